import workbook  # noqa: I001  (first: it picks GPU or simulator before numba.cuda is imported)

import numpy as np
import pytest

from workbook import cuda
from chapters.ch03_amp_unscale import kernels as k

WRAPPERS = [k.unscale_per_tensor, k.unscale_fused]
LARGE_ODD = workbook.size(gpu=(1 << 22) + 5, sim=3001)
SIZES = [1, 31, 32, 33, 1000, k.TILE + 7, 3 * k.TILE, LARGE_ODD]


def make(sizes, dtype, seed=0, scale=100.0):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal(n) * scale).astype(dtype) for n in sizes]


def flag(value):
    return cuda.to_device(np.array([value], dtype=np.float32))


def run_and_check(wrapper, host, inv_scale, **list_options):
    """Run one wrapper on device copies of `host`; assert gradients and found_inf against NumPy."""
    expected_grads, expected_flag = k.unscale_reference(host, inv_scale)
    grads = k.GradientList([cuda.to_device(h) for h in host], **list_options)
    found_inf, out = wrapper(grads, flag(0.0), flag(inv_scale))
    assert out is grads
    k.assert_unscaled(out, expected_grads, wrapper.__name__)
    k.assert_unscaled(found_inf, expected_flag, wrapper.__name__)
    return float(found_inf.copy_to_host()[0])


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("dtype", k.GRAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("n", SIZES)
def test_single_tensor_sizes(wrapper, dtype, n):
    assert run_and_check(wrapper, make([n], dtype, seed=n), 1 / 512) == 0.0


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("dtype", k.GRAD_DTYPES, ids=lambda d: np.dtype(d).name)
def test_list_of_awkward_sizes_with_empty_tensors(wrapper, dtype):
    sizes = [0, 1, 31, 0, 32, 33, 1000, 0, k.TILE + 7, LARGE_ODD, 0]
    assert run_and_check(wrapper, make(sizes, dtype), 1 / 1024) == 0.0


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
@pytest.mark.parametrize("dtype", k.GRAD_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("where", ["first of first", "last of last", "middle tensor"])
def test_non_finite_anywhere_sets_found_inf(wrapper, dtype, bad, where):
    sizes = [33, 0, 1000, k.TILE + 7, 2 * k.TILE + 1]
    host = make(sizes, dtype, seed=7)
    if where == "first of first":
        host[0][0] = bad
    elif where == "last of last":
        host[-1][-1] = bad
    else:
        host[3][k.TILE // 2] = bad  # inside a full tile: the vector path
    assert run_and_check(wrapper, host, 1 / 1024) == 1.0


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
def test_non_finite_in_partial_tile_of_middle_tensor(wrapper):
    host = make([k.TILE, k.TILE + 7, 5], np.float32)
    host[1][k.TILE + 3] = np.nan  # the partial-tile (scalar) path
    assert run_and_check(wrapper, host, 0.5) == 1.0


def test_found_inf_is_never_cleared():
    # The kernels only ever raise the flag: a clean list leaves a raised flag raised.
    grads = k.GradientList([cuda.to_device(np.ones(40, dtype=np.float32))])
    for wrapper in WRAPPERS:
        found_inf, _ = wrapper(grads, flag(1.0), flag(1.0))
        assert found_inf.copy_to_host()[0] == 1.0


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
def test_1000_tiny_tensors(wrapper):
    rng = np.random.default_rng(3)
    host = [rng.standard_normal(n).astype(np.float32) for n in rng.integers(0, 9, size=1000)]
    if wrapper is k.unscale_fused:  # (the simulator takes ~5 s per 1000 launches: once is enough)
        assert run_and_check(wrapper, host, 0.125) == 0.0
    host[-1] = np.array([1.0, np.inf], dtype=np.float32)
    assert run_and_check(wrapper, host, 0.125) == 1.0


def test_chunked_lists_take_one_launch_per_chunk():
    host = make([5, 0, 700, 33, 1, 64, 9], np.float32)
    grads = k.GradientList([cuda.to_device(h) for h in host], max_tensors_per_launch=3)
    assert len(grads.launches) == 3  # tensors [0..2], [3..5], [6]
    assert len(k.GradientList([cuda.to_device(h) for h in host]).launches) == 1
    host[4][0] = np.nan
    assert run_and_check(k.unscale_fused, host, 0.25, max_tensors_per_launch=3) == 1.0


@pytest.mark.parametrize("max_blocks", [1, 3])
def test_fewer_blocks_than_tiles(max_blocks):
    # The grid is a block per tile; with fewer blocks the kernel's tile loop strides over the rest.
    host = make([k.TILE * 2 + 5, 7, k.TILE * 3], np.float32, seed=max_blocks)
    assert run_and_check(k.unscale_fused, host, 1 / 256, max_blocks=max_blocks) == 0.0
    host[2][k.TILE + 9] = np.inf
    assert run_and_check(k.unscale_fused, host, 1 / 256, max_blocks=max_blocks) == 1.0


def test_fused_on_a_stream_of_its_own():
    """A training step captured into a CUDA graph launches on its capture stream (chapter 08)."""
    rng = np.random.default_rng(8)
    host = [rng.standard_normal(k.TILE + 3).astype(np.float32), rng.standard_normal(5).astype(np.float32)]
    host[1][2] = np.nan
    grads = k.GradientList([cuda.to_device(h) for h in host])
    stream = cuda.stream()
    found_inf, _ = k.unscale_fused(grads, flag(0.0), flag(0.25), stream=stream)
    stream.synchronize()
    expected, expected_flag = k.unscale_reference(host, 0.25)
    k.assert_unscaled(grads, expected)
    assert found_inf.copy_to_host()[0] == expected_flag[0] == 1.0


def test_all_empty_list_launches_nothing():
    grads = k.GradientList([cuda.device_array(0, dtype=np.float32)] * 3)
    assert grads.launches == []
    found_inf, _ = k.unscale_fused(grads, flag(0.0), flag(0.5))
    assert found_inf.copy_to_host()[0] == 0.0


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
def test_multidimensional_gradients(wrapper):
    rng = np.random.default_rng(5)
    host = [rng.standard_normal((7, 13)).astype(np.float32), rng.standard_normal((3, 4, 5)).astype(np.float32)]
    assert run_and_check(wrapper, host, 0.5) == 0.0


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
def test_float16_overflow_after_unscale_is_not_flagged(wrapper):
    # Convention (PyTorch's): the *input* is checked, before the multiply. 60000 * 2 overflows
    # float16 to Inf in the output, but the input was finite: found_inf stays 0.
    host = [np.array([60000.0, -60000.0, 1.0, 0.5], dtype=np.float16)]
    with np.errstate(over="ignore"):
        assert run_and_check(wrapper, host, 2.0) == 0.0
    grads = k.GradientList([cuda.to_device(host[0])])
    with np.errstate(over="ignore"):
        wrapper(grads, flag(0.0), flag(2.0))
    out = grads.copy_to_host()[0]
    assert np.isposinf(out[0]) and np.isneginf(out[1]) and out[2] == 2.0


def test_float16_rounding_matches_numpy():
    # float32 products rounded to float16 (to nearest even), compared bit for bit.
    host = [np.linspace(-65504, 65504, 2 * k.TILE + 3, dtype=np.float32).astype(np.float16)]
    assert run_and_check(k.unscale_fused, host, 1 / 3) == 0.0


# ---------------------------------------------------------------------------------------------
# Bad input: a clear error before any launch


def test_host_array_in_list_is_rejected():
    with pytest.raises(TypeError, match=r"grads\[1\] is a host \(NumPy\) array"):
        k.GradientList([cuda.to_device(np.ones(4, np.float32)), np.ones(4, np.float32)])


@pytest.mark.parametrize("dtype", [np.int32, np.float64, np.uint16])
def test_non_float_or_unsupported_dtype_is_rejected(dtype):
    with pytest.raises(TypeError, match=r"grads\[0\] has dtype .*expected float32 or float16"):
        k.GradientList([cuda.to_device(np.ones(4, dtype))])


def test_mixed_dtypes_are_rejected():
    with pytest.raises(TypeError, match="mixes dtypes"):
        k.GradientList([cuda.to_device(np.ones(4, np.float32)), cuda.to_device(np.ones(4, np.float16))])


def test_empty_list_and_single_array_are_rejected():
    with pytest.raises(ValueError, match="empty list"):
        k.GradientList([])
    with pytest.raises(TypeError, match="a list of device arrays, not one array"):
        k.GradientList(cuda.to_device(np.ones(4, np.float32)))


def test_misaligned_view_is_rejected():
    base = cuda.to_device(np.ones(9, np.float32))
    with pytest.raises(ValueError, match="not a multiple of 16 bytes"):
        k.GradientList([base[1:]])


def test_bad_max_tensors_per_launch_is_rejected():
    with pytest.raises(ValueError, match="max_tensors_per_launch"):
        k.GradientList([cuda.to_device(np.ones(4, np.float32))], max_tensors_per_launch=0)


@pytest.mark.parametrize("wrapper", WRAPPERS, ids=lambda w: w.__name__)
def test_wrapper_argument_errors(wrapper):
    grads = k.GradientList([cuda.to_device(np.ones(4, np.float32))])
    with pytest.raises(TypeError, match="grads must be a GradientList"):
        wrapper([cuda.to_device(np.ones(4, np.float32))], flag(0.0), flag(1.0))
    with pytest.raises(TypeError, match="found_inf is a host"):
        wrapper(grads, np.zeros(1, np.float32), flag(1.0))
    with pytest.raises(TypeError, match="inv_scale has dtype float64"):
        wrapper(grads, flag(0.0), cuda.to_device(np.ones(1, np.float64)))
    with pytest.raises(ValueError, match=r"found_inf has shape \(2,\), expected \(1,\)"):
        wrapper(grads, cuda.to_device(np.zeros(2, np.float32)), flag(1.0))


# ---------------------------------------------------------------------------------------------
# The loss scaler


def test_loss_scaler_backs_off_skips_and_grows():
    scaler = k.DynamicLossScaler(init_scale=8.0, growth_interval=2, max_steps=8)
    weights = cuda.to_device(np.ones(5, np.float32))
    grads = k.GradientList([cuda.to_device(np.full(5, 8.0, np.float32))])
    history_of_weights = []
    for step in range(5):
        host_grad = np.full(5, 8.0, np.float32)
        if step == 1:
            host_grad[2] = np.inf
        grads.flat[0].copy_to_device(host_grad)
        scaler.unscale_(grads)
        k.sgd_step_kernel[1, 32](weights, grads.flat[0], np.float32(0.5), scaler.found_inf)
        scaler.update()
        history_of_weights.append(weights.copy_to_host()[0])
    # scale used at each step: 8, 8 (Inf: back off), 4, 4 (2 good steps: grow), 8
    np.testing.assert_array_equal(scaler.history.copy_to_host()[:5], [8, 8, 4, 4, 8])
    assert scaler.inv_scale.copy_to_host()[0] == np.float32(1 / 8)
    # step 0: w -= 0.5 * 8/8; step 1 skipped; steps 2, 3: g = 8/4 = 2; step 4: g = 1
    np.testing.assert_allclose(history_of_weights, [0.5, 0.5, -0.5, -1.5, -2.0])
    assert scaler.found_inf.copy_to_host()[0] == 0.0  # reset for the next step


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
def test_scale_to_half_overflows_to_inf_like_a_float16_backward():
    # The chapter's stand-in for a float16 backward pass of (loss * scale): 70000 overflows float16.
    grad32 = np.array([1.0, -3.0, 70000.0 / 1024, 1e-8, np.nan, 0.1], np.float32)
    scale = cuda.to_device(np.array([1024.0], np.float32))
    grad16 = cuda.to_device(np.zeros(grad32.size, np.float16))
    k.scale_to_half_kernel[1, 32](cuda.to_device(grad32), scale, grad16)
    np.testing.assert_array_equal(grad16.copy_to_host(), (grad32 * np.float32(1024)).astype(np.float16))
    assert np.isinf(grad16.copy_to_host()[2])


def test_loss_scaler_rejects_bad_parameters():
    with pytest.raises(ValueError, match="growth > 1"):
        k.DynamicLossScaler(growth=1.0)
