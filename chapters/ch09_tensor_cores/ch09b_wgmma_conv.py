# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 09b — Tensor cores: Hopper's wgmma, and the convolution
#
# Part a (`ch09a_mma_sync.ipynb`) fed mma.sync from a cp.async pipeline: fragments in every
# warp's registers, loaded by ldmatrix from swizzled shared tiles. In this notebook you will learn
# - Hopper's own instruction, wgmma: a warpgroup multiplying tiles straight from shared memory,
#   asynchronously, and the shared layout it asks for;
# - how chapter 04's implicit-GEMM convolution, channels last, becomes 16-byte copies feeding the
#   same tensor-core GEMM, against cuDNN.
#
# Without a GPU every kernel runs in the simulator (wgmma included: each thread computes its
# accumulators from the tiles its descriptors point at), and the stored figures of the reference
# GPU follow each comparison.

# %%
# Reload an edited kernel module before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import bench, capability, cuda
from workbook.check import to_host

from chapters.ch04_implicit_gemm import kernels as fp32
from chapters.ch09_tensor_cores import kernels as k
from chapters.ch09_tensor_cores.comparing import checker, operands, product_reference

print(f"running on: {workbook.MODE}")
capability.needed(*capability.MMA_SYNC, what="every kernel of this chapter", instead="run the chapter in the simulator "
                  "(WORKBOOK_DEVICE=sim), where all of it runs")
chapter = workbook.Chapter("ch09b", "Tensor cores: wgmma, and the convolution")
rng = np.random.default_rng(0)
torch = bench.optional_torch()
if torch is not None:
    torch.backends.cuda.matmul.allow_tf32 = True

# %% [markdown]
# ## Hopper's instruction: wgmma
#
# mma.sync is the A100's instruction. Hopper (9.0) has its own, and cuBLAS uses it there:
# `wgmma.mma_async`. A *warpgroup* (4 warps) multiplies a 64-row tile of A by a 128-column tile of Bᵀ straight from
# shared memory, described by 64-bit descriptors, into 64 accumulators a thread, asynchronously:
# issue, commit, and wait later. No ldmatrix, no fragments: between two wgmma a warp only copies
# and waits. What it asks in return is its own shared layout, the 128-byte swizzle (rows of 128
# bytes, 16-byte unit u of row r at u ^ (r % 8), 1024-byte atoms), and both tiles K-major: the
# kernel multiplies A by Bᵀ, which a linear layer's weights already are. `wgmma.py` has the GEMM
# and the convolution; in the simulator each thread computes its own 64 accumulators from the
# tiles its descriptors point at, when the wait runs.

# %%
from chapters.ch09_tensor_cores import wgmma

workbook.show(wgmma.make_kernels)
HAS_WGMMA = capability.check("wgmma", what="this section", instead="the mma.sync kernels run without it")
print("wgmma here:", HAS_WGMMA)

# %% [markdown]
# 4096³ products as in part a's benchmark (operands from `comparing.operands`), Bᵀ made once
# beforehand, against cuBLAS on the same operation (`torch.matmul(a, bt.T)`) and part a's pipelined
# mma.sync kernel (A·B), timed again in this run. wgmma reads TF32 from shared memory and drops the
# low 13 bits, with no register pass to round them: its TF32 is truncated, and so is its reference
# (`"tf32-truncated"`), within the tolerance part a derives (`k.tolerance`).

# %%
n = workbook.size(gpu=4096, sim=32)
flops = 2 * n**3
(a32, b32, a16, b16), (d_a32, d_b32, d_a16, d_b16), (t_a32, _, t_a16, _) = operands(rng, n)
out = cuda.device_array((n, n), np.float32)
d_bt32, d_bt16 = cuda.to_device(np.ascontiguousarray(b32.T)), cuda.to_device(np.ascontiguousarray(b16.T))
t_bt32, t_bt16 = bench.torch_view(d_bt32), bench.torch_view(d_bt16)
# The float64 references of these operands take the host seconds at 4096^3: `comparing.py` computes
# each once, in a thread of its own, beside the GPU's warm-ups; every check waits for its own.

