"""On an H100: the GEMM and the convolution on wgmma, the warpgroup MMA (sm_90a).

mma.sync is the Ampere instruction: a warp, a 16x8 tile, operands in registers. The H100 has its
own, `wgmma.mma_async`: a warpgroup (4 warps, 128 threads) multiplies a 64-row tile of A by a
128-column tile of B, both read straight from shared memory through 64-bit descriptors, into 64
accumulators a thread, asynchronously (commit a group, wait for it later). No ldmatrix, no
fragments in registers: the instructions between two wgmma are the copies and the barrier.

- **The tiles' layout is the instruction's.** wgmma reads K-major tiles in one of a few layouts; the
  fast one is the 128-byte swizzle: rows of 128 bytes (64 halves, 32 floats of K), 16-byte unit u of
  row r at unit u ^ (r % 8), in 1024-byte atoms of 8 rows, aligned to 1024 bytes. cp.async writes
  each 16-byte chunk where the swizzle puts it. (Without a swizzle, in 8x16-byte "core matrices",
  the same kernel is several times slower: EXPERIMENTS.md has the runs.)
- **B^T, K-major.** Both tiles are rows of K: the GEMM multiplies A by B^T (a linear layer's
  weights, (out, in), are B^T already), the convolution by its filters in KRSC.
- **A block**: two warpgroups, a 128x128 tile of C, each warpgroup 64x128 (4 wgmma a step, 32 bytes
  of K each); three stages of 128 bytes of K (96 KB of dynamic shared memory), copied two steps
  ahead. Each step: wait for this thread's copies, `fence_proxy_async` (so that wgmma, which reads
  through the "async proxy", sees them), barrier, `wgmma_fence`, 4 wgmma, commit, the next copies,
  `wgmma_wait(0)`: the step's wgmma done before the next barrier lets anyone refill its stage.
- **TF32 truncates here**: wgmma reads float32 bits from shared memory and drops the low 13; there
  is no register pass to round them in. Its reference truncates too (reference.py "tf32-truncated").

Shapes: any M and N (rows past them zero-filled, the epilogue guarded); K, and C for the
convolution, multiples of 16 bytes of elements, as for the pipelined kernels.
"""

import numpy as np
from numba import cuda, float32, int32

from workbook.tensor_cores import (SWIZZLE_ATOM, SWIZZLE_ROW, WGMMA_ACCUMULATORS, cp_async16, cp_async_commit,
                                   cp_async_wait, fence_proxy_async, shared_address, shared_descriptor, wgmma_commit,
                                   swizzled_chunk_128, wgmma_f16, wgmma_fence, wgmma_tf32, wgmma_wait)

from .conv import OUTPUTS, ROWS_A_THREAD, first_depth, make_gather, pixel, window_starts

BM, BN = 128, 128  # the block's tile of C
THREADS = 256  # two warpgroups, 64 rows each
STAGES = 3
WAIT_FOR = STAGES - 2  # copy groups still in flight after a wait
UNITS = SWIZZLE_ROW // 16  # 16-byte units in a tile row a stage: 8
ROWS_APART = THREADS // UNITS  # a thread's chunks of a tile: unit tid % 8 of rows tid / 8 + 32i
INSTRUCTIONS = SWIZZLE_ROW // 32  # wgmma a step: 32 bytes of K each
descriptor = cuda.jit(device=True)(shared_descriptor)


def shared_bytes():
    """Dynamic shared memory a block asks for: three stages of A and B^T, and room to align them."""
    return 2 * STAGES * BM * SWIZZLE_ROW + SWIZZLE_ATOM


