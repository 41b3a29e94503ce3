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
# # Chapter 12a — Attention: FlashAttention from numba on tensor cores
#
# In this chapter you will learn
# - what attention computes, O = softmax(Q Kᵀ / √d) V for every head, and why its textbook form
#   writes N x N scores to memory and reads them back;
# - how FlashAttention-2 never writes them: a block keeps 128 queries, streams K and V through shared
#   memory tile by tile, keeps the scores in the tensor cores' registers and updates the softmax
#   **online**, rescaling what it has summed whenever a row's maximum grows;
# - how chapter 06's running maximum, chapter 09's mma.sync, ldmatrix and cp.async, and chapter
#   04's tiles meet in one kernel, and what the causal mask lets it skip;
# - how close that gets from numba to torch's attention (cuDNN's and FlashAttention-2's kernels),
#   in FP16 and in BF16.
#
# Part b (`ch12b_wgmma_attention.ipynb`) moves the same loop to Hopper's own instruction, wgmma.
#
# Without a GPU every kernel runs in the simulator at a few dozen tokens, the tensor-core
# instructions included; the times there mean nothing, and the stored figures of the reference
# GPU follow each comparison.

# %%
# Reload an edited kernel module before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import capability, cuda, memtrace

from chapters.ch12_attention import fused, measuring, naive, tiles
from chapters.ch12_attention import kernels as k

print(f"running on: {workbook.MODE}")
capability.needed(*capability.MMA_SYNC, what="every kernel of this chapter", instead="run the chapter in the simulator "
                  "(WORKBOOK_DEVICE=sim), where all of it runs")
chapter = workbook.Chapter("ch12a", "Attention: FlashAttention from numba on tensor cores")
rng = np.random.default_rng(0)

# %% [markdown]
# ## The reference, and how close a half-precision kernel must come
#
# Each head has N queries, N keys and N values of d numbers (d = 64 or 128). Query i scores every
# key j, s = q_i · k_j / √d; the softmax of its row weighs the values. With a **causal** mask query i
# sees keys j ≤ i only (a language model does not read ahead). Scores left out are not in the
# softmax at all; a row with no finite score has no distribution and is defined as 0. The kernels
# take FP16 inputs and round P and O to FP16 on the way, so they are held to that rounding plus
# float32's sums: the tolerance is derived in `reference.py`, not guessed.

# %%
workbook.show(k.attention_reference)
workbook.show(k.tolerance)

# %% [markdown]
# ## Naive: three kernels, S and P through global memory
#
# The textbook order: a kernel writes the scores S (N x N float32 a head), chapter 06's row
# softmax turns each row into P (FP16), and a third multiplies P by V. Each is fast on its own:
# the products run on the tensor cores with the fused kernel's own tiles (`tiles.py`). But at
# N = 4096 one head's S is 64 MiB, written once and read three times, then P is written and read
# again: 12 bytes or more a score, where the answer holds 2 bytes per number of O.

# %%
workbook.show(naive.make_scores)
workbook.show(naive.softmax)

# %% [markdown]
# ## Fused: the online softmax
#
# Softmax needs the row's maximum before it can weigh anything, and the maximum is known only at
# the end of the row. The online form (Milakov and Gimelshein, chapter 06) keeps a running maximum
# m and sum l, and when a tile of scores raises the maximum to m', it multiplies what it has by
# e^(m - m'): the sum, and here also the partial output O, which is a sum weighted the same way.
# At the end O / l is the answer. So a block can take K and V a tile at a time, and S never
# leaves the registers:
#
# - a block owns 128 queries, each warp 32 of them (two m16 blocks of rows);
# - K and V tiles (64 keys at d = 64, 32 at d = 128) stream through two stages of shared memory:
#   `cp.async` fills the next while the warps work on this one;
# - S = Q Kᵀ for the warp's rows is a set of mma tiles in registers; the 4 lanes of a row agree on
#   its maximum with two shuffles; P is rounded to FP16 in the registers where the mma left S, which
#   is exactly the layout of the next mma's A operand, so P·V needs no shuffle at all;
# - every K and V fragment a warp loads (one `ldmatrix`) feeds both of its row blocks: with 16 rows
#   a warp, shared memory's bandwidth, not the tensor cores, sets the pace;
# - a causal block stops at the diagonal: tiles of keys after all its queries are never loaded.

