import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from chapters.ch05_directives import kernels as k
from chapters.ch05_directives import pipeline as p
from workbook import assert_close, cuda

# (height, width): 1 pixel; a row or a column of 31 (one short of a warp); 32 x 33 and 33 x 32 (one
# past a warp / a block row); 25 x 40 = 1000 pixels; 9 x 35 (no dimension a multiple of the blur
# block's 32 x 8); a large odd image (a few thousand pixels in the simulator).
SHAPES = [(1, 1), (1, 31), (31, 1), (32, 33), (33, 32), (25, 40), (9, 35),
          workbook.size(gpu=(1001, 2049), sim=(41, 53))]
ids = [f"{h}x{w}" for h, w in SHAPES]


def images(shape, seed=0):
    rng = np.random.default_rng(seed + shape[0] * 1000 + shape[1])
    return rng.integers(0, 256, shape, dtype=np.uint8), rng.integers(0, 256, shape, dtype=np.uint8)


# ---------------------------------------------------------------------------------------------
# The references themselves, on cases worked by hand


def test_references_by_hand():
    a = np.array([[3, 0, 255, 254]], np.uint8)
    b = np.array([[4, 255, 255, 255]], np.uint8)
    assert k.merge_reference(a, b).tolist() == [[4, 128, 255, 255]]  # halves round up, no wrap at 256
    assert k.blur_reference(np.array([[7]], np.uint8)).tolist() == [[7]]  # 1 pixel blurs to itself
    # 2x2 [[0, 9], [9, 9]]: every pixel sees, clamped, four 0s or one 0 ... worked out:
    #   (0,0): rows 0,0,1 x cols 0,0,1 -> 0+0+9 +0+0+9 +9+9+9 = 45 -> (45+4)//9 = 5
    #   (0,1): 0+9+9 +0+9+9 +9+9+9 = 63 -> 7;  (1,0): 0+0+9 + 9+9+9 + 9+9+9 = 63 -> 7;  (1,1): 9*8 = 72 -> 8
    assert k.blur_reference(np.array([[0, 9], [9, 9]], np.uint8)).tolist() == [[5, 7], [7, 8]]


# ---------------------------------------------------------------------------------------------
# Every variant against NumPy


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
def test_merge_variants(shape):
    a, b = images(shape)
    expected = k.merge_reference(a, b)
    assert_close(k.merge_directive(a, b), expected, name="directive")
    assert_close(k.merge_on_host_arrays(a, b, np.zeros_like(a)), expected, name="explicit, host arrays")
    d_out = cuda.to_device(np.zeros_like(a))
    assert_close(k.merge(cuda.to_device(a), cuda.to_device(b), d_out), expected, name="explicit, device")


@pytest.mark.parametrize("shape", SHAPES, ids=ids)
@pytest.mark.parametrize("variant", ["2d", "tile"])
def test_blur(shape, variant):
    image, _ = images(shape)
    out = k.blur(cuda.to_device(image), cuda.to_device(np.zeros_like(image)), variant)
    assert_close(out, k.blur_reference(image), name=f"blur {variant}")


@pytest.mark.parametrize("variant", ["2d", "tile"])
def test_blur_extremes(variant):
    # All 255 must stay 255 (a sum of 9 x 255 = 2295 does not fit a byte: the kernels sum in int32),
    # a checkerboard of 0/255 exercises the rounding of (sum + 4) // 9.
    full = np.full((9, 35), 255, np.uint8)
    checker = (np.indices((9, 35)).sum(axis=0) % 2 * 255).astype(np.uint8)
    for image in (full, checker):
        out = k.blur(cuda.to_device(image), cuda.device_array_like(image), variant)
        assert_close(out, k.blur_reference(image), name=f"blur {variant}")


