"""Naive attention: three kernels, with S and P written to global memory in between.

    scores      S = Q K^T · scale, one 64 x 64 tile a block, on the tensor cores (the fused
                kernel's own tiles and fragments); masked scores -inf. S: float32, N x N' a head
    softmax     one warp a row of S: its maximum, its sum of exponentials, then P = e^(S - max) /
                sum in FP16 (chapter 06's row softmax); a row with no finite score is 0
    values      O = P V, 64 rows of O a block, P and V tiles through shared memory

Every tile is as fast as the fused kernel's; what costs is the N x N' scores: 4 bytes written and
read back (several times: three passes), then 2 bytes of P written and read again, 12 bytes a
score at the least, where the fused kernel moves none. N' is N rounded up to a tile, so that P's
rows start on 16 bytes for cp.async; P's columns N..N' are written as 0.
"""

import math

import numpy as np
from numba import cuda, float32

from workbook.tensor_cores import cp_async_commit, cp_async_wait, mma_f16

from .tiles import ROWS, THREADS, tile_ops

NEG_INF = float32(-math.inf)
FULL = 0xFFFFFFFF
ROWS_PER_BLOCK = 4  # softmax: a warp a row
SOFTMAX_THREADS = 32 * ROWS_PER_BLOCK


def padded(n):
    """N' : the scores' row length, N rounded up to a whole tile."""
    return -(-n // ROWS) * ROWS


def make_scores(d, causal):
    tile = ROWS * d
    k_steps, key_tiles = d // 16, ROWS // 8
    copy, row_fragments, key_fragments, _ = tile_ops(d)
    both = 2 * tile

    @cuda.jit
    def scores(q, k, s, scale):
        """s[h, i, j] = q[h, i] · k[h, j] · scale (float32), -inf where masked or j >= N."""
        smem = cuda.shared.array(both, np.float16)
        n = q.shape[1]
        key0, m0, head = cuda.blockIdx.x * ROWS, cuda.blockIdx.y * ROWS, cuda.blockIdx.z
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        copy(smem, 0, q, (head * n + m0) * d, d, n - m0, tid)
        copy(smem, tile, k, (head * n + key0) * d, d, n - key0, tid)
        cp_async_commit()
        cp_async_wait(0)
        cuda.syncthreads()
        acc = cuda.local.array(32, float32)
        for i in range(32):
            acc[i] = 0
        for kk in range(k_steps):
            a = row_fragments(smem, 0, 16 * warp, kk, lane)
            for jp in range(0, key_tiles, 2):
                b = key_fragments(smem, tile, jp, kk, lane)
                for h in range(2):
                    x = 4 * (jp + h)
                    out = mma_f16(a, (b[2 * h], b[2 * h + 1]), (acc[x], acc[x + 1], acc[x + 2], acc[x + 3]))
                    for r in range(4):
                        acc[x + r] = out[r]
        for jt in range(key_tiles):
            for r in range(4):
                row, key = m0 + 16 * warp + g + 8 * (r // 2), key0 + 8 * jt + 2 * t + r % 2
                if row < n:
                    masked = key >= n or (causal and key > row)
                    s[head, row, key] = NEG_INF if masked else acc[4 * jt + r] * scale

    return scores


@cuda.jit
def softmax(s, p, n):
    """p[h, i, :n] = the softmax of s[h, i, :n] in FP16, p[h, i, n:] = 0; one warp a row."""
    row = cuda.blockIdx.x * ROWS_PER_BLOCK + cuda.threadIdx.x // 32
    lane = cuda.threadIdx.x % 32
    if row >= s.shape[0] * n:
        return
    head, i = row // n, row % n
    top = NEG_INF
    for j in range(lane, n, 32):
        top = max(top, s[head, i, j])
    offset = 16
    while offset > 0:  # a butterfly: every lane ends with the row's max
        top = max(top, cuda.shfl_xor_sync(FULL, top, offset))
        offset >>= 1
    shift = float32(0) if top == NEG_INF else top  # no finite score: every weight e^-inf = 0
    total = float32(0)
    for j in range(lane, n, 32):
        total += math.exp(s[head, i, j] - shift)
    offset = 16
    while offset > 0:
        total += cuda.shfl_xor_sync(FULL, total, offset)
        offset >>= 1
    inverse = float32(0) if total == 0 else float32(1) / total
    for j in range(lane, p.shape[2], 32):
        p[head, i, j] = math.exp(s[head, i, j] - shift) * inverse if j < n else float32(0)


def make_values(d):
    v_tile, p_tile = ROWS * d, ROWS * ROWS
    key_steps, out_tiles = ROWS // 16, d // 8
    copy_p, p_fragments, _, _ = tile_ops(ROWS)
    copy_v, _, _, value_fragments = tile_ops(d)
    both = v_tile + p_tile
    o_values = 4 * out_tiles

    @cuda.jit
    def values(p, v, o):
        """o[h] = p[h, :, :N] @ v[h] in FP16 (float32 sums); p (heads, N, N') with zeros past N."""
        smem = cuda.shared.array(both, np.float16)
        n, width = v.shape[1], p.shape[2]
        m0, head = cuda.blockIdx.x * ROWS, cuda.blockIdx.y
        tid = cuda.threadIdx.x
        warp, lane = tid // 32, tid % 32
        g, t = lane // 4, lane % 4
        acc = cuda.local.array(o_values, float32)
        for i in range(o_values):
            acc[i] = 0
        for key0 in range(0, n, ROWS):
            copy_p(smem, 0, p, (head * n + m0) * width + key0, width, n - m0, tid)
            copy_v(smem, p_tile, v, (head * n + key0) * d, d, n - key0, tid)
            cp_async_commit()
            cp_async_wait(0)
            cuda.syncthreads()
            for ks in range(key_steps):
                a = p_fragments(smem, 0, 16 * warp, ks, lane)
                for c in range(0, out_tiles, 2):
                    b = value_fragments(smem, p_tile, ks, c, lane)
                    for h in range(2):
                        x = 4 * (c + h)
                        out = mma_f16(a, (b[2 * h], b[2 * h + 1]), (acc[x], acc[x + 1], acc[x + 2], acc[x + 3]))
                        for r in range(4):
                            acc[x + r] = out[r]
            cuda.syncthreads()  # the tiles are read before the next copy overwrites them
        row = m0 + 16 * warp + g
        for c in range(out_tiles):
            col = 8 * c + 2 * t
            if row < n:
                o[head, row, col], o[head, row, col + 1] = acc[4 * c], acc[4 * c + 1]
            if row + 8 < n:
                o[head, row + 8, col], o[head, row + 8, col + 1] = acc[4 * c + 2], acc[4 * c + 3]

    return values


def blocks_of_scores(heads, n):
    tiles = -(-n // ROWS)
    return (tiles, tiles, heads)


def blocks_of_softmax(heads, n):
    return -(-heads * n // ROWS_PER_BLOCK)


def blocks_of_values(heads, n):
    return (-(-n // ROWS), heads)