cases = (("tf32", "TF32", (d_a32, d_b32, d_bt32, t_a32, t_bt32, a32, b32)),
         ("f16", "FP16", (d_a16, d_b16, d_bt16, t_a16, t_bt16, a16, b16)))
variants = {}
for precision, _, (da, db, dbt, *_) in cases:
    variants[precision] = {"pipelined": lambda da=da, db=db: k.gemm(da, db, out)}
    if HAS_WGMMA:
        variants[precision]["wgmma (A·Bᵀ)"] = lambda da=da, dbt=dbt: k.gemm_bt(da, dbt, out)
bench.warm_up([f for table in variants.values() for f in table.values()])  # both tables' kernels side by side
wgmma_results = {}
for precision, label, (da, db, dbt, ta, tbt, ah, bh) in cases:
    wgmma_results[precision] = chapter.compare(
        f"gemm {precision} wgmma", variants[precision],
        reference=lambda ah=ah, bh=bh, precision=precision: product_reference(precision, ah, bh),
        check=checker(precision, ah, bh),
        baselines={f"torch.matmul {label} A·Bᵀ (cuBLAS)": lambda ta=ta, tbt=tbt: torch.matmul(ta, tbt.T)},
        flops=flops, size=f"{n}^3 {'float32' if precision == 'tf32' else 'float16'}, B^T given",
    )

# %% [markdown]
# ## The convolution on tensor cores
#
# Chapter 04 turned a convolution into a GEMM whose B tile is gathered from the image. Channels
# last (x as N, H, W, C; filters as K, R, S, C) the gather becomes 16-byte copies: for one filter
# tap (r, s) the channels of a pixel sit side by side, so with C a multiple of 8 halves (or 4
# floats) every 16-byte chunk of the GEMM's A tile is either 16 contiguous bytes of x or all
# padding, and cp.async copies it or zero-fills it. The filters, (K, R·S·C), are B^T: rows of
# depth, copied and read as part a's TF32 GEMM reads B^T. Everything else is part a's pipelined GEMM.

# %%
from chapters.ch09_tensor_cores import conv

workbook.show(conv.make_conv_kernel)

# %% [markdown]
# Checked first at awkward shapes: odd image sizes, K not a multiple of anything, strides, padding
# wider than the filter's reach, dilation, C = 8 and 24; a NaN in one pixel must reach exactly the
# outputs whose windows cover it. The reference is the im2col GEMM in float64
# (`conv_reference`), and part a's GEMM tolerance holds as it is: the same products, summed in
# another order.

# %%
CONV_CASES = [  # (x NHWC, w KRSC, stride, padding, dilation); tests/test_ch09_tensor_cores.py has more
    ((2, 6, 5, 8), (9, 3, 2, 8), (2, 1), (1, 2), (2, 1)),
    ((1, 3, 3, 24), (33, 1, 1, 24), 1, 2, 1),  # C = 24: a step's depth is not a whole number of taps
]


def check_conv(precision, x, w, stride, padding, dilation):
    """The tensor-core convolution (out filled with 7s before) against the float64 reference."""
    a, b, g = k.conv_as_gemm(x, w, stride, padding, dilation)
    got = cuda.to_device(np.full((g.N, g.P, g.Q, g.K), 7.0, np.float32))
    k.conv2d(cuda.to_device(x), cuda.to_device(w), got, stride=stride, padding=padding, dilation=dilation)
    ref = k.conv_reference(x, w, precision, stride, padding, dilation)
    workbook.assert_close(got, ref.astype(np.float32), rtol=0,
                          atol=float(np.nan_to_num(k.tolerance(a, b, precision)).max()),
                          name=f"conv {precision} x{x.shape} w{w.shape}")


