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
# # Chapter 10a — The LSTM layer: launches, fusion, and a persistent kernel
#
# An LSTM reads a sequence one step at a time, and each step needs the last one's output: the
# recurrence that makes it hard to keep a GPU busy. For each step t and each layer:
#
#     z   = x_t @ W_ih^T + h_{t-1} @ W_hh^T + b          (B, 4H): four gates side by side
#     i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);   g = tanh(z_g)
#     c_t = f * c_{t-1} + i * g;     h_t = o * tanh(c_t)
#
# In this notebook you will learn
# - why the LSTM "Learn CUDA Programming" builds from cuBLAS calls (a GEMM per gate per step, then
#   element-wise kernels) spends its time launching, not computing;
# - the rewrites of NVIDIA's "Optimizing Recurrent Neural Networks in cuDNN 5": the four gates as
#   one GEMM, the input term of every step hoisted into one big GEMM, the cell fused into one kernel;
# - Baidu's persistent RNN: one launch for the whole sequence, the recurrent weights kept in shared
#   memory, and a grid-wide barrier (`cuda.cg.this_grid().sync()`) between steps;
# - how to see where a step's time goes: named ranges, the host's launches and the GPU's kernels
#   on one timeline.
#
# Part b (`ch10b_wavefront.ipynb`) makes the persistent kernel fast (every layer in one wavefront,
# each step a tiled GEMM for a large batch, FP16 tensor cores) and sets every variant against
# cuDNN's LSTM at the book's sizes.
#
# Every variant is checked against a float64 NumPy LSTM (`reference.py`). Without a GPU, the
# simulator runs all of them on a small LSTM (its grid barrier included: the blocks of a
# cooperative launch run side by side there), and the reference GPU's stored figures follow each
# comparison.

# %%
# %load_ext autoreload
# %autoreload 2

import numpy as np

import workbook
from workbook import bench, cuda, host, timeline

from chapters.ch10_lstm import fused, layer, naive, persistent, profiling
from chapters.ch10_lstm import reference as ref
from chapters.ch10_lstm.comparing import (HIDDEN, INPUT, LAYERS, STEPS, atol, check, cudnn_call, inputs,
                                          optional_cudnn, rtol, torch_lstm, weights)

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch10a", "The LSTM layer: per-gate GEMMs, fused steps, a persistent kernel")
rng = np.random.default_rng(0)
torch = optional_cudnn()  # torch with TF32 off, or None
# The naive and fused LSTMs against each other: the first SLOW_STEPS steps of batch 64. Every step
# is the same work, so their ratio is the whole forward's; at the book's 512 steps the naive forward
# alone takes seconds a call, and a ratio of host-bound calls needs many rounds.
SLOW_STEPS, BATCH = workbook.size(gpu=32, sim=STEPS), workbook.size(gpu=64, sim=3)
print(f"T={STEPS} steps, I={INPUT}, H={HIDDEN}, {LAYERS} layers; tolerance rtol={rtol:g}, atol={atol:.2g}")

# %% [markdown]
# ## Naive: the book's structure, made correct
#
# Per step and per gate, two GEMMs (chapter 04's, our cuBLAS) and an activation kernel, then the
# cell and the hidden state: 14 launches a step a layer, 28,672 for the book's 512 steps and 4
# layers. Each launch is a small B x H piece of work, and the input term, which depends on no earlier
# step, is computed inside the loop anyway.

# %%
workbook.show(naive.NaiveLSTM._layer)
workbook.show(naive.gate_kernel)

# %% [markdown]
# ## Fused: one GEMM for all steps' inputs, one for the gates, one kernel for the cell
#
# `x_t @ W_ih^T` for every t is one (T·B, I) @ (I, 4H) GEMM before the loop: large enough to fill
# the GPU. What is left in the loop is the recurrence: one (B, H) @ (H, 4H) GEMM and one kernel
# that adds the three terms, applies the four activations and updates c and h. Two launches a step.
# The activations and the update are one device function, `lstm_cell`: every kernel from here on
# ends its step with it, and differs only in where the gates' sums come from.

# %%
workbook.show(fused.FusedLSTM._layer)
workbook.show(layer.lstm_cell)
workbook.show(fused.fused_cell_kernel)

# %% [markdown]
# ## Persistent: the recurrent weights stay on chip
#
# Even fused, each step reads W_hh (4H x H floats, 4 MB at H = 512) from memory again and pays two
# launches. A persistent kernel is launched once per layer: block k owns a few hidden units, copies
# their four gates' rows of W_hh into shared memory *once*, and then runs every step: stage
# h_{t-1}, a warp per weight row multiplies it (a shuffle reduction), a thread per unit applies the
# cell, and the grid meets at `grid.sync()` before anyone reads h_t. The grid must be resident at
# once, a block per SM: numba launches a kernel calling `cuda.cg.this_grid()` cooperatively and
# `max_cooperative_grid_blocks` says how large it may be; the wrapper refuses more.

