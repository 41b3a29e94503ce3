"""The implicit GEMM on tensor cores: FP16 features and weights, FP32 sums (chapter 09's mma.sync,
cp.async and ldmatrix).

The same output-stationary GEMM as implicit.py, fed as chapter 09's pipelined GEMM feeds its
tensor cores:
- a block of WARPS warps takes BM = 16 * WARPS output rows (in the grouped order) and all K output
  channels; warp w owns rows 16w .. 16w + 15 by n-tiles of 8 channels (4 sums a thread each);
- a step is one tap and BKC = 64 of its channels: the A tile (the BM rows' source rows, 128
  bytes each) and the tap's weights (stored transposed, (27, K, C): a row per output channel) are
  copied into shared memory by cp.async, 16 bytes a copy, without passing through registers. The
  gather is in the copies: row r's chunks come from its source row through the pair table, and a
  missing neighbour's are zero-filled (a copy of 0 bytes). While the warps multiply one step, the
  next two are being copied, and the pair-table entries of the one after are being loaded;
- the loop is chapter 09's, written once (workbook.tensor_cores.make_mainloop): this file passes its
  copies, fragments and multiply, the step's position (tap, channels) carried from copy to copy;
- the warps read their fragments with ldmatrix from a swizzled layout (16-byte chunk c of row r at
  chunk c XOR r % 8: the 8 rows a matrix reads lie on 8 different bank groups), then one mma per
  n-tile and 16 channels.
Features and weights are rounded to FP16 once, before the layer (`to_half`); what is multiplied is
exact in FP32, so the check is against the reference of the rounded values. A block's taps are
the OR of its BM rows' masks, rows grouped as implicit.py's are (grouping.py)."""

import numpy as np
from numba import cuda, float32, int32, uint32

from workbook import ON_GPU, capability
from workbook.inputs import require
from workbook.memory import aligned
from workbook.tensor_cores import cp_async16, ldmatrix_x4, make_mainloop, mma_f16, swizzled_chunk_128
from workbook.launch import cdiv

from . import grouping
from .grouping import next_tap
from .reference import TAPS

NEEDS = ("mma.sync.f16", "cp.async", "ldmatrix")  # 8.0 and up: workbook/capability.py
WARPS = 4
BM = 16 * WARPS
THREADS = 32 * WARPS
MAX_TILES = 8  # n-tiles a warp holds: K up to 64 (32 sums a thread)
BKC = 64  # channels a step: 128 bytes of a row, 8 chunks of 16 bytes
CHUNKS = BKC // 8
ROWS_APART = THREADS // CHUNKS  # rows between one thread's copies (a thread copies chunk tid % 8 of its rows)
A_COPIES, B_COPIES = BM * CHUNKS // THREADS, 8 * MAX_TILES * CHUNKS // THREADS  # chunks a thread copies a step
STAGES = 3  # stages of 16 KB, 48 KB in all: the mainloop refills a stage half a step in, so with 2 the
# copies had only half a step to land (16% slower: EXPERIMENTS.md)
A_STAGE, B_STAGE = BM * BKC, 8 * MAX_TILES * BKC
SUMS = 4 * MAX_TILES
A_REGISTERS = 8  # a warp's A fragments of half a stage (two k16 slices), a thread's share
ALL_TAPS = (1 << TAPS) - 1
ZERO = float32(0)


@cuda.jit(device=True, inline=True)
def swizzled(row, chunk):
    """Where 16-byte chunk `chunk` of `row` of a stage lives (in halves)."""
    return row * BKC + swizzled_chunk_128(row, chunk) * 8


@cuda.jit(device=True, inline=True)
def advance(taps, k, c0, C):
    """The step after (tap k, channels c0 ..): the next BKC channels, or the next tap the block has."""
    if c0 + BKC < C:
        return k, c0 + BKC
    return next_tap(taps, k), 0


@cuda.jit(device=True, inline=True)
def sources(neighbours, rows, k, srcs):
    """srcs[i]: the input row under tap k of this thread's A row i (rows[i] in the pair table, -1
    past the end), or -1. Loaded a step before the copies that use them, so that issuing the copies
    does not wait for the pair table."""
    for i in range(A_COPIES):
        srcs[i] = neighbours[rows[i], k] if rows[i] >= 0 else -1


