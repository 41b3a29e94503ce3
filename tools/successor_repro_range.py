"""A grid-stride `range` under numba-cuda-mlir 0.6.0: a 64-bit division at every loop's entry that
always takes the slow path (chapter 08's EXPERIMENTS.md, `half_weights_kernel`).

The same copy written two ways: `for i in range(first, n, stride)`, the workbook's grid-stride loop,
and the `while` loop it means. Without a GPU, each compiled by both:

    PYTHONPATH=<numba-cuda-mlir's site> python tools/successor_ptx.py successor_repro_range:range_loop \\
        "float32[::1], float32[::1]" --grep 'div\\.|neg\\.s64'
    (and successor_repro_range:while_loop)

The successor computes the range's trip count before the loop, for a positive step and for a
negative one (the step's sign is known at run time only), each with `div.u64`. The negative count
divides by -stride as an unsigned number, which never fits in 32 bits, so ptxas's 32-bit shortcut
never applies and every warp calls the `__cuda_sm20_div_u64` subroutine (66 instructions) at each
loop's entry: 48 calls in chapter 08's kernel. numba-cuda's `range` divides once, signed, by the
stride, and takes the slow path too when a thread's loop starts past its end (a negative count),
as here; its build of chapter 08's kernel took none. The `while` loop divides under neither.
Measured on the H200 (results/nvidia-h200/successor_repro_range.log): the `while` loop is the
faster under both compilers.

On a GPU, with the successor importable (tools/successor_on_device.sh run ...):

    ncu --metrics smsp__inst_executed.sum --kernel-name regex:_loop --launch-count 4 \\
        python tools/successor_repro_range.py

launches each kernel once per compiler (numba-cuda first), checks the copy, and prints the GPU time
of each launch: `loops` loops in a row over a small array, a block of threads, as chapter 08's
kernel runs them.
"""

import sys
from pathlib import Path

import numpy as np
from numba import cuda

LOOPS = 6  # chapter 08's half_weights_kernel: six grid-stride loops a thread


@cuda.jit
def range_loop(x, out):
    first, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(LOOPS):  # each loop to its own end, as each of chapter 08's arrays has its own size
        for i in range(first, out.size - k, stride):
            out[i] += x[i]


@cuda.jit
def while_loop(x, out):
    first, stride = cuda.grid(1), cuda.gridsize(1)
    for k in range(LOOPS):
        i = first
        while i < out.size - k:
            out[i] += x[i]
            i += stride


def main(n=144, block=256):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from workbook import bench, successor

    launcher = successor.Launcher()
    x = cuda.to_device(np.arange(n, dtype=np.float32))
    out = cuda.to_device(np.zeros(n, np.float32))
    functions = {}
    for kernel in (range_loop, while_loop):
        built = launcher.kernel(kernel)
        views = [launcher.argument(a) for a in (x, out)]
        for compiler, launch in (("numba-cuda", lambda k=kernel: k[1, block](x, out)),
                                 ("numba-cuda-mlir", lambda b=built, v=views: b[1, block](*v))):
            out.copy_to_device(np.zeros(n, np.float32))
            launch()
            loops = np.minimum(LOOPS, n - np.arange(n))  # element i: the loops whose end is past it
            np.testing.assert_array_equal(out.copy_to_host(), loops * np.arange(n, dtype=np.float32))
            functions[f"{kernel.py_func.__name__}, {compiler}"] = launch
    times = bench.time_interleaved(functions, repeats=31, flush=True)
    for name, values in times.items():
        low, mid, high = np.percentile(values, [25, 50, 75]) * 1e3
        print(f"{name:32s} {mid:6.2f} us [{low:.2f}-{high:.2f}]")


if __name__ == "__main__":
    main()
