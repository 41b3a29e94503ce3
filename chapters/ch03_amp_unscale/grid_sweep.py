"""How chapter 03's fused unscale got its grid, and what the chapter's table hides: a ~600M-element
mixed list (the chapter's recipe) unscaled by the fused kernel on grids of 8 to 64 blocks
per SM (looping over the tiles) and one block per tile, each timed against torch's fused kernel and
a torch copy of as many bytes, in the same process. Then the wrapper `unscale_fused` itself, and the
same kernel timed right after a host-bound call, as the chapter's table times it. GPU and torch only:

    WORKBOOK_DEVICE=gpu python chapters/ch03_amp_unscale/grid_sweep.py
"""

import numpy as np

import workbook
from workbook import cuda
from workbook.bench import copy_ceiling, time_interleaved, torch_view

from chapters.ch03_amp_unscale import kernels as k


def mixed_sizes(total=600_000_000, count=300, seed=0):
    """The chapter's recipe: log-normal sizes summing to ~total, mostly not multiples of a tile."""
    rng = np.random.default_rng(seed)
    weights = rng.lognormal(mean=0.0, sigma=1.5, size=count)
    return np.maximum(1, (weights / weights.sum() * total).astype(np.int64) + rng.integers(0, 4, count))


def main():
    if not workbook.ON_GPU:
        raise SystemExit("grid_sweep.py times kernels: it needs a GPU (WORKBOOK_DEVICE=gpu)")
    import torch

    sizes = mixed_sizes()
    rng = np.random.default_rng(1)
    grads = k.GradientList([cuda.to_device(rng.standard_normal(n, dtype=np.float32)) for n in sizes])
    found = cuda.to_device(np.zeros(1, np.float32))
    inv_scale = cuda.to_device(np.array([1.0], np.float32))  # values unchanged from run to run
    kernel = k.unscale_fused_kernels[np.dtype(np.float32)]
    (_, table), = grads.launches
    tiles = int(table.copy_to_host()[k.TILE_START, -1])
    sms = cuda.get_current_device().MULTIPROCESSOR_COUNT

    functions = {}
    for per_sm in (8, 16, 32, 64):
        launch = kernel[sms * per_sm, k.THREADS_PER_BLOCK]
        functions[f"{per_sm} blocks/SM, looping"] = lambda launch=launch: launch(table, found, inv_scale)
    launch = kernel[tiles, k.THREADS_PER_BLOCK]
    functions[f"a block per tile ({tiles})"] = lambda: launch(table, found, inv_scale)
    functions["unscale_fused (the wrapper)"] = lambda: k.unscale_fused(grads, found, inv_scale)
    torch_grads = [torch_view(a) for a in grads.arrays]
    torch_found, torch_inv = torch_view(found), torch_view(inv_scale)
    functions["torch _amp_foreach_..."] = lambda: torch._amp_foreach_non_finite_check_and_unscale_(
        torch_grads, torch_found, torch_inv)
    a = torch.empty(int(sizes.sum()), device="cuda")
    b = torch.empty_like(a)
    functions["torch copy_ of as many bytes"] = lambda: b.copy_(a)

    def idle_then_wrapper():
        # What the chapter's table measures for the fused call: it follows the per-tensor loop,
        # whose 300 launches leave the GPU idle, so the wrapper's host work (argument checks, the
        # launch) runs between the start event and the kernel.
        cuda.synchronize()
        k.unscale_fused(grads, found, inv_scale)

    for function in functions.values():  # warm-up: compiles
        function()
    cuda.synchronize()
    measured = time_interleaved(functions, repeats=20)
    idle = time_interleaved({"unscale_fused after an idle GPU": idle_then_wrapper}, repeats=20,
                            unheld={"unscale_fused after an idle GPU"})  # it synchronises: no hold
    ceiling = copy_ceiling()["gbps"]
    moved = 8 * int(sizes.sum())  # each float32 read once and written once
    print(f"{len(sizes)} tensors, {int(sizes.sum()):,} float32, {tiles} tiles of {k.TILE}; "
          f"copy ceiling {ceiling:.0f} GB/s (torch copy_, 2 x 512 MiB)")
    for name, times in {**measured, **idle}.items():
        ms = float(np.median(times))
        print(f"{name:36s} {ms:7.4f} ms  {moved / ms / 1e6:5.0f} GB/s  {moved / ms / 1e6 / ceiling:5.3f} of ceiling")


if __name__ == "__main__":
    main()
