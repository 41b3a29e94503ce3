import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from chapters.ch04_implicit_gemm import gather
from chapters.ch04_implicit_gemm import kernels as k
from workbook import assert_close, cuda
from workbook.inputs import sm_count

# The chapter's awkward cases (name, x NCHW, w KCRS, stride, padding, dilation), and a large odd one.
CONV_CASES = k.AWKWARD_CASES + [
    ("large odd", workbook.size(gpu=(5, 67, 57, 55), sim=(2, 2, 31, 33)),
     workbook.size(gpu=(131, 67, 3, 3), sim=(5, 2, 3, 3)), 1, 1, 1),
]
CONVS = [k.conv2d_explicit, k.conv2d_implicit]
# (M, KD, NC): 1, 31, 32, 33, 1000, not multiples of any tile, and a large odd one.
GEMM_CASES = [(1, 1, 1), (31, 32, 33), (33, 31, 32), (3, 5, 1000), (17, 1000, 5), (32, 33, 31),
              workbook.size(gpu=(1031, 1000, 2049), sim=(5, 7, 2047))]


def data(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def run_conv(conv, x, w, stride, padding, dilation, tile=None, splits=None):
    g = k.conv_geometry(x.shape, w.shape, stride, padding, dilation)
    out = cuda.to_device(np.full(g.out_shape, 7.0, dtype=np.float32))  # not zeros: every output written
    return conv(cuda.to_device(x), cuda.to_device(w), out, stride=stride, padding=padding,
                dilation=dilation, tile=tile, splits=splits), g


@pytest.mark.parametrize("case", [c for c in CONV_CASES if np.prod(c[1]) * np.prod(c[2]) < 20000],
                         ids=lambda c: c[0])
def test_references_agree(case):
    _, xs, ws, stride, padding, dilation = case
    x, w = data(xs, 1), data(ws, 2)
    np.testing.assert_allclose(k.conv2d_reference(x, w, stride, padding, dilation),
                               k.conv2d_loops(x, w, stride, padding, dilation), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", CONV_CASES, ids=lambda c: c[0])
@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_conv(conv, case):
    _, xs, ws, stride, padding, dilation = case
    x, w = data(xs, 1), data(ws, 2)
    out, g = run_conv(conv, x, w, stride, padding, dilation)
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol,
                 name=conv.__name__)


@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[3]], ids=["3x3: packed table", "5x5: pairs"])
@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_conv_tile_of_one_gathered_row_per_thread(conv, case):
    # 32 threads for an 8-column B tile of 4 rows: each thread gathers one B row a step, its table
    # entries one or two words, read one at a time (no whole 16-byte quad of them).
    _, xs, ws, stride, padding, dilation = case
    x, w = data(xs, 1), data(ws, 2)
    out, g = run_conv(conv, x, w, stride, padding, dilation, tile=k.Tile(16, 8, 4, 2, 2))
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol)


def test_cases_cover_both_table_formats():
    fields = [k.tap_field(k.conv_geometry(xs, ws, stride, padding, dilation))
              for _, xs, ws, stride, padding, dilation in CONV_CASES]
    assert 0 in fields and any(fields)  # (offset, tap) pairs, and packed entries


@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[3]], ids=["3x3: packed table", "5x5: pairs"])
@pytest.mark.parametrize("tile", list(k.TILES)[1:])
@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_conv_every_tile(conv, tile, case):
    # The first tile is tested above; the others on two awkward cases each, one per table format.
    _, xs, ws, stride, padding, dilation = case
    x, w = data(xs, 1), data(ws, 2)
    out, g = run_conv(conv, x, w, stride, padding, dilation, tile=tile)
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", [CONV_CASES[2], CONV_CASES[3], CONV_CASES[9]],
                         ids=["3x3: packed table", "5x5: pairs", "C=K=33"])
