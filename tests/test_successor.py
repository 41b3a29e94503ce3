"""The second compiler (workbook/successor.py, successor_intrinsics.py, compilers.py): the choice,
the options handed over, the rows merged and tabled; and, where numba-cuda-mlir is installed, the
workbook's kernels and intrinsics compiled by it without a GPU (PTX read back)."""

import json
import os
import re

import numpy as np
import pytest
from numba import float32, uint32, uint64
from numba.core.types import float16

import workbook
from workbook import compilers, successor

needs_successor = pytest.mark.skipif(successor.missing() is not None, reason="numba-cuda-mlir is not installed")


def test_the_default_compiler_is_numba_cuda(monkeypatch):
    monkeypatch.delenv(successor.VARIABLE, raising=False)
    assert successor.chosen() == successor.STOCK
    monkeypatch.setenv(successor.VARIABLE, " Numba-CUDA-MLIR ")
    assert successor.chosen() == successor.NAME


def test_an_unknown_compiler_is_named_in_the_error(monkeypatch):
    monkeypatch.setenv(successor.VARIABLE, "nvcc")
    with pytest.raises(ValueError, match=r"WORKBOOK_COMPILER='nvcc'.*numba-cuda-mlir"):
        successor.chosen()


def test_options_are_handed_over_as_the_successor_takes_them():
    handed = successor._options({"fastmath": {"contract", "afn"}, "debug": 0, "lineinfo": 1, "device": True,
                                 "forceinline": True, "inline": "never", "launch_bounds": (256, 4),
                                 "max_registers": None, "opt": True, "cache": True, "boundscheck": False})
    assert handed == {"fastmath": True, "debug": False, "lineinfo": True, "device": True, "forceinline": True,
                      "launch_bounds": (256, 4), "opt": True}
    assert successor._options({"inline": True}) == {"inline": "always"}
    assert successor._options({"inline": "always"}) == {"inline": "always"}


def test_every_workaround_says_what_where_and_what_is_done():
    for what, where, done in successor.WORKAROUNDS + successor.UNMENDED:
        assert len(what) > 20 and where and len(done) > 10, (what, where, done)


def test_kernels_and_device_functions_are_read_back_as_python():
    from chapters.ch00_measuring import kernels as k
    from chapters.ch01_relu_mask import batchnorm

    fn, options = successor.source_of(k.copy_quads_kernel)
    python = k.copy_quads_kernel.py_func if workbook.ON_GPU else k.copy_quads_kernel.fn  # a dispatcher, or the simulator's
    assert fn is python and not options.get("device")
    fn, options = successor.source_of(batchnorm._block_sum2)
    assert options["device"] and options["forceinline"]
    deferred = successor.Deferred(fn, {"device": True})
    assert successor.source_of(deferred) == (fn, {"device": True})
    assert successor.source_of(np.float32(1)) is None


def _row(kernel, passed, failed, timed=False, ratio=1.0):
    row = {"kernel": kernel, "signature": "array(float32, 1d, C)", "tests_passed": passed, "tests_failed": failed,
           "correct": failed == 0 and passed > 0, "error": "boom" if failed else None, "bytes": 64, "timed": timed}
    if timed:
        for which in (successor.STOCK, successor.NAME):
            row[which] = {"median_ms": 0.01, "spread_ms": [0.009, 0.011], "registers": 32, "spill_bytes": 0}
        row["time_ratio"] = {"median": ratio, "spread": [ratio - 0.01, ratio + 0.01]}
    return row


def test_rows_of_several_workers_are_merged_per_kernel():
    rows = compilers._merged([_row("chapters.a.k", 2, 0), _row("chapters.a.k", 1, 0, timed=True),
                              _row("chapters.a.j", 1, 0), _row("chapters.a.j", 0, 1)])
    by_kernel = {row["kernel"]: row for row in rows}
    assert by_kernel["chapters.a.k"]["tests_passed"] == 3 and by_kernel["chapters.a.k"]["timed"]
    assert by_kernel["chapters.a.k"]["correct"]
    assert not by_kernel["chapters.a.j"]["correct"] and by_kernel["chapters.a.j"]["error"] == "boom"


