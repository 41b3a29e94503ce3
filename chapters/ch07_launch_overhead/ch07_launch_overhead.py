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
# # Chapter 07 — What a call from Python costs: launch overhead and CUDA graphs
#
# In this chapter you will learn
# - that a kernel call has two costs: the GPU's time, which chapters 00-06 measure, and the host's
#   time to issue it, which a `%timeit` or a training loop pays as well — and when the second is
#   the larger (a kernel is *launch-bound*);
# - where a numba launch spends its host time (typing the arguments, finding the overload,
#   marshalling each array into 5 + 2·ndim parameters), how it grows with the number of array
#   arguments, and what a torch op and the driver itself cost;
# - three ways to pay less: a **prepared launch** that checks and packs its arguments once, a
#   launch straight through the driver (`cuLaunchKernel`, cuda-python), and a **CUDA graph** that
#   captures a whole step of launches once and replays it with one call;
# - what viewing a torch tensor as a numba array costs a wrapper, and how a kept view spares it at
#   every call.
#
# Without a GPU this notebook runs in the simulator: every path runs and is checked (a prepared
# launch and a graph fall back to plain launches there, and say so), and the stored figures of the reference GPU
# follow each comparison.

# %%
# Reload an edited launch.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import cProfile
import io
import pstats

import numpy as np

import workbook
from workbook import bench, cuda, plots

from chapters.ch01_relu_mask import batchnorm as bn
from chapters.ch01_relu_mask import kernels as relu
from chapters.ch01_relu_mask import measuring as ch01
from chapters.ch07_launch_overhead import launch as L
from chapters.ch07_launch_overhead import measuring

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch07", "Launch overhead and CUDA graphs")
rng = np.random.default_rng(0)
torch = bench.optional_torch()

# %% [markdown]
# ## Two costs of one call
#
# `compare` (chapter 00) now reports both for every variant: **median ms**, the GPU's time (the GPU
# is held until Python has queued the whole call, so none of Python's time is in it), and
# **host us/call**, what the call costs the CPU (calls queued back to back while the GPU is held).
# A kernel whose GPU time is below its host cost cannot be fed fast enough from a Python loop: the
# GPU idles between calls. First, the launch alone: empty kernels with 0 to 8 array arguments.

# %%
workbook.show(L.empty_2)
small = [cuda.to_device(np.zeros(32, np.float32)) for _ in range(8)]
empty_variants = {f"numba, {n} array args": (lambda n=n: L.EMPTY[n][1, 32](*small[:n])) for n in L.EMPTY}
baselines = {}
if torch is not None:
    t_small = [bench.torch_view(a) for a in small[:2]]
    baselines["torch.neg(out=) on 32 floats"] = lambda: torch.neg(t_small[0], out=t_small[1])
empty = chapter.compare("empty launches", empty_variants, baselines=baselines, size="1 block of 32 threads")

# %% [markdown]
# Each array argument is 5 + 2·ndim kernel parameters (meminfo, parent, size, itemsize, data pointer,
# shape, strides) that numba types (`typeof`) and packs at every call; the driver's own cost is a
# few microseconds whatever the arguments.
#
# ## Where a wrapper's time goes
#
# A chapter's wrapper adds its checks to numba's launch. cProfile of 2000 calls of chapter 01's
# `relu_mask_quads` on a small array (the GPU work is nothing; what is left is the host):

# %%
n_small = 4096
x_small = cuda.to_device(rng.standard_normal(n_small, dtype=np.float32))
y_small = cuda.device_array_like(x_small)
mask_small = cuda.device_array(relu.mask_words(n_small), np.uint32)
relu.relu_mask_quads(x_small, y_small, mask_small)  # compile outside the profile
profile = cProfile.Profile()
profile.enable()
for _ in range(workbook.size(gpu=2000, sim=5)):
    relu.relu_mask_quads(x_small, y_small, mask_small)
