"""Where the persistent LSTM's time goes on a GPU: the cost of a grid barrier alone (numba's
grid.sync() and workbook.barrier's counter), and one persistent layer per batch size (CUDA events,
median of 15).

    python tools/lstm_probe.py [steps]
"""

import sys

import numba
import numpy as np
from numba import cuda

from workbook import bench
from workbook.barrier import counter_barrier

from chapters.ch10_lstm import persistent, reference as ref

steps = int(sys.argv[1]) if len(sys.argv) > 1 else 512


@cuda.jit
def barriers_kernel(n, out):
    grid = cuda.cg.this_grid()
    for _ in range(n):
        grid.sync()
    if cuda.grid(1) == 0:
        out[0] = n


@cuda.jit
def counter_barriers_kernel(n, out, counter):
    cuda.cg.this_grid()  # launched cooperatively: every block resident
    blocks = numba.uint64(cuda.gridDim.x)
    for i in range(n):
        counter_barrier(counter, numba.uint64(i + 1) * blocks)
    cuda.syncthreads()
    if cuda.threadIdx.x == 0 and cuda.atomic.add(counter, 1, 1) == blocks - numba.uint64(1):
        counter[0] = 0  # the last block out: zero for the next launch
        counter[1] = 0
    if cuda.grid(1) == 0:
        out[0] = n


out = cuda.device_array(1, np.int32)
counter = cuda.to_device(np.zeros(2, np.uint64))
for blocks in (32, 64, 128):
    t = bench.time_interleaved({"sync": lambda: barriers_kernel[blocks, 256](steps, out),
                                "counter": lambda: counter_barriers_kernel[blocks, 256](steps, out, counter)},
                               repeats=15)
    print(f"{steps} barriers, {blocks} blocks of 256: grid.sync {np.median(t['sync']) * 1e3 / steps:.2f} us a barrier, "
          f"workbook.barrier's counter {np.median(t['counter']) * 1e3 / steps:.2f} us")

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