def test_a_factorys_kernels_are_kept_apart():
    """Chapter 03's fused kernel is made once per gradient dtype, with the same signature: two rows,
    each timed on its own launches."""
    from chapters.ch03_amp_unscale import kernels as k

    made = [getattr(kernel, "py_func", None) or kernel.fn for kernel in k.unscale_fused_kernels.values()]
    assert sorted(compilers.variant(fn) for fn in made) == ["element=float16", "element=float32"]
    assert compilers.variant(k.unscale_one_tensor_kernel.py_func if workbook.ON_GPU
                             else k.unscale_one_tensor_kernel.fn) == ""
    from chapters.ch02_dropout import kernels as dropout  # the same flags, other device functions

    def key(kernel):
        fn = getattr(kernel, "py_func", None) or kernel.fn
        return fn.__qualname__, compilers.variant(fn)

    wide, each = key(dropout.backward_bitmask_kernel), key(dropout.backward_bitmask_scalar_kernel)
    assert wide != each and "load4=load_each4" in each[1]
    # the forward kernels differ in the closure of the device function they share: seen through it
    forward = [key(getattr(dropout, f"dropout_{name}_kernel"))
               for name in ("bitmask", "bitmask_scalar", "seed_only", "seed_only_scalar", "bitmask_counted")]
    assert len(set(forward)) == 5 and "forward.write_mask=False" in forward[2][1]
    half, single = _row("chapters.a.k", 1, 0, timed=True, ratio=1.5), _row("chapters.a.k", 1, 0, timed=True)
    half["variant"], single["variant"] = "element=float16", "element=float32"
    rows = compilers._merged([half, single])
    assert len(rows) == 2 and "a.k (element=float16)" in compilers.slower_markdown("ch01", {"rows": rows}, "gpu", "")


def test_the_tables_count_what_is_correct_slower_and_spilling():
    slow = _row("chapters.ch01_x.k", 1, 0, timed=True, ratio=1.5)
    slow[successor.NAME]["spill_bytes"] = 24
    stored = {"chapters": {"ch01": {"rows": [slow, _row("chapters.ch01_x.j", 1, 0, timed=True),
                                             _row("chapters.ch01_x.i", 0, 2)], "translation": compilers.TRANSLATION,
                                    "timing_rule": "largest launch", "variant_rule": compilers.VARIANT_RULE,
                                    "date": "2026-11-30T01:00:00"}},
              "stamp": {"device": "GPU", "numba_cuda_mlir": "0.6.0"}}
    summary, full, stamp = compilers.markdown(stored)
    assert "| ch01 | 3 | 2 | 2 | 1.25 | 1 | 1 | 2026-11-30 |" in summary
    assert full.count("\n| ch01_x.") == 3 and "**no**" in full and "0.6.0" in stamp
    assert "older rebuild" not in summary and "share a row" not in summary
    del stored["chapters"]["ch01"]["variant_rule"]  # measured before rows looked into device functions
    assert "ch01: measured before the rows told apart" in compilers.markdown(stored)[0]
    stored["chapters"]["ch01"]["range_mend"] = True
    assert "ch01: measured with successor_mends._patch_range_count on" in compilers.markdown(stored)[0]
    stored["chapters"]["ch01"]["translation"] = 1
    assert "older rebuild" in compilers.markdown(stored)[0]
    assert "not measured" in compilers.launch_markdown(stored)


def test_two_runs_are_compared_by_their_ratios_spreads():
    import importlib.util

    from workbook import results

    spec = importlib.util.spec_from_file_location("successor_compare", results.ROOT / "tools" / "successor_compare.py")
    tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tool)
    before = {"chapters": {"ch01": {"rows": [_row("chapters.ch01_x.a", 1, 0, timed=True, ratio=1.5),
                                             _row("chapters.ch01_x.b", 1, 0, timed=True, ratio=1.0),
                                             _row("chapters.ch01_x.c", 1, 0, timed=True, ratio=1.0)]}}}
    after = {"chapters": {"ch01": {"rows": [_row("chapters.ch01_x.a", 1, 0, timed=True, ratio=1.1),
                                            _row("chapters.ch01_x.b", 1, 0, timed=True, ratio=1.015),
                                            _row("chapters.ch01_x.c", 1, 0, timed=True, ratio=1.3),
                                            _row("chapters.ch01_x.d", 0, 1)]}}}
    ratios, slower, faster, unmatched, wrong = tool.compare(before, after)
    assert [line[1] for line in faster] == ["ch01_x.a"]  # 1.5 -> 1.1
    assert [line[1] for line in slower] == ["ch01_x.c"]  # b's spreads overlap: neither
    assert len(ratios) == 3 and unmatched == wrong == [("ch01", "ch01_x.d")]
    assert tool.compare(before, after, chapters=["ch02"])[0] == []


