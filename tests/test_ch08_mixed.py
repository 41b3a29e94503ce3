"""Chapter 08 in mixed precision: the float16 kernels against NumPy at awkward sizes, one mixed step
against the float64 network, and the loss scale's rule: a planted overflow skips the step."""

import numpy as np
import pytest

import workbook  # noqa: F401  (selects the GPU or the simulator first)
from numba import cuda

from chapters.ch02_dropout import kernels as drop
from chapters.ch04_implicit_gemm.kernels import conv_geometry
from chapters.ch08_capstone import half as H
from chapters.ch08_capstone import layers as L
from chapters.ch08_capstone import mixed
from chapters.ch08_capstone import network as nw


def _channels_last16(a, channels):
    """NumPy's to_half: (N, C, HW) float32 -> (N, HW, channels) float16, zeros beyond C."""
    out = np.zeros((a.shape[0], a.shape[2], channels), np.float16)
    with np.errstate(over="ignore"):  # what passes 65504 is Inf, as on the GPU
        out[..., :a.shape[1]] = a.transpose(0, 2, 1)
    return out


@pytest.mark.parametrize("shape, channels", [((1, 1, 1), 8), ((2, 3, 31), 8), ((3, 33, 5), 40), ((1, 40, 33), 40),
                                             ((2, 8, 64), 8)])
def test_to_half_transposes_pads_and_overflows_as_float16(shape, channels):
    rng = np.random.default_rng(sum(shape))
    a = rng.standard_normal(shape).astype(np.float32)
    a.flat[::7] = np.inf
    a.flat[3::11] = np.nan
    a.flat[5::13] = 1e5  # past float16's 65504: Inf, as a scaled gradient that overflows
    dst = cuda.to_device(np.full((shape[0], shape[2], channels), 7, np.float16))
    H.to_half(cuda.to_device(a), dst)
    np.testing.assert_array_equal(dst.copy_to_host(), _channels_last16(a, channels))


def test_to_half_rejects_wrong_shapes():
    src = cuda.to_device(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="Cp >= 3"):
        H.to_half(src, cuda.to_device(np.zeros((2, 4, 2), np.float16)))
    with pytest.raises(TypeError, match="float16"):
        H.to_half(src, cuda.to_device(np.zeros((2, 4, 8), np.float32)))


@pytest.mark.parametrize("k, c", [(1, 1), (5, 3), (33, 9)])
def test_half_filters_both_layouts(k, c):
    w = np.random.default_rng(k).standard_normal((k, c, 3, 3)).astype(np.float32)
    w16 = cuda.device_array((k, 3, 3, H.padded(c)), np.float16)
    wt16 = cuda.device_array((c, 3, 3, H.padded(k)), np.float16)
    H.half_filters(cuda.to_device(w), w16, wt16)
    forward = np.zeros(w16.shape, np.float16)
    forward[..., :c] = w.transpose(0, 2, 3, 1)
    turned = np.zeros(wt16.shape, np.float16)
    turned[..., :k] = w[:, :, ::-1, ::-1].transpose(1, 2, 3, 0)
    np.testing.assert_array_equal(w16.copy_to_host(), forward)
    np.testing.assert_array_equal(wt16.copy_to_host(), turned)


# (N, C, H, W, K, stride, padding, dilation, slices): one image of one channel, odd planes, K past a
# tile (32), a stride, a dilation, more slices than steps
WGRAD = [(1, 1, 3, 3, 1, 1, 1, 1, 1), (2, 3, 5, 7, 5, 1, 1, 1, 2), (3, 9, 6, 5, 33, 2, 0, 1, 3),
         (2, 8, 7, 6, 8, 1, 2, 2, 1), (1, 16, 4, 4, 3, 1, 1, 1, 5)]


@pytest.mark.parametrize("case", WGRAD)
def test_wgrad_half_matches_the_reference_on_float16_data(case):
    n, c, h, w, k, stride, padding, dilation, slices = case
    rng = np.random.default_rng(n * 100 + c)
    x = rng.standard_normal((n, c, h, w)).astype(np.float16)
    g = conv_geometry(x.shape, (k, c, 3, 3), stride, padding, dilation)
    dy = rng.standard_normal(g.out_shape).astype(np.float16)
    x16 = cuda.to_device(_channels_last16(x.reshape(n, c, -1).astype(np.float32), H.padded(c)).reshape(n, h, w, -1))
    dy16 = cuda.to_device(_channels_last16(dy.reshape(n, k, -1).astype(np.float32), H.padded(k))
                          .reshape(n, g.P, g.Q, -1))
    dw = cuda.to_device(np.zeros((k, c, 3, 3), np.float32))
    H.wgrad_half(x16, dy16, dw, stride=stride, padding=padding, dilation=dilation, slices=slices)
    _, ref = L.conv2d_backward_reference(x, np.zeros((k, c, 3, 3), np.float32), dy, stride, padding, dilation)
    # float16 products are exact in float32; only the float32 sums round
    np.testing.assert_allclose(dw.copy_to_host(), ref, rtol=1e-5, atol=1e-5 * np.sqrt(g.N * g.P * g.Q))


