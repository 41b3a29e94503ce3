"""What the simulator sees of a kernel's memory: every read and write of a device array or a shared
array, by which simulated thread, at which point of the kernel's source.

The simulator runs a kernel as Python, so every `x[i]` inside it is a call to the array's
`__getitem__`. `install()` wraps those calls. Always: a negative index, or one past the end, is an
error naming the kernel, the block, the thread and the source line (NumPy would wrap -1 to the last
element silently; numba on a GPU reads whatever lies there); an integer element is read as numba
computes with it (numba_typing.py). And while a *listener* is registered
(the memory trace, `workbook.memtrace`; the sanitizer, `sanitizer.py`), each element access is
handed to it as an `Access`:

    kernel line 12:   out[i] = x[i] * 2.0
                      |        '- Access(op="ld", space="global", root=x, offset=4*i, size=4, ...)
                      '- Access(op="st", space="global", root=out, offset=4*i, size=4, value=...)

Shared arrays are plain NumPy arrays in numba's simulator; while a listener is registered,
`cuda.shared.array` hands the kernel a thin wrapper (`SharedArray`) that reports the same way.
The 16-byte accesses of `workbook.memory` report one access of 16 bytes, as the hardware makes it.
Accesses inside `cuda.atomic.*` are not reported: atomics do not race, and their traffic is not
what the lessons count. With no listener, a plain run pays one list test per access.
"""

import contextlib
import sys

import greenlet
import numpy as np

from .numba_typing import widened
from .scheduler import current
from .scheduler import listeners as _listeners  # a trace or sanitizer each; see listening()


@contextlib.contextmanager
def listening(listener):
    """Register a listener while the block runs: `with listening(trace): kernel[...](...)`."""
    _listeners.append(listener)
    try:
        yield listener
    finally:
        _listeners.remove(listener)


def active():
    return bool(_listeners)


class Access:
    """One element access of one simulated thread (a 16-byte vector access is one Access)."""

    __slots__ = ("thread", "space", "op", "root", "offset", "size", "index", "value", "code", "line")

    def __init__(self, thread, space, op, root, offset, size, index, value, frame):
        self.thread, self.space, self.op = thread, space, op
        self.root, self.offset, self.size = root, offset, size
        self.index, self.value = index, value
        self.code, self.line = frame.f_code, frame.f_lineno

    @property
    def where(self):
        """'kernel.py:41' - the source line of the access."""
        return f"{self.code.co_filename.rsplit('/', 1)[-1]}:{self.line}"

    def __repr__(self):
        return (f"Access({self.op} {self.space} +{self.offset} [{self.size} B] by thread "
                f"{tuple(self.thread.threadIdx)} of block {tuple(self.thread.blockIdx)} at {self.where})")


def root_of(array):
    """The allocation an array (or a view of one) lives in, and the view's byte offset in it."""
    root = array
    while True:
        base = root.base
        if isinstance(base, memoryview) and isinstance(base.obj, np.ndarray):
            base = base.obj
        if not isinstance(base, np.ndarray):
            break
        root = base
    return root, array.__array_interface__["data"][0] - root.__array_interface__["data"][0]


def element_offset(array, index):
    """Byte offset of array[index] from the array's first element, or None when the index selects
    more than one element (a slice or a row: a view, not an access)."""
    if not isinstance(index, tuple):
        index = (index,)
    if len(index) != array.ndim:
        return None
    offset = 0
    for value, stride in zip(index, array.strides, strict=True):
        if not isinstance(value, int | np.integer) or isinstance(value, bool | np.bool_):
            return None
        offset += int(value) * stride
    return offset


_arrays = {}  # id(array) -> (array, its allocation, its byte offset there): asked once per launch


def forget_arrays():
    """Called at each launch: the arrays of the last one may be gone, and their ids reused."""
    _arrays.clear()


def report(space, op, array, index, value=None, size=None, depth=2):
    """Hand one access of array[index] (an element, or `size` bytes from it) to the listeners."""
    me = current()
    if getattr(me, "in_atomic", True):  # inside cuda.atomic.*, or not a simulated thread at all
        return
    known = _arrays.get(id(array))
    if known is None or known[0] is not array:  # (array, allocation, offset there, 1-D stride or None)
        known = _arrays[id(array)] = (array, *root_of(array), array.strides[0] if array.ndim == 1 else None)
    if type(index) is int and known[3] is not None:  # the common case, without element_offset's loop
        offset = index * known[3]
    else:
        offset = element_offset(array, index)
        if offset is None:
            return
    access = None
    for listener in tuple(_listeners):  # a listener may step aside while it is told
        count = getattr(listener, "count", None)
        if count is not None:  # a listener that only adds bytes up: no Access to build
            count(space, size or array.itemsize)
            continue
        if access is None:
            access = Access(me, space, op, known[1], known[2] + offset, size or array.itemsize, index, value,
                            sys._getframe(depth))
        listener.access(access)


