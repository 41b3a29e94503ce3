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
# # Chapter 05 — Directive-style vs explicit kernels: data movement and copy/compute overlap
#
# The OpenACC lesson of *Learn CUDA Programming* (chapter 9), told in numba. OpenACC lets the
# compiler write the kernel and move the data; numba has the same ladder:
#
# | OpenACC | numba | who moves the data |
# | --- | --- | --- |
# | `#pragma acc parallel loop` on host arrays | `@vectorize(target="cuda")` called on NumPy arrays | numba, at every call |
# | a hand-written kernel, implicit `copy(...)` | `@cuda.jit` launched on NumPy arrays | numba, every argument in **and out** |
# | `#pragma acc data copyin(a,b) copyout(out)` | `cuda.to_device` once, kernels on device arrays, one `copy_to_host` | you, once |
# | `async(k)` queues + `wait` | `cuda.stream()`, pinned host memory, row blocks | you, overlapped with compute |
# | `collapse(2)`, `tile(32,32)` | a 2-D grid; a shared-memory tile with a halo | — |
#
# In this chapter you will learn
# - what each rung of that ladder costs, on a 64-megapixel image pair: the kernels take
#   microseconds, the **bus** (PCIe between host and GPU) takes milliseconds;
# - why a sequence of operations must keep its data on the device (a *data region*);
# - how to hide the copies behind each other with **streams and pinned memory**, and how to read a
#   timeline of what each stream did, drawn from CUDA event timestamps;
# - how fast the host-to-device and device-to-host copies are, and what bound that sets;
# - a 3x3 blur two ways: one thread per pixel on a 2-D grid, and a shared-memory tile with a halo.
#
# **In the simulator** (no GPU) every kernel runs and is checked on small images, but streams are
# synchronous, events carry no time (the timeline there uses the host clock and shows everything in
# series), pinned memory is ordinary memory, and `@vectorize(target="cuda")` cannot be built: the
# directive variant falls back to the same pixel rule compiled for the CPU, and says so. The
# figures to read are the stored results of the reference GPU shown after each comparison.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import cuda, plots

from chapters.ch05_directives import kernels as k
from chapters.ch05_directives import measuring
from chapters.ch05_directives import pipeline as p

print(f"running on: {workbook.MODE}; directive variant compiled for: {k.DIRECTIVE_TARGET}")
chapter = workbook.Chapter("ch05", "Directive-style vs explicit kernels: data movement and overlap")
rng = np.random.default_rng(0)

# %% [markdown]
# ## The reference
#
# Two 8-bit grayscale images are merged, `out = (a + b + 1) >> 1` (the mean, halves rounded up:
# (3, 4) → 4, (0, 255) → 128), then blurred with a 3x3 box: the mean of the 9 neighbours rounded to
# nearest, `(sum + 4) // 9`, repeating the edge pixel outside the image (so a 1x1 image blurs to
# itself). NumPy says it exactly:

# %%
workbook.show(k.merge_reference)
workbook.show(k.blur_reference)

# %% [markdown]
# ## Rung 1: the directive
#
# The pixel rule is written once as plain Python. `vectorize(target="cuda")` turns it into a
# ufunc: numba writes the kernel (one thread per element), and called on NumPy arrays it copies
# both inputs to the device, allocates the output there, launches, copies the output back and frees
# the device memory — **at every call**. Per pixel: 2 bytes up, 1 byte down.

# %%
workbook.show(k.merge_pixel_py)
print(f'merge_ufunc = vectorize(["uint8(uint8, uint8)"], target={k.DIRECTIVE_TARGET.split()[0]!r})(merge_pixel_py)')

# %% [markdown]
# ## Rung 2: our kernel, numba's transfers
#
# The same rule as a device function inside a `@cuda.jit` kernel (a machine-sized grid striding
# over the flattened image). Launched on NumPy arrays, numba copies every array argument to the
# device before the launch and **every one back** after it: it cannot know that `a` and `b` were
# only read. Per pixel: 3 bytes up, 3 bytes down — worse than the directive.

