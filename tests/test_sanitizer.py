"""The simulator's sanitizer (workbook/simulator/sanitizer.py) and bounds checks (watch.py): races
on shared and global memory, reads of unwritten shared memory and out-of-bounds indices, each named
with the kernel, the threads, the source lines and the array, the way compute-sanitizer would."""

import workbook  # first: applies WORKBOOK_DEVICE before numba.cuda is imported

import re
from pathlib import Path

import numpy as np
import pytest
from numba import cuda

pytestmark = pytest.mark.skipif(workbook.ON_GPU, reason="the simulator's sanitizer (on a GPU: compute-sanitizer)")

if not workbook.ON_GPU:
    from workbook.simulator import RaceError, UninitializedReadError, sanitizing


@cuda.jit
def reverse(x, out, sync):
    s = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    s[t] = x[t]
    if sync:
        cuda.syncthreads()
    out[t] = s[63 - t]


@cuda.jit
def half_written(x, out):
    s = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    if t < 32:
        s[t] = x[t]
    cuda.syncthreads()
    out[t] = s[63 - t]


@cuda.jit
def running_max(x, flag):
    i = cuda.grid(1)
    if i < x.size:
        flag[0] = max(flag[0], x[i])  # read-modify-write from every thread: a race


@cuda.jit
def set_flag(x, flag):
    i = cuda.grid(1)
    if i < x.size and x[i] > 10:
        flag[0] = 1  # every writer writes the same value: not reported


@cuda.jit
def atomic_max(x, flag):
    i = cuda.grid(1)
    if i < x.size:
        cuda.atomic.max(flag, 0, x[i])


@cuda.jit
def neighbour_in_warp(x, out, sync):
    s = cuda.shared.array(32, np.float32)
    lane = cuda.threadIdx.x
    s[lane] = x[lane]
    if sync:
        cuda.syncwarp()
    out[lane] = s[(lane + 1) % 32]


def test_a_missing_syncthreads_is_a_race_naming_both_threads_lines_and_the_array():
    x = np.arange(64, dtype=np.float32)
    with sanitizing(), pytest.raises(RaceError) as race:
        reverse[1, 64](x, np.zeros_like(x), False)
    message = str(race.value)
    assert re.search(r"race on shared array s\[\d+\] in kernel 'reverse': thread \(\d+, 0, 0\) of block \(0, 0, 0\) "
                     r"(wrote|read) it at test_sanitizer.py:\d+, and thread \(\d+, 0, 0\) .* with no syncthreads\(\) "
                     r"between them", message), message
    lines = {int(n) for n in re.findall(r"test_sanitizer.py:(\d+)", message)}
    source = Path(__file__).read_text().splitlines()
    assert {source[n - 1].strip() for n in lines} == {"s[t] = x[t]", "out[t] = s[63 - t]"}


def test_the_same_kernel_with_its_syncthreads_is_clean():
    x = np.arange(64, dtype=np.float32)
    out = np.zeros_like(x)
    with sanitizing():
        reverse[1, 64](x, out, True)
    np.testing.assert_array_equal(out, x[::-1])


def test_a_read_of_shared_memory_no_thread_wrote_is_named():
    x = np.arange(64, dtype=np.float32)
    with sanitizing(), pytest.raises(UninitializedReadError, match=r"kernel 'half_written': thread \(\d+, 0, 0\) of "
                                     r"block \(0, 0, 0\) reads shared array s\[\d+\] at test_sanitizer.py:\d+ before "
                                     r"any thread of its block wrote it"):
        half_written[1, 64](x, np.zeros_like(x))


def test_a_read_modify_write_of_global_memory_is_a_race_whatever_the_scheduler_does():
    x = np.arange(40, dtype=np.float32)
    with sanitizing(), pytest.raises(RaceError, match=r"race on global array flag\[0\] in kernel 'running_max'"):
        running_max[2, 32](x, np.zeros(1, np.float32))


def test_two_blocks_are_never_ordered():
    x = np.arange(40, dtype=np.float32)
    with sanitizing(), pytest.raises(RaceError, match="two blocks of one launch are never ordered"):
        running_max[40, 1](x, np.zeros(1, np.float32))


def test_same_value_writes_and_atomics_are_not_races():
    x = np.arange(40, dtype=np.float32)
    flag = np.zeros(1, np.float32)
    with sanitizing():
        set_flag[2, 32](x, flag)
        atomic_max[2, 32](x, flag)
    assert flag[0] == 39


