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
# # Chapter 01 — ReLU with a 1-bit mask: sequential vs warp ballot, and fused BatchNorm + Add + ReLU
#
# The case comes from OneFlow's normalization kernels. In a ResNet every BatchNorm is followed by a
# ReLU (`bn → relu`) or by a residual add and a ReLU (`bn → + identity → relu`). The backward pass of
# ReLU needs only *where the input was positive*, so instead of keeping `y` (4 bytes per element)
# for the backward pass, the forward pass can keep **one bit** per element.
#
# In this chapter you will learn
# - why building a bitmask **sequentially** (one thread, eight elements, one byte) breaks coalescing,
#   and how a **warp ballot** (`cuda.ballot_sync`) builds each 32-bit word in one instruction;
# - how to keep a warp-level collective safe: a loop whose trip count is **warp-uniform**, and a tail
#   where lanes past the end still vote (false);
# - the backward pass from the mask — a *select*, not a multiply — and what the 31/32 of bytes saved
#   is worth against `torch`'s `threshold_backward`, which reads `y`;
# - fusing BatchNorm (training) + add + ReLU + mask into one pass, and the ReLU gradient into the
#   BatchNorm backward.
#
# Without a GPU this notebook runs in numba's CUDA simulator on small arrays; each comparison is then
# followed by the stored figures of the reference GPU.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import cuda, host, plots

from chapters.ch01_relu_mask import batchnorm as bn
from chapters.ch01_relu_mask import kernels as k
from chapters.ch01_relu_mask import measuring

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch01", "ReLU with a 1-bit mask; fused BatchNorm + Add + ReLU")
rng = np.random.default_rng(1)
torch = workbook.bench.optional_torch()

# %% [markdown]
# ## The reference and the mask layout
#
# `y = relu(x)`, and the mask is `uint32[ceil(n / 32)]` with bit `i % 32` of word `i // 32` set when
# `x[i] > 0` — exactly `np.packbits(x > 0, bitorder="little")` viewed as uint32, padding bits 0.
#
# The special values, decided once: `NaN > 0` is false, so **a NaN gets bit 0** (its gradient is 0,
# as in torch, whose `threshold_backward` tests `y > 0` and `NaN > 0` is false); `y` keeps the NaN
# (as `torch.relu` does). `+inf` gets bit 1, `-0.0` and `+0.0` get bit 0 and give `y = +0.0`.

# %%
x_small = np.array([1.5, -2.0, 0.0, -0.0, np.nan, np.inf, -np.inf, 3.0], dtype=np.float32)
y_small, mask_small = k.relu_mask_reference(x_small)
print("x    ", x_small)
print("y    ", y_small)
print("mask  0b" + format(int(mask_small[0]), "08b")[::-1], "(bit 0 first)")

# %% [markdown]
# What the mask saves: the backward pass keeps `n / 8` bytes instead of `4n` — 32 times less.

# %%
for shape in [(16, 32, 112, 112), (32, 256, 56, 56), (1 << 28,)]:
    count = int(np.prod(shape))
    print(f"{str(shape):>20}: keep y {4 * count / 2**20:8.1f} MiB   keep the mask "
          f"{4 * k.mask_words(count) / 2**20:6.1f} MiB")

# %% [markdown]
# ## Naive: a sequential bitmask
#
# Each thread reads 8 consecutive elements and writes one byte of bits:
#
# ```
# thread:   t0                  t1                  t2                  ...  t31
# reads:    x[0]   x[1] .. x[7] x[8]   x[9] .. x[15] x[16] ...                 x[248] .. x[255]
# load j=0: x[0]                x[8]                x[16]               ...  x[248]   32 bytes apart
# writes:   mask byte 0         mask byte 1         mask byte 2         ...  byte 31  32 consecutive bytes
# ```
#
# The byte stores are coalesced. The loads are not: on each of the 8 load instructions the 32 lanes
# read addresses 32 bytes apart, 32 different sectors, 4 useful bytes in each. The next 7 loads
# reuse those sectors only if they are still in L1, and the `y` stores have the same stride.