# %%
workbook.show(k.merge_kernel)

# %% [markdown]
# ## Rung 3: a data region
#
# Copy in once, run as many kernels as the algorithm needs on device arrays, copy out once. Here, a
# sequence of merges `acc <- merge(acc, b)` (each step moves the image halfway towards `b`), and
# merge-then-blur:

# %%
workbook.show(p.merge_sequence_data_region)
workbook.show(p.merge_blur_data_region)

# %% [markdown]
# The blur, `collapse(2)` style: one thread per output pixel on a 2-D grid, `x` across the columns
# so that a warp's 32 lanes read and write 32 consecutive bytes. Each thread loads its 9 neighbours;
# each byte is loaded by 9 threads, mostly from L1.

# %%
workbook.show(k.blur_2d_kernel)

# %% [markdown]
# The blur, `tile` style: a block of 32 x 8 threads stages the 66 x 34 bytes its 64 x 32 outputs
# need (the halo included) in shared memory, once, and each thread slides down a column of 8
# outputs keeping the horizontal sums of the last rows in registers: 3.75 shared loads per output
# instead of 9 loads, and 1.10 global loads per output, all issued before the first shared store.

# %%
workbook.show(k.blur_tile_kernel)

# %% [markdown]
# ## Rung 4: the pipeline
#
# The image is cut into row blocks; block *k* goes to stream *k* mod *S*, and each stream copies
# its block up, merges, blurs and copies it down. While block *k* is copied up, block *k-1* is
# computed and block *k-2* copied down: the copy engines (one per direction) and the SMs work at
# the same time. Each block copies one row of halo above and below, since the blur of its edge
# rows needs them. The host arrays must be **pinned** (page-locked): the driver copies pageable
# memory through a staging buffer with the CPU, and such a copy cannot overlap anything.
#
# Every copy costs the bus a few microseconds on top of its bytes, so the two images live in one
# pinned array (`pinned_pair`): b starts a fixed distance after a, and one 2-D copy (two "rows",
# one from each image, that distance apart) brings a block of both up. `run` queues the work and
# waits; `_issue` is the queueing.

# %%
workbook.show(p.Pipeline.run)
workbook.show(p.Pipeline._issue)

# %% [markdown]
# ## Check first
#
# Every variant against NumPy at the sizes that break image kernels: 1 pixel, a 31-pixel row and
# column, 33 x 32 (one row and column past a warp), 9 x 35 (nothing a multiple of the 32 x 8 block),
# and a large odd image. The pipeline is checked with more blocks than streams (buffers reused) and
# blocks of one row.

# %%
check_shapes = [(1, 1), (1, 31), (31, 1), (33, 32), (9, 35), workbook.size(gpu=(2049, 4097), sim=(27, 45))]
for shape in check_shapes:
    a = rng.integers(0, 256, shape, dtype=np.uint8)
    b = rng.integers(0, 256, shape, dtype=np.uint8)
    merged = k.merge_reference(a, b)
    expected = k.blur_reference(merged)  # k.merge_blur_reference(a, b), its merge done once
    workbook.assert_close(k.merge_directive(a, b), merged, name=f"directive {shape}")
    workbook.assert_close(k.merge_on_host_arrays(a, b, np.empty_like(a)), merged, name=f"host arrays {shape}")
    for variant in ("2d", "tile"):
        workbook.assert_close(p.merge_blur_data_region(a, b, variant), expected, name=f"region {variant} {shape}")
    blocks = min(shape[0], 5)
    out = p.Pipeline(*shape, blocks, 2, "tile").run(*p.pinned_pair(a, b), cuda.pinned_array(shape, np.uint8))
    workbook.assert_close(out, expected, name=f"pipeline {blocks} blocks {shape}")
print("every variant agrees with NumPy at", check_shapes)

