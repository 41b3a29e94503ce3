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
# # Chapter 06 — Softmax and cross-entropy: from one thread per row to warp and block reductions
#
# In this chapter you will learn
# - why softmax is computed as `exp(x - max) / sum(exp(x - max))`, and why a loss is computed from
#   the **log-sum-exp** (`loss = lse - x[target]`), never as `-log(softmax[target])`;
# - why **one thread per row** (the loss layer of *Learn CUDA Programming*, ch. 10) is slow: the
#   32 lanes of a warp read 32 different rows, and a batch of 4096 rows is one warp per SM;
# - the two bugs of that book's kernel (a grid sized by batch x classes, and a batch mean that is
#   only right while the batch fits one block), and their fixes;
# - how a **warp per row** (OneFlow's softmax) keeps the row in registers and reduces it with
#   `shfl_xor` butterflies, and how a **block per row** adds one step through shared memory;
# - the **online** max-and-sum (one pass over the row instead of two), and a **fused**
#   cross-entropy forward that reads the logits once and writes 8 bytes per row.
#
# Without a GPU, this notebook runs in numba's CUDA simulator: every kernel runs and is checked on
# small matrices (the simulator runs every CUDA thread in Python); the times printed there
# mean nothing, so each comparison is followed by the stored figures of the reference GPU.

# %%
# Reload the chapter's edited modules before each cell runs:
# %load_ext autoreload
# %autoreload 2
import functools

import numpy as np

import workbook
from workbook import cuda, plots

from chapters.ch06_softmax import kernels as k
from chapters.ch06_softmax import measuring

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch06", "Softmax and cross-entropy: warp and block reductions")
rng = np.random.default_rng(0)

torch = workbook.bench.optional_torch()
logits_like = functools.partial(measuring.logits_like, generator=rng)  # drawn on every core for a GPU's sizes

# %% [markdown]
# ## The reference, and why it subtracts the max
#
# `exp(89)` overflows float32. Softmax is unchanged when a constant is subtracted from a row, so
# every implementation subtracts the row's max first: the largest exponent is then `exp(0) = 1`
# and the sum is between 1 and the number of columns. The loss of a row with target *t* is
#
# `loss = -log softmax[t] = lse - x[t]`, with `lse = max + log(sum(exp(x - max)))`,
#
# which stays finite (and accurate) when `softmax[t]` underflows to 0 in float32. The references
# below compute in float64; the kernels compute in float32 (also for float16 logits).

# %%
x_small = np.array([[1.0, 2.0, 3.0], [1e4, 0.0, -1e4]], dtype=np.float32)
with np.errstate(over="ignore", invalid="ignore"):
    unsafe = np.exp(x_small) / np.exp(x_small).sum(axis=1, keepdims=True)
print("exp(x) / sum(exp(x)):       ", unsafe.tolist())
print("softmax_reference:          ", k.softmax_reference(x_small).tolist())
print("log_softmax_reference:      ", k.log_softmax_reference(x_small).tolist())
print("loss of target 2 (row 1):   ", k.cross_entropy_reference(x_small, np.array([0, 2]))[1].tolist())

# %% [markdown]
# ## Naive: one thread per row
#
# The book's loss layer gives each thread one sample: the thread walks its row to find the max,
# again to sum the exponentials, and (for softmax) a third time to write the output. Then one
# block tree-reduces the per-row losses to the batch mean.
#
# Two bugs, fixed here:
# 1. **Its grid is sized by batch x classes**, one thread per *logit*, but each thread handles a
#    *row*: threads with index >= batch read and write rows that do not exist. The grid below
#    has one thread per row, and `if row >= x.shape[0]: return`.
# 2. **Its mean reduction loads one loss per thread of a single block**, so a batch larger than
#    the block silently loses every loss past the block. Here each thread first sums a
#    block-strided slice (`range(tid, n, TREE_THREADS)`), then the tree reduces 256 partials.
#
# Even fixed, the naive kernel is slow for a reason the diagram in `naive.py` shows: at step
# *c*, lane *i* of a warp reads `x[i, c]` — 32 addresses one row apart, 32 memory sectors per load.

# %%
workbook.show(k.softmax_naive_kernel)
workbook.show(k.batch_mean_kernel)

