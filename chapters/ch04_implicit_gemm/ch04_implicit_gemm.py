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
# # Chapter 04 — Convolution: explicit im2col + GEMM vs implicit GEMM
#
# In this chapter you will learn
# - how a convolution **is** a matrix product, once every input window is laid out as a column
#   (im2col), and what that unfolded matrix costs: R·S times the input, written and read back;
# - **implicit GEMM**, the method of CUTLASS, cuDNN and spconv: run the same tiled GEMM, but compute
#   each matrix element's address in the input tensor when the tile is loaded, and never build the
#   matrix — with a precomputed offset table so that the inner loop has no division, and predicates
#   that read padding as zeros;
# - what makes a numba GEMM fast: a block tile in shared memory (transposed, padded against bank
#   conflicts), a register tile a thread, double buffering, 16-byte fragment loads and register
#   prefetch — and how far from cuBLAS and cuDNN that gets in FP32 (we count FLOPs).
#
# Without a GPU the notebook runs the same kernels in the simulator on tiny shapes and small tiles;
# each comparison is followed by the reference GPU's stored figures.

# %%
# Reload the chapter's edited modules before each cell runs:
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import cuda, plots

from chapters.ch04_implicit_gemm import kernels as k
from chapters.ch04_implicit_gemm import resnet

print(f"running on: {workbook.MODE}; tiles: " + ", ".join(f"{name} ({tile})" for name, tile in k.TILES.items()))
chapter = workbook.Chapter("ch04", "Convolution: explicit im2col + GEMM vs implicit GEMM")
rng = np.random.default_rng(0)
torch = workbook.bench.optional_torch()
if torch is not None:  # FP32 baselines: no TF32 tensor cores for cuBLAS or cuDNN
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # let cuDNN pick its fastest algorithm, as we pick tiles
device_data = resnet.device_data  # standard_normal float32 on the device, drawn on every core


# %% [markdown]
# ## The mapping: a convolution as a matrix product
#
# A convolution of x (N, C, H, W) with K filters w (K, C, R, S), stride (sh, sw), padding
# (ph, pw), dilation (dh, dw), gives out (N, K, P, Q):
#
# $$\mathrm{out}[n,k,p,q] = \sum_{c,r,s} w[k,c,r,s]\; x[n,\,c,\; p\,s_h - p_h + r\,d_h,\; q\,s_w - p_w + s\,d_w]$$
#
# Name the rows of a matrix by (c, r, s) and its columns by (n, p, q), and this is a GEMM:
#
# ```
#            GEMM depth C*R*S                      columns N*P*Q                    columns N*P*Q
#          +------------------+          +---------------------------+      +---------------------------+
#  K rows  |  w as (K, C*R*S) |    x     |  X[(c,r,s), (n,p,q)]  =   |  =   |  out as (K, N*P*Q)        |
#          +------------------+  C*R*S   |  x[n, c, p*sh-ph+r*dh,    |      |  (stored straight into    |
#                                 rows   |        q*sw-pw+s*dw]      |      |   N, K, P, Q)             |
#                                        |  or 0 where that is off   |      +---------------------------+
#                                        |  the image (padding)      |
#                                        +---------------------------+
# ```
#
# **Explicit** (im2col): a first kernel writes X to memory, then a GEMM multiplies. X holds every
# input element up to R·S times: 9x the input for a 3x3 filter.
#
# **Implicit**: the GEMM's tile loader asks "which x element is X[row, column]?" and loads it
# directly. The address splits into a part that depends only on the column and a part that
# depends only on the row:
#
# ```
#   x offset = [ n*C*H*W + (p*sh - ph)*W + (q*sw - pw) ]  +  [ c*H*W + r*dh*W + s*dw ]
#                column base: a thread owns one column,      row offset: changes every depth step,
#                decodes (n, p, q) ONCE (two divisions)      read from a table built on the host
#   in bounds  <=>  0 <= (p*sh - ph) + r*dh < H   and   0 <= (q*sw - pw) + s*dw < W    (else 0)
# ```
#
# So the inner loop adds and compares: no division (numba turns each integer `//` into a 64-bit
# division, dozens of instructions). As CUTLASS's "optimized" iterator does, each thread works out
# once which taps (r, s) land on the image for its column, a bit mask `on_image` (bit r·S + s), and
# each table row is one 32-bit word, `offset << R·S | 1 << r·S + s`. Loading an element: read the
# row's word (the same for the whole warp), AND it with `on_image`, load `x[base + (word >> R·S)]`
# or take 0 — a shift-and-add (`LEA.HI`) and a multiply-add, where 64-bit words took 13 SASS
# instructions. A 3x3 filter leaves 23 bits of offset (8M elements an image); past that (a 7x7
# filter, a huge image) a row takes two words, tested against a 64-bit mask.
#
# Here is the mapping on a tiny case, one channel, a 4x4 image numbered 0..15, a 3x3 filter,
# padding 1: column (p, q) = (0, 0) of X is the window at the top-left corner, half off the image.