# %%
workbook.show(tiles.tile_ops)
workbook.show(fused.make_forward)

# %% [markdown]
# ## Check: awkward lengths, both masks, NaN and -inf, BF16
#
# Lengths that are not a multiple of the tile (1, 33, 65), both head dimensions, causal or not.
# BF16 has FP16's size and float32's range, with 8 significant bits instead of 11: the fused
# kernel takes it as it is (NumPy has no bfloat16, so its bits travel in uint16 arrays), with
# `mma_bf16` and P rounded to BF16, and is held to BF16's rounding.
# A NaN in a query reaches its own row of O only; a query whose every score is -inf (a -inf in a
# query against keys that are positive there) gives a row of zeros, not NaN. The tests run more
# (`tests/test_ch12_attention.py`).

# %%
def check_case(heads, n, d, causal, variant, poison=None, precision="f16"):
    q, kk, v = k.operands(rng, heads, n, d, np.float16 if precision == "f16" else "bf16")
    if poison == "nan":
        q[0, n // 2, 3] = np.nan
    if poison == "-inf":
        q[0, n // 2, 0], kk[0, :, 0] = -np.inf, np.abs(kk[0, :, 0]) + np.float16(0.5)
    o = cuda.to_device(np.full(q.shape, 7, q.dtype))
    k.attention(cuda.to_device(q), cuda.to_device(kk), cuda.to_device(v), o, causal=causal, variant=variant,
                precision=precision)
    reference = k.attention_reference(q, kk, v, causal)
    workbook.assert_close(k.values(o.copy_to_host()), reference, rtol=0,
                          atol=float(k.tolerance(v, d, n, precision).max()),
                          name=f"{variant} {precision} {heads}x{n}x{d} causal={causal}")
    return reference


CASES = [(1, 1, 64, False), (2, 33, 64, True), (1, 65, 128, False), (1, 65, 128, True)]
for variant in ("naive", "fused"):
    for case in CASES:
        check_case(*case, variant)
    nan_row = check_case(1, 40, 64, True, variant, poison="nan")
    zero_row = check_case(1, 40, 64, False, variant, poison="-inf")
check_case(*CASES[-1], "fused", precision="bf16")
print("naive and fused: correct at (heads, N, d, causal) =", CASES, "| fused in BF16 too, at", CASES[-1])
print("a NaN in query 20 reaches rows", np.unique(np.nonzero(np.isnan(nan_row[0]))[0]).tolist(),
      "| the -inf query's row:", zero_row[0, 20, :4], "...")
try:
    k.attention(*(cuda.to_device(np.zeros((1, 8, 96), np.float16)) for _ in range(4)))
except ValueError as error:
    print("d = 96:", error)

# %% [markdown]
# ## What moves through global memory
#
# The simulator sees every access: here both at one head of 130 tokens, the bytes the kernels ask
# for. The naive kernels' stores are the scores and P, and O; the fused kernel stores O and
# nothing else, and loads K and V once per block of 128 queries.

# %%
n_traced, d_traced = 130, 64
traced_in = [cuda.to_device(x) for x in k.operands(rng, 1, n_traced, d_traced)]
traffic = {}
if not workbook.ON_GPU:
    for variant in ("naive", "fused"):
        with memtrace.trace() as trace:
            k.attention(*traced_in, cuda.device_array((1, n_traced, d_traced), np.float16), variant=variant)
        kernels = trace.kernels()
        traffic[variant] = {way: sum(spaces[f"global {way}"].requested for spaces in kernels.values()
                                     if f"global {way}" in spaces) for way in ("ld", "st")}
    output_bytes = n_traced * d_traced * 2
    print({variant: f"loads {t['ld']:,} B, stores {t['st']:,} B" for variant, t in traffic.items()},
          f"| O itself is {output_bytes:,} B")
    assert traffic["fused"]["st"] == output_bytes  # nothing but O is stored
print("bytes a call must move at N = 4096, d = 128, a head:",
      {variant: f"{k.bytes_moved(1, 4096, 128, variant) / 2**20:.0f} MiB" for variant in ("naive", "fused")})

# %% [markdown]
# ## Benchmark: against torch's attention
#
# On a GPU: 64 heads (batch x heads) of 4096 tokens, d = 128, FP16, then the causal mask, then 16
# heads of 16384. TFLOP/s counts 4·heads·N²·d, half of it under the causal mask. The baselines run
# on the same buffers: `scaled_dot_product_attention` with the backend torch picks, with its
# FlashAttention-2 backend forced, and torch's own matmul, softmax, matmul. Each case is checked
# on its first two heads against the float64 reference first.

# %%
heads, n = workbook.size(gpu=64, sim=1), workbook.size(gpu=4096, sim=70)
full = measuring.compare(chapter, heads, n, 128, causal=False)
causal = measuring.compare(chapter, heads, n, 128, causal=True)
long_heads, long_n = workbook.size(gpu=16, sim=1), workbook.size(gpu=16384, sim=40)
long_full = measuring.compare(chapter, long_heads, long_n, 128, False, ("fused",), key="attention long d=128 full")
bf16 = measuring.compare(chapter, workbook.size(gpu=heads, sim=1), workbook.size(gpu=n, sim=33), 128, False, ("fused",),
                         key="attention d=128 full bf16", precision="bf16")
long_causal = measuring.compare(chapter, long_heads, long_n, 128, True, ("fused",), key="attention long d=128 causal")
small_d = measuring.compare(chapter, heads, n, 64, causal=False, variants=("fused",))

# %% [markdown]
# ## The ceiling: mma.sync alone
#
# Chapter 09's ceiling kernel issues mma.sync after mma.sync from registers, no memory at all: no
# kernel built on this instruction can pass it. Hopper's torch kernels use its own instruction,
# wgmma, which can.

# %%
peak = measuring.mma_ceiling()
print(f"mma.sync FP16 here: {peak:.0f} TFLOP/s" if peak else "the simulator: no ceiling to measure")
chapter.record("mma.sync FP16 ceiling (TFLOP/s)", {"mma.sync f16": peak} if peak else {})

# %% [markdown]
# ## What the numbers mean
#
# - **Bytes**: the naive kernels move the N x N scores at least four times (S written and read,
#   P written and read), 12 bytes a score; the fused kernel moves Q, K, V and O, 8 bytes a token
#   and dimension, and loads K and V once per 128 queries, from the L2 mostly.
# - **The naive order** is bound by those bytes long before the tensor cores are busy; fused, the
#   same products and the same softmax run at tensor-core speed.
# - **The fused kernel** runs its two products on mma.sync with FP32 sums, its softmax on the
#   exp2 unit, and a rescale of 64 accumulators per row per tile: the work the tensor cores do
#   not do is what keeps it below the mma.sync ceiling printed below.
# - **torch's default** on Hopper is cuDNN's attention on wgmma, Hopper's own instruction, which
#   mma.sync cannot match (chapter 09b); its FlashAttention-2 backend is the mma.sync design this
#   chapter follows. Part b takes the same loop to wgmma, and holds the chapter's bars.
# - **Causal** halves the work and skips half the tiles; the diagonal tiles pay for the mask.

# %%
chapter.show_figures({
    "fused, 64x4096 d=128 (TFLOP/s)": ("{:.0f}", ("attention d=128 full", "fused", "tflops")),
    "fused, causal (TFLOP/s)": ("{:.0f}", ("attention d=128 causal", "fused", "tflops")),
    "fused, 16x16384 (TFLOP/s)": ("{:.0f}", ("attention long d=128 full", "fused", "tflops")),
    "fused, d=64 (TFLOP/s)": ("{:.0f}", ("attention d=64 full", "fused", "tflops")),
    "fused BF16 / torch SDPA BF16, 64x4096 (TFLOP/s)": (
        "{:.0f} / {:.0f}", ("attention d=128 full bf16", "fused", "tflops"),
        ("attention d=128 full bf16", "torch SDPA (its default backend)", "tflops")),
    "naive (TFLOP/s)": ("{:.0f}", ("attention d=128 full", "naive", "tflops")),
    "torch SDPA default / FA2 backend / unfused (TFLOP/s)": (
        "{:.0f} / {:.0f} / {:.0f}", ("attention d=128 full", "torch SDPA (its default backend)", "tflops"),
        ("attention d=128 full", "torch SDPA, FlashAttention-2 backend", "tflops"),
        ("attention d=128 full", "torch matmul-softmax-matmul", "tflops")),
    "fused vs naive (speed-up)": ("{:.1f}x", chapter.ratio(("attention d=128 full", "fused", "tflops"),
                                                           ("attention d=128 full", "naive", "tflops"))),
    "fused vs torch SDPA default / FA2 backend (fraction)": (
        "{:.2f} / {:.2f}", chapter.ratio(("attention d=128 full", "fused", "tflops"),
                                         ("attention d=128 full", "torch SDPA (its default backend)", "tflops")),
        chapter.ratio(("attention d=128 full", "fused", "tflops"),
                      ("attention d=128 full", "torch SDPA, FlashAttention-2 backend", "tflops"))),
    "mma.sync FP16 ceiling (TFLOP/s)": ("{:.0f}", ("mma.sync FP16 ceiling (TFLOP/s)", "mma.sync f16")),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises on one small kernel: the fused kernel's
# algorithm without the tensor cores, a warp a query and a lane a key of each tile, K and V in two
# stages of shared memory. Each cell below shows one and runs its check: *not attempted*, *wrong*
# (with what is wrong) or *correct*. Edit `exercises.py` between `# >>> ch12.N` and `# <<< ch12.N`,
# save, and re-run the cell. `python -m pytest --exercises -k ch12` checks them all at once.

# %%
from workbook import exercises  # noqa: E402

exercises.show("ch12.1")

# %%
exercises.show("ch12.2")

# %% [markdown]
# ch12.3 divides by a row's sum, which is 0 when no score of the row is finite; ch12.4 loads the
# next tile into a stage some warp may still be reading (the simulator's sanitizer names both).

# %%
exercises.show("ch12.3")

# %%
exercises.show("ch12.4")

# %% [markdown]
# ## More to try
# 1. Tiles of 64 keys at d = 128 run out of registers and spill (`EXPERIMENTS.md`). Let P take the
#    registers of S (S is dead once P is packed) and measure `regs_per_thread` and the time.
# 2. Split each tile's copies into two groups, K then V, so that S = Q Kᵀ starts before V lands.
# 3. Add a key-padding length per head (heads with fewer keys than N): which tiles can be skipped?
# 4. BF16 in part b's wgmma kernel: wgmma takes `.bf16` operands too. What else changes?
#
# ## References
# - T. Dao, "FlashAttention-2: Faster Attention with Better Parallelism and Work Partitioning" (2023).
# - J. Shah et al., "FlashAttention-3: Fast and Accurate Attention with Asynchrony and Low-precision" (2024).
# - M. Milakov, N. Gimelshein, "Online normalizer calculation for softmax" (2018).
# - Triton's fused-attention tutorial (`06-fused-attention.py`): the same algorithm in tiles.
