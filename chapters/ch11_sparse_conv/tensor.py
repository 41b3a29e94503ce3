"""The implicit GEMM on tensor cores: FP16 features and weights, FP32 sums (chapter 09's mma.sync).

The same output-stationary GEMM as implicit.py, its tiles fed to `mma.sync.m16n8k16` straight from
global memory, no shared memory at all:
- a block of WARPS warps takes BM = 16 * WARPS output rows (in the grouped order) and all K output
  channels; warp w owns rows 16w .. 16w + 15, n-tiles of 8 channels side by side (4 sums a thread
  each);
- for each tap its rows have, and each 16 channels of it: lane (g, t) of the warp loads its A
  fragment, two FP16 channels a 32-bit word, from the source rows of its rows g and g + 8 through
  the pair table (a missing neighbour: zeros), and for each n-tile its B fragment from the tap's
  weights stored transposed, (27, K, C), so that two neighbouring channels of one output channel
  are one word; then one mma per n-tile.
Features and weights are rounded to FP16 once, before the layer (`to_half`); what is multiplied is
exact in FP32, so the check is against the reference of the rounded values. A block's taps are
the OR of its BM rows' masks, rows grouped as implicit.py's are (grouping.py)."""

import numpy as np
from numba import cuda, float32, uint32

from workbook import ON_GPU
from workbook.inputs import require
from workbook.tensor_cores import mma_f16, tensor_cores

from . import grouping
from .grouping import next_tap
from .reference import TAPS

WARPS = 4
BM = 16 * WARPS
MAX_TILES = 8  # n-tiles a warp holds: K up to 64 (32 sums a thread)
SUMS = 4 * MAX_TILES  # a local array's size: a plain name, which numba reads as a constant
ZERO = float32(0)


@cuda.jit
def tensor_kernel(x_words, wt_words, neighbours, order, tile_masks, out):
    """out[order[r], :] for the block's BM rows. x_words (inputs, C / 2) uint32: the FP16 features,
    two channels a word; wt_words (27, K, C / 2) uint32: the FP16 weights transposed, likewise;
    neighbours (N, 27), order (N,), tile_masks (row tiles,) as implicit.py's; out (N, K) float32."""
    N, words = neighbours.shape[0], x_words.shape[1]  # N output rows; words: C / 2
    K = out.shape[1]
    lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
    g, t = lane // 4, lane % 4
    r_lo = cuda.blockIdx.x * BM + warp * 16 + g  # this lane's rows: r_lo and r_lo + 8
    r_hi = r_lo + 8
    acc = cuda.local.array(SUMS, float32)
    for i in range(SUMS):
        acc[i] = ZERO
    tiles = (K + 7) // 8
    taps = tile_masks[cuda.blockIdx.x]
    k = next_tap(taps, -1)
    while k < TAPS:
        src_lo = neighbours[order[r_lo], k] if r_lo < N else -1
        src_hi = neighbours[order[r_hi], k] if r_hi < N else -1
        for w0 in range(0, words, 8):  # 16 channels a step: words w0 .. w0 + 7
            a0 = x_words[src_lo, w0 + t] if src_lo >= 0 else uint32(0)
            a1 = x_words[src_hi, w0 + t] if src_hi >= 0 else uint32(0)
            a2 = x_words[src_lo, w0 + t + 4] if src_lo >= 0 else uint32(0)
            a3 = x_words[src_hi, w0 + t + 4] if src_hi >= 0 else uint32(0)
            for n in range(MAX_TILES):
                if n < tiles:  # the same for the whole warp
                    column = n * 8 + g
                    b0 = wt_words[k, column, w0 + t] if column < K else uint32(0)
                    b1 = wt_words[k, column, w0 + t + 4] if column < K else uint32(0)
                    d = mma_f16((a0, a1, a2, a3), (b0, b1), (acc[4 * n], acc[4 * n + 1], acc[4 * n + 2],
                                                             acc[4 * n + 3]))
                    acc[4 * n], acc[4 * n + 1], acc[4 * n + 2], acc[4 * n + 3] = d
        k = next_tap(taps, k)
    for n in range(MAX_TILES):  # C register q: row g + 8 (q // 2), column 2t + q % 2 of n-tile n
        for q in range(4):
            r = r_hi if q >= 2 else r_lo
            column = n * 8 + 2 * t + q % 2
            if n < tiles and r < N and column < K:
                out[order[r], column] = acc[4 * n + q]


