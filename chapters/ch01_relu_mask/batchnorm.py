"""Chapter 01, part 2: BatchNorm (training) + optional residual add + ReLU, fused, keeping a 1-bit
mask for the backward pass, on NCHW float32 tensors.

    forward:   stats kernel       per (n, c) plane: sum x and sum x^2 (float64)      reads 4 bytes/elt
               forward kernel     per (n, c) plane: z = x * scale + shift (+ identity),
                                  y = relu(z), mask bit = z > 0 (warp ballot)          reads 4 (+4), writes 4 + 1/8
    backward:  reduce kernel      per (n, c) plane: g = dy where the bit is set, else 0;
                                  sum g and sum g * x; writes d_identity = g          reads 4 + 4 + 1/8 (writes 4)
               dx kernel          per (n, c) plane: dx = a * g + b * x + k            reads 4 + 4 + 1/8, writes 4

Each (n, c) plane of H*W elements is contiguous in NCHW, and the channel of a plane is the block's
blockIdx.x, so no kernel divides an index to find its channel. Block (c, g) takes the planes
n = g, g + G, g + 2G, ... of channel c, where G (the grid's y) is chosen so that the grid is one full
wave of resident blocks (`plane_groups`): a block's fixed costs (folding its channel's sums before it
starts, its block-wide reduction at the end) are paid once for several planes, and the SM streams
from one plane into the next without a gap. The per-block partial sums (G of them per channel) are
folded by the next kernel: its first warp sums the G partials of its channel, so the "finalize"
step costs no launch of its own.

Mask layout: uint32[N, C, ceil(H*W / 32)], bit j % 32 of word j // 32 of plane (n, c) is z[n, c, j] > 0;
each plane's last word is padded with 0 bits (so that no two blocks ever write the same word).

Running statistics are updated like PyTorch's: running = (1 - momentum) * running + momentum * batch,
with the unbiased variance (count / (count - 1)) for running_var.
"""

import math

import numpy as np
from numba import cuda, float32, float64

from workbook import ON_GPU
from workbook.check import pack_bitmask
from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache

from .kernels import FULL_MASK, ZERO, relu

# 8 warps per (n, c) plane on a GPU; 2 in the simulator, which runs every CUDA thread in Python
THREADS_PER_BLOCK = 256 if ON_GPU else 64
WARPS_PER_BLOCK = THREADS_PER_BLOCK // 32
UNROLL = 4  # elements per thread per trip in the elementwise loops: 4 loads of each input in flight
WORDS_PER_TRIP = 4  # mask words (rows of 32) per warp per trip in the forward kernel
# 8 blocks of 256 threads per SM: the compiler keeps each kernel within 32 registers (see kernels.py).
BLOCKS_PER_SM = 8
FILL_THE_SM = {"launch_bounds": (THREADS_PER_BLOCK, BLOCKS_PER_SM)} if ON_GPU else {}


# ---------------------------------------------------------------------------------------------
# NumPy references (float64 inside)


def batchnorm_forward_reference(x, gamma, beta, running_mean, running_var, *, identity=None,
                                momentum=0.1, eps=1e-5):
    """Training-mode BatchNorm (+ identity) + ReLU on NCHW.

    Returns (y, mask, saved, new_running_mean, new_running_var): saved = float64[2, C] (batch mean,
    1 / sqrt(var + eps)); mask = uint32[N, C, words] as described in the module docstring.
    """
    n, c, h, w = x.shape
    count = n * h * w
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=(0, 2, 3))
    var = x64.var(axis=(0, 2, 3))
    invstd = 1.0 / np.sqrt(var + eps)
    z = (x64 - mean[:, None, None]) * (invstd * gamma)[:, None, None] + beta[:, None, None]
    if identity is not None:
        z = z + identity
    y = np.where(z > 0, z, 0.0).astype(np.float32)
    mask = pack_planes(z > 0)
    new_mean = ((1 - momentum) * running_mean + momentum * mean).astype(np.float32)
    new_var = ((1 - momentum) * running_var + momentum * var * count / (count - 1)).astype(np.float32)
    return y, mask, np.stack([mean, invstd]), new_mean, new_var


