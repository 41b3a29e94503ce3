"""Chapter 01, part 2: BatchNorm (training) + optional residual add + ReLU, fused, keeping a 1-bit
mask for the backward pass, on NCHW float32 tensors.

    forward:   stats kernel       per (n, c) plane: sum x and sum x^2 (float64)      reads 4 bytes/elt
               forward kernel     per (n, c) plane: z = x * scale + shift (+ identity),
                                  y = relu(z), mask bit = z > 0 (warp ballot)          reads 4 (+4), writes 4 + 1/8
    backward:  reduce kernel      per (n, c) plane: g = dy where the bit is set, else 0;
                                  sum g and sum g * x; writes d_identity = g          reads 4 + 4 + 1/8 (writes 4)
               dx kernel          per (n, c) plane: dx = a * g + b * x + k            reads 4 + 4 + 1/8, writes 4

Each kernel comes twice: on 4-byte elements, for any H*W, and on 16-byte quads (workbook.memory),
which the wrappers take wherever H*W % 4 == 0 and the buffers are 16-byte aligned. At 4 bytes an
access the kernels issue more instructions per byte than the SMs can while the memory waits; the
quads move four elements an instruction.

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
import os

import numpy as np
from numba import cuda, float32, float64, int32, int64

from workbook import ON_GPU
from workbook.check import pack_bitmask
from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, cdiv
from workbook.memory import aligned, load4, store4

from .kernels import FULL_MASK, ZERO, _spread8, relu

# 8 warps per (n, c) plane on a GPU; 2 in the simulator, which runs every CUDA thread in Python
THREADS_PER_BLOCK = 256 if ON_GPU else 64
WARPS_PER_BLOCK = THREADS_PER_BLOCK // 32
UNROLL = 4  # elements per thread per trip in the elementwise loops: 4 loads of each input in flight
WORDS_PER_TRIP = 4  # mask words (rows of 32) per warp per trip in the forward kernel
# Blocks of 256 threads an SM: the compiler keeps each kernel within 65536 / (256 x BLOCKS_PER_SM)
# registers a thread (64 at 4: none of the kernels spills; at 8, 32 registers, the quad kernels
# spill). 1024 threads an SM, each with 32 bytes of each input in flight, keep
# far more in flight than the memory needs (chapter 00's Little's law). WORKBOOK_BN_BLOCKS_PER_SM
# tries another (chapters/ch01_relu_mask/probes/bn_probe.py; what was measured is in EXPERIMENTS.md).
BLOCKS_PER_SM = int(os.environ.get("WORKBOOK_BN_BLOCKS_PER_SM", "4"))
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
    return cdiv(h * w, 32)


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


@cuda.jit(device=True, forceinline=True)
def _store_partial(partial, first_plane, c, a, b):
    """The block's two sums, (a, b) summed over its threads, into partial[:, first_plane, c]."""
    a, b = _block_sum2(a, b)
    if cuda.threadIdx.x == 0:
        partial[0, first_plane, c] = a
        partial[1, first_plane, c] = b


# ---------------------------------------------------------------------------------------------
# Walking a block's planes as one sequence
#
# Block (c, g) takes planes n = g, g + G, g + 2G, ... of channel c: P of them. Its threads walk
# them as if they were one array of P * H*W elements, `step` elements at a time, carrying (k, i),
# plane k of the block at offset i, from one step to the next: a plane's last partial trip is
# filled with the start of the next plane, so a block ends with at most one partial trip, not one a
# plane (at 56x56, 3136 elements a plane and 1024 a trip, that is 25 trips for 8 planes, not 32).


@cuda.jit(device=True, forceinline=True)
def _advance(k, i, step, size):
    """(plane k, offset i) moved on by `step` elements through planes of `size` elements each."""
    i += step
    while i >= size:
        i -= size
        k += 1
    return k, i


