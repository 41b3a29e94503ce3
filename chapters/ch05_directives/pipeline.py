"""Chapter 05's data movement: the directive/explicit/data-region sequences, the row-block pipeline
over streams with pinned memory, and a timeline of what each stream did (from CUDA events).

In numba's simulator streams, events and pinned memory exist but everything runs synchronously
and events carry no time, so the timeline there uses the host clock and shows the work in series.
"""

import time

import numpy as np
from numba import cuda
from numba.cuda.cudadrv import driver  # the simulator has the same two copy functions

from workbook import ON_GPU
from workbook.inputs import require
from workbook.launch import PreparedLaunch, StepGraph, cdiv, stream_handle

from . import kernels as k

# ---------------------------------------------------------------------------------------------
# A sequence of merges, acc <- merge(acc, b), three ways. Per pixel and per step:
#   directive              2 bytes up, 1 down, plus a device allocation for each input and output
#   explicit, host arrays  3 bytes up, 3 down (numba copies back every array argument)
#   data region            2 bytes up and 1 down once for the whole sequence; steps touch only HBM


def merge_sequence_directive(a, b, steps):
    acc = a
    for _ in range(steps):
        acc = k.merge_directive(acc, b)
    return acc


def merge_sequence_on_host_arrays(a, b, steps):
    acc, out = a.copy(), np.empty_like(a)
    for _ in range(steps):
        k.merge_on_host_arrays(acc, b, out)
        acc, out = out, acc
    return acc


def merge_sequence_data_region(a, b, steps):
    a = k.check_image(a, "a", device=False)
    b = k.check_image(b, "b", device=False, like=a)
    d_acc, d_b = cuda.to_device(a), cuda.to_device(b)  # copyin(a, b)
    d_out = cuda.device_array_like(d_acc)  # create(out): never copied
    for _ in range(steps):
        k.merge(d_acc, d_b, d_out)
        d_acc, d_out = d_out, d_acc
    return d_acc.copy_to_host()  # copyout(acc)


def merge_blur_data_region(a, b, variant="2d"):
    """Merge then blur with one copy in, one copy out (pageable host memory): 3 bytes per pixel."""
    a = k.check_image(a, "a", device=False)
    b = k.check_image(b, "b", device=False, like=a)
    d_a, d_b = cuda.to_device(a), cuda.to_device(b)
    merged, out = cuda.device_array_like(d_a), cuda.device_array_like(d_a)
    k.merge_blur(d_a, d_b, merged, out, variant)
    return out.copy_to_host()


# ---------------------------------------------------------------------------------------------
# Timeline marks


class Timeline:
    """Spans of work per stream: CUDA events recorded before and after each operation on its stream.

    An event completes when its stream reaches it, so a span starts when the stream was ready for the
    operation: a copy that waits for a copy engine busy with another stream shows its wait too.
    In the simulator the host clock stands in for events (everything there is synchronous).
    """

    def __init__(self):
        self.spans = []  # (lane, kind, start mark, end mark)
        self.origin = self._mark(0)

    @staticmethod
    def _mark(stream):
        if not ON_GPU:
            return time.perf_counter()
        event = cuda.event()
        event.record(stream)
        return event

    def run(self, lane, kind, stream, operation, /, *args, **kwargs):
        start = self._mark(stream)
        operation(*args, **kwargs)
        self.spans.append((lane, kind, start, self._mark(stream)))

    def intervals(self):
        """[(lane, kind, start ms, end ms)] from the origin; call after the work is synchronised."""
        cuda.synchronize()

        def ms(mark):
            if ON_GPU:
                return cuda.event_elapsed_time(self.origin, mark)
            return (mark - self.origin) * 1e3

        return [(lane, kind, ms(start), ms(end)) for lane, kind, start, end in self.spans]


# ---------------------------------------------------------------------------------------------
# The pipeline
#
#   rows of the image, cut into B blocks; block k goes to stream k % S:
#
#   stream 0:  [up a,b: 0][merge,blur 0][down 0]                [up 3][..]
#   stream 1:             [up a,b: 1   ][merge,blur 1][down 1]
#   stream 2:                          [up a,b: 2    ][merge..][down 2]
#
# While block k is copied up, block k-1 is computed and block k-2 copied down: with one copy engine
# per direction, the time tends to max(bytes up / H2D rate, bytes down / D2H rate) instead of their
# sum. Block k's blur needs one merged row of block k-1 and one of block k+1, so each block copies
# up one row of halo above and below (2 rows of 2 images per block: 0.4% extra at 512-row blocks).
# Host memory must be pinned: a copy from pageable memory is staged through a driver buffer by the
# CPU and cannot overlap anything.


