"""What chapter 07's notebook measures with, so that the notebook shows the launch paths and their
figures rather than the plumbing:

    torch_tensor_calls   the chapters' wrappers called on torch tensors, each beside torch's own op
    launch_bound         the optimized kernels of chapters 01, 02 and 06 at growing sizes: GPU time
                         against the host cost of the wrapper and of the prepared launch
    plot_launch_bound    those sweeps, a panel each, and where each stops being launch-bound
    host_by_approach     one kernel launch's host cost, from numba's plain call down to a graph replay

Chapters 01, 02, 06 and 09 are imported for their public wrappers; what is measured is their
calls, not their kernels.
"""

import numpy as np

from workbook import ON_GPU, bench, cuda, plots
from workbook.check import assert_close
from workbook.host import standard_normal

from chapters.ch01_relu_mask import kernels as relu
from chapters.ch02_dropout import kernels as dropout
from chapters.ch06_softmax import kernels as softmax


def _exact(out, ref, name):
    assert_close(out, ref, exact=True, name=name)


def torch_tensor_calls(torch, rng, xa, xs, mask_words):
    """{name: (the wrapper on torch tensors, its reference, its check, {torch's op: the call})} on
    the notebook's inputs xa (a vector) and xs (rows of 1024), viewed as torch tensors; the outputs
    torch's own. Empty without torch CUDA tensors of uint32 (the masks: torch 2.3 or later). On a
    GPU with wgmma (compute capability 9.0), chapter 09's GEMM at 512^3 FP16 too."""
    calls = {}
    if torch is None or not hasattr(torch, "uint32"):
        return calls
    tx, tsx = bench.torch_view(xa), bench.torch_view(xs)
    ty, tdrop_y, tsout = torch.empty_like(tx), torch.empty_like(tx), torch.empty_like(tsx)
    tmask, tdrop_mask = (torch.empty(mask_words, dtype=torch.uint32, device="cuda") for _ in range(2))
    calls["ch01 relu + mask"] = (lambda: relu.relu_mask_quads(tx, ty, tmask),
                                 lambda: relu.relu_mask_reference(xa.copy_to_host()), _exact,
                                 {"torch.relu": lambda: torch.relu(tx)})
    calls["ch02 dropout"] = (lambda: dropout.dropout_bitmask(tx, 0.1, 42, 0, tdrop_y, tdrop_mask),
                             lambda: dropout.dropout_reference(xa.copy_to_host(), 0.1, 42, 0), _exact,
                             {"torch native_dropout": lambda: torch.native_dropout(tx, 0.1, True)})
    calls["ch06 softmax"] = (lambda: softmax.softmax(tsx, tsout), lambda: softmax.softmax_reference(xs.copy_to_host()),
                             None, {"torch.softmax": lambda: torch.softmax(tsx, -1)})
    if tuple(cuda.get_current_device().compute_capability) == (9, 0):
        from chapters.ch09_tensor_cores import kernels as tc

        a16, bt16 = (rng.standard_normal((512, 512)).astype(np.float16) for _ in range(2))
        ta16, tbt16 = (torch.as_tensor(v, device="cuda") for v in (a16, bt16))
        tc32 = torch.empty(512, 512, device="cuda")
        within = float(tc.tolerance(a16, bt16.T, "f16").max())
        calls["ch09 gemm_bt 512^3 FP16"] = (
            lambda: tc.gemm_bt(ta16, tbt16, tc32), lambda: tc.gemm_reference(a16, bt16.T, "f16").astype(np.float32),
            lambda out, ref, name: assert_close(out, ref, rtol=0, atol=within, name=name),
            {"torch.matmul": lambda: torch.matmul(ta16, tbt16.T)})
    return calls


def _relu_at(rng, size):
    x = cuda.to_device(standard_normal(rng, size))  # on every core at the large sizes
    y, mask = cuda.device_array_like(x), cuda.device_array(relu.mask_words(size), np.uint32)
    return (lambda: relu.relu_mask_quads(x, y, mask), relu.prepare_relu_mask_quads(x, y, mask),
            lambda: relu.relu_mask_reference(x.copy_to_host()), _exact)


