"""Chapter 10: every LSTM variant against the float64 NumPy LSTM at awkward sizes (one step, one
unit, a batch past the persistent kernel's chunk, sizes that split unevenly over its blocks), NaN
carried as the reference carries it, and bad input refused with a message naming it."""

import numpy as np
import pytest

import workbook  # noqa: F401  (selects the GPU or the simulator first)
from numba import cuda

from chapters.ch10_lstm import reference as ref
from chapters.ch10_lstm.fused import FusedLSTM
from chapters.ch10_lstm.half import HalfLSTM, fragments, n_tiles
from chapters.ch10_lstm.naive import NaiveLSTM
from chapters.ch10_lstm.persistent import CHUNK, PersistentLSTM
from chapters.ch10_lstm.streams import StreamsLSTM
from chapters.ch10_lstm.layerwise import MAX_CHUNK, LayerwiseLSTM, batch_chunk
from chapters.ch10_lstm.wavefront import WavefrontLSTM, chunk_rows

VARIANTS = {"naive": NaiveLSTM, "fused": FusedLSTM, "persistent": lambda w: PersistentLSTM(w, blocks=3),
            "wavefront": lambda w: WavefrontLSTM(w, blocks=4), "layerwise": lambda w: LayerwiseLSTM(w, blocks=4),
            "streams": StreamsLSTM}


def _run(net, x, h0=None, c0=None):
    put = (lambda a: None if a is None else cuda.to_device(a))
    y, h, c = net(put(x), put(h0), put(c0))
    return y.copy_to_host(), h.copy_to_host(), c.copy_to_host()


def _check(got, expected, hidden, input_size):
    rtol, atol = ref.tolerance(hidden, input_size)
    for name, g, e in zip(("y", "h_n", "c_n"), got, expected):
        workbook.assert_close(g, np.asarray(e, np.float32), rtol=rtol, atol=atol, name=name)


@pytest.mark.parametrize("variant", list(VARIANTS))
@pytest.mark.parametrize("steps, batch, input_size, hidden, layers", [
    (1, 1, 1, 1, 1), (2, CHUNK + 1, 3, 33, 1), (3, 2, 5, 31, 2)])
def test_lstm_matches_the_float64_reference(variant, steps, batch, input_size, hidden, layers):
    rng = np.random.default_rng(steps * 100 + hidden)
    weights = ref.init_lstm(input_size, hidden, layers, seed=hidden)
    x = rng.standard_normal((steps, batch, input_size)).astype(np.float32)
    h0, c0 = (rng.standard_normal((2, layers, batch, hidden)) * 0.5).astype(np.float32)
    _check(_run(VARIANTS[variant](weights), x, h0, c0), ref.lstm_reference(x, weights, h0, c0), hidden, input_size)


@pytest.mark.parametrize("variant", ["naive", "fused"])
def test_the_warm_up_launches_run_on_buffers_of_their_own(variant):
    """warm_ups(): each launch of a step alone (on a GPU, bench.warm_up compiles them side by side);
    run before and between forwards, they change no forward's result."""
    weights = ref.init_lstm(5, 33, 2, seed=4)
    x = np.random.default_rng(5).standard_normal((3, 2, 5)).astype(np.float32)
    net = VARIANTS[variant](weights)
    calls = net.warm_ups(2) if variant == "naive" else net.warm_ups(cuda.to_device(x))
    assert len(calls) == (5 if variant == "naive" else 3)
    for call in calls:
        call()
    first = _run(net, x)
    for call in calls:
        call()
    _check(first, ref.lstm_reference(x, weights), 33, 5)
    _check(_run(net, x), ref.lstm_reference(x, weights), 33, 5)


@pytest.mark.parametrize("variant", ["fused", "wavefront"])
def test_zero_initial_state_is_the_default(variant):
    weights = ref.init_lstm(4, 9, 1, seed=2)
    x = np.random.default_rng(3).standard_normal((2, 3, 4)).astype(np.float32)
    _check(_run(VARIANTS[variant](weights), x), ref.lstm_reference(x, weights), 9, 4)


