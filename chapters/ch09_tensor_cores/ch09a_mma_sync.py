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
# # Chapter 09a — Tensor cores from numba: mma.sync, ldmatrix and cp.async
#
# In this notebook you will learn
# - what a tensor core computes (a 16x8 tile of D = A·B + C per instruction, the whole warp
#   together) and which lane holds which element: the *fragment layouts*;
# - what TF32 rounds away from float32, what FP16 cannot hold, and how close a tensor-core GEMM
#   must come to a float64 reference (a tolerance derived, not guessed);
# - how a GEMM feeds the tensor cores: tiles in shared memory, copied by `cp.async` three steps
#   ahead, handed to the warp by `ldmatrix` from a swizzled layout without bank conflicts;
# - how far that gets from numba against cuBLAS, and what the instruction itself allows.
#
# Part b (`ch09b_wgmma_conv.ipynb`) goes on from here: Hopper's own instruction, wgmma, and the
# convolution on tensor cores.
#
# numba has no tensor-core API; `workbook/tensor_cores.py` emits each PTX instruction through
# inline assembly, as `workbook/memory.py` does for 16-byte loads. Without a GPU every kernel runs
# in the simulator, where each instruction is a warp collective with the hardware's layouts
# (checked against a Hopper GPU by `tests/test_tensor_cores.py`), and the stored figures of the
# reference GPU follow each comparison.

# %%
# Reload an edited kernel module before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import bench, capability, cuda
from workbook import tensor_cores as tc

from chapters.ch04_implicit_gemm import kernels as fp32
from chapters.ch09_tensor_cores import ceiling, naive, pipelined
from chapters.ch09_tensor_cores import kernels as k
from chapters.ch09_tensor_cores.comparing import checker, operands, product_reference

print(f"running on: {workbook.MODE}")
capability.needed(*capability.MMA_SYNC, what="every kernel of this chapter", instead="run the chapter in the simulator "
                  "(WORKBOOK_DEVICE=sim), where all of it runs")
chapter = workbook.Chapter("ch09a", "Tensor cores: mma.sync, ldmatrix and cp.async")
rng = np.random.default_rng(0)
torch = bench.optional_torch()

# %% [markdown]
# ## One instruction, a whole warp
#
# `mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32` multiplies a 16x8 tile of A by an 8x8 tile
# of B and adds a 16x8 tile of C. No lane holds a whole matrix: each of the 32 lanes brings 4
# values of A, 2 of B and 4 of C in its registers, and gets 4 values of D back. Which ones is fixed
# by the hardware (the PTX ISA's tables). With g = lane / 4 and t = lane % 4, the lane that holds
# each element:

# %%
where = tc.fragment_coordinates("tf32")
for name, (rows, cols) in (("A (16x8)", (16, 8)), ("B (8x8)", (8, 8)), ("C and D (16x8)", (16, 8))):
    owner = np.zeros((rows, cols), int)
    for lane in range(32):
        for row, col in where[name[0].lower()][lane]:
            owner[row, col] = lane
    print(f"{name}: the lane holding each element")
    print("\n".join(" ".join(f"{lane:2d}" for lane in row) for row in owner), "\n")

# %% [markdown]
# A's rows go to groups of four lanes (g), its columns across the four (t); B's columns go to the
# groups. The FP16 instruction (m16n8k16) is the same with pairs: each 32-bit register holds two
# neighbouring halves (`pack_f16x2`). The naive kernel below loads exactly these elements.
#
# ## What TF32 rounds away, what FP16 cannot hold
#
# TF32 is float32 with 10 mantissa bits instead of 23: `to_tf32` (`cvt.rna`) rounds to the nearest,
# and a value not rounded is truncated by the tensor core. FP16 keeps 10 too, and its exponent
# stops at 65504. So a tensor-core product differs from the float32 one by the rounding of the
# inputs, and the reference (`reference.py`) rounds them as the kernel does; what remains is the
# accumulation, which the tolerance bounds.

# %%
a_small = rng.standard_normal((64, 1024)).astype(np.float32)
b_small = rng.standard_normal((1024, 64)).astype(np.float32)
tf32_error = k.tf32_input_error(a_small, b_small)
print(f"max |TF32 product - float32 product| / max |product|, K = 1024: {tf32_error:.2e}"
      f"  (one TF32 rounding is at most 2^-11 = {2.0 ** -11:.2e})")