# %% [markdown]
# ## Optimized: a warp per row, the row in registers
#
# For rows up to 1024 columns, one warp owns a row: lane *l* holds columns *l, l+32, l+64, ...*
# (at most 32 values per lane, in registers). Each load of the warp now reads 32 consecutive
# floats: 128 contiguous bytes. The max and the sum are combined across the 32 lanes with a
# **butterfly**: `shfl_xor_sync(mask, v, 16)`, then 8, 4, 2, 1 — after 5 exchanges every lane holds
# the result, no shared memory, no barrier. The row is read once and written once.
#
# numba has no `#pragma unroll`, and a `cuda.local.array` indexed in a loop that the compiler does
# not unroll completely lives in (slow) local memory. So the kernel is generated, already
# unrolled, for each power-of-two number of columns per lane; here is the one for rows of up to
# 64 columns. Rows of exactly 32, 64, ..., 1024 columns get a variant without the bounds checks
# (`full=True`): no comparisons, no predicated loads and stores.

# %%
workbook.show(k.warp_softmax_kernel(2))
workbook.show(k.warp_max)

# %% [markdown]
# In the PTX (`workbook.show_ptx`: numba's real compiler, on a laptop too with the `compile` extra)
# each butterfly step is one `shfl.sync.bfly.b32`: 5 for the max, 5 for the sum, unrolled.

# %%
_rows = np.zeros((4, 64), np.float32)
workbook.show_ptx(k.warp_softmax_kernel(2, full=True), _rows, _rows, grep=r"shfl\.")

# %% [markdown]
# ## Optimized: the online max-and-sum, and a block per row
#
# Above 1024 columns a row no longer fits a warp's registers. A block of 256 threads takes the
# row; each thread keeps a running `(max, sum)` over its columns in **one pass**: when the max
# grows from *m* to *m'*, the sum so far is rescaled by `exp(m - m')`. Two partial pairs merge the
# same way, which is what the shuffles (within a warp) and then 2 x 8 floats of shared memory
# (across the 8 warps) do.
#
# The **fused cross-entropy forward** needs nothing but that pair: it reads the logits once and
# writes the loss and the log-sum-exp of each row (8 bytes per row). The backward,
# `(softmax - onehot) / batch = (exp(x - lse) - onehot) / batch`, then needs only the logits and
# the stored lse: one read, one write.

# %%
workbook.show(k.row_kernels(k.ROW_THREADS).cross_entropy)
workbook.show(k.merge)

# %% [markdown]
# ## Optimized again: 16 bytes per access
#
# Every kernel above moves 4 bytes per load and per store (2 in float16). Chapter 00's
# `load16`/`store16` (`workbook/memory.py`) move 16 bytes in one instruction: 4 float32 or 8
# float16. The wrappers use them wherever the rows allow (`_width`: rows a multiple of 16 bytes, so
# that every row starts on a 16-byte boundary, and 16-byte-aligned arrays); any other shape or view
# takes the kernels above, unchanged.
#
# - **The register kernel**: lane *l* holds columns 4*l*..4*l*+3, then the same 128 columns
#   further, and so on (float32; 8*l*..8*l*+7 in float16). A 1024-column row is 8 loads and 8
#   stores per lane instead of 32 and 32, and a warp's load covers 512 contiguous bytes. The
#   compiler needs far fewer registers for it (fewer addresses and predicates; printed below), so
#   an SM holds more warps, and the grid is sized to the data, a warp per row.
# - **float16** gains the most: 8 halves per access where each lane loaded 2 bytes at a time.
# - **The block-per-row kernels** (cross-entropy forward and backward, rows over 1024 columns):
#   each thread loads two 16-byte chunks per trip (8 float32 in flight) and folds them into its
#   running `(max, sum)` with one rescale per trip.

# %%
workbook.show(k.warp_softmax_kernel(8, full=True, width=4))  # rows of 256 float32: 2 accesses per lane
workbook.show_ptx(k.warp_softmax_kernel(8, full=True, width=4), np.zeros((4, 256), np.float32),
                  np.zeros((4, 256), np.float32), grep=r"global\.v4")

# %% [markdown]
# ## Check first: awkward shapes, float16, and extreme logits
#
# Rows of 1, 31, 33 (one short of and one past a warp), 1024 and 1025 (the warp/block boundary),
# 32000 (a vocabulary), a number of rows that does not fill the last block, float16 logits (in the
# simulator at 33, 1025 and 32000 columns, where its code paths differ from float32's). Then
# logits of ±1e4, rows with -inf entries, a target with probability ~e^-10000 and one with
# probability exactly 0 (loss = +inf). The tests (`tests/test_ch06_softmax.py`) run more.

