"""Chapter 02 — solutions: dropout with a counter-based generator and a 1-bit mask.

Each exercise is the code between `# >>> ch02.N` and `# <<< ch02.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch02` (or run the exercise cells of the chapter's
notebook). The chapter's mapping: element i is kept iff word i % 4 of Philox4x32-10 with counter
(quad, offset) and key (seed) is >= threshold_for(p), where quad = i // 4; all 64-bit numbers go
in as (low, high) uint32 words. Kept elements are scaled by 1 / (1 - p).
"""

import math

import numpy as np
from numba import cuda

from chapters.ch02_dropout.kernels import (FULL_MASK, THREADS_PER_BLOCK, check_p, check_u64, keep4, scale_for,
                                           split_u64, threshold_for)
from chapters.ch02_dropout.philox import philox4x32
from workbook.check import pack_bitmask  # noqa: F401  (handy for your own experiments)
from workbook.inputs import require

ZERO = np.float32(0.0)


def _generator_args(p, seed, offset):
    """(threshold, scale, seed_lo, seed_hi, off_lo, off_hi): what the kernels take for (p, seed, offset)."""
    p = check_p(p)
    seed_lo, seed_hi = split_u64(check_u64(seed, "seed"))
    off_lo, off_hi = split_u64(check_u64(offset, "offset"))
    return threshold_for(p), scale_for(p), seed_lo, seed_hi, off_lo, off_hi


def _quad_blocks(n):
    return max(1, math.ceil(math.ceil(n / 4) / THREADS_PER_BLOCK))


# ---------------------------------------------------------------------------------------------
# ch02.1 (complete one line) — the four random words of a quad.
#
# Thread t owns the quad of elements 4t .. 4t+3. Call `philox4x32(c0, c1, c2, c3, k0, k1)` (six
# uint32) with the counter and key of the module docstring: the counter is the quad index (low,
# high) followed by the offset (low, high); the key is the seed (low, high). Hint: the chapter's
# `keep4` does exactly this, and `np.uint32(quad >> 32)` is the high word of the quad index.


@cuda.jit
def keep_flags_kernel(out, threshold, seed_lo, seed_hi, off_lo, off_hi):
    quad = cuda.grid(1)
    first = quad * 4
    n = out.size
    if first < n:
        # >>> ch02.1 (stub cd5f579d)
        r0, r1, r2, r3 = philox4x32(np.uint32(quad & 0xFFFFFFFF), np.uint32(quad >> 32),
                                    off_lo, off_hi, seed_lo, seed_hi)
        # <<< ch02.1
        out[first] = np.uint64(r0) >= threshold  # an integer compare: exact for p = 0 and p = 1
        if first + 1 < n:
            out[first + 1] = np.uint64(r1) >= threshold
        if first + 2 < n:
            out[first + 2] = np.uint64(r2) >= threshold
        if first + 3 < n:
            out[first + 3] = np.uint64(r3) >= threshold


def keep_flags(n, p, seed, offset, out):
    """out[i] = 1 if element i is kept, else 0 (uint8[n])."""
    out = require(out, "out", dtype=np.uint8, shape=(n,))
    threshold, _, seed_lo, seed_hi, off_lo, off_hi = _generator_args(p, seed, offset)
    keep_flags_kernel[_quad_blocks(n), THREADS_PER_BLOCK](out, threshold, seed_lo, seed_hi, off_lo, off_hi)
    return out


# ---------------------------------------------------------------------------------------------
# ch02.2 (write a kernel) — the backward pass from the bitmask: dx[i] = dy[i] * scale where bit i of
# the mask is set, else 0 (a select: a dropped inf or NaN gives 0). One thread per element; bit i
# is bit i % 32 of mask word i // 32. Per element: read dy 4 bytes and 1/8 byte of mask, write 4.


@cuda.jit
def dropout_backward_kernel(dy, mask, scale, dx):
    # >>> ch02.2 (stub e74fdd92)
    i = cuda.grid(1)
    if i < dy.size:
        word = mask[i >> 5]  # the same word for 32 lanes: one broadcast load
        dx[i] = dy[i] * scale if (word >> (i & 31)) & 1 else ZERO
    # <<< ch02.2