class Pipeline:
    """Merge + blur of an image in row blocks over streams. Buffers and views are made once, here;
    run() only issues copies and launches."""

    def __init__(self, height, width, blocks, streams, variant="2d"):
        if variant not in k.BLUR_KERNELS:
            raise ValueError(f"variant must be one of {sorted(k.BLUR_KERNELS)}, not {variant!r}")
        for name, value in (("height", height), ("width", width), ("blocks", blocks), ("streams", streams)):
            if not isinstance(value, (int, np.integer)) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        if blocks > height:
            raise ValueError(f"cannot cut {height} rows into {blocks} blocks")
        self.shape, self.variant = (height, width), variant
        block_rows = cdiv(height, blocks)
        streams = min(streams, blocks)
        self.streams = [cuda.stream() for _ in range(streams)]
        # Per stream, reused by every block of that stream (work in one stream runs in order).
        # a and b are the two planes of one buffer, so that one 2-D copy can fill both (run()).
        buffers = [{"ab": cuda.device_array((2, block_rows + 2, width), np.uint8),
                    "merged": cuda.device_array((block_rows + 2, width), np.uint8),
                    "out": cuda.device_array((block_rows, width), np.uint8)} for _ in self.streams]
        for buffer in buffers:
            buffer["a"], buffer["b"] = buffer["ab"][0], buffer["ab"][1]
        self.blocks = []
        self._max_pitch = cuda.get_current_device().MAX_PITCH if ON_GPU else None  # for run()'s 2-D copies
        for index, r0 in enumerate(range(0, height, block_rows)):
            r1 = min(r0 + block_rows, height)
            s0, s1 = max(r0 - 1, 0), min(r1 + 1, height)  # rows to copy up: the block and its halo
            buffer, n = buffers[index % streams], (s1 - s0) * width
            stream = self.streams[index % streams]
            self.blocks.append({
                "stream": stream, "lane": index % streams, "rows": (r0, r1), "halo_rows": (s0, s1),
                "a": buffer["a"][: s1 - s0], "b": buffer["b"][: s1 - s0],
                "merged": buffer["merged"][: s1 - s0], "out": buffer["out"][: r1 - r0],
                "a_flat": buffer["a"].reshape(buffer["a"].size)[:n], "b_flat": buffer["b"].reshape(buffer["b"].size)[:n],
                "merged_flat": buffer["merged"].reshape(buffer["merged"].size)[:n],
                "out_flat": buffer["out"].reshape(buffer["out"].size)[: (r1 - r0) * width],
                # byte ranges of the flattened host images: what goes up, what comes down
                "up": (s0 * width, s1 * width), "down": (r0 * width, r1 * width),
            })
            # Each block's two launches, prepared once: checked, typed and packed here, so that
            # run() pays the driver's ~8 us per launch instead of numba's ~40 (chapter 07); at 64
            # blocks, 128 launches from Python would otherwise take longer than the GPU's work.
            block = self.blocks[-1]
            if ON_GPU:  # the addresses the copies use, and the stream as the driver knows it
                block["handle"] = stream_handle(stream)
                for name in ("a", "b", "out"):
                    block[f"{name}_ptr"] = block[f"{name}_flat"].__cuda_array_interface__["data"][0]
                # rows s0..s1 of both images in one copy, when they are planes of one host array
                block["pair_copy"] = _pair_copy(block["a_ptr"], block["b_ptr"] - block["a_ptr"], n)
            block["merge"] = PreparedLaunch(k.merge_kernel, k.merge_blocks(n), k.THREADS_PER_BLOCK,
                                            block["a_flat"], block["b_flat"], block["merged_flat"], stream=stream)
            block["blur"] = PreparedLaunch(k.BLUR_KERNELS[variant], k.blur_grid(r1 - r0, width, variant == "tile"),
                                           (k.BLOCK_X, k.BLOCK_Y), block["merged"], block["out"], s0, r0,
                                           stream=stream)

    def run(self, a, b, out, timeline=None):
        """out <- blur(merge(a, b)); a, b, out host arrays (pinned for overlap). Returns out."""
        a, b, out = self._check(a, b, out)
        self._issue(a, b, out, timeline)
        for stream in self.streams:
            stream.synchronize()
        return out

    def graph(self, a, b, out):
        """The whole pipeline for these host arrays, captured once as a CUDA graph: calling the
        result replays every block's copies and kernels, all streams, in one cuGraphLaunch, and
        returns out. The graph holds the arrays' addresses: new arrays need a new graph."""
        return CapturedPipeline(self, *self._check(a, b, out))

    def _check(self, a, b, out):
        return (require(a, "a", dtype=np.uint8, shape=self.shape, device=False),
                require(b, "b", dtype=np.uint8, shape=self.shape, device=False),
                require(out, "out", dtype=np.uint8, shape=self.shape, device=False))

    def _issue(self, a, b, out, timeline=None):
        """Queue every block's copies and kernels on its stream; no synchronisation (a graph
        captures exactly this)."""

        def step(operation, *args, _kind, **kwargs):
            if timeline is None:
                operation(*args, **kwargs)
            else:
                timeline.run(lane, _kind, stream, operation, *args, **kwargs)

        # The copies skip DeviceNDArray.copy_to_device, which re-checks shapes and builds array views
        # at every call (~100 us from Python on the H100 host): with 4-5 calls per block the host,
        # not the bus, would set the pace. On a GPU they are cuMemcpy*Async calls on addresses
        # computed once (a few us each); in the simulator, numba's driver functions on the views.
        # The shapes were checked above and in __init__.
        a_flat, b_flat, out_flat = a.reshape(a.size), b.reshape(b.size), out.reshape(out.size)
        if ON_GPU:
            up, down = _copy_up, _copy_down
            a_src, b_src, out_dst = (array.ctypes.data for array in (a_flat, b_flat, out_flat))
            # The bus charges ~3 us per copy on top of the bytes (measured: 128 MiB up in 128 copies
            # takes 0.36 ms longer than in one). When a and b are the two planes of one host array
            # (pinned_pair), b sits a fixed distance after a, and one 2-D copy (2 rows of a block's
            # bytes, that distance apart) moves both: one copy per block instead of two.
            # (Same base: one allocation. The distance must not overlap a row, nor pass the largest
            # pitch the driver takes, asked once in __init__.)
            pitch = b_src - a_src if a.base is not None and a.base is b.base else 0
            pitch = pitch if a.nbytes <= pitch <= self._max_pitch else None
        for block in self.blocks:
            stream, lane = block["stream"], block["lane"]
            (up0, up1), (down0, down1) = block["up"], block["down"]
            # 2 bytes per pixel (plus halo rows) up
            if ON_GPU and pitch:
                step(_copy_up_pair, block["pair_copy"], a_src + up0, pitch, block["handle"], _kind="copy up")
            elif ON_GPU:
                step(up, block["a_ptr"], a_src + up0, up1 - up0, block["handle"], _kind="copy up")
                step(up, block["b_ptr"], b_src + up0, up1 - up0, block["handle"], _kind="copy up")
            else:
                step(driver.host_to_device, block["a_flat"], a_flat[up0:up1], up1 - up0, stream=stream,
                     _kind="copy up")
                step(driver.host_to_device, block["b_flat"], b_flat[up0:up1], up1 - up0, stream=stream,
                     _kind="copy up")
            # merge: 2 bytes read, 1 written per pixel; blur: ~1 read, 1 written (HBM, not the bus)
            step(block["merge"], _kind="kernel")
            step(block["blur"], _kind="kernel")
            # 1 byte per pixel down
            if ON_GPU:
                step(down, out_dst + down0, block["out_ptr"], down1 - down0, block["handle"], _kind="copy down")
            else:
                step(driver.device_to_host, out_flat[down0:down1], block["out_flat"], down1 - down0,
                     stream=stream, _kind="copy down")


