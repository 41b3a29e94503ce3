"""The checker is itself tested: known-wrong kernels must be caught, and the message must say where."""

import numpy as np
import pytest

import workbook
from workbook import CheckError, Launch, assert_bitmask, assert_close, cuda, pack_bitmask
from workbook.inputs import require

THREADS = 32


@cuda.jit
def double_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]


@cuda.jit
def double_off_by_one_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size - 1:  # misses the last element
        out[i] = 2 * x[i]


def run(kernel, x, blocks=None):
    d_x = cuda.to_device(x)
    out = cuda.to_device(np.zeros_like(x))
    blocks = blocks if blocks is not None else -(-x.size // THREADS)
    kernel[blocks, THREADS](d_x, out)
    return out


@pytest.fixture
def x():
    return np.random.default_rng(1).standard_normal(100).astype(np.float32)


def test_right_kernel_passes(x):
    assert_close(run(double_kernel, x), 2 * x)


def test_off_by_one_tail_is_caught_and_located(x):
    with pytest.raises(CheckError, match=r"1 of 100 elements differ[\s\S]*at \[99\] \(block 3, thread 3\)"):
        assert_close(run(double_off_by_one_kernel, x), 2 * x, launch=Launch(4, THREADS))


def test_skipped_last_block_is_caught(x):
    with pytest.raises(CheckError, match=r"4 of 100 elements differ[\s\S]*come from 1 block\(s\): \[3\]"):
        assert_close(run(double_kernel, x, blocks=3), 2 * x, launch=Launch(4, THREADS))


def test_all_zeros_is_caught_even_with_a_huge_tolerance(x):
    tiny = (x * 1e-6).astype(np.float32)
    with pytest.raises(CheckError, match="all zeros"):
        assert_close(np.zeros_like(tiny), tiny, atol=1.0)


def test_nan_where_reference_is_finite_is_caught(x):
    bad = 2 * x
    bad[7] = np.nan
    with pytest.raises(CheckError, match=r"NaN in 1 elements where the reference is finite[\s\S]*\[7\]"):
        assert_close(bad, 2 * x, rtol=1.0)


def test_output_left_equal_to_input_is_caught(x):
    with pytest.raises(CheckError, match="left equal to its input"):
        assert_close(x.copy(), x + np.float32(1e-7), rtol=1e-3, input=x)


def test_wrong_shape_and_dtype_are_caught(x):
    with pytest.raises(CheckError, match="shape"):
        assert_close(x[:-1], x)
    with pytest.raises(CheckError, match="dtype float64, expected float32"):
        assert_close(x.astype(np.float64), x)


def test_nan_and_inf_must_match_exactly():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0], dtype=np.float32)
    assert_close(ref.copy(), ref)
    with pytest.raises(CheckError, match="expected np.float32\\(-inf\\)|expected -inf"):
        assert_close(np.array([np.nan, np.inf, np.inf, 1.0], dtype=np.float32), ref)


def test_exact_mode_distinguishes_negative_zero():
    with pytest.raises(CheckError, match="exact"):
        assert_close(np.array([0.0], np.float32), np.array([-0.0], np.float32), exact=True)


def test_float16_tolerance_is_looser_than_float32():
    ref = np.array([1.0, 2.0], dtype=np.float16)
    assert_close(ref + np.float16(0.001), ref)
    with pytest.raises(CheckError):
        assert_close(np.array([1.001, 2.0], np.float32), np.array([1.0, 2.0], np.float32))


