"""The simulator's grid barrier: a kernel calling cuda.cg.this_grid().sync() runs its blocks side by
side (a cooperative launch), each with its own shared memory; a block that skips a grid.sync() is an
error naming it (on a GPU the launch would hang). On a GPU the same kernels run cooperatively.
workbook.barrier's counter barrier orders the blocks the same way."""

import numba
import numpy as np
import pytest

import workbook
from numba import cuda

from workbook.barrier import counter_barrier


@cuda.jit
def rotate_kernel(x, out, rounds):
    """Each round, element i takes element i+1's value: across blocks, so only a grid barrier orders it."""
    grid = cuda.cg.this_grid()
    mine = cuda.shared.array(1, np.float32)
    i = cuda.grid(1)
    for r in range(rounds):
        if cuda.threadIdx.x == 0:
            mine[0] = r  # each block's own shared memory: no block sees another's
        cuda.syncthreads()
        if i < x.size:
            out[r, i] = x[(i + 1) % x.size] + mine[0]
        grid.sync()
        if i < x.size:
            x[i] = out[r, i]
        grid.sync()


def test_blocks_meet_at_the_grid_barrier():
    n, rounds = 10, 3
    x = np.arange(n, dtype=np.float32)
    d_x, d_out = cuda.to_device(x), cuda.to_device(np.zeros((rounds, n), np.float32))
    rotate_kernel[3, 4](d_x, d_out, rounds)
    expected, value = [], x.copy()
    for r in range(rounds):
        value = np.roll(value, -1) + r
        expected.append(value)
    np.testing.assert_array_equal(d_out.copy_to_host(), np.array(expected))


@cuda.jit
def skipping_kernel(x):
    grid = cuda.cg.this_grid()
    if cuda.blockIdx.x == 1:
        return
    grid.sync()
    x[cuda.blockIdx.x] = 1


@pytest.mark.skipif(workbook.ON_GPU, reason="on a GPU this launch hangs")
def test_a_block_that_skips_the_barrier_is_named():
    from workbook.simulator import GridSyncError

    with pytest.raises(GridSyncError, match=r"block\(s\) \(1, 0, 0\) will never reach"):
        skipping_kernel[3, 4](cuda.to_device(np.zeros(3, np.float32)))


@cuda.jit(device=True)
def barrier():
    cuda.cg.this_grid().sync()


@cuda.jit
def calls_barrier(x):
    barrier()


@cuda.jit
def no_barrier(x):
    cuda.syncthreads()


@pytest.mark.skipif(workbook.ON_GPU, reason="the simulator's own detection")
def test_a_grid_sync_is_found_in_device_functions_too():
    from workbook.simulator import uses_grid_sync

    assert uses_grid_sync(calls_barrier.fn) and uses_grid_sync(rotate_kernel.fn)
    assert not uses_grid_sync(no_barrier.fn)


@cuda.jit
def counter_rotate_kernel(x, out, rounds, counter):
    """rotate_kernel with workbook.barrier's counter barrier in place of grid.sync()."""
    cuda.cg.this_grid()  # launched cooperatively: every block resident
    i, blocks = cuda.grid(1), cuda.gridDim.x
    for r in range(rounds):
        if i < x.size:
            out[r, i] = x[(i + 1) % x.size] + r
        counter_barrier(counter, numba.uint64((2 * r + 1) * blocks))
        if i < x.size:
            x[i] = out[r, i]
        counter_barrier(counter, numba.uint64((2 * r + 2) * blocks))


def test_the_counter_barrier_orders_blocks_like_grid_sync():
    n, rounds = 10, 3
    x = np.arange(n, dtype=np.float32)
    d_x, d_out = cuda.to_device(x), cuda.to_device(np.zeros((rounds, n), np.float32))
    counter = cuda.to_device(np.zeros(1, np.uint64))
    counter_rotate_kernel[3, 4](d_x, d_out, rounds, counter)
    expected, value = [], x.copy()
    for r in range(rounds):
        value = np.roll(value, -1) + r
        expected.append(value)
    np.testing.assert_array_equal(d_out.copy_to_host(), np.array(expected))
    assert counter.copy_to_host()[0] == 2 * rounds * 3  # every block arrived at every barrier


@cuda.jit
def rotate_once_kernel(x, out, rounds):
    """rotate_kernel without its second grid.sync(): a block may overwrite x[i] for the next round
    while a block behind it still reads x[i] for this one."""
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    for r in range(rounds):
        if i < x.size:
            out[r, i] = x[(i + 1) % x.size] + r
        grid.sync()
        if i < x.size:
            x[i] = out[r, i]


@pytest.mark.skipif(workbook.ON_GPU, reason="the simulator's sanitizer")
def test_the_sanitizer_orders_blocks_by_grid_sync():
    from workbook.simulator import RaceError, sanitizing

    def run(kernel):
        kernel[3, 4](cuda.to_device(np.arange(10, dtype=np.float32)), cuda.to_device(np.zeros((3, 10), np.float32)), 3)

    with sanitizing():
        run(rotate_kernel)  # two grid.sync() a round: every access ordered
        with pytest.raises(RaceError, match=r"x\[\d\].*of block \(\d, 0, 0\).*grid\.sync\(\) between them"):
            run(rotate_once_kernel)


@cuda.jit
def sync_in_branch(x):
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    if i < x.size:
        x[i] = 1
        grid.sync()


@cuda.jit
def sync_after_return(x):
    grid = cuda.cg.this_grid()
    i = cuda.grid(1)
    if i >= x.size:
        return
    grid.sync()


def test_a_grid_sync_some_thread_skips_is_found_before_any_launch():
    """What an exercise's wrapper asks before launching an answer on a GPU, where it would hang."""
    from workbook.barrier import unsafe_grid_sync

    assert "inside an if" in unsafe_grid_sync(sync_in_branch)
    assert "after the return at line" in unsafe_grid_sync(sync_after_return)
    assert unsafe_grid_sync(rotate_kernel) is None and unsafe_grid_sync(counter_rotate_kernel) is None
