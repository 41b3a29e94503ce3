"""Development bench for chapter 09 on a GPU: correctness at 4096^3 and TFLOP/s of each kernel beside
cuBLAS (torch.matmul) and chapter 04's FP32 GEMM, interleaved, CUDA events. Prints; stores nothing.

    python chapters/ch09_tensor_cores/probes/tc_bench.py [size] [repeats] [caps] [ceiling] [wgmma]
"""
import sys

import workbook  # noqa: I001

import numpy as np

from chapters.ch04_implicit_gemm import kernels as k4
from chapters.ch09_tensor_cores import kernels as k
from workbook import bench, cuda

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 15
torch = bench.optional_torch()
rng = np.random.default_rng(0)
a32, b32 = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
da32, db32 = cuda.to_device(a32), cuda.to_device(b32)
da16, db16 = cuda.to_device(a32.astype(np.float16)), cuda.to_device(b32.astype(np.float16))
outs = {name: cuda.device_array((n, n), np.float32) for name in ("tf32", "f16", "tf32n", "f16n", "fp32")}
ta32, tb32, ta16, tb16 = (torch.as_tensor(x, device="cuda") for x in (da32, db32, da16, db16))
exact = (ta32.double() @ tb32.double())
exact16 = (ta16.double() @ tb16.double())
variants = {
    "tf32 pipelined": lambda: k.gemm(da32, db32, outs["tf32"]),
    "f16 pipelined": lambda: k.gemm(da16, db16, outs["f16"]),
    "fp32 ch04": lambda: k4.gemm(da32, db32, outs["fp32"]),
}
if n <= 4096:
    variants["tf32 naive"] = lambda: k.gemm(da32, db32, outs["tf32n"], variant="naive")
    variants["f16 naive"] = lambda: k.gemm(da16, db16, outs["f16n"], variant="naive")
if len(sys.argv) > 3 and sys.argv[3][0].isdigit():  # register caps to try: 3 blocks of 128 threads a SM need <= 168 registers
    from chapters.ch09_tensor_cores import pipelined as P
    for cap in map(int, sys.argv[3].split(",")):
        f16 = cuda.jit(max_registers=cap)(P.gemm_f16_pipelined.py_func)
        t32 = cuda.jit(max_registers=cap)(P.gemm_tf32_pipelined.py_func)
        grid = P.grid_for(n, n)
        variants[f"f16 cap {cap}"] = lambda f16=f16: f16[grid, P.THREADS](da16, db16, outs["f16"])
        variants[f"tf32 cap {cap}"] = lambda t32=t32: t32[grid, P.THREADS](da32, db32, outs["tf32"])
if "ceiling" in sys.argv:  # mma.sync alone (chapters/ch09_tensor_cores/ceiling.py), 4, 8 and 16 warps a block
    from chapters.ch09_tensor_cores import ceiling
    LOOPS = 4096
    sink = cuda.device_array(132 * 8 * 256, np.float32)
    flops_of = {}
    for precision, kern in ceiling.KERNELS.items():
        for warps in (4, 8, 16):
            blocks = sink.size // (32 * warps)
            name = f"ceiling {precision} {warps}w"
            variants[name] = lambda kern=kern, blocks=blocks, warps=warps: kern[blocks, 32 * warps](sink, LOOPS)
            flops_of[name] = ceiling.flops(precision, blocks, 32 * warps, LOOPS)
if "wgmma" in sys.argv:  # C = A @ B^T on wgmma (chapters/ch09_tensor_cores/wgmma.py), and cuBLAS on the same
    dbt32, dbt16 = cuda.to_device(np.ascontiguousarray(b32.T)), cuda.to_device(np.ascontiguousarray(b32.T.astype(np.float16)))
    tbt32, tbt16 = (torch.as_tensor(x, device="cuda") for x in (dbt32, dbt16))
    outs["w32"], outs["w16"] = cuda.device_array((n, n), np.float32), cuda.device_array((n, n), np.float32)
    variants["tf32 wgmma A@Bt"] = lambda: k.gemm_bt(da32, dbt32, outs["w32"])
    variants["f16 wgmma A@Bt"] = lambda: k.gemm_bt(da16, dbt16, outs["w16"])
    variants["torch tf32 A@Bt"] = lambda: torch.matmul(ta32, tbt32.T)
    variants["torch f16 A@Bt"] = lambda: torch.matmul(ta16, tbt16.T)
torch.backends.cuda.matmul.allow_tf32 = True
variants["torch tf32"] = lambda: torch.matmul(ta32, tb32)
variants["torch f16"] = lambda: torch.matmul(ta16, tb16)
for f in variants.values():
    f()
cuda.synchronize()
for name, ref in (("tf32", exact), ("tf32n", exact), ("f16", exact16), ("f16n", exact16), ("fp32", exact),
                  ("w32", exact), ("w16", exact16)):
    if (name.endswith("n") and n > 4096) or name not in outs:
        continue
    got = torch.as_tensor(outs[name], device="cuda").double()
    print(f"{name}: max |err| / max |ref| = {float((got - ref).abs().max() / ref.abs().max()):.3e}")
t = bench.time_interleaved(variants, repeats=repeats)
flops = 2 * n ** 3
dev = cuda.get_current_device()
print(f"{dev.name} n={n} repeats={repeats}")
for name, ms in t.items():
    f = flops_of.get(name, flops) if "ceiling" in sys.argv else flops
    print(f"{name:16s} median {np.median(ms):8.3f} ms  [{ms.min():.3f}-{ms.max():.3f}]  "
          f"{f / np.median(ms) / 1e9:7.1f} TFLOP/s")
