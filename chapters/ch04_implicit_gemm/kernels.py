"""Chapter 04's kernels, in one namespace: `from chapters.ch04_implicit_gemm import kernels as k`.

A convolution of x (N, C, H, W) with filters w (K, C, R, S) is a GEMM of the filters, (K, C*R*S),
by X = im2col(x), (C*R*S, N*P*Q). The explicit path writes X and multiplies; the implicit path
gathers X's tiles from x as the GEMM loads them. The modules, in reading order:

    geometry.py     shapes and their checks, NumPy references, the offset and tap tables
    explicit.py     naive: the im2col kernel, then the GEMM (conv2d_explicit)
    tiles.py        the Tile, the chapter's tiles, a block tile's arithmetic (make_tile_math)
    tile_memory.py  the A and B tiles into shared memory, the epilogue into the output
    schedule.py     which tiles and depth steps each block runs: one per tile, split-K, stream-K
    gemm.py         the tiled GEMM kernel (make_gemm_kernel) and gemm()
    gather.py       the implicit GEMM's B tile, gathered from x through the tap table
    implicit.py     optimized: the GEMM with the gather as its B loader (conv2d_implicit)

This module adds what spans them: choosing a tile per shape (fastest_tile) and what a tile costs
the SM (resources). Every kernel is what the chapter shows and tests/test_ch04_implicit_gemm.py tests.
"""

import numpy as np

from workbook import ON_GPU

from .explicit import IM2COL_ROW_BLOCKS, IM2COL_THREADS, conv2d_explicit, im2col, im2col_kernel
from .gather import SHARED_TABLE_STEP, SHARED_TABLE_WORDS, make_gather, shared_table_words
from .gemm import gemm, make_gemm_kernel
from .geometry import (AWKWARD_CASES, MAX_TAPS, TABLE_ALIGN, ConvGeometry, column_origin, conv2d_loops, conv2d_reference, conv_args,
                       conv_geometry, device_offset_table, device_tap_table, gemm_reference, im2col_reference,
                       offset_table, row_offset, tap_field, tap_table, tolerance)
from .implicit import conv2d_implicit, make_implicit_kernel
from .schedule import MAX_SPLITS, MIN_GAIN, MIN_STEPS_PER_BLOCK, grid_blocks, make_schedule, split_count, zero_kernel
from .tile_memory import make_epilogue, make_tile_loads
from .tiles import (DEFAULT_TILE, GPU_TILES, MADE, SEARCH_TILES, SIM_TILES, TILES, Tile, layout, make_tile_math, pick_tile,
                    quad_outputs_fit, quads_fit, tile_takes_quads)

__all__ = [
    "IM2COL_ROW_BLOCKS", "IM2COL_THREADS", "conv2d_explicit", "im2col", "im2col_kernel",
    "SHARED_TABLE_STEP", "SHARED_TABLE_WORDS", "make_gather", "shared_table_words",
    "gemm", "make_gemm_kernel",
    "AWKWARD_CASES", "MAX_TAPS", "TABLE_ALIGN", "ConvGeometry", "column_origin", "conv2d_loops", "conv2d_reference", "conv_args",
    "conv_geometry", "device_offset_table", "device_tap_table", "gemm_reference", "im2col_reference",
    "offset_table", "row_offset", "tap_field", "tap_table", "tolerance",
    "conv2d_implicit", "make_implicit_kernel",
    "MAX_SPLITS", "MIN_GAIN", "MIN_STEPS_PER_BLOCK", "grid_blocks", "make_schedule", "split_count", "zero_kernel",
    "make_epilogue", "make_tile_loads",
    "DEFAULT_TILE", "GPU_TILES", "SEARCH_TILES", "SIM_TILES", "TILES", "Tile", "layout", "make_tile_math", "pick_tile",
    "quad_outputs_fit", "quads_fit", "tile_takes_quads",
    "fastest_tile", "resources",
]


def fastest_tile(run, repeats=7, tiles=SEARCH_TILES):
    """(name, {name: median ms}): the tile among `tiles` (names in TILES) for which run(name) is
    fastest here.

    A library does the same per shape (cuBLAS heuristics, cuDNN's benchmark mode): the best tile
    depends on the shape, e.g. a 128-row tile wastes half its work when K = 64. In the simulator,
    where times mean nothing: the first tile, and no times.
    """
    if not ON_GPU:
        return tiles[0], {}
    from workbook import bench

    candidates = {name: (lambda name=name: run(name)) for name in tiles}
    bench.warm_up(candidates)  # their kernels compiled side by side (workbook/compile_pool.py)
    for function in candidates.values():
        function()  # and each warmed up alone
    times = bench.time_interleaved(candidates, repeats=repeats)
    medians = {name: float(np.median(ms)) for name, ms in times.items()}
    return min(medians, key=medians.get), medians


def resources(tile):
    """Registers per thread, local (spilled) bytes per thread, shared bytes per block, on a GPU:
    for each kernel made with this tile that has been compiled (launched)."""
    if not ON_GPU:
        return None
    usage = {}
    for description, kernel in MADE.get(pick_tile(tile), {}).items():
        if not kernel.overloads:  # not compiled yet: nothing launched it
            continue
        compiled = next(iter(kernel.overloads.values()))  # one per argument types; all alike here
        usage[description] = {"registers": compiled.regs_per_thread,
                              "local bytes": compiled.local_mem_per_thread,
                              "shared bytes": compiled.shared_mem_per_block}
    return usage
