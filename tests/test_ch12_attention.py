import workbook  # noqa: I001  (first: chooses GPU or simulator)

import math

import numpy as np
import pytest

from chapters.ch12_attention import fused
from chapters.ch12_attention import kernels as k
from workbook import assert_close, cuda, memtrace

# (heads, N): one token, a warp's worth, past one tile of keys and of queries by one, a ragged last
# tile, and a GPU-sized odd length.
CASES = [(1, 1), (2, 31), (1, 33), (1, 65), (1, 129), workbook.size(gpu=(3, 1031), sim=(1, 161))]
NAIVE_CASES = [(1, 1), (2, 31), (1, 65)] + ([(3, 1031)] if workbook.ON_GPU else [])  # its three kernels' edges
VARIANTS = ("naive", "fused")


def run(q, kk, v, causal, variant):
    o = cuda.to_device(np.full(q.shape, 7, np.float16))  # not zeros: every output written
    k.attention(cuda.to_device(q), cuda.to_device(kk), cuda.to_device(v), o, causal=causal, variant=variant)
    return o.copy_to_host().astype(np.float64)


def check(q, kk, v, causal, variant):
    got = run(q, kk, v, causal, variant)
    reference = k.attention_reference(q, kk, v, causal)
    d, n = q.shape[2], q.shape[1]
    assert_close(got, reference, rtol=0, atol=float(k.tolerance(v, d, n).max()),
                 name=f"{variant} {q.shape} causal={causal}")
    return got, reference


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", k.HEAD_DIMS)
@pytest.mark.parametrize("case", CASES, ids=str)
def test_fused_against_the_reference(case, d, causal):
    heads, n = case
    check(*k.operands(np.random.default_rng(n + d), heads, n, d), causal, "fused")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d", k.HEAD_DIMS)
@pytest.mark.parametrize("case", NAIVE_CASES, ids=str)
def test_naive_against_the_reference(case, d, causal):
    heads, n = case
    check(*k.operands(np.random.default_rng(n + d), heads, n, d), causal, "naive")


@pytest.mark.parametrize("variant", VARIANTS)
def test_scores_that_overflow_fp16_are_fine(variant):
    """Scores in the hundreds (|q|, |k| of 30): exp of an unshifted score would overflow float32
    (and P in FP16) without the running maximum."""
    q, kk, v = k.operands(np.random.default_rng(5), 1, 70, 64)
    check(q * np.float16(30), kk * np.float16(30), v, False, variant)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_nan_in_a_query_stays_in_its_row(causal, variant):
    q, kk, v = k.operands(np.random.default_rng(6), 2, 67, 64)
    q[1, 40, 9] = np.nan
    got, reference = check(q, kk, v, causal, variant)
    assert np.isnan(got[1, 40]).all()
    assert np.isnan(got).sum() == 64


@pytest.mark.parametrize("variant", VARIANTS)
def test_a_nan_in_a_key_reaches_the_rows_that_see_it(variant):
    """Causal: query i sees key 50 only when i >= 50; a masked NaN score never enters a row."""
    q, kk, v = k.operands(np.random.default_rng(7), 1, 100, 64)
    kk[0, 50, 3] = np.nan
    got, _ = check(q, kk, v, True, variant)
    rows_with_nan = np.nonzero(np.isnan(got[0]).any(axis=1))[0]
    np.testing.assert_array_equal(rows_with_nan, np.arange(50, 100))


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_row_whose_every_score_is_minus_inf_is_zero(causal, variant):
    q, kk, v = k.operands(np.random.default_rng(8), 1, 90, 128)
    q[0, 70, 0] = -np.inf
    kk[0, :, 0] = np.abs(kk[0, :, 0]) + np.float16(0.25)  # every key positive there: every score -inf
    got, _ = check(q, kk, v, causal, variant)
    assert (got[0, 70] == 0).all() and np.isfinite(np.delete(got[0], 70, axis=0)).all()


# (heads, N, d): both head dimensions among the edges of CASES
BF16_CASES = [(1, 1, 64), (2, 31, 128), (1, 65, 64), workbook.size(gpu=(3, 1031, 128), sim=(1, 129, 128))]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", BF16_CASES, ids=str)
def test_fused_bf16_against_the_reference(case, causal):
    """BF16's bits in uint16 arrays: the same kernel on mma_bf16, held to BF16's rounding."""
    q, kk, v = k.operands(np.random.default_rng(sum(case)), *case, "bf16")
    o = cuda.to_device(np.full(q.shape, 7, np.uint16))
    k.attention(cuda.to_device(q), cuda.to_device(kk), cuda.to_device(v), o, causal=causal, precision="bf16")
    assert_close(k.values(o.copy_to_host()), k.attention_reference(q, kk, v, causal), rtol=0,
                 atol=float(k.tolerance(v, case[2], case[1], "bf16").max()), name=f"bf16 {case} causal={causal}")


