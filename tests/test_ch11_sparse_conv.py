"""Chapter 11: the hash table, the pair table and the rulebook against NumPy on the tiny cases
(one voxel, a line, a plane, no neighbours) and a small scan; both convolutions against the dense
definition and the direct reference, at channel counts that are not multiples of the tiles, with
NaN spreading as the reference spreads it; bad input refused with a message naming it."""

import numpy as np
import pytest

import workbook
from numba import cuda

from chapters.ch11_sparse_conv import grouping, implicit, maps, naive, onelaunch, scan, tensor
from chapters.ch11_sparse_conv import reference as ref

CASES = {**scan.TINY, "a small scan": scan.voxelize(scan.lidar_scan(3, 40))}


def _pairs(coords):
    table = maps.SiteTable(cuda.to_device(np.asarray(coords, np.int32)))
    return table, table.pairs()


@pytest.mark.parametrize("case", list(CASES))
def test_maps_match_numpy(case):
    coords = np.asarray(CASES[case], np.int32)
    table, pairs = _pairs(coords)
    expected = ref.neighbours(coords)
    np.testing.assert_array_equal(pairs.neighbours.copy_to_host(), expected)
    masks = ((expected >= 0) << np.arange(ref.TAPS)).sum(axis=1)
    np.testing.assert_array_equal(pairs.masks.copy_to_host(), masks)
    assert (table.probes.copy_to_host() >= 1).all()
    stored = table.keys.copy_to_host()
    assert sorted(stored[stored != maps.EMPTY]) == sorted(ref.key(coords))  # every key once, nothing else
    rules = maps.rulebook(pairs)
    rule_in, rule_out = rules.rule_in.copy_to_host(), rules.rule_out.copy_to_host()
    for k in range(ref.TAPS):
        n = rules.counts[k]
        got = sorted(zip(rule_in[k, :n], rule_out[k, :n]))
        assert got == sorted((expected[i, k], i) for i in np.flatnonzero(expected[:, k] >= 0)), f"tap {k}"
    assert rules.counts[ref.CENTRE] == len(coords)  # the centre tap: every site is its own neighbour


def test_tiny_cases_have_the_neighbours_known_by_hand():
    assert (ref.neighbours(scan.TINY["no neighbours"]) >= 0).sum() == 6  # only the centre taps
    line = ref.neighbours(scan.TINY["a line of 33"])
    assert (line >= 0).sum(axis=1).tolist() == [2] + [3] * 31 + [2]
    plane = (ref.neighbours(scan.TINY["a 6 x 6 plane"]) >= 0).sum(axis=1)
    assert plane.max() == 9 and plane.min() == 4


def test_a_full_probe_sequence_wraps_around_the_table():
    """More keys than one cluster of slots: probe counts above one, every key still found."""
    coords = np.stack(np.meshgrid(np.arange(7), np.arange(5), np.arange(3), indexing="ij"), -1).reshape(-1, 3)
    table, pairs = _pairs(coords)
    assert table.keys.size >= 2 * len(coords)
    np.testing.assert_array_equal(pairs.neighbours.copy_to_host(), ref.neighbours(coords))


@pytest.mark.parametrize("case", list(CASES))
def test_rows_grouped_by_mask_on_the_gpu(case):
    """The counting sort: every row once, the buckets (top bits of the masks) in order, and each
    tile's mask the OR of its rows'."""
    _, pairs = _pairs(CASES[case])
    masks = pairs.masks.copy_to_host()
    order = grouping.group_by_mask(pairs.masks).copy_to_host()
    assert sorted(order) == list(range(len(masks)))
    buckets = masks[order] >> (ref.TAPS - grouping.GROUP_BITS)
    assert (np.diff(buckets) >= 0).all()
    tiles = grouping.tile_masks(pairs.masks, cuda.to_device(order), 4).copy_to_host()
    expected = [np.bitwise_or.reduce(masks[order[t:t + 4]]) for t in range(0, len(order), 4)]
    np.testing.assert_array_equal(tiles, expected)