class CapturedPipeline:
    """A Pipeline's run for one set of host arrays as one CUDA graph (chapter 07's StepGraph).

    A capture records the work queued on one stream; the pipeline's streams join it the way CUDA's
    programming guide describes (fork: they wait for an event recorded on the capturing stream;
    join: the capturing stream waits for an event recorded on each of them), so the graph keeps
    their independence: copies of one block overlap kernels of another, as in run(). Replayed, the
    host pays one cuGraphLaunch instead of four or five calls per block. In the simulator the step
    runs its calls one by one (`.how` says so).
    """

    def __init__(self, pipeline, a, b, out):
        for name, array in (("a", a), ("b", b), ("out", out)):
            # The driver captures a copy from pageable memory without complaint, but a graph's copy
            # node is a DMA transfer: only page-locked memory is safe to replay.
            if not _is_pinned(array):
                raise ValueError(f"{name} is pageable host memory: a captured pipeline copies from and to "
                                 "pinned memory only (cuda.pinned_array, or pinned_copy(array))")
        self.out, self._host_arrays = out, (a, b, out)  # the graph copies from/to these addresses
        # events for ordering only (the simulator's take no arguments)
        fork, *joins = [cuda.event(timing=False) if ON_GPU else cuda.event()
                        for _ in range(1 + len(pipeline.streams))]

        def step(stream):
            fork.record(stream)
            for other in pipeline.streams:
                fork.wait(other)
            pipeline._issue(a, b, out)
            for other, join in zip(pipeline.streams, joins):
                join.record(other)
                join.wait(stream)

        self._graph = StepGraph(step)
        self.how = self._graph.how

    def __call__(self):
        self._graph()
        self._graph.stream.synchronize()
        return self.out