conv_checks = []
for x_shape, w_shape, stride, padding, dilation in CONV_CASES:
    for precision, dtype in (("f16", np.float16), ("tf32", np.float32)):
        x = rng.standard_normal(x_shape).astype(dtype)
        w = rng.standard_normal(w_shape).astype(dtype)
        x[0, 1, 2, 3] = np.nan
        conv_checks.append((precision, x, w, stride, padding, dilation))
workbook.warm_up([lambda case=case: check_conv(*case) for case in conv_checks])  # a GPU compiles them side by side
for case in conv_checks:
    check_conv(*case)
print("conv2d, TF32 and FP16: correct, NaN where its windows reach, at", [c[:2] for c in CONV_CASES])
try:
    k.conv2d(cuda.to_device(np.zeros((1, 4, 4, 12), np.float16)), cuda.to_device(np.zeros((8, 3, 3, 12), np.float16)),
             cuda.device_array((1, 2, 2, 8), np.float32))
except ValueError as error:
    print("C = 12 in FP16:", error)

# %% [markdown]
# On a GPU, chapter 04's big layer: N=32, C=K=256, 56x56, 3x3, pad 1, against cuDNN channels last in
# FP16 and TF32 (`torch.nn.functional.conv2d` on views of the same buffers, `cudnn.benchmark` on)
# and chapter 04's FP32 implicit GEMM on the same data in NCHW (its fastest tile on this layer).
# Image 0 is checked against the float64 reference (all 32 would take NumPy minutes); cuDNN's FP16
# output is FP16, one rounding more.

# %%
cn, cc, side = workbook.size(gpu=(32, 256, 56), sim=(1, 8, 6))
x32 = rng.standard_normal((cn, side, side, cc)).astype(np.float32)
w32 = (rng.standard_normal((cc, 3, 3, cc)) / np.sqrt(9 * cc)).astype(np.float32)
g_conv = fp32.conv_geometry((cn, cc, side, side), (cc, cc, 3, 3), 1, 1, 1)
conv_in = {"f16": (cuda.to_device(x32.astype(np.float16)), cuda.to_device(w32.astype(np.float16))),
           "tf32": (cuda.to_device(x32), cuda.to_device(w32))}
conv_out = cuda.device_array((cn, side, side, cc), np.float32)
x_nchw = cuda.to_device(np.ascontiguousarray(x32.transpose(0, 3, 1, 2)))
w_kcrs = cuda.to_device(np.ascontiguousarray(w32.transpose(0, 3, 1, 2)))
out_nchw = cuda.device_array(g_conv.out_shape, np.float32)
fp32_tile = "256x128 wide, 16x8/thread" if workbook.ON_GPU else None  # chapter 04's fastest here
if torch is not None:
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = True
# torch's NCHW views of the NHWC buffers: channels-last tensors, as cuDNN's fast kernels want them
t_conv = {p: tuple(bench.torch_view(a).permute(0, 3, 1, 2) if torch is not None else None for a in pair)
          for p, pair in conv_in.items()}


def conv_checker(precision):
    """Image 0 against the float64 reference: the tensor-core kernels within the derived tolerance;
    cuDNN (an NCHW view of a channels-last output, FP16 for FP16) with one rounding more; chapter
    04's kernel (NCHW, float32 inputs) against the unrounded inputs, within its own tolerance."""
    x0, w0 = (a.copy_to_host() for a in conv_in[precision])
    a0, b0, _ = k.conv_as_gemm(x0[:1], w0, 1, 1, 1)
    atol = float(k.tolerance(a0, b0, precision).max())

    def check(got, ref, name):
        host = to_host(got)[:1].astype(np.float32)
        if name.startswith(("chapter 04", "cuDNN")):  # NCHW: chapter 04's, and cuDNN's view
            host = np.ascontiguousarray(host.transpose(0, 2, 3, 1))
        if name.startswith("chapter 04"):
            rtol_fp32, atol_fp32 = fp32.tolerance(g_conv.gemm_depth)
            exact = k.conv_reference(x32[:1], w32, "fp32", 1, 1, 1).astype(np.float32)
            workbook.assert_close(host, exact, rtol=rtol_fp32, atol=atol_fp32, name=name)
        elif name.startswith("wgmma") and precision == "tf32":  # truncated, not rounded (above)
            truncated = k.conv_reference(x0[:1], w0, "tf32-truncated", 1, 1, 1).astype(np.float32)
            workbook.assert_close(host, truncated, rtol=0, atol=atol, name=name)
        else:
            workbook.assert_close(host, ref, rtol=2.0 ** -10 if name.startswith("cuDNN") else 0, atol=atol, name=name)
    return check


