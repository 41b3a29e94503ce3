"""Chapter 10 — exercises: the LSTM's fused cell, its hoisted input projection, a grid barrier.

Each exercise is the code between `# >>> ch10.N` and `# <<< ch10.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch10` (or run the exercise cells of the chapter's
notebook). Arrays are float32; references are float64 NumPy (reference.py).
"""

import math

import numpy as np
from numba import cuda, float32

from chapters.ch04_implicit_gemm.kernels import gemm
from workbook import ON_GPU
from workbook.barrier import unsafe_grid_sync
from workbook.inputs import require

THREADS = 128
ONE = float32(1.0)


def _blocks(n, threads=THREADS):
    return max(1, math.ceil(n / threads))


# ---------------------------------------------------------------------------------------------
# ch10.1 (write a kernel) — one step of the LSTM cell, fused. For every batch row b and unit j:
#   z_q = x_terms[b, q*H + j] + h_terms[b, q*H + j] + bias[q*H + j]     for the gates q = i, f, g, o (0..3)
#   c[b, j] = sigmoid(z_f) * c[b, j] + sigmoid(z_i) * tanh(z_g)            (in place)
#   h[b, j] = sigmoid(z_o) * tanh(c[b, j])
# with sigmoid(z) = 1 / (1 + exp(-z)). One thread per (b, j), grid-stride (the grid may be smaller
# than B * H). Keep the arithmetic float32 (ONE, not 1.0). NaN in a row stays in that row.


@cuda.jit
def lstm_cell_kernel(x_terms, h_terms, bias, c, h):
    # >>> ch10.1 (stub aa5d1d38)
    raise NotImplementedError("ch10.1: write the fused cell: c and h of every (b, j)")
    # <<< ch10.1


def lstm_cell(x_terms, h_terms, bias, c, h):
    c = require(c, "c", dtype=np.float32, ndim=2)
    B, H = c.shape
    x_terms = require(x_terms, "x_terms", dtype=np.float32, shape=(B, 4 * H))
    h_terms = require(h_terms, "h_terms", dtype=np.float32, shape=(B, 4 * H))
    bias = require(bias, "bias", dtype=np.float32, shape=(4 * H,))
    h = require(h, "h", dtype=np.float32, shape=(B, H))
    lstm_cell_kernel[min(_blocks(B * H), 4), THREADS](x_terms, h_terms, bias, c, h)
    return c, h


# ---------------------------------------------------------------------------------------------
# ch10.2 (complete two lines) — the input projection of every time step as one GEMM. x is the
# whole input sequence, (T, B, I); w_ih_t is W_ih transposed, (I, 4H). The projection of step t is
# x[t] @ w_ih_t, (B, 4H); all T of them are one product of a (T*B, I) matrix by w_ih_t. Chapter
# 04's gemm(a, b, c) computes c = a @ b for 2-D a (M, K), b (K, N) and c (M, N). `out` is the
# (T*B, 4H) result buffer; return it viewed as (T, B, 4H), so that out[t] is step t's projection.
# (A contiguous device array's .reshape makes a view: no copy.)


def input_projection(x, w_ih_t, out):
    x = require(x, "x", dtype=np.float32, ndim=3)
    T, B, I = x.shape
    w_ih_t = require(w_ih_t, "w_ih_t", dtype=np.float32, ndim=2)
    if w_ih_t.shape[0] != I:
        raise ValueError(f"w_ih_t has {w_ih_t.shape[0]} rows, x has {I} features")
    four_h = w_ih_t.shape[1]
    out = require(out, "out", dtype=np.float32, shape=(T * B, four_h))
    # >>> ch10.2 (stub bcec1f39)
    gemm(x, w_ih_t, out)  # wrong shapes: a is 3-D
    return out
    # <<< ch10.2


# ---------------------------------------------------------------------------------------------
# ch10.3 (fix a planted bug) — a recurrence over the whole grid, the persistent kernel's skeleton:
#   h_t[i] = tanh(x[t, i] + sum_k w[i, k] * h_{t-1}[k])     for t = 0 .. T-1
# h (N,) holds h_{-1} on entry and is updated in place; w (N, N), x (T, N). One cooperative launch,
# thread i of the grid owns h[i], and the blocks meet at grid.sync() between steps. As written, one
# thread can overwrite its h[i] with h_t while another, in its block or in another, still reads
# h_{t-1}[i] for its own sum: a race. Place the grid barriers so that no write meets a read of the
# same step. Every thread of every block must reach every grid.sync(): one that some thread skips
# (inside `if i < n:`, or after a `return`) hangs a GPU; the wrapper refuses to launch it there.

GRID_THREADS = 32  # small blocks, so that a check's sizes span several of them


@cuda.jit
def recurrence_kernel(w, x, h):
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    n = h.size
    # >>> ch10.3 (stub a4dd9789)
    for t in range(x.shape[0]):
        if i < n:
            total = x[t, i]
            for k in range(n):
                total += w[i, k] * h[k]
            h[i] = math.tanh(total)
        grid.sync()  # every h_t[i] written before the next step reads them
    # <<< ch10.3


def recurrence(w, x, h):
    h = require(h, "h", dtype=np.float32, ndim=1)
    n = h.shape[0]
    w = require(w, "w", dtype=np.float32, shape=(n, n))
    x = require(x, "x", dtype=np.float32, ndim=2)
    if x.shape[1] != n:
        raise ValueError(f"x has {x.shape[1]} values a step, h has {n}")
    if ON_GPU and (hazard := unsafe_grid_sync(recurrence_kernel)):
        raise ValueError(f"recurrence_kernel not launched: {hazard}; on a GPU the launch would hang")
    recurrence_kernel[_blocks(n, GRID_THREADS), GRID_THREADS](w, x, h)
    return h