@pytest.mark.parametrize("n", [1, 31, 32, 33, 100])
def test_bitmask_matches_packbits(n):
    bits = np.random.default_rng(n).random(n) > 0.5
    words = pack_bitmask(bits)
    assert words.dtype == np.uint32 and words.size == -(-n // 32)
    assert_bitmask(words, bits)


def test_bitmask_first_wrong_bit_is_named():
    bits = np.zeros(70, dtype=bool)
    words = pack_bitmask(bits)
    words[1] |= np.uint32(1 << 5)  # element 37
    with pytest.raises(CheckError, match=r"element 37 \(word 1, bit 5\) \(block 1, thread 5\)"):
        assert_bitmask(words, bits, launch=Launch(3, 32))


def test_bitmask_padding_bits_must_be_zero():
    bits = np.ones(33, dtype=bool)
    words = pack_bitmask(bits)
    words[1] |= np.uint32(1 << 4)
    with pytest.raises(CheckError, match="padding bit"):
        assert_bitmask(words, bits)


def test_require_rejects_host_arrays_dtypes_and_shapes(x):
    with pytest.raises(TypeError, match="host \\(NumPy\\) array"):
        require(x, "x")
    d_x = cuda.to_device(x)
    with pytest.raises(TypeError, match="dtype float32, expected float64"):
        require(d_x, "x", dtype=np.float64)
    with pytest.raises(ValueError, match="shape \\(100,\\), expected \\(99,\\)"):
        require(d_x, "x", shape=(99,))
    with pytest.raises(TypeError, match="must be a device array"):
        require([1, 2, 3], "x")
    assert require(d_x, "x", dtype=np.float32, ndim=1) is d_x


def test_compare_checks_every_variant_and_reports(x):
    d_x = cuda.to_device(x)
    out = cuda.device_array_like(d_x)

    def good():
        double_kernel[4, THREADS](d_x, out)
        return out

    def bad():
        double_off_by_one_kernel[4, THREADS](d_x, out)
        return out

    result = workbook.bench.compare({"good": good}, reference=2 * x, bytes=8 * x.size)
    assert result["good"].correct is True
    assert result.meaningful == workbook.ON_GPU
    with pytest.raises(CheckError, match="bad"):
        workbook.bench.compare({"good": good, "bad": bad}, reference=2 * x)


# Property tests: the mask helpers against NumPy for any length and any bits.
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from workbook import unpack_bitmask  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.lists(st.booleans(), min_size=1, max_size=200), st.data())
def test_any_wrong_bit_is_found_and_named(bits, data):
    bits = np.array(bits)
    words = pack_bitmask(bits)
    assert np.array_equal(unpack_bitmask(words, bits.size), bits)
    assert np.array_equal(words.view(np.uint8)[: -(-bits.size // 8)],
                          np.packbits(bits, bitorder="little"))
    flipped = int(data.draw(st.integers(0, bits.size - 1)))
    words[flipped // 32] ^= np.uint32(1 << (flipped % 32))
    word, bit = divmod(flipped, 32)
    with pytest.raises(CheckError, match=rf"first wrong bit is element {flipped} \(word {word}, bit {bit}\)"):
        assert_bitmask(words, bits)


def test_plots_draw_what_they_are_given():
    from workbook import plots

    figure = plots.bars({"plain launch": 34.0, "prepared": 8.5, "graph, per kernel": 1.2}, xlabel="us")
    bars = figure.axes[0].patches
    assert [round(bar.get_width(), 1) for bar in bars] == [34.0, 8.5, 1.2]
    assert [label.get_text() for label in figure.axes[0].get_yticklabels()] == ["plain launch", "prepared",
                                                                                 "graph, per kernel"]
    # sweep into a panel of an existing figure: the lines land there, None points are skipped
    panels = plots.plt.subplots(1, 2)[1]
    drawn = plots.sweep([1, 2, 4], {"a": [1.0, None, 3.0], "b": [2.0, 2.0, 2.0]}, axes=panels[1])
    assert drawn is panels[1].figure and not panels[0].lines
    assert [list(line.get_xdata()) for line in panels[1].lines] == [[1, 4], [1, 2, 4]]
    plots.plt.close("all")


@pytest.mark.parametrize("measured, target, met, text", [
    (1.4976, ">= 1.5", False, "1.498"),  # a miss never prints as its target
    (1.0004, "<= 1", False, "1.0004"),
    (0.8653, ">= 0.7", True, "0.865"),
    (0.5, ">= 0.7", False, "0.5"),
])
def test_bar_figures_do_not_round_a_miss_into_a_pass(measured, target, met, text):
    from workbook.chapter import bar_figure

    assert bar_figure({"measured": measured, "target": target, "met": met}) == text


@pytest.mark.parametrize("measured, spread, target, expected", [
    (1.518, [1.4916, 1.527], ">= 1.5", "within noise"),  # the median clears it, the spread does not
    (1.62, [1.609, 1.622], ">= 1.5", "met"),
    (1.113, [1.105, 1.12], "<= 1.1", "not met"),
    (1.08, [1.07, 1.11], "<= 1.1", "within noise"),
    (0.99, None, ">= 0.97", "met"),  # no spread (an accuracy): its value alone
    (float("nan"), None, ">= 1", None),
])
def test_a_bar_is_met_only_when_its_spread_clears_it(measured, spread, target, expected):
    from workbook.chapter import verdict

    assert verdict({"measured": measured, "spread": spread, "target": target, "met": True}) == expected
    assert verdict({"measured": measured, "spread": spread, "target": target, "met": None}) is None


def test_comparison_tables_fit_100_columns_and_take_rows_of_any_kind():
    from workbook import tables

    rows = [{"variant": "a kernel with a long name that must wrap", "kind": "kernel", "correct": True,
             "median_ms": 0.12345, "p25_ms": 0.12, "p75_ms": 0.13, "gbps": 2900.0, "fraction_of_ceiling": 0.97,
             "tflops": None, "speedup_vs_first": [1.0, 1.0, 1.0], "speedup_vs_baseline": [0.98, 0.97, 0.99],
             "host_us": 31.0, "latency_us": 250.0},
            {"variant": "torch (baseline)", "kind": "baseline", "correct": True, "median_ms": 0.121, "p25_ms": 0.12,
             "p75_ms": 0.122, "gbps": 2950.0, "fraction_of_ceiling": 0.99, "tflops": None,
             "speedup_vs_first": [1.02, 1.0, 1.03], "speedup_vs_baseline": [1.0, 1.0, 1.0], "host_us": 12.0,
             "latency_us": 190.0, "synchronises": True}]
    copies = [{"variant": "16 copies", "kind": "copy", "correct": None, "median_ms": 5.1, "p25_ms": None,
               "p75_ms": None, "gbps": 26.0, "fraction_of_ceiling": None, "tflops": None}]  # ch05's stored case
    for table_rows in (rows, copies):
        console = tables.console(record=True, file=open("/dev/null", "w"))
        console.print(tables.comparison("a case", table_rows, ceiling={"gbps": 2990.0, "how": "torch copy_"}))
        text = console.export_text()
        assert max(len(line) for line in text.splitlines()) <= tables.WIDTH
        assert table_rows[0]["variant"].split()[0] in text
    assert "TFLOP/s" not in text.splitlines()[2]  # a rate column no row has is left out


@pytest.mark.parametrize("differing", [3, 900])
def test_assert_close_tests_only_unequal_elements_and_still_finds_every_one(differing):
    # The check tests the unequal elements only when few differ, all of them in place when most do:
    # the same verdict either way, naming every bad element (exact: -0 is not +0, NaN is NaN).
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000, dtype=np.float32)
    ref[:4] = (np.nan, np.inf, -np.inf, -0.0)
    out = ref.copy()
    out[3] = 0.0
    assert_close(out, ref)  # within tolerance: +0 vs -0
    with pytest.raises(CheckError, match="1 of 1000 elements differ \\(exact"):
        assert_close(out, ref, exact=True)
    wrong = np.arange(1000 - differing, 1000)
    out[wrong] += 1.0
    with pytest.raises(CheckError, match=f"{differing} of 1000 elements differ \\(rtol"):
        assert_close(out, ref)
    with pytest.raises(CheckError, match=f"{differing + 1} of 1000 elements differ \\(exact"):
        assert_close(out, ref, exact=True)
    out[wrong] -= 1.0
    out[wrong] = np.nextafter(out[wrong], np.float32(np.inf))  # one ulp: close, not exact
    assert_close(out, ref)


def _host_verdict(out, ref, **options):
    try:
        assert_close(out, ref, **options)
    except CheckError:
        return False
    return True


def _device_verdict(out, ref, *, exact=False, rtol=None, atol=None):
    from workbook import device_check

    is_float = ref.dtype.kind == "f"
    default_rtol, default_atol = workbook.check.DEFAULT_TOLERANCE.get(ref.dtype, (1e-5, 1e-6))
    return device_check.passes(cuda.to_device(out), ref, exact=exact or not is_float,
                               rtol=default_rtol if rtol is None else rtol,
                               atol=default_atol if atol is None else atol)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.uint8, np.bool_])
