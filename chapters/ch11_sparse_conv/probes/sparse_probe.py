"""Chapter 11's submanifold layer on a GPU, for trying the implicit GEMM's tile: the scan, its
maps, gather-GEMM-scatter and the implicit GEMM checked against the direct reference, then timed
(CUDA events, median of 15, interleaved).

    TILE=BM:BN:BK:TM:TN python chapters/ch11_sparse_conv/probes/sparse_probe.py [beams steps channels]
"""

import os
import sys

import numpy as np

import workbook
from workbook import bench, cuda

from chapters.ch11_sparse_conv import implicit as im
from chapters.ch11_sparse_conv import maps, naive, scan
from chapters.ch11_sparse_conv import reference as ref

if "TILE" in os.environ:  # before the first compile: the kernel reads these as constants
    im.BM, im.BN, im.BK, im.TM, im.TN = (int(v) for v in os.environ["TILE"].split(":"))
    im.THREADS, im.COLUMNS = (im.BM // im.TM) * (im.BN // im.TN), im.BN // im.TN
    im.ROW_GROUP, im.COLUMN_GROUP = im.BM * 4 // im.TM, im.BN * 4 // im.TN
    im.A_QUADS, im.B_QUADS = im.BM * im.BK // (4 * im.THREADS), im.BK * im.BN // (4 * im.THREADS)
    im.A_VALUES, im.B_VALUES, im.A_TILE, im.B_TILE = 4 * im.A_QUADS, 4 * im.B_QUADS, im.BK * im.BM, im.BK * im.BN
beams, steps, C = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (256, 4096, 64)
coords = scan.voxelize(scan.lidar_scan(beams, steps))
N = len(coords)
x, w = ref.features(N, C), ref.weights(C, C)
pairs = maps.SiteTable(cuda.to_device(coords)).pairs()
rules = maps.rulebook(pairs)
layers = {"gather-GEMM-scatter": naive.GatherGemmScatter(rules, C, C), "implicit": im.ImplicitGemm(pairs)}
d_x, d_w = cuda.to_device(x), cuda.to_device(w)
outs = {name: cuda.device_array((N, C), np.float32) for name in layers}
want = ref.submanifold_direct(coords, x, w).astype(np.float32)
rtol, atol = ref.tolerance(C)
for name, layer in layers.items():
    workbook.assert_close(layer(d_x, d_w, outs[name]), want, rtol=rtol, atol=atol, name=name)
if not workbook.ON_GPU:
    sys.exit(f"checked in the simulator (N={N}); times need a GPU")
times = bench.time_interleaved({name: (lambda layer=layer, name=name: layer(d_x, d_w, outs[name]))
                                for name, layer in layers.items()}, repeats=15)
flops = 2.0 * rules.counts.sum() * C * C
print(f"N={N} pairs={rules.counts.sum()} tile {im.BM}x{im.BN}x{im.BK}, {im.TM}x{im.TN} a thread "
      f"({im.THREADS} threads), {layers['implicit'].taps_per_tile():.1f} taps a block: " +
      ", ".join(f"{name} {np.median(t):.3f} ms [{np.percentile(t, 25):.3f}-{np.percentile(t, 75):.3f}] "
                f"({flops / np.median(t) / 1e9:.1f} TFLOP/s)" for name, t in times.items()), flush=True)
