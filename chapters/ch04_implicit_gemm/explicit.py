"""Chapter 04's naive convolution: im2col writes X to memory, then the tiled GEMM multiplies it."""


import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.inputs import require
from workbook.launch import cdiv

from .gemm import make_gemm_kernel
from .geometry import column_origin, conv_args, device_offset_table
from .schedule import launch_gemm, launches
from .tiles import pick_tile, quad_outputs_fit, quads_fit

# Naive, part 1: im2col. A 2-D grid: x over the N*P*Q columns (coalesced writes), y over rows.
# Each thread decodes its column once and writes it for rows blockIdx.y, + gridDim.y, ...
# Bytes: reads each input element up to R*S times (mostly from cache), WRITES 4*C*R*S*N*P*Q bytes,
# and the GEMM reads all of them back: R*S times the input's size, twice over DRAM.

IM2COL_THREADS = 256 if ON_GPU else 32  # the simulator runs every CUDA thread in Python
IM2COL_ROW_BLOCKS = 64 if ON_GPU else 2


@cuda.jit(fastmath=True)
def im2col_kernel(x, table, H, W, CHW, PQ, Q, sh, sw, ph, pw, col):
    npq = cuda.blockIdx.x * cuda.blockDim.x + cuda.threadIdx.x
    if npq >= col.shape[1]:  # the last block is partly past the end
        return
    base, h0, w0 = column_origin(npq, PQ, Q, sh, sw, ph, pw, W, CHW)
    for crs in range(cuda.blockIdx.y, col.shape[0], cuda.gridDim.y):
        h = h0 + table[1, crs]
        w = w0 + table[2, crs]
        value = float32(0)  # padding: the window hangs over the image's edge
        if h >= 0 and h < H and w >= 0 and w < W:
            value = x[base + table[0, crs]]
        col[crs, npq] = value  # 4 bytes written per element of X


def im2col(x, g, col):
    """Write the column matrix of x for geometry g into col (C*R*S, N*P*Q)."""
    x = require(x, "x", dtype=np.float32, shape=(g.N, g.C, g.H, g.W))
    col = require(col, "col", dtype=np.float32, shape=(g.gemm_depth, g.gemm_columns))
    blocks = (cdiv(g.gemm_columns, IM2COL_THREADS), min(g.gemm_depth, IM2COL_ROW_BLOCKS))
    launches.launch(im2col_kernel, blocks, IM2COL_THREADS, (x.reshape(-1), device_offset_table(g), g.H, g.W,
                                                            g.C * g.H * g.W, g.P * g.Q, g.Q, g.sh, g.sw, g.ph, g.pw, col))
    return col


def conv2d_explicit(x, w, out, *, stride=1, padding=0, dilation=1, workspace=None, tile=None,
                    splits=None):
    """The naive way: im2col into `workspace` (allocated if None), then the tiled GEMM."""
    x, w, out, g = conv_args(x, w, out, stride, padding, dilation)
    if workspace is None:
        workspace = cuda.device_array((g.gemm_depth, g.gemm_columns), dtype=np.float32)
    col = im2col(x, g, workspace)
    tile = pick_tile(tile)
    a = w.reshape(g.K, g.gemm_depth)
    kernel = make_gemm_kernel(tile, quads=quads_fit(tile, a, col), quad_outputs=quad_outputs_fit(tile, out, g.P * g.Q))
    launch_gemm(kernel, tile, g.K, g.gemm_columns, g.gemm_depth, splits, out.reshape(g.N, g.K, g.P * g.Q),
                a, col, g.P * g.Q)
    return out