print("float16(70000.0) =", np.float16(70000.0), "   float16(1e-8) =", np.float16(1e-8),
      "   float16's largest:", np.finfo(np.float16).max)
tol = k.tolerance(a_small, b_small, "tf32")
print(f"tolerance against the TF32-rounded reference, K = 1024: up to {tol.max():.2e} "
      f"(K·2^-23·(|A|@|B|)); the data's products are about {np.abs(a_small @ b_small).max():.0f}")
chapter.record("TF32 input rounding, K=1024 (relative error)", {"TF32 vs float32 inputs": tf32_error})

# %% [markdown]
# Scaled data that lands past 65504 becomes `inf` in FP16 and poisons every sum it enters; data
# below FP16's smallest subnormal becomes 0. A mixed-precision training loop keeps its gradients in
# range by scaling the loss, and skips a step whose gradients overflowed: chapter 03's
# check-finite-and-unscale.
#
# ## Naive: one warp per 16x8 tile, fragments from global memory

# %%
workbook.show(naive.gemm_tf32_naive)
workbook.show(naive.gemm_f16_naive)

# %% [markdown]
# Correct, and wasteful: every warp reads its own A rows and B columns from global memory, with
# 4- and 2-byte scattered loads, so each A element is read N / 8 times and each B element M / 16
# times; the tensor core mostly waits.
#
# ## Optimized: shared tiles, a cp.async pipeline, ldmatrix from a swizzled layout
#
# A block of 4 warps computes a 128x128 tile of C, each warp 64x64 (4 x 8 mma tiles, 128
# accumulators a thread). The depth is walked in steps (32 halves or 16 floats); for each step the
# block copies an A tile and a B tile into shared memory with `cp.async`, which moves 16 bytes
# global → shared without passing through registers and lands only when waited for. Three stages:
# while the warps multiply step k, steps k+1 and k+2 are on their way. One barrier a step: wait for
# step k's copies, sync, multiply; the stage step k-1 used is refilled while the first half of the
# step's mma run (after the barrier, so that no warp still reads it).
#
# That loop is written once, `tc.make_mainloop`, for the chapter's mma.sync GEMMs, part b's
# convolution, chapter 08's weight gradient and chapter 11's sparse convolution: a kernel passes only how it copies a step into a stage (`issue`), how a warp loads a
# half step's fragments, and its mma. Below, the copies, the loop, then the FP16 GEMM that packs its
# arrays for it.

# %%
workbook.show(pipelined.plan_rows)
workbook.show(pipelined.issue_rows)
workbook.show(pipelined.plan_b_f16)
workbook.show(tc.make_mainloop)
workbook.show(pipelined.issue_f16)
workbook.show(pipelined.gemm_f16_pipelined)

# %% [markdown]
# `ldmatrix_x4` gives a warp a whole 16x16 FP16 A fragment in one instruction: lane L points at row
# L % 8 of matrix L / 8 (16 bytes), and each lane gets back exactly its mma registers. Stored row
# after row, the eight rows of a matrix would sit 64 bytes apart (A) or 256 bytes apart (B), on the
# same banks: a 4- or 8-way bank conflict at every ldmatrix. The *swizzle* stores 16-byte chunk c
# of row r at chunk c XOR f(r), so that the eight rows of a matrix fall on eight different bank
# groups, and the 16-byte copies stay whole. A step has two k16 halves, and each half's fragments
# are loaded while the other half's mma run: the second half's before the first is multiplied, and
# the next step's first half right after the barrier, before this step's second half is multiplied
# (in the code; the compiler may move register-only mma across the barrier, and here it does).

# %%
workbook.show(tc.swizzled_chunk_64)
workbook.show(pipelined.f16_fragments)

# %% [markdown]
# TF32 has no 32-bit transposing ldmatrix, and B (K x N) is needed by columns. So `gemm()` first
# writes B^T once, rounded to TF32 (`transpose_to_tf32`), and the kernel multiplies A by B^T with
# ldmatrix for both; A's values are rounded in registers by adding half a TF32 unit to their bits
# and letting the tensor core drop the rest, which equals `cvt.rna` for every finite value.

