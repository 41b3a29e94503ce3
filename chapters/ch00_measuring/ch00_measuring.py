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
# # Chapter 00 — Measuring a kernel
#
# In this chapter you will learn
# - how the workbook checks a kernel against NumPy and times it (CUDA events, warm-up, median of
#   many interleaved runs, bytes counted, the copy ceiling measured in the same run);
# - the one idea every later chapter rests on: **memory coalescing** — a warp's 32 loads should
#   fall on consecutive addresses;
# - why a grid sized to the machine, with several independent loads in flight per thread, beats a
#   grid with one element per thread, and what "wider loads" buy on top.
#
# Every chapter has the same skeleton: NumPy reference → naive kernel → optimized kernel → check →
# benchmark (sweep + plot) → what the numbers mean → exercises.
#
# Without a GPU, this notebook runs in numba's CUDA simulator: every kernel runs and is checked, on
# small arrays; the times printed there mean nothing, so each comparison is followed by the stored
# figures from an NVIDIA H100.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import cuda, plots

from chapters.ch00_measuring import kernels as k

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch00", "Measuring a kernel: coalescing")
rng = np.random.default_rng(0)

# %% [markdown]
# ## The kernels
#
# The naive copy gives each thread one element. Its loads are already coalesced — lane *k* reads
# word *k* — but each thread has exactly one load to wait for, ~600 ns, before it can store and
# exit.

# %%
workbook.show(k.copy_one_per_thread_kernel)

# %% [markdown]
# The optimized copy launches only as many blocks as the GPU holds at once (8 blocks of 256 threads
# per SM, 132 SMs on an H100) and lets each thread stride over the array by the grid size, with four
# independent loads issued before the first store:

# %%
workbook.show(k.copy_grid_stride_kernel)

# %% [markdown]
# ## Check first
#
# A kernel is right before it is fast. The sizes that break kernels are the small and the odd
# ones: 1 element, 31 and 33 (one short of and one past a warp), sizes that leave the last block
# partly empty, and a large odd size. The check names the block and thread of the first wrong
# element, if there is one.

# %%
odd_sizes = [1, 31, 33, 1000, 4097, workbook.size(gpu=(1 << 24) + 3, sim=3001)]
for n in odd_sizes:
    src = rng.standard_normal(n).astype(np.float32)
    y = rng.standard_normal(n).astype(np.float32)
    d_src, d_y = cuda.to_device(src), cuda.to_device(y)
    for copy in (k.copy_one_per_thread, k.copy_grid_stride, k.copy_grid_stride_wide):
        out = copy(d_src, cuda.device_array_like(d_src))
        workbook.assert_close(out, k.copy_reference(src), exact=True, name=f"{copy.__name__} n={n}")
    for axpy in (k.axpy_one_per_thread, k.axpy_grid_stride):
        out = axpy(2.5, d_src, d_y, cuda.device_array_like(d_src))
        workbook.assert_close(out, k.axpy_reference(2.5, src, y), name=f"{axpy.__name__} n={n}")
print("all kernels agree with NumPy at sizes", odd_sizes)

# %% [markdown]
# ## Copy: naive vs optimized, against the copy ceiling
#
# A copy of *n* float32 reads 4n bytes and writes 4n bytes: **8n bytes**. On a GPU the array is
# 2^26 floats (256 MiB, five times the H100's 50 MB L2), so every byte really comes from HBM.
# The ceiling is the driver's device-to-device copy (and torch's, when torch is installed),
# measured in this same process.

# %%
n = workbook.size(gpu=1 << 26, sim=4096)
src = cuda.to_device(rng.standard_normal(n).astype(np.float32))
dst = cuda.device_array_like(src)
torch_src, torch_dst = workbook.bench.torch_view(src), workbook.bench.torch_view(dst)

copy_result = chapter.compare(
    "copy",
    {
        "one per thread": lambda: k.copy_one_per_thread(src, dst),
        "grid-stride x4": lambda: k.copy_grid_stride(src, dst),
        "grid-stride x4, 8-byte words": lambda: k.copy_grid_stride_wide(src, dst),
    },
    reference=lambda: src.copy_to_host(),
    check=lambda out, ref, name: workbook.assert_close(out, ref, exact=True, name=name),
    baselines={"torch copy_": lambda: torch_dst.copy_(torch_src)},
    bytes=8 * n,
    size=f"n={n:,} float32",
)
chapter.bar("optimized copy vs torch copy_ (same run), n=2^26",
            copy_result.ratio("torch copy_", "grid-stride x4, 8-byte words"), at_least=0.9)

# %% [markdown]
# ## axpy: `out = a*x + y`
#
# Reads 8n bytes, writes 4n: **12n bytes** for 2n FLOPs — 1/6 FLOP per byte, so no GPU can make
# this compute-bound: it is a memory kernel, and its yardstick is the copy ceiling.

# %%
x = src
y = cuda.to_device(rng.standard_normal(n).astype(np.float32))
out = cuda.device_array_like(x)
torch_x, torch_y, torch_out = (workbook.bench.torch_view(a) for a in (x, y, out))

