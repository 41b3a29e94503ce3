"""What chapter 05's notebook measures the bus and the pipeline with, so that the notebook shows
the ladder's code and its figures rather than the plumbing:

    bus_copies           one image up and down, pageable and pinned, and both directions at once
    record_host_costs    what a call from Python costs, stored as a case of its own
    record_copy_split    the bus's cost per copy, stored as a case of its own
    block_sweep          the pipeline at each block count, from Python and as one graph
    against_best         64 blocks against the best count, with the spread of the ratio
    plot_sweep           the sweep beside the bus's serial and overlapped bounds

The cases bound by the bus, not by the GPU's memory, are stored without a copy ceiling.
"""

import numpy as np

from workbook import ON_GPU, cuda, plots

from . import pipeline as p


def without_ceiling(chapter, comparison):
    """These cases are bound by the bus, not by HBM: drop the device-copy ceiling from the record."""
    for timing in comparison.timings:
        timing.ceiling_gbps = None
    comparison.ceiling = None
    chapter.cases[-1].update(ceiling=None, rows=comparison.rows())
    comparison.show()
    if not ON_GPU:
        chapter.show_stored(chapter.cases[-1]["key"])
    return comparison


def bus_copies(chapter, device_image, device_other, image_a, pinned_a, pinned_b, pinned_out):
    """One image copied up and down, from pageable and from pinned memory; then one image up and
    another down at the same time, on two streams. Returns (pinned up GB/s, pinned down GB/s) on a
    GPU, else None."""
    pixels = image_a.size
    pageable_out = np.empty_like(image_a)
    up_stream, down_stream = cuda.stream(), cuda.stream()

    def both_ways():
        device_other.copy_to_device(pinned_b, stream=up_stream)
        device_image.copy_to_host(pinned_out, stream=down_stream)
        up_stream.synchronize()
        down_stream.synchronize()

    one_way = without_ceiling(chapter, chapter.compare(
        "host-device copies",
        {"up, pageable": lambda: device_image.copy_to_device(image_a),
         "up, pinned": lambda: device_image.copy_to_device(pinned_a),
         "down, pageable": lambda: device_image.copy_to_host(pageable_out),
         "down, pinned": lambda: device_image.copy_to_host(pinned_out)},
        bytes=pixels, repeats=20, size=f"{pixels:,} bytes", show=False))
    two_ways = without_ceiling(chapter, chapter.compare(
        "copies both ways at once", {"up and down at once, pinned": both_ways},
        bytes=2 * pixels, repeats=20, size=f"2 x {pixels:,} bytes", show=False))
    if not ON_GPU:
        return None
    up, down = one_way["up, pinned"].gbps, one_way["down, pinned"].gbps
    both = two_ways["up and down at once, pinned"].gbps
    print(f"pinned: up {up:.1f} GB/s, down {down:.1f} GB/s, both at once {both:.1f} GB/s in total "
          f"({both / max(up, down):.2f}x one direction)")
    return up, down


def _row(variant, kind, median_ms, repeats, bytes_=None):
    return {"variant": variant, "kind": kind, "correct": None, "median_ms": median_ms, "p25_ms": None,
            "p75_ms": None, "repeats": repeats, "bytes": bytes_, "flops": None,
            "gbps": bytes_ / median_ms / 1e6 if bytes_ and median_ms else None, "tflops": None,
            "fraction_of_ceiling": None}


def record_host_costs(chapter, host_costs, width):
    """Store {call: host us} (pipeline.host_cost_us) as the case "host cost per call", and print it."""
    chapter.cases.append({"key": "host cost per call", "size": f"1 row of {width} bytes", "ceiling": None,
                          "rows": [_row(name, "kernel", us / 1e3 if ON_GPU else None, 200 if ON_GPU else 1)
                                   for name, us in host_costs.items()]})
    for name, us in host_costs.items():
        print(f"{name:<40} {us:8.1f} us per call" + ("" if ON_GPU else "  (simulator: meaningless)"))


def record_copy_split(chapter, split_ms, total_bytes):
    """Store {copies: ms} (pipeline.split_copy_ms) as the case "bus cost per copy", and print what
    each extra copy adds; in the simulator, print the reference GPU's instead."""
    if not ON_GPU:
        chapter.show_stored("bus cost per copy")
        return
    for count, ms in split_ms.items():
        extra = f"  (+{(ms - split_ms[1]) * 1e3 / (count - 1):.1f} us per extra copy)" if count > 1 else ""
        print(f"{total_bytes >> 20} MiB in {count:3d} copies: {ms:.3f} ms{extra}")
    chapter.cases.append({"key": "bus cost per copy", "size": f"{total_bytes >> 20} MiB up, pinned", "ceiling": None,
                          "rows": [_row(f"{count} copies", "copy", ms, 7, total_bytes)
                                   for count, ms in split_ms.items()]})


def block_sweep(chapter, images, expected, block_counts, streams):
    """The pipeline (2-D blur) at each block count, from Python and replayed as one graph, checked:
    (ms from Python, ms as a graph, the comparisons), a value each per count."""
    pinned_a, pinned_b, pinned_out = images
    height, width = pinned_out.shape
    python_ms, graph_ms, results = [], [], []
    for blocks in block_counts:
        pipeline = p.Pipeline(height, width, blocks, streams, "2d")
        result = chapter.compare(
            f"pipeline sweep, {blocks} blocks",
            {"pipelined": lambda: pipeline.run(pinned_a, pinned_b, pinned_out),
             "pipelined, one graph": pipeline.graph(pinned_a, pinned_b, pinned_out)},
            reference=expected, repeats=10, show=False,
            size=f"{height}x{width} uint8, {blocks} blocks, {min(blocks, streams)} streams")
        python_ms.append(result["pipelined"].median_ms)
        graph_ms.append(result["pipelined, one graph"].median_ms)
        results.append(result)
    return python_ms, graph_ms, results


def against_best(block_counts, results, variant, times):
    """64 blocks / the best count: the ratio of medians, and its spread from their quartiles (the
    two were timed in separate runs of the sweep, so no per-repeat ratio exists)."""
    at_64, best = (results[i][variant] for i in (block_counts.index(64), int(np.argmin(times))))
    (low_64, high_64), (low_best, high_best) = at_64.spread_ms, best.spread_ms
    return at_64.median_ms / best.median_ms, low_64 / high_best, high_64 / low_best


def plot_sweep(block_counts, python_ms, graph_ms, streams, up_ms, down_ms):
    """ms end to end against the block count, with the bus's serial and overlapped bounds."""
    figure = plots.sweep(block_counts, {f"pipelined, {streams} streams": python_ms,
                                        f"pipelined, {streams} streams, one graph": graph_ms},
                         xlabel="row blocks", ylabel="ms, end to end (lower is better)",
                         title="merge + blur of 8192 x 8192, pinned memory")
    axes = figure.axes[0]
    axes.axhline(up_ms + down_ms, linestyle="--", color="tab:red", label="bus bound, serial")
    axes.axhline(max(up_ms, down_ms), linestyle=":", color="tab:green", label="bus bound, overlapped")
    axes.legend()
    return figure
