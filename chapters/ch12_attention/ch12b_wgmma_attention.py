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
# # Chapter 12b — Attention on Hopper's wgmma
#
# Part a (`ch12a_attention.ipynb`) built FlashAttention-2's loop on mma.sync. On an H100 or H200
# that design stops well short of torch: every warp loads its own fragments of K and V with
# ldmatrix at every tile, and mma.sync's own ceiling there is below that of Hopper's instruction.
# In this notebook you will learn
# - the same loop with both products on **wgmma** (chapter 09b): a warpgroup reads Q, K and V
#   straight from shared memory, 64 queries by 128 keys an instruction;
# - how P goes from S's accumulators to the next product **in registers** (wgmma's A operand may
#   be registers), and V is read as it lies, rows of keys, by a transposed ("N-major") descriptor;
# - how the asynchronous instruction lets the tensor cores run P·V of one tile and Q·Kᵀ of the next
#   back to back, and where that leaves this kernel against torch's and against the instruction's
#   own ceiling.
#
# Without a GPU the kernel runs in the simulator at a few tiles (wgmma included), and the stored
# figures of the reference GPU follow each comparison. On a GPU without wgmma (anything but
# compute capability 9.0) the comparisons run part a's kernels and say what is missing.

# %%
# Reload an edited kernel module before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import capability, cuda, memtrace

from chapters.ch12_attention import hopper, measuring
from chapters.ch12_attention import kernels as k

print(f"running on: {workbook.MODE}")
capability.needed(*capability.MMA_SYNC, what="every kernel of this chapter", instead="run the chapter in the simulator "
                  "(WORKBOOK_DEVICE=sim), where all of it runs")
HAS_WGMMA = capability.check("wgmma", what="the wgmma kernel", instead="part a's kernels run without it")
chapter = workbook.Chapter("ch12b", "Attention on Hopper's wgmma")
rng = np.random.default_rng(0)

# %% [markdown]
# ## The kernel: part a's loop, the operands where wgmma wants them
#
# A block owns 128 queries, two warpgroups of 64. For every tile of 128 keys:
#
# - **S = Q Kᵀ**: 8 wgmma, 16 of the depth each, from Q's and K's tiles in shared memory, both in
#   chapter 09b's layout (rows of 128 bytes, the 128-byte swizzle; d = 128 is two panels of 64
#   columns). No fragments are loaded: that was most of part a's instructions.
# - **The online softmax** is part a's, on the 64 accumulators a thread holds (two rows, 32 scores
#   each); P is packed to FP16 two at a time into 32 registers.
# - **O += P V**: 8 wgmma, 16 keys each, with A from those registers (`wgmma_f16_from_registers`):
#   an accumulator tile's layout is the A fragment's, as in part a. V's tile is keys x columns, the
#   product's depth x N: wgmma reads such an "N-major" B when told to transpose
#   (`n_major_descriptor`: its leading offset steps from one 64-column panel to the next).
# - **Three stages** of K and V: tile j + 1 is copied (cp.async) into the stage of tile j - 2, after
#   the barrier that every warpgroup reaches only once its P·V of tile j - 2 is done.
# - **Asynchronous**: P·V is committed and not waited for. The next tile's Q·Kᵀ queues behind it,
#   and one wait covers both; O is rescaled only after it.

# %%
workbook.show(hopper.copy_tile)
workbook.show(hopper.make_forward)

# %% [markdown]
# ## Check: ragged lengths, the mask, NaN and -inf
#
# d = 128 (wgmma's N here is O's 128 columns); lengths of 1, 33 and 129 tokens, and three tiles so
# that every stage is used; a NaN query; a row with no finite score. The tests run more
# (`tests/test_ch12b_wgmma.py`).

