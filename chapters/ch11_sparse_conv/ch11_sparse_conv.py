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
# # Chapter 11 — Sparse 3-D convolution: rulebooks, gather-GEMM-scatter and the implicit GEMM
#
# A LiDAR scan fills a few percent of its voxel grid: the ground, walls, the sides of cars. A
# sparse convolution computes only at the active voxels, and first has to find, for each output
# site and each of the 27 taps of a 3x3x3 filter, the active input site under that tap. Then
#
#     out[o] = sum over taps k of x[neighbour of o under k] @ w[k]        (C -> K channels)
#
# In this chapter you will learn
# - how a GPU finds neighbours: a hash table of coordinates, filled with atomic compare-and-swap,
#   and what its load factor does to the probes;
# - the two maps a sparse convolution is run from: the rulebook (per tap, the (input, output)
#   pairs: spconv 1.x) and the pair table (per output, its 27 neighbours: spconv 2.x), built once
#   and shown apart, since a network reuses them across layers;
# - naive: gather each tap's input rows, a GEMM per tap (chapter 04's), scatter-add into the output;
# - optimized: one implicit GEMM over the output rows, the gather fused into its tile loads from
#   the pair table, each output row written once (output-stationary), rows grouped by their tap
#   masks so that a block skips the taps none of its rows has; then the same on FP16 tensor cores;
# - why the maps' build is mostly launches and allocations, and how one cooperative launch over
#   buffers kept from the last build removes them;
# - how all of it compares with spconv 2.x, the library these notes come from, on the same layer.
#
# Every kernel is checked against two NumPy references (`reference.py`): the definition (the
# features scattered into a dense grid, a dense convolution, read back at the active sites) at
# small sizes, and a direct sparse one at any size.

# %%
# %load_ext autoreload
# %autoreload 2
import functools
import time

import numpy as np

import workbook
from workbook import bench, capability, cuda, host

from chapters.ch11_sparse_conv import grouping, implicit, maps, measuring, naive, onelaunch, scan, spconv_baseline, tensor
from chapters.ch11_sparse_conv import reference as ref

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch11", "Sparse 3-D convolution: rulebooks, gather-GEMM-scatter, implicit GEMM")
torch = bench.optional_torch()
if torch is not None:  # float32 means float32 for torch's GEMMs too
    torch.backends.cuda.matmul.allow_tf32 = False
spconv, spconv_missing = spconv_baseline.load()  # spconv 2.x, where it is installed (see "spconv 2.x" below)

CHANNELS = workbook.size(gpu=64, sim=16)  # the tensor-core kernel takes a multiple of 8
OUT_CHANNELS = workbook.size(gpu=64, sim=12)

# %% [markdown]
# ## The data: a LiDAR-like scan, voxelised
#
# `scan.lidar_scan` casts a sensor's rays (beams x azimuths) at a ground plane, two walls and
# boxes standing on the ground; `scan.voxelize` keeps the 0.1 m voxels the points fall in, each
# once. The features are random here: the convolution's cost depends on where the sites are, not
# on what they hold.

# %%
started = time.perf_counter()
points = scan.lidar_scan(workbook.size(gpu=256, sim=3), workbook.size(gpu=4096, sim=48))
coords = scan.voxelize(points)
extent = coords.max(axis=0) + 1
N = len(coords)
x = ref.features(N, CHANNELS)
w = ref.weights(CHANNELS, OUT_CHANNELS)
print(f"{len(points)} points -> {N} active voxels in a {extent[0]} x {extent[1]} x {extent[2]} grid "
      f"({N / np.prod(extent):.2%} of it); made in {time.perf_counter() - started:.1f} s on the host")

# %% [markdown]
# ## The NumPy references
#
# The definition: scatter the features into a dense grid, convolve, read back at the active sites
# (small grids only). The direct reference: each tap's neighbours found by key, any size.

# %%
workbook.show(ref.submanifold_dense)
workbook.show(ref.submanifold_direct)

