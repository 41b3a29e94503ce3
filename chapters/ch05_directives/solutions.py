"""Chapter 05 — solutions: explicit kernels for the image merge and blur.

Each exercise is the code between `# >>> ch05.N` and `# <<< ch05.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch05` (or run the exercise cells of the chapter's
notebook). Images are uint8, height x width, C order; the rules are the chapter's `merge_reference`
(the rounded average) and `blur_reference` (3x3 box, clamp to the edge, rounded).
"""

import math

import numpy as np
from numba import cuda

from chapters.ch05_directives.kernels import BLOCK_X, BLOCK_Y, THREADS_PER_BLOCK, check_image
from workbook.inputs import require


# ---------------------------------------------------------------------------------------------
# ch05.1 (complete one line) — the merge pixel: out = (a + b + 1) >> 1, the average rounded up.
# a and b are uint8. numba computes uint8 + uint8 in 64 bits (200 + 100 = 300), so the sum cannot
# wrap, and the simulator reads array elements the same way; NumPy's own uint8 scalars would wrap
# at 256 (200 + 100 = 44). Widening to int32 yourself keeps the arithmetic 32-bit. The check has
# 255 + 255.


@cuda.jit
def merge_kernel(a, b, out):
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        # >>> ch05.1 (stub 0f1b1eb9)
        out[i] = (np.int32(a[i]) + np.int32(b[i]) + np.int32(1)) >> np.int32(1)  # read 2 bytes, write 1
        # <<< ch05.1


def merge(a, b, out):
    a = check_image(a, "a")
    b, out = check_image(b, "b", like=a), check_image(out, "out", like=a)
    flat = a.size
    merge_kernel[max(1, min(64, math.ceil(flat / THREADS_PER_BLOCK))), THREADS_PER_BLOCK](
        a.reshape(flat), b.reshape(flat), out.reshape(flat))
    return out


# ---------------------------------------------------------------------------------------------
# ch05.2 (write a kernel) — the 3x3 box blur, one thread per output pixel on a 2-D grid (x across
# the columns, y down the rows). dst[r, c] = (sum of the 9 src pixels around (r, c) + 4) // 9,
# where a neighbour outside the image is replaced by the nearest pixel on the edge (clamp the row
# to [0, height - 1] and the column to [0, width - 1]). Sum in int32.


@cuda.jit
def blur_kernel(src, dst):
    # >>> ch05.2 (stub 7066550d)
    c, r = cuda.grid(2)
    height, width = src.shape
    if r < height and c < width:
        total = 0
        for dr in range(-1, 2):
            rr = min(max(r + dr, 0), height - 1)
            for dc in range(-1, 2):
                cc = min(max(c + dc, 0), width - 1)
                total += np.int32(src[rr, cc])  # 9 loads, mostly L1 hits
        dst[r, c] = (total + 4) // 9
    # <<< ch05.2


def _blur_launch(kernel, src, dst):
    src = check_image(src, "src")
    dst = check_image(dst, "dst", like=src)
    height, width = src.shape
    kernel[(math.ceil(width / BLOCK_X), math.ceil(height / BLOCK_Y)), (BLOCK_X, BLOCK_Y)](src, dst)
    return dst


def blur(src, dst):
    return _blur_launch(blur_kernel, src, dst)


# ---------------------------------------------------------------------------------------------
# ch05.3 (find and fix the bug) — another blur, right on square images only. The check runs it on
# wide images; read which pixels are wrong (their columns) and fix it.


@cuda.jit
def blur_clamped_kernel(src, dst):
    c, r = cuda.grid(2)
    height, width = src.shape
    if r < height and c < width:
        total = 0
        for dr in range(-1, 2):
            for dc in range(-1, 2):
                # >>> ch05.3 (stub cf33988a)
                rr = min(max(r + dr, 0), height - 1)
                cc = min(max(c + dc, 0), width - 1)
                # <<< ch05.3
                total += np.int32(src[rr, cc])
        dst[r, c] = (total + 4) // 9


def blur_clamped(src, dst):
    return _blur_launch(blur_clamped_kernel, src, dst)


# ---------------------------------------------------------------------------------------------
# ch05.4 (write a kernel) — merge four pixels at a time. View a, b and out as uint32 words (4 pixels
# each) and compute the four rounded averages at once, with no unpacking:
#     (a | b) - (((a ^ b) >> 1) & 0x7F7F7F7F)
# (a + b + 1) >> 1 == (a | b) - ((a ^ b) >> 1) for one byte; the mask stops each byte's shifted bit
# from leaking into its neighbour. A grid-stride loop over the words: 8 bytes read, 4 written per
# word, one load and one store instruction each instead of four.


@cuda.jit
def merge4_kernel(a, b, out):
    # >>> ch05.4 (stub 101e486b)
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        x, y = a[i], b[i]
        out[i] = (x | y) - (((x ^ y) >> np.uint32(1)) & np.uint32(0x7F7F7F7F))
    # <<< ch05.4


def merge4(a, b, out):
    """a, b, out: uint32 device arrays of the same size, each word four uint8 pixels."""
    a = require(a, "a", dtype=np.uint32, ndim=1)
    b = require(b, "b", dtype=np.uint32, shape=a.shape)
    out = require(out, "out", dtype=np.uint32, shape=a.shape)
    merge4_kernel[max(1, min(64, math.ceil(a.size / THREADS_PER_BLOCK))), THREADS_PER_BLOCK](a, b, out)
    return out


# Planted wrong answers: edits of the answers above that the checks must reject (a test applies
# each one and expects its check to fail), so that no check passes vacuously.
# Edits of the answers above that are right on a GPU and that the simulator once graded wrong
# (NumPy wraps uint8 sums at 256 where numba computes in 64 bits): a test expects each graded correct.
RIGHT_ON_A_GPU = {
    "ch05.1": [("np.int32(a[i]) + np.int32(b[i]) + np.int32(1)) >> np.int32(1)", "a[i] + b[i] + 1) >> 1")],
    "ch05.2": [("total += np.int32(src[rr, cc])", "total += src[rr, cc]")],
}

PLANTED_WRONG_ANSWERS = {
    "ch05.1": [("+ np.int32(1)) >> np.int32(1)", ") >> np.int32(1)")],  # rounds down
    "ch05.2": [("(total + 4) // 9", "total // 9")],  # truncates instead of rounding
    "ch05.3": [("cc = min(max(c + dc, 0), width - 1)", "cc = min(max(c + dc, 1), width - 1)")],  # left edge
    "ch05.4": [("np.uint32(0x7F7F7F7F)", "np.uint32(0xFFFFFFFF)")],  # bits leak between pixels
}
