"""Chapter 09 — exercises: tensor cores from numba.

Each exercise is the code between `# >>> ch09.N` and `# <<< ch09.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch09` (or run the exercise cells of the chapter's
notebook). The instructions are workbook/tensor_cores.py's; its docstring has the fragment tables.
Every mma and ldmatrix is executed by all 32 lanes of a warp together.
"""

import numpy as np
from numba import cuda, float32

from chapters.ch09_tensor_cores.naive import THREADS, WARPS, at, blocks_for, store_tile, warp_tile
from workbook.inputs import require
from workbook.tensor_cores import (cp_async16, cp_async_commit, cp_async_wait, ldmatrix_x2_trans, ldmatrix_x4, mma_f16,
                                   mma_tf32, pack_f16x2, to_tf32)

def _gemm_args(a, b, c, dtype):
    a = require(a, "a", dtype=dtype, ndim=2)
    b = require(b, "b", dtype=dtype, ndim=2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    c = require(c, "c", dtype=np.float32, shape=(a.shape[0], b.shape[1]))
    return a, b, c, blocks_for(a.shape[0], b.shape[1])


# ---------------------------------------------------------------------------------------------
# ch09.1 (complete the fragments) — one warp per 16x8 tile of C = A @ B with TF32 tensor cores
# (the chapter's naive kernel, naive.py: `at`, `warp_tile` and `store_tile` are its).
#
# mma_tf32(a, b, c) multiplies the warp's 16x8 slice of A (16 rows, 8 columns of depth) by its 8x8
# slice of B. Lane (g, t), g = lane // 4 and t = lane % 4, holds these elements (row, column), each
# rounded with to_tf32 (use `at`, which reads zero past the edges):
#   A: a0 (g, t)   a1 (g + 8, t)   a2 (g, t + 4)   a3 (g + 8, t + 4)
#   B: b0 (k = t, n = g)   b1 (k = t + 4, n = g)
# offset by the tile's first row (row0), first column (col0) and the depth step (k0).


@cuda.jit
def gemm_tf32_tile_kernel(a, b, c):
    K = a.shape[1]
    lane, row0, col0 = warp_tile(c)  # the chapter's: WARPS tiles a block
    if row0 >= c.shape[0]:  # the whole warp leaves together
        return
    g, t = lane // 4, lane % 4
    acc = (float32(0), float32(0), float32(0), float32(0))
    for k0 in range(0, K, 8):
        # >>> ch09.1 (stub 00bbbbf7)
        raise NotImplementedError("ch09.1: frag_a (4 values) and frag_b (2 values) of lane (g, t), rounded to TF32")
        # <<< ch09.1
        acc = mma_tf32(frag_a, frag_b, acc)
    store_tile(c, row0, col0, lane, acc)


def gemm_tf32_tile(a, b, c):
    """c = a @ b, float32 in and out, TF32 multiplies; any shape."""
    a, b, c, blocks = _gemm_args(a, b, c, np.float32)
    gemm_tf32_tile_kernel[blocks, THREADS](a, b, c)
    return c


# ---------------------------------------------------------------------------------------------
# ch09.2 (fix the pipeline) — column sums of x (rows, 128) float32, a tile of 32 rows at a time
# copied into shared memory by cp.async, two stages: while the block sums tile t, tile t + 1 is on
# its way. One block of 128 threads; thread j owns column j. Each thread copies one 16-byte chunk
# of each tile's rows (32 rows x 32 chunks = 1024 chunks, 8 a thread), zero-filled past the last row.
#
# The kernel below returns wrong sums (the check says which columns). A cp.async lands in shared
# memory only once the thread that issued it waits for its group (cp_async_wait(n): until at most n
# of its groups are still in flight), and other threads see it only after that and a barrier. Fix it.

TILE_ROWS, COLUMNS = 32, 128
TILE = TILE_ROWS * COLUMNS  # floats in a stage
STAGES_SIZE = 2 * TILE  # a constant: numba sizes shared arrays from constants only


@cuda.jit(device=True)
def copy_tile(x, stages, stage, tile, tid):
    rows = x.shape[0]
    for i in range(TILE // 4 // (COLUMNS)):  # 8 chunks a thread: rows tid // 32 + 4i, chunk tid % 32
        row, chunk = tid // 32 + 4 * i, tid % 32
        source_row = tile * TILE_ROWS + row
        inside = source_row < rows
        cp_async16(stages, stage * TILE + row * COLUMNS + chunk * 4, x, source_row * COLUMNS + chunk * 4 if inside else 0,
                   16 if inside else 0)


@cuda.jit
def column_sums_kernel(x, out):
    stages = cuda.shared.array(STAGES_SIZE, float32)
    tid = cuda.threadIdx.x
    tiles = (x.shape[0] + TILE_ROWS - 1) // TILE_ROWS
    copy_tile(x, stages, 0, 0, tid)
    cp_async_commit()
    total = float32(0)
    for tile in range(tiles):
        if tile + 1 < tiles:
            copy_tile(x, stages, (tile + 1) % 2, tile + 1, tid)
        cp_async_commit()  # a group per tile, empty or not
        # >>> ch09.2 (stub ec1d3129)
        cuda.syncthreads()  # every thread's copies of `tile` have landed?
        # <<< ch09.2
        base = (tile % 2) * TILE
        for row in range(TILE_ROWS):
            total += stages[base + row * COLUMNS + tid]
        cuda.syncthreads()  # everyone is done with this stage before it is refilled
    out[tid] = total


def column_sums(x, out):
    """out[j] = sum of x[:, j]; x (rows, 128) float32, out (128,) float32."""
    x = require(x, "x", dtype=np.float32, ndim=2)
    if x.shape[1] != COLUMNS:
        raise ValueError(f"x must have {COLUMNS} columns, not {x.shape[1]}")
    out = require(out, "out", dtype=np.float32, shape=(COLUMNS,))
    column_sums_kernel[1, COLUMNS](x, out)
    return out


# ---------------------------------------------------------------------------------------------
# ch09.3 (complete the address) — one warp per 16x8 tile of C = A @ B in FP16, A and B staged in
# shared memory first: the warp's 16x16 slice of A (row-major, 16 halves a row) and 16x8 slice of B
# (8 halves a row). ldmatrix_x4(s, i) reads four 8x8 matrices: lane L gives the address (the flat
# index i) of row L % 8 of matrix L // 8, and the lanes get back exactly the mma's A registers if
# the matrices are, in order: rows 0-7 and columns 0-7 of the slice, rows 8-15 and columns 0-7,
# rows 0-7 and columns 8-15, rows 8-15 and columns 8-15. Complete `a_row_start`: the flat index in
# `a_s` of the row lane `lane` points at. (B's is done: ldmatrix_x2_trans, lane L points at row L
# of the 16x8 slice.)


@cuda.jit
def gemm_f16_ldmatrix_kernel(a, b, c):
    a_s = cuda.shared.array((WARPS, 256), np.float16)  # each warp's 16x16 slice of A
    b_s = cuda.shared.array((WARPS, 128), np.float16)  # and its 16x8 slice of B
    K = a.shape[1]
    warp = cuda.threadIdx.x // 32
    lane, row0, col0 = warp_tile(c)
    if row0 >= c.shape[0]:  # the whole warp leaves together; no barrier below, only syncwarp
        return
    acc = (float32(0), float32(0), float32(0), float32(0))
    for k0 in range(0, K, 16):
        for i in range(lane, 256, 32):  # the slices, zero past the edges
            a_s[warp, i] = at(a, row0 + i // 16, k0 + i % 16)
        for i in range(lane, 128, 32):
            b_s[warp, i] = at(b, k0 + i // 8, col0 + i % 8)
        cuda.syncwarp()
        # >>> ch09.3 (stub 52d9b1a9)
        raise NotImplementedError("ch09.3: a_row_start = the flat index in a_s[warp] of the row lane `lane` gives ldmatrix")
        # <<< ch09.3
        frag_a = ldmatrix_x4(a_s[warp], a_row_start)
        frag_b = ldmatrix_x2_trans(b_s[warp], (lane % 16) * 8)
        acc = mma_f16(frag_a, frag_b, acc)
        cuda.syncwarp()  # all lanes have read the slices before they are overwritten
    store_tile(c, row0, col0, lane, acc)


def gemm_f16_ldmatrix(a, b, c):
    """c = a @ b; a, b float16, c float32; any shape."""
    a, b, c, blocks = _gemm_args(a, b, c, np.float16)
    gemm_f16_ldmatrix_kernel[blocks, THREADS](a, b, c)
    return c


# ---------------------------------------------------------------------------------------------
# ch09.4 (make it faster) — the naive FP16 kernel: one warp per 16x8 tile of C, every fragment
# element loaded from global memory. For each 16x8 tile a warp loads a 16x16 fragment of A (8
# scattered 2-byte loads a lane) to use it in one mma; its neighbours to the right load the very
# same rows again. Make each warp compute a 16 x TILE_N tile: load the A fragment once a step and
# use it for TILE_N / 8 mma, one per 8 columns, each with its own B fragment and accumulators. The
# wrapper launches one warp per 16 x TILE_N tile (wide_tile). Target: at least 1.5x the
# chapter's naive FP16 kernel on a GPU, same run (in the simulator: the global-memory traffic).


@cuda.jit(device=True)
def wide_tile(c, width):
    """(lane, first row, first column) of this warp's 16 x width tile of c: WARPS tiles a block,
    row after row of tiles."""
    tile = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    across = (c.shape[1] + width - 1) // width
    return cuda.threadIdx.x % 32, tile // across * 16, tile % across * width


# >>> ch09.4 (stub 8c80ad17)
TILE_N = 8  # columns of C a warp computes: 8, one mma tile, as the naive kernel


@cuda.jit
def gemm_f16_wide_kernel(a, b, c):
    K = a.shape[1]
    lane, row0, col0 = wide_tile(c, TILE_N)
    if row0 >= c.shape[0]:  # the whole warp leaves together
        return
    g, t = lane // 4, lane % 4
    acc = (float32(0), float32(0), float32(0), float32(0))
    for k0 in range(0, K, 16):
        r, k = row0 + g, k0 + 2 * t  # a register holds two neighbours along k
        frag_a = (pack_f16x2(at(a, r, k), at(a, r, k + 1)), pack_f16x2(at(a, r + 8, k), at(a, r + 8, k + 1)),
                  pack_f16x2(at(a, r, k + 8), at(a, r, k + 9)), pack_f16x2(at(a, r + 8, k + 8), at(a, r + 8, k + 9)))
        n = col0 + g
        frag_b = (pack_f16x2(at(b, k, n), at(b, k + 1, n)), pack_f16x2(at(b, k + 8, n), at(b, k + 9, n)))
        acc = mma_f16(frag_a, frag_b, acc)
    store_tile(c, row0, col0, lane, acc)
# <<< ch09.4


def gemm_f16_wide(a, b, c):
    """c = a @ b; a, b float16, c float32; any shape."""
    a, b, c, _ = _gemm_args(a, b, c, np.float16)
    tiles = ((a.shape[0] + 15) // 16) * ((b.shape[1] + TILE_N - 1) // TILE_N)
    gemm_f16_wide_kernel[max(1, (tiles + WARPS - 1) // WARPS), THREADS](a, b, c)
    return c
