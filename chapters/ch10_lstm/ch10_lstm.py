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
# # Chapter 10 — The LSTM layer: from a GEMM per gate per step to a persistent kernel
#
# An LSTM reads a sequence one step at a time, and each step needs the last one's output: the
# recurrence that makes it hard to keep a GPU busy. For each step t and each layer:
#
#     z   = x_t @ W_ih^T + h_{t-1} @ W_hh^T + b          (B, 4H): four gates side by side
#     i, f, o = sigmoid(z_i), sigmoid(z_f), sigmoid(z_o);   g = tanh(z_g)
#     c_t = f * c_{t-1} + i * g;     h_t = o * tanh(c_t)
#
# In this chapter you will learn
# - why the LSTM "Learn CUDA Programming" builds from cuBLAS calls (a GEMM per gate per step, then
#   element-wise kernels) spends its time launching, not computing;
# - the rewrites of NVIDIA's "Optimizing Recurrent Neural Networks in cuDNN 5": the four gates as
#   one GEMM, the input term of every step hoisted into one big GEMM, the cell fused into one kernel;
# - Baidu's persistent RNN: one launch for the whole sequence, the recurrent weights kept in shared
#   memory, and a grid-wide barrier (`cuda.cg.this_grid().sync()`) between steps;
# - why a large batch wants the step as a tiled GEMM (chapter 04's register tiles) inside the
#   persistent kernel, and a small batch every layer in one wavefront;
# - the layers on streams of their own, replayed as one CUDA graph;
# - the wavefront's products on FP16 tensor cores (chapter 09's `mma.sync`), and what FP16 costs in
#   accuracy;
# - how these compare with cuDNN's LSTM (`torch.nn.LSTM`) at the book's sizes and at small batches;
# - how to see where a step's time goes: named ranges, the host's launches and the GPU's kernels
#   on one timeline.
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

from chapters.ch10_lstm import fused, half, layer, layerwise, naive, persistent, profiling, streams, wavefront
from chapters.ch10_lstm import reference as ref

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch10", "The LSTM layer: per-gate GEMMs, fused steps, a persistent kernel")
rng = np.random.default_rng(0)
torch = bench.optional_torch()
if torch is not None:  # float32 means float32 for cuDNN too: no TF32 tensor cores in its GEMMs
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

# the book's sizes on a GPU; a small LSTM with awkward sizes in the simulator
STEPS = workbook.size(gpu=512, sim=3)
HIDDEN = workbook.size(gpu=512, sim=33)
INPUT = workbook.size(gpu=512, sim=7)
LAYERS = workbook.size(gpu=4, sim=2)
BATCHES = (1, 8, 64) if workbook.ON_GPU else (3,)
# The naive and fused LSTMs against each other: the first SLOW_STEPS steps of the largest batch.
# Every step is the same work, so their ratio is the whole forward's; at the book's 512 steps the
# naive forward alone takes seconds a call, and a ratio of host-bound calls needs many rounds.
SLOW_STEPS = workbook.size(gpu=32, sim=STEPS)

weights = ref.init_lstm(INPUT, HIDDEN, LAYERS, seed=0)
rtol, atol = ref.tolerance(HIDDEN, INPUT)
print(f"T={STEPS} steps, I={INPUT}, H={HIDDEN}, {LAYERS} layers; tolerance rtol={rtol:g}, atol={atol:.2g}")


