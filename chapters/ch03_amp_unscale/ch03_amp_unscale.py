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
# # Chapter 03 — check_finite_and_unscale over hundreds of tensors: one launch, not hundreds
#
# In this chapter you will learn
# - why a loop of small kernel launches is slow however good each kernel is: a launch from Python
#   costs ~15-20 µs, while 4,096 gradients take a few *nanoseconds* of memory time;
# - how **one** numba kernel reaches hundreds of independently allocated arrays: a device table
#   of base addresses and tile offsets, an address turned into a typed pointer by a tiny
#   intrinsic, and a binary search over offsets staged in shared memory;
# - the rest of a fast memory-bound kernel: 16-byte vector loads, several in flight per thread,
#   a flag kept in a register and written once per block, a scale read on the device;
# - how a **dynamic loss scaler** (`torch.amp.GradScaler`'s rule) uses the kernel in a small
#   mixed-precision training loop without the host ever waiting for the GPU.
#
# The case: PyTorch's `torch._amp_foreach_non_finite_check_and_unscale_` and PaddlePaddle's
# `check_finite_and_unscale`. After the backward pass of a *scaled* loss, every gradient is
# multiplied by `1/scale`, and one flag, `found_inf`, records whether any value was Inf or NaN:
# if so, the optimizer skips the step and the scale is lowered.
#
# Without a GPU this notebook runs in numba's CUDA simulator: every kernel runs and is checked on
# small lists; times mean nothing there, so each comparison is followed by the stored figures of the reference GPU.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import warnings

import numpy as np

import workbook
from workbook import cuda, device_check, plots
from workbook.host import standard_normals

from chapters.ch03_amp_unscale import kernels as k

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch03", "check_finite_and_unscale: per-tensor launches vs one fused launch")
rng = np.random.default_rng(0)


def device_list(host_arrays):
    """Each gradient in its own device allocation, as a framework's gradients are."""
    return [cuda.to_device(h) for h in host_arrays]


def flag(value):
    return cuda.to_device(np.array([value], dtype=np.float32))


# %% [markdown]
# ## The reference
#
# For each gradient `g`: `g * inv_scale`, computed in float32 and stored back in `g`'s dtype
# (float32 or float16), and `found_inf = 1.0` if any value of any gradient is not finite.
#
# **Which value is checked?** The *input*, before the multiply — PyTorch's convention, which we
# follow so that our results and torch's agree bit for bit. It matters only for float16 with
# `inv_scale > 1` (a loss scale below 1): a finite 60000 times 2 overflows to Inf *after* the check
# and does not raise the flag. A loss scaler keeps `scale >= 1` in practice, where unscaling only
# shrinks values and cannot overflow.

# %%
workbook.show(k.unscale_reference)

# %% [markdown]
# ## Naive: one launch per tensor
#
# One element per thread, one launch per gradient, every launch writing the same `found_inf`
# (all writers write 1.0, so no atomic is needed). Each element costs 8 bytes of memory traffic
# for float32; 4,096 of them take ~3 ns at 3 TB/s. The launch costs thousands of times more.

# %%
workbook.show(k.unscale_one_tensor_kernel)