conv_variants = {}
for precision, label in (("f16", "FP16"), ("tf32", "TF32")):
    xd, wd = conv_in[precision]
    variants = conv_variants[precision] = {
        f"tensor cores {label}": lambda xd=xd, wd=wd: k.conv2d(xd, wd, conv_out, padding=1)}
    if HAS_WGMMA:
        variants[f"wgmma {label}"] = lambda xd=xd, wd=wd: k.conv2d(xd, wd, conv_out, padding=1, variant="wgmma")
    if precision == "f16":
        variants["chapter 04 FP32 implicit (CUDA cores)"] = lambda: fp32.conv2d_implicit(
            x_nchw, w_kcrs, out_nchw, padding=1, tile=fp32_tile)
bench.warm_up([f for table in conv_variants.values() for f in table.values()])  # side by side, as above
conv_results = {}
for precision, label in (("f16", "FP16"), ("tf32", "TF32")):
    xd, wd = conv_in[precision]
    tx, tw = t_conv[precision]
    conv_results[precision] = chapter.compare(
        f"conv {precision}", conv_variants[precision],
        reference=lambda xd=xd, wd=wd, precision=precision: k.conv_reference(
            xd.copy_to_host()[:1], wd.copy_to_host(), precision, 1, 1, 1).astype(np.float32),
        check=conv_checker(precision),
        baselines={f"cuDNN {label} channels last": lambda tx=tx, tw=tw: torch.nn.functional.conv2d(tx, tw, padding=1)},
        flops=g_conv.flops, size=f"N={cn} C=K={cc} {side}x{side} 3x3 pad 1, NHWC",
    )

# %% [markdown]
# ## Bars

# %%
# in the simulator, or on a GPU without wgmma, a ratio is NaN: the bar is not judged
chapter.bar("GEMM 4096^3 TF32: wgmma (B^T given) vs cuBLAS TF32 on the same (fraction of its speed)",
            wgmma_results["tf32"].ratio("torch.matmul TF32 A·Bᵀ (cuBLAS)", "wgmma (A·Bᵀ)"), at_least=0.5)
chapter.bar("GEMM 4096^3 FP16: wgmma (B^T given) vs cuBLAS FP16 on the same (fraction of its speed)",
            wgmma_results["f16"].ratio("torch.matmul FP16 A·Bᵀ (cuBLAS)", "wgmma (A·Bᵀ)"), at_least=0.5)
chapter.bar("conv N=32 C=K=256 56x56 3x3 FP16: wgmma vs cuDNN FP16 channels last (fraction of its speed)",
            conv_results["f16"].ratio("cuDNN FP16 channels last", "wgmma FP16"), at_least=0.5)
chapter.bar("conv N=32 C=K=256 56x56 3x3: wgmma FP16 vs chapter 04's FP32 implicit GEMM (speed-up)",
            conv_results["f16"].ratio("chapter 04 FP32 implicit (CUDA cores)", "wgmma FP16"), at_least=5)

