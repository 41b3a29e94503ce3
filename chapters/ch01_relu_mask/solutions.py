"""Chapter 01 — solutions: ReLU's 1-bit mask, warp ballots, and a backward pass that reads bits.

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
        bits = cuda.ballot_sync(FULL_MASK, v > ZERO)
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
    i = cuda.grid(1)
    if i < out.size:
        out[i] = (mask[i >> 5] >> (i & 31)) & 1  # read 4 bytes (shared by the warp), write 1
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
        dx[i] = dy[i] if bit else ZERO  # a select: a dropped inf or NaN gradient gives 0, not NaN
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
ROWS_PER_TRIP = 8  # rows of 32 elements a warp loads before its first vote: 8 loads in flight per lane


@cuda.jit
def relu_mask_fast_kernel(x, y, mask):
    n = x.size
    lane = cuda.laneid
    rows = (n + 31) >> 5
    row = (cuda.grid(1) >> 5) * ROWS_PER_TRIP
    step = (cuda.gridsize(1) >> 5) * ROWS_PER_TRIP
    my_row = lane % ROWS_PER_TRIP  # lanes j, j+8, j+16, j+24 store the word of row j
    values = cuda.local.array(ROWS_PER_TRIP, np.float32)  # registers: the loops are unrolled
    while row < rows:  # warp-uniform
        first = row * 32 + lane
        for j in range(ROWS_PER_TRIP):  # all loads first: each lane has 8 in flight
            i = first + 32 * j
            values[j] = x[i] if i < n else ZERO
        mine = 0
        for j in range(ROWS_PER_TRIP):
            i = first + 32 * j
            if i < n:
                y[i] = relu(values[j])
            bits = cuda.ballot_sync(FULL_MASK, values[j] > ZERO)
            if my_row == j:
                mine = bits  # a select, not a branch
        # Every lane stores (4 lanes per word, the same value): one 32-byte sector and no branch on
        # the lane, which would make the compiler split the loop into two copies run one after the other.
        if row + my_row < rows:
            mask[row + my_row] = mine
        row += step


def relu_mask_fast(x, y, mask):
    x, y, mask = _forward_args(x, y, mask)
    warps_needed = math.ceil(mask.size / ROWS_PER_TRIP)
    blocks = max(1, min(sm_count() * BLOCKS_PER_SM, math.ceil(warps_needed * 32 / THREADS_PER_BLOCK)))
    relu_mask_fast_kernel[blocks, THREADS_PER_BLOCK](x, y, mask)
    return y, mask
# <<< ch01.4


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
PLANTED_WRONG_ANSWERS = {
    "ch01.1": [("v > ZERO", "v >= ZERO")],  # +0.0 and -0.0 would count as positive
    "ch01.2": [("(i & 31)", "(i & 15)"),  # the wrong bit of the word
               # the block size hard-coded: right only with the wrapper's blocks
               ("i = cuda.grid(1)", "i = cuda.threadIdx.x + cuda.blockIdx.x * 256", "simulator")],
    "ch01.3": [("dy[i] if bit else ZERO", "dy[i] if bit else dy[i] * ZERO")],  # inf * 0 = NaN
    "ch01.4": [("values[j] > ZERO", "values[j] > np.float32(-1.0)")],  # wrong bits
}
