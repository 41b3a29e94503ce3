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
#   conflicts), a register tile of 8x8 outputs per thread, double buffering, then 16-byte
#   shared-memory loads of the fragments (an instruction numba does not expose, reached through
#   `workbook.memory`) and register prefetch — and how far from cuBLAS and cuDNN that gets in FP32
#   (this is the workbook's compute-bound chapter: we count FLOPs).
#
# Without a GPU this notebook runs in numba's CUDA simulator on tiny shapes and small tiles (the
# same kernel source, with the tile sizes as parameters); each comparison is followed by the stored
# figures from an NVIDIA H100.

# %%
# Reload an edited kernels.py before each cell runs:
# %load_ext autoreload
# %autoreload 2
import matplotlib.pyplot as plt
import numpy as np

import workbook
from workbook import cuda, plots

from chapters.ch04_implicit_gemm import kernels as k

print(f"running on: {workbook.MODE}; tiles: " + ", ".join(f"{name} ({tile})" for name, tile in k.TILES.items()))
chapter = workbook.Chapter("ch04", "Convolution: explicit im2col + GEMM vs implicit GEMM")
rng = np.random.default_rng(0)
torch = workbook.bench.optional_torch()
if torch is not None:  # FP32 baselines: no TF32 tensor cores for cuBLAS or cuDNN
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True  # let cuDNN pick its fastest algorithm, as we pick tiles


def device_data(shape, seed):
    return cuda.to_device(np.random.default_rng(seed).standard_normal(shape).astype(np.float32))


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
# So the inner loop adds and compares — no division, no modulo (numba would turn each `//` on
# integers into a 64-bit division, dozens of instructions). The implicit kernel goes one step
# further, as CUTLASS's "optimized" iterator does: whether tap (r, s) of the filter lands on the
# image depends only on the thread's column, so each thread computes that once, as a bit mask
# `on_image` (bit r·S + s), and each table row is one 32-bit word that packs the row offset and
# the row's bit: `offset << R·S | 1 << r·S + s`. Loading an element is then: read the row's word
# (the same for the whole warp), AND it with `on_image`, and load `x[base + (word >> R·S)]` or take
# 0. The offsets are 32-bit: the shift and the sum are one instruction (`LEA.HI`), the address one
# multiply-add (`x + 4·offset`); with 64-bit words the same gather took 13 SASS instructions per
# element. A 3x3 filter leaves 23 bits for the offset (8M elements per image); where the taps and
# the offset do not fit in 32 bits (a 7x7 filter, a huge image), a row takes two words, the offset
# and the tap number, tested against a 64-bit mask.
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
x_small = rng.standard_normal((2, 3, 9, 10)).astype(np.float32)
w_small = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
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
# The GEMM is already a good one — the explicit path is "naive" only in that it materialises X.
# Each block computes a BM x BN tile of the output; each of its 256 threads an 8x8 register tile
# (2x4 in the simulator), interleaved so that a warp reads 16 consecutive words of the B tile
# (no bank conflicts) and 2 broadcast words of the A tile. The A tile is stored transposed and its
# rows padded by 32/BK words, so that a warp's 32 stores land in 32 banks. The next tile's global
# loads are issued into registers before the current tile's FMAs (double buffering), so their
# latency hides behind arithmetic. The epilogue writes column (n, p, q) straight into the NKPQ
# output: no transpose afterwards.

# %%
gemm_kernel, implicit_conv_kernel = k.make_kernels(k.DEFAULT_TILE)
workbook.show(gemm_kernel)

# %% [markdown]
# ## Optimized: implicit GEMM
#
# The same kernel with one change: the loader of the B tile. Each thread decodes its column
# `(n, p, q)` once (`column_origin`) and marks which filter taps land on the image for it
# (`on_image`); then for each row it loads, it reads the row's entry from the tap table — the whole
# warp reads the same row, one broadcast — and loads `x[base + offset]` if the tap's bit is set,
# else 0. Indices that cannot be negative are cast to unsigned (`U64`): numba then skips the
# negative-index test it adds to every signed index (5 instructions on 64-bit integers). Two
# placements matter on the GPU (measured at the end of the chapter): each block first copies the
# table into shared memory (up to 12 KB; a larger one is read from global memory), and the next
# step's gathers are issued halfway through this step's FMAs, not right after the barrier.

# %%
workbook.show(k.column_origin)
workbook.show(implicit_conv_kernel)

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
#   row of A and B is a whole number of 16-byte-aligned quads (`_quads`); else the 4-byte loader;
# - the A tile's row pitch stays a multiple of 4 words, so every row of A_s is 16-byte aligned;
# - **prefetch**: row kk+1's fragments are loaded into a second set of registers before row kk's
#   FMAs, so the FMAs never wait for shared memory. The loop is unrolled by two by hand: NVVM
#   leaves a loop of 512 FMAs rolled, and a register array indexed by `kk % 2` must then live in
#   local memory (measured: 7 TFLOP/s, five times slower, with 384 bytes of local memory). Its last
#   pair is peeled off and its trips counted in 32 bits, so that the loop carries as few
#   instructions as possible besides its FMAs (`multiply_tile`'s docstring counts them).
#
# Same source, one switch: `Tile(..., wide=True, prefetch=True)`; the simulator runs a 16x32 wide
# tile through the same code.

# %%
wide_gemm, _ = k.make_kernels(next(t for t in k.TILES.values() if t.wide))
workbook.show(wide_gemm.parts["output_row"])
workbook.show(wide_gemm.parts["load_fragments"])
workbook.show(wide_gemm.parts["multiply_tile"])

# %% [markdown]
# The PTX shows the trade: 16-byte shared loads, 16-byte global loads, and no 4-byte fragment load.

