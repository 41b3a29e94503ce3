"""workbook/host.py: references computed in pieces of rows on every core give the same bits as one
call, at sizes that cut a piece mid-word, mid-quad or at one row; and random inputs that do not
depend on the machine."""

import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from chapters.ch01_relu_mask import kernels as relu
from chapters.ch02_dropout import kernels as dropout
from chapters.ch03_amp_unscale import kernels as unscale
from chapters.ch06_softmax import kernels as softmax
from workbook import host


@pytest.fixture
def always_in_pieces(monkeypatch):
    """Every array counts as large, and the machine has 5 cores: pieces of odd sizes."""
    monkeypatch.setattr(host, "SMALL", 0)
    monkeypatch.setattr(host, "_cores", lambda: 5)


def whole(function, *args):
    """function(*args) with nothing computed in pieces (inner references included)."""
    small = host.SMALL
    host.SMALL = 1 << 62
    try:
        return function(*args)
    finally:
        host.SMALL = small


def same(a, b):
    if isinstance(a, tuple):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            same(x, y)
        return
    assert a.dtype == b.dtype and a.shape == b.shape
    np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))  # the same bits, NaN payloads too


@pytest.mark.parametrize("n", [1, 31, 33, 32 * 5 - 1, 32 * 5 + 1, 1001])
def test_relu_references_in_pieces(always_in_pieces, n):
    x = relu.special_inputs(n, seed=3)
    same(relu.relu_mask_reference(x), whole(relu.relu_mask_reference, x))
    same(relu.relu_reference(x), whole(relu.relu_reference, x))
    dy = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
    same(relu.relu_backward_reference(dy, x > 0), whole(relu.relu_backward_reference, dy, x > 0))


@pytest.mark.parametrize("n", [1, 7, 1001])
def test_dropout_reference_in_pieces(always_in_pieces, n):
    x = np.random.default_rng(1).standard_normal(n, dtype=np.float32)
    same(dropout.dropout_reference(x, 0.3, 7, 11), whole(dropout.dropout_reference, x, 0.3, 7, 11))


@pytest.mark.parametrize("shape", [(1, 1), (3, 31), (7, 33), (11, 1000)])
def test_softmax_references_in_pieces(always_in_pieces, shape):
    x = np.random.default_rng(2).standard_normal(shape, dtype=np.float32) * 4
    if shape[1] > 1:
        x[0, 0] = -np.inf  # a logit of -inf: its probability is 0
    for function in (softmax.softmax_reference, softmax.log_softmax_reference, softmax.logsumexp_reference):
        same(function(x), whole(function, x))
    targets = np.arange(shape[0]) % shape[1]
    for function in (softmax.cross_entropy_reference, softmax.cross_entropy_backward_reference):
        same(function(x, targets), whole(function, x, targets))


def test_unscale_reference_side_by_side(always_in_pieces):
    rng = np.random.default_rng(4)
    grads = [rng.standard_normal(n).astype(np.float32) for n in (1, 31, 1000, 33)]
    scaled, found = unscale.unscale_reference(grads, 0.25)
    assert found[0] == 0.0 and [g.dtype for g in scaled] == [np.float32] * 4
    for g, s in zip(grads, scaled, strict=True):
        same(s, g * np.float32(0.25))
    grads[2][500] = np.nan
    assert unscale.unscale_reference(grads, 0.25)[1][0] == 1.0


def test_rows_of_unequal_length_are_computed_whole(always_in_pieces):
    calls = []

    @host.by_rows
    def first_rows(a, b):
        calls.append(len(a))
        return a[: len(b)]

    first_rows(np.arange(10), np.arange(4))
    assert calls == [10]


def test_standard_normal_depends_on_the_seed_only(monkeypatch):
    monkeypatch.setattr(host, "SMALL", 0)
    monkeypatch.setattr(host, "_cores", lambda: 3)
    a = host.standard_normal(np.random.default_rng(5), (37, 11))
    monkeypatch.setattr(host, "_cores", lambda: 8)
    b = host.standard_normal(np.random.default_rng(5), (37, 11))
    same(a, b)
    assert a.dtype == np.float32 and a.shape == (37, 11)
    assert host.standard_normal(np.random.default_rng(5), 1000, np.float16).dtype == np.float16
    monkeypatch.setattr(host, "SMALL", 1 << 40)  # small sizes: exactly rng.standard_normal
    same(host.standard_normal(np.random.default_rng(6), 10), np.random.default_rng(6).standard_normal(10, dtype=np.float32))


def test_in_process_returns_what_the_call_returns_and_names_what_failed():
    from chapters.ch10_lstm import reference as lstm

    weights = lstm.init_lstm(5, 7, 2)
    rng = np.random.default_rng(3)
    parts = [(rng.standard_normal((3, b, 5)), rng.standard_normal((2, b, 7)), rng.standard_normal((2, b, 7)))
             for b in (1, 4)]
    computed = host.in_process(lstm.lstm_references, parts, weights).result()
    for (x, h0, c0), got in zip(parts, computed):
        for one, whole_batch in zip(got, lstm.lstm_reference(x, weights, h0, c0)):
            np.testing.assert_allclose(one, whole_batch, rtol=1e-12, atol=1e-14)
    assert host.in_process(print, "said", "nothing").result() is None  # prints go to stderr, not the result
    with pytest.raises(RuntimeError, match="lstm_reference failed in its own process(.|\n)*could not convert"):
        host.in_process(lstm.lstm_reference, "not an array", weights).result()
