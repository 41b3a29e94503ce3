"""Checks of chapter 06's exercises against the chapter's float64 NumPy references, on row counts
and widths around a warp (1, 31, 33, ...), with logits of +-1e4 and -inf entries, on poisoned
outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import Launch, smallest_first
from workbook.exercises import Exercise, poisoned

from . import kernels as k


def warp_per_row(m):
    """Which block and thread wrote an element, as the exercises launch (exercises.py): a warp per
    row, m.ROWS_PER_BLOCK rows a block, lane c % 32 on column c; lane 31 writes a row's sum."""
    rows = m.ROWS_PER_BLOCK
    return Launch.mapped(lambda at: (at[0] // rows, 32 * (at[0] % rows) + (at[1] % 32 if len(at) > 1 else 31)))


THREAD_PER_ROW = Launch.mapped(lambda at: divmod(at[0], 64))  # softmax_rows: a thread per row, 64 a block


SHAPES = smallest_first([(1, 1), (1, 31), (2, 64), (3, 33), (5, 100), (9, 1), workbook.size(gpu=(1001, 1025), sim=(7, 67))])


def logits(shape, seed=0):
    """Normal logits; every third row shifted by 1e4 (exp would overflow unshifted), the next one by
    -1e4 (a max started at 0, not -inf, would leave exp(x - 0) = 0 everywhere); -inf entries."""
    rng = np.random.default_rng(seed + shape[0] * 131 + shape[1])
    x = rng.standard_normal(shape, dtype=np.float32) * 3
    x[::3] += np.float32(1e4)
    x[1::3] -= np.float32(1e4)
    if shape[1] > 1:
        x[:, 1::7] = -np.inf  # never a whole row: column 0 stays finite
    return x


def check_row_sums(m):
    for shape in SHAPES:
        x = np.random.default_rng(shape[1]).standard_normal(shape, dtype=np.float32)
        out = m.row_sums(cuda.to_device(x), poisoned(shape[0], np.float32))
        workbook.assert_close(out, x.astype(np.float64).sum(axis=1).astype(np.float32), rtol=1e-5, atol=1e-5,
                              name=f"row_sums {shape}", launch=warp_per_row(m))


def check_softmax(m):
    for shape in smallest_first(SHAPES + [(65, 3)]):  # 65 rows: more than the 64 threads of one block
        x = logits(shape)
        out = m.softmax_rows(cuda.to_device(x), poisoned(shape, np.float32))
        workbook.assert_close(out, k.softmax_reference(x), rtol=1e-5, atol=1e-7, name=f"softmax_rows {shape}",
                              launch=THREAD_PER_ROW)


def check_subtract_max(m):
    for shape in SHAPES:
        x = logits(shape, seed=1)
        out = m.subtract_row_max(cuda.to_device(x), poisoned(shape, np.float32))
        workbook.assert_close(out, x - x.max(axis=1, keepdims=True), exact=True, name=f"subtract_row_max {shape}",
                              launch=warp_per_row(m))


def check_log_softmax(m):
    for shape in SHAPES:
        x = logits(shape, seed=2)
        out = m.log_softmax(cuda.to_device(x), poisoned(shape, np.float32))
        expected = k.log_softmax_reference(x).astype(np.float32)
        workbook.assert_close(out, expected, rtol=1e-5, atol=1e-4, name=f"log_softmax {shape}", launch=warp_per_row(m))


EXERCISES = [
    Exercise("ch06.1", "a warp sum: the butterfly", "complete", "row_sums_kernel", check_row_sums),
    Exercise("ch06.2", "softmax, a thread per row", "write", "softmax_rows_kernel", check_softmax),
    Exercise("ch06.3", "a warp max only lane 0 knows", "fix", "subtract_row_max_kernel", check_subtract_max),
    Exercise("ch06.4", "log_softmax, a warp per row", "write", "log_softmax_kernel", check_log_softmax),
]
