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
mma wants it by columns). TF32: BK = 16 floats (again 64 bytes a row of A, so A's swizzle and its
copies are the same). ldmatrix has no 32-bit transpose, so the wrapper first writes B^T, rounded to
TF32 (transpose_to_tf32), and the kernel copies and reads B^T's rows as it does A's. A's values are
rounded in registers as CUTLASS rounds them: half a TF32 unit added to the bits (HALF_TF32_UNIT),
the 13 low bits then dropped by the tensor core, which is cvt.rna's result for every finite value,
in one integer add.

Shapes: any M; K and N multiples of 8 (FP16) or 4 (TF32), so that every row of A and B starts on a
16-byte boundary, which cp.async requires (the wrapper says so). The ragged edges of the tiles are
zero-filled by cp.async (source bytes 0..16).
"""

import numpy as np
from numba import cuda, float32, uint32

from workbook.tensor_cores import (cp_async16, ldmatrix_x4, ldmatrix_x4_trans, make_mainloop, mma_f16, mma_tf32,
                                   swizzled_chunk_64, swizzled_chunk_128, to_tf32)

BM, BN = 128, 128  # the block's tile of C
WM, WN = 64, 64  # each warp's tile of C
WARPS = (BM // WM) * (BN // WN)
THREADS = 32 * WARPS
MI, NI = WM // 16, WN // 8  # mma tiles per warp: 4 x 8, 32 accumulators of 4 floats each
STAGES = 3  # steps in flight: 3 x (A + B) = 48 KB of shared memory, numba's static limit
BK_F16, BK_TF32 = 32, 16  # depth of a step: 64 bytes of a row of A either way
CHUNK_F16, CHUNK_TF32 = 8, 4  # elements per 16-byte chunk
# numba sizes shared and local arrays from constants only
A_STAGES_F16, B_STAGES_F16 = STAGES * BM * BK_F16, STAGES * BK_F16 * BN
A_STAGES_TF32, B_STAGES_TF32 = STAGES * BM * BK_TF32, STAGES * BN * BK_TF32
ACCUMULATORS, A_REGISTERS, B_REGISTERS = MI * NI * 4, MI * 4, NI * 2
# TF32 rounding as CUTLASS does it: add half a TF32 unit to the float32's bits, and let the tensor
# core drop the 13 bits below TF32's last place. The same as cvt.rna (to_tf32) for every finite
# value, one integer add instead of a conversion.
HALF_TF32_UNIT = uint32(0x1000)


@cuda.jit(device=True)
def plan_rows(x, tid, first_row, CHUNK):
    """This thread's share of every step's copies of a 128-row tile of 64-byte rows (4 chunks of 16
    bytes: A in both precisions, B^T in TF32), rows first_row.. of x: 512 chunks, 4 a thread, chunk
    tid % 4 of rows tid / 4 + 32i. Stepping 32 rows leaves a row's swizzle (its bits 1-2) as it is,
    so the four chunks are one stride apart in global and in shared memory. Worked out once: where
    the first comes from and goes to, the rows left, the chunk's first column."""
    r, ch = tid // 4, tid % 4
    return ((first_row + r) * x.shape[1] + ch * CHUNK, (r * 4 + swizzled_chunk_64(r, ch)) * CHUNK,
            x.shape[0] - first_row - r, ch * CHUNK)


@cuda.jit(device=True)
def issue_rows(x, x_s, plan, stage, k0, BK):
    """cp.async of the tile at depth k0 into `stage`; chunks past an edge read nothing and are
    zero-filled (source bytes 0: their address is never used). K is a multiple of the chunk, so a
    chunk is all in or all out."""
    source, to, rows_left, col = plan
    K = x.shape[1]
    inside = k0 + col < K
    for i in range(4):
        ok = inside and 32 * i < rows_left
        cp_async16(x_s, stage * BM * BK + to + 32 * i * BK, x, source + 32 * i * K + k0, 16 if ok else 0)


B_ROW = BN // CHUNK_F16  # FP16's B tile: 32 rows of 16 chunks
B_ROWS_APART = THREADS // B_ROW  # rows between one thread's chunks of it


@cuda.jit(device=True)
def plan_b_f16(b, tid, col0):
    """The same for FP16's B tile (BK_F16 rows of K, 128 columns of N): chunk tid % 16 of rows
    tid / 16 + 8i, swizzled by the row's bits 0-2, which stepping 8 rows leaves as they are."""
    rb, cb = tid // B_ROW, tid % B_ROW
    return (rb * b.shape[1] + col0 + cb * CHUNK_F16, (rb * B_ROW + swizzled_chunk_128(rb, cb)) * CHUNK_F16, rb,
            col0 + cb * CHUNK_F16 < b.shape[1])


@cuda.jit(device=True)
def issue_b_f16(b, b_s, plan, stage, k0):
    source, to, row, inside = plan
    K, N = b.shape
    for i in range(4):
        ok = inside and k0 + row + B_ROWS_APART * i < K
        cp_async16(b_s, stage * BK_F16 * BN + to + B_ROWS_APART * i * BN, b, source + (k0 + B_ROWS_APART * i) * N,
                   16 if ok else 0)


