"""Argument checks for the chapters' host wrappers: a clear error before a launch, never a wrong
answer or a crash inside a kernel."""

from functools import lru_cache

import numpy as np
from numba import cuda

from . import ON_GPU


def require(array, name, *, dtype=None, shape=None, ndim=None, device=True):
    """Raise TypeError/ValueError unless `array` is what a kernel expects; returns it.

    dtype: one dtype or a tuple of accepted dtypes; shape: the exact shape; device: a device array
    (numba's, or anything with __cuda_array_interface__, e.g. a torch CUDA tensor, which is wrapped).
    """
    if device:
        if isinstance(array, np.ndarray):
            raise TypeError(f"{name} is a host (NumPy) array; copy it to the device first: "
                            f"cuda.to_device({name})")
        if not hasattr(array, "copy_to_host"):
            # Not numba's: anything else that lives on the GPU (a torch or CuPy tensor) is viewed
            # zero-copy. The simulator has no foreign device arrays.
            if not (ON_GPU and cuda.is_cuda_array(array)):
                raise TypeError(f"{name} must be a device array, not {type(array).__name__}")
            array = cuda.as_cuda_array(array)
    elif not isinstance(array, np.ndarray):
        raise TypeError(f"{name} must be a NumPy array, not {type(array).__name__}")
    if dtype is not None:
        accepted = _dtypes(dtype)
        if array.dtype not in accepted:
            names = " or ".join(str(d) for d in accepted)
            raise TypeError(f"{name} has dtype {np.dtype(array.dtype)}, expected {names}")
    if ndim is not None and array.ndim != ndim:
        raise ValueError(f"{name} has {array.ndim} dimensions, expected {ndim}")
    if shape is not None and tuple(array.shape) != tuple(shape):
        raise ValueError(f"{name} has shape {tuple(array.shape)}, expected {tuple(shape)}")
    if not _contiguous(array):
        raise ValueError(f"{name} must be C-contiguous")
    return array


@lru_cache(maxsize=None)
def _dtypes(dtype):
    """The accepted dtypes as a tuple of np.dtype, built once per spelling (a wrapper's checks run
    at every call: chapter 07 counts their cost)."""
    return tuple(np.dtype(d) for d in (dtype if isinstance(dtype, tuple) else (dtype,)))


def _contiguous(array):
    if hasattr(array, "is_c_contiguous"):  # numba's device arrays, real and simulated
        return array.is_c_contiguous()
    return bool(array.flags["C_CONTIGUOUS"])


@lru_cache(maxsize=None)
def sm_count():
    """Streaming multiprocessors on this GPU (132 on an H100); 2 in the simulator, to keep grids small.
    Asked once: the device query costs more than a kernel launch (chapter 07)."""
    return cuda.get_current_device().MULTIPROCESSOR_COUNT if ON_GPU else 2