def test_a_chapters_experiments_list_its_kernels_more_than_10_percent_slower():
    slow, fast = _row("chapters.ch01_x.k", 1, 0, timed=True, ratio=1.5), _row("chapters.ch01_x.j", 1, 0, timed=True)
    block = compilers.slower_markdown("ch01", {"rows": [slow, fast]}, "gpu", "a stamp")
    assert "ch01_x.k" in block and "ch01_x.j" not in block and "1.50 [1.49-1.51]" in block
    assert "No kernel of ch01" in compilers.slower_markdown("ch01", {"rows": [fast]}, "gpu", "a stamp")


def test_the_stored_comparison_is_explained_in_every_chapter_it_finds_slower():
    """Each chapter with a kernel more than 10% slower under the successor (stored H200 results) has
    the generated table in its EXPERIMENTS.md, as `python -m workbook table --readme` writes it now,
    followed by the explanation."""
    from workbook import results

    stored = json.loads((results.RESULTS / "nvidia-h200" / "compilers.json").read_text())
    files = compilers.experiments_files(stored)
    for chapter_id, chapter in stored["chapters"].items():
        if not compilers.slower_rows(chapter):
            continue
        assert chapter_id in files, f"{chapter_id} has kernels more than 10% slower and no EXPERIMENTS.md"
        text = files[chapter_id].read_text()
        assert compilers.SLOWER_BEGIN in text, f"{files[chapter_id]} has no table of its slower kernels"
        block = text.split(compilers.SLOWER_BEGIN, 1)[1].split(compilers.SLOWER_END, 1)[0].strip()
        stamp = compilers.stamp_line(stored["stamp"], chapter.get("date"))  # when that chapter was measured
        assert block == compilers.slower_markdown(chapter_id, chapter, "nvidia-h200", stamp), \
            f"{files[chapter_id]}: run python -m workbook table --readme"
        prose = text.replace(block, "")
        for row in compilers.slower_rows(chapter):
            parts = row["kernel"].split(".")
            names = {parts[-1]} | ({parts[parts.index("<locals>") - 1]} if "<locals>" in parts else set())
            assert any(f"`{name}" in prose for name in names), f"{files[chapter_id]} does not say why {names} is slower"


def test_the_compilers_command_measures_on_a_gpu_only(capsys):
    if workbook.ON_GPU:
        pytest.skip("on a GPU the command runs the tests")
    assert compilers.run(["ch00"]) == 2
    assert "WORKBOOK_COMPILER=numba-cuda-mlir" in capsys.readouterr().out


# ---------------------------------------------------------------------------------------------
# With numba-cuda-mlir installed: the workbook's kernels compiled by it, no GPU needed


def _ptx(fn, *argtypes, options=None):
    translation = successor.Translation(gpu=workbook.ON_GPU)
    kernel = translation.jit(fn, options or {})
    signature = tuple(successor.argument_type(translation, t) for t in argtypes)
    return translation.cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0))[0]


@needs_successor
def test_a_chapter_kernel_compiles_with_its_16_byte_accesses():
    from chapters.ch00_measuring import kernels as k

    ptx = _ptx(*successor.source_of(k.copy_quads_kernel)[:1], float32[::1], float32[::1])
    assert re.search(r"ld\.global(\.nc)?\.v4\.f32", ptx) and "st.global.v4.f32" in ptx


@needs_successor
def test_a_float16_gradient_is_reached_through_a_typed_pointer():
    from numba import int64

    from chapters.ch03_amp_unscale import kernels as k

    fused = k.unscale_fused_kernels[np.dtype(np.float16)]
    ptx = _ptx(*successor.source_of(fused)[:1], int64[:, ::1], float32[::1], float32[::1])
    assert len(re.findall(r"st(\.global)?\.v4\.b16", ptx)) >= 4  # a full tile: four 8-byte stores a thread
    assert re.search(r"ld(\.global)?\.b16", ptx) and re.search(r"st(\.global)?\.b16", ptx)  # the partial tile


@needs_successor
def test_shared_quads_stay_in_shared_memory():
    from numba import cuda

    from workbook.memory import load4, shared_load4, shared_store4, store4

    def kernel(a, b):
        s = cuda.shared.array((4, 64), float32)
        t = cuda.threadIdx.x * 4
        shared_store4(s, t, load4(a, t))
        cuda.syncthreads()
        store4(b, t, shared_load4(s, t ^ 4))

    ptx = _ptx(kernel, float32[:, ::1], float32[:, ::1])
    assert "st.shared.v4.f32" in ptx and "ld.shared.v4.f32" in ptx  # not ld.global on a shared address


