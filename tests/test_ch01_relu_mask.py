import workbook  # noqa: I001  (first: it picks the GPU or the simulator before numba.cuda is imported)

import numpy as np
import pytest

from workbook import cuda

from chapters.ch01_relu_mask import batchnorm as bn
from chapters.ch01_relu_mask import kernels as k

LARGE_ODD = workbook.size(gpu=(1 << 22) + 7, sim=3001)
SIZES = [1, 31, 32, 33, 1000, 257 * 3, LARGE_ODD]  # 771: not a multiple of a block or of a 256-element trip
FORWARDS = [k.relu_mask_sequential, k.relu_mask_ballot, k.relu_mask_wide, k.relu_mask_quads]
SIZES_WIDE = [2, 63, 64, 65, 127, 129, 511, 513]  # pairs, rows of 64, warps of 128 quads, trips of 256


def empty_outputs(n):
    return cuda.device_array(n, np.float32), cuda.device_array(k.mask_words(n), np.uint32)


# ---------------------------------------------------------------------------------------------
# ReLU forward with mask


@pytest.mark.parametrize("forward", FORWARDS, ids=lambda f: f.__name__)
@pytest.mark.parametrize("n", SIZES + SIZES_WIDE)
def test_forward_matches_reference(forward, n):
    x = k.special_inputs(n)
    y_ref, mask_ref = k.relu_mask_reference(x)
    d_y, d_mask = empty_outputs(n)
    d_mask.copy_to_device(np.full(d_mask.size, 0xFFFFFFFF, np.uint32))  # padding bits must be written as 0
    y, mask = forward(cuda.to_device(x), d_y, d_mask)
    workbook.assert_close(y, y_ref, exact=True, name="y")
    workbook.assert_bitmask(mask, x > 0)
    assert np.array_equal(mask.copy_to_host(), np.packbits(np.pad(x > 0, (0, 32 * mask.size - n)),
                                                           bitorder="little").view(np.uint32))


def test_mask_bits_of_special_values():
    x = np.array([np.nan, -np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45], dtype=np.float32)
    for forward in FORWARDS:
        y, mask = forward(cuda.to_device(x), *empty_outputs(x.size))
        # NaN -> 0, +inf -> 1, -inf -> 0, +-0 -> 0, the smallest positive subnormal -> 1
        assert mask.copy_to_host()[0] == 0b01000100, forward.__name__  # bits 2 and 6
        y = y.copy_to_host()
        assert np.isnan(y[:2]).all() and y[2] == np.inf
        assert not np.signbit(y[3:6]).any()  # -inf, 0 and -0 all give +0.0


@pytest.mark.parametrize("forward", [k.relu_mask_ballot, k.relu_mask_wide], ids=lambda f: f.__name__)
@pytest.mark.parametrize("blocks", [1, 2])
@pytest.mark.parametrize("n", [3001, 4096])
def test_ballot_grid_stride_several_trips_per_warp(forward, blocks, n):
    # One or two blocks for thousands of elements: every warp goes round the trip loop more than once.
    x = k.special_inputs(n, seed=1)
    y, mask = forward(cuda.to_device(x), *empty_outputs(n), blocks=blocks)
    workbook.assert_close(y, k.relu_reference(x), exact=True)
    workbook.assert_bitmask(mask, x > 0)


@pytest.mark.skipif(not workbook.ON_GPU, reason="the simulator's arrays have no device address")
def test_wide_kernels_reject_misaligned_views():
    x = cuda.device_array(101, np.float32)[1:]  # starts 4 bytes past an 8-byte boundary
    with pytest.raises(ValueError, match="8-byte boundary"):
        k.relu_mask_wide(x, *empty_outputs(100))
    with pytest.raises(ValueError, match="8-byte boundary"):
        k.relu_backward_from_mask_wide(x, cuda.device_array(4, np.uint32), cuda.device_array(100, np.float32))


# ---------------------------------------------------------------------------------------------
# ReLU backward