# %%
workbook.show(k.relu_mask_sequential_kernel)

# %% [markdown]
# ## Optimized: one ballot per 32 elements
#
# Lane *k* of a warp tests element *k* of a row of 32, and `cuda.ballot_sync(FULL_MASK, x > 0)` gives
# every lane the 32 answers as one word — the mask word of that row. A warp does 8 rows per trip
# (8 independent loads in flight per lane), lanes 0–7 keep the 8 words and store them together: 32
# consecutive bytes. All loads and stores of `x` and `y` are coalesced 128-byte rows.
#
# The trip loop depends only on the warp index, so a warp goes round it as one and every lane reaches
# every ballot; the last partial trip runs with bounds checks, and lanes past `n` vote `False`.

# %%
workbook.show(k._relu_mask_trip)
workbook.show(k.relu_mask_ballot_kernel)

# %% [markdown]
# What the GPU runs: `workbook.show_ptx` compiles the kernel for these argument types with numba's
# real compiler (on a laptop too, with the `compile` extra installed) and prints the PTX lines that
# match a pattern. A ballot is one instruction for the whole warp, `vote.sync.ballot.b32`: 8 of them
# in the unrolled trip (one per row), 8 more in the bounds-checked last trip.

# %%
_x = np.zeros(64, np.float32)
workbook.show_ptx(k.relu_mask_ballot_kernel, _x, _x, np.zeros(2, np.uint32), grep=r"vote\.")

# %% [markdown]
# Two details in that trip cost a lot when done the obvious way. The word is stored by *every*
# lane (lanes j, j+8, j+16, j+24 store row j's word, the same value to the same address): written as
# `if lane < 8: mask[...] = mine`, the compiler moves that loop-invariant test out of the loop and
# makes two copies of the loop, one for lanes 0–7 and one for lanes 8–31. The warp then runs both
# copies one after the other, meeting at each ballot, and every load is issued twice, by 8 and by 24
# lanes. And the row a lane keeps is picked with a select (`if row == j: mine = bits`), not a branch.
#
# ### One step further: 8-byte words
#
# Chapter 00 found that a numba kernel moving 8-byte words gets closer to the copy ceiling than one
# moving 4-byte floats. Here lane *k* loads the `uint64` holding elements 2k and 2k+1 of a row of 64,
# and never forms a float: a float32 is positive when its bits are in `1 .. 0x7F800000`, and `y` is
# its bits or 0. Two ballots per row (even and odd elements) are interleaved into the two mask words
# of the row with a few shifts and masks.

# %%
workbook.show(k._spread16)
workbook.show(k._relu_mask_wide_trip)

# %% [markdown]
# ## Backward from the mask
#
# `dx = dy` where the bit is set, else 0. It must be a **select**: `dy * bit` would turn a masked
# `inf` in `dy` into `inf * 0 = NaN`. The 32 lanes of a row read the same mask word (one broadcast
# load). Bytes per element: the version that reads `y` moves 4 + 4 + 4 = 12, the mask version
# 4 + 1/8 + 4 = 8.125, so at most 12 / 8.125 = 1.48x faster.

# %%
workbook.show(k._backward_from_mask_trip)

# %% [markdown]
# ## Optimized further: 16-byte quads
#
# Chapter 00 built a 16-byte load and store numba does not have (`workbook/memory.py`'s `load4` and
# `store4`: one `ld.global.v4.f32` / `st.global.v4.f32`) and found that its best copy gives each
# thread *one* quad on a grid sized to the data. Here is the mask kernel in that shape. A warp now
# covers 32 quads = 128 elements = 4 mask words, and lane *k* holds elements 4k..4k+3, so one
# ballot no longer gives a mask word: four ballots do, one per position *j* in the quad (bit *k* of
# ballot *j* is element 4k + j). Word *w* takes byte *w* of each ballot, its bits spread 4 apart
# (`_spread8`) and shifted by *j*. The backward pass reads a 4-bit nibble of the mask per quad.