def inputs(batch, seed=1):
    """x (T, B, I), h0 and c0 (L, B, H): float32, on the host."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((STEPS, batch, INPUT)).astype(np.float32)
    h0, c0 = (0.5 * r.standard_normal((LAYERS, batch, HIDDEN))).astype(np.float32), \
        (0.5 * r.standard_normal((LAYERS, batch, HIDDEN))).astype(np.float32)
    return x, h0, c0


def check(out, expected, name):
    """One output (y, h_n or c_n) against the float64 reference's."""
    workbook.assert_close(workbook.check.to_host(out), np.asarray(expected, np.float32), rtol=rtol, atol=atol,
                          name=name)


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
# ## Wavefront: every layer in one persistent kernel
#
# Layer l+1 at step t needs only layer l's h_t, so the layers need not wait for each other's whole
# sequence: at wavefront step s, layer l works on time step s - l, all layers at once on blocks of
# their own, and a forward takes T + L - 1 grid barriers instead of T·L:
#
#                 time step t:  0   1   2   3   4  ...
#     layer 0                   s0  s1  s2  s3  s4
#     layer 1                       s1  s2  s3  s4  ...      (layer l at t runs at step s = t + l,
#     layer 2                           s2  s3  s4           after layer l - 1 at t (step s - 1)
#     layer 3                               s3  s4  ...       and itself at t - 1 (step s - 1))
#
# Each block now keeps *both*
# its weight matrices on chip (W_ih as well: 256 KB a block at H = 512, in 227 KB of shared memory
# plus registers), so the kernel is built for its sizes (`make_wavefront_kernel`: unrolled loops
# keep an array in registers) and asks for more than the 48 KB of shared memory a kernel gets by
# default. Three more changes make it fast: a block multiplies several batch rows per weight it
# reads; after the warp's reduction the four gates of a unit sit in the same warp, so its lanes
# compute the cell with no shared memory and no block barrier; and the grid barrier is
# `workbook.barrier`'s counter (release and acquire, no call), not numba's `grid.sync()`, a call
# around which every live register, the W_ih ones included, is saved and restored.

# %%
workbook.show(wavefront.make_wavefront_kernel)

# %% [markdown]
# ## Layer by layer, each step a tiled GEMM: for a large batch
#
# At batch 64 a step of a layer is a real GEMM, (64, 512) x (512, 2048), and the wavefront's lanes,
# each with one k of a row and at most 4 batch rows, read a value of h from shared memory for every
# multiply-add: shared memory sets the pace. `layerwise.py` goes back to one layer a launch, keeps
# only W_hh on chip (an eighth of the wavefront's weights a block), and gives the room to a chunk of
# 64 batch rows of h_{t-1}. Each thread then owns a 4 x 8 tile of sums (one unit's four gates, 8
# batch rows) as chapter 04's GEMM does: per k it reads 4 weights and 8 values of h for 32
# multiply-adds. The k of a row are split over the block's warps, whose partial sums meet in shared
# memory before the cell. The input term is step 2's hoisted GEMM again, which at this batch is a
# big GEMM that runs near chapter 04's best rate. Two details mattered as much as the tiling: h is
# staged with unsigned indices and a test-free path for whole chunks (the signed index arithmetic
# numba emits had cost more instructions than the multiply-adds), and the cell's inputs that need
# no h are loaded before the staging, so that their latency hides behind it.

# %%
workbook.show(layerwise.make_layer_kernel)

# %% [markdown]
# ## Streams: the layers side by side, from the host
#
# The wavefront can also be had without a persistent kernel: step 2's launches, each layer on a
# stream of its own, issued in wavefront order, an event telling layer l+1 that layer l's h_t is
# written (`streams.py`). Launched call by call, the host issues three launches a step a layer and
# the GPU waits for it; captured once as a CUDA graph (chapter 07) and replayed, the GPU runs the
# streams' kernels side by side, and what is left is the GPU's time.

# %%
workbook.show(streams.StreamsLSTM._layers)

# %% [markdown]
# ## FP16 on tensor cores: the wavefront's products with `mma.sync`
#
# A block of the wavefront computes (its 64 gate rows) x [x_t ; h_{t-1}] each step: a GEMM with
# K = 2H. `half.py` does it with chapter 09's warp-wide `mma.sync` (m16n8k16: FP16 operands, FP32
# sums). The weights are stored in FP16, half the bytes, so both matrices of a block fit in shared
# memory, and in the order of mma's A fragments (`half.fragments`, on the host), so a lane reads its
# four registers of a tile as four bank-conflict-free words. The k of the GEMM are split over the
# block's warps; each warp loads its slice of x_t and h_{t-1} for 8 batch rows (an n-tile) straight
# from global memory, and packs two float32 into one register of two FP16 only at the mma, so that
# the loads are all in flight together (a chunk's during the last chunk's cells). The warps'
# partial sums meet in shared memory, laid out as mma left them (33 words a register's lanes, so
# the cells read them without bank conflicts), and the cell stays FP32.
# What is rounded to FP16 is exactly what is multiplied: the weights, h and x. The reference
# models that (`lstm_reference(..., fp16=True)`), so the check stays as tight as float32's, and the
# distance to the exact float64 LSTM is measured apart.

# %%
workbook.show(half.make_half_kernel)