def make_kernels(precision, layout="nhwc"):
    """(gemm, conv) for "f16" (float16 data) or "tf32" (float32 data, truncated to TF32); the
    convolution's output channels last ("nhwc") or first ("nchw", as conv.py's)."""
    rows_of = OUTPUTS[layout][0]
    dtype = np.float16 if precision == "f16" else np.float32
    ITEM = np.dtype(dtype).itemsize
    EL = 16 // ITEM  # elements a 16-byte unit
    BK = UNITS * EL  # elements of K a stage
    STAGE = BM * BK  # elements of one tile's stage (A's and B^T's are both 128 rows)
    B_AT = STAGES * STAGE  # B^T's stages follow A's in the one dynamic array
    wgmma = wgmma_f16 if precision == "f16" else wgmma_tf32
    issue_gather, advance = make_gather(BK, STAGE)

    @cuda.jit(device=True)
    def aligned(smem):
        """Elements from the dynamic array's start to the first 1024-byte boundary: the swizzle's
        atoms must be aligned, and the array's start need not be."""
        return (SWIZZLE_ATOM - shared_address(smem, 0) % SWIZZLE_ATOM) % SWIZZLE_ATOM // ITEM

    @cuda.jit(device=True)
    def place(row, unit):
        """Where unit `unit` of tile row `row` goes in a stage, swizzled (elements)."""
        return (row * UNITS + swizzled_chunk_128(row, unit)) * EL

    @cuda.jit(device=True)
    def issue_rows(x, smem, at, first_row, k0, tid):
        """cp.async of this thread's 4 chunks of a 128 x BK tile of x (rows first_row.., K-major) to
        `at`; past x's rows or K: zero-filled."""
        K = x.shape[1]
        row, unit = tid // UNITS, tid % UNITS
        inside = k0 + unit * EL < K
        for i in range(ROWS_A_THREAD):
            ok = inside and first_row + row + ROWS_APART * i < x.shape[0]
            cp_async16(smem, at + place(row, unit) + ROWS_APART * i * BK, x,
                       (first_row + row + ROWS_APART * i) * K + k0 + unit * EL, 16 if ok else 0)

    @cuda.jit(device=True)
    def multiply(acc, base, stage, wg):
        """The warpgroup's 64 x 128 tile += its 64 rows of A's stage x the 128 rows of B^T's: 4 wgmma,
        each 32 bytes further along the rows, one commit group."""
        wgmma_fence()
        for kk in range(INSTRUCTIONS):
            a_at = base + (stage * STAGE + wg * 64 * BK) * ITEM + 32 * kk
            b_at = base + (B_AT + stage * STAGE) * ITEM + 32 * kk
            wgmma(acc, descriptor(a_at), descriptor(b_at))
        wgmma_commit()

    @cuda.jit(device=True)
    def store(c, acc, row0, col0, tid):
        """The warpgroup's tile of C: warp w holds rows 16w + g and + 8, acc[4j + q] at column 8j + 2t + q % 2."""
        wg, w, lane = tid // 128, tid % 128 // 32, tid % 32
        g, t = lane // 4, lane % 4
        for j in range(BN // 8):
            for q in range(4):
                row, col = row0 + 64 * wg + 16 * w + g + 8 * (q // 2), col0 + 8 * j + 2 * t + q % 2
                if row < c.shape[0] and col < c.shape[1]:
                    c[row, col] = acc[4 * j + q]

    if layout == "nhwc":
        @cuda.jit(device=True)
        def store_conv(out, acc, row0, col0, tid, PQ):
            store(out, acc, row0, col0, tid)
    else:
        @cuda.jit(device=True)
        def store_conv(out, acc, row0, col0, tid, PQ):
            """store's walk into an (N, K, P*Q) output: each of the thread's two rows' pixel found once."""
            wg, w, lane = tid // 128, tid % 128 // 32, tid % 32
            g, t = lane // 4, lane % 4
            for half in range(2):
                n, at = pixel(out, row0 + 64 * wg + 16 * w + g + 8 * half, PQ)
                if n < out.shape[0]:
                    for j in range(BN // 8):
                        for e in range(2):
                            k = col0 + 8 * j + 2 * t + e
                            if k < out.shape[1]:
                                out[n, k, at] = acc[4 * j + 2 * half + e]

    @cuda.jit
    def gemm_wgmma(a, bt, c):
        """c = a @ bt.T; a (M, K), bt (N, K), c (M, N) float32."""
        K = a.shape[1]
        smem = cuda.shared.array(0, dtype)
        acc = cuda.local.array(WGMMA_ACCUMULATORS, float32)
        for i in range(WGMMA_ACCUMULATORS):
            acc[i] = 0
        tid = cuda.threadIdx.x
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        steps = (K + BK - 1) // BK
        pad = aligned(smem)
        for s in range(STAGES - 1):
            if s < steps:
                issue_rows(a, smem, pad + s * STAGE, row0, s * BK, tid)
                issue_rows(bt, smem, pad + B_AT + s * STAGE, col0, s * BK, tid)
            cp_async_commit()
        base = shared_address(smem, pad)
        read, write = 0, STAGES - 1
        for step in range(steps):
            cp_async_wait(WAIT_FOR)  # this thread's copies of `step` have landed
            fence_proxy_async()  # ... and are visible to wgmma's reads
            cuda.syncthreads()  # everyone's; every wgmma of step - 1 has finished
            multiply(acc, base, read, tid // 128)
            if step + STAGES - 1 < steps:  # refill step - 1's stage
                issue_rows(a, smem, pad + write * STAGE, row0, (step + STAGES - 1) * BK, tid)
                issue_rows(bt, smem, pad + B_AT + write * STAGE, col0, (step + STAGES - 1) * BK, tid)
            cp_async_commit()
            wgmma_wait(0)  # this step's wgmma done: nobody reads its stage after the next barrier
            read = read + 1 if read < STAGES - 1 else 0
            write = write + 1 if write < STAGES - 1 else 0
        store(c, acc, row0, col0, tid)

    @cuda.jit
    def conv_wgmma(x, wt, out, H, W, C, PQ, Q, S, sh, sw, ph, pw, dh, dw):
        """out (N*P*Q, K) or (N, K, P*Q) = the convolution of x (N*H*W*C, flat, NHWC) with wt (K, R*S*C) (KRSC)."""
        M, KD = rows_of(out, PQ), wt.shape[1]
        smem = cuda.shared.array(0, dtype)
        acc = cuda.local.array(WGMMA_ACCUMULATORS, float32)
        for i in range(WGMMA_ACCUMULATORS):
            acc[i] = 0
        tid = cuda.threadIdx.x
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        steps = (KD + BK - 1) // BK
        pad = aligned(smem)
        start = cuda.local.array(ROWS_A_THREAD, int32)
        top = cuda.local.array(ROWS_A_THREAD, int32)
        left = cuda.local.array(ROWS_A_THREAD, int32)
        row, unit = tid // UNITS, tid % UNITS
        window_starts(row0, row, M, PQ, Q, H, W, C, sh, sw, ph, pw, start, top, left)
        to = pad + place(row, unit)
        col = unit * EL
        depth = first_depth(col, C, S)
        for s in range(STAGES - 1):
            if s < steps:
                issue_gather(x, smem, s, to, start, top, left, depth, H, W, C, dh, dw, s * BK + col < KD)
                issue_rows(wt, smem, pad + B_AT + s * STAGE, col0, s * BK, tid)
                depth = advance(depth, C, S)
            cp_async_commit()
        base = shared_address(smem, pad)
        read, write = 0, STAGES - 1
        for step in range(steps):
            cp_async_wait(WAIT_FOR)
            fence_proxy_async()
            cuda.syncthreads()
            multiply(acc, base, read, tid // 128)
            k0 = (step + STAGES - 1) * BK
            if k0 < KD:
                issue_gather(x, smem, write, to, start, top, left, depth, H, W, C, dh, dw, k0 + col < KD)
                issue_rows(wt, smem, pad + B_AT + write * STAGE, col0, k0, tid)
                depth = advance(depth, C, S)
            cp_async_commit()
            wgmma_wait(0)
            read = read + 1 if read < STAGES - 1 else 0
            write = write + 1 if write < STAGES - 1 else 0
        store_conv(out, acc, row0, col0, tid, PQ)

    return gemm_wgmma, conv_wgmma


KERNELS = {precision: make_kernels(precision) for precision in ("f16", "tf32")}
NCHW_KERNELS = {precision: make_kernels(precision, "nchw")[1] for precision in ("f16", "tf32")}


def grid_for(M, N):
    return ((N + BN - 1) // BN, (M + BM - 1) // BM)
