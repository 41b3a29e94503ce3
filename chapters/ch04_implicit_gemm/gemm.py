"""Chapter 04's tiled GEMM: the kernel both convolutions end in, and its host wrapper.

make_gemm_kernel(tile, quads=..., quad_outputs=...) assembles the kernel from the tile's parts
(tiles.py: the arithmetic; tile_memory.py: loads, stores, epilogue; schedule.py: the work share).
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32

from workbook.inputs import require

from .schedule import launch_gemm, make_schedule
from .tile_memory import make_epilogue, make_tile_loads
from .tiles import jit_options, layout, make_tile_math, pick_tile, quad_outputs_fit, quads_fit, register


@lru_cache(maxsize=None)
def make_gemm_kernel(tile, *, quads=False, quad_outputs=False):
    """gemm_kernel(a, b, PQ, c) with the tiling of `tile`; quads: 16-byte loads of a and b
    (tiles.quads_fit); quad_outputs: 16-byte stores of c (tiles.quad_outputs_fit)."""
    BM, BN, BK, TM, TN = tile.BM, tile.BN, tile.BK, tile.TM, tile.TN
    A_PITCH = layout(tile).A_PITCH
    tile_math = make_tile_math(tile)
    thread_position, multiply_tile = tile_math.thread_position, tile_math.multiply_tile
    load_a_tile, store_a_tile, load_b_tile, store_b_tile, A_LOADS, B_LOADS = make_tile_loads(tile, quads=quads)
    epilogue = make_epilogue(tile, quad_outputs=quad_outputs)
    block_share, start_tile_run = make_schedule(tile)
    options, _ = jit_options(tile)

    @cuda.jit(**options)
    def gemm_kernel(a, b, PQ, c):
        """c[n, m, pq] = (a @ b)[m, n*PQ + pq]; a (M, KD), b (KD, NC), c (NC/PQ, M, PQ)."""
        M, KD = a.shape
        NC = b.shape[1]
        t = cuda.threadIdx.x
        tx, ty = thread_position(t)
        a_s = cuda.shared.array((2, BK, A_PITCH), float32)  # A tile, transposed: a_s[k, m]
        b_s = cuda.shared.array((2, BK, BN), float32)
        acc = cuda.local.array((TM, TN), float32)  # registers: indexed by unrolled constants only
        ra = cuda.local.array((2, TM), float32)  # this thread's fragments of A and B (two with PREFETCH)
        rb = cuda.local.array((2, TN), float32)
        next_a = cuda.local.array(A_LOADS, float32)  # the next tile, in flight
        next_b = cuda.local.array(B_LOADS, float32)
        tiles_across, steps = (NC + BN - 1) // BN, (KD + BK - 1) // BK
        unit, end = block_share(tiles_across * ((M + BM - 1) // BM), steps)
        while unit < end:  # one output tile's run of depth steps per trip (usually one or two trips)
            first, last, row0, col0 = start_tile_run(unit, end, steps, tiles_across, acc)
            load_a_tile(a, row0, first * BK, t, next_a)  # the first step (zeros past the edges)
            load_b_tile(b, col0, first * BK, t, next_b)
            # The steps are counted in 32 bits, as multiply_tile counts its trips: numba's range
            # counts in 64, and a step's 64-bit count, tests and buffer index cost 27 instructions
            # per step of the 16x8 tile (373 besides its 2,048 FMAs, now 346). A step index fits:
            # 2^32 steps of depth would be more than a GPU's memory holds.
            step, stop = np.uint32(first), np.uint32(last)
            while step < stop:
                buf = step & np.uint32(1)
                # Store step's tile into buffer `buf`. Every thread passed the syncthreads below
                # after it finished reading this buffer two steps ago: nobody is still reading it.
                store_a_tile(a_s, buf, t, next_a)
                store_b_tile(b_s, buf, t, next_b)
                cuda.syncthreads()
                step = np.uint32(step + np.uint32(1))  # the cast keeps the sum 32-bit
                if step < stop:  # issue the next step's global loads now; use them after the FMAs
                    load_a_tile(a, row0, step * np.uint32(BK), t, next_a)
                    load_b_tile(b, col0, step * np.uint32(BK), t, next_b)
                multiply_tile(a_s, b_s, buf, 0, BK, ty, tx, ra, rb, acc)
            epilogue(c, acc, row0, col0, ty, tx, M, NC, PQ, first == 0 and last == steps)
            unit += last - first
            cuda.syncthreads()  # the next tile's first store reuses a buffer: wait until all have read both

    return register(tile, "gemm_kernel" + (", 16-byte global loads" if quads else "")
                    + (", 16-byte outputs" if quad_outputs else ""), gemm_kernel)


def gemm(a, b, c, *, tile=None, splits=None, stream=0):
    """c = a @ b, float32, with the chapter's tiled GEMM; a (M, KD), b (KD, NC), c (M, NC).

    tile: a name in TILES or a Tile (None: the first); splits: blocks per output tile (split-K), or
    "stream" (stream-K), or None (split_count's choice);
    stream: where the launches go (0: the default stream).
    """
    a = require(a, "a", dtype=np.float32, ndim=2)
    b = require(b, "b", dtype=np.float32, ndim=2)
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    c = require(c, "c", dtype=np.float32, shape=(a.shape[0], b.shape[1]))
    tile = pick_tile(tile)
    kernel = make_gemm_kernel(tile, quads=quads_fit(tile, a, b), quad_outputs=quad_outputs_fit(tile, c, b.shape[1]))
    launch_gemm(kernel, tile, a.shape[0], b.shape[1], a.shape[1], splits, c.reshape(1, *c.shape),
                a, b, b.shape[1], stream=stream)
    return c