# %%
net_naive, net_fused = naive.NaiveLSTM(weights), fused.FusedLSTM(weights)
net_persistent = persistent.PersistentLSTM(weights)
print(f"persistent: {net_persistent.blocks} blocks of {persistent.THREADS} threads, {net_persistent.units} "
      f"hidden units each, {net_persistent.shared_bytes} bytes of shared memory a block")
w_hh_bytes = 4 * 4 * HIDDEN * HIDDEN
traffic = {"layers": LAYERS, "fused: W_hh every step": STEPS * w_hh_bytes, "persistent: W_hh once": w_hh_bytes,
           "steps": STEPS, "W_hh bytes": w_hh_bytes}
try:
    net_wavefront = wavefront.WavefrontLSTM(weights, blocks=workbook.size(gpu=None, sim=4))  # a block an SM; 4 simulated
    print(f"wavefront: {net_wavefront.blocks} blocks of {net_wavefront.threads} threads ({LAYERS} layers side by "
          f"side), {net_wavefront.units} hidden units each, {net_wavefront.shared_bytes} bytes of shared memory a "
          "block and more for each batch chunk")
    traffic["wavefront: batch rows a block takes at once, batch 64"] = wavefront.chunk_rows(
        HIDDEN, net_wavefront.units, 64)
except ValueError as why:  # a GPU with less shared memory than an H100 (a T4's 64 KB) cannot hold the weights
    net_wavefront = None
    print(f"wavefront: not on this GPU: {why}")
net_layerwise = layerwise.LayerwiseLSTM(weights, blocks=workbook.size(gpu=None, sim=4))
print(f"layer by layer: {net_layerwise.blocks} blocks of {layerwise.THREADS} threads, {net_layerwise.units} hidden "
      f"units each; at batch 64, chunks of {layerwise.batch_chunk(HIDDEN, net_layerwise.units, 64)} batch rows")
net_streams = streams.StreamsLSTM(weights)
try:
    net_half = half.HalfLSTM(weights, blocks=workbook.size(gpu=None, sim=4))
    print(f"FP16 on tensor cores: {net_half.blocks} blocks of {half.THREADS} threads, {net_half.units} hidden units "
          f"each; batch rows a block takes at once: {8 * half.n_tiles(HIDDEN, net_half.units, LAYERS, 1)} at batch 1, "
          f"{8 * half.n_tiles(HIDDEN, net_half.units, LAYERS, 64)} at batch 64")
    traffic["FP16: batch rows a block takes at once, batch 64"] = 8 * half.n_tiles(HIDDEN, net_half.units, LAYERS, 64)
    traffic["FP16: weight bytes a block"] = 4 * net_half.w_frag.size // net_half.blocks
except ValueError as why:  # a GPU with less shared memory than the weights need
    net_half = None
    print(f"FP16 on tensor cores: not on this GPU: {why}")
chapter.record("recurrent weight bytes read per layer", traffic)


def torch_lstm(dtype=None):
    """torch.nn.LSTM (cuDNN) with the same weights (dtype: torch.float16 for cuDNN's FP16 LSTM); any batch."""
    lstm = torch.nn.LSTM(INPUT, HIDDEN, LAYERS).cuda()
    with torch.no_grad():
        for layer, w in enumerate(weights):
            for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
                getattr(lstm, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l{layer}").copy_(
                    torch.from_numpy(w[name]))
    return lstm if dtype is None else lstm.to(dtype)


def cudnn_call(lstm, *inputs):
    def call():
        with torch.no_grad():
            y, (h, c) = lstm(inputs[0], inputs[1:])
        return y, h, c
    return call


# %% [markdown]
# ## Every variant against cuDNN
#
# The whole forward (every layer, every step) from the same inputs, checked against the float64
# reference, then timed with CUDA events. The naive and fused LSTMs make thousands of launches a
# forward at the book's sizes, at any batch (their time is their launches'), so they are compared first,
# over the first steps of the sequence at batch 64 (every step is the same work: their ratio is the
# whole forward's), with the persistent kernel beside them; the streams LSTM is timed as its graph's
# replay (launched call by call, its time is its host's, like the fused one's).

# %% [markdown]
# The FP16 kernel has a table of its own: it is checked against the FP16 model of the reference,
# and timed beside cuDNN's FP16 LSTM (FP16 inputs, weights, state and outputs; checked against the
# same model at FP16's own precision, 2^-8).

