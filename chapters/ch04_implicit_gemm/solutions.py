"""Chapter 04 — solutions: convolution as a GEMM, explicit (im2col) and implicit.

Each exercise is the code between `# >>> ch04.N` and `# <<< ch04.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch04` (or run the exercise cells of the chapter's
notebook). Layouts are the chapter's: x is NCHW, w is KCRS, out is NKPQ, all float32; the GEMM
rows of im2col are (c, r, s) and its columns (n, p, q).
"""

import math

import numpy as np
from numba import cuda, float32

from chapters.ch04_implicit_gemm.kernels import conv_geometry, offset_table
from workbook.inputs import require

THREADS_PER_BLOCK = 128
ZERO = np.float32(0.0)


# ---------------------------------------------------------------------------------------------
# ch04.1 (complete the lookup) — im2col with the offset table.
#
# A thread owns column j = (n, p, q) of the column matrix and walks down its rows (c, r, s). The
# column part of the address is computed once, before the loop (`base`, `h0`, `w0`); the row part
# comes from the chapter's offset table, one column per row:
#   table[0, row] = c*H*W + r*dh*W + s*dw   (add to base: the element's offset in x)
#   table[1, row] = r*dh                    (add to h0: the input row)
#   table[2, row] = s*dw                    (add to w0: the input column)
# Complete the three lines: the element's (h, w), and its value, 0 where (h, w) is in the padding.


@cuda.jit
def im2col_kernel(x_flat, table, H, W, CHW, PQ, Q, sh, sw, ph, pw, col):
    j = cuda.grid(1)
    depth, columns = col.shape
    if j < columns:
        n = j // PQ  # the only divisions: once per thread
        p = (j % PQ) // Q
        q = j % Q
        h0 = p * sh - ph
        w0 = q * sw - pw
        base = n * CHW + h0 * W + w0
        for row in range(depth):
            # >>> ch04.1 (stub b4bed039)
            h = h0 + table[1, row]
            w = w0 + table[2, row]
            value = x_flat[base + table[0, row]] if 0 <= h < H and 0 <= w < W else ZERO
            # <<< ch04.1
            col[row, j] = value  # lanes write consecutive columns: coalesced


def im2col(x, w_shape, stride=1, padding=0, dilation=1):
    """The column matrix (C*R*S, N*P*Q) of x (a device array) for a filter of shape w_shape."""
    x = require(x, "x", dtype=np.float32, ndim=4)
    g = conv_geometry(x.shape, w_shape, stride, padding, dilation)
    col = cuda.device_array((g.gemm_depth, g.gemm_columns), np.float32)
    blocks = max(1, math.ceil(g.gemm_columns / THREADS_PER_BLOCK))
    im2col_kernel[blocks, THREADS_PER_BLOCK](x.reshape(x.size), cuda.to_device(offset_table(g)), g.H, g.W,
                                             g.C * g.H * g.W, g.P * g.Q, g.Q, g.sh, g.sw, g.ph, g.pw, col)
    return col


# ---------------------------------------------------------------------------------------------
# ch04.2 (write a kernel) — C = A @ B, one thread per element of C. A is (M, K), B is (K, N), C is
# (M, N), float32. A 2-D grid: x across the columns of C (so that a warp reads a row of B and
# writes a row of C coalesced), y down its rows. Sum in float32; the check allows for the rounding
# of K products.


@cuda.jit
def gemm_kernel(a, b, c):
    # >>> ch04.2 (stub 741e341c)
    col, row = cuda.grid(2)
    rows, depth = a.shape
    columns = b.shape[1]
    if row < rows and col < columns:
        total = ZERO
        for kk in range(depth):
            total += a[row, kk] * b[kk, col]  # a: a broadcast across the warp; b: coalesced
        c[row, col] = total
    # <<< ch04.2


def _gemm_args(a, b, c):
    a = require(a, "a", dtype=np.float32, ndim=2)
    b = require(b, "b", dtype=np.float32, ndim=2)
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {a.shape}, b is {b.shape}")
    c = require(c, "c", dtype=np.float32, shape=(a.shape[0], b.shape[1]))
    return a, b, c


def gemm(a, b, c):
    a, b, c = _gemm_args(a, b, c)
    blocks = (math.ceil(c.shape[1] / 16), math.ceil(c.shape[0] / 16))
    gemm_kernel[blocks, (16, 16)](a, b, c)
    return c


