"""Another thread order in the simulator (workbook/simulator/interleave.py): seeded, reproducible, it
shows what the default order (threads in index order, switching only where they must wait) hides,
and leaves race-free kernels' results alone."""

import workbook  # noqa: F401  (first: applies WORKBOOK_DEVICE before numba.cuda is imported)

import numpy as np
import pytest
from numba import cuda

from workbook.simulator.interleave import interleaved

pytestmark = pytest.mark.skipif(workbook.ON_GPU, reason="the simulator's thread orders")


@cuda.jit
def append_positive_racy(x, counter, out):
    """Each positive x into a slot of its own: taken by a plain read, then an atomic add. Two threads
    may read the same count: a race the default order never runs."""
    i = cuda.grid(1)
    if i < x.size and x[i] > 0:
        slot = counter[0]
        cuda.atomic.add(counter, 0, 1)
        out[slot] = x[i]


@cuda.jit
def append_positive(x, counter, out):
    i = cuda.grid(1)
    if i < x.size and x[i] > 0:
        out[cuda.atomic.add(counter, 0, 1)] = x[i]


@cuda.jit
def block_sums(x, out):
    """A warp shuffle reduction, then the block's warps through shared memory: ordered by the
    collectives and the barrier, whatever order the threads run in."""
    partial = cuda.shared.array(8, np.float32)
    i = cuda.grid(1)
    v = x[i] if i < x.size else np.float32(0)
    for offset in (16, 8, 4, 2, 1):
        v += cuda.shfl_down_sync(0xFFFFFFFF, v, offset)
    lane, warp = cuda.threadIdx.x % 32, cuda.threadIdx.x // 32
    if lane == 0:
        partial[warp] = v
    cuda.syncthreads()
    if cuda.threadIdx.x == 0:
        total = np.float32(0)
        for w in range(cuda.blockDim.x // 32):
            total += partial[w]
        out[cuda.blockIdx.x] = total


def appended(kernel, seed=None):
    x = np.arange(1, 97, dtype=np.float32)
    counter, out = np.zeros(1, np.int64), np.zeros(96, np.float32)
    if seed is None:
        kernel[3, 32](x, counter, out)
    else:
        with interleaved(seed):
            kernel[3, 32](x, counter, out)
    return counter[0], out


def test_another_order_shows_a_read_racing_an_atomic():
    count, out = appended(append_positive_racy)
    assert count == 96 and sorted(out) == list(range(1, 97)), "the default order hides the race"
    lost = [seed for seed in (1, 2, 3) if sorted(appended(append_positive_racy, seed)[1]) != list(range(1, 97))]
    assert lost, "no interleaved order overwrote a slot"


def test_an_order_is_reproducible_from_its_seed():
    first, second = appended(append_positive_racy, 7)[1], appended(append_positive_racy, 7)[1]
    np.testing.assert_array_equal(first, second)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_race_free_kernels_give_the_same_results_in_any_order(seed):
    count, out = appended(append_positive, seed)
    assert count == 96 and sorted(out) == list(range(1, 97))
    x = np.arange(256, dtype=np.float32)
    sums = np.zeros(2, np.float32)
    with interleaved(seed):
        block_sums[2, 128](x, sums)
    np.testing.assert_allclose(sums, [x[:128].sum(), x[128:].sum()])
