"""What the simulator sees of a kernel's memory: every read and write of a device array or a shared
array, by which simulated thread, at which point of the kernel's source.

The simulator runs a kernel as Python, so every `x[i]` inside it is a call to the array's
`__getitem__`. `install()` wraps those calls. Always: a negative index, or one past the end, is an
error naming the kernel, the block, the thread and the source line (NumPy would wrap -1 to the last
element silently; numba on a GPU reads whatever lies there); an integer narrower than 64 bits is
read widened, as numba computes with it (`widened`). And while a *listener* is registered
(the memory trace, `workbook.memtrace`; the sanitizer, `sanitizer.py`), each element access is
handed to it as an `Access`:

    kernel line 12:   out[i] = x[i] * 2.0
                      |        '- Access(op="ld", space="global", array=x, offset=4*i, size=4, ...)
                      '- Access(op="st", space="global", array=out, offset=4*i, size=4, value=...)

Shared arrays are plain NumPy arrays in numba's simulator; while a listener is registered,
`cuda.shared.array` hands the kernel a thin wrapper (`SharedArray`) that reports the same way.
The 16-byte accesses of `workbook.memory` report one access of 16 bytes, as the hardware makes it.
Accesses inside `cuda.atomic.*` are not reported: atomics do not race, and their traffic is not
what the lessons count. With no listener, a plain run pays one list test per access.
"""

import sys
import threading

import numpy as np

_listeners = []  # objects with .access(Access) and .launch_ended(); see listening()
_local = threading.local()  # .atomic: inside a cuda.atomic.* call


def listening(listener):
    """Register a listener (a context manager: `with listening(trace): kernel[...](...)`)."""
    return _Listening(listener)


class _Listening:
    def __init__(self, listener):
        self.listener = listener

    def __enter__(self):
        _listeners.append(self.listener)
        return self.listener

    def __exit__(self, *exc):
        _listeners.remove(self.listener)


def active():
    return bool(_listeners)


class Access:
    """One element access of one simulated thread (a 16-byte vector access is one Access)."""

    __slots__ = ("thread", "space", "op", "array", "root", "offset", "size", "index", "value", "code", "line")

    def __init__(self, thread, space, op, array, root, offset, size, index, value, frame):
        self.thread, self.space, self.op = thread, space, op
        self.array, self.root, self.offset, self.size = array, root, offset, size
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


def report(space, op, array, index, value=None, size=None, depth=2):
    """Hand one access of array[index] (an element, or `size` bytes from it) to the listeners."""
    me = threading.current_thread()
    if getattr(_local, "atomic", False) or not hasattr(me, "block"):
        return
    offset = element_offset(array, index)
    if offset is None:
        return
    root, base = root_of(array)
    access = Access(me, space, op, array, root, base + offset, size or array.itemsize, index, value,
                    sys._getframe(depth))
    for listener in list(_listeners):
        listener.access(access)


# ---------------------------------------------------------------------------------------------
# Integer reads, typed as numba types them


def _integer_kind(value):
    """'u' or 'i' for an integer as numba types it (a Python int is an int64), None for anything else."""
    read_as = getattr(value, "read_as", None) or getattr(value, "dtype", None)
    if isinstance(value, bool | np.bool_):
        return None
    if isinstance(value, int) and read_as is None:
        return "i"
    return read_as.kind if isinstance(value, int | np.integer) and read_as.kind in "ui" else None


def _as(result, value):
    try:
        return result(value)
    except OverflowError:  # a uint64 past int64's range, or a negative int64 made unsigned: wrap
        return np.array(int(value) % (1 << 64), np.uint64).astype(result)[()]


def _numba_binary(op, shift=False):
    """An operator with numba's integer typing (checked against numba's CPU signatures): two unsigned
    operands give a uint64, any signed one (a Python int is one) an int64; a shift takes the left
    operand's signedness. Floats and anything else: NumPy's rules on the 64-bit value."""
    def apply(left, right):
        kinds = (_integer_kind(left), _integer_kind(right))
        if None in kinds:
            return op(_wide(left), _wide(right))
        unsigned = kinds[0] == "u" if shift else kinds == ("u", "u")
        result = np.uint64 if unsigned else np.int64
        return op(_as(result, left), _as(result, right))

    return (lambda self, other: apply(self, other)), (lambda self, other: apply(other, self))


