"""Chapter 04's kernels: convolution as a matrix product, explicit (im2col + GEMM) and implicit.

A convolution of x (N, C, H, W) with filters w (K, C, R, S) into out (N, K, P, Q) is the GEMM

    out[k, (n, p, q)] = sum over (c, r, s) of  w[k, (c, r, s)] * X[(c, r, s), (n, p, q)]
        M = K rows          GEMM depth KD = C*R*S           columns NC = N*P*Q

where X[(c, r, s), (n, p, q)] = x[n, c, p*sh - ph + r*dh, q*sw - pw + s*dw] (0 outside the image).
The explicit path writes X to memory (im2col: R*S times the input) and runs a GEMM on it; the
implicit path runs the same GEMM but computes each X element's address when it loads the tile.

Every kernel here is what the chapter shows and what tests/test_ch04_implicit_gemm.py tests.
"""

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint32
from numpy.lib.stride_tricks import sliding_window_view

from workbook import ON_GPU
from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache
from workbook.memory import (aligned, atomic_add4, load4, shared_load4, shared_store4, store4,
                             vector_atomics)

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
def _device_table(g):
    return cuda.to_device(offset_table(g))  # cached: a host-to-device copy per launch would be timed


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
    rows = -(-g.gemm_depth // TABLE_ALIGN) * TABLE_ALIGN
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
def _device_tap_table(g):
    return cuda.to_device(tap_table(g).reshape(-1))  # flat: entries are read 16 bytes at a time


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


# ---------------------------------------------------------------------------------------------
# Naive, part 1: im2col. A 2-D grid: x over the N*P*Q columns (coalesced writes), y over rows.
# Each thread decodes its column once and writes it for rows blockIdx.y, + gridDim.y, ...
# Bytes: reads each input element up to R*S times (mostly from cache), WRITES 4*C*R*S*N*P*Q bytes,
# and the GEMM reads all of them back: R*S times the input's size, twice over DRAM.

IM2COL_THREADS = 256 if ON_GPU else 32  # the simulator runs a Python thread per CUDA thread
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


# ---------------------------------------------------------------------------------------------
# The GEMM tiling, shared by the explicit GEMM and the implicit convolution.
#
#   block tile: BM rows x BN columns of the output, marching over the depth in steps of BK
#
#            BK                  BN                       threads: TY x TX = (BM/TM) x (BN/TN)
#         +-----+         +-------------+                 thread (ty, tx) owns the TM x TN outputs
#      BM | A_s |  x   BK |     B_s     |                   rows ty + TY*i, columns tx + TX*j
#         +-----+         +-------------+                 (interleaved, so that a warp's 16 tx read
#     A tile stored transposed (BK, BM+pad):               16 consecutive words of B_s: no bank
#     a column of A is a row of A_s                        conflicts; its 2 ty read 2 broadcast words)
#
# Per step of the depth each thread reads TM + TN words of shared memory and does TM*TN FMAs:
# 8x8 -> 16 loads for 64 FMAs. The tile comes from global memory once per block: the arithmetic
# intensity is BM*BN*2 FLOPs per (BM+BN)*4 bytes per depth step = 32 FLOP/byte at 128x128.
#
# Double buffering: the global loads of step k+1 are issued into registers before step k's FMAs,
# so their latency hides behind the arithmetic; after the FMAs the registers go to the other
# shared buffer. One syncthreads per step suffices (see the loop).


@dataclass(frozen=True)
class Tile:
    BM: int  # block tile rows (output channels K)
    BN: int  # block tile columns (N*P*Q)
    BK: int  # depth step (C*R*S)
    TM: int  # outputs per thread, rows
    TN: int  # outputs per thread, columns
    min_blocks: int = 1  # launch bound: blocks per SM the compiler must fit (caps registers)
    wide: bool = False  # 16-byte shared loads of the fragments (and 16-byte global loads when it can)
    warp_columns: int = 0  # a warp's 32 threads cover (32 / warp_columns) x warp_columns of the
    #                        TY x TX thread grid (0: min(TX, 32), whole rows of the grid)
    prefetch: bool = False  # load the fragments of row kk + 1 of the tile before row kk's FMAs

    @property
    def threads(self):
        return (self.BM // self.TM) * (self.BN // self.TN)

    def __str__(self):
        return f"{self.BM}x{self.BN}x{self.BK}, {self.TM}x{self.TN}/thread"


# On the GPU: 256 threads, 8x8 outputs each. In the simulator (a Python thread per CUDA thread),
# 64 threads of 2x4 (and 32 of 2x2): the same code, small enough to run in seconds.
GPU_TILES = {
    "128x128": Tile(128, 128, 8, 8, 8, min_blocks=2),  # 2 blocks of 8 warps per SM: <= 128 registers
    "128x128, BK=16": Tile(128, 128, 16, 8, 8),  # half the syncthreads per FMA; 1 block per SM
    "64x128": Tile(64, 128, 8, 4, 8, min_blocks=2),  # K = 64 fills it
    "64x64": Tile(64, 64, 8, 4, 4, min_blocks=3),  # 4x the blocks: for layers with few columns
    # The optimized step: fragments read 16 bytes at a time (4 shared loads per 64 FMAs instead of
    # 16), tiles loaded from global memory 16 bytes at a time where the shapes allow, and (prefetch)
    # the next row's fragments loaded while this row's FMAs run.
    "128x128 wide": Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True),
    "128x128 wide, prefetch": Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True, prefetch=True),
    "128x128 wide, prefetch, BK=16": Tile(128, 128, 16, 8, 8, min_blocks=2, wide=True, prefetch=True),
    "64x128 wide, prefetch": Tile(64, 128, 8, 4, 8, min_blocks=2, wide=True, prefetch=True),
    "64x64 wide, prefetch": Tile(64, 64, 8, 4, 4, min_blocks=3, wide=True, prefetch=True),
    # 128 threads of 8x16 (or 16x8) outputs: 128 FMAs per 6 shared loads instead of 64 per 4, and
    # 2 x 128 threads per SM leave up to 255 registers to each: no spills, BK = 16 affordable.
    "128x128 wide, 8x16/thread, BK=16": Tile(128, 128, 16, 8, 16, min_blocks=2, wide=True, prefetch=True),
    "128x128 wide, 16x8/thread, BK=16": Tile(128, 128, 16, 16, 8, min_blocks=2, wide=True, prefetch=True),
    # 256 threads of 16x8, one block of 8 warps per SM: the B tile serves twice the rows, so a
    # thread gathers 4 B elements per 1,024 FMAs where the 128x128 tile gathers 16 per 2,048. BK = 8
    # keeps the tiles (24 KB) and the implicit GEMM's table (12 KB) under the 48 KB of static shared
    # memory; the price is a barrier per 1,024 FMAs that 8 warps wait at with no second block to run.
    "256x128 wide, 16x8/thread": Tile(256, 128, 8, 16, 8, min_blocks=1, wide=True, prefetch=True),
}
SIM_TILES = {"16x32": Tile(16, 32, 4, 2, 4), "8x16": Tile(8, 16, 4, 2, 2),
             "16x32 wide, prefetch": Tile(16, 32, 8, 4, 4, wide=True, prefetch=True),
             # more threads than columns, as in the 256x128 tile: each B column gathered by two
             "32x16 wide, prefetch": Tile(32, 16, 8, 4, 4, wide=True, prefetch=True)}
