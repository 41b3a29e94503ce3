"""Checks of chapter 04's exercises against the chapter's NumPy references (im2col_reference,
gemm_reference, conv2d_reference), on shapes with odd sizes, strides, padding and dilation, and
poisoned outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import Launch
from workbook.exercises import Exercise, poisoned

from . import kernels as k

GEOMETRIES = [case[1:] for case in k.AWKWARD_CASES]  # (x shape, w shape, stride, padding, dilation)
GEMM_SHAPES = [(1, 1, 1), (1, 9, 1), (31, 17, 33), (33, 8, 31), (9, 23, 16),
               workbook.size(gpu=(257, 1001, 131), sim=(37, 29, 41))]  # (M, K, N)


def _grid(threads_x, threads_y):
    """Element [i, j] of a matrix written by thread (j, i) of a 2-D grid of (threads_x, threads_y) blocks."""
    return Launch.mapped(lambda at: ((at[1] // threads_x, at[0] // threads_y), (at[1] % threads_x, at[0] % threads_y)))


# How the exercises launch (exercises.py), so that a wrong element names its block and thread: im2col
# a thread per column of X, conv2d_direct a thread per output element (m.THREADS_PER_BLOCK a block),
# the GEMMs a thread per element of c in blocks of 16x16 (naive) or m.TILE x m.TILE.
def _column_thread(m):
    return Launch.mapped(lambda at: divmod(at[1], m.THREADS_PER_BLOCK))


def _random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def check_im2col(m):
    for index, (x_shape, w_shape, stride, padding, dilation) in enumerate(GEOMETRIES):
        x = _random(x_shape, index)
        g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
        col = m.im2col(cuda.to_device(x), w_shape, stride, padding, dilation)
        workbook.assert_close(col, k.im2col_reference(x, g), exact=True,
                              name=f"im2col x{x_shape} w{w_shape} stride {stride} padding {padding} dilation {dilation}",
                              launch=_column_thread(m))


def _check_gemm(gemm, name, launch):
    for M, K, N in GEMM_SHAPES:
        a, b = _random((M, K), M), _random((K, N), N)
        rtol, atol = k.tolerance(K)
        c = gemm(cuda.to_device(a), cuda.to_device(b), poisoned((M, N), np.float32))
        workbook.assert_close(c, k.gemm_reference(a, b), rtol=rtol, atol=atol, name=f"{name} M={M} K={K} N={N}",
                              launch=launch)


def check_gemm(m):
    _check_gemm(m.gemm, "gemm", _grid(16, 16))


def check_gemm_tiled(m):
    _check_gemm(m.gemm_tiled, "gemm_tiled", _grid(m.TILE, m.TILE))


def check_conv(m):
    for index, (x_shape, w_shape, stride, padding, dilation) in enumerate(GEOMETRIES):
        x, w = _random(x_shape, index), _random(w_shape, index + 10)
        g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
        rtol, atol = k.tolerance(g.gemm_depth)
        out = m.conv2d_direct(cuda.to_device(x), cuda.to_device(w), poisoned(g.out_shape, np.float32), stride,
                              padding, dilation)
        workbook.assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol,
                              name=f"conv2d_direct x{x_shape} w{w_shape} stride {stride} padding {padding} "
                                   f"dilation {dilation}", launch=Launch(0, m.THREADS_PER_BLOCK))


EXERCISES = [
    Exercise("ch04.1", "im2col: the offset-table lookup", "complete", "im2col_kernel", check_im2col),
    Exercise("ch04.2", "a GEMM, one thread per element", "write", "gemm_kernel", check_gemm),
    Exercise("ch04.3", "the tiled GEMM's last step", "fix", "gemm_tiled_kernel", check_gemm_tiled),
    Exercise("ch04.4", "direct convolution", "write", "conv2d_direct_kernel", check_conv),
]