# %% [markdown]
# ## The images
#
# On a GPU, two 8192 x 8192 images: 64 Mi pixels, 64 MiB each (at least 64
# megapixels). Merge-then-blur must move 2 bytes per pixel up and 1 down: **192 MiB over the bus**,
# whatever the kernels do.

# %%
height, width = workbook.size(gpu=(8192, 8192), sim=(24, 37))
pixels = height * width
image_a = rng.integers(0, 256, (height, width), dtype=np.uint8)
image_b = rng.integers(0, 256, (height, width), dtype=np.uint8)
pinned_a, pinned_b = p.pinned_pair(image_a, image_b)  # the two planes of one pinned array (Rung 4)
pinned_out = cuda.pinned_array((height, width), np.uint8)
print(f"{height} x {width} = {pixels:,} pixels, {pixels:,} bytes per image")

# %% [markdown]
# ## The bus: host ↔ device bandwidth
#
# One image (64 MiB) copied up and down, from pageable memory (what `np.empty` gives) and from
# pinned memory (`cuda.pinned_array`); and, with pinned memory, one image up and another down *at the
# same time* on two streams: whether the two directions add up is what the pipeline bets on.

# %%
device_image, device_other = cuda.to_device(image_a), cuda.to_device(image_b)
rates = measuring.bus_copies(chapter, device_image, device_other, image_a, pinned_a, pinned_b, pinned_out)

# %% [markdown]
# ## A sequence of 10 merges: directive vs data region
#
# Per step, the directive moves 2 bytes up and 1 down per pixel and allocates device memory for
# three images; our kernel on host arrays moves 3 up and 3 down; the data region moves 2 up and 1
# down **once for the whole sequence**, and each step touches only the GPU's own memory (192 MiB
# at ~3 TB/s: well under a millisecond). Times are end to end, transfers included.

# %%
steps = 10
if not workbook.ON_GPU:
    print(f"simulator: the directive row below runs the CPU fallback ({k.DIRECTIVE_TARGET}), not a CUDA ufunc")
sequence = chapter.compare(
    "10 merges end to end",
    {
        "directive (@vectorize), host arrays": lambda: p.merge_sequence_directive(image_a, image_b, steps),
        "@cuda.jit on host arrays": lambda: p.merge_sequence_on_host_arrays(image_a, image_b, steps),
        "data region": lambda: p.merge_sequence_data_region(image_a, image_b, steps),
    },
    reference=lambda: k.merge_sequence_reference(image_a, image_b, steps),
    repeats=5, size=f"{height}x{width} uint8, {steps} steps",
)
chapter.bar("data region vs directive, 10 merges of a 64 MP image, end to end",
            sequence.ratio("directive (@vectorize), host arrays", "data region"), at_least=5)

# %% [markdown]
# ## The kernels alone: merge, and blur 2-D grid vs shared-memory tile
#
# On device-resident data, so only the kernels are timed. The merge reads 2 bytes and writes 1 per
# pixel; the blur reads ~1 (each byte once from HBM, the other 8 uses from cache or shared memory)
# and writes 1.

# %%
device_merged = cuda.device_array_like(device_image)
device_blurred = cuda.device_array_like(device_image)
torch_a, torch_b = workbook.bench.torch_view(device_image), workbook.bench.torch_view(device_other)


def torch_merge():
    import torch

    return ((torch_a.to(torch.int16) + torch_b.to(torch.int16) + 1) >> 1).to(torch.uint8)


