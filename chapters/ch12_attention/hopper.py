"""Attention forward on Hopper's warpgroup MMA (wgmma, sm_90a): fused.py's loop with both products
on wgmma, head dimension 128.

What changes from the mma.sync kernel (fused.py) is who holds the operands. mma.sync wants every
operand in registers, so each warp reads its fragments of Q, K and V from shared memory by ldmatrix
at every tile; wgmma reads them from shared memory itself, described by 64-bit descriptors
(chapter 09b), and a warpgroup (4 warps) multiplies 64 rows by 128 columns in one instruction.

- **A block**: two warpgroups, 64 queries each (BM = 128); tiles of BN = 128 keys, so S of a tile
  is one 64 x 128 wgmma accumulator a warpgroup: 64 floats a thread, in mma's C layout.
- **Shared memory, in wgmma's layout.** Q, K and V are stored as panels of 64 columns (128 bytes a
  row, the 128-byte swizzle), the panels of one tile one after the other. Three stages of K and V:
  tile j + 1 is copied (cp.async) into the stage that tile j - 2 used, after the barrier that
  follows every warpgroup's last read of it.
- **S = Q K^T** is 8 wgmma, 16 of the depth each: A is the warpgroup's 64 rows of Q, B^T the
  tile's 128 rows of K, both K-major, as chapter 09b's GEMM reads them.
- **O += P V from registers.** The online softmax (fused.py's) turns S's accumulators into P, two
  FP16 at a time; an accumulator tile's layout is mma's A fragment, so P never goes to shared
  memory: `wgmma_f16_from_registers` takes it as A. V is keys x columns, row-major: for O = P V its
  rows are the depth (K) and its columns N, "N-major", which wgmma reads as it is (transposed B,
  `n_major_descriptor`): 8 wgmma, 16 keys each.
- **Asynchronous.** P V is committed and not waited for: the next tile's Q K^T queues behind it on
  the tensor cores, and the wait for S waits for both. O is rescaled only after that wait.

Masks, the causal bound, rows with no finite score and NaN: as in fused.py. make_forward(causal)
compiles one kernel per mask; head dimension 128 only (wgmma's N is 128 here, and O's columns are N).
"""

import math

import numpy as np
from numba import cuda, float32, uint32

from workbook.tensor_cores import (SWIZZLE_ATOM, SWIZZLE_ROW, WGMMA_ACCUMULATORS, cp_async16, cp_async_commit,
                                   cp_async_wait, fence_proxy_async, n_major_descriptor, pack_f16x2, shared_address,
                                   shared_descriptor, swizzled_chunk_128, wgmma_commit, wgmma_f16,
                                   wgmma_f16_from_registers, wgmma_fence, wgmma_wait)

D = 128  # the head dimension
WARPGROUPS = 2
THREADS = 128 * WARPGROUPS
BM = 64 * WARPGROUPS  # queries of a block
BN = 128  # keys of a tile: wgmma's N
STAGES = 3
WIDTH = SWIZZLE_ROW // 2  # halves in a panel's row: 64 columns
PANEL = BN * WIDTH  # halves in a panel of a 128-row tile (Q's tile is 128 rows too)
TILE = 2 * PANEL  # halves in a tile of Q, K or V: D = 2 panels
UNITS = D // 8  # 16-byte units in a row of D
ROWS_APART = THREADS // UNITS  # a thread copies unit tid % 16 of rows tid // 16 + 16i
FULL = 0xFFFFFFFF
NEG_INF = float32(-math.inf)
P_REGISTERS = WGMMA_ACCUMULATORS // 2  # P's A fragments: two FP16 a register
K_STEPS = D // 16  # wgmma of Q K^T: 16 of the depth each
V_STEPS = BN // 16  # wgmma of P V: 16 keys each
describe = cuda.jit(device=True)(shared_descriptor)
describe_n_major = cuda.jit(device=True)(n_major_descriptor)


