"""Chapter 03 — solutions: check_finite_and_unscale, one tensor at a time and fused.

Each exercise is the code between `# >>> ch03.N` and `# <<< ch03.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch03` (or run the exercise cells of the chapter's
notebook). The convention is PyTorch's: found_inf[0] becomes 1.0 if any gradient is inf or NaN
*before* the multiply; every gradient is multiplied by inv_scale in place, in float32.
"""

import math

import numpy as np
from numba import cuda

from workbook.inputs import require

THREADS_PER_BLOCK = 128
ONE = np.float32(1.0)


def _unscale_args(grad, found_inf, inv_scale):
    grad = require(grad, "grad", dtype=np.float32, ndim=1)
    found_inf = require(found_inf, "found_inf", dtype=np.float32, shape=(1,))
    inv_scale = require(inv_scale, "inv_scale", dtype=np.float32, shape=(1,))
    return grad, found_inf, inv_scale


# ---------------------------------------------------------------------------------------------
# ch03.1 (complete one test) — raise the flag. One thread per element. Set found_inf[0] to 1.0 when
# this thread's value is inf or NaN. Many threads may write it at once: since they all write the
# same 1.0, no atomic is needed. Hint: `math.isfinite` (NaN is not finite, and neither is -inf).


@cuda.jit
def unscale_kernel(grad, found_inf, inv_scale):
    i = cuda.grid(1)
    if i < grad.size:
        value = grad[i]
        # >>> ch03.1 (stub 5fab3d9a)
        if not math.isfinite(value):  # checked before the multiply, as PyTorch does
            found_inf[0] = ONE
        # <<< ch03.1
        grad[i] = value * inv_scale[0]  # read 4 bytes, write 4 bytes, in place


def unscale(grad, found_inf, inv_scale):
    grad, found_inf, inv_scale = _unscale_args(grad, found_inf, inv_scale)
    blocks = max(1, math.ceil(grad.size / THREADS_PER_BLOCK))
    unscale_kernel[blocks, THREADS_PER_BLOCK](grad, found_inf, inv_scale)
    return grad, found_inf


# ---------------------------------------------------------------------------------------------
# ch03.2 (write a device function) — which tensor owns item i? The fused kernel lays all tensors end
# to end; starts[t] is where tensor t begins (starts[0] = 0, non-decreasing; an empty tensor has the
# same start as the next one). Return the last t with starts[t] <= i: for empty tensors that is the
# next non-empty one, which really owns i. `count` is the number of tensors. Use a binary search:
# log2(count) steps, not count.
#
#   starts = [0, 3, 3, 7]   (tensor 1 is empty)     i = 0 1 2 | 3 4 5 6 | 7 ...
#                                                owner = 0 0 0 | 2 2 2 2 | 3 ...


@cuda.jit(device=True)
def find_owner(starts, count, i):
    # >>> ch03.2 (stub 6daa93bd)
    low, high = 0, count - 1  # invariant: starts[low] <= i, and the answer is in [low, high]
    while low < high:
        middle = (low + high + 1) >> 1  # rounds up, so that low = middle always moves
        if starts[middle] <= i:
            low = middle
        else:
            high = middle - 1
    return low
    # <<< ch03.2


@cuda.jit
def owners_kernel(starts, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = find_owner(starts, starts.size, i)


def owners(starts, out):
    """out[i] = the tensor that owns item i, for i < out.size (starts: int32 device array)."""
    starts = require(starts, "starts", dtype=np.int32, ndim=1)
    out = require(out, "out", dtype=np.int32, ndim=1)
    owners_kernel[max(1, math.ceil(out.size / THREADS_PER_BLOCK)), THREADS_PER_BLOCK](starts, out)
    return out


# ---------------------------------------------------------------------------------------------
# ch03.3 (find and fix the bug) — the same unscale with a small grid striding over the tensor.
# The check says which elements are wrong and which thread owns them. Fix the loop.


@cuda.jit
def unscale_grid_stride_kernel(grad, found_inf, inv_scale):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    # >>> ch03.3 (stub d2210a63)
    for i in range(start, grad.size, stride):
        # <<< ch03.3
        value = grad[i]
        if not math.isfinite(value):
            found_inf[0] = ONE
        grad[i] = value * inv_scale[0]


def unscale_grid_stride(grad, found_inf, inv_scale, blocks=2):
    grad, found_inf, inv_scale = _unscale_args(grad, found_inf, inv_scale)
    unscale_grid_stride_kernel[blocks, THREADS_PER_BLOCK](grad, found_inf, inv_scale)
    return grad, found_inf


# ---------------------------------------------------------------------------------------------
# ch03.4 (write a kernel) — the dynamic loss scale, updated on the device after each step, so that
# the host never waits for found_inf. One thread does it all:
#   if found_inf[0] != 0: scale[0] *= backoff; good_steps[0] = 0           (an overflow: back off)
#   else: good_steps[0] += 1, and when it reaches `interval`: scale[0] *= growth; good_steps[0] = 0
#   inv_scale[0] = 1 / scale[0] (float32), whichever branch ran. found_inf is left as it is.


@cuda.jit
def update_scale_kernel(scale, inv_scale, good_steps, found_inf, growth, backoff, interval):
    # >>> ch03.4 (stub c727a7b4)
    if cuda.grid(1) != 0:
        return  # one thread: four numbers do not need more
    if found_inf[0] != 0:
        scale[0] = scale[0] * backoff
        good_steps[0] = 0
    else:
        good_steps[0] += 1
        if good_steps[0] == interval:
            scale[0] = scale[0] * growth
            good_steps[0] = 0
    inv_scale[0] = ONE / scale[0]
    # <<< ch03.4


def update_scale(scale, inv_scale, good_steps, found_inf, growth=2.0, backoff=0.5, interval=3):
    scale = require(scale, "scale", dtype=np.float32, shape=(1,))
    inv_scale = require(inv_scale, "inv_scale", dtype=np.float32, shape=(1,))
    good_steps = require(good_steps, "good_steps", dtype=np.int32, shape=(1,))
    found_inf = require(found_inf, "found_inf", dtype=np.float32, shape=(1,))
    update_scale_kernel[1, 32](scale, inv_scale, good_steps, found_inf, np.float32(growth),
                               np.float32(backoff), np.int32(interval))
    return scale, inv_scale, good_steps


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
PLANTED_WRONG_ANSWERS = {
    "ch03.1": [("if not math.isfinite(value):", "if math.isinf(value):")],  # misses NaN
    "ch03.2": [("if starts[middle] <= i:", "if starts[middle] < i:")],  # the first item of each tensor
    "ch03.3": [("range(start, grad.size, stride)", "range(start, grad.size, stride + 1)")],
    "ch03.4": [("if good_steps[0] == interval:", "if good_steps[0] > interval:")],  # grows a step late
}