# %%
workbook.show(k._spread8)
workbook.show(k.relu_mask_quads_kernel)
workbook.show(k.relu_backward_from_mask_quads_kernel)
_x = np.zeros(256, np.float32)
workbook.show_ptx(k.relu_mask_quads_kernel, _x, _x, np.zeros(8, np.uint32), grep=r"\.v4|vote")

# %% [markdown]
# ## Check first: awkward sizes and special values
#
# Sizes 1, 31, 32, 33, 1000, a size that is not a multiple of a trip, and a large odd size; the
# inputs (`special_inputs`, which the tests and the exercise checks use too) include zeros,
# negative zeros, NaN and ±inf, and `dy` has infinities where the mask is 0.

# %%
odd_sizes = [1, 31, 32, 33, 1000, 2049, workbook.size(gpu=(1 << 24) + 3, sim=3001)]
forwards = (k.relu_mask_sequential, k.relu_mask_ballot, k.relu_mask_wide, k.relu_mask_quads)
backwards = (k.relu_backward_from_mask, k.relu_backward_from_mask_wide, k.relu_backward_from_mask_quads,
             k.relu_backward_from_y)
# every kernel below compiled first, side by side (on a GPU, in worker processes: workbook.warm_up)
v32, m32 = cuda.device_array(32, np.float32), cuda.device_array(1, np.uint32)
workbook.warm_up([lambda f=f: f(v32, cuda.device_array_like(v32), m32) for f in forwards]
                 + [lambda b=b: b(v32, v32 if b is k.relu_backward_from_y else m32, cuda.device_array_like(v32))
                    for b in backwards])
for n in odd_sizes:
    x_host = k.special_inputs(n)
    y_ref, mask_ref = k.relu_mask_reference(x_host)
    x_dev = cuda.to_device(x_host)
    for forward in forwards:
        y_dev, mask_dev = forward(x_dev, cuda.device_array(n, np.float32), cuda.device_array(k.mask_words(n), np.uint32))
        workbook.assert_close(y_dev, y_ref, exact=True, name=f"{forward.__name__} y, n={n}")
        workbook.assert_bitmask(mask_dev, x_host > 0, name=f"{forward.__name__} mask, n={n}")
    dy_host = host.standard_normal(rng, n)  # rng.standard_normal on every core (workbook/host.py)
    dy_host[~(x_host > 0)] = np.inf  # a select gives 0 there; a multiply would give NaN
    dx_ref = k.relu_backward_reference(dy_host, x_host > 0)
    dy_dev = cuda.to_device(dy_host)
    for backward in (k.relu_backward_from_mask, k.relu_backward_from_mask_wide, k.relu_backward_from_mask_quads):
        dx = backward(dy_dev, cuda.to_device(mask_ref), cuda.device_array(n, np.float32))
        workbook.assert_close(dx, dx_ref, exact=True, name=f"{backward.__name__}, n={n}")
    dx = k.relu_backward_from_y(dy_dev, cuda.to_device(y_ref), cuda.device_array(n, np.float32))
    workbook.assert_close(dx, dx_ref, exact=True, name=f"backward from y, n={n}")
print("ReLU kernels agree with NumPy at sizes", odd_sizes)

# %% [markdown]
# ## Forward: sequential vs ballot vs `torch.relu`
#
# `torch.relu` reads 4n and writes 4n bytes and keeps no mask; the mask kernels write n/8 bytes more:
# **8.125n bytes**, so at best 1.016x the time of `torch.relu`. The bar: 0.85 of the copy ceiling.

# %%
n = workbook.size(gpu=1 << 28, sim=4096)
x = cuda.to_device(host.standard_normal(rng, n))
y = cuda.device_array(n, np.float32)
mask = cuda.device_array(k.mask_words(n), np.uint32)
torch_x = workbook.bench.torch_view(x)
expected_forward = k.relu_mask_reference(x.copy_to_host())  # (y, mask)

