"""Chapter 04's geometry: a convolution's shapes, its NumPy references, and the row tables.

A convolution of x (N, C, H, W) with filters w (K, C, R, S) into out (N, K, P, Q) is the GEMM

    out[k, (n, p, q)] = sum over (c, r, s) of  w[k, (c, r, s)] * X[(c, r, s), (n, p, q)]
        M = K rows          GEMM depth KD = C*R*S           columns NC = N*P*Q

where X[(c, r, s), (n, p, q)] = x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw] (0 outside the image).
The explicit path writes X to memory (im2col: R*S times the input) and runs a GEMM on it; the
implicit path runs the same GEMM but computes each X element's address when it loads the tile.
This module holds what both share: the shapes and their checks, the references, and the tables
that turn a GEMM row (c, r, s) into an offset into x.
"""

from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import cuda
from numpy.lib.stride_tricks import sliding_window_view

from workbook.inputs import require
from workbook.launch import cdiv

# ---------------------------------------------------------------------------------------------
# Geometry: the shapes, and the checks every wrapper shares.


def _pair(value, name, minimum):
    pair = (value, value) if isinstance(value, (int, np.integer)) else value
    if not isinstance(pair, (tuple, list)) or len(pair) != 2 or not all(
            isinstance(v, (int, np.integer)) for v in pair):
        raise TypeError(f"{name} must be an int or a pair of ints, not {value!r}")
    if min(pair) < minimum:
        raise ValueError(f"{name} must be >= {minimum}, not {value!r}")
    return int(pair[0]), int(pair[1])


@dataclass(frozen=True)
class ConvGeometry:
    N: int
    C: int
    H: int
    W: int
    K: int
    R: int
    S: int
    sh: int
    sw: int
    ph: int
    pw: int
    dh: int
    dw: int

    @property
    def P(self):  # output rows: how many times the dilated filter fits down the padded image
        return (self.H + 2 * self.ph - self.dh * (self.R - 1) - 1) // self.sh + 1

    @property
    def Q(self):
        return (self.W + 2 * self.pw - self.dw * (self.S - 1) - 1) // self.sw + 1

    @property
    def gemm_depth(self):  # KD = C*R*S
        return self.C * self.R * self.S

    @property
    def gemm_columns(self):  # NC = N*P*Q
        return self.N * self.P * self.Q

    @property
    def out_shape(self):
        return (self.N, self.K, self.P, self.Q)

    @property
    def flops(self):  # one multiply and one add per (output, c, r, s)
        return 2 * self.N * self.K * self.P * self.Q * self.C * self.R * self.S

    @property
    def workspace_bytes(self):  # the im2col matrix, float32
        return 4 * self.gemm_depth * self.gemm_columns


def conv_geometry(x_shape, w_shape, stride=1, padding=0, dilation=1):
    """Validate a convolution's shapes and parameters; a ConvGeometry or a clear error."""
    if len(x_shape) != 4:
        raise ValueError(f"x must be NCHW (4 dimensions), not shape {tuple(x_shape)}")
    if len(w_shape) != 4:
        raise ValueError(f"w must be KCRS (4 dimensions), not shape {tuple(w_shape)}")
    N, C, H, W = (int(v) for v in x_shape)
    K, Cw, R, S = (int(v) for v in w_shape)
    if Cw != C:
        raise ValueError(f"channel mismatch: x has C={C} channels, w expects {Cw}")
    if min(N, C, H, W, K, R, S) < 1:
        raise ValueError(f"empty shapes are not supported: x {tuple(x_shape)}, w {tuple(w_shape)}")
    sh, sw = _pair(stride, "stride", 1)
    ph, pw = _pair(padding, "padding", 0)
    dh, dw = _pair(dilation, "dilation", 1)
    g = ConvGeometry(N, C, H, W, K, R, S, sh, sw, ph, pw, dh, dw)
    if dh * (R - 1) + 1 > H + 2 * ph or dw * (S - 1) + 1 > W + 2 * pw:
        raise ValueError(f"filter {R}x{S} (dilation {dh}x{dw}) is larger than the padded input "
                         f"{H + 2 * ph}x{W + 2 * pw}")
    if N * C * H * W >= 2**31 or g.gemm_depth * g.gemm_columns >= 2**40:
        raise ValueError("tensor too large for this chapter's int32 offset tables")
    return g


def conv_args(x, w, out, stride, padding, dilation):
    """A convolution wrapper's arguments checked: (x, w, out, geometry), or a clear error."""
    x = require(x, "x", dtype=np.float32, ndim=4)
    w = require(w, "w", dtype=np.float32, ndim=4)
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation)
    out = require(out, "out", dtype=np.float32, shape=g.out_shape)
    return x, w, out, g


