"""Optimized: block tiles staged in shared memory by cp.async, three stages deep, read by ldmatrix
from a swizzled layout; each warp multiplies a 64x64 tile of C held in registers.

A block computes a BM x BN = 128 x 128 tile of C with 4 warps (2 x 2, 64 x 64 each). Per step of
BK along K it needs a 128 x BK tile of A and a BK x 128 tile of B. Three ideas, one per stage of
the chapter:

- **Shared tiles.** Each A and B element is fetched from global memory once per block, not once
  per warp: 128 / 16 = 8 times fewer A reads than the naive kernel's warps, 128 / 8 = 16 times fewer
  B reads.
- **cp.async, three stages.** A tile is copied global -> shared without passing through registers,
  and while the warps multiply step k, the copies of steps k+1 and k+2 are in flight:
  `cp_async_wait(STAGES - 2)` waits only for the oldest group. Nothing stalls on memory as long as
  two steps of copying take less time than one step of math.
- **ldmatrix, swizzled.** One ldmatrix_x4 hands a warp a whole 16x16 A fragment (FP16) from eight
  16-byte rows per matrix. With rows one after the other, the eight rows of a matrix sit 64 or 256
  bytes apart, on the same 4-byte banks: a 4- or 8-way bank conflict. The swizzle stores 16-byte
  chunk c of row r at chunk c XOR f(r), so the eight rows a matrix reads fall on eight different
  bank groups, and the cp.async writes stay whole 16-byte chunks.

FP16: BK = 32 halves (64 bytes a row of A), B's fragments by ldmatrix_x4_trans (B is K x N, the
mma wants it by columns). TF32: BK = 16 floats (again 64 bytes a row of A, so A's swizzle is the
same); ldmatrix has no 32-bit transpose, so B's fragments are loaded as single floats, from rows
swizzled so that the 32 lanes hit 32 different banks. Each A and B value is rounded to TF32 as
CUTLASS rounds it: half a TF32 unit added to its bits (HALF_TF32_UNIT), the rest of the 13 low bits
dropped by the tensor core, which is cvt.rna's result for every finite value, in one integer add.

Shapes: any M; K and N multiples of 8 (FP16) or 4 (TF32), so that every row of A and B starts on a
16-byte boundary, which cp.async requires (the wrapper says so). The ragged edges of the tiles are
zero-filled by cp.async (source bytes 0..16).
"""

from numba import cuda, float32, uint32
import numpy as np

from workbook.tensor_cores import (cp_async16, cp_async_commit, cp_async_wait, ldmatrix_x4, ldmatrix_x4_trans,
                                   mma_f16, mma_tf32)