# %%
tiny = k.conv_geometry((1, 1, 4, 4), (1, 1, 3, 3), stride=1, padding=1)
image = np.arange(16, dtype=np.float32).reshape(1, 1, 4, 4) + 1  # 1..16, so that 0 means padding
X = k.im2col_reference(image, tiny)
print(f"X is {X.shape[0]} x {X.shape[1]} (C*R*S x N*P*Q) for a {image.size}-element input:")
print("first 6 columns (windows at p=0, q=0..3 and p=1, q=0..1); 0 = padding:")
print(X[:, :6].astype(int))
print("offset table (row offset, r*dh, s*dw) per row (c, r, s), for im2col:")
print(k.offset_table(tiny))
field = k.tap_field(tiny)  # R*S = 9 bits of taps, 23 of offset
table = k.tap_table(tiny)[: tiny.gemm_depth]
print(f"tap table for implicit GEMM, one word per row (c, r, s): offset << {field} | 1 << r*S + s")
print("offset:", table >> field)
print("bit:   ", table & ((1 << field) - 1))

# %% [markdown]
# ## The NumPy reference
#
# `conv2d_reference` takes every window of the padded input with `sliding_window_view` and sums
# with one `einsum` (in float64). `conv2d_loops` is the definition, one loop per index: slow, but
# independent, so it checks the reference on small shapes.

# %%
x_small = rng.standard_normal((2, 3, 9, 10), dtype=np.float32)
w_small = rng.standard_normal((4, 3, 3, 3), dtype=np.float32)
np.testing.assert_allclose(k.conv2d_reference(x_small, w_small, stride=2, padding=1, dilation=2),
                           k.conv2d_loops(x_small, w_small, stride=2, padding=1, dilation=2), rtol=1e-5, atol=1e-5)
print("sliding_window_view + einsum agrees with the seven loops")

# %% [markdown]
# ## Naive: im2col, then a tiled GEMM
#
# The im2col kernel: one thread per column (coalesced writes along N*P*Q), looping over rows.

# %%
workbook.show(k.im2col_kernel)

# %% [markdown]
# The GEMM is already a good one: the explicit path is "naive" only in that it materialises X. A
# block computes a BM x BN tile of the output, each of its 256 threads an 8x8 register tile (2x4 in
# the simulator), interleaved so that a warp reads 16 consecutive words of B (no bank conflicts)
# and 2 broadcast words of A. The next tile's global loads go into registers before this tile's
# FMAs (double buffering); the epilogue writes column (n, p, q) straight into the NKPQ output.

# %%
workbook.show(k.make_gemm_kernel(k.DEFAULT_TILE))

# %% [markdown]
# Why the padding: `store_a_tile` writes the A tile transposed, `a_s[k, m] = A[m, k]`, and a warp's
# 32 threads write 32/BK consecutive m in each of BK rows k. A row of BM words (a multiple of 32)
# starts in the same bank as every other row, so the BK rows' stores queue in the same 32/BK banks:
# BK passes where one would do. A row of BM + 32/BK words starts 32/BK banks further along, and the
# 32 stores land in 32 banks. The simulator's memory trace (`workbook.memtrace`, chapter 00) counts
# the shared-memory passes of one GEMM launch with and without it (`Tile(..., padded=False)`);
# beside them, Nsight Compute's count for the GPU's 128x128 tile (BK = 8), stored by
# `tools/validate_memtrace.py`, which shows where the compiler joins accesses the trace counts.