# The awkward shapes every path is checked on (the tests, the exercise checks, the chapter):
# (name, x NCHW, w KCRS, stride, padding, dilation). Odd sizes, C and K not multiples of any tile,
# 1x1 to 7x7 filters, strides, padding larger than the filter's reach, dilation, batch 1.
AWKWARD_CASES = [
    ("1 pixel", (1, 1, 1, 1), (1, 1, 1, 1), 1, 0, 1),
    ("1x1", (2, 5, 6, 7), (3, 5, 1, 1), 1, 0, 1),
    ("3x3 pad 1", (1, 3, 7, 6), (5, 3, 3, 3), 1, 1, 1),
    ("5x5 pad 2, K=17", (1, 7, 9, 11), (17, 7, 5, 5), 1, 2, 1),
    ("7x7 stride 2 pad 3", (1, 3, 15, 13), (9, 3, 7, 7), 2, 3, 1),
    ("4x8: 32 taps, the last one bit 31", (1, 2, 6, 9), (3, 2, 4, 8), 1, (1, 3), 1),
    ("3x3 dilation 2", (2, 3, 9, 10), (4, 3, 3, 3), 1, 2, 2),
    ("mixed stride/pad/dilation", (2, 4, 9, 8), (6, 4, 3, 2), (2, 1), (1, 2), (2, 1)),
    ("pad 3 > filter reach", (1, 2, 3, 3), (3, 2, 3, 3), 1, 3, 1),
    ("C=K=33", (1, 33, 4, 5), (33, 33, 3, 3), 1, 1, 1),
    ("filter = padded input", (1, 2, 3, 4), (3, 2, 5, 6), 1, 1, 1),
]


# ---------------------------------------------------------------------------------------------
# References


def conv2d_reference(x, w, stride=1, padding=0, dilation=1):
    """NumPy: every (R, S) window of the padded input, then one einsum (float64 sums)."""
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation)
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    span = (g.dh * (g.R - 1) + 1, g.dw * (g.S - 1) + 1)  # the dilated filter's footprint
    windows = sliding_window_view(padded, span, axis=(2, 3))  # (N, C, H', W', span_h, span_w)
    windows = windows[:, :, ::g.sh, ::g.sw, ::g.dh, ::g.dw][:, :, :g.P, :g.Q]  # (N, C, P, Q, R, S)
    out = np.einsum("ncpqrs,kcrs->nkpq", windows, w.astype(np.float64), optimize=True)
    return out.astype(np.float32)


def conv2d_loops(x, w, stride=1, padding=0, dilation=1):
    """The definition, one loop per index: an independent check of conv2d_reference, tiny shapes only."""
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation)
    out = np.zeros(g.out_shape, dtype=np.float64)
    for n in range(g.N):
        for k in range(g.K):
            for p in range(g.P):
                for q in range(g.Q):
                    total = 0.0
                    for c in range(g.C):
                        for r in range(g.R):
                            for s in range(g.S):
                                h = p * g.sh - g.ph + r * g.dh
                                v = q * g.sw - g.pw + s * g.dw
                                if 0 <= h < g.H and 0 <= v < g.W:
                                    total += float(x[n, c, h, v]) * float(w[k, c, r, s])
                    out[n, k, p, q] = total
    return out.astype(np.float32)


def im2col_reference(x, g):
    """The column matrix X (C*R*S, N*P*Q) that explicit GEMM multiplies by w viewed as (K, C*R*S)."""
    padded = np.pad(x, ((0, 0), (0, 0), (g.ph, g.ph), (g.pw, g.pw)))
    span = (g.dh * (g.R - 1) + 1, g.dw * (g.S - 1) + 1)
    windows = sliding_window_view(padded, span, axis=(2, 3))[:, :, ::g.sh, ::g.sw, ::g.dh, ::g.dw]
    windows = windows[:, :, :g.P, :g.Q]  # (N, C, P, Q, R, S)
    return np.ascontiguousarray(windows.transpose(1, 4, 5, 0, 2, 3).reshape(g.gemm_depth, g.gemm_columns))


def gemm_reference(a, b):
    return (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float32)


def tolerance(depth):
    """(rtol, atol) for float32 sums of `depth` products of O(1) numbers vs a float64 reference."""
    return 1e-4, 2e-6 * depth + 1e-5