def _wide(value):
    read_as = getattr(value, "read_as", None)
    return value if read_as is None else (np.uint64(value) if read_as.kind == "u" else np.int64(value))


def _read_type(dtype):
    """np.int64 or np.uint64, remembering the narrow type it was read as (`read_as`), computing as
    numba does."""
    import operator

    base = np.uint64 if dtype.kind == "u" else np.int64
    methods = {"read_as": dtype, "__slots__": ()}
    for name in ("add", "sub", "mul", "floordiv", "mod", "and", "or", "xor", "lshift", "rshift"):
        op = getattr(operator, name + "_" if name in ("and", "or") else name)
        methods[f"__{name}__"], methods[f"__r{name}__"] = _numba_binary(op, shift=name.endswith("shift"))
    methods["__invert__"] = lambda self: ~_wide(self)
    return type(f"{dtype.name}_as_read", (base,), methods)


_READ_TYPES = {np.dtype(t): _read_type(np.dtype(t)) for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)}


def widened(value):
    """An integer read from an array, as numba computes with it: arithmetic on integers narrower than
    64 bits gives 64 bits in numba (uint8 + uint8 is a uint64: 200 + 100 = 300), where NumPy keeps the
    narrow type and wraps (200 + 100 = 44). So a sum of uint8 pixels, right on a GPU, is right here.
    The value itself keeps its type where numba's does: `read_as` tells the intrinsics (clz of an
    int32 element counts 32 bits, a shuffle of it is an int32 shuffle)."""
    if isinstance(value, np.integer):
        read_type = _READ_TYPES.get(value.dtype)
        if read_type is not None:
            return read_type(value)
    return value


# ---------------------------------------------------------------------------------------------
# Bounds: always on


def _bad_index(array, index):
    """Why array[index] is out of bounds (a negative or too large integer), or None."""
    for axis, value in enumerate(index if isinstance(index, tuple) else (index,)):
        if isinstance(value, int | np.integer) and not isinstance(value, bool | np.bool_):
            if value < 0:
                return f"index {value} is negative"
            if axis < array.ndim and value >= array.shape[axis]:
                return f"index {value} is past the end of axis {axis} (size {array.shape[axis]})"
    return None


def out_of_bounds(array, index, verb, space, depth=2):
    """An IndexError naming the kernel, block, thread and source line of a bad access."""
    me = threading.current_thread()
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
        value = widened(ary[index])
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
        if shape == 0:  # dynamic shared memory: every such array is a view of one buffer
            ary = np.frombuffer(self._dynshared.data, dtype=dtype, count=self._dynshared_size // dtype.itemsize)
        else:
            caller = sys._getframe(1)
            key = (caller.f_code.co_filename, caller.f_lineno)
            ary = self._allocations.get(key)
            if ary is None:
                ary = self._allocations[key] = np.empty(shape, dtype)
        return SharedArray(ary) if _listeners else ary

    kernelapi.FakeCUDAShared.array = shared_array

    for name, method in list(vars(kernelapi.FakeCUDAAtomic).items()):
        if callable(method) and not name.startswith("__"):
            setattr(kernelapi.FakeCUDAAtomic, name, _unreported(method))


def _unreported(method):
    def atomic(*args, **kwargs):
        _local.atomic = True
        try:
            return method(*args, **kwargs)
        finally:
            _local.atomic = False

    atomic.__name__ = method.__name__
    return atomic


def unreported():
    """A context in which accesses are not reported (workbook.memory's atomic_add4)."""
    return _Unreported()


class _Unreported:
    def __enter__(self):
        _local.atomic = True

    def __exit__(self, *exc):
        _local.atomic = False
