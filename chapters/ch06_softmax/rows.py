"""Chapter 06's row kernels: a warp or a block per row, reading along the row (coalesced), the
partial results combined with shuffles and, for a block, through shared memory."""

import math
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
from numba import cuda

from workbook.memory import load16, store16

from .common import (MAX_WARPS, NAN, NEG_INF, ONE, ROW_THREADS, WARP, ZERO, _exp_times4, _exp_times8, _grad4, _grad8,
                     _max_of, _sum_exp, warp_merge)

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
        m, s = warp_merge(m, s)
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
        m, s = warp_merge(m, s)
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