# %%
shapes = [(1, 1), (3, 31), (5, 33), (2, 1024), (3, 1025), (workbook.size(gpu=257, sim=2), 32000),
          workbook.size(gpu=(4099, 1003), sim=(37, 97))]

float16_shapes = measuring.check_shapes(shapes)
print("all kernels agree with the float64 references at", shapes, "in float32, and float16 at", float16_shapes)

# %%
x = np.zeros((4, 1025), dtype=np.float32)
x[0, ::2], x[0, 1::2] = 1e4, -1e4  # exp(1e4) would overflow: only exp(x - max) is safe
x[1, ::3] = -np.inf  # masked entries, as in attention
x[2, 0] = -1e4  # target 0: probability ~e^-10000, loss ~1e4 (not inf)
x[3, 7] = -np.inf  # target 7: probability exactly 0, loss +inf
t = np.array([0, 1, 0, 7], dtype=np.int32)
mean, losses, lse = k.cross_entropy(cuda.to_device(x), cuda.to_device(t), cuda.device_array(4, np.float32),
                                    cuda.device_array(4, np.float32), cuda.device_array(1, np.float32))
workbook.assert_close(losses, k.cross_entropy_reference(x, t)[1], rtol=1e-5, atol=1e-5, name="extreme losses")
workbook.assert_close(k.softmax(cuda.to_device(x), cuda.device_array_like(x)), k.softmax_reference(x),
                      rtol=1e-4, atol=1e-6, name="extreme softmax")
print("losses at the extremes:", losses.copy_to_host().tolist())

# A target out of range is a clear error (checked once, on the host), never a read past the row.
try:
    k.cross_entropy(cuda.to_device(x), cuda.to_device(np.array([0, 1, 2, 1025], np.int32)),
                    cuda.device_array(4, np.float32), cuda.device_array(4, np.float32),
                    cuda.device_array(1, np.float32))
except ValueError as error:
    print("ValueError:", error)

# %% [markdown]
# ## Softmax: naive vs warp per row vs `torch.softmax`
#
# 49152 rows of 1024 float32 (192 MiB in, 192 MiB out: four times a Hopper GPU's 50 MB L2). The least
# a softmax can move is the input read once and the output written once: **8 bytes per element**.
# "two passes" is the same warp per row without the registers: an online (max, sum) pass, then
# a second read of the row (from L1/L2, since it was just read) to write the output.

# %%
rows, ncols = workbook.size(gpu=(49152, 1024), sim=(5, 1024))
d_x = cuda.to_device(logits_like(rows, ncols))
d_out = cuda.device_array_like(d_x)
t_x = workbook.bench.torch_view(d_x)
close = measuring.close  # rtol 1e-3 past 1025 columns: the naive kernel's sequential sum

softmax_result = chapter.compare(
    "softmax",
    {
        "one thread per row": lambda: k.softmax_naive(d_x, d_out),
        "warp per row, registers": lambda: k.softmax(d_x, d_out, wide=False),
        "warp per row, two passes": lambda: k.softmax(d_x, d_out, registers=False, wide=False),
        "warp per row, registers, 16-byte": lambda: k.softmax(d_x, d_out),
    },
    reference=lambda: k.softmax_reference(d_x.copy_to_host()),
    check=close,
    baselines={"torch.softmax": lambda: torch.softmax(t_x, 1)},
    bytes=8 * rows * ncols,
    size=f"{rows}x{ncols} float32",
)
chapter.bar(f"softmax {rows}x{ncols} f32: warp per row, 16-byte accesses: fraction of the copy ceiling",
            softmax_result.fraction("warp per row, registers, 16-byte"), at_least=0.85)

# %%
d_x16 = cuda.to_device(logits_like(rows, ncols, np.float16))
d_out16 = cuda.device_array_like(d_x16)
t_x16 = workbook.bench.torch_view(d_x16)
softmax16_result = chapter.compare(
    "softmax float16",
    {
        "one thread per row": lambda: k.softmax_naive(d_x16, d_out16),
        "warp per row, registers": lambda: k.softmax(d_x16, d_out16, wide=False),
        "warp per row, registers, 16-byte": lambda: k.softmax(d_x16, d_out16),
    },
    reference=lambda: k.softmax_reference(d_x16.copy_to_host()),
    baselines={"torch.softmax": lambda: torch.softmax(t_x16, 1)},
    bytes=4 * rows * ncols,
    size=f"{rows}x{ncols} float16",
)
chapter.bar(f"softmax {rows}x{ncols} f16: warp per row, 16-byte accesses: fraction of the copy ceiling",
            softmax16_result.fraction("warp per row, registers, 16-byte"), at_least=0.85)
