"""What chapter 06's notebook checks and measures with, so that the notebook shows the kernels and
their figures rather than the plumbing:

    logits_like      logits of a given shape and dtype, drawn on every core for a GPU's sizes
    check_shapes     every naive and optimized wrapper against the float64 references, shape by shape
    column_sweep     softmax and cross-entropy forward on the same number of logits, rows of 32 to
                     32000 columns, against torch
    show_registers   what the compiler made of a kernel: registers and local memory a thread
"""

import functools

import numpy as np

from workbook import ON_GPU, bench, cuda, host, warm_up
from workbook.check import assert_close

from . import kernels as k


def logits_like(rows, ncols, dtype=np.float32, scale=4.0, generator=None):
    """standard_normal((rows, ncols)) * scale as `dtype`, drawn on every core (workbook/host.py)."""
    generator = np.random.default_rng(0) if generator is None else generator
    return (host.standard_normal(generator, (rows, ncols)) * np.float32(scale)).astype(dtype)


def close(out, ref, name):
    """float32 softmax tolerance: rtol 1e-3 past 1025 columns, where the naive kernel's sequential
    sum of up to 32000 exps drifts by ~1e-4 relative (the warp and block kernels add in a tree)."""
    assert_close(out, ref, rtol=1e-4 if ref.shape[1] <= 1025 else 1e-3, atol=1e-6, name=name)


@functools.cache  # a case's warm-up call (on a GPU) and its check share inputs and references
def _shape_case(rows, ncols, dtype, seed):
    case_rng = np.random.default_rng(seed)
    x = logits_like(rows, ncols, dtype, generator=case_rng)
    t = case_rng.integers(0, ncols, rows).astype(np.int32)
    return x, t, k.softmax_reference(x), k.cross_entropy_reference(x, t), k.cross_entropy_backward_reference(x, t)


def _check_shape(rows, ncols, dtype, seed, parts=("softmax", "cross-entropy", "backward")):
    """The naive and the optimized wrapper of each of `parts` on one shape, against the references."""
    x, t, probabilities, expected, gradient = _shape_case(rows, ncols, dtype, seed)
    d_x, d_t = cuda.to_device(x), cuda.to_device(t)
    tol = dict(rtol=1e-4 if ncols <= 1025 else 1e-3, atol=1e-6) if dtype == np.float32 else {}
    for softmax in (k.softmax_naive, k.softmax) if "softmax" in parts else ():
        out = softmax(d_x, cuda.device_array_like(d_x))
        assert_close(out, probabilities, name=f"{softmax.__name__} {rows}x{ncols}", **tol)
    for forward in (k.cross_entropy_naive, k.cross_entropy) if "cross-entropy" in parts else ():
        got = forward(d_x, d_t, cuda.device_array(rows, np.float32), cuda.device_array(rows, np.float32),
                      cuda.device_array(1, np.float32))
        for out, ref, what in zip(got, expected, ("mean", "loss", "lse")):
            assert_close(out, ref, rtol=1e-4, atol=1e-5, name=f"{forward.__name__} {what}")
    d_lse = cuda.to_device(expected[2])
    for backward in (k.cross_entropy_backward_naive, k.cross_entropy_backward) if "backward" in parts else ():
        grad = backward(d_x, d_t, d_lse, cuda.device_array_like(d_x))
        assert_close(grad, gradient, name=backward.__name__, **tol)


def check_shapes(shapes):
    """Every wrapper at every (rows, ncols) of `shapes` in float32, and in float16 at every shape on a
    GPU; in the simulator (every CUDA thread run in Python) float16 only at the shapes that take its
    other code paths: 33 and 1025 columns (element by element), 32000 (a block per row). Returns the
    float16 shapes."""
    cases = [(rows, ncols, dtype, seed) for seed, (rows, ncols) in enumerate(shapes)
             for dtype in (np.float32, np.float16) if dtype == np.float32 or ON_GPU or ncols in (33, 1025, 32000)]
    # a GPU compiles their kernels side by side, each case's three parts apart
    warm_up([lambda case=case, part=part: _check_shape(*case, parts=(part,))
             for case in cases for part in ("softmax", "cross-entropy", "backward")])
    for case in cases:
        _check_shape(*case)
    _shape_case.cache_clear()  # their inputs and references are not needed again
    return sorted({(rows, ncols) for rows, ncols, dtype, _ in cases if dtype == np.float16})


def column_sweep(chapter, torch, columns, total, rng):
    """`total` float32 logits cut into rows of each of `columns`: the softmax (8 bytes a logit) and
    the cross-entropy forward (4), naive and optimized, against torch, checked. Returns the two
    series, {variant: [GB/s per column count]}."""
    softmax_series = {"one thread per row": [], "warp/block per row": [], "torch.softmax": []}
    forward_series = {"one thread per row + tree mean": [], "fused": [], "torch cross_entropy": []}
    for ncols in columns:
        rows = max(1, total // ncols)
        s_host = logits_like(rows, ncols, generator=rng)  # kept for the references: no copy back
        s_x = cuda.to_device(s_host)
        s_out = cuda.device_array_like(s_x)
        s_t = rng.integers(0, ncols, rows)
        s_dt = cuda.to_device(s_t.astype(np.int32))
        s_losses, s_lse, s_mean = (cuda.device_array(rows, np.float32), cuda.device_array(rows, np.float32),
                                   cuda.device_array(1, np.float32))
        ts_x = bench.torch_view(s_x)
        ts_t = None if ts_x is None else torch.as_tensor(s_t, device="cuda")
        result = chapter.compare(
            "softmax sweep", {"one thread per row": lambda: k.softmax_naive(s_x, s_out),
                              "warp/block per row": lambda: k.softmax(s_x, s_out)},
            reference=lambda: k.softmax_reference(s_host), check=close,
            baselines={"torch.softmax": lambda: torch.softmax(ts_x, 1)},
            bytes=8 * rows * ncols, size=f"{rows}x{ncols}", repeats=10, show=False)
        for name in softmax_series:
            softmax_series[name].append(result.gbps(name))
        result = chapter.compare(
            "cross-entropy forward sweep",
            {"one thread per row + tree mean": lambda: k.cross_entropy_naive(
                s_x, s_dt, s_losses, s_lse, s_mean, check_targets=False)[0],
             "fused": lambda: k.cross_entropy(s_x, s_dt, s_losses, s_lse, s_mean, check_targets=False)[0]},
            reference=lambda: k.cross_entropy_reference(s_host, s_t)[0],
            check=lambda out, ref, name: assert_close(out, ref, rtol=1e-4, atol=1e-5, name=name),
            baselines={"torch cross_entropy": lambda: torch.nn.functional.cross_entropy(ts_x, ts_t).reshape(1)},
            bytes=4 * rows * ncols + 12 * rows, size=f"{rows}x{ncols}", repeats=10, show=False)
        for name in forward_series:
            forward_series[name].append(result.gbps(name))
    return softmax_series, forward_series


def show_registers(kernels):
    """On a GPU: each {name: kernel}'s registers and local memory a thread (no local memory: the row
    lives in registers)."""
    if ON_GPU:
        for name, kernel in kernels.items():
            print(f"{name}: registers/thread {list(kernel.get_regs_per_thread().values())}, "
                  f"local bytes/thread {list(kernel.get_local_mem_per_thread().values())}")
