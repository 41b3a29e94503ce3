"""Checks of chapter 02's exercises against the chapter's NumPy references (the Philox mapping bit
for bit), at awkward sizes, with inf and NaN gradients where elements are dropped, on poisoned
outputs. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.exercises import Exercise, poisoned
from workbook.launch import cdiv

from . import kernels as k

# every residue class that matters: a partial first word, whole words (32, 64: no partial last word),
# every residue of a quad (4, 1, 6, 3), past a block (1000), large and odd (in the simulator too, more
# than one block's quads: 256 threads x 4). A thread a quad, no loop: no check on one block
SIZES = [1, 3, 4, 5, 6, 31, 32, 33, 64, 1000, workbook.size(gpu=(1 << 22) + 7, sim=2055)]
CASES = [(0.3, 0x0123456789ABCDEF, 0), (0.5, 42, (7 << 32) + 5), (0.0, 1, 2), (1.0, 3, 4)]


def _gradients(n, keep, seed=0):
    dy = np.random.default_rng(seed + n).standard_normal(n, dtype=np.float32)
    dy[~keep & (np.arange(n) % 2 == 0)] = np.inf  # dropped infinities must give 0, not NaN
    dy[~keep & (np.arange(n) % 2 == 1)] = np.nan
    return dy


def check_keep_flags(m):
    for n in SIZES:
        for p, seed, offset in CASES:
            out = m.keep_flags(n, p, seed, offset, poisoned(n, np.uint8))
            expected = k.keep_reference(n, p, seed, offset).astype(np.uint8)
            workbook.assert_close(out, expected, name=f"keep_flags n={n} p={p} seed={seed:#x} offset={offset:#x}")


def check_backward(m):
    for n in SIZES:
        for p, seed, offset in CASES[:2]:
            keep = k.keep_reference(n, p, seed, offset)
            dy = _gradients(n, keep)
            out = m.dropout_backward(cuda.to_device(dy), cuda.to_device(workbook.pack_bitmask(keep)), p,
                                     poisoned(n, np.float32))
            workbook.assert_close(out, k.backward_reference(dy, keep, p), name=f"dropout_backward n={n} p={p}")


def check_mask(m):
    for n in SIZES:
        for p, seed, offset in CASES:
            mask = m.dropout_mask(n, p, seed, offset, poisoned(cdiv(n, 32), np.uint32))
            workbook.assert_bitmask(mask, k.keep_reference(n, p, seed, offset), name=f"dropout_mask n={n} p={p}")


def check_seed_only(m):
    for n in SIZES:
        for p, seed, offset in CASES[:2]:
            keep = k.keep_reference(n, p, seed, offset)
            dy = _gradients(n, keep, seed=1)
            out = m.seed_only_backward(cuda.to_device(dy), p, seed, offset, poisoned(n, np.float32))
            workbook.assert_close(out, k.backward_reference(dy, keep, p), name=f"seed_only_backward n={n} p={p}")


EXERCISES = [
    Exercise("ch02.1", "the Philox counter and key", "complete", "keep_flags_kernel", check_keep_flags,
             grids=("more blocks", "smaller blocks"), tiles={("keep_flags_kernel", 0, 0): 4}),
    Exercise("ch02.2", "backward from the bitmask", "write", "dropout_backward_kernel", check_backward),
    Exercise("ch02.3", "the mask's padding bits", "fix", "dropout_mask_kernel", check_mask),
    Exercise("ch02.4", "the seed-only backward", "write", "seed_only_backward_kernel", check_seed_only,
             grids=("more blocks", "smaller blocks"), tiles={("seed_only_backward_kernel", 0, 0): 4}),
]
