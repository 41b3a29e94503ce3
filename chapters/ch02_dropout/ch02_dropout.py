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
# # Chapter 02 — Dropout with a bitmask and a counter-based random generator
#
# Dropout zeroes each element with probability *p* and scales the survivors by 1/(1 − p). It is
# pure memory traffic, and its mask must be kept for the backward pass. onnxruntime's
# `BitmaskDropout`, PyTorch's fused dropout and Triton's "low-memory dropout" tutorial all attack
# the same two costs: the random numbers and the mask.
#
# In this chapter you will learn
# - why a **counter-based** generator (Philox4x32-10) beats a per-thread state: random number *q*
#   is a pure function of (*q*, seed), so any thread can make any number, and the result does not
#   depend on the grid — a NumPy copy reproduces the GPU's masks bit for bit;
# - how to pack a mask **one bit per element** with warp shuffles (numba has no `reduce_or_sync`),
#   keeping every lane in step so that no collective is skipped;
# - a **(seed, offset)** API that never reuses a random number across calls;
# - what each byte costs: a byte mask (torch), a bit mask (1/8 of it), or no mask at all
#   (regenerate it in the backward pass);
# - how to get 16-byte loads out of numba (an `@intrinsic` with inline PTX), and how big a grid
#   a grid-stride kernel wants.
#
# Without a GPU this notebook runs in numba's CUDA simulator on small arrays: every kernel runs and
# is checked; times there mean nothing, so each comparison is followed by the stored figures of the reference GPU.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import cuda, device_check, host, plots

from chapters.ch02_dropout import kernels as k
from chapters.ch02_dropout import philox

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch02", "Dropout with a bitmask and a counter-based random generator")
rng = np.random.default_rng(0)

# %% [markdown]
# ## The reference: Philox4x32-10 in NumPy, checked against Random123
#
# Philox is ten rounds of "multiply two words 32×32→64, swap the halves, XOR with the key" on a
# 128-bit counter under a 64-bit key. It is a *bijection* of the counter — distinct counters give
# distinct outputs — and passes BigCrush. Before anything else, the NumPy copy must reproduce the
# published known-answer vectors of the Random123 library, and the device function must reproduce
# the NumPy copy.

# %%
for counter, key, expected in philox.KNOWN_ANSWERS:
    got = philox.philox4x32_reference([counter], key)[0]
    assert [int(v) for v in got] == list(expected), (counter, key, got)
known_counters = np.array([c for c, _, _ in philox.KNOWN_ANSWERS], dtype=np.uint32)
for index, (_, key, expected) in enumerate(philox.KNOWN_ANSWERS):
    out = cuda.device_array((3, 4), dtype=np.uint32)
    philox.philox_kernel[1, 32](cuda.to_device(known_counters), cuda.to_device(np.array(key, np.uint32)), out)
    assert [int(v) for v in out.copy_to_host()[index]] == list(expected)
print("NumPy and device Philox4x32-10 reproduce the Random123 known answers")
workbook.show(philox.philox4x32)

# %% [markdown]
# Which number belongs to which element is part of the specification, not of the launch:
#
# ```
# element i  ->  Philox(counter = (i // 4, offset), key = seed), output word i % 4
# keep[i]    =   word >= ceil(p * 2^32)         (an integer compare: p = 0 keeps all, p = 1 none)
# y[i]       =   x[i] * (1 / (1 - p)) if keep[i] else 0      (scale = 0 when p = 1: no 1/0)
# ```
#
# The offset occupies the counter's upper half, so call number *k* (offset *k*) can never meet the
# counters of another call: `PhiloxDropout` hands out offsets 0, 1, 2, ...

# %%
n_demo = 40
x_demo = rng.standard_normal(n_demo, dtype=np.float32)
keep_demo = k.keep_reference(n_demo, 0.5, seed=2024, offset=0)
print("keep:", "".join("1" if b else "." for b in keep_demo))
print("mask words:", [hex(w) for w in workbook.pack_bitmask(keep_demo)])

# %% [markdown]
# ## Naive: numba's xoroshiro128p, a state per thread, a byte per element
#
# numba ships one generator, xoroshiro128p, whose 16-byte state lives in global memory, one per
# thread. Each draw reads and writes the state, and the result depends on which thread handled
# which element — change the grid and the mask changes. The mask is a byte per element, as torch's.

