"""Checks of chapter 04's exercises against the chapter's NumPy references (im2col_reference,
gemm_reference, conv2d_reference), on shapes with odd sizes, strides, padding and dilation, and
poisoned outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import Launch, smallest_first
from workbook.exercises import Exercise, poisoned

from . import kernels as k

GEOMETRIES = [case[1:] for case in k.AWKWARD_CASES]  # (x shape, w shape, stride, padding, dilation)
# (M, K, N); with the depths K = 10, 11, 12, 14, every residue of K modulo 8 (ch04.3's TILE)
GEMM_SHAPES = smallest_first([(1, 1, 1), (1, 9, 1), (3, 10, 5), (5, 11, 3), (2, 12, 7), (7, 14, 2), (31, 17, 33),
                              (33, 8, 31), (9, 23, 16), workbook.size(gpu=(257, 1001, 131), sim=(37, 29, 41))],
                             lambda mkn: max(mkn[0] * mkn[1], mkn[1] * mkn[2], mkn[0] * mkn[2]))


def _grid(threads_x, threads_y):
    """Element [i, j] of a matrix written by thread (j, i) of a 2-D grid of (threads_x, threads_y) blocks."""
    return Launch.mapped(lambda at: ((at[1] // threads_x, at[0] // threads_y), (at[1] % threads_x, at[0] % threads_y)))


# How the exercises launch (exercises.py), so that a wrong element names its block and thread: im2col
# a thread per column of X, conv2d_direct a thread per output element (m.THREADS_PER_BLOCK a block),
# the GEMMs a thread per element of c in blocks of 16x16 (naive) or m.TILE x m.TILE.
def _column_thread(m):
    return Launch.mapped(lambda at: divmod(at[1], m.THREADS_PER_BLOCK))


def _columns(case):
    """The size of im2col's output for (index, geometry): what its check is ordered by."""
    g = k.conv_geometry(*case[1])
    return max(np.prod(case[1][0]), g.gemm_depth * g.gemm_columns)


def _largest(case):
    """The largest of x, w and the output for (index, geometry): what the convolution's check is ordered by."""
    g = k.conv_geometry(*case[1])
    return max(np.prod(case[1][0]), np.prod(case[1][1]), np.prod(g.out_shape))


def _random(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32)


def check_im2col(m):
    for index, (x_shape, w_shape, stride, padding, dilation) in smallest_first(enumerate(GEOMETRIES), _columns):
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
    for index, (x_shape, w_shape, stride, padding, dilation) in smallest_first(enumerate(GEOMETRIES), _largest):
        x, w = _random(x_shape, index), _random(w_shape, index + 10)
        g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
        rtol, atol = k.tolerance(g.gemm_depth)
        out = m.conv2d_direct(cuda.to_device(x), cuda.to_device(w), poisoned(g.out_shape, np.float32), stride,
                              padding, dilation)
        workbook.assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol,
                              name=f"conv2d_direct x{x_shape} w{w_shape} stride {stride} padding {padding} "
                                   f"dilation {dilation}", launch=Launch(0, m.THREADS_PER_BLOCK))


EXERCISES = [
    Exercise("ch04.1", "im2col: the offset-table lookup", "complete", "im2col_kernel", check_im2col,
             fixed={"im2col_kernel argument 1 axis 0": "the offset table's three rows: channel, row, column"}),
    Exercise("ch04.2", "a GEMM, one thread per element", "write", "gemm_kernel", check_gemm),
    Exercise("ch04.3", "the tiled GEMM's last step", "fix", "gemm_tiled_kernel", check_gemm_tiled,
             tiles={("gemm_tiled_kernel", 0, 1): 8}),  # a's depth K, walked TILE at a time
    Exercise("ch04.4", "direct convolution", "write", "conv2d_direct_kernel", check_conv),
]
