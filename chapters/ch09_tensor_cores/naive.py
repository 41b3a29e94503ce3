"""Naive: one warp per 16x8 tile of C, every fragment element loaded from global memory.

The mma instruction is the whole lesson here: each lane loads the A, B and C elements the fragment
tables (workbook/tensor_cores.py) say it holds, the warp multiplies, each lane stores its four
results. Nothing is shared between warps: each A element is read by every warp of its row of tiles
(N / 8 times), each B element M / 16 times, and the loads are 4- or 2-byte scattered reads.
Any M, N, K: elements past the edges are zeros.
"""

from numba import cuda, float32

from workbook.tensor_cores import mma_f16, mma_tf32, pack_f16x2, to_tf32

WARPS = 4  # warps per block, one 16x8 output tile each
THREADS = 32 * WARPS


@cuda.jit(device=True)
def at(x, row, col):
    """x[row, col], or zero past the edge of x."""
    if row < x.shape[0] and col < x.shape[1]:
        return x[row, col]
    return x.dtype.type(0)


@cuda.jit(device=True)
def warp_tile(c):
    """(lane, first row, first column) of the 16x8 tile of c this thread's warp computes: WARPS
    tiles a block, row after row of tiles."""
    tile = cuda.blockIdx.x * WARPS + cuda.threadIdx.x // 32
    tiles_across = (c.shape[1] + 7) // 8
    return cuda.threadIdx.x % 32, tile // tiles_across * 16, tile % tiles_across * 8


@cuda.jit(device=True)
def store_tile(c, row0, col0, lane, d):
    """Lane (g, t) holds C's (g, 2t), (g, 2t+1), (g+8, 2t), (g+8, 2t+1)."""
    g, t = lane // 4, lane % 4
    for q in range(4):
        row, col = row0 + g + 8 * (q // 2), col0 + 2 * t + q % 2
        if row < c.shape[0] and col < c.shape[1]:
            c[row, col] = d[q]


@cuda.jit
def gemm_tf32_naive(a, b, c):
    """c = a @ b with TF32 tensor cores; a (M, K), b (K, N), c (M, N), float32."""
    K = a.shape[1]
    lane, row0, col0 = warp_tile(c)
    if row0 >= c.shape[0]:  # the whole warp leaves together: nobody is left waiting in an mma
        return
    g, t = lane // 4, lane % 4
    acc = (float32(0), float32(0), float32(0), float32(0))
    for k0 in range(0, K, 8):
        frag_a = (to_tf32(at(a, row0 + g, k0 + t)), to_tf32(at(a, row0 + g + 8, k0 + t)),
                  to_tf32(at(a, row0 + g, k0 + t + 4)), to_tf32(at(a, row0 + g + 8, k0 + t + 4)))
        frag_b = (to_tf32(at(b, k0 + t, col0 + g)), to_tf32(at(b, k0 + t + 4, col0 + g)))
        acc = mma_tf32(frag_a, frag_b, acc)
    store_tile(c, row0, col0, lane, acc)


@cuda.jit
def gemm_f16_naive(a, b, c):
    """c = a @ b with FP16 tensor cores, FP32 accumulation; a (M, K), b (K, N) float16, c float32."""
    K = a.shape[1]
    lane, row0, col0 = warp_tile(c)
    if row0 >= c.shape[0]:
        return
    g, t = lane // 4, lane % 4
    acc = (float32(0), float32(0), float32(0), float32(0))
    for k0 in range(0, K, 16):
        r, k = row0 + g, k0 + 2 * t  # a register holds two neighbours along k
        frag_a = (pack_f16x2(at(a, r, k), at(a, r, k + 1)), pack_f16x2(at(a, r + 8, k), at(a, r + 8, k + 1)),
                  pack_f16x2(at(a, r, k + 8), at(a, r, k + 9)), pack_f16x2(at(a, r + 8, k + 8), at(a, r + 8, k + 9)))
        n = col0 + g
        frag_b = (pack_f16x2(at(b, k, n), at(b, k + 1, n)), pack_f16x2(at(b, k + 8, n), at(b, k + 9, n)))
        acc = mma_f16(frag_a, frag_b, acc)
    store_tile(c, row0, col0, lane, acc)


def blocks_for(M, N):
    return max(1, (((M + 15) // 16) * ((N + 7) // 8) + WARPS - 1) // WARPS)