def _is_pinned(array):
    """Is this host array page-locked? Asks the driver (True in the simulator, which has no DMA)."""
    if not ON_GPU:
        return True
    from cuda.bindings import driver as cu

    error, kind = cu.cuPointerGetAttribute(cu.CUpointer_attribute.CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
                                           array.ctypes.data)
    return int(error) == 0 and kind == cu.CUmemorytype.CU_MEMORYTYPE_HOST


def _copy_up(device, host, nbytes, stream):
    from cuda.bindings import driver as cu

    error, = cu.cuMemcpyHtoDAsync(device, host, nbytes, stream)
    if error:
        raise RuntimeError(f"cuMemcpyHtoDAsync failed: {error!r}")


def _copy_down(host, device, nbytes, stream):
    from cuda.bindings import driver as cu

    error, = cu.cuMemcpyDtoHAsync(host, device, nbytes, stream)
    if error:
        raise RuntimeError(f"cuMemcpyDtoHAsync failed: {error!r}")


def _pair_copy(device, device_pitch, nbytes):
    """The driver's description of a 2-D copy of `nbytes` from each of two host planes to two
    device planes `device_pitch` bytes apart; the host side is filled in per run (_copy_up_pair).
    Built once per block: making one costs the host ~30 us, filling two of its fields ~1."""
    from cuda.bindings import driver as cu

    copy = cu.CUDA_MEMCPY2D()
    copy.srcMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_HOST
    copy.dstMemoryType = cu.CUmemorytype.CU_MEMORYTYPE_DEVICE
    copy.dstDevice, copy.dstPitch = device, device_pitch
    copy.WidthInBytes, copy.Height = nbytes, 2
    return copy


def _copy_up_pair(copy, host, host_pitch, stream):
    from cuda.bindings import driver as cu

    copy.srcHost, copy.srcPitch = host, host_pitch
    error, = cu.cuMemcpy2DAsync(copy, stream)
    if error:
        raise RuntimeError(f"cuMemcpy2DAsync failed: {error!r}")


def pinned_pair(a, b):
    """Page-locked copies of two images of one shape as the two planes of one (2, H, W) array,
    returned as (a, b): a Pipeline then moves a block of both images with one copy instead of two."""
    a = require(a, "a", dtype=np.uint8, ndim=2, device=False)
    b = require(b, "b", dtype=np.uint8, shape=a.shape, device=False)
    pair = cuda.pinned_array((2, *a.shape), dtype=np.uint8)
    pair[0], pair[1] = a, b
    return pair[0], pair[1]


def pinned_copy(array):
    """A page-locked copy of a host array: what lets a copy run while the GPU computes."""
    pinned = cuda.pinned_array(array.shape, dtype=array.dtype)
    pinned[...] = array
    return pinned


# ---------------------------------------------------------------------------------------------
# The timeline plot


