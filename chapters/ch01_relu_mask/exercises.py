"""Chapter 01 — exercises: ReLU's 1-bit mask, warp ballots, and a backward pass that reads bits.

Each exercise is the code between `# >>> ch01.N` and `# <<< ch01.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch01` (or run the exercise cells of the chapter's
notebook). The mask layout is the chapter's: uint32[ceil(n / 32)], bit i % 32 of word i // 32 is
(x[i] > 0), padding bits past n are 0.
"""

import math

import numpy as np
from numba import cuda

from chapters.ch01_relu_mask.kernels import (BLOCKS_PER_SM, FULL_MASK, THREADS_PER_BLOCK, ZERO, mask_words,
                                             relu)
from workbook.inputs import require, sm_count


def _forward_args(x, y, mask):
    x = require(x, "x", dtype=np.float32, ndim=1)
    y = require(y, "y", dtype=np.float32, shape=x.shape)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(x.size),))
    return x, y, mask


# ---------------------------------------------------------------------------------------------
# ch01.1 (complete one line) — the mask word of a row, with one warp vote.
#
# A warp owns rows of 32 consecutive elements; lane k holds element k of the row in `v` (0.0 past
# the end of x). One collective gives every lane a 32-bit word whose bit k is lane k's predicate.
# Which one? Lanes past n must still take part (they hold 0.0, so they vote 0 and the padding bits
# come out 0). Hint: chapter 01's `_relu_mask_trip`; FULL_MASK names the 32 lanes.


@cuda.jit
def relu_mask_kernel(x, y, mask):
    n = x.size
    lane = cuda.laneid
    rows = (n + 31) >> 5
    row = cuda.grid(1) >> 5  # this warp's first row: the same in all 32 lanes
    warps = cuda.gridsize(1) >> 5
    while row < rows:  # warp-uniform: every lane goes round together, so all 32 reach the vote
        i = row * 32 + lane
        v = x[i] if i < n else ZERO
        if i < n:
            y[i] = relu(v)  # read 4 bytes, write 4 bytes
        # >>> ch01.1 (stub db20de9a)
        raise NotImplementedError("ch01.1: bits = the mask word of this row (bit k: lane k's v > 0)")
        # <<< ch01.1
        if lane == 0:
            mask[row] = bits  # 4 bytes: 1/8 byte per element
        row += warps


def relu_mask(x, y, mask, blocks=2):
    x, y, mask = _forward_args(x, y, mask)
    relu_mask_kernel[blocks, THREADS_PER_BLOCK](x, y, mask)
    return y, mask


# ---------------------------------------------------------------------------------------------
# ch01.2 (write a kernel) — unpack a mask: out[i] = bit i of the mask, as a byte (0 or 1).
#
# One thread per element, the grid rounded up to whole blocks. Bit i lives in word i // 32 at
# position i % 32 (shifts and ANDs: i >> 5 and i & 31). The 32 lanes of a warp read the same word:
# one broadcast load per warp.


@cuda.jit
def unpack_mask_kernel(mask, out):
    # >>> ch01.2 (stub 572c52f1)
    raise NotImplementedError("ch01.2: write the kernel: out[i] = bit i of the mask")
    # <<< ch01.2


def unpack_mask(mask, out):
    out = require(out, "out", dtype=np.uint8, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(out.size),))
    unpack_mask_kernel[max(1, math.ceil(out.size / THREADS_PER_BLOCK)), THREADS_PER_BLOCK](mask, out)
    return out


# ---------------------------------------------------------------------------------------------
# ch01.3 (find and fix the bug) — the backward pass from the mask: dx = dy where the bit is set,
# else 0. The version below multiplies by the bit. It passes for ordinary numbers; the check feeds
# it what a real backward pass sees now and then. Read the checker's message, then fix the line.


@cuda.jit
def relu_backward_kernel(dy, mask, dx):
    i = cuda.grid(1)
    if i < dy.size:
        bit = (mask[i >> 5] >> (i & 31)) & 1
        # >>> ch01.3 (stub 3194c5bb)
        dx[i] = dy[i] * np.float32(bit)
        # <<< ch01.3


def relu_backward(dy, mask, dx):
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(dy.size),))
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    relu_backward_kernel[max(1, math.ceil(dy.size / THREADS_PER_BLOCK)), THREADS_PER_BLOCK](dy, mask, dx)
    return dx


# ---------------------------------------------------------------------------------------------
# ch01.4 (make it faster) — ReLU forward with its mask, fast.
#
# The kernel below is naive, like the chapter's `relu_mask_sequential_kernel` (a thread per mask
# byte) but with a thread per mask word: correct, and slow, because lane k reads x[32k + j] and the
# 32 lanes of a warp touch 32 different 128-byte lines at every step. Rewrite the kernel and its launch (both inside the region). Target, on a GPU: at least 0.75
# of the throughput of chapter 01's `relu_mask_ballot` at n = 2^26 (same run). In the simulator, the
# global-memory sectors both move are compared instead (traced). Hint: your answer to ch01.1, with several rows in flight per warp.

# >>> ch01.4 (stub 69f9d659)
@cuda.jit
def relu_mask_fast_kernel(x, y, mask):
    t = cuda.grid(1)  # thread t builds mask word t from x[32t .. 32t + 31]
    n = x.size
    if t < mask.size:
        bits = 0
        for j in range(32):
            i = t * 32 + j
            if i < n:
                v = x[i]  # lanes 128 bytes apart: a warp touches 32 lines per step
                y[i] = relu(v)
                if v > ZERO:
                    bits |= 1 << j
        mask[t] = bits


def relu_mask_fast(x, y, mask):
    x, y, mask = _forward_args(x, y, mask)
    relu_mask_fast_kernel[max(1, math.ceil(mask.size / THREADS_PER_BLOCK)), THREADS_PER_BLOCK](x, y, mask)
    return y, mask
# <<< ch01.4