# %% [markdown]
# ## The hash table and the maps
#
# `SiteTable` inserts every site's key (x << 42 | y << 21 | z) into a table of twice as many slots
# as sites: a thread hashes its key to a slot and claims it with `cuda.atomic.cas` (EMPTY -> key);
# a thread that finds the slot taken tries the next. A lookup walks the same slots until it finds
# the key or an empty one, so the probes a key needs are the table's cost.

# %%
workbook.show(maps.insert_kernel)
workbook.show(maps.lookup)

# %% [markdown]
# The pair table is one lookup per (site, tap); the rulebook compacts it tap by tap with an atomic
# counter a tap. The same pairs, kept two ways (a row a site, a column a tap; -1: no neighbour):
#
#     pair table (sites x 27 taps)              rulebook (per tap, its (input, output) pairs)
#     site   tap 0   tap 1  ...  tap 13 ...       tap 0:  (4, 0) (9, 2)
#       0      4      -1          0               tap 1:  (7, 1)
#       1     -1       7          1               ...
#       2      9      -1          2               tap 13: (0, 0) (1, 1) (2, 2) ...  (the centre: every site)
#
# Output-stationary kernels read the table by rows: each output row gathers its neighbours and is
# written once. Gather-GEMM-scatter reads the rulebook by taps: one GEMM per tap over its pairs,
# each output row added to by every tap that reaches it.

# %%
workbook.show(maps.pairs_kernel)
workbook.show(maps.rulebook_kernel)

# %%
d_coords = cuda.to_device(coords)
table = maps.SiteTable(d_coords)
pairs = table.pairs()
rules = maps.rulebook(pairs)
probes = table.probes.copy_to_host()
neighbours = pairs.neighbours.copy_to_host()
expected_neighbours = ref.neighbours(coords)
if not np.array_equal(neighbours, expected_neighbours):
    bad = np.argwhere(neighbours != expected_neighbours)[0]
    raise AssertionError(f"pair table wrong at site {bad[0]}, tap {bad[1]}: {neighbours[tuple(bad)]}, "
                         f"expected {expected_neighbours[tuple(bad)]}")
pair_count = int(rules.counts.sum())
map_facts = {"sites": N, "slots": int(table.keys.size), "load factor": N / table.keys.size,
             "mean probes": float(probes.mean()), "largest probe count": int(probes.max()),
             "pairs": pair_count, "mean neighbours a site": pair_count / N,
             "pairs per tap": [int(c) for c in rules.counts]}
chapter.record("maps", map_facts)
print(f"hash table: {N} keys in {table.keys.size} slots (load {N / table.keys.size:.2f}): "
      f"{probes.mean():.2f} probes an insert on average, {probes.max()} at most")
print(f"pair table correct; {pair_count} pairs, {pair_count / N:.1f} neighbours a site (of 27)")

# %% [markdown]
# ## Naive: gather, GEMM, scatter, tap by tap (spconv 1.x)

# %%
workbook.show(naive.GatherGemmScatter.__call__)
workbook.show(naive.gather_kernel)
workbook.show(naive.scatter_add_kernel)

# %% [markdown]
# ## Optimized: one implicit GEMM over the output rows (spconv 2.x)
#
# Row i of the GEMM's A is site i's 27 neighbours' features side by side; it is never written. A
# block loads its A tile through the pair table, skips the taps its rows lack, and writes each
# output row once. Grouping the rows by their tap masks (once, with the maps) puts rows with the
# same taps in the same block: a counting sort on the GPU, on the masks' top bits.
#
# Inside, it is chapter 04's tiled GEMM with its lessons kept: a block of 64 rows by 64 output
# channels, 16 input channels a step; the next step's tiles are loaded into registers while this
# step's are multiplied; a thread's 8 x 4 sums are quads of adjacent rows and adjacent channels, so
# that each channel of a step is three 16-byte shared loads (`shared_load4`) for 32 multiply-adds;
# and the gathered rows arrive 16 bytes at a time (`load4`) when the channels are a multiple of 4.

# %%
workbook.show(implicit.implicit_kernel)
workbook.show(grouping.block_scan)

