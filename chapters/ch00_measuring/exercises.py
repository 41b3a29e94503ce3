"""Chapter 00 — exercises: grid-stride loops, tails and coalescing.

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
        raise NotImplementedError("ch00.1: step i on to this thread's next element")
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
    raise NotImplementedError("ch00.2: write the kernel: dst[i] = src[n - 1 - i]")
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
    if i + grid < n:
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
@cuda.jit
def copy_matrix_kernel(src, dst):
    row = cuda.grid(1)  # a thread per row
    rows, cols = src.shape
    if row < rows:
        for col in range(cols):
            dst[row, col] = src[row, col]  # lanes 4 * cols bytes apart: uncoalesced


def copy_matrix(src, dst):
    src = require(src, "src", dtype=np.float32, ndim=2)
    dst = require(dst, "dst", dtype=np.float32, shape=src.shape)
    rows = src.shape[0]
    blocks = max(1, min(sm_count() * BLOCKS_PER_SM, math.ceil(rows / THREADS_PER_BLOCK)))
    copy_matrix_kernel[blocks, THREADS_PER_BLOCK](src, dst)
    return dst
# <<< ch00.4
