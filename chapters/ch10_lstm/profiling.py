"""Chapter 10's profiling section: one forward of the fused LSTM, launched call by call and
replayed as one CUDA graph (chapter 07), each recorded as a timeline (workbook.timeline): the
ranges its code opens (`span`), the host's launch calls, the GPU's kernels."""

from workbook import cuda, timeline
from workbook.launch import StepGraph


def timelines(net, x, h0, c0):
    """{"one by one": events, "one CUDA graph": events} of net(x, h0, c0), warmed up first."""
    net(x, h0, c0)
    graph = StepGraph(lambda stream: net(x, h0, c0, stream=stream))
    graph()
    cuda.synchronize()
    return {"one by one": timeline.record(lambda: net(x, h0, c0)), "one CUDA graph": timeline.record(graph)}


def figure(recorded, size):
    """The two timelines, one above the other, each on its own time axis."""
    return timeline.figure(recorded, f"fused LSTM forward, {size}")