def test_bf16_keeps_a_nan_in_its_row_and_an_empty_row_zero():
    q, kk, v = k.operands(np.random.default_rng(11), 1, 90, 64, "bf16")
    q[0, 40, 9] = 0x7FC0  # NaN
    q[0, 70, 0] = 0xFF80  # -inf
    kk[0, :, 0] &= 0x7FFF  # every key positive or zero there: query 70's scores are -inf, or NaN where 0
    kk[0, :, 0] |= 0x0080  # ... and no zero: the smallest normal BF16 at the least
    o = cuda.device_array(q.shape, np.uint16)
    k.attention(*(cuda.to_device(x) for x in (q, kk, v)), o, precision="bf16")
    got = k.values(o.copy_to_host())
    assert np.isnan(got[0, 40]).all() and np.isnan(got).sum() == 64
    assert (got[0, 70] == 0).all()


def test_bad_arguments_are_named():
    good = cuda.to_device(np.zeros((1, 8, 64), np.float16))
    with pytest.raises(ValueError, match="64 or 128, not 96"):
        k.attention(*(cuda.to_device(np.zeros((1, 8, 96), np.float16)) for _ in range(4)))
    with pytest.raises((TypeError, ValueError), match="q"):
        k.attention(cuda.to_device(np.zeros((1, 8, 64), np.float32)), good, good, good)
    with pytest.raises((TypeError, ValueError), match="v"):
        k.attention(good, good, cuda.to_device(np.zeros((1, 9, 64), np.float16)), good)
    with pytest.raises(ValueError, match="variant"):
        k.attention(good, good, good, good, variant="flash")
    with pytest.raises(TypeError, match="q has dtype float16, expected"):
        k.attention(good, good, good, good, precision="bf16")
    bits = cuda.to_device(np.zeros((1, 8, 64), np.uint16))
    with pytest.raises(ValueError, match="precision='bf16' runs on variant='fused'"):
        k.attention(bits, bits, bits, bits, precision="bf16", variant="naive")
    with pytest.raises(ValueError, match="precision must be 'f16' or 'bf16'"):
        k.attention(good, good, good, good, precision="fp8")


@pytest.mark.skipif(workbook.ON_GPU, reason="the memory trace is the simulator's")
def test_the_fused_kernel_writes_nothing_of_size_n_squared():
    """The trace of every global access: the fused kernel stores O and nothing else, and loads Q
    once and K and V once per block of queries; the naive kernels store S and P as well."""
    heads, n, d = 1, fused.BM + 5, 64
    arrays = [cuda.to_device(x) for x in k.operands(np.random.default_rng(9), heads, n, d)]
    stored = {}
    for variant in VARIANTS:
        with memtrace.trace() as trace:
            k.attention(*arrays, cuda.device_array((heads, n, d), np.float16), variant=variant)
        stored[variant] = {name: spaces["global st"].requested for name, spaces in trace.kernels().items()
                           if "global st" in spaces}
        loaded = sum(spaces["global ld"].requested for spaces in trace.kernels().values())
        if variant == "fused":
            blocks = math.ceil(n / fused.BM)
            assert loaded == heads * n * d * 2 * (1 + 2 * blocks)
    token_bytes = heads * n * d * 2
    assert stored["fused"] == {"attention_forward": token_bytes}
    assert sum(stored["naive"].values()) >= token_bytes + heads * n * n * (4 + 2)


def test_causal_blocks_skip_the_tiles_after_their_queries():
    """With the causal mask, a block loads the key tiles up to its last query only (the trace
    counts them): about half of all tiles over a long sequence."""
    if workbook.ON_GPU:
        pytest.skip("the memory trace is the simulator's")
    blocks = 2
    heads, n, d = 1, blocks * fused.BM, 64
    arrays = [cuda.to_device(x) for x in k.operands(np.random.default_rng(10), heads, n, d)]
    loaded = {}
    for causal in (False, True):
        with memtrace.trace() as trace:
            k.attention(*arrays, cuda.device_array((heads, n, d), np.float16), causal=causal)
        loaded[causal] = trace.kernels()["attention_forward"]["global ld"].requested
    kv_tiles = {False: blocks * blocks, True: sum(range(1, blocks + 1))}  # in units of 128 keys
    q_bytes = n * d * 2
    assert (loaded[True] - q_bytes) * kv_tiles[False] == (loaded[False] - q_bytes) * kv_tiles[True]