device_image.copy_to_device(image_a)
device_other.copy_to_device(image_b)
chapter.compare(
    "merge on the device",
    {"merge kernel": lambda: k.merge(device_image, device_other, device_merged)},
    reference=lambda: k.merge_reference(image_a, image_b),
    baselines={"torch, int16 arithmetic": torch_merge},
    bytes=3 * pixels, size=f"{height}x{width} uint8",
)
k.merge(device_image, device_other, device_merged)
blur_result = chapter.compare(
    "blur on the device",
    {
        "2-D grid (collapse)": lambda: k.blur(device_merged, device_blurred, "2d"),
        "shared-memory tile": lambda: k.blur(device_merged, device_blurred, "tile"),
    },
    reference=lambda: k.blur_reference(device_merged.copy_to_host()),
    bytes=2 * pixels, size=f"{height}x{width} uint8",
)
chapter.bar("shared-memory blur vs 2-D blur (kernel time, 64 MP)",
            blur_result.ratio("2-D grid (collapse)", "shared-memory tile"), at_least=1.0)

# %% [markdown]
# ## What a call from Python costs
#
# A pipeline block is four or five calls from Python (one or two copies up, two kernels, one copy
# down). Each is asynchronous, but issuing it costs the host some microseconds; if a block's calls
# take longer to issue than the GPU takes to run them, the host sets the pace. Measured here on 1-row blocks, so
# that the GPU work is negligible. numba's `DeviceNDArray.copy_to_device` checks shapes and builds
# array views at every call; the pipeline checks once and calls the driver's copy functions.

# %%
host_costs = p.host_cost_us(width, calls=workbook.size(gpu=200, sim=1))
measuring.record_host_costs(chapter, host_costs, width)

# %% [markdown]
# ## What a copy costs the bus
#
# The copy engine also charges per copy: 128 MiB of pinned memory up in 1 to 256 equal copies,
# back to back on one stream (GPU time). What grows with the count is the per-copy cost; it is
# why the pipeline moves both images of a block in one 2-D copy.

# %%
split_bytes = workbook.size(gpu=128 << 20, sim=1 << 10)
measuring.record_copy_split(chapter, p.split_copy_ms(split_bytes, [1, 16, 64, 128, 256]), split_bytes)

# %% [markdown]
# ## A sweep: how many blocks?
#
# More blocks shorten the pipeline's fill and drain (the first block's copy up and the last one's
# copy down, which overlap nothing), but each block costs the host four calls from Python (one 2-D
# copy up, two launches, one copy down) and the bus three copies' worth of set-up (~2.5 us each,
# above). The launches are prepared once per block (`PreparedLaunch`, chapter 07: ~8 us of host
# each instead of ~40) and the copies go straight to the driver on addresses computed once, so even
# 64 blocks (256 calls) stay ahead of the GPU. The sweep also replays each pipeline as **one CUDA
# graph** (`Pipeline.graph`, chapter 07's `StepGraph` with the four streams forked from and joined
# to the capturing one): the host then pays one launch per run, and what is left at 64 blocks is
# the bus's per-copy cost. Whether 64 blocks stay within 20% of the best count is a bar below (10%
# was a coin flip between runs: `EXPERIMENTS.md`). The sweep picks the block count
# used below (on a GPU; the simulator uses 3).

# %%
sweep_blocks = workbook.size(gpu=[1, 2, 4, 6, 8, 12, 16, 24, 32, 64], sim=[1, 2, 3])
pipeline_streams = 4
expected = k.merge_blur_reference(image_a, image_b)
sweep_ms, graph_ms, sweep_results = measuring.block_sweep(chapter, (pinned_a, pinned_b, pinned_out), expected,
                                                         sweep_blocks, pipeline_streams)
pipeline_blocks = sweep_blocks[int(np.argmin(sweep_ms))] if workbook.ON_GPU else 3
print(f"pipeline used below: {pipeline_blocks} blocks on {pipeline_streams} streams")
if workbook.ON_GPU:
    up_ms, down_ms = 2 * pixels / (rates[0] * 1e9) * 1e3, pixels / (rates[1] * 1e9) * 1e3
    chapter.savefig(measuring.plot_sweep(sweep_blocks, sweep_ms, graph_ms, pipeline_streams, up_ms, down_ms),
                    "blocks_sweep")
    for blocks, ms, graph in zip(sweep_blocks, sweep_ms, graph_ms):
        print(f"{blocks:3d} blocks: {ms:.2f} ms from Python, {graph:.2f} ms as one graph")
    chapter.bar("pipeline at 64 blocks / at its best block count (end to end)",
                measuring.against_best(sweep_blocks, sweep_results, "pipelined", sweep_ms), at_most=1.20)
    chapter.bar("pipeline as one graph at 64 blocks / at its best block count (end to end)",
                measuring.against_best(sweep_blocks, sweep_results, "pipelined, one graph", graph_ms), at_most=1.20)