slots, full = k._slots(ncols), ncols == 32 * k._slots(ncols)  # what the compiler made of the kernels
measuring.show_registers({"warp per row, registers": k.warp_softmax_kernel(slots, full=full, width=1),
                          "warp per row, registers, 16-byte": k.warp_softmax_kernel(slots, full=full, width=4),
                          "warp per row, two passes": k.row_kernels(k.WARP, 1).softmax})

# %% [markdown]
# ## Cross-entropy forward: naive vs fused vs `torch.nn.functional.cross_entropy`
#
# 4096 rows of 32000 classes (a language model's vocabulary): 500 MiB of float32 logits. The
# fused kernel reads them once (**4 bytes per logit**), writes 8 bytes per row, and a one-block
# tree reduces the 4096 losses to the mean. torch computes `log_softmax` (reads the logits, writes
# a second 500 MiB tensor), then `nll_loss` picks one value per row. The targets are checked once
# before timing (`k.check_targets`), as a training loop checks its labels when it loads them.

# %%
rows, ncols = workbook.size(gpu=(4096, 32000), sim=(2, 4000))
logits = logits_like(rows, ncols)  # kept for the references: no copy back of the 500 MiB
d_logits = cuda.to_device(logits)
targets = rng.integers(0, ncols, rows)
d_targets = cuda.to_device(targets.astype(np.int32))
k.check_targets(d_targets, ncols)
d_losses, d_lse, d_mean = (cuda.device_array(rows, np.float32), cuda.device_array(rows, np.float32),
                           cuda.device_array(1, np.float32))
t_logits = workbook.bench.torch_view(d_logits)
t_targets = None if t_logits is None else torch.as_tensor(targets, device="cuda")  # int64
loose = lambda out, ref, name: workbook.assert_close(out, ref, rtol=1e-4, atol=1e-5, name=name)  # noqa: E731

forward_result = chapter.compare(
    "cross-entropy forward",
    {
        "one thread per row + tree mean": lambda: k.cross_entropy_naive(
            d_logits, d_targets, d_losses, d_lse, d_mean, check_targets=False)[0],
        "fused, block per row": lambda: k.cross_entropy(
            d_logits, d_targets, d_losses, d_lse, d_mean, check_targets=False, wide=False)[0],
        "fused, 16-byte loads": lambda: k.cross_entropy(
            d_logits, d_targets, d_losses, d_lse, d_mean, check_targets=False)[0],
    },
    reference=lambda: k.cross_entropy_reference(logits, targets)[0],
    check=loose,
    baselines={"torch cross_entropy": lambda: torch.nn.functional.cross_entropy(
        t_logits, t_targets).reshape(1)},
    bytes=4 * rows * ncols + 12 * rows,
    size=f"{rows}x{ncols} float32",
    repeats=20,
)
chapter.bar(f"fused cross-entropy forward {rows}x{ncols} f32, 16-byte loads: fraction of the copy ceiling",
            forward_result.fraction("fused, 16-byte loads"), at_least=0.85)
measuring.show_registers({"fused forward": k.row_kernels(k.ROW_THREADS, 1).cross_entropy,
                          "fused forward, 16-byte": k.row_kernels(k.ROW_THREADS, 4).cross_entropy})

# %% [markdown]
# ## Cross-entropy backward: `(softmax - onehot) / batch` in one pass
#
# Reads the logits and the stored lse, writes the gradient: 8 bytes per logit. The torch
# baseline is what one writes by hand: `softmax`, subtract 1 at the targets, divide.

# %%
k.cross_entropy(d_logits, d_targets, d_losses, d_lse, d_mean)
d_grad = cuda.device_array_like(d_logits)


def torch_backward():
    grad = torch.softmax(t_logits, 1)
    grad[torch.arange(rows, device="cuda"), t_targets] -= 1
    return grad.div_(rows)


chapter.compare(
    "cross-entropy backward",
    {
        "one thread per row": lambda: k.cross_entropy_backward_naive(
            d_logits, d_targets, d_lse, d_grad, check_targets=False),
        "fused, block per row": lambda: k.cross_entropy_backward(
            d_logits, d_targets, d_lse, d_grad, check_targets=False, wide=False),
        "fused, 16-byte": lambda: k.cross_entropy_backward(
            d_logits, d_targets, d_lse, d_grad, check_targets=False),
    },
    reference=lambda: k.cross_entropy_backward_reference(logits, targets),
    check=lambda out, ref, name: workbook.assert_close(out, ref, rtol=1e-4, atol=1e-9, name=name),
    baselines={"torch softmax - onehot": torch_backward},
    bytes=8 * rows * ncols + 8 * rows,
    size=f"{rows}x{ncols} float32",
    repeats=10,
)