# %%
gathered = naive.GatherGemmScatter(rules, CHANNELS, OUT_CHANNELS)
fused = implicit.ImplicitGemm(pairs)
unsorted = implicit.ImplicitGemm(pairs, group=False)
print(f"taps a block of {implicit.BM} rows runs: {fused.taps_per_tile():.1f} of 27 with the rows grouped by mask, "
      f"{unsorted.taps_per_tile():.1f} in scan order")
chapter.record("taps a block runs", {"grouped by mask": fused.taps_per_tile(), "scan order": unsorted.taps_per_tile()})

# %% [markdown]
# ## Checked, then timed
#
# Both variants against the direct reference (float64) on the scan, and against the dense
# definition on the small cases. Then timed with CUDA events, the maps built beforehand and
# excluded; beside them, the same gather-GEMM-scatter written with torch (`index_select`, `mm`,
# `index_add_`) on the same rulebook.

# %%
rtol, atol = ref.tolerance(CHANNELS)
# the scan's direct reference, in a thread of its own while the GPU works (NumPy lets go of Python's
# lock): the comparison below waits for it, the check of the maps built in one launch reuses it
direct = host.in_background(ref.submanifold_direct, coords, x, w)

check_tiny = functools.partial(measuring.check_tiny, w=w, out_channels=OUT_CHANNELS, tolerance=(rtol, atol))
d_x, d_w = cuda.to_device(x), cuda.to_device(w)
out_naive, out_fused = (cuda.device_array((N, OUT_CHANNELS), np.float32) for _ in range(2))
variants = {"gather-GEMM-scatter: a GEMM a tap": lambda: gathered(d_x, d_w, out_naive),
            "implicit GEMM: gather fused, rows by mask": lambda: fused(d_x, d_w, out_fused),
            "implicit GEMM, rows in scan order": lambda: unsorted(d_x, d_w, out_fused)}
# a GPU compiles the layers' kernels side by side first (a layer's call is a chain of launches, each
# compiling its kernel when it comes to it): the tiny checks, the variants, and the GEMM that
# gather-GEMM-scatter runs tap by tap (chapter 04's) on its own buffers
workbook.warm_up([*(lambda case=case: check_tiny(*case) for case in scan.TINY.items()), *variants.values(),
                  lambda: naive.gemm(gathered.gathered, d_w[0], gathered.products, splits=1)])
for case in scan.TINY.items():
    check_tiny(*case)
print("both variants equal the dense definition on:", ", ".join(scan.TINY))

baselines, t_x = {}, bench.torch_view(d_x)
if torch is not None:
    baselines["torch: index_select, mm, index_add_"] = measuring.torch_rulebook_conv(torch, rules, d_x, d_w,
                                                                                    OUT_CHANNELS)
SPCONV = "spconv 2.x: SubMConv3d (its implicit GEMM)"
if spconv is not None:
    spconv_layer = spconv_baseline.SpconvLayer(spconv, coords, w)
    baselines[SPCONV] = lambda: spconv_layer(t_x)
comparison = chapter.compare(
    "submanifold 3x3x3 convolution", variants, baselines=baselines, flops=2.0 * pair_count * CHANNELS * OUT_CHANNELS,
    reference=lambda: direct.result().astype(np.float32),
    check=lambda out, want, name: workbook.assert_close(out, want, rtol=rtol, atol=atol, name=name),
    size=f"N={N} C={CHANNELS} K={OUT_CHANNELS} pairs={pair_count}")
if workbook.ON_GPU:
    chapter.bar(f"submanifold 3x3x3, {N} voxels, C=K={CHANNELS}: implicit vs gather-GEMM-scatter (speed-up)",
                comparison.ratio("gather-GEMM-scatter: a GEMM a tap", "implicit GEMM: gather fused, rows by mask"),
                at_least=2)
    chapter.bar(f"submanifold 3x3x3, {N} voxels, C=K={CHANNELS}: implicit vs spconv 2.x (fraction of its speed)",
                comparison.ratio(SPCONV, "implicit GEMM: gather fused, rows by mask") if spconv else float("nan"),
                at_least=0.7)