def test_maps_in_one_launch_equal_the_separate_kernels():
    """One builder, reused for every case, small after large and large again: each build's pair
    table, masks, grouped order and tile masks as the separate kernels' (the order as a grouping:
    rows within a bucket come in any order)."""
    builder = onelaunch.MapBuilder(max(len(c) for c in CASES.values()), rows=4)
    for case in [*CASES, "a small scan"]:
        coords = np.asarray(CASES[case], np.int32)
        pairs, order, tiles = builder.build(cuda.to_device(coords))
        expected = ref.neighbours(coords)
        np.testing.assert_array_equal(pairs.neighbours.copy_to_host(), expected)
        masks = pairs.masks.copy_to_host()
        np.testing.assert_array_equal(masks, ((expected >= 0) << np.arange(ref.TAPS)).sum(axis=1))
        order = order.copy_to_host()
        assert sorted(order) == list(range(len(coords))), case
        assert (np.diff(masks[order] >> (ref.TAPS - grouping.GROUP_BITS)) >= 0).all(), case
        np.testing.assert_array_equal(tiles.copy_to_host(),
                                      [np.bitwise_or.reduce(masks[order[t:t + 4]]) for t in range(0, len(order), 4)])


def test_the_implicit_gemm_runs_on_maps_built_in_one_launch():
    coords = np.asarray(CASES["a small scan"], np.int32)
    x, w = ref.features(len(coords), 8, seed=1), ref.weights(8, 12, seed=2)
    pairs, order, tiles = onelaunch.MapBuilder(len(coords), implicit.BM).build(cuda.to_device(coords))
    layer = implicit.ImplicitGemm(pairs, grouped=(order, tiles))
    out = layer(cuda.to_device(x), cuda.to_device(w), cuda.device_array((len(coords), 12), np.float32))
    rtol, atol = ref.tolerance(8)
    workbook.assert_close(out, ref.submanifold_direct(coords, x, w).astype(np.float32), rtol=rtol, atol=atol)
    with pytest.raises(ValueError, match="tiles of"):
        implicit.ImplicitGemm(pairs, grouped=(order, cuda.to_device(np.zeros(1, np.int32))))


def test_the_one_launch_builder_refuses_bad_sites():
    builder = onelaunch.MapBuilder(4, rows=4)
    with pytest.raises(ValueError, match="1 repeat a coordinate"):
        builder.build(cuda.to_device(np.array([[1, 2, 3], [1, 2, 3]], np.int32)))
    with pytest.raises(ValueError, match="max_sites"):
        builder.build(cuda.to_device(np.zeros((5, 3), np.int32)))
    with pytest.raises(ValueError, match="outside"):
        builder.build(cuda.to_device(np.array([[-1, 0, 0]], np.int32)))
    pairs, _, _ = builder.build(cuda.to_device(np.array([[1, 2, 3], [1, 2, 4]], np.int32)))  # fine again after
    np.testing.assert_array_equal(pairs.masks.copy_to_host(), [1 << 14 | 1 << 13, 1 << 13 | 1 << 12])


def test_the_scan_of_the_bucket_counts():
    counts = np.random.default_rng(0).integers(0, 5, grouping.BUCKETS).astype(np.int32)
    starts = cuda.device_array(grouping.BUCKETS, np.int32)
    grouping.scan_kernel[1, grouping.SCAN_THREADS](cuda.to_device(counts), starts)
    np.testing.assert_array_equal(starts.copy_to_host(), np.concatenate([[0], np.cumsum(counts)[:-1]]))


