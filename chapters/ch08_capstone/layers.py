"""The capstone's new kernels: the layers a training step needs that chapters 00-06 did not write.

    conv2d_dgrad        dx from dy: the forward convolution of dy with the filters flipped and
                        transposed, run by chapter 04's implicit-GEMM kernel (stride 1)
    conv2d_wgrad        dw from x and dy: an implicit GEMM of its own (depth = N*P*Q), split over
                        the depth and summed with atomics
    global_avg_pool     a warp per (n, c) plane, and its backward (one thread per element)
    linear_forward      out = x @ wt + b on chapter 04's GEMM; linear_backward: two more GEMMs,
                        two small transposes and a column sum
    batchnorm_eval_relu BatchNorm with the running statistics (+ identity) + ReLU, for evaluation
    sgd_momentum        one launch over every parameter of the network, kept in one flat buffer
    add_into, gather_batch, end_step: the glue of a step (see network.py)

Every kernel here is what the notebook shows and what tests/test_ch08_capstone.py tests.
"""

import math
from functools import lru_cache
from types import SimpleNamespace

import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, cdiv

from chapters.ch04_implicit_gemm.kernels import (column_origin, conv2d_implicit, conv_geometry, device_offset_table,
                                                 gemm, zero_kernel)
from chapters.ch06_softmax.kernels import warp_sum

ZERO = np.float32(0.0)
THREADS = 256 if ON_GPU else 32  # elementwise kernels; the simulator runs every CUDA thread in Python
U64 = np.uint64

_workspaces = {}
# Every launch below goes through this cache (chapter 07): a step calls these wrappers with the
# same buffers each time, so numba types and packs their arguments once.
_launches = LaunchCache()


def workspace(name, shape, dtype=np.float32):
    """A device buffer kept for the next calls with the same shape: allocating in the step would
    cost a cudaMalloc per call, and is not allowed at all while a step is captured into a graph."""
    key = (name, tuple(shape), np.dtype(dtype).str)
    if key not in _workspaces:
        _workspaces[key] = cuda.device_array(shape, dtype=dtype)
    return _workspaces[key]


def _elementwise_blocks(n):
    return max(1, min(cdiv(n, THREADS), sm_count() * 8))


# ---------------------------------------------------------------------------------------------
# NumPy references (float64 inside)


def conv2d_backward_reference(x, w, dy, stride=1, padding=0, dilation=1):
    """(dx, dw) of out = conv2d(x, w): the adjoint of the forward's gather, in float64."""
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation)
    dy64, w64 = dy.astype(np.float64), w.astype(np.float64)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    dpadded = np.zeros_like(padded)
    dw = np.zeros(w.shape, np.float64)
    for r in range(g.R):
        for s in range(g.S):
            rows = slice(r * g.dh, r * g.dh + g.sh * (g.P - 1) + 1, g.sh)  # the inputs tap (r, s) reads
            cols = slice(s * g.dw, s * g.dw + g.sw * (g.Q - 1) + 1, g.sw)
            dw[:, :, r, s] = np.einsum("nkpq,ncpq->kc", dy64, padded[:, :, rows, cols])
            dpadded[:, :, rows, cols] += np.einsum("nkpq,kc->ncpq", dy64, w64[:, :, r, s])
    dx = dpadded[:, :, g.ph:g.ph + g.H, g.pw:g.pw + g.W]
    return dx, dw


# ---------------------------------------------------------------------------------------------
# Data gradient. For stride 1 the gradient of a convolution is a convolution:
#
#   dx[n, c, h, w] = sum over k, r, s of dy[n, k, h + ph - r*dh, w + pw - s*dw] * w[k, c, r, s]
#                  = conv2d(dy, wt, padding = dh*(R-1) - ph, dilation = dh)[n, c, h, w]
#   with wt[c, k, r, s] = w[k, c, R-1-r, S-1-s]   (filters transposed, and turned by 180 degrees)
#
# so chapter 04's implicit GEMM computes it unchanged: M = C rows, N*H*W columns, depth K*R*S.
# This is CUTLASS's unit-stride dgrad. With a stride > 1, dy has holes (the positions the forward
# skipped) and CUTLASS's strided dgrad splits the work by the stride's phases; not done here.