# %% [markdown]
# ## A sweep over the number of columns
#
# The same number of logits (2^25 on a GPU, 128 MiB) cut into rows of 32 to 32000 columns. The
# naive kernel gets *fewer* threads as rows get longer; the warp kernels switch to a block per
# row past 1024 columns. GB/s counts the bytes the kernel must move (softmax 8, forward 4 per
# logit); the dashed line is the device-to-device copy rate measured in this run.

# %%
sweep_columns = [32, 100, 256, 1000, 1024, 1025, 4096, 32000] if workbook.ON_GPU else [32, 1024, 1025]
total = workbook.size(gpu=1 << 25, sim=3 * 1025)
softmax_series, forward_series = measuring.column_sweep(chapter, torch, sweep_columns, total, rng)
if workbook.ON_GPU:
    ceiling = workbook.bench.copy_ceiling()["gbps"]
    for ncols, rate in zip(sweep_columns, softmax_series["warp/block per row"]):
        print(f"softmax, {ncols:5d} columns: {rate:6.0f} GB/s")
    figure = plots.sweep(sweep_columns, softmax_series, ceiling=ceiling, xlabel="columns per row",
                         ylabel="GB/s (8 bytes per logit)", title="Softmax of 2^25 float32 logits")
    chapter.savefig(figure, "softmax_sweep")
    figure = plots.sweep(sweep_columns, forward_series, ceiling=ceiling, xlabel="columns per row",
                         ylabel="GB/s (4 bytes per logit)", title="Cross-entropy forward of 2^25 float32 logits")
    chapter.savefig(figure, "cross_entropy_sweep")
else:
    print("simulator: the sweep ran and was checked at", sweep_columns, "columns; the plots need a GPU's times.")
    chapter.show_stored_figure("softmax_sweep")  # the same plot, measured on the reference GPU
    chapter.show_stored_figure("cross_entropy_sweep")  # the same plot, measured on the reference GPU

# %% [markdown]
# ## What the numbers mean
#
# - **One thread per row** is bounded by its access pattern and its parallelism, not by the
#   arithmetic (4096 rows are 128 warps for a GPU of 132 SMs). It gets *slower* per byte as rows get
#   longer, exactly when the optimized kernels get faster.
# - **A warp per row** with the row in registers moves the minimum, 8 bytes per element. NVVM gives
#   that unrolled kernel ~250 registers a thread (all 32 values and their exps in flight), so an SM
#   holds two 128-thread blocks; launched as 16 blocks per SM whose warps loop over the rows
#   (`WARP_ROW_BLOCKS_PER_SM`), the few resident warps stay busy. The "two passes" variant (40
#   registers, the row read again from L1/L2) is slower still.
# - **16-byte accesses**: the same values in a quarter of the instructions need 72 registers instead
#   of ~250, so a grid sized to the data (a warp per row) beats the looping one. In **float16** the
#   gain is larger, because each lane used to load 2 bytes at a time.
# - **The fused forward** reads each logit once, where `F.cross_entropy` runs `log_softmax`, reading
#   the logits and writing a tensor as large; two 16-byte loads per thread per trip take it near the
#   copy ceiling. The fused **backward** is a pure stream.
# - The **sweep** (16-byte kernels wherever the rows allow) shows the one cliff left: rows of 1000
#   columns take the 16-byte register kernel with per-access bounds checks, but rows of 1025, not a
#   multiple of 4, fall to a 256-thread block with 4 columns per thread. A block of 64-128 threads,
#   or two warps, per row between 1024 and 4096 columns would close it. At 32000 columns the block
#   kernel's second read no longer hits the L2.
#
# The variants tried on the way: [EXPERIMENTS.md](EXPERIMENTS.md). The figures these bullets point to:

