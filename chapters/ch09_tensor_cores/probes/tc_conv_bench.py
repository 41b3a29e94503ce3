"""Development bench for chapter 09's convolution on a GPU: the tensor-core implicit GEMM (FP16 and TF32,
channels last) beside cuDNN (torch conv2d, channels last, FP16 and TF32) and chapter 04's FP32 implicit
GEMM, on one layer, interleaved, CUDA events. Checks image 0 against the float64 reference. Prints.

    python chapters/ch09_tensor_cores/probes/tc_conv_bench.py [N C H] [repeats]        (K = C, 3x3, pad 1)
"""
import sys

import workbook  # noqa: I001

import numpy as np

from chapters.ch04_implicit_gemm import kernels as k4
from chapters.ch09_tensor_cores import kernels as k
from workbook import bench, cuda

N, C, H = (int(v) for v in sys.argv[1:4]) if len(sys.argv) > 3 else (32, 256, 56)
repeats = int(sys.argv[4]) if len(sys.argv) > 4 else 9
torch = bench.optional_torch()
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.allow_tf32 = True
rng = np.random.default_rng(0)
x = rng.standard_normal((N, H, H, C)).astype(np.float32)
w = (rng.standard_normal((C, 3, 3, C)) / np.sqrt(9 * C)).astype(np.float32)
dx32, dw32 = cuda.to_device(x), cuda.to_device(w)
dx16, dw16 = cuda.to_device(x.astype(np.float16)), cuda.to_device(w.astype(np.float16))
out16, out32, outw16, outw32 = (cuda.device_array((N, H, H, C), np.float32) for _ in range(4))
x_nchw, w_kcrs = cuda.to_device(np.ascontiguousarray(x.transpose(0, 3, 1, 2))), cuda.to_device(np.ascontiguousarray(w.transpose(0, 3, 1, 2)))
out_fp32 = cuda.device_array((N, C, H, H), np.float32)
tx32, tw32, tx16, tw16 = (torch.as_tensor(a, device="cuda").permute(0, 3, 1, 2) for a in (dx32, dw32, dx16, dw16))
assert tx16.is_contiguous(memory_format=torch.channels_last)
F = torch.nn.functional
variants = {
    "tc conv f16": lambda: k.conv2d(dx16, dw16, out16, padding=1),
    "tc conv tf32": lambda: k.conv2d(dx32, dw32, out32, padding=1),
    "wgmma conv f16": lambda: k.conv2d(dx16, dw16, outw16, padding=1, variant="wgmma"),
    "wgmma conv tf32": lambda: k.conv2d(dx32, dw32, outw32, padding=1, variant="wgmma"),
    "ch04 implicit fp32": lambda: k4.conv2d_implicit(x_nchw, w_kcrs, out_fp32, padding=1, tile="256x128 wide, 16x8/thread"),
    "cudnn f16 NHWC": lambda: F.conv2d(tx16, tw16, padding=1),
    "cudnn tf32 NHWC": lambda: F.conv2d(tx32, tw32, padding=1),
}
for f in variants.values():
    f()
cuda.synchronize()
for name, got, dt, prec in (("f16", out16, np.float16, "f16"), ("tf32", out32, np.float32, "tf32"),
                             ("wgmma f16", outw16, np.float16, "f16"), ("wgmma tf32", outw32, np.float32, "tf32-truncated")):
    x0, wq = x[:1].astype(dt), w.astype(dt)
    a, b, g = k.conv_as_gemm(x0, wq, 1, 1, 1)
    ref = k.conv_reference(x0, wq, prec, 1, 1, 1)
    err = np.abs(got.copy_to_host()[:1] - ref)
    tol = k.tolerance(a, b, prec).reshape(ref.shape)
    print(f"{name}: image 0 max |err| {err.max():.2e}, within tolerance: {bool((err <= tol).all())}")
t = bench.time_interleaved(variants, repeats=repeats)
flops = 2 * N * C * H * H * C * 9
print(f"{cuda.get_current_device().name} N={N} C=K={C} {H}x{H} 3x3 pad 1, {flops / 1e9:.1f} GFLOP, repeats={repeats}")
med = {name: float(np.median(ms)) for name, ms in t.items()}
for name, ms in t.items():
    print(f"{name:20s} median {med[name]:8.3f} ms  [{ms.min():.3f}-{ms.max():.3f}]  {flops / med[name] / 1e9:7.1f} TFLOP/s")
print(f"f16 vs cuDNN f16: {med['cudnn f16 NHWC'] / med['tc conv f16']:.3f}; tf32 vs cuDNN tf32: "
      f"{med['cudnn tf32 NHWC'] / med['tc conv tf32']:.3f}; f16 vs ch04 fp32: {med['ch04 implicit fp32'] / med['tc conv f16']:.2f}x")
print(f"wgmma: f16 vs cuDNN f16 {med['cudnn f16 NHWC'] / med['wgmma conv f16']:.3f}, tf32 vs cuDNN tf32 "
      f"{med['cudnn tf32 NHWC'] / med['wgmma conv tf32']:.3f}, f16 vs ch04 fp32 {med['ch04 implicit fp32'] / med['wgmma conv f16']:.2f}x")