@pytest.mark.parametrize("where", ["global memory", "shared, no spare room"])
def test_implicit_table_in_global_or_exactly_sized_shared_memory(monkeypatch, case, where):
    # The default gives a shared table room in steps of 1024 words. Here: a table too large for
    # shared memory (every table, with the limit at 0) is read from global memory; and with steps
    # of one TABLE_ALIGN, the shared copy is exactly as long as the table (a read past its end
    # raises in the simulator).
    if where == "global memory":
        monkeypatch.setattr(gather, "SHARED_TABLE_WORDS", 0)
    else:
        monkeypatch.setattr(gather, "SHARED_TABLE_STEP", k.TABLE_ALIGN)
    _, xs, ws, stride, padding, dilation = case
    x, w = data(xs, 1), data(ws, 2)
    out, g = run_conv(k.conv2d_implicit, x, w, stride, padding, dilation)
    words = k.tap_table(g).size
    assert gather.shared_table_words(words) == (0 if where == "global memory" else words)
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol)


def test_shared_table_words():
    assert k.shared_table_words(32) == k.SHARED_TABLE_STEP
    assert k.shared_table_words(k.SHARED_TABLE_STEP + 32) == 2 * k.SHARED_TABLE_STEP
    assert k.shared_table_words(k.SHARED_TABLE_WORDS) == k.SHARED_TABLE_WORDS
    assert k.shared_table_words(k.SHARED_TABLE_WORDS + 32) == 0  # too large: global memory
    assert k.SHARED_TABLE_WORDS % k.SHARED_TABLE_STEP == 0


@pytest.mark.parametrize("case, splits", [(CONV_CASES[3], 2), (CONV_CASES[8], 8), (CONV_CASES[3], "stream"),
                                          (CONV_CASES[10], "stream")],
                         ids=["K=17 x2", "C=K=33 x8", "K=17 stream-K", "large odd stream-K"])
@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_conv_split_k(conv, case, splits):
    # Depth slices add into the output with atomics: more slices than steps leaves some empty;
    # stream-K's shares cross from one tile into the next.
    _, xs, ws, stride, padding, dilation = case
    x, w = data(xs, 1), data(ws, 2)
    out, g = run_conv(conv, x, w, stride, padding, dilation, splits=splits)
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w, stride, padding, dilation), rtol=rtol, atol=atol)


@pytest.mark.parametrize("splits", [1, 3, "stream"])
@pytest.mark.parametrize("shape", [(31, 130, 33), (1, 1, 1), workbook.size(gpu=(300, 1100, 700), sim=(40, 70, 72))],
                         ids=str)
def test_gemm_split_k(shape, splits):
    m, depth, n = shape
    a, b = data((m, depth), 3), data((depth, n), 4)
    c = cuda.to_device(np.full((m, n), 7.0, dtype=np.float32))
    rtol, atol = k.tolerance(depth)
    assert_close(k.gemm(cuda.to_device(a), cuda.to_device(b), c, splits=splits), k.gemm_reference(a, b),
                 rtol=rtol, atol=atol)


def test_split_count_fills_waves():
    tile = k.Tile(128, 128, 8, 8, 8, min_blocks=2)
    places = sm_count() * 2
    # A GEMM with exactly one wave of tiles is not split; one with a third of a wave is shared out
    # (stream-K); one too shallow to share is not.
    assert k.split_count(tile, 128, 128 * places, 4096) == 1
    assert k.split_count(tile, 128, 128 * max(1, places // 3), 4096) == "stream"
    assert k.split_count(tile, 128, 128, 8) == 1


def test_grid_blocks():
    tile = k.Tile(128, 128, 8, 8, 8, min_blocks=2)
    places = sm_count() * 2
    assert k.grid_blocks(tile, 200, 300, 64, 3) == 2 * 3 * 3  # split-K: 3 blocks per tile
    assert k.grid_blocks(tile, 128, 128 * 4 * places, 4096, "stream") == places  # one per place
    assert k.grid_blocks(tile, 128, 128, 8 * 40, "stream") == 3  # >= 16 depth steps per block


# A wide tile writes 4 adjacent output columns with one 16-byte store (or one vector atomic add
# when blocks share the tile) where P*Q % 4 == 0, else element by element: both, with every way of
# sharing the work.
WIDE_TILE = next(name for name, tile in k.TILES.items() if tile.wide)


@pytest.mark.parametrize("splits", [1, 2, "stream"], ids=str)
@pytest.mark.parametrize("x_shape", [(2, 3, 8, 6), (2, 3, 7, 5)], ids=["PQ % 4 == 0", "PQ odd"])
@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_wide_tile_outputs(conv, x_shape, splits):
    x, w = data(x_shape, 5), data((9, 3, 3, 3), 6)
    out, g = run_conv(conv, x, w, 1, 1, 1, tile=WIDE_TILE, splits=splits)
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w, 1, 1, 1), rtol=rtol, atol=atol)
    assert k.quad_outputs_fit(k.TILES[WIDE_TILE], cuda.device_array(g.out_shape, np.float32), g.P * g.Q) == (
        g.P * g.Q % 4 == 0)


