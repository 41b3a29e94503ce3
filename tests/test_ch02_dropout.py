import workbook  # first: chooses the GPU or the simulator before numba.cuda is imported

import numpy as np
import pytest

from chapters.ch02_dropout import kernels as k
from chapters.ch02_dropout import philox
from workbook import cuda

LARGE_ODD = workbook.size(gpu=(1 << 22) + 3, sim=3001)
SIZES = [1, 31, 32, 33, 1000, 1001, LARGE_ODD]  # 1001: not a multiple of 4, 32 or the block
SEED, OFFSET = 0x1234_5678_9ABC_DEF0, 3


def _data(n, dtype, seed=0):
    return np.random.default_rng(seed + n).standard_normal(n).astype(dtype)


# --- the generator ------------------------------------------------------------------------------


@pytest.mark.parametrize("counter, key, expected", philox.KNOWN_ANSWERS)
def test_philox_reference_known_answers(counter, key, expected):
    out = philox.philox4x32_reference([counter], key)
    assert [int(v) for v in out[0]] == list(expected)


def test_philox_device_matches_known_answers_and_reference():
    counters = np.array([c for c, _, _ in philox.KNOWN_ANSWERS], dtype=np.uint32)
    for index, (_, key, expected) in enumerate(philox.KNOWN_ANSWERS):
        out = cuda.device_array((len(counters), 4), dtype=np.uint32)
        philox.philox_kernel[1, 32](cuda.to_device(counters), cuda.to_device(np.array(key, np.uint32)), out)
        got = out.copy_to_host()
        assert [int(v) for v in got[index]] == list(expected)
        workbook.assert_close(got, philox.philox4x32_reference(counters, key), exact=True)


def test_philox_device_matches_reference_on_many_counters():
    rng = np.random.default_rng(1)
    counters = rng.integers(0, 2**32, size=(200, 4), dtype=np.uint64).astype(np.uint32)
    key = (0xDEADBEEF, 0x01234567)
    out = cuda.device_array((200, 4), dtype=np.uint32)
    philox.philox_kernel[7, 32](cuda.to_device(counters), cuda.to_device(np.array(key, np.uint32)), out)
    workbook.assert_close(out, philox.philox4x32_reference(counters, key), exact=True)


# --- forward and backward against the NumPy reference, exactly -----------------------------------


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_bitmask_forward_and_backward_match_reference(n, dtype):
    x = _data(n, dtype)
    p = 0.3
    y, mask = k.dropout_bitmask(cuda.to_device(x), p, SEED, OFFSET)
    y_ref, mask_ref = k.dropout_reference(x, p, SEED, OFFSET)
    keep = k.keep_reference(n, p, SEED, OFFSET)
    workbook.assert_close(y, y_ref, exact=True, name=f"y n={n}")
    workbook.assert_bitmask(mask, keep, name=f"mask n={n}")
    workbook.assert_close(mask, mask_ref, exact=True, name=f"mask words n={n}")

    dy = _data(n, dtype, seed=99)
    dx = k.dropout_backward_bitmask(cuda.to_device(dy), mask, p)
    workbook.assert_close(dx, k.backward_reference(dy, keep, p), exact=True, name=f"dx n={n}")


@pytest.mark.parametrize("n", [1, 33, 1001, LARGE_ODD])
def test_seed_only_forward_and_backward_match_reference(n):
    x, dy = _data(n, np.float32), _data(n, np.float32, seed=7)
    p = 0.5
    y = k.dropout_seed_only(cuda.to_device(x), p, SEED, OFFSET)
    workbook.assert_close(y, k.dropout_reference(x, p, SEED, OFFSET)[0], exact=True)
    dx = k.dropout_backward_seed_only(cuda.to_device(dy), p, SEED, OFFSET)
    workbook.assert_close(dx, k.backward_reference(dy, k.keep_reference(n, p, SEED, OFFSET), p), exact=True)