# %%
workbook.show(k.dropout_naive_kernel)

# %% [markdown]
# ## Optimized: Philox, a quad per lane, a shuffle-OR into mask words
#
# Each lane owns four consecutive elements: one Philox call makes their four random words, one
# 16-byte load brings them in (`load4`/`store4` of `workbook.memory`, chapter 00: numba emits only
# 4-byte accesses by itself, so an `@intrinsic` emits `ld.global.v4.f32`; 8 bytes for float16).
# Lanes 8w…8w+7 together hold the 32 bits of mask
# word w, a nibble each; three `shfl_xor_sync` steps OR them together. Four ballots would do it
# too, but the ballot of element j of each quad yields bits in the wrong order (bit *l* is element
# 4*l* + *j*) and would need a bit interleave afterwards. The loop is over warp tiles, so all 32
# lanes make the same number of trips and reach every shuffle, tail included.

# %%
workbook.show(k._make_forward_kernel)

# %% [markdown]
# The backward needs no collectives: thread *t* reads the nibble of its quad out of word *q*/8
# (eight lanes share a word, so the warp's four words come in one request):

# %%
workbook.show(k._make_backward_kernel)

# %% [markdown]
# ## Check first: exact masks at awkward sizes, NaN and Inf, the ends of p
#
# The masks are compared **exactly** with the NumPy Philox — no statistics needed to know the
# kernel is right. Sizes 1, 31, 33 (around a warp), 1001 (not a multiple of 4, 32 or the block),
# and a large odd size; float32 and float16.

# %%
odd_sizes = [1, 31, 33, 1001, workbook.size(gpu=(1 << 24) + 3, sim=2001)]
for n in odd_sizes:
    keep = k.keep_reference(n, 0.3, 7, 11)  # the same numbers for every kernel below: seed 7, offset 11
    for dtype in (np.float32, np.float16):
        x = rng.standard_normal(n).astype(dtype)
        y, mask = k.dropout_bitmask(cuda.to_device(x), 0.3, seed=7, offset=11)
        y_ref, mask_ref = k.dropout_reference(x, 0.3, seed=7, offset=11)
        workbook.assert_close(y, y_ref, exact=True, name=f"y n={n} {dtype.__name__}")
        workbook.assert_close(mask, mask_ref, exact=True, name=f"mask n={n}")
        dx = k.dropout_backward_bitmask(cuda.to_device(x), mask, 0.3)
        workbook.assert_close(dx, k.backward_reference(x, keep, 0.3), exact=True, name=f"dx n={n}")
    dx = k.dropout_backward_seed_only(cuda.to_device(x.astype(np.float32)), 0.3, seed=7, offset=11)
    workbook.assert_close(dx, k.backward_reference(x.astype(np.float32), keep, 0.3),
                          exact=True, name=f"seed-only dx n={n}")
print("bitmask forward, backward and seed-only backward match the NumPy Philox exactly at", odd_sizes)

x = np.array([np.nan, np.inf, -np.inf, 1.0, np.nan, 2.0, -np.inf, 3.0], dtype=np.float32)
y, _ = k.dropout_bitmask(cuda.to_device(x), 0.5, seed=1, offset=0)
print("x:", x, "\ny:", y.copy_to_host(), "(a dropped NaN or Inf becomes 0; a kept one stays)")

for p in (0.0, 0.1, 0.5, 0.9, 1.0):
    n = workbook.size(gpu=1 << 22, sim=2048)
    _, mask = k.dropout_bitmask(cuda.device_array(n, dtype=np.float32), p, seed=3, offset=0)
    print(f"p = {p}: kept {workbook.unpack_bitmask(mask, n).mean():.4f} (expected {1 - p:.4f})")