# %%
workbook.show(pipelined.tf32_fragments)

# %% [markdown]
# ## Check: awkward sizes, NaN and Inf
#
# The naive kernel takes any shape; the pipelined one needs K and N multiples of 16 bytes (4 floats,
# 8 halves: cp.async copies whole 16-byte chunks), and says so otherwise. Every case is checked
# against the rounded float64 reference within the derived tolerance (`tests/test_ch09_tensor_cores.py`
# runs the same and more).

# %%
CASES = {"naive": [(1, 1, 1), (31, 33, 17), (33, 31, 40)], "pipelined": [(1, 8, 8), (31, 136, 40), (129, 16, 8)]}


def check_gemm(variant, precision, a, b):
    """C (7s before) = A·B by `variant`, against the rounded float64 reference within the tolerance."""
    (m, kd), n = a.shape, b.shape[1]
    c = cuda.to_device(np.full((m, n), 7.0, np.float32))
    k.gemm(cuda.to_device(a), cuda.to_device(b), c, variant=variant)
    ref = k.gemm_reference(a, b, precision)
    workbook.assert_close(c, ref.astype(np.float32), rtol=0,
                          atol=float(np.nan_to_num(k.tolerance(a, b, precision)).max()),
                          name=f"{variant} {precision} {m}x{n}x{kd}")


gemm_checks = []
for variant, cases in CASES.items():
    for m, n, kd in cases:
        for precision, dtype in (("tf32", np.float32), ("f16", np.float16)):
            a = rng.standard_normal((m, kd)).astype(dtype)
            b = rng.standard_normal((kd, n)).astype(dtype)
            if m > 2:
                a[1, 0] = np.nan  # row 1 of C must be NaN, and only row 1
            gemm_checks.append((variant, precision, a, b))
workbook.warm_up([lambda case=case: check_gemm(*case) for case in gemm_checks])  # a GPU compiles them side by side
for case in gemm_checks:
    check_gemm(*case)
print("naive and pipelined, TF32 and FP16: correct at", CASES)
try:
    k.gemm(cuda.to_device(np.zeros((8, 12), np.float16)), cuda.to_device(np.zeros((12, 8), np.float16)),
           cuda.to_device(np.zeros((8, 8), np.float32)))
except ValueError as error:
    print("K = 12 in FP16:", error)

# %% [markdown]
# ## Benchmark: against cuBLAS, and against the CUDA cores
#
# 4096³ on a GPU (137 GFLOP), each precision against `torch.matmul` on the same buffers (cuBLAS:
# TF32 with `allow_tf32`, FP16 with FP32 accumulation and an FP16 output), and chapter 04's FP32
# GEMM on the CUDA cores beside the TF32 kernels. The TF32 pipelined time includes its transpose.

# %%
n = workbook.size(gpu=4096, sim=32)
flops = 2 * n**3
(a32, b32, a16, b16), (d_a32, d_b32, d_a16, d_b16), (t_a32, t_b32, t_a16, t_b16) = operands(rng, n)
out = cuda.device_array((n, n), np.float32)
if torch is not None:
    torch.backends.cuda.matmul.allow_tf32 = True
# The float64 references of these operands take the host seconds at 4096^3: `comparing.py` computes
# each once, in a thread of its own, beside the GPU's warm-ups; every check waits for its own.


tf32_variants = {"naive": lambda: k.gemm(d_a32, d_b32, out, variant="naive"),
                 "pipelined": lambda: k.gemm(d_a32, d_b32, out),
                 "chapter 04 FP32 (CUDA cores)": lambda: fp32.gemm(d_a32, d_b32, out)}
f16_variants = {"naive": lambda: k.gemm(d_a16, d_b16, out, variant="naive"),
                "pipelined": lambda: k.gemm(d_a16, d_b16, out)}