# %%
_m = np.zeros((8, 8), np.float32)
workbook.show_ptx(k.make_kernels(k.Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True, prefetch=True), True)[0],
                  _m, _m, 8, np.zeros((1, 8, 8), np.float32), grep=r"ld\.shared|ld\.global\.v4")

# %% [markdown]
# ## Optimized, step 3: the work shared out, and 16-byte outputs
#
# Three changes that matter most on the small ResNet layers, where the GEMM is 7.4 GFLOP of
# 128 x 25,088 or 256 x 6,272 outputs: 196 or 98 tiles of 128x128 for 264 places (132 SMs, 2 blocks each).
#
# - **Stream-K.** With one block per tile, 196 tiles fill 74% of one wave and 98 tiles 37%: the rest
#   of the machine idles for the whole kernel. Split-K (S blocks per tile) fixes the count only when
#   S x tiles happens to land near a multiple of 264. Instead, every kernel sees its work as one row
#   of tiles x steps (output tile, depth step) iterations, and each block takes an equal,
#   consecutive share of that row (`block_share`): with one block per place ("stream"), every SM
#   works until the end, and a share that ends inside a tile hands the rest of that tile to the
#   next block. Blocks that ran part of a tile add their partial sums into the (zeroed) output with
#   atomics; a block that ran all of a tile stores it. The same kernel, with one block per tile,
#   is the classic GEMM; with S per tile, split-K. (Osama et al., *Stream-K*, PPoPP 2023.)
# - **16-byte outputs.** A wide tile's 4 adjacent columns are 4 adjacent positions of one image
#   when P·Q % 4 == 0: `store4` writes them in one instruction, and a partial tile adds them with one
#   `red.global.add.v4.f32` (`workbook.memory.atomic_add4`, Hopper and later): a quarter of the
#   atomics, which were 10% of the stream-K kernel's time with one atomic per element (measured on
#   the H100: 0.237 vs 0.211 ms without them).
# - **128 threads of 8x16 outputs.** Per depth row a thread reads 8 + 16 words (6 shared loads) for
#   128 FMAs, instead of 4 loads per 64; at 2 blocks of 128 threads per SM each thread may use
#   255 registers, so BK = 16 (half the syncthreads) fits without the spills the 256-thread tile
#   has at 128 registers (`resources` below).

# %%
workbook.show(wide_gemm.parts["block_share"])
workbook.show(wide_gemm.parts["store_output_quads"])

# %% [markdown]
# ## Check first
#
# Awkward shapes: a single pixel, 1x1, 3x3, 5x5 with K = 17 (not a multiple of any tile), 7x7 with
# stride 2, dilation 2, mixed strides, padding larger than the filter reaches, batch 1 and 2, C = K = 33,
# and a NaN in the input, which must poison exactly the outputs whose window covers it.