def test_the_device_test_passes_exactly_what_the_host_test_passes(dtype):
    # On a GPU, assert_close first tests a large output where it lies (workbook/device_check.py) and
    # trusts a pass. So that kernel must reject every output the host test rejects: planted
    # faults one at a time, each compared with the host test's verdict.
    rng = np.random.default_rng(1)
    ref = rng.standard_normal(97).astype(dtype) if dtype != np.bool_ else rng.random(97) > 0.5
    is_float = ref.dtype.kind == "f"
    if is_float:
        ref[:4] = (np.nan, np.inf, -np.inf, -0.0)
    bits = f"u{ref.itemsize}"
    faults = {"none": lambda o: None, "unwritten": lambda o: o.view(bits).__setitem__(50, np.iinfo(bits).max),
              "all zero": lambda o: o.fill(0), "off by one": lambda o: o.__setitem__(60, o[60] + 1)}
    if is_float:
        faults.update({
            "nan where finite": lambda o: o.__setitem__(70, np.nan), "nan lost": lambda o: o.__setitem__(0, 1.0),
            "wrong infinity": lambda o: o.__setitem__(1, -np.inf), "inf where finite": lambda o: o.__setitem__(9, np.inf),
            "sign of zero": lambda o: o.__setitem__(3, 0.0),
            "one ulp": lambda o: o.__setitem__(20, np.nextafter(o[20], ref.dtype.type(np.inf))),
            "nan payload": lambda o: o.view(bits).__setitem__(0, o.view(bits)[0] ^ 1),
        })
    verdicts = {}
    for fault, plant in faults.items():
        out = ref.copy()
        plant(out)
        for options in ({"exact": True}, {}) if is_float else ({"exact": True},):
            host, device = _host_verdict(out, ref, **options), _device_verdict(out, ref, **options)
            assert device == host, f"{fault} {options}: device says {device}, host says {host}"
            verdicts[fault, options.get("exact", False)] = host
    assert verdicts["none", True] and not verdicts["off by one", True] and not verdicts["unwritten", True]
    if is_float:
        assert verdicts["sign of zero", False] and not verdicts["sign of zero", True]
        assert verdicts["nan payload", True] and not verdicts["nan where finite", False]


