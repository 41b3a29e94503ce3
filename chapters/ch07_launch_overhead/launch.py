"""Chapter 07's kernels: launches that cost nothing on the GPU, so that what is measured is the
launch. The cheaper ways to launch (PreparedLaunch, StepGraph) live in workbook/launch.py, since
every chapter's wrappers use them; this chapter shows them.
"""

import numpy as np
from numba import cuda

from workbook.launch import PreparedLaunch, StepGraph  # noqa: F401  (shown by the chapter)

# ---------------------------------------------------------------------------------------------
# Empty kernels: the cost of a launch and nothing else, by number of array arguments.


@cuda.jit
def empty_0():
    pass


@cuda.jit
def empty_1(a):
    pass


@cuda.jit
def empty_2(a, b):
    pass


@cuda.jit
def empty_4(a, b, c, d):
    pass


@cuda.jit
def empty_8(a, b, c, d, e, f, g, h):
    pass


EMPTY = {0: empty_0, 1: empty_1, 2: empty_2, 4: empty_4, 8: empty_8}


@cuda.jit
def scale_kernel(x, factor, out):
    """out = factor * x: a real kernel small enough that its launch is all it costs."""
    i = cuda.grid(1)
    if i < x.size:
        out[i] = factor * x[i]


def scale_reference(x, factor):
    return (np.float32(factor) * x).astype(np.float32)


