"""The workbook's helper package: pick GPU or simulator, check kernels, time them, store and plot results.

`import workbook` before anything imports numba.cuda: it applies WORKBOOK_DEVICE (see device.py)."""

import os as _os
import warnings as _warnings

from .device import choose_mode as _choose_mode

# Small grids are deliberate in the simulator and in the tests' awkward sizes.
_os.environ.setdefault("NUMBA_CUDA_LOW_OCCUPANCY_WARNINGS", "0")
# numba colours its typing errors through colorama, which re-wraps stdout for every error it formats,
# and typing a kernel raises and catches many: about a tenth of a compile. The messages are the same.
_os.environ.setdefault("NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING", "1")

MODE = _choose_mode()  # "gpu" or "sim"

from numba import cuda  # noqa: E402  (must follow the mode choice)

from .compat import allow_numpy_2_5 as _allow_numpy_2_5  # noqa: E402

_allow_numpy_2_5(MODE)  # numba-cuda 0.30 with numpy 2.5: see compat.py

# numba-cuda 0.30's own numba.cuda.random (the xoroshiro generators, imported by chapter 02) passes
# nopython=False to numba.jit, which numba 0.68 warns about at every import: not the reader's concern.
_warnings.filterwarnings("ignore", message="The keyword argument 'nopython=False' was supplied",
                         module="numba.core.decorators")

if MODE == "sim":
    from . import compiler as _compiler
    from . import simulator as _simulator

    _simulator.install()  # warp intrinsics, the event-driven scheduler, negative indices named
    _compiler.install()  # every launch also compiled for a GPU (see compiler.py)

ON_GPU = MODE == "gpu"

if ON_GPU:
    from . import successor as _successor

    _successor.install()  # WORKBOOK_COMPILER=numba-cuda-mlir: every launch compiled by the successor

from .check import CheckError, Launch, assert_bitmask, assert_close, pack_bitmask, unpack_bitmask  # noqa: E402,F401
from .chapter import Chapter  # noqa: E402,F401
from .compile_pool import warm_up  # noqa: E402,F401


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


def show_ptx(kernel, *args, grep=None, cc=(9, 0)):
    """Print the PTX a kernel compiles to for these arguments (example arrays, or numba types),
    on a GPU or, through workbook/compiler.py's worker, on a laptop. grep: a regular expression;
    only the matching lines are printed (e.g. r"vote|shfl" or r"ld\\.global\\.v4"). Returns the PTX."""
    import re

    from numba.core import types as numba_types

    from .compiler import argument_types, missing, ptx

    argtypes = tuple(a if isinstance(a, numba_types.Type) else argument_types((a,))[0] for a in args)
    if ON_GPU:
        from numba.cuda import compile_ptx

        text, _ = compile_ptx(kernel.py_func, argtypes, cc=cc)
    else:
        reason = missing()
        if reason:
            print(f"No PTX on this machine: {reason}. Stored PTX facts are in the chapter's text.")
            return ""
        text = ptx(kernel, argtypes, cc)
    name = getattr(kernel, "__name__", None) or kernel.fn.__name__
    lines = text.splitlines()
    if grep:
        picked = [f"{number:5d}  {line}" for number, line in enumerate(lines, 1) if re.search(grep, line)]
        print(f"{name}({', '.join(map(str, argtypes))}), cc {cc[0]}.{cc[1]}: {len(picked)} of {len(lines)} "
              f"PTX lines match {grep!r}")
        print("\n".join(picked))
    else:
        print(text)
    return text