BM, BN = 128, 128  # the block's tile of C
WM, WN = 64, 64  # each warp's tile of C
WARPS = (BM // WM) * (BN // WN)
THREADS = 32 * WARPS
MI, NI = WM // 16, WN // 8  # mma tiles per warp: 4 x 8, 32 accumulators of 4 floats each
STAGES = 3  # tiles in flight: 3 x (A + B) = 48 KB of shared memory, numba's static limit
WAIT_FOR = STAGES - 2  # groups still in flight after a wait: the two tiles behind the one used
BK_F16, BK_TF32 = 32, 16  # depth of a step: 64 bytes of a row of A either way
CHUNK_F16, CHUNK_TF32 = 8, 4  # elements per 16-byte chunk
# numba sizes shared and local arrays from constants only
A_STAGES_F16, B_STAGES_F16 = STAGES * BM * BK_F16, STAGES * BK_F16 * BN
A_STAGES_TF32, B_STAGES_TF32 = STAGES * BM * BK_TF32, STAGES * BK_TF32 * BN
ACCUMULATORS, A_REGISTERS, B_REGISTERS = MI * NI * 4, MI * 4, NI * 2
# TF32 rounding as CUTLASS does it: add half a TF32 unit to the float32's bits, and let the tensor
# core drop the 13 bits below TF32's last place. The same as cvt.rna (to_tf32) for every finite
# value, one integer add instead of a conversion.
HALF_TF32_UNIT = uint32(0x1000)


@cuda.jit(device=True)
def issue(a, b, a_s, b_s, step, tid, row0, col0, BK, CHUNK):
    """cp.async of step `step`'s A tile (BM rows x 4 chunks: 64 bytes a row) and B tile (BK rows x
    BN / CHUNK chunks) into stage step % STAGES, zero-filled past the edges. 512 chunks each, 4 per
    thread: thread tid copies chunk tid % 4 of A rows tid / 4 + 32i, and chunk tid % B_ROW of B
    rows tid / B_ROW + (THREADS / B_ROW)i. Those steps of rows do not change a row's swizzle (bits
    1-2 of the row for A, bits 0-2 or 0-1 for B), so each thread's four chunks are one stride apart."""
    M, K = a.shape
    N = b.shape[1]
    B_ROW = BN // CHUNK  # chunks in a row of the B tile: 16 (FP16) or 32 (TF32)
    B_ROWS = THREADS // B_ROW  # B rows one pass of the block covers
    stage, k0 = step % STAGES, step * BK
    r, ch = tid // 4, tid % 4
    col = k0 + ch * CHUNK
    a_to = stage * BM * BK + (r * 4 + (ch ^ ((r >> 1) & 3))) * CHUNK
    for i in range(4):
        row = row0 + r + 32 * i
        ok = row < M and col < K  # K is a multiple of CHUNK: a chunk is all in or all out
        cp_async16(a_s, a_to + 32 * i * BK, a, row * K + col if ok else 0, 16 if ok else 0)
    rb, cb = tid // B_ROW, tid % B_ROW
    col = col0 + cb * CHUNK
    swizzle = (rb & 7) if CHUNK == 8 else ((rb & 3) << 1)  # TF32's B is read a float at a time
    b_to = stage * BK * BN + (rb * B_ROW + (cb ^ swizzle)) * CHUNK
    for i in range(4):
        row = k0 + rb + B_ROWS * i
        ok = row < K and col < N
        cp_async16(b_s, b_to + B_ROWS * i * BN, b, row * N + col if ok else 0, 16 if ok else 0)


@cuda.jit
def gemm_f16_pipelined(a, b, c):
    """c = a @ b; a (M, K), b (K, N) float16, c (M, N) float32; K and N multiples of 8."""
    K = a.shape[1]
    a_s = cuda.shared.array(A_STAGES_F16, np.float16)
    b_s = cuda.shared.array(B_STAGES_F16, np.float16)
    acc = cuda.local.array(ACCUMULATORS, float32)
    frag_a = cuda.local.array(A_REGISTERS, uint32)
    frag_b = cuda.local.array(B_REGISTERS, uint32)
    for i in range(ACCUMULATORS):
        acc[i] = 0
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    wm, wn = warp // (BN // WN) * WM, warp % (BN // WN) * WN
    row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    steps = (K + BK_F16 - 1) // BK_F16
    # Where this lane's ldmatrix rows start, less what changes with the stage, kk, i and j. A: row
    # wm + 16i + lane % 16, chunk 2kk + lane / 16, swizzled by bits 1-2 of the row (16i keeps them).
    # B: row 16kk + lane % 16, chunk wn / 8 + j + lane / 16, swizzled by the row's bits 0-2.
    high = lane // 16
    a_lane, a_swizzle = (wm + lane % 16) * BK_F16, ((lane % 16) >> 1) & 3
    b_lane = (lane % 16) * BN + wn

    for s in range(STAGES - 1):  # the prologue: the first steps' copies in flight
        if s < steps:
            issue(a, b, a_s, b_s, s, tid, row0, col0, BK_F16, CHUNK_F16)
        cp_async_commit()  # a group per step, empty or not, so that the count below stays right
    for step in range(steps):
        cp_async_wait(WAIT_FOR)  # this thread's copies of `step` have landed ...
        cuda.syncthreads()  # ... and everyone's; and everyone is done with step - 1's stage
        if step + STAGES - 1 < steps:  # refill step - 1's stage with a later step
            issue(a, b, a_s, b_s, step + STAGES - 1, tid, row0, col0, BK_F16, CHUNK_F16)
        cp_async_commit()
        stage = step % STAGES
        for kk in range(BK_F16 // 16):
            a_at = stage * BM * BK_F16 + a_lane + (((2 * kk + high) ^ a_swizzle) * CHUNK_F16)
            for i in range(MI):  # A: rows wm + 16i + (lane % 16), chunk 2kk + lane / 16
                regs = ldmatrix_x4(a_s, a_at + 16 * i * BK_F16)
                for q in range(4):
                    frag_a[4 * i + q] = regs[q]
            b_at = stage * BK_F16 * BN + b_lane + 16 * kk * BN
            for j in range(0, NI, 2):  # B, two n8 tiles at a time: k rows 16kk + (lane % 16)
                regs = ldmatrix_x4_trans(b_s, b_at + ((j + high) ^ (lane & 7)) * CHUNK_F16)
                for q in range(4):
                    frag_b[2 * j + q] = regs[q]
            for i in range(MI):
                for j in range(NI):
                    base = (i * NI + j) * 4
                    d = mma_f16((frag_a[4 * i], frag_a[4 * i + 1], frag_a[4 * i + 2], frag_a[4 * i + 3]),
                                (frag_b[2 * j], frag_b[2 * j + 1]),
                                (acc[base], acc[base + 1], acc[base + 2], acc[base + 3]))
                    for q in range(4):
                        acc[base + q] = d[q]
    store_warp_tile(c, acc, row0 + wm, col0 + wn, lane)


@cuda.jit
def gemm_tf32_pipelined(a, b, c):
    """c = a @ b; a (M, K), b (K, N), c (M, N) float32 (TF32 multiplies); K and N multiples of 4."""
    K = a.shape[1]
    a_s = cuda.shared.array(A_STAGES_TF32, uint32)  # float32 bits
    b_s = cuda.shared.array(B_STAGES_TF32, uint32)
    acc = cuda.local.array(ACCUMULATORS, float32)
    frag_a = cuda.local.array(A_REGISTERS, uint32)
    frag_b = cuda.local.array(B_REGISTERS, uint32)
    for i in range(ACCUMULATORS):
        acc[i] = 0
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    g, t = lane // 4, lane % 4
    wm, wn = warp // (BN // WN) * WM, warp % (BN // WN) * WN
    row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    steps = (K + BK_TF32 - 1) // BK_TF32
    high = lane // 16
    a_lane, a_swizzle = (wm + lane % 16) * BK_TF32, ((lane % 16) >> 1) & 3  # as in the FP16 kernel

    for s in range(STAGES - 1):
        if s < steps:
            issue(a, b, a_s, b_s, s, tid, row0, col0, BK_TF32, CHUNK_TF32)
        cp_async_commit()
    for step in range(steps):
        cp_async_wait(WAIT_FOR)
        cuda.syncthreads()
        if step + STAGES - 1 < steps:
            issue(a, b, a_s, b_s, step + STAGES - 1, tid, row0, col0, BK_TF32, CHUNK_TF32)
        cp_async_commit()
        stage = step % STAGES
        for kk in range(BK_TF32 // 8):
            a_at = stage * BM * BK_TF32 + a_lane + (((2 * kk + high) ^ a_swizzle) * CHUNK_TF32)
            for i in range(MI):  # on 32-bit data, ldmatrix's "pair" is one float: TF32's A layout
                regs = ldmatrix_x4(a_s, a_at + 16 * i * BK_TF32)
                for q in range(4):
                    frag_a[4 * i + q] = regs[q] + HALF_TF32_UNIT
            b_at = stage * BK_TF32 * BN + (8 * kk + t) * BN
            for j in range(NI):  # b0 = B[k = 8kk + t, n = wn + 8j + g], b1 = B[k + 4, n]; k's bits 0-1 are t's
                n = wn + 8 * j + g
                at = b_at + (((n >> 2) ^ (t << 1)) << 2) + (n & 3)
                frag_b[2 * j] = b_s[at] + HALF_TF32_UNIT
                frag_b[2 * j + 1] = b_s[at + 4 * BN] + HALF_TF32_UNIT
            for i in range(MI):
                for j in range(NI):
                    base = (i * NI + j) * 4
                    d = mma_tf32((frag_a[4 * i], frag_a[4 * i + 1], frag_a[4 * i + 2], frag_a[4 * i + 3]),
                                 (frag_b[2 * j], frag_b[2 * j + 1]),
                                 (acc[base], acc[base + 1], acc[base + 2], acc[base + 3]))
                    for q in range(4):
                        acc[base + q] = d[q]
    store_warp_tile(c, acc, row0 + wm, col0 + wn, lane)


@cuda.jit(device=True)
def store_warp_tile(c, acc, row0, col0, lane):
    """The warp's 64x64 tile of C from its accumulators: lane (g, t) of mma tile (i, j) holds
    rows g and g + 8, columns 2t and 2t + 1 (two neighbours: one 8-byte store each)."""
    g, t = lane // 4, lane % 4
    for i in range(MI):
        for j in range(NI):
            for half in range(2):
                row, col = row0 + 16 * i + g + 8 * half, col0 + 8 * j + 2 * t
                if row < c.shape[0]:
                    if col < c.shape[1]:
                        c[row, col] = acc[(i * NI + j) * 4 + 2 * half]
                    if col + 1 < c.shape[1]:
                        c[row, col + 1] = acc[(i * NI + j) * 4 + 2 * half + 1]


def grid_for(M, N):
    return ((N + BN - 1) // BN, (M + BM - 1) // BM)
