"""Chapter 00's kernels: copy and axpy, one element per thread vs grid-stride with loads in flight,
then 16 bytes per load and store (workbook.memory), and a strided gather that shows what
uncoalesced access costs.

Every kernel here is what the chapter shows and what tests/test_ch00_measuring.py tests.
"""


import numpy as np
from numba import cuda

from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, TensorCalls, cdiv
from workbook.memory import aligned, load4, store4

THREADS_PER_BLOCK = 256
LOADS_IN_FLIGHT = 4  # independent loads each thread issues before its first store
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 threads, the most a Hopper SM holds at once


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
# Optimized further: 16 bytes per access. load4/store4 (workbook/memory.py) move a *quad* of four
# float32 in one instruction, ld.global.v4.f32 / st.global.v4.f32. Quad q is elements 4q..4q+3.
#
# The copy gives each thread one quad, on a grid sized to the data (QUAD_THREADS per block): 16
# bytes in flight per thread from a single load, and the block scheduler streams new blocks in as
# old ones finish. A warp's quad load covers 32 x 16 = 512 consecutive bytes: still coalesced.
# On the H100 at 2^28 floats this reached 1.00 of torch's copy_ where a grid-stride quad copy with
# 4 quads in flight per thread reached 0.935 (same benchmark; quad_sweep.py tries more shapes).
# The last n % 4 elements (and everything, if the array is not 16-byte aligned) take the 4-byte path.

QUAD_THREADS = 1024


@cuda.jit
def copy_quads_kernel(src, dst):
    n = src.size
    quads = n // 4  # whole quads; the n % 4 elements after them are the tail
    q = cuda.grid(1)
    if q < quads:
        store4(dst, 4 * q, load4(src, 4 * q))  # 16 bytes read, 16 written, one instruction each
    elif q == quads:  # the first thread past the quads copies the tail: at most 3 elements
        for i in range(4 * quads, n):
            dst[i] = src[i]


@cuda.jit
def axpy_quads_kernel(a, x, y, out):
    n = x.size
    quads = n // 4
    grid = cuda.gridsize(1)
    q = cuda.grid(1)
    while q + grid < quads:  # two quads of x and two of y in flight: 64 bytes per thread
        x0, y0 = load4(x, 4 * q), load4(y, 4 * q)
        x1, y1 = load4(x, 4 * (q + grid)), load4(y, 4 * (q + grid))
        store4(out, 4 * q, (a * x0[0] + y0[0], a * x0[1] + y0[1], a * x0[2] + y0[2], a * x0[3] + y0[3]))
        store4(out, 4 * (q + grid), (a * x1[0] + y1[0], a * x1[1] + y1[1], a * x1[2] + y1[2], a * x1[3] + y1[3]))
        q += 2 * grid
    if q < quads:
        x0, y0 = load4(x, 4 * q), load4(y, 4 * q)
        store4(out, 4 * q, (a * x0[0] + y0[0], a * x0[1] + y0[1], a * x0[2] + y0[2], a * x0[3] + y0[3]))
    i = 4 * quads + cuda.grid(1)
    if i < n:
        out[i] = a * x[i] + y[i]


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
    return max(1, cdiv(n, THREADS_PER_BLOCK))


def _machine_blocks(n):
    # Enough blocks to fill every SM, never more than the data needs.
    return max(1, min(sm_count() * BLOCKS_PER_SM, cdiv(n, THREADS_PER_BLOCK)))


def _copy_args(src, dst):
    src = require(src, "src", dtype=(np.float32, np.float64, np.int32, np.uint32), ndim=1)
    dst = require(dst, "dst", dtype=src.dtype, shape=src.shape)
    return src, dst


# Every wrapper launches through a cache of prepared launches: the same buffers again cost the
# driver's launch, not numba's typing and packing of every argument (chapter 07).
_launches = LaunchCache()
_torch_calls = TensorCalls()  # copy_quads on torch tensors met before: one launch (chapter 07)


def copy_one_per_thread(src, dst):
    src, dst = _copy_args(src, dst)
    _launches.launch(copy_one_per_thread_kernel, _blocks_for(src.size), THREADS_PER_BLOCK, (src, dst))
    return dst