@cuda.jit(device=True)
def f16_fragments(a_s, b_s, stage, kk, lane, wm, wn, frag_a, frag_b):
    """The warp's A fragments (4 x 16 rows) and B fragments (8 x 8 columns) of k16 slice kk of a
    stage. A: row wm + 16i + lane % 16, chunk 2kk + lane / 16, swizzled by the row's bits 1-2 (16i
    leaves them). B (x4.trans, two n8 tiles a load): row 16kk + lane % 16, chunk wn / 8 + j + lane / 16,
    swizzled by the row's bits 0-2."""
    high = lane // 16
    a_at = stage * BM * BK_F16 + (wm + lane % 16) * BK_F16 + swizzled_chunk_64(lane % 16, 2 * kk + high) * CHUNK_F16
    for i in range(MI):
        regs = ldmatrix_x4(a_s, a_at + 16 * i * BK_F16)
        for q in range(4):
            frag_a[4 * i + q] = regs[q]
    b_at = stage * BK_F16 * BN + (16 * kk + lane % 16) * BN
    for j in range(0, NI, 2):
        regs = ldmatrix_x4_trans(b_s, b_at + swizzled_chunk_128(lane, wn // 8 + j + high) * CHUNK_F16)
        for q in range(4):
            frag_b[2 * j + q] = regs[q]


def make_multiply(mma):
    """The warp's 4 x 8 mma tiles with `mma` (mma_f16 or mma_tf32): acc += A fragments x B fragments."""
    @cuda.jit(device=True)
    def multiply(frag_a, frag_b, acc):
        for i in range(MI):
            for j in range(NI):
                base = (i * NI + j) * 4
                d = mma((frag_a[4 * i], frag_a[4 * i + 1], frag_a[4 * i + 2], frag_a[4 * i + 3]),
                        (frag_b[2 * j], frag_b[2 * j + 1]), (acc[base], acc[base + 1], acc[base + 2], acc[base + 3]))
                for q in range(4):
                    acc[base + q] = d[q]
    return multiply


f16_multiply, tf32_multiply = make_multiply(mma_f16), make_multiply(mma_tf32)


@cuda.jit(device=True)
def issue_f16(operands, state, stage, step):
    """This thread's copies of a step of A and B (FP16) into a stage (make_mainloop's issue)."""
    a, b, a_s, b_s, plan_a, plan_b, lane, wm, wn = operands
    issue_rows(a, a_s, plan_a, stage, step * BK_F16, BK_F16)
    issue_b_f16(b, b_s, plan_b, stage, step * BK_F16)
    return state


@cuda.jit(device=True)
def fragments_f16(operands, stage, half, frag_a, frag_b):
    a, b, a_s, b_s, plan_a, plan_b, lane, wm, wn = operands
    f16_fragments(a_s, b_s, stage, half, lane, wm, wn, frag_a, frag_b)  # BK_F16 = 32: two k16 halves


f16_mainloop = make_mainloop(issue_f16, fragments_f16, f16_multiply, STAGES)


@cuda.jit
def gemm_f16_pipelined(a, b, c):
    """c = a @ b; a (M, K), b (K, N) float16, c (M, N) float32; K and N multiples of 8."""
    K = a.shape[1]
    a_s = cuda.shared.array(A_STAGES_F16, np.float16)
    b_s = cuda.shared.array(B_STAGES_F16, np.float16)
    acc = cuda.local.array(ACCUMULATORS, float32)
    # two sets of fragments: both halves of a step are loaded before the first is multiplied, so
    # that the second half's ldmatrix latency hides behind the first half's mma
    a0, a1 = cuda.local.array(A_REGISTERS, uint32), cuda.local.array(A_REGISTERS, uint32)
    b0, b1 = cuda.local.array(B_REGISTERS, uint32), cuda.local.array(B_REGISTERS, uint32)
    for i in range(ACCUMULATORS):
        acc[i] = 0
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    wm, wn = warp // (BN // WN) * WM, warp % (BN // WN) * WN
    row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    steps = (K + BK_F16 - 1) // BK_F16
    plan_a, plan_b = plan_rows(a, tid, row0, CHUNK_F16), plan_b_f16(b, tid, col0)
    f16_mainloop((a, b, a_s, b_s, plan_a, plan_b, lane, wm, wn), 0, steps, acc, a0, a1, b0, b1)
    store_warp_tile(c, acc, row0 + wm, col0 + wn, lane)


@cuda.jit(device=True)
def tf32_fragments(a_s, bt_s, stage, kk, lane, wm, wn, frag_a, frag_b):
    """k8 slice kk of a stage. On 32-bit data ldmatrix's "pair" is one float, and a 16-byte row is 4
    of them: lane L gets column L % 4 of row L / 4, which is TF32's A fragment (rows of A) and its
    B fragment (rows of B^T: b0 = B[k = t, n = g] = B^T[g, t]). Both tiles are 64-byte rows of
    K-slices, with A's swizzle. A's values are rounded here; B^T was rounded when it was made."""
    high = lane // 16
    a_at = stage * BM * BK_TF32 + (wm + lane % 16) * BK_TF32 + swizzled_chunk_64(lane % 16, 2 * kk + high) * CHUNK_TF32
    for i in range(MI):  # matrices: rows 0-7 | 8-15 of the m16 tile, at chunks 2kk | 2kk + 1
        regs = ldmatrix_x4(a_s, a_at + 16 * i * BK_TF32)
        for q in range(4):
            frag_a[4 * i + q] = regs[q] + HALF_TF32_UNIT
    # matrices: n rows 0-7 of tile j at chunks 2kk | 2kk + 1, then tile j + 1's: (b0, b1) of j, of j + 1
    n = wn + 8 * high + lane % 8
    b_at = stage * BN * BK_TF32 + n * BK_TF32 + swizzled_chunk_64(lane % 8, 2 * kk + (lane // 8) % 2) * CHUNK_TF32
    for j in range(0, NI, 2):
        regs = ldmatrix_x4(bt_s, b_at + 8 * j * BK_TF32)
        for q in range(4):
            frag_b[2 * j + q] = regs[q]


@cuda.jit(device=True)
def issue_tf32(operands, state, stage, step):
    """This thread's copies of a step of A and B^T (TF32) into a stage: both are rows of K."""
    a, bt, a_s, bt_s, plan_a, plan_b, lane, wm, wn = operands
    issue_rows(a, a_s, plan_a, stage, step * BK_TF32, BK_TF32)
    issue_rows(bt, bt_s, plan_b, stage, step * BK_TF32, BK_TF32)
    return state


@cuda.jit(device=True)
def fragments_tf32(operands, stage, half, frag_a, frag_b):
    a, bt, a_s, bt_s, plan_a, plan_b, lane, wm, wn = operands
    tf32_fragments(a_s, bt_s, stage, half, lane, wm, wn, frag_a, frag_b)  # BK_TF32 = 16: two k8 halves


tf32_mainloop = make_mainloop(issue_tf32, fragments_tf32, tf32_multiply, STAGES)


@cuda.jit
def gemm_tf32_pipelined(a, bt, c):
    """c = a @ bt.T; a (M, K), bt (N, K) float32, B transposed and already rounded to TF32
    (transpose_to_tf32), c (M, N); K a multiple of 4."""
    K = a.shape[1]
    a_s = cuda.shared.array(A_STAGES_TF32, uint32)  # float32 bits
    bt_s = cuda.shared.array(B_STAGES_TF32, uint32)
    acc = cuda.local.array(ACCUMULATORS, float32)
    a0, a1 = cuda.local.array(A_REGISTERS, uint32), cuda.local.array(A_REGISTERS, uint32)
    b0, b1 = cuda.local.array(B_REGISTERS, uint32), cuda.local.array(B_REGISTERS, uint32)
    for i in range(ACCUMULATORS):
        acc[i] = 0
    tid = cuda.threadIdx.x
    warp, lane = tid // 32, tid % 32
    wm, wn = warp // (BN // WN) * WM, warp % (BN // WN) * WN
    row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    steps = (K + BK_TF32 - 1) // BK_TF32
    plan_a = plan_rows(a, tid, row0, CHUNK_TF32)  # both operands are rows of K: one plan each
    plan_b = plan_rows(bt, tid, col0, CHUNK_TF32)
    tf32_mainloop((a, bt, a_s, bt_s, plan_a, plan_b, lane, wm, wn), 0, steps, acc, a0, a1, b0, b1)
    store_warp_tile(c, acc, row0 + wm, col0 + wn, lane)


TRANSPOSE = 32  # a 32 x 32 tile a block of 32 x 8 threads
TRANSPOSE_TILE = (TRANSPOSE, TRANSPOSE + 1)  # a constant, as numba sizes shared arrays


@cuda.jit
def transpose_to_tf32(b, bt):
    """bt = b.T rounded to TF32 (cvt.rna); b (K, N), bt (N, K). Through a 32 x 33 shared tile, so that
    both the reads and the writes are whole rows (coalesced) and the tile's columns fall on 32 banks."""
    tile = cuda.shared.array(TRANSPOSE_TILE, float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    x, y = cuda.blockIdx.x * TRANSPOSE + tx, cuda.blockIdx.y * TRANSPOSE + ty
    for r in range(0, TRANSPOSE, 8):
        if y + r < b.shape[0] and x < b.shape[1]:
            tile[ty + r, tx] = to_tf32(b[y + r, x])
    cuda.syncthreads()
    x, y = cuda.blockIdx.y * TRANSPOSE + tx, cuda.blockIdx.x * TRANSPOSE + ty
    for r in range(0, TRANSPOSE, 8):
        if y + r < bt.shape[0] and x < bt.shape[1]:
            bt[y + r, x] = tile[tx, ty + r]


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