@needs_successor
def test_the_successors_gaps_are_mended():
    from numba import cuda

    high = np.uint64(0xFFFFFFFF00000000)

    def kernel(words, out):
        i = cuda.grid(1)
        if i < out.size:
            words[i] = words[i] ^ high
            out[i] = uint32(cuda.lanemask_lt())

    ptx = _ptx(kernel, uint64[::1], uint32[::1])
    assert "-4294967296" in ptx  # the constant, as the same 64 bits
    assert "%laneid" in ptx

    def more(lock, values, out):
        i = cuda.threadIdx.x
        while cuda.atomic.cas(lock, 0, 0, 1) != 0:  # an int32 array, literal values
            pass
        cuda.threadfence()
        out[i] = cuda.match_any_sync(0xFFFFFFFF, values[i])  # a float64: its bits are matched
        cuda.atomic.exch(lock, 0, 0)

    from numba import float64, int32

    ptx = _ptx(more, int32[::1], float64[::1], uint32[::1])
    assert "match.any.sync.b64" in ptx and "membar.gl" in ptx and "atom.global.cas.b32" in ptx
    if workbook.ON_GPU:
        def checked(flags, values, old, out):
            i = cuda.threadIdx.x
            old[i] = cuda.atomic.cas(flags, i, 0, 1)  # each thread its own word: every swap succeeds
            cuda.threadfence()
            out[i] = cuda.match_any_sync(0xFFFFFFFF, values[i])

        translation = successor.Translation(gpu=True)
        values = 0.5 + np.arange(32) % 2  # even lanes 0.5, odd lanes 1.5
        flags, d_values, old, out = (translation.cuda.to_device(a) for a in (
            np.zeros(32, np.int32), values, np.full(32, 7, np.int32), np.zeros(32, np.uint32)))
        translation.jit(checked, {})[1, 32](flags, d_values, old, out)
        np.testing.assert_array_equal(flags.copy_to_host(), 1)
        np.testing.assert_array_equal(old.copy_to_host(), 0)
        np.testing.assert_array_equal(out.copy_to_host(), np.where(np.arange(32) % 2, 0xAAAAAAAA, 0x55555555))


@needs_successor
def test_the_range_mend_divides_once_by_the_steps_size_and_leaves_constant_steps_alone():
    """successor_mends._patch_range_count (on with WORKBOOK_SUCCESSOR_RANGE_MEND=1): a range whose
    step is known at run time only counts its trips with one division, never by a negated step (whose
    unsigned bits keep every warp in the 64-bit division subroutine); a constant step's loop is
    compiled as without it. On a GPU, every count is Python's, past the end and stepping down
    included."""
    from numba import cuda, int64
    from numba_cuda_mlir import lowering_utilities

    from workbook import successor_mends

    if successor_mends.range_mend_on():
        pytest.skip("the mend is on for the whole run: nothing to compare it with")

    def trips(starts, stops, steps, out):
        i = cuda.grid(1)
        if i < out.size:
            n = 0
            for _ in range(starts[i], stops[i], steps[i]):
                n += 1
            out[i] = n

    def by_four(values, out):
        for i in range(cuda.grid(1), out.size, 4):
            out[i] = values[i]

    types = (int64[::1],) * 4
    before = _ptx(trips, *types), _ptx(by_four, int64[::1], int64[::1])
    stock = lowering_utilities.RangeObject.__init__
    successor_mends._patch_range_count()
    try:
        after = _ptx(trips, *types), _ptx(by_four, int64[::1], int64[::1])
        negated = set(re.findall(r"neg\.s64\s+(%rd\d+)", after[0]))
        divisors = re.findall(r"div\.u64\s+%rd\d+, %rd\d+, (%rd\d+)", after[0])
        assert len(divisors) == 1 and not negated & set(divisors), after[0]
        assert len(re.findall(r"div\.u64", before[0])) == 2  # the successor's own: two
        assert after[1] == before[1]  # a constant step: untouched
        if workbook.ON_GPU:
            cases = [(0, 10, 3), (10, 0, 3), (5, 5, 1), (9, -2, -4), (-2, 9, -4), (0, 1, 7), (3, 2**33, 2**31),
                     (2**40, 0, -(2**38)), (-7, 7, 1), (7, -7, -1)]
            translation = successor.Translation(gpu=True)
            args = [translation.cuda.to_device(np.array(column, np.int64)) for column in zip(*cases)]
            out = translation.cuda.to_device(np.full(len(cases), -1, np.int64))
            translation.jit(trips, {})[1, 32](*args, out)
            np.testing.assert_array_equal(out.copy_to_host(), [len(range(*case)) for case in cases])
    finally:
        lowering_utilities.RangeObject.__init__ = stock