@pytest.mark.parametrize("blocks_per_sm", [1, "data"])
def test_any_grid_gives_the_same_mask(blocks_per_sm):
    # 1 block per SM: each warp makes many trips (the warp-uniform loop); "data": exactly one.
    n = 3001
    x, dy = _data(n, np.float32), _data(n, np.float32, seed=5)
    y, mask = k.dropout_bitmask(cuda.to_device(x), 0.2, SEED, OFFSET, blocks_per_sm=blocks_per_sm)
    y_ref, mask_ref = k.dropout_reference(x, 0.2, SEED, OFFSET)
    workbook.assert_close(y, y_ref, exact=True)
    workbook.assert_close(mask, mask_ref, exact=True)
    dx = k.dropout_backward_bitmask(cuda.to_device(dy), mask, 0.2, blocks_per_sm=blocks_per_sm)
    workbook.assert_close(dx, k.backward_reference(dy, k.keep_reference(n, 0.2, SEED, OFFSET), 0.2), exact=True)


def test_misaligned_view_takes_the_scalar_path_and_is_still_right():
    n = 1003
    full = _data(n + 1, np.float32)
    d_full = cuda.to_device(full)
    view = d_full[1:]  # 4 bytes past a 16-byte boundary: no 16-byte loads allowed
    assert not k.quads_aligned(view)
    y, mask = k.dropout_bitmask(view, 0.25, SEED, OFFSET)
    y_ref, mask_ref = k.dropout_reference(full[1:], 0.25, SEED, OFFSET)
    workbook.assert_close(y, y_ref, exact=True)
    workbook.assert_close(mask, mask_ref, exact=True)


def test_nan_and_inf_are_kept_or_zeroed_like_the_reference():
    n = 257
    x = _data(n, np.float32)
    x[::3], x[1::5], x[2::7] = np.nan, np.inf, -np.inf
    y, _ = k.dropout_bitmask(cuda.to_device(x), 0.5, SEED, OFFSET)
    y_ref, _ = k.dropout_reference(x, 0.5, SEED, OFFSET)
    workbook.assert_close(y, y_ref, exact=True)
    out = y.copy_to_host()
    keep = k.keep_reference(n, 0.5, SEED, OFFSET)
    assert np.isnan(out[np.isnan(x) & keep]).all() and (out[~keep] == 0).all()
    assert np.isinf(out[np.isinf(x) & keep]).all()


# --- the (seed, offset) contract -----------------------------------------------------------------


def test_successive_calls_advance_the_offset_and_repeat_exactly():
    x = cuda.to_device(_data(500, np.float32))
    drop = k.PhiloxDropout(0.5, seed=42)
    _, mask_a, offset_a = drop.forward(x)
    _, mask_b, offset_b = drop.forward(x)
    assert (offset_a, offset_b) == (0, 1)
    a, b = mask_a.copy_to_host(), mask_b.copy_to_host()
    assert not np.array_equal(a, b)  # a new offset: new random numbers
    again = k.dropout_bitmask(x, 0.5, 42, offset_a)[1].copy_to_host()
    np.testing.assert_array_equal(again, a)  # same (seed, offset, n): the same mask
    other_seed = k.dropout_bitmask(x, 0.5, 43, offset_a)[1].copy_to_host()
    assert not np.array_equal(other_seed, a)


def test_mask_does_not_depend_on_the_grid():
    # The same (seed, offset) over n elements, and over a prefix: the prefix's bits agree.
    n = 777
    x = _data(n, np.float32)
    _, mask = k.dropout_bitmask(cuda.to_device(x), 0.4, SEED, OFFSET)
    _, prefix = k.dropout_bitmask(cuda.to_device(x[:300]), 0.4, SEED, OFFSET)
    full_bits = workbook.unpack_bitmask(mask, n)
    np.testing.assert_array_equal(workbook.unpack_bitmask(prefix, 300), full_bits[:300])


# --- statistics and the ends of p ----------------------------------------------------------------


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_keep_rate_is_one_minus_p(p):
    n = workbook.size(gpu=1 << 20, sim=2048)
    _, mask = k.dropout_bitmask(cuda.device_array(n, dtype=np.float32), p, SEED, OFFSET)
    rate = workbook.unpack_bitmask(mask, n).mean()
    sigma = np.sqrt(p * (1 - p) / n)
    assert abs(rate - (1 - p)) < 5 * sigma, f"keep rate {rate:.4f}, expected {1 - p} +- {5 * sigma:.4f}"


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_naive_keep_rate_and_consistency(p):
    n = 2000
    x = _data(n, np.float32)
    y, mask = k.dropout_naive(cuda.to_device(x), p, seed=5)
    keep = mask.copy_to_host().astype(bool)
    expected = np.where(keep, x * k.scale_for(p), np.float32(0))
    workbook.assert_close(y, expected, exact=True)
    assert abs(keep.mean() - (1 - p)) < 5 * np.sqrt(p * (1 - p) / n)
    dx = k.dropout_backward_bytemask(cuda.to_device(x), mask, p)
    workbook.assert_close(dx, expected, exact=True)