def copy_grid_stride(src, dst):
    src, dst = _copy_args(src, dst)
    _launches.launch(copy_grid_stride_kernel, _machine_blocks(src.size), THREADS_PER_BLOCK, (src, dst))
    return dst


def copy_grid_stride_wide(src, dst):
    """The grid-stride copy moving 8-byte words: the same bytes in half the instructions.

    A copy does not care what the bits mean, so an even-length float32 array is viewed as uint64.
    """
    src, dst = _copy_args(src, dst)
    if src.size % 2 or src.dtype.itemsize != 4:
        return copy_grid_stride(src, dst)
    wide_src, wide_dst = src.view(np.uint64), dst.view(np.uint64)
    _launches.launch(copy_grid_stride_kernel, _machine_blocks(wide_src.size), THREADS_PER_BLOCK, (wide_src, wide_dst))
    return dst


def copy_quads(src, dst):
    """The grid-stride copy moving 16-byte quads. A copy does not care what the bits mean, so any
    4- or 8-byte dtype is copied as uint32 quads; arrays whose first element is not 16-byte aligned
    (views at an odd offset) take the 4-byte kernel: a quad there would fault."""
    given = (src, dst)
    key = _torch_calls.key(("src", "dst"), given)
    found = _torch_calls.find(key)
    if found is not None:  # torch tensors met before, every check passed then: the same launch
        return found(None, given)[0]
    src, dst = _copy_args(src, dst)
    if not (aligned(src, 16) and aligned(dst, 16)):
        return copy_grid_stride(src, dst)
    words_src, words_dst = src.view(np.uint32), dst.view(np.uint32)
    threads_needed = words_src.size // 4 + 1  # a thread per quad, one more for the tail
    # through a cache of prepared launches: the uint32 views are new objects at every call, but the
    # same memory finds the launch made for it, and costs the driver's launch only (chapter 07)
    entry = _launches.launch(copy_quads_kernel, cdiv(threads_needed, QUAD_THREADS), QUAD_THREADS,
                             (words_src, words_dst))
    _torch_calls.keep(key, entry, returns=(dst,), owners=(1,))
    return dst


def _axpy_args(x, y, out):
    x = require(x, "x", dtype=(np.float32, np.float64), ndim=1)
    y = require(y, "y", dtype=x.dtype, shape=x.shape)
    out = require(out, "out", dtype=x.dtype, shape=x.shape)
    return x, y, out


def axpy_one_per_thread(a, x, y, out):
    x, y, out = _axpy_args(x, y, out)
    _launches.launch(axpy_one_per_thread_kernel, _blocks_for(x.size), THREADS_PER_BLOCK, (x.dtype.type(a), x, y, out))
    return out


def axpy_grid_stride(a, x, y, out):
    x, y, out = _axpy_args(x, y, out)
    _launches.launch(axpy_grid_stride_kernel, _machine_blocks(x.size), THREADS_PER_BLOCK, (x.dtype.type(a), x, y, out))
    return out


def axpy_quads(a, x, y, out):
    """axpy on 16-byte quads of float32; float64 or arrays not 16-byte aligned take the 4-byte kernel."""
    x, y, out = _axpy_args(x, y, out)
    if x.dtype != np.float32 or not all(aligned(v, 16) for v in (x, y, out)):
        return axpy_grid_stride(a, x, y, out)
    _launches.launch(axpy_quads_kernel, _machine_blocks(cdiv(x.size, 4)), THREADS_PER_BLOCK, (np.float32(a), x, y, out))
    return out


def gather_strided(src, dst, stride):
    src = require(src, "src", dtype=(np.float32,), ndim=1)
    if not isinstance(stride, (int, np.integer)) or stride < 1:
        raise ValueError(f"stride must be a positive integer, not {stride!r}")
    dst = require(dst, "dst", dtype=src.dtype, shape=(src.size // stride,))
    _launches.launch(gather_strided_kernel, _blocks_for(dst.size), THREADS_PER_BLOCK, (src, dst), (stride,))
    return dst
