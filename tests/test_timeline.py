"""workbook.timeline: the events a step's timeline keeps from a Chrome trace (torch's profiler
export), the ranges timed on the host where there is no profiler, and the plot of both."""

import workbook  # noqa: F401  (selects the GPU or the simulator first)
from workbook import timeline

TRACE = {"traceEvents": [
    {"ph": "X", "cat": "user_annotation", "name": "step 0", "ts": 1000.0, "dur": 50.0, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 1005.0, "dur": 8.0, "pid": 1, "tid": 1},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "ts": 1060.0, "dur": 3.0},
    {"ph": "X", "cat": "kernel", "name": "gemm_kernel", "ts": 1015.0, "dur": 4.5, "args": {"stream": 7}},
    {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "ts": 1030.0, "dur": 1.0, "args": {"stream": 7}},
    {"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": 1001.0, "dur": 1.0},
    {"ph": "i", "cat": "kernel", "name": "instant", "ts": 1002.0},
]}


def test_a_trace_keeps_kernels_launches_and_ranges_from_the_first_event():
    events = timeline.events_of_trace(TRACE)
    assert [(e["row"], e["kind"], e["name"], e["start_us"], e["us"]) for e in events] == [
        ("ranges (host)", "range", "step 0", 0.0, 50.0),
        ("launches (host)", "launch", "cuLaunchKernel", 5.0, 8.0),
        ("GPU stream 7", "kernel", "gemm_kernel", 15.0, 4.5),
        ("GPU stream 7", "copy", "Memcpy DtoD", 30.0, 1.0)]
    rows, end = timeline.summary(events)
    assert rows["GPU stream 7"] == (5.5, 2) and end == 50.0


def test_without_a_profiler_the_ranges_are_timed_on_the_host():
    if workbook.ON_GPU:
        return  # on a GPU with torch the profiler records them (chapter 10 shows it)

    def step():
        with timeline.span("outer"):
            with timeline.span("inner"):
                pass

    events = timeline.record(step, calls=2)
    assert [e["name"] for e in events] == ["outer", "inner", "outer", "inner"]  # by start time
    assert all(e["row"] == "ranges (host)" and e["us"] >= 0 for e in events) and events[0]["start_us"] == 0
    with timeline.span("outside a recording"):  # nothing recorded, nothing raised
        pass


def test_the_plot_has_a_row_per_stream_and_for_the_host():
    figure = timeline.plot(timeline.events_of_trace(TRACE), "a step")
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["ranges (host)", "launches (host)", "GPU stream 7"]


def test_recordings_are_drawn_one_above_the_other():
    events = timeline.events_of_trace(TRACE)
    drawn = timeline.figure({"one by one": events, "one CUDA graph": events[:1]}, "a step")
    assert [axis.get_title() for axis in drawn.axes] == ["a step: one by one", "a step: one CUDA graph"]
