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

This module holds the host wrappers (check the arguments, pick the kernel, size the grid, launch)
and gathers the chapter's names in one namespace. The kernels, in reading order:

    common.py        constants, the warp collectives (warp_max, warp_sum, merge, warp_merge)
    naive.py         the float64 NumPy references, and the kernels with one thread per row
    rows.py          a warp or a block per row: online max-and-sum, fused cross-entropy
    warp_softmax.py  a warp per row with the row in registers, unrolled per columns per lane

Logits are float32 or float16 (arithmetic in float32); targets int32 or int64. Every kernel here is
what the chapter shows and what tests/test_ch06_softmax.py tests.
"""

from functools import lru_cache

import numpy as np

from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, PreparedLaunch, TensorCalls, cdiv
from workbook.memory import aligned, per16

from .common import (FULL_MASK, LOGIT_DTYPES, MAX_WARPS, MAX_WAVES, NAIVE_THREADS, NAN, NEG_INF, ONE, ROW_THREADS,
                     TARGET_DTYPES, TREE_THREADS, WARP, WARP_ROW_BLOCKS_PER_SM, WARP_ROW_MAX, ZERO, merge, warp_max,
                     warp_merge, warp_sum)
from .naive import (batch_mean_kernel, cross_entropy_backward_naive_kernel, cross_entropy_backward_reference,
                    cross_entropy_naive_kernel, cross_entropy_reference, log_softmax_reference, logsumexp_reference,
                    softmax_naive_kernel, softmax_reference)
from .rows import row_kernels
from .warp_softmax import _slots, warp_softmax_kernel


# ---------------------------------------------------------------------------------------------
# Host wrappers: check the arguments, pick the kernel, size the grid, launch. Naive and optimized
# take the same arguments, so one chapter.compare() call checks and times both. Every launch goes
# through a cache of prepared launches: the same buffers again cost the driver's launch, not
# numba's typing and packing of every argument (chapter 07).

_launches = LaunchCache()
_torch_calls = TensorCalls()  # softmax on torch tensors met before: one launch (chapter 07)


def _rows_args(x, name="x"):
    x = require(x, name, dtype=LOGIT_DTYPES, ndim=2)
    if x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} has shape {tuple(x.shape)}: need at least one row and one column")
    return x


def _blocks(rows, rows_per_block):
    """One row group per row up to sm_count() * MAX_WAVES blocks (the block scheduler balances the
    waves); past that, the kernels' row loops stride over the rest."""
    return max(1, min(cdiv(rows, rows_per_block), sm_count() * MAX_WAVES))


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
    return max(1, cdiv(rows, NAIVE_THREADS))


def _softmax_args(x, out):
    x = _rows_args(x)
    out = require(out, "out", dtype=x.dtype, shape=x.shape)
    return x, out


def softmax_naive(x, out):
    x, out = _softmax_args(x, out)
    _launches.launch(softmax_naive_kernel, _naive_blocks(x.shape[0]), NAIVE_THREADS, (x, out))
    return out


def softmax(x, out, *, registers=True, wide=True):
    """A warp per row up to WARP_ROW_MAX columns (the row in registers; with registers=False, two
    passes over the row instead), a block per row above. wide=True: 16-byte loads and stores
    wherever the rows allow them (`_width`); wide=False: element by element, the chapter's
    earlier kernels."""
    given = (x, out)
    key = _torch_calls.key(("x", "out"), given, registers, wide)
    found = _torch_calls.find(key)
    if found is not None:  # torch tensors met before, every check passed then: the same launch
        return found(None, given)[0]
    x, out = _softmax_args(x, out)
    # kernel choice, grid and argument packing done once per pair of buffers (chapter 07)
    entry = _launches.launch_planned(_softmax_plan, (x, out), (registers, wide))
    _torch_calls.keep(key, entry, returns=(out,), owners=(1,))
    return out


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
        blocks = max(1, min(cdiv(rows, 4), sm_count() * per_sm))
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
    _launches.launch(cross_entropy_naive_kernel, _naive_blocks(logits.shape[0]), NAIVE_THREADS,
                     (logits, targets, losses, lse))
    _launches.launch(batch_mean_kernel, 1, TREE_THREADS, (losses, mean))
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
    _launches.launch(cross_entropy_backward_naive_kernel, _naive_blocks(logits.shape[0]), NAIVE_THREADS,
                     (logits, targets, lse, grad))
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
