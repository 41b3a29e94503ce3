"""Chapter 06's kernels: softmax and cross-entropy, from one thread per row to a warp or a block per row.

    softmax_naive(x, out)            one thread per row, three passes over the row
    softmax(x, out)                  a warp per row (the row in registers) up to 1024 columns,
                                     a block per row (online max-and-sum, shared memory) above that;
                                     16-byte loads and stores (workbook.memory) where the rows allow
    cross_entropy_naive(logits, targets, losses, lse, mean)
    cross_entropy(logits, targets, losses, lse, mean)
                                     fused forward: reads the logits once, writes the per-row loss and
                                     log-sum-exp, then the batch mean (a shared-memory tree)
    cross_entropy_backward_naive(logits, targets, lse, grad)
    cross_entropy_backward(logits, targets, lse, grad)
                                     grad = (softmax - onehot) / batch, in one pass

Logits are float32 or float16 (arithmetic in float32); targets int32 or int64. Every kernel here is
what the chapter shows and what tests/test_ch06_softmax.py tests.
"""

import linecache
import math
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
from numba import cuda

from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, PreparedLaunch
from workbook.memory import aligned, load16, per16, store16

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
# float64 NumPy references


def logsumexp_reference(logits):
    """log(sum(exp(row))) per row, in float64, shifted by the row's max so that nothing overflows."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=1, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0.0)  # a row of -inf: shift by 0, its lse is -inf
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - shift).sum(axis=1)) + shift[:, 0]


def log_softmax_reference(logits):
    x = np.asarray(logits, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return x - logsumexp_reference(x)[:, None]


def softmax_reference(logits):
    """exp(x - lse): float64 inside, returned in the logits' dtype like the kernels' output."""
    with np.errstate(invalid="ignore"):
        return np.exp(log_softmax_reference(logits)).astype(logits.dtype)


def cross_entropy_reference(logits, targets):
    """(mean loss [1], loss per row, lse per row), float32: loss = lse - x[target] = -log softmax[target]."""
    lse = logsumexp_reference(logits)
    picked = np.asarray(logits, dtype=np.float64)[np.arange(len(targets)), targets]
    losses = lse - picked
    return (np.array([losses.mean()], dtype=np.float32), losses.astype(np.float32), lse.astype(np.float32))


def cross_entropy_backward_reference(logits, targets):
    """d(mean loss)/d(logits) = (softmax - onehot(target)) / batch, in the logits' dtype."""
    grad = np.exp(log_softmax_reference(logits))
    grad[np.arange(len(targets)), targets] -= 1.0
    return (grad / len(targets)).astype(logits.dtype)


# ---------------------------------------------------------------------------------------------
# Naive: one thread per row, as in the loss layer of "Learn CUDA Programming" (ch. 10).
#
#   thread t0 -> row 0:  x[0,0] x[0,1] ... x[0,C-1]      at step c, the 32 lanes of a warp read
#   thread t1 -> row 1:  x[1,0] x[1,1] ... x[1,C-1]      x[0,c], x[1,c], ..., x[31,c]: 32 addresses
#   ...                                                  4*C bytes apart, 32 sectors per request.
#
# Each thread walks its row three times (max, sum of exp, normalise): 12*C bytes read and 4*C
# written per row for softmax (L1 hides some of the re-reads), and only B threads in the grid: a
# batch of 4096 rows is 128 warps for 132 SMs, less than one warp per SM.
#
# The book's version has two bugs, fixed here:
#   1. its grid has batch x classes threads, and nothing stops thread t >= batch: it reads and
#      writes rows that do not exist. Here the grid has one thread per row and a bounds check.
#   2. its batch mean loads one loss per thread of ONE block and tree-reduces it, so a batch
#      larger than the block loses every loss past the block. Here each thread first sums a
#      block-strided slice of the losses, then the tree reduces the 256 partial sums.


@cuda.jit
def softmax_naive_kernel(x, out):
    row = cuda.grid(1)
    if row >= x.shape[0]:  # bug 1: the last block is partly past the batch
        return
    ncols = x.shape[1]
    top = NEG_INF
    for c in range(ncols):  # pass 1: read 4*C bytes
        top = max(top, np.float32(x[row, c]))
    total = ZERO
    for c in range(ncols):  # pass 2: read 4*C bytes again
        total += math.exp(np.float32(x[row, c]) - top)
    inv = ONE / total
    for c in range(ncols):  # pass 3: read 4*C, write 4*C bytes
        out[row, c] = math.exp(np.float32(x[row, c]) - top) * inv