# %%
import dataclasses  # noqa: E402

from workbook import memtrace  # noqa: E402

for how, padding_tile in {"padded": k.DEFAULT_TILE, "unpadded": dataclasses.replace(k.DEFAULT_TILE, padded=False)}.items():
    gpu = memtrace.measured(f"ch04 GEMM, 128x128 tile, A tile {how}")
    line = (f"A tile {how:8s} Nsight Compute, 128x128 tile, BK=8: {gpu['shared st bank_conflicts']:.0f} conflicts "
            f"in {gpu['shared st wavefronts']:.0f} passes")
    if not workbook.ON_GPU:  # the simulator's trace: one output tile, two steps of the depth
        depth = 2 * padding_tile.BK
        pa, pb = (cuda.to_device(rng.standard_normal(shape, dtype=np.float32))
                  for shape in ((padding_tile.BM, depth), (depth, padding_tile.BN)))
        with memtrace.trace() as padding_trace:
            k.gemm(pa, pb, cuda.device_array((padding_tile.BM, padding_tile.BN), np.float32), tile=padding_tile, splits=1)
        stores = padding_trace.kernels()["gemm_kernel"]["shared st"]
        line += f" | here, {padding_tile}: {stores.passes} passes, {stores.requests} stores ({stores.conflicts} conflicts)"
    print(line)

# %% [markdown]
# ## Optimized: implicit GEMM
#
# The same kernel with one change: the loader of the B tile, the gather (`gather.py`). Each thread
# decodes its column `(n, p, q)` once per output tile (`column_taps`) and marks which filter taps
# land on the image for it (`on_image`); then for each row it loads, it reads the row's entry from
# the tap table (`load_tap_entries`: the whole warp reads the same row, one broadcast) and loads
# `x[base + offset]` if the tap's bit is set, else 0 (`gather_b_tile`). Indices that cannot be negative are cast to unsigned (`U64`): numba then skips the
# negative-index test it adds to every signed index (5 instructions on 64-bit integers). Two
# placements matter on the GPU (measured at the end of the chapter): each block first copies the
# table into shared memory (up to 12 KB; a larger one is read from global memory), and the next
# step's gathers are issued halfway through this step's FMAs, not right after the barrier.

# %%
gather = k.make_gather(k.DEFAULT_TILE, tap_field=9)  # the packed table of a 3x3 filter
workbook.show(gather.column_taps)
workbook.show(gather.gather_b_tile)
workbook.show(k.make_implicit_kernel(k.DEFAULT_TILE, tap_field=9))

# %% [markdown]
# ## Optimized, step 2: 16-byte fragments (the "wide" tiles)
#
# Per depth row kk, each thread above reads TM + TN = 16 words of shared memory for 64 FMAs, one
# 4-byte `ld.shared.f32` each. A GPU reads 16 bytes per thread in one instruction
# (`ld.shared.v4.f32`, `workbook.memory.shared_load4`, chapter 00), but only 4 *adjacent* words,
# and in the interleaved layout a thread's values are TY (or TX) words apart. The wide tiles
# change the layout: a thread owns 4x4 groups of adjacent outputs (`output_row` with G = 4: rows
# 4·ty..4·ty+3 and 4·ty+64..4·ty+67), so its 8 A values of row kk are two quads, and its 8 B values
# two more: **4 shared loads per 64 FMAs instead of 16**. What rides along:
# - the tiles come from global memory 16 bytes at a time too (`load_b_tile`, `load4`) when every
#   row of A and B is a whole number of 16-byte-aligned quads (`quads_fit`); else the 4-byte loader;
# - the A tile's row pitch stays a multiple of 4 words, so every row of A_s is 16-byte aligned;
# - **prefetch**: row kk+1's fragments are loaded into a second set of registers before row kk's
#   FMAs, so the FMAs never wait for shared memory. The loop is unrolled by two by hand: NVVM
#   leaves a loop of 512 FMAs rolled, and a register array indexed by `kk % 2` must then live in
#   local memory, five times slower (EXPERIMENTS.md). Its last
#   pair is peeled off and its trips counted in 32 bits, so that the loop carries as few
#   instructions as possible besides its FMAs (`multiply_tile`'s docstring counts them).
#
# Same source, one switch: `Tile(..., wide=True, prefetch=True)`; the simulator runs a 16x32 wide
# tile through the same code.