def report_atomic(op, array, index, depth=2):
    """Hand an atomic's element to the listeners that ask for atomics (the sanitizer: a plain access
    and an atomic of the same word race). Its bytes are not traffic: the tracers never see it."""
    space, ary = _atomic_target(array)
    if ary is None:
        return
    offset = element_offset(ary, index)
    listeners = [listener for listener in tuple(_listeners) if hasattr(listener, "atomic")]
    if offset is None or not listeners:
        return
    root, base = root_of(ary)
    access = Access(current(), space, op, root, base + offset, ary.itemsize, index, None, sys._getframe(depth))
    for listener in listeners:
        listener.atomic(access)


# ---------------------------------------------------------------------------------------------
# Bounds: always on


def _bad_index(array, index):
    """Why array[index] is out of bounds (a negative or too large integer), or None."""
    if type(index) is int:  # the common case, fast: this runs at every access of every kernel
        return None if 0 <= index < array.shape[0] else _why_out_of_bounds(array, index)
    if type(index) is tuple and len(index) == 2 and type(index[0]) is int and type(index[1]) is int:
        shape = array.shape
        if 0 <= index[0] < shape[0] and (len(shape) < 2 or 0 <= index[1] < shape[1]):
            return None
    return _why_out_of_bounds(array, index)


def _why_out_of_bounds(array, index):
    for axis, value in enumerate(index if isinstance(index, tuple) else (index,)):
        if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            if value < 0:
                return f"index {value} is negative"
            if axis < array.ndim and value >= array.shape[axis]:
                return f"index {value} is past the end of axis {axis} (size {array.shape[axis]})"
    return None


def out_of_bounds(array, index, verb, space, depth=2):
    """An IndexError naming the kernel, block, thread and source line of a bad access."""
    me = current()
    frame = sys._getframe(depth)
    where = f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}"
    who = (f"kernel '{me.block.kernel.__name__}', block {tuple(me.blockIdx)}, thread {tuple(me.threadIdx)}"
           if hasattr(me, "block") else "a kernel")
    reason = _bad_index(array, index) or "out of bounds"
    name = array_name(frame, root_of(array)[0]) or f"{space} array"
    return named(IndexError(f"{who} {verb} {name}[{_show(index)}] of shape {array.shape} at {where}: {reason} "
                      "(on a GPU: a wrong value, a fault, or another array's data)"))


def named(error):
    """Mark an error whose message names its kernel, block and thread (the scheduler adds nothing)."""
    error.names_thread = True
    return error


def array_name(frame, root):
    """The name a kernel's frame gives an array living in `root` (its variable), or None."""
    for name, value in frame.f_locals.items():
        ary = value if isinstance(value, np.ndarray) else getattr(value, "_ary", None)
        if isinstance(ary, np.ndarray) and root_of(ary)[0] is root:
            return name
    return None


def _show(index):
    return ", ".join(str(v) for v in index) if isinstance(index, tuple) else str(index)


# ---------------------------------------------------------------------------------------------
# The wrappers


class SharedArray:
    """A shared array as a kernel sees it while a listener is registered: NumPy indexing, reported."""

    __slots__ = ("_ary",)

    def __init__(self, ary):
        self._ary = ary

    def __getitem__(self, index):
        ary = self._ary
        if _bad_index(ary, index):
            raise out_of_bounds(ary, index, "reads", "shared")
        value = ary[index]
        if type(value) is np.ndarray:  # a view (a_s[buf, kk, ty:]): its reads are reported as they happen
            return SharedArray(value)
        value = widened(value)
        if _listeners:
            report("shared", "ld", ary, index, value)
        return value

    def __setitem__(self, index, value):
        ary = self._ary
        if _bad_index(ary, index):
            raise out_of_bounds(ary, index, "writes", "shared")
        ary[index] = value
        if _listeners:
            report("shared", "st", ary, index, ary[index] if element_offset(ary, index) is not None else None)

    def __getattr__(self, name):
        return getattr(self._ary, name)

    def __len__(self):
        return len(self._ary)

    def __array__(self, dtype=None, copy=None):
        return self._ary if dtype is None else self._ary.astype(dtype)