@cuda.jit
def cross_entropy_naive_kernel(logits, targets, losses, lse):
    row = cuda.grid(1)
    if row >= logits.shape[0]:  # bug 1 again
        return
    ncols = logits.shape[1]
    top = NEG_INF
    for c in range(ncols):
        top = max(top, np.float32(logits[row, c]))
    total = ZERO
    for c in range(ncols):
        total += math.exp(np.float32(logits[row, c]) - top)
    lse[row] = top + math.log(total)
    t = targets[row]
    if t >= 0 and t < ncols:
        # (max - x[t]) + log(sum): the first difference is exact when x[t] is near the max, so a
        # loss near 0 keeps its digits even when the logits are 1e4 (lse - x[t] would lose them).
        losses[row] = (top - np.float32(logits[row, t])) + math.log(total)
    else:
        losses[row] = NAN  # an out-of-range target is never read: a NaN loss instead


@cuda.jit
def batch_mean_kernel(values, mean):
    """mean[0] = values.mean(): one block of TREE_THREADS threads, any number of values."""
    partial = cuda.shared.array(TREE_THREADS, dtype=np.float32)
    tid = cuda.threadIdx.x
    acc = ZERO
    for i in range(tid, values.size, TREE_THREADS):  # bug 2: every value, however many
        acc += values[i]
    partial[tid] = acc
    cuda.syncthreads()
    stride = TREE_THREADS // 2
    while stride > 0:  # 256 -> 128 -> ... -> 1 partial sums, a barrier after each halving
        if tid < stride:
            partial[tid] += partial[tid + stride]
        cuda.syncthreads()
        stride >>= 1
    if tid == 0:
        mean[0] = partial[0] / np.float32(values.size)


@cuda.jit
def cross_entropy_backward_naive_kernel(logits, targets, lse, grad):
    row = cuda.grid(1)
    if row >= logits.shape[0]:
        return
    ncols = logits.shape[1]
    scale = ONE / np.float32(logits.shape[0])
    t = targets[row]
    valid = t >= 0 and t < ncols
    row_lse = lse[row]
    for c in range(ncols):  # read 4*C, write 4*C bytes, uncoalesced like the forward
        g = math.exp(np.float32(logits[row, c]) - row_lse)
        if c == t:
            g -= ONE
        grad[row, c] = g * scale if valid else NAN


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
def _warp_max(v):
    """Butterfly all-reduce: after log2(32) = 5 exchanges every lane holds the warp's max."""
    offset = WARP // 2
    while offset > 0:
        v = max(v, cuda.shfl_xor_sync(FULL_MASK, v, offset))
        offset >>= 1
    return v


@cuda.jit(device=True)
def _warp_sum(v):
    offset = WARP // 2
    while offset > 0:
        v += cuda.shfl_xor_sync(FULL_MASK, v, offset)
        offset >>= 1
    return v


@cuda.jit(device=True)
def _merge(m1, s1, m2, s2):
    """Two partial (max, sum of exp(x - max)) of one row -> the pair for their union.

    Each sum is rescaled to the common max: s1 * exp(m1 - m) + s2 * exp(m2 - m). While both parts
    have seen only -inf, m is -inf and m1 - m would be NaN: shift by 0 instead (exp(-inf) = 0).
    """
    m = max(m1, m2)
    shift = m if m != NEG_INF else ZERO
    return m, s1 * math.exp(m1 - shift) + s2 * math.exp(m2 - shift)


@cuda.jit(device=True)
def _warp_merge(m, s):
    offset = WARP // 2
    while offset > 0:
        m_other = cuda.shfl_xor_sync(FULL_MASK, m, offset)
        s_other = cuda.shfl_xor_sync(FULL_MASK, s, offset)
        m, s = _merge(m, s, m_other, s_other)
        offset >>= 1
    return m, s


# 16-byte accesses (chapter 00, workbook/memory.py): `load16(x, i)` brings 16 bytes of a row at once,
# a tuple of 4 float32 or 8 float16. The helpers below work on such a tuple whatever its length:
# numba unrolls a loop over a tuple of constant length, so `for v in values` costs no loop.


@cuda.jit(device=True, inline=True)
def _max_of(m, values):
    for v in values:
        m = max(m, np.float32(v))
    return m


@cuda.jit(device=True, inline=True)
def _sum_exp(values, shift):
    total = ZERO
    for v in values:
        total += math.exp(np.float32(v) - shift)
    return total


@cuda.jit(device=True, inline=True)
def _exp_times4(values, shift, factor):
    """(exp(v - shift) * factor for each of the 4 values): the tuple store16 writes back."""
    a, b, c, d = values
    return (math.exp(np.float32(a) - shift) * factor, math.exp(np.float32(b) - shift) * factor,
            math.exp(np.float32(c) - shift) * factor, math.exp(np.float32(d) - shift) * factor)


