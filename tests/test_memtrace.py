"""The memory trace (workbook.memtrace): sectors per request and shared-memory bank conflicts counted
from the accesses the simulator sees, on kernels whose figures are known by hand."""

import workbook  # first: applies WORKBOOK_DEVICE before numba.cuda is imported

import numpy as np
import pytest
from numba import cuda

from workbook import memtrace
from workbook.memory import load4

pytestmark = pytest.mark.skipif(workbook.ON_GPU, reason="the trace runs in the simulator (on a GPU: Nsight Compute)")


@cuda.jit
def copy(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i]


@cuda.jit
def gather_strided(x, out, stride):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = x[i * stride]


@cuda.jit
def sum_quads(x, out):
    i = cuda.grid(1)
    if 4 * i < x.size:
        q = load4(x, 4 * i)
        out[i] = q[0] + q[1] + q[2] + q[3]


@cuda.jit
def transpose(x, out):
    tile = cuda.shared.array((32, 32), np.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = x[ty, tx]
    cuda.syncthreads()
    out[ty, tx] = tile[tx, ty]  # a column of the tile: 32 words in one bank


@cuda.jit
def transpose_padded(x, out):
    tile = cuda.shared.array((32, 33), np.float32)  # one spare column: a column spans all 32 banks
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = x[ty, tx]
    cuda.syncthreads()
    out[ty, tx] = tile[tx, ty]


@cuda.jit
def shared_doubles(x, out, spread):
    s = cuda.shared.array(64, np.float64)
    lane = cuda.threadIdx.x
    s[lane * spread] = x[lane]
    cuda.syncthreads()
    out[lane] = s[lane * spread] + s[0]  # s[0]: one word for every lane (a broadcast)


def _totals(t, kernel, what):
    return t.kernels()[kernel][what]


def test_a_coalesced_copy_moves_4_sectors_per_request_and_nothing_more():
    x = np.arange(1000, dtype=np.float32)
    with memtrace.trace() as t:
        copy[4, 256](x, np.zeros_like(x))
    for what in ("global ld", "global st"):
        totals = _totals(t, "copy", what)
        assert totals.requests == 32  # 1000 elements: 31 full warps and one of 8 lanes (warps past n do nothing)
        assert totals.sectors == 125 and totals.efficiency == 1.0
    assert t.launches["copy"] == 1


@pytest.mark.parametrize("stride, sectors", [(1, 4), (2, 8), (8, 32), (32, 32)])
def test_a_strided_gather_moves_a_sector_per_lane_once_the_stride_passes_8_floats(stride, sectors):
    x = np.arange(64 * 32, dtype=np.float32)
    with memtrace.trace() as t:
        gather_strided[1, 64](x, np.zeros(64, np.float32), stride)
    loads = _totals(t, "gather_strided", "global ld")
    assert loads.requests == 2 and loads.sectors_per_request == sectors
    assert loads.requested == 256 and loads.moved == 2 * 32 * sectors


def test_a_16_byte_load_is_one_request_of_16_sectors():
    x = np.arange(4096, dtype=np.float32)
    with memtrace.trace() as t:
        sum_quads[4, 256](x, np.zeros(1024, np.float32))
    loads = _totals(t, "sum_quads", "global ld")
    assert loads.requests == 32 and loads.sectors_per_request == 16 and loads.efficiency == 1.0


def test_a_tile_read_by_columns_has_31_bank_conflicts_per_request_and_none_once_padded():
    x = np.arange(1024, dtype=np.float32).reshape(32, 32)
    with memtrace.trace() as t:
        transpose[1, (32, 32)](x, np.zeros_like(x))
        transpose_padded[1, (32, 32)](x, np.zeros_like(x))
    assert _totals(t, "transpose", "shared st").conflicts == 0
    reads = _totals(t, "transpose", "shared ld")
    assert reads.requests == 32 and reads.conflicts == 32 * 31
    assert _totals(t, "transpose_padded", "shared ld").conflicts == 0
    by_line = {(space_op[3], space_op[4]): totals for space_op, totals in t.lines("transpose").items()}
    assert by_line[("shared", "ld")].conflicts == 32 * 31


@pytest.mark.parametrize("spread, conflicts", [(1, 0), (2, 1)])
def test_8_byte_shared_accesses_are_served_half_a_warp_at_a_time(spread, conflicts):
    # float64 s[lane]: 16 lanes x 8 bytes fill the 32 banks once, so 2 passes, the fewest possible.
    # s[2 * lane]: each half warp needs 2 passes: 2 more than the fewest per request.
    x = np.arange(32, dtype=np.float64)
    with memtrace.trace() as t:
        shared_doubles[1, 32](x, np.zeros_like(x), spread)
    stores = _totals(t, "shared_doubles", "shared st")
    assert stores.requests == 1 and stores.passes == 2 + 2 * conflicts and stores.conflicts == 2 * conflicts
    loads = _totals(t, "shared_doubles", "shared ld")  # s[lane * spread] and the broadcast s[0]
    assert loads.requests == 2 and loads.conflicts == 2 * conflicts


def test_per_thread_counts_and_the_source_view():
    x = np.arange(40, dtype=np.float32)
    with memtrace.trace() as t:
        copy[2, 32](x, np.zeros_like(x))
    counts = t.per_thread("copy")
    assert counts[((1, 0, 0), (7, 0, 0))] == {"global ld": 1, "global st": 1}
    assert ((1, 0, 0), (8, 0, 0)) not in counts  # past the end: no access
    console = workbook.tables.console(record=True)
    t.show(console)
    text = console.export_text()
    assert "test_memtrace.py:" in text and "sectors/req" in text


def test_no_trace_no_wrapper(monkeypatch):
    from workbook.simulator import watch

    monkeypatch.setenv("WORKBOOK_COMPILE", "0")  # the kernel below appends to a Python list: simulator only

    assert not watch.active()
    seen = []

    @cuda.jit
    def kind_of_shared(out):
        s = cuda.shared.array(4, np.float32)
        s[0] = 1.0
        if cuda.threadIdx.x == 0:
            seen.append(type(s).__name__)
        out[0] = s[0]

    kind_of_shared[1, 1](np.zeros(1, np.float32))
    with memtrace.trace():
        kind_of_shared[1, 1](np.zeros(1, np.float32))
    assert seen == ["ndarray", "SharedArray"]


@cuda.jit
def even_lanes_double(x, out):
    i = cuda.grid(1)
    if i < x.size:
        if cuda.threadIdx.x % 2 == 0:
            out[i] = x[i] * 2
        else:
            out[i] = x[i]


def test_divergence_names_the_lines_some_lanes_of_a_warp_skipped():
    from pathlib import Path

    x = np.arange(40, dtype=np.float32)
    with memtrace.trace(lines=True) as t:
        even_lanes_double[2, 32](x, np.zeros_like(x))
    split = {Path(__file__).read_text().splitlines()[line - 1].strip(): warps
             for (_, _, line), warps in t.divergence("even_lanes_double").items()}
    assert split["if cuda.threadIdx.x % 2 == 0:"] == [((1, 0, 0), 0, 8, 32)]  # past n=40: 24 lanes stop
    assert split["out[i] = x[i] * 2"] == [((0, 0, 0), 0, 16, 32), ((1, 0, 0), 0, 4, 32)]
    assert "i = cuda.grid(1)" not in split
    with memtrace.trace() as plain, pytest.raises(RuntimeError, match="lines=True"):
        plain.divergence()