# %% [markdown]
# ## What the memory sees, without a GPU
#
# The simulator's memory trace (`workbook.memtrace`, chapter 00) counts each warp's requests to
# global memory and the 32-byte sectors they touch, as Nsight Compute does, and the passes of the
# shared-memory requests. On the small scan a laptop runs, the **stores** tell the two apart:
# gather-GEMM-scatter writes every tap's gathered rows and products, and adds into the output tap
# by tap; the implicit GEMM writes each output row once. Its **loads** are not fewer here: each
# block reads the weights of every tap its rows have, and with the simulator's tile (8 output
# channels a block) it reads each gathered row once per block of channels. On the GPU one block
# holds all 64 output channels, and those re-reads come mostly from L1 and L2, where
# gather-GEMM-scatter's intermediates, 4 x 64 x 4 bytes a pair, go out to memory and come back.

# %%

if workbook.ON_GPU:
    print("(the memory trace runs in the simulator: WORKBOOK_DEVICE=sim; on a GPU, Nsight Compute counts the same)")
else:
    traced = {"gather-GEMM-scatter": measuring.traffic(gathered, d_x, d_w, out_naive),
              "implicit GEMM": measuring.traffic(fused, d_x, d_w, out_fused)}
    for name, counted in traced.items():
        print(f"{name:20s} stores {counted['stores'] / 1024:6.1f} KB, loads {counted['loads'] / 1024:6.1f} KB, "
              f"{counted['shared passes']} shared-memory passes")
    print(f"(N = {N} sites, {pair_count} pairs, C = {CHANNELS}, K = {OUT_CHANNELS}; the output alone is "
          f"{4 * N * OUT_CHANNELS / 1024:.1f} KB)")

# %% [markdown]
# ## On tensor cores: FP16 features and weights
#
# The same implicit GEMM with chapter 09's `mma.sync.m16n8k16` (`tensor.py`), fed as chapter 09's
# pipelined GEMM feeds it: a step is one tap and 64 channels; cp.async copies the step's A tile
# (the block's 64 source rows, gathered through the pair table: a missing neighbour's copy reads 0
# bytes and zero-fills) and the tap's weights (stored transposed, a row per output channel) into
# shared memory, the next two steps' while this one is multiplied; the warps read their fragments
# with ldmatrix from a swizzled layout, and each owns 16 output rows by all the output channels. The
# loop is chapter 09's `make_mainloop`: this chapter passes only its copies (`tensor.issue`, which
# carries the step's tap and channels to the next copy), its fragments and its multiply. The
# features and weights are rounded to FP16 once, before the layer; the sums stay FP32, and the check
# is against the reference of the rounded values. Beside it, torch's gather-GEMM-scatter in FP16 (its products
# in FP16, summed in float32).

# %%
workbook.show(tensor.make_tensor_kernel)

# %%
on_tensor_cores = tensor.TensorImplicitGemm(pairs)
out_tc = cuda.device_array((N, OUT_CHANNELS), np.float32)
has_tensor_cores = capability.check(*tensor.NEEDS, what="the tensor-core convolution",
                                    instead="its comparison is left out")
if has_tensor_cores:
    # the reference of the rounded values in a thread of its own, while a GPU compiles the weights'
    # transpose and the layer's kernel side by side (the layer on stand-ins of its operands' types)
    fp16_reference = host.in_background(ref.submanifold_direct, coords, x.astype(np.float16), w.astype(np.float16))
    x16_like = cuda.device_array(x.shape, np.float16)
    wt16_like = cuda.device_array((ref.TAPS, OUT_CHANNELS, CHANNELS), np.float16)
    workbook.warm_up([lambda: tensor.to_half(x, w), lambda: on_tensor_cores(x16_like, wt16_like, out_tc)])
x16, wt16 = tensor.to_half(x, w)
baselines_fp16 = {}
if torch is not None:
    baselines_fp16["torch FP16: index_select, mm, index_add_"] = measuring.torch_rulebook_conv(
        torch, rules, d_x, d_w, OUT_CHANNELS, half=True)