def _dropout_at(rng, size):
    x = cuda.to_device(standard_normal(rng, size))
    y, mask = cuda.device_array_like(x), cuda.device_array(-(-size // 32), np.uint32)
    step = dropout.prepare_dropout_bitmask(x, 0.1, 42, y, mask)
    return (lambda: dropout.dropout_bitmask(x, 0.1, 42, 0, y, mask), lambda: step(0),
            lambda: dropout.dropout_reference(x.copy_to_host(), 0.1, 42, 0), _exact)


def _softmax_at(rng, size):
    x = cuda.to_device(standard_normal(rng, (size // 1024, 1024)))
    out = cuda.device_array_like(x)
    return (lambda: softmax.softmax(x, out), softmax.prepare_softmax(x, out),
            lambda: softmax.softmax_reference(x.copy_to_host()), None)


SWEEPS = {"ch01 relu + mask (16-byte)": ("relu forward: GPU time vs host cost", _relu_at),
          "ch02 dropout + bitmask": ("dropout: GPU time vs host cost", _dropout_at),
          "ch06 softmax, rows of 1024": ("softmax: GPU time vs host cost", _softmax_at)}


def launch_bound(chapter, rng, sizes):
    """Each of SWEEPS at each size, wrapper and prepared launch in one compare() (checked there, GPU
    time and host cost measured together): {name: {series: [a value per size]}}."""
    sweeps = {}
    for name, (title, make) in SWEEPS.items():
        series = sweeps[name] = {"GPU time (us)": [], "wrapper host cost (us)": [], "prepared launch host cost (us)": []}
        for size in sizes:
            wrapper, prepared, reference, check = make(rng, size)
            chapter.compare(title, {"wrapper": wrapper, "prepared": prepared}, reference=reference, check=check,
                            poison_outputs=False, size=f"{size:,} elements", repeats=20, show=False)
            rows = {row["variant"]: row for row in chapter.cases[-1]["rows"]}
            series["GPU time (us)"].append(rows["wrapper"]["median_ms"] * 1e3 if ON_GPU else None)
            series["wrapper host cost (us)"].append(rows["wrapper"]["host_us"])
            series["prepared launch host cost (us)"].append(rows["prepared"]["host_us"])
    return sweeps


def plot_launch_bound(sizes, sweeps):
    """The sweeps, a panel each (log scale); prints the size where each wrapper's GPU time first
    passes its host cost."""
    figure, panels = plots.plt.subplots(1, len(sweeps), figsize=(15, 4), sharey=True)
    for panel, (name, series) in zip(panels, sweeps.items()):
        plots.sweep(sizes, series, xlabel="elements", ylabel="microseconds", title=name, logy=True, axes=panel)
        crossing = next((size for size, gpu, host in zip(sizes, series["GPU time (us)"],
                                                         series["wrapper host cost (us)"]) if gpu > host), None)
        print(f"{name}: " + (f"the wrapper stops being launch-bound at about {crossing:,} elements" if crossing
                             else "launch-bound at every size of the sweep"))
    figure.suptitle("GPU time vs host cost per call")
    figure.tight_layout()
    return figure


def host_by_approach(chapter, with_torch):
    """{approach: host us per kernel launch} from this run's cases, the BN step's graph replay
    shared over its 4 kernels."""
    def host_us(key, variant):
        case = next(case for case in reversed(chapter.cases) if case["key"] == key)
        return next(row["host_us"] for row in case["rows"] if row["variant"] == variant)

    scale = "scale, 4096 floats"
    by_approach = {
        "kernel[grid, block](...), empty, 2 arrays": host_us("empty launches", "numba, 2 array args"),
        "kernel[grid, block](...), scale": host_us(scale, "kernel[grid, block](...)"),
        "bound launcher, scale": host_us(scale, "bound launcher"),
        "ch01 wrapper (checks + LaunchCache)": host_us("ch01 relu + mask, host cost", "wrapper relu_mask_quads"),
        "PreparedLaunch, cuda.core.launch": host_us(scale, "prepared, cuda.core.launch"),
        "PreparedLaunch, cuLaunchKernel": host_us(scale, "prepared, cuLaunchKernel"),
        "graph replay, per kernel (BN step / 4)": host_us("bn+add+relu step: launches vs graph", "graph replay") / 4,
    }
    if with_torch:
        by_approach["torch.mul(out=) (baseline)"] = host_us(scale, "torch.mul(out=)")
    return by_approach
