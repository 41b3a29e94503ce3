"""Argument checks for the chapters' host wrappers: a clear error before a launch, never a wrong
answer or a crash inside a kernel; and the views through which the wrappers take torch and CuPy
tensors at little more than the cost of numba's own arrays (chapter 07).

    x = require(x, "x", dtype=np.float32, ndim=1)   # numba's array as it is, or a view of a tensor's memory
"""

from collections import OrderedDict
from functools import lru_cache

import numpy as np
from numba import cuda

from . import ON_GPU


def require(array, name, *, dtype=None, shape=None, ndim=None, device=True):
    """Raise TypeError/ValueError unless `array` is what a kernel expects; returns it.

    dtype: one dtype or a tuple of accepted dtypes; shape: the exact shape; device: a device array
    (numba's, returned as it is, or anything with __cuda_array_interface__, e.g. a torch or CuPy
    CUDA tensor, returned as a numba view of its memory: see ForeignViews).
    """
    if device:
        # not numba's: a type already met as foreign (one lookup, no failed attribute), or any other
        if type(array) in _READERS or not hasattr(array, "copy_to_host"):
            if isinstance(array, np.ndarray):
                raise TypeError(f"{name} is a host (NumPy) array; copy it to the device first: "
                                f"cuda.to_device({name})")
            array = FOREIGN.view(array, name)
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


# ---------------------------------------------------------------------------------------------
# Foreign device arrays: torch and CuPy tensors, viewed as numba arrays at little cost per call


FOREIGN_VIEWS = 64  # views kept: a training step's tensors, a few times over


class ForeignViews:
    """numba views of foreign device arrays, made once per memory and layout.

    `cuda.as_cuda_array(tensor)` at every call is what a torch tensor used to cost a wrapper over a
    numba array: torch builds `__cuda_array_interface__` in Python, and numba makes a DeviceNDArray
    (its shape and strides worked out, its memory described). Here the view is made on the first
    call that sees a given (data pointer, shape, strides, dtype, device) and kept, at most `size`
    of them, the least recently used dropped first. A later call reads those five from the tensor
    - a torch tensor through its C accessors (`data_ptr()`, `shape`, `stride()`, `dtype`), anything
    else through its interface - and finds the view.

    A kept view does not hold its tensor: torch's caching allocator may free and reuse the memory
    while the view waits here. A view is only ever found for a live object with exactly that
    pointer, shape, strides, dtype and device: exactly the view that object needs. What `view()`
    hands out is a copy of the kept view whose memory names the caller's object as its owner, as
    `cuda.as_cuda_array`'s views do (a slice or a reshape of it inherits the owner): a wrapper may
    return it, or a prepared launch keep it, and the tensor stays alive with it.

    A torch tensor that requires grad is refused (these kernels are not recorded by autograd: pass
    `x.detach()`, the same memory, if no gradient should flow), as are torch tensors on the CPU and
    dtypes NumPy has no name for (bfloat16). An interface that names a stream (CuPy's) is
    synchronised on at every call, as `cuda.as_cuda_array` does when numba's
    CUDA_ARRAY_INTERFACE_SYNC is on (the default).

    make(description) -> view: builds a view from an interface dict, on the GPU numba's own
    `from_cuda_array_interface`; None where there are no foreign device arrays (the simulator,
    whose device arrays are host memory: a tensor on a GPU is refused with a message).
    """

    def __init__(self, size=FOREIGN_VIEWS, make=None):
        self.size, self.make = size, make
        self.views = OrderedDict()  # key -> the kept view (holds no tensor)
        self.misses = 0  # views made: a count for the tests and tools/host_cost_probe.py

    def view(self, array, name):
        """A numba view of foreign device array `array` (an argument called `name`), or TypeError."""
        reader = _READERS.get(type(array)) or _reader_for(type(array))
        key = reader.key(array, name)
        kept = self.views.get(key)
        if kept is None:
            kept = self._make(array, name, reader, key)
        else:
            try:
                self.views.move_to_end(key)
            except KeyError:  # dropped by another thread in between: it is still the right view
                pass
        return _held(kept, array)

    def _make(self, array, name, reader, key):
        if self.make is None:
            raise TypeError(f"{name} is a {type(array).__name__} in GPU memory: the simulator runs kernels on "
                            f"the host and cannot read it; copy it into a device array of the simulator "
                            f"(cuda.to_device of a NumPy copy)")
        description = reader.describe(array, key, name)
        address, itemsize = description["data"][0], np.dtype(description["typestr"]).itemsize
        if address % itemsize:
            raise ValueError(f"{name} starts at address {address:#x}, not a multiple of its {itemsize}-byte "
                             "elements: the kernels read whole elements; copy it to a fresh tensor")
        kept = self.make(description)
        self.misses += 1
        self.views[key] = kept
        if len(self.views) > self.size:
            self.views.popitem(last=False)
        return kept

    def clear(self):
        self.views.clear()