def batchnorm_backward_reference(dy, positive, x, gamma, saved, *, with_identity=False):
    """Gradients of BatchNorm (+ identity) + ReLU: (dx, d_identity or None, dgamma, dbeta).

    positive: bool[N, C, H, W], where the forward pass's z was > 0."""
    n, c, h, w = x.shape
    count = n * h * w
    mean, invstd = saved[0][:, None, None], saved[1][:, None, None]
    g = np.where(positive, dy, 0.0).astype(np.float64)  # the ReLU gradient: a select, not a multiply
    xhat = (x.astype(np.float64) - mean) * invstd
    dbeta = g.sum(axis=(0, 2, 3))
    dgamma = (g * xhat).sum(axis=(0, 2, 3))
    dx = (gamma[:, None, None] * invstd) * (g - dbeta[:, None, None] / count - xhat * dgamma[:, None, None] / count)
    d_identity = g.astype(np.float32) if with_identity else None
    return dx.astype(np.float32), d_identity, dgamma.astype(np.float32), dbeta.astype(np.float32)


def pack_planes(bits):
    """bool[N, C, H, W] -> uint32[N, C, ceil(H*W / 32)]: each (n, c) plane packed on its own."""
    n, c = bits.shape[:2]
    planes = bits.reshape(n * c, -1)
    return np.stack([pack_bitmask(plane) for plane in planes]).reshape(n, c, -1)