# %%
SM, SM16, CE, CEB = "softmax", "softmax float16", "cross-entropy forward", "cross-entropy backward"
WARP, QUAD, SWEEP = "warp per row, registers", "warp per row, registers, 16-byte", "softmax sweep"
chapter.show_figures({
    "one thread per row: softmax 1024 columns / cross-entropy 32000": (
        "{:.0f} / {:.0f} GB/s", (SM, "one thread per row", "gbps"), (CE, "one thread per row + tree mean", "gbps")),
    "softmax f32, warp per row: GB/s, vs torch.softmax": ("{:.0f}, {:.2f}x", (SM, WARP, "gbps"),
                                                          (SM, WARP, "speedup_vs_baseline")),
    "softmax f32, 16-byte: ms, of the ceiling, vs torch.softmax": (
        "{:.3f}, {:.0%}, {:.2f}x", (SM, QUAD), (SM, QUAD, "fraction_of_ceiling"), (SM, QUAD, "speedup_vs_baseline")),
    "softmax f16: 16-byte / 2-byte loads": ("{:.4f} / {:.4f} ms", (SM16, QUAD), (SM16, WARP)),
    "  vs torch.softmax; torch's fraction of the ceiling": (
        "{:.2f}x; {:.0%}", (SM16, QUAD, "speedup_vs_baseline"), (SM16, "torch.softmax", "fraction_of_ceiling")),
    "cross-entropy forward, 4-byte: GB/s, vs F.cross_entropy": (
        "{:.0f}, {:.1f}x", (CE, "fused, block per row", "gbps"), (CE, "fused, block per row", "speedup_vs_baseline")),
    "  torch cross_entropy": ("{:.0f} GB/s", (CE, "torch cross_entropy", "gbps")),
    "  16-byte: GB/s, of the ceiling, vs torch": ("{:.0f}, {:.0%}, {:.2f}x", *(
        (CE, "fused, 16-byte loads", field) for field in ("gbps", "fraction_of_ceiling", "speedup_vs_baseline"))),
    "cross-entropy backward: 4-byte / 16-byte (of the ceiling)": (
        "{:.0%} / {:.0%}", (CEB, "fused, block per row", "fraction_of_ceiling"),
        (CEB, "fused, 16-byte", "fraction_of_ceiling")),
    "  16-byte vs the hand-written torch version": ("{:.1f}x", (CEB, "fused, 16-byte", "speedup_vs_baseline")),
    "sweep, GB/s: 1000 columns / 1025 (torch) / 32000 (torch)": ("{:.0f} / {:.0f} ({:.0f}) / {:.0f} ({:.0f})", *(
        lambda size=size, variant=variant: chapter.figure(SWEEP, variant, "gbps", size=size)
        for size, variant in (("33554x1000", "warp/block per row"), ("32736x1025", "warp/block per row"),
                              ("32736x1025", "torch.softmax"), ("1048x32000", "warp/block per row"),
                              ("1048x32000", "torch.softmax")))),
    "  one thread per row at 32000 columns": (
        "{:.0f} GB/s", lambda: chapter.figure(SWEEP, "one thread per row", "gbps", size="1048x32000")),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch06.N` and `# <<< ch06.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch06`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch06.1")

# %%
exercises.show("ch06.2")

# %%
exercises.show("ch06.3")

# %%
exercises.show("ch06.4")

# %% [markdown]
# ## More to try
# 1. Change `WARP_ROW_BLOCKS_PER_SM` (16) to 2, to 64, and to "one block per 4 rows" with
#    `wide=False`; then compile the 4-byte register kernel with `cuda.jit(max_registers=64)`.
#    Predict, then measure against `torch.softmax` on 49152 x 1024.
# 2. Make the register kernel handle 2048 columns (64 values per lane). Look at
#    `get_regs_per_thread()` and `get_local_mem_per_thread()`: what happens, and what does it cost?
# 3. Write a fused `log_softmax` (out = x - lse) with the online pass. How many bytes does it move?
# 4. The backward uses the float32 lse of the forward. At logits of 1e4, `lse` carries an absolute
#    error up to 1e4 x 2^-24 ≈ 6e-4. Measure the gradient's relative error and propose a fix.
# 5. Replace the tree mean by `cuda.atomic.add` from each row group. What changes, and is the sum
#    still the same from run to run?
# 6. Label smoothing: loss = (1-ε)(lse - x[t]) + ε(lse - mean(x)). Add it to the fused forward
#    without a second read of the logits.
#
# ## References
# - J. Han, B. Sharma, *Learn CUDA Programming* (Packt, 2019), ch. 10: the loss layer this chapter starts from.
# - M. Milakov, N. Gimelshein, "Online normalizer calculation for softmax" (2018).
# - OneFlow, "How to implement an efficient Softmax CUDA kernel" (2021): a warp per row in
#   registers up to 1024 columns, a block per row with shared memory above.
# - NVIDIA, *CUDA C++ Programming Guide*, "Warp Shuffle Functions".
