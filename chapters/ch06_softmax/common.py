"""Chapter 06's building blocks: the constants, and the warp collectives every optimized kernel
uses (a warp's max and sum by shuffles, the online max-and-sum merge), with small element helpers.
"""

import math

import numpy as np
from numba import cuda

WARP = 32
FULL_MASK = 0xFFFFFFFF
NAIVE_THREADS = 128  # naive kernels: one row per thread
TREE_THREADS = 256  # the batch mean: one block, a power of two for the halving tree
ROW_THREADS = 256  # optimized kernels: threads per block, and the threads of a block per row
MAX_WARPS = 32  # shared-memory partials: one per warp of a block of up to 1024 threads
WARP_ROW_MAX = 1024  # up to this many columns a warp owns a row (32 values per lane at most)
MAX_WAVES = 128  # grids stop at sm_count() * MAX_WAVES blocks; more rows are strided over
# The register kernel needs ~250 registers a thread, so an SM holds only two of its 128-thread
# blocks at once: a grid of 16 blocks per SM whose warps loop over rows keeps them busy, where
# one short-lived block per 4 rows paid a block launch for every 4 rows (measured on the H100).
WARP_ROW_BLOCKS_PER_SM = 16
LOGIT_DTYPES = (np.float32, np.float16)
TARGET_DTYPES = (np.int32, np.int64)

# float32 constants: a bare Python float in a kernel is a float64, and float64 is slow on a GPU.
NEG_INF = np.float32(-np.inf)
ZERO = np.float32(0.0)
ONE = np.float32(1.0)
NAN = np.float32(np.nan)


# ---------------------------------------------------------------------------------------------
# Optimized: a group of threads per row, reading along the row so that a warp's loads coalesce.
#
#   warp per row (<= 1024 columns)          block per row (> 1024 columns)
#   lane:  0   1  ...  31 | 0   1 ...       thread: 0    1   ...  255 | 0    1 ...
#   col:   0   1  ...  31 | 32  33 ...      col:    0    1   ...  255 | 256  257 ...
#
# At each step the 32 lanes of a warp read 32 consecutive columns: 128 contiguous bytes (float32),
# one request, every byte used. The partial results of the lanes are then combined in registers,
# with shuffles, and (block per row) once more through 2 x 8 floats of shared memory.


@cuda.jit(device=True)
def warp_max(v):
    """Butterfly all-reduce: after log2(32) = 5 exchanges every lane holds the warp's max."""
    offset = WARP // 2
    while offset > 0:
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, offset))
        offset >>= 1
    return v


@cuda.jit(device=True)
def warp_sum(v):
    offset = WARP // 2
    while offset > 0:
        v += cuda.shfl_xor_sync(FULL_MASK, v, offset)
        offset >>= 1
    return v


@cuda.jit(device=True)
def merge(m1, s1, m2, s2):
    """Two partial (max, sum of exp(x - max)) of one row -> the pair for their union.

    Each sum is rescaled to the common max: s1 * exp(m1 - m) + s2 * exp(m2 - m). While both parts
    have seen only -inf, m is -inf and m1 - m would be NaN: shift by 0 instead (exp(-inf) = 0).
    """
    m = max(m1, m2)
    shift = m if m != NEG_INF else ZERO
    return m, s1 * math.exp(m1 - shift) + s2 * math.exp(m2 - shift)


@cuda.jit(device=True)
def warp_merge(m, s):
    offset = WARP // 2
    while offset > 0:
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
        s_other = cuda.shfl_xor_sync(FULL_MASK, s, offset)
        m, s = merge(m, s, m_other, s_other)
        offset >>= 1
    return m, s


# 16-byte accesses (chapter 00, workbook/memory.py): `load16(x, i)` brings 16 bytes of a row at once,
# a tuple of 4 float32 or 8 float16. The helpers below work on such a tuple whatever its length:
# a loop over range(len(values)) has a constant trip count, which the compiler unrolls, so it costs
# no loop and the tuple stays in registers (`for v in values` reads the same, but numba-cuda-mlir
# keeps it a loop over a copy of the tuple in local memory: chapter 06's EXPERIMENTS.md).


@cuda.jit(device=True, forceinline=True)
def _max_of(m, values):
    for k in range(len(values)):
        m = max(m, np.float32(values[k]))
    return m


@cuda.jit(device=True, forceinline=True)
def _sum_exp(values, shift):
    total = ZERO
    for k in range(len(values)):
        total += math.exp(np.float32(values[k]) - shift)
    return total


@cuda.jit(device=True, forceinline=True)
def _exp_times4(values, shift, factor):
    """(exp(v - shift) * factor for each of the 4 values): the tuple store16 writes back."""
    a, b, c, d = values
    return (math.exp(np.float32(a) - shift) * factor, math.exp(np.float32(b) - shift) * factor,
            math.exp(np.float32(c) - shift) * factor, math.exp(np.float32(d) - shift) * factor)


@cuda.jit(device=True, forceinline=True)
def _exp_times8(values, shift, factor):
    a, b, c, d, e, f, g, h = values
    return (math.exp(np.float32(a) - shift) * factor, math.exp(np.float32(b) - shift) * factor,
            math.exp(np.float32(c) - shift) * factor, math.exp(np.float32(d) - shift) * factor,
            math.exp(np.float32(e) - shift) * factor, math.exp(np.float32(f) - shift) * factor,
            math.exp(np.float32(g) - shift) * factor, math.exp(np.float32(h) - shift) * factor)


@cuda.jit(device=True, forceinline=True)
def _grad1(value, row_lse, col, target, bad, scale):
    """(exp(x - lse) - onehot) * scale for one column (bad: NaN for a row whose target is out of
    range, else 0)."""
    return (math.exp(np.float32(value) - row_lse) - (ONE if col == target else bad)) * scale


@cuda.jit(device=True, forceinline=True)
def _grad4(values, row_lse, first_col, target, bad, scale):
    a, b, c, d = values
    return (_grad1(a, row_lse, first_col, target, bad, scale), _grad1(b, row_lse, first_col + 1, target, bad, scale),
            _grad1(c, row_lse, first_col + 2, target, bad, scale), _grad1(d, row_lse, first_col + 3, target, bad, scale))


@cuda.jit(device=True, forceinline=True)
def _grad8(values, row_lse, first_col, target, bad, scale):
    a, b, c, d, e, f, g, h = values
    return (_grad1(a, row_lse, first_col, target, bad, scale), _grad1(b, row_lse, first_col + 1, target, bad, scale),
            _grad1(c, row_lse, first_col + 2, target, bad, scale), _grad1(d, row_lse, first_col + 3, target, bad, scale),
            _grad1(e, row_lse, first_col + 4, target, bad, scale), _grad1(f, row_lse, first_col + 5, target, bad, scale),
            _grad1(g, row_lse, first_col + 6, target, bad, scale), _grad1(h, row_lse, first_col + 7, target, bad, scale))