def test_wavefront_takes_the_batch_in_chunks_and_leaves_its_barrier_at_zero():
    """2 layers, H = 8 over 4 blocks: 4 units a block, 4 rows a warp, so chunks of 4 batch rows;
    batch 9 is 2 full chunks and a ragged one. Run twice: the barrier's counter is back at zero."""
    weights = ref.init_lstm(3, 8, 2, seed=8)
    net = WavefrontLSTM(weights, blocks=4)
    assert chunk_rows(8, net.units, 9) == 4
    x = np.random.default_rng(9).standard_normal((3, 9, 3)).astype(np.float32)
    expected = ref.lstm_reference(x, weights)
    for _ in range(2):
        _check(_run(net, x), expected, 8, 3)
        assert not net.counter.copy_to_host().any()


def test_layerwise_takes_the_batch_in_chunks_and_leaves_its_barrier_at_zero():
    """H = 16 over 4 blocks: 4 units a block; a batch of MAX_CHUNK + 3 rows is a full chunk (in the
    simulator's 64 threads, staged without a test per value) and a ragged one (tested per value).
    Run twice: the barrier's counter is back at zero."""
    weights = ref.init_lstm(3, 16, 1, seed=12)
    net = LayerwiseLSTM(weights, blocks=4)
    assert batch_chunk(16, net.units, MAX_CHUNK + 3) == MAX_CHUNK
    x = np.random.default_rng(13).standard_normal((2, MAX_CHUNK + 3, 3)).astype(np.float32)
    expected = ref.lstm_reference(x, weights)
    for _ in range(2):
        _check(_run(net, x), expected, 16, 3)
        assert not net.counter.copy_to_host().any()


def test_the_streams_lstm_replays_as_one_graph():
    """Captured once (on a GPU; the simulator runs the step itself), replayed on new inputs in the
    same buffers: the outputs follow the new inputs."""
    weights = ref.init_lstm(3, 6, 3, seed=10)
    net = StreamsLSTM(weights)
    rng = np.random.default_rng(11)
    x = cuda.to_device(rng.standard_normal((4, 2, 3)).astype(np.float32))
    h0, c0 = (cuda.to_device((rng.standard_normal((3, 2, 6)) * 0.5).astype(np.float32)) for _ in range(2))
    graph = net.graph(x, h0, c0)
    for _ in range(2):
        new_x = rng.standard_normal((4, 2, 3)).astype(np.float32)
        x.copy_to_device(new_x)
        graph()
        cuda.synchronize()
        got = tuple(a.copy_to_host() for a in net.outputs(x))
        _check(got, ref.lstm_reference(new_x, weights, h0.copy_to_host(), c0.copy_to_host()), 6, 3)


