"""The convolution on tensor cores: chapter 04's implicit GEMM, channels last, inside the pipelined GEMM.

With x in NHWC (N, H, W, C) and the filters in KRSC (K, R, S, C), a convolution is the GEMM

    out[(n, p, q), k] = sum over (r, s, c) of  A[(n, p, q), (r, s, c)] * w[k, (r, s, c)]
    A[(n, p, q), (r, s, c)] = x[n, p*sh - ph + r*dh, q*sw - pw + s*dw, c]   (0 outside the image)

and for one tap (r, s) the C channels of a pixel lie side by side in memory. So when C is a whole
number of 16-byte chunks, every chunk of A's tile is 16 contiguous bytes of x, or lies wholly in the
padding: cp.async copies it, or zero-fills it (source bytes 0). That is the whole gather. The rest is
pipelined.py's FP16/TF32 GEMM: 128x128 block tiles, three stages, swizzled ldmatrix, 64x64 per warp.

- **A (the gather).** A thread copies chunk tid % 4 of rows tid / 4 + 32i of the tile, as plan_rows
  does. Before its loop it divides once per row, (n, p, q) from the row, and keeps where the pixel's
  window starts (top, left) and its offset in x. The depth of its chunk, (r, s, c), is a counter
  advanced by BK a step, with no division in the loop.
- **B (the filters).** w viewed as (K, R*S*C) is B^T in rows of depth: the same 64-byte-row tile as
  A, copied by plan_rows/issue_rows and read by ldmatrix without transpose in both precisions (for
  16-bit data the untransposed 8x8 matrix of B^T is the mma's B fragment, as for 32-bit).
- **TF32**: both operands rounded in registers (half a TF32 unit added to the bits, pipelined.py).
- **The output** (N*P*Q, K) is out in NHWC, written by pipelined.store_warp_tile; or, for a caller
  that goes on in NCHW (chapter 08's BatchNorm), (N, K, P*Q) (`layout="nchw"`): each value put
  where its pixel and channel go.
"""

import numpy as np
from numba import cuda, float32, int32, uint32

from workbook.tensor_cores import cp_async16, ldmatrix_x4, make_mainloop, swizzled_chunk_64

from .pipelined import (BK_F16, BK_TF32, BM, BN, CHUNK_F16, CHUNK_TF32, HALF_TF32_UNIT, MI, NI, STAGES, THREADS,
                        WM, WN, f16_multiply, issue_rows, plan_rows, store_warp_tile, tf32_multiply)

ROWS_A_THREAD = BM * 4 // THREADS  # rows of A's tile a thread copies a chunk of: 4, 32 apart
OUTSIDE = -(1 << 30)  # a row past M starts its window here: never inside the image


def make_gather(BK, STAGE):
    """The gather of A's tile for stages of BK elements of depth (STAGE elements a stage): a thread's
    4 chunks, rows 32 apart, and the depth counter it advances a step at a time. Shared by this
    kernel and wgmma.py's, which place the chunks differently (`to`: where row `tid / units`'s chunk
    goes; the others are 32 rows = 32 BK elements further)."""

    @cuda.jit(device=True)
    def issue_gather(x, a_s, stage, to, start, top, left, depth, H, W, C, dh, dw, inside):
        """cp.async of this thread's 4 chunks of A's tile at depth (c, s, r) into `stage`: each 16
        bytes of x at pixel (top + r*dh, left + s*dw), channels c.., or zeros in the padding."""
        c, s, r = depth
        dy, dx = r * dh, s * dw
        shift = int32((dy * W + dx) * C + c)  # x has < 2^31 elements (conv_geometry checks)
        for i in range(ROWS_A_THREAD):
            y, v = top[i] + dy, left[i] + dx
            ok = inside and 0 <= y and y < H and 0 <= v and v < W
            cp_async16(a_s, stage * STAGE + to + 32 * i * BK, x, start[i] + shift, 16 if ok else 0)

    @cuda.jit(device=True)
    def advance(depth, C, S):
        """(c, s, r) one step (BK) deeper: channels first, then the filter's columns, then its rows."""
        c, s, r = depth
        c += BK
        while c >= C:  # once a step when C >= BK
            c -= C
            s += 1
            if s == S:
                s = 0
                r += 1
        return c, s, r

    return issue_gather, advance