# %%
_half = "FP16 wavefront: tensor cores (mma.sync)"
rtol16, atol16 = ref.tolerance_fp16(HIDDEN, INPUT)


def check_fp16(out, expected, name):
    """Ours at the FP16 model's tolerance; cuDNN's FP16 LSTM, which also stores h and c in FP16, at 2^-8."""
    r, a = (2.0 ** -8, 2.0 ** -8) if "cuDNN" in name else (rtol16, atol16)
    workbook.assert_close(np.asarray(workbook.check.to_host(out), np.float32), np.asarray(expected, np.float32),
                          rtol=r, atol=a, name=name)


device_inputs = {batch: [cuda.to_device(a) for a in inputs(batch)] for batch in BATCHES}  # x, h0, c0
big = max(BATCHES)
first_steps = (device_inputs[big][0][:SLOW_STEPS], *device_inputs[big][1:])  # x's first steps: a view
# The float64 references, each a loop over the steps in a process of its own, started first: they
# take the host seconds, while the kernels below compile and run. One reference serves every batch
# (lstm_references: one LSTM of all their rows side by side).
x_big, h0_big, c0_big = inputs(big)
computing = {"slow": host.in_process(ref.lstm_reference, x_big[:SLOW_STEPS], weights, h0_big, c0_big),
             False: host.in_process(ref.lstm_references, [inputs(batch) for batch in BATCHES], weights)}
if net_half is not None:
    computing[True] = host.in_process(ref.lstm_references, [inputs(batch) for batch in BATCHES], weights, True)


def reference(batch, fp16=False):
    """The float64 LSTM's (y, h_n, c_n) for inputs(batch) (fp16=True: the FP16 model's)."""
    if batch in BATCHES:
        return computing[fp16].result()[BATCHES.index(batch)]
    x, h0, c0 = inputs(batch)
    return ref.lstm_reference(x, weights, h0, c0, fp16=fp16)


slow = {"naive: 2 GEMMs a gate a step": lambda: net_naive(*first_steps),
        "fused: hoisted input GEMM, fused cell": lambda: net_fused(*first_steps)}
# On a GPU every variant is called once for every batch, all at the same time, their kernels
# compiled side by side (bench.warm_up; the slow calls' outputs kept for their checks).
nets = [net for net in (net_persistent, net_wavefront, net_layerwise, net_streams, net_half) if net is not None]
bench.warm_up([lambda net=net, a=a: net(*a) for net in nets for a in device_inputs.values()] + list(slow.values()),
              keep=slow.values())

cudnn, cudnn_fp16 = (torch_lstm(), torch_lstm(torch.float16)) if torch is not None else (None, None)
slow_case = f"LSTM forward, batch {big}, first {SLOW_STEPS} steps"
slow_comparison = chapter.compare(
    slow_case, {**slow, "persistent: W_hh in shared memory": lambda: net_persistent(*first_steps)},
    baselines={"torch.nn.LSTM (cuDNN)": cudnn_call(cudnn, *(bench.torch_view(a) for a in first_steps))}
    if torch is not None else None,
    flops=2.0 * SLOW_STEPS * big * 4 * HIDDEN * (INPUT + HIDDEN + (LAYERS - 1) * 2 * HIDDEN),
    reference=lambda: computing["slow"].result(), check=check,
    size=f"T={SLOW_STEPS} I={INPUT} H={HIDDEN} L={LAYERS} B={big}", repeats=15, seconds=6,
    wall_clock=slow.keys())  # host-bound, both: each call's wall clock

