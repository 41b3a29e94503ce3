"""Checks of chapter 05's exercises against the chapter's NumPy references, on images of awkward
shapes (1x1, one row, one column, wider than tall and taller than wide), with 0 and 255 pixels, on poisoned outputs. See
workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import smallest_first
from workbook.exercises import Exercise, poisoned

from . import kernels as k

SHAPES = smallest_first([(1, 1), (1, 33), (31, 1), (7, 33), (4, 64), (33, 65), workbook.size(gpu=(1001, 3001), sim=(37, 71))])
WIDE = [(1, 2), (3, 5), (7, 33), (2, 64), (9, 70), workbook.size(gpu=(513, 2049), sim=(17, 63))]  # height < width
TALL = [(2, 1), (5, 3), (33, 7), (70, 9)]  # and height > width: a fix for one of the two is no fix


def _image(shape, seed):
    image = np.random.default_rng(seed + shape[0] * 7919 + shape[1]).integers(0, 256, shape, dtype=np.uint8)
    image.reshape(-1)[::5] = 255  # 255 + 255 overflows a uint8 sum
    image.reshape(-1)[1::7] = 0
    return image


def check_merge(m):
    for shape in SHAPES:
        a, b = _image(shape, 1), _image(shape, 2)
        out = m.merge(cuda.to_device(a), cuda.to_device(b), poisoned(shape, np.uint8))
        workbook.assert_close(out, k.merge_reference(a, b), name=f"merge {shape}")


def _check_blur(blur, name, shapes):
    for shape in shapes:
        src = _image(shape, 3)
        out = blur(cuda.to_device(src), poisoned(shape, np.uint8))
        workbook.assert_close(out, k.blur_reference(src), name=f"{name} {shape}")


def check_blur(m):
    _check_blur(m.blur, "blur", SHAPES)


def check_blur_clamped(m):
    _check_blur(m.blur_clamped, "blur_clamped", smallest_first(WIDE + TALL))


def check_merge4(m):
    for shape in SHAPES:
        words = (shape[0] * shape[1] + 3) // 4
        a, b = _image((words, 4), 4), _image((words, 4), 5)
        out = m.merge4(cuda.to_device(a.reshape(-1).view(np.uint32)), cuda.to_device(b.reshape(-1).view(np.uint32)),
                       poisoned(words, np.uint32))
        workbook.assert_close(workbook.check.to_host(out).view(np.uint8), k.merge_reference(a, b).reshape(-1),
                              name=f"merge4, {words} words (as bytes)")


EXERCISES = [
    Exercise("ch05.1", "the merge pixel", "complete", "merge_kernel", check_merge,
             grids=("more blocks", "one block", "smaller blocks")),
    Exercise("ch05.2", "a 3x3 blur, clamped to the edge", "write", "blur_kernel", check_blur),
    Exercise("ch05.3", "a blur right on square images only", "fix", "blur_clamped_kernel", check_blur_clamped),
    Exercise("ch05.4", "four pixels per uint32", "write", "merge4_kernel", check_merge4,
             grids=("more blocks", "one block", "smaller blocks")),
]
