"""The capstone's float16 kernels: what mixed precision adds to a step (mixed.py puts them together).

    to_half             float32 (N, C, HW) -> float16 (N, HW, Cp): a cast and a transpose to channels
                        last, the channels padded with zeros to Cp (chapter 09's convolution copies
                        16 bytes of channels at a time: Cp a multiple of 8). The linear layer's
                        operands, viewed as (N, C, 1) or (1, C, HW), go through it too.
    half_filters        the master weights (K, C, R, S) float32 -> float16 KRSC for the forward,
                        and turned and transposed (C, R, S, K) for the data gradient (cast_filters,
                        turn_filters, cast_matrix: the device functions, for one launch a step)
    wgrad_half          the weight gradient on tensor cores (mma.sync FP16, FP32 accumulation),
                        split over the depth N*P*Q as layers.conv2d_wgrad is
    scale_to_half       a *= scale[0] (the loss scale, read on the GPU), and a float16 copy

Every kernel here is what the notebook shows and what tests/test_ch08_mixed.py tests.
"""


import numpy as np
from numba import cuda, float32, int32, uint32

from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, cdiv
from workbook.tensor_cores import cp_async16, ldmatrix_x4_trans, make_mainloop, mma_f16

from chapters.ch04_implicit_gemm.kernels import conv_geometry

from .layers import THREADS, _elementwise_blocks

CHUNK = 8  # halves in 16 bytes: a cp.async, and the unit channels are padded to
_launches = LaunchCache()  # a step calls these wrappers with the same buffers each time (chapter 07)


def padded(channels):
    """Channels rounded up to a whole number of 16-byte chunks of float16."""
    return cdiv(channels, CHUNK) * CHUNK


# ---------------------------------------------------------------------------------------------
# Layout and precision. to_half is layers.transpose_kernel's tiled transpose, one image per
# blockIdx.z: a 32 x 32 tile read along HW and written along the channels, both coalesced.

TILE, ROWS = 32, 8  # a block of 32 x 8 threads moves a 32 x 32 tile
PITCH = TILE + 1  # a column of the shared tile falls on 32 banks
MAX_IMAGES = 65535  # blockIdx.z's limit


@cuda.jit
def to_half_kernel(src, dst):
    """dst[n, j, c] = float16(src[n, c, j]), 0 for the padding channels c >= C."""
    tile = cuda.shared.array((TILE, PITCH), float32)
    C, HW = src.shape[1], src.shape[2]
    Cp = dst.shape[2]
    tx, ty, n = cuda.threadIdx.x, cuda.threadIdx.y, cuda.blockIdx.z
    j0, c0 = cuda.blockIdx.x * TILE, cuda.blockIdx.y * TILE
    for i in range(ty, TILE, ROWS):
        c, j = c0 + i, j0 + tx
        if j < HW:
            tile[i, tx] = src[n, c, j] if c < C else float32(0)  # a warp reads 128 bytes of a plane
    cuda.syncthreads()
    for i in range(ty, TILE, ROWS):
        j, c = j0 + i, c0 + tx
        if j < HW and c < Cp:
            dst[n, j, c] = tile[tx, i]  # and writes 64 bytes of a pixel's channels


def to_half(src, dst, *, stream=0):
    """dst (N, HW, Cp) float16 = src (N, C, HW) float32 channels last, Cp >= C (zeros beyond C). An
    NCHW tensor is (N, C, H*W); a matrix (B, I) is (B, I, 1) as it is, (1, B, I) to transpose it."""
    src = require(src, "src", dtype=np.float32, ndim=3)
    dst = require(dst, "dst", dtype=np.float16, ndim=3)
    N, C, HW = src.shape
    if dst.shape[:2] != (N, HW) or dst.shape[2] < C:
        raise ValueError(f"dst must be ({N}, {HW}, Cp >= {C}) for src {tuple(src.shape)}, not {tuple(dst.shape)}")
    if N > MAX_IMAGES:
        raise ValueError(f"to_half takes at most {MAX_IMAGES} images a call (one per blockIdx.z), not {N}")
    blocks = (cdiv(HW, TILE), cdiv(dst.shape[2], TILE), N)
    _launches.launch(to_half_kernel, blocks, (TILE, ROWS), (src, dst), stream=stream)
    return dst