else:
    print("simulator: the sweep ran and was checked at", sweep_blocks, "blocks; the plot needs a GPU's times.")
    chapter.show_stored_figure("blocks_sweep")  # the same plot, measured on the reference GPU

# %% [markdown]
# ## Merge + blur end to end: serial vs pipelined
#
# - **data region, pageable**: `to_device` twice, two kernels, `copy_to_host`: the plain program;
# - **serial, pinned**: the same steps from pinned memory, one block, one stream: copy up, then
#   compute, then copy down, each waiting for the last;
# - **pipelined**: the sweep's best block count on 4 streams, pinned memory, with either blur.

# %%
serial = p.Pipeline(height, width, 1, 1, "2d")
pipelined = {variant: p.Pipeline(height, width, pipeline_blocks, pipeline_streams, variant)
             for variant in ("2d", "tile")}
pipelined_name = "pipelined"  # the block and stream counts go in the case's size
end_to_end = chapter.compare(
    "merge + blur end to end",
    {
        "data region, pageable": lambda: p.merge_blur_data_region(image_a, image_b),
        "serial, pinned": lambda: serial.run(pinned_a, pinned_b, pinned_out),
        f"{pipelined_name}, 2-D blur": lambda: pipelined["2d"].run(pinned_a, pinned_b, pinned_out),
        f"{pipelined_name}, tiled blur": lambda: pipelined["tile"].run(pinned_a, pinned_b, pinned_out),
    },
    reference=expected,
    repeats=20, size=f"{height}x{width} uint8; pipelined: {pipeline_blocks} blocks, {pipeline_streams} streams",
)
chapter.bar("pipelined vs serial copy-compute-copy, both pinned, 64 MP merge + blur, end to end",
            end_to_end.ratio("serial, pinned", f"{pipelined_name}, 2-D blur"), at_least=1.3)
chapter.bar("pipelined (pinned) vs data region (pageable), 64 MP merge + blur, end to end",
            end_to_end.ratio("data region, pageable", f"{pipelined_name}, 2-D blur"), at_least=1.3)

if workbook.ON_GPU:
    # What the bus allows: serially the copies add up; overlapped, the longer direction is the floor.
    print(f"bus bound, serial:    2 x 64 MiB up at {rates[0]:.1f} GB/s + 64 MiB down at {rates[1]:.1f} GB/s "
          f"= {up_ms:.2f} + {down_ms:.2f} = {up_ms + down_ms:.2f} ms")
    print(f"bus bound, pipelined: max({up_ms:.2f}, {down_ms:.2f}) = {max(up_ms, down_ms):.2f} ms "
          f"(if the two directions overlap fully)")
    for name in ("serial, pinned", f"{pipelined_name}, 2-D blur"):
        print(f"measured {name}: {end_to_end[name].median_ms:.2f} ms")

# %% [markdown]
# ## The timeline
#
# One more run of the serial version, the pipeline, and a pipeline with far more blocks, with a
# CUDA event recorded on its stream before and after every copy and kernel; the spans are drawn
# per stream from the event timestamps. An event completes when its stream reaches it, so a span
# starts when the stream was *ready* for the operation: a copy that waits for the copy engine (busy
# with another stream's copy), or a kernel the host has not issued yet, shows that wait as part of
# its bar. The two events per operation cost the host time of their own, enough to make the
# instrumented pipeline visibly slower than the timed one (compare the panel titles with the table
# above): the timeline shows the order and the overlap of the work; the table has its time.

