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


def in_flight(record, device, *, others=()):
    """Chapter 00's Little's-law plot: the fraction of the copy ceiling a copy reaches against the
    KB it keeps in flight per SM, and a vertical line where ceiling x latency says the SMs have
    enough. record: the chapter's "bytes in flight" record; others: (device name, record-like dict
    with ceiling_gbps, sms and, where measured there, latency_ns) for other GPUs' lines."""
    figure, axes = plt.subplots(figsize=(7, 4))
    axes.plot(record["kb_per_sm"], record["fraction_of_ceiling"], marker="o", label=f"{device}: copy")
    axes.axvline(record["needed_kb_per_sm"], linestyle="--", color="tab:blue",
                 label=f"{device}: ceiling x latency ({record['needed_kb_per_sm']:.0f} KB)")
    for index, (name, other) in enumerate(others):
        latency = other.get("latency_ns") or record["latency_ns"]
        whose = "its" if other.get("latency_ns") else "this GPU's"
        needed = other["ceiling_gbps"] * latency / other["sms"] / 1024
        axes.axvline(needed, linestyle=":", color=f"C{index + 1}",
                     label=f"{name}: its ceiling x {whose} latency ({needed:.0f} KB)")
    axes.set_xlabel("KB in flight per SM")
    axes.set_ylabel("fraction of the copy ceiling")
    axes.set_ylim(0, 1.1)
    axes.set_title("Little's law: bytes in flight against bandwidth")
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    return figure