@cuda.jit(device=True, forceinline=True)
def _planes_of_block(n_planes, first_plane):
    """P: how many of the N planes block (c, first_plane) takes (every G-th from first_plane)."""
    return (n_planes - first_plane + cuda.gridDim.y - 1) // cuda.gridDim.y


# ---------------------------------------------------------------------------------------------
# Forward


@cuda.jit(**FILL_THE_SM)
def bn_stats_kernel(x, partial):
    """Block (c, g): partial[0, g, c] = sum of its planes x[n, c] (n = g, g + G, ...),
    partial[1, g, c] = their sum of squares."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    planes, size, threads = _planes_of_block(x.shape[0], first_plane), x.shape[2], cuda.blockDim.x
    s = 0.0
    ss = 0.0
    k, i = _advance(0, 0, cuda.threadIdx.x, size)  # this thread's first element of the block's sequence
    while k < planes:
        values = cuda.local.array(UNROLL, float32)
        for u in range(UNROLL):  # UNROLL independent loads before the first add
            values[u] = x[first_plane + k * cuda.gridDim.y, c, i] if k < planes else ZERO
            k, i = _advance(k, i, threads, size)
        for u in range(UNROLL):
            v = float64(values[u])
            s += v
            ss += v * v
    _store_partial(partial, first_plane, c, s, ss)


@cuda.jit(device=True, forceinline=True)
def _forward_coefficients(partial, gamma, beta, saved, running_mean, running_var, momentum, eps, c, first_plane,
                          count):
    """(scale, shift) of channel c, for every thread of the block: warp 0 folds the channel's G
    partial sums into mean and variance; block (c, 0) also saves the statistics and updates the
    running ones. count: elements per channel."""
    coefficients = cuda.shared.array(2, float32)
    if cuda.threadIdx.x < 32:
        s, ss = _channel_sums(partial, c)
        if cuda.threadIdx.x == 0:
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
    return coefficients[0], coefficients[1]


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
    ReLU, ballot the mask. A warp's unit is a trip of WORDS_PER_TRIP mask words; the block's warps
    walk the trips of all its planes as one sequence (the trips of a plane, then the next plane's).

    Without an identity the caller passes x again as `identity` (never read): numba cannot drop an
    argument that is None from an inlined device function, and a uniform branch costs nothing."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    lane, warp = cuda.laneid, cuda.threadIdx.x >> 5
    scale, shift = _forward_coefficients(partial, gamma, beta, saved, running_mean, running_var, momentum, eps,
                                         c, first_plane, x.shape[0] * x.shape[2])
    planes = _planes_of_block(x.shape[0], first_plane)
    trips = (mask.shape[2] + WORDS_PER_TRIP - 1) // WORDS_PER_TRIP  # a plane's trips
    k, group = _advance(0, 0, warp, trips)  # warp-uniform: all 32 lanes reach every ballot
    while k < planes:
        n = first_plane + k * cuda.gridDim.y
        _forward_trip(x[n, c], identity[n, c], has_identity, y[n, c], mask[n, c], scale, shift, group, lane)
        k, group = _advance(k, group, WARPS_PER_BLOCK, trips)


# ---------------------------------------------------------------------------------------------
# Backward
#
# Both kernels read dy, the mask word and x of every element. dy is loaded whatever its bit says
# and the bit applied after, with a select: a load that waited for the mask word would put a whole
# memory latency between the two loads of every element (their sectors are read anyway: half the
# bits of a word are set).


@cuda.jit(device=True, forceinline=True)
def _masked_gradient(dy, mask, n, c, i):
    """g = dy[n, c, i] where bit i of plane (n, c)'s mask is set, else 0 (a select: masked inf gives 0)."""
    word = mask[n, c, i >> 5]  # the same word for 32 consecutive i: a broadcast
    grad = dy[n, c, i]  # not behind the bit: see above
    return grad if (word >> (i & 31)) & 1 else ZERO