COLOURS = {"copy up": "tab:blue", "kernel": "tab:green", "copy down": "tab:orange"}


def draw_timelines(timelines, title=""):
    """{panel title: [(lane, kind, start ms, end ms)]} -> a matplotlib figure, one panel each."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    lanes_total = sum(1 + max(lane for lane, *_ in spans) for spans in timelines.values())
    figure, axes = plt.subplots(len(timelines), 1, figsize=(9, 1.5 + 0.5 * lanes_total), sharex=True,
                                squeeze=False)
    for axis, (name, spans) in zip(axes[:, 0], timelines.items()):
        lanes = 1 + max(lane for lane, *_ in spans)
        for lane, kind, start, end in spans:
            axis.broken_barh([(start, max(end - start, 1e-3))], (lane - 0.4, 0.8), color=COLOURS[kind],
                             edgecolor="black", linewidth=0.3)
        end_ms = max(end for *_, end in spans)
        axis.set_yticks(range(lanes), [f"stream {lane}" for lane in range(lanes)])
        axis.set_ylim(lanes - 0.5, -0.5)
        axis.set_title(f"{name}: {end_ms:.3g} ms", fontsize=10)
        axis.grid(True, axis="x", alpha=0.3)
    axes[-1, 0].set_xlabel("ms since the first copy was issued")
    axes[0, 0].legend(handles=[Patch(color=c, label=kind) for kind, c in COLOURS.items()],
                      loc="upper right", fontsize=8)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    return figure


# ---------------------------------------------------------------------------------------------
# What one call from Python costs the host


def split_copy_ms(nbytes, pieces, repeats=7):
    """{pieces: GPU ms} to copy nbytes of pinned host memory up in that many equal copies, back to
    back on the default stream (bench.time_interleaved: CUDA events, median of `repeats`): what the
    bus charges per copy beyond its bytes. Meaningless in the simulator (None there)."""
    if not ON_GPU:
        return {count: None for count in pieces}
    from workbook import bench

    host, device = cuda.pinned_array(nbytes, np.uint8), cuda.device_array(nbytes, np.uint8)
    source, target = host.ctypes.data, device.__cuda_array_interface__["data"][0]
    default_stream = stream_handle(0)

    def copies(count):
        size = nbytes // count
        return lambda: [_copy_up(target + i * size, source + i * size, size, default_stream) for i in range(count)]

    times = bench.time_interleaved({count: copies(count) for count in pieces}, repeats=repeats)
    return {count: float(np.median(ms)) for count, ms in times.items()}


def host_cost_us(width, calls):
    """Microseconds of host time per call, for each kind of call a pipeline block makes (on a
    1-row block, so the GPU work itself is negligible and asynchronous). Meaningless in the simulator."""
    stream = cuda.stream()
    p_row = cuda.pinned_array((1, width), np.uint8)
    p_row[...] = 1
    d_row, d_out = cuda.to_device(p_row, stream=stream), cuda.device_array((1, width), np.uint8)
    d_flat, p_flat = d_row.reshape(width), p_row.reshape(width)
    merge_blocks = k.merge_blocks(width)
    blur_grid = k.blur_grid(1, width, False)
    candidates = {
        "DeviceNDArray.copy_to_device, 1 row": lambda: d_row.copy_to_device(p_row, stream=stream),
        "driver.host_to_device, 1 row": lambda: driver.host_to_device(d_flat, p_flat, width, stream=stream),
        "DeviceNDArray.copy_to_host, 1 row": lambda: d_row.copy_to_host(p_row, stream=stream),
        "driver.device_to_host, 1 row": lambda: driver.device_to_host(p_flat, d_flat, width, stream=stream),
        "merge kernel launch, 3 arrays": lambda: k.merge_kernel[merge_blocks, k.THREADS_PER_BLOCK, stream](
            d_flat, d_flat, d_flat),
        "blur kernel launch, 2 arrays": lambda: k.blur_2d_kernel[blur_grid, (k.BLOCK_X, k.BLOCK_Y), stream](
            d_row, d_out, 0, 0),
    }
    costs = {}
    for name, call in candidates.items():
        call()  # compile, first-call costs
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            call()
        costs[name] = (time.perf_counter() - start) / calls * 1e6
        stream.synchronize()
    return costs
