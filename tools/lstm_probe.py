"""Where the persistent LSTM's time goes on a GPU: the cost of numba's grid barrier alone, and one
persistent layer per batch size (CUDA events, median of 15).

    python tools/lstm_probe.py [steps]
"""

import sys

import numpy as np
from numba import cuda

from workbook import bench

from chapters.ch10_lstm import persistent, reference as ref

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 512


@cuda.jit
def barriers_kernel(n, out):
    grid = cuda.cg.this_grid()
    for _ in range(n):
        grid.sync()
    if cuda.grid(1) == 0:
        out[0] = n


out = cuda.device_array(1, np.int32)
for blocks in (32, 64, 128):
    t = bench.time_interleaved({"sync": lambda: barriers_kernel[blocks, 256](steps, out)}, repeats=15)["sync"]
    print(f"grid.sync x{steps}, {blocks} blocks of 256: {np.median(t) * 1e3 / steps:.2f} us a barrier")

H = 512
weights = ref.init_lstm(H, H, 1, seed=0)
net = persistent.PersistentLSTM(weights)
for batch in (1, 8, 64):
    x = cuda.to_device(np.random.default_rng(0).standard_normal((steps, batch, H)).astype(np.float32))
    x_terms = net.input_terms(0, x)
    h = cuda.to_device(np.zeros((batch, H), np.float32))
    c = cuda.to_device(np.zeros((batch, H), np.float32))
    y = cuda.device_array((steps, batch, H), np.float32)
    args = (x_terms, net.w_hh[0], net.bias[0], h, c, y, np.int32(net.units))

    def layer():
        persistent.persistent_layer_kernel[net.blocks, persistent.THREADS, 0, net.shared_bytes](*args)

    t = bench.time_interleaved({"layer": layer}, repeats=15)["layer"]
    print(f"persistent layer, batch {batch}: {np.median(t) * 1e3 / steps:.2f} us a step "
          f"({net.blocks} blocks, {net.units} units each)")