TILES = GPU_TILES if ON_GPU else SIM_TILES
DEFAULT_TILE = next(iter(TILES.values()))


# numba gives every signed index a test "if i < 0: i += length" (Python's negative indexing): 5
# instructions on 64-bit ints. Indices known to be >= 0 are cast to unsigned, which skips it; and
# LLVM then folds a thread's stores into a shared tile to one address plus constant offsets (the
# 8x16 tile's stores: 69 instructions per step fewer in the GEMM, 155 in the implicit kernel).
U64 = np.uint64


_made = {}  # tile -> {(quads, quad_outputs, tap_field, table_words): its two kernels}, for resources()


@lru_cache(maxsize=None)
def make_kernels(tile, quads=False, quad_outputs=False, tap_field=0, table_words=0):
    """Compile-time tile sizes -> (gemm_kernel, implicit_conv_kernel) with that tiling.

    quads: the GEMM kernel loads its A and B tiles from global memory 16 bytes at a time (load4);
    the caller checked that the rows of a and b are whole, 16-byte aligned quads.
    quad_outputs: a wide tile writes its outputs 16 bytes at a time (store4, atomic_add4); the caller
    checked that PQ % 4 == 0, that c is 16-byte aligned, and that the GPU has vector atomics.
    tap_field: the implicit GEMM's table format, tap_field(g): R*S for packed entries (one 32-bit
    word per row, a 32-bit on_image mask), 0 for (offset, tap) pairs (a 64-bit mask).
    table_words: the implicit GEMM copies its table into a shared array of this many words (at
    least the table's length; see shared_table_words), or reads it from global memory if 0.
    """
    BM, BN, BK, TM, TN = tile.BM, tile.BN, tile.BK, tile.TM, tile.TN
    TY, TX = BM // TM, BN // TN
    THREADS = TY * TX
    # A thread's outputs come in groups of G adjacent rows and G adjacent columns: G = 1 is the
    # interleaved layout drawn above; G = 4 (a wide tile) lets one ld.shared.v4 read 4 of its
    # A values and one 4 of its B values.
    G = 4 if tile.wide else 1
    V = 4 if quads else 1  # elements per global load of the GEMM's tile loader
    if THREADS % BK or THREADS % BN or (BM * BK) % THREADS or (BK * BN) % THREADS:
        raise ValueError(f"tile {tile}: every thread must load whole rows of the A and B tiles")
    if quad_outputs and not tile.wide:
        raise ValueError(f"tile {tile}: only a wide tile writes its outputs in quads")
    if TM % G or TN % G or (BM * BK) % (V * THREADS) or (BK * BN) % (V * THREADS) or BK % V or (tile.prefetch and BK % 2):
        raise ValueError(f"tile {tile}: a wide tile needs TM, TN, BK multiples of 4 and whole quads per thread; "
                         "prefetch an even BK")
    if tile.prefetch and not tile.wide:
        raise ValueError(f"tile {tile}: prefetch reads 16-byte fragments (load_fragment_quads): it needs a wide tile")
    PREFETCH = tile.prefetch
    TapWord = np.uint32 if tap_field else np.uint64  # the on_image mask
    FIELD = np.uint32(tap_field)
    WARP_TX = tile.warp_columns or min(TX, 32)
    WARPS_ACROSS = TX // WARP_TX  # warps side by side along a row of the thread grid
    if 32 % WARP_TX or TX % WARP_TX or (THREADS >= 32 and TY % (32 // WARP_TX)):
        raise ValueError(f"tile {tile}: a warp's {32 // WARP_TX} x {WARP_TX} threads must tile the "
                         f"{TY} x {TX} thread grid")
    A_LOADS, A_STEP = BM * BK // THREADS, THREADS // BK  # A tile elements per thread, row stride
    B_LOADS, B_STEP = BK * BN // THREADS, THREADS // BN
    A_QUADS, A_QUAD_STEP = A_LOADS // V, THREADS * V // BK  # the same, one quad per load
    B_QUADS, B_QUAD_STEP = B_LOADS // V, THREADS * V // BN
    SHARED_TABLE = table_words > 0
    TABLE_WORDS = max(table_words, 4)
    load_table_quad = shared_load4 if SHARED_TABLE else load4
    # The implicit GEMM gathers its next B tile after SPLIT of the BK rows of FMAs (an even number
    # with PREFETCH, which multiplies rows in pairs), not right after the barrier: see the kernel.
    SPLIT = 2 * (BK // 4) if PREFETCH else BK // 2
    ROW_WORDS = 1 if tap_field else 2  # the implicit GEMM's table words per GEMM row
    ENTRY_WORDS = ROW_WORDS * B_LOADS  # and for the B rows a thread gathers in one step
    ENTRY_QUADS = ENTRY_WORDS % 4 == 0 and ROW_WORDS * BK % 4 == 0  # whole, 16-byte aligned quads
    # A_s row padding: a warp stores 32/BK consecutive rows of A into BK rows of A_s; a row pitch of
    # BM + 32/BK words puts those 32 stores into 32 different banks. A wide tile reads A_s rows 16
    # bytes at a time, so its pitch stays a multiple of 4 words.
    A_PITCH = BM + max(G, 32 // BK)
    options, inline = {"fastmath": True}, {"device": True}
    if ON_GPU:  # the simulator's jit knows no launch bounds, nor inlining
        options["launch_bounds"] = (THREADS, tile.min_blocks)
        # The helpers below take the thread's register arrays: inlined into the kernel (NVVM IR
        # level), their constant indices let LLVM keep the arrays in registers.
        inline["forceinline"] = True

    @cuda.jit(**inline)
    def load_fragments(a_s, b_s, buf, kk, ty, tx, ra, rb, slot):
        """This thread's TM values of A_s row kk and TN values of B_s row kk into ra[slot], rb[slot]."""
        if G == 1:
            # Views starting at this thread's first word: the loads below have constant offsets
            # from one address per kk, not one 64-bit sum per load.
            a_k = a_s[buf, kk, ty:]
            b_k = b_s[buf, kk, tx:]
            for i in range(TM):
                ra[slot, i] = a_k[TY * i]  # a warp reads 2 broadcast words
            for j in range(TN):
                rb[slot, j] = b_k[TX * j]  # a warp reads 16 consecutive words: no bank conflict
        else:
            a_k, b_k = fragment_starts(buf, kk, ty, tx)
            load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, slot)

    @cuda.jit(**inline)
    def fragment_starts(buf, kk, ty, tx):
        """Flat indices of this thread's first A_s and B_s words in row kk of buffer buf (a wide tile)."""
        return U64((buf * BK + kk) * A_PITCH + 4 * ty), U64((buf * BK + kk) * BN + 4 * tx)

    @cuda.jit(**inline)
    def load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, slot):
        """A wide tile's load_fragments, from the flat indices of this thread's first A_s and B_s
        words of the row: 16 bytes per load, TM/4 + TN/4 shared loads instead of TM + TN."""
        for i in range(TM // 4):
            (ra[slot, 4 * i], ra[slot, 4 * i + 1],
             ra[slot, 4 * i + 2], ra[slot, 4 * i + 3]) = shared_load4(a_s, a_k + U64(4 * TY * i))
        for j in range(TN // 4):
            (rb[slot, 4 * j], rb[slot, 4 * j + 1],
             rb[slot, 4 * j + 2], rb[slot, 4 * j + 3]) = shared_load4(b_s, b_k + U64(4 * TX * j))

    @cuda.jit(**inline)
    def rank1_update(acc, ra, rb, slot):
        for i in range(TM):
            for j in range(TN):
                acc[i, j] += ra[slot, i] * rb[slot, j]

    @cuda.jit(**inline)
    def multiply_tile(a_s, b_s, buf, first_row, rows, ty, tx, ra, rb, acc):
        """acc += A_s[buf] x B_s[buf] over the tile's rows first_row .. first_row + rows - 1 (all
        BK of them in the GEMM): rank-1 updates of this thread's TM x TN outputs. The kernels pass
        constants: once inlined, the loop counts are known.

        With PREFETCH, the fragments of row kk + 1 are loaded before row kk's FMAs, into the other
        half of ra and rb, so that the FMAs need not wait for the shared loads (16 more registers).
        The loop is unrolled by two by hand: NVVM does not unroll it (512 FMAs), and an array
        indexed by a variable cannot live in registers. Its overhead is paid per 2*TM*TN FMAs, so it
        is kept small: the last pair is peeled off (no "is there a next row" test inside), the
        fragments' indices move on by two rows per trip (not recomputed from buf and kk), and the
        trips are counted in 32 bits (numba's range counts in 64): 10 instructions per 256 FMAs
        instead of 19 (SASS of the 8x16 tile)."""
        if not PREFETCH:
            for kk in range(first_row, first_row + rows):
                load_fragments(a_s, b_s, buf, kk, ty, tx, ra, rb, 0)
                rank1_update(acc, ra, rb, 0)
        else:
            a_k, b_k = fragment_starts(buf, first_row, ty, tx)
            load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, 0)
            pair = np.uint32(0)
            while pair < np.uint32(rows // 2 - 1):
                load_fragment_quads(a_s, b_s, a_k + U64(A_PITCH), b_k + U64(BN), ra, rb, 1)
                rank1_update(acc, ra, rb, 0)
                a_k += U64(2 * A_PITCH)
                b_k += U64(2 * BN)
                load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, 0)
                rank1_update(acc, ra, rb, 1)
                pair += np.uint32(1)
            load_fragment_quads(a_s, b_s, a_k + U64(A_PITCH), b_k + U64(BN), ra, rb, 1)
            rank1_update(acc, ra, rb, 0)
            rank1_update(acc, ra, rb, 1)

    @cuda.jit(**inline)
    def thread_position(t):
        """(tx, ty) of thread t in the TY x TX grid: each warp a (32 / WARP_TX) x WARP_TX patch of it."""
        warp, lane = t // 32, t % 32
        return ((warp % WARPS_ACROSS) * WARP_TX + lane % WARP_TX,
                (warp // WARPS_ACROSS) * (32 // WARP_TX) + lane // WARP_TX)

    @cuda.jit(**inline)
    def output_row(i, ty):  # the tile row of this thread's i-th register row
        return (i // G) * (G * TY) + G * ty + i % G

    @cuda.jit(**inline)
    def output_column(j, tx):
        return (j // G) * (G * TX) + G * tx + j % G

    @cuda.jit(**inline)
    def load_a_tile(a, row0, k0, t, next_a):
        """The A tile of depth step k0 into registers: zeros past the matrix's edges."""
        M, KD = a.shape
        if V == 1:
            ak, am = t % BK, t // BK  # A[row0 + am + A_STEP*l, k0 + ak]: a warp reads 4 rows of 32 bytes
            for l in range(A_LOADS):
                m = row0 + am + A_STEP * l
                next_a[l] = a[U64(m), U64(k0 + ak)] if m < M and k0 + ak < KD else float32(0)
        else:
            ak, am = V * (t % (BK // V)), t // (BK // V)  # a quad A[m, k0+ak .. k0+ak+3]
            for l in range(A_QUADS):
                m = row0 + am + A_QUAD_STEP * l
                quad = (float32(0), float32(0), float32(0), float32(0))
                if m < M and k0 + ak < KD:  # KD % 4 == 0: the quad is whole
                    quad = load4(a, U64(m) * U64(KD) + U64(k0 + ak))
                next_a[4 * l], next_a[4 * l + 1], next_a[4 * l + 2], next_a[4 * l + 3] = quad

    @cuda.jit(**inline)
    def store_a_tile(a_s, buf, t, next_a):  # transposed: a_s[k, m] = A[m, k]
        if V == 1:
            ak, am = t % BK, t // BK
            for l in range(A_LOADS):
                a_s[U64(buf), U64(ak), U64(am + A_STEP * l)] = next_a[l]
        else:
            ak, am = V * (t % (BK // V)), t // (BK // V)
            for l in range(A_QUADS):
                for e in range(4):
                    a_s[U64(buf), U64(ak + e), U64(am + A_QUAD_STEP * l)] = next_a[4 * l + e]

    @cuda.jit(**inline)
    def load_b_tile(b, col0, k0, t, next_b):
        KD, NC = b.shape
        if V == 1:
            bk, bn = t // BN, t % BN  # B[k0 + bk + B_STEP*l, col0 + bn]: a warp reads 128 bytes
            for l in range(B_LOADS):
                k = k0 + bk + B_STEP * l
                next_b[l] = b[U64(k), U64(col0 + bn)] if k < KD and col0 + bn < NC else float32(0)
        else:
            bk, bn = t // (BN // V), V * (t % (BN // V))  # a warp reads 512 bytes of one row
            for l in range(B_QUADS):
                k = k0 + bk + B_QUAD_STEP * l
                quad = (float32(0), float32(0), float32(0), float32(0))
                if k < KD and col0 + bn < NC:  # NC % 4 == 0: the quad is whole
                    quad = load4(b, U64(k) * U64(NC) + U64(col0 + bn))
                next_b[4 * l], next_b[4 * l + 1], next_b[4 * l + 2], next_b[4 * l + 3] = quad

    @cuda.jit(**inline)
    def store_b_tile(b_s, buf, t, next_b):
        if V == 1:
            bk, bn = t // BN, t % BN
            for l in range(B_LOADS):
                b_s[U64(buf), U64(bk + B_STEP * l), U64(bn)] = next_b[l]
        else:
            bk, bn = t // (BN // V), V * (t % (BN // V))
            for l in range(B_QUADS):
                shared_store4(b_s, U64((buf * BK + bk + B_QUAD_STEP * l) * BN + bn),
                              (next_b[4 * l], next_b[4 * l + 1], next_b[4 * l + 2], next_b[4 * l + 3]))

    @cuda.jit(**inline)
    def load_tap_entries(table, k, entries):
        """The table entries of B rows k .. k + B_LOADS - 1 into entries (ENTRY_WORDS words), from
        the block's shared copy of the table (SHARED_TABLE) or from global memory.

        The same for the whole warp (a broadcast); the rows are consecutive, so their entries come
        16 bytes per load where they fill whole, aligned quads (ROW_WORDS * k a multiple of 4)."""
        if ENTRY_QUADS:
            for q in range(ENTRY_WORDS // 4):
                (entries[4 * q], entries[4 * q + 1],
                 entries[4 * q + 2], entries[4 * q + 3]) = load_table_quad(table, U64(ROW_WORDS * k + 4 * q))
        else:
            for e in range(ENTRY_WORDS):
                entries[e] = table[U64(ROW_WORDS * k + e)]

    @cuda.jit(**inline)
    def copy_table(taps_table, table_s, t):
        """The whole table into shared memory, 16 bytes per load and store (its length is a
        multiple of TABLE_ALIGN rows)."""
        for q in range(t, taps_table.size // 4, THREADS):
            e0, e1, e2, e3 = load4(taps_table, U64(4 * q))
            shared_store4(table_s, U64(4 * q), (e0, e1, e2, e3))

    @cuda.jit(**inline)
    def gather_b_tile(x, entries, base, on_image, next_b):
        """The B_LOADS rows of this thread's column whose table entries load_tap_entries put in
        `entries`, gathered from x: zeros off the image.

        x offsets are 32-bit (the wrapper checked that x has fewer than 2^31 elements): one 32-bit
        add, and the address is one multiply-add, x + 4 * offset."""
        for l in range(B_LOADS):
            if tap_field:  # packed: one AND tests the row's bit, one shift extracts its offset
                on = on_image & entries[l]
                offset = entries[l] >> FIELD
            else:  # pairs: the offset, and the tap's bit of a 64-bit mask
                offset = entries[2 * l]
                on = (on_image >> entries[2 * l + 1]) & TapWord(1)
            value = float32(0)
            if on:  # predicate: padding reads as zero
                value = x[U64(np.uint32(U64(base) + U64(offset)))]  # the 32-bit sum wraps to the offset
            next_b[l] = value

    @cuda.jit(**inline)
    def store_outputs(c, acc, row0, col0, ty, tx, M, NC, PQ, whole):
        """Epilogue: column -> (image n, position pq) of the NKPQ output. A tile whose depth was
        shared between blocks (not `whole`) adds its partial sums into c, which the host zeroed."""
        for j in range(TN):
            col = col0 + output_column(j, tx)
            if col < NC:
                n = col // PQ
                pq = col - n * PQ
                for i in range(TM):
                    m = row0 + output_row(i, ty)
                    if m < M:
                        if whole:
                            c[n, m, pq] = acc[i, j]
                        else:
                            cuda.atomic.add(c, (n, m, pq), acc[i, j])

    @cuda.jit(**inline)
    def store_output_quads(c, acc, row0, col0, ty, tx, M, NC, PQ, whole):
        """store_outputs 16 bytes at a time: a wide tile's 4 adjacent columns are 4 adjacent
        positions of one image (PQ % 4 == 0), stored with one st.global.v4 or, for a partial tile,
        added with one red.global.add.v4: a quarter of the atomics."""
        for jq in range(TN // 4):
            col = col0 + output_column(4 * jq, tx)
            if col < NC:  # NC % 4 == 0: the quad is whole
                n = col // PQ
                pq = col - n * PQ
                for i in range(TM):
                    m = row0 + output_row(i, ty)
                    if m < M:
                        index = (U64(n) * U64(M) + U64(m)) * U64(PQ) + U64(pq)
                        quad = (acc[i, 4 * jq], acc[i, 4 * jq + 1], acc[i, 4 * jq + 2], acc[i, 4 * jq + 3])
                        if whole:
                            store4(c, index, quad)
                        else:
                            atomic_add4(c, index, quad)

    epilogue = store_output_quads if quad_outputs else store_outputs

    @cuda.jit(**inline)
    def block_share(tiles, steps):
        """This block's share of the work: units [first, end) of the tiles * steps (tile, depth step)
        iterations, in order, split evenly over the grid's blocks."""
        share = (tiles * steps + cuda.gridDim.x - 1) // cuda.gridDim.x
        first = cuda.blockIdx.x * share
        return first, min(tiles * steps, first + share)

    @cuda.jit(**inline)
    def start_tile_run(unit, end, steps, tiles_across, acc):
        """At unit `unit` of a share ending at `end`: the depth steps [first, last) of the tile it
        falls in that this block runs, the tile's first row and column; the accumulators zeroed."""
        tile = unit // steps
        first = unit - tile * steps
        for i in range(TM):
            for j in range(TN):
                acc[i, j] = float32(0)
        return first, min(steps, first + end - unit), (tile // tiles_across) * BM, (tile % tiles_across) * BN

    @cuda.jit(**options)
    def gemm_kernel(a, b, PQ, c):
        """c[n, m, pq] = (a @ b)[m, n*PQ + pq]; a (M, KD), b (KD, NC), c (NC/PQ, M, PQ)."""
        M, KD = a.shape
        NC = b.shape[1]
        t = cuda.threadIdx.x
        tx, ty = thread_position(t)
        a_s = cuda.shared.array((2, BK, A_PITCH), float32)  # A tile, transposed: a_s[k, m]
        b_s = cuda.shared.array((2, BK, BN), float32)
        acc = cuda.local.array((TM, TN), float32)  # registers: indexed by unrolled constants only
        ra = cuda.local.array((2, TM), float32)  # this thread's fragments of A and B (two with PREFETCH)
        rb = cuda.local.array((2, TN), float32)
        next_a = cuda.local.array(A_LOADS, float32)  # the next tile, in flight
        next_b = cuda.local.array(B_LOADS, float32)
        tiles_across, steps = (NC + BN - 1) // BN, (KD + BK - 1) // BK
        unit, end = block_share(tiles_across * ((M + BM - 1) // BM), steps)
        while unit < end:  # one output tile's run of depth steps per trip (usually one or two trips)
            first, last, row0, col0 = start_tile_run(unit, end, steps, tiles_across, acc)
            load_a_tile(a, row0, first * BK, t, next_a)  # the first step (zeros past the edges)
            load_b_tile(b, col0, first * BK, t, next_b)
            # The steps are counted in 32 bits, as multiply_tile counts its trips: numba's range
            # counts in 64, and a step's 64-bit count, tests and buffer index cost 27 instructions
            # per step of the 16x8 tile (373 besides its 2,048 FMAs, now 346). A step index fits:
            # 2^32 steps of depth would be more than a GPU's memory holds.
            step, stop = np.uint32(first), np.uint32(last)
            while step < stop:
                buf = step & np.uint32(1)
                # Store step's tile into buffer `buf`. Every thread passed the syncthreads below
                # after it finished reading this buffer two steps ago: nobody is still reading it.
                store_a_tile(a_s, buf, t, next_a)
                store_b_tile(b_s, buf, t, next_b)
                cuda.syncthreads()
                step = np.uint32(step + np.uint32(1))  # the cast keeps the sum 32-bit
                if step < stop:  # issue the next step's global loads now; use them after the FMAs
                    load_a_tile(a, row0, step * np.uint32(BK), t, next_a)
                    load_b_tile(b, col0, step * np.uint32(BK), t, next_b)
                multiply_tile(a_s, b_s, buf, 0, BK, ty, tx, ra, rb, acc)
            epilogue(c, acc, row0, col0, ty, tx, M, NC, PQ, first == 0 and last == steps)
            unit += last - first
            cuda.syncthreads()  # the next tile's first store reuses a buffer: wait until all have read both

    @cuda.jit(**options)
    def implicit_conv_kernel(x, a, taps_table, H, W, PQ, Q, R, S, sh, sw, ph, pw, dh, dw, c):
        """gemm_kernel with b = im2col(x) never built: each B element is loaded from x directly.

        x: the input, flat; a: filters (K, C*R*S); taps_table: tap_table(); c: out (N, K, P*Q).
        """
        M, KD = a.shape
        NC = c.shape[0] * PQ
        CHW = x.size // c.shape[0]
        t = cuda.threadIdx.x
        tx, ty = thread_position(t)
        a_s = cuda.shared.array((2, BK, A_PITCH), float32)
        b_s = cuda.shared.array((2, BK, BN), float32)
        acc = cuda.local.array((TM, TN), float32)
        ra = cuda.local.array((2, TM), float32)
        rb = cuda.local.array((2, TN), float32)
        next_a = cuda.local.array(A_LOADS, float32)
        next_b = cuda.local.array(B_LOADS, float32)
        entries = cuda.local.array(ENTRY_WORDS, uint32)  # table entries of the B rows of a step
        table = taps_table
        if SHARED_TABLE:  # a copy per block, read once from global memory: entries in ~30 cycles
            table = cuda.shared.array(TABLE_WORDS, uint32)
            copy_table(taps_table, table, t)
            cuda.syncthreads()
        bk, bn = t // BN, t % BN  # this thread gathers B[k0 + bk*B_LOADS + l, col0 + bn], l < B_LOADS
        tiles_across, steps = (NC + BN - 1) // BN, (KD + BK - 1) // BK
        unit, end = block_share(tiles_across * ((M + BM - 1) // BM), steps)
        while unit < end:
            first, last, row0, col0 = start_tile_run(unit, end, steps, tiles_across, acc)
            # This thread's B column (n, p, q) is fixed for the tile: decode it once, and note which
            # of the R*S filter taps fall on the image for it (bit r*S + s). Columns past the end:
            # no tap.
            base, h0, w0 = column_origin(col0 + bn, PQ, Q, sh, sw, ph, pw, W, CHW)
            base = np.uint32(base & 0xFFFFFFFF)  # negative at a padded corner: mod 2^32, as the sum wraps
            on_image = 0
            if col0 + bn < NC:
                for r in range(R):
                    for s in range(S):
                        h, w = h0 + r * dh, w0 + s * dw
                        if h >= 0 and h < H and w >= 0 and w < W:
                            on_image |= 1 << (r * S + s)
            on_image = TapWord(on_image)

            load_a_tile(a, row0, first * BK, t, next_a)
            load_tap_entries(table, first * BK + bk * B_LOADS, entries)
            gather_b_tile(x, entries, base, on_image, next_b)
            step, stop = np.uint32(first), np.uint32(last)  # in 32 bits, as in gemm_kernel
            while step < stop:
                buf = step & np.uint32(1)
                store_a_tile(a_s, buf, t, next_a)
                for l in range(B_LOADS):
                    b_s[U64(buf), U64(bk * B_LOADS + l), U64(bn)] = next_b[l]
                cuda.syncthreads()
                # The next step's loads go between two halves of the FMAs, not right after the
                # barrier: there the 4 warps of a block would all issue their gathers' chains
                # (entry, test, offset, address, load) at once, with nothing to overlap them.
                multiply_tile(a_s, b_s, buf, 0, SPLIT, ty, tx, ra, rb, acc)
                step = np.uint32(step + np.uint32(1))
                if step < stop:
                    load_a_tile(a, row0, step * np.uint32(BK), t, next_a)
                    load_tap_entries(table, step * np.uint32(BK) + bk * B_LOADS, entries)
                    gather_b_tile(x, entries, base, on_image, next_b)
                # A fence for the scheduler, not for the data: in this loop ptxas would sink the
                # loads below the second half's FMAs on some tiles (64x128: to the end of the step,
                # where nothing hides their latency; 0.285 ms instead of 0.233 on the 64-channel
                # layer). Memory accesses do not cross a syncwarp, so they stay above it.
                cuda.syncwarp()
                multiply_tile(a_s, b_s, buf, SPLIT, BK - SPLIT, ty, tx, ra, rb, acc)
            epilogue(c, acc, row0, col0, ty, tx, M, NC, PQ, first == 0 and last == steps)
            unit += last - first
            cuda.syncthreads()

    # The helpers, for the chapter to show (the kernels call them; nothing else does)
    gemm_kernel.parts = {"load_fragments": load_fragments, "multiply_tile": multiply_tile,
                         "output_row": output_row, "load_b_tile": load_b_tile, "block_share": block_share,
                         "store_output_quads": store_output_quads}
    _made.setdefault(tile, {})[quads, quad_outputs, tap_field, table_words] = (gemm_kernel, implicit_conv_kernel)
    return gemm_kernel, implicit_conv_kernel


# ---------------------------------------------------------------------------------------------
# Host wrappers: check the arguments, size the grid, launch.


# Sharing the work. A GEMM with few output tiles leaves SMs idle: the 14x14 layer with C = K = 256
# has 49 x 2 tiles of 128x128 for 132 SMs that hold 2 blocks each (98 of 264 places). The kernels
# see their work as tiles x steps (output tile, depth step) iterations in a row, and each block takes
# an equal, consecutive share of it (`block_share`), so the host chooses how many blocks there are:
#
#   one per tile              a block runs all the depth steps of its tile, stores it: no atomics
#   splits = S                S blocks per tile (split-K): each runs 1/S of the depth
#   splits = "stream"         stream-K: one block per place the SMs hold, each with 1/264 of ALL
#                             the iterations, crossing from one tile into the next where its share
#                             does; every SM busy until the end, whatever the tile count
#
# A block that ran only part of a tile's depth adds its partial sums into the output with atomics,
# so the output must start at zero: one more, tiny, launch. Without a choice the wrappers take one
# block per tile when the tiles fill the machine's waves to within MIN_GAIN, stream-K otherwise.

MAX_SPLITS = 8
MIN_STEPS_PER_BLOCK = 16  # depth steps: below that a block is all prologue and epilogue
MIN_GAIN = 0.1


def split_count(tile, rows, columns, depth):
    """The wrappers' choice when given no `splits`: 1 (a block per output tile) if the `rows x columns`
    tiles fill this GPU's waves to within MIN_GAIN, else "stream" (stream-K)."""
    tiles = math.ceil(columns / tile.BN) * math.ceil(rows / tile.BM)
    places = sm_count() * tile.min_blocks  # blocks resident at once, by the launch bound
    filled = tiles / (math.ceil(tiles / places) * places)  # the fraction of the waves' places in use
    if filled >= 1 - MIN_GAIN or math.ceil(depth / tile.BK) < 2 * MIN_STEPS_PER_BLOCK:
        return 1
    return "stream"


def grid_blocks(tile, rows, columns, depth, splits):
    """How many blocks share the tiles x steps iterations for this `splits`."""
    tiles, steps = math.ceil(columns / tile.BN) * math.ceil(rows / tile.BM), math.ceil(depth / tile.BK)
    if splits == "stream":
        return min(sm_count() * tile.min_blocks, math.ceil(tiles * steps / MIN_STEPS_PER_BLOCK))
    return tiles * splits


@cuda.jit
def zero_kernel(values):
    for i in range(cuda.grid(1), values.size, cuda.gridsize(1)):
        values[i] = float32(0)


# Launches prepared once per set of buffers (chapter 07): the views and the ~20 arguments of a
# convolution are typed and packed the first time only.
_launches = LaunchCache()


def _launch_gemm(kernel, tile, rows, columns, depth, splits, c3, *args, stream=0):
    """Launch `kernel(*args, c3)` with `splits` (None: split_count's choice); returns the splits used."""
    if splits is None:
        splits = split_count(tile, rows, columns, depth)
    elif splits != "stream" and (not isinstance(splits, (int, np.integer)) or not 1 <= splits <= MAX_SPLITS):
        raise ValueError(f'splits must be an int from 1 to {MAX_SPLITS} or "stream", not {splits!r}')
    blocks = grid_blocks(tile, rows, columns, depth, splits)
    steps = math.ceil(depth / tile.BK)
    share = math.ceil(math.ceil(columns / tile.BN) * math.ceil(rows / tile.BM) * steps / blocks)
    if share % steps:  # some tile's depth is shared between blocks: their partial sums add up in c
        flat = c3.reshape(-1)
        _launches.launch(zero_kernel, min(sm_count() * 8, math.ceil(flat.size / 256)), 256, (flat,), stream=stream)
    _launches.launch(kernel, blocks, tile.threads, (*args, c3), stream=stream)
    return splits


# The implicit GEMM's table in shared memory: its size is fixed when the kernel is compiled, so
# tables are given room in steps of SHARED_TABLE_STEP words (one kernel per step, not per depth);
# a table larger than SHARED_TABLE_WORDS (12 KB: C*R*S up to 3072 packed rows, e.g. 341 channels
# of a 3x3 filter) stays in global memory, where every block reads it through L1 (the gathers then
# wait for their entries: slower, still right). 12 KB keeps the largest tile (33 KB of tiles)
# under the 48 KB of static shared memory a block may declare.
SHARED_TABLE_STEP = 1024
SHARED_TABLE_WORDS = 3072


def shared_table_words(table_words):
    """The room the implicit GEMM gives a table of table_words words in shared memory; 0: none."""
    if table_words > SHARED_TABLE_WORDS:
        return 0
    return -(-table_words // SHARED_TABLE_STEP) * SHARED_TABLE_STEP


def _tile(tile):
    if tile is None:
        return DEFAULT_TILE
    if isinstance(tile, str):
        if tile not in TILES:
            raise ValueError(f"unknown tile {tile!r}; have {list(TILES)}")
        return TILES[tile]
    if not isinstance(tile, Tile):
        raise TypeError(f"tile must be a Tile or one of {list(TILES)}, not {type(tile).__name__}")
    return tile


def gemm(a, b, c, *, tile=None, splits=None, stream=0):
    """c = a @ b, float32, with the chapter's tiled GEMM; a (M, KD), b (KD, NC), c (M, NC).

    tile: a name in TILES or a Tile (None: the first); splits: blocks per output tile (split-K), or
    "stream" (stream-K), or None (split_count's choice);
    stream: where the launches go (0: the default stream).
    """
    a = require(a, "a", dtype=np.float32, ndim=2)
    b = require(b, "b", dtype=np.float32, ndim=2)
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    c = require(c, "c", dtype=np.float32, shape=(a.shape[0], b.shape[1]))
    tile = _tile(tile)
    gemm_kernel, _ = make_kernels(tile, _quads(tile, a, b), _quad_outputs(tile, c, b.shape[1]))
    _launch_gemm(gemm_kernel, tile, a.shape[0], b.shape[1], a.shape[1], splits, c.reshape(1, *c.shape),
                 a, b, b.shape[1], stream=stream)
    return c


def _tile_takes_quads(tile):
    per_thread = 4 * tile.threads
    return tile.wide and (tile.BM * tile.BK) % per_thread == 0 and (tile.BK * tile.BN) % per_thread == 0


def _quads(tile, *matrices):
    """Can a wide tile load these row-major matrices from global memory 16 bytes at a time? Every
    row a whole number of quads, the first element 16-byte aligned, and a whole number of quads per
    thread in each tile (else: 4-byte loads)."""
    return (_tile_takes_quads(tile) and all(m.shape[1] % 4 == 0 and aligned(m) for m in matrices))


def _quad_outputs(tile, out, PQ):
    """Can a wide tile write `out` 16 bytes at a time? Its 4 adjacent columns must be 4 positions
    of one image (PQ % 4 == 0), the output 16-byte aligned, and the GPU have vector atomics."""
    return tile.wide and PQ % 4 == 0 and aligned(out) and _vector_atomics()


@lru_cache(maxsize=None)
def _vector_atomics():
    # The simulator has them (workbook.memory), so that they are checked on a laptop too.
    return vector_atomics(cuda.get_current_device().compute_capability) if ON_GPU else True


def _conv_args(x, w, out, stride, padding, dilation):
    x = require(x, "x", dtype=np.float32, ndim=4)
    w = require(w, "w", dtype=np.float32, ndim=4)
    g = conv_geometry(x.shape, w.shape, stride, padding, dilation)
    out = require(out, "out", dtype=np.float32, shape=g.out_shape)
    return x, w, out, g


def im2col(x, g, col):
    """Write the column matrix of x for geometry g into col (C*R*S, N*P*Q)."""
    x = require(x, "x", dtype=np.float32, shape=(g.N, g.C, g.H, g.W))
    col = require(col, "col", dtype=np.float32, shape=(g.gemm_depth, g.gemm_columns))
    blocks = (math.ceil(g.gemm_columns / IM2COL_THREADS), min(g.gemm_depth, IM2COL_ROW_BLOCKS))
    _launches.launch(im2col_kernel, blocks, IM2COL_THREADS, (x.reshape(-1), _device_table(g), g.H, g.W, g.C * g.H * g.W,
                                                             g.P * g.Q, g.Q, g.sh, g.sw, g.ph, g.pw, col))
    return col


def conv2d_explicit(x, w, out, *, stride=1, padding=0, dilation=1, workspace=None, tile=None,
                    splits=None):
    """The naive way: im2col into `workspace` (allocated if None), then the tiled GEMM."""
    x, w, out, g = _conv_args(x, w, out, stride, padding, dilation)
    if workspace is None:
        workspace = cuda.device_array((g.gemm_depth, g.gemm_columns), dtype=np.float32)
    col = im2col(x, g, workspace)
    tile = _tile(tile)
    a = w.reshape(g.K, g.gemm_depth)
    gemm_kernel, _ = make_kernels(tile, _quads(tile, a, col), _quad_outputs(tile, out, g.P * g.Q))
    _launch_gemm(gemm_kernel, tile, g.K, g.gemm_columns, g.gemm_depth, splits,
                 out.reshape(g.N, g.K, g.P * g.Q), a, col, g.P * g.Q)
    return out


def conv2d_implicit(x, w, out, *, stride=1, padding=0, dilation=1, workspace=None, tile=None,
                    splits=None, stream=0):
    """Implicit GEMM: the same tiling, B tiles gathered from x through the tap table.

    `workspace` is accepted (and ignored) so that both paths share one calling convention.
    """
    x, w, out, g = _conv_args(x, w, out, stride, padding, dilation)
    if g.R * g.S > MAX_TAPS:
        raise ValueError(f"implicit GEMM supports filters of at most {MAX_TAPS} taps (R*S), "
                         f"not {g.R}x{g.S}; use conv2d_explicit")
    if x.size >= 2**31:
        raise ValueError(f"implicit GEMM indexes x with 32-bit offsets: x has {x.size} elements, "
                         "at most 2^31 - 1; use conv2d_explicit or a smaller batch")
    tile = _tile(tile)
    a = w.reshape(g.K, g.gemm_depth)
    # quads: the A tile (filters) only; B is gathered element by element
    table = _device_tap_table(g)
    _, implicit_conv_kernel = make_kernels(tile, _quads(tile, a), _quad_outputs(tile, out, g.P * g.Q), tap_field(g),
                                           shared_table_words(table.size))
    _launch_gemm(implicit_conv_kernel, tile, g.K, g.gemm_columns, g.gemm_depth, splits,
                 out.reshape(g.N, g.K, g.P * g.Q), x.reshape(-1), a,
                 table, g.H, g.W, g.P * g.Q, g.Q, g.R, g.S, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw,
                 stream=stream)
    return out


# ---------------------------------------------------------------------------------------------
# Picking a tile, and what a tile costs the SM.


def fastest_tile(run, repeats=7):
    """(name, {name: median ms}): the tile in TILES for which run(name) is fastest here.

    A library does the same per shape (cuBLAS heuristics, cuDNN's benchmark mode): the best tile
    depends on the shape, e.g. a 128-row tile wastes half its work when K = 64. In the simulator,
    where times mean nothing: the first tile, and no times.
    """
    if not ON_GPU:
        return next(iter(TILES)), {}
    from workbook import bench

    candidates = {name: (lambda name=name: run(name)) for name in TILES}
    for function in candidates.values():
        function()  # compile and warm up
    times = bench.time_interleaved(candidates, repeats=repeats)
    medians = {name: float(np.median(ms)) for name, ms in times.items()}
    return min(medians, key=medians.get), medians


def resources(tile):
    """Registers per thread, local (spilled) bytes per thread, shared bytes per block, on a GPU:
    for each kernel made with this tile that has been compiled (launched)."""
    if not ON_GPU:
        return None
    usage = {}
    for (quads, quad_outputs, field, table_words), kernels in _made.get(_tile(tile), {}).items():
        for kernel in kernels:
            if not kernel.overloads:  # not compiled yet: nothing launched it
                continue
            compiled = next(iter(kernel.overloads.values()))  # one per argument types; all alike here
            name = kernel.py_func.__name__ + (", 16-byte global loads" if quads else "") + (
                ", 16-byte outputs" if quad_outputs else "")
            if kernel is kernels[1]:
                name += f", packed table ({field}-bit taps)" if field else ", table of pairs"
                name += f" in shared memory ({4 * table_words // 1024} KB)" if table_words else ""
            usage[name] = {"registers": compiled.regs_per_thread,
                           "local bytes": compiled.local_mem_per_thread,
                           "shared bytes": compiled.shared_mem_per_block}
    return usage