forward_result = chapter.compare(
    "relu forward + mask",
    {
        "sequential (naive)": lambda: k.relu_mask_sequential(x, y, mask),
        "warp ballot": lambda: k.relu_mask_ballot(x, y, mask),
        "warp ballot, 8-byte words": lambda: k.relu_mask_wide(x, y, mask),
        "warp ballot, 16-byte quads": lambda: k.relu_mask_quads(x, y, mask),
    },
    reference=expected_forward,
    baselines={"torch.relu (no mask)": lambda: torch.relu(torch_x)},
    check_baselines=False,  # torch.relu returns y only; it is checked below
    bytes=8.125 * n,
    size=f"n=2^{n.bit_length() - 1} float32",
)
if torch is not None:
    workbook.assert_close(torch.relu(torch_x), expected_forward[0], name="torch.relu")


best_forward = forward_result.fastest(["warp ballot", "warp ballot, 8-byte words"])
chapter.bar(f"relu+mask forward ({best_forward}): fraction of the copy ceiling, n=2^28",
            forward_result.fraction(best_forward), at_least=0.85)
chapter.bar("relu+mask forward, 16-byte quads: fraction of the copy ceiling, n=2^28",
            forward_result.fraction("warp ballot, 16-byte quads"), at_least=0.85)

# %% [markdown]
# ### Why the sequential kernel is slow, counted without a GPU
#
# The sequential kernel's lane *k* reads `x[8k + j]`: on each of its loads the warp's 32 addresses
# are 32 bytes apart, one sector each, to use 4 bytes of every one. The ballot kernel's lanes read
# 32 neighbouring floats: 4 sectors, all used. In the simulator `workbook.memtrace` sees every
# access and groups a warp's lanes into requests as the hardware does (chapter 00), so the
# difference shows on a laptop: the sectors each request moves, and the sectors moved per element
# (through L1; repeated hits on the same sectors are what L1 absorbs). Beside them, the reference
# GPU's times.

# %%
if workbook.ON_GPU:
    print("memtrace counts in the simulator (WORKBOOK_DEVICE=sim); on a GPU, Nsight Compute's "
          "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum / ..._requests_... are the same counts")
else:
    measuring.traced_forward_table(chapter, [("sequential (naive)", k.relu_mask_sequential),
                                             ("warp ballot", k.relu_mask_ballot),
                                             ("warp ballot, 16-byte quads", k.relu_mask_quads)], rng)

# %% [markdown]
# ## Backward: from the mask vs from `y` vs `threshold_backward`
#
# Both of our backward kernels run the same loop; they differ only in what they read. torch's
# `threshold_backward(dy, y, 0)` is what autograd runs for `relu`: 12 bytes per element.

# %%
dy = cuda.to_device(host.standard_normal(rng, n))
dx = cuda.device_array(n, np.float32)
k.relu_mask_ballot(x, y, mask)
torch_dy, torch_y = workbook.bench.torch_view(dy), workbook.bench.torch_view(y)


def backward_case(key, dy, y, mask, dx, size):
    n = dy.size
    t_dy, t_y = workbook.bench.torch_view(dy), workbook.bench.torch_view(y)
    return chapter.compare(
        key,
        {
            "from y (12 B/elt)": lambda: k.relu_backward_from_y(dy, y, dx),
            "from mask (8.125 B/elt)": lambda: k.relu_backward_from_mask(dy, mask, dx),
            "from mask, 8-byte words": lambda: k.relu_backward_from_mask_wide(dy, mask, dx),
            "from mask, 16-byte quads": lambda: k.relu_backward_from_mask_quads(dy, mask, dx),
        },
        reference=lambda: k.relu_backward_reference(dy.copy_to_host(), y.copy_to_host() > 0),
        baselines={"torch threshold_backward": lambda: torch.ops.aten.threshold_backward(t_dy, t_y, 0)},
        bytes=8.125 * n,
        size=size,
    )