@cuda.jit(device=True, inline=True)
def _exp_times8(values, shift, factor):
    a, b, c, d, e, f, g, h = values
    return (math.exp(np.float32(a) - shift) * factor, math.exp(np.float32(b) - shift) * factor,
            math.exp(np.float32(c) - shift) * factor, math.exp(np.float32(d) - shift) * factor,
            math.exp(np.float32(e) - shift) * factor, math.exp(np.float32(f) - shift) * factor,
            math.exp(np.float32(g) - shift) * factor, math.exp(np.float32(h) - shift) * factor)


@cuda.jit(device=True, inline=True)
def _grad1(value, row_lse, col, target, bad, scale):
    """(exp(x - lse) - onehot) * scale for one column (bad: NaN for a row whose target is out of
    range, else 0)."""
    return (math.exp(np.float32(value) - row_lse) - (ONE if col == target else bad)) * scale


@cuda.jit(device=True, inline=True)
def _grad4(values, row_lse, first_col, target, bad, scale):
    a, b, c, d = values
    return (_grad1(a, row_lse, first_col, target, bad, scale), _grad1(b, row_lse, first_col + 1, target, bad, scale),
            _grad1(c, row_lse, first_col + 2, target, bad, scale), _grad1(d, row_lse, first_col + 3, target, bad, scale))


@cuda.jit(device=True, inline=True)
def _grad8(values, row_lse, first_col, target, bad, scale):
    a, b, c, d, e, f, g, h = values
    return (_grad1(a, row_lse, first_col, target, bad, scale), _grad1(b, row_lse, first_col + 1, target, bad, scale),
            _grad1(c, row_lse, first_col + 2, target, bad, scale), _grad1(d, row_lse, first_col + 3, target, bad, scale),
            _grad1(e, row_lse, first_col + 4, target, bad, scale), _grad1(f, row_lse, first_col + 5, target, bad, scale),
            _grad1(g, row_lse, first_col + 6, target, bad, scale), _grad1(h, row_lse, first_col + 7, target, bad, scale))


def row_kernels(group, width=1):
    """See _row_kernels: one compiled set per (group, width), however the call spells them."""
    return _row_kernels(int(group), int(width))