@pytest.mark.parametrize("n", SIZES + SIZES_WIDE)
@pytest.mark.parametrize("source", ["mask", "mask, 8-byte words", "mask, 16-byte quads", "y"])
def test_backward_matches_reference(n, source):
    x = k.special_inputs(n, seed=2)
    y_ref, mask_ref = k.relu_mask_reference(x)
    rng = np.random.default_rng(n)
    dy = rng.standard_normal(n).astype(np.float32)
    dy[~(x > 0)] = np.inf  # masked infinities: a multiply would make NaN
    dy[(x > 0) & (rng.random(n) < 0.1)] = np.nan  # a NaN gradient where the bit is set passes through
    expected = k.relu_backward_reference(dy, x > 0)
    d_dy, dx = cuda.to_device(dy), cuda.device_array(n, np.float32)
    if source == "mask":
        out = k.relu_backward_from_mask(d_dy, cuda.to_device(mask_ref), dx)
    elif source == "mask, 8-byte words":
        out = k.relu_backward_from_mask_wide(d_dy, cuda.to_device(mask_ref), dx)
    elif source == "mask, 16-byte quads":
        out = k.relu_backward_from_mask_quads(d_dy, cuda.to_device(mask_ref), dx)
    else:
        out = k.relu_backward_from_y(d_dy, cuda.to_device(y_ref), dx)
    workbook.assert_close(out, expected, exact=True)
    assert not np.isnan(out.copy_to_host()[~(x > 0)]).any()


@pytest.mark.parametrize("backward", [k.relu_backward_from_mask, k.relu_backward_from_mask_wide,
                                      k.relu_backward_from_y], ids=lambda f: f.__name__)
@pytest.mark.parametrize("blocks", [1, 3])
def test_backward_several_trips_per_warp(backward, blocks):
    n = 3001
    x = k.special_inputs(n, seed=3)
    dy = np.random.default_rng(3).standard_normal(n).astype(np.float32)
    y_ref, mask_ref = k.relu_mask_reference(x)
    second = y_ref if backward is k.relu_backward_from_y else mask_ref
    out = backward(cuda.to_device(dy), cuda.to_device(second), cuda.device_array(n, np.float32), blocks=blocks)
    workbook.assert_close(out, k.relu_backward_reference(dy, x > 0), exact=True)


# ---------------------------------------------------------------------------------------------
# Bad input


def test_forward_rejects_bad_arguments():
    n = 100
    x = cuda.to_device(np.ones(n, np.float32))
    y, mask = empty_outputs(n)
    for forward in FORWARDS:
        with pytest.raises(TypeError, match="host"):
            forward(np.ones(n, np.float32), y, mask)
        with pytest.raises(TypeError, match="dtype float64"):
            forward(cuda.to_device(np.ones(n)), y, mask)
        with pytest.raises(ValueError, match="shape"):
            forward(x, cuda.device_array(n + 1, np.float32), mask)
        with pytest.raises(ValueError, match=r"mask has shape \(5,\), expected \(4,\)"):
            forward(x, y, cuda.device_array(5, np.uint32))
        with pytest.raises(TypeError, match="mask has dtype int32"):
            forward(x, y, cuda.device_array(4, np.int32))
        with pytest.raises(ValueError, match="dimensions"):
            forward(cuda.device_array((10, 10), np.float32), y, mask)
        with pytest.raises(ValueError, match="empty"):
            forward(cuda.device_array(0, np.float32), cuda.device_array(0, np.float32),
                    cuda.device_array(0, np.uint32))


@pytest.mark.parametrize("backward", [k.relu_backward_from_mask, k.relu_backward_from_mask_wide,
                                      k.relu_backward_from_mask_quads], ids=lambda f: f.__name__)
def test_backward_rejects_bad_arguments(backward):
    n = 64
    dy, dx = cuda.device_array(n, np.float32), cuda.device_array(n, np.float32)
    with pytest.raises(TypeError, match="host"):
        backward(dy, np.zeros(2, np.uint32), dx)
    with pytest.raises(TypeError, match="host"):
        backward(np.zeros(n, np.float32), cuda.device_array(2, np.uint32), dx)
    with pytest.raises(ValueError, match="mask has shape"):
        backward(dy, cuda.device_array(3, np.uint32), dx)
    with pytest.raises(TypeError, match="mask has dtype int32"):
        backward(dy, cuda.device_array(2, np.int32), dx)
    with pytest.raises(TypeError, match="y has dtype float64"):
        k.relu_backward_from_y(dy, cuda.device_array(n, np.float64), dx)
    with pytest.raises(ValueError, match="dx has shape"):
        k.relu_backward_from_y(dy, cuda.device_array(n, np.float32), cuda.device_array(n - 1, np.float32))


