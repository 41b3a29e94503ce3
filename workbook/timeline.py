"""A step's timeline: named ranges around its phases, what the host launched, what the GPU ran.

    with timeline.span("input GEMM"):     # an NVTX range (the optional `nvtx` package) and, while
        ...                               # a recording runs, a torch profiler range too
    events = timeline.record(step, calls=2)   # [{"row", "kind", "name", "start_us", "us"}, ...]
    figure = timeline.plot(events, "title")   # a row per stream and for the host, against time

`record` runs `step()` under torch's profiler, which collects the GPU's activity through CUPTI:
every kernel of the process (numba's too), the driver and runtime calls that launched them, and the
ranges. Nsight Systems would show the same; the reference GPU machine has no Nsight Systems and no
`nvtx`, but it has torch. Without torch (or a GPU), `record` still times the ranges on the host
clock, and the plot shows only those: a laptop sees the phases, not the kernels.
"""

import contextlib
import json
import os
import tempfile
import time

from .bench import optional_torch

_recording = None  # while record() runs: ("torch", record_function) or ("host", [events]), else None

try:  # an optional dependency: NVTX ranges for Nsight Systems, where it is installed
    import nvtx as _nvtx
except ImportError:
    _nvtx = None


@contextlib.contextmanager
def span(name):
    """A named range around a phase of a step. Costs nothing measurable outside a recording
    without `nvtx`; with it, Nsight Systems shows the range."""
    if _nvtx is not None:
        _nvtx.push_range(name)
    recording = _recording
    start = time.perf_counter()
    try:
        if recording is not None and recording[0] == "torch":
            with recording[1](name):
                yield
        else:
            yield
    finally:
        if recording is not None and recording[0] == "host":
            recording[1].append({"row": "ranges (host)", "kind": "range", "name": name,
                                 "start_us": start * 1e6, "us": (time.perf_counter() - start) * 1e6})
        if _nvtx is not None:
            _nvtx.pop_range()


def record(step, calls=1):
    """The timeline of `calls` calls of step(): GPU kernels by stream, the host's launch calls and
    the ranges (torch's profiler), or only the ranges on the host's clock where torch is absent."""
    global _recording
    torch = optional_torch()
    if torch is None:
        events = []
        _recording = ("host", events)
        try:
            for _ in range(calls):
                step()
        finally:
            _recording = None
        return _from_zero(events)
    from torch.profiler import ProfilerActivity, profile, record_function

    torch.cuda.synchronize()
    _recording = ("torch", record_function)
    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            for _ in range(calls):
                step()
            torch.cuda.synchronize()
    finally:
        _recording = None
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as trace:
            return events_of_trace(json.load(trace))


LAUNCHES = ("LaunchKernel", "GraphLaunch", "Memcpy", "Memset")  # host calls that put work on the GPU


def events_of_trace(trace):
    """The events of a Chrome trace (torch's export) that a step's timeline shows, in microseconds
    from the first one: kernels, copies and GPU ranges by stream; the host's launch calls; the
    ranges opened on the host."""
    events = []
    for event in trace.get("traceEvents", trace if isinstance(trace, list) else []):
        if event.get("ph") != "X" or "dur" not in event:
            continue
        category, name, args = event.get("cat", ""), event.get("name", ""), event.get("args", {})
        if category in ("kernel", "gpu_memcpy", "gpu_memset", "gpu_user_annotation"):
            kind = "range" if category == "gpu_user_annotation" else "kernel" if category == "kernel" else "copy"
            row = f"GPU stream {args.get('stream', event.get('tid'))}"
        elif category in ("cuda_runtime", "cuda_driver") and any(word in name for word in LAUNCHES):
            kind, row = "launch", "launches (host)"
        elif category == "user_annotation":
            kind, row = "range", "ranges (host)"
        else:
            continue
        events.append({"row": row, "kind": kind, "name": name, "start_us": float(event["ts"]),
                       "us": float(event["dur"])})
    return _from_zero(events)


def _from_zero(events):
    if not events:
        return []
    first = min(e["start_us"] for e in events)
    return sorted(({**e, "start_us": e["start_us"] - first} for e in events), key=lambda e: e["start_us"])


def summary(events):
    """{row: (busy us, events)} and the span of the whole timeline: how much of it each row's
    kernels, copies and launches filled (its ranges are not work: they are left out)."""
    rows = {}
    for e in events:
        if e["kind"] == "range" and not e["row"].startswith("ranges"):
            continue
        busy, count = rows.get(e["row"], (0.0, 0))
        rows[e["row"]] = (busy + e["us"], count + 1)
    end = max((e["start_us"] + e["us"] for e in events), default=0.0)
    return rows, end


COLOURS = {"kernel": "tab:blue", "copy": "tab:green", "launch": "tab:orange", "range": "tab:gray"}


def plot(events, title="", axis=None):
    """A row per GPU stream, one for the host's launches and one for the ranges, against time."""
    import matplotlib.pyplot as plt

    if axis is None:
        figure, axis = plt.subplots(figsize=(11, 2.6))
    else:
        figure = axis.figure
    rows = sorted({e["row"] for e in events}, key=lambda r: (not r.startswith("ranges"), not r.startswith("launches"), r))
    for y, row in enumerate(rows):
        for kind in COLOURS:
            spans = [(e["start_us"], max(e["us"], 0.3)) for e in events if e["row"] == row and e["kind"] == kind]
            if spans:
                axis.broken_barh(spans, (y - 0.35, 0.7), color=COLOURS[kind], alpha=0.85 if kind != "range" else 0.35)
        if row.startswith("ranges"):  # name the ranges where there is room
            for e in events:
                if e["row"] == row and e["us"] > 0.04 * max(1.0, summary(events)[1]):
                    axis.text(e["start_us"] + e["us"] / 2, y, e["name"], ha="center", va="center", fontsize=7)
    axis.set_yticks(range(len(rows)), rows)
    axis.set(xlabel="microseconds", title=title)
    axis.invert_yaxis()
    axis.grid(axis="x", alpha=0.3)
    from matplotlib.patches import Patch

    kinds = [kind for kind in COLOURS if any(e["kind"] == kind for e in events)]
    if kinds:  # what each colour is, for the kinds drawn
        axis.legend(handles=[Patch(color=COLOURS[kind], alpha=0.85 if kind != "range" else 0.35, label=LABELS[kind])
                             for kind in kinds], loc="upper right", fontsize=7, framealpha=0.8)
    return figure


LABELS = {"kernel": "kernel (GPU)", "copy": "copy (GPU)", "launch": "launch call (host)", "range": "named range (host)"}


def figure(recorded, title):
    """{name: events} -> one timeline per recording, one above the other, each on its own time axis
    (a step launched call by call above the same step as one CUDA graph, say)."""
    import matplotlib.pyplot as plt

    drawn, axes = plt.subplots(len(recorded), 1, figsize=(11, 2.75 * len(recorded)), squeeze=False)
    for axis, (name, events) in zip(axes[:, 0], recorded.items()):
        plot(events, f"{title}: {name}", axis=axis)
    drawn.tight_layout()
    return drawn
