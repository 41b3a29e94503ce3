import sys

import workbook  # noqa: F401
import numpy as np
from chapters.ch09_tensor_cores import conv, kernels as k, pipelined as P
from workbook import cuda

a = cuda.to_device(np.ones((256, 256), np.float16))
k.gemm(a, a, cuda.device_array((256, 256), np.float32))
a32 = cuda.to_device(np.ones((256, 256), np.float32))
k.gemm(a32, a32, cuda.device_array((256, 256), np.float32))
x = cuda.to_device(np.ones((1, 8, 8, 16), np.float16))
w = cuda.to_device(np.ones((16, 3, 3, 16), np.float16))
k.conv2d(x, w, cuda.device_array((1, 8, 8, 16), np.float32), padding=1)
for name, kern in (("gemm_f16", P.gemm_f16_pipelined), ("gemm_tf32", P.gemm_tf32_pipelined), ("conv_f16", conv.KERNELS["f16"])):
    sass = kern.inspect_sass()
    sass = next(iter(sass.values())) if isinstance(sass, dict) else sass
    open(f"{sys.argv[1]}/{name}.sass", "w").write(sass)
