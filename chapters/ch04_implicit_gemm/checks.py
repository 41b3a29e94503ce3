"""Checks of chapter 04's exercises against the chapter's NumPy references (im2col_reference,
gemm_reference, conv2d_reference), on shapes with odd sizes, strides, padding and dilation, and
poisoned outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.exercises import Exercise, poisoned

from . import kernels as k

# (x shape NCHW, w shape KCRS, stride, padding, dilation)
GEOMETRIES = [
    ((1, 1, 1, 1), (1, 1, 1, 1), 1, 0, 1),
    ((1, 2, 5, 7), (3, 2, 3, 3), 1, 1, 1),
    ((2, 3, 9, 6), (4, 3, 3, 2), 2, (1, 0), 1),
    ((1, 2, 11, 10), (2, 2, 3, 3), 1, 2, 2),
    ((3, 1, 7, 5), (2, 1, 1, 3), (1, 2), 0, 1),
]
GEMM_SHAPES = [(1, 1, 1), (1, 9, 1), (31, 17, 33), (33, 8, 31), (9, 23, 16),
               workbook.size(gpu=(257, 1001, 131), sim=(37, 29, 41))]  # (M, K, N)


def _random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def check_im2col(m):
    for index, (x_shape, w_shape, stride, padding, dilation) in enumerate(GEOMETRIES):
        x = _random(x_shape, index)
        g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
        col = m.im2col(cuda.to_device(x), w_shape, stride, padding, dilation)
        workbook.assert_close(col, k.im2col_reference(x, g), exact=True,
                              name=f"im2col x{x_shape} w{w_shape} stride {stride} padding {padding} dilation {dilation}")


def _check_gemm(gemm, name):
    for M, K, N in GEMM_SHAPES:
        a, b = _random((M, K), M), _random((K, N), N)
        rtol, atol = k.tolerance(K)
        c = gemm(cuda.to_device(a), cuda.to_device(b), poisoned((M, N), np.float32))
        workbook.assert_close(c, k.gemm_reference(a, b), rtol=rtol, atol=atol, name=f"{name} M={M} K={K} N={N}")


def check_gemm(m):
    _check_gemm(m.gemm, "gemm")


def check_gemm_tiled(m):
    _check_gemm(m.gemm_tiled, "gemm_tiled")


def check_conv(m):
    for index, (x_shape, w_shape, stride, padding, dilation) in enumerate(GEOMETRIES):
        x, w = _random(x_shape, index), _random(w_shape, index + 10)
        g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
        rtol, atol = k.tolerance(g.gemm_depth)
        out = m.conv2d_direct(cuda.to_device(x), cuda.to_device(w), poisoned(g.out_shape, np.float32), stride,
                              padding, dilation)
        workbook.assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol,
                              name=f"conv2d_direct x{x_shape} w{w_shape} stride {stride} padding {padding} "
                                   f"dilation {dilation}")


EXERCISES = [
    Exercise("ch04.1", "im2col: the offset-table lookup", "complete", "im2col_kernel", check_im2col),
    Exercise("ch04.2", "a GEMM, one thread per element", "write", "gemm_kernel", check_gemm),
    Exercise("ch04.3", "the tiled GEMM's last step", "fix", "gemm_tiled_kernel", check_gemm_tiled),
    Exercise("ch04.4", "direct convolution", "write", "conv2d_direct_kernel", check_conv),
]
