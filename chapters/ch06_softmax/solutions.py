"""Chapter 06 — solutions: softmax and its reductions, a thread, a warp per row.

Each exercise is the code between `# >>> ch06.N` and `# <<< ch06.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch06` (or run the exercise cells of the chapter's
notebook). Rows of x are float32; references are the chapter's float64 NumPy functions.
"""

import math

import numpy as np
from numba import cuda

from chapters.ch06_softmax.kernels import FULL_MASK, NEG_INF, ONE, WARP, ZERO
from workbook.inputs import require

ROWS_PER_BLOCK = 4  # warp-per-row kernels: 4 warps of 32 lanes per block


def _rows(x, out, out_shape=None):
    x = require(x, "x", dtype=np.float32, ndim=2)
    out = require(out, "out", dtype=np.float32, shape=out_shape or x.shape)
    return x, out


def _warp_per_row_launch(kernel, rows):
    return kernel[max(1, math.ceil(rows / ROWS_PER_BLOCK)), ROWS_PER_BLOCK * WARP]


# ---------------------------------------------------------------------------------------------
# ch06.1 (complete one line) — a warp's sum, by butterfly. A warp owns a row; lane k first sums
# columns k, k + 32, k + 64, ... Then five exchanges, offsets 16, 8, 4, 2, 1: at each, every lane
# adds the partial sum of the lane whose index differs from its own in exactly that bit. After the
# fifth, every lane holds the whole row's sum, and lane 31 writes it (any lane could).
# Hint: `cuda.shfl_xor_sync(mask, value, lane_mask)`.


@cuda.jit
def row_sums_kernel(x, out):
    row = cuda.grid(1) >> 5  # the same in all 32 lanes of a warp
    lane = cuda.laneid
    if row < x.shape[0]:
        total = ZERO
        for c in range(lane, x.shape[1], WARP):  # lanes read 32 consecutive floats: coalesced
            total += x[row, c]
        offset = WARP // 2
        while offset > 0:
            # >>> ch06.1 (stub 06f571b3)
            total += cuda.shfl_xor_sync(FULL_MASK, total, offset)
            # <<< ch06.1
            offset >>= 1
        if lane == WARP - 1:
            out[row] = total


def row_sums(x, out):
    x, out = _rows(x, out, (x.shape[0],))
    _warp_per_row_launch(row_sums_kernel, x.shape[0])(x, out)
    return out


# ---------------------------------------------------------------------------------------------
# ch06.2 (write a kernel) — softmax, one thread per row (the chapter's naive layout).
#   out[r, c] = exp(x[r, c] - m) / sum over c' of exp(x[r, c'] - m),   m = max of row r
# Subtracting the row's max keeps exp() from overflowing (the check has logits of 1e4) and does
# not change the result. Three passes over the row: max, sum, normalise. A row may hold -inf
# (exp(-inf) = 0) but is never all -inf in the check.


@cuda.jit
def softmax_rows_kernel(x, out):
    # >>> ch06.2 (stub e5a77e7a)
    row = cuda.grid(1)
    if row < x.shape[0]:
        columns = x.shape[1]
        top = NEG_INF
        for c in range(columns):
            top = max(top, x[row, c])
        total = ZERO
        for c in range(columns):
            total += math.exp(x[row, c] - top)
        inverse = ONE / total
        for c in range(columns):
            out[row, c] = math.exp(x[row, c] - top) * inverse
    # <<< ch06.2


def softmax_rows(x, out):
    x, out = _rows(x, out)
    softmax_rows_kernel[max(1, math.ceil(x.shape[0] / 64)), 64](x, out)
    return out


# ---------------------------------------------------------------------------------------------
# ch06.3 (find and fix the bug) — out[r, c] = x[r, c] - max(x[r, :]), a warp per row: each lane
# takes the max of its columns, the warp combines them, and every lane then writes its columns.
# Only some lanes get the right answer. Run the check, see which columns are wrong, fix the line.


@cuda.jit
def subtract_row_max_kernel(x, out):
    row = cuda.grid(1) >> 5
    lane = cuda.laneid
    if row < x.shape[0]:
        top = NEG_INF
        for c in range(lane, x.shape[1], WARP):
            top = max(top, x[row, c])
        offset = WARP // 2
        while offset > 0:
            # >>> ch06.3 (stub 61d44300)
            top = max(top, cuda.shfl_xor_sync(FULL_MASK, top, offset))  # every lane ends with the max
            # <<< ch06.3
            offset >>= 1
        for c in range(lane, x.shape[1], WARP):
            out[row, c] = x[row, c] - top


def subtract_row_max(x, out):
    x, out = _rows(x, out)
    _warp_per_row_launch(subtract_row_max_kernel, x.shape[0])(x, out)
    return out


# ---------------------------------------------------------------------------------------------
# ch06.4 (write a kernel) — log_softmax, a warp per row: out = x - lse, lse = m + log(sum exp(x - m)).
# A warp-wide max, then a warp-wide sum of exp(x - m), then one write pass. (The chapter's online
# pass does max and sum in one read; two reads are fine here.) Bytes: read the row twice, write it
# once. Mind the rounding: at logits of 1e4 a float32 has a spacing of 1e-3, so lse = m + log(sum)
# rounds away the digits that x - lse needs; (x - m) - log(sum) keeps them (x - m is exact there).
# Hint: your answer to ch06.1, and ch06.3 for the max.


@cuda.jit
def log_softmax_kernel(x, out):
    # >>> ch06.4 (stub f20c84cc)
    row = cuda.grid(1) >> 5
    lane = cuda.laneid
    if row < x.shape[0]:
        top = NEG_INF
        for c in range(lane, x.shape[1], WARP):
            top = max(top, x[row, c])
        offset = WARP // 2
        while offset > 0:
            top = max(top, cuda.shfl_xor_sync(FULL_MASK, top, offset))
            offset >>= 1
        total = ZERO
        for c in range(lane, x.shape[1], WARP):
            total += math.exp(x[row, c] - top)
        offset = WARP // 2
        while offset > 0:
            total += cuda.shfl_xor_sync(FULL_MASK, total, offset)
            offset >>= 1
        log_total = math.log(total)
        for c in range(lane, x.shape[1], WARP):
            out[row, c] = (x[row, c] - top) - log_total  # not x - (top + log_total): see above
    # <<< ch06.4


def log_softmax(x, out):
    x, out = _rows(x, out)
    _warp_per_row_launch(log_softmax_kernel, x.shape[0])(x, out)
    return out


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
PLANTED_WRONG_ANSWERS = {
    "ch06.1": [("shfl_xor_sync", "shfl_down_sync")],  # only lane 0 ends with the sum
    "ch06.2": [("inverse = ONE / total", "inverse = ONE / (total + ONE)"),
               ("top = NEG_INF", "top = ZERO")],  # a max started at 0: rows of -1e4 give exp(x - 0) = 0
    "ch06.3": [("top = max(top, cuda.shfl_xor_sync", "top = min(top, cuda.shfl_xor_sync")],
    "ch06.4": [("(x[row, c] - top) - log_total", "x[row, c] - (top + log_total)")],  # rounds lse at 1e4
}
