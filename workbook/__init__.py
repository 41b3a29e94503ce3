"""The workbook's helper package: pick GPU or simulator, check kernels, time them, store and plot results.

`import workbook` before anything imports numba.cuda: it applies WORKBOOK_DEVICE (see device.py)."""

import os as _os

from .device import choose_mode as _choose_mode

# Small grids are deliberate in the simulator and in the tests' awkward sizes.
_os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")

MODE = _choose_mode()  # "gpu" or "sim"

from numba import cuda  # noqa: E402  (must follow the mode choice)

if MODE == "sim":
    from . import simulator as _simulator

    _simulator.install()

ON_GPU = MODE == "gpu"

from .check import CheckError, Launch, assert_bitmask, assert_close, pack_bitmask, unpack_bitmask  # noqa: E402,F401
from .chapter import Chapter  # noqa: E402,F401


def size(gpu, sim):
    """A problem size for this mode: large on a GPU (past the 50 MB L2), small in the simulator."""
    return gpu if ON_GPU else sim


def show(function):
    """Display the source of a kernel or device function, as the tests run it (one copy)."""
    import inspect

    source = inspect.getsource(getattr(function, "py_func", function))
    try:
        from IPython import get_ipython
        from IPython.display import Code, display

        if get_ipython() is not None:
            display(Code(source, language="python"))
            return
    except ImportError:
        pass
    print(source)