bench.warm_up([*tf32_variants.values(), *f16_variants.values()])  # a GPU compiles both tables' kernels side by side
tf32_result = chapter.compare(
    "gemm tf32", tf32_variants,
    reference=lambda: product_reference("tf32", a32, b32),
    check=checker("tf32", a32, b32),
    baselines={"torch.matmul TF32 (cuBLAS)": lambda: torch.matmul(t_a32, t_b32)},
    flops=flops, size=f"{n}^3 float32",
)
f16_result = chapter.compare(
    "gemm f16", f16_variants,
    reference=lambda: product_reference("f16", a16, b16),
    check=checker("f16", a16, b16),
    baselines={"torch.matmul FP16 (cuBLAS)": lambda: torch.matmul(t_a16, t_b16)},
    flops=flops, size=f"{n}^3 float16",
)

# %% [markdown]
# ## The ceiling: mma.sync alone
#
# How fast can mma.sync go here at all? `ceiling.py` issues mma after mma from registers (8
# independent tiles a warp, no memory): no GEMM built on mma.sync can beat it.

# %%
workbook.show(ceiling.make_ceiling_kernel)
blocks, threads = workbook.size(gpu=132 * 64, sim=2), workbook.size(gpu=128, sim=32)
loops = workbook.size(gpu=4096, sim=1)
sink = cuda.device_array(blocks * threads, np.float32)
runs = {p: (lambda p=p: ceiling.KERNELS[p][blocks, threads](sink, loops)) for p in ceiling.KERNELS}
for run in runs.values():
    run()
if workbook.ON_GPU:
    times = bench.time_interleaved(runs, repeats=7)
    peak = {f"mma.sync {p}": ceiling.flops(p, blocks, threads, loops) / float(np.median(ms)) / 1e9
            for p, ms in times.items()}
    print({name: f"{value:.0f} TFLOP/s" for name, value in peak.items()})
else:
    peak = {}
    print("the simulator ran each once; times mean nothing here")
chapter.record("mma.sync ceiling (TFLOP/s)", peak)

# %% [markdown]
# ## Bars

# %%
# in the simulator a ratio is NaN: the bar is not judged
chapter.bar("GEMM 4096^3 FP16: pipelined mma.sync vs naive (speed-up)",
            f16_result.ratio("naive", "pipelined"), at_least=10)
chapter.bar("GEMM 4096^3 FP16: pipelined mma.sync vs cuBLAS FP16 (fraction of its speed)",
            f16_result.ratio("torch.matmul FP16 (cuBLAS)", "pipelined"), at_least=0.4)
chapter.bar("GEMM 4096^3 TF32: pipelined mma.sync vs cuBLAS TF32 (fraction of its speed)",
            tf32_result.ratio("torch.matmul TF32 (cuBLAS)", "pipelined"), at_least=0.4)

# %% [markdown]
# ## What the numbers mean
#
# - **The naive kernel** issues an mma every few hundred cycles and spends the rest on scattered
#   2- and 4-byte loads, each A element fetched by every warp of its row of tiles.
# - **The pipelined kernel**: each element crosses global memory once per block, the copies of the
#   next two steps fly while the warps multiply, and an ldmatrix hands a warp a whole fragment without
#   bank conflicts. TF32 on tensor cores against chapter 04's FP32 GEMM, tuned for the CUDA cores,
#   costs an error of the order printed below, from rounding the inputs.
# - **The ceiling**: mma.sync alone, operands in registers, is what the pipelined kernels aim at.
#   On Hopper cuBLAS uses the GPU's own instruction, wgmma (part b), which mma.sync cannot match.
# - **Where the rest goes**: Nsight Compute finds the tensor pipe idle between mma instructions for a
#   good part of the run, the warps waiting on the instruction before, on the barrier and on the
#   copies (`EXPERIMENTS.md` has the counts). Two blocks of 4 warps share an SM, limited by registers
#   (128 accumulators a thread) and shared memory alike.
# - **Exactness**: FP16 inputs are what they are, so an FP16 GEMM is exact up to the FP32
#   accumulation; TF32 rounds float32 inputs to 10 mantissa bits. Neither is float32 arithmetic: a
#   check against a float32 reference must round as the kernel does, or it either fails correct
#   kernels or passes wrong ones.
#
# The figures these bullets point to:

# %%
def _tf(case, variant):
    return lambda: chapter.figure(case, variant, "tflops")