# ---------------------------------------------------------------------------------------------
# Fused BatchNorm (+ add) + ReLU

BN_SHAPES = [(2, 3, 5, 7), (3, 2, 1, 33), (1, 1, 1, 2)] + ([(4, 64, 28, 28)] if workbook.ON_GPU else [])


def _bn_buffers(shape, with_identity, seed):
    rng = np.random.default_rng(seed)
    x, identity, gamma, beta, running_mean, running_var = bn.batchnorm_inputs(rng, shape, with_identity=with_identity)
    running_mean += rng.standard_normal(shape[1]).astype(np.float32)  # not the default, so the update shows
    dy = rng.standard_normal(shape).astype(np.float32)
    return x, identity, gamma, beta, running_mean, running_var, dy


@pytest.mark.parametrize("with_identity", [True, False], ids=["bn+add+relu", "bn+relu"])
@pytest.mark.parametrize("shape", BN_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_relu_forward_backward(shape, with_identity):
    _check_batchnorm(shape, with_identity)


@pytest.mark.parametrize("quads", [False, True], ids=["4-byte", "quads"])
@pytest.mark.parametrize("groups", [1, 2, 5])
@pytest.mark.parametrize("shape", [(5, 3, 3, 12), (5, 2, 8, 9)], ids=lambda s: "x".join(map(str, s)))
def test_batchnorm_blocks_take_several_planes(shape, groups, quads):
    """Block (c, g) takes planes g, g + G, ...: one block for all five planes, two blocks that take
    three and two, and a block a plane; each must give the same answer, with 4-byte accesses and
    with quads (36 elements a plane: a partial mask word; 72: a partial trip of 32 quads)."""
    _check_batchnorm(shape, True, groups=groups, quads=quads)


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_batchnorm_buffers_off_16_bytes_take_the_4_byte_kernels(offset):
    """x, y, dy, dx at 4, 8 or 12 bytes past a 16-byte boundary (views into a larger buffer): the
    quad kernels would fault there, so the wrappers take the 4-byte ones, with the same answer."""
    shape = (3, 2, 4, 8)
    n = int(np.prod(shape))

    def misaligned(values=None):
        flat = cuda.device_array(n + offset, np.float32)
        if values is not None:
            flat[offset:].copy_to_device(np.ascontiguousarray(values).reshape(-1))
        return flat[offset:].reshape(shape)

    x, identity, gamma, beta, running_mean, running_var, dy = _bn_buffers(shape, False, seed=offset)
    y_ref, mask_ref, saved_ref, _, _ = bn.batchnorm_forward_reference(x, gamma, beta, running_mean, running_var)
    d = cuda.to_device
    saved = cuda.device_array((2, shape[1]), np.float64)
    mask = cuda.device_array((shape[0], shape[1], bn.plane_words(*shape[2:])), np.uint32)
    y, _ = bn.batchnorm_relu_forward(misaligned(x), d(gamma), d(beta), d(running_mean), d(running_var), misaligned(),
                                     mask, saved)
    workbook.assert_close(y, y_ref, rtol=1e-5, atol=1e-5, name="y")
    workbook.assert_close(mask, mask_ref, exact=True, name="mask")
    dx_ref = bn.batchnorm_backward_reference(dy, y_ref > 0, x, gamma, saved_ref)[0]
    dx = bn.batchnorm_relu_backward(misaligned(dy), mask, misaligned(x), d(gamma), saved, misaligned(),
                                    cuda.device_array(shape[1], np.float32), cuda.device_array(shape[1], np.float32))[0]
    workbook.assert_close(dx, dx_ref, rtol=1e-4, atol=1e-5, name="dx")
    with pytest.raises(ValueError, match="16-byte aligned"):
        bn.batchnorm_relu_forward(misaligned(x), d(gamma), d(beta), d(running_mean), d(running_var), misaligned(),
                                  mask, saved, quads=True)


def test_batchnorm_quads_need_whole_quads():
    with pytest.raises(ValueError, match="H\\*W % 4 == 0"):
        _check_batchnorm((2, 3, 3, 11), True, quads=True)


def test_batchnorm_grid_is_one_wave():
    resident = bn.sm_count() * bn.BLOCKS_PER_SM
    assert bn.plane_groups(1000, 1) == resident and bn.plane_groups(3, 1) == 3
    assert bn.plane_groups(64, resident + 1) == 1  # more channels than blocks fit: one block a channel
    assert 3 * bn.plane_groups(64, 3) <= resident


def _check_batchnorm(shape, with_identity, groups=None, quads=None):
    x, identity, gamma, beta, running_mean, running_var, dy = _bn_buffers(shape, with_identity, seed=sum(shape))
    y_ref, mask_ref, saved_ref, mean_ref, var_ref = bn.batchnorm_forward_reference(
        x, gamma, beta, running_mean, running_var, identity=identity, momentum=0.2)
    n, c, h, w = shape
    d = cuda.to_device
    d_mean, d_var = d(running_mean), d(running_var)
    saved = cuda.device_array((2, c), np.float64)
    y, mask = bn.batchnorm_relu_forward(d(x), d(gamma), d(beta), d_mean, d_var, cuda.device_array(shape, np.float32),
                                        cuda.device_array((n, c, bn.plane_words(h, w)), np.uint32), saved,
                                        identity=None if identity is None else d(identity), momentum=0.2,
                                        groups=groups, quads=quads)
    workbook.assert_close(y, y_ref, rtol=1e-5, atol=1e-5, name="y")
    workbook.assert_close(mask, mask_ref, exact=True, name="mask")
    workbook.assert_close(saved, saved_ref, rtol=1e-7, atol=1e-9, name="saved mean, 1/std")
    workbook.assert_close(d_mean, mean_ref, name="running_mean")
    workbook.assert_close(d_var, var_ref, name="running_var")

    positive = y_ref > 0
    dx_ref, d_identity_ref, dgamma_ref, dbeta_ref = bn.batchnorm_backward_reference(
        dy, positive, x, gamma, saved_ref, with_identity=with_identity)
    dx, d_identity, dgamma, dbeta = bn.batchnorm_relu_backward(
        d(dy), mask, d(x), d(gamma), saved, cuda.device_array(shape, np.float32), cuda.device_array(c, np.float32),
        cuda.device_array(c, np.float32), d_identity=cuda.device_array(shape, np.float32) if with_identity else None,
        groups=groups, quads=quads)
    workbook.assert_close(dx, dx_ref, rtol=1e-4, atol=1e-5, name="dx")
    workbook.assert_close(dgamma, dgamma_ref, rtol=1e-5, atol=1e-5, name="dgamma")
    workbook.assert_close(dbeta, dbeta_ref, rtol=1e-5, atol=1e-5, name="dbeta")
    if with_identity:
        workbook.assert_close(d_identity, d_identity_ref, exact=True, name="d_identity")
    else:
        assert d_identity is None


def test_batchnorm_backward_mask_is_a_select():
    # dy = inf where the ReLU was off: a select leaves those out of dx, dgamma and dbeta entirely.
    shape = (2, 2, 3, 11)
    x, identity, gamma, beta, running_mean, running_var, dy = _bn_buffers(shape, True, seed=5)
    y_ref, mask_ref, saved_ref, _, _ = bn.batchnorm_forward_reference(x, gamma, beta, running_mean, running_var,
                                                                       identity=identity)
    dy[~(y_ref > 0)] = np.inf
    d = cuda.to_device
    outs = bn.batchnorm_relu_backward(d(dy), d(mask_ref), d(x), d(gamma), d(saved_ref), cuda.device_array(shape, np.float32),
                                      cuda.device_array(2, np.float32), cuda.device_array(2, np.float32),
                                      d_identity=cuda.device_array(shape, np.float32))
    refs = bn.batchnorm_backward_reference(dy, y_ref > 0, x, gamma, saved_ref, with_identity=True)
    for out, ref in zip(outs, refs):
        workbook.assert_close(out, ref, rtol=1e-4, atol=1e-5)
        assert np.isfinite(out.copy_to_host()).all()


def test_batchnorm_rejects_bad_arguments():
    shape = (2, 3, 4, 4)
    c = shape[1]
    x = cuda.device_array(shape, np.float32)
    vec = [cuda.device_array(c, np.float32) for _ in range(4)]
    y, saved = cuda.device_array(shape, np.float32), cuda.device_array((2, c), np.float64)
    mask = cuda.device_array((2, 3, 1), np.uint32)
    with pytest.raises(TypeError, match="host"):
        bn.batchnorm_relu_forward(np.zeros(shape, np.float32), *vec, y, mask, saved)
    with pytest.raises(ValueError, match="dimensions, expected 4"):
        bn.batchnorm_relu_forward(cuda.device_array((6, 16), np.float32), *vec, y, mask, saved)
    with pytest.raises(ValueError, match="gamma has shape"):
        bn.batchnorm_relu_forward(x, cuda.device_array(c + 1, np.float32), *vec[1:], y, mask, saved)
    with pytest.raises(ValueError, match=r"mask has shape \(2, 3, 2\), expected \(2, 3, 1\)"):
        bn.batchnorm_relu_forward(x, *vec, y, cuda.device_array((2, 3, 2), np.uint32), saved)
    with pytest.raises(TypeError, match="saved has dtype float32"):
        bn.batchnorm_relu_forward(x, *vec, y, mask, cuda.device_array((2, c), np.float32))
    with pytest.raises(ValueError, match="identity has shape"):
        bn.batchnorm_relu_forward(x, *vec, y, mask, saved, identity=cuda.device_array((2, 3, 4, 5), np.float32))
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        bn.batchnorm_relu_forward(cuda.device_array((1, c, 1, 1), np.float32), *vec,
                                  cuda.device_array((1, c, 1, 1), np.float32), cuda.device_array((1, c, 1), np.uint32),
                                  saved)
    with pytest.raises(ValueError, match="momentum"):
        bn.batchnorm_relu_forward(x, *vec, y, mask, saved, momentum=1.5)
    with pytest.raises(ValueError, match="d_identity has shape"):
        bn.batchnorm_relu_backward(y, mask, x, vec[0], saved, y, vec[1], vec[2],
                                   d_identity=cuda.device_array((2, 3, 4, 3), np.float32))
    with pytest.raises(TypeError, match="dy has dtype float64"):
        bn.batchnorm_relu_backward(cuda.device_array(shape, np.float64), mask, x, vec[0], saved, y, vec[1], vec[2])


# ---------------------------------------------------------------------------------------------
# The references themselves


def test_references_against_a_direct_computation():
    x = k.special_inputs(77, seed=9)
    y, mask = k.relu_mask_reference(x)
    bits = np.unpackbits(mask.view(np.uint8), bitorder="little")
    assert bits[:77].astype(bool).tolist() == [bool(v > 0) for v in x] and not bits[77:].any()
    assert [float(v) if not np.isnan(v) else "nan" for v in y] == \
        [("nan" if np.isnan(v) else (float(v) if v > 0 else 0.0)) for v in x]


def test_notebook_matches_its_source():
    pytest.importorskip("jupytext", reason="jupytext is not installed (the GPU machine has no Jupyter)")
    from workbook.__main__ import main

    assert main(["notebooks", "--check", "ch01"]) == 0


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_quads_at_every_alignment(offset):
    # Views 0..3 elements into aligned buffers: offset 0 takes the 16-byte kernels, the others the
    # 4-byte ones; all must agree with NumPy.
    n = 301
    x = k.special_inputs(n + 3, seed=7)
    dy = np.random.default_rng(7).standard_normal(n + 3).astype(np.float32)
    d_x, d_dy = cuda.to_device(x)[offset:offset + n], cuda.to_device(dy)[offset:offset + n]
    y = cuda.to_device(np.full(n + 3, 7.0, np.float32))[offset:offset + n]
    mask = cuda.to_device(np.full(k.mask_words(n), 0xDEADBEEF, np.uint32))
    k.relu_mask_quads(d_x, y, mask)
    y_ref, mask_ref = k.relu_mask_reference(x[offset:offset + n])
    workbook.assert_close(y, y_ref, exact=True, name=f"y, offset {offset}")
    workbook.assert_bitmask(mask, x[offset:offset + n] > 0, name=f"mask, offset {offset}")
    dx = cuda.to_device(np.full(n + 3, 7.0, np.float32))[offset:offset + n]
    k.relu_backward_from_mask_quads(d_dy, mask, dx)
    workbook.assert_close(dx, k.relu_backward_reference(dy[offset:offset + n], x[offset:offset + n] > 0),
                          exact=True, name=f"dx, offset {offset}")