if spconv is not None:
    spconv_fp16 = spconv_baseline.SpconvLayer(spconv, coords, w, torch.float16)
    t_x16 = t_x.half()
    baselines_fp16["spconv 2.x FP16: SubMConv3d"] = lambda: spconv_fp16(t_x16)


def check_fp16(out, want, name):
    """Ours against the rounded values' reference at float32's tolerance; torch's FP16 products are
    rounded to FP16 before they are summed: 2^-8; spconv's outputs are FP16 and its sums not all
    float32 (on Hopper its error passes 2^-8): 2^-6."""
    r, a = (2.0 ** -8, 2.0 ** -8) if "torch" in name else (rtol, atol)
    if "spconv" in name:
        out, r, a = out.float(), 2.0 ** -6, 2.0 ** -6
    workbook.assert_close(out, want, rtol=r, atol=a, name=name)


if has_tensor_cores:
    chapter.compare(
        "submanifold 3x3x3 convolution, FP16 on tensor cores",
        {"tensor cores: implicit GEMM, mma.sync": lambda: on_tensor_cores(x16, wt16, out_tc)},
        baselines=baselines_fp16, flops=2.0 * pair_count * CHANNELS * OUT_CHANNELS, check=check_fp16,
        reference=lambda: fp16_reference.result().astype(np.float32),
        size=f"N={N} C={CHANNELS} K={OUT_CHANNELS} pairs={pair_count}")

# %% [markdown]
# ## A strided convolution: new output sites
#
# With stride 2 the output sites are new: output p sees the inputs 2p - 1 .. 2p + 1 on each axis,
# so an input feeds up to 8 outputs. `SiteTable.strided` inserts every input's candidates into a
# second hash table, and the thread whose compare-and-swap claims a key numbers it (an atomic
# counter): the output sites come out in no fixed order, and the checks compare them as a set.
# Then the same pair-table kernel, looking up 2p + offset, and the same two convolutions.

# %%
workbook.show(maps.strided_outputs_kernel)

# %%
out_coords, strided_pairs = table.strided()
strided_coords = out_coords.copy_to_host()
if sorted(ref.key(strided_coords)) != sorted(ref.key(ref.strided_outputs(coords))):
    raise AssertionError("the strided convolution's output sites differ from the definition's")
strided_rules = maps.rulebook(strided_pairs)
M, strided_count = len(strided_coords), int(strided_rules.counts.sum())
chapter.record("strided maps", {"input sites": N, "output sites": M, "pairs": strided_count})
print(f"stride 2: {N} input sites -> {M} output sites, {strided_count} pairs")
strided_layers = {"gather-GEMM-scatter: a GEMM a tap": naive.GatherGemmScatter(strided_rules, CHANNELS, OUT_CHANNELS),
                  "implicit GEMM: gather fused, rows by mask": implicit.ImplicitGemm(strided_pairs)}
strided_out = cuda.device_array((M, OUT_CHANNELS), np.float32)
chapter.compare(
    "strided 3x3x3 convolution, stride 2",
    {name: (lambda layer=layer: layer(d_x, d_w, strided_out)) for name, layer in strided_layers.items()},
    flops=2.0 * strided_count * CHANNELS * OUT_CHANNELS,
    reference=lambda: ref.submanifold_direct(coords, x, w, strided_coords, 2).astype(np.float32),
    check=lambda out, want, name: workbook.assert_close(out, want, rtol=rtol, atol=atol, name=name),
    size=f"N={N} M={M} C={CHANNELS} K={OUT_CHANNELS} pairs={strided_count}")

# %% [markdown]
# ## The maps' cost, apart
#
# A network builds its maps once per active set and runs many layers on them. Timed here, the
# whole build for each variant, with its waits for the GPU (the rulebook's ends by copying its tap
# lengths to the host: the GEMMs' sizes). Built as above, the implicit GEMM's maps take six
# launches, ten allocations and copies from the host (the empty hash table, eight bytes a slot, and
# zeroed counters): on the GPU that is mostly host time, not work. `onelaunch.MapBuilder` builds the implicit GEMM's maps in **one cooperative launch**, the
# same device functions as phases between grid-wide barriers, into buffers it allocated once.

# %%
workbook.show(onelaunch.maps_kernel)