@pytest.mark.parametrize("variant", ["fused", "persistent", "wavefront", "layerwise", "streams", "half"])
def test_nan_in_one_batch_row_stays_in_that_row(variant):
    weights = ref.init_lstm(3, 5, 1, seed=4)
    x = np.random.default_rng(5).standard_normal((2, 3, 3)).astype(np.float32)
    x[0, 1, 2] = np.nan
    net = HalfLSTM(weights, blocks=4) if variant == "half" else VARIANTS[variant](weights)
    y, _, _ = _run(net, x)
    y_ref, _, _ = ref.lstm_reference(x, weights, fp16=variant == "half")
    assert np.isnan(y[:, 1]).all() and np.isnan(y_ref[:, 1]).all()
    np.testing.assert_allclose(y[:, [0, 2]], y_ref[:, [0, 2]], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("steps, batch, input_size, hidden, layers, blocks", [
    (1, 1, 1, 1, 1, 1), (2, 9, 3, 33, 1, 4), (3, 2, 5, 31, 2, 4), (2, 17, 4, 16, 3, 3)])
def test_half_matches_the_fp16_model_of_the_reference(steps, batch, input_size, hidden, layers, blocks):
    """The FP16 wavefront against the float64 LSTM of FP16-rounded weights and h (what it multiplies),
    at hidden sizes that are not multiples of 16, one to three layers, and batches past its chunk of
    8 rows (17: three chunks, the last of one row)."""
    rng = np.random.default_rng(steps * 100 + hidden)
    weights = ref.init_lstm(input_size, hidden, layers, seed=hidden)
    x = rng.standard_normal((steps, batch, input_size)).astype(np.float32)
    h0, c0 = (rng.standard_normal((2, layers, batch, hidden)) * 0.5).astype(np.float32)
    net = HalfLSTM(weights, blocks=blocks)
    rtol, atol = ref.tolerance_fp16(hidden, input_size)
    expected = ref.lstm_reference(x, weights, h0, c0, fp16=True)
    for _ in range(2):  # twice: the barrier's counter is left at zero
        got = _run(net, x, h0, c0)
        for name, g, e in zip(("y", "h_n", "c_n"), got, expected):
            workbook.assert_close(g, np.asarray(e, np.float32), rtol=rtol, atol=atol, name=name)
        assert not net.counter.copy_to_host().any()


def test_half_refuses_weights_fp16_cannot_hold():
    weights = ref.init_lstm(3, 4, 2, seed=1)
    weights[1]["w_ih"][2, 1] = 1e5
    with pytest.raises(ValueError, match="layer 1 w_ih holds a value that FP16 cannot"):
        HalfLSTM(weights, blocks=2)
    weights[1]["w_ih"][2, 1] = 0
    weights[0]["w_hh"][0, 0] = np.nan
    with pytest.raises(ValueError, match="layer 0 w_hh"):
        HalfLSTM(weights, blocks=2)


def test_half_fragments_are_mma_operands():
    """fragments() lays out each block's [W_ih | W_hh] rows so that lane L's register r of k-step ks
    and m-tile mt holds the pair mma.m16n8k16 reads there: rebuilt from the table, the rows come back."""
    from workbook.tensor_cores import fragment_coordinates

    weights = ref.init_lstm(5, 6, 2, seed=3)
    units, per_layer = 3, 2
    frag = fragments(weights, units, per_layer)  # (blocks, k-steps, m-tiles, 4, 32)
    a = fragment_coordinates("f16")["a"]
    halves = frag.view(np.uint16).reshape(frag.shape[:-1] + (32, 2)).view(np.float16)
    block = 1 * per_layer + 1  # layer 1's second block: units 3, 4, 5
    rebuilt = np.zeros((16 * frag.shape[2], 16 * frag.shape[1]), np.float16)
    for ks in range(frag.shape[1]):
        for mt in range(frag.shape[2]):
            for r in range(4):
                for lane in range(32):
                    row, col = a[lane, r]
                    rebuilt[16 * mt + row, 16 * ks + col:16 * ks + col + 2] = halves[block, ks, mt, r, lane]
    w = weights[1]
    for u in range(units):
        for q in range(4):
            j = units + u
            np.testing.assert_array_equal(rebuilt[4 * u + q, :6], w["w_ih"][q * 6 + j].astype(np.float16))
            np.testing.assert_array_equal(rebuilt[4 * u + q, 16:22], w["w_hh"][q * 6 + j].astype(np.float16))
    assert not rebuilt[4 * units:].any() and not rebuilt[:, 6:16].any() and not rebuilt[:, 22:].any()
    assert n_tiles(6, units, 2, 64) >= 1


def test_half_is_closer_to_the_fp16_model_than_to_float32():
    """What FP16 costs: the kernel matches the FP16-rounded reference far better than the exact one,
    and the exact one within what FP16's 11-bit significand allows (a check that the tolerance of
    the other tests is not hiding a wrong gate: the difference to float64 is real rounding)."""
    weights = ref.init_lstm(8, 32, 2, seed=5)
    x = np.random.default_rng(6).standard_normal((4, 3, 8)).astype(np.float32)
    y = _run(HalfLSTM(weights, blocks=4), x)[0]
    off_model = np.abs(y - ref.lstm_reference(x, weights, fp16=True)[0]).max()
    off_exact = np.abs(y - ref.lstm_reference(x, weights)[0]).max()
    assert off_model < off_exact / 10
    assert 2.0 ** -16 < off_exact < 2.0 ** -8


def test_the_reference_stacks_layers():
    """Two layers are the first layer's outputs fed to the second: a check of lstm_reference itself."""
    weights = ref.init_lstm(3, 4, 2, seed=6)
    x = np.random.default_rng(7).standard_normal((3, 2, 3))
    y, h, c = ref.lstm_reference(x, weights)
    y0, h0, c0 = ref.lstm_reference(x, weights[:1])
    y1, h1, c1 = ref.lstm_reference(y0, weights[1:])
    np.testing.assert_array_equal(y, y1)
    np.testing.assert_array_equal(h, np.concatenate([h0, h1]))
    one = weights[0]  # and one step by hand: z = x W_ih^T + b with h = c = 0
    z = x[0] @ one["w_ih"].T.astype(np.float64) + one["b_ih"] + one["b_hh"]
    i, g, o = ref.sigmoid(z[:, :4]), np.tanh(z[:, 8:12]), ref.sigmoid(z[:, 12:])
    np.testing.assert_allclose(y0[0], o * np.tanh(i * g), rtol=1e-12)


@pytest.mark.parametrize("fp16", [False, True])
def test_the_reference_is_the_step_by_step_formula(fp16):
    """lstm_reference hoists each layer's input term out of its loop (one product for every step):
    the same LSTM as the module docstring's formula taken one step at a time, from a non-zero state."""
    weights = ref.init_lstm(5, 7, 2, seed=9)
    rng = np.random.default_rng(10)
    x = rng.standard_normal((6, 3, 5)).astype(np.float32)
    h0, c0 = rng.standard_normal((2, 2, 3, 7)) * 0.5
    r = ref.half if fp16 else np.asarray
    sequence, hs, cs = x.astype(np.float64), [], []
    for layer, w in enumerate(weights):
        to_x = r if layer else np.asarray
        h, c, out = h0[layer], c0[layer], []
        for t in range(len(sequence)):
            z = (to_x(sequence[t]) @ to_x(w["w_ih"].astype(np.float64)).T + r(h) @ r(w["w_hh"].astype(np.float64)).T
                 + w["b_ih"] + w["b_hh"].astype(np.float64))
            i, f, g, o = ref.sigmoid(z[:, :7]), ref.sigmoid(z[:, 7:14]), np.tanh(z[:, 14:21]), ref.sigmoid(z[:, 21:])
            c = f * c + i * g
            h = o * np.tanh(c)
            out.append(h)
        sequence = np.stack(out)
        hs.append(h)
        cs.append(c)
    for got, want in zip(ref.lstm_reference(x, weights, h0, c0, fp16=fp16), (sequence, np.stack(hs), np.stack(cs))):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_bad_input_is_refused_with_a_message():
    weights = ref.init_lstm(4, 6, 2, seed=1)
    net = FusedLSTM(weights)
    good = cuda.to_device(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(TypeError, match="x has dtype float64"):
        net(cuda.to_device(np.zeros((2, 3, 4))))
    with pytest.raises(ValueError, match="x has 5 features per step, the first layer takes 4"):
        net(cuda.to_device(np.zeros((2, 3, 5), np.float32)))
    with pytest.raises(TypeError, match="host"):
        net(np.zeros((2, 3, 4), np.float32))
    with pytest.raises(ValueError, match="h0 has shape"):
        net(good, h0=cuda.to_device(np.zeros((1, 3, 6), np.float32)))
    with pytest.raises(ValueError, match="no steps or no batch"):
        net(cuda.to_device(np.zeros((0, 3, 4), np.float32)))
    with pytest.raises(ValueError, match="layer 1 w_hh"):
        FusedLSTM([weights[0], {**weights[1], "w_hh": np.zeros((24, 5), np.float32)}])


def test_persistent_refuses_what_cannot_be_resident():
    with pytest.raises(ValueError, match="shared memory"):
        PersistentLSTM(ref.init_lstm(4, 100, 1), blocks=1)  # 100 units' weights in one block: 160 KB
    net = PersistentLSTM(ref.init_lstm(2, 33, 1), blocks=8)  # 7 blocks; the simulator co-schedules 4
    if workbook.ON_GPU:
        pytest.skip("a GPU holds 7 such blocks")
    with pytest.raises(ValueError, match="cannot all be resident"):
        net(cuda.to_device(np.zeros((1, 1, 2), np.float32)))