# %%
workbook.show(persistent.persistent_layer_kernel)

# %% [markdown]
# ## The three against each other, and against cuDNN
#
# The whole forward (every layer, every step) from the same inputs, checked against the float64
# reference, then timed with CUDA events. The naive and fused LSTMs make thousands of launches a
# forward at the book's sizes, at any batch (their time is their launches'), so they are compared
# over the first steps of the sequence at batch 64 (every step is the same work: their ratio is the
# whole forward's), with the persistent kernel and cuDNN beside them.

# %%
net_naive, net_fused = naive.NaiveLSTM(weights), fused.FusedLSTM(weights)
net_persistent = persistent.PersistentLSTM(weights)
print(f"persistent: {net_persistent.blocks} blocks of {persistent.THREADS} threads, {net_persistent.units} "
      f"hidden units each, {net_persistent.shared_bytes} bytes of shared memory a block")
w_hh_bytes = 4 * 4 * HIDDEN * HIDDEN
chapter.record("recurrent weight bytes read per layer", {
    "layers": LAYERS, "fused: W_hh every step": STEPS * w_hh_bytes, "persistent: W_hh once": w_hh_bytes,
    "steps": STEPS, "W_hh bytes": w_hh_bytes})

x, h0, c0 = inputs(BATCH)
first_steps = [cuda.to_device(a) for a in (x[:SLOW_STEPS], h0, c0)]  # x's first steps
# The float64 reference, a loop over the steps, in a process of its own: it takes the host's
# seconds while the kernels below compile and run.
computing = host.in_process(ref.lstm_reference, x[:SLOW_STEPS], weights, h0, c0)
variants = {"naive: 2 GEMMs a gate a step": lambda: net_naive(*first_steps),
            "fused: hoisted input GEMM, fused cell": lambda: net_fused(*first_steps),
            "persistent: W_hh in shared memory": lambda: net_persistent(*first_steps)}
host_bound = list(variants)[:2]
# On a GPU every variant is called once, all at the same time, their kernels compiled side by side
# (bench.warm_up; the host-bound calls' outputs kept for their checks), and each launch of the naive
# and fused steps on its own beside them: a forward compiles its kernels one after the other.
bench.warm_up([*variants.values(), *net_naive.warm_ups(BATCH), *net_fused.warm_ups(first_steps[0])],
              keep=[variants[name] for name in host_bound])
slow_case = f"LSTM forward, batch {BATCH}, first {SLOW_STEPS} steps"
slow_comparison = chapter.compare(
    slow_case, variants,
    baselines={"torch.nn.LSTM (cuDNN)": cudnn_call(torch_lstm(), *(bench.torch_view(a) for a in first_steps))}
    if torch is not None else None,
    flops=2.0 * SLOW_STEPS * BATCH * 4 * HIDDEN * (INPUT + HIDDEN + (LAYERS - 1) * 2 * HIDDEN),
    reference=computing.result, check=check,
    size=f"T={SLOW_STEPS} I={INPUT} H={HIDDEN} L={LAYERS} B={BATCH}", repeats=15, seconds=6,
    wall_clock=host_bound)  # host-bound, both: each call's wall clock

# %%
if workbook.ON_GPU:
    chapter.bar(f"batch {BATCH}, {SLOW_STEPS} steps: fused vs naive (speed-up)",
                slow_comparison.ratio("naive: 2 GEMMs a gate a step", "fused: hoisted input GEMM, fused cell"),
                at_least=5)
else:  # the reference GPU's run of the same comparison, at the book's sizes
    chapter.show_stored("LSTM forward, batch 64, first 32 steps")

# %% [markdown]
# ## Profiling a step: what the host and the GPU each do
#
# The fused LSTM's code opens a named range around each phase (`workbook.timeline.span`: an NVTX
# range where the `nvtx` package is installed, for Nsight Systems). `timeline.record` runs one
# forward under torch's profiler, which collects through CUPTI what the GPU ran (every kernel of
# the process, numba's included) and the host's launch calls, then draws a row for the ranges, one
# for the launches and one per GPU stream. Below: 8 steps of one layer, launched call by call,
# then the same forward captured once as a CUDA graph and replayed (chapter 07). Without a GPU
# the recording has only the ranges, on the host's clock, and the reference GPU's stored plot follows.

# %%
small_net = fused.FusedLSTM(ref.init_lstm(HIDDEN, HIDDEN, 1, seed=0))
small_batch = workbook.size(gpu=8, sim=2)
x_small = cuda.to_device(rng.standard_normal((8, small_batch, HIDDEN)).astype(np.float32))
h_small, c_small = (cuda.to_device(np.zeros((1, small_batch, HIDDEN), np.float32)) for _ in range(2))
recorded = profiling.timelines(small_net, x_small, h_small, c_small)
for name, events in recorded.items():
    rows, end = timeline.summary(events)
    print(f"{name}: {end:.0f} us from first to last event; " + ", ".join(
        f"{row} busy {busy:.0f} us ({count} events)" for row, (busy, count) in rows.items()))