@pytest.mark.parametrize("shape", [(1, 1), (31, 1), (33, 32), SHAPES[-1]], ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("variant", ["2d", "tile"])
def test_merge_blur_data_region(shape, variant):
    a, b = images(shape)
    assert_close(p.merge_blur_data_region(a, b, variant), k.merge_blur_reference(a, b))


# (shape, blocks, streams, blur): one block (the serial case); more blocks than streams, so buffers
# are reused; a last block shorter than the others; one-row blocks (every row is a halo row of two
# blocks); the large odd image.
PIPELINES = [((1, 1), 1, 1, "2d"), ((1, 1), 1, 1, "tile"), ((33, 32), 4, 2, "2d"), ((33, 32), 4, 2, "tile"),
             ((25, 40), 3, 3, "tile"), ((7, 33), 7, 3, "2d"), (SHAPES[-1], 5, 2, "tile")]


@pytest.mark.parametrize("shape, blocks, streams, variant", PIPELINES,
                         ids=[f"{s[0]}x{s[1]}-{b}blocks-{n}streams-{v}" for s, b, n, v in PIPELINES])
def test_pipeline(shape, blocks, streams, variant):
    a, b = images(shape)
    pipeline = p.Pipeline(*shape, blocks, streams, variant)
    pinned_a, pinned_b = p.pinned_copy(a), p.pinned_copy(b)
    out = cuda.pinned_array(shape, dtype=np.uint8)
    out[...] = 0
    assert_close(pipeline.run(pinned_a, pinned_b, out), k.merge_blur_reference(a, b))
    if blocks > streams:  # again, on pageable memory, with every buffer already used
        assert_close(pipeline.run(a, b, np.zeros_like(a)), k.merge_blur_reference(a, b))


CAPTURED = [((1, 1), 1, 1), ((33, 32), 4, 2), ((7, 33), 7, 3), (SHAPES[-1], 5, 4)]


@pytest.mark.parametrize("shape, blocks, streams", CAPTURED,
                         ids=[f"{s[0]}x{s[1]}-{b}blocks-{n}streams" for s, b, n in CAPTURED])
def test_captured_pipeline(shape, blocks, streams):
    # The graph of the whole pipeline: each replay recomputes out from what a and b hold then.
    a, b = images(shape)
    pinned_a, pinned_b = p.pinned_copy(a), p.pinned_copy(b)
    out = cuda.pinned_array(shape, dtype=np.uint8)
    replay = p.Pipeline(*shape, blocks, streams, "2d").graph(pinned_a, pinned_b, out)
    assert replay.how == ("one cuGraphLaunch" if workbook.ON_GPU else
                          "simulator: the step's launches, one by one (no graphs)")
    for _ in range(2):
        out[...] = 0
        assert replay() is out
        assert_close(out, k.merge_blur_reference(pinned_a, pinned_b))
        pinned_a[...], pinned_b[...] = images(shape, seed=7)  # new data, same buffers


@pytest.mark.parametrize("shape, blocks, streams", CAPTURED,
                         ids=[f"{s[0]}x{s[1]}-{b}blocks-{n}streams" for s, b, n in CAPTURED])
def test_pipeline_on_a_pinned_pair(shape, blocks, streams):
    # a and b as the planes of one pinned array: on a GPU one 2-D copy per block moves both.
    a, b = images(shape)
    pair_a, pair_b = p.pinned_pair(a, b)
    assert np.array_equal(pair_a, a) and np.array_equal(pair_b, b)
    out = cuda.pinned_array(shape, np.uint8)
    pipeline, expected = p.Pipeline(*shape, blocks, streams, "2d"), k.merge_blur_reference(a, b)
    out[...] = 0
    assert_close(pipeline.run(pair_a, pair_b, out), expected, name="run")
    out[...] = 0
    assert_close(pipeline.graph(pair_a, pair_b, out)(), expected, name="graph")
    out[...] = 0
    timeline = p.Timeline()
    assert_close(pipeline.run(pair_a, pair_b, out, timeline=timeline), expected, name="run with a timeline")
    copies_up = sum(kind == "copy up" for _, kind, _, _ in timeline.intervals())
    assert copies_up == len(pipeline.blocks) * (1 if workbook.ON_GPU else 2)
    # b before a in memory, or the same image twice: two copies per block, still correct
    out[...] = 0
    assert_close(pipeline.run(pair_b, pair_a, out), k.merge_blur_reference(b, a), name="swapped")
    assert_close(pipeline.run(pair_a, pair_a, out), k.merge_blur_reference(a, a), name="same image")


@pytest.mark.skipif(not workbook.ON_GPU, reason="the simulator has no page-locked memory to ask about")
def test_captured_pipeline_needs_pinned_memory():
    a, b = images((33, 32))
    pinned_a, pinned_b, pinned_out = p.pinned_copy(a), p.pinned_copy(b), cuda.pinned_array(a.shape, np.uint8)
    for args, name in (((a, pinned_b, pinned_out), "a"), ((pinned_a, b, pinned_out), "b"),
                       ((pinned_a, pinned_b, np.empty_like(a)), "out")):
        with pytest.raises(ValueError, match=f"{name} is pageable host memory"):
            p.Pipeline(33, 32, 2, 2).graph(*args)


@pytest.mark.parametrize("shape", [(1, 1), (9, 35)], ids=["1x1", "9x35"])
def test_merge_sequences(shape):
    a, b = images(shape)
    steps = 3
    expected = k.merge_sequence_reference(a, b, steps)
    assert_close(p.merge_sequence_directive(a, b, steps), expected, name="directive")
    assert_close(p.merge_sequence_on_host_arrays(a, b, steps), expected, name="explicit, host arrays")
    assert_close(p.merge_sequence_data_region(a, b, steps), expected, name="data region")
    assert not np.array_equal(expected, a)  # the sequence did something


def test_directive_target():
    # On a GPU the directive variant must be the real CUDA ufunc; the CPU build is the simulator's only.
    assert k.DIRECTIVE_TARGET == ("cuda" if workbook.ON_GPU else "cpu (simulator fallback)")


def test_timeline_spans():
    a, b = images((9, 35))
    timeline = p.Timeline()
    p.Pipeline(9, 35, 3, 2).run(a, b, np.empty_like(a), timeline=timeline)
    spans = timeline.intervals()
    assert len(spans) == 3 * 5  # per block: 2 copies up, 2 kernels, 1 copy down
    assert [kind for _, kind, _, _ in spans[:5]] == ["copy up", "copy up", "kernel", "kernel", "copy down"]
    assert {lane for lane, *_ in spans} == {0, 1}
    assert all(0 <= start <= end for _, _, start, end in spans)
    figure = p.draw_timelines({"pipelined": spans})
    assert len(figure.axes) == 1


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error before any launch


def test_bad_input_is_a_clear_error():
    a, b = images((4, 5))
    d_a, d_b, d_out = cuda.to_device(a), cuda.to_device(b), cuda.device_array((4, 5), np.uint8)
    with pytest.raises(TypeError, match="host"):
        k.merge(a, d_b, d_out)  # a host array where a device array is expected
    with pytest.raises(TypeError, match="NumPy array"):
        k.merge_directive(d_a, b)  # the directive variant takes host arrays
    with pytest.raises(TypeError, match="dtype"):
        k.merge_directive(a.astype(np.float32), b)
    with pytest.raises(TypeError, match="dtype"):
        k.merge(d_a, cuda.to_device(b.astype(np.int16)), d_out)
    with pytest.raises(ValueError, match="shape"):
        k.merge(d_a, d_b, cuda.device_array((5, 4), np.uint8))
    with pytest.raises(ValueError, match="shape"):
        k.merge_on_host_arrays(a, b[:3], np.empty_like(a))
    with pytest.raises(ValueError, match="shape"):
        p.pinned_pair(a, b[:3])
    with pytest.raises(ValueError, match="dimensions"):
        k.merge_directive(a.reshape(-1), b.reshape(-1))
    with pytest.raises(ValueError, match="empty image"):
        k.merge_directive(a[:0], b[:0])
    with pytest.raises(ValueError, match="variant"):
        k.blur(d_a, d_out, "3x3")
    with pytest.raises(ValueError, match="width"):
        k.blur(d_a, cuda.device_array((4, 6), np.uint8))
    with pytest.raises(ValueError, match="src must hold image rows"):
        k.blur(d_a[1:], d_out[1:3], dst_row0=1, src_row0=1, image_height=4)  # no halo row above
    with pytest.raises(ValueError, match="blocks must be a positive integer"):
        p.Pipeline(4, 5, 0, 1)
    with pytest.raises(ValueError, match="cannot cut"):
        p.Pipeline(4, 5, 5, 1)
    with pytest.raises(ValueError, match="variant"):
        p.Pipeline(4, 5, 2, 2, "box")
    with pytest.raises(ValueError, match="shape"):
        p.Pipeline(4, 5, 2, 2).run(a[:3], b[:3], np.empty_like(a[:3]))
    with pytest.raises(TypeError, match="NumPy array"):
        p.Pipeline(4, 5, 2, 2).run(d_a, b, np.empty_like(a))


def test_blur_on_row_blocks():
    # The wrapper's row-block form, as the pipeline uses it: dst rows 3..5 of an 8-row image from
    # src rows 2..6 (one halo row each side).
    image, _ = images((8, 11))
    dst = k.blur(cuda.to_device(image[2:7]), cuda.device_array((3, 11), np.uint8), "tile",
                 src_row0=2, dst_row0=3, image_height=8)
    assert_close(dst, k.blur_reference(image)[3:6])