# %%
builder = onelaunch.MapBuilder(N, implicit.BM)
built_pairs, built_order, built_tiles = builder.build(d_coords)
if not np.array_equal(built_pairs.neighbours.copy_to_host(), neighbours):
    raise AssertionError("the maps built in one launch differ from the separate kernels'")
one_launch = implicit.ImplicitGemm(built_pairs, grouped=(built_order, built_tiles))
workbook.assert_close(one_launch(d_x, d_w, out_fused), direct.result().astype(np.float32),
                      rtol=rtol, atol=atol, name="implicit GEMM on the maps built in one launch")
print(f"maps in one launch: {builder.blocks} blocks of {onelaunch.THREADS} threads; the same pair table, "
      "and the implicit GEMM on them equals the reference")
ONE_LAUNCH = "the same in one launch, buffers reused (implicit GEMM)"
maps_variants = {"hash + pair table + rulebook (gather-GEMM-scatter)":
                 lambda: maps.rulebook(maps.SiteTable(d_coords).pairs()).rule_in,
                 "hash + pair table + rows grouped by mask (implicit GEMM)":
                 lambda: implicit.ImplicitGemm(maps.SiteTable(d_coords).pairs()).order,
                 ONE_LAUNCH: lambda: builder.build(d_coords)[1]}
SPCONV_MAPS = "spconv 2.x: hash + pair table + masks sorted"
maps_baselines = {SPCONV_MAPS: spconv_layer.build_maps} if spconv is not None else {}
maps_comparison = chapter.compare("maps for one active set", maps_variants, baselines=maps_baselines, size=f"N={N}",
                                  poison_outputs=False)
if workbook.ON_GPU:
    chapter.bar(f"maps for {N} voxels: ours in one launch vs spconv 2.x (fraction of its speed)",
                maps_comparison.ratio(SPCONV_MAPS, ONE_LAUNCH)
                if spconv else float("nan"), at_least=0.7)

# %% [markdown]
# ## spconv 2.x
#
# spconv is the library these notes come from. Where it is installed it stands beside ours in the
# tables above (`spconv_baseline.py`): its `SubMConv3d` in inference mode, which is its own implicit
# GEMM over a pair table with masks (float32 without TF32, its default; FP16 with float32 sums),
# and its map build (`get_indice_pairs_implicit_gemm`), on the same sites, features and weights.
# It is not a dependency of the workbook: install the spconv 2.x wheel that matches your CUDA
# (`pip install spconv-cu126`, say) to see it here; without it the cell below says why, and the
# chapter goes on with torch's baseline alone.

# %%
print("spconv 2.x: " + ("in the tables above" if spconv is not None else spconv_missing))

# %% [markdown]
# ## What the numbers mean
#
# - **The scan is sparse, and its voxels are surfaces**: a site has a minority of the 27 neighbours a tap
#   could reach. A dense 3x3x3 convolution would multiply 27 taps at every voxel of the grid; the
#   sparse one multiplies the pairs the table lists.
# - **The hash table** is sized at a low load, so an insert takes about one probe and a lookup is
#   one or two reads of L2.
# - **Gather-GEMM-scatter** is three launches a tap, and the pairs' features pass through global
#   memory three more times than the arithmetic needs.
# - **The implicit GEMM** is one launch: the gather inside the tile loads, each output row written
#   once. Grouped by their tap masks, a block's rows share their taps, so a block runs few of the 27
#   where rows in scan order make it run most of them.
# - **On tensor cores** the same implicit GEMM multiplies FP16 features and weights with FP32 sums.
# - **The maps** are built once per active set, and every submanifold layer of a network runs on
#   them. Built kernel by kernel, most of their time is launches, allocations and the copy that
#   empties the table; in one cooperative launch into buffers kept from the last build, what is
#   left is the work.
#
# The figures these bullets point to (spconv 2.x's where it was installed):

# %%
CASE, FP16, MAPS = ("submanifold 3x3x3 convolution", "submanifold 3x3x3 convolution, FP16 on tensor cores",
                    "maps for one active set")
