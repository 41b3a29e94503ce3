"""Chapter 07: a prepared launch and a captured step compute what the plain launches compute."""

import numpy as np
import pytest

import workbook  # noqa: F401  (selects the GPU or the simulator first)
from numba import cuda

from chapters.ch01_relu_mask import kernels as relu
from chapters.ch07_launch_overhead import launch as L
from workbook.check import assert_close
from workbook.launch import PreparedLaunch, StepGraph, prepared


@pytest.mark.parametrize("n", [1, 31, 33, 1000])
@pytest.mark.parametrize("via", ["driver", "cuda.core"])
def test_prepared_launch_computes_what_the_plain_launch_does(n, via):
    x = cuda.to_device(np.arange(n, dtype=np.float32) - n / 2)
    out = cuda.to_device(np.full(n, np.nan, np.float32))
    launch = PreparedLaunch(L.scale_kernel, -(-n // 32), 32, x, np.float32(-2.5), out, via=via, returns=out)
    assert launch() is out
    assert_close(out, L.scale_reference(x.copy_to_host(), -2.5), exact=True)
    x.copy_to_device(np.ones(n, np.float32))  # new data in the same buffer: the same launch sees it
    launch()
    assert_close(out, np.full(n, -2.5, np.float32), exact=True)


def test_prepared_launch_rejects_host_arrays_and_unknown_paths():
    out = cuda.device_array(4, np.float32)
    with pytest.raises(TypeError, match="host"):
        PreparedLaunch(L.scale_kernel, 1, 32, np.zeros(4, np.float32), np.float32(1), out)
    with pytest.raises(ValueError, match="via"):
        PreparedLaunch(L.scale_kernel, 1, 32, out, np.float32(1), out, via="magic")


@pytest.mark.parametrize("n", [1, 33, 4099])
@pytest.mark.parametrize("offset", [0, 1])
def test_prepared_relu_mask_matches_the_wrapper(n, offset):
    # offset 1: a view that is not 16-byte aligned takes the ballot kernel, as the wrapper does
    base = np.random.default_rng(n).standard_normal(n + offset).astype(np.float32)
    base[offset] = np.nan
    x = cuda.to_device(base)[offset:]
    y = cuda.device_array(n + offset, np.float32)[offset:]
    mask = cuda.device_array(relu.mask_words(n), np.uint32)
    launch = relu.prepare_relu_mask_quads(x, y, mask)
    expected_y, expected_mask = relu.relu_mask_reference(base[offset:])
    got_y, got_mask = launch()
    assert_close(got_y, expected_y, exact=True)
    assert_close(got_mask, expected_mask, exact=True)


def test_prepared_relu_mask_checks_once_like_the_wrapper():
    x = cuda.device_array(64, np.float32)
    with pytest.raises(ValueError):
        relu.prepare_relu_mask_quads(x, cuda.device_array(63, np.float32), cuda.device_array(2, np.uint32))


def test_step_graph_replays_the_step():
    n = 100
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    tmp, out = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)

    def step(stream):  # two launches, the second reading the first's output
        L.scale_kernel[4, 32, stream](x, np.float32(2), tmp)
        L.scale_kernel[4, 32, stream](tmp, np.float32(3), out)

    graph = StepGraph(step)
    out.copy_to_device(np.zeros(n, np.float32))
    graph()
    graph.stream.synchronize()
    assert_close(out, 6 * np.arange(n, dtype=np.float32), exact=True)
    x.copy_to_device(np.ones(n, np.float32))  # the graph reads the same buffers at every replay
    graph()
    graph.stream.synchronize()
    assert_close(out, np.full(n, 6, np.float32), exact=True)


@pytest.mark.parametrize("n", [1, 33, 1001])
def test_prepared_dropout_takes_a_new_offset_each_step(n):
    from chapters.ch02_dropout import kernels as dropout

    x_host = np.random.default_rng(n).standard_normal(n).astype(np.float32)
    x = cuda.to_device(x_host)
    y, mask = cuda.device_array(n, np.float32), cuda.device_array(-(-n // 32), np.uint32)
    step = dropout.prepare_dropout_bitmask(x, 0.3, 1234, y, mask)
    for offset in (0, 8, 2**40 + 4):
        got_y, got_mask = step(offset)
        expected_y, expected_mask = dropout.dropout_reference(x_host, 0.3, 1234, offset)
        assert_close(got_y, expected_y, exact=True, name=f"y, offset {offset}")
        assert_close(got_mask, expected_mask, exact=True, name=f"mask, offset {offset}")


@pytest.mark.parametrize("shape", [(1, 1), (3, 33), (5, 256), (2, 1500)])
def test_prepared_softmax_matches_the_wrapper(shape):
    from chapters.ch06_softmax import kernels as sm

    x_host = np.random.default_rng(shape[1]).standard_normal(shape).astype(np.float32)
    x, out = cuda.to_device(x_host), cuda.device_array(shape, np.float32)
    launch = sm.prepare_softmax(x, out)
    assert_close(launch(), sm.softmax(x, cuda.device_array(shape, np.float32)), rtol=1e-6, atol=1e-7)


def test_only_scalars_can_be_changed():
    out = cuda.device_array(4, np.float32)
    launch = PreparedLaunch(L.scale_kernel, 1, 32, out, np.float32(1), out)
    launch.set(1, 2.0)  # a scalar: fine
    if prepared():
        with pytest.raises(TypeError, match="not a scalar"):
            launch.set(0, 1.0)


@cuda.jit
def scale_into_kernel(x, out, factor):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = factor * x[i]


def test_launch_cache_reuses_a_launch_only_for_the_same_live_buffers():
    from workbook.launch import LaunchCache

    cache = LaunchCache(size=2)
    n = 40
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    outs = [cuda.device_array(n, np.float32) for _ in range(3)]
    for factor in (2.0, 3.0):  # a changed scalar is stored into the cached launch
        for out in outs:  # three buffers through a cache of two: evictions
            cache.launch(scale_into_kernel, 2, 32, (x, out), (np.float32(factor),))
            assert_close(out, factor * np.arange(n, dtype=np.float32), exact=True)
    del outs[0]  # a buffer freed: a new one may get its address, and the launch kept for that address fits it
    fresh = cuda.device_array(n, np.float32)
    cache.launch(scale_into_kernel, 2, 32, (x, fresh), (np.float32(5.0),))
    assert_close(fresh, 5 * np.arange(n, dtype=np.float32), exact=True)


def test_launch_cache_plans_once_per_set_of_buffers():
    from workbook.launch import LaunchCache

    cache, plans = LaunchCache(size=4), []

    def choose(x, factor, out, variant):  # a wrapper's kernel choice: the arguments in, a launch out
        plans.append((x.shape, variant))
        return L.scale_kernel, max(1, -(-x.size // 32)), 32

    values = np.arange(70, dtype=np.float32)
    x, out = cuda.to_device(values), cuda.device_array(70, np.float32)
    for factor in (2.0, 3.0):
        cache.launch_planned(choose, (x, np.float32(factor), out), ("plain",))
        assert_close(out, factor * values, exact=True)
    short, short_out = x[:33], cuda.device_array(33, np.float32)  # other buffers: planned again
    cache.launch_planned(choose, (short, np.float32(1.0), short_out), ("plain",))
    assert_close(short_out, values[:33], exact=True)
    # where launches are prepared the plan runs once per set of buffers; elsewhere (the simulator, the
    # successor compiler) there is no cache and it plans per call
    expected = [((70,), "plain"), ((33,), "plain")]
    assert plans == (expected if prepared() else expected[:1] * 2 + expected[1:])


def test_launch_cache_finds_the_launch_of_a_new_view_of_the_same_memory():
    from workbook.launch import LaunchCache

    cache = LaunchCache(size=4)
    values = np.arange(40, dtype=np.float32)
    x = cuda.to_device(values.reshape(4, 10))
    out = cuda.device_array(40, np.float32)
    for factor in (2.0, -1.5):  # a scalar between the arrays, changed in place
        cache.launch(L.scale_kernel, 2, 32, (x.reshape(40), np.float32(factor), out))  # a fresh view each call
        assert_close(out, factor * values, exact=True)
    if prepared():
        assert len(cache.entries) == 1  # one launch prepared, found again through the view's address
    tail = cuda.device_array(30, np.float32)
    cache.launch(L.scale_kernel, 1, 32, (x.reshape(40)[10:], np.float32(4.0), tail))  # other memory: its own launch
    assert_close(tail, 4 * values[10:], exact=True)
