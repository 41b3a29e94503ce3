import workbook  # noqa: I001  (first: chooses GPU or simulator)

import math

import numpy as np
import pytest

from chapters.ch12_attention import hopper
from chapters.ch12_attention import kernels as k
from workbook import assert_close, capability, cuda, memtrace

pytestmark = pytest.mark.skipif(workbook.ON_GPU and not capability.supports("wgmma"),
                                reason="wgmma is Hopper's (compute capability 9.0) alone")

# (heads, N): one token, past one tile of keys and queries by one, and four tiles (the three stages
# wrap around) with a ragged last one; on a GPU an odd length of nine tiles.
CASES = [(1, 1), (2, 33), (1, 129), workbook.size(gpu=(3, 1031), sim=(1, 390))]
D = hopper.D


def check(q, kk, v, causal):
    o = cuda.to_device(np.full(q.shape, 7, np.float16))  # not zeros: every output written
    k.attention(cuda.to_device(q), cuda.to_device(kk), cuda.to_device(v), o, causal=causal, variant="wgmma")
    got = o.copy_to_host().astype(np.float64)
    assert_close(got, k.attention_reference(q, kk, v, causal), rtol=0,
                 atol=float(k.tolerance(v, D, q.shape[1]).max()), name=f"wgmma {q.shape} causal={causal}")
    return got


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("case", CASES, ids=str)
def test_wgmma_against_the_reference(case, causal):
    check(*k.operands(np.random.default_rng(case[1]), *case, D), causal)


def test_scores_that_overflow_fp16_are_fine():
    q, kk, v = k.operands(np.random.default_rng(5), 1, 70, D)
    check(q * np.float16(20), kk * np.float16(20), v, False)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_nan_in_a_query_stays_in_its_row(causal):
    q, kk, v = k.operands(np.random.default_rng(6), 2, 67, D)
    q[1, 40, 9] = np.nan
    got = check(q, kk, v, causal)
    assert np.isnan(got[1, 40]).all() and np.isnan(got).sum() == D


def test_a_row_whose_every_score_is_minus_inf_is_zero():
    q, kk, v = k.operands(np.random.default_rng(8), 1, 90, D)
    q[0, 70, 0] = -np.inf
    kk[0, :, 0] = np.abs(kk[0, :, 0]) + np.float16(0.25)  # every key positive there: every score -inf
    got = check(q, kk, v, True)
    assert (got[0, 70] == 0).all() and np.isfinite(np.delete(got[0], 70, axis=0)).all()


def test_head_dimension_64_is_refused_with_the_way_out():
    x = cuda.to_device(np.zeros((1, 8, 64), np.float16))
    with pytest.raises(ValueError, match="head dimension 128 only, not 64: take variant='fused'"):
        k.attention(x, x, x, x, variant="wgmma")


@pytest.mark.skipif(workbook.ON_GPU, reason="the memory trace is the simulator's")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_wgmma_kernel_stores_o_alone_and_loads_k_and_v_once_a_block(causal):
    """Nothing of size N x N: O is the only store; Q is loaded once, and K and V once per block of
    128 queries (causal: up to the block's diagonal tile)."""
    heads, n = 1, hopper.BM + 5
    arrays = [cuda.to_device(x) for x in k.operands(np.random.default_rng(9), heads, n, D)]
    with memtrace.trace() as trace:
        k.attention(*arrays, cuda.device_array((heads, n, D), np.float16), causal=causal, variant="wgmma")
    spaces = trace.kernels()["attention_wgmma"]
    assert spaces["global st"].requested == heads * n * D * 2
    blocks = math.ceil(n / hopper.BM)
    key_blocks = sum(range(1, blocks + 1)) if causal else blocks * blocks  # (block, key tile) pairs
    keys_loaded = key_blocks * hopper.BN - (blocks * hopper.BN - n) * (1 if causal else blocks)
    assert spaces["global ld"].requested == heads * D * 2 * (n + 2 * keys_loaded)
