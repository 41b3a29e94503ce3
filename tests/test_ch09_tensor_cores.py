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
