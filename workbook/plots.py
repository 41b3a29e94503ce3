"""Plots the chapters share. Headless-safe: matplotlib picks a non-GUI backend when there is no display."""

import os

import matplotlib

if not os.environ.get("DISPLAY") and "ipykernel" not in matplotlib.get_backend().lower() and \
        not os.environ.get("MPLBACKEND"):
    matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def sweep(sizes, series, *, ceiling=None, xlabel="elements", ylabel="GB/s", title="", logy=False, axes=None):
    """One line per variant over a size sweep, and the copy ceiling as a dashed line.

    sizes: x values; series: {name: y values}, None where a variant was not run; axes: draw into
    this panel of an existing figure instead of a new one.
    """
    if axes is None:
        figure, axes = plt.subplots(figsize=(7, 4))
    else:
        figure = axes.figure
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


def bars(values, *, xlabel="", title=""):
    """A horizontal bar per entry of {label: value}, the value printed at its end."""
    figure, axes = plt.subplots(figsize=(7, 0.8 + 0.35 * len(values)))
    labels, heights = list(values), list(values.values())
    axes.barh(labels, heights, color="tab:blue")
    for row, value in enumerate(heights):
        axes.text(value, row, f" {value:.1f}", va="center", fontsize=8)
    axes.invert_yaxis()  # the first entry on top
    axes.set_xlabel(xlabel)
    axes.set_title(title)
    axes.grid(True, axis="x", alpha=0.3)
    figure.tight_layout()
    return figure