@pytest.mark.parametrize("case", CONV_CASES[:9], ids=lambda c: c[0])
def test_im2col(case):
    _, xs, ws, stride, padding, dilation = case
    x = data(xs, 1)
    g = k.conv_geometry(xs, ws, stride, padding, dilation)
    col = cuda.to_device(np.full((g.gemm_depth, g.gemm_columns), 7.0, dtype=np.float32))
    assert_close(k.im2col(cuda.to_device(x), g, col), k.im2col_reference(x, g), exact=True)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_conv_nan_inf(conv, special):
    # One bad input pixel poisons exactly the outputs whose window covers it (padding zeros do not).
    _, xs, ws, stride, padding, dilation = CONV_CASES[2]
    x, w = data(xs, 1), np.abs(data(ws, 2))  # positive weights: Inf stays Inf, never Inf - Inf
    x[0, 1, 3, 2] = special
    out, g = run_conv(conv, x, w, stride, padding, dilation)
    expected = k.conv2d_reference(x, w, stride, padding, dilation)
    assert not np.isfinite(expected).all()
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, expected, rtol=rtol, atol=atol)


@pytest.mark.parametrize("shape", GEMM_CASES, ids=str)
def test_gemm(shape):
    m, depth, n = shape
    a, b = data((m, depth), 3), data((depth, n), 4)
    c = cuda.to_device(np.full((m, n), 7.0, dtype=np.float32))
    rtol, atol = k.tolerance(depth)
    assert_close(k.gemm(cuda.to_device(a), cuda.to_device(b), c), k.gemm_reference(a, b),
                 rtol=rtol, atol=atol)


@pytest.mark.parametrize("tile", list(k.TILES)[1:])
def test_gemm_every_tile(tile):
    a, b = data((33, 21), 3), data((21, 79), 4)
    c = k.gemm(cuda.to_device(a), cuda.to_device(b), cuda.device_array((33, 79), np.float32), tile=tile)
    assert_close(c, k.gemm_reference(a, b), rtol=1e-4, atol=1e-4)


WIDE_TILES = [name for name, tile in k.TILES.items() if k.tile_takes_quads(tile)]