def _of(case, variant, other):
    return lambda: chapter.figure(case, variant, "tflops") / chapter.figure(case, other, "tflops")


def _of_ceiling(case, precision):
    return lambda: chapter.figure(case, "pipelined", "tflops") / chapter.figure("mma.sync ceiling (TFLOP/s)",
                                                                               f"mma.sync {precision}")


_cublas = {"f16": "torch.matmul FP16 (cuBLAS)", "tf32": "torch.matmul TF32 (cuBLAS)"}
chapter.show_figures({
    **{f"GEMM 4096^3 {p.upper().replace('F16', 'FP16')}: {name}": ("{:.0f} TFLOP/s", _tf(f"gemm {p}", variant))
       for p in ("f16", "tf32") for name, variant in (("naive", "naive"), ("pipelined", "pipelined"),
                                                       ("cuBLAS", _cublas[p]))},
    **{f"  pipelined {p.upper().replace('F16', 'FP16')}: of cuBLAS / of mma.sync's ceiling": ("{}", lambda p=p: "{:.2f} / {:.2f}".format(
        _of(f"gemm {p}", "pipelined", _cublas[p])(), _of_ceiling(f"gemm {p}", p)())) for p in ("f16", "tf32")},
    "chapter 04's FP32 GEMM on the CUDA cores": ("{:.0f} TFLOP/s", _tf("gemm tf32", "chapter 04 FP32 (CUDA cores)")),
    "  TF32 pipelined vs it (speed-up)": ("{:.1f}x", _of("gemm tf32", "pipelined", "chapter 04 FP32 (CUDA cores)")),
    "  TF32 input rounding, K=1024 (relative error)": ("{:.0e}", lambda: chapter.figure(
        "TF32 input rounding, K=1024 (relative error)", "TF32 vs float32 inputs")),
    "mma.sync ceiling: FP16 / TF32": ("{}", lambda: "{:.0f} / {:.0f} TFLOP/s".format(
        *(chapter.figure("mma.sync ceiling (TFLOP/s)", f"mma.sync {p}") for p in ("f16", "tf32")))),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises: the TF32 fragments of one lane, a
# cp.async pipeline that reads its tile too early, the address each lane hands ldmatrix, and a
# wider warp tile that loads each A fragment once for four mma. Each cell below shows the code you
# edit and runs its check on what the file holds now: *not attempted*, *wrong* (with what is wrong),
# *correct*, or for the last one *fast enough* or *too slow* (on a GPU its time against the naive
# kernel's; in the simulator the global-memory traffic). Edit `exercises.py` between `# >>> ch09.N`
# and `# <<< ch09.N`, save, and re-run the cell. `python -m pytest --exercises -k ch09` checks them
# all at once. In the simulator a cp.async lands only at the wait that covers it, so a missing wait
# reads the stale tile every time; on a GPU it reads stale data only sometimes.

# %%
from workbook import exercises

exercises.show("ch09.1")

# %%
exercises.show("ch09.2")

# %%
exercises.show("ch09.3")

# %%
exercises.show("ch09.4")

# %% [markdown]
# ## More to try
# 1. **More warps a scheduler**: 8 warps of 64x32 lost here (more shared-memory reads per mma).
#    Try a 128x256 tile of 8 warps of 64x64 with 96 KB of dynamic shared memory.
# 2. **BF16**: `mma_bf16` is there and tested. What changes in the kernel, the reference and the
#    tolerance, and why does BF16 not need loss scaling where FP16 does?
# 3. **Split-K** for a GEMM with a small M·N and a long K (chapter 04's schedule.py), on tensor cores.
#
# ## References
# - NVIDIA, *PTX ISA*: `mma` (the m16n8k8 and m16n8k16 fragment layouts), `ldmatrix`, `cp.async`,
#   `cvt.rna.tf32.f32`.
# - NVIDIA CUTLASS: the sm80 tensor-op GEMMs (multistage pipelines, swizzled shared-memory layouts,
#   TF32 rounding by `round_half_ulp_truncate`).
# - P. Micikevicius et al., *Mixed Precision Training* (ICLR 2018): FP16 storage, FP32 master
#   weights, loss scaling.