# %%
def check_case(heads, n, causal, poison=None):
    q, kk, v = k.operands(rng, heads, n, hopper.D)
    if poison == "nan":
        q[0, n // 2, 3] = np.nan
    if poison == "-inf":
        q[0, n // 2, 0], kk[0, :, 0] = -np.inf, np.abs(kk[0, :, 0]) + np.float16(0.5)
    o = cuda.to_device(np.full(q.shape, 7, np.float16))
    k.attention(cuda.to_device(q), cuda.to_device(kk), cuda.to_device(v), o, causal=causal, variant="wgmma")
    reference = k.attention_reference(q, kk, v, causal)
    workbook.assert_close(o.copy_to_host().astype(np.float64), reference, rtol=0,
                          atol=float(k.tolerance(v, hopper.D, n).max()), name=f"wgmma {heads}x{n} causal={causal}")
    return reference


CASES = [(1, 1, False), (2, 33, True), (1, 129, False), (1, 260, True)]
if HAS_WGMMA:
    for case in CASES:
        check_case(*case)
    nan_row = check_case(1, 40, True, poison="nan")
    zero_row = check_case(1, 40, False, poison="-inf")
    print("wgmma: correct at (heads, N, causal) =", CASES, "| NaN query 20 reaches rows",
          np.unique(np.nonzero(np.isnan(nan_row[0]))[0]).tolist(), "| the -inf row:", zero_row[0, 20, :4], "...")

# %% [markdown]
# ## What moves through global memory
#
# The simulator's trace at 133 tokens: O is the only store, and K and V are loaded once per block
# of 128 queries.

# %%
if HAS_WGMMA and not workbook.ON_GPU:
    n_traced = hopper.BM + 5
    traced_in = [cuda.to_device(x) for x in k.operands(rng, 1, n_traced, hopper.D)]
    with memtrace.trace() as trace:
        k.attention(*traced_in, cuda.device_array((1, n_traced, hopper.D), np.float16), variant="wgmma")
    spaces = trace.kernels()["attention_wgmma"]
    print(f"loads {spaces['global ld'].requested:,} B, stores {spaces['global st'].requested:,} B | O itself is "
          f"{n_traced * hopper.D * 2:,} B")

# %% [markdown]
# ## Benchmark: against torch's attention, and against part a
#
# The cases of part a: 64 heads of 4096 tokens, d = 128, FP16, full and causal, then 16 heads of
# 16384; torch's baselines on the same buffers, part a's naive and mma.sync kernels beside it.

# %%
ours = ("naive", "fused", "wgmma") if HAS_WGMMA else ("naive", "fused")
fastest = ours[-1]
heads, n = workbook.size(gpu=64, sim=1), workbook.size(gpu=4096, sim=70)
full = measuring.compare(chapter, heads, n, 128, causal=False, variants=ours)
causal = measuring.compare(chapter, heads, n, 128, causal=True, variants=ours)
long_heads, long_n = workbook.size(gpu=16, sim=1), workbook.size(gpu=16384, sim=40)
long_full = measuring.compare(chapter, long_heads, long_n, 128, False, (fastest,), key="attention long d=128 full")
long_causal = measuring.compare(chapter, long_heads, long_n, 128, True, (fastest,), key="attention long d=128 causal")

# %% [markdown]
# ## The ceilings: what each instruction allows
#
# Each ceiling kernel issues its instruction and nothing else (no loads, no softmax): mma.sync from
# registers (chapter 09's), wgmma from two shared tiles. No kernel on an instruction passes its
# ceiling.

# %%
ceilings = {"mma.sync f16": measuring.mma_ceiling(), "wgmma f16": measuring.wgmma_ceiling()}
ceilings = {name: value for name, value in ceilings.items() if value}
print({name: f"{value:.0f} TFLOP/s" for name, value in ceilings.items()} or "the simulator: no ceiling to measure")
chapter.record("FP16 ceilings (TFLOP/s)", ceilings)

# %% [markdown]
# ## Bars
#
# The fastest fused kernel this GPU has (wgmma on Hopper) against part a's naive kernels, and
# against torch's attention with the backend it picks.

# %%
# in the simulator a ratio is NaN: the bar is not judged
label = {"wgmma": "wgmma", "fused": "mma.sync"}[fastest]
chapter.bar(f"attention 64x4096, d=128 FP16: fused ({label}) vs naive (speed-up)", full.ratio("naive", fastest),
            at_least=5)
for name, result in (("64x4096", full), ("64x4096 causal", causal), ("16x16384", long_full),
                     ("16x16384 causal", long_causal)):
    chapter.bar(f"attention {name}, d=128 FP16: fused ({label}) vs torch SDPA (fraction of its speed)",
                result.ratio("torch SDPA (its default backend)", fastest), at_least=0.5)

# %% [markdown]
# ## What the numbers mean
#
# - **wgmma against mma.sync**: the same algorithm, the same softmax, the same bytes from global
#   memory. What went is the ldmatrix traffic (each warp loading its fragments of K and V from
#   shared memory at every tile) and mma.sync's own ceiling: wgmma's, measured above, is higher.
# - **Against torch's default** (cuDNN's attention on Hopper): cuDNN, like FlashAttention-3,
#   overlaps the softmax of one warpgroup with the other's products (ping-pong scheduling) and the
#   softmax of a tile with the next tile's Q·Kᵀ, and loads with the Tensor Memory Accelerator from
#   a warp that does nothing else. Here the softmax (64 exp2 a thread a tile) runs while the
#   tensor cores wait; that gap is what remains.
# - **Causal** skips whole tiles past the diagonal and its blocks run longest first, so it keeps
#   most of the full rate.

# %%
chapter.show_figures({
    "wgmma, 64x4096 d=128 (TFLOP/s)": ("{:.0f}", ("attention d=128 full", "wgmma", "tflops")),
    "wgmma, causal (TFLOP/s)": ("{:.0f}", ("attention d=128 causal", "wgmma", "tflops")),
    "wgmma, 16x16384 / causal (TFLOP/s)": ("{:.0f} / {:.0f}", ("attention long d=128 full", "wgmma", "tflops"),
                                           ("attention long d=128 causal", "wgmma", "tflops")),
    "mma.sync fused / naive (TFLOP/s)": ("{:.0f} / {:.0f}", ("attention d=128 full", "fused", "tflops"),
                                         ("attention d=128 full", "naive", "tflops")),
    "torch SDPA default / FA2 backend (TFLOP/s)": (
        "{:.0f} / {:.0f}", ("attention d=128 full", "torch SDPA (its default backend)", "tflops"),
        ("attention d=128 full", "torch SDPA, FlashAttention-2 backend", "tflops")),
    "wgmma vs torch SDPA default (fraction)": ("{:.2f}", chapter.ratio(
        ("attention d=128 full", "wgmma", "tflops"), ("attention d=128 full", "torch SDPA (its default backend)",
                                                       "tflops"))),
    "ceilings: mma.sync / wgmma FP16 (TFLOP/s)": ("{:.0f} / {:.0f}", ("FP16 ceilings (TFLOP/s)", "mma.sync f16"),
                                                  ("FP16 ceilings (TFLOP/s)", "wgmma f16")),
})

# %%
chapter.save()

# %% [markdown]
# ## More to try
# 1. Two S accumulators: issue Q·Kᵀ of tile j + 1 before the softmax of tile j, so that the tensor
#    cores work while the exp2 unit does (FlashAttention-3's intra-warpgroup overlap). Count the
#    registers first: 64 more a thread.
# 2. Three warpgroups a block (192 queries): does a third hide the softmax better than two?
# 3. d = 64: wgmma's N is a parameter of the instruction (m64n64k16). What else changes?
#
# ## References
# - J. Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision" (2024).
# - PTX ISA, "Asynchronous Warpgroup Level Matrix Multiply-Accumulate" (wgmma.mma_async, its
#   descriptors and register fragments).
# - CUTLASS's CuTe Hopper examples: the canonical shared layouts of wgmma's operands.
