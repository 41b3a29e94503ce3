"""Chapter 08, the capstone: each new layer against NumPy at awkward sizes, the gradients as adjoints
of the forwards, and one whole training step against the float64 NumPy network."""

import numpy as np
import pytest

import workbook  # noqa: F401  (selects the GPU or the simulator first)
from numba import cuda

from chapters.ch02_dropout import kernels as drop
from chapters.ch04_implicit_gemm import kernels as conv
from chapters.ch08_capstone import layers as L
from chapters.ch08_capstone import network as nw
from workbook.check import assert_close


def _conv_case(seed, n, c, h, w, k, r, s):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((n, c, h, w)).astype(np.float32),
            rng.standard_normal((k, c, r, s)).astype(np.float32), rng)


# (N, C, H, W, K, R, S, padding, dilation): one image, one channel, odd planes, 1x1 and 5x5
# filters, a dilation, and planes wider than a tile
UNIT_STRIDE = [(1, 1, 1, 1, 1, 1, 1, 0, 1), (2, 3, 5, 7, 4, 3, 3, 1, 1), (1, 2, 9, 4, 3, 5, 5, 2, 1),
               (3, 2, 6, 5, 3, 3, 3, 2, 2), (2, 5, 3, 33, 7, 3, 1, (1, 0), 1), (1, 4, 8, 8, 9, 3, 3, 0, 1)]


@pytest.mark.parametrize("case", UNIT_STRIDE)
def test_conv_dgrad_matches_the_reference(case):
    n, c, h, w, k, r, s, padding, dilation = case
    x, wt, rng = _conv_case(1, n, c, h, w, k, r, s)
    g = conv.conv_geometry(x.shape, wt.shape, 1, padding, dilation)
    dy = rng.standard_normal(g.out_shape).astype(np.float32)
    dx_ref, _ = L.conv2d_backward_reference(x, wt, dy, 1, padding, dilation)
    dx = cuda.to_device(np.full(x.shape, np.nan, np.float32))  # every element must be written
    L.conv2d_dgrad(cuda.to_device(dy), cuda.to_device(wt), dx, padding=padding, dilation=dilation)
    rtol, atol = conv.tolerance(k * r * s)
    assert_close(dx, dx_ref.astype(np.float32), rtol=rtol, atol=atol)


@pytest.mark.parametrize("case", UNIT_STRIDE + [(2, 3, 7, 6, 2, 3, 3, 1, 1, 2), (1, 2, 9, 9, 3, 3, 3, 0, 1, 3)])
@pytest.mark.parametrize("slices", [None, 1, 3])
def test_conv_wgrad_matches_the_reference_with_any_number_of_slices(case, slices):
    n, c, h, w, k, r, s, padding, dilation, *stride = case
    stride = stride[0] if stride else 1  # the weight gradient takes strides too
    x, wt, rng = _conv_case(2, n, c, h, w, k, r, s)
    g = conv.conv_geometry(x.shape, wt.shape, stride, padding, dilation)
    dy = rng.standard_normal(g.out_shape).astype(np.float32)
    _, dw_ref = L.conv2d_backward_reference(x, wt, dy, stride, padding, dilation)
    dw = cuda.to_device(np.full(wt.shape, np.nan, np.float32))
    L.conv2d_wgrad(cuda.to_device(x), cuda.to_device(dy), dw, stride=stride, padding=padding, dilation=dilation,
                   slices=slices)
    assert_close(dw, dw_ref.astype(np.float32), rtol=1e-4, atol=2e-6 * g.N * g.P * g.Q + 1e-5)


