"""Where the persistent LSTMs' time goes on a GPU (CUDA events, median of 15):

    python chapters/ch10_lstm/probes/lstm_probe.py barriers [steps]      numba's grid.sync() against workbook.barrier's counter
    python chapters/ch10_lstm/probes/lstm_probe.py gemm [batch ...]      the hoisted input GEMM with each of chapter 04's searched tiles
    python chapters/ch10_lstm/probes/lstm_probe.py layerwise [batch ...] the hoisted input GEMM, then the layer-by-layer
                                                     kernel alone, a step (env THREADS, MAX_TB, MAX_CHUNK
                                                     override layerwise.py's)
    python chapters/ch10_lstm/probes/lstm_probe.py once [batch]          one launch of the layer-by-layer kernel, T = 32, for
                                                     ncu --kernel-name regex:layer_kernel --launch-count 1
"""

import os
import sys

import numba
import numpy as np
from numba import cuda

from workbook import bench
from workbook.barrier import counter_barrier, counter_leave

from chapters.ch10_lstm import layerwise, reference as ref

T, H = 512, 512


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
    counter_leave(counter, blocks)  # zero for the next launch
    if cuda.grid(1) == 0:
        out[0] = n


def barriers(steps=T):
    out = cuda.device_array(1, np.int32)
    counter = cuda.to_device(np.zeros(2, np.uint64))
    for blocks in (32, 64, 128):
        t = bench.time_interleaved({"sync": lambda: barriers_kernel[blocks, 256](steps, out),
                                    "counter": lambda: counter_barriers_kernel[blocks, 256](steps, out, counter)},
                                   repeats=15)
        print(f"{steps} barriers, {blocks} blocks of 256: grid.sync {np.median(t['sync']) * 1e3 / steps:.2f} us a "
              f"barrier, workbook.barrier's counter {np.median(t['counter']) * 1e3 / steps:.2f} us")


def _overrides():
    for name in ("THREADS", "MAX_TB", "MAX_CHUNK", "ROUND"):
        if name in os.environ:
            setattr(layerwise, name, int(os.environ[name]))


def once(batch=64, steps=32):
    _overrides()
    net = layerwise.LayerwiseLSTM(ref.init_lstm(H, H, 1, seed=0))
    x = cuda.to_device(np.random.default_rng(0).standard_normal((steps, batch, H)).astype(np.float32))
    h, c = (cuda.to_device(np.zeros((batch, H), np.float32)) for _ in range(2))
    net._layer(0, x, h, c, cuda.device_array((steps, batch, H), np.float32), 0)
    cuda.synchronize()


def layer_by_layer(batches):
    _overrides()
    net = layerwise.LayerwiseLSTM(ref.init_lstm(H, H, 1, seed=0))
    for batch in batches:
        x = cuda.to_device(np.random.default_rng(0).standard_normal((T, batch, H)).astype(np.float32))
        h = cuda.to_device(np.zeros((batch, H), np.float32))
        c = cuda.to_device(np.zeros((batch, H), np.float32))
        y = cuda.device_array((T, batch, H), np.float32)
        chunk = layerwise.batch_chunk(H, net.units, batch)
        t = bench.time_interleaved({"gemm": lambda: net.input_terms(0, x), "layer": lambda: net._layer(0, x, h, c, y, 0)},
                                   repeats=15)
        gemm, layer = np.median(t["gemm"]), np.median(t["layer"])
        flops = 2 * T * batch * 4 * H * H
        print(f"layerwise, batch {batch} (THREADS {layerwise.THREADS}, chunk {chunk}, tiling "
              f"{layerwise.tiling(H, net.units, chunk)[:3]}): input GEMM {gemm:.3f} ms ({flops / gemm / 1e9:.1f} "
              f"TFLOP/s); recurrent kernel {(layer - gemm) * 1e3 / T:.2f} us a step "
              f"({flops / (layer - gemm) / 1e9:.1f} TFLOP/s)", flush=True)


def input_gemm(batches):
    from chapters.ch04_implicit_gemm import kernels as k
    for batch in batches:
        a = cuda.to_device(np.random.default_rng(0).standard_normal((T * batch, H)).astype(np.float32))
        b = cuda.to_device(np.random.default_rng(1).standard_normal((H, 4 * H)).astype(np.float32))
        out = cuda.device_array((T * batch, 4 * H), np.float32)
        names = [None, *k.SEARCH_TILES]
        t = bench.time_interleaved({str(name): (lambda name=name: k.gemm(a, b, out, tile=name)) for name in names},
                                   repeats=15)
        flops = 2 * T * batch * 4 * H * H
        print(f"input GEMM, batch {batch}: " + "; ".join(f"{name} {np.median(v):.3f} ms ({flops / np.median(v) / 1e9:.1f} "
                                                       "TFLOP/s)" for name, v in t.items()), flush=True)


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "barriers"
    if what == "barriers":
        barriers(*(int(a) for a in sys.argv[2:]))
    elif what == "once":
        once(*(int(a) for a in sys.argv[2:]))
    elif what == "gemm":
        input_gemm([int(b) for b in sys.argv[2:]] or [8, 64])
    else:
        layer_by_layer([int(b) for b in sys.argv[2:]] or [1, 8, 64])
