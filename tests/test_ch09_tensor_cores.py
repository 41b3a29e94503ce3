import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from chapters.ch09_tensor_cores import kernels as k
from workbook import assert_close, cuda

# (M, N, K): 1, 31, 33, not multiples of any tile, and a large odd one. The pipelined kernel needs K
# and N multiples of 8 (float16; 4 for float32): its cases round them up.
NAIVE_CASES = [(1, 1, 1), (31, 33, 17), (33, 31, 40), (17, 130, 9), workbook.size(gpu=(1031, 1001, 515), sim=(47, 29, 23))]
PIPELINED_CASES = [(1, 8, 8), (31, 136, 40), (33, 8, 72), (129, 264, 8),
                   workbook.size(gpu=(1031, 1000, 520), sim=(130, 136, 48))]
DTYPES = {"tf32": np.float32, "f16": np.float16}


def run(m, n, kd, dtype, variant, seed=0, a=None):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, kd)).astype(dtype) if a is None else a
    b = rng.standard_normal((kd, n)).astype(dtype)
    c = cuda.to_device(np.full((m, n), 7.0, np.float32))  # not zeros: every output written
    k.gemm(cuda.to_device(a), cuda.to_device(b), c, variant=variant)
    return a, b, c


def check(a, b, c, precision, name):
    tol = k.tolerance(a, b, precision)
    assert_close(c, k.gemm_reference(a, b, precision).astype(np.float32), rtol=0, atol=float(tol.max()), name=name)


@pytest.mark.parametrize("case", NAIVE_CASES, ids=str)
@pytest.mark.parametrize("precision", DTYPES)
def test_naive(precision, case):
    a, b, c = run(*case, DTYPES[precision], "naive")
    check(a, b, c, precision, f"gemm_{precision}_naive")


@pytest.mark.parametrize("case", PIPELINED_CASES, ids=str)
@pytest.mark.parametrize("precision", DTYPES)
def test_pipelined(precision, case):
    a, b, c = run(*case, DTYPES[precision], "pipelined")
    check(a, b, c, precision, f"gemm_{precision}_pipelined")


@pytest.mark.parametrize("variant", ["naive", "pipelined"])
@pytest.mark.parametrize("precision", DTYPES)
def test_nan_and_inf_reach_their_rows(precision, variant):
    a = np.random.default_rng(3).standard_normal((33, 40)).astype(DTYPES[precision])
    a[2, 5], a[7, 0] = np.nan, np.inf
    a, b, c = run(33, 16, 40, DTYPES[precision], variant, a=a)
    out, ref = c.copy_to_host(), k.gemm_reference(a, b, precision)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    assert np.isnan(out[2]).all() and not np.isfinite(out[7]).any()


def test_tf32_loses_what_the_reference_says():
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((64, 256)).astype(np.float32), rng.standard_normal((256, 32)).astype(np.float32)
    assert 2 ** -14 < k.tf32_input_error(a, b) < 2 ** -8  # about 2^-11 a product, partly cancelling


def test_the_wrapper_names_what_is_wrong():
    a32, b32 = cuda.to_device(np.zeros((8, 12), np.float32)), cuda.to_device(np.zeros((12, 8), np.float32))
    c = cuda.to_device(np.zeros((8, 8), np.float32))
    with pytest.raises(TypeError, match="dtype float16, expected float32"):
        k.gemm(a32, cuda.to_device(np.zeros((12, 8), np.float16)), c)
    with pytest.raises(ValueError, match="inner dimensions differ"):
        k.gemm(a32, cuda.to_device(np.zeros((8, 8), np.float32)), c)
    with pytest.raises(ValueError, match="shape"):
        k.gemm(a32, b32, cuda.to_device(np.zeros((8, 9), np.float32)))
    with pytest.raises(ValueError, match="multiples of 8 for float16"):
        k.gemm(cuda.to_device(np.zeros((8, 12), np.float16)), cuda.to_device(np.zeros((12, 8), np.float16)), c)
    with pytest.raises(ValueError, match="variant"):
        k.gemm(a32, b32, c, variant="fast")
    with pytest.raises(TypeError, match="host"):
        k.gemm(np.zeros((8, 12), np.float32), b32, c)


# (x NHWC, w KRSC, stride, padding, dilation): batch 1, odd sizes, K of 1, 17 and 33 (not multiples of
# the tile), a 1x1 filter, strides, padding past the filter's reach, dilation, C = 8 (a chunk) and 24;
# on a GPU a larger odd layer too (several blocks both ways).
CONV_CASES = [((1, 1, 1, 8), (1, 1, 1, 8), 1, 0, 1), ((1, 5, 7, 16), (17, 3, 3, 16), 1, 1, 1),
              ((2, 6, 5, 8), (9, 3, 2, 8), (2, 1), (1, 2), (2, 1)), ((1, 3, 3, 24), (33, 3, 3, 24), 1, 3, 1),
              workbook.size(gpu=((3, 29, 31, 40), (131, 5, 3, 40), (2, 1), 2, 1), sim=((1, 9, 2, 8), (3, 3, 3, 8), 1, 1, 1))]