def test_wgrad_half_rejects_what_it_cannot_do():
    x16 = cuda.to_device(np.zeros((1, 4, 4, 8), np.float16))
    dw = cuda.to_device(np.zeros((3, 2, 3, 3), np.float32))
    with pytest.raises(ValueError, match="dy16 must be"):
        H.wgrad_half(x16, cuda.to_device(np.zeros((1, 4, 4, 3), np.float16)), dw, padding=1)  # Kp not padded
    with pytest.raises(ValueError, match="slices"):
        H.wgrad_half(x16, cuda.to_device(np.zeros((1, 4, 4, 8), np.float16)), dw, padding=1, slices=0)


def test_scale_to_half_and_a_skipped_sgd_step():
    a = cuda.to_device(np.array([0, 1, -2, 3e4, 3], np.float32))
    a16 = cuda.to_device(np.zeros((5, 1), np.float16))
    H.scale_to_half(a, cuda.to_device(np.array([4.0], np.float32)), a16)
    np.testing.assert_array_equal(a.copy_to_host(), [0, 4, -8, 1.2e5, 12])
    np.testing.assert_array_equal(a16.copy_to_host().ravel(), [0, 4, -8, np.inf, 12])  # past 65504: Inf
    with pytest.raises(ValueError, match="5 elements"):
        H.scale_to_half(a, cuda.to_device(np.array([4.0], np.float32)), cuda.to_device(np.zeros(4, np.float16)))
    params, grads, velocity = (cuda.to_device(np.ones(9, np.float32)) for _ in range(3))
    L.sgd_momentum(params, grads, velocity, lr=0.1, skip_if=cuda.to_device(np.ones(1, np.float32)))
    np.testing.assert_array_equal(params.copy_to_host(), np.ones(9))  # skipped: nothing moved
    L.sgd_momentum(params, grads, velocity, lr=0.1, skip_if=cuda.to_device(np.zeros(1, np.float32)))
    assert params.copy_to_host()[0] == pytest.approx(1 - 0.1 * (0.9 + 1))


def _mixed_step(batch=2, width=2, p=0.25, **options):
    params = nw.init_parameters(width, seed=3)
    rng = np.random.default_rng(5)
    x = rng.standard_normal((batch, 1, 8, 8), dtype=np.float32)
    t = rng.integers(0, nw.CLASSES, batch).astype(np.int32)
    net = mixed.MixedNetwork(params, batch, p_drop=p, seed=99, **options)
    net.set_step(7)
    net.load_batch(x, t)
    keep = drop.keep_reference(batch * width, p, 99, 7).reshape(batch, width)
    return net, params, nw.reference_loss_and_grads(params, x, t, keep, p, half_scale=net.init_scale)


def test_one_mixed_step_matches_the_float64_network_and_skips_a_planted_overflow():
    net, params, (loss_ref, grads_ref) = _mixed_step(growth_interval=1)
    net.forward()
    net.backward()
    net.unscale()
    assert float(net.scaler.found_inf.copy_to_host()[0]) == 0
    assert float(net.loss.copy_to_host()[0]) == pytest.approx(loss_ref, rel=1e-3)
    got = net.grads.to_host()
    for name, ref in grads_ref.items():  # the reference rounds where the network does: float32 sums left
        assert np.linalg.norm(got[name] - ref) <= 1e-3 * np.linalg.norm(ref), name
    # a loss scale no float16 gradient survives: the step changes no weight, the scale halves
    net.set_scale(2.0**60)
    before, velocity = net.params.to_host(), net.velocity.to_host()
    net.forward()
    net.backward()
    net.update()
    after = net.params.to_host()
    for name in before:
        np.testing.assert_array_equal(after[name], before[name], err_msg=name)
        np.testing.assert_array_equal(net.velocity.to_host()[name], velocity[name], err_msg=name)
    scales, skipped = net.scales_so_far(9)
    assert scales[7] == 2.0**60 and skipped[7]
    assert float(net.scaler.scale.copy_to_host()[0]) == 2.0**59
    assert float(net.scaler.found_inf.copy_to_host()[0]) == 0  # cleared for the next step
    # a clean step (growth_interval=1) at an ordinary scale doubles it
    net.set_scale(4.0)
    net.forward()
    net.backward()
    net.update()
    scales, skipped = net.scales_so_far(9)
    assert scales[8] == 4.0 and not skipped[8] and float(net.scaler.scale.copy_to_host()[0]) == 8.0
    assert any(not np.array_equal(net.params.to_host()[name], before[name]) for name in before)


def test_the_rounding_reference_is_the_float64_network_without_its_roundings():
    params = nw.init_parameters(2, seed=4)
    rng = np.random.default_rng(6)
    x, t = rng.standard_normal((2, 1, 8, 8)), np.array([1, 7])
    keep = np.array([[True, False], [True, True]])
    plain = nw.reference_loss_and_grads(params, x, t, keep, 0.25)
    rounded = nw.reference_loss_and_grads(params, x, t, keep, 0.25, half_scale=2.0**16)
    assert rounded[0] == pytest.approx(plain[0], rel=1e-2) and rounded[0] != plain[0]
    for name in params:
        assert np.linalg.norm(rounded[1][name] - plain[1][name]) <= 0.1 * np.linalg.norm(plain[1][name]), name


def test_mixed_network_rejects_a_bad_variant():
    with pytest.raises(ValueError, match="variant"):
        mixed.MixedNetwork(nw.init_parameters(2), 2, variant="fast")