# %%
timelines = {}
many_blocks = workbook.size(gpu=64, sim=4)
for name, pipeline in (("serial, pinned", serial),
                       (f"pipelined, {pipeline_blocks} blocks, {pipeline_streams} streams", pipelined["2d"]),
                       (f"pipelined, {many_blocks} blocks, {pipeline_streams} streams",
                        p.Pipeline(height, width, many_blocks, pipeline_streams, "2d"))):
    timeline = p.Timeline()
    out = pipeline.run(pinned_a, pinned_b, pinned_out, timeline=timeline)
    workbook.assert_close(out, expected, name=f"timeline run {name}")
    timelines[name] = timeline.intervals()
title = "merge + blur, 8192 x 8192" if workbook.ON_GPU else "simulator: host clock, everything synchronous"
chapter.savefig(p.draw_timelines(timelines, title=title), "timeline")
for name, spans in timelines.items():
    busy = {kind: sum(end - start for _, kind_, start, end in spans if kind_ == kind) for kind in p.COLOURS}
    print(f"{name}: ends at {max(end for *_, end in spans):.3g} ms; summed spans: "
          + ", ".join(f"{kind} {ms:.3g} ms" for kind, ms in busy.items()))

# %% [markdown]
# ## What the numbers mean
#
# - **The bus is the bottleneck, by far.** A merge of two 64 MiB images takes the GPU a fraction of
#   what moving the images over PCIe takes. Every rung of the ladder is a way to cross the bus fewer
#   times, or to cross it while doing something else.
# - **Directive vs data region.** The directive pays the bus (and a device allocation) at every
#   operation; `@cuda.jit` on host arrays pays it twice over, since numba copies every argument back.
#   A data region pays it once per sequence, so ten operations cost about what one does. That is
#   OpenACC's `data` clause, and the first thing to fix in any GPU port.
# - **Pinned vs pageable.** From pageable memory the driver copies through a pinned staging buffer
#   with the CPU, which costs bandwidth and makes every copy synchronous; pinned memory lets the DMA
#   engines read host memory directly and lets a copy run while the GPU computes.
# - **The pipeline's bound.** Serially, the time is at least (bytes up) / (up rate) + (bytes down) /
#   (down rate). With both directions overlapped it tends to the larger of the two, here the 2 bytes
#   per pixel going up, plus the fill and drain of one block. With kernels this short, that caps the
#   gain near (2 + 1) / 2 = 1.5x, less whatever the two directions lose by sharing the link and host
#   memory (the "both ways at once" row says how much).
# - **The host is part of the pipeline.** Each block costs four calls from Python ("What a call
#   costs" above). Few blocks leave a long fill and drain; many blocks add calls for the host and
#   copies for the bus: the sweep's minimum sits where these costs meet, a broad floor a little above
#   the overlapped bus bound. numba's `copy_to_device`/`copy_to_host` cost the host many times what
#   the driver's functions do, enough to make a pipeline slower than the serial version; and each
#   copy has a fixed cost on the bus ("What a copy costs the bus"), which one 2-D copy per block
#   halves. Measure the host, and count the copies.
# - **2-D grid vs tile.** The 2-D blur's 9 loads per pixel mostly hit L1 (each byte is used by 9
#   threads of nearby warps); what it pays is instructions: 9 two-dimensional index computations,
#   clamps and loads per pixel. The tile replaces them by about 1 global and 4 shared loads per pixel,
#   at the price of a barrier and the staging arithmetic. Neither is near the HBM floor (2 bytes per
#   pixel), and both are a small fraction of the end-to-end time: the blur is not where the time goes.
#
# The figures these bullets point to:

# %%
COPIES, CALLS, BUS, E2E, MERGES = ("host-device copies", "host cost per call", "bus cost per copy",
                                   "merge + blur end to end", "10 merges end to end")
