"""Checks of chapter 01's exercises: each runs the student's wrappers (module `m`: exercises.py or
solutions.py) at awkward sizes, with NaN, +-inf and signed zeros, on poisoned outputs. See
workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import smallest_first
from workbook.exercises import Exercise, poisoned, speed_ratio

from . import kernels as k

SIZES = [1, 31, 32, 33, 1000, workbook.size(gpu=(1 << 22) + 7, sim=3001)]


def _check_forward(forward, name):
    finite = np.random.default_rng(7).standard_normal(64, dtype=np.float32)  # and one with no special value
    for n, x in smallest_first([*((n, k.special_inputs(n)) for n in SIZES), (64, finite)], lambda case: case[0]):
        y, mask = forward(cuda.to_device(x), poisoned(n, np.float32), poisoned(k.mask_words(n), np.uint32))
        workbook.assert_close(y, k.relu_reference(x), exact=True, name=f"{name} y, n={n}")
        workbook.assert_bitmask(mask, x > 0, name=f"{name} mask, n={n}")


def check_relu_mask(m):
    _check_forward(m.relu_mask, "relu_mask")


def check_unpack(m):
    for n in SIZES:
        bits = k.special_inputs(n, seed=1) > 0
        out = m.unpack_mask(cuda.to_device(workbook.pack_bitmask(bits)), poisoned(n, np.uint8))
        workbook.assert_close(out, bits.astype(np.uint8), name=f"unpack_mask n={n}")


def check_backward(m):
    for n in smallest_first([*SIZES, 64]):
        x = k.special_inputs(n, seed=2)
        dy = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
        if n != 64:  # (64: finite gradients only)
            dy[~(x > 0)] = np.inf  # masked infinities: what an overflowing loss scale sends back
            dy[(x > 0) & (np.arange(n) % 7 == 0)] = np.nan  # a NaN gradient where the bit is set passes through
        out = m.relu_backward(cuda.to_device(dy), cuda.to_device(workbook.pack_bitmask(x > 0)),
                              poisoned(n, np.float32))
        workbook.assert_close(out, k.relu_backward_reference(dy, x > 0), exact=True, name=f"relu_backward n={n}")


def check_relu_mask_fast(m):
    _check_forward(m.relu_mask_fast, "relu_mask_fast")


def speed_relu_mask_fast(m):
    n = workbook.size(gpu=1 << 26, sim=4096)  # on a GPU 256 MiB of x: five times the L2
    x = cuda.to_device(np.random.default_rng(0).standard_normal(n, dtype=np.float32))
    y, mask = cuda.device_array(n, np.float32), cuda.device_array(k.mask_words(n), np.uint32)
    ratio = speed_ratio(lambda: m.relu_mask_fast(x, y, mask), lambda: k.relu_mask_ballot(x, y, mask))
    return ratio, f"relu_mask_fast vs chapter 01's relu_mask_ballot, n=2^26"


EXERCISES = [
    Exercise("ch01.1", "the mask word: one warp vote", "complete", "relu_mask_kernel", check_relu_mask,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch01.2", "unpack a mask to bytes", "write", "unpack_mask_kernel", check_unpack),
    Exercise("ch01.3", "backward: a multiply by the bit", "fix", "relu_backward_kernel", check_backward),
    Exercise("ch01.4", "a fast ReLU mask", "faster", ("relu_mask_fast_kernel", "relu_mask_fast"),
             check_relu_mask_fast, speed=speed_relu_mask_fast, target=0.75,
             grids=("more blocks", "one block", "smaller blocks")),
]
