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
# # Chapter 10b — The LSTM layer: the wavefront, tiled steps and FP16, against cuDNN
#
# Part a (`ch10a_launches.ipynb`) went from 14 launches a step a layer to one launch a layer: the
# persistent kernel keeps W_hh in shared memory and meets the grid at a barrier between steps. It is
# correct, and slow: a block multiplies a few batch rows at a time, and every layer waits for the
# one below to finish its whole sequence. In this notebook you will learn
# - the wavefront: every layer in one persistent kernel, layer l at step t - l, for a small batch;
# - why a large batch wants the step as a tiled GEMM (chapter 04's register tiles) inside the
#   persistent kernel instead;
# - the layers on streams of their own, replayed as one CUDA graph;
# - the wavefront's products on FP16 tensor cores (chapter 09's `mma.sync`), and what FP16 costs in
#   accuracy;
# - how these compare with cuDNN's LSTM (`torch.nn.LSTM`) at the book's sizes and at small batches.
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
from workbook import bench, cuda, host

from chapters.ch10_lstm import half, layerwise, streams, wavefront
from chapters.ch10_lstm import reference as ref
from chapters.ch10_lstm.comparing import (BATCHES, HIDDEN, INPUT, LAYERS, STEPS, atol, check, cudnn_call, inputs,
                                          optional_cudnn, rtol, torch_lstm, weights)

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch10b", "The LSTM layer: wavefront, tiled steps, streams and FP16 against cuDNN")
torch = optional_cudnn()  # torch with TF32 off, or None
print(f"T={STEPS} steps, I={INPUT}, H={HIDDEN}, {LAYERS} layers; tolerance rtol={rtol:g}, atol={atol:.2g}")

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
# memory before the cell. The input term is part a's hoisted GEMM again, which at this batch is a
# big GEMM that runs near chapter 04's best rate. Two details mattered as much as the tiling: h is
# staged with unsigned indices and a test-free path for whole chunks (the signed index arithmetic
# numba emits had cost more instructions than the multiply-adds), and the cell's inputs that need
# no h are loaded before the staging, so that their latency hides behind it.

# %%
workbook.show(layerwise.make_layer_kernel)

# %% [markdown]
# ## Streams: the layers side by side, from the host
#
# The wavefront can also be had without a persistent kernel: part a's fused launches, each layer
# on a stream of its own, issued in wavefront order, an event telling layer l+1 that layer l's h_t
# is written (`streams.py`). Launched call by call, the host issues three launches a step a layer and
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
traffic = {}
try:
    net_wavefront = wavefront.WavefrontLSTM(weights, blocks=workbook.size(gpu=None, sim=4))  # a block an SM; 4 simulated
    print(f"wavefront: {net_wavefront.blocks} blocks of {net_wavefront.threads} threads ({LAYERS} layers side by "
          f"side), {net_wavefront.units} hidden units each, {net_wavefront.shared_bytes} bytes of shared memory a "
          "block and more for each batch chunk")
    traffic["wavefront: batch rows a block takes at once, batch 64"] = wavefront.chunk_rows(
        HIDDEN, net_wavefront.units, 64)
except ValueError as why:  # a GPU with less shared memory than Hopper's (a T4's 64 KB) cannot hold the weights
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

# %% [markdown]
# ## Every variant against cuDNN
#
# The whole forward (every layer, every step) from the same inputs at batches 1, 8 and 64, checked
# against the float64 reference, then timed with CUDA events; the streams LSTM is timed as its
# graph's replay (launched call by call, its time is its host's, as part a's fused LSTM's is).
# Part a's persistent kernel is not among them: the wavefront is what it becomes.

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
# The float64 references, each a loop over the steps in a process of its own, started first: they
# take the host seconds, while the kernels below compile and run. One reference serves every batch
# (lstm_references: one LSTM of all their rows side by side).
computing = {False: host.in_process(ref.lstm_references, [inputs(batch) for batch in BATCHES], weights)}
if net_half is not None:
    computing[True] = host.in_process(ref.lstm_references, [inputs(batch) for batch in BATCHES], weights, True)


def reference(batch, fp16=False):
    """The float64 LSTM's (y, h_n, c_n) for inputs(batch) (fp16=True: the FP16 model's)."""
    if batch in BATCHES:
        return computing[fp16].result()[BATCHES.index(batch)]
    x, h0, c0 = inputs(batch)
    return ref.lstm_reference(x, weights, h0, c0, fp16=fp16)


# On a GPU every variant is called once for every batch, all at the same time, their kernels
# compiled side by side (bench.warm_up).
nets = [net for net in (net_wavefront, net_layerwise, net_streams, net_half) if net is not None]
bench.warm_up([lambda net=net, a=a: net(*a) for net in nets for a in device_inputs.values()])

cudnn, cudnn_fp16 = (torch_lstm(), torch_lstm(torch.float16)) if torch is not None else (None, None)

comparisons, comparisons_fp16 = {}, {}
for batch in BATCHES:
    d_x, d_h0, d_c0 = device_inputs[batch]
    variants = {}
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
    for batch, target in ((1, 1.5), (8, 1.5), (64, 0.8)):
        if torch is None or batch not in comparisons:
            continue
        ours = [t for t in comparisons[batch].timings if t.kind == "kernel"]  # float32 only: FP16's table is apart
        best = min(ours, key=lambda t: t.median_ms)
        chapter.bar(f"batch {batch}: fastest workbook LSTM ({best.name.split(':')[0]}) vs cuDNN (speed-up)",
                    comparisons[batch].ratio("torch.nn.LSTM (cuDNN)", best.name), at_least=target)
else:  # the reference GPU's runs of the same comparisons, at the book's sizes
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
# ## What the numbers mean
#
# - **The wavefront kernel** takes part a's persistent structure further: every layer in one
#   launch, T + L - 1 grid barriers where part a's persistent kernel has T x L, both weight matrices
#   read from memory once. At batch 64 a block takes only the batch rows its shared memory holds beside the
#   weights, so a step is several passes over them, where cuDNN's GEMMs have rows enough to fill
#   the GPU.
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
_wavefront, _cudnn = "wavefront: every layer in one kernel", "torch.nn.LSTM (cuDNN)"
_layerwise, _streams = "layer by layer: each step a tiled GEMM", "streams: layers side by side, one CUDA graph"
_traffic = "recurrent weight bytes read per layer"


def _ms(batch, variant, fp16=False):
    return lambda: chapter.figure(f"LSTM forward{' in FP16' if fp16 else ''}, batch {batch}", variant)


chapter.show_figures({
    **{f"batch {b}: {name}": ("{:.2f} ms", _ms(b, variant)) for b in (1, 8, 64)
       for name, variant in (("wavefront", _wavefront), ("layer by layer", _layerwise),
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

# %%
chapter.save()

# %% [markdown]
# ## More to try
# 1. The layer-by-layer kernel's staging of h_{t-1} with `cp.async` (inline PTX, as chapter 09
#    reaches the tensor cores): the loads in flight without registers to hold them, or the next
#    chunk's while this one multiplies.
# 2. The FP16 kernel at batch 64: the next chunk's loads in flight during this chunk's cells, or
#    part of the A fragments in registers (a block reads its 128 KB of weights from shared memory
#    for every chunk); the first layer's input GEMM on chapter 09's tensor-core GEMM too.
#
# ## References
# - Jeremy Appleyard, *Optimizing Recurrent Neural Networks in cuDNN 5*, NVIDIA developer blog.
# - Greg Diamos et al., *Persistent RNNs: Stashing Recurrent Weights On-Chip*, ICML 2016.