chapter.show_figures({
    "merge on the device / 64 MiB up, pinned": ("{:.3f} / {:.2f} ms", ("merge on the device", "merge kernel"),
                                                (COPIES, "up, pinned")),
    "64 MiB up: pageable / pinned; down: pageable / pinned": ("{:.0f} / {:.0f}; {:.0f} / {:.0f} GB/s", *(
        (COPIES, v, "gbps") for v in ("up, pageable", "up, pinned", "down, pageable", "down, pinned"))),
    "both ways at once, pinned": ("{:.0f} GB/s", ("copies both ways at once", "up and down at once, pinned", "gbps")),
    "10 merges: directive / @cuda.jit on host arrays / data region": ("{:.0f} / {:.0f} / {:.1f} ms", *(
        (MERGES, v) for v in ("directive (@vectorize), host arrays", "@cuda.jit on host arrays", "data region"))),
    "host a call: copy_to_device / driver.host_to_device": (
        "{:.0f} / {:.1f} us", lambda: chapter.figure(CALLS, "DeviceNDArray.copy_to_device, 1 row") * 1e3,
        lambda: chapter.figure(CALLS, "driver.host_to_device, 1 row") * 1e3),
    "128 MiB up, pinned: as 1 copy / as 128": ("{:.2f} / {:.2f} ms", (BUS, "1 copies"), (BUS, "128 copies")),
    "blur on the device: 2-D grid / shared-memory tile": ("{:.3f} / {:.3f} ms", *(
        ("blur on the device", v) for v in ("2-D grid (collapse)", "shared-memory tile"))),
    "merge + blur: data region (pageable) / serial (pinned) / pipelined": ("{:.1f} / {:.1f} / {:.1f} ms", *(
        (E2E, v) for v in ("data region, pageable", "serial, pinned", "pipelined, 2-D blur"))),
    "pipeline at 64 blocks / at its best block count": (
        "{:.2f}", "pipeline at 64 blocks / at its best block count (end to end)"),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch05.N` and `# <<< ch05.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch05`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch05.1")

# %%
exercises.show("ch05.2")

# %%
exercises.show("ch05.3")

# %%
exercises.show("ch05.4")

# %% [markdown]
# ## More to try
# 1. Merge four bytes at a time: view the images as `uint32` and use `(a | b) - (((a ^ b) >> 1) & 0x7F7F7F7F)`,
#    which is the byte-wise `(a + b + 1) >> 1` without unpacking. Does the merge kernel get faster? Does
#    anything end to end?
# 2. Interleave a and b as one pinned array of shape `(height, 2, width)`: a block of both is then
#    one contiguous 1-D copy, but the kernels read rows with a stride. Against the 2-D copy of two
#    planes, what changes in the sweep at 64 blocks, and in the kernels' time?
# 3. Run the pipeline with 1, 2, 3 and 8 streams at 16 blocks. Predict from the timeline first.
# 4. Fuse merge and blur into one kernel that reads a and b with the halo. Which figure in this
#    chapter changes, and which cannot?
# 5. Make the directive variant cheaper without leaving `@vectorize`: call it on device arrays
#    (`cuda.to_device`) with `out=` a device array. Which rung of the ladder is that?
#
# ## References
# - B. Sharma, J. Han, *Learn CUDA Programming*, Packt 2019, chapter 9 ("GPU Programming Using OpenACC").
# - OpenACC API 3.3, sections on `data`, `parallel loop`, `collapse`, `tile` and `async`.
# - numba-cuda documentation: "CUDA ufuncs and generalized ufuncs", "Memory management" (pinned
#   memory, streams), "Events".
# - NVIDIA, *CUDA C++ Best Practices Guide*, "Data Transfer Between Host and Device" and
#   "Asynchronous and Overlapping Transfers with Computation".
# - M. Harris, "How to Overlap Data Transfers in CUDA C/C++", NVIDIA Developer Blog, 2012.