# %% [markdown]
# ## Fused: reaching 300 arrays from one kernel
#
# A numba kernel takes a fixed list of arguments, and every array argument costs host time at
# each launch (several µs: numba unpacks its shape, strides and pointer). Passing 300 arrays is
# out. What the kernel needs of each gradient is two integers: **where it starts** (its device
# address) and **how long it is**. So the host writes them once into one int64 table on the device:
#
#     table[ADDRESS, t]      base address of gradient t   (arr.__cuda_array_interface__["data"][0])
#     table[SIZE, t]         its number of elements
#     table[TILE_START, t]   its first tile; table[TILE_START, n] = number of tiles in all
#
# Each gradient is cut into tiles of `TILE` = 256 threads x 16 elements = 4,096 elements (its last
# tile may be partial, an empty gradient has none), so every tile belongs to one gradient. The grid
# has a block per tile (sized to the data, like chapter 00's fastest copy; the kernel's tile loop
# is a grid stride, so a smaller grid would be correct too, only slower); a block finds its tile's
# gradient by a binary search over the tile starts, which it stages in shared memory:
#
#     tile starts:  [0, 2, 2, 3, 7]        gradients 0..3 own tiles [0,2) [2,2) [2,3) [3,7)
#     tile 2 -> the last t with start[t] <= 2 -> t = 2   (gradient 1 is empty and owns nothing)
#
# The address becomes a pointer through `tensor_pointer(address, element_type)`. On a GPU it is a
# numba *intrinsic* — a function whose body is LLVM IR: one `inttoptr`. Its siblings `load4` and
# `store4` move four elements with one 16-byte instruction (`ld.global.v4.f32`), which is what gets
# a numba kernel close to the copy ceiling. The simulator has no device addresses, so there the
# same names are plain Python: the "address" is where NumPy keeps the data, and `tensor_pointer`
# looks the array up in a dict that `GradientList` filled. The kernel's source is one and the same.

# %%
import inspect

source = inspect.getsource(k)  # both implementations, GPU and simulator, as kernels.py has them
print(source[source.index("# [address helpers: begin]"):source.index("# [address helpers: end]")])
workbook.show(k.find_tensor)

# %% [markdown]
# The kernel. In a full tile each thread issues four independent 16-byte loads (64 bytes in
# flight), checks the 16 values and stores them scaled; a warp's loads cover 512 consecutive bytes.
# The flag lives in a register until the end, when one `syncthreads_or` per block decides whether
# thread 0 writes `found_inf`. The scale is read from device memory: the host never has to know it.

# %%
workbook.show(k.unscale_fused_kernel)

# %% [markdown]
# The host side is built **once** for a list of gradients: `GradientList` checks every array
# (dtype, device, alignment), writes the table and configures the launch. A training step then
# costs one launch — the host work per call does not grow with the number of tensors.

# %%
workbook.show(k.unscale_fused)

# %% [markdown]
# ## Check first
#
# Sizes 1, 31, 32, 33, 1000, one not a multiple of the tile, a large odd one, and an empty tensor;
# then Inf, -Inf and NaN placed as the first element of the first tensor, the last element of the
# last tensor and inside a middle tensor; a single tensor; 1000 tiny tensors; and the float16
# overflow convention. Both kernels, float32 and float16, against NumPy, bit for bit.

# %%
big_odd = workbook.size(gpu=(1 << 22) + 3, sim=3001)
awkward_sizes = [1, 31, 32, 33, 0, 1000, k.TILE + 7, big_odd]
wrappers = (k.unscale_per_tensor, k.unscale_fused)


def check_case(host_arrays, inv_scale, label):
    expected_grads, expected_flag = k.unscale_reference(host_arrays, inv_scale)
    for unscale in wrappers:
        grads = k.GradientList(device_list(host_arrays))
        found_inf, out = unscale(grads, flag(0.0), flag(inv_scale))
        name = f"{unscale.__name__} {label}"
        k.assert_unscaled(found_inf, expected_flag, name)
        k.assert_unscaled(out, expected_grads, name)
    return expected_flag[0]


bad_sizes = [1, 33, 0, 1000, k.TILE + 7]  # Inf/NaN cases: a shorter list, the same edges
for dtype in k.GRAD_DTYPES:
    clean = [rng.standard_normal(n).astype(dtype) * 100 for n in awkward_sizes]
    check_case(clean, 1 / 1024, f"{np.dtype(dtype)} sizes {awkward_sizes}")
    for bad in (np.inf, -np.inf, np.nan):
        for where in ("first of first", "last of last", "middle tensor"):
            arrays = [rng.standard_normal(n).astype(dtype) for n in bad_sizes]
            if where == "first of first":
                arrays[0][0] = bad
            elif where == "last of last":
                arrays[-1][-1] = bad
            else:
                arrays[bad_sizes.index(1000)][500] = bad
            assert check_case(arrays, 1 / 1024, f"{np.dtype(dtype)} {bad} {where}") == 1.0
    check_case([rng.standard_normal(big_odd).astype(dtype)], 0.5, f"{np.dtype(dtype)} one tensor")