def _held(kept, owner):
    """A copy of kept view `kept` that holds `owner` (its memory's owner, as numba's views of foreign
    memory name it): a few attribute copies, none of the DeviceNDArray's construction."""
    view = object.__new__(type(kept))
    view.__dict__.update(kept.__dict__)
    memory = view.__dict__.get("gpu_data")
    if hasattr(memory, "_owner") and hasattr(memory, "__dict__"):
        # numba's MemoryPointer: it names the owner, and slices of the view inherit it
        held = object.__new__(type(memory))
        held.__dict__.update(memory.__dict__)
        held._owner = owner
        view.gpu_data = held
    else:  # any other view (the tests' host-memory views in the simulator)
        view._owner = owner
    return view


def held(view, owner):
    """A copy of a view kept without an owner (ForeignViews, launch.TensorCalls) that holds `owner`."""
    return _held(view, owner)


def unheld(view):
    """A copy of a view that holds nothing (its memory names no owner), to be kept between calls."""
    return _held(view, _NOT_HELD)


# How to read a foreign array's key cheaply, and describe it once for its view: one reader per type.


class _Reader:
    def __init__(self, key, describe):
        self.key, self.describe = key, describe


def _torch_key(tensor, name):
    """(data pointer, shape, strides in elements, torch dtype, device): torch's C-level accessors,
    a fraction of a microsecond each, where its __cuda_array_interface__ is built in Python."""
    device = tensor.get_device()  # -1 off the GPU
    if device < 0:
        where = (f"move it to the GPU first: {name}.cuda()" if ON_GPU else
                 f"the simulator takes its own device arrays: cuda.to_device({name}.numpy())")
        raise TypeError(f"{name} is a torch tensor on {tensor.device}; {where}")
    if tensor.requires_grad:
        raise TypeError(f"{name} is a torch tensor that requires grad, and these kernels are not recorded by "
                        f"autograd: pass {name}.detach() (the same memory) if no gradient should flow through "
                        "this call")
    try:
        pointer = tensor.data_ptr()
    except RuntimeError as error:  # a sparse tensor, a tensor without storage
        raise TypeError(f"{name}: torch gives no data pointer for it ({error}); a dense CUDA tensor is "
                        "needed") from None
    return pointer, tensor.shape, tensor.stride(), tensor.dtype, device


torch_key = _torch_key  # for launch.TensorCalls: the same checks, the same key


def _torch_describe(tensor, key, name):
    pointer, shape, strides, torch_dtype, device = key
    dtype = _TORCH_DTYPES.get(torch_dtype) or _torch_dtype(torch_dtype, name)  # once per view, not per call
    if ON_GPU and device != cuda.get_current_device().id:
        raise ValueError(f"{name} is on cuda:{device}, but numba runs on GPU {cuda.get_current_device().id}: "
                         f"cuda.select_device({device}) first, or move the tensor")
    contiguous = tensor.is_contiguous()  # as torch's own interface: no strides when contiguous
    return {"data": (pointer if tensor.numel() else 0, False), "shape": tuple(shape),
            "strides": None if contiguous else tuple(s * dtype.itemsize for s in strides),
            "typestr": dtype.str, "version": 2}


_TORCH_DTYPES = {}  # torch dtype -> NumPy dtype, filled as they are met