@lru_cache(maxsize=None)
def _row_kernels(group, width):
    """The kernels for a row group of `group` threads: WARP (rows up to WARP_ROW_MAX columns, 8 rows
    per block of 256) or a whole block (ROW_THREADS; up to 1024). One compiled set per group size;
    `group` is a constant inside the kernels, so `% group` is a mask and the branch on the group
    size costs nothing. Launch with `threads_per_block` threads per block.

    width=1: element by element. width=4 (float32) or 8 (float16): each thread moves 16 bytes per
    access, `width` consecutive columns; rows must be a multiple of `width` columns and the arrays
    16-byte aligned (the host wrappers check, see `_wide`)."""
    threads_per_block = max(group, ROW_THREADS)
    groups_per_block = threads_per_block // group
    warps_per_group = group // WARP
    step = group * width  # columns a row group covers with one access per thread
    exp_times = _exp_times4 if width == 4 else _exp_times8
    grad_of = _grad4 if width == 4 else _grad8

    @cuda.jit(device=True)
    def online_max_sum_wide(x, row, rank):
        """online_max_sum with 16-byte loads: columns width*rank.. of each `step`, two loads (32
        bytes) in flight per thread, then one exp per value and one rescale per two loads."""
        ncols = x.shape[1]
        start = row * ncols  # flat index of the row's first element; a multiple of width
        m = NEG_INF
        s = ZERO
        c = rank * width
        while c + step < ncols:  # ncols % width == 0: the second load is a whole one too
            a = load16(x, start + c)
            b = load16(x, start + c + step)
            new_m = _max_of(_max_of(m, a), b)
            shift = new_m if new_m != NEG_INF else ZERO
            s = s * math.exp(m - shift) + (_sum_exp(a, shift) + _sum_exp(b, shift))
            m = new_m
            c += 2 * step
        if c < ncols:
            a = load16(x, start + c)
            new_m = _max_of(m, a)
            shift = new_m if new_m != NEG_INF else ZERO
            s = s * math.exp(m - shift) + _sum_exp(a, shift)
            m = new_m
        return m, s

    @cuda.jit(device=True)
    def online_max_sum(x, row, rank):
        """This thread's (max, sum of exp(x - max)) over columns rank, rank + group, ... of the row.

        One pass (the "online softmax" of Milakov & Gimelshein, 2018): when the max grows, the sum
        so far is rescaled by exp(old max - new max). Eight columns are loaded before any is used,
        so each thread has 8 loads (32 bytes of float32) in flight; one exp per value, one per trip.
        """
        ncols = x.shape[1]
        m = NEG_INF
        s = ZERO
        c = rank
        while c + 7 * group < ncols:
            v0 = np.float32(x[row, c])
            v1 = np.float32(x[row, c + group])
            v2 = np.float32(x[row, c + 2 * group])
            v3 = np.float32(x[row, c + 3 * group])
            v4 = np.float32(x[row, c + 4 * group])
            v5 = np.float32(x[row, c + 5 * group])
            v6 = np.float32(x[row, c + 6 * group])
            v7 = np.float32(x[row, c + 7 * group])
            new_m = max(m, max(max(max(v0, v1), max(v2, v3)), max(max(v4, v5), max(v6, v7))))
            shift = new_m if new_m != NEG_INF else ZERO
            s = s * math.exp(m - shift) + (
                ((math.exp(v0 - shift) + math.exp(v1 - shift)) + (math.exp(v2 - shift) + math.exp(v3 - shift)))
                + ((math.exp(v4 - shift) + math.exp(v5 - shift)) + (math.exp(v6 - shift) + math.exp(v7 - shift))))
            m = new_m
            c += 8 * group
        while c < ncols:  # the tail: fewer than 8 columns left for this thread
            v = np.float32(x[row, c])
            new_m = max(m, v)
            shift = new_m if new_m != NEG_INF else ZERO
            s = s * math.exp(m - shift) + math.exp(v - shift)
            m = new_m
            c += group
        return m, s

    row_max_sum = online_max_sum if width == 1 else online_max_sum_wide

    @cuda.jit(device=True)
    def write_softmax(x, out, row, rank, m, inv):
        """out[row] = exp(x[row] - m) * inv: the second pass, one element at a time..."""
        ncols = x.shape[1]
        c = rank
        while c + 3 * group < ncols:  # four loads before the first store
            v0 = np.float32(x[row, c])
            v1 = np.float32(x[row, c + group])
            v2 = np.float32(x[row, c + 2 * group])
            v3 = np.float32(x[row, c + 3 * group])
            out[row, c] = math.exp(v0 - m) * inv
            out[row, c + group] = math.exp(v1 - m) * inv
            out[row, c + 2 * group] = math.exp(v2 - m) * inv
            out[row, c + 3 * group] = math.exp(v3 - m) * inv
            c += 4 * group
        while c < ncols:
            out[row, c] = math.exp(np.float32(x[row, c]) - m) * inv
            c += group

    @cuda.jit(device=True)
    def write_softmax_wide(x, out, row, rank, m, inv):
        """...or 16 bytes at a time: two loads in flight, then two 16-byte stores."""
        ncols = x.shape[1]
        start = row * ncols
        c = rank * width
        while c + step < ncols:
            a = load16(x, start + c)
            b = load16(x, start + c + step)
            store16(out, start + c, exp_times(a, m, inv))
            store16(out, start + c + step, exp_times(b, m, inv))
            c += 2 * step
        if c < ncols:
            store16(out, start + c, exp_times(load16(x, start + c), m, inv))

    @cuda.jit(device=True)
    def write_grad(x, grad, row, rank, t, row_lse, bad, scale):
        """grad[row] = (exp(x[row] - lse) - onehot(t)) * scale, one element at a time..."""
        ncols = x.shape[1]
        c = rank
        while c + 3 * group < ncols:
            v0 = np.float32(x[row, c])
            v1 = np.float32(x[row, c + group])
            v2 = np.float32(x[row, c + 2 * group])
            v3 = np.float32(x[row, c + 3 * group])
            grad[row, c] = (math.exp(v0 - row_lse) - (ONE if c == t else bad)) * scale
            grad[row, c + group] = (math.exp(v1 - row_lse) - (ONE if c + group == t else bad)) * scale
            grad[row, c + 2 * group] = (math.exp(v2 - row_lse) - (ONE if c + 2 * group == t else bad)) * scale
            grad[row, c + 3 * group] = (math.exp(v3 - row_lse) - (ONE if c + 3 * group == t else bad)) * scale
            c += 4 * group
        while c < ncols:
            grad[row, c] = (math.exp(np.float32(x[row, c]) - row_lse) - (ONE if c == t else bad)) * scale
            c += group

    @cuda.jit(device=True)
    def write_grad_wide(x, grad, row, rank, t, row_lse, bad, scale):
        """...or 16 bytes at a time."""
        ncols = x.shape[1]
        start = row * ncols
        c = rank * width
        while c + step < ncols:
            a = load16(x, start + c)
            b = load16(x, start + c + step)
            store16(grad, start + c, grad_of(a, row_lse, c, t, bad, scale))
            store16(grad, start + c + step, grad_of(b, row_lse, c + step, t, bad, scale))
            c += 2 * step
        if c < ncols:
            store16(grad, start + c, grad_of(load16(x, start + c), row_lse, c, t, bad, scale))

    softmax_pass = write_softmax if width == 1 else write_softmax_wide
    grad_pass = write_grad if width == 1 else write_grad_wide

    @cuda.jit(device=True)
    def group_max_sum(m, s, scratch_m, scratch_s):
        """Every thread of the group gets the row's (max, sum): shuffles within each warp, then,
        for a block-sized group, one partial per warp through shared memory (2 x 8 floats for
        256 threads)."""
        m, s = _warp_merge(m, s)
        if warps_per_group == 1:
            return m, s
        warp = cuda.threadIdx.x // WARP
        lane = cuda.threadIdx.x % WARP
        if lane == 0:
            scratch_m[warp] = m
            scratch_s[warp] = s
        cuda.syncthreads()
        # Every warp reduces the 8 partials itself: no second barrier to broadcast a result.
        m = scratch_m[lane] if lane < warps_per_group else NEG_INF
        s = scratch_s[lane] if lane < warps_per_group else ZERO
        m, s = _warp_merge(m, s)
        cuda.syncthreads()  # nobody overwrites the partials (next row) before all have read them
        return m, s

    @cuda.jit
    def cross_entropy_kernel(x, targets, losses, lse):
        """Fused forward: read the B*C logits once (4*B*C bytes in float32); write 8*B bytes."""
        scratch_m = cuda.shared.array(MAX_WARPS, dtype=np.float32)
        scratch_s = cuda.shared.array(MAX_WARPS, dtype=np.float32)
        rank = cuda.threadIdx.x % group  # this thread's place in its row group
        first_row = cuda.blockIdx.x * groups_per_block + cuda.threadIdx.x // group
        row_step = cuda.gridDim.x * groups_per_block
        ncols = x.shape[1]
        for row in range(first_row, x.shape[0], row_step):  # the same trip count for a whole group
            m, s = row_max_sum(x, row, rank)
            m, s = group_max_sum(m, s, scratch_m, scratch_s)
            if rank == 0:
                log_total = math.log(s)
                lse[row] = m + log_total
                t = targets[row]
                if t >= 0 and t < ncols:
                    # (max - x[t]) + log(sum): exact first difference, so a loss near 0 keeps its
                    # digits at logits of 1e4. One more 4-byte read, from L2: the row was just read.
                    losses[row] = (m - np.float32(x[row, t])) + log_total
                else:
                    losses[row] = NAN  # an out-of-range target is never read

    @cuda.jit
    def softmax_kernel(x, out):
        """Two passes over the row: (max, sum) online, then re-read and write. The second read
        comes from L1/L2 (the row was read microseconds before), so DRAM sees 8*C bytes per row."""
        scratch_m = cuda.shared.array(MAX_WARPS, dtype=np.float32)
        scratch_s = cuda.shared.array(MAX_WARPS, dtype=np.float32)
        rank = cuda.threadIdx.x % group
        first_row = cuda.blockIdx.x * groups_per_block + cuda.threadIdx.x // group
        row_step = cuda.gridDim.x * groups_per_block
        for row in range(first_row, x.shape[0], row_step):
            m, s = row_max_sum(x, row, rank)
            m, s = group_max_sum(m, s, scratch_m, scratch_s)
            softmax_pass(x, out, row, rank, m, ONE / s)

    @cuda.jit
    def backward_kernel(x, targets, lse, grad):
        """grad = (exp(x - lse) - onehot) / B: read 4*B*C + 8*B bytes, write 4*B*C (float32)."""
        scale = ONE / np.float32(x.shape[0])
        rank = cuda.threadIdx.x % group
        first_row = cuda.blockIdx.x * groups_per_block + cuda.threadIdx.x // group
        row_step = cuda.gridDim.x * groups_per_block
        ncols = x.shape[1]
        for row in range(first_row, x.shape[0], row_step):
            t = targets[row]
            row_lse = lse[row]
            # An out-of-range target: the whole gradient row is NaN, like its loss.
            bad = ZERO if (t >= 0 and t < ncols) else NAN
            grad_pass(x, grad, row, rank, t, row_lse, bad, scale)

    return SimpleNamespace(cross_entropy=cross_entropy_kernel, softmax=softmax_kernel,
                           backward=backward_kernel, group=group, threads_per_block=threads_per_block)