print("both kernels agree with NumPy at sizes", awkward_sizes, "with Inf, -Inf, NaN anywhere")

tiny = [rng.standard_normal(n, dtype=np.float32) for n in rng.integers(0, 9, size=1000)]
tiny[-1][-1:] = np.nan
assert check_case(tiny, 0.125, "1000 tiny tensors") == 1.0
print("1000 tiny tensors (0-8 elements): agree, found_inf set by the very last element")

# float16 values that overflow after unscaling: checked before the multiply, so no flag.
overflow = [np.array([60000.0, -60000.0, 1.0], dtype=np.float16)]
with warnings.catch_warnings():  # NumPy (and the simulator) warn of the overflow; it is the point
    warnings.simplefilter("ignore", RuntimeWarning)
    assert check_case(overflow, 2.0, "float16 overflow after unscale") == 0.0
print("float16 60000 * 2 -> Inf, found_inf stays 0 (the input was finite): PyTorch's convention")

# %% [markdown]
# ## 300 tensors of 4,096 float32: launch-bound
#
# 300 x 4,096 float32 is 4.9 MB read and 4.9 MB written: ~3 µs of HBM time. The per-tensor loop
# pays 300 launches; the fused kernel one. torch's fused call (`_amp_foreach_...`) does its host
# work in C++ (tens of µs for 300 tensors) and launches one kernel per chunk of its tensor list.
#
# Every variant unscales the same buffers in place, so each one's first run is checked against the
# reference and the gradients are then restored before the next variant's first run (the timed
# runs that follow keep shrinking the values: that changes no byte counts).

# %%
def benchmark_list(sizes, key, *, dtype=np.float32, show=True, repeats=None, label=None):
    host = standard_normals(rng, sizes, dtype)  # on every core: 600M values take a while
    pristine = device_list(host)
    grads = k.GradientList([cuda.device_array_like(p) for p in pristine])

    def restore():
        for grad, original in zip(grads.flat, pristine):
            grad.copy_to_device(original)

    restore()
    inv_scale = flag(1 / 1024)
    expected = k.unscale_reference(host, 1 / 1024)
    flags = {name: flag(0.0) for name in ("per-tensor", "fused", "torch")}
    torch = workbook.bench.optional_torch()  # None in the simulator: the baseline is skipped
    torch_grads = [workbook.bench.torch_view(a) for a in grads.arrays]
    torch_found, torch_inv = workbook.bench.torch_view(flags["torch"]), workbook.bench.torch_view(inv_scale)

    def run_torch():
        torch._amp_foreach_non_finite_check_and_unscale_(torch_grads, torch_found, torch_inv)
        return torch_found, grads

    def check_then_restore(out, ref, name):
        k.assert_unscaled(out, ref, name)
        if isinstance(out, k.GradientList):
            restore()

    # On a GPU each variant's gradients are checked where they lie: the expected ones are copied
    # to the device for the first variant's check and kept for the others' (2.4 GB at 600M).
    with device_check.keeping():
        comparison = chapter.compare(
            key,
            {
                "per-tensor launches": lambda: k.unscale_per_tensor(grads, flags["per-tensor"], inv_scale),
                "fused, one launch": lambda: k.unscale_fused(grads, flags["fused"], inv_scale),
            },
            reference=(expected[1], expected[0]),
            check=check_then_restore,
            poison_outputs=False,  # in place: the check restores the gradients instead
            baselines={"torch _amp_foreach_non_finite_check_and_unscale_": run_torch},
            bytes=2 * np.dtype(dtype).itemsize * int(np.sum(sizes)),  # each element read once, written once
            size=label or f"{len(sizes)} tensors, {int(np.sum(sizes)):,} float32",
            show=show,
            repeats=repeats,
        )
    return comparison, grads