def plane_words(h, w):
    return -(-(h * w) // 32)


# ---------------------------------------------------------------------------------------------
# Block-level helpers


@cuda.jit(device=True, forceinline=True)
def _warp_sum2(a, b):
    # Butterfly: after 5 steps every lane holds the warp's totals.
    offset = 16
    while offset > 0:
        a += cuda.shfl_xor_sync(FULL_MASK, a, offset)
        b += cuda.shfl_xor_sync(FULL_MASK, b, offset)
        offset >>= 1
    return a, b


@cuda.jit(device=True, forceinline=True)
def _block_sum2(a, b):
    """(sum of a, sum of b) over the block, valid in warp 0; float64 so 10^5 terms lose nothing."""
    totals = cuda.shared.array((2, WARPS_PER_BLOCK), float64)
    lane, warp = cuda.laneid, cuda.threadIdx.x >> 5
    a, b = _warp_sum2(a, b)
    if lane == 0:
        totals[0, warp] = a
        totals[1, warp] = b
    cuda.syncthreads()
    a = totals[0, lane] if lane < WARPS_PER_BLOCK else 0.0
    b = totals[1, lane] if lane < WARPS_PER_BLOCK else 0.0
    return _warp_sum2(a, b)


@cuda.jit(device=True, forceinline=True)
def _channel_sums(partial, c):
    """Warp 0 only: the sums of a channel's G per-block partials (partial: float64[2, G, C])."""
    a = 0.0
    b = 0.0
    k = cuda.laneid
    while k < partial.shape[1]:
        a += partial[0, k, c]
        b += partial[1, k, c]
        k += 32
    return _warp_sum2(a, b)


# ---------------------------------------------------------------------------------------------
# Forward


@cuda.jit(**FILL_THE_SM)
def bn_stats_kernel(x, partial):
    """Block (c, g): partial[0, g, c] = sum of its planes x[n, c] (n = g, g + G, ...),
    partial[1, g, c] = their sum of squares."""
    c, g = cuda.blockIdx.x, cuda.blockIdx.y
    threads = cuda.blockDim.x
    s = 0.0
    ss = 0.0
    for n in range(g, x.shape[0], cuda.gridDim.y):
        plane = x[n, c]  # H*W contiguous floats (x is viewed as N, C, H*W)
        size = plane.size
        j = cuda.threadIdx.x
        while j < size:
            values = cuda.local.array(UNROLL, float32)
            for u in range(UNROLL):  # UNROLL independent loads before the first add
                i = j + u * threads
                values[u] = plane[i] if i < size else ZERO
            for u in range(UNROLL):
                v = float64(values[u])
                s += v
                ss += v * v
            j += UNROLL * threads
    s, ss = _block_sum2(s, ss)
    if cuda.threadIdx.x == 0:
        partial[0, g, c] = s
        partial[1, g, c] = ss


@cuda.jit(device=True, forceinline=True)
def _forward_trip(plane, extra, has_extra, out, bits_out, scale, shift, group, lane):
    """One warp trip over WORDS_PER_TRIP rows of 32 elements of a plane (group is warp-uniform)."""
    size = plane.size
    first = group * (32 * WORDS_PER_TRIP) + lane
    z = cuda.local.array(WORDS_PER_TRIP, float32)
    for r in range(WORDS_PER_TRIP):
        i = first + 32 * r
        z[r] = plane[i] if i < size else ZERO
    others = cuda.local.array(WORDS_PER_TRIP, float32)
    for r in range(WORDS_PER_TRIP):
        i = first + 32 * r
        others[r] = extra[i] if has_extra and i < size else ZERO
    row = lane & (WORDS_PER_TRIP - 1)  # lanes r, r+4, r+8, ... store row r's word (same value)
    mine = 0
    for r in range(WORDS_PER_TRIP):
        i = first + 32 * r
        v = z[r] * scale + shift
        if has_extra:
            v += others[r]
        if i < size:
            out[i] = relu(v)
        bits = cuda.ballot_sync(FULL_MASK, i < size and v > ZERO)  # the whole warp votes
        if row == r:
            mine = bits
    word = group * WORDS_PER_TRIP + row
    if word < bits_out.size:  # no lane-only condition: it would split the loop (see kernels.py)
        bits_out[word] = mine  # 16 consecutive bytes, each word stored by 8 lanes


@cuda.jit(**FILL_THE_SM)
def bn_forward_kernel(x, identity, has_identity, gamma, beta, partial, saved, running_mean, running_var,
                      momentum, eps, y, mask):
    """Block (c, g): normalise its planes (n, c), n = g, g + G, ..., add identity (if has_identity),
    ReLU, ballot the mask.

    Without an identity the caller passes x again as `identity` (never read): numba cannot drop an
    argument that is None from an inlined device function, and a uniform branch costs nothing."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    lane, warp = cuda.laneid, cuda.threadIdx.x >> 5
    count = x.shape[0] * x.shape[2]  # elements per channel
    coefficients = cuda.shared.array(2, float32)
    if warp == 0:  # fold the channel's N partial sums: mean, variance, then scale and shift
        s, ss = _channel_sums(partial, c)
        if lane == 0:
            mean = s / count
            var = max(ss / count - mean * mean, 0.0)
            invstd = 1.0 / math.sqrt(var + eps)
            scale = gamma[c] * invstd
            coefficients[0] = scale
            coefficients[1] = beta[c] - mean * scale
            if first_plane == 0:  # one block per channel saves the statistics and updates the running ones
                saved[0, c] = mean
                saved[1, c] = invstd
                running_mean[c] = (1.0 - momentum) * running_mean[c] + momentum * mean
                running_var[c] = (1.0 - momentum) * running_var[c] + momentum * var * count / (count - 1)
    cuda.syncthreads()
    scale, shift = coefficients[0], coefficients[1]
    for n in range(first_plane, x.shape[0], cuda.gridDim.y):
        plane, out, bits_out = x[n, c], y[n, c], mask[n, c]
        extra = identity[n, c]
        group = warp  # warp-uniform loop: all 32 lanes reach every ballot
        while group * WORDS_PER_TRIP < bits_out.size:
            _forward_trip(plane, extra, has_identity, out, bits_out, scale, shift, group, lane)
            group += WARPS_PER_BLOCK


# ---------------------------------------------------------------------------------------------
# Backward


@cuda.jit(**FILL_THE_SM)
def bn_backward_reduce_kernel(dy, mask, x, d_identity, has_identity, partial):
    """Block (c, b) over its planes n = b, b + G, ...: g = dy where the bit is set;
    partial[:, b, c] = (sum g, sum g * x); d_identity = g."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    threads = cuda.blockDim.x
    sg = 0.0
    sgx = 0.0
    for n in range(first_plane, x.shape[0], cuda.gridDim.y):
        grad, bits_in, plane = dy[n, c], mask[n, c], x[n, c]
        size = plane.size
        j = cuda.threadIdx.x  # a warp's 32 lanes hold 32 consecutive j, all in one mask word
        while j < size:
            gs = cuda.local.array(UNROLL, float32)
            xs = cuda.local.array(UNROLL, float32)
            for u in range(UNROLL):
                i = j + u * threads
                g = ZERO
                xs[u] = ZERO
                if i < size:
                    word = bits_in[i >> 5]  # the same word for the whole warp: a broadcast
                    g = grad[i] if (word >> (i & 31)) & 1 else ZERO  # a select: masked inf gives 0
                    xs[u] = plane[i]
                gs[u] = g
            for u in range(UNROLL):
                i = j + u * threads
                if has_identity and i < size:
                    d_identity[n, c, i] = gs[u]  # the add's gradient is the ReLU's: stored once, here
                sg += float64(gs[u])
                sgx += float64(gs[u]) * float64(xs[u])
            j += UNROLL * threads
    sg, sgx = _block_sum2(sg, sgx)
    if cuda.threadIdx.x == 0:
        partial[0, first_plane, c] = sg
        partial[1, first_plane, c] = sgx


@cuda.jit(**FILL_THE_SM)
def bn_backward_dx_kernel(dy, mask, x, gamma, saved, partial, dx, dgamma, dbeta):
    """Block (c, g) over its planes n = g, g + G, ...: dx = a * g + b * x + k, with a, b, k from the
    channel's sums (folded by warp 0)."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    lane, warp = cuda.laneid, cuda.threadIdx.x >> 5
    count = x.shape[0] * x.shape[2]
    coefficients = cuda.shared.array(3, float32)
    if warp == 0:
        sg, sgx = _channel_sums(partial, c)
        if lane == 0:
            mean, invstd = saved[0, c], saved[1, c]
            dgamma_c = invstd * (sgx - mean * sg)  # sum g * xhat, with xhat = (x - mean) * invstd
            a = gamma[c] * invstd
            b = -a * invstd * dgamma_c / count
            coefficients[0] = a
            coefficients[1] = b
            coefficients[2] = -a * sg / count - b * mean
            if first_plane == 0:
                dgamma[c] = dgamma_c
                dbeta[c] = sg
    cuda.syncthreads()
    a, b, k = coefficients[0], coefficients[1], coefficients[2]
    threads = cuda.blockDim.x
    for n in range(first_plane, x.shape[0], cuda.gridDim.y):
        grad, bits_in, plane, out = dy[n, c], mask[n, c], x[n, c], dx[n, c]
        size = plane.size
        j = cuda.threadIdx.x
        while j < size:
            gs = cuda.local.array(UNROLL, float32)
            xs = cuda.local.array(UNROLL, float32)
            for u in range(UNROLL):
                i = j + u * threads
                g = ZERO
                xs[u] = ZERO
                if i < size:
                    word = bits_in[i >> 5]
                    g = grad[i] if (word >> (i & 31)) & 1 else ZERO
                    xs[u] = plane[i]
                gs[u] = g
            for u in range(UNROLL):
                i = j + u * threads
                if i < size:
                    out[i] = a * gs[u] + b * xs[u] + k
            j += UNROLL * threads


# ---------------------------------------------------------------------------------------------
# Host wrappers


_workspaces = {}
# The four kernels' launches, prepared once per set of buffers (chapter 07): a training loop calls
# these wrappers with the same tensors at every step.
_launches = LaunchCache()


def plane_groups(n, c):
    """G, the blocks per channel: as many as make the grid (C, G) one full wave of resident blocks
    (BLOCKS_PER_SM on each SM), at least 1 and at most N. One wave, not more: a second, partial wave
    would leave most SMs idle at the end, and a block that ends early has nothing to take over."""
    resident = sm_count() * BLOCKS_PER_SM
    return max(1, min(n, resident // c))


def _partial_sums(groups, c):
    """float64[2, G, C] for per-block partial sums, allocated once per shape (numba has no caching
    allocator: a cudaMalloc per call would cost more than the small kernels)."""
    key = (groups, c)
    if key not in _workspaces:
        _workspaces[key] = cuda.device_array((2, groups, c), dtype=np.float64)
    return _workspaces[key]


def _grid(n, c, groups):
    if groups is None:
        return plane_groups(n, c)
    if not 1 <= groups <= n:
        raise ValueError(f"groups must be between 1 and N={n}, got {groups}")
    return groups


def _planes(array):
    """An NCHW device array viewed as (N, C, H*W): the same memory."""
    n, c, h, w = array.shape
    return array.reshape(n, c, h * w)


def batchnorm_relu_forward(x, gamma, beta, running_mean, running_var, y, mask, saved, *, identity=None,
                           momentum=0.1, eps=1e-5, stream=0, groups=None):
    """y = relu(batchnorm(x) [+ identity]) in training mode, and its 1-bit mask. Returns (y, mask).

    x, y, identity: float32[N, C, H, W]; gamma, beta, running_mean, running_var: float32[C] (the
    running statistics are updated in place); mask: uint32[N, C, ceil(H*W / 32)];
    saved: float64[2, C] receives the batch mean and 1/std for the backward pass. stream: where
    the two kernels go (0: the default stream; chapter 07 captures them on another into a graph).
    groups: blocks per channel (default `plane_groups`: one full wave); the backward pass may use
    another.
    """
    x = require(x, "x", dtype=np.float32, ndim=4)
    n, c, h, w = x.shape
    if n * h * w < 2:
        raise ValueError(f"BatchNorm in training needs more than 1 value per channel, got x of shape {x.shape}")
    for name, array in (("gamma", gamma), ("beta", beta), ("running_mean", running_mean),
                        ("running_var", running_var)):
        require(array, name, dtype=np.float32, shape=(c,))
    y = require(y, "y", dtype=np.float32, shape=x.shape)
    mask = require(mask, "mask", dtype=np.uint32, shape=(n, c, plane_words(h, w)))
    saved = require(saved, "saved", dtype=np.float64, shape=(2, c))
    if identity is not None:
        require(identity, "identity", dtype=np.float32, shape=x.shape)
    if not 0.0 <= momentum <= 1.0 or eps <= 0:
        raise ValueError(f"need 0 <= momentum <= 1 and eps > 0, got momentum={momentum}, eps={eps}")
    groups = _grid(n, c, groups)
    partial = _partial_sums(groups, c)
    x3 = _planes(x)
    blocks = (c, groups)  # block (c, g) takes planes g, g + G, ... of channel c
    _launches.launch(bn_stats_kernel, blocks, THREADS_PER_BLOCK, (x3, partial), stream=stream)
    has_identity = identity is not None
    _launches.launch(bn_forward_kernel, blocks, THREADS_PER_BLOCK,
                     (x3, _planes(identity) if has_identity else x3, has_identity, gamma, beta, partial, saved,
                      running_mean, running_var, np.float32(momentum), np.float32(eps), _planes(y), mask),
                     stream=stream)
    return y, mask


def batchnorm_relu_backward(dy, mask, x, gamma, saved, dx, dgamma, dbeta, *, d_identity=None, stream=0,
                            groups=None):
    """Gradients of batchnorm_relu_forward: dx, dgamma, dbeta and (with an identity) d_identity,
    from dy, the 1-bit mask, x and the saved statistics. Returns (dx, d_identity, dgamma, dbeta)."""
    x = require(x, "x", dtype=np.float32, ndim=4)
    n, c, h, w = x.shape
    dy = require(dy, "dy", dtype=np.float32, shape=x.shape)
    mask = require(mask, "mask", dtype=np.uint32, shape=(n, c, plane_words(h, w)))
    require(gamma, "gamma", dtype=np.float32, shape=(c,))
    saved = require(saved, "saved", dtype=np.float64, shape=(2, c))
    dx = require(dx, "dx", dtype=np.float32, shape=x.shape)
    require(dgamma, "dgamma", dtype=np.float32, shape=(c,))
    require(dbeta, "dbeta", dtype=np.float32, shape=(c,))
    if d_identity is not None:
        d_identity = require(d_identity, "d_identity", dtype=np.float32, shape=x.shape)
    groups = _grid(n, c, groups)
    partial = _partial_sums(groups, c)
    x3, dy3 = _planes(x), _planes(dy)
    blocks = (c, groups)
    has_identity = d_identity is not None
    # Without an identity, dy is passed as d_identity and never written (see bn_forward_kernel).
    _launches.launch(bn_backward_reduce_kernel, blocks, THREADS_PER_BLOCK,
                     (dy3, mask, x3, _planes(d_identity) if has_identity else dy3, has_identity, partial), stream=stream)
    _launches.launch(bn_backward_dx_kernel, blocks, THREADS_PER_BLOCK,
                     (dy3, mask, x3, gamma, saved, partial, _planes(dx), dgamma, dbeta), stream=stream)
    return dx, d_identity, dgamma, dbeta


# ---------------------------------------------------------------------------------------------
# Inputs for checks and benchmarks


def batchnorm_inputs(rng, shape, *, with_identity=True, margin=1e-3):
    """Host float32 arrays (x, identity or None, gamma, beta, running_mean, running_var) for an NCHW
    shape, with every pre-ReLU value z at least `margin` away from 0.

    Why: float32 kernels (and torch) round z differently from a float64 reference; an element with
    |z| ~ 1e-7 could get bit 1 in one and 0 in the other, and its gradient would differ by all of dy.
    Such elements are nudged (identity += 3 margin, or x by the same amount of z) before use.
    """
    n, c = shape[:2]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np.float32)
    identity = rng.standard_normal(shape, dtype=np.float32) if with_identity else None
    gamma = rng.uniform(0.5, 1.5, c).astype(np.float32)
    beta = (0.5 * rng.standard_normal(c)).astype(np.float32)
    for _ in range(5):
        x64 = x.astype(np.float64)
        mean = x64.mean(axis=(0, 2, 3))
        scale = gamma / np.sqrt(x64.var(axis=(0, 2, 3)) + 1e-5)
        z = (x64 - mean[:, None, None]) * scale[:, None, None] + beta[:, None, None]
        if identity is not None:
            z += identity
        near = np.abs(z) < margin
        if not near.any():
            break
        if identity is not None:
            identity[near] += np.float32(3 * margin)
        else:
            x[near] += (3 * margin / np.broadcast_to(scale[:, None, None], shape)[near]).astype(np.float32)
    return x, identity, gamma, beta, np.zeros(c, np.float32), np.ones(c, np.float32)