@pytest.mark.parametrize("sync", [False, True])
def test_lanes_of_one_warp_need_a_syncwarp(sync):
    x = np.arange(32, dtype=np.float32)
    out = np.zeros_like(x)
    with sanitizing():
        if sync:
            neighbour_in_warp[1, 32](x, out, True)
            np.testing.assert_array_equal(out, np.roll(x, -1))
            return
        with pytest.raises(RaceError, match=r"with no syncwarp\(\) or syncthreads\(\) between them"):
            neighbour_in_warp[1, 32](x, out, False)


def test_the_chapter_04_tiled_gemm_without_its_second_barrier_is_named(tmp_path):
    """The tiles of step k+1 overwrite those of step k while slower threads still read them."""
    from workbook import exercises as ex

    if not ex.has_solutions("ch04"):
        pytest.skip("no solutions.py here (a handout): the planted kernel is the reference answer without a barrier")
    source = (Path(workbook.results.ROOT) / "chapters/ch04_implicit_gemm/solutions.py").read_text()
    barrier = "        cuda.syncthreads()  # everyone is done with them before the next step overwrites them\n"
    assert source.count(barrier) == 1
    module = ex.load_source(source.replace(barrier, ""), tmp_path, "gemm_without_second_barrier")
    a = np.random.default_rng(1).standard_normal((9, 20), dtype=np.float32)
    b = np.random.default_rng(2).standard_normal((20, 7), dtype=np.float32)
    da, db = cuda.to_device(a), cuda.to_device(b)
    with sanitizing(), pytest.raises(RaceError, match=r"race on shared array [ab]_tile\[\d, \d\] in kernel "
                                     r"'gemm_tiled_kernel'"):
        module.gemm_tiled(da, db, cuda.device_array((9, 7), np.float32))
    c = cuda.device_array((9, 7), np.float32)
    with sanitizing():  # the chapter's own kernel is clean
        ex.load("ch04", "solutions").gemm_tiled(da, db, c)
    np.testing.assert_allclose(c.copy_to_host(), a @ b, rtol=1e-4, atol=1e-5)


@cuda.jit
def shift_right(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i + 1]  # x[n] at i = n - 1


def test_an_index_past_the_end_is_named_with_kernel_block_thread_line_and_array():
    x = np.arange(40, dtype=np.float32)
    with pytest.raises(IndexError, match=r"kernel 'shift_right', block \(1, 0, 0\), thread \(7, 0, 0\) reads "
                                         r"x\[40\] of shape \(40,\) at test_sanitizer.py:\d+: index 40 is past "
                                         r"the end of axis 0 \(size 40\)"):
        shift_right[2, 32](x, np.zeros_like(x))


def test_an_exercise_check_names_a_race_as_the_sanitizer_found_it():
    from workbook.exercises import _message, strict_simulator

    x = np.arange(64, dtype=np.float32)
    with strict_simulator(), pytest.raises(RaceError) as race:
        reverse[1, 64](x, np.zeros_like(x), False)
    assert _message(race.value).startswith("not what a GPU guarantees (sanitizer):\nrace on shared array s[")


@cuda.jit
def search_that_never_ends(x, out):
    i = cuda.grid(1)
    lo, hi = 0, x.size
    while lo < hi:
        mid = (lo + hi) // 2
        if x[mid] <= i:
            lo = mid  # should be mid + 1: once hi - lo == 1, nothing changes
        else:
            hi = mid
    out[i] = lo


def test_a_loop_that_never_ends_is_stopped_and_named(monkeypatch):
    from workbook.simulator import TIME_LIMIT_ENV, KernelTimeoutError

    monkeypatch.setenv(TIME_LIMIT_ENV, "1")
    with pytest.raises(KernelTimeoutError, match=r"kernel 'search_that_never_ends' did not finish block \(0, 0, 0\) "
                                                 r"within 1 s: thread \(\d, 0, 0\).* at test_sanitizer.py:\d+"):
        search_that_never_ends[1, 8](np.arange(10, dtype=np.float32), np.zeros(8, np.int32))
    out = np.zeros(8, np.int32)
    shift_right[1, 8](np.arange(9, dtype=np.float32), np.zeros(8, np.float32))  # the pool's threads are free again
    reverse[1, 64](np.arange(64, dtype=np.float32), np.zeros(64, np.float32), True)
    assert out.sum() == 0