# %%
wide_tile = next(t for t in k.TILES.values() if t.wide)
wide = k.make_tile_math(wide_tile)
workbook.show(wide.output_row)
workbook.show(wide.load_fragments)
workbook.show(wide.multiply_tile)

# %% [markdown]
# The PTX shows the trade: 16-byte shared loads, 16-byte global loads, and no 4-byte fragment load.

# %%
_m = np.zeros((8, 8), np.float32)
workbook.show_ptx(k.make_gemm_kernel(k.Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True, prefetch=True), quads=True),
                  _m, _m, 8, np.zeros((1, 8, 8), np.float32), grep=r"ld\.shared|ld\.global\.v4")

# %% [markdown]
# ## Optimized, step 3: the work shared out, and 16-byte outputs
#
# Three changes that matter most on the small ResNet layers, whose GEMMs have 196 or 98 tiles of
# 128x128: on a GPU of 132 SMs at 2 blocks each, 74% or 37% of one wave, the rest idle throughout.
#
# - **Stream-K.** Every kernel sees its work as one row of tiles x depth steps, and each block takes
#   an equal, consecutive share of it (`block_share`): with one block per place ("stream"), every SM
#   works until the end; a share that ends inside a tile leaves the rest to the next block, and
#   blocks that ran part of a tile add into the zeroed output with atomics. With one block per tile
#   the same kernel is the classic GEMM; with S per tile, split-K. (Osama et al., PPoPP 2023.)
# - **16-byte outputs.** A wide tile's 4 adjacent columns are 4 adjacent positions of one image
#   when P·Q % 4 == 0: `store4` writes them in one instruction, and a partial tile adds them with one
#   `red.global.add.v4.f32` (`workbook.memory.atomic_add4`, Hopper and later): a quarter of the
#   atomics, which were a tenth of the stream-K kernel's time with one atomic per element
#   (EXPERIMENTS.md).
# - **128 threads of 8x16 outputs.** Per depth row a thread reads 8 + 16 words (6 shared loads) for
#   128 FMAs, instead of 4 loads per 64; at 2 blocks of 128 threads per SM each thread may use
#   255 registers, so BK = 16 (half the syncthreads) fits without the spills the 256-thread tile
#   has at 128 registers (`resources` below).

# %%
workbook.show(k.make_schedule(wide_tile).block_share)
workbook.show(k.make_epilogue(wide_tile, quad_outputs=True))

# %% [markdown]
# ## Check first
#
# Awkward shapes (`AWKWARD_CASES`, which the tests and the exercise checks use too): a single pixel,
# 1x1, 3x3, 5x5 with K = 17 (not a multiple of any tile), 7x7 with stride 2, 32 taps, dilation 2,
# mixed strides, padding larger than the filter reaches, a filter as large as the padded input,
# batch 1 and 2, C = K = 33, and a NaN in the input, which must poison exactly the outputs whose
# window covers it.

