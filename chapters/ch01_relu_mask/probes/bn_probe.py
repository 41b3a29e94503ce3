"""Chapter 01's fused BatchNorm + add + ReLU (forward + backward) with other grids: how many
blocks per channel (`groups`: each block takes N / groups planes), each kernel timed alone and the
whole step, as a fraction of the copy ceiling measured in the same run.

    python chapters/ch01_relu_mask/probes/bn_probe.py [N C H W] [--groups 1,2,4,8,32]
    WORKBOOK_BN_BLOCKS_PER_SM=4 python chapters/ch01_relu_mask/probes/bn_probe.py     # the kernels built for 4 blocks an SM

A maintainer's tool (on a GPU); the chapter uses `batchnorm.plane_groups`, the default here.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import workbook  # noqa: E402,I001  (first: chooses GPU or simulator)

import numpy as np  # noqa: E402

from chapters.ch01_relu_mask import batchnorm as bn  # noqa: E402
from workbook import bench, cuda  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("shape", nargs="*", type=int, default=[32, 256, 56, 56])
    parser.add_argument("--groups", default="")
    args = parser.parse_args()
    shape = tuple(args.shape)
    n, c, h, w = shape
    auto = bn.plane_groups(n, c)
    groups = sorted({auto, *(int(g) for g in args.groups.split(",") if g)})
    rng = np.random.default_rng(0)
    x, identity, gamma, beta, mean, var = bn.batchnorm_inputs(rng, shape, with_identity=True)
    d = {name: cuda.to_device(a) for name, a in dict(x=x, identity=identity, gamma=gamma, beta=beta,
                                                    mean=mean, var=var).items()}
    d["dy"] = cuda.to_device(rng.standard_normal(shape, dtype=np.float32))
    for name in ("y", "dx", "d_identity"):
        d[name] = cuda.device_array(shape, np.float32)
    d["mask"] = cuda.device_array((n, c, bn.plane_words(h, w)), np.uint32)
    d["saved"] = cuda.device_array((2, c), np.float64)
    d["dgamma"], d["dbeta"] = cuda.device_array(c, np.float32), cuda.device_array(c, np.float32)

    def forward(g, quads):
        return bn.batchnorm_relu_forward(d["x"], d["gamma"], d["beta"], d["mean"], d["var"], d["y"], d["mask"],
                                         d["saved"], identity=d["identity"], groups=g, quads=quads)[0]

    def backward(g, quads):
        return bn.batchnorm_relu_backward(d["dy"], d["mask"], d["x"], d["gamma"], d["saved"], d["dx"],
                                          d["dgamma"], d["dbeta"], d_identity=d["d_identity"], groups=g,
                                          quads=quads)[0]

    def step(g, quads):
        forward(g, quads)
        return backward(g, quads)

    widths = [False, True] if (h * w) % 4 == 0 else [False]
    variants = [(g, quads) for quads in widths for g in groups]

    for quads in widths:
        step(auto, quads)
    if workbook.ON_GPU:
        for kernel in (bn.bn_stats_kernel, bn.bn_forward_kernel, bn.bn_backward_reduce_kernel, bn.bn_backward_dx_kernel,
                       *((bn.bn_stats_quads_kernel, bn.bn_forward_quads_kernel, bn.bn_backward_reduce_quads_kernel,
                          bn.bn_backward_dx_quads_kernel) if True in widths else ())):
            print(f"{kernel.__name__}: registers {list(kernel.get_regs_per_thread().values())}, "
                  f"local bytes {list(kernel.get_local_mem_per_thread().values())}")
    elements = n * c * h * w
    print(f"shape {shape}, {(bench.copy_ceiling() or {}).get('gbps', float('nan')):.0f} GB/s copy ceiling, default groups {auto} "
          f"({bn.sm_count()} SMs x {bn.BLOCKS_PER_SM} blocks / {c} channels)")
    for what, fn, bytes_per in (("forward (stats + apply)", forward, 4 + 12.125),
                                ("backward (reduce + dx)", backward, 12.125 + 12.125),
                                ("whole step", step, 4 + 3 * 12.125)):
        name = "{} groups={}".format
        result = bench.compare({name("quads" if quads else "4-byte", g): (lambda g=g, quads=quads: fn(g, quads))
                                for g, quads in variants}, bytes=bytes_per * elements, repeats=30, title=f"{what}")
        result.show()
        for g, quads in variants:
            key = name("quads" if quads else "4-byte", g)
            median, low, high = result.fraction(key)
            print(f"  {what}, {key}: {result[key].median_ms:.4f} ms, {median:.3f} [{low:.3f}-{high:.3f}] of the ceiling")


if __name__ == "__main__":
    main()