def test_a_device_arrays_view_is_made_once_and_forgotten_with_it():
    class Translation:  # the successor's from_cuda_array_interface, counted
        made = []

        class cuda:
            @staticmethod
            def from_cuda_array_interface(interface, owner, sync):
                Translation.made.append(interface["data"][0])
                return ("view", interface["data"][0], interface["shape"])

    class Array:
        def __init__(self, address, shape):
            self.address, self.shape = address, shape

        @property
        def __cuda_array_interface__(self):
            return {"data": (self.address, False), "shape": self.shape, "strides": None, "typestr": "<f4",
                    "version": 3}

    launcher = object.__new__(successor.Launcher)
    launcher.translation, launcher.views, launcher.streams = Translation, {}, {}
    a, b = Array(4096, (8,)), Array(8192, (8,))
    assert launcher.argument((a, b)) == (("view", 4096, (8,)), ("view", 8192, (8,)))
    assert launcher.argument(a) is launcher.argument(a) and Translation.made == [4096, 8192]
    a.shape = (4,)  # resized in place: a new view
    assert launcher.argument(a) == ("view", 4096, (4,)) and len(Translation.made) == 3
    del a, b
    assert launcher.views == {}  # nothing kept alive, nothing left behind


@needs_successor
def test_64_bit_values_are_shuffled_whole():
    from numba import cuda, float64, int64

    def kernel(x, n):
        i = cuda.threadIdx.x
        x[i] = cuda.shfl_xor_sync(0xFFFFFFFF, x[i], 1)
        n[i] = cuda.shfl_down_sync(0xFFFFFFFF, n[i], 1)

    ptx = _ptx(kernel, float64[::1], int64[::1])
    assert "cvt.rn.f32.f64" not in ptx  # not rounded to float32 on the way
    assert len(re.findall(r"shfl\.sync\.\w+\.b32", ptx)) == 4  # two words a value
    if workbook.ON_GPU:
        translation = successor.Translation(gpu=True)
        x, n = np.pi * (1 + np.arange(32)), (np.arange(32, dtype=np.int64) << 33) + 7
        d_x, d_n = translation.cuda.to_device(x), translation.cuda.to_device(n)
        translation.jit(kernel, {})[1, 32](d_x, d_n)
        np.testing.assert_array_equal(d_x.copy_to_host(), x[np.arange(32) ^ 1])
        np.testing.assert_array_equal(d_n.copy_to_host(), n[np.minimum(np.arange(32) + 1, 31)])


@needs_successor
def test_mma_and_ldmatrix_are_written_in_ptx():
    from numba import cuda

    from workbook.tensor_cores import cp_async16, cp_async_commit, cp_async_wait, ldmatrix_x4, mma_f16, pack_f16x2

    def kernel(a, out):
        s = cuda.shared.array(512, float16)
        lane = cuda.threadIdx.x
        cp_async16(s, lane * 8, a, lane * 8, 16)
        cp_async_commit()
        cp_async_wait(0)
        cuda.syncthreads()
        r = ldmatrix_x4(s, (lane % 16) * 16)
        d = mma_f16(r, (r[0], r[1]), (0.0, 0.0, 0.0, 0.0))
        out[lane] = pack_f16x2(d[0], d[1])

    ptx = _ptx(kernel, float16[::1], uint32[::1])
    for instruction in ("cp.async.cg.shared.global", "cp.async.wait_group 0", "ldmatrix.sync.aligned.m8n8.x4",
                        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", "cvt.rn.f16x2.f32"):
        assert instruction in ptx, instruction


@needs_successor
def test_a_wgmma_kernel_is_built_for_sm_90a():
    from numba import cuda

    from workbook.tensor_cores import WGMMA_ACCUMULATORS, wgmma_commit, wgmma_f16, wgmma_fence, wgmma_wait

    def kernel(out, desc_a, desc_b):
        acc = cuda.local.array(WGMMA_ACCUMULATORS, float32)
        for i in range(WGMMA_ACCUMULATORS):
            acc[i] = 0.0
        wgmma_fence()
        wgmma_f16(acc, desc_a, desc_b)
        wgmma_commit()
        wgmma_wait(0)
        out[cuda.threadIdx.x] = acc[0]

    translation = successor.Translation(gpu=workbook.ON_GPU)
    built = translation.jit(kernel, {})
    assert built._workbook_sm_90a
    signature = (successor.argument_type(translation, float32[::1]), translation.types.uint64,
                 translation.types.uint64)
    built.compile(signature)
    ptx = built.inspect_asm(signature)
    assert ".target sm_90a" in ptx and "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in ptx