@cuda.jit
def flip_filters_kernel(w, wt):
    """wt[c, k, r, s] = w[k, c, R-1-r, S-1-s]: 4*K*C*R*S bytes read and written, once per step."""
    K, C, R, S = w.shape
    for i in range(cuda.grid(1), wt.size, cuda.gridsize(1)):
        s = i % S
        r = (i // S) % R
        k = (i // (S * R)) % K
        c = i // (S * R * K)
        wt[c, k, r, s] = w[k, c, R - 1 - r, S - 1 - s]


def conv2d_dgrad(dy, w, dx, *, padding=0, dilation=1, tile=None, stream=0):
    """dx = the gradient of conv2d(x, w, stride=1, padding, dilation) for an output gradient dy.

    dy: float32 (N, K, P, Q); w: float32 (K, C, R, S); dx: float32 (N, C, H, W), overwritten."""
    dx = require(dx, "dx", dtype=np.float32, ndim=4)
    w = require(w, "w", dtype=np.float32, ndim=4)
    g = conv_geometry(dx.shape, w.shape, 1, padding, dilation)
    dy = require(dy, "dy", dtype=np.float32, shape=g.out_shape)
    back_ph, back_pw = g.dh * (g.R - 1) - g.ph, g.dw * (g.S - 1) - g.pw
    if back_ph < 0 or back_pw < 0:
        raise ValueError(f"padding {padding} is more than the filter's reach ({g.dh * (g.R - 1)}, "
                         f"{g.dw * (g.S - 1)}): outputs that see only padding; not supported")
    wt = workspace("flipped filters", (g.C, g.K, g.R, g.S))
    _launches.launch(flip_filters_kernel, _elementwise_blocks(wt.size), THREADS, (w, wt), stream=stream)
    return conv2d_implicit(dy, wt, dx, padding=(back_ph, back_pw), dilation=(g.dh, g.dw), tile=tile,
                           stream=stream)


# ---------------------------------------------------------------------------------------------
# Weight gradient: another implicit GEMM, over a different depth.
#
#   dw[k, (c, r, s)] = sum over (n, p, q) of dy[n, k, p, q] * X[(c, r, s), (n, p, q)]
#       M = K rows     N = C*R*S columns     depth = N*P*Q      (X: the forward's im2col, never built)
#
# The forward reduced over C*R*S (hundreds); this GEMM reduces over N*P*Q (16,384 in the capstone)
# into a small output (32 x 288): a few tiles with very long depths. Each block therefore takes one
# slice of the depth (blockIdx.z), and the slices' partial sums meet in dw with atomics: split-K,
# as CUTLASS's wgrad does, taken much further than chapter 04's 2-8 slices.
#
#   depth step: BK positions (n, p, q)      A tile (BK x BM): dy[n, k, p, q]   a warp reads 16 consecutive q
#                                           B tile (BK x BN): X[(c, r, s), (n, p, q)], gathered from x
# A thread owns one depth position per step (kk = t % BK): it decodes (n, p, q) once per step and
# loads its A and B values down that position's column, every load coalesced along q.

WGRAD = (SimpleNamespace(BM=32, BN=64, BK=16, TM=4, TN=4) if ON_GPU
         else SimpleNamespace(BM=8, BN=8, BK=4, TM=2, TN=2))
WGRAD_BLOCKS_PER_SM = 4  # blocks in flight per SM the depth split aims for


def _make_wgrad_kernel(t):
    BM, BN, BK, TM, TN = t.BM, t.BN, t.BK, t.TM, t.TN
    TY, TX = BM // TM, BN // TN
    NT = TY * TX
    A_LOADS, B_LOADS, ROW_STEP = BM * BK // NT, BK * BN // NT, NT // BK
    # pitch + 1: the A and B stores go down a column of the tile, one bank per thread
    A_PITCH, B_PITCH = BM + 1, BN + 1
    options = {"fastmath": True}
    if ON_GPU:
        options["launch_bounds"] = (NT, WGRAD_BLOCKS_PER_SM)

    @cuda.jit(**options)
    def wgrad_kernel(x, dy, table, H, W, CHW, PQ, Q, sh, sw, ph, pw, dw):
        """dw (K, C*R*S) (+)= dy x im2col(x)^T over this block's slice of the depth. x, dy: flat;
        table: chapter 04's offset table (x offset, r*dh, s*dw of each row (c, r, s))."""
        K, CRS = dw.shape
        depth = (dy.size // K)  # N*P*Q
        tid = cuda.threadIdx.x
        tx, ty = tid % TX, tid // TX
        kk, first_row = tid % BK, tid // BK  # this thread's depth position in a step, first tile row
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        a_s = cuda.shared.array((BK, A_PITCH), float32)
        b_s = cuda.shared.array((BK, B_PITCH), float32)
        acc = cuda.local.array((TM, TN), float32)
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = ZERO
        steps = (depth + BK - 1) // BK
        per_slice = (steps + cuda.gridDim.z - 1) // cuda.gridDim.z
        first = cuda.blockIdx.z * per_slice
        last = min(steps, first + per_slice)
        for step in range(first, last):
            npq = step * BK + kk
            inside = npq < depth
            base, h0, w0 = column_origin(npq, PQ, Q, sh, sw, ph, pw, W, CHW)  # 4 divisions per step
            n = npq // PQ
            dy_base = n * K * PQ + (npq - n * PQ)  # dy[n, 0, p, q]
            for l in range(A_LOADS):
                row = first_row + ROW_STEP * l
                k = row0 + row
                a_s[kk, row] = dy[U64(dy_base + k * PQ)] if inside and k < K else ZERO
            for l in range(B_LOADS):
                col = first_row + ROW_STEP * l
                crs = col0 + col
                value = ZERO
                if inside and crs < CRS:
                    h, w = h0 + table[1, crs], w0 + table[2, crs]
                    if h >= 0 and h < H and w >= 0 and w < W:  # the padding reads as 0
                        value = x[U64(base + table[0, crs])]
                b_s[kk, col] = value
            cuda.syncthreads()
            for k2 in range(BK):  # BK rank-1 updates of this thread's TM x TN outputs
                for i in range(TM):
                    a = a_s[k2, ty + TY * i]  # 2 words per warp: broadcasts
                    for j in range(TN):
                        acc[i, j] += a * b_s[k2, tx + TX * j]  # 16 consecutive words per warp
            cuda.syncthreads()  # before the next step's stores overwrite the tiles
        for i in range(TM):
            k = row0 + ty + TY * i
            for j in range(TN):
                crs = col0 + tx + TX * j
                if k < K and crs < CRS:
                    if cuda.gridDim.z == 1:
                        dw[k, crs] = acc[i, j]
                    else:
                        cuda.atomic.add(dw, (k, crs), acc[i, j])

    wgrad_kernel.threads = NT
    return wgrad_kernel


wgrad_kernel = _make_wgrad_kernel(WGRAD)


def wgrad_slices(g, tile=WGRAD):
    """Depth slices for the weight gradient of geometry g: enough blocks to give every SM
    WGRAD_BLOCKS_PER_SM of them, at least one depth step per slice."""
    tiles = cdiv(g.K, tile.BM) * cdiv(g.gemm_depth, tile.BN)
    steps = cdiv(g.N * g.P * g.Q, tile.BK)
    return max(1, min(steps, cdiv(sm_count() * WGRAD_BLOCKS_PER_SM, tiles)))


def conv2d_wgrad(x, dy, dw, *, stride=1, padding=0, dilation=1, slices=None, stream=0):
    """dw = the filter gradient of conv2d(x, w, stride, padding, dilation) for an output gradient dy.

    x: float32 (N, C, H, W); dy: float32 (N, K, P, Q); dw: float32 (K, C, R, S), overwritten.
    slices: how many slices of the depth N*P*Q (None: wgrad_slices); more than one adds into dw
    with atomics, after a launch that zeroes it."""
    x = require(x, "x", dtype=np.float32, ndim=4)
    dw = require(dw, "dw", dtype=np.float32, ndim=4)
    g = conv_geometry(x.shape, dw.shape, stride, padding, dilation)
    dy = require(dy, "dy", dtype=np.float32, shape=g.out_shape)
    slices = wgrad_slices(g) if slices is None else slices
    if not isinstance(slices, (int, np.integer)) or slices < 1:
        raise ValueError(f"slices must be a positive int, not {slices!r}")
    dw2 = dw.reshape(g.K, g.gemm_depth)
    if slices > 1:
        zero(dw, stream=stream)
    blocks = (cdiv(g.gemm_depth, WGRAD.BN), cdiv(g.K, WGRAD.BM), int(slices))
    _launches.launch(wgrad_kernel, blocks, wgrad_kernel.threads,
                     (x.reshape(-1), dy.reshape(-1), device_offset_table(g), g.H, g.W, g.C * g.H * g.W, g.P * g.Q, g.Q,
                      g.sh, g.sw, g.ph, g.pw, dw2), stream=stream)
    return dw


# ---------------------------------------------------------------------------------------------
# Global average pooling: (N, C, H, W) -> (N, C). A warp per (n, c) plane: its lanes read the
# plane's H*W contiguous floats 128 bytes at a time, then fold their 32 partial sums with shuffles.
# Backward: every element of a plane gets dg[n, c] / (H*W): read 4 bytes per plane, write 4 per element.


@cuda.jit
def global_avg_pool_kernel(planes, out):
    """planes: (N*C, H*W); out: (N*C,) = the mean of each row."""
    rows, size = planes.shape
    lane = cuda.threadIdx.x % 32
    warp = cuda.grid(1) // 32
    for row in range(warp, rows, cuda.gridsize(1) // 32):  # warp-uniform loop: all lanes shuffle
        total = ZERO
        for i in range(lane, size, 32):
            total += planes[row, i]
        total = warp_sum(total)
        if lane == 0:
            out[row] = total / float32(size)


@cuda.jit
def global_avg_pool_backward_kernel(d_out, d_planes):
    rows, size = d_planes.shape
    inv = float32(1.0) / float32(size)
    for i in range(cuda.grid(1), rows * size, cuda.gridsize(1)):
        row = i // size
        d_planes[row, i - row * size] = d_out[row] * inv


def _pool_args(x, out):
    x = require(x, "x", dtype=np.float32, ndim=4)
    n, c, h, w = x.shape
    out = require(out, "out", dtype=np.float32, shape=(n, c))
    return x.reshape(n * c, h * w), out.reshape(n * c)


def global_avg_pool(x, out, *, stream=0):
    """out[n, c] = mean of x[n, c, :, :]; x float32 (N, C, H, W), out float32 (N, C)."""
    planes, flat = _pool_args(x, out)
    warps_per_block = THREADS // 32
    blocks = max(1, min(cdiv(planes.shape[0], warps_per_block), sm_count() * 16))
    _launches.launch(global_avg_pool_kernel, blocks, THREADS, (planes, flat), stream=stream)
    return out


def global_avg_pool_backward(d_out, dx, *, stream=0):
    """dx[n, c, h, w] = d_out[n, c] / (H*W)."""
    planes, flat = _pool_args(dx, d_out)
    _launches.launch(global_avg_pool_backward_kernel, _elementwise_blocks(dx.size), THREADS, (flat, planes), stream=stream)
    return dx


# ---------------------------------------------------------------------------------------------
# The linear layer on chapter 04's GEMM, which multiplies row-major a (M, KD) by b (KD, NC):
#
#   forward   out (B, O) = x (B, I) @ wt (I, O) + b       the GEMM, then a bias kernel
#   backward  dwt (I, O) = x^T (I, B) @ dout (B, O)       x transposed first: a GEMM reads rows
#             dx  (B, I) = dout (B, O) @ wt^T (O, I)      wt transposed first
#             db  (O,)   = dout summed over the batch     a column sum
#
# The weight is kept as wt = W^T (in, out) so that the forward needs no transpose. The transposes
# are the classic tiled one: a 32 x 32 tile read along rows and written along columns through
# shared memory, padded to 33 words a row so that reading a column of the tile hits 32 banks.

TRANSPOSE_TILE = 32
TRANSPOSE_ROWS = 8  # a block of 32 x 8 threads moves a 32 x 32 tile, 4 elements each
TRANSPOSE_PITCH = TRANSPOSE_TILE + 1


@cuda.jit
def transpose_kernel(a, at):
    tile = cuda.shared.array((TRANSPOSE_TILE, TRANSPOSE_PITCH), float32)
    rows, cols = a.shape
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    row0, col0 = cuda.blockIdx.y * TRANSPOSE_TILE, cuda.blockIdx.x * TRANSPOSE_TILE
    for i in range(ty, TRANSPOSE_TILE, TRANSPOSE_ROWS):
        if row0 + i < rows and col0 + tx < cols:
            tile[i, tx] = a[row0 + i, col0 + tx]  # a warp reads 128 bytes of a row
    cuda.syncthreads()
    for i in range(ty, TRANSPOSE_TILE, TRANSPOSE_ROWS):
        if col0 + i < cols and row0 + tx < rows:
            at[col0 + i, row0 + tx] = tile[tx, i]  # and writes 128 bytes of a row of at


def transpose(a, at, *, stream=0):
    """at = a.T for a float32 (rows, cols) device matrix."""
    a = require(a, "a", dtype=np.float32, ndim=2)
    at = require(at, "at", dtype=np.float32, shape=a.shape[::-1])
    blocks = (cdiv(a.shape[1], TRANSPOSE_TILE), cdiv(a.shape[0], TRANSPOSE_TILE))
    _launches.launch(transpose_kernel, blocks, (TRANSPOSE_TILE, TRANSPOSE_ROWS), (a, at), stream=stream)
    return at


@cuda.jit
def add_bias_kernel(out, b):
    rows, cols = out.shape
    for i in range(cuda.grid(1), rows * cols, cuda.gridsize(1)):
        out[i // cols, i % cols] += b[i % cols]


@cuda.jit
def column_sum_kernel(a, total):
    """total[j] = sum of column j: a warp per column, its lanes down the rows."""
    rows, cols = a.shape
    lane = cuda.threadIdx.x % 32
    for col in range(cuda.grid(1) // 32, cols, cuda.gridsize(1) // 32):
        partial = ZERO
        for i in range(lane, rows, 32):
            partial += a[i, col]
        partial = warp_sum(partial)
        if lane == 0:
            total[col] = partial


def add_bias(out, b, *, stream=0):
    """out (B, O) += b (O,) on every row; float32."""
    out = require(out, "out", dtype=np.float32, ndim=2)
    b = require(b, "b", dtype=np.float32, shape=(out.shape[1],))
    _launches.launch(add_bias_kernel, _elementwise_blocks(out.size), THREADS, (out, b), stream=stream)
    return out


def column_sum(a, total, *, stream=0):
    """total (O,) = a (B, O) summed over its rows; float32."""
    a = require(a, "a", dtype=np.float32, ndim=2)
    total = require(total, "total", dtype=np.float32, shape=(a.shape[1],))
    _launches.launch(column_sum_kernel, max(1, cdiv(total.size * 32, THREADS)), THREADS, (a, total),
                     stream=stream)
    return total


def _linear_shapes(x, wt, out_name, out):
    x = require(x, "x", dtype=np.float32, ndim=2)
    wt = require(wt, "wt", dtype=np.float32, ndim=2)
    if wt.shape[0] != x.shape[1]:
        raise ValueError(f"x is {tuple(x.shape)} but wt is {tuple(wt.shape)}: wt must be (in, out) = "
                         f"({x.shape[1]}, out)")
    return x, wt, require(out, out_name, dtype=np.float32, shape=(x.shape[0], wt.shape[1]))


def linear_forward(x, wt, b, out, *, tile=None, stream=0):
    """out = x @ wt + b; x (B, I), wt (I, O), b (O,), out (B, O), all float32."""
    x, wt, out = _linear_shapes(x, wt, "out", out)
    require(b, "b", dtype=np.float32, shape=(wt.shape[1],))
    gemm(x, wt, out, tile=tile, stream=stream)
    return add_bias(out, b, stream=stream)


def linear_backward(x, wt, d_out, dx, dwt, db, *, tile=None, stream=0):
    """Gradients of linear_forward: dx (B, I), dwt (I, O), db (O,), from d_out (B, O)."""
    x, wt, d_out = _linear_shapes(x, wt, "d_out", d_out)
    dx = require(dx, "dx", dtype=np.float32, shape=x.shape)
    dwt = require(dwt, "dwt", dtype=np.float32, shape=wt.shape)
    db = require(db, "db", dtype=np.float32, shape=(wt.shape[1],))
    xt = transpose(x, workspace("x^T", x.shape[::-1]), stream=stream)
    gemm(xt, d_out, dwt, tile=tile, stream=stream)
    w = transpose(wt, workspace("w", wt.shape[::-1]), stream=stream)
    gemm(d_out, w, dx, tile=tile, stream=stream)
    column_sum(d_out, db, stream=stream)
    return dx, dwt, db


# ---------------------------------------------------------------------------------------------
# BatchNorm for evaluation: the running statistics instead of the batch's, so each element is
# y = relu(x * scale[c] + shift[c] (+ identity)): one read (two) and one write of 4 bytes.


@cuda.jit
def batchnorm_eval_relu_kernel(x, identity, has_identity, gamma, beta, running_mean, running_var, eps, y):
    n, c, hw = x.shape
    for i in range(cuda.grid(1), x.size, cuda.gridsize(1)):
        plane = i // hw
        ch = plane % c
        j = i - plane * hw
        scale = gamma[ch] / math.sqrt(running_var[ch] + eps)
        z = (x[plane // c, ch, j] - running_mean[ch]) * scale + beta[ch]
        if has_identity:
            z += identity[plane // c, ch, j]
        y[plane // c, ch, j] = max(z, ZERO)


def batchnorm_eval_relu(x, gamma, beta, running_mean, running_var, y, *, identity=None, eps=1e-5, stream=0):
    """y = relu(batchnorm(x) [+ identity]) with the running statistics (evaluation mode)."""
    x = require(x, "x", dtype=np.float32, ndim=4)
    n, c, h, w = x.shape
    for name, array in (("gamma", gamma), ("beta", beta), ("running_mean", running_mean),
                        ("running_var", running_var)):
        require(array, name, dtype=np.float32, shape=(c,))
    y = require(y, "y", dtype=np.float32, shape=x.shape)
    if identity is not None:
        require(identity, "identity", dtype=np.float32, shape=x.shape)
    x3 = x.reshape(n, c, h * w)
    _launches.launch(batchnorm_eval_relu_kernel, _elementwise_blocks(x.size), THREADS,
                     (x3, x3 if identity is None else identity.reshape(n, c, h * w), identity is not None, gamma, beta,
                      running_mean, running_var, np.float32(eps), y.reshape(n, c, h * w)), stream=stream)
    return y


# ---------------------------------------------------------------------------------------------
# SGD with momentum, as torch.optim.SGD computes it:
#
#   g = grad + weight_decay * w;   v = momentum * v + g;   w = w - lr * v
#
# over every parameter of the network in one launch: the parameters live in one flat buffer (each
# layer's weights a view of it), and so do their gradients and velocities. Read 12 bytes and write
# 8 per parameter; the per-tensor launches of chapter 03's naive step never happen.


@cuda.jit
def sgd_momentum_kernel(params, grads, velocity, lr, momentum, weight_decay, skip_if):
    if skip_if[0] != 0:  # mixed precision: this step's gradients were not finite (mixed.py)
        return
    for i in range(cuda.grid(1), params.size, cuda.gridsize(1)):
        w = params[i]
        v = momentum * velocity[i] + (grads[i] + weight_decay * w)
        velocity[i] = v
        params[i] = w - lr * v


@lru_cache(maxsize=None)
def _never():
    return cuda.to_device(np.zeros(1, np.float32))


def sgd_momentum(params, grads, velocity, *, lr, momentum=0.9, weight_decay=0.0, skip_if=None, stream=0):
    """One SGD-with-momentum step over flat float32 buffers of the same size (in place). skip_if: a
    float32 (1,) device flag (chapter 03's found_inf): if it is not 0 the kernel changes nothing."""
    params = require(params, "params", dtype=np.float32, ndim=1)
    grads = require(grads, "grads", dtype=np.float32, shape=params.shape)
    velocity = require(velocity, "velocity", dtype=np.float32, shape=params.shape)
    for name, value in (("lr", lr), ("momentum", momentum), ("weight_decay", weight_decay)):
        if not (isinstance(value, (int, float, np.floating)) and 0 <= value < math.inf):
            raise ValueError(f"{name} must be a finite number >= 0, not {value!r}")
    skip_if = _never() if skip_if is None else require(skip_if, "skip_if", dtype=np.float32, shape=(1,))
    _launches.launch(sgd_momentum_kernel, _elementwise_blocks(params.size), THREADS,
                     (params, grads, velocity, np.float32(lr), np.float32(momentum), np.float32(weight_decay),
                      skip_if), stream=stream)
    return params


# ---------------------------------------------------------------------------------------------
# The glue of a training step


@cuda.jit
def add_into_kernel(a, b):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] += b[i]


def zero(a, *, stream=0):
    """a = 0, a float32 device array (before blocks add into it)."""
    a = require(a, "a", dtype=np.float32)
    _launches.launch(zero_kernel, _elementwise_blocks(a.size), THREADS, (a.reshape(-1),), stream=stream)
    return a


def add_into(a, b, *, stream=0):
    """a += b for float32 device arrays of one shape (a residual's two gradients meet)."""
    a = require(a, "a", dtype=np.float32)
    b = require(b, "b", dtype=np.float32, shape=a.shape)
    _launches.launch(add_into_kernel, _elementwise_blocks(a.size), THREADS, (a.reshape(-1), b.reshape(-1)), stream=stream)
    return a


@cuda.jit
def gather_batch_kernel(images, labels, order, counter, steps_per_epoch, x, targets):
    """Batch number counter[0] of the epoch's order: x[i] = images[order[step * B + i]]. The step
    is read from device memory, so a graph that replays this launch takes the next batch each time."""
    batch, size = x.shape
    step = np.int64(counter[0] % steps_per_epoch)  # both uint64: numba would mix a signed one into a float
    for i in range(cuda.grid(1), batch * size, cuda.gridsize(1)):
        row = i // size
        source = order[step * batch + row]
        x[row, i - row * size] = images[source, i - row * size]
        if i - row * size == 0:
            targets[row] = labels[source]


def gather_batch(images, labels, order, counter, steps_per_epoch, x, targets, *, stream=0):
    """x, targets = batch counter[0] % steps_per_epoch of `order` (see gather_batch_kernel)."""
    _launches.launch(gather_batch_kernel, _elementwise_blocks(x.size), THREADS,
                     (images, labels, order, counter, np.uint64(steps_per_epoch), x, targets), stream=stream)


@cuda.jit(device=True)
def record_and_advance(counter, loss, history):
    """Keep the step's loss (history[step % len]) and advance the step counter, which the next
    step's batch and dropout read. Returns the step that ended."""
    step = counter[0]
    history[step % np.uint64(history.size)] = loss[0]
    counter[0] = step + np.uint64(1)
    return step


@cuda.jit
def end_step_kernel(counter, loss, history):
    """The last launch of a step (one thread)."""
    if cuda.grid(1) == 0:
        record_and_advance(counter, loss, history)


def end_step(counter, loss, history, *, stream=0):
    _launches.launch(end_step_kernel, 1, 32, (counter, loss, history), stream=stream)