# %%
def check_case(x_shape, w_shape, stride, padding, dilation, seed, convs=(k.conv2d_explicit, k.conv2d_implicit)):
    case_rng = np.random.default_rng(seed)
    x_host = case_rng.standard_normal(x_shape, dtype=np.float32)
    x_host.reshape(-1)[x_host.size // 2] = np.nan
    w_host = case_rng.standard_normal(w_shape, dtype=np.float32)
    g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
    expected = k.conv2d_reference(x_host, w_host, stride, padding, dilation)
    rtol, atol = k.tolerance(g.gemm_depth)
    for conv in convs:
        out = conv(cuda.to_device(x_host), cuda.to_device(w_host), cuda.device_array(g.out_shape, np.float32),
                   stride=stride, padding=padding, dilation=dilation)
        workbook.assert_close(out, expected, rtol=rtol, atol=atol, name=f"{conv.__name__} {x_shape} {w_shape}")


cases = [(*case[1:], seed) for seed, case in enumerate(k.AWKWARD_CASES)]
# a GPU compiles their kernels side by side, each case's two convolutions apart
workbook.warm_up([lambda case=case, conv=conv: check_case(*case, convs=(conv,))
                  for case in cases for conv in (k.conv2d_explicit, k.conv2d_implicit)])
for case in cases:
    check_case(*case)
print(f"explicit and implicit agree with NumPy on {len(k.AWKWARD_CASES)} shapes, NaN included")

# %% [markdown]
# ## The memory each needs
#
# The ResNet-50 3x3 layers at batch 32 (56x56 with 64 channels, 28x28 with 128, 14x14 with 256) and
# the big layer below. The im2col workspace is 9x the input; implicit GEMM needs none.

# %%
print(f"{'layer (N=32, 3x3, pad 1)':28s} {'input MB':>9s} {'im2col MB':>10s} {'GFLOP':>7s}")
for name, channels, side in resnet.RESNET + [resnet.BIG]:
    g = k.conv_geometry((32, channels, side, side), (channels, channels, 3, 3), 1, 1, 1)
    print(f"{name:28s} {4 * g.N * g.C * g.H * g.W / 1e6:9.1f} {g.workspace_bytes / 1e6:10.1f} {g.flops / 1e9:7.1f}")

# %% [markdown]
# ## The GEMM alone, against cuBLAS
#
# First the GEMM kernel on its own, 4096³ FP32 on a GPU (2·4096³ = 137 GFLOP), every tile
# configuration against `torch.matmul` with TF32 off (cuBLAS FP32, no tensor cores), same run.

# %%
n_gemm = workbook.size(gpu=4096, sim=40)
a, b = device_data((n_gemm, n_gemm), 1), device_data((n_gemm, n_gemm), 2)
c = cuda.device_array((n_gemm, n_gemm), np.float32)
ta, tb, tc = (workbook.bench.torch_view(m) for m in (a, b, c))
rtol, atol = k.tolerance(n_gemm)
gemm_result = chapter.compare(
    "gemm 4096",
    {f"tile {name}": (lambda name=name: k.gemm(a, b, c, tile=name)) for name in k.TILES},
    reference=lambda: k.gemm_reference(a.copy_to_host(), b.copy_to_host()),
    check=lambda out, ref, name: workbook.assert_close(out, ref, rtol=rtol, atol=atol, name=name),
    baselines={"torch.matmul (cuBLAS FP32)": lambda: torch.matmul(ta, tb, out=tc)},
    flops=2 * n_gemm**3,
    size=f"{n_gemm}^3 float32",
)
best_gemm = gemm_result.fastest([f"tile {name}" for name in k.TILES])[len("tile "):]
for name in k.TILES:
    print(name, k.resources(name))
chapter.bar(f"GEMM 4096^3 FP32, best tile ({best_gemm}) vs cuBLAS FP32 (fraction)",
            gemm_result.ratio("torch.matmul (cuBLAS FP32)", f"tile {best_gemm}"), at_least=0.70)

# %% [markdown]
# ## Explicit vs implicit on the ResNet-50 3x3 layers
#
# End to end: the explicit path is im2col + GEMM (workspace allocated once, beforehand, as a
# framework would), the implicit one the single kernel. Both use the same tile, the fastest for
# the implicit kernel on that layer (`fastest_tile`, among the four wide tiles that won some layer
# when all twelve were tried: `SEARCH_TILES`), and the same sharing of the work:
# `split_count` keeps one block per tile where the tiles fill the machine's waves, and takes
# stream-K where they do not (the 28x28 and 14x14 layers). Where another tile makes the explicit
# path faster, it runs with that one too, and the bar counts the faster of its two times: the
# naive path gets its best tile, not ours. cuDNN (`torch.nn.functional.conv2d`, TF32 off) is the
# baseline.

# %%
BATCH = workbook.size(gpu=32, sim=1)
layers = resnet.RESNET if workbook.ON_GPU else resnet.SIMULATED
workbook.warm_up(resnet.warm_ups(BATCH, layers))  # every layer's tile search: its kernels compiled side by side
layer_results = {}
for key, channels, side in layers:
    g, result, buffers = resnet.conv_case(chapter, torch, key, BATCH, channels, side)
    layer_results[key] = (g, result, buffers)
    chapter.bar(f"{key}: implicit vs explicit im2col + GEMM, end to end (speed-up)",
                result.ratio(resnet.fastest_explicit(result), "implicit GEMM"), at_least=resnet.SPEEDUP_BAR[key])
chapter.bar("implicit GEMM workspace (bytes)", 0, at_most=0)  # it allocates nothing: see conv2d_implicit

# %% [markdown]
# What sharing the work buys on the layer with the fewest tiles: the same kernel with one block per
# tile, with 4 per tile (split-K), and with one per place in the machine (stream-K).

# %%
g, _, (x, w, out, workspace, tile, reference, (rtol, atol)) = layer_results[layers[-1][0]]
split_result = chapter.compare(
    "sharing the work on the last layer",
    {f"implicit, {resnet.describe_work(splits)}": (lambda splits=splits: k.conv2d_implicit(
        x, w, out, padding=1, tile=tile, splits=splits))
     for splits in (1, 4, "stream")},
    reference=reference,
    check=lambda o, ref, name: workbook.assert_close(o, ref, rtol=rtol, atol=atol, name=name),
    flops=g.flops,
    size=f"N={g.N} C=K={g.C} {g.H}x{g.W}, tile {tile}",
)

# %% [markdown]
# ## Where the explicit path's time goes
#
# Each layer's two explicit kernels timed apart: im2col is pure data movement (it reads the input and
# writes 9x as much; we count the workspace written plus the input read once), the GEMM is the
# arithmetic, with the same tile and the same sharing of the work as the explicit path above. The
# implicit kernel is that GEMM with a gather in its B loader instead of 16-byte loads, so
# `implicit - GEMM` is what the gather costs, and the speed-up is
# (t_im2col + t_GEMM) / t_implicit: 1.5 needs t_implicit <= (t_im2col + t_GEMM) / 1.5.

# %%
explicit_parts = resnet.explicit_parts(chapter, layer_results, workbook.ON_GPU)

# %% [markdown]
# ## The big layer: N=32, C=K=256, 56x56, 3x3, pad 1
#
# Its GFLOP are in the layer table above. The bar: 10 TFLOP/s; cuDNN FP32 is the yardstick.

# %%
big_key, big_channels, big_side = resnet.BIG if workbook.ON_GPU else resnet.SIMULATED_BIG
g_big, big_result, _ = resnet.conv_case(chapter, torch, big_key, BATCH, big_channels, big_side)
chapter.bar("N=32 C=K=256 56x56 3x3: implicit GEMM TFLOP/s",
            big_result["implicit GEMM"].tflops if workbook.ON_GPU else float("nan"), at_least=10)
chapter.bar("N=32 C=K=256 56x56 3x3: implicit GEMM vs cuDNN FP32 (fraction of its speed)",
            big_result.ratio(resnet.CUDNN, "implicit GEMM") if workbook.ON_GPU else float("nan"), at_least=0.70)

# %% [markdown]
# ## A sweep: the GEMM from small to large
#
# Square GEMMs, the best tile of the 4096³ run against cuBLAS FP32. Small ones cannot fill 132 SMs
# with 128x128 tiles (a 1024² output has 64 of them): stream-K shares the work out, but each call
# then pays two launches from Python (zeroing, GEMM) and the wrapper's checks, which at 512³ cost
# more than the arithmetic.

# %%
sweep_sizes = workbook.size(gpu=[512, 1024, 2048, 3072, 4096, 6144], sim=[16, 32, 48])
series = resnet.gemm_sweep(chapter, torch, sweep_sizes, best_gemm)
if workbook.ON_GPU:
    chapter.savefig(plots.sweep(sweep_sizes, series, xlabel="n (an n x n x n GEMM)", ylabel="TFLOP/s (FP32)",
                                title="FP32 GEMM: numba tiled kernel vs cuBLAS"), "gemm_sweep")
    chapter.savefig(resnet.plot_layers({**{key: r for key, (_, r, _) in layer_results.items()}, big_key: big_result}),
                    "conv_layers")
else:
    print("simulator: the sweep ran and was checked at", sweep_sizes, "- the plots need a GPU's times.")
    chapter.show_stored_figure("gemm_sweep")  # the same plots, measured on the reference GPU
    chapter.show_stored_figure("conv_layers")

# %% [markdown]
# ## What the numbers mean
#
# - **im2col is pure traffic.** It writes 9x the input for the GEMM to read back. The implicit GEMM
#   reads x itself, 9x smaller and mostly held in the L2, and allocates nothing.
# - **The more arithmetic, the less it matters.** The implicit GEMM's gain shrinks as the layers'
#   channels grow: a speed-up of 1.5x needs im2col to cost half the GEMM, and the more channels a
#   layer has, the more its GEMM outweighs its im2col (the 14x14 layer's bar is 1.4x).
# - **Small layers starve the machine; stream-K feeds it.** The 14x14 layer has 49 tiles of 256x128:
#   one block per tile leaves most SMs idle, split-K and stream-K keep every SM busy to the end.
# - **A GEMM is fast through its tiles.** 16-byte fragments and register prefetch, then 128 threads
#   of 16x8 outputs with BK = 16: a 256-thread tile has 128 registers a thread and spills
#   (`resources` above); 128 threads get 255.
# - **The gather is a table lookup.** One packed 32-bit word per depth row (offset and tap bit),
#   copied into shared memory once per block, ANDed with the column's `on_image` mask: the inner loop
#   adds and compares, and never divides. Issued halfway through a step's FMAs, its latency hides. A
#   taller tile (256x128) gathers half as much per FMA; it wins on 14x14 and on the big layer, while
#   K = 64 or 128 would leave it half empty.
# - **Against cuDNN**: where cuDNN runs faster than cuBLAS's rate on a plain GEMM (the 28x28 layer),
#   it computes fewer FLOPs than the 2·N·K·P·Q·C·R·S we count (with Winograd, for instance).
# - **Past the tiles, instructions count.** Unsigned indices, 32-bit loop counters, no division in
#   the loop: fewer instructions beside the FMAs (`workbook.show_ptx`). An unrelated edit moves a
#   kernel by several per cent: compare a change only beside the old kernel, in one process.
#
# Variants tried and dropped are in [EXPERIMENTS.md](EXPERIMENTS.md). The figures:

# %%
SPEEDUP = "{}: implicit vs explicit im2col + GEMM, end to end (speed-up)"
TILES = ("tile 128x128", "tile 128x128 wide, prefetch", "tile 128x128 wide, 16x8/thread, BK=16")
BIG_BAR, SHARE = "N=32 C=K=256 56x56 3x3: implicit GEMM", "sharing the work on the last layer"
workspace_mb = lambda channels, side: lambda: k.conv_geometry(  # noqa: E731
    (32, channels, side, side), (channels, channels, 3, 3), 1, 1, 1).workspace_bytes / 1e6
chapter.show_figures({
    "im2col workspace: 64-channel layer / the big one": ("{:.0f} / {:.0f} MB", workspace_mb(64, 56),
                                                         workspace_mb(256, 56)),
    "implicit vs explicit: 64ch 56x56 / 128ch 28x28 / 256ch 14x14": (
        "{:.2f}x / {:.2f}x / {:.2f}x", *(SPEEDUP.format(key) for key, _, _ in resnet.RESNET)),
    "  14x14: the middle half of its repeats": ("{:.2f} to {:.2f}", (SPEEDUP.format("resnet 256ch 14x14"), None, "p25"),
                                                (SPEEDUP.format("resnet 256ch 14x14"), None, "p75")),
    "  14x14: im2col / the GEMM on its workspace / the implicit GEMM": (
        "{:.3f} / {:.3f} / {:.4f} ms", lambda: chapter.figure("explicit split: im2col", "im2col", size="N=32 C=256 14x14"),
        lambda: chapter.figure("explicit split: GEMM on the workspace", "GEMM on im2col", size="(256 x 2304)"),
        ("resnet 256ch 14x14", "implicit GEMM")),
    "14x14: a block per tile / split-K 4 / stream-K": ("{:.3f} / {:.3f} / {:.3f} ms", *(
        (SHARE, f"implicit, {how}") for how in ("a block per tile", "split-K 4", "stream-K"))),
    "GEMM 4096^3: 128x128 / wide, prefetch / 16x8 a thread, BK=16": ("{:.1f} / {:.1f} / {:.1f} TFLOP/s", *(
        ("gemm 4096", tile, "tflops") for tile in TILES)),
    "  cuBLAS FP32; the best tile's fraction of it": ("{:.1f} TFLOP/s; {:.2f}", ("gemm 4096", resnet.CUBLAS, "tflops"),
                                                      ("gemm 4096", TILES[2], "speedup_vs_baseline")),
    "big layer: implicit GEMM / cuDNN FP32; of cuDNN's speed": (
        "{:.1f} / {:.1f} TFLOP/s; {:.2f}", f"{BIG_BAR} TFLOP/s", ("256ch 56x56", resnet.CUDNN, "tflops"),
        f"{BIG_BAR} vs cuDNN FP32 (fraction of its speed)"),
    "128ch 28x28: cuDNN FP32": ("{:.1f} TFLOP/s", ("resnet 128ch 28x28", resnet.CUDNN, "tflops")),
})

# %%
chapter.save()

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises, each a stub with its spec and hints.
# Each cell below shows the code you edit and runs its check on what the file holds now: *not
# attempted*, *wrong* (with what is wrong: the elements, their block and thread, the first wrong bit
# of a mask) or *correct*. Edit `exercises.py` between `# >>> ch04.N` and `# <<< ch04.N`,
# save, and re-run the cell (autoreload picks the edit up). `python -m pytest --exercises -k ch04`
# checks them all at once; on a GPU the "faster" exercises are also timed against this chapter's
# kernel, in the same run.

# %%
from workbook import exercises

exercises.show("ch04.1")

# %%
exercises.show("ch04.2")

# %%
exercises.show("ch04.3")

# %%
exercises.show("ch04.4")

# %% [markdown]
# ## More to try
# 1. **BK = 16 on the 256x128 tile** needs 49.7 KB of tiles and the table, past the 48 KB a block may declare
#    statically: carve the tiles out of one dynamic `cuda.shared.array(0, ...)`, and ask the driver
#    for the room (`cuKernelSetAttribute`, `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`). Half
#    the barriers: does the implicit kernel gain, or do its 8 gathers a step cost more registers?
# 2. **Warp specialisation**: some warps only load (the A tile and the gathered B tile, into the
#    other buffer) while the rest only multiply. How many multiplying warps per scheduler keep the
#    FMA pipe busy, and how many registers does a 16x8 thread leave for them?
# 3. **No table at all**: walk the depth as (c // 16, r, s, c % 16), so that a step is one tap of 16
#    channels, on the image or off it for a whole column. What layout must the filters have, and is
#    it still a fair race if the explicit path gets that layout too?
# 4. Change `conv2d_implicit` to NHWC input: which loads become contiguous, and what does the offset
#    table look like when c is the fastest index?
# 5. Split-K adds partial sums with atomics, so the output's last bits change from run to run.
#    Write a deterministic version: each slice writes its own partial output, and a second kernel
#    sums them in a fixed order. What does the extra traffic cost on the 14x14 layer?
#
# ## References
# - S. Chetlur et al., *cuDNN: Efficient Primitives for Deep Learning* (2014) — convolution as GEMM.
# - NVIDIA CUTLASS, *Implicit GEMM Convolution* (docs/implicit_gemm_convolution.md).
# - V. Volkov, *Better Performance at Lower Occupancy* (GTC 2010) — register tiling.