@cuda.jit(device=True, inline=True)
def issue_step(x16, wt16, srcs, k, c0, stage, tid, a_s, b_s):
    """This thread's cp.async copies of step (tap k, channels c0 ..) into `stage`: chunk tid % 8 of
    A's rows tid / 8 + 16i (from input rows srcs[i]) and of the weights' rows (output channels) as
    many. Chunks past C, past K or of a missing neighbour are zero-filled; their address is never
    read (index 0)."""
    C, K = x16.shape[1], wt16.shape[1]
    chunk = tid % CHUNKS
    c = c0 + 8 * chunk
    for i in range(A_COPIES):
        r = tid // CHUNKS + ROWS_APART * i
        src = srcs[i]
        ok = src >= 0 and c < C
        cp_async16(a_s, stage * A_STAGE + swizzled(r, chunk), x16, src * C + c if ok else 0, 16 if ok else 0)
    for i in range(B_COPIES):
        n = tid // CHUNKS + ROWS_APART * i
        ok = n < K and c < C
        cp_async16(b_s, stage * B_STAGE + swizzled(n, chunk), wt16, (k * K + n) * C + c if ok else 0, 16 if ok else 0)


@cuda.jit(device=True, inline=True)
def issue(operands, state, stage, step):
    """make_mainloop's issue: the copies of the step at `state` (tap, first channel), then the
    pair-table entries of the step after, which fly while this step is multiplied. Steps come in
    order, so the position is carried, not decoded from `step`."""
    x16, wt16, neighbours, rows, srcs, taps, tid, a_s, b_s = operands
    k, c0 = state
    issue_step(x16, wt16, srcs, k, c0, stage, tid, a_s, b_s)
    k, c0 = advance(taps, k, c0, x16.shape[1])
    if k < TAPS:
        sources(neighbours, rows, k, srcs)
    return k, c0