TORCH = "torch _amp_foreach_non_finite_check_and_unscale_"
n_small = workbook.size(gpu=4096, sim=64)
small, small_grads = benchmark_list([n_small] * 300 if workbook.ON_GPU else [n_small] * 30, "300x4096")
chapter.bar("300x4096 float32: fused vs per-tensor loop (speed-up)",
            small.ratio("per-tensor launches", "fused, one launch"), at_least=20)
chapter.bar("300x4096 float32: fused time / torch fused time",
            small.ratio("fused, one launch", TORCH), at_most=1.5)
chapter.bar("kernel launches per fused call, 300 tensors", len(small_grads.launches), at_most=1)

# %% [markdown]
# ## 300 tensors of mixed sizes, ~600M elements: bandwidth-bound
#
# Now the data dominates: ~600M float32 gradients, 2.4 GB read and 2.4 GB written per call, sizes
# spread over four orders of magnitude and mostly not multiples of 4,096 (so every tensor ends in
# a partial tile). The yardstick is the copy ceiling measured in this run.

# %%
total = workbook.size(gpu=600_000_000, sim=6_000)
count = workbook.size(gpu=300, sim=20)
weights = rng.lognormal(mean=0.0, sigma=1.5, size=count)
mixed_sizes = np.maximum(1, (weights / weights.sum() * total).astype(np.int64) + rng.integers(0, 4, count))
mixed, mixed_grads = benchmark_list(mixed_sizes, "300 mixed",
                                    label=f"{count} tensors of {mixed_sizes.min():,}..{mixed_sizes.max():,}, "
                                          f"{int(mixed_sizes.sum()):,} float32")
chapter.bar("mixed ~600M float32: fused, fraction of the copy ceiling", mixed.fraction("fused, one launch"),
            at_least=0.95)
del mixed_grads  # 2.4 GB of device memory

# %% [markdown]
# The same sizes in float16 (no bar): half the bytes, and the same kernel moving 8-byte vectors
# (four halves) instead of 16-byte ones.

# %%
mixed16, mixed16_grads = benchmark_list(mixed_sizes, "300 mixed float16", dtype=np.float16,
                                        label=f"{count} tensors, {int(mixed_sizes.sum()):,} float16")
del mixed16_grads

# %% [markdown]
# ## Time vs number of tensors
#
# Tensors of 4,096 float32, from 1 to 1,000. The per-tensor loop grows by one launch per tensor;
# the fused kernel stays at one launch until the data itself starts to count.

# %%
counts = workbook.size(gpu=[1, 3, 10, 30, 100, 300, 1000], sim=[1, 3, 10])
series = {"per-tensor launches": [], "fused, one launch": [], TORCH: []}
for n_tensors in counts:
    result, _ = benchmark_list([n_small] * n_tensors, "tensors sweep", show=False, repeats=20,
                               label=f"{n_tensors} x {n_small} float32")
    ran = [t.name for t in result.timings]
    for name in series:
        series[name].append(result[name].median_ms if name in ran and workbook.ON_GPU else None)

if workbook.ON_GPU:
    figure = plots.sweep(counts, series, xlabel=f"number of tensors of {n_small:,} float32",
                         ylabel="ms per call (median)", title="check_finite_and_unscale: time vs tensors",
                         logy=True)
    chapter.savefig(figure, "tensors_sweep")
else:
    print("simulator: the sweep ran and was checked at", counts, "tensors - the plot needs a GPU's times.")
    chapter.show_stored_figure("tensors_sweep")  # the same plot, measured on the reference GPU