def test_the_device_test_fails_over_to_the_host_test_which_names_the_element(monkeypatch):
    # A GPU-sized check in miniature: assert_close takes the device path, which finds a fault, and
    # the message is the host test's, naming the element.
    monkeypatch.setattr(workbook, "ON_GPU", True)
    monkeypatch.setattr(workbook.check, "DEVICE_CHECK_FROM", 16)
    from workbook import device_check

    verdicts = []
    monkeypatch.setattr(device_check, "passes", lambda *a, _passes=device_check.passes, **k: verdicts.append(
        _passes(*a, **k)) or verdicts[-1])
    ref = np.arange(40, dtype=np.float32)
    out = ref.copy()
    assert_close(cuda.to_device(out), ref)
    out[33] = -1
    with pytest.raises(CheckError, match=r"1 of 40 elements differ.*\n  at \[33\]: got np.float32\(-1.0\)"):
        assert_close(cuda.to_device(out), ref)
    assert verdicts == [True, False]


def test_compare_catches_a_variant_that_leaves_elements_another_variant_wrote(x):
    """Two variants share one output: the second one's missing element must not pass for the
    first one's (compare poisons each variant's outputs before its checked call)."""
    d_x, out = cuda.to_device(x), cuda.device_array_like(x)
    blocks = -(-x.size // THREADS)

    def launch(kernel):
        kernel[blocks, THREADS](d_x, out)
        return out

    with pytest.raises(CheckError, match="off_by_one"):
        workbook.bench.compare({"double": lambda: launch(double_kernel),
                                "off_by_one": lambda: launch(double_off_by_one_kernel)}, reference=2 * x)


@pytest.mark.skipif(workbook.ON_GPU, reason="the simulator's way of finding a call's outputs")
def test_outputs_of_skips_the_launches_or_calls_for_real():
    from workbook.simulator import outputs_of

    x = np.ones(40, np.float32)
    d_x, out = cuda.to_device(x), cuda.to_device(np.zeros_like(x))
    assert outputs_of(lambda: run_into(d_x, out)) is out
    assert not out.copy_to_host().any(), "a skipped launch wrote its output"

    def reads_back():  # its host code fails without what the kernel writes: called for real
        run_into(d_x, out)
        return cuda.to_device(np.zeros(80 // int(out.copy_to_host()[0]), np.float32))

    assert outputs_of(reads_back).size == 40
    assert (out.copy_to_host() == 2).all()


def run_into(d_x, out):
    double_kernel[-(-d_x.size // THREADS), THREADS](d_x, out)
    return out


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32, np.uint8, np.bool_])
def test_an_output_with_its_references_bytes_gets_the_full_tests_verdict(dtype, monkeypatch):
    # assert_close returns early when the output holds the reference's bytes: every verdict must be
    # the one the full host test gives, whatever the reference holds (the poison's bytes, NaN
    # payloads, -0, mostly NaN, all zeros) and whatever the options (exact, tolerances, input=).
    rng = np.random.default_rng(2)
    bits = f"u{np.dtype(dtype).itemsize}"
    base = rng.standard_normal(64).astype(dtype) if dtype != np.bool_ else rng.random(64) > 0.5
    refs = {"plain": base, "all zero": np.zeros_like(base), "poison": base.copy()}
    refs["poison"].view(bits)[5:9] = np.iinfo(bits).max
    if np.dtype(dtype).kind == "f":
        specials = base.copy()
        specials[:5] = (np.nan, np.inf, -np.inf, -0.0, 0.0)
        specials.view(bits)[6] = specials.view(bits)[0] ^ 1  # a NaN of another payload
        mostly_nan = np.full_like(base, np.nan)
        mostly_nan[:8] = 0.0
        refs.update({"specials": specials, "mostly nan": mostly_nan})
    options = [{"exact": True}]
    if np.dtype(dtype).kind == "f":
        options += [{}, {"rtol": 0.0, "atol": 0.0}, {"rtol": np.inf}, {"atol": -1.0}, {"rtol": np.nan}]

    def verdict(out, ref, **kwargs):
        try:
            assert_close(out, ref, **kwargs)
        except CheckError:
            return False
        return True

    for label, ref in refs.items():
        for extra in options:
            for given in ({}, {"input": ref.copy()}, {"input": base[::-1].copy()}):
                for out in (ref.copy(), np.repeat(ref, 2)[::2]):  # contiguous, and a strided view
                    quick = verdict(out, ref, **extra, **given)
                    with monkeypatch.context() as patch:
                        patch.setattr(workbook.check, "_same_bytes", lambda out, ref: False)
                        full = verdict(out, ref, **extra, **given)
                    assert quick == full, f"{label} {extra} {list(given)}: quick {quick}, full {full}"


def test_keeping_copies_each_reference_to_the_device_once_until_the_block_ends():
    from workbook import device_check

    refs = [np.arange(n, dtype=np.float32) for n in (40, 50, 60)]
    outs = [cuda.to_device(ref) for ref in refs]
    with device_check.keeping():
        first = [device_check._on_device(ref) for ref in refs]
        for out, ref in zip(outs, refs):
            assert device_check.passes(out, ref, rtol=1e-5, atol=1e-6, exact=False)
        assert all(device_check._on_device(ref) is copy for ref, copy in zip(refs, first))  # not new copies
    assert not device_check._uploaded  # the block's end frees them
    for ref in refs:
        device_check._on_device(ref)
    assert list(device_check._uploaded) == [id(refs[-1])]  # outside: the last one only


def test_at_reads_a_sample_of_a_device_array():
    from workbook import device_check

    values = np.arange(7 * 9, dtype=np.float32).reshape(7, 9)
    sample = np.array([0, 62, 5, 5, 40])
    np.testing.assert_array_equal(device_check.at(cuda.to_device(values), sample), values.reshape(-1)[sample])
    assert device_check.at(cuda.to_device(values), np.array([], np.int64)).size == 0
    with pytest.raises(IndexError, match="indices from -1 to 5 for an array of 63 elements"):
        device_check.at(cuda.to_device(values), [-1, 5])