backward_result = backward_case("relu backward", dy, y, mask, dx, f"n=2^{n.bit_length() - 1} float32")
best_backward = backward_result.fastest(["from mask (8.125 B/elt)", "from mask, 8-byte words"])
chapter.bar(f"relu backward {best_backward}: fraction of the copy ceiling, n=2^28",
            backward_result.fraction(best_backward), at_least=0.85)
chapter.bar("relu backward from mask, 16-byte quads: fraction of the copy ceiling, n=2^28",
            backward_result.fraction("from mask, 16-byte quads"), at_least=0.85)

# %% [markdown]
# GB/s above count the mask kernel's 8.125 bytes per element for every row, so the "from y" row's
# true rate is 12/8.125 times the one shown.
#
# ### The seed case: 16 x 32 x 112 x 112
#
# 6.4 million elements: `dy` is 25.7 MB, with `dx` about 52 MB of traffic, which a Hopper GPU's
# 50 MB L2 largely serves between repeats. At this size the
# launch (~15-20 µs from Python, more with each array argument) is a large part of the time.

# %%
seed_n = workbook.size(gpu=16 * 32 * 112 * 112, sim=16 * 112)
seed_args = (dy[:seed_n], y[:seed_n], mask[:k.mask_words(seed_n)], dx[:seed_n])
seed_result = backward_case("relu backward, seed case", *seed_args,
                            f"16x32x112x112 = {seed_n:,} float32 (fits in L2)" if workbook.ON_GPU
                            else f"n={seed_n}")

# %% [markdown]
# ## Fused BatchNorm (training) + Add + ReLU
#
# Per channel *c*, over N·H·W elements: `mean`, `var` (biased), `z = (x - mean) / sqrt(var + eps) ·
# gamma + beta + identity`, `y = relu(z)`, mask bit `z > 0`. Four kernels, each with one block per
# contiguous (n, c) plane of NCHW:
#
# | kernel | reads | writes |
# | --- | --- | --- |
# | stats: sum x, sum x² per plane (float64) | x: 4 | — |
# | forward: fold the N partials, normalise, + identity, ReLU, ballot | x 4 + identity 4 | y 4 + mask 1/8 |
# | backward reduce: g = dy where bit, sum g, sum g·x; d_identity = g | dy 4 + mask 1/8 + x 4 | d_identity 4 |
# | backward dx: dx = a·g + b·x + k per channel | dy 4 + mask 1/8 + x 4 | dx 4 |
#
# 40.4 bytes per element in all. torch's unfused autograd graph (`batch_norm`, `+`, `relu`, then
# `threshold_backward` and `batch_norm_backward`) moves about 64. The mask layout here is per plane:
# `uint32[N, C, ceil(H·W / 32)]`, each plane's last word padded, so no two blocks share a word.
# Inputs are drawn so that no `z` is within 1e-3 of 0 (see `bn.batchnorm_inputs`): float32 rounding
# must not flip a mask bit between us, torch and the float64 reference.

# %%
workbook.show(bn.bn_forward_kernel)
workbook.show(bn.bn_backward_dx_kernel)

# %%
for shape in [(2, 3, 5, 7), (3, 2, 1, 33), (1, 1, 1, 2)]:
    for with_identity in (True, False):
        host, dev, refs = measuring.bn_case(rng, shape, with_identity)
        grads = measuring.fused_step(dev)
        name = f"BN{' + add' if with_identity else ''} + ReLU {shape}"
        workbook.assert_close(dev["y"], refs["y"], rtol=1e-5, atol=1e-5, name=f"{name} y")
        workbook.assert_close(dev["mask"], refs["mask"], exact=True, name=f"{name} mask")
        workbook.assert_close(dev["running_mean"], refs["running_mean"], name=f"{name} running_mean")
        workbook.assert_close(dev["running_var"], refs["running_var"], name=f"{name} running_var")
        what = ("dx", "d_identity", "dgamma", "dbeta") if with_identity else ("dx", "dgamma", "dbeta")
        for grad, ref, label in zip(grads, refs["grads"], what):
            workbook.assert_close(grad, ref, rtol=1e-4, atol=1e-5, name=f"{name} {label}")