# %% [markdown]
# ## A dynamic loss scaler and a mixed-precision training loop
#
# float16 holds magnitudes up to 65,504 and loses gradients below ~6e-8. Training multiplies the
# loss by a large *scale* so that small gradients survive the float16 backward pass, then unscales
# them. The scale is adjusted as training goes (`torch.amp.GradScaler`'s rule):
# - a step with an Inf or NaN gradient is **skipped**, and the scale is multiplied by 0.5;
# - after `growth_interval` good steps in a row, the scale is multiplied by 2.
#
# All of the scaler's state — scale, 1/scale, found_inf, the count of good steps — lives in device
# memory, and one one-thread kernel updates it. The optimizer's step kernel reads `found_inf` on
# the device to skip a step. So the host never waits for a flag. (Our toy model computes its
# float32 gradient with NumPy on the host, so this loop does copy the weights back each step; the
# float16 "backward" — the scaled gradient rounded to float16 — is a kernel.)

# %%
workbook.show(k.update_scale)  # the rule, a device function: chapter 08's training step calls it too
workbook.show(k.update_scale_kernel)

# %%
features, samples = 40, 256
train_rng = np.random.default_rng(1)  # its own generator: the same run on a GPU and in the simulator
X = train_rng.standard_normal((samples, features), dtype=np.float32)
true_w = (3 * train_rng.standard_normal(features)).astype(np.float32)
y = X @ true_w
pieces = [24, 15, 1]  # the model's parameters, as three separately allocated tensors
params = device_list([np.zeros(n, dtype=np.float32) for n in pieces])
grads32 = device_list([np.zeros(n, dtype=np.float32) for n in pieces])
grads16 = k.GradientList(device_list([np.zeros(n, dtype=np.float16) for n in pieces]))
steps = 60
scaler = k.DynamicLossScaler(init_scale=2.0**16, growth_interval=10, max_steps=steps)
lr = np.float32(0.05)
threads = 32
losses = []
for step in range(steps):
    w = np.concatenate([p.copy_to_host() for p in params])
    residual = X @ w - y
    losses.append(float(np.mean(residual**2)))
    g = (2 / samples) * (X.T @ residual)
    for piece, target, start in zip(grads32, grads16.flat, np.cumsum([0] + pieces[:-1])):
        piece.copy_to_device(g[start:start + piece.size].astype(np.float32))
        # the float16 backward pass of (loss * scale): Inf where scale * g > 65504
        k.scale_to_half_kernel[-(-piece.size // threads), threads](piece, scaler.scale, target)
    scaler.unscale_(grads16)  # one launch for all three tensors
    for param, grad in zip(params, grads16.flat):
        k.sgd_step_kernel[-(-param.size // threads), threads](param, grad, lr, scaler.found_inf)
    scaler.update()

scales = scaler.history.copy_to_host()[:steps]
skipped = int(np.sum(scales[1:] < scales[:-1]))
print(f"loss {losses[0]:.3g} -> {losses[-1]:.3g} in {steps} steps; {skipped} steps skipped (Inf in float16)")
print("scale at each step:", " ".join(f"{s:g}" for s in scales[:24]), "...")
assert losses[-1] < 1e-2 * losses[0], "the loop did not train"
assert skipped >= 1 and scales.max() > scales.min(), "the scaler never backed off"
assert np.all(np.exp2(np.round(np.log2(scales))) == scales), "scales must stay powers of two"

# The plot needs no timing: the simulator draws the same one (it is stored from the GPU run).
figure, (top, bottom) = plots.plt.subplots(2, 1, figsize=(7, 5), sharex=True)
top.step(range(steps), scales, where="post")
top.set_yscale("log", base=2)
top.set_ylabel("loss scale")
bottom.plot(losses)
bottom.set_yscale("log")
bottom.set_ylabel("loss")
bottom.set_xlabel("step")
top.set_title("Dynamic loss scaling: back off on Inf, grow after 10 good steps")
if workbook.ON_GPU:
    chapter.savefig(figure, "loss_scale")

# %% [markdown]
# ## What the numbers mean
#
# - **300 x 4,096 is launch-bound.** Each tensor is 16 KB, moved in about a microsecond. The
#   per-tensor loop is 300 kernel launches (its host time, launches from Python, is larger still:
#   chapter 07); the fused kernel is one.
# - **The sweep** shows how each grows with the list. The loop adds a launch per tensor. The fused
#   kernel stays one launch whatever the count, until the bytes it reads and writes start to count.
#   torch launches one kernel per group of tensors (its multi-tensor apply packs a bounded number of
#   tensor pointers per launch), so it starts level with ours and falls behind as the list grows.
# - **600M elements is bandwidth-bound.** The table, the binary search and the partial tiles cost next
#   to nothing; what counts is bytes in flight (four 16-byte loads per thread) and few instructions
#   per byte. The grid matters: a block per tile beats a few resident blocks per SM looping over the
#   tiles (`grid_sweep.py` beside this notebook).
# - **One launch per call** for lists of up to `MAX_TENSORS_PER_LAUNCH` = 4,096 tensors (their tile
#   starts fill 16 KiB of shared memory); a longer list takes one launch per 4,096 tensors.
#
# The figures these bullets point to:

# %%
_mixed, _mixed16, _sweep = "300 mixed", "300 mixed float16", "tensors sweep"
_fused = "fused, one launch"
chapter.show_figures({
    "300 x 4,096: per-tensor loop / fused / torch": ("{}", lambda: "{:.3f} / {:.4f} / {:.4f} ms".format(
        chapter.figure("300x4096", "per-tensor launches"), chapter.figure("300x4096", _fused),
        chapter.figure("300x4096", TORCH))),
    "  fused vs the loop (speed-up)": ("{:.0f}x", lambda: chapter.figure(
        "300x4096 float32: fused vs per-tensor loop (speed-up)")),
    "fused: 1 tensor / 1,000 tensors": ("{}", lambda: "{:.4f} / {:.4f} ms".format(
        chapter.figure(_sweep, _fused, size="1 x "), chapter.figure(_sweep, _fused, size="1000 x "))),
    "torch: 1,000 tensors": ("{:.4f} ms", lambda: chapter.figure(_sweep, TORCH, size="1000 x ")),
    "~600M float32: fused / torch (of the copy ceiling)": ("{}", lambda: "{:.1%} / {:.0%}".format(
        chapter.figure(_mixed, _fused, "fraction_of_ceiling"), chapter.figure(_mixed, TORCH, "fraction_of_ceiling"))),
    "~600M float16: fused / torch (of the copy ceiling)": ("{}", lambda: "{:.0%} / {:.0%}".format(
        chapter.figure(_mixed16, _fused, "fraction_of_ceiling"),
        chapter.figure(_mixed16, TORCH, "fraction_of_ceiling"))),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch03.N` and `# <<< ch03.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch03`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch03.1")

# %%
exercises.show("ch03.2")

# %%
exercises.show("ch03.3")

# %%
exercises.show("ch03.4")

# %% [markdown]
# ## More to try
# 1. Change `VECTORS_PER_THREAD`'s worth of loads in the full-tile path from 4 to 2 (and the tile
#    with it). Predict the effect on the 600M case, then measure.
# 2. The binary search runs once per tile. Replace it by a host-built table "tile -> tensor"
#    (PyTorch's multi_tensor_apply has one per launch). What does it cost in memory, and in time?
# 3. Check *after* the multiply instead of before. Which test changes, and which framework would
#    you then agree with?
# 4. Give the scaler a `skipped_steps` counter on the device, and read it once at the end.
# 5. Make float16 gradients use 16-byte loads (8 halves): what must change in `load4`/`store4`?
#
# ## References
# - PyTorch, `aten/src/ATen/native/cuda/AmpKernels.cu` (`_amp_foreach_non_finite_check_and_unscale_`)
#   and `MultiTensorApply.cuh`; `torch.amp.GradScaler`.
# - PaddlePaddle, `check_finite_and_unscale` operator and its fused CUDA kernel.
# - P. Micikevicius et al., "Mixed Precision Training", ICLR 2018.
# - numba-cuda documentation, "Extending: intrinsics" (`numba.cuda.extending.intrinsic`).
