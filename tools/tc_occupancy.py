"""mma.sync's ceiling (chapters/ch09_tensor_cores/ceiling.py) against occupancy: 132 x k blocks of 4
warps, k = 1, 2, 3, 4, 16, so that each SM holds 4k warps. Prints TFLOP/s; stores nothing.

    python tools/tc_occupancy.py
"""
import workbook  # noqa: F401, I001

import numpy as np

from chapters.ch09_tensor_cores import ceiling
from workbook import bench, cuda
sink = cuda.device_array(132 * 64 * 128, np.float32)
v, fl = {}, {}
for p, kern in ceiling.KERNELS.items():
    for per_sm in (1, 2, 3, 4, 16):
        blocks, loops = 132 * per_sm, 4096 * 16 // per_sm
        v[f"{p} {4*per_sm} warps/SM"] = lambda kern=kern, blocks=blocks, loops=loops: kern[blocks, 128](sink, loops)
        fl[f"{p} {4*per_sm} warps/SM"] = ceiling.flops(p, blocks, 128, loops)
for f in v.values():
    f()
t = bench.time_interleaved(v, repeats=5)
for name, ms in t.items():
    print(f"ceiling {name:22s} {fl[name] / np.median(ms) / 1e9:7.1f} TFLOP/s")