def test_exercise_checks_have_a_time_limit():
    from workbook.exercises import strict_simulator
    from workbook.simulator.scheduler import block_time_limit

    assert block_time_limit() is None
    with strict_simulator():
        assert block_time_limit() == 60


@cuda.jit
def sync_in_a_branch(x, out):
    t = cuda.threadIdx.x
    if t < 16:
        cuda.syncthreads()  # threads 16..63 skip it (and exit, so the simulator would not hang)
    out[t] = x[t]


@cuda.jit
def sync_after_a_return(x, out):
    i = cuda.grid(1)
    if i >= x.size:
        return
    cuda.syncthreads()
    out[i] = x[i]


@pytest.mark.parametrize("kernel, line", [(sync_in_a_branch, "cuda.syncthreads()  # threads 16..63"),
                                          (sync_after_a_return, "cuda.syncthreads()")])
def test_a_syncthreads_some_threads_never_reach_is_named_in_strict_mode(kernel, line):
    from workbook.exercises import strict_simulator
    from workbook.simulator import StrictModeError

    x = np.arange(40 if kernel is sync_after_a_return else 64, dtype=np.float32)
    kernel[1, 64](x, np.zeros(64, np.float32))  # outside strict mode: as on a GPU that counts exited threads
    with strict_simulator(), pytest.raises(StrictModeError) as error:
        kernel[1, 64](x, np.zeros(64, np.float32))
    message = str(error.value)
    assert f"kernel '{kernel.__name__}', block (0, 0, 0)" in message and "never reached: they exited first" in message
    number = int(re.search(r"wait in syncthreads\(\) at test_sanitizer.py:(\d+)", message)[1])
    assert Path(__file__).read_text().splitlines()[number - 1].strip().startswith(line)


@cuda.jit
def read_then_atomic_add(counter, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = counter[0]  # a plain read of the word ...
        cuda.atomic.add(counter, 0, 1)  # ... that other threads update atomically


@cuda.jit
def atomic_add_then_read(counter, out):
    i = cuda.grid(1)
    if i < out.size:
        cuda.atomic.add(counter, 0, 1)
        out[i] = counter[0]  # the other way round: no barrier between another thread's atomic and this


@cuda.jit
def atomics_then_barrier_then_read(out):
    total = cuda.shared.array(1, np.int32)
    if cuda.threadIdx.x == 0:
        total[0] = 0
    cuda.syncthreads()
    cuda.atomic.add(total, 0, 1)  # atomics among themselves: no race
    cuda.syncthreads()  # ... and every one done before anyone reads
    out[cuda.threadIdx.x] = total[0]


@pytest.mark.parametrize("kernel, first, second", [
    (read_then_atomic_add, r"updated \(cuda\.atomic\.add\)", "reads"),
    (atomic_add_then_read, "read", r"updates \(cuda\.atomic\.add\)")])  # thread 0 reads before thread 1 adds
def test_a_plain_access_racing_an_atomic_is_named(kernel, first, second):
    """A GPU orders atomics only among themselves: a plain read of a word other threads update
    atomically, with no barrier between, reads any of its values. Both threads, both lines, the word."""
    counter, out = cuda.to_device(np.zeros(1, np.int32)), cuda.to_device(np.zeros(64, np.int32))
    pattern = (rf"race on global array counter\[0\] in kernel '{kernel.__name__}': thread \(\d, 0, 0\) of block "
               rf"\(0, 0, 0\) {first} it at test_sanitizer\.py:\d+, and thread \(\d, 0, 0\) of block \(0, 0, 0\) "
               rf"{second} it at test_sanitizer\.py:\d+")
    with sanitizing(), pytest.raises(RaceError, match=pattern):
        kernel[2, 32](counter, out)


def test_atomics_ordered_by_a_barrier_are_no_race():
    out = cuda.to_device(np.zeros(64, np.int32))
    with sanitizing():
        atomics_then_barrier_then_read[1, 64](out)
    assert (out.copy_to_host() == 64).all()
    counter, out = cuda.to_device(np.zeros(1, np.int32)), cuda.to_device(np.zeros(64, np.int32))
    with sanitizing():  # the atomic's own return value is no plain read
        add_only_kernel[2, 32](counter, out)
    assert sorted(out.copy_to_host()) == list(range(64))


@cuda.jit
def add_only_kernel(counter, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = cuda.atomic.add(counter, 0, 1)