# %% [markdown]
# ## What the numbers mean
#
# - **wgmma** (where the GPU has it): the warps no longer load fragments, the tensor cores read the
#   swizzled tiles themselves, and a warp's instructions between two wgmma are the next copies and
#   one barrier. That is what part a's mma.sync kernels spend their issue slots on.
# - **wgmma's TF32 is truncated**: it reads float32 from shared memory and drops the low 13 bits,
#   with no register pass to round them; its reference truncates too, within the same tolerance.
# - **The convolution**, channels last, gathers with nothing but 16-byte copies; against the GEMM it
#   pays the integer work of each chunk's address and edge tests, and it writes FP32, twice the bytes
#   of cuDNN's FP16 output.
# - **Against chapter 04**: the same implicit GEMM on the CUDA cores in FP32, the tensor cores' FP16
#   rate against FP32 FMA, and half the input bytes.
#
# The figures these bullets point to:

# %%
def _tf(case, variant):
    return lambda: chapter.figure(case, variant, "tflops")


def _of(case, variant, other):
    return lambda: chapter.figure(case, variant, "tflops") / chapter.figure(case, other, "tflops")


chapter.show_figures({
    **{f"wgmma {p.upper().replace('F16', 'FP16')} (B^T given)": ("{:.0f} TFLOP/s", _tf(f"gemm {p} wgmma", "wgmma (A·Bᵀ)")) for p in ("f16", "tf32")},
    **{f"  wgmma {label}: of cuBLAS on the same": ("{:.2f}", lambda label=label: chapter.figure(
        f"GEMM 4096^3 {label}: wgmma (B^T given) vs cuBLAS {label} on the same (fraction of its speed)"))
       for label in ("FP16", "TF32")},
    "conv N=32 C=K=256 56x56 3x3, mma.sync FP16 / TF32": ("{}", lambda: "{:.0f} / {:.0f} TFLOP/s".format(
        _tf("conv f16", "tensor cores FP16")(), _tf("conv tf32", "tensor cores TF32")())),
    "  of cuDNN channels last, FP16 / TF32": ("{}", lambda: "{:.2f} / {:.2f}".format(
        _of("conv f16", "tensor cores FP16", "cuDNN FP16 channels last")(),
        _of("conv tf32", "tensor cores TF32", "cuDNN TF32 channels last")())),
    "  FP16 vs chapter 04's FP32 implicit GEMM (speed-up)": ("{:.1f}x", lambda: chapter.figure(
        "conv f16", "chapter 04 FP32 implicit (CUDA cores)") / chapter.figure("conv f16", "tensor cores FP16")),
    "conv on wgmma, FP16": ("{:.0f} TFLOP/s", _tf("conv f16", "wgmma FP16")),
    "  of cuDNN": ("{:.2f}", lambda: chapter.figure(
        "conv N=32 C=K=256 56x56 3x3 FP16: wgmma vs cuDNN FP16 channels last (fraction of its speed)")),
})

# %%
chapter.save()

# %% [markdown]
# ## More to try
# 1. **A bigger wgmma tile**: m64n256 (128 accumulators a thread) makes each tile of A serve twice
#    the columns. What does it do to registers, shared memory and blocks a SM, and to the time?
#    Then TMA (Hopper's bulk tensor copy) in place of cp.async, which takes the copies' address
#    arithmetic off the warps.
# 2. **Keep B transposed on mma.sync too**: a linear layer stores its weights as (out, in), which is
#    B^T already. Time part a's TF32 kernel without its transpose, against `torch.matmul(a, bt.T)`.
# 3. **The convolution's output in FP16**: cuDNN writes half the bytes the kernel writes. Round the
#    accumulators in `store_warp_tile` (`pack_f16x2`), and time the layer again.
#
# ## References
# - NVIDIA, *PTX ISA*: `wgmma.mma_async`, its matrix descriptors and the 128-byte swizzle mode.
# - NVIDIA CUTLASS: the sm90 GEMMs (warpgroup MMA, multistage pipelines) and the implicit-GEMM
#   convolutions (channels last, a tile's gather as 16-byte copies).