# The register kernel. numba has no `#pragma unroll`, and a loop of 16 or 32 exps is too long for
# the compiler to unroll completely (LLVM's NVPTX pipeline, tried offline, leaves it rolled), so a
# `cuda.local.array` indexed in it would end up in (slow) local memory. The kernel is therefore
# written out unrolled, once per `slots` (columns per lane), from this template: slots = 2 gives
# the body with v0, v1 that `workbook.show(warp_softmax_kernel(2))` prints.

_WARP_SOFTMAX_SOURCE = """
def {name}(x, out):
    # A warp per row; {layout}
    lane = cuda.threadIdx.x % WARP
    first_row = cuda.grid(1) // WARP
    row_step = cuda.gridsize(1) // WARP
    ncols = x.shape[1]
    for row in range(first_row, x.shape[0], row_step):  # warp-uniform: all lanes, same rows
        # {in_flight}
{loads}
        top = _warp_max({max_of_all})
{exps}
        inv = ONE / _warp_sum({sum_of_all})
{stores}
"""


def _tree(op, names):
    """A balanced expression: max(max(a, b), max(c, d)), (a + b) + (c + d): short dependency chains."""
    if len(names) == 1:
        return names[0]
    half = len(names) // 2
    left, right = _tree(op, names[:half]), _tree(op, names[half:])
    return f"max({left}, {right})" if op == "max" else f"({left} + {right})"


