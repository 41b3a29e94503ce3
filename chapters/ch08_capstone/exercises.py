"""Chapter 08 — exercises: the small layers of a training step, and its optimizer.

Each exercise is the code between `# >>> ch08.N` and `# <<< ch08.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch08` (or run the exercise cells of the chapter's
notebook). Arrays are float32; references are float64 NumPy.
"""

import math

import numpy as np
from numba import cuda

from chapters.ch08_capstone.layers import ZERO
from workbook.inputs import require

THREADS = 128


def _blocks(n):
    return max(1, math.ceil(n / THREADS))


# ---------------------------------------------------------------------------------------------
# ch08.1 (complete one line) — the data gradient's filters. For stride 1 the gradient of a
# convolution is the convolution of dy with the filters transposed (C and K swapped) and turned by
# 180 degrees:  wt[c, k, r, s] = w[k, c, R-1-r, S-1-s].  One thread per element of wt; the loop
# below has already found this element's (c, k, r, s).


@cuda.jit
def flip_filters_kernel(w, wt):
    K, C, R, S = w.shape
    for i in range(cuda.grid(1), wt.size, cuda.gridsize(1)):
        s = i % S
        r = (i // S) % R
        k = (i // (S * R)) % K
        c = i // (S * R * K)
        # >>> ch08.1 (stub b30e5ff4)
        raise NotImplementedError("ch08.1: wt[c, k, r, s] = the element of w it comes from")
        # <<< ch08.1


def flip_filters(w, wt):
    w = require(w, "w", dtype=np.float32, ndim=4)
    wt = require(wt, "wt", dtype=np.float32, shape=(w.shape[1], w.shape[0], w.shape[2], w.shape[3]))
    flip_filters_kernel[_blocks(wt.size), THREADS](w, wt)
    return wt


# ---------------------------------------------------------------------------------------------
# ch08.2 (write a kernel) — global average pooling's backward. The forward took the mean of each
# (n, c) plane of H*W values: out[row] = mean of planes[row, :], with row = n*C + c. Its gradient
# spreads each d_out[row] evenly back over the plane:
#   d_planes[row, j] = d_out[row] / (H*W)      for every j < H*W
# One thread per element of d_planes, grid-stride (the grid may be smaller than the data). Bytes:
# 4 written per element, 4 read per plane (from cache, shared by the plane's threads).


@cuda.jit
def pool_backward_kernel(d_out, d_planes):
    # >>> ch08.2 (stub 1a35bdf0)
    raise NotImplementedError("ch08.2: write the kernel: d_planes[row, j] = d_out[row] / (H*W)")
    # <<< ch08.2


def pool_backward(d_out, d_planes):
    d_planes = require(d_planes, "d_planes", dtype=np.float32, ndim=2)
    d_out = require(d_out, "d_out", dtype=np.float32, shape=(d_planes.shape[0],))
    pool_backward_kernel[min(_blocks(d_planes.size), 4), THREADS](d_out, d_planes)
    return d_planes


# ---------------------------------------------------------------------------------------------
# ch08.3 (find and fix the bug) — SGD with momentum, as torch.optim.SGD computes it:
#   g = grad + weight_decay * w;   v = momentum * v + g;   w = w - lr * v
# The weight decay is part of the gradient, so it goes through the momentum too. This kernel
# trains, but not the same network as torch: after a few steps its weights drift apart. The check
# runs three steps and says which parameters differ.


@cuda.jit
def sgd_momentum_kernel(params, grads, velocity, lr, momentum, weight_decay):
    for i in range(cuda.grid(1), params.size, cuda.gridsize(1)):
        w = params[i]
        # >>> ch08.3 (stub 7e39e9ab)
        v = momentum * velocity[i] + grads[i]
        velocity[i] = v
        params[i] = w - lr * (v + weight_decay * w)
        # <<< ch08.3


def sgd_momentum(params, grads, velocity, lr, momentum, weight_decay):
    params = require(params, "params", dtype=np.float32, ndim=1)
    grads = require(grads, "grads", dtype=np.float32, shape=params.shape)
    velocity = require(velocity, "velocity", dtype=np.float32, shape=params.shape)
    sgd_momentum_kernel[min(_blocks(params.size), 8), THREADS](params, grads, velocity, np.float32(lr),
                                                               np.float32(momentum), np.float32(weight_decay))
    return params


# ---------------------------------------------------------------------------------------------
# ch08.4 (write a kernel) — the linear layer's bias gradient: db[j] = sum over rows i of d_out[i, j].
# A warp per column: lane k adds rows k, k + 32, k + 64, ... of its column, then the warp folds its
# 32 partial sums with shuffles, and one lane writes. (Reading down a column is strided: fine for
# the 10 columns of the capstone's logits, which sit in L2 anyway.) Warps in a block: THREADS // 32;
# columns past the grid's warps: loop (cuda.gridsize(1) // 32 warps in the grid).
# Hint: chapter 06's ch06.1, the butterfly.


@cuda.jit
def column_sum_kernel(a, total):
    # >>> ch08.4 (stub 6a019868)
    raise NotImplementedError("ch08.4: write the kernel: total[j] = sum of column j, a warp per column")
    # <<< ch08.4


def column_sum(a, total):
    a = require(a, "a", dtype=np.float32, ndim=2)
    total = require(total, "total", dtype=np.float32, shape=(a.shape[1],))
    column_sum_kernel[max(1, min(math.ceil(a.shape[1] * 32 / THREADS), 2)), THREADS](a, total)
    return total
