"""Step 6, for a large batch: one persistent kernel a layer, each step's recurrent product done as a
tiled GEMM.

The wavefront (wavefront.py) gives each lane one k of a weight row and at most 4 batch rows: every
multiply-add reads an h value from shared memory, and at batch 64 shared memory, not arithmetic,
sets its pace. Here a block keeps only W_hh (its units' 4 gate rows, k-major), and each step is
the GEMM (its rows) x (h_{t-1} of a chunk of up to 64 batch rows), tiled as chapter 04 tiles one:
- a thread owns one unit's 4 gate rows and TB batch rows of the chunk (a 4 x TB tile of sums): per
  k it reads 4 weights and TB values of h from shared memory for 4 * TB multiply-adds;
- the k of a row are split over KSPLIT groups of threads (thread tid takes k = ks, ks + KSPLIT, ...),
  whose partial sums meet in shared memory before the cell;
- h_{t-1} is staged transposed, h_s[k * (BC + 1) + b] (the + 1: a warp's stores of 32 consecutive
  k land in 32 banks), in rounds of loads that are all in flight together;
- the cell's inputs that need no h (x_terms, bias, c) are loaded before the h_{t-1} rounds, so their
  latency hides behind them.
Each layer's input term is step 2's hoisted GEMM (chapter 04's, at its best on (T*B, I) x (I, 4H)).
The price against the wavefront: T grid barriers a layer, T * L in all, against T + L - 1."""

from functools import lru_cache

import numba
import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.barrier import counter_barrier, counter_leave
from workbook.inputs import sm_count
from workbook.launch import cdiv, shared_memory_limit

from .fused import FusedLSTM
from .layer import lstm_cell
from workbook.launch import cooperative_launch

THREADS = 512 if ON_GPU else 64  # 16 warps: faster a step at batch 64 than 256 threads (EXPERIMENTS.md)
MAX_CHUNK, MAX_TB = 64, 8  # batch rows a block takes at once; of them, a thread's
ROUND = 16  # h_{t-1} values a thread loads before storing any: all in flight at once
ZERO = float32(0.0)