def _torch_dtype(torch_dtype, name):
    spelled = str(torch_dtype).removeprefix("torch.")
    try:
        dtype = np.dtype(spelled)
    except TypeError:
        dtype = None
    # a name NumPy only knows through an extension (ml_dtypes makes bfloat16 a 2-byte void) is not
    # one numba can type either
    if dtype is None or dtype.kind not in "biufc":
        raise TypeError(f"{name} has dtype {torch_dtype}, which NumPy (and so numba) has no dtype for")
    _TORCH_DTYPES[torch_dtype] = dtype
    return dtype


def _interface_key(array, name):
    """(data pointer, shape, strides in bytes or None, typestr, stream) from the interface; an
    interface that names a stream is synchronised on, as cuda.as_cuda_array does."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        raise TypeError(f"{name} must be a device array, not {type(array).__name__}")
    stream = interface.get("stream")
    if stream is not None and ON_GPU and _sync_interfaces():
        _external_stream(stream).synchronize()
    strides = interface.get("strides")
    return (interface["data"][0], tuple(interface["shape"]), strides if strides is None else tuple(strides),
            interface["typestr"], stream)


def _interface_describe(array, key, name):
    return array.__cuda_array_interface__


_TORCH = _Reader(_torch_key, _torch_describe)
_INTERFACE = _Reader(_interface_key, _interface_describe)
_READERS = {}  # type -> its reader, worked out once per type


def _reader_for(cls):
    """torch.Tensor and its subclasses (nn.Parameter) through torch's accessors, anything else
    through __cuda_array_interface__. torch is recognised by name: nothing here imports it."""
    _READERS[cls] = reader = _TORCH if _torch_named(cls) else _INTERFACE
    return reader


@lru_cache(maxsize=None)
def _sync_interfaces():
    try:
        from numba.cuda.core import config
    except ImportError:  # older numba-cuda
        from numba.core import config
    return bool(config.CUDA_ARRAY_INTERFACE_SYNC)


@lru_cache(maxsize=64)
def _external_stream(pointer):
    return cuda.external_stream(pointer)


class _NotHeld:
    """The owner a kept view's memory names: nobody (see ForeignViews)."""

    __slots__ = ()

    def __repr__(self):
        return "<foreign memory, not held>"


_NOT_HELD = _NotHeld()


def _numba_view(description):
    """numba's DeviceNDArray on the memory an interface describes, holding nothing: no tensor, and
    (sync=False) no stream synchronisation, which the reader does at every call instead."""
    view = cuda.from_cuda_array_interface(description, owner=_NOT_HELD, sync=False)
    for cached in ("_numba_type_", "_strided_memory_view_shim"):  # numba's cached properties: worked out
        getattr(view, cached, None)  # once here, and copied with the view at every call
    return view


FOREIGN = ForeignViews(make=_numba_view if ON_GPU else None)


def is_torch_tensor(given):
    """Whether `given` is a torch tensor (or a subclass's): one lookup for a type met before, read
    by require() or not (a wrapper asks before it reads its arguments: launch.TensorCalls)."""
    cls = type(given)
    known = _IS_TORCH.get(cls)
    if known is None:
        known = _IS_TORCH[cls] = _READERS.get(cls, _reader_for(cls) if _torch_named(cls) else None) is _TORCH
    return known


_IS_TORCH = {}  # type -> whether it is torch's


def _torch_named(cls):
    return any(c.__name__ == "Tensor" and c.__module__ == "torch" for c in cls.__mro__)


def empty_like_input(given, shape, dtype):
    """An output for a wrapper called without one: torch's caching allocator for a torch input (a
    few microseconds, and its memory comes back at the next call, where the view is kept), numba's
    allocator for anything else. Returns what `require` returns for it: a device array."""
    if ON_GPU and is_torch_tensor(given):
        import torch

        torch_dtype = getattr(torch, np.dtype(dtype).name, None)  # torch.uint32 is torch 2.3's
        if isinstance(torch_dtype, torch.dtype):
            return FOREIGN.view(torch.empty(shape, dtype=torch_dtype, device=given.device), "output")
    return cuda.device_array(shape, dtype=dtype)