# %% [markdown]
# ## Forward: naive vs bitmask vs seed-only vs torch
#
# Bytes per element, at 2^28 float32 (1 GiB per array, twenty times the L2):
#
# | variant | read | written | mask kept |
# | --- | --- | --- | --- |
# | naive (xoroshiro, byte mask) | x 4 + state 16 (L2) | y 4 + mask 1 + state 16 (L2) | n bytes |
# | torch `native_dropout` | x 4 | y 4 + mask 1 | n bytes |
# | **Philox, bitmask** | x 4 | y 4 + mask 1/8 | n/8 bytes |
# | Philox, seed-only | x 4 | y 4 | none |
#
# The GB/s column counts **8.125 bytes per element for every row** — what a forward that keeps a
# mask must move at least — so it compares times, not each variant's own traffic.

# %%
n = workbook.size(gpu=1 << 28, sim=2048)
p, seed, OFFSET = 0.1, 2026, 5
x = cuda.to_device(host.standard_normal(rng, n))  # rng.standard_normal on every core (workbook/host.py)
y = cuda.device_array_like(x)
mask = cuda.device_array(-(-n // 32), dtype=np.uint32)
byte_mask = cuda.device_array(n, dtype=np.uint8)
torch_x = workbook.bench.torch_view(x)
sample = np.unique(np.concatenate([rng.integers(0, n, size=min(n, 1 << 20)), np.arange(max(0, n - 4099), n)]))
x_sample = device_check.at(x, sample)
keep_sample = k.keep_reference_at(sample, p, seed, OFFSET)  # what (seed, OFFSET) keeps there


def check_forward(out, _, name):
    """y (and the mask) against the NumPy Philox at sampled indices, exactly; the naive kernel,
    whose numbers no reference can know, against its own mask and the keep rate. The samples are
    gathered on the device (device_check.at): a copy of the sample, not of the 1 GiB output."""
    y_host = device_check.at(out[0], sample)
    if name.startswith("naive"):
        keep = device_check.at(out[1], sample).astype(bool)
        assert abs(keep.mean() - (1 - p)) < 0.01, f"{name}: keep rate {keep.mean()}"
    else:
        keep = keep_sample
        if len(out) > 1:
            bits = (device_check.at(out[1], sample // 32) >> (sample % 32).astype(np.uint32)) & 1
            np.testing.assert_array_equal(bits.astype(bool), keep, err_msg=f"{name}: mask bits")
    expected = np.where(keep, x_sample * k.scale_for(p), np.float32(0))
    workbook.assert_close(y_host, expected, exact=True, name=name)


torch_mask_bytes = None
if torch_x is not None:
    import torch

    torch_mask_bytes = torch.native_dropout(torch_x, p, True)[1].nbytes
forward = chapter.compare(
    "forward",
    {
        "naive xoroshiro, byte mask": lambda: [*k.dropout_naive(x, p, seed, y, byte_mask)],
        "Philox bitmask, 4-byte loads": lambda: [*k.dropout_bitmask(x, p, seed, OFFSET, y, mask, vector=False)],
        "Philox bitmask": lambda: [*k.dropout_bitmask(x, p, seed, OFFSET, y, mask)],
        "Philox seed-only (no mask)": lambda: [k.dropout_seed_only(x, p, seed, OFFSET, y)],
    },
    reference=[None],
    check=check_forward,
    baselines={"torch native_dropout": lambda: torch.native_dropout(torch_x, p, True)},
    check_baselines=False,
    bytes=8.125 * n,
    size=f"n={n:,} float32, p={p}",
)
chapter.bar("forward bitmask: fraction of the copy ceiling, 2^28 fp32",
            forward.fraction("Philox bitmask"), at_least=0.85)
chapter.bar("mask bytes: bitmask / torch's byte mask", mask.nbytes / (torch_mask_bytes or n), at_most=0.125)
chapter.bar("mask bytes kept by the seed-only variant", 0, at_most=0)

# %% [markdown]
# ## Backward: from a byte mask, from the bitmask, or regenerated from (seed, offset)
#
# dx = dy · keep / (1 − p). From a byte mask: 4 + 1 read, 4 written = 9 B per element; from the
# bitmask 8.125 B; seed-only 8 B plus a Philox call per four elements. The byte count allows the
# bitmask about 9 / 8.125 = 1.11× over torch's backward; the bar is 1.05×.

# %%
dy = cuda.to_device(host.standard_normal(rng, n))
dx = cuda.device_array_like(dy)
k.dropout_bitmask(x, p, seed, OFFSET, y, mask)
k.dropout_naive(x, p, seed, y, byte_mask)
dy_sample = device_check.at(dy, sample)
torch_dy = workbook.bench.torch_view(dy)
if torch_dy is not None:
    torch_keep = torch.native_dropout(torch_x, p, True)[1]


def check_backward(out, _, name):
    dx_host = device_check.at(out[0], sample)
    if name.startswith("naive"):
        keep = device_check.at(byte_mask, sample).astype(bool)
    else:
        keep = keep_sample
    expected = np.where(keep, dy_sample * k.scale_for(p), np.float32(0))
    workbook.assert_close(dx_host, expected, exact=True, name=name)


backward = chapter.compare(
    "backward",
    {
        "naive, byte mask": lambda: [k.dropout_backward_bytemask(dy, byte_mask, p, dx)],
        "bitmask, 4-byte loads": lambda: [k.dropout_backward_bitmask(dy, mask, p, dx, vector=False)],
        "bitmask": lambda: [k.dropout_backward_bitmask(dy, mask, p, dx)],
        "seed-only (regenerate)": lambda: [k.dropout_backward_seed_only(dy, p, seed, OFFSET, dx)],
    },
    reference=[None],
    check=check_backward,
    baselines={"torch native_dropout_backward":
               lambda: torch.ops.aten.native_dropout_backward(torch_dy, torch_keep, 1.0 / (1.0 - p))},
    check_baselines=False,
    bytes=8.125 * n,
    size=f"n={n:,} float32, p={p}",
)
chapter.bar("backward from the bitmask: fraction of the copy ceiling, 2^28 fp32",
            backward.fraction("bitmask"), at_least=0.85)

# %% [markdown]
# ## How big a grid?
#
# The grid-stride kernels need only as many threads as the GPU holds at once (8 blocks of 256 per
# SM). Launching more — 32 blocks per SM queues four blocks per resident one — lets the block
# scheduler hand work to whichever SM frees up first, so SMs that run slower than the rest do not
# hold up the end of the kernel. At the far end, `"data"` (the default, `BLOCKS_PER_SM` in
# kernels.py) gives every thread exactly one quad, the way torch's elementwise kernels are launched.
#
# In the stored tables each step to a larger grid is faster, and one quad per thread fastest of
# all, for the forward and the backward: the block scheduler balances the work better than a fixed
# share per thread does. That is why it is the default; the table below says whether your GPU agrees.

# %%
grid_choices = [8, 32, 128, "data"]
grid_forward = chapter.compare(
    "forward grid size",
    {f"bitmask, {b} blocks/SM" if b != "data" else "bitmask, one quad per thread":
     (lambda b=b: [*k.dropout_bitmask(x, p, seed, OFFSET, y, mask, blocks_per_sm=b)]) for b in grid_choices},
    reference=[None],
    check=check_forward,
    bytes=8.125 * n,
    size=f"n={n:,} float32, p={p}",
)
grid_backward = chapter.compare(
    "backward grid size",
    {f"bitmask, {b} blocks/SM" if b != "data" else "bitmask, one quad per thread":
     (lambda b=b: [k.dropout_backward_bitmask(dy, mask, p, dx, blocks_per_sm=b)]) for b in grid_choices},
    reference=[None],
    check=check_backward,
    bytes=8.125 * n,
    size=f"n={n:,} float32, p={p}",
)

# %% [markdown]
# ## Half precision
#
# float16 takes the same kernels: `load4`/`store4` move a quad of halves in one 8-byte access.
# 4.125 bytes per element for the bitmask forward, 5 for torch's.

# %%
x16 = cuda.to_device(host.standard_normal(rng, n, np.float16))
y16 = cuda.device_array_like(x16)
torch_x16 = workbook.bench.torch_view(x16)
x16_sample = x16.copy_to_host()[sample]


def check_forward16(out, _, name):
    keep = keep_sample
    bits = workbook.unpack_bitmask(out[1], n)[sample]
    np.testing.assert_array_equal(bits, keep, err_msg=f"{name}: mask bits")
    expected = np.where(keep, x16_sample.astype(np.float32) * k.scale_for(p), np.float32(0)).astype(np.float16)
    workbook.assert_close(workbook.check.to_host(out[0])[sample], expected, exact=True, name=name)


chapter.compare(
    "forward fp16",
    {"Philox bitmask": lambda: [*k.dropout_bitmask(x16, p, seed, OFFSET, y16, mask)]},
    reference=[None],
    check=check_forward16,
    baselines={"torch native_dropout": lambda: torch.native_dropout(torch_x16, p, True)},
    check_baselines=False,
    bytes=4.125 * n,
    size=f"n={n:,} float16, p={p}",
)

# %% [markdown]
# ## A size sweep
#
# Below ~2^20 elements the launch (~15–20 µs from Python) dominates, and everything sits in the
# 50 MB L2; past it we see HBM. The dashed line is the copy ceiling measured in this run.

# %%
sweep_sizes = [1 << s for s in (range(16, 29, 2) if workbook.ON_GPU else range(6, 11, 2))]
series = {"Philox bitmask": [], "Philox seed-only (no mask)": [], "torch native_dropout": []}
for size in sweep_sizes:
    s_x = cuda.to_device(host.standard_normal(rng, size))
    s_y, s_mask = cuda.device_array_like(s_x), cuda.device_array(-(-size // 32), dtype=np.uint32)
    t_x = workbook.bench.torch_view(s_x)
    result = chapter.compare(
        "forward sweep",
        {
            "Philox bitmask": lambda: [*k.dropout_bitmask(s_x, p, seed, OFFSET, s_y, s_mask)],
            "Philox seed-only (no mask)": lambda: [k.dropout_seed_only(s_x, p, seed, OFFSET, s_y)],
        },
        baselines={"torch native_dropout": lambda: torch.native_dropout(t_x, p, True)},
        bytes=8.125 * size,
        size=f"n={size:,}",
        repeats=20,
        show=False,
    )
    for name in series:
        series[name].append(result.gbps(name))

if workbook.ON_GPU:
    ceiling = workbook.bench.copy_ceiling()["gbps"]
    figure = plots.sweep(sweep_sizes, series, ceiling=ceiling, xlabel="float32 elements",
                         ylabel="GB/s (8.125 B per element)", title="Dropout forward vs size")
    chapter.savefig(figure, "forward_sweep")
else:
    print("simulator: the sweep ran at", sweep_sizes, "- the plot needs a GPU's times.")
    chapter.show_stored_figure("forward_sweep")  # the same plot, measured on the reference GPU

# %% [markdown]
# ## What the numbers mean
#
# - **The naive kernel pays for its generator**: every draw reads and writes a 16-byte state. The
#   states stay in L2, but that traffic and the chain of dependent state updates make it several
#   times slower than the Philox bitmask kernel, and its mask cannot be reproduced by anyone else.
# - **Philox costs instructions, not bytes.** Ten rounds for four elements is ~15 integer
#   instructions per element, issued while the SM waits for memory: the seed-only forward does all of
#   that work, stores no mask, and still runs near the copy ceiling.
# - **The mask costs a little more than its bytes.** The bitmask forward moves 1.6% more bytes than
#   the seed-only one; the shuffles and the mask stores sit between the loads and the stores. torch's
#   `native_dropout` moves 9 bytes per element against our 8.125.
# - **The backward is a race against the copy ceiling.** It moves 8.125 bytes per element against
#   torch's 9, which bounds its gain at 9/8.125 = 1.11x. The grid decides how close it comes: one
#   quad per thread (the default) against 32 blocks per SM looping over the quads.
# - **16-byte accesses**: each lane's four 4-byte loads fall on one 16-byte chunk and the L1 merges
#   them into the same sectors, so the bytes are the same; what one wide load saves is instructions,
#   three in four of the loads and stores the SM has to issue while the memory waits (chapter 00
#   shows the same for a copy).
# - **float16** moves a quad of halves in one 8-byte access (`workbook.memory.load4` on float16),
#   where `native_dropout` reads 16 bytes per access. Two quads per lane (exercise 4 below) is the
#   next step.
# - **Small sizes are host-bound**: below ~2^24 elements the sweep measures the Python launch, not
#   the GPU (chapter 07).
# - **The mask** is n/8 bytes instead of n; the seed-only variant keeps none, and pays for it with a
#   second Philox per quad in the backward, hidden under memory time.
#
# The record of variants measured and dropped is in `EXPERIMENTS.md` beside this notebook. The
# figures these bullets point to:

# %%
_f, _b, _g = "forward", "backward", "backward grid size"
chapter.show_figures({
    "forward: naive, slower than the Philox bitmask by": ("{:.1f}x", lambda: chapter.figure(
        _f, "naive xoroshiro, byte mask") / chapter.figure(_f, "Philox bitmask")),
    "  naive: fraction of the copy ceiling": ("{:.0%}", lambda: chapter.figure(
        _f, "naive xoroshiro, byte mask", "fraction_of_ceiling")),
    "forward, seed-only: fraction of the copy ceiling": ("{:.0%}", lambda: chapter.figure(
        _f, "Philox seed-only (no mask)", "fraction_of_ceiling")),
    "forward: the bitmask's time over the seed-only's": ("+{:.1%}", lambda: chapter.figure(_f, "Philox bitmask")
                                                         / chapter.figure(_f, "Philox seed-only (no mask)") - 1),
    "forward: bitmask time / torch native_dropout's": ("{:.2f}", lambda: 1 / chapter.figure(
        _f, "Philox bitmask", "speedup_vs_baseline")),
    "backward: bitmask vs torch (speed-up)": ("{:.2f}x", lambda: chapter.figure(_b, "bitmask", "speedup_vs_baseline")),
    "backward grid: one quad a thread / 32 blocks per SM (of the ceiling)": ("{}", lambda: "{:.0%} / {:.0%}".format(
        chapter.figure(_g, "bitmask, one quad per thread", "fraction_of_ceiling"),
        chapter.figure(_g, "bitmask, 32 blocks/SM", "fraction_of_ceiling"))),
    "forward: 4-byte loads / 16-byte": ("{}", lambda: "{:.3f} / {:.3f} ms".format(
        chapter.figure(_f, "Philox bitmask, 4-byte loads"), chapter.figure(_f, "Philox bitmask"))),
    "float16 forward": ("{:.3f} ms", lambda: chapter.figure("forward fp16", "Philox bitmask")),
    "  of native_dropout's speed": ("{:.2f}", lambda: chapter.figure("forward fp16", "Philox bitmask",
                                                                     "speedup_vs_baseline")),
    "backward: regenerated / from the mask": ("{}", lambda: "{:.3f} / {:.3f} ms".format(
        chapter.figure(_b, "seed-only (regenerate)"), chapter.figure(_b, "bitmask"))),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch02.N` and `# <<< ch02.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch02`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch02.1")

# %%
exercises.show("ch02.2")

# %%
exercises.show("ch02.3")

# %%
exercises.show("ch02.4")

# %% [markdown]
# ## More to try
# 1. Set `BLOCKS_PER_SM = 8` in kernels.py (a grid that just fills the GPU, each thread looping)
#    and re-run the chapter on a GPU. Do both bars move as the grid-size tables predict? Why might
#    a fixed share per thread lose on a GPU with 132 SMs?
# 2. Replace the shuffle-OR by four `ballot_sync` calls and a bit interleave. Check it against
#    `keep_reference`, then time it. Which is shorter in instructions?
# 3. Philox with 7 rounds still passes BigCrush. How much faster is the seed-only backward?
#    (Your masks will no longer match the Random123 vectors: change the reference too.)
# 4. float16 quads move 8 bytes per access. Give each lane two quads of halves (16 bytes, with
#    `workbook.memory.load16`) and measure the float16 forward again.
# 5. Break the tail on purpose (drop `and first + 1 < n`) and read what `assert_bitmask` says
#    about the padding bits.
#
# ## References
# - J. K. Salmon, M. A. Moraes, R. O. Dror, D. E. Shaw, "Parallel Random Numbers: As Easy as
#   1, 2, 3", SC'11 (Philox; the Random123 library and its known-answer vectors).
# - onnxruntime, `BitmaskDropout` contrib op; PyTorch `native_dropout`; Triton tutorial 04,
#   "Low-Memory Dropout".
# - NVIDIA, *CUDA C++ Programming Guide*, "Warp Shuffle Functions" and "Warp Vote Functions".