def shared_bytes():
    """Q's tile and three stages of a K and a V tile, and room to align them to 1024 bytes."""
    return (TILE + STAGES * 2 * TILE) * 2 + SWIZZLE_ATOM


@cuda.jit(device=True, forceinline=True)
def aligned(smem):
    """Halves from the dynamic array's start to the first 1024-byte boundary: the swizzle's atoms
    must be aligned, and the array's start need not be."""
    return (SWIZZLE_ATOM - shared_address(smem, 0) % SWIZZLE_ATOM) % SWIZZLE_ATOM // 2


@cuda.jit(device=True, forceinline=True)
def copy_tile(smem, at, x, start, rows_left, tid):
    """cp.async of 128 rows of x (flattened, D halves a row) from element `start` into the tile at
    smem[at..]: unit u of row r goes to panel u // 8, row r, unit (u % 8) swizzled; rows past
    rows_left are zero-filled."""
    row, unit = tid // UNITS, tid % UNITS
    to = at + (unit // 8) * PANEL + swizzled_chunk_128(row, unit % 8) * 8
    for i in range(BN // ROWS_APART):  # stepping 16 rows keeps the row's swizzle
        r = row + ROWS_APART * i
        cp_async16(smem, to + r * WIDTH, x, start + r * D + unit * 8, 16 if r < rows_left else 0)


@cuda.jit(device=True, forceinline=True)
def online_softmax(s, acc, pa, m_run, l_run, half, scale_log2):
    """Row g + 8·half of the warp's 16: its new maximum, the rescale of its sum and its O, its P."""
    top = m_run[half]
    for j in range(BN // 8):
        top = max(top, max(s[4 * j + 2 * half], s[4 * j + 2 * half + 1]))
    top = max(top, cuda.shfl_xor_sync(FULL, top, 1))  # the four lanes of a row
    top = max(top, cuda.shfl_xor_sync(FULL, top, 2))
    shift = float32(0) if top == NEG_INF else top * scale_log2
    alpha = math.exp2(m_run[half] * scale_log2 - shift)
    m_run[half] = top
    total = l_run[half] * alpha
    for c in range(D // 8):
        acc[4 * c + 2 * half] *= alpha
        acc[4 * c + 2 * half + 1] *= alpha
    for j in range(BN // 8):
        p0 = math.exp2(s[4 * j + 2 * half] * scale_log2 - shift)
        p1 = math.exp2(s[4 * j + 2 * half + 1] * scale_log2 - shift)
        total += p0 + p1
        # accumulator tile j is half of the A fragment of keys 16(j // 2)..: a0 (row g), a1 (row
        # g + 8) of an even tile, a2 and a3 of an odd one
        pa[4 * (j // 2) + 2 * (j % 2) + half] = pack_f16x2(p0, p1)
    l_run[half] = total


def make_forward(causal):
    @cuda.jit(fastmath={"contract", "afn"})
    def attention_wgmma(q, k, v, o, scale_log2):
        """o = softmax(q k^T scale) v per head; q, k, v, o (heads, N, 128); scale_log2 = scale·log2 e."""
        smem = cuda.shared.array(0, np.float16)
        n = q.shape[1]
        head, block = cuda.blockIdx.y, cuda.blockIdx.x
        if causal:  # the last queries see the most keys: their blocks start first
            block = cuda.gridDim.x - 1 - block
        m0 = block * BM
        tid = cuda.threadIdx.x
        wg, lane = tid // 128, tid % 32
        g, t = lane // 4, lane % 4
        first_row = m0 + 64 * wg + 16 * (tid % 128 // 32) + g  # the thread's rows: first_row and + 8
        head_start = head * n * D
        tiles = (n + BN - 1) // BN
        if causal:
            tiles = min(tiles, (m0 + BM + BN - 1) // BN)  # the last tile holding a key <= the last query

        pad = aligned(smem)
        copy_tile(smem, pad, q, head_start + m0 * D, n - m0, tid)  # Q, and tile 0 of K and V: one group
        copy_tile(smem, pad + TILE, k, head_start, n, tid)
        copy_tile(smem, pad + 2 * TILE, v, head_start, n, tid)
        cp_async_commit()
        q_at = shared_address(smem, pad) + 64 * WIDTH * 2 * wg  # the warpgroup's 64 rows of each panel

        acc = cuda.local.array(WGMMA_ACCUMULATORS, float32)  # O: row g (+ 8), columns 8c + 2t (+ 1)
        for i in range(WGMMA_ACCUMULATORS):
            acc[i] = 0
        s = cuda.local.array(WGMMA_ACCUMULATORS, float32)
        pa = cuda.local.array(P_REGISTERS, uint32)
        m_run = cuda.local.array(2, float32)
        l_run = cuda.local.array(2, float32)
        for r in range(2):
            m_run[r] = NEG_INF
            l_run[r] = 0

        for j in range(tiles):
            cp_async_wait(0)  # this thread's copies of tile j have landed
            fence_proxy_async()  # ... visible to wgmma's reads
            cuda.syncthreads()  # everyone's; and every warpgroup is past its wait for P V of tile j - 2
            if j + 1 < tiles:  # tile j + 1 into that tile's stage
                at = pad + TILE + ((j + 1) % STAGES) * 2 * TILE
                copy_tile(smem, at, k, head_start + (j + 1) * BN * D, n - (j + 1) * BN, tid)
                copy_tile(smem, at + TILE, v, head_start + (j + 1) * BN * D, n - (j + 1) * BN, tid)
            cp_async_commit()
            k_at = shared_address(smem, pad + TILE + (j % STAGES) * 2 * TILE)
            v_at = k_at + TILE * 2

            for i in range(WGMMA_ACCUMULATORS):
                s[i] = 0
            wgmma_fence()
            for kk in range(K_STEPS):  # S = Q K^T: panel kk // 4, 32 bytes further along its rows each
                offset = (kk // 4) * PANEL * 2 + (kk % 4) * 32
                wgmma_f16(s, describe(q_at + offset, SWIZZLE_ATOM), describe(k_at + offset, SWIZZLE_ATOM))
            wgmma_commit()
            wgmma_wait(0)  # S of this tile, and P V of the last

            key0 = j * BN
            if key0 + BN > n or (causal and key0 + BN - 1 > first_row):  # a key past N or after a query
                for jt in range(BN // 8):
                    for r in range(4):
                        key = key0 + 8 * jt + 2 * t + r % 2
                        if key >= n or (causal and key > first_row + 8 * (r // 2)):
                            s[4 * jt + r] = NEG_INF
            online_softmax(s, acc, pa, m_run, l_run, 0, scale_log2)
            online_softmax(s, acc, pa, m_run, l_run, 1, scale_log2)

            wgmma_fence()  # O and P were written by this thread's instructions
            for ks in range(V_STEPS):  # O += P V: keys 16ks.., rows 16ks.. of V's panels
                wgmma_f16_from_registers(acc, (pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3]),
                                         describe_n_major(v_at + ks * 16 * SWIZZLE_ROW, PANEL * 2))
            wgmma_commit()
        wgmma_wait(0)

        for half in range(2):
            total = l_run[half]
            total += cuda.shfl_xor_sync(FULL, total, 1)
            total += cuda.shfl_xor_sync(FULL, total, 2)
            inverse = float32(0) if total == 0 else float32(1) / total  # no finite score: 0, not 0/0
            row = first_row + 8 * half
            if row < n:
                for c in range(D // 8):
                    col = 8 * c + 2 * t
                    o[head, row, col] = acc[4 * c + 2 * half] * inverse
                    o[head, row, col + 1] = acc[4 * c + 2 * half + 1] * inverse

    return attention_wgmma