profile.disable()
cuda.synchronize()
report = io.StringIO()
pstats.Stats(profile, stream=report).sort_stats("tottime").print_stats(12)
print("\n".join(line for line in report.getvalue().splitlines() if line.strip())[:3000])

# %% [markdown]
# ## A prepared launch
#
# Everything numba does per call depends only on the arguments' types and the launch
# configuration, which in a training loop are the same at every step. `PreparedLaunch` does it
# once — types, overload, numba's own marshalling (`_prepare_args`) — and keeps the result; a call
# then hands the packed parameters to the driver, either through `cuda.core.launch` or through
# `cuLaunchKernel` itself with the array of parameter pointers built once. The arguments are
# fixed: the same buffers at every call (their contents may change).

# %%
workbook.show(L.PreparedLaunch)

# %%
n_scale = 1 << 12
x_scale = cuda.to_device(rng.standard_normal(n_scale, dtype=np.float32))
out_scale = cuda.device_array_like(x_scale)
threads = 256
blocks = -(-n_scale // threads)
factor = np.float32(1.5)
bound = L.scale_kernel[blocks, threads]  # the configuration bound once
prepared_core = L.PreparedLaunch(L.scale_kernel, blocks, threads, x_scale, factor, out_scale, via="cuda.core",
                                 returns=out_scale)
prepared_driver = L.PreparedLaunch(L.scale_kernel, blocks, threads, x_scale, factor, out_scale, returns=out_scale)


def scale_plain():
    L.scale_kernel[blocks, threads](x_scale, factor, out_scale)
    return out_scale


def scale_bound():
    bound(x_scale, factor, out_scale)
    return out_scale


print("prepared launches:", prepared_core.how, "|", prepared_driver.how)
launch_variants = {
    "kernel[grid, block](...)": scale_plain,
    "bound launcher": scale_bound,
    "prepared, cuda.core.launch": prepared_core,
    "prepared, cuLaunchKernel": prepared_driver,
}
baselines = {}
if torch is not None:
    t_x, t_out = bench.torch_view(x_scale), bench.torch_view(out_scale)
    baselines["torch.mul(out=)"] = lambda: torch.mul(t_x, 1.5, out=t_out)
launches = chapter.compare("scale, 4096 floats", launch_variants, baselines=baselines,
                           reference=lambda: L.scale_reference(x_scale.copy_to_host(), factor),
                           size=f"n={n_scale}")
if workbook.ON_GPU and torch is not None:
    host = {row["variant"]: row["host_us"] for row in chapter.cases[-1]["rows"]}
    print(f"host cost per call: plain {host['kernel[grid, block](...)']:.1f} us, prepared through the driver "
          f"{host['prepared, cuLaunchKernel']:.1f} us, torch {host['torch.mul(out=)']:.1f} us")
    chapter.bar("scale kernel: prepared launch host cost / torch op host cost",
                host["prepared, cuLaunchKernel"] / host["torch.mul(out=)"], at_most=3)

# %% [markdown]
# ## Apply it: the prepared paths of chapters 01, 02 and 06
#
# Each chapter's optimized wrapper now has a prepared twin that runs the wrapper's checks and picks
# its kernel and grid once, then launches at the driver's cost: `prepare_relu_mask_quads`,
# `prepare_dropout_bitmask` (each step a new Philox offset, stored into the packed parameters with
# `PreparedLaunch.set`) and `prepare_softmax`. Host cost per call against the plain wrapper and
# torch's op, on small arrays where the host is all there is.

# %%
from chapters.ch02_dropout import kernels as dropout  # noqa: E402
from chapters.ch06_softmax import kernels as softmax  # noqa: E402

n_apply = workbook.size(gpu=1 << 16, sim=300)
xa = cuda.to_device(rng.standard_normal(n_apply, dtype=np.float32))
ya, maska = cuda.device_array_like(xa), cuda.device_array(relu.mask_words(n_apply), np.uint32)
ta = bench.torch_view(xa)
applied = {}
applied["ch01 relu + mask"] = chapter.compare(
    "ch01 relu + mask, host cost",
    {"wrapper relu_mask_quads": lambda: relu.relu_mask_quads(xa, ya, maska),
     "prepared": relu.prepare_relu_mask_quads(xa, ya, maska)},
    reference=lambda: relu.relu_mask_reference(xa.copy_to_host()),
    check=lambda out, ref, name: workbook.assert_close(out, ref, exact=True, name=name),
    baselines={"torch.relu": lambda: torch.relu(ta)}, check_baselines=False, size=f"n={n_apply}")

drop_y, drop_mask = cuda.device_array_like(xa), cuda.device_array(-(-n_apply // 32), np.uint32)
drop_step = dropout.prepare_dropout_bitmask(xa, 0.1, 42, drop_y, drop_mask)
applied["ch02 dropout"] = chapter.compare(
    "ch02 dropout, host cost",
    {"wrapper dropout_bitmask": lambda: dropout.dropout_bitmask(xa, 0.1, 42, 0, drop_y, drop_mask),
     "prepared": lambda: drop_step(0)},
    reference=lambda: dropout.dropout_reference(xa.copy_to_host(), 0.1, 42, 0),
    check=lambda out, ref, name: workbook.assert_close(out, ref, exact=True, name=name),
    baselines={"torch native_dropout": lambda: torch.native_dropout(ta, 0.1, True)}, check_baselines=False,
    size=f"n={n_apply}")

rows_apply = workbook.size(gpu=64, sim=4)
xs = cuda.to_device(rng.standard_normal((rows_apply, 1024), dtype=np.float32))
outs = cuda.device_array_like(xs)
ts = bench.torch_view(xs)
applied["ch06 softmax"] = chapter.compare(
    "ch06 softmax, host cost",
    {"wrapper softmax": lambda: softmax.softmax(xs, outs), "prepared": softmax.prepare_softmax(xs, outs)},
    reference=lambda: softmax.softmax_reference(xs.copy_to_host()),
    baselines={"torch.softmax": lambda: torch.softmax(ts, -1)}, check_baselines=False,
    size=f"{rows_apply}x1024")
if workbook.ON_GPU and torch is not None:
    for name, case in zip(applied, chapter.cases[-3:]):
        host = {row["variant"]: row["host_us"] for row in case["rows"]}
        torch_host = host[next(v for v in host if v.startswith("torch"))]
        chapter.bar(f"{name}: prepared path host cost / torch op host cost", host["prepared"] / torch_host,
                    at_most=3)

# %% [markdown]
# ## The same wrappers with torch tensors
#
# Every wrapper also takes torch (and CuPy) CUDA tensors, viewed as numba arrays of the same memory.
# A view made afresh at every call (`cuda.as_cuda_array`) is host work at every call: torch builds
# `__cuda_array_interface__` in Python (a dict: pointer, shape, strides, typestr), numba builds a new
# `DeviceNDArray` from it (its layout and extent worked out, its memory described), and a launch
# that is not prepared types the new array again. `require` (workbook/inputs.py) keeps instead the
# view it made for each (data pointer, shape, strides, dtype, device) it has met, the most recently
# used `FOREIGN_VIEWS` of them, and reads those five from a torch tensor through torch's C accessors
# (`data_ptr()`, `shape`, `stride()`, `dtype`); the wrapper's `LaunchCache` then finds its prepared
# launch by the same address. What is kept:
# - every check, with the same message as for a numba array (dtype, shape, contiguity), and the
#   element alignment of the address, checked once per view;
# - the tensor's lifetime: a kept view holds nothing, so torch's caching allocator may free the
#   memory and hand it out again; a view is only found for a live tensor with exactly that pointer
#   and layout, which is exactly the view it needs. What a call gets is a copy of it that holds the
#   tensor, as `cuda.as_cuda_array`'s view did, so a wrapper may return it;
# - autograd's rules: a tensor that requires grad is refused (pass `x.detach()`), as torch's own
#   interface refuses it.
#
# The chapters' main wrappers (the copy, relu, dropout, unscale, convolution, merge and softmax) go
# one step shorter for a call they have met before: `TensorCalls` (workbook/launch.py) reads those
# same five of every tensor first, with the wrapper's options (p and seed for dropout), and finds
# the whole call: its checks passed then, and the memory, layouts and options that picked its
# kernels and grids are the same, so what is left is the launches (a new Philox offset stored into
# dropout's) and the views it returns. The first call with new tensors takes the full path: every
# check, the views, the launch cache.
#
# Host cost per call of each wrapper on torch tensors, against torch's op on the same tensors (and,
# on a GPU with wgmma, compute capability 9.0, chapter 09's GEMM at a small size, FP16):

# %%
with_torch = measuring.torch_tensor_calls(torch, rng, xa, xs, maska.size)  # name: (call, reference, check, torch's)
for name, (wrapper, reference, check, baseline) in with_torch.items():
    chapter.compare(f"{name}, torch tensors, host cost", {"wrapper, torch tensors": wrapper}, reference=reference,
                    check=check, baselines=baseline, check_baselines=False)
    host = {row["variant"]: row["host_us"] for row in chapter.cases[-1]["rows"]}
    chapter.bar(f"{name}: wrapper with torch tensors, host cost / torch op host cost",
                host["wrapper, torch tensors"] / host[next(iter(baseline))], at_most=2)
if not with_torch:
    print("No torch CUDA tensors here (the simulator, or torch before 2.3); the stored GPU figures, where there are:")
    for name in ("ch01 relu + mask", "ch02 dropout", "ch06 softmax", "ch09 gemm_bt 512^3 FP16"):
        chapter.show_stored(f"{name}, torch tensors, host cost")

# %% [markdown]
# ## When is a kernel launch-bound?
#
# The optimized kernels of chapters 01, 02 and 06 at growing sizes: each one's GPU time against
# the host cost of its wrapper and of its prepared launch (the wrapper's checks and grid, done
# once). Below the crossing, a loop of calls runs at the host's pace, whatever the kernel.

# %%
sweep_sizes = workbook.size(gpu=[1 << p for p in range(12, 27, 2)], sim=[1024, 2048])
sweeps = measuring.launch_bound(chapter, rng, sweep_sizes)
if workbook.ON_GPU:
    chapter.savefig(measuring.plot_launch_bound(sweep_sizes, sweeps), "launch_bound")
else:
    print("simulator: the sweeps ran and were checked at", sweep_sizes, "- the plot needs a GPU's times.")
    chapter.show_stored_figure("launch_bound")

# %% [markdown]
# ## A whole step as a CUDA graph
#
# A training step is many launches. Chapter 01's fused BatchNorm + Add + ReLU, forward and
# backward, is four kernels; at ResNet's first-stage shape 16x32x112x112 each runs for tens of
# microseconds, about what its launch costs in Python. A CUDA graph records the launches once —
# stream capture: every launch on the capturing stream becomes a node instead of running — and
# replays them all with one `cuGraphLaunch`: one call's host cost for the whole step. The step
# must launch on the stream it is given (the wrappers take `stream=`) and do nothing the capture
# cannot record (no allocation, no copy to the host, no synchronize).

# %%
workbook.show(L.StepGraph)

# %%
bn_shape = workbook.size(gpu=(16, 32, 112, 112), sim=(2, 3, 5, 7))
host_bn, d, refs = ch01.bn_case(rng, bn_shape, with_identity=True)  # chapter 01's buffers and references


def bn_step(stream=0):
    bn.batchnorm_relu_forward(d["x"], d["gamma"], d["beta"], d["running_mean"], d["running_var"], d["y"],
                              d["mask"], d["saved"], identity=d["identity"], stream=stream)
    bn.batchnorm_relu_backward(d["dy"], d["mask"], d["x"], d["gamma"], d["saved"], d["dx"], d["dgamma"],
                               d["dbeta"], d_identity=d["d_identity"], stream=stream)
    return d["dx"], d["d_identity"], d["dgamma"], d["dbeta"]


graph = L.StepGraph(bn_step)
print("graph:", graph.how)


def graph_step():
    graph()
    return d["dx"], d["d_identity"], d["dgamma"], d["dbeta"]


torch_step = None if torch is None else ch01.torch_bn_step(torch, host_bn, d)
step_result = chapter.compare(
    "bn+add+relu step: launches vs graph",
    {"4 launches from Python": bn_step, "graph replay": graph_step},
    reference=refs["grads"],
    # dgamma and dbeta (outputs 2 and 3) are sums over N*H*W = 200,704 values a channel: torch adds
    # them in float32, whose rounding grows with the count (ours add in float64)
    check=lambda out, ref, name: workbook.assert_close(
        out, ref, rtol=1e-3 if name.endswith(("output 2", "output 3")) else 1e-4, atol=1e-4, name=name),
    baselines={"torch eager (autograd)": torch_step},
    poison_outputs=False, size="x".join(map(str, bn_shape)),
)

# %% [markdown]
# What a training loop sees is neither column alone: it is the wall time per step of a loop,
# host and GPU overlapped. Measured as 200 steps back to back, synchronised once:

# %%
steps = workbook.size(gpu=200, sim=2)
walls = {"4 launches from Python": bench.loop_us(bn_step, steps), "graph replay": bench.loop_us(graph_step, steps)}
if torch_step is not None:
    walls["torch eager (autograd)"] = bench.loop_us(torch_step, steps)
for name, us in walls.items():
    print(f"{name:26s} {us:8.1f} us per step (wall, host included)")
chapter.record("bn+add+relu step, wall time per step (us)", walls)
if workbook.ON_GPU and torch_step is not None:
    chapter.bar("BN+add+relu fwd+bwd step 16x32x112x112 as a graph: wall per step / torch eager's",
                walls["graph replay"] / walls["torch eager (autograd)"], at_most=0.8)

# %% [markdown]
# ## Host cost per kernel, by approach
#
# The figures above side by side: what one kernel launch costs the host, from numba's plain call
# down to a graph replay (the BN step's host cost per step over its 4 kernels).

# %%
if workbook.ON_GPU:
    chapter.savefig(plots.bars(measuring.host_by_approach(chapter, torch is not None),
                               xlabel="host microseconds per kernel launch",
                               title="What a launch costs the host, by approach"), "host_by_approach")
else:
    chapter.show_stored_figure("host_by_approach")

# %% [markdown]
# ## What the numbers mean
#
# - **The launch is the floor of a small kernel.** An empty numba launch costs its host more with
#   every array it takes, and several times what the GPU spends running it.
# - **Most of numba's cost is per call, not per kernel**: typing each argument and packing each
#   array's parameters. A prepared launch does that once, and a call then costs what the driver's
#   `cuLaunchKernel` costs.
# - **The chapters' wrappers** keep the prepared launches they have made (`LaunchCache`), keyed by
#   each array's address, shape, strides and dtype, and store changed scalars into them; their
#   prepared twins skip the checks too.
# - **Where a kernel stops being launch-bound**: past some size the wrapper's GPU time passes its host
#   cost. Below it, a loop of calls runs at the host's pace, whatever the kernel.
# - **A torch tensor is read, not viewed afresh**: `require` finds the numba view it made for the
#   same pointer, shape, strides, dtype and device, read through torch's C accessors, and a call met
#   before finds its launches (`TensorCalls`); the kept views hold nothing (torch may reuse the
#   memory), the copies a call gets hold their tensors.
# - **A graph pays the host once per step**, whatever the number of kernels. It fixes the buffers (a
#   new shape is a new capture), which a training loop with static shapes has anyway: it is what
#   `torch.compile`'s "reduce-overhead" mode does. Chapter 05 captures its four-stream pipeline this
#   way, chapter 08 a whole training step.
#
# How the wrappers got here, with the figures of each step, is in [EXPERIMENTS.md](EXPERIMENTS.md).
# Host figures move by 10-50% between runs, torch's as much as numba's. The figures these bullets
# point to:

# %%
def crossing(key):
    """The first size of the sweep where the wrapper's GPU time exceeds its host cost."""
    for size in (1 << p for p in range(12, 27, 2)):
        at = f"{size:,} elements"
        if chapter.figure(key, "wrapper", size=at) * 1e3 > chapter.figure(key, "wrapper", "host_us", size=at):
            return f"2^{size.bit_length() - 1} elements"
    return "none of the sweep's sizes"


EMPTY, SCALE, STEP = "empty launches", "scale, 4096 floats", "bn+add+relu step: launches vs graph"
WALLS = "bn+add+relu step, wall time per step (us)"
APPLIED = {"relu + mask": ("ch01 relu + mask, host cost", "wrapper relu_mask_quads", "torch.relu"),
           "dropout": ("ch02 dropout, host cost", "wrapper dropout_bitmask", "torch native_dropout"),
           "softmax": ("ch06 softmax, host cost", "wrapper softmax", "torch.softmax")}
chapter.show_figures({
    "empty launch, host: 0 / 2 / 8 arrays": ("{:.0f} / {:.0f} / {:.0f} us", *(
        (EMPTY, f"numba, {n} array args", "host_us") for n in (0, 2, 8))),
    "  its GPU time / a torch op's host cost": ("{:.1f} / {:.0f} us", lambda: chapter.figure(
        EMPTY, "numba, 0 array args") * 1e3, (EMPTY, "torch.neg(out=) on 32 floats", "host_us")),
    "scale, host a call: prepared (cuLaunchKernel / cuda.core)": ("{:.1f} / {:.1f} us", *(
        (SCALE, v, "host_us") for v in ("prepared, cuLaunchKernel", "prepared, cuda.core.launch"))),
    "  kernel[grid, block](...) / torch.mul(out=)": ("{:.0f} / {:.0f} us", *(
        (SCALE, v, "host_us") for v in ("kernel[grid, block](...)", "torch.mul(out=)"))),
    **{f"{name}, host a call: prepared / wrapper / torch": ("{:.1f} / {:.0f} / {:.1f} us", *(
        (case, v, "host_us") for v in ("prepared", wrapper, op))) for name, (case, wrapper, op) in APPLIED.items()},
    **{f"{name}: GPU time passes host cost at": ("{}", lambda title=title: crossing(title))
       for name, (title, _) in zip(APPLIED, measuring.SWEEPS.values())},
    "BN step, wall a step: graph / 4 launches / torch eager": ("{:.0f} / {:.0f} / {:.0f} us", *(
        (WALLS, v) for v in ("graph replay", "4 launches from Python", "torch eager (autograd)"))),
    "  host a step: graph / 4 launches (their GPU time)": (
        "{:.1f} / {:.0f} us ({:.0f} us)", (STEP, "graph replay", "host_us"), (STEP, "4 launches from Python", "host_us"),
        lambda: chapter.figure(STEP, "4 launches from Python") * 1e3),
})

# %%
chapter.save()

# %% [markdown]
# ## More to try
# 1. Prepare all four launches of the BN step (`PreparedLaunch` per kernel) and compare the loop's
#    wall time with the graph's. What is left between them?
# 2. Capture the step on a torch stream instead (`torch.cuda.graph`, with numba launching on
#    `cuda.external_stream(torch.cuda.current_stream().cuda_stream)`).
# 3. Profile `conv2d_implicit` (chapter 04) with cProfile: which of its checks could move to a
#    prepared call?
#
# ## References
# - NVIDIA, *CUDA C++ Programming Guide*, "CUDA Graphs" (stream capture, instantiate, launch).
# - NVIDIA nvbench: the blocking kernel that separates launch cost from GPU time.
# - PyTorch, *CUDA Graphs* (torch.cuda.graph, make_graphed_callables).