@cuda.jit(device=True)
def cast_filters(w, w16, first, stride):
    """w16[k, r, s, c] = w[k, c, r, s] in float16, zeros in the padding channels; elements first,
    first + stride, ... (a grid-stride loop's share)."""
    K, C, R, S = w.shape
    Cp = w16.shape[3]
    for i in range(first, w16.size, stride):
        c = i % Cp
        tap = (i // Cp) % (R * S)
        k = i // (Cp * R * S)
        w16[k, tap // S, tap % S, c] = w[k, c, tap // S, tap % S] if c < C else float32(0)


@cuda.jit(device=True)
def turn_filters(w, wt16, first, stride):
    """wt16[c, r, s, k] = w[k, c, R-1-r, S-1-s] in float16 (layers.conv2d_dgrad's turn), zeros in
    the padding channels."""
    K, C, R, S = w.shape
    Kp = wt16.shape[3]
    for i in range(first, wt16.size, stride):
        k = i % Kp
        tap = (i // Kp) % (R * S)
        c = i // (Kp * R * S)
        r, s = tap // S, tap % S
        wt16[c, r, s, k] = w[k, c, R - 1 - r, S - 1 - s] if k < K else float32(0)


@cuda.jit(device=True)
def cast_matrix(a, a16, a16_t, first, stride):
    """a16 = float16(a) and a16_t = its transpose, a (I, O)."""
    rows, cols = a.shape
    for i in range(first, a.size, stride):
        value = a[i // cols, i % cols]
        a16[i // cols, i % cols] = value
        a16_t[i % cols, i // cols] = value


@cuda.jit
def half_filters_kernel(w, w16, wt16, turned):
    first, stride = cuda.grid(1), cuda.gridsize(1)
    cast_filters(w, w16, first, stride)
    if turned:
        turn_filters(w, wt16, first, stride)


def half_filters(w, w16, wt16=None, *, stream=0):
    """The float16 filters of master weights w (K, C, R, S) float32: w16 (K, R, S, Cp) for the
    forward, and, if given, wt16 (C, R, S, Kp) for the data gradient (layers.conv2d_dgrad's turn)."""
    w = require(w, "w", dtype=np.float32, ndim=4)
    K, C, R, S = w.shape
    w16 = require(w16, "w16", dtype=np.float16, shape=(K, R, S, padded(C)))
    if wt16 is not None:
        wt16 = require(wt16, "wt16", dtype=np.float16, shape=(C, R, S, padded(K)))
    _launches.launch(half_filters_kernel, _elementwise_blocks(max(w16.size, 0 if wt16 is None else wt16.size)),
                     THREADS, (w, w16, w16 if wt16 is None else wt16, wt16 is not None), stream=stream)


@cuda.jit
def scale_to_half_kernel(a, scale, a16):
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        value = a[i] * scale[0]
        a[i] = value
        a16[i] = value  # Inf past 65504


def scale_to_half(a, scale, a16, *, stream=0):
    """a *= scale[0] in place (float32), and a16 = float16(a), same number of elements: the loss
    scale applied to the loss's gradient, which the float32 bias gradient and the float16 GEMMs
    both read."""
    a = require(a, "a", dtype=np.float32)
    scale = require(scale, "scale", dtype=np.float32, shape=(1,))
    a16 = require(a16, "a16", dtype=np.float16)
    if a16.size != a.size:
        raise ValueError(f"a16 must hold {a.size} elements as a does, not {a16.size}")
    _launches.launch(scale_to_half_kernel, _elementwise_blocks(a.size), THREADS,
                     (a.reshape(-1), scale, a16.reshape(-1)), stream=stream)
    return a16


# ---------------------------------------------------------------------------------------------
# The weight gradient on tensor cores:
#
#   dw[k, (r, s, c)] = sum over m = (n, p, q) of dy[m, k] * X[m, (r, s, c)]     X: the im2col of x
#
# a GEMM D = dy^T X whose depth is m. Both operands are channels last, so in shared memory a tile is
# rows of m, each row 16-byte chunks of k (dy) or of (r, s, c) (X, gathered from x as chapter 09's
# convolution gathers it: a chunk is 8 channels of one pixel, or zeros in the padding). The mma
# wants pairs along the depth, down those columns: ldmatrix's .trans hands them out, for A (dy^T)
# and for B (X) alike. Rows are padded by one chunk (pitch 5 or 9 chunks: odd), so the 8 rows an
# 8x8 matrix reads fall on 8 different groups of banks.
#
#   block: BM = 32 rows of k x BN = 64 columns of (r, s, c), 4 warps of 32 x 16 (2 x 2 mma tiles)
#   depth: BK = 64 positions a step, three stages (the next two steps' copies fly while this one
#          is multiplied), the blocks of blockIdx.z splitting the steps; partial tiles meet in dw by
#          atomics, straight into the master layout (K, C, R, S), padding channels dropped.

BM, BN, BK = 32, 64, 64
WARPS = 4
WGRAD_THREADS = 32 * WARPS
DY_PITCH, X_PITCH = BM + CHUNK, BN + CHUNK  # halves a row of each tile takes in shared memory
DY_STAGE, X_STAGE = BK * DY_PITCH, BK * X_PITCH
STAGES = 3  # steps in flight: 43 KB of shared memory
DY_TILES, X_TILES = STAGES * DY_STAGE, STAGES * X_STAGE  # numba sizes shared arrays from constants
DY_CHUNKS, X_CHUNKS = BM // CHUNK // 2, BN // CHUNK // 2  # a thread's chunks of its row: 2 of dy, 4 of X
A_REGISTERS, B_REGISTERS = 16, 8  # a warp's fragments of half a stage (two k16 slices), a thread's share
BLOCKS_PER_SM = 1  # blocks the depth split aims at per SM (2 measured slower on an H100: more atomics)


@cuda.jit(device=True)
def issue(operands, state, stage, step):
    """cp.async of this thread's share of step `step` of the block's slice (make_mainloop's issue):
    row `row` (a position m) of both tiles, half `half` of it (2 chunks of dy, 4 of X), zeros past
    the edges and in the padding. The position is decoded once for its 6 chunks; each X chunk's tap
    (r*dh, s*dw, c) was worked out before the loop."""
    x, dy, dy_s, x_s, M, Kp, H, W, Cp, PQ, Q, sh, sw, ph, pw, row, half, k0, taps, first, lane, wn = operands
    m = (first + step) * BK + row
    # unsigned 32-bit division: numba's signed // keeps Python's floor rounding, a dozen
    # instructions more, and a 64-bit one more still (positions are < 2^31: wgrad_half checks)
    n = uint32(m) // uint32(PQ)
    rest = uint32(m) - n * uint32(PQ)
    p = rest // uint32(Q)
    q = rest - p * uint32(Q)
    inside = m < M
    for e in range(DY_CHUNKS):
        k = k0 + CHUNK * e
        ok = inside and k < Kp
        cp_async16(dy_s, stage * DY_STAGE + row * DY_PITCH + (half * DY_CHUNKS + e) * CHUNK, dy,
                   m * Kp + k if ok else 0, 16 if ok else 0)
    top, left = int32(p) * sh - ph, int32(q) * sw - pw
    for e in range(X_CHUNKS):
        h, v = top + taps[0, e], left + taps[1, e]
        ok = inside and taps[2, e] >= 0 and 0 <= h and h < H and 0 <= v and v < W
        cp_async16(x_s, stage * X_STAGE + row * X_PITCH + (half * X_CHUNKS + e) * CHUNK, x,
                   ((n * H + h) * W + v) * Cp + taps[2, e] if ok else 0, 16 if ok else 0)
    return state


@cuda.jit(device=True)
def fragments(operands, stage, half, a, b):
    """The warp's fragments of half `half` of a stage: positions 32 half .. + 31, two k16 slices
    (make_mainloop's fragments). Lane L addresses row L % 8 of 8x8 matrix L / 8.
    A = dy^T (16 k x 16 m): matrices (k 0-7, m 0-7), (k 8-15, m 0-7), (k 0-7, m 8-15),
    (k 8-15, m 8-15), stored as rows of m; a[(2 slice + i) * 4 ..] its m16 tile i.
    B = X (16 m x 8 cols), two n8 tiles: (m 0-7, cols 0-7), (m 8-15, cols 0-7), then cols 8-15;
    b[4 slice ..]."""
    dy_s, x_s, lane, wn = operands[2], operands[3], operands[20], operands[21]
    matrix, row = lane >> 3, lane & 7
    for s in range(2):
        kk = 2 * half + s
        a_at = stage * DY_STAGE + (16 * kk + (matrix // 2) * 8 + row) * DY_PITCH + (matrix % 2) * 8
        b_at = stage * X_STAGE + (16 * kk + (matrix % 2) * 8 + row) * X_PITCH + wn + (matrix // 2) * 8
        regs = ldmatrix_x4_trans(x_s, b_at)
        for q in range(4):
            b[4 * s + q] = regs[q]
        for i in range(2):
            regs = ldmatrix_x4_trans(dy_s, a_at + 16 * i)
            for q in range(4):
                a[(2 * s + i) * 4 + q] = regs[q]


@cuda.jit(device=True)
def multiply(a, b, acc):
    """acc += A x B for the warp's 2 x 2 mma tiles over two k16 slices (make_mainloop's multiply)."""
    for s in range(2):
        for i in range(2):
            for j in range(2):
                base = (2 * i + j) * 4
                d = mma_f16((a[(2 * s + i) * 4], a[(2 * s + i) * 4 + 1], a[(2 * s + i) * 4 + 2], a[(2 * s + i) * 4 + 3]),
                            (b[4 * s + 2 * j], b[4 * s + 2 * j + 1]),
                            (acc[base], acc[base + 1], acc[base + 2], acc[base + 3]))
                for q in range(4):
                    acc[base + q] = d[q]


mainloop = make_mainloop(issue, fragments, multiply, STAGES)


@cuda.jit
def wgrad_half_kernel(x, dy, dw, H, W, Cp, PQ, Q, sh, sw, ph, pw, dh, dv, Kp):
    """dw (K, C, R, S) float32 += this block's slice of dy^T X. x: flat NHWC float16 with Cp
    channels; dy: flat (N*P*Q, Kp) float16."""
    K, C, R, S = dw.shape
    M = dy.size // Kp
    RSC = R * S * Cp
    dy_s = cuda.shared.array(DY_TILES, np.float16)
    x_s = cuda.shared.array(X_TILES, np.float16)
    acc = cuda.local.array(16, float32)
    a0, a1 = cuda.local.array(A_REGISTERS, uint32), cuda.local.array(A_REGISTERS, uint32)
    b0, b1 = cuda.local.array(B_REGISTERS, uint32), cuda.local.array(B_REGISTERS, uint32)
    for i in range(16):
        acc[i] = 0
    tid = cuda.threadIdx.x
    lane, wn = tid & 31, (tid >> 5) * 16
    row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
    row, half = tid >> 1, tid & 1  # this thread copies half of row `row` of each tile, every step
    taps = cuda.local.array((3, X_CHUNKS), int32)  # its X chunks' (r*dh, s*dw, c); c = -1 past RSC
    for e in range(X_CHUNKS):
        rsc = col0 + (half * X_CHUNKS + e) * CHUNK
        tap = uint32(rsc) // uint32(Cp)
        taps[0, e], taps[1, e] = (tap // uint32(S)) * dh, (tap % uint32(S)) * dv
        taps[2, e] = rsc - tap * Cp if rsc < RSC else -1
    k0 = row0 + half * DY_CHUNKS * CHUNK
    steps = (M + BK - 1) // BK
    per_slice = (steps + cuda.gridDim.z - 1) // cuda.gridDim.z
    first = cuda.blockIdx.z * per_slice
    last = min(steps, first + per_slice)
    mainloop((x, dy, dy_s, x_s, M, Kp, H, W, Cp, PQ, Q, sh, sw, ph, pw, row, half, k0, taps, first, lane, wn), 0,
             last - first, acc, a0, a1, b0, b1)
    g, t = lane >> 2, lane & 3
    for i in range(2):
        for j in range(2):
            for q in range(4):
                k = row0 + 16 * i + g + 8 * (q // 2)
                col = col0 + wn + 8 * j + 2 * t + q % 2
                tap = uint32(col) // uint32(Cp)
                ch = uint32(col) - tap * uint32(Cp)
                if k < K and col < RSC and ch < C:
                    cuda.atomic.add(dw, (k, ch, tap // uint32(S), tap % uint32(S)), acc[(2 * i + j) * 4 + q])


def wgrad_half_slices(g, Kp, Cp):
    """Depth slices: about BLOCKS_PER_SM blocks per SM in all, at least one step each."""
    tiles = cdiv(Kp, BM) * cdiv(g.R * g.S * Cp, BN)
    steps = cdiv(g.N * g.P * g.Q, BK)
    return max(1, min(steps, cdiv(sm_count() * BLOCKS_PER_SM, tiles)))


def wgrad_half(x16, dy16, dw, *, stride=1, padding=0, dilation=1, slices=None, stream=0):
    """dw += the filter gradient of conv2d for an output gradient dy, on tensor cores.

    x16: float16 (N, H, W, Cp); dy16: float16 (N, P, Q, Kp), channels padded with zeros (to_half);
    dw: float32 (K, C, R, S), the master layout, C <= Cp, K <= Kp. The blocks ADD into dw (atomics):
    zero it first. slices: how many slices of the depth N*P*Q (None: wgrad_half_slices)."""
    x16 = require(x16, "x16", dtype=np.float16, ndim=4)
    dw = require(dw, "dw", dtype=np.float32, ndim=4)
    (N, H, W, Cp), (K, C, R, S) = x16.shape, dw.shape
    g = conv_geometry((N, C, H, W), (K, C, R, S), stride, padding, dilation)
    dy16 = require(dy16, "dy16", dtype=np.float16, ndim=4)
    Kp = dy16.shape[3]
    if dy16.shape[:3] != (N, g.P, g.Q) or not K <= Kp or Kp % CHUNK or not C <= Cp or Cp % CHUNK:
        raise ValueError(f"for dw {tuple(dw.shape)} and x16 {tuple(x16.shape)}, dy16 must be ({N}, {g.P}, {g.Q}, Kp) "
                         f"with Kp >= {K}, and Kp and x16's channels ({Cp} >= {C}) multiples of {CHUNK}: "
                         f"dy16 is {tuple(dy16.shape)}")
    if N * g.P * g.Q >= 2**31:
        raise ValueError(f"{N * g.P * g.Q} output positions: the kernel decodes them in 32 bits (at most 2^31 - 1)")
    slices = wgrad_half_slices(g, Kp, Cp) if slices is None else slices
    if not isinstance(slices, (int, np.integer)) or slices < 1:
        raise ValueError(f"slices must be a positive int, not {slices!r}")
    blocks = (cdiv(R * S * Cp, BN), cdiv(Kp, BM), int(slices))
    _launches.launch(wgrad_half_kernel, blocks, WGRAD_THREADS,
                     (x16.reshape(-1), dy16.reshape(-1), dw, H, W, Cp, g.P * g.Q, g.Q, g.sh, g.sw, g.ph, g.pw, g.dh,
                      g.dw, Kp), stream=stream)
    return dw