def warp_softmax_kernel(slots, full=False, width=1):
    """See _warp_softmax_kernel: one compiled kernel per (slots, full, width)."""
    return _warp_softmax_kernel(int(slots), bool(full), int(width))


@lru_cache(maxsize=None)
def _warp_softmax_kernel(slots, full, width):
    """Softmax with a warp per row and the row in registers (OneFlow's design for rows up to 1024
    columns): read and write each byte once, 8*C bytes per row in float32.

    full=True: for rows of exactly 32*slots columns, with no bounds checks at all. The checks are
    not free: 2*slots comparisons, and every load and store predicated (on the H100, 1000-column
    rows run well below 1024-column ones: see the chapter's sweep).

    width=4 (float32) or 8 (float16): the lane's values come in 16-byte loads of `width` columns
    (load16) and go out in 16-byte stores: slots/width accesses per lane instead of 2*slots. Lane l
    holds columns width*l .. width*l + width-1, then the same 32*width columns further, and so on.
    Needs slots >= width, rows a multiple of `width` columns and 16-byte aligned arrays.
    """
    pad = " " * 8
    names = [f"v{j}" for j in range(slots)]

    def col(j):
        return "lane" if j == 0 else f"lane + {j * WARP}"

    if width > 1:
        loads, stores = _wide_register_body(slots, full, width, pad)
    elif full:
        loads = [f"{pad}v{j} = np.float32(x[row, {col(j)}])" for j in range(slots)]
        stores = [f"{pad}out[row, {col(j)}] = v{j} * inv" for j in range(slots)]
    else:
        loads = [f"{pad}v{j} = np.float32(x[row, {col(j)}]) if {col(j)} < ncols else NEG_INF"
                 for j in range(slots)]
        stores = [f"{pad}if {col(j)} < ncols:\n{pad}    out[row, {col(j)}] = v{j} * inv" for j in range(slots)]
    name = f"warp_softmax_{slots}" + ("_full" if full else "") + (f"_x{width}" if width > 1 else "")
    if width == 1:
        layout = f"lane l holds columns l, l+32, ..., l+32*{slots - 1} in v0..v{slots - 1}."
        in_flight = (f"{slots} independent loads per lane, all in flight at once. Each address is the row's\n"
                     f"{pad}# start + 4*lane + 128*j bytes: one base register and a constant offset per load.")
    else:
        layout = (f"lane l holds columns {width}l..{width}l+{width - 1}, the same {WARP * width} columns "
                  f"further, ... in v0..v{slots - 1}.")
        in_flight = (f"{slots // width} independent 16-byte loads per lane, all in flight at once, at the "
                     f"row's start\n{pad}# + 16*lane + 512*k bytes: a warp reads 512 contiguous bytes per load.")
    source = _WARP_SOFTMAX_SOURCE.format(
        name=name, layout=layout, in_flight=in_flight, loads="\n".join(loads), max_of_all=_tree("max", names),
        exps="\n".join(f"{pad}v{j} = math.exp(v{j} - top)" for j in range(slots)),
        sum_of_all=_tree("+", names), stores="\n".join(stores))
    filename = f"<{name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # for show()
    namespace = dict(globals())
    exec(compile(source, filename, "exec"), namespace)
    return cuda.jit(namespace[name])


