"""Chapter 00's kernels: copy and axpy, one element per thread vs grid-stride with loads in flight,
and a strided gather that shows what uncoalesced access costs.

Every kernel here is what the chapter shows and what tests/test_ch00_measuring.py tests.
"""

import math

import numpy as np
from numba import cuda

from workbook.inputs import require, sm_count

THREADS_PER_BLOCK = 256
LOADS_IN_FLIGHT = 4  # independent loads each thread issues before its first store
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 threads, the most an H100 SM holds at once


# ---------------------------------------------------------------------------------------------
# References


def copy_reference(src):
    return src.copy()


def axpy_reference(a, x, y):
    return (np.float32(a) * x + y).astype(x.dtype)


def gather_reference(src, stride):
    return src[::stride][: len(src) // stride].copy()


# ---------------------------------------------------------------------------------------------
# Naive: one element per thread.
#
#   thread:   t0  t1  t2 ... t31 | t32 ...        a warp's 32 loads fall on 32 consecutive words:
#   element:  e0  e1  e2 ... e31 | e32 ...        4 sectors of 32 bytes, one request: coalesced.
#
# It is already coalesced; what it lacks is work per thread. Each thread issues one load, waits
# ~600 ns for it, stores, and exits: the SM must hide the latency with other warps alone, and every
# element pays for its own index arithmetic and bounds check.


@cuda.jit
def copy_one_per_thread_kernel(src, dst):
    i = cuda.grid(1)
    if i < src.size:  # the last block is partly past the end
        dst[i] = src[i]  # read 4 bytes, write 4 bytes


@cuda.jit
def axpy_one_per_thread_kernel(a, x, y, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = a * x[i] + y[i]  # read 8 bytes, write 4 bytes, 2 FLOPs


# ---------------------------------------------------------------------------------------------
# Optimized: a grid sized to the machine (not to the data), each thread striding over the array
# and keeping LOADS_IN_FLIGHT independent loads outstanding before it stores anything.
#
#   trip 0:  thread t loads e[t], e[t + G], e[t + 2G], e[t + 3G]     (G = threads in the grid)
#   trip 1:  thread t loads e[t + 4G], ...
#
# Each of the four loads is still coalesced across the warp (lanes read consecutive words), and
# because none depends on another, the memory system works on all four at once.


@cuda.jit
def copy_grid_stride_kernel(src, dst):
    n = src.size
    grid = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + 3 * grid < n:
        v0 = src[i]
        v1 = src[i + grid]
        v2 = src[i + 2 * grid]
        v3 = src[i + 3 * grid]
        dst[i] = v0
        dst[i + grid] = v1
        dst[i + 2 * grid] = v2
        dst[i + 3 * grid] = v3
        i += 4 * grid
    while i < n:  # the tail: fewer than 4 grid-widths left
        dst[i] = src[i]
        i += grid


@cuda.jit
def axpy_grid_stride_kernel(a, x, y, out):
    n = x.size
    grid = cuda.gridsize(1)
    i = cuda.grid(1)
    while i + 3 * grid < n:
        x0, x1, x2, x3 = x[i], x[i + grid], x[i + 2 * grid], x[i + 3 * grid]
        y0, y1, y2, y3 = y[i], y[i + grid], y[i + 2 * grid], y[i + 3 * grid]
        out[i] = a * x0 + y0
        out[i + grid] = a * x1 + y1
        out[i + 2 * grid] = a * x2 + y2
        out[i + 3 * grid] = a * x3 + y3
        i += 4 * grid
    while i < n:
        out[i] = a * x[i] + y[i]
        i += grid


# ---------------------------------------------------------------------------------------------
# Uncoalesced: lane k of a warp reads element k * stride. With stride >= 8 (32 bytes), every lane
# touches its own 32-byte sector and uses 4 bytes of it: 1/8 of the bytes moved are useful.


@cuda.jit
def gather_strided_kernel(src, dst, stride):
    i = cuda.grid(1)
    if i < dst.size:
        dst[i] = src[i * stride]


# ---------------------------------------------------------------------------------------------
# Host wrappers: check the arguments, size the grid, launch. Naive and optimized take the same
# arguments, so one call checks and times both.


def _blocks_for(n):
    return max(1, math.ceil(n / THREADS_PER_BLOCK))


def _machine_blocks(n):
    # Enough blocks to fill every SM, never more than the data needs.
    return max(1, min(sm_count() * BLOCKS_PER_SM, math.ceil(n / THREADS_PER_BLOCK)))


def _copy_args(src, dst):
    src = require(src, "src", dtype=(np.float32, np.float64, np.int32, np.uint32), ndim=1)
    dst = require(dst, "dst", dtype=src.dtype, shape=src.shape)
    return src, dst


def copy_one_per_thread(src, dst):
    src, dst = _copy_args(src, dst)
    copy_one_per_thread_kernel[_blocks_for(src.size), THREADS_PER_BLOCK](src, dst)
    return dst


def copy_grid_stride(src, dst):
    src, dst = _copy_args(src, dst)
    copy_grid_stride_kernel[_machine_blocks(src.size), THREADS_PER_BLOCK](src, dst)
    return dst


def copy_grid_stride_wide(src, dst):
    """The grid-stride copy moving 8-byte words: the same bytes in half the instructions.

    A copy does not care what the bits mean, so an even-length float32 array is viewed as uint64.
    """
    src, dst = _copy_args(src, dst)
    if src.size % 2 or src.dtype.itemsize != 4:
        return copy_grid_stride(src, dst)
    wide_src, wide_dst = src.view(np.uint64), dst.view(np.uint64)
    copy_grid_stride_kernel[_machine_blocks(wide_src.size), THREADS_PER_BLOCK](wide_src, wide_dst)
    return dst


def _axpy_args(x, y, out):
    x = require(x, "x", dtype=(np.float32, np.float64), ndim=1)
    y = require(y, "y", dtype=x.dtype, shape=x.shape)
    out = require(out, "out", dtype=x.dtype, shape=x.shape)
    return x, y, out


def axpy_one_per_thread(a, x, y, out):
    x, y, out = _axpy_args(x, y, out)
    axpy_one_per_thread_kernel[_blocks_for(x.size), THREADS_PER_BLOCK](x.dtype.type(a), x, y, out)
    return out


def axpy_grid_stride(a, x, y, out):
    x, y, out = _axpy_args(x, y, out)
    axpy_grid_stride_kernel[_machine_blocks(x.size), THREADS_PER_BLOCK](x.dtype.type(a), x, y, out)
    return out


def gather_strided(src, dst, stride):
    src = require(src, "src", dtype=(np.float32,), ndim=1)
    if not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"stride must be a positive integer, not {stride!r}")
    dst = require(dst, "dst", dtype=src.dtype, shape=(src.size // stride,))
    gather_strided_kernel[_blocks_for(dst.size), THREADS_PER_BLOCK](src, dst, stride)
    return dst