@pytest.mark.parametrize("tile", WIDE_TILES)
@pytest.mark.parametrize("shape", [(1, 4, 4), (33, 20, 84), (5, 36, 132)], ids=str)
def test_wide_tiles_load_16_bytes_at_the_edges(tile, shape):
    # Rows of whole quads: the tile loaders take load4, with partial tiles at every edge
    m, depth, n = shape
    a, b = data((m, depth), 3), data((depth, n), 4)
    assert k.quads_fit(k.TILES[tile], cuda.to_device(a), cuda.to_device(b))
    c = k.gemm(cuda.to_device(a), cuda.to_device(b), cuda.device_array((m, n), np.float32), tile=tile)
    assert_close(c, k.gemm_reference(a, b), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("tile", WIDE_TILES)
def test_wide_tiles_take_4_byte_loads_on_a_misaligned_view(tile):
    # A view one element into its buffer is not 16-byte aligned: a load4 there would fault
    a, b = data((9, 8), 3), data((8, 12), 4)
    flat = cuda.to_device(np.concatenate([[0], a.reshape(-1)]).astype(np.float32))
    a_view = flat[1:].reshape(9, 8)
    assert not k.quads_fit(k.TILES[tile], a_view, cuda.to_device(b))
    c = k.gemm(a_view, cuda.to_device(b), cuda.device_array((9, 12), np.float32), tile=tile)
    assert_close(c, k.gemm_reference(a, b), rtol=1e-4, atol=1e-4)


def test_offset_table_has_no_division_left():
    # The table plus the column base must give every im2col address: checked against the reference.
    g = k.conv_geometry((2, 3, 5, 6), (4, 3, 3, 2), 2, 1, (1, 2))
    table = k.offset_table(g)
    assert table.shape == (3, g.gemm_depth) and table.dtype == np.int32
    c, r, s = 2, 1, 1
    crs = (c * g.R + r) * g.S + s
    assert tuple(table[:, crs]) == (c * g.H * g.W + r * g.dh * g.W + s * g.dw, r * g.dh, s * g.dw)


@pytest.mark.parametrize("x_shape, filter_, packed", [
    ((1, 3, 16, 17), (3, 2), True),  # 6 taps: offsets up to 2^26
    ((1, 3, 16, 17), (3, 3), True),
    ((1, 3, 2048, 2048), (3, 3), False),  # 3x3 leaves 23 bits; this image's offsets need 24
    ((1, 3, 16, 17), (4, 8), False),  # 32 taps leave no room for an offset
    ((1, 3, 16, 17), (7, 7), False),
])
def test_tap_table(x_shape, filter_, packed):
    g = k.conv_geometry(x_shape, (2, x_shape[1], *filter_), 1, 1, (2, 1))
    table = k.tap_table(g)
    offsets = k.offset_table(g)[0].astype(np.uint64)
    taps = np.tile(np.arange(g.R * g.S, dtype=np.uint64), g.C)  # rows are c-major: (c, r, s)
    assert table.dtype == np.uint32 and len(table) % k.TABLE_ALIGN == 0 and len(table) >= g.gemm_depth
    assert k.tap_field(g) == (g.R * g.S if packed else 0)
    if packed:  # offset << R*S | the row's bit; padding rows 0: never on the image
        assert table.ndim == 1 and offsets.max() < 2 ** (32 - g.R * g.S)
        np.testing.assert_array_equal(table[: g.gemm_depth] >> (g.R * g.S), offsets)
        np.testing.assert_array_equal(table[: g.gemm_depth] & ((1 << g.R * g.S) - 1), np.uint64(1) << taps)
        assert (table[g.gemm_depth:] == 0).all()
    else:  # (offset, tap); padding rows tap 63, a bit no mask sets
        assert table.shape[1] == 2
        np.testing.assert_array_equal(table[: g.gemm_depth, 0], offsets)
        np.testing.assert_array_equal(table[: g.gemm_depth, 1], taps)
        assert (table[g.gemm_depth:, 1] == k.MAX_TAPS).all()


def test_implicit_refuses_more_than_63_taps_explicit_does_not():
    x, w = data((1, 2, 9, 9), 1), data((3, 2, 8, 8), 2)
    with pytest.raises(ValueError, match="at most 63 taps"):
        run_conv(k.conv2d_implicit, x, w, 1, 0, 1)
    out, g = run_conv(k.conv2d_explicit, x, w, 1, 0, 1)
    rtol, atol = k.tolerance(g.gemm_depth)
    assert_close(out, k.conv2d_reference(x, w), rtol=rtol, atol=atol)


def test_geometry_counts():
    g = k.conv_geometry((32, 256, 56, 56), (256, 256, 3, 3), 1, 1, 1)
    assert (g.P, g.Q) == (56, 56)
    assert g.flops == 2 * 32 * 256 * 56 * 56 * 256 * 9
    assert g.workspace_bytes == 4 * 256 * 9 * 32 * 56 * 56  # 925 MB: 9x the input
    assert k.conv_geometry((1, 1, 15, 13), (1, 1, 7, 7), 2, 3, 1).out_shape == (1, 1, 8, 7)


def _conv_call(conv, x=None, w=None, out=None, **params):
    x = cuda.to_device(data((1, 3, 6, 6), 1)) if x is None else x
    w = cuda.to_device(data((4, 3, 3, 3), 2)) if w is None else w
    out = cuda.device_array((1, 4, 4, 4), np.float32) if out is None else out
    return conv(x, w, out, **params)


@pytest.mark.parametrize("conv", CONVS, ids=lambda f: f.__name__)
def test_bad_input_is_a_clear_error(conv):
    with pytest.raises(TypeError, match="dtype float64"):
        _conv_call(conv, x=cuda.to_device(data((1, 3, 6, 6), 1).astype(np.float64)))
    with pytest.raises(TypeError, match="host"):
        _conv_call(conv, w=data((4, 3, 3, 3), 2))
    with pytest.raises(ValueError, match="channel mismatch"):
        _conv_call(conv, w=cuda.to_device(data((4, 2, 3, 3), 2)))
    with pytest.raises(ValueError, match="larger than the padded input"):
        _conv_call(conv, w=cuda.to_device(data((4, 3, 7, 3), 2)))
    with pytest.raises(ValueError, match="shape"):
        _conv_call(conv, out=cuda.device_array((1, 4, 5, 4), np.float32))
    with pytest.raises(ValueError, match="3 dimensions, expected 4"):
        _conv_call(conv, x=cuda.to_device(data((3, 6, 6), 1)))
    with pytest.raises(ValueError, match="stride must be >= 1"):
        _conv_call(conv, stride=0)
    with pytest.raises(ValueError, match="padding must be >= 0"):
        _conv_call(conv, padding=(1, -1))
    with pytest.raises(TypeError, match="dilation must be an int"):
        _conv_call(conv, dilation=1.5)
    with pytest.raises(ValueError, match="unknown tile"):
        _conv_call(conv, tile="huge")
    with pytest.raises(ValueError, match='splits must be an int from 1 to 8 or "stream"'):
        _conv_call(conv, splits=0)
    with pytest.raises(ValueError, match="splits must be"):
        _conv_call(conv, splits="streams")


def test_gemm_bad_input_is_a_clear_error():
    a, b = cuda.to_device(data((4, 5), 1)), cuda.to_device(data((5, 6), 2))
    with pytest.raises(ValueError, match="inner dimensions"):
        k.gemm(a, cuda.to_device(data((4, 6), 2)), cuda.device_array((4, 6), np.float32))
    with pytest.raises(ValueError, match="shape"):
        k.gemm(a, b, cuda.device_array((6, 4), np.float32))
    with pytest.raises(TypeError, match="host"):
        k.gemm(data((4, 5), 1), b, cuda.device_array((4, 6), np.float32))
    with pytest.raises(TypeError, match="dtype"):
        k.gemm(a, b, cuda.device_array((4, 6), np.float64))
    with pytest.raises(ValueError, match="whole rows"):
        k.make_gemm_kernel(k.Tile(16, 16, 4, 3, 2))
    with pytest.raises(ValueError, match="needs a wide tile"):
        k.make_implicit_kernel(k.Tile(16, 32, 4, 2, 4, prefetch=True))


def test_resident_blocks_follow_the_sms_shared_memory(monkeypatch):
    # The stream-K grid is one block per place an SM holds: on a T4 (64 KB of shared memory per SM)
    # the 8x16/thread BK=16 tile (33 KB of tiles, up to 12 KB of table) fits once, not twice.
    from chapters.ch04_implicit_gemm import schedule

    tile = k.GPU_TILES["128x128 wide, 8x16/thread, BK=16"]
    monkeypatch.setattr(schedule, "ON_GPU", True)
    for shared_per_sm, blocks in ((64 * 1024, 1), (228 * 1024, tile.min_blocks)):
        device = type("Device", (), {"MAX_SHARED_MEMORY_PER_MULTIPROCESSOR": shared_per_sm})
        monkeypatch.setattr(schedule.cuda, "get_current_device", lambda device=device: device)
        assert schedule.resident_blocks.__wrapped__(tile) == blocks
