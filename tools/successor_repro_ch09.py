"""Chapter 09's accumulators in local memory under numba-cuda-mlir 0.6.0, reduced to a pair of
kernels without tensor cores (chapter 09's EXPERIMENTS.md). Each compiled by both, without a GPU:

    PYTHONPATH=<numba-cuda-mlir's site> python tools/successor_ptx.py successor_repro_ch09:stores_4x8x2 \\
        "float32[:, ::1], float32[:, ::1]"
    (and successor_repro_ch09:stores_2x8x2)

Both fill 128 accumulators a thread, then store them as chapter 09's store_warp_tile does: tile
(i, j) of the warp, two rows a lane, two guarded neighbours a row. The only difference is the
outer trip count, 4 or 2. numba-cuda unrolls both nests and keeps the accumulators in registers;
the successor leaves the 4 x 8 x 2 nest's outer loop a loop, so the accumulators are indexed at run
time and live in a 512-byte local array.
"""

from numba import cuda, float32


def _stores(rows_of_tiles):
    @cuda.jit
    def kernel(a, c):
        acc = cuda.local.array(128, float32)
        lane = cuda.threadIdx.x % 32
        for k in range(128):
            acc[k] = a[lane, k]
        row0, col0 = cuda.blockIdx.y * 64, cuda.blockIdx.x * 64
        g, t = lane // 4, lane % 4
        for i in range(rows_of_tiles):
            for j in range(8):
                for half in range(2):
                    row, col = row0 + 16 * i + g + 8 * half, col0 + 8 * j + 2 * t
                    if col < c.shape[1]:
                        c[row, col] = acc[(i * 8 + j) * 4 + 2 * half]
                    if col + 1 < c.shape[1]:
                        c[row, col + 1] = acc[(i * 8 + j) * 4 + 2 * half + 1]

    return kernel


stores_4x8x2 = _stores(4)  # the successor: 512 bytes of stack
stores_2x8x2 = _stores(2)  # both: registers only