def test_backward_reference_is_the_adjoint_of_the_forward():
    # <dy, conv(v, w)> = <dx, v> and <dy, conv(x, u)> = <dw, u> for any v, u: checks the NumPy
    # reference (and through it the kernels) without trusting another implementation
    x, wt, rng = _conv_case(3, 2, 3, 6, 5, 4, 3, 3)
    for stride, padding, dilation in ((1, 1, 1), (2, 1, 1), (1, 2, 2)):
        g = conv.conv_geometry(x.shape, wt.shape, stride, padding, dilation)
        dy = rng.standard_normal(g.out_shape)
        dx, dw = L.conv2d_backward_reference(x, wt, dy, stride, padding, dilation)
        v, u = rng.standard_normal(x.shape), rng.standard_normal(wt.shape)
        lhs_x = np.vdot(dy, conv.conv2d_reference(v, wt, stride, padding, dilation).astype(np.float64))
        lhs_w = np.vdot(dy, conv.conv2d_reference(x, u, stride, padding, dilation).astype(np.float64))
        assert np.vdot(dx, v) == pytest.approx(lhs_x, rel=1e-5, abs=1e-4)
        assert np.vdot(dw, u) == pytest.approx(lhs_w, rel=1e-5, abs=1e-4)


def test_conv_gradients_reject_what_they_cannot_do():
    dy = cuda.device_array((1, 2, 4, 4), np.float32)
    w = cuda.device_array((2, 3, 3, 3), np.float32)
    dx = cuda.device_array((1, 3, 4, 4), np.float32)
    with pytest.raises(ValueError, match="more than the filter's reach"):  # outputs of padding alone
        L.conv2d_dgrad(cuda.device_array((1, 2, 8, 8), np.float32), w, dx, padding=3)
    with pytest.raises(ValueError, match="shape"):  # dy of the wrong shape for this geometry
        L.conv2d_dgrad(dy, w, dx, padding=0)
    with pytest.raises(TypeError, match="host"):
        L.conv2d_dgrad(dy.copy_to_host(), w, dx, padding=1)
    with pytest.raises(TypeError, match="dtype"):
        L.conv2d_wgrad(cuda.device_array((1, 3, 4, 4), np.float64), dy, w, padding=1)
    with pytest.raises(ValueError, match="slices"):
        L.conv2d_wgrad(dx, dy, w, padding=1, slices=0)


@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (2, 3, 4, 8), (3, 2, 5, 7), (1, 33, 1, 33)])
def test_global_average_pool_and_its_backward(shape):
    rng = np.random.default_rng(4)
    x = rng.standard_normal(shape).astype(np.float32)
    out = cuda.to_device(np.full(shape[:2], np.nan, np.float32))
    L.global_avg_pool(cuda.to_device(x), out)
    assert_close(out, x.astype(np.float64).mean(axis=(2, 3)).astype(np.float32), rtol=1e-5, atol=1e-6)
    d_out = rng.standard_normal(shape[:2]).astype(np.float32)
    dx = cuda.to_device(np.full(shape, np.nan, np.float32))
    L.global_avg_pool_backward(cuda.to_device(d_out), dx)
    expected = np.broadcast_to(d_out[:, :, None, None] / np.float32(shape[2] * shape[3]), shape)
    assert_close(dx, expected.astype(np.float32), rtol=1e-6, atol=0)
    with pytest.raises(ValueError, match="shape"):
        L.global_avg_pool(cuda.to_device(x), cuda.device_array((shape[0], shape[1] + 1), np.float32))


@pytest.mark.parametrize("rows, cols", [(1, 1), (31, 33), (33, 65), (64, 10)])
def test_transpose(rows, cols):
    a = np.random.default_rng(rows).standard_normal((rows, cols)).astype(np.float32)
    at = cuda.to_device(np.full((cols, rows), np.nan, np.float32))
    L.transpose(cuda.to_device(a), at)
    assert_close(at, a.T.copy(), exact=True)