# ---------------------------------------------------------------------------------------------
# ch04.3 (find and fix the bug) — the shared-memory GEMM. A block of TILE x TILE threads computes a
# TILE x TILE tile of C; it walks the depth TILE at a time, staging a tile of A and a tile of B in
# shared memory (each element loaded once per block instead of TILE times). It is right for some
# shapes only. Run the check and compare the shapes that pass with the ones that fail.

TILE = 8


@cuda.jit
def gemm_tiled_kernel(a, b, c):
    a_tile = cuda.shared.array((TILE, TILE), float32)
    b_tile = cuda.shared.array((TILE, TILE), float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    col = cuda.blockIdx.x * TILE + tx
    row = cuda.blockIdx.y * TILE + ty
    rows, depth = a.shape
    columns = b.shape[1]
    total = ZERO
    # >>> ch04.3 (stub c6f98923)
    steps = (depth + TILE - 1) // TILE  # the last step may be partial: its missing elements load as 0
    # <<< ch04.3
    for step in range(steps):
        k0 = step * TILE
        a_tile[ty, tx] = a[row, k0 + tx] if row < rows and k0 + tx < depth else ZERO
        b_tile[ty, tx] = b[k0 + ty, col] if k0 + ty < depth and col < columns else ZERO
        cuda.syncthreads()  # the tiles are complete before anyone reads them
        for kk in range(TILE):
            total += a_tile[ty, kk] * b_tile[kk, tx]
        cuda.syncthreads()  # everyone is done with them before the next step overwrites them
    if row < rows and col < columns:
        c[row, col] = total


def gemm_tiled(a, b, c):
    a, b, c = _gemm_args(a, b, c)
    blocks = (math.ceil(c.shape[1] / TILE), math.ceil(c.shape[0] / TILE))
    gemm_tiled_kernel[blocks, (TILE, TILE)](a, b, c)
    return c


# ---------------------------------------------------------------------------------------------
# ch04.4 (write a kernel) — direct convolution, one thread per output element out[n, k, p, q]:
#   out[n, k, p, q] = sum over c, r, s of x[n, c, h, w] * w[k, c, r, s]
#   with h = p*sh - ph + r*dh and w = q*sw - pw + s*dw; terms with (h, w) outside x count 0.
# Flatten the output index (one thread per element of N*K*P*Q) and unflatten it with divisions.


@cuda.jit
def conv2d_direct_kernel(x, w, out, sh, sw, ph, pw, dh, dw):
    # >>> ch04.4 (stub 5ed9e399)
    index = cuda.grid(1)
    N, K, P, Q = out.shape
    C, H, W = x.shape[1], x.shape[2], x.shape[3]
    R, S = w.shape[2], w.shape[3]
    if index < N * K * P * Q:
        q = index % Q
        p = (index // Q) % P
        k = (index // (P * Q)) % K
        n = index // (K * P * Q)
        total = ZERO
        for c in range(C):
            for r in range(R):
                h = p * sh - ph + r * dh
                if 0 <= h < H:
                    for s in range(S):
                        v = q * sw - pw + s * dw
                        if 0 <= v < W:
                            total += x[n, c, h, v] * w[k, c, r, s]
        out[n, k, p, q] = total
    # <<< ch04.4


def conv2d_direct(x, w, out, stride=1, padding=0, dilation=1):
    x = require(x, "x", dtype=np.float32, ndim=4)
    w = require(w, "w", dtype=np.float32, ndim=4)
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation)
    out = require(out, "out", dtype=np.float32, shape=g.out_shape)
    blocks = max(1, math.ceil(out.size / THREADS_PER_BLOCK))
    conv2d_direct_kernel[blocks, THREADS_PER_BLOCK](x, w, out, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw)
    return out


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
PLANTED_WRONG_ANSWERS = {
    "ch04.1": [("else ZERO", "else np.float32(1.0)"),  # the padding read as 1, not 0
               ("0 <= w < W", "0 <= w < H")],  # H for W: right on square images only
    "ch04.2": [("for kk in range(depth):", "for kk in range(depth - 1):")],  # drops the last product
    "ch04.3": [("(depth + TILE - 1) // TILE", "(depth + TILE - 2) // TILE"),  # a partial step of 1 is lost
               # right values, but a step of zeros where depth is whole: too slow (the simulator's traffic)
               ("(depth + TILE - 1) // TILE", "depth // TILE + 1", "simulator")],
    "ch04.4": [("v = q * sw - pw + s * dw", "v = q * sw + s * dw")],  # padding forgotten along w
}