def run_conv(x, w, stride, padding, dilation, precision):
    a, b, g = k.conv_as_gemm(x, w, stride, padding, dilation)
    out = cuda.to_device(np.full((g.N, g.P, g.Q, g.K), 7.0, np.float32))  # not zeros: every output written
    k.conv2d(cuda.to_device(x), cuda.to_device(w), out, stride=stride, padding=padding, dilation=dilation)
    return out.copy_to_host(), k.conv_reference(x, w, precision, stride, padding, dilation), k.tolerance(a, b, precision)


@pytest.mark.parametrize("case", CONV_CASES, ids=str)
@pytest.mark.parametrize("precision", DTYPES)
def test_conv(precision, case):
    x_shape, w_shape, *params = case
    rng = np.random.default_rng(5)
    x, w = (rng.standard_normal(s).astype(DTYPES[precision]) for s in (x_shape, w_shape))
    out, ref, tol = run_conv(x, w, *params, precision)
    assert_close(out, ref.astype(np.float32), rtol=0, atol=float(tol.max()), name=f"conv2d {precision}")


def test_conv_reference_is_the_definition():
    """conv_reference (im2col in float64) against chapter 04's loop-by-loop definition, NHWC <-> NCHW."""
    from chapters.ch04_implicit_gemm import kernels as k4

    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((2, 6, 5, 8)).astype(np.float32), rng.standard_normal((9, 3, 2, 8)).astype(np.float32)
    loops = k4.conv2d_loops(x.transpose(0, 3, 1, 2), w.transpose(0, 3, 1, 2), (2, 1), (1, 2), (2, 1))
    np.testing.assert_allclose(k.conv_reference(x, w, "fp32", (2, 1), (1, 2), (2, 1)), loops.transpose(0, 2, 3, 1),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision", DTYPES)
def test_conv_nan_and_inf_reach_the_outputs_whose_windows_cover_them(precision):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 6, 7, 8)).astype(DTYPES[precision])
    w = np.abs(rng.standard_normal((5, 3, 3, 8))).astype(DTYPES[precision])  # positive: inf stays inf
    x[0, 0, 0, 3], x[0, 4, 5, 0] = np.nan, np.inf
    out, ref, _ = run_conv(x, w, 1, 1, 1, precision)
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    np.testing.assert_array_equal(np.isinf(out), np.isinf(ref))
    assert np.isnan(out[0, :2, :2]).all() and np.isinf(out[0, 3:6, 4:7]).all() and np.isfinite(out[0, 2:, 2:4]).all()


def test_conv_wrapper_names_what_is_wrong():
    def dev(shape, dtype=np.float16):
        return cuda.to_device(np.zeros(shape, dtype))

    with pytest.raises(ValueError, match="C=12 channels.*multiple of 8"):
        k.conv2d(dev((1, 4, 4, 12)), dev((8, 3, 3, 12)), dev((1, 2, 2, 8), np.float32))
    with pytest.raises(ValueError, match="channel mismatch"):
        k.conv2d(dev((1, 4, 4, 8)), dev((8, 3, 3, 16)), dev((1, 2, 2, 8), np.float32))
    with pytest.raises(ValueError, match=r"out has shape \(1, 4, 4, 8\), expected \(1, 2, 2, 8\)"):
        k.conv2d(dev((1, 4, 4, 8)), dev((8, 3, 3, 8)), dev((1, 4, 4, 8), np.float32))
    with pytest.raises(TypeError, match="w has dtype float32, expected float16"):
        k.conv2d(dev((1, 4, 4, 8)), dev((8, 3, 3, 8), np.float32), dev((1, 2, 2, 8), np.float32))
    with pytest.raises(ValueError, match="larger than the padded input"):
        k.conv2d(dev((1, 2, 2, 8)), dev((8, 3, 3, 8)), dev((1, 1, 1, 8), np.float32))
    with pytest.raises(ValueError, match="16-byte aligned"):
        k.conv2d(dev((129,))[1:].reshape(1, 4, 4, 8), dev((8, 3, 3, 8)), dev((1, 2, 2, 8), np.float32))


# wgmma (wgmma.py): on a GPU only on an H100 (compute capability 9.0); everywhere in the simulator.
def _has_wgmma():
    if not workbook.ON_GPU:
        return True
    from numba import cuda as real

    return tuple(real.get_current_device().compute_capability) == (9, 0)


needs_wgmma = pytest.mark.skipif(not _has_wgmma(), reason="wgmma needs an H100 (compute capability 9.0)")
WGMMA_REFERENCE = {"f16": "f16", "tf32": "tf32-truncated"}
WGMMA_CASES = [(1, 8, 8), (31, 136, 40), (129, 17, 72), workbook.size(gpu=(1031, 1000, 520), sim=(130, 136, 136))]


