"""Plots the chapters share. Headless-safe: matplotlib picks a non-GUI backend when there is no display."""

import os

import matplotlib

if not os.environ.get("DISPLAY") and "ipykernel" not in matplotlib.get_backend().lower() and \
        not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def sweep(sizes, series, *, ceiling=None, xlabel="elements", ylabel="GB/s", title="", logy=False):
    """One line per variant over a size sweep, and the copy ceiling as a dashed line.

    sizes: x values; series: {name: y values}, None where a variant was not run.
    """
    figure, axes = plt.subplots(figsize=(7, 4))
    for name, values in series.items():
        points = [(x, y) for x, y in zip(sizes, values) if y is not None]
        if points:
            axes.plot(*zip(*points), marker="o", label=name)
    if ceiling:
        axes.axhline(ceiling, linestyle="--", color="gray", label=f"copy ceiling ({ceiling:.0f})")
    axes.set_xscale("log", base=2)
    if logy:
        axes.set_yscale("log")
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, alpha=0.3)
    axes.legend()
    return figure