def _layers(coords):
    _, pairs = _pairs(coords)
    return {"gather-GEMM-scatter": lambda C, K: naive.GatherGemmScatter(maps.rulebook(pairs), C, K),
            "implicit": lambda C, K: implicit.ImplicitGemm(pairs),
            "implicit, scan order": lambda C, K: implicit.ImplicitGemm(pairs, group=False)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("channels, out_channels", [(1, 1), (5, 7), (9, 17), (16, 12)])
def test_convolutions_match_the_references(case, channels, out_channels):
    coords = np.asarray(CASES[case], np.int32)
    x = ref.features(len(coords), channels, seed=len(coords))
    w = ref.weights(channels, out_channels, seed=channels)
    want = ref.submanifold_direct(coords, x, w)
    if len(coords) <= 64:
        np.testing.assert_allclose(want, ref.submanifold_dense(coords, x, w), rtol=1e-12, atol=1e-12)
    rtol, atol = ref.tolerance(channels)
    for name, make in _layers(coords).items():
        out = cuda.to_device(np.full((len(coords), out_channels), np.nan, np.float32))
        make(channels, out_channels)(cuda.to_device(x), cuda.to_device(w), out)
        workbook.assert_close(out.copy_to_host(), want.astype(np.float32), rtol=rtol, atol=atol, name=name)


@pytest.mark.parametrize("case", list(CASES))
def test_strided_outputs_and_convolution_match_the_definition(case):
    """Stride 2: the output sites (a second hash table, numbered by the threads that claim them)
    are the definition's, as a set; the pairs and both convolutions match the references."""
    coords = np.asarray(CASES[case], np.int32)
    channels, out_channels = 5, 7
    x, w = ref.features(len(coords), channels, seed=3), ref.weights(channels, out_channels, seed=4)
    out_coords, pairs = maps.SiteTable(cuda.to_device(coords)).strided()
    got_coords = out_coords.copy_to_host()
    assert sorted(ref.key(got_coords)) == sorted(ref.key(ref.strided_outputs(coords)))
    np.testing.assert_array_equal(pairs.neighbours.copy_to_host(), ref.neighbours(coords, got_coords, 2))
    want = ref.submanifold_direct(coords, x, w, got_coords, 2)
    if len(coords) <= 64:
        dense_coords, dense = ref.strided_dense(coords, x, w)
        by_key = dict(zip(ref.key(dense_coords), dense))
        np.testing.assert_allclose(want, [by_key[k] for k in ref.key(got_coords)], rtol=1e-12, atol=1e-12)
    rtol, atol = ref.tolerance(channels)
    for name, layer in (("gather-GEMM-scatter", naive.GatherGemmScatter(maps.rulebook(pairs), channels, out_channels)),
                        ("implicit", implicit.ImplicitGemm(pairs))):
        out = layer(cuda.to_device(x), cuda.to_device(w), cuda.device_array((len(got_coords), out_channels), np.float32))
        workbook.assert_close(out.copy_to_host(), want.astype(np.float32), rtol=rtol, atol=atol, name=name)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("channels, out_channels", [(16, 8), (32, 20), (8, 1)])
def test_tensor_cores_match_the_fp16_reference(case, channels, out_channels):
    """FP16 features and weights, FP32 sums: exact products, so float32's tolerance against the
    reference of the rounded values; K not a multiple of 8 (a ragged n-tile)."""
    coords = np.asarray(CASES[case], np.int32)
    x = ref.features(len(coords), channels, seed=5)
    w = ref.weights(channels, out_channels, seed=6)
    _, pairs = _pairs(coords)
    x16, wt16 = tensor.to_half(x, w)
    out = cuda.to_device(np.full((len(coords), out_channels), np.nan, np.float32))
    tensor.TensorImplicitGemm(pairs)(x16, wt16, out)
    want = ref.submanifold_direct(coords, x.astype(np.float16), w.astype(np.float16))
    rtol, atol = ref.tolerance(channels)
    workbook.assert_close(out.copy_to_host(), want.astype(np.float32), rtol=rtol, atol=atol, name="out")


def test_tensor_cores_take_more_channels_than_a_step():
    """C = 72: two steps a tap (64 channels, then 8 and zero-filled chunks); K = 64: every n-tile."""
    test_tensor_cores_match_the_fp16_reference("a small scan", 72, 64)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_the_implicit_gemm_at_every_alignment_of_its_arrays(offset):
    """x, w and out as views starting 0-3 floats into their allocations: only 16-byte aligned ones
    take the 16-byte loads and stores; every offset gives the reference (C = 8, K = 12: whole quads)."""
    coords = np.asarray(CASES["a small scan"], np.int32)
    C, K, N = 8, 12, len(coords)
    x, w = ref.features(N, C, seed=7), ref.weights(C, K, seed=8)

    def shifted(a):
        flat = cuda.to_device(np.concatenate([np.zeros(offset, np.float32), a.ravel()]))
        return flat[offset:].reshape(a.shape)
    _, pairs = _pairs(coords)
    out = shifted(np.full((N, K), np.nan, np.float32))
    implicit.ImplicitGemm(pairs)(shifted(x), shifted(w), out)
    rtol, atol = ref.tolerance(C)
    workbook.assert_close(out.copy_to_host(), ref.submanifold_direct(coords, x, w).astype(np.float32),
                          rtol=rtol, atol=atol, name=f"out, offset {offset}")


def test_tensor_cores_refuse_what_they_cannot_take():
    _, pairs = _pairs(scan.TINY["a 6 x 6 plane"])
    layer = tensor.TensorImplicitGemm(pairs)
    x16, wt16 = tensor.to_half(np.zeros((36, 12), np.float32), np.zeros((27, 12, 8), np.float32))
    with pytest.raises(ValueError, match="C a multiple of 8"):
        layer(x16, wt16, cuda.device_array((36, 8), np.float32))
    x16, wt16 = tensor.to_half(np.zeros((35, 16), np.float32), np.zeros((27, 16, 8), np.float32))
    with pytest.raises(ValueError, match="x16 has 35 rows, the maps have 36 input sites"):
        layer(x16, wt16, cuda.device_array((36, 8), np.float32))
    x16 = cuda.to_device(np.zeros(36 * 16 + 8, np.float16))[8:].reshape(36, 16)  # 16 bytes in: aligned
    layer(x16, wt16, cuda.device_array((36, 8), np.float32))
    x16 = cuda.to_device(np.zeros(36 * 16 + 4, np.float16))[4:].reshape(36, 16)  # 8 bytes in: not
    with pytest.raises(ValueError, match="16-byte boundary"):
        layer(x16, wt16, cuda.device_array((36, 8), np.float32))
    with pytest.raises(TypeError, match="float16"):
        layer(cuda.to_device(np.zeros((36, 16), np.float32)), wt16, cuda.device_array((36, 8), np.float32))


@pytest.mark.parametrize("variant", ["gather-GEMM-scatter", "implicit"])
def test_nan_spreads_to_the_sites_whose_window_holds_it(variant):
    coords = np.asarray(scan.TINY["a line of 33"], np.int32)
    x = ref.features(33, 4)
    x[10, 2] = np.nan
    w = ref.weights(4, 3)
    out = cuda.device_array((33, 3), np.float32)
    _layers(coords)[variant](4, 3)(cuda.to_device(x), cuda.to_device(w), out)
    got = out.copy_to_host()
    assert np.isnan(got[9:12]).all() and not np.isnan(np.delete(got, [9, 10, 11], axis=0)).any()


def test_bad_input_is_refused_with_a_message():
    with pytest.raises(ValueError, match="repeat a coordinate"):
        maps.SiteTable(cuda.to_device(np.array([[1, 2, 3], [1, 2, 3]], np.int32)))
    with pytest.raises(ValueError, match="outside"):
        maps.SiteTable(cuda.to_device(np.array([[1, -2, 3]], np.int32)))
    with pytest.raises(ValueError, match=r"expected \(N, 3\)"):
        maps.SiteTable(cuda.to_device(np.zeros((4, 2), np.int32)))
    with pytest.raises(TypeError, match="int32"):
        maps.SiteTable(cuda.to_device(np.zeros((4, 3), np.int64)))
    _, pairs = _pairs(scan.TINY["a 6 x 6 plane"])
    layer = implicit.ImplicitGemm(pairs)
    x, w = cuda.to_device(np.zeros((36, 4), np.float32)), cuda.to_device(np.zeros((27, 4, 2), np.float32))
    with pytest.raises(ValueError, match="x has 35 rows, the maps have 36 input sites"):
        layer(cuda.to_device(np.zeros((35, 4), np.float32)), w, cuda.device_array((36, 2), np.float32))
    with pytest.raises(ValueError, match=r"w has shape \(27, 5, 2\)"):
        layer(x, cuda.to_device(np.zeros((27, 5, 2), np.float32)), cuda.device_array((36, 2), np.float32))
    with pytest.raises(ValueError, match="out has shape"):
        layer(x, w, cuda.device_array((36, 3), np.float32))


def test_the_scan_is_deterministic_and_on_surfaces():
    a, b = scan.lidar_scan(4, 64), scan.lidar_scan(4, 64)
    np.testing.assert_array_equal(a, b)
    coords = scan.voxelize(scan.lidar_scan(16, 512))
    assert len(np.unique(ref.key(coords))) == len(coords) and coords.min() == 0
    assert (ref.neighbours(coords) >= 0).sum(axis=1).mean() > 2.5  # voxels on surfaces have neighbours