def install():
    """Wrap device-array indexing, cuda.shared.array and cuda.atomic.* (called by simulator.install())."""
    from numba.cuda.simulator import kernelapi
    from numba.cuda.simulator.cudadrv import devicearray

    within = devicearray.FakeWithinKernelCUDAArray
    stock_get, stock_set = within.__getitem__, within.__setitem__

    def getitem(self, index):
        ary = self._item._ary
        if _bad_index(ary, index):
            raise out_of_bounds(ary, index, "reads", "device")
        value = widened(stock_get(self, index))
        if _listeners:
            report("global", "ld", ary, index, value)
        return value

    def setitem(self, index, value):
        ary = self._item._ary
        if _bad_index(ary, index):
            raise out_of_bounds(ary, index, "writes", "device")
        stock_set(self, index, value)
        if _listeners and element_offset(ary, index) is not None:
            report("global", "st", ary, index, ary[index])

    within.__getitem__, within.__setitem__ = getitem, setitem

    def shared_array(self, shape, dtype, alignment=None):
        """numba's FakeCUDAShared.array, with the caller found in one frame (the stock one formats
        the whole stack at every call), wrapped while a listener is registered."""
        if alignment is not None:
            raise RuntimeError("Array alignment is not supported in cudasim")
        if not isinstance(dtype, np.dtype):
            from numba.np import numpy_support
            dtype = numpy_support.as_dtype(dtype) if not isinstance(dtype, type) else np.dtype(dtype)
        allocations, dynamic = self._allocations, self._dynshared
        block = getattr(greenlet.getcurrent(), "block", None)
        if getattr(block, "grid", None) is not None:  # a cooperative launch: its blocks run at once, each its own
            if block.shared is None:
                block.shared = ({}, np.zeros(self._dynshared_size, dtype=np.byte))
            allocations, dynamic = block.shared
        if shape == 0:  # dynamic shared memory: every such array is a view of one buffer
            ary = np.frombuffer(dynamic.data, dtype=dtype, count=self._dynshared_size // dtype.itemsize)
        else:
            caller = sys._getframe(1)
            key = (caller.f_code.co_filename, caller.f_lineno)
            ary = allocations.get(key)
            if ary is None:  # what a read before any write finds: the same every run, and no 0xFF poison
                ary = allocations[key] = np.empty(shape, dtype)
                ary.reshape(-1).view(np.uint8).fill(UNWRITTEN_SHARED_BYTE)
        return SharedArray(ary) if _listeners else ary

    kernelapi.FakeCUDAShared.array = shared_array

    for name, method in list(vars(kernelapi.FakeCUDAAtomic).items()):
        if callable(method) and not name.startswith("__"):
            setattr(kernelapi.FakeCUDAAtomic, name, _unreported(method))


# The bytes of a shared array before a thread writes it: a GPU leaves whatever was there, numpy's
# np.empty whatever memory it reuses (another array's 0xFF poison, so a check said "left unwritten").
# 0x7F: a large finite float32 (3.4e38), a large positive int; the same at every run.
UNWRITTEN_SHARED_BYTE = 0x7F
_SPUN_ON = ("cas", "compare_and_swap", "exch")  # what a spin lock calls until another thread lets go


def _atomic_target(array):
    """(space, NumPy array) behind an atomic's array argument, or (None, None)."""
    if isinstance(array, SharedArray):
        return "shared", array._ary
    if hasattr(array, "_item"):
        return "global", array._item._ary
    if isinstance(array, np.ndarray):  # a shared array while nothing listens
        return "shared", array
    return None, None


def _check_atomic_index(name, array, index):
    """An atomic on an element needs an index for each dimension of its array, as numba's GPU typing
    does; the simulator would otherwise take a row, and fail with a message about the row."""
    ndim = getattr(_atomic_target(array)[1], "ndim", None)
    given = len(index) if isinstance(index, tuple) else 1
    if ndim is not None and ndim > 1 and given != ndim:
        raise TypeError(f"cuda.atomic.{name} on a {ndim}-D array given {given} index(es): an atomic works on one "
                        f"element, so it needs an index for each dimension (a tuple of {ndim}); a GPU compiler "
                        "rejects this kernel too")


def _unreported(method):
    spun_on = method.__name__ in _SPUN_ON
    indexed = method.__name__ != "compare_and_swap"  # the others take (array, index, ...)

    def atomic(*args, **kwargs):
        if indexed and len(args) >= 3:  # (self, array, index, ...)
            _check_atomic_index(method.__name__, *args[1:3])
        me = current()
        me.in_atomic = True
        try:
            old = method(*args, **kwargs)
        finally:
            me.in_atomic = False
            if spun_on and hasattr(me, "block"):
                me.block.pause(me)  # the threads of a block share one OS thread: let the holder run
        if indexed and len(args) >= 3 and _listeners:
            report_atomic(f"atomic.{method.__name__}", *args[1:3])
        return old

    atomic.__name__ = method.__name__
    return atomic
