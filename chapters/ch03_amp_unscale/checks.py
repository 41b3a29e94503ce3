"""Checks of chapter 03's exercises: unscale against the chapter's NumPy reference (inf, -inf and
NaN alone and together), the owner search with empty tensors, and the loss scale step by step
against a Python model. See workbook/exercises.py."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import CheckError, Launch, smallest_first
from workbook.exercises import Exercise, poisoned
from workbook.launch import cdiv

from . import kernels as k

# a partial warp (1, 31, 33), whole warps (64), past a block (1000), large and odd
SIZES = [1, 31, 33, 64, 1000, workbook.size(gpu=(1 << 22) + 7, sim=2001)]
SPECIALS = {"finite": None, "inf": np.inf, "-inf": -np.inf, "NaN": np.nan,
            "inf, NaN and -inf": (np.inf, np.nan, -np.inf)}  # several bad values: a flag, not a count


def _check_unscale(function, name, blocks=None):
    for n in SIZES:
        for special, value in SPECIALS.items():
            grad = np.random.default_rng(n).standard_normal(n, dtype=np.float32) * 1000
            for at, bad in enumerate(np.atleast_1d(value) if value is not None else ()):
                grad[((n * 5) // 7 + 37 * at) % n] = bad  # in the middle of some block, and apart
            _unscaled(function, name, n, special, grad, 0.125, blocks)
        if n == 33:  # a scale below 1 (inv_scale 4) that overflows finite gradients: the flag is the input's
            grad = np.float32(1e38) * np.random.default_rng(n).uniform(1, 3, n).astype(np.float32)  # not the product's
            _unscaled(function, name, n, "finite, inv_scale 4", grad, 4.0, blocks)


def _unscaled(function, name, n, special, grad, inv_scale, blocks):
    expected, expected_flag = k.unscale_reference([grad], inv_scale)
    d_grad = cuda.to_device(grad)
    found_inf = cuda.to_device(np.zeros(1, np.float32))
    with np.errstate(over="ignore"):
        function(d_grad, found_inf, cuda.to_device(np.array([inv_scale], np.float32)))
    launch = Launch(blocks, 128, grid_stride=True) if blocks else Launch(cdiv(n, 128), 128)
    label = f"{name} n={n}, {special}"
    workbook.assert_close(d_grad, expected[0], name=f"{label}: grad", launch=launch, input=grad)
    workbook.assert_close(found_inf, expected_flag, exact=True, name=f"{label}: found_inf")


def check_unscale(m):
    _check_unscale(m.unscale, "unscale")


def check_owners(m):
    rng = np.random.default_rng(3)
    cases = [[5], [1, 1, 1], [0, 3], [3, 0, 4], [0, 0, 7, 0], [12, 20], [33, 0, 0, 31, 1],
             list(rng.integers(0, 9, size=57)) + [4]]
    for sizes in smallest_first(cases, sum):
        starts = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
        items = int(np.sum(sizes))
        expected = (np.searchsorted(starts, np.arange(items), side="right") - 1).astype(np.int32)
        out = m.owners(cuda.to_device(starts), poisoned(items, np.int32))
        workbook.assert_close(out, expected, name=f"owners of tensor sizes {sizes}")


def check_grid_stride(m):
    _check_unscale(m.unscale_grid_stride, "unscale_grid_stride", blocks=2)
    # another grid than the wrapper's default: a stride of 2 blocks taken for granted scales twice
    n = SIZES[-1]  # (the largest: the cases run smallest first)
    grad = np.random.default_rng(5).standard_normal(n, dtype=np.float32)
    _unscaled(lambda g, f, s: m.unscale_grid_stride(g, f, s, blocks=3), "unscale_grid_stride, blocks=3", n,
              "finite", grad, 0.125, 3)


# (growth, backoff, interval, found_inf step by step): two rules, so that no constant of one passes
UPDATE_CASES = [(2.0, 0.5, 3, [0, 0, 0, 1, 0, 0, 0, 0, 1, 1, 0, 0, 0]),
                (4.0, 0.25, 5, [0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0])]


def check_update_scale(m):
    for growth, backoff, interval, flags in UPDATE_CASES:
        rule = f"growth={growth}, backoff={backoff}, interval={interval}"
        scale, good = np.float32(1024.0), 0
        d_scale, d_inv = cuda.to_device(np.array([scale])), poisoned(1, np.float32)
        d_good = cuda.to_device(np.zeros(1, np.int32))
        for step, flag in enumerate(flags):
            d_flag = cuda.to_device(np.array([flag], np.float32))
            m.update_scale(d_scale, d_inv, d_good, d_flag, growth=growth, backoff=backoff, interval=interval)
            if flag:
                scale, good = np.float32(scale * backoff), 0
            else:
                good += 1
                if good == interval:
                    scale, good = np.float32(scale * growth), 0
            got = (d_scale.copy_to_host()[0], d_inv.copy_to_host()[0], d_good.copy_to_host()[0])
            if got != (scale, np.float32(1) / scale, good):
                raise CheckError(f"update_scale ({rule}), step {step} (found_inf history {flags[:step + 1]}): got "
                                 f"scale, inv_scale, good_steps = {got}, expected {(scale, np.float32(1) / scale, good)}")
            if d_flag.copy_to_host()[0] != flag:
                raise CheckError(f"update_scale, step {step}: found_inf changed; leave it as it is")


def _one_flag_one_scale(kernel):
    """What the unscale kernels' spec fixes: one flag, one scale."""
    return {f"{kernel} argument 1": "found_inf: one flag", f"{kernel} argument 2": "inv_scale: one float"}


EXERCISES = [
    Exercise("ch03.1", "raise the found_inf flag", "complete", "unscale_kernel", check_unscale,
             fixed=_one_flag_one_scale("unscale_kernel")),
    Exercise("ch03.2", "the owner of an item: binary search", "write", "find_owner", check_owners),
    Exercise("ch03.3", "a grid-stride loop that stops short", "fix", "unscale_grid_stride_kernel",
             check_grid_stride,
             grids=("more blocks", "one block", "smaller blocks"),
             fixed=_one_flag_one_scale("unscale_grid_stride_kernel")),
    Exercise("ch03.4", "the dynamic loss scale, on the device", "write", "update_scale_kernel",
             check_update_scale,
             grids=("more blocks", "one block", "smaller blocks"),
             fixed={"update_scale_kernel argument 0": "the loss scale: one float",
                    "update_scale_kernel argument 1": "its inverse: one float",
                    "update_scale_kernel argument 2": "the count of good steps: one int",
                    "update_scale_kernel argument 3": "found_inf: one flag",
                    "update_scale_kernel warp residues": "one thread updates the scale",
                    "update_scale_kernel past one launch": "one thread updates the scale"}),
]
