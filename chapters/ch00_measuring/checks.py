"""Checks of chapter 00's exercises: each runs the student's wrappers (module `m`: exercises.py or
solutions.py) at awkward sizes on poisoned outputs and names what is wrong. See workbook/exercises.py."""


import numpy as np

import workbook
from workbook import cuda
from workbook.check import Launch, smallest_first
from workbook.exercises import Exercise, poisoned, speed_ratio
from workbook.launch import cdiv

from . import kernels as k

# a partial warp (1, 31, 33), whole warps (64), past a block (1000), large and odd
SIZES = [1, 31, 33, 64, 1000, workbook.size(gpu=(1 << 22) + 7, sim=3001)]


def _random(n, seed=0):
    return np.random.default_rng(seed + n).standard_normal(n, dtype=np.float32)


def check_grid_stride(m):
    for n in SIZES:
        src = _random(n)
        out = m.copy_grid_stride(cuda.to_device(src), poisoned(n, np.float32))
        workbook.assert_close(out, src, exact=True, name=f"copy_grid_stride n={n}",
                              launch=Launch(2, k.THREADS_PER_BLOCK, grid_stride=True))


def check_reverse(m):
    for n in SIZES:
        src = _random(n)
        out = m.reverse(cuda.to_device(src), poisoned(n, np.float32))
        workbook.assert_close(out, src[::-1], exact=True, name=f"reverse n={n}",
                              launch=Launch(cdiv(n, k.THREADS_PER_BLOCK), k.THREADS_PER_BLOCK))


def check_two_in_flight(m):
    # 1024 = two grid-widths of 2 x 256 threads: the main loop does every element and the tail
    # nothing, so a wrong tail passes there; the other sizes need the tail.
    for n in smallest_first([1024, *SIZES]):
        src = _random(n)
        out = m.copy_two_in_flight(cuda.to_device(src), poisoned(n, np.float32))
        workbook.assert_close(out, src, exact=True, name=f"copy_two_in_flight n={n}",
                              launch=Launch(2, k.THREADS_PER_BLOCK, grid_stride=True))


MATRIX_SHAPES = smallest_first([(1, 1), (1, 33), (31, 1), (33, 31), (2, 64), workbook.size(gpu=(2049, 3001), sim=(37, 67))])


def check_copy_matrix(m):
    for shape in MATRIX_SHAPES:
        src = np.random.default_rng(shape[0]).standard_normal(shape, dtype=np.float32)
        out = m.copy_matrix(cuda.to_device(src), poisoned(shape, np.float32))
        workbook.assert_close(out, src, exact=True, name=f"copy_matrix {shape}")


def speed_copy_matrix(m):
    side = workbook.size(gpu=8192, sim=96)  # on a GPU 256 MiB each way: five times a Hopper GPU's L2
    src = cuda.to_device(np.ones((side, side), np.float32))
    dst = cuda.device_array_like(src)
    flat_src, flat_dst = src.reshape(side * side), dst.reshape(side * side)
    # The yardstick is the chapter's coalesced copy with one element per thread: the access pattern
    # the exercise teaches, so the target travels between GPUs (a grid-stride copy with more bytes
    # in flight per thread gains more on a GPU with more bandwidth per SM, and would move the bar).
    ratio = speed_ratio(lambda: m.copy_matrix(src, dst), lambda: k.copy_one_per_thread(flat_src, flat_dst))
    return ratio, f"copy_matrix {side}x{side} vs chapter 00's copy_one_per_thread on the same bytes"


EXERCISES = [
    Exercise("ch00.1", "the grid-stride step", "complete", "copy_grid_stride_kernel", check_grid_stride,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch00.2", "reverse an array", "write", "reverse_kernel", check_reverse, coalesced=True),
    Exercise("ch00.3", "two loads in flight: the tail", "fix", "copy_two_in_flight_kernel",
             check_two_in_flight,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch00.4", "a coalesced matrix copy", "faster", ("copy_matrix_kernel", "copy_matrix"),
             check_copy_matrix, speed=speed_copy_matrix, target=0.75),
]