def dropout_backward(dy, mask, p, dx):
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(-(-dy.size // 32),))
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    blocks = max(1, math.ceil(dy.size / THREADS_PER_BLOCK))
    dropout_backward_kernel[blocks, THREADS_PER_BLOCK](dy, mask, scale_for(check_p(p)), dx)
    return dx


# ---------------------------------------------------------------------------------------------
# ch02.3 (find and fix the bug) — the mask by warp ballot. A warp owns rows of 32 elements; lane k
# finds whether element k of its row is kept, and one ballot makes the row's mask word. Sizes that
# are a multiple of 32 come out right; the others do not. Run the check and read what
# `assert_bitmask` says about the bits past n.


@cuda.jit
def dropout_mask_kernel(n, mask, threshold, seed_lo, seed_hi, off_lo, off_hi):
    lane = cuda.laneid
    row = cuda.grid(1) >> 5  # one row per warp: the same in all 32 lanes
    if row < mask.size:
        i = row * 32 + lane
        keep0, keep1, keep2, keep3 = keep4(i >> 2, threshold, seed_lo, seed_hi, off_lo, off_hi)
        which = i & 3
        flag = keep0 if which == 0 else keep1 if which == 1 else keep2 if which == 2 else keep3
        # >>> ch02.3 (stub 4a3dc6f7)
        keep = flag and i < n  # elements past n do not exist: their bits must be 0
        # <<< ch02.3
        bits = cuda.ballot_sync(FULL_MASK, keep)
        if lane == 0:
            mask[row] = bits


def dropout_mask(n, p, seed, offset, mask):
    mask = require(mask, "mask", dtype=np.uint32, shape=(-(-n // 32),))
    threshold, _, seed_lo, seed_hi, off_lo, off_hi = _generator_args(p, seed, offset)
    blocks = max(1, math.ceil(mask.size * 32 / THREADS_PER_BLOCK))
    dropout_mask_kernel[blocks, THREADS_PER_BLOCK](n, mask, threshold, seed_lo, seed_hi, off_lo, off_hi)
    return mask


# ---------------------------------------------------------------------------------------------
# ch02.4 (write a kernel) — the seed-only backward: no mask at all. The forward pass kept only
# (seed, offset); the backward pass draws the same random words again and gets the same keep flags.
# dx[i] = dy[i] * scale if element i is kept, else 0. One thread per quad (4 elements, one Philox
# call): `keep4(quad, threshold, seed_lo, seed_hi, off_lo, off_hi)` gives the quad's four flags.
# Mind the last quad when n is not a multiple of 4. Bytes per element: read 4, write 4, no mask.


# >>> ch02.4 (stub c57d414b)
@cuda.jit(device=True)
def _drop(dy, dx, i, keep, scale):
    if i < dy.size:
        dx[i] = dy[i] * scale if keep else ZERO


@cuda.jit
def seed_only_backward_kernel(dy, dx, threshold, scale, seed_lo, seed_hi, off_lo, off_hi):
    quad = cuda.grid(1)
    first = quad * 4
    if first < dy.size:
        keep0, keep1, keep2, keep3 = keep4(quad, threshold, seed_lo, seed_hi, off_lo, off_hi)
        _drop(dy, dx, first, keep0, scale)
        _drop(dy, dx, first + 1, keep1, scale)
        _drop(dy, dx, first + 2, keep2, scale)
        _drop(dy, dx, first + 3, keep3, scale)
# <<< ch02.4


def seed_only_backward(dy, p, seed, offset, dx):
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    threshold, scale, seed_lo, seed_hi, off_lo, off_hi = _generator_args(p, seed, offset)
    seed_only_backward_kernel[_quad_blocks(dy.size), THREADS_PER_BLOCK](dy, dx, threshold, scale, seed_lo,
                                                                        seed_hi, off_lo, off_hi)
    return dx


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
PLANTED_WRONG_ANSWERS = {
    "ch02.1": [("off_lo, off_hi, seed_lo, seed_hi)", "seed_lo, seed_hi, off_lo, off_hi)")],  # key <-> counter
    "ch02.2": [("(i & 31)", "(i % 31)")],  # the wrong bit
    "ch02.3": [("flag and i < n", "flag and i <= n")],  # one padding bit too many
    "ch02.4": [("_drop(dy, dx, first + 3, keep3, scale)", "_drop(dy, dx, first + 3, keep2, scale)")],
}