axpy_result = chapter.compare(
    "axpy",
    {
        "one per thread": lambda: k.axpy_one_per_thread(2.5, x, y, out),
        "grid-stride x4": lambda: k.axpy_grid_stride(2.5, x, y, out),
    },
    reference=lambda: k.axpy_reference(2.5, x.copy_to_host(), y.copy_to_host()),
    baselines={"torch add(alpha=)": lambda: __import__("torch").add(torch_y, torch_x, alpha=2.5, out=torch_out)},
    bytes=12 * n,
    flops=2 * n,
    size=f"n={n:,} float32",
)

# %% [markdown]
# ## Coalesced vs strided
#
# `gather_strided` reads every *s*-th element. The useful bytes are the same 4 per element, but
# the memory system moves whole 32-byte sectors: at stride 8 and beyond, each lane's load lands
# in its own sector and 28 of every 32 bytes fetched are thrown away. We count only the useful
# bytes (4 read + 4 written per element), so the GB/s below falls as the stride grows.

# %%
strides = [1, 2, 4, 8, 16, 32]
gather_rates = {}
for stride in strides:
    out = cuda.device_array(n // stride, dtype=np.float32)
    result = chapter.compare(
        f"gather stride {stride}",
        {f"stride {stride}": lambda: k.gather_strided(src, out, stride)},
        reference=lambda: k.gather_reference(src.copy_to_host(), stride),
        bytes=8 * (n // stride),
        size=f"n={n:,} float32",
        show=workbook.ON_GPU,
    )
    gather_rates[stride] = result[f"stride {stride}"].gbps
if workbook.ON_GPU:
    for stride, rate in gather_rates.items():
        print(f"stride {stride:2d}: {rate:7.0f} GB/s of useful bytes")

# %% [markdown]
# ## A size sweep
#
# Small arrays are dominated by the launch: a launch from Python costs ~15-20 µs of host time, and
# the events around it measure that wait too, so below ~2^22 elements every kernel is
# launch-bound (torch's launch path is shorter). Arrays that fit in the 50 MB L2 (2^22 floats is
# 16 MiB per buffer) would be served from it; only past the L2 do we see the HBM rate. The dashed
# line is the copy ceiling measured in this run.

# %%
sweep_sizes = [1 << p for p in (range(16, 29, 2) if workbook.ON_GPU else range(6, 13, 2))]
sweep_results = {}
series = {"one per thread": [], "grid-stride x4": [], "grid-stride x4, 8-byte words": [], "torch copy_": []}
for size in sweep_sizes:
    s_src = cuda.to_device(rng.standard_normal(size).astype(np.float32))
    s_dst = cuda.device_array_like(s_src)
    t_src, t_dst = workbook.bench.torch_view(s_src), workbook.bench.torch_view(s_dst)
    result = chapter.compare(
        "copy sweep",
        {
            "one per thread": lambda: k.copy_one_per_thread(s_src, s_dst),
            "grid-stride x4": lambda: k.copy_grid_stride(s_src, s_dst),
            "grid-stride x4, 8-byte words": lambda: k.copy_grid_stride_wide(s_src, s_dst),
        },
        reference=lambda: s_src.copy_to_host(),
        baselines={"torch copy_": lambda: t_dst.copy_(t_src)},
        bytes=8 * size,
        size=f"n={size:,}",
        repeats=20,
        show=False,
    )
    for name in series:
        series[name].append(result.gbps(name))
    sweep_results[size] = result

if workbook.ON_GPU:
    chapter.bar("optimized copy vs torch copy_ (same run), n=2^28",
                sweep_results[1 << 28].ratio("torch copy_", "grid-stride x4, 8-byte words"), at_least=0.9)
    ceiling = workbook.bench.copy_ceiling()["gbps"]
    figure = plots.sweep(sweep_sizes, series, ceiling=ceiling, xlabel="float32 elements",
                         ylabel="GB/s (read + written)", title="Copy bandwidth vs size")
    chapter.savefig(figure, "copy_sweep")
else:
    print("simulator: the sweep ran and was checked at", sweep_sizes, "- the plot needs a GPU's times.")
    chapter.show_stored_figure("copy_sweep")  # the same plot, measured on the H100

# %% [markdown]
# ## What the numbers mean
#
# - Both copies are coalesced; the difference is **work in flight**. One element per thread
#   launches n/256 blocks that each live for one load; the grid-stride kernel keeps every SM full
#   for the whole run and has four loads outstanding per thread.
# - **Wider words** move the same bytes with half the load and store instructions; that is how a
#   numba kernel gets close to the driver's copy.
# - **Strided access** wastes the sector: at stride ≥ 8 the useful bandwidth falls by ~8x and
#   stays there (compare the stored figures above), the cost every later chapter avoids.

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch00.N` and `# <<< ch00.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch00`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch00.1")

# %%
exercises.show("ch00.2")

# %%
exercises.show("ch00.3")

# %%
exercises.show("ch00.4")

# %% [markdown]
# ## More to try
# 1. Change `LOADS_IN_FLIGHT`'s kernel to 2 and to 8 loads per trip. Predict, then measure.
# 2. Write a 16-byte-word copy (view float32 pairs as `complex128`). Does it beat the 8-byte one?
# 3. Make `gather_strided` read `src[(i * stride) % n]`: every element is used, but is it fast?
# 4. Break the copy on purpose (drop the tail loop) and read what `assert_close` tells you.
#
# ## References
# - NVIDIA, *CUDA C++ Best Practices Guide*, "Coalesced Access to Global Memory".
# - M. Harris, "CUDA Pro Tip: Write Flexible Kernels with Grid-Stride Loops".