NAIVE, FUSED = "gather-GEMM-scatter: a GEMM a tap", "implicit GEMM: gather fused, rows by mask"
chapter.show_figures({
    "active sites; pairs multiplied": ("{}; {}", ("maps", "sites"), ("maps", "pairs")),
    "neighbours a site, on average (of 27)": ("{:.1f}", ("maps", "mean neighbours a site")),
    "hash table: load, mean probes, most probes": ("{:.2f}, {:.2f}, {}", *(
        ("maps", key) for key in ("load factor", "mean probes", "largest probe count"))),
    "gather-GEMM-scatter / the same in torch": ("{:.2f} / {:.2f} ms", (CASE, NAIVE),
                                                (CASE, "torch: index_select, mm, index_add_")),
    "implicit GEMM: rows grouped by mask / in scan order": ("{:.2f} / {:.2f} ms", (CASE, FUSED),
                                                            (CASE, "implicit GEMM, rows in scan order")),
    "  speed-up over gather-GEMM-scatter": ("{:.1f}x", chapter.ratio((CASE, NAIVE), (CASE, FUSED))),
    "taps a block runs: grouped / scan order (of 27)": ("{:.1f} / {:.1f}", ("taps a block runs", "grouped by mask"),
                                                        ("taps a block runs", "scan order")),
    "spconv 2.x, float32; ours as a fraction of its speed": ("{:.2f} ms; {:.2f}", (CASE, SPCONV),
                                                             chapter.ratio((CASE, SPCONV), (CASE, FUSED))),
    "FP16 on tensor cores / torch's gather-GEMM-scatter / spconv 2.x": ("{:.3f} / {:.2f} / {:.3f} ms", *(
        (FP16, v) for v in ("tensor cores: implicit GEMM, mma.sync", "torch FP16: index_select, mm, index_add_",
                            "spconv 2.x FP16: SubMConv3d"))),
    "maps kernel by kernel: rulebook / rows grouped by mask": ("{:.1f} / {:.1f} ms", *(
        (MAPS, v) for v in ("hash + pair table + rulebook (gather-GEMM-scatter)",
                            "hash + pair table + rows grouped by mask (implicit GEMM)"))),
    "maps in one launch / spconv 2.x's map build": ("{:.2f} / {:.2f} ms", (MAPS, ONE_LAUNCH), (MAPS, SPCONV_MAPS)),
})

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds three exercises, each a stub with its spec. Each cell
# below shows one and runs its check: *not attempted*, *wrong* (with what is wrong) or *correct*.
# Edit `exercises.py` between `# >>> ch11.N` and `# <<< ch11.N`, save, and re-run the cell.
# `python -m pytest --exercises -k ch11` checks them all at once.

# %%
from workbook import exercises  # noqa: E402

exercises.show("ch11.1")

# %%
exercises.show("ch11.2")

# %% [markdown]
# ch11.3 scatters every tap's products in one launch. Within a tap no output row repeats, across
# taps they do: find the lost update (the simulator's sanitizer names both threads) and make the
# adds safe.

# %%
exercises.show("ch11.3")

# %% [markdown]
# ## More to try
# 1. A strided layer's output sites in key order (a sort of the claimed keys), so that a network's
#    layers see them in the same order on every run.
# 2. The tensor-core kernel with 128 rows a block (8 warps): half the weight copies per row, a few
#    more taps per block. Or the weights of all 27 taps kept in shared memory by a persistent block
#    an SM (27 x 8 KB in FP16).
# 3. Group the rows by all 27 bits of their masks (a second counting-sort pass on the low bits,
#    stable): how many taps does a block then skip?
#
# ## References
# - Yan Yan, Yuxing Mao and Bo Li, *SECOND: Sparsely Embedded Convolutional Detection*, Sensors 2018
#   (the rulebook and gather-GEMM-scatter).
# - spconv 2.x's algorithm notes (`docs/spconv2_algo.pdf`): the implicit GEMM over a pair table
#   with masks.
# - Ben Graham and Laurens van der Maaten, *Submanifold Sparse Convolutional Networks*, 2017.

# %%
chapter.save()
