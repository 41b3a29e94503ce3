"""Checks of chapter 10's exercises against float64 NumPy, at awkward sizes (one unit, rows and
units around a warp, more work than the grid, a grid of one thread and of four blocks), on poisoned
outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.exercises import Exercise, poisoned

from chapters.ch10_lstm.reference import sigmoid

CELLS = [(1, 1), (2, 32), (2, 33), (3, 31), (5, 100)]  # (B, H), smallest first
PROJECTIONS = [(1, 1, 1, 1), (3, 2, 5, 4), (2, 5, 7, 16), (4, 3, 33, 8)]  # (T, B, I, H)
# (T, N): one thread; one block; a whole warp; past a block; 4 blocks
RECURRENCES = [(1, 1), (3, 31), (2, 32), (4, 33), (3, 100)]


def check_cell(m):
    for B, H in CELLS:
        rng = np.random.default_rng(B * 1000 + H)
        x_terms, h_terms = rng.standard_normal((2, B, 4 * H), dtype=np.float32)
        bias = rng.standard_normal(4 * H, dtype=np.float32)
        c0 = rng.standard_normal((B, H), dtype=np.float32)
        if B > 1:  # NaN in the last row's last unit's input gate (in c and h of that (b, j) only), and
            x_terms[B - 1, H - 1] = np.nan  # inf in the first row's first output gate (o = 1 there)
            x_terms[0, 3 * H] = np.inf
        z = x_terms.astype(np.float64) + h_terms + bias
        i, f, g, o = sigmoid(z[:, :H]), sigmoid(z[:, H:2 * H]), np.tanh(z[:, 2 * H:3 * H]), sigmoid(z[:, 3 * H:])
        c_ref = f * c0 + i * g
        h_ref = o * np.tanh(c_ref)
        c, h = cuda.to_device(c0), poisoned((B, H), np.float32)
        m.lstm_cell(cuda.to_device(x_terms), cuda.to_device(h_terms), cuda.to_device(bias), c, h)
        workbook.assert_close(c, c_ref.astype(np.float32), rtol=1e-5, atol=1e-6, name=f"c (updated in place), B={B} H={H}")
        workbook.assert_close(h, h_ref.astype(np.float32), rtol=1e-5, atol=1e-6, name=f"h, B={B} H={H}")


def check_projection(m):
    for T, B, I, H in PROJECTIONS:
        rng = np.random.default_rng(T * 100 + I)
        x = rng.standard_normal((T, B, I), dtype=np.float32)
        w_ih_t = rng.standard_normal((I, 4 * H), dtype=np.float32)
        out = m.input_projection(cuda.to_device(x), cuda.to_device(w_ih_t), poisoned((T * B, 4 * H), np.float32))
        if tuple(out.shape) != (T, B, 4 * H):
            raise workbook.check.CheckError(f"input_projection returned shape {tuple(out.shape)}, expected "
                                            f"{(T, B, 4 * H)} (T, B, 4H) for T={T} B={B} I={I} H={H}")
        expected = np.einsum("tbi,ik->tbk", x.astype(np.float64), w_ih_t.astype(np.float64))
        workbook.assert_close(out, expected.astype(np.float32), rtol=1e-5, atol=1e-5 * I,
                              name=f"the projection, T={T} B={B} I={I} H={H}")


def check_recurrence(m):
    for T, N in RECURRENCES:
        rng = np.random.default_rng(T * 1000 + N)
        w = (rng.standard_normal((N, N)) / np.sqrt(N)).astype(np.float32)
        x = rng.standard_normal((T, N), dtype=np.float32)
        h0 = rng.standard_normal(N, dtype=np.float32)
        expected = h0.astype(np.float64)
        for t in range(T):
            expected = np.tanh(x[t] + w.astype(np.float64) @ expected)
        h = cuda.to_device(h0)
        m.recurrence(cuda.to_device(w), cuda.to_device(x), h)
        workbook.assert_close(h, expected.astype(np.float32), rtol=1e-4, atol=1e-5, name=f"h after T={T} steps, N={N}")


EXERCISES = [
    Exercise("ch10.1", "the LSTM cell, fused", "write", "lstm_cell_kernel", check_cell,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch10.2", "the hoisted input projection's shapes", "complete", "input_projection", check_projection,
             grids=(), fixed={"gemm_kernel argument 3 axis 0": "one batch: the hoisted projection is one GEMM"}),
    Exercise("ch10.3", "a grid barrier placed wrong", "fix", "recurrence_kernel", check_recurrence, grids=()),
]