@pytest.mark.parametrize("batch, inputs, outputs", [(1, 1, 1), (7, 5, 10), (33, 32, 10)])
def test_linear_forward_and_backward(batch, inputs, outputs):
    rng = np.random.default_rng(batch)
    x, wt, b, d_out = (rng.standard_normal(shape).astype(np.float32) for shape in
                       ((batch, inputs), (inputs, outputs), (outputs,), (batch, outputs)))
    d = [cuda.to_device(a) for a in (x, wt, b, d_out)]
    out = cuda.device_array((batch, outputs), np.float32)
    L.linear_forward(d[0], d[1], d[2], out)
    x64, w64, d64 = x.astype(np.float64), wt.astype(np.float64), d_out.astype(np.float64)
    assert_close(out, (x64 @ w64 + b).astype(np.float32), rtol=1e-5, atol=1e-5)
    dx, dwt, db = (cuda.device_array(shape, np.float32) for shape in (x.shape, wt.shape, b.shape))
    L.linear_backward(d[0], d[1], d[3], dx, dwt, db)
    assert_close(dx, (d64 @ w64.T).astype(np.float32), rtol=1e-5, atol=1e-5)
    assert_close(dwt, (x64.T @ d64).astype(np.float32), rtol=1e-5, atol=1e-5 * batch)
    assert_close(db, d64.sum(axis=0).astype(np.float32), rtol=1e-5, atol=1e-5 * batch)
    with pytest.raises(ValueError, match="wt must be"):
        L.linear_forward(d[0], cuda.device_array((inputs + 1, outputs), np.float32), d[2], out)


@pytest.mark.parametrize("identity", [False, True])
def test_batchnorm_eval_relu(identity):
    rng = np.random.default_rng(5)
    shape = (3, 5, 3, 7)
    x = rng.standard_normal(shape).astype(np.float32)
    gamma, beta, mean = (rng.standard_normal(5).astype(np.float32) for _ in range(3))
    var = rng.uniform(0.5, 2, 5).astype(np.float32)
    extra = rng.standard_normal(shape).astype(np.float32)
    y = cuda.device_array(shape, np.float32)
    L.batchnorm_eval_relu(*(cuda.to_device(a) for a in (x, gamma, beta, mean, var)), y,
                          identity=cuda.to_device(extra) if identity else None)
    c = (slice(None), None, None)
    z = (x - mean[c]) / np.sqrt(var[c].astype(np.float64) + 1e-5) * gamma[c] + beta[c] + (extra if identity else 0)
    assert_close(y, np.maximum(z, 0).astype(np.float32), rtol=1e-5, atol=1e-5)


def test_sgd_momentum_is_torchs_formula_and_rejects_bad_rates():
    rng = np.random.default_rng(6)
    w, g, v = (rng.standard_normal(1001).astype(np.float32) for _ in range(3))
    dw, dg, dv = (cuda.to_device(a) for a in (w, g, v))
    L.sgd_momentum(dw, dg, dv, lr=0.1, momentum=0.9, weight_decay=5e-4)
    v_new = 0.9 * v.astype(np.float64) + g + 5e-4 * w
    assert_close(dv, v_new.astype(np.float32), rtol=1e-6, atol=1e-6)
    assert_close(dw, (w - 0.1 * v_new).astype(np.float32), rtol=1e-6, atol=1e-6)
    for bad in (-0.1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="lr"):
            L.sgd_momentum(dw, dg, dv, lr=bad)
    with pytest.raises(ValueError, match="shape"):
        L.sgd_momentum(dw, cuda.device_array(1000, np.float32), dv, lr=0.1)