def tiling(hidden, units, chunk):
    """(TB, KSPLIT, KPT, words): a thread's batch rows, the k groups, the k a thread takes (padded
    with zeros to KPT * KSPLIT), and the block's float32 words of shared memory, for a chunk of
    `chunk` batch rows (a power of 2)."""
    tb = min(MAX_TB, chunk)
    tiles = units * (chunk // tb)
    ksplit = THREADS // tiles
    kpt = cdiv(hidden, ksplit) if ksplit else 0
    kp, pitch = kpt * ksplit, chunk + 1
    return tb, ksplit, kpt, kp * 4 * units + max(kp * pitch, ksplit * 4 * units * pitch)


def batch_chunk(hidden, units, batch):
    """Batch rows a block takes at once: a power of 2 up to the batch and MAX_CHUNK, as many as
    the threads (one tile each at least) and the shared memory allow; 0 if not even one fits."""
    chunk = 1
    while chunk < min(batch, MAX_CHUNK):
        chunk *= 2
    while chunk >= 1:
        _, ksplit, _, words = tiling(hidden, units, chunk)
        if ksplit >= 1 and 4 * words <= shared_memory_limit():
            return chunk
        chunk //= 2
    return 0


@lru_cache(maxsize=None)
def make_layer_kernel(H, U, BC):
    """The kernel of one layer for hidden size H, U units a block, chunks of BC batch rows."""
    TB, KSPLIT, KPT, _ = tiling(H, U, BC)
    R, BG, BCP = 4 * U, BC // TB, BC + 1  # weight rows (unit u's gate q: row 4u + q), batch groups, h_s pitch
    TILES = U * BG  # thread tid: tile tid % TILES = (unit, batch group) = divmod-like (tile % U, tile // U)
    KP = KPT * KSPLIT
    WS = KP * R  # W_hh's words (w_s[k * R + r]); h_s (and then the partial sums) after them
    CPT = -(-U * BC // THREADS)  # cells a thread computes a chunk
    KW = min(THREADS, KP)  # staging h_{t-1}: thread tid takes k = tid % KW + kk * KW and rows tid // KW + p * RP
    RP, KREP = THREADS // KW, cdiv(KP, KW)
    BREP = ROUND * cdiv(BC, RP * ROUND)  # rows a thread stages, in whole rounds
    EXACT = THREADS == RP * KW and BREP * RP == BC and KREP * KW == KP  # the staging covers h_s exactly
    UNROLL = 4 if KPT % 4 == 0 else 1
    SUMS, INPUTS = 4 * TB, 4 * CPT  # local arrays' sizes: plain names, which numba reads as constants
    options = {"launch_bounds": (THREADS, 1)} if ON_GPU else {}

    @cuda.jit(device=True, forceinline=True)
    def cell_inputs(cs, xs, c, bias, x_terms, t, B, b0, j0, tid):
        """The chunk's cells' inputs that need no h, for the cells this thread computes: c_{t-1}, and
        each gate's hoisted input term plus bias. In flight during the staging."""
        u64 = numba.uint64
        for p in range(CPT):
            n = tid + u64(p * THREADS)
            cu, bb = n % u64(U), n // u64(U)
            b, j = b0 + bb, j0 + cu
            if bb < u64(BC) and b < B and j < u64(H):
                cs[p] = c[b * u64(H) + j]
                for q in range(4):
                    xs[4 * p + q] = x_terms[(t * B + b) * u64(4 * H) + u64(q * H) + j] + bias[u64(q * H) + j]

    @cuda.jit(device=True, forceinline=True)
    def stage_h(shared, stage, src, src_at, B, b0, k_lane, r_lane):
        """h_{t-1} of the chunk's rows, transposed into h_s (k-major): a thread's k, its rows, ROUND
        loads in flight at once; zeros past the ends, which add nothing."""
        u64 = numba.uint64
        for kk in range(KREP):
            k = k_lane + u64(kk * KW)
            whole = EXACT and k < u64(H) and b0 + u64(BC) <= B  # nothing past an end: no test per value
            for first in range(0, BREP, ROUND):
                for p in range(ROUND):
                    bb = r_lane + u64((first + p) * RP)
                    if whole:
                        stage[p] = src[src_at + k + u64((first + p) * RP * H)]
                    else:
                        stage[p] = ZERO
                        if k < u64(H) and bb < u64(BC) and b0 + bb < B:
                            stage[p] = src[src_at + k + u64((first + p) * RP * H)]
                for p in range(ROUND):
                    bb = r_lane + u64((first + p) * RP)
                    if EXACT or (r_lane < u64(RP) and bb < u64(BC) and k < u64(KP)):
                        shared[u64(WS) + k * u64(BCP) + bb] = stage[p]

    @cuda.jit(device=True, forceinline=True)
    def tile_sums(acc, w, shared, w_at, h_at):
        """acc[q * TB + i] += this thread's part (its k-split) of gate q of its unit, batch row
        g + i * BG; UNROLL k at a time, their addresses a base and constants."""
        u64 = numba.uint64
        for m0 in range(0, KPT, UNROLL):
            w_m, h_m = w_at + u64(m0 * KSPLIT * R), h_at + u64(m0 * KSPLIT * BCP)
            for m in range(UNROLL):
                for q in range(4):
                    w[q] = shared[w_m + u64(m * KSPLIT * R + q)]
                for i in range(TB):
                    hv = shared[h_m + u64(m * KSPLIT * BCP + i * BG)]
                    for q in range(4):
                        acc[q * TB + i] += w[q] * hv

    @cuda.jit(device=True, forceinline=True)
    def cells(c, y, shared, xs, cs, z, t, B, b0, j0, tid):
        """The cells, a thread per (unit, batch row): each gate's KSPLIT partial sums, then lstm_cell."""
        u64 = numba.uint64
        for p in range(CPT):
            n = tid + u64(p * THREADS)
            cu, bb = n % u64(U), n // u64(U)
            b, j = b0 + bb, j0 + cu
            if bb < u64(BC) and b < B and j < u64(H):
                for q in range(4):
                    z[q] = xs[4 * p + q]
                    for s in range(KSPLIT):
                        z[q] += shared[u64(WS) + (u64(s * R + q) + u64(4) * cu) * u64(BCP) + bb]
                c[b * u64(H) + j], y[(t * B + b) * u64(H) + j] = lstm_cell(z[0], z[1], z[2], z[3], cs[p])

    @cuda.jit(**options)
    def layer_kernel(x_terms, w_hh, bias, h, c, y, T, B, counter):
        """A whole layer: y[t] = h_t. Flat float32 arrays: x_terms (T, B, 4H), the hoisted GEMM's;
        bias (4H,); h, c (B, H), the initial state, left holding the last; y (T, B, H); w_hh (4H, H).
        Block k owns units k*U .. k*U + U - 1. counter: 2 uint64, zero at the launch and left at zero
        (the last block out resets them). Indices are unsigned: no wrap-around tests, and division by
        the constants is a multiply and a shift."""
        u64 = numba.uint64
        T, B = u64(T), u64(B)
        cuda.cg.this_grid()  # unused but for this: numba launches the kernel cooperatively (all blocks resident)
        shared = cuda.shared.array(0, dtype=float32)
        tid = u64(cuda.threadIdx.x)
        blocks = u64(cuda.gridDim.x)
        j0 = u64(cuda.blockIdx.x) * u64(U)
        for n in range(tid, u64(WS), u64(THREADS)):  # once per sequence: the block's rows of W_hh, k-major
            k, r = n // u64(R), n % u64(R)
            j = j0 + r // u64(4)
            shared[n] = w_hh[(r % u64(4)) * u64(H) + j, k] if j < u64(H) and k < u64(H) else ZERO
        tile, ks = tid % u64(TILES), tid // u64(TILES)
        u, g = tile % u64(U), tile // u64(U)
        k_lane, r_lane = tid % u64(KW), tid // u64(KW)
        w_at = ks * u64(R) + u64(4) * u  # w_s[k * R + 4u + q] at w_at + m * KSPLIT * R + q, k = ks + m * KSPLIT
        h_at = u64(WS) + ks * u64(BCP) + g  # h_s[k * BCP + g + i * BG] at h_at + m * KSPLIT * BCP + i * BG
        acc = cuda.local.array(SUMS, float32)  # acc[q * TB + i]: gate q of unit u, batch row g + i * BG
        w = cuda.local.array(4, float32)
        z = cuda.local.array(4, float32)
        stage = cuda.local.array(ROUND, float32)
        xs = cuda.local.array(INPUTS, float32)
        cs = cuda.local.array(CPT, float32)
        for t in range(T):
            for b0 in range(u64(0), B, u64(BC)):  # BC batch rows a chunk
                cell_inputs(cs, xs, c, bias, x_terms, t, B, b0, j0, tid)
                cuda.syncthreads()  # the last chunk's cells are done with the partial sums h_s holds
                src = h if t == u64(0) else y  # h_{t-1}: the initial state, or the last step's outputs
                src_at = (u64(0) if t == u64(0) else (t - u64(1)) * B * u64(H)) + (b0 + r_lane) * u64(H)
                stage_h(shared, stage, src, src_at, B, b0, k_lane, r_lane)
                cuda.syncthreads()
                for n in range(SUMS):
                    acc[n] = ZERO
                if ks < u64(KSPLIT):  # threads past KSPLIT * TILES have no tile
                    tile_sums(acc, w, shared, w_at, h_at)
                cuda.syncthreads()  # every thread done with h_s: the partial sums take its place
                if ks < u64(KSPLIT):
                    for q in range(4):
                        for i in range(TB):
                            shared[u64(WS) + (ks * u64(R) + u64(4) * u + u64(q)) * u64(BCP) + g + u64(i * BG)] = \
                                acc[q * TB + i]
                cuda.syncthreads()
                cells(c, y, shared, xs, cs, z, t, B, b0, j0, tid)
            counter_barrier(counter, (t + u64(1)) * blocks)  # every h_t written before any block reads it
        for n in range(tid, u64(U) * B, u64(THREADS)):  # h_n: the units this block owns, written by it
            cu, b = n % u64(U), n // u64(U)
            if j0 + cu < u64(H):
                h[b * u64(H) + j0 + cu] = y[((T - u64(1)) * B + b) * u64(H) + j0 + cu]
        counter_leave(counter, blocks)  # ready for the next launch

    return layer_kernel


class LayerwiseLSTM(FusedLSTM):
    """Step 2's input GEMM, then one cooperative launch a layer whose steps are tiled GEMMs."""

    def __init__(self, weights, blocks=None):
        super().__init__(weights)
        H = self.hidden
        self.w_hh = [cuda.to_device(w["w_hh"]) for w in weights]
        self.counter = cuda.to_device(np.zeros(2, np.uint64))  # the grid barrier's; each launch leaves it at zero
        resident = sm_count() if blocks is None else blocks  # one block an SM
        self.units = cdiv(H, resident)
        self.blocks = cdiv(H, self.units)
        if batch_chunk(H, self.units, 1) == 0:
            raise ValueError(f"hidden size {H} over {self.blocks} blocks gives each block {self.units} units: "
                             f"more than its {THREADS} threads or than the {shared_memory_limit()} bytes of "
                             "shared memory hold: use more blocks")

    def _layer(self, layer, x, h, c, y, stream):
        H, B = self.hidden, x.shape[1]
        chunk = batch_chunk(H, self.units, B)
        x_terms = self.input_terms(layer, x, stream)
        cooperative_launch(make_layer_kernel(H, self.units, chunk), self.blocks, THREADS,
                           4 * tiling(H, self.units, chunk)[3], stream,
                           x_terms.reshape(-1), self.w_hh[layer], self.bias[layer], h.reshape(-1), c.reshape(-1),
                           y.reshape(-1), np.int64(x.shape[0]), np.int64(B), self.counter)