@cuda.jit(device=True)
def window_starts(row0, row, M, PQ, Q, H, W, C, sh, sw, ph, pw, start, top, left):
    """This thread's rows row0 + row + 32i of A, divided once: where each pixel's window starts
    (top, left), and its offset in x (channel 0 at that corner: outside the image, never read)."""
    for i in range(ROWS_A_THREAD):
        m = row0 + row + 32 * i
        n = m // PQ
        p = (m - n * PQ) // Q
        q = m - n * PQ - p * Q
        top[i] = p * sh - ph if m < M else OUTSIDE
        left[i] = q * sw - pw
        start[i] = ((n * H + top[i]) * W + left[i]) * C


@cuda.jit(device=True)
def first_depth(col, C, S):
    """(c, s, r) of depth `col`, the chunk's first column in the first step."""
    tap = col // C
    return col - tap * C, tap % S, tap // S


@cuda.jit(device=True)
def output_rows(out, PQ):
    """M = N*P*Q, the GEMM's rows, from an output (M, K) (channels last)."""
    return out.shape[0]


@cuda.jit(device=True)
def output_rows_nchw(out, PQ):
    """M from an output (N, K, P*Q) (channels first)."""
    return out.shape[0] * PQ


@cuda.jit(device=True)
def pixel(out, m, PQ):
    """Row m = (n, p, q) of the GEMM as (n, p*Q + q) of an (N, K, P*Q) output (n >= N past its end)."""
    n = m // PQ
    return n, m - n * PQ


@cuda.jit(device=True)
def store_nhwc(out, acc, row0, col0, lane, PQ):
    store_warp_tile(out, acc, row0, col0, lane)


@cuda.jit(device=True)
def store_nchw(out, acc, row0, col0, lane, PQ):
    """pipelined.store_warp_tile's walk over the accumulators into an (N, K, P*Q) output: a row's
    pixel found once, its 16 values stored down the channels. A warp's lanes g hold 8 consecutive
    rows: 8 neighbouring pixels of one channel per store."""
    g, t = lane // 4, lane % 4
    for i in range(MI):
        for half in range(2):
            n, at = pixel(out, row0 + 16 * i + g + 8 * half, PQ)
            if n < out.shape[0]:
                for j in range(NI):
                    for e in range(2):
                        k = col0 + 8 * j + 2 * t + e
                        if k < out.shape[1]:
                            out[n, k, at] = acc[(i * NI + j) * 4 + 2 * half + e]


OUTPUTS = {"nhwc": (output_rows, store_nhwc), "nchw": (output_rows_nchw, store_nchw)}


