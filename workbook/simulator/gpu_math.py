"""`math` in a simulated kernel as a GPU computes it: IEEE results, never a Python exception.

A kernel's `math.log(0.0)` is -inf on a GPU and `math.exp(1000.0)` is inf; Python's math raises
ValueError and OverflowError, which the simulator would report as a crash inside the kernel, not
as the value a GPU computes. While a kernel or device function runs in the simulator, the `math`
module (and math functions imported by name) in its module's globals is this one: the same
functions, and where Python's would raise, NumPy's IEEE answer (nan, +-inf) instead.
"""

import contextlib
import math
import types

import numpy as np

_NUMPY = {"acos": np.arccos, "acosh": np.arccosh, "asin": np.arcsin, "atanh": np.arctanh, "cos": np.cos,
          "cosh": np.cosh, "exp": np.exp, "exp2": np.exp2, "expm1": np.expm1, "fmod": np.fmod, "ldexp": np.ldexp,
          "log": np.log, "log10": np.log10, "log1p": np.log1p, "log2": np.log2, "pow": np.power, "sin": np.sin,
          "sinh": np.sinh, "sqrt": np.sqrt, "tan": np.tan}


def _ieee(name, python, numpy):
    def function(*args):
        try:
            return python(*args)
        except (ValueError, OverflowError):  # where a GPU returns nan or +-inf
            if name == "log" and len(args) == 2:  # log(x, base)
                with np.errstate(all="ignore"):
                    return float(np.log(np.float64(args[0])) / np.log(np.float64(args[1])))
            with np.errstate(all="ignore"):
                return float(numpy(*(np.float64(a) if isinstance(a, float) else a for a in args)))

    function.__name__ = name
    return function


gpu_math = types.ModuleType("math", __doc__)
gpu_math.__dict__.update({k: v for k, v in vars(math).items() if not k.startswith("__")})
_REPLACED = {}
for _name, _numpy in _NUMPY.items():
    if hasattr(math, _name):
        _REPLACED[getattr(math, _name)] = _ieee(_name, getattr(math, _name), _numpy)
        setattr(gpu_math, _name, _REPLACED[getattr(math, _name)])
_REPLACED[math] = gpu_math

_swapped = {}  # id(globals) -> {name: original}


def install():
    """Wrap numba's swap of `cuda` in a kernel's globals (done while any of the module's kernels or
    device functions runs) so that it swaps `math` for gpu_math too, and back when the last leaves."""
    from numba.cuda.simulator import kernel, kernelapi

    stock = kernelapi.swapped_cuda_module
    if getattr(stock, "with_gpu_math", False):
        return

    @contextlib.contextmanager
    def swapped(fn, fake_cuda_module):
        globs = fn.__globals__
        gid = id(globs)
        with stock(fn, fake_cuda_module):
            lock = kernelapi._globals_locks[gid]
            with lock:
                if gid not in _swapped:
                    original = {k: v for k, v in globs.items() if _is_replaced(v)}
                    _swapped[gid] = original
                    globs.update({k: _REPLACED[v] for k, v in original.items()})
            try:
                yield
            finally:
                with lock:
                    if kernelapi._swap_refcount[gid] == 1 and gid in _swapped:  # the last one out
                        globs.update(_swapped.pop(gid))

    swapped.with_gpu_math = True
    kernelapi.swapped_cuda_module = kernel.swapped_cuda_module = swapped


def _is_replaced(value):
    try:
        return value in _REPLACED
    except TypeError:  # unhashable
        return False
