"""Chapter 11's tensor-core implicit GEMM with another block, checked against the FP16 reference,
then timed beside spconv 2.x in FP16 where it is installed (CUDA events, median of 15, interleaved).

    TC=WARPS:STAGES python chapters/ch11_sparse_conv/probes/sparse_tensor_probe.py      # e.g. TC=8:2: 128 rows a block, 2 stages

Sizes are the chapter's on a GPU (256 beams x 4,096 steps, C = K = 64), a small scan in the simulator."""

import os
import sys

import numpy as np

import workbook
from workbook import bench, cuda

from chapters.ch11_sparse_conv import maps, scan, spconv_baseline
from chapters.ch11_sparse_conv import reference as ref
from chapters.ch11_sparse_conv import tensor as tc

if "TC" in os.environ:  # before the first compile: the kernel reads these as constants
    warps, stages = (int(v) for v in os.environ["TC"].split(":"))
    tc.WARPS, tc.STAGES, tc.BM, tc.THREADS = warps, stages, 16 * warps, 32 * warps
    tc.ROWS_APART = tc.THREADS // tc.CHUNKS
    tc.A_COPIES, tc.B_COPIES = tc.BM * tc.CHUNKS // tc.THREADS, 8 * tc.MAX_TILES * tc.CHUNKS // tc.THREADS
    tc.A_STAGE, tc.B_STAGE = tc.BM * tc.BKC, 8 * tc.MAX_TILES * tc.BKC
coords = scan.voxelize(scan.lidar_scan(*((256, 4096) if workbook.ON_GPU else (3, 48))))
N, C = len(coords), 64
x, w = ref.features(N, C), ref.weights(C, C)
layer = tc.TensorImplicitGemm(maps.SiteTable(cuda.to_device(coords)).pairs())
x16, wt16 = tc.to_half(x, w)
out = cuda.device_array((N, C), np.float32)
want = ref.submanifold_direct(coords, x.astype(np.float16), w.astype(np.float16)).astype(np.float32)
rtol, atol = ref.tolerance(C)
workbook.assert_close(layer(x16, wt16, out), want, rtol=rtol, atol=atol, name="tensor cores")
if not workbook.ON_GPU:
    sys.exit(f"checked in the simulator (N={N}); times need a GPU")
variants = {"ours": lambda: layer(x16, wt16, out)}
spconv, missing = spconv_baseline.load()
if spconv is not None:
    import torch
    theirs, t_x16 = spconv_baseline.SpconvLayer(spconv, coords, w, torch.float16), bench.torch_view(x16)
    theirs(t_x16)  # its maps and its choice of kernel, before the timing
    variants["spconv FP16"] = lambda: theirs(t_x16)
times = bench.time_interleaved(variants, repeats=15)
taps = np.mean([bin(int(m)).count("1") for m in layer.tile_masks.copy_to_host()])
print(f"{tc.WARPS} warps ({tc.BM} rows a block, {taps:.1f} taps), {tc.STAGES} stages: " +
      ", ".join(f"{name} {np.median(t):.4f} ms [{np.percentile(t, 25):.4f}-{np.percentile(t, 75):.4f}]"
                for name, t in times.items()) + ("" if spconv else f" (spconv: {missing})"))