@cuda.jit
def transpose_weights_kernel(w16, wt):
    """wt[k, n, c] = w16[k, c, n] (FP16)."""
    taps, C, K = w16.shape
    for at in range(cuda.grid(1), taps * C * K, cuda.gridsize(1)):
        k, rest = at // (C * K), at % (C * K)
        c, n = rest // K, rest % K
        wt[k, n, c] = w16[k, c, n]


def to_half(x, w):
    """(x16 (N, C), wt16 (27, K, C)): the layer's features and weights in FP16 on the device, the
    weights transposed (host arrays in, rounded to nearest)."""
    x16 = cuda.to_device(np.ascontiguousarray(np.asarray(x, np.float32).astype(np.float16)))
    w16 = cuda.to_device(np.ascontiguousarray(np.asarray(w, np.float32).astype(np.float16)))
    wt16 = cuda.device_array((w16.shape[0], w16.shape[2], w16.shape[1]), np.float16)
    transpose_weights_kernel[min(1024, -(-w16.size // 256)), 256](w16, wt16)
    return x16, wt16


class TensorImplicitGemm:
    """The implicit GEMM through a pair table (maps.Pairs) on FP16 tensor cores; its rows grouped
    by mask as implicit.ImplicitGemm's (grouping.py), in tiles of BM rows."""

    def __init__(self, pairs, group=True, stream=0, grouped=None):
        """grouped: (order, tile_masks) already made in tiles of BM rows (onelaunch.MapBuilder)."""
        self.neighbours, self.inputs = pairs.neighbours, pairs.inputs
        self.order, self.tile_masks = grouped or grouping.row_order(pairs.masks, BM, group, stream)
        if self.tile_masks.shape[0] != -(-self.order.shape[0] // BM):
            raise ValueError(f"grouped: {self.tile_masks.shape[0]} tile masks for {self.order.shape[0]} rows: "
                             f"made for tiles of another size than this kernel's {BM} rows")

    def __call__(self, x16, wt16, out, stream=0):
        """x16 (inputs, C) float16, wt16 (27, K, C) float16 (to_half), out (N, K) float32; C a multiple
        of 16, K at most 8 * MAX_TILES."""
        x16 = require(x16, "x16", dtype=np.float16, ndim=2)
        wt16 = require(wt16, "wt16", dtype=np.float16, ndim=3)
        C, K = x16.shape[1], wt16.shape[1]
        if C % 16 or wt16.shape[2] != C:
            raise ValueError(f"x16 has {C} channels and wt16 shape {tuple(wt16.shape)}: the tensor-core kernel "
                             "takes C a multiple of 16 (one mma's depth) and wt16 (27, K, C); pad the channels with zeros")
        if K > 8 * MAX_TILES:
            raise ValueError(f"K = {K} output channels: this kernel holds at most {8 * MAX_TILES}")
        if ON_GPU:
            cc = cuda.get_current_device().compute_capability
            if not tensor_cores(cc):
                raise RuntimeError(f"compute capability {cc[0]}.{cc[1]}: mma.sync m16n8k16 needs 8.0 or newer")
        m = self
        if x16.shape[0] != m.inputs:
            raise ValueError(f"x16 has {x16.shape[0]} rows, the maps have {m.inputs} input sites")
        if wt16.shape[0] != TAPS:
            raise ValueError(f"wt16 has shape {tuple(wt16.shape)}, expected ({TAPS}, K, C)")
        out = require(out, "out", dtype=np.float32, shape=(m.neighbours.shape[0], K))
        tensor_kernel[-(-out.shape[0] // BM), 32 * WARPS, stream](x16.view(np.uint32), wt16.view(np.uint32),
                                                                  m.neighbours, m.order, m.tile_masks, out)
        return out