print("fused BatchNorm (+ add) + ReLU agrees with NumPy")

# %% [markdown]
# ### Fused forward + backward vs torch's unfused autograd
#
# One training step of `relu(batch_norm(x) + identity)`: forward, then backward with a given `dy`,
# producing `dx`, `d_identity`, `dgamma`, `dbeta`. torch runs on the same device buffers.

# %%
bn_shape = workbook.size(gpu=(32, 256, 56, 56), sim=(2, 4, 6, 6))
host, dev, refs = measuring.bn_case(rng, bn_shape, True)
torch_step = None if torch is None else measuring.torch_bn_step(torch, host, dev)
elements = int(np.prod(bn_shape))
bn_result = chapter.compare(
    "bn+add+relu fwd+bwd",
    {"fused (4 kernels, 1-bit mask)": lambda: measuring.fused_step(dev)},
    reference=refs["grads"],
    baselines={"torch unfused (autograd)": torch_step},
    check=lambda out, ref, name: workbook.assert_close(out, ref, rtol=1e-4, atol=1e-4, name=name),
    bytes=(4 + 12.125 + 12.125 + 12.125) * elements,
    size="x".join(map(str, bn_shape)),
)
chapter.bar("fused BN+add+relu fwd+bwd: fraction of the copy ceiling, 32x256x56x56",
            bn_result.fraction("fused (4 kernels, 1-bit mask)"), at_least=0.85)

# %% [markdown]
# ## A size sweep: the forward pass
#
# Small arrays are dominated by the launch (~15-20 µs from Python; torch's ~11 µs) and sit in the L2;
# past the L2 the rate settles. The dashed line is the copy ceiling measured in this run.

# %%
sweep_sizes = [1 << p for p in (range(16, 29, 2) if workbook.ON_GPU else range(6, 13, 2))]
series = measuring.forward_sweep(chapter, torch, x, y, mask, sweep_sizes)
if workbook.ON_GPU:
    figure = plots.sweep(sweep_sizes, series, ceiling=workbook.bench.copy_ceiling()["gbps"],
                         xlabel="float32 elements", ylabel="GB/s (8.125 bytes per element)",
                         title="ReLU forward with a 1-bit mask")
    chapter.savefig(figure, "relu_sweep")
else:
    print("simulator: the sweep ran and was checked at", sweep_sizes, "- the plot needs a GPU's times.")
    chapter.show_stored_figure("relu_sweep")  # the same plot, measured on the reference GPU

# %% [markdown]
# ## What the numbers mean
#
# - **Sequential vs ballot.** Both move the same bytes. The sequential kernel's loads are 32 bytes
#   apart across a warp, so each load instruction touches 32 sectors and relies on L1 to serve the
#   next seven; its `y` stores are scattered the same way. The ballot kernel reads and writes whole
#   128-byte rows, and builds a word with one instruction instead of 8 compares, shifts and ORs.
# - **Ballot vs torch.relu.** The mask adds 1/64 to the bytes, so at best the mask kernels take
#   1.016 of `torch.relu`'s time; the rest of the gap is how close a numba kernel gets to torch's
#   16-byte loads and stores (chapter 00 measured it for a copy), and the 16-byte quads close it.
# - **Backward.** Reading one bit instead of `y` removes a third of the bytes: at best 12 / 8.125 =
#   1.48x over our own "from y" kernel. Testing for a whole quad first and reading the mask inside
#   that branch is what got the quads close (the variants are in EXPERIMENTS.md).
# - **Wide words cost the host, not the GPU.** The 8-byte-word kernels run as fast as the 4-byte
#   ones on the GPU, but their wrappers cost more host time a call: only large arrays pay that back.
# - **Small sizes.** At 16x32x112x112 the data sits in the L2 and a kernel takes about what a launch
#   from Python costs: chapter 07 is about that.
# - **Divergence costs bandwidth.** A lane-only `if` around the mask store, hoisted out of the loop by
#   the compiler, splits every load and store of the warp in two; the ballot kernel's store is
#   branch-free for that reason.
# - **Fused BatchNorm.** Two passes forward, two backward, with the ReLU folded into both and the mask
#   replacing `y`: about 40 bytes per element against torch's ~64, and 4 launches against torch's ~8
#   kernels plus autograd's bookkeeping. Two things bring it near the copy ceiling. Quads: at 4
#   bytes an access each element pays for its own address arithmetic, mask bit and load, more
#   instructions than the SMs issue while the memory waits. And a grid of one wave: a block takes
#   several planes of its channel, folds the channel's sums once, not once per plane, and walks its
#   planes as one sequence, so that only its last trip is partial.
#
# Variants measured on the way and dropped: [EXPERIMENTS.md](EXPERIMENTS.md). The figures these
# bullets point to:

# %%
FWD, BWD, BN, FUSED = "relu forward + mask", "relu backward", "bn+add+relu fwd+bwd", "fused (4 kernels, 1-bit mask)"
chapter.show_figures({
    "forward at 2^28: sequential / warp ballot": ("{:.2f} / {:.2f} ms", (FWD, "sequential (naive)"), (FWD, "warp ballot")),
    "forward, 16-byte quads: time / torch.relu's": ("{:.3f}", lambda: 1 / chapter.figure(
        FWD, "warp ballot, 16-byte quads", "speedup_vs_baseline")),
    "backward from the mask, quads: vs from y / vs threshold_backward": (
        "{:.2f}x / {:.2f}x", (BWD, "from mask, 16-byte quads", "speedup_vs_first"),
        (BWD, "from mask, 16-byte quads", "speedup_vs_baseline")),
    "backward at 2^28: 8-byte words / 4-byte": ("{:.3f} / {:.3f} ms", (BWD, "from mask, 8-byte words"),
                                                (BWD, "from mask (8.125 B/elt)")),
    "  host cost a call: 8-byte words / quads": ("{:.0f} / {:.0f} us", (BWD, "from mask, 8-byte words", "host_us"),
                                                 (BWD, "from mask, 16-byte quads", "host_us")),
    "backward at 16x32x112x112 (in the L2)": ("{:.0f} us", lambda: 1000 * chapter.figure(
        "relu backward, seed case", "from mask (8.125 B/elt)")),
    "fused BatchNorm step: vs torch's unfused (speed-up); of the copy ceiling": (
        "{:.2f}x; {:.0%}", (BN, FUSED, "speedup_vs_baseline"), (BN, FUSED, "fraction_of_ceiling")),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch01.N` and `# <<< ch01.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch01`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch01.1")

# %%
exercises.show("ch01.2")

# %%
exercises.show("ch01.3")

# %%
exercises.show("ch01.4")

# %% [markdown]
# ## More to try
# 1. Change `WORDS_PER_TRIP` to 4 and 16. Predict, then measure. What happens to the registers?
# 2. Write the backward pass that loads one word per lane (lanes 0–7) and hands each row its word
#    with `cuda.shfl_sync` instead of a broadcast load. Is it faster?
# 3. Drop the `check` branch of `_relu_mask_trip` (run every trip unchecked) and read what the tests
#    and `workbook.assert_bitmask` say at n = 33.
# 4. Make the backward pass a multiply (`dy * bit`) and find the input that makes it wrong.
# 5. The stats kernel computes `sum x²`; for data with a large mean, `E[x²] - mean²` in float32 would
#    lose everything. Why does float64 accumulation save it here, and what does Welford's method do?
#
# ## References
# - OneFlow, `oneflow/core/cuda/layer_norm.cuh` and the fused `normalization` kernels with a ReLU
#   bitmask (`fused_bn_add_relu`).
# - NVIDIA, *CUDA C++ Programming Guide*, "Warp Vote Functions" (`__ballot_sync`).
# - S. Ioffe, C. Szegedy, "Batch Normalization" (2015): the backward formulas used here.
