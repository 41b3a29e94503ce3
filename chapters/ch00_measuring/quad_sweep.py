"""How chapter 00's 16-byte copy was chosen: grid-stride quad copies (1, 2, 4 quads in flight;
128-512 threads; 2-32 blocks per SM) against one quad per thread on a data-sized grid, each timed
against torch's copy_ in the same process at 2^28 float32. GPU and torch only:

    WORKBOOK_DEVICE=gpu python chapters/ch00_measuring/quad_sweep.py
"""

import statistics

import numpy as np

import workbook
from workbook import cuda
from workbook.inputs import sm_count
from workbook.memory import load4, store4
from workbook.launch import cdiv


def grid_stride_copy(in_flight):
    """A grid-stride quad copy with `in_flight` independent quad loads per trip (generated: numba
    has no unroll pragma)."""
    lines = ["def kernel(src, dst):", "    quads = src.size // 4", "    grid = cuda.gridsize(1)",
             "    q = cuda.grid(1)", f"    while q + {in_flight - 1} * grid < quads:"]
    lines += [f"        v{j} = load4(src, 4 * (q + {j} * grid))" for j in range(in_flight)]
    lines += [f"        store4(dst, 4 * (q + {j} * grid), v{j})" for j in range(in_flight)]
    lines += [f"        q += {in_flight} * grid", "    while q < quads:",
              "        store4(dst, 4 * q, load4(src, 4 * q))", "        q += grid"]
    namespace = {"cuda": cuda, "load4": load4, "store4": store4}
    exec("\n".join(lines), namespace)
    return cuda.jit(namespace["kernel"])


def median_ms(launch, repeats=30):
    launch()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = cuda.event(), cuda.event()
        start.record()
        launch()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end))
    return statistics.median(times)


def main():
    import torch

    from chapters.ch00_measuring import kernels as k

    n = 1 << 28
    src = cuda.to_device(np.ones(n, np.float32))
    dst = cuda.device_array_like(src)
    t_src, t_dst = torch.as_tensor(src, device="cuda"), torch.as_tensor(dst, device="cuda")
    torch_copy = lambda: t_dst.copy_(t_src)  # noqa: E731
    print(f"{workbook.results.device_facts()['name']}, n = 2^28 float32; ratio = torch time / this time")
    for in_flight in (1, 2, 4):
        kernel = grid_stride_copy(in_flight)
        for threads in (128, 256, 512):
            for blocks_per_sm in (2, 4, 8, 16):
                blocks = sm_count() * blocks_per_sm * 256 // threads
                mine = median_ms(lambda: kernel[blocks, threads](src, dst))
                print(f"grid-stride, {in_flight} quads in flight, {threads} threads x {blocks} blocks: "
                      f"{median_ms(torch_copy) / mine:.3f}")
    for threads in (128, 256, 512, 1024):
        blocks = cdiv(n // 4 + 1, threads)
        mine = median_ms(lambda: k.copy_quads_kernel[blocks, threads](src, dst))
        print(f"a quad per thread, {threads} threads per block: {median_ms(torch_copy) / mine:.3f}")


if __name__ == "__main__":
    main()
