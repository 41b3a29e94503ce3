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
from numba import cuda, float32

from workbook import ON_GPU

from . import grouping
from .grouping import next_tap
from .maps import check_layer
from .reference import TAPS

BM, BN, BK, TM, TN = (64, 64, 16, 4, 4) if ON_GPU else (8, 8, 4, 2, 2)
THREADS = (BM // TM) * (BN // TN)
COLUMNS = BN // TN  # threads across a tile: thread (tx, ty) owns rows ty * TM + i, columns tx + j * COLUMNS
A_LOADS, B_LOADS = BM * BK // THREADS, BK * BN // THREADS  # values a thread loads of each tile a step
A_STEP, B_STEP = THREADS // BK, THREADS // BN  # rows between a thread's loads of A, of B
A_PITCH = BM + 1  # a_s[c, r]: the A tile transposed; + 1: a warp's stores of one row's channels hit 32 banks
ZERO = float32(0)


@cuda.jit(device=True, forceinline=True)
def load_tiles(x, w, neighbours, order, k, c0, row0, col0, t, next_a, next_b):
    """This thread's share of step (tap k, channels c0 ..)'s tiles, into registers: A gathered
    through the pair table (a warp reads BK consecutive channels of one row's source), B from w."""
    N, C = neighbours.shape[0], x.shape[1]  # N: output rows
    K = w.shape[2]
    r0, c = row0 + t // BK, c0 + t % BK  # a thread loads one channel of rows r0, r0 + A_STEP, ...
    for q in range(A_LOADS):
        r = r0 + q * A_STEP
        src = neighbours[order[r], k] if r < N else -1
        next_a[q] = x[src, c] if src >= 0 and c < C else ZERO
    cb, n = c0 + t // BN, col0 + t % BN  # and one column of B's rows cb, cb + B_STEP, ...
    for q in range(B_LOADS):
        next_b[q] = w[k, cb + q * B_STEP, n] if cb + q * B_STEP < C and n < K else ZERO


@cuda.jit
def implicit_kernel(x, w, neighbours, order, tile_masks, out):
    """out[order[r], :] for the block's rows r: x (inputs, C), w (27, C, K), neighbours (N, 27),
    out (N, K), order (N,) the rows by mask, tile_masks (row tiles,) the OR of a tile's row masks.
    The block runs steps of BK channels of one tap, over the taps its rows have: each step's
    tiles are loaded into registers while the last step's are multiplied."""
    N, C = neighbours.shape[0], x.shape[1]  # N: output rows
    K = w.shape[2]
    t = cuda.threadIdx.x
    tx, ty = t % COLUMNS, t // COLUMNS
    row0, col0 = cuda.blockIdx.x * BM, cuda.blockIdx.y * BN
    a_s = cuda.shared.array((BK, A_PITCH), float32)
    b_s = cuda.shared.array((BK, BN), float32)
    acc = cuda.local.array((TM, TN), float32)
    next_a = cuda.local.array(A_LOADS, float32)
    next_b = cuda.local.array(B_LOADS, float32)
    a = cuda.local.array(TM, float32)
    b = cuda.local.array(TN, float32)
    for i in range(TM):
        for j in range(TN):
            acc[i, j] = ZERO
    taps = tile_masks[cuda.blockIdx.x]
    k, c0 = next_tap(taps, -1), 0
    if k < TAPS:
        load_tiles(x, w, neighbours, order, k, c0, row0, col0, t, next_a, next_b)
    while k < TAPS:
        cuda.syncthreads()  # every thread done with the last step's tiles
        for q in range(A_LOADS):
            a_s[t % BK, t // BK + q * A_STEP] = next_a[q]
        for q in range(B_LOADS):
            b_s[t // BN + q * B_STEP, t % BN] = next_b[q]
        cuda.syncthreads()
        c0 += BK
        if c0 >= C:  # this tap's channels done: the next tap the block's rows have
            k, c0 = next_tap(taps, k), 0
        if k < TAPS:  # the next step's tiles: in flight while this one's are multiplied
            load_tiles(x, w, neighbours, order, k, c0, row0, col0, t, next_a, next_b)
        for c in range(BK):
            for i in range(TM):
                a[i] = a_s[c, ty * TM + i]
            for j in range(TN):
                b[j] = b_s[c, tx + j * COLUMNS]
            for i in range(TM):
                for j in range(TN):
                    acc[i, j] += a[i] * b[j]
    for i in range(TM):
        r = row0 + ty * TM + i
        if r < N:
            row = order[r]
            for j in range(TN):
                n = col0 + tx + j * COLUMNS
                if n < K:
                    out[row, n] = acc[i, j]


class ImplicitGemm:
    """The 3x3x3 convolution through a pair table (maps.Pairs): out = conv(x, w). Grouping the rows
    by mask (grouping.py, on the GPU) is part of its maps: once per active set. group=False: the
    rows in the pair table's order."""

    def __init__(self, pairs, group=True, stream=0):
        self.neighbours, self.inputs = pairs.neighbours, pairs.inputs
        self.order, self.tile_masks = grouping.row_order(pairs.masks, BM, group, stream)

    def taps_per_tile(self):
        """How many of the 27 taps a block runs, on average (copies the tiles' masks to the host)."""
        return float(np.mean([bin(int(m)).count("1") for m in self.tile_masks.copy_to_host()]))

    def __call__(self, x, w, out, stream=0):
        """x (N, C), w (27, C, K), out (N, K): float32 device arrays."""
        x, w, out = check_layer(x, w, out, self.inputs, self.neighbours.shape[0])
        N, K = out.shape
        implicit_kernel[(-(-N // BM), -(-K // BN)), THREADS, stream](x, w, self.neighbours, self.order,
                                                                     self.tile_masks, out)
        return out