@pytest.mark.parametrize("n, offset", [(1, 0), (33, 0), (1000, 1)])
def test_dropout_reads_its_offset_from_the_counter(n, offset):
    # offset 1: a view that is not 16-byte aligned takes the element-by-element kernel
    x_host = np.random.default_rng(n).standard_normal(n + offset).astype(np.float32)
    x = cuda.to_device(x_host)[offset:]
    y, mask = cuda.device_array(n, np.float32), cuda.device_array(-(-n // 32), np.uint32)
    counter = cuda.to_device(np.array([2**33 + 5], np.uint64))  # both words of the offset matter
    for step in range(2):
        drop.dropout_bitmask_counted(x, 0.3, 42, counter, y, mask)
        y_ref, mask_ref = drop.dropout_reference(x_host[offset:], 0.3, 42, 2**33 + 5 + step)
        assert_close(y, y_ref, exact=True)
        assert_close(mask, mask_ref, exact=True)
        counter.copy_to_device(np.array([2**33 + 6], np.uint64))  # what end_step_kernel does


def _tiny_step(batch, width, p, seed=99, step=7):
    params = nw.init_parameters(width, seed=3)
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((batch, 1, 8, 8)).astype(np.float32)
    t = rng.integers(0, nw.CLASSES, batch).astype(np.int32)
    net = nw.Network(params, batch, p_drop=p, seed=seed)
    net.set_step(step)
    net.load_batch(x, t)
    net.forward()
    net.backward()
    keep = drop.keep_reference(batch * width, p, seed, step).reshape(batch, width)
    return net, nw.reference_loss_and_grads(params, x, t, keep, p), (params, x, t, keep)


def test_one_step_matches_the_float64_network_which_matches_finite_differences():
    net, (loss_ref, grads_ref), (params, x, t, keep) = _tiny_step(batch=3, width=2, p=0.25)
    assert float(net.loss.copy_to_host()[0]) == pytest.approx(loss_ref, rel=1e-5)
    got = net.grads.to_host()
    for name, ref in grads_ref.items():
        assert np.linalg.norm(got[name] - ref) <= 1e-4 * np.linalg.norm(ref), name
    # the reference itself, by central differences on one coordinate of each parameter
    for name, value in params.items():
        index = np.unravel_index(value.size // 2, value.shape)
        moved = []
        for h in (1e-6, -1e-6):
            changed = dict(params, **{name: value.astype(np.float64).copy()})
            changed[name][index] += h
            moved.append(nw.reference_loss_and_grads(changed, x, t, keep, 0.25)[0])
        numeric = (moved[0] - moved[1]) / 2e-6
        assert numeric == pytest.approx(grads_ref[name][index], rel=1e-4, abs=1e-8), name


def test_a_step_trains_gathers_its_batch_and_counts():
    width, batch = 2, 2
    params = nw.init_parameters(width, seed=1)
    net = nw.Network(params, batch, lr=0.05)
    rng = np.random.default_rng(8)
    images = rng.standard_normal((5, 1, 8, 8)).astype(np.float32)
    labels = np.arange(5, dtype=np.int32)
    net.attach(images, labels)
    assert net.steps_per_epoch == 2  # 5 images, batches of 2: the last one waits for the next epoch
    order = np.array([4, 2, 0, 1, 3], np.int32)
    net.set_order(order)
    net.set_step(1)
    net.step()
    assert_close(net.x, images[[0, 1]], exact=True)  # batch 1 of the order
    assert_close(net.targets, labels[[0, 1]], exact=True)
    assert int(net.counter.copy_to_host()[0]) == 2
    assert net.losses_so_far(2)[1] == pytest.approx(float(net.loss.copy_to_host()[0]))
    after = net.params.to_host()
    grads = net.grads.to_host()
    for name in params:  # the first step from zero momentum: w - lr * (g + wd * w)
        expected = params[name] - 0.05 * (grads[name] + 5e-4 * params[name])
        np.testing.assert_allclose(after[name], expected, rtol=1e-5, atol=1e-7, err_msg=name)
    graph = net.graph()  # in the simulator: the same launches one by one
    graph()
    assert int(net.counter.copy_to_host()[0]) >= 3


def test_network_rejects_bad_parameters_and_data():
    params = nw.init_parameters(2)
    with pytest.raises(ValueError, match="params"):
        nw.Network({**params, "conv2": np.zeros((2, 3, 3, 3), np.float32)}, 2)
    with pytest.raises(ValueError, match="batch"):
        nw.Network(params, 0)
    net = nw.Network(params, 4)
    with pytest.raises(ValueError, match="at least 4"):
        net.attach(np.zeros((3, 1, 8, 8), np.float32), np.zeros(3, np.int32))
    net.attach(np.zeros((4, 1, 8, 8), np.float32), np.zeros(4, np.int32))
    with pytest.raises(ValueError, match="permutation"):
        net.set_order(np.arange(3))


def test_digits_split_is_fixed_and_complete():
    pytest.importorskip("sklearn")
    train_x, train_y, test_x, test_y = nw.load_digits()
    assert train_x.shape == (1437, 1, 8, 8) and test_x.shape == (360, 1, 8, 8)
    assert set(np.unique(train_y)) == set(range(10))
    again = nw.load_digits()
    assert np.array_equal(again[1], train_y) and np.array_equal(again[2], test_x)
    assert abs(float(train_x.mean())) < 0.1 and 0.8 < float(train_x.std()) < 1.2
