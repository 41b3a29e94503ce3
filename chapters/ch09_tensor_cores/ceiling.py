"""What mma.sync can do at most on this GPU: each warp issues mma after mma on operands already in
registers (8 independent tiles, so that no mma waits for the one before), no memory at all. A GEMM
kernel built on mma.sync cannot go faster than this, whatever its tiles and pipelines; cuBLAS on an
H100 uses wgmma, a different instruction, and is not bound by it."""

from numba import cuda, float32, uint32

from workbook.tensor_cores import MMA_SHAPES, mma_f16, mma_tf32

TILES = 8  # independent accumulators a warp
ACCUMULATORS = 4 * TILES


def make_ceiling_kernel(mma):
    @cuda.jit
    def ceiling(out, loops):
        acc = cuda.local.array(ACCUMULATORS, float32)
        for i in range(ACCUMULATORS):
            acc[i] = 0
        x = uint32(cuda.threadIdx.x)  # any bits: 0 would let nothing be learned from the sum
        for _ in range(loops):
            for t in range(TILES):
                d = mma((x, x, x, x), (x, x), (acc[4 * t], acc[4 * t + 1], acc[4 * t + 2], acc[4 * t + 3]))
                for q in range(4):
                    acc[4 * t + q] = d[q]
        total = float32(0)
        for i in range(ACCUMULATORS):
            total += acc[i]
        out[cuda.grid(1)] = total  # a result, or the compiler would drop the work
    return ceiling


ceiling_f16 = make_ceiling_kernel(mma_f16)
ceiling_tf32 = make_ceiling_kernel(mma_tf32)
KERNELS = {"f16": ceiling_f16, "tf32": ceiling_tf32}


def flops(precision, blocks, threads, loops):
    m, n, k = MMA_SHAPES[precision]
    return 2 * m * n * k * TILES * loops * blocks * (threads // 32)
