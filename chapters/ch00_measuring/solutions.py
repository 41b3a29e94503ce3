"""Chapter 00 — solutions: grid-stride loops, tails and coalescing.

Each exercise is the code between `# >>> ch00.N` and `# <<< ch00.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch00` (or run the exercise cells of the chapter's
notebook). Every wrapper below is given; the checks call the wrappers.
"""

import math

import numpy as np
from numba import cuda

from chapters.ch00_measuring.kernels import BLOCKS_PER_SM, THREADS_PER_BLOCK
from workbook.inputs import require, sm_count

# ---------------------------------------------------------------------------------------------
# ch00.1 (complete one line) — the grid-stride step.
#
# The grid below has a fixed number of threads G = blocks * threads_per_block, usually far fewer
# than elements. Thread t copies elements t, t + G, t + 2G, ... until it runs off the end:
#
#   G = 8:   thread 0 -> 0, 8, 16, ...   thread 1 -> 1, 9, 17, ...   thread 7 -> 7, 15, 23, ...
#
# Hint: numba names G `cuda.gridsize(1)`. The check launches 2 blocks on arrays of up to 3001
# elements, so every thread goes round the loop several times.


@cuda.jit
def copy_grid_stride_kernel(src, dst):
    i = cuda.grid(1)
    while i < src.size:
        dst[i] = src[i]  # read 4 bytes, write 4 bytes
        # >>> ch00.1 (stub 5fed165d)
        i += cuda.gridsize(1)
        # <<< ch00.1


def copy_grid_stride(src, dst, blocks=2):
    src = require(src, "src", dtype=np.float32, ndim=1)
    dst = require(dst, "dst", dtype=np.float32, shape=src.shape)
    copy_grid_stride_kernel[blocks, THREADS_PER_BLOCK](src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# ch00.2 (write a kernel) — reverse an array: dst[i] = src[n - 1 - i].
#
# Launched with one thread per element, rounded up to whole blocks of 256: the last block is partly
# past the end, so threads with nothing to do must do nothing. Both the reads and the writes are
# coalesced: lane k reads src[n - 1 - i0 - k], 32 consecutive words, only in descending order.


@cuda.jit
def reverse_kernel(src, dst):
    # >>> ch00.2 (stub 9d32ed35)
    i = cuda.grid(1)
    n = src.size
    if i < n:  # the last block is partly past the end
        dst[i] = src[n - 1 - i]  # read 4 bytes, write 4 bytes
    # <<< ch00.2


def reverse(src, dst):
    src = require(src, "src", dtype=np.float32, ndim=1)
    dst = require(dst, "dst", dtype=np.float32, shape=src.shape)
    blocks = max(1, math.ceil(src.size / THREADS_PER_BLOCK))
    reverse_kernel[blocks, THREADS_PER_BLOCK](src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# ch00.3 (find and fix the bug) — a grid-stride copy with two loads in flight.
#
# Each trip a thread loads src[i] and src[i + G] before storing either, so two loads are in flight
# at once. When fewer than two grid-widths are left, the main loop stops and the tail finishes the
# job. One size in the check works; most do not. Run the check, read which elements are wrong and
# which block and thread own them, and fix the tail.


@cuda.jit
def copy_two_in_flight_kernel(src, dst):
    n = src.size
    grid = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + grid < n:  # both i and i + grid are in range
        first = src[i]
        second = src[i + grid]
        dst[i] = first
        dst[i + grid] = second
        i += 2 * grid
    # Here i + grid >= n: at most one element (i itself) is left for this thread.
    # >>> ch00.3 (stub 5a27b201)
    if i < n:
        dst[i] = src[i]
    # <<< ch00.3


def copy_two_in_flight(src, dst, blocks=2):
    src = require(src, "src", dtype=np.float32, ndim=1)
    dst = require(dst, "dst", dtype=np.float32, shape=src.shape)
    copy_two_in_flight_kernel[blocks, THREADS_PER_BLOCK](src, dst)
    return dst


# ---------------------------------------------------------------------------------------------
# ch00.4 (make it faster) — copy a matrix, rows x cols float32.
#
# The kernel below is correct and slow: a thread per row, walking along its row. At each step the
# 32 lanes of a warp read 32 words from 32 different rows, 4 * cols bytes apart: 32 sectors of 32
# bytes to use 128 bytes, an eighth of what the memory system moves. Rewrite the kernel and its
# launch (both are inside the region) so that the lanes of a warp touch consecutive addresses.
# Target, on a GPU: at least 0.75 of the throughput of chapter 00's `copy_one_per_thread` copying
# the same bytes (an 8192 x 8192 matrix, 256 MiB, in the same run): that kernel is coalesced and has
# one element per thread, so what it reaches is what this access pattern allows on your GPU. In the
# simulator, the global-memory sectors both move are compared instead (traced, workbook.memtrace).
# Hint: a 2-D grid, x across the columns.

# >>> ch00.4 (stub 7c970e15)
TILE_COLS, TILE_ROWS = 32, 8  # a block of 32 x 8 threads: each warp is one row segment of 128 bytes


@cuda.jit
def copy_matrix_kernel(src, dst):
    col, row = cuda.grid(2)  # x across the columns: lane k reads word k of a row segment
    rows, cols = src.shape
    if row < rows and col < cols:
        dst[row, col] = src[row, col]  # read 4 bytes, write 4 bytes, coalesced across the warp


def copy_matrix(src, dst):
    src = require(src, "src", dtype=np.float32, ndim=2)
    dst = require(dst, "dst", dtype=np.float32, shape=src.shape)
    rows, cols = src.shape
    blocks = (math.ceil(cols / TILE_COLS), math.ceil(rows / TILE_ROWS))
    copy_matrix_kernel[blocks, (TILE_COLS, TILE_ROWS)](src, dst)
    return dst
# <<< ch00.4


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
PLANTED_WRONG_ANSWERS = {
    "ch00.1": [("i += cuda.gridsize(1)", "i += cuda.gridsize(1) + 1"),  # skips elements
               ("i += cuda.gridsize(1)", "i += 512", "simulator"),  # the wrapper's 2 x 256 threads, hard-coded
               # strides by the block: blocks overlap, right values, twice the traffic (too slow)
               ("i += cuda.gridsize(1)", "i += cuda.blockDim.x", "simulator")],
    "ch00.2": [("src[n - 1 - i]", "src[i]")],  # a plain copy
    "ch00.3": [("if i < n:", "if i + 1 < n:")],  # drops the very last element
    "ch00.4": [("if row < rows and col < cols:", "if row < rows - 1 and col < cols:")],  # last row
}