@cuda.jit(device=True, forceinline=True)
def _backward_coefficients(partial, gamma, saved, dgamma, dbeta, c, first_plane, count):
    """(a, b, shift) of channel c, dx = a * g + b * x + shift, for every thread of the block:
    warp 0 folds the channel's G partial sums; block (c, 0) also writes dgamma[c] and dbeta[c]."""
    coefficients = cuda.shared.array(3, float32)
    if cuda.threadIdx.x < 32:
        sg, sgx = _channel_sums(partial, c)
        if cuda.threadIdx.x == 0:
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
    return coefficients[0], coefficients[1], coefficients[2]


@cuda.jit(device=True, forceinline=True)
def _load_backward_elements(dy, mask, x, c, first_plane, planes, k, i, size, gs, xs, ns, offsets):
    """UNROLL elements of g (dy where the bit is set) and x, loaded before any is used, from the
    block's sequence position (plane k, offset i); ns[u], offsets[u]: where each is (ns[u] >= N past
    the block's planes). Returns the position after them."""
    for u in range(UNROLL):
        n = first_plane + k * cuda.gridDim.y
        ns[u], offsets[u] = n, i
        gs[u] = ZERO
        xs[u] = ZERO
        if k < planes:
            gs[u] = _masked_gradient(dy, mask, n, c, i)
            xs[u] = x[n, c, i]
        k, i = _advance(k, i, cuda.blockDim.x, size)
    return k, i


@cuda.jit(**FILL_THE_SM)
def bn_backward_reduce_kernel(dy, mask, x, d_identity, has_identity, partial):
    """Block (c, g) over its planes n = g, g + G, ...: g = dy where the bit is set;
    partial[:, g, c] = (sum g, sum g * x); d_identity = g."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    planes, size = _planes_of_block(x.shape[0], first_plane), x.shape[2]
    sg = 0.0
    sgx = 0.0
    k, i = _advance(0, 0, cuda.threadIdx.x, size)
    while k < planes:
        gs = cuda.local.array(UNROLL, float32)
        xs = cuda.local.array(UNROLL, float32)
        ns = cuda.local.array(UNROLL, int32)
        offsets = cuda.local.array(UNROLL, int32)
        k, i = _load_backward_elements(dy, mask, x, c, first_plane, planes, k, i, size, gs, xs, ns, offsets)
        for u in range(UNROLL):
            if has_identity and ns[u] < x.shape[0]:
                d_identity[ns[u], c, offsets[u]] = gs[u]  # the add's gradient is the ReLU's: stored once, here
            sg += float64(gs[u])
            sgx += float64(gs[u]) * float64(xs[u])
    _store_partial(partial, first_plane, c, sg, sgx)


@cuda.jit(**FILL_THE_SM)
def bn_backward_dx_kernel(dy, mask, x, gamma, saved, partial, dx, dgamma, dbeta):
    """Block (c, g) over its planes n = g, g + G, ...: dx = a * g + b * x + k, with a, b, k from the
    channel's sums (folded by warp 0)."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    a, b, shift = _backward_coefficients(partial, gamma, saved, dgamma, dbeta, c, first_plane,
                                         x.shape[0] * x.shape[2])
    planes, size = _planes_of_block(x.shape[0], first_plane), x.shape[2]
    k, i = _advance(0, 0, cuda.threadIdx.x, size)
    while k < planes:
        gs = cuda.local.array(UNROLL, float32)
        xs = cuda.local.array(UNROLL, float32)
        ns = cuda.local.array(UNROLL, int32)
        offsets = cuda.local.array(UNROLL, int32)
        k, i = _load_backward_elements(dy, mask, x, c, first_plane, planes, k, i, size, gs, xs, ns, offsets)
        for u in range(UNROLL):
            if ns[u] < x.shape[0]:
                dx[ns[u], c, offsets[u]] = a * gs[u] + b * xs[u] + shift