def _wide_register_body(slots, full, width, pad):
    """The loads and stores of the 16-byte register kernel: access k of a lane covers columns
    width*lane + 32*width*k ... + width-1 (flat index `start` + 32*width*k), values v[width*k ...]."""
    loads = [f"{pad}start = row * ncols + {width} * lane  # this lane's first column, as a flat index"]
    stores = []
    for k in range(slots // width):
        values = [f"v{k * width + e}" for e in range(width)]
        offset = "" if k == 0 else f" + {k * WARP * width}"
        # float32 arrives as float32; float16 arrives as 8 halves (h...), converted for the arithmetic
        if width == 4:
            load = [f"{', '.join(values)} = load16(x, start{offset})"]
        else:
            halves = [f"h{k * width + e}" for e in range(width)]
            load = [f"{', '.join(halves)} = load16(x, start{offset})"] + [
                f"{v} = np.float32({h})" for v, h in zip(values, halves)]
        store = f"store16(out, start{offset}, ({', '.join(v + ' * inv' for v in values)}))"
        if full:
            loads += [pad + line for line in load]
            stores.append(pad + store)
        else:  # ncols % width == 0: a lane's access is all inside the row or all past it
            inside = f"{width} * lane{offset} < ncols"
            loads.append(f"{pad}if {inside}:")
            loads += [pad + "    " + line for line in load]
            loads += [f"{pad}else:", f"{pad}    {' = '.join(values)} = NEG_INF"]
            stores += [f"{pad}if {inside}:", f"{pad}    {store}"]
    return loads, stores


def _slots(ncols):
    """Columns per lane for the register kernel, rounded up to a power of two (1, 2, ..., 32): a
    handful of compiled variants, as OneFlow's template parameter has."""
    slots = 1
    while slots * WARP < ncols:
        slots *= 2
    return slots


# ---------------------------------------------------------------------------------------------
# Host wrappers: check the arguments, pick the kernel, size the grid, launch. Naive and optimized
# take the same arguments, so one chapter.compare() call checks and times both.


def _rows_args(x, name="x"):
    x = require(x, name, dtype=LOGIT_DTYPES, ndim=2)
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: need at least one row and one column")
    return x


def _blocks(rows, rows_per_block):
    """One row group per row up to sm_count() * MAX_WAVES blocks (the block scheduler balances the
    waves); past that, the kernels' row loops stride over the rest."""
    return max(1, min(math.ceil(rows / rows_per_block), sm_count() * MAX_WAVES))


def _width(ncols, *arrays):
    """Columns per 16-byte access (4 float32, 8 float16) when every row starts 16 bytes after a
    16-byte boundary: rows a multiple of that many columns and every array 16-byte aligned. 1
    otherwise (element by element: correct for any shape and any view)."""
    width = per16(arrays[0].dtype)
    return width if ncols % width == 0 and all(aligned(a, 16) for a in arrays) else 1


@lru_cache(maxsize=256)  # a pure function of the shape: worked out once, not at every call
def _row_plan(name, rows, ncols, width=1):
    """(kernel, blocks, threads) of row_kernels' `name`: a warp per row up to WARP_ROW_MAX columns,
    a block of ROW_THREADS per row above; `width` columns per access."""
    kernels = row_kernels(WARP if ncols <= WARP_ROW_MAX else ROW_THREADS, width)
    rows_per_block = kernels.threads_per_block // kernels.group
    return getattr(kernels, name), _blocks(rows, rows_per_block), kernels.threads_per_block


def _naive_blocks(rows):
    return max(1, math.ceil(rows / NAIVE_THREADS))


def _softmax_args(x, out):
    x = _rows_args(x)
    out = require(out, "out", dtype=x.dtype, shape=x.shape)
    return x, out


def softmax_naive(x, out):
    x, out = _softmax_args(x, out)
    softmax_naive_kernel[_naive_blocks(x.shape[0]), NAIVE_THREADS](x, out)
    return out


def softmax(x, out, *, registers=True, wide=True):
    """A warp per row up to WARP_ROW_MAX columns (the row in registers; with registers=False, two
    passes over the row instead), a block per row above. wide=True: 16-byte loads and stores
    wherever the rows allow them (`_width`); wide=False: element by element, the chapter's
    earlier kernels."""
    x, out = _softmax_args(x, out)
    # kernel choice, grid and argument packing done once per pair of buffers (chapter 07)
    _launches.launch_planned(_softmax_plan, (x, out), (registers, wide))
    return out


_launches = LaunchCache()


def prepare_softmax(x, out, *, registers=True, wide=True):
    """softmax's checks, kernel choice and grid done once for these buffers: returns a call that
    launches the same kernel at the driver's cost and returns out (chapter 07)."""
    x, out = _softmax_args(x, out)
    kernel, blocks, threads = _softmax_plan(x, out, registers, wide)
    return PreparedLaunch(kernel, blocks, threads, x, out, returns=out)


def _softmax_plan(x, out, registers, wide):
    """(kernel, blocks, threads) for softmax of checked x into out."""
    rows, ncols = x.shape
    width = _width(ncols, x, out) if wide else 1
    if ncols <= WARP_ROW_MAX and registers:
        slots = _slots(ncols)
        # fewer columns than one 16-byte access per lane (slots < width): element by element
        width = width if slots >= width else 1
        kernel = warp_softmax_kernel(slots, full=ncols == slots * WARP, width=width)
        threads_per_block = 4 * WARP  # 4 warps, each looping over rows (the kernel's row loop)
        # 4-byte: ~250 registers a thread, few resident warps: a grid that keeps them looping.
        # 16-byte: ~72 registers (4x fewer loads, addresses and predicates to keep), so an SM holds
        # 3x more warps and a grid sized to the data (a warp per row) is faster (measured).
        per_sm = WARP_ROW_BLOCKS_PER_SM if width == 1 else MAX_WAVES
        blocks = max(1, min(math.ceil(rows / 4), sm_count() * per_sm))
        return kernel, blocks, threads_per_block
    return _row_plan("softmax", rows, ncols, width)


def check_targets(targets, ncols):
    """ValueError unless 0 <= target < ncols everywhere. Copies the targets to the host (a sync):
    done once per data set in a training loop, so the timed calls below pass check_targets=False.
    The kernels never read outside a row whatever the targets: a bad one gives a NaN loss."""
    values = targets.copy_to_host()
    bad = np.flatnonzero((values < 0) | (values >= ncols))
    if len(bad):
        i = int(bad[0])
        raise ValueError(f"targets[{i}] = {int(values[i])} is out of range for {ncols} classes "
                         f"({len(bad)} target(s) outside [0, {ncols}))")


def _cross_entropy_args(logits, targets, losses, lse, mean, validate):
    logits = _rows_args(logits, "logits")
    rows, ncols = logits.shape
    targets = require(targets, "targets", dtype=TARGET_DTYPES, shape=(rows,))
    losses = require(losses, "losses", dtype=np.float32, shape=(rows,))
    lse = require(lse, "lse", dtype=np.float32, shape=(rows,))
    mean = require(mean, "mean", dtype=np.float32, shape=(1,))
    if validate:
        check_targets(targets, ncols)
    return logits, targets, losses, lse, mean


def cross_entropy_naive(logits, targets, losses, lse, mean, *, check_targets=True):
    logits, targets, losses, lse, mean = _cross_entropy_args(logits, targets, losses, lse, mean,
                                                             check_targets)
    cross_entropy_naive_kernel[_naive_blocks(logits.shape[0]), NAIVE_THREADS](logits, targets, losses, lse)
    batch_mean_kernel[1, TREE_THREADS](losses, mean)
    return mean, losses, lse


def cross_entropy(logits, targets, losses, lse, mean, *, check_targets=True, wide=True, stream=0):
    """Fused forward: per-row loss and log-sum-exp in one read of the logits, then the batch mean.
    wide: 16-byte loads of the logits where the rows allow them; stream: where both kernels go."""
    logits, targets, losses, lse, mean = _cross_entropy_args(logits, targets, losses, lse, mean,
                                                             check_targets)
    rows, ncols = logits.shape
    kernel, blocks, threads = _row_plan("cross_entropy", rows, ncols, _width(ncols, logits) if wide else 1)
    _launches.launch(kernel, blocks, threads, (logits, targets, losses, lse), stream=stream)
    _launches.launch(batch_mean_kernel, 1, TREE_THREADS, (losses, mean), stream=stream)
    return mean, losses, lse


def _backward_args(logits, targets, lse, grad, validate):
    logits = _rows_args(logits, "logits")
    rows, ncols = logits.shape
    targets = require(targets, "targets", dtype=TARGET_DTYPES, shape=(rows,))
    lse = require(lse, "lse", dtype=np.float32, shape=(rows,))
    grad = require(grad, "grad", dtype=logits.dtype, shape=logits.shape)
    if validate:
        check_targets(targets, ncols)
    return logits, targets, lse, grad


def cross_entropy_backward_naive(logits, targets, lse, grad, *, check_targets=True):
    logits, targets, lse, grad = _backward_args(logits, targets, lse, grad, check_targets)
    cross_entropy_backward_naive_kernel[_naive_blocks(logits.shape[0]), NAIVE_THREADS](logits, targets, lse, grad)
    return grad


def cross_entropy_backward(logits, targets, lse, grad, *, check_targets=True, wide=True, stream=0):
    """grad = (softmax - onehot) / batch in one pass, from the lse the forward stored. wide: 16-byte
    loads and stores where the rows allow them."""
    logits, targets, lse, grad = _backward_args(logits, targets, lse, grad, check_targets)
    rows, ncols = logits.shape
    width = _width(ncols, logits, grad) if wide else 1
    kernel, blocks, threads = _row_plan("backward", rows, ncols, width)
    _launches.launch(kernel, blocks, threads, (logits, targets, lse, grad), stream=stream)
    return grad
