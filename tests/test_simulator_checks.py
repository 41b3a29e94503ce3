"""What the simulator and the checker tell a student beyond the warp intrinsics: a negative index
named with its block and thread, an output left unwritten named as such, shuffles checked strictly
in exercise checks, and a compile that could not run never blamed on the kernel."""

import workbook  # first: applies WORKBOOK_DEVICE before numba.cuda is imported

import math
from math import exp

import numpy as np
import pytest
from numba import cuda

from workbook import CheckError, assert_close
from workbook.check import poisoned

sim_only = pytest.mark.skipif(workbook.ON_GPU, reason="simulator feature")


@cuda.jit
def shift_left(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i - 1]  # x[-1] at i = 0: a bug NumPy's semantics would hide


@sim_only
def test_a_negative_index_is_named_with_its_block_and_thread():
    x = cuda.to_device(np.arange(40, dtype=np.float32))
    with pytest.raises(IndexError, match=r"kernel 'shift_left', block \(0, 0, 0\), thread \(0, 0, 0\) reads "
                                         r"x\[-1\] of shape \(40,\) at test_simulator_checks.py:\d+: index -1 is negative"):
        shift_left[2, 32](x, cuda.device_array(40, np.float32))


@cuda.jit
def copy_all_but_the_tail(x, out):
    i = cuda.grid(1)
    if i < x.size - 3:
        out[i] = x[i]


@pytest.mark.parametrize("dtype", [np.float32, np.int32, np.uint8])
def test_an_output_left_unwritten_says_so(dtype):
    x = np.arange(1, 34).astype(dtype)
    out = poisoned(33, dtype)
    copy_all_but_the_tail[2, 32](cuda.to_device(x), out)
    with pytest.raises(CheckError, match=r"3 of 33 elements left unwritten .*\n  at \[30\] \(block 0, thread 30\)"):
        assert_close(out, x, launch=workbook.Launch(2, 32))


def test_an_output_of_255s_that_should_be_255s_is_not_unwritten():
    out = poisoned(5, np.uint8)
    assert_close(out, np.full(5, 255, np.uint8))


@cuda.jit
def read_the_lane_above(x, out):
    i = cuda.grid(1)
    if i >= x.size:
        return
    out[i] = cuda.shfl_down_sync(0xFFFFFFFF, x[i], 1)  # the last live lane reads an exited one


@sim_only
def test_exercise_checks_run_the_simulator_strictly():
    from workbook.exercises import strict_simulator
    from workbook.simulator import StrictModeError

    x = cuda.to_device(np.arange(20, dtype=np.float32))
    read_the_lane_above[1, 32](x, cuda.device_array(20, np.float32))  # outside a check: the caller's value
    with strict_simulator(), pytest.raises(StrictModeError, match="lane 19 of warp 0 reads lane 20 .* has exited"):
        read_the_lane_above[1, 32](x, cuda.device_array(20, np.float32))


@sim_only
def test_a_compile_that_cannot_run_is_not_the_kernels_fault(monkeypatch, capsys):
    from workbook import compiler

    class Broken:
        def start(self, kernel, argtypes):  # the answer, got while the simulator runs the launch
            return lambda: {"ok": None, "error": "CudaSupportError: Error at driver init: CUDA driver library "
                                                 "cannot be found"}

        def compile(self, kernel, argtypes):
            return self.start(kernel, argtypes)()

    monkeypatch.setenv("WORKBOOK_COMPILE", "1")
    monkeypatch.setattr(compiler, "_compiler", Broken())
    monkeypatch.setattr(compiler, "_could_not_check", set())
    out = cuda.device_array(40, np.float32)
    copy_all_but_the_tail[2, 32](cuda.to_device(np.ones(40, np.float32)), out)  # runs: no GPUCompileError
    said = capsys.readouterr().err
    assert "could not be compiled for a GPU here, which says nothing about the kernel" in said
    assert "CudaSupportError" in said


def test_compile_errors_quote_the_kernels_own_line(tmp_path):
    from workbook.compiler import with_source_lines

    source = tmp_path / "mine.py"
    source.write_text("def kernel(x):\n    x[0] = [v for v in x]\n")
    message = f'TypingError: bad\nFile "{source}", line 2:\n<source missing, REPL/exec in use?>\n'
    assert with_source_lines(message) == f'TypingError: bad\nFile "{source}", line 2:\n    x[0] = [v for v in x]\n'