# ---------------------------------------------------------------------------------------------
# The same four kernels on 16-byte quads (planes of H*W % 4 == 0, buffers 16-byte aligned)
#
# At 4 bytes an access, each element costs its own address arithmetic, mask bit and load or store
# instructions, and the four kernels issue more instructions than the SMs can while the memory
# waits. A quad moves four elements with one instruction (workbook.memory, chapter 00): its mask bits
# are a nibble, bits 4 (q % 8) .. + 3 of word q // 8. A warp's forward trip is 32 quads, 128
# elements: four mask words, built from four ballots as chapter 01's relu_mask_quads_kernel does.

QUAD_UNROLL = 2  # quads a thread loads before it uses the first: 32 bytes of each input in flight
QUAD_VALUES = 4 * QUAD_UNROLL  # (a local array's size must be a constant)


@cuda.jit(device=True, forceinline=True)
def _quad_at(array, n, c, q):
    """Flat index of quad q of plane (n, c) of an (N, C, H*W) array: what load4 and store4 take."""
    return (n * array.shape[1] + c) * array.shape[2] + 4 * q


@cuda.jit(device=True, forceinline=True)
def _nibble(mask, n, c, q):
    """The 4 mask bits of quad q of plane (n, c)."""
    return (mask[n, c, q >> 3] >> (4 * (q & 7))) & 0xF


@cuda.jit(**FILL_THE_SM)
def bn_stats_quads_kernel(x, partial):
    """bn_stats_kernel on quads: QUAD_UNROLL quads a thread in flight, then their sums."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    planes, threads, quads = _planes_of_block(x.shape[0], first_plane), cuda.blockDim.x, x.shape[2] // 4
    s = 0.0
    ss = 0.0
    k, q = _advance(0, 0, cuda.threadIdx.x, quads)
    while k < planes:
        values = cuda.local.array(QUAD_VALUES, float32)
        for u in range(QUAD_UNROLL):
            quad = (ZERO, ZERO, ZERO, ZERO)
            if k < planes:
                quad = load4(x, _quad_at(x, first_plane + k * cuda.gridDim.y, c, q))
            for e in range(4):
                values[4 * u + e] = quad[e]
            k, q = _advance(k, q, threads, quads)
        for e in range(QUAD_VALUES):
            v = float64(values[e])
            s += v
            ss += v * v
    _store_partial(partial, first_plane, c, s, ss)


@cuda.jit(**FILL_THE_SM)
def bn_forward_quads_kernel(x, identity, has_identity, gamma, beta, partial, saved, running_mean, running_var,
                            momentum, eps, y, mask):
    """bn_forward_kernel on quads: a warp's trip is 32 quads (lane l: quad 32 t + l) and 4 mask words."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    lane, warp = cuda.laneid, cuda.threadIdx.x >> 5
    scale, shift = _forward_coefficients(partial, gamma, beta, saved, running_mean, running_var, momentum, eps,
                                         c, first_plane, x.shape[0] * x.shape[2])
    planes, quads, words = _planes_of_block(x.shape[0], first_plane), x.shape[2] // 4, mask.shape[2]
    trips = (words + 3) // 4
    k, trip = _advance(0, 0, warp, trips)  # warp-uniform: all 32 lanes reach every ballot
    while k < planes:
        n = first_plane + k * cuda.gridDim.y
        q = 32 * trip + lane
        z = (ZERO, ZERO, ZERO, ZERO)  # past the plane's end: votes 0, the padding bits
        if q < quads:
            at = _quad_at(x, n, c, q)
            v = load4(x, at)
            z = (v[0] * scale + shift, v[1] * scale + shift, v[2] * scale + shift, v[3] * scale + shift)
            if has_identity:
                e = load4(identity, at)
                z = (z[0] + e[0], z[1] + e[1], z[2] + e[2], z[3] + e[3])
            store4(y, at, (relu(z[0]), relu(z[1]), relu(z[2]), relu(z[3])))
        ballot_a = cuda.ballot_sync(FULL_MASK, z[0] > ZERO)
        ballot_b = cuda.ballot_sync(FULL_MASK, z[1] > ZERO)
        ballot_c = cuda.ballot_sync(FULL_MASK, z[2] > ZERO)
        ballot_d = cuda.ballot_sync(FULL_MASK, z[3] > ZERO)
        bits = 8 * (lane & 3)  # this lane builds word (lane & 3) of the trip's four: quads 8w .. 8w + 7
        word = (_spread8(ballot_a >> bits) | (_spread8(ballot_b >> bits) << 1)
                | (_spread8(ballot_c >> bits) << 2) | (_spread8(ballot_d >> bits) << 3))
        index = 4 * trip + (lane & 3)
        if index < words:
            mask[n, c, index] = word
        k, trip = _advance(k, trip, WARPS_PER_BLOCK, trips)


