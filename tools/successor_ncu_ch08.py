"""Chapter 08's `half_weights_kernel` under both compilers, for Nsight Compute (issue 62).

On a GPU, with numba-cuda-mlir importable (tools/successor_on_device.sh sets it up):

    ncu --kernel-name regex:half_weights --section WarpStateStats --section LaunchStats \\
        --section SourceCounters python tools/successor_ncu_ch08.py [--width 2]

launches the kernel `--launches` times with numba-cuda, then as many with the successor's build of
the same source on the same arrays (numba-cuda's first, so ncu's first profiled launches are
numba-cuda's). --width is the network's width (the tests use 2). The successor's writes are checked
against numba-cuda's, so a profile of a wrong kernel cannot pass for a slow one.
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from chapters.ch08_capstone import mixed, network  # noqa: E402
from workbook import successor  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=2)
    parser.add_argument("--launches", type=int, default=3)
    options = parser.parse_args()
    net = mixed.MixedNetwork(network.init_parameters(options.width, seed=3), 2)
    p, w = net.params, net.width
    args = (p["conv1"], p["conv2"], p["conv3"], p["fc.wt"], net.w16[1], net.w16[2], net.w16[3], net.wt16[2],
            net.wt16[3], net.fc16.reshape(w, network.CLASSES), net.fc16_t.reshape(network.CLASSES, w))
    grid, block = -(-net.w16[2].size // mixed.layers.THREADS), mixed.layers.THREADS
    launcher = successor.Launcher()
    successor_kernel = launcher.kernel(mixed.half_weights_kernel)
    successor_args = [launcher.argument(a) for a in args]
    expected = None
    for name, launch in (("numba-cuda", lambda: mixed.half_weights_kernel[grid, block](*args)),
                         ("numba-cuda-mlir", lambda: successor_kernel[grid, block](*successor_args))):
        for target in args[4:]:
            target.copy_to_device(np.zeros(target.shape, target.dtype))
        for _ in range(options.launches):
            launch()
        cuda.synchronize()
        written = [t.copy_to_host() for t in args[4:]]
        if expected is None:
            expected = written
            assert any(np.any(x != 0) for x in written), "numba-cuda's launch wrote nothing"
        else:
            for got, want in zip(written, expected):
                np.testing.assert_array_equal(got, want)
        print(f"{name}: {options.launches} launches of {grid} x {block}, correct")


if __name__ == "__main__":
    main()