def make_conv_kernel(precision, layout="nhwc"):
    """The implicit-GEMM convolution kernel for "f16" (float16 x and w) or "tf32" (float32); its
    output channels last ("nhwc", out (N*P*Q, K)) or first ("nchw", out (N, K, P*Q))."""
    rows_of, store = OUTPUTS[layout]
    f16 = precision == "f16"
    BK, CHUNK = (BK_F16, CHUNK_F16) if f16 else (BK_TF32, CHUNK_TF32)
    STAGE = BM * BK  # elements of one stage of a tile (B's tile is BN x BK, BN = BM)
    TILE_STAGES = STAGES * STAGE
    shared_type = np.float16 if f16 else np.uint32  # TF32 kept as float32 bits
    ROUND = uint32(0) if f16 else HALF_TF32_UNIT
    multiply = f16_multiply if f16 else tf32_multiply  # the GEMM's: acc += A fragments x B fragments
    ACCUMULATORS, A_REGISTERS, B_REGISTERS = MI * NI * 4, MI * 4, NI * 2

    issue_gather, advance = make_gather(BK, STAGE)

    @cuda.jit(device=True)
    def fragments(a_s, b_s, stage, kk, lane, wm, wn, frag_a, frag_b):
        """k slice kk of a stage (k16 FP16, k8 TF32): two chunks of each 64-byte row. A: row
        wm + 16i + lane % 16, chunk 2kk + lane / 16. B^T, two n8 tiles a load: row wn + 8j +
        8 (lane / 16) + lane % 8, chunk 2kk + (lane / 8) % 2. Both swizzled by the row's bits 1-2."""
        high = lane // 16
        a_at = stage * STAGE + (wm + lane % 16) * BK + swizzled_chunk_64(lane % 16, 2 * kk + high) * CHUNK
        for i in range(MI):
            regs = ldmatrix_x4(a_s, a_at + 16 * i * BK)
            for q in range(4):
                frag_a[4 * i + q] = regs[q] + ROUND
        n = wn + 8 * high + lane % 8
        b_at = stage * STAGE + n * BK + swizzled_chunk_64(lane % 8, 2 * kk + (lane // 8) % 2) * CHUNK
        for j in range(0, NI, 2):
            regs = ldmatrix_x4(b_s, b_at + 8 * j * BK)
            for q in range(4):
                frag_b[2 * j + q] = regs[q] + ROUND

    @cuda.jit(device=True)
    def issue(operands, depth, stage, step):
        """A's chunks gathered from the image, B's copied as rows of depth; the depth this thread's
        chunk reaches next (make_mainloop's state)."""
        x, wt, a_s, b_s, to, start, top, left, H, W, C, S, dh, dw, col, KD, plan_b, lane, wm, wn = operands
        issue_gather(x, a_s, stage, to, start, top, left, depth, H, W, C, dh, dw, step * BK + col < KD)
        issue_rows(wt, b_s, plan_b, stage, step * BK, BK)
        return advance(depth, C, S)

    @cuda.jit(device=True)
    def stage_fragments(operands, stage, half, frag_a, frag_b):
        x, wt, a_s, b_s, to, start, top, left, H, W, C, S, dh, dw, col, KD, plan_b, lane, wm, wn = operands
        fragments(a_s, b_s, stage, half, lane, wm, wn, frag_a, frag_b)

    mainloop = make_mainloop(issue, stage_fragments, multiply, STAGES)

    @cuda.jit
    def conv_implicit(x, wt, out, H, W, C, PQ, Q, S, sh, sw, ph, pw, dh, dw):
        """out (N*P*Q, K) or (N, K, P*Q) = the convolution of x (N*H*W*C, flat, NHWC) with wt (K, R*S*C) (KRSC)."""
        M, KD = rows_of(out, PQ), wt.shape[1]
        a_s = cuda.shared.array(TILE_STAGES, shared_type)
        b_s = cuda.shared.array(TILE_STAGES, shared_type)
        acc = cuda.local.array(ACCUMULATORS, float32)
        a0, a1 = cuda.local.array(A_REGISTERS, uint32), cuda.local.array(A_REGISTERS, uint32)
        b0, b1 = cuda.local.array(B_REGISTERS, uint32), cuda.local.array(B_REGISTERS, uint32)
        for i in range(ACCUMULATORS):
            acc[i] = 0
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        wm, wn = warp // (BN // WN) * WM, warp % (BN // WN) * WN
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        steps = (KD + BK - 1) // BK

        start = cuda.local.array(ROWS_A_THREAD, int32)
        top = cuda.local.array(ROWS_A_THREAD, int32)
        left = cuda.local.array(ROWS_A_THREAD, int32)
        row, chunk = tid // 4, tid % 4
        window_starts(row0, row, M, PQ, Q, H, W, C, sh, sw, ph, pw, start, top, left)
        to = (row * 4 + swizzled_chunk_64(row, chunk)) * CHUNK  # as plan_rows places its chunks
        col = chunk * CHUNK  # the chunk's first column in a step
        plan_b = plan_rows(wt, tid, col0, CHUNK)
        operands = (x, wt, a_s, b_s, to, start, top, left, H, W, C, S, dh, dw, col, KD, plan_b, lane, wm, wn)
        mainloop(operands, first_depth(col, C, S), steps, acc, a0, a1, b0, b1)  # pipelined.gemm_f16_pipelined's
        store(out, acc, row0 + wm, col0 + wn, lane, PQ)

    return conv_implicit


KERNELS = {precision: make_conv_kernel(precision) for precision in ("f16", "tf32")}
NCHW_KERNELS = {precision: make_conv_kernel(precision, "nchw") for precision in ("f16", "tf32")}


def grid_for(M, K):
    return ((K + BN - 1) // BN, (M + BM - 1) // BM)
