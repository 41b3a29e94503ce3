"""The one compatibility shim the workbook carries: numba-cuda 0.30 on numpy 2.5.

numpy 2.5 removed `np.row_stack` (an alias of `np.vstack`). numba-cuda 0.30.x still registers an
overload for it, `overload(np.row_stack)` in numba/cuda/np/arrayobj.py, which its CUDA target
imports the first time a kernel is compiled: with numpy 2.5 that import raises AttributeError and
no kernel compiles. numba 0.68.1 guards the same line for its CPU target; numba-cuda is in
maintenance mode and will not (NVIDIA/numba-cuda#907).

`allow_numpy_2_5()` gives numpy a stand-in `row_stack` for the length of that one import, then takes
it away: numpy's namespace stays as numpy made it, and the overload registered is for the stand-in,
which no kernel can reach. With numpy < 2.5 (it still has row_stack), or in the simulator (which
never imports the CUDA target), it does nothing. `import workbook` calls it, so a notebook or a test
needs nothing else.
"""

import numpy as np


def _row_stack_removed(*args, **kwargs):
    raise AttributeError("numpy 2.5 removed np.row_stack: use np.vstack")


def allow_numpy_2_5(mode):
    """Import numba-cuda's array overloads with a stand-in np.row_stack where numpy lacks it.
    mode: "gpu", "compile" or "sim" (workbook.device.choose_mode). Returns True if it had to."""
    if mode == "sim" or hasattr(np, "row_stack"):
        return False
    np.row_stack = _row_stack_removed
    try:
        import numba.cuda.np.arrayobj  # noqa: F401  (the module that registers the overload)
    finally:
        del np.row_stack
    return True