# %%
cases = [
    ((1, 1, 1, 1), (1, 1, 1, 1), 1, 0, 1),
    ((2, 5, 6, 7), (3, 5, 1, 1), 1, 0, 1),
    ((1, 7, 9, 11), (17, 7, 5, 5), 1, 2, 1),
    ((1, 3, 15, 13), (9, 3, 7, 7), 2, 3, 1),
    ((2, 3, 9, 10), (4, 3, 3, 3), 1, 2, 2),
    ((2, 4, 9, 8), (6, 4, 3, 2), (2, 1), (1, 2), (2, 1)),
    ((1, 2, 3, 3), (3, 2, 3, 3), 1, 3, 1),
    ((1, 33, 4, 5), (33, 33, 3, 3), 1, 1, 1),
]
for x_shape, w_shape, stride, padding, dilation in cases:
    x_host = rng.standard_normal(x_shape).astype(np.float32)
    x_host.reshape(-1)[x_host.size // 2] = np.nan
    w_host = rng.standard_normal(w_shape).astype(np.float32)
    g = k.conv_geometry(x_shape, w_shape, stride, padding, dilation)
    expected = k.conv2d_reference(x_host, w_host, stride, padding, dilation)
    rtol, atol = k.tolerance(g.gemm_depth)
    for conv in (k.conv2d_explicit, k.conv2d_implicit):
        out = conv(cuda.to_device(x_host), cuda.to_device(w_host), cuda.device_array(g.out_shape, np.float32),
                   stride=stride, padding=padding, dilation=dilation)
        workbook.assert_close(out, expected, rtol=rtol, atol=atol, name=f"{conv.__name__} {x_shape} {w_shape}")
print(f"explicit and implicit agree with NumPy on {len(cases)} shapes, NaN included")

# %% [markdown]
# ## The memory each needs
#
# The ResNet-50 3x3 layers at batch 32 (56x56 with 64 channels, 28x28 with 128, 14x14 with 256) and
# the big layer of the issue. The im2col workspace is 9x the input; implicit GEMM needs none.

# %%
RESNET = [("resnet 64ch 56x56", 64, 56), ("resnet 128ch 28x28", 128, 28), ("resnet 256ch 14x14", 256, 14)]
BIG = ("256ch 56x56", 256, 56)
print(f"{'layer (N=32, 3x3, pad 1)':28s} {'input MB':>9s} {'im2col MB':>10s} {'GFLOP':>7s}")
for name, channels, side in RESNET + [BIG]:
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
best_gemm = min(k.TILES, key=lambda name: gemm_result[f"tile {name}"].median_ms)  # the first, in the simulator
for name in k.TILES:
    print(name, k.resources(name))
chapter.bar(f"GEMM 4096^3 FP32, best tile ({best_gemm}) vs cuBLAS FP32 (fraction)",
            gemm_result.ratio("torch.matmul (cuBLAS FP32)", f"tile {best_gemm}"), at_least=0.70)

# %% [markdown]
# ## Explicit vs implicit on the ResNet-50 3x3 layers
#
# End to end: the explicit path is im2col + GEMM (workspace allocated once, beforehand, as a
# framework would), the implicit one the single kernel. Both use the same tile, the fastest for
# the implicit kernel on that layer (`fastest_tile`), and the same sharing of the work:
# `split_count` keeps one block per tile where the tiles fill the machine's waves, and takes
# stream-K where they do not (the 28x28 and 14x14 layers). Where another tile makes the explicit
# path faster, it runs with that one too, and the bar counts the faster of its two times: the
# naive path gets its best tile, not ours. cuDNN (`torch.nn.functional.conv2d`, TF32 off) is the
# baseline.

# %%
BATCH = workbook.size(gpu=32, sim=1)
layers = RESNET if workbook.ON_GPU else [("resnet 64ch 56x56", 4, 6), ("resnet 128ch 28x28", 6, 5),
                                         ("resnet 256ch 14x14", 8, 4)]


def describe_work(splits):
    return {1: "a block per tile", "stream": "stream-K"}.get(splits, f"split-K {splits}")


def conv_case(key, channels, side):
    g = k.conv_geometry((BATCH, channels, side, side), (channels, channels, 3, 3), 1, 1, 1)
    x, w = device_data((g.N, g.C, g.H, g.W), 3), device_data((g.K, g.C, g.R, g.S), 4)
    out = cuda.device_array(g.out_shape, np.float32)
    workspace = cuda.device_array((g.gemm_depth, g.gemm_columns), np.float32)
    tile, tile_ms = k.fastest_tile(lambda name: k.conv2d_implicit(x, w, out, padding=1, tile=name))
    def explicit(name):
        return k.conv2d_explicit(x, w, out, padding=1, workspace=workspace, tile=name)

    explicit_tile, explicit_ms = k.fastest_tile(explicit)
    for path, times in (("implicit GEMM", tile_ms), ("explicit", explicit_ms)):
        if times:
            print(f"{key}: {path} ms by tile: " + ", ".join(f"{n} {ms:.3f}" for n, ms in times.items()))
    tx, tw = workbook.bench.torch_view(x), workbook.bench.torch_view(w)

    # The reference: cuDNN in FP32 where it exists (NumPy would take minutes on these shapes), else
    # NumPy. cuDNN may pick Winograd or FFT algorithms, whose FP32 rounding differs more from ours
    # than a plain sum's would: a wider tolerance there, still far below what a wrong index gives.
    def reference():
        if torch is not None:
            return torch.nn.functional.conv2d(tx, tw, padding=1).cpu().numpy()
        return k.conv2d_reference(x.copy_to_host(), w.copy_to_host(), 1, 1, 1)

    rtol, atol = (1e-3, 2e-2) if torch is not None else k.tolerance(g.gemm_depth)
    variants = {"explicit: im2col + GEMM": lambda: explicit(tile),
                "implicit GEMM": lambda: k.conv2d_implicit(x, w, out, padding=1, tile=tile)}
    if explicit_tile != tile:
        variants[f"explicit, tile {explicit_tile}"] = lambda: explicit(explicit_tile)
    result = chapter.compare(
        key,
        variants,
        reference=reference,
        check=lambda o, ref, name: workbook.assert_close(o, ref, rtol=rtol, atol=atol, name=name),
        baselines={"torch conv2d (cuDNN FP32)": lambda: torch.nn.functional.conv2d(tx, tw, padding=1)},
        flops=g.flops,
        size=f"N={g.N} C=K={g.C} {g.H}x{g.W} 3x3 pad 1, tile {tile}, "
             f"{describe_work(k.split_count(k.TILES[tile], g.K, g.gemm_columns, g.gemm_depth))}",
    )
    return g, result, (x, w, out, workspace, tile, reference, (rtol, atol))


def fastest_explicit(result):
    """The explicit variant with the smaller median: with the implicit kernel's tile, or its own."""
    names = [t.name for t in result.timings if t.name.startswith("explicit")]
    return min(names, key=lambda name: result[name].median_ms)


layer_results = {}
for key, channels, side in layers:
    g, result, buffers = conv_case(key, channels, side)
    layer_results[key] = (g, result, buffers)
    chapter.bar(f"{key}: implicit vs explicit im2col + GEMM, end to end (speed-up)",
                result.ratio(fastest_explicit(result), "implicit GEMM"), at_least=1.5)
chapter.bar("implicit GEMM workspace (bytes)", 0, at_most=0)  # it allocates nothing: see conv2d_implicit

# %% [markdown]
# What sharing the work buys on the layer with the fewest tiles: the same kernel with one block per
# tile, with 4 per tile (split-K), and with one per place in the machine (stream-K).

# %%
g, _, (x, w, out, workspace, tile, reference, (rtol, atol)) = layer_results[layers[-1][0]]
split_result = chapter.compare(
    "sharing the work on the last layer",
    {f"implicit, {describe_work(splits)}": (lambda splits=splits: k.conv2d_implicit(x, w, out, padding=1, tile=tile,
                                                                                    splits=splits))
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
explicit_parts = {}
for key, (g, result, (x, w, out, workspace, tile, _, _)) in layer_results.items():
    split = chapter.compare(
        "explicit split: im2col",
        {"im2col": lambda: k.im2col(x, g, workspace)},
        reference=lambda: k.im2col_reference(x.copy_to_host(), g),
        check=lambda o, ref, name: workbook.assert_close(o, ref, exact=True, name=name),
        bytes=g.workspace_bytes + 4 * g.N * g.C * g.H * g.W,
        size=f"N={g.N} C={g.C} {g.H}x{g.W}",
    )
    gemm_out = cuda.device_array((g.K, g.gemm_columns), np.float32)
    gemm_only = chapter.compare(
        "explicit split: GEMM on the workspace",
        {"GEMM on im2col": lambda: k.gemm(w.reshape(g.K, g.gemm_depth), workspace, gemm_out, tile=tile)},
        flops=g.flops,
        size=f"({g.K} x {g.gemm_depth}) @ ({g.gemm_depth} x {g.gemm_columns}), tile {tile}",
    )
    explicit_parts[key] = (split["im2col"].median_ms, gemm_only["GEMM on im2col"].median_ms,
                           result["implicit GEMM"].median_ms)
    del gemm_out

if workbook.ON_GPU:
    print(f"{'layer':20s} {'im2col':>7s} {'GEMM':>7s} {'implicit':>9s} {'gather':>7s} {'1.5x needs':>11s}  (ms)")
    for key, (im2col_ms, gemm_ms, implicit_ms) in explicit_parts.items():
        print(f"{key:20s} {im2col_ms:7.4f} {gemm_ms:7.4f} {implicit_ms:9.4f} {implicit_ms - gemm_ms:7.4f} "
              f"{(im2col_ms + gemm_ms) / 1.5:11.4f}")

# %% [markdown]
# ## The big layer: N=32, C=K=256, 56x56, 3x3, pad 1
#
# 236 GFLOP per call. The bar is 10 TFLOP/s for the implicit GEMM; cuDNN FP32 is the yardstick.

# %%
big_key, big_channels, big_side = BIG if workbook.ON_GPU else ("256ch 56x56", 8, 6)
g_big, big_result, _ = conv_case(big_key, big_channels, big_side)
chapter.bar("N=32 C=K=256 56x56 3x3: implicit GEMM TFLOP/s",
            big_result["implicit GEMM"].tflops if workbook.ON_GPU else float("nan"), at_least=10)
chapter.bar("N=32 C=K=256 56x56 3x3: implicit GEMM vs cuDNN FP32 (fraction of its speed)",
            big_result.ratio("torch conv2d (cuDNN FP32)", "implicit GEMM") if workbook.ON_GPU else float("nan"),
            at_least=0.70)

# %% [markdown]
# ## A sweep: the GEMM from small to large
#
# Square GEMMs, the best tile of the 4096³ run against cuBLAS FP32. Small ones cannot fill 132 SMs
# with 128x128 tiles (a 1024² output has 64 of them): stream-K shares the work out, but each call
# then pays two launches from Python (zeroing, GEMM) and the wrapper's checks, which at 512³ cost
# more than the arithmetic.

# %%
sweep_sizes = workbook.size(gpu=[512, 1024, 2048, 3072, 4096, 6144], sim=[16, 32, 48])
series = {f"numba GEMM, tile {best_gemm}": [], "torch.matmul (cuBLAS FP32)": []}
for n in sweep_sizes:
    sa, sb = device_data((n, n), 5), device_data((n, n), 6)
    sc = cuda.device_array((n, n), np.float32)
    tsa, tsb, tsc = (workbook.bench.torch_view(m) for m in (sa, sb, sc))
    rtol, atol = k.tolerance(n)
    result = chapter.compare(
        "gemm sweep",
        {f"numba GEMM, tile {best_gemm}": lambda: k.gemm(sa, sb, sc, tile=best_gemm)},
        reference=lambda: k.gemm_reference(sa.copy_to_host(), sb.copy_to_host()),
        check=lambda o, ref, name: workbook.assert_close(o, ref, rtol=rtol, atol=atol, name=name),
        baselines={"torch.matmul (cuBLAS FP32)": lambda: torch.matmul(tsa, tsb, out=tsc)},
        flops=2 * n**3, size=f"{n}^3", repeats=20, show=False,
    )
    for name in series:
        series[name].append(result.tflops(name))

if workbook.ON_GPU:
    figure = plots.sweep(sweep_sizes, series, xlabel="n (an n x n x n GEMM)", ylabel="TFLOP/s (FP32)",
                         title="FP32 GEMM: numba tiled kernel vs cuBLAS")
    chapter.savefig(figure, "gemm_sweep")
    figure, axes = plt.subplots(figsize=(7, 4))
    names = ["explicit: im2col + GEMM", "implicit GEMM", "torch conv2d (cuDNN FP32)"]
    keys = list(layer_results) + [big_key]
    results_by_key = {**{key: r for key, (_, r, _) in layer_results.items()}, big_key: big_result}
    for index, name in enumerate(names):
        picked = {key: fastest_explicit(r) if name.startswith("explicit") else name for key, r in results_by_key.items()}
        values = [results_by_key[key][picked[key]].tflops for key in keys]
        axes.bar(np.arange(len(keys)) + 0.27 * (index - 1), values, width=0.27, label=name)
    axes.set_xticks(np.arange(len(keys)), [key.replace("resnet ", "") for key in keys])
    axes.set_ylabel("TFLOP/s (FP32)")
    axes.set_title("3x3 convolutions, N=32")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    chapter.savefig(figure, "conv_layers")
else:
    print("simulator: the sweep ran and was checked at", sweep_sizes, "- the plots need a GPU's times.")
    chapter.show_stored_figure("gemm_sweep")  # the same plot, measured on the H100
    chapter.show_stored_figure("conv_layers")  # the same plot, measured on the H100

# %% [markdown]
# ## What the numbers mean
#
# (The figures are in the tables above on a GPU, and in the stored H100 results in the simulator.)
#
# - **im2col is pure traffic.** It writes 9x the input (231 MB for the 64-channel layer, 925 MB for
#   the big one) and the GEMM reads it back; on the small-channel layers, whose GEMM is short, that
#   traffic is a large share of the explicit path. The implicit GEMM reads x itself, a tensor 9x
#   smaller that mostly stays in the 50 MB L2, and allocates nothing.
# - **When the GEMM dominates, implicit and explicit converge**: for C = K = 256 the arithmetic
#   (236 GFLOP) dwarfs the 925 MB of im2col traffic, and the speed-up shrinks towards 1. The
#   memory saving stays. The 1.5x holds only where im2col costs at least half as much as
#   the GEMM: the faster the GEMM, the larger im2col's share. With ours, the three ResNet layers
#   pass, the 14x14 one by little (im2col 0.093 ms against a GEMM of 0.18: see the stored H100
#   figures).
# - **Small layers starve the machine, and stream-K feeds it** (the 14x14 layer, same run, the
#   256x128 tile: 49 tiles for 132 SMs): one block per tile 0.438 ms, split-K 4 0.240, stream-K
#   0.180 — every SM busy to the end. The
#   28x28 layer went the same way: its implicit GEMM from 0.291 ms (25 TFLOP/s, before stream-K)
#   to 0.203 (36 TFLOP/s).
# - **What moved the GEMM** (4096³, same run): the interleaved 128x128 tile 28.0 TFLOP/s, the wide
#   tile with prefetch 39.8 (16-byte fragments), the 128-thread 16x8 tile with BK = 16 **44.8
#   (0.869 of cuBLAS FP32's 51.5)**. The 256-thread tiles stay at 128 registers a thread (2 blocks
#   of 256 per SM) and spill (`local bytes` above); at 128 threads a thread has 255, and 8x16
#   outputs need 6 shared loads per 128 FMAs. The last 4% came from the instructions around the
#   FMAs, read in the SASS: shared-tile stores with unsigned indices (one address plus constant
#   offsets: 69 instructions per depth step fewer in the GEMM, 155 in the implicit kernel) and the
#   FMA loop's own overhead (`multiply_tile`: 19 instructions per 256 FMAs down to 10; the step
#   loop's, counted in 32 bits, 27 fewer per step: see "The last 1%" below). The big layer's
#   implicit GEMM: 45.6 TFLOP/s, 1.04 of cuDNN (with the 256x128 tile, below; 44.0 and 1.01 with
#   the 128x128 before the 32-bit step loop). What still separates it from cuBLAS: NVVM
#   (not us) allocates the registers and schedules the loads, a loop of 256 FMAs still carries
#   22 other instructions, and 8 warps per SM leave little to hide a barrier's stall.
# - **The gather's wait, hidden.** Right after the syncthreads, every depth step, a warp loaded
#   its 16 table entries from global memory and could not issue a gather until they arrived; with
#   the 8x16 tile's 255 registers there was no room for 32 words of (offset, bit) pairs loaded
#   earlier (every such variant spilled and ran slower). Packing a row's offset and bit into one
#   word (`tap_table`) halved that to 16 registers, and the packed entries went before the tile
#   stores and the barrier, where their wait overlapped the barrier's: 28x28 from 1.50 to 1.59,
#   64 channels from 1.96 to 2.16, the big layer from 0.92 to 0.99 of cuDNN. Then (H100,
#   2026-11-24, each beside the previous kernel in the same run) the table moved into shared
#   memory, copied once per block (9 KB for 256 channels): an entry arrives in ~30 cycles, so it
#   is loaded where it is used and holds no registers across the barrier (246 a thread instead of
#   254 and a 16-byte spill). And the next step's loads moved from right after the barrier, where
#   the 4 warps of a block issued their gathers' chains all at once, to halfway through the FMAs
#   (`SPLIT`). Each alone gained under 1%; together, 2% on every layer: 14x14 0.1847 ms against
#   0.1881, 28x28 0.1873 against 0.1903, 64 channels (16x8 tile) 0.348 against 0.352, the big
#   layer 2.69 against 2.75 — now level with cuDNN. The GEMM keeps its loads after the barrier:
#   moved halfway it ran 4% slower (3.18 ms against 3.06 at 4096³).
# - **A tile of 256 rows: half the gathers per FMA** (H100, 2026-11-24). A block gathers its B
#   tile once for all of the tile's rows, so a taller tile gathers less per FMA: the 256x128 tile
#   (256 threads of 16x8, one block of 8 warps per SM) gathers 4 elements a thread per 1,024 FMAs
#   where the 128x128 tile gathers 16 per 2,048. It needs BK = 8 to keep its tiles (24 KB) and the
#   table (12 KB) under the 48 KB of static shared memory, so it pays a barrier per 1,024 FMAs with
#   no second block on the SM to run meanwhile; 236 registers, no spill. In the run that brought
#   it the implicit kernel picked it on the 14x14 layer (0.181 ms against 0.184 with the 128x128
#   tile) and on the big one (2.63 ms against 2.69: 45.1 TFLOP/s, 1.03 of cuDNN); the 28x28 and
#   64-channel layers (K = 128 and 64) would leave half or three quarters of it empty. Its GEMM
#   gains nothing (3.105 ms against 3.081 at 4096³: the B tile's 16-byte loads were never the
#   cost), so on the 14x14 layer the explicit path is faster with the 128x128 tile (0.2716 ms
#   against 0.2771), and the bar counts that: it read 1.497, where the same tile for both would
#   read 1.52. Variants, each beside it in the same run: 4 x 8 threads a warp instead of 2 x 16,
#   the same (0.1838 ms); 8x16 a thread, 0.199; 8x8 with 512 threads (16 warps), 0.233; a
#   `cuda.syncwarp()` that keeps its gathers in the middle of the step, 0.186 (here ptxas's place
#   for them, right after the barrier, is the better one: 8 warps hide it).
# - **The same tile with BK = 16, in 60 KB of shared memory** (H100, 2026-11-24, beside the BK = 8
#   tile in the same run). A barrier per 2,048 FMAs instead of 1,024 needs 49.7 KB of tiles and the
#   9 KB table: more than the 48 KB a block may declare statically. Dynamic shared memory goes up
#   to 227 KB a block, once the kernel asks the driver for it (`cuKernelSetAttribute` with
#   `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES` on numba's compiled kernel: numba has no API
#   for it) and is launched with the bytes (`kernel[blocks, threads, stream, bytes]`). The kernel
#   then carves its tiles out of one `cuda.shared.array(0, float32, alignment=16)`; a 3-D view at
#   an offset took a small intrinsic, because `reshape` of a slice calls a runtime helper that is
#   not linked into CUDA code. 246 registers, no spill, right on every layer. The GEMM gained a
#   little (28x28 explicit path 0.4525 ms against 0.4584, the big layer 3.366 against 3.411); the
#   implicit kernel lost on every layer (14x14 0.1877 ms against 0.1824, 28x28 0.347 against 0.340,
#   the big layer 2.660 against 2.607): with 8 gathers a thread per step instead of 4, its
#   registers (246 against 236) and the gathers' chains weigh more than the barriers saved. Not
#   kept: it would only have made the baseline faster.
# - **The last 1%: the step loop in 32 bits** (H100, 2026-11-24). With the 256x128 tile the
#   14x14 layer read 1.497 in the stored run, against the explicit path's own fastest tile (with
#   the 128x128 tile, before it: 1.48 stored and 1.455-1.506 in six runs side by side): GEMM
#   0.1788 ms, implicit 0.1814, and 1.5 needed 0.1811. numba's `range` counts in 64 bits, and so
#   did the step loop of both kernels: its count, its "is there a next step" test, the buffer
#   index and each tile's depth offset, in pairs of 32-bit instructions. `multiply_tile` already
#   counted its trips in 32 bits; the step loop now does too (`step` a `uint32`, each sum cast back
#   to 32 bits, so that LLVM knows the high half is zero). Per step, besides the FMAs, the SASS
#   goes from 176 instructions to 152 in the 256x128 implicit kernel and from 373 to 346 in the
#   GEMM's 16x8 tile. Beside the old kernels in one process, 3 rounds of 60 calls each (every
#   output checked against cuDNN first): the 14x14 implicit kernel 0.1807 ms against 0.1824, the
#   big layer 2.598 against 2.627, the GEMM 3.065 against 3.080 at 4096³, and the explicit path's
#   best (the same loop) 0.2712 against 0.2720: 1.501 against 1.491 side by side. The stored run:
#   implicit 0.1803 ms, explicit 0.2734, **1.52**. The 28x28 layer's 128x128 implicit kernel
#   moved by under 0.3%, and three things got slower: the 64-channel layer's 64x128 implicit
#   kernel (0.2332 ms against 0.2311, with the fence below), chapter 08's 32x128 tile on its
#   layer (23.5 us against 23.1) and the 256x128 GEMM (3.156 ms against 3.107 at 4096³, no
#   layer's best explicit tile), which is partly why the 14x14 "gather" in the table above now
#   reads about zero (-0.0005 ms). One trap: written as a `while` loop, ptxas sank the 64x128
#   tile's next-step loads below all of the step's FMAs (0.285 ms against 0.231 on the 64-channel
#   layer: their latency no longer hidden). Memory accesses do not move across a `cuda.syncwarp()`, so one
#   after the gathers keeps them where `SPLIT` puts them. Elsewhere it costs at most 0.3% (the
#   256x128 kernel, 0.1807 ms against 0.1802 without it) and the 128x128 kernel gains 0.5%.
#   Two explanations of the old miss had been measured and excluded before: the kernel's start,
#   where each block copies the table before its first barrier (compiled as up to three L2 round
#   trips one after another, where the GEMM waits for none): the copy done twice, or unrolled into
#   one round trip, ran within 0.1% of it in three rounds of the same run (0.1831 and 0.1832 ms
#   against 0.1834). And the A tile's row offsets and bounds worked out once per tile run instead
#   of every step (5 of the step's 176 instructions, in the SASS): the 256x128 kernel 0.4% faster
#   (0.1820 ms against 0.1828) but the 128x128 tile slower in both kernels (28x28 implicit 0.191
#   against 0.186, the 14x14 explicit path 0.2755 against 0.2723): ptxas schedules the
#   rest differently. Not kept. The 128x128 kernel,
#   analysed before the taller tile came: on the 14x14 layer 1.5 needs the implicit kernel
#   at about 0.178-0.182 ms; the GEMM alone takes 0.176-0.178 and the implicit 0.184-0.188, so the
#   gather costs 0.007-0.010 ms (4-6%) and must almost vanish. Per depth step a thread issues 2,048 FMAs and 417 other instructions in the
#   implicit kernel, 372 in the GEMM (SASS of the 16x8 tile, the loop's trips counted): 2% more.
#   Before the table moved, the rest was waiting: Nsight Compute (`ncu --section WarpStateStats
#   --section SchedulerStats --section SourceCounters`) had the schedulers issuing in 74% of
#   cycles against the GEMM's 77%, the extra stalls at the barrier (warps that finished their
#   gathers wait for those that have not), on the first shared loads after it, and on each
#   gather's dependent chain (test, offset, address, load) that 2 warps per scheduler cannot
#   hide. Now it reads 78.9% against 79.8%, and the kernel 222 us against the GEMM's 215 (ncu
#   locks the clocks): 3.4%, most of it those instructions. A scratch kernel loading contiguous elements instead of gathering (a wrong answer,
#   timed only) ran 0.174 ms: a perfect gather would pass at 1.57x. cuDNN's effective rate on
#   these layers (above cuBLAS's 51.5 on the big GEMM) means fewer FLOPs than the
#   2·N·K·P·Q·C·R·S we count: Winograd, for instance.
# - **A gather without a table, and why it is not used** (H100, 2026-11-24, 16x8 tile, each time
#   beside the table kernel's in the same run). Walk the depth as (c // 16, r, s, c % 16) and a step
#   is one tap of 16 consecutive channels: for a thread's column the whole step is on the image or
#   off it (one test), and its 16 loads are H*W apart from one address (no table, no per-load
#   test). With the filters read in the KCRS order (A columns 9 apart, 4-byte loads) it ran
#   0.240 ms against the table's 0.191; with the filters stored in that order,
#   (K, C/16, R, S, 16) as CUTLASS's KRSC or oneDNN's blocked formats do, 0.183 ms against the
#   table's 0.189: 3% faster. But the comparison must give both paths the same filters, and the
#   same order makes the explicit path's im2col far faster (its whole path 0.272 -> 0.235 ms):
#   implicit vs explicit falls to 1.28. Against the KCRS explicit path it would read 1.49, still
#   short, and it would compare two different layouts. (Reordering the filters costs 10 us a call.)
# - **Other tiles, and warps that only load** (H100, 2026-11-24, the 14x14 layer, each beside the
#   16x8 tile's implicit kernel, 0.187-0.189 ms, in the same run). A 256x64 tile halves the gathers
#   per thread (8 instead of 16) but doubles the filter loads: 0.208 ms (16x8 a thread) and 0.211
#   (8x16), both spilling. A 128x64 tile of 8x8 with 3 blocks per SM (12 warps, 168 registers):
#   0.206. Then warp specialization, the way production kernels hide a gather: some warps only load
#   (the A tile and the gathered B tile, into the other buffer) while the rest only multiply, with
#   the same one barrier a step. 4 multiplying warps of 16x8 and 4 loading warps, one block per SM:
#   0.213 ms, and 3.65 ms on the big layer against 2.75: one multiplying warp per scheduler cannot
#   keep the FMA pipe busy. 8 multiplying warps of 8x8 and 4 loading (12 warps): 0.234, against
#   0.213 for the same 8x8 tile with no loading warps. The combination that would keep 2 warps of
#   16x8 per scheduler, 2 blocks of 4 + 1 warps, does not fit: 10 warps put 3 on some scheduler,
#   whose register file (16K) then allows 168 registers a thread, and ptxas caps the kernel there;
#   a 16x8 thread needs about 200. Last, the gathers two steps ahead: B tiles in a 3-stage ring
#   filled with `cp.async` (inline PTX; straight into shared memory, zero-filled off the image, no
#   registers held, 242 a thread and no spills): 0.192 ms against 0.189, and 3.04 ms against 2.75
#   on the big layer. And the gathers moved away from the barrier, into the middle of the step (8
#   rows of FMAs, the table entries and the 16 gathers, 8 more rows): 0.186 ms against 0.188 (1.47
#   against 1.46 in the same run, its GEMM done the same way), 1% on the big layer: too small, on
#   its own, for a second copy of the FMA loop (kept later, with the table in shared memory: see
#   "The gather's wait, hidden"). Quarters (4 rows, 4 gathers, ...) need four
#   copies and run 0.205; one loop with the gathers behind a branch inside it, 1.35-1.37.
#   Where 5 us more seemed to be: stream-K's zeroing launch. Timed without it (a wrong answer,
#   timed only), the implicit path dropped from 0.188 to 0.183 ms while the explicit path hardly
#   moved: 1.48 instead of 1.44 in that run. So the kernels were given a fix-up that needs no zeroed
#   output, as CUTLASS's stream-K has: the block holding a tile's first steps stores its sums and
#   counts itself in a per-tile flag, the others wait for the count and then add, and every block
#   walks its share backwards so that nobody waits in practice. It was right (the tests, and
#   compute-sanitizer's memcheck and racecheck), but both paths gained alike: implicit 0.188 ->
#   0.185 ms, explicit 0.273 -> 0.269 (its GEMM had a zeroing launch too), so the ratio stayed
#   within its run-to-run spread (1.46 side by side). And ptxas reacted to the extra code: the
#   interleaved 128x128 GEMM ran 16% slower (5.17 -> 6.01 ms at 4096³), and the variant that
#   restored it made the 14x14 implicit kernel 5% slower. Not kept. Measured again with the 256x128
#   tile (same run, a wrong answer timed only): without the zeroing launch the implicit kernel
#   runs 0.1781 ms against 0.1841 and the explicit path's best 0.2694 against 0.2780: 1.513
#   against 1.510, both paths pay the same 6 us. The driver's memset (`cuMemsetD32Async`) zeroes
#   the 6.4 MB output in 4.8 us against the zero kernel's 5.8 on their own, and in place left the
#   implicit kernel's time where it was (0.1845 ms both).
# - **Fewer instructions around the gather, and fewer registers** (H100, 2026-11-24, the 16x8
#   tile, each beside the kernels of its day in the same run). A thread gathering a 4x4 block (4
#   rows of 4 adjacent columns) needs one table quad per step instead of four, 4 shifts instead of
#   16, and stores its rows with 4 `st.shared.v4` instead of 16 stores; 250 registers and no spill
#   (then 254 and 16 bytes). It ran 3-6% slower on every layer (14x14 0.196 ms against 0.188,
#   28x28 0.201 against 0.189, the big layer 2.84 against 2.75): a warp's gather now reads 32
#   columns 4 apart, four times the 128-byte lines per load, and the L1 time that costs outweighs
#   the instructions saved. 2 adjacent columns of 8 rows (`st.shared.v2`) lost too: 0.189 against
#   0.185 (with the table in shared memory). The A tile copied by `cp.async` straight into its
#   transposed place (4 bytes a copy, no registers held: 230 registers in the GEMM, 238 in the
#   implicit kernel): 16 copies a thread per step cost more than 4 16-byte loads and 16 stores,
#   the GEMM 3.39 ms against 3.09 at 4096³, the 14x14 implicit kernel 0.200 against 0.189. The
#   SASS shows each gather reloading x's address from the constant bank (`LDC.64`, 16 a step):
#   ptxas keeps no register for it. A 64-bit pointer to the thread's column, made once per tile,
#   so that no gather needs x's address: 252 registers, 0.186 ms against 0.185. Where the gathers go: after 6
#   rows of FMAs 0.187, after 12 0.185, after 8 (kept) 0.185; the A tile's loads right after the
#   barrier instead of with the gathers, 0.186; the gathers in two groups of 8, after rows 8 and
#   12, 0.187, after rows 6 and 12, 0.190 (against 0.185 in the same run).
# - **Fewer instructions, paid back in fetching them** (H100, 2026-11-24, the 16x8 tile, each beside
#   the shipped kernels in the same run). `multiply_tile` runs its rows in a loop of pairs, 9
#   instructions of loop control per 256 FMAs. Unrolled by four instead, each 8-row half of the
#   implicit kernel's step becomes straight code: 344 instructions besides the 2,048 FMAs of a step
#   instead of 418. But in straight code ptxas moves the gathers up to the barrier, where "The
#   gather's wait, hidden" took them away from: 0.1925 ms against 0.1862. A `cuda.syncwarp()`
#   between the halves keeps them in the middle (after 992 of the 2,048 FMAs; 342 other
#   instructions, fewer than the GEMM's 373), and it still runs 0.1856 against 0.1845, the
#   64-channel layer 0.245 against 0.230: a step's code is now 38 KB instead of 22, and Nsight
#   Compute shows the warps waiting for instructions to be fetched (0.13 cycles per issued
#   instruction against 0.05) and for the shared-memory pipe (0.05 against 0.01). The GEMM
#   unrolled the same way runs 3.039 ms against 3.081 at 4096³ (0.878 of cuBLAS against 0.865) with
#   the 16x8 tile but 3.406 against 3.197 with the 8x16, and it makes the 14x14 layer's explicit
#   path 2% faster (0.2709 against 0.2760 ms): the baseline of the 1.5x has that much left in it,
#   which would move the ratio away from 1.5, not towards it. Not kept. (The SASS counts come from a
#   laptop: ptxas from numba-cuda's cu12 wheels gives the H100's register counts, 246 and 244, and
#   `nvdisasm` is a wheel too, `nvidia-cuda-nvdisasm`.)
# - **Where the last 4% goes** (H100, 2026-11-24). Back to back for 3 s each, the implicit kernel
#   and the GEMM on its im2col both run at 1980 MHz, the implicit drawing 571 W and the GEMM 670 (no
#   power limit in play): 0.184 against 0.1775 ms, 3.6%. Nsight Compute, clocks locked: 141.5 M
#   instructions against 138.1 M (+2.5%), 340 K active cycles per SM against 328 K (+3.9%), 3.15
#   instructions issued per cycle against 3.19. Per issued instruction the warps of both wait alike
#   (`--metrics smsp__average_warps_issue_stalled_*_per_issue_active.ratio`): not selected, another
#   warp issued, 0.73 against 0.72 cycles; dispatch 0.24 / 0.22; fixed-latency dependencies
#   0.18 / 0.16; shared-memory results 0.09 / 0.11; the barrier 0.07 / 0.09; the L1/shared data pipe
#   45% busy in both. No stall stands out to remove: the gap is the gather's ~45 instructions a step
#   and a slightly lower issue rate, and every way of removing instructions tried on that tile
#   cost as much in issue rate. (So did the 32-bit step loop later: 24 instructions fewer on this
#   tile and the same time; on the 256x128 tile the same cut gave 1%, "The last 1%" above.)

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
# 1. Change `conv2d_implicit` to NHWC input: which loads become contiguous, and what does the offset
#    table look like when c is the fastest index?
# 2. Precompute the column bases too (a table of N·P·Q entries) and drop `column_origin`'s
#    divisions. Measure: does it matter, given that each thread divides only once?
# 3. Add a `Tile(128, 64, 8, 8, 4)` and a `Tile(64, 64, 16, 4, 4)`. Which layer likes which, and why
#    does K = 64 punish a 128-row tile?
# 4. Split-K adds partial sums with atomics, so the output's last bits change from run to run.
#    Write a deterministic version: each slice writes its own partial output, and a second kernel
#    sums them in a fixed order. What does the extra memory traffic cost on the 14x14 layer?
# 5. Sparse convolution (spconv): given the active input sites, build a rulebook of
#    (input index, output index) pairs per filter offset, then gather, GEMM and scatter-add.
#
# ## References
# - S. Chetlur et al., *cuDNN: Efficient Primitives for Deep Learning* (2014) — convolution as GEMM.
# - NVIDIA CUTLASS, *Implicit GEMM Convolution* (docs/implicit_gemm_convolution.md).
# - V. Volkov, *Better Performance at Lower Occupancy* (GTC 2010) — register tiling.
# - Y. Yan et al., *SECOND: Sparsely Embedded Convolutional Detection* (2018) and spconv — rulebooks.