@cuda.jit
def vote_inside_the_bounds_test(x, words):
    i = cuda.grid(1)
    if i < x.size:  # lanes past the end skip the vote and exit: the ch01.1 answer its spec rules out
        bits = cuda.ballot_sync(0xFFFFFFFF, x[i] > 0)
        if cuda.laneid == 0:
            words[i // 32] = bits


@sim_only
def test_a_lane_that_exits_without_making_a_full_mask_call_is_named_in_strict_mode():
    from workbook.exercises import strict_simulator
    from workbook.simulator import StrictModeError

    x = np.ones(40, np.float32)  # warp 1: lanes 0..7 vote, lanes 8..31 exit without voting
    with strict_simulator(), pytest.raises(StrictModeError, match=r"lane\(s\) 8, 9, 10, 11, 12, 13, 14, 15 \.\.\. "
                                                                r"of warp 1 .* exited without calling ballot_sync"):
        vote_inside_the_bounds_test[1, 64](x, np.zeros(2, np.uint32))
    words = np.zeros(2, np.uint32)
    vote_inside_the_bounds_test[1, 64](x, words)  # outside strict mode: as a GPU, without them
    assert list(words) == [0xFFFFFFFF, 0xFF]
    with strict_simulator():  # every lane of the mask votes: fine
        vote_inside_the_bounds_test[1, 64](np.ones(64, np.float32), words)


@cuda.jit
def list_inside(x):
    x[0] = len([v for v in range(3)])  # the simulator runs it; numba cannot compile a list for a GPU


@sim_only
def test_a_kernel_the_gpu_compiler_rejects_fails_its_launch_after_the_simulated_run(monkeypatch):
    # The compile runs beside the simulated launch; its verdict still fails the launch.
    from workbook import compiler

    if compiler.missing():
        pytest.skip(f"no GPU compiler here: {compiler.missing()}")
    monkeypatch.setenv("WORKBOOK_COMPILE", "1")
    with pytest.raises(compiler.GPUCompileError, match="list_inside .* would not compile for a GPU"):
        list_inside[1, 1](np.zeros(1, np.int64))


@sim_only
def test_numba_cudas_own_simulator_tests_pass_as_they_do_without_the_workbook():
    """A subset of numba-cuda's cudapy tests (all: `python tools/numba_sim_parity.py`), each side in
    its own process: the workbook's patches (warp intrinsics, scheduler, bounds, declared signatures,
    the compile hook) change no outcome."""
    pytest.importorskip("filecheck", reason="numba-cuda's test support needs filecheck (the dev extra)")
    import sys

    sys.path.insert(0, str(workbook.results.ROOT / "tools"))
    from numba_sim_parity import differences

    differ, count = differences(["test_array_args", "test_slicing", "test_retrieve_autoconverted_arrays"])
    assert count > 20 and not differ, differ


@cuda.jit
def _logs_and_exps(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i, 0] = math.log(x[i])
        out[i, 1] = exp(x[i] * 1000.0)
        out[i, 2] = math.sqrt(x[i])


@sim_only
def test_math_in_a_kernel_gives_what_a_gpu_gives_not_a_python_error():
    x = np.array([0.0, -1.0, 1.0, -0.0])
    out = np.zeros((4, 3))
    _logs_and_exps[1, 4](x, out)
    with np.errstate(all="ignore"):
        expected = np.stack([np.log(x), np.exp(x * 1000.0), np.sqrt(x)], axis=1)
    np.testing.assert_array_equal(out, expected)  # -inf, nan, inf where Python's math raises
    with pytest.raises(ValueError):  # host code keeps Python's math
        math.log(0.0)


@cuda.jit
def atomic_on_rows(a, b):
    i = cuda.grid(1)
    if i < a.shape[0]:
        cuda.atomic.add(b, i, 1.0)  # 1-D: one index
        cuda.atomic.add(a, (i, 1), 1.0)  # 2-D: an index for each dimension
        cuda.atomic.add(a, i, 1.0)  # 2-D given one index: a GPU compiler rejects it


@sim_only
def test_an_atomic_needs_an_index_for_each_dimension(monkeypatch):
    """numba's simulator would take a row of a 2-D array and fail on the row's `+=`; the workbook's
    says what a GPU compiler says: an atomic works on one element."""
    monkeypatch.setenv("WORKBOOK_COMPILE", "0")  # the simulator's own message, not the compiler's
    a, b = cuda.to_device(np.zeros((4, 3), np.float32)), cuda.to_device(np.zeros(4, np.float32))
    with pytest.raises(TypeError, match=r"cuda\.atomic\.add on a 2-D array given 1 index\(es\).*a tuple of 2"):
        atomic_on_rows[1, 32](a, b)
    assert b.copy_to_host()[0] == 1.0 and a.copy_to_host()[0, 1] == 1.0  # the first thread's right ones ran
