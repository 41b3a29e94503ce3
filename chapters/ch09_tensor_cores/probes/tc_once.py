"""Launch each chapter 09 pipelined kernel once at n^3, and with `conv` the FP16 convolution once on
N=32 C=K=256 56x56 3x3 (for ncu)."""
import sys

import workbook  # noqa: F401,I001

import numpy as np

from chapters.ch09_tensor_cores import kernels as k
from workbook import cuda

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
for dtype in (np.float16, np.float32):
    a = cuda.to_device(np.ones((n, n), dtype))
    c = cuda.device_array((n, n), np.float32)
    k.gemm(a, a, c)
    cuda.synchronize()
if "conv" in sys.argv:
    x = cuda.to_device(np.ones((32, 56, 56, 256), np.float16))
    w = cuda.to_device(np.ones((256, 3, 3, 256), np.float16))
    k.conv2d(x, w, cuda.device_array((32, 56, 56, 256), np.float32), padding=1)
    cuda.synchronize()
