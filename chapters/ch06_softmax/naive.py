"""Chapter 06's references and naive kernels: float64 NumPy, and one thread per row."""

import math

import numpy as np
from numba import cuda

from workbook.host import by_rows

from .common import NAN, NEG_INF, ONE, TREE_THREADS, ZERO

# ---------------------------------------------------------------------------------------------
# float64 NumPy references


@by_rows  # each row on its own: on every core for a GPU's 131M logits (workbook/host.py)
def logsumexp_reference(logits):
    """log(sum(exp(row))) per row, in float64, shifted by the row's max so that nothing overflows."""
    x = np.asarray(logits, dtype=np.float64)
    top = x.max(axis=1, keepdims=True)
    shift = np.where(np.isfinite(top), top, 0.0)  # a row of -inf: shift by 0, its lse is -inf
    with np.errstate(divide="ignore"):
        return np.log(np.exp(x - shift).sum(axis=1)) + shift[:, 0]


@by_rows
def log_softmax_reference(logits):
    x = np.asarray(logits, dtype=np.float64)
    with np.errstate(invalid="ignore"):
        return x - logsumexp_reference(x)[:, None]


@by_rows
def softmax_reference(logits):
    """exp(x - lse): float64 inside, returned in the logits' dtype like the kernels' output."""
    with np.errstate(invalid="ignore"):
        return np.exp(log_softmax_reference(logits)).astype(logits.dtype)


def cross_entropy_reference(logits, targets):
    """(mean loss [1], loss per row, lse per row), float32: loss = lse - x[target] = -log softmax[target]."""
    lse = logsumexp_reference(logits)
    picked = np.asarray(logits)[np.arange(len(targets)), targets].astype(np.float64)  # not all of them
    losses = lse - picked
    return (np.array([losses.mean()], dtype=np.float32), losses.astype(np.float32), lse.astype(np.float32))


def cross_entropy_backward_reference(logits, targets):
    """d(mean loss)/d(logits) = (softmax - onehot(target)) / batch, in the logits' dtype."""
    logits, targets = np.asarray(logits), np.asarray(targets)  # both cut at the same rows
    return _backward_rows(logits, targets, len(targets))


@by_rows  # each row on its own but for the batch size, which is passed whole
def _backward_rows(logits, targets, batch):
    grad = np.exp(log_softmax_reference(logits))
    grad[np.arange(len(targets)), targets] -= 1.0
    return (grad / batch).astype(logits.dtype)


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


