"""Checks of chapter 08's exercises against float64 NumPy, at awkward sizes (one element, planes and
columns around a warp, more work than the grid), on poisoned outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import smallest_first
from workbook.exercises import Exercise, poisoned

FILTERS = smallest_first([(1, 1, 1, 1), (3, 2, 3, 3), (4, 8, 1, 1), (5, 4, 5, 3), (2, 7, 1, 5)])  # (K, C, R, S)
PLANES = smallest_first([(1, 1), (6, 31), (3, 33), (35, 64), workbook.size(gpu=(4097, 49), sim=(9, 100))])  # (N*C, H*W)
COLUMNS = smallest_first([(1, 1), (31, 10), (33, 65), (64, 32), (257, 3)])  # (rows, columns)


def check_flip_filters(m):
    for shape in FILTERS:
        w = np.random.default_rng(sum(shape)).standard_normal(shape, dtype=np.float32)
        wt = m.flip_filters(cuda.to_device(w), poisoned((shape[1], shape[0], shape[2], shape[3]), np.float32))
        expected = np.ascontiguousarray(w.transpose(1, 0, 2, 3)[:, :, ::-1, ::-1])
        workbook.assert_close(wt, expected, exact=True, name=f"flip_filters, w of shape {shape}")


def check_pool_backward(m):
    for rows, size in PLANES:
        d_out = np.random.default_rng(rows + size).standard_normal(rows, dtype=np.float32)
        out = m.pool_backward(cuda.to_device(d_out), poisoned((rows, size), np.float32))
        expected = np.repeat((d_out.astype(np.float64) / size)[:, None], size, axis=1).astype(np.float32)
        workbook.assert_close(out, expected, rtol=1e-6, atol=0, name=f"pool_backward, {rows} planes of {size}")


def check_sgd(m):
    rng = np.random.default_rng(8)
    # no constant of one case passes; sizes under a warp, past one, whole warps, past the grid
    for n, lr, momentum, decay in [(5, 0.2, 0.8, 0.05), (33, 0.05, 0.5, 0.001), (64, 0.01, 0.95, 0.0),
                                   (1001, 0.1, 0.9, 0.01)]:
        rule = f"lr={lr}, momentum={momentum}, decay={decay}"
        w, v = rng.standard_normal(n), np.zeros(n)
        params, velocity = cuda.to_device(w.astype(np.float32)), cuda.to_device(v.astype(np.float32))
        for step in range(3):  # three steps: the first alone cannot tell where the decay goes
            g = rng.standard_normal(n)
            m.sgd_momentum(params, cuda.to_device(g.astype(np.float32)), velocity, lr, momentum, decay)
            v = momentum * v + (g + decay * w)
            w = w - lr * v
            workbook.assert_close(velocity, v.astype(np.float32), rtol=1e-5, atol=1e-6,
                                  name=f"velocity after step {step + 1} ({rule})")
            workbook.assert_close(params, w.astype(np.float32), rtol=1e-5, atol=1e-6,
                                  name=f"params after step {step + 1} ({rule})")


def check_column_sum(m):
    for shape in COLUMNS:
        a = np.random.default_rng(shape[0]).standard_normal(shape, dtype=np.float32)
        out = m.column_sum(cuda.to_device(a), poisoned(shape[1], np.float32))
        workbook.assert_close(out, a.astype(np.float64).sum(axis=0).astype(np.float32), rtol=1e-5, atol=1e-5,
                              name=f"column_sum of {shape}")


EXERCISES = [
    Exercise("ch08.1", "the data gradient's filters", "complete", "flip_filters_kernel", check_flip_filters,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch08.2", "global average pooling, backward", "write", "pool_backward_kernel", check_pool_backward,
             grids=("more blocks", "one block", "smaller blocks"), coalesced=True),
    Exercise("ch08.3", "SGD: where the weight decay goes", "fix", "sgd_momentum_kernel", check_sgd,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch08.4", "the bias gradient, a warp per column", "write", "column_sum_kernel", check_column_sum,
             grids=("more blocks", "one block", "smaller blocks")),
]