comparisons, comparisons_fp16 = {}, {}
for batch in BATCHES:
    d_x, d_h0, d_c0 = device_inputs[batch]
    variants = {"persistent: W_hh in shared memory": lambda: net_persistent(d_x, d_h0, d_c0)}
    if net_wavefront is not None:
        variants["wavefront: every layer in one kernel"] = lambda: net_wavefront(d_x, d_h0, d_c0)
    variants["layer by layer: each step a tiled GEMM"] = lambda: net_layerwise(d_x, d_h0, d_c0)
    replay = net_streams.graph(d_x, d_h0, d_c0, warmed_up=True)  # called on these arrays in the warm-up above
    variants["streams: layers side by side, one CUDA graph"] = \
        lambda replay=replay, d_x=d_x: (replay(), net_streams.outputs(d_x))[1]
    baselines, baselines_fp16 = {}, {}
    if torch is not None:
        t_inputs = [bench.torch_view(a) for a in (d_x, d_h0, d_c0)]
        baselines["torch.nn.LSTM (cuDNN)"] = cudnn_call(cudnn, *t_inputs)
        baselines_fp16["torch.nn.LSTM FP16 (cuDNN)"] = cudnn_call(cudnn_fp16, *(a.half() for a in t_inputs))
    flops = 2.0 * STEPS * batch * 4 * HIDDEN * (INPUT + HIDDEN + (LAYERS - 1) * 2 * HIDDEN)
    comparisons[batch] = chapter.compare(
        f"LSTM forward, batch {batch}", variants, baselines=baselines, flops=flops,
        reference=lambda batch=batch: reference(batch), check=check,
        size=f"T={STEPS} I={INPUT} H={HIDDEN} L={LAYERS} B={batch}", repeats=9)
    if net_half is not None:
        comparisons_fp16[batch] = chapter.compare(
            f"LSTM forward in FP16, batch {batch}", {_half: lambda: net_half(d_x, d_h0, d_c0)},
            baselines=baselines_fp16, flops=flops, check=check_fp16,
            reference=lambda batch=batch: reference(batch, fp16=True),
            size=f"T={STEPS} I={INPUT} H={HIDDEN} L={LAYERS} B={batch}", repeats=9)

# %%
if workbook.ON_GPU:
    chapter.bar(f"batch {big}, {SLOW_STEPS} steps: fused vs naive (speed-up)",
                slow_comparison.ratio("naive: 2 GEMMs a gate a step", "fused: hoisted input GEMM, fused cell"),
                at_least=5)
    for batch, target in ((1, 1.5), (8, 1.5), (64, 0.8)):
        if torch is None or batch not in comparisons:
            continue
        ours = [t for t in comparisons[batch].timings if t.kind == "kernel"]  # float32 only: FP16's table is apart
        best = min(ours, key=lambda t: t.median_ms)
        chapter.bar(f"batch {batch}: fastest workbook LSTM ({best.name.split(':')[0]}) vs cuDNN (speed-up)",
                    comparisons[batch].ratio("torch.nn.LSTM (cuDNN)", best.name), at_least=target)
else:
    chapter.show_stored("LSTM forward, batch 64, first 32 steps")
    for batch in (1, 8, 64):
        chapter.show_stored(f"LSTM forward, batch {batch}")
        chapter.show_stored(f"LSTM forward in FP16, batch {batch}")

# %% [markdown]
# What FP16 costs in accuracy: the largest difference to the exact float64 LSTM, at batch 1, of the
# float32 wavefront and of the FP16 one.

# %%
if net_half is not None and net_wavefront is not None:
    exact = reference(1)  # the float32 table's reference at batch 1
    d_in = [cuda.to_device(a) for a in inputs(1)]
    off = {name: float(max(np.abs(workbook.check.to_host(got) - want).max() for got, want in zip(net(*d_in), exact)))
           for name, net in (("float32 wavefront", net_wavefront), ("FP16 wavefront", net_half))}
    chapter.record("largest difference to float64, batch 1", off)
    print(", ".join(f"{name}: {value:.2g}" for name, value in off.items()))

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
#   per weight row, three block barriers a chunk: its time grows with the batch, and at batch 64
#   most of it is waiting. It is the structure, made correct, not yet fast.
# - **The wavefront kernel** is the same structure made fast: every layer in one launch, T + L - 1
#   grid barriers where the persistent kernel has T x L, both weight matrices read from memory once.
#   At batch 64 a block takes only the batch rows its shared memory holds beside the weights, so a
#   step is several passes over them, where cuDNN's GEMMs have rows enough to fill the GPU.
# - **Layer by layer, each step a tiled GEMM**, is the variant for a large batch; each of its T x L
#   steps costs a barrier, the staging of h and a block's latency whatever the batch, so small
#   batches belong to the wavefront.
# - **The streams LSTM** replayed as one graph runs the layers side by side, but every step of every
#   layer is still three kernels, each a launch's worth of work, where the persistent kernels run one.
# - **FP16 on tensor cores**: at batch 1 a step is latency (the barrier, the loads, the cell) and the
#   tensor cores change little; at batch 8 the float32 wavefront's passes over its weights become one
#   n-tile of mma; at batch 64 the accumulators bound the rows a block takes. cuDNN's FP16 LSTM waits
#   for the GPU inside its call, so it is timed with its host's waits. Rounding h and the weights to
#   11 significant bits moves the outputs from the exact LSTM by the amount printed below.
#
# The figures these bullets point to:

# %%
_persistent, _fused, _naive = ("persistent: W_hh in shared memory", "fused: hoisted input GEMM, fused cell",
                               "naive: 2 GEMMs a gate a step")
_wavefront, _cudnn = "wavefront: every layer in one kernel", "torch.nn.LSTM (cuDNN)"
_layerwise, _streams = "layer by layer: each step a tiled GEMM", "streams: layers side by side, one CUDA graph"
_slow_case = f"LSTM forward, batch 64, first {workbook.size(gpu=SLOW_STEPS, sim=32)} steps"  # the reference GPU's
_traffic = "recurrent weight bytes read per layer"


def _ms(batch, variant, fp16=False):
    return lambda: chapter.figure(f"LSTM forward{' in FP16' if fp16 else ''}, batch {batch}", variant)


chapter.show_figures({
    f"{_slow_case}: naive": ("{:.0f} ms", lambda: chapter.figure(_slow_case, _naive)),
    f"{_slow_case}: fused": ("{:.0f} ms", lambda: chapter.figure(_slow_case, _fused)),
    "  fused vs naive (speed-up)": ("{:.1f}x", lambda: chapter.figure(_slow_case, _naive)
                                    / chapter.figure(_slow_case, _fused)),
    "  fused: host cost of a call": ("{:.0f} ms", lambda: chapter.figure(_slow_case, _fused, "host_us") / 1e3),
    "W_hh read a layer: once (persistent) / every step (fused)": (
        "{}", lambda: f"{chapter.figure(_traffic, 'persistent: W_hh once') / 1e6:.1f} MB / "
                      f"{chapter.figure(_traffic, 'fused: W_hh every step') / 1e6:.0f} MB"),
    **{f"batch {b}: {name}": ("{:.2f} ms", _ms(b, variant)) for b in (1, 8, 64)
       for name, variant in (("persistent", _persistent), ("wavefront", _wavefront), ("layer by layer", _layerwise),
                             ("streams, one graph", _streams), ("cuDNN", _cudnn))},
    "wavefront: batch rows a block takes at once, batch 64": (
        "{}", lambda: chapter.figure(_traffic, "wavefront: batch rows a block takes at once, batch 64")),
    **{f"batch {b}: FP16 on tensor cores / cuDNN FP16": (
        "{}", lambda b=b: f"{_ms(b, _half, True)():.2f} / {_ms(b, 'torch.nn.LSTM FP16 (cuDNN)', True)():.2f} ms")
       for b in (1, 8, 64)},
    "FP16: batch rows a block takes at once, batch 64": (
        "{}", lambda: chapter.figure(_traffic, "FP16: batch rows a block takes at once, batch 64")),
    "largest difference to float64 at batch 1: FP16 / float32 wavefront": (
        "{}", lambda: "{FP16 wavefront:.1g} / {float32 wavefront:.1g}".format(
            **chapter.figure("largest difference to float64, batch 1"))),
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
# 2. The layer-by-layer kernel's staging of h_{t-1} with `cp.async` (inline PTX, as chapter 09
#    reaches the tensor cores): the loads in flight without registers to hold them, or the next
#    chunk's while this one multiplies.
# 3. The FP16 kernel at batch 64: the next chunk's loads in flight during this chunk's cells, or
#    part of the A fragments in registers (a block reads its 128 KB of weights from shared memory
#    for every chunk); the first layer's input GEMM on chapter 09's tensor-core GEMM too.
# 4. The persistent kernel's steps one at a time: which of the wavefront's changes (batch chunks,
#    the cell in the warp, the barrier without a call) buys how much, with `chapters/ch10_lstm/probes/lstm_bench.py`.
#
# ## References
# - Jaegeun Han and Bharatkumar Sharma, *Learn CUDA Programming*, chapter 10 (the LSTM from cuBLAS
#   calls, against cuDNN).
# - Jeremy Appleyard, *Optimizing Recurrent Neural Networks in cuDNN 5*, NVIDIA developer blog.
# - Greg Diamos et al., *Persistent RNNs: Stashing Recurrent Weights On-Chip*, ICML 2016.

# %%
chapter.save()
