"""Optimized, after spconv 2.x: one implicit GEMM over the output rows, the gather fused into its
A tile's loads, no scatter.

The output is a GEMM: out (N, K) = A (N, 27 C) @ W (27 C, K), where row i of A is, tap by tap, the
features of site i's neighbour under that tap (zeros where there is none). A is never written:
a block computes a BM x BN tile of out, and for each tap and each BK channels it loads its A tile
straight from x through the pair table (row r's source: neighbours[r, k]), as chapter 04's
implicit convolution loads its B tile through the tap table. Each output row is written once, by
the block that owns it: output-stationary, no atomics, no scatter.

A block skips the taps none of its rows has. Rows are taken grouped by their tap masks (`order`,
made once with the maps: grouping.py), so the rows of a block mostly share their taps and the
skipped ones are many; a block's mask is the OR of its rows' (its tile mask)."""

import numpy as np
from numba import cuda, float32, int32

from workbook import ON_GPU
from workbook.memory import aligned, load4, shared_load4, shared_store4, store4
from workbook.launch import cdiv

from . import grouping
from .grouping import next_tap
from .maps import check_layer
from .reference import TAPS

# The tile: BM output rows x BN output channels a block, BK input channels a step; a thread's TM x TN
# sums are quads of 4 adjacent rows by quads of 4 adjacent channels (TM, TN: multiples of 4).
BM, BN, BK, TM, TN = (64, 64, 16, 8, 4) if ON_GPU else (16, 8, 4, 8, 4)
THREADS = (BM // TM) * (BN // TN)
COLUMNS = BN // TN  # thread t = (tx, ty): tx = t % COLUMNS, ty = t // COLUMNS
ROW_GROUP, COLUMN_GROUP = BM * 4 // TM, BN * 4 // TN  # a thread's quads of rows (columns) lie this far apart
A_QUADS, B_QUADS = BM * BK // (4 * THREADS), BK * BN // (4 * THREADS)  # quads a thread loads a step
A_VALUES, B_VALUES, A_TILE, B_TILE = 4 * A_QUADS, 4 * B_QUADS, BK * BM, BK * BN  # array sizes: plain names
ZERO = float32(0)


@cuda.jit(device=True, forceinline=True)
def load_tiles(x, w, neighbours, rows, k, c0, col0, t, wide, next_a, next_b):
    """This thread's quads of step (tap k, channels c0 ..), into registers. A: 4 channels of the
    source of one output row (rows[q]: its row of the pair table, -1 past the end), read through
    the pair table;
    the 32 lanes of a warp take 32 different rows, so that their stores into a_s hit 32 banks.
    B: 4 adjacent output channels of the tap's weights. wide: every quad is whole and 16-byte
    aligned (C and K multiples of 4), one 16-byte load each; else 4 loads with bounds."""
    C, K = x.shape[1], w.shape[2]
    for q in range(A_QUADS):
        c = c0 + 4 * ((t + q * THREADS) // BM)
        src = neighbours[rows[q], k] if rows[q] >= 0 else -1
        if wide and src >= 0 and c < C:
            v0, v1, v2, v3 = load4(x, src * C + c)
        else:
            v0 = x[src, c] if src >= 0 and c < C else ZERO
            v1 = x[src, c + 1] if src >= 0 and c + 1 < C else ZERO
            v2 = x[src, c + 2] if src >= 0 and c + 2 < C else ZERO
            v3 = x[src, c + 3] if src >= 0 and c + 3 < C else ZERO
        next_a[4 * q], next_a[4 * q + 1], next_a[4 * q + 2], next_a[4 * q + 3] = v0, v1, v2, v3
    for q in range(B_QUADS):
        quad = t + q * THREADS
        c, n = c0 + quad // (BN // 4), col0 + 4 * (quad % (BN // 4))
        if wide and c < C and n < K:
            v0, v1, v2, v3 = load4(w, (k * C + c) * K + n)
        else:
            v0 = w[k, c, n] if c < C and n < K else ZERO
            v1 = w[k, c, n + 1] if c < C and n + 1 < K else ZERO
            v2 = w[k, c, n + 2] if c < C and n + 2 < K else ZERO
            v3 = w[k, c, n + 3] if c < C and n + 3 < K else ZERO
        next_b[4 * q], next_b[4 * q + 1], next_b[4 * q + 2], next_b[4 * q + 3] = v0, v1, v2, v3

@cuda.jit
def implicit_kernel(x, w, neighbours, order, tile_masks, wide, out):
    """out[order[r], :] for the block's rows r: x (inputs, C), w (27, C, K), neighbours (N, 27),
    out (N, K), order (N,) the rows by mask, tile_masks (row tiles,) the OR of a tile's row masks.
    The block runs steps of BK channels of one tap, over the taps its rows have: each step's
    tiles are loaded into registers while the last step's are multiplied. a_s holds the A tile
    transposed (a_s[c * BM + r]), so that a thread's 4 rows at one channel are one 16-byte
    shared load, as its 4 columns of b_s are: 2 shared loads per 16 multiply-adds."""
    N, K = neighbours.shape[0], w.shape[2]  # N: output rows
    C = x.shape[1]
    t = cuda.threadIdx.x
    tx, ty = t % COLUMNS, t // COLUMNS
    row0, col0 = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    a_s = cuda.shared.array(A_TILE, float32)
    b_s = cuda.shared.array(B_TILE, float32)
    acc = cuda.local.array((TM, TN), float32)
    rows = cuda.local.array(A_QUADS, int32)
    next_a = cuda.local.array(A_VALUES, float32)
    next_b = cuda.local.array(B_VALUES, float32)
    a = cuda.local.array(TM, float32)
    b = cuda.local.array(TN, float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = ZERO
    for q in range(A_QUADS):  # the output rows this thread loads A for: the same at every step
        r = row0 + (t + q * THREADS) % BM
        rows[q] = order[r] if r < N else -1
    taps = tile_masks[cuda.blockIdx.x]
    k, c0 = next_tap(taps, -1), 0
    if k < TAPS:
        load_tiles(x, w, neighbours, rows, k, c0, col0, t, wide, next_a, next_b)
    while k < TAPS:
        cuda.syncthreads()  # every thread done with the last step's tiles
        for q in range(A_QUADS):
            quad = t + q * THREADS
            at = 4 * (quad // BM) * BM + quad % BM  # a_s[c, r]: the quad's 4 channels, BM apart
            for j in range(4):
                a_s[at + j * BM] = next_a[4 * q + j]
        for q in range(B_QUADS):
            shared_store4(b_s, 4 * (t + q * THREADS),
                          (next_b[4 * q], next_b[4 * q + 1], next_b[4 * q + 2], next_b[4 * q + 3]))
        cuda.syncthreads()
        c0 += BK
        if c0 >= C:  # this tap's channels done: the next tap the block's rows have
            k, c0 = next_tap(taps, k), 0
        if k < TAPS:  # the next step's tiles: in flight while this one's are multiplied
            load_tiles(x, w, neighbours, rows, k, c0, col0, t, wide, next_a, next_b)
        for c in range(BK):
            for g in range(TM // 4):
                a[4 * g], a[4 * g + 1], a[4 * g + 2], a[4 * g + 3] = shared_load4(a_s, c * BM + g * ROW_GROUP + 4 * ty)
            for g in range(TN // 4):
                b[4 * g], b[4 * g + 1], b[4 * g + 2], b[4 * g + 3] = shared_load4(b_s, c * BN + g * COLUMN_GROUP + 4 * tx)
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a[i] * b[j]
    for i in range(TM):
        r = row0 + (i // 4) * ROW_GROUP + 4 * ty + i % 4
        if r < N:
            row = order[r]
            for g in range(TN // 4):
                n = col0 + g * COLUMN_GROUP + 4 * tx
                if wide and n < K:
                    store4(out, row * K + n, (acc[i, 4 * g], acc[i, 4 * g + 1], acc[i, 4 * g + 2], acc[i, 4 * g + 3]))
                elif not wide:
                    for j in range(4):
                        if n + j < K:
                            out[row, n + j] = acc[i, 4 * g + j]


class ImplicitGemm:
    """The 3x3x3 convolution through a pair table (maps.Pairs): out = conv(x, w). Grouping the rows
    by mask (grouping.py, on the GPU) is part of its maps: once per active set. group=False: the
    rows in the pair table's order."""

    def __init__(self, pairs, group=True, stream=0, grouped=None):
        """grouped: (order, tile_masks) already made in tiles of BM rows (onelaunch.MapBuilder)."""
        self.neighbours, self.inputs = pairs.neighbours, pairs.inputs
        self.order, self.tile_masks = grouping.row_order(pairs.masks, BM, group, stream, grouped)

    def taps_per_tile(self):
        """How many of the 27 taps a block runs, on average (copies the tiles' masks to the host)."""
        return float(np.mean([bin(int(m)).count("1") for m in self.tile_masks.copy_to_host()]))

    def __call__(self, x, w, out, stream=0):
        """x (N, C), w (27, C, K), out (N, K): float32 device arrays."""
        x, w, out = check_layer(x, w, out, self.inputs, self.neighbours.shape[0])
        N, K = out.shape
        wide = x.shape[1] % 4 == 0 and K % 4 == 0 and aligned(x) and aligned(w) and aligned(out)
        implicit_kernel[(cdiv(N, BM), cdiv(K, BN)), THREADS, stream](x, w, self.neighbours, self.order,
                                                                     self.tile_masks, wide, out)
        return out
