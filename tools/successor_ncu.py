"""One chapter kernel under both compilers, for Nsight Compute (issue 62, the EXPERIMENTS.md that cite it).

On a GPU, with numba-cuda-mlir importable (tools/successor_on_device.sh sets it up):

    ncu --kernel-name regex:half_weights --section WarpStateStats --section InstructionStats \\
        python tools/successor_ncu.py ch08-half-weights [--size 2]

launches the case's kernel `--launches` times with numba-cuda, then as many with the successor's
build of the same source on the same arrays (numba-cuda's first, so ncu's first profiled launches
are numba-cuda's). The successor's output is checked against numba-cuda's, so a profile of a wrong
kernel cannot pass for a slow one. The cases, each at the size its tests launch by default:

    ch08-half-weights   chapter 08's half_weights_kernel; --size: the network's width (tests: 2)
    ch06-warp-softmax   chapter 06's warp_softmax_kernel(32, width=8), float16 rows of 1,000
                        columns; --size: rows (tests: 2)
    ch02-backward       chapter 02's backward_bitmask_kernel on float16; --size: elements (by
                        default about the tests' largest, 4,194,301)
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from workbook import successor  # noqa: E402


def ch08_half_weights(width):
    """(kernel, arguments, outputs, grid, block): the launch MixedNetwork.half_weights makes."""
    from chapters.ch08_capstone import mixed, network

    net = mixed.MixedNetwork(network.init_parameters(width, seed=3), 2)
    p, w = net.params, net.width
    args = (p["conv1"], p["conv2"], p["conv3"], p["fc.wt"], net.w16[1], net.w16[2], net.w16[3], net.wt16[2],
            net.wt16[3], net.fc16.reshape(w, network.CLASSES), net.fc16_t.reshape(network.CLASSES, w))
    return mixed.half_weights_kernel, args, args[4:], -(-net.w16[2].size // mixed.layers.THREADS), mixed.layers.THREADS


def ch06_warp_softmax(rows):
    """The launch chapter 06's softmax plans for float16 rows of 1,000 columns, 16-byte accesses."""
    from chapters.ch06_softmax import kernels

    rng = np.random.default_rng(0)
    x = cuda.to_device(rng.standard_normal((rows, 1000)).astype(np.float16))
    out = cuda.device_array_like(x)
    kernel, blocks, threads = kernels._softmax_plan(x, out, registers=True, wide=True)
    return kernel, (x, out), (out,), blocks, threads


def ch02_backward(n):
    """Chapter 02's backward from the bitmask on n float16 gradients, 16-byte build, as
    dropout_backward_bitmask launches it."""
    from chapters.ch02_dropout import kernels

    rng = np.random.default_rng(0)
    dy = cuda.to_device(rng.standard_normal(n).astype(np.float16))
    mask = cuda.to_device(rng.integers(0, 2**32, -(-n // 32), dtype=np.uint32))
    dx = cuda.device_array_like(dy)
    args = (dy, mask, dx, *kernels._fixed_scalars(0.25, 0), *kernels.split_u64(0))
    quads = -(-n // 4)
    return kernels.backward_bitmask_kernel, args, (dx,), kernels._blocks_for_quads(quads), kernels.THREADS_PER_BLOCK


CASES = {"ch08-half-weights": (ch08_half_weights, 2), "ch06-warp-softmax": (ch06_warp_softmax, 2),
         "ch02-backward": (ch02_backward, 4_194_301)}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=sorted(CASES))
    parser.add_argument("--size", type=int, default=None, help="the case's size (its tests' by default)")
    parser.add_argument("--launches", type=int, default=3)
    options = parser.parse_args()
    make, size = CASES[options.case]
    kernel, args, outputs, grid, block = make(options.size or size)
    launcher = successor.Launcher()
    built = launcher.kernel(kernel)
    views = [launcher.argument(a) for a in args]
    expected = None
    for name, launch in (("numba-cuda", lambda: kernel[grid, block](*args)),
                         ("numba-cuda-mlir", lambda: built[grid, block](*views))):
        for target in outputs:
            target.copy_to_device(np.zeros(target.shape, target.dtype))
        for _ in range(options.launches):
            launch()
        cuda.synchronize()
        written = [t.copy_to_host() for t in outputs]
        if expected is None:
            expected = written
            assert any(np.any(x != 0) for x in written), "numba-cuda's launch wrote nothing"
        else:
            for got, want in zip(written, expected):
                np.testing.assert_array_equal(got, want)
        print(f"{name}: {options.launches} launches of {grid} x {block}, correct")


if __name__ == "__main__":
    main()