chapter.savefig(profiling.figure(recorded, f"T=8 B={small_batch} H={HIDDEN}"), "timeline")

# %% [markdown]
# Launched call by call, each step's range (grey, top) is mostly the host: the wrappers check
# their arguments and pick a schedule, the launches (orange) go out one by one, and the GPU's
# kernels (blue) can start only as their launches arrive: wherever the stream's row is empty, the
# GPU waits for the host (the line printed above says how long each row was busy). As one graph the
# host issues one launch for the whole forward, and the same kernels run back to back: the forward
# takes what its kernels take. That is the fused LSTM's "host-bound" in a picture; the persistent
# kernel removes the launches in another way, by not making them.

# %% [markdown]
# ## What the numbers mean
#
# - **Launches, not arithmetic, set the naive LSTM's time.** It issues 14 launches a step a layer,
#   the fused one 2 (and one big GEMM a layer) for the same arithmetic, and the GPU waits for every
#   launch the host has not made yet: the fused call costs its host as long as it takes.
# - **The persistent kernel** issues one launch a layer and reads W_hh (4H x H floats) from memory
#   once a sequence instead of once a step. A block multiplies a few batch rows at a time, a warp
#   per weight row, three block barriers a chunk: at batch 64, the batch timed here, most of its
#   time is waiting. It is the structure, made correct, not yet fast: part b makes it fast.
# - **cuDNN** (`torch.nn.LSTM`) makes the whole forward one library call: what part b's kernels are
#   set against, at every batch.
#
# The figures these bullets point to:

# %%
_persistent, _fused, _naive = ("persistent: W_hh in shared memory", "fused: hoisted input GEMM, fused cell",
                               "naive: 2 GEMMs a gate a step")
_slow_case = f"LSTM forward, batch 64, first {workbook.size(gpu=SLOW_STEPS, sim=32)} steps"  # the reference GPU's
_traffic = "recurrent weight bytes read per layer"
chapter.show_figures({
    f"{_slow_case}: naive": ("{:.0f} ms", lambda: chapter.figure(_slow_case, _naive)),
    f"{_slow_case}: fused": ("{:.0f} ms", lambda: chapter.figure(_slow_case, _fused)),
    "  fused vs naive (speed-up)": ("{:.1f}x", lambda: chapter.figure(_slow_case, _naive)
                                    / chapter.figure(_slow_case, _fused)),
    "  fused: host cost of a call": ("{:.0f} ms", lambda: chapter.figure(_slow_case, _fused, "host_us") / 1e3),
    f"{_slow_case}: persistent": ("{:.2f} ms", lambda: chapter.figure(_slow_case, _persistent)),
    f"{_slow_case}: cuDNN": ("{:.2f} ms", lambda: chapter.figure(_slow_case, "torch.nn.LSTM (cuDNN)")),
    "W_hh read a layer: once (persistent) / every step (fused)": (
        "{}", lambda: f"{chapter.figure(_traffic, 'persistent: W_hh once') / 1e6:.1f} MB / "
                      f"{chapter.figure(_traffic, 'fused: W_hh every step') / 1e6:.0f} MB"),
})

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds three exercises, each a stub with its spec. Each cell
# below shows one and runs its check: *not attempted*, *wrong* (with what is wrong) or *correct*.
# Edit `exercises.py` between `# >>> ch10.N` and `# <<< ch10.N`, save, and re-run the cell.
# `python -m pytest --exercises -k ch10` checks them all at once.

# %%
from workbook import exercises  # noqa: E402

exercises.show("ch10.1")

# %%
exercises.show("ch10.2")

# %% [markdown]
# ch10.3 is the persistent kernel's skeleton, one value a thread: find where its grid barrier
# leaves a write and a read of the same step unordered. The simulator's sanitizer names both
# threads; on a GPU, a `grid.sync()` that some thread skips would hang the launch, so the wrapper
# reads the kernel's source first and refuses to launch such an answer there.

# %%
exercises.show("ch10.3")

# %% [markdown]
# ## More to try
# 1. Time the fused LSTM as one CUDA graph at the book's sizes (the profiling section replays 8
#    steps that way): its time is its host's.
# 2. The persistent kernel's steps one at a time: which of the wavefront's changes in part b (batch
#    chunks, the cell in the warp, the barrier without a call) buys how much, with
#    `chapters/ch10_lstm/probes/lstm_bench.py`.
#
# ## References
# - Jaegeun Han and Bharatkumar Sharma, *Learn CUDA Programming*, chapter 10 (the LSTM from cuBLAS
#   calls, against cuDNN).
# - Jeremy Appleyard, *Optimizing Recurrent Neural Networks in cuDNN 5*, NVIDIA developer blog.
# - Greg Diamos et al., *Persistent RNNs: Stashing Recurrent Weights On-Chip*, ICML 2016.

# %%
chapter.save()