def test_p_zero_keeps_everything_and_p_one_drops_everything():
    n = 301
    x = _data(n, np.float32)
    y0, m0 = k.dropout_bitmask(cuda.to_device(x), 0.0, SEED, OFFSET)
    workbook.assert_close(y0, x, exact=True)
    assert workbook.unpack_bitmask(m0, n).all()
    assert int(m0.copy_to_host()[-1]) >> (n % 32) == 0  # padding bits past n stay 0
    y1, m1 = k.dropout_bitmask(cuda.to_device(x), 1.0, SEED, OFFSET)
    out = y1.copy_to_host()
    assert np.isfinite(out).all() and not out.any()  # zeros, not 0 * inf = NaN
    assert not m1.copy_to_host().any()
    dx = k.dropout_backward_bitmask(cuda.to_device(x), m1, 1.0)
    assert not dx.copy_to_host().any()


# --- bad input: a clear error before any launch ---------------------------------------------------


def test_bad_inputs_raise_clear_errors():
    x = cuda.to_device(_data(64, np.float32))
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        k.dropout_bitmask(x, 1.5, SEED, OFFSET)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        k.dropout_bitmask(x, -0.1, SEED, OFFSET)
    with pytest.raises(ValueError, match=r"p must be in \[0, 1\]"):
        k.dropout_seed_only(x, float("nan"), SEED, OFFSET)
    with pytest.raises(TypeError, match="p must be a number"):
        k.dropout_bitmask(x, "0.5", SEED, OFFSET)
    with pytest.raises(TypeError, match="host .NumPy. array"):
        k.dropout_bitmask(_data(64, np.float32), 0.5, SEED, OFFSET)
    with pytest.raises(TypeError, match="dtype float64"):
        k.dropout_bitmask(cuda.to_device(np.zeros(64)), 0.5, SEED, OFFSET)
    with pytest.raises(TypeError, match="dtype float64"):
        k.dropout_naive(cuda.to_device(np.zeros(64)), 0.5, SEED)
    with pytest.raises(ValueError, match="shape"):
        k.dropout_bitmask(x, 0.5, SEED, OFFSET, y=cuda.device_array(63, dtype=np.float32))
    with pytest.raises(ValueError, match="shape"):
        k.dropout_bitmask(x, 0.5, SEED, OFFSET, mask=cuda.device_array(3, dtype=np.uint32))
    with pytest.raises(TypeError, match="mask has dtype uint8"):
        k.dropout_backward_bitmask(x, cuda.device_array(2, dtype=np.uint8), 0.5)
    with pytest.raises(ValueError, match="shape"):
        k.dropout_backward_bitmask(x, cuda.device_array(3, dtype=np.uint32), 0.5)
    with pytest.raises(ValueError, match="dimensions"):
        k.dropout_bitmask(cuda.device_array((8, 8), dtype=np.float32), 0.5, SEED, OFFSET)
    with pytest.raises(ValueError, match="seed must be in"):
        k.dropout_bitmask(x, 0.5, -1, OFFSET)
    with pytest.raises(ValueError, match="offset must be in"):
        k.dropout_backward_seed_only(x, 0.5, SEED, 2**64)
    with pytest.raises(ValueError, match="blocks_per_sm must be"):
        k.dropout_bitmask(x, 0.5, SEED, OFFSET, blocks_per_sm=0)
    with pytest.raises(TypeError, match="seed must be an integer"):
        k.PhiloxDropout(0.5, seed=1.5)


def test_empty_input_launches_nothing():
    y, mask = k.dropout_bitmask(cuda.device_array(0, dtype=np.float32), 0.5, SEED, OFFSET)
    assert y.size == 0 and mask.size == 0