@needs_wgmma
@pytest.mark.parametrize("case", WGMMA_CASES, ids=str)
@pytest.mark.parametrize("precision", DTYPES)
def test_wgmma_gemm_bt(precision, case):
    m, n, kd = case
    rng = np.random.default_rng(8)
    a, bt = (rng.standard_normal(s).astype(DTYPES[precision]) for s in ((m, kd), (n, kd)))
    a[m // 2, 0] = np.nan  # one row of C NaN, and only that one
    c = cuda.to_device(np.full((m, n), 7.0, np.float32))
    k.gemm_bt(cuda.to_device(a), cuda.to_device(bt), c)
    ref, tol = k.gemm_reference(a, bt.T, WGMMA_REFERENCE[precision]), k.tolerance(a, bt.T, WGMMA_REFERENCE[precision])
    out = c.copy_to_host()
    np.testing.assert_array_equal(np.isnan(out), np.isnan(ref))
    assert_close(np.nan_to_num(out), np.nan_to_num(ref).astype(np.float32), rtol=0,
                 atol=float(np.nan_to_num(tol).max()), name=f"gemm_bt {precision}")


@needs_wgmma
@pytest.mark.parametrize("case", CONV_CASES[1:3] + CONV_CASES[4:], ids=str)
@pytest.mark.parametrize("precision", DTYPES)
def test_wgmma_conv(precision, case):
    x_shape, w_shape, stride, padding, dilation = case
    rng = np.random.default_rng(9)
    x, w = (rng.standard_normal(s).astype(DTYPES[precision]) for s in (x_shape, w_shape))
    a, b, g = k.conv_as_gemm(x, w, stride, padding, dilation)
    out = cuda.to_device(np.full((g.N, g.P, g.Q, g.K), 7.0, np.float32))
    k.conv2d(cuda.to_device(x), cuda.to_device(w), out, stride=stride, padding=padding, dilation=dilation,
             variant="wgmma")
    ref = k.conv_reference(x, w, WGMMA_REFERENCE[precision], stride, padding, dilation)
    assert_close(out, ref.astype(np.float32), rtol=0, atol=float(k.tolerance(a, b, WGMMA_REFERENCE[precision]).max()),
                 name=f"conv2d wgmma {precision}")


def test_wgmma_tf32_truncates_where_the_rounded_reference_differs():
    """A value halfway between two TF32 values: cvt.rna rounds it up, wgmma's read truncates it."""
    from workbook.tensor_cores import round_tf32, truncate_tf32

    half_up = np.array([1 + 2.0 ** -11], np.float32)  # exactly half a TF32 unit above 1
    assert round_tf32(half_up)[0] == 1 + 2.0 ** -10 and truncate_tf32(half_up)[0] == 1.0


def test_wgmma_wrapper_names_what_is_wrong():
    def dev(shape, dtype=np.float16):
        return cuda.to_device(np.zeros(shape, dtype))

    with pytest.raises(ValueError, match="same number of columns"):
        k.gemm_bt(dev((8, 16)), dev((8, 24)), dev((8, 8), np.float32))
    with pytest.raises(ValueError, match="multiple of 8"):
        k.gemm_bt(dev((8, 12)), dev((8, 12)), dev((8, 8), np.float32))
    with pytest.raises(ValueError, match="variant must be"):
        k.conv2d(dev((1, 4, 4, 8)), dev((8, 3, 3, 8)), dev((1, 2, 2, 8), np.float32), variant="wmma")


@pytest.mark.parametrize("variant", ["pipelined", pytest.param("wgmma", marks=needs_wgmma)])
@pytest.mark.parametrize("case", [CONV_CASES[1], CONV_CASES[2]], ids=str)
def test_conv_writes_nchw_what_it_writes_nhwc(case, variant):
    """out_layout="nchw" (chapter 08's mixed precision): the same values, channels first."""
    x_shape, w_shape, *params = case
    rng = np.random.default_rng(11)
    x, w = (cuda.to_device(rng.standard_normal(s).astype(np.float16)) for s in (x_shape, w_shape))
    g = k.conv_as_gemm(np.zeros(x_shape), np.zeros(w_shape), *params)[2]
    nhwc = cuda.to_device(np.zeros((g.N, g.P, g.Q, g.K), np.float32))
    nchw = cuda.to_device(np.full((g.N, g.K, g.P, g.Q), 7.0, np.float32))
    options = dict(zip(("stride", "padding", "dilation"), params), variant=variant)
    k.conv2d(x, w, nhwc, **options)
    k.conv2d(x, w, nchw, out_layout="nchw", **options)
    np.testing.assert_array_equal(nchw.copy_to_host(), nhwc.copy_to_host().transpose(0, 3, 1, 2))
    with pytest.raises(ValueError, match="out_layout"):
        k.conv2d(x, w, nchw, out_layout="chw", **options)
