"""Chapter 04's work schedule: which (output tile, depth step) iterations each block runs, how
many blocks there are (one per tile, split-K or stream-K), and the launch that sizes the grid.
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.inputs import sm_count
from workbook.launch import LaunchCache, cdiv

from .gather import SHARED_TABLE_WORDS
from .tiles import jit_options, shared_bytes

# Sharing the work. A GEMM with few output tiles leaves SMs idle: the 14x14 layer with C = K = 256
# has 49 x 2 tiles of 128x128 for 132 SMs that hold 2 blocks each (98 of 264 places). The kernels
# see their work as tiles x steps (output tile, depth step) iterations in a row, and each block takes
# an equal, consecutive share of it (`block_share`), so the host chooses how many blocks there are:
#
#   one per tile              a block runs all the depth steps of its tile, stores it: no atomics
#   splits = S                S blocks per tile (split-K): each runs 1/S of the depth
#   splits = "stream"         stream-K: one block per place the SMs hold, each with 1/264 of ALL
#                             the iterations, crossing from one tile into the next where its share
#                             does; every SM busy until the end, whatever the tile count
#
# A block that ran only part of a tile's depth adds its partial sums into the output with atomics,
# so the output must start at zero: one more, tiny, launch. Without a choice the wrappers take one
# block per tile when the tiles fill the machine's waves to within MIN_GAIN, stream-K otherwise.

MAX_SPLITS = 8
MIN_STEPS_PER_BLOCK = 16  # depth steps: below that a block is all prologue and epilogue
MIN_GAIN = 0.1


TABLE_BYTES = 4 * SHARED_TABLE_WORDS  # the largest table the implicit GEMM keeps in shared memory


@lru_cache(maxsize=None)
def resident_blocks(tile):
    """Blocks of this tile an SM holds at once: the launch bound's min_blocks, or fewer where the
    SM's shared memory cannot hold that many (a T4 has 64 KB per SM, an H100 228 KB)."""
    if not ON_GPU:  # the simulator: the launch bound as written
        return tile.min_blocks
    per_sm = cuda.get_current_device().MAX_SHARED_MEMORY_PER_MULTIPROCESSOR
    return max(1, min(tile.min_blocks, per_sm // (shared_bytes(tile) + TABLE_BYTES)))


def split_count(tile, rows, columns, depth):
    """The wrappers' choice when given no `splits`: 1 (a block per output tile) if the `rows x columns`
    tiles fill this GPU's waves to within MIN_GAIN, else "stream" (stream-K)."""
    tiles = cdiv(columns, tile.BN) * cdiv(rows, tile.BM)
    places = sm_count() * resident_blocks(tile)  # blocks resident at once
    filled = tiles / (cdiv(tiles, places) * places)  # the fraction of the waves' places in use
    if filled >= 1 - MIN_GAIN or cdiv(depth, tile.BK) < 2 * MIN_STEPS_PER_BLOCK:
        return 1
    return "stream"


def grid_blocks(tile, rows, columns, depth, splits):
    """How many blocks share the tiles x steps iterations for this `splits`."""
    tiles, steps = cdiv(columns, tile.BN) * cdiv(rows, tile.BM), cdiv(depth, tile.BK)
    if splits == "stream":
        return min(sm_count() * resident_blocks(tile), cdiv(tiles * steps, MIN_STEPS_PER_BLOCK))
    return tiles * splits


@cuda.jit
def zero_kernel(values):
    for i in range(cuda.grid(1), values.size, cuda.gridsize(1)):
        values[i] = float32(0)


class Schedule(NamedTuple):
    block_share: object
    start_tile_run: object


@lru_cache(maxsize=None)
def make_schedule(tile):
    """The device functions by which a block finds its share of the work and starts each tile of it."""
    BM, BN, TM, TN = tile.BM, tile.BN, tile.TM, tile.TN
    _, inline = jit_options(tile)

    @cuda.jit(**inline)
    def block_share(tiles, steps):
        """This block's share of the work: units [first, end) of the tiles * steps (tile, depth step)
        iterations, in order, split evenly over the grid's blocks."""
        share = (tiles * steps + cuda.gridDim.x - 1) // cuda.gridDim.x
        first = cuda.blockIdx.x * share
        return first, min(tiles * steps, first + share)

    @cuda.jit(**inline)
    def start_tile_run(unit, end, steps, tiles_across, acc):
        """At unit `unit` of a share ending at `end`: the depth steps [first, last) of the tile it
        falls in that this block runs, the tile's first row and column; the accumulators zeroed."""
        tile = unit // steps
        first = unit - tile * steps
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0)
        return first, min(steps, first + end - unit), (tile // tiles_across) * BM, (tile % tiles_across) * BN

    return Schedule(block_share, start_tile_run)


# Launches prepared once per set of buffers (chapter 07): the views and the ~20 arguments of a
# convolution are typed and packed the first time only. Room for thousands: a recurrent network
# calls the GEMM on other views at every step (chapter 10's naive LSTM, 1,024 sets of buffers in
# 32 steps of 4 layers), and a cache smaller than a forward's would prepare every call afresh.
launches = LaunchCache(size=4096)


def launch_gemm(kernel, tile, rows, columns, depth, splits, c3, *args, stream=0):
    """Launch `kernel(*args, c3)` with `splits` (None: split_count's choice); returns the launch
    cache's entries of its launches (for launch.TensorCalls)."""
    if splits is None:
        splits = split_count(tile, rows, columns, depth)
    elif splits != "stream" and (not isinstance(splits, (int, np.integer)) or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f'splits must be an int from 1 to {MAX_SPLITS} or "stream", not {splits!r}')
    blocks = grid_blocks(tile, rows, columns, depth, splits)
    steps = cdiv(depth, tile.BK)
    share = cdiv(cdiv(columns, tile.BN) * cdiv(rows, tile.BM) * steps, blocks)
    entries = ()
    if share % steps:  # some tile's depth is shared between blocks: their partial sums add up in c
        flat = c3.reshape(-1)
        entries += (launches.launch(zero_kernel, min(sm_count() * 8, cdiv(flat.size, 256)), 256, (flat,),
                                    stream=stream),)
    return (*entries, launches.launch(kernel, blocks, tile.threads, (*args, c3), stream=stream))