def make_tensor_kernel(tiles, stages=None):
    """The kernel for K up to 8 * tiles output channels (tiles even: ldmatrix loads two n-tiles
    of B at a time), written on chapter 09's mainloop (workbook.tensor_cores.make_mainloop): this
    file passes its copies (`issue`), its fragments and its multiply. A half of a stage is two k16
    slices (32 channels): A's fragments 8 registers, B's 4 a slice and n-tile pair."""
    stages = STAGES if stages is None else stages
    b_registers = 2 * 2 * tiles
    a_shared, b_shared = stages * A_STAGE, stages * B_STAGE

    @cuda.jit(device=True, inline=True)
    def fragments(operands, stage, half, a, b):
        """The warp's fragments of channels 32 half .. + 31 of a stage: a[4 s ..] its A rows' k16
        slice s, b[(s * tiles + j) * 2 ..] n-tile j's."""
        a_s, b_s, tid = operands[7], operands[8], operands[6]
        lane, warp = tid % 32, tid // 32
        m = lane // 8
        for s in range(2):
            kk = 2 * half + s
            regs = ldmatrix_x4(a_s, stage * A_STAGE + swizzled(16 * warp + lane % 16, 2 * kk + lane // 16))
            for q in range(4):
                a[4 * s + q] = regs[q]
            for j in range(0, tiles, 2):  # two n-tiles a load: (j, low k), (j, high k), (j + 1, ...)
                regs = ldmatrix_x4(b_s, stage * B_STAGE + swizzled(8 * (j + m // 2) + lane % 8, 2 * kk + m % 2))
                for q in range(4):
                    b[(s * tiles + j) * 2 + q] = regs[q]

    @cuda.jit(device=True, inline=True)
    def multiply(a, b, acc):
        for s in range(2):
            for j in range(tiles):
                d = mma_f16((a[4 * s], a[4 * s + 1], a[4 * s + 2], a[4 * s + 3]),
                            (b[(s * tiles + j) * 2], b[(s * tiles + j) * 2 + 1]),
                            (acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3]))
                acc[4 * j], acc[4 * j + 1], acc[4 * j + 2], acc[4 * j + 3] = d

    mainloop = make_mainloop(issue, fragments, multiply, stages)

    @cuda.jit
    def tensor_kernel(x16, wt16, neighbours, order, tile_masks, out):
        """out[order[r], :] for the block's BM rows. x16 (inputs, C) float16; wt16 (27, K, C) float16,
        the weights transposed; neighbours (N, 27), order (N,), tile_masks (row tiles,) as
        implicit.py's; out (N, K) float32."""
        N, C, K = neighbours.shape[0], x16.shape[1], out.shape[1]
        tid = cuda.threadIdx.x
        lane, warp = tid % 32, tid // 32
        g, t = lane // 4, lane % 4
        a_s = cuda.shared.array(a_shared, np.float16)
        b_s = cuda.shared.array(b_shared, np.float16)
        acc = cuda.local.array(SUMS, float32)
        a0, a1 = cuda.local.array(A_REGISTERS, uint32), cuda.local.array(A_REGISTERS, uint32)
        b0, b1 = cuda.local.array(b_registers, uint32), cuda.local.array(b_registers, uint32)
        rows = cuda.local.array(A_COPIES, int32)
        srcs = cuda.local.array(A_COPIES, int32)
        for i in range(SUMS):
            acc[i] = ZERO
        row0 = cuda.blockIdx.x * BM
        for i in range(A_COPIES):  # the rows this thread copies A for: the same at every step
            r = row0 + tid // CHUNKS + ROWS_APART * i
            rows[i] = order[r] if r < N else -1
        taps = tile_masks[cuda.blockIdx.x]
        first = next_tap(taps, -1)
        if first < TAPS:
            sources(neighbours, rows, first, srcs)
        steps = cuda.popc(taps & ALL_TAPS) * ((C + BKC - 1) // BKC)  # a step: a tap's BKC channels
        mainloop((x16, wt16, neighbours, rows, srcs, taps, tid, a_s, b_s), (first, 0), steps, acc, a0, a1, b0, b1)
        r_lo = row0 + 16 * warp + g  # C register q: row g + 8 (q // 2), column 2t + q % 2 of n-tile n
        for n in range(tiles):
            for q in range(4):
                r = r_lo + 8 if q >= 2 else r_lo
                column = n * 8 + 2 * t + q % 2
                if r < N and column < K:
                    out[order[r], column] = acc[4 * n + q]

    return tensor_kernel


_KERNELS = {}


def tensor_kernel(out_channels):
    """The kernel for `out_channels` (K), made once for each even number of n-tiles."""
    tiles = 2 * cdiv(out_channels, 16)
    if tiles not in _KERNELS:
        _KERNELS[tiles] = make_tensor_kernel(tiles)
    return _KERNELS[tiles]


@cuda.jit
def transpose_weights_kernel(w16, wt):
    """wt[k, n, c] = w16[k, c, n] (FP16)."""
    taps, C, K = w16.shape
    for at in range(cuda.grid(1), taps * C * K, cuda.gridsize(1)):
        k, rest = at // (C * K), at % (C * K)
        c, n = rest // K, rest % K
        wt[k, n, c] = w16[k, c, n]


def to_half(x, w):
    """(x16 (N, C), wt16 (27, K, C)): the layer's features and weights in FP16 on the device, the
    weights transposed (host arrays in, rounded to nearest)."""
    x16 = cuda.to_device(np.ascontiguousarray(np.asarray(x, np.float32).astype(np.float16)))
    w16 = cuda.to_device(np.ascontiguousarray(np.asarray(w, np.float32).astype(np.float16)))
    wt16 = cuda.device_array((w16.shape[0], w16.shape[2], w16.shape[1]), np.float16)
    transpose_weights_kernel[min(1024, cdiv(w16.size, 256)), 256](w16, wt16)
    return x16, wt16


class TensorImplicitGemm:
    """The implicit GEMM through a pair table (maps.Pairs) on FP16 tensor cores; its rows grouped
    by mask as implicit.ImplicitGemm's (grouping.py), in tiles of BM rows."""

    def __init__(self, pairs, group=True, stream=0, grouped=None):
        """grouped: (order, tile_masks) already made in tiles of BM rows (onelaunch.MapBuilder)."""
        self.neighbours, self.inputs = pairs.neighbours, pairs.inputs
        self.order, self.tile_masks = grouping.row_order(pairs.masks, BM, group, stream, grouped)

    def __call__(self, x16, wt16, out, stream=0):
        """x16 (inputs, C) float16, wt16 (27, K, C) float16 (to_half), out (N, K) float32; C a multiple
        of 8 (rows of whole 16-byte chunks), K at most 8 * MAX_TILES; x16 and wt16 16-byte aligned."""
        x16 = require(x16, "x16", dtype=np.float16, ndim=2)
        wt16 = require(wt16, "wt16", dtype=np.float16, ndim=3)
        C, K = x16.shape[1], wt16.shape[1]
        if C % 8 or wt16.shape[2] != C:
            raise ValueError(f"x16 has {C} channels and wt16 shape {tuple(wt16.shape)}: the tensor-core kernel "
                             "takes C a multiple of 8 (rows of 16-byte chunks) and wt16 (27, K, C); pad the channels "
                             "with zeros")
        if not (aligned(x16, 16) and aligned(wt16, 16)):
            raise ValueError("x16 and wt16 must start on a 16-byte boundary (cp.async copies 16 bytes): "
                             "pass whole device arrays, not views that start mid-row")
        if K > 8 * MAX_TILES:
            raise ValueError(f"K = {K} output channels: this kernel holds at most {8 * MAX_TILES}")
        if ON_GPU:
            capability.require(*NEEDS, what="the tensor-core implicit GEMM")
        m = self
        if x16.shape[0] != m.inputs:
            raise ValueError(f"x16 has {x16.shape[0]} rows, the maps have {m.inputs} input sites")
        if wt16.shape[0] != TAPS:
            raise ValueError(f"wt16 has shape {tuple(wt16.shape)}, expected ({TAPS}, K, C)")
        out = require(out, "out", dtype=np.float32, shape=(m.neighbours.shape[0], K))
        tensor_kernel(K)[cdiv(out.shape[0], BM), THREADS, stream](x16, wt16, m.neighbours, m.order, m.tile_masks, out)
        return out