# ---------------------------------------------------------------------------------------------
# The offset table: the division-free half of the index mapping.
#
# The address of X[(c, r, s), (n, p, q)] splits into a column part and a row part:
#
#   x offset = n*C*H*W + (p*sh - ph)*W + (q*sw - pw)   +   c*H*W + r*dh*W + s*dw
#              '---------- column base (n, p, q) ----'     '-- row offset (c, r, s) -'
#   h        = (p*sh - ph)                             +   r*dh
#   w        = (q*sw - pw)                             +   s*dw
#
# A thread owns one column for the whole GEMM, so it divides once (n, p, q from n*P*Q + p*Q + q)
# before its loop. The rows change every step: their three numbers come from this table, built
# once on the host, 12 bytes per row (C*R*S rows), read through the cache as warp-wide broadcasts.


def row_offset(g, c, r, s):
    """The x offset of GEMM row (c, r, s): ints or arrays of them."""
    return c * g.H * g.W + r * g.dh * g.W + s * g.dw


def offset_table(g):
    """int32 (3, C*R*S): row offset into x, r*dh, s*dw for each GEMM row (c, r, s)."""
    c, r, s = np.meshgrid(np.arange(g.C), np.arange(g.R), np.arange(g.S), indexing="ij")
    table = np.stack([row_offset(g, c, r, s), r * g.dh, s * g.dw])
    return table.reshape(3, -1).astype(np.int32)
@lru_cache(maxsize=64)
def device_offset_table(g):
    """offset_table(g) on the device, copied once per geometry (a copy per launch would be timed)."""
    return cuda.to_device(offset_table(g))


# The implicit GEMM goes one step further (CUTLASS's "optimized" iterator does the same): its bounds
# test depends on (r, s) and on the thread's column only, so each thread computes once which of the
# R*S filter taps land on the image for its column: a bit mask, `on_image`, bit r*S + s. A row of the
# table then packs the row's x offset and the row's bit into one 32-bit word,
#
#     entry = offset << R*S  |  1 << (r*S + s)          padding rows: 0, never on the image
#
# and the loader's test is one AND with on_image, its offset one shift, entry >> R*S (ptxas folds
# the shift and the column base's add into one LEA.HI). One word, not two, matters for where the
# entries can be loaded (see implicit_conv_kernel). It needs the taps and the largest offset to
# share the 32 bits: a 3x3 filter leaves 23 bits, up to 8M elements per image. Otherwise (a 7x7
# filter, a huge image) a row takes two words, its offset and its tap r*S + s, and the test is a
# 64-bit shift and AND against a 64-bit mask: the "pairs" table (padding rows: tap 63, a bit no 7x7
# mask sets). Padding rows round the table up to whole depth steps.

MAX_TAPS = 63
TABLE_ALIGN = 32  # rows: a multiple of every tile's BK


def tap_field(g):
    """The table format for geometry g: R*S, the bits of a packed entry's tap field, when the taps
    and the largest x offset fit in 32 bits; else 0, a table of (offset, tap) pairs."""
    taps = g.R * g.S
    return taps if taps < 32 and row_offset(g, g.C - 1, g.R - 1, g.S - 1) < 1 << (32 - taps) else 0


def tap_table(g):
    """uint32 per GEMM row (c, r, s), C*R*S rows rounded up to TABLE_ALIGN: packed entries
    offset << R*S | 1 << r*S + s, shape (rows,), if tap_field(g); else pairs (offset, r*S + s),
    shape (rows, 2)."""
    rows = cdiv(g.gemm_depth, TABLE_ALIGN) * TABLE_ALIGN
    taps = np.tile(np.arange(g.R * g.S, dtype=np.uint64), g.C)  # rows are c-major: (c, r, s)
    offsets = offset_table(g)[0].astype(np.uint64)
    field = tap_field(g)
    if field:
        table = np.zeros(rows, dtype=np.uint32)
        table[: g.gemm_depth] = (offsets << np.uint64(field)) | (np.uint64(1) << taps)
    else:
        table = np.full((rows, 2), (0, MAX_TAPS), dtype=np.uint32)
        table[: g.gemm_depth, 0] = offsets
        table[: g.gemm_depth, 1] = taps
    return table


@lru_cache(maxsize=64)
def device_tap_table(g):
    """tap_table(g) on the device, flat (entries are read 16 bytes at a time), copied once per geometry."""
    return cuda.to_device(tap_table(g).reshape(-1))


@cuda.jit(device=True)
def column_origin(npq, PQ, Q, sh, sw, ph, pw, W, CHW):
    """(n, p, q) of GEMM column npq -> the column base offset into x and the window's corner (h0, w0)."""
    n = npq // PQ  # the only divisions of a convolution: once per thread, outside its loops
    pq = npq - n * PQ
    p = pq // Q
    q = pq - p * Q
    h0 = p * sh - ph
    w0 = q * sw - pw
    return n * CHW + h0 * W + w0, h0, w0