@cuda.jit(device=True, forceinline=True)
def _load_backward_quads(dy, mask, x, c, first_plane, planes, k, q, quads, grads, xs, at):
    """QUAD_UNROLL quads of g (dy where the bit is set) and x, loaded before any is used, from the
    block's sequence position (k, q); at[u]: each quad's flat index, -1 past the block's planes.
    Returns the position after them."""
    for u in range(QUAD_UNROLL):
        g = (ZERO, ZERO, ZERO, ZERO)
        v = (ZERO, ZERO, ZERO, ZERO)
        at[u] = -1
        if k < planes:
            n = first_plane + k * cuda.gridDim.y
            at[u] = _quad_at(x, n, c, q)
            bits = _nibble(mask, n, c, q)
            d = load4(dy, at[u])  # not behind the bits (see the backward section above)
            g = (d[0] if bits & 1 else ZERO, d[1] if bits & 2 else ZERO,
                 d[2] if bits & 4 else ZERO, d[3] if bits & 8 else ZERO)
            v = load4(x, at[u])
        for e in range(4):
            grads[4 * u + e] = g[e]
            xs[4 * u + e] = v[e]
        k, q = _advance(k, q, cuda.blockDim.x, quads)
    return k, q


@cuda.jit(**FILL_THE_SM)
def bn_backward_reduce_quads_kernel(dy, mask, x, d_identity, has_identity, partial):
    """bn_backward_reduce_kernel on quads."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    planes, quads = _planes_of_block(x.shape[0], first_plane), x.shape[2] // 4
    sg = 0.0
    sgx = 0.0
    k, q = _advance(0, 0, cuda.threadIdx.x, quads)
    while k < planes:
        grads = cuda.local.array(QUAD_VALUES, float32)
        xs = cuda.local.array(QUAD_VALUES, float32)
        at = cuda.local.array(QUAD_UNROLL, int64)
        k, q = _load_backward_quads(dy, mask, x, c, first_plane, planes, k, q, quads, grads, xs, at)
        for u in range(QUAD_UNROLL):
            if has_identity and at[u] >= 0:
                store4(d_identity, at[u], (grads[4 * u], grads[4 * u + 1], grads[4 * u + 2], grads[4 * u + 3]))
        for e in range(QUAD_VALUES):
            sg += float64(grads[e])
            sgx += float64(grads[e]) * float64(xs[e])
    _store_partial(partial, first_plane, c, sg, sgx)


@cuda.jit(**FILL_THE_SM)
def bn_backward_dx_quads_kernel(dy, mask, x, gamma, saved, partial, dx, dgamma, dbeta):
    """bn_backward_dx_kernel on quads."""
    c, first_plane = cuda.blockIdx.x, cuda.blockIdx.y
    a, b, shift = _backward_coefficients(partial, gamma, saved, dgamma, dbeta, c, first_plane,
                                         x.shape[0] * x.shape[2])
    planes, quads = _planes_of_block(x.shape[0], first_plane), x.shape[2] // 4
    k, q = _advance(0, 0, cuda.threadIdx.x, quads)
    while k < planes:
        grads = cuda.local.array(QUAD_VALUES, float32)
        xs = cuda.local.array(QUAD_VALUES, float32)
        at = cuda.local.array(QUAD_UNROLL, int64)
        k, q = _load_backward_quads(dy, mask, x, c, first_plane, planes, k, q, quads, grads, xs, at)
        for u in range(QUAD_UNROLL):
            if at[u] >= 0:
                e = 4 * u
                store4(dx, at[u], (a * grads[e] + b * xs[e] + shift, a * grads[e + 1] + b * xs[e + 1] + shift,
                                   a * grads[e + 2] + b * xs[e + 2] + shift, a * grads[e + 3] + b * xs[e + 3] + shift))


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


def _use_quads(quads, h, w, *arrays):
    """The quad kernels where every plane starts on 16 bytes (H*W % 4 == 0 and each array aligned),
    unless the caller says (quads=False: the 4-byte kernels, e.g. to compare them)."""
    possible = (h * w) % 4 == 0 and all(aligned(a, 16) for a in arrays if a is not None)
    if quads and not possible:
        raise ValueError(f"quads need H*W % 4 == 0 and 16-byte aligned buffers; H*W = {h * w}")
    return possible if quads is None else quads


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
                           momentum=0.1, eps=1e-5, stream=0, groups=None, quads=None):
    """y = relu(batchnorm(x) [+ identity]) in training mode, and its 1-bit mask. Returns (y, mask).

    x, y, identity: float32[N, C, H, W]; gamma, beta, running_mean, running_var: float32[C] (the
    running statistics are updated in place); mask: uint32[N, C, ceil(H*W / 32)];
    saved: float64[2, C] receives the batch mean and 1/std for the backward pass. stream: where
    the two kernels go (0: the default stream; chapter 07 captures them on another into a graph).
    groups: blocks per channel (default `plane_groups`: one full wave); the backward pass may use
    another. quads: the 16-byte kernels (default: wherever H*W % 4 == 0 and the buffers are aligned).
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
        identity = require(identity, "identity", dtype=np.float32, shape=x.shape)
    if not 0.0 <= momentum <= 1.0 or eps <= 0:
        raise ValueError(f"need 0 <= momentum <= 1 and eps > 0, got momentum={momentum}, eps={eps}")
    groups = _grid(n, c, groups)
    partial = _partial_sums(groups, c)
    x3 = _planes(x)
    blocks = (c, groups)  # block (c, g) takes planes g, g + G, ... of channel c
    wide = _use_quads(quads, h, w, x, y, identity)
    _launches.launch(bn_stats_quads_kernel if wide else bn_stats_kernel, blocks, THREADS_PER_BLOCK, (x3, partial),
                     stream=stream)
    has_identity = identity is not None
    _launches.launch(bn_forward_quads_kernel if wide else bn_forward_kernel, blocks, THREADS_PER_BLOCK,
                     (x3, _planes(identity) if has_identity else x3, has_identity, gamma, beta, partial, saved,
                      running_mean, running_var, np.float32(momentum), np.float32(eps), _planes(y), mask),
                     stream=stream)
    return y, mask


def batchnorm_relu_backward(dy, mask, x, gamma, saved, dx, dgamma, dbeta, *, d_identity=None, stream=0,
                            groups=None, quads=None):
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
    wide = _use_quads(quads, h, w, dy, x, dx, d_identity)
    # Without an identity, dy is passed as d_identity and never written (see bn_forward_kernel).
    _launches.launch(bn_backward_reduce_quads_kernel if wide else bn_backward_reduce_kernel, blocks, THREADS_PER_BLOCK,
                     (dy3, mask, x3, _planes(d_identity) if has_identity else dy3, has_identity, partial), stream=stream)
    _launches.launch(bn_backward_dx_quads_kernel if wide else bn_backward_dx_kernel, blocks, THREADS_PER_BLOCK,
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
