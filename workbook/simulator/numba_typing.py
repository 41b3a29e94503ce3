"""The simulator computes with numba's types, not NumPy's, where the two differ in what a kernel
gets: a GPU-correct kernel must be correct here.

- **Integer elements** (`widened`): numba computes uint8 + uint8 in 64 bits (200 + 100 = 300) where
  NumPy's uint8 scalars wrap (44). An integer read from an array is a 64-bit value that remembers
  the type it was read as (`read_as`) and computes with numba's rules, checked against numba's own
  signatures: two unsigned operands give a uint64, any signed one (a Python int is one) an int64,
  a shift the left operand's signedness, `/` a float64. The intrinsics see the element's own width
  (`as_read`: clz of an int32 element counts 32 bits, a shuffle of it is an int32 shuffle).
- **Declared signatures** (`declared_types`, `as_declared`): `cuda.jit("void(int32[:], int32)")`
  converts its integer arguments to the declared width at the launch, wrapping as a GPU does
  (0xFFFFFFFF is -1), as a `DeclaredInt`: a Python int (Python's math.ldexp takes it, as numba's
  does) that remembers its type.
"""

import operator

import numpy as np


class DeclaredInt(int):
    """A kernel argument declared as a narrow integer (`cuda.jit("void(int32[:], int32)")`): a Python
    int, so that Python's own functions (math.ldexp) take it as numba's do, that remembers its
    declared type for the bit intrinsics (clz of an int32 counts 32 bits)."""

    def __new__(cls, value, dtype):
        made = super().__new__(cls, value)
        made.dtype = np.dtype(dtype)
        return made


def as_read(value):
    """An array element as numba types it: the narrow integer the simulator widened for arithmetic
    (widened) back to its own type."""
    read_as = getattr(value, "read_as", None)
    return value if read_as is None else read_as.type(value)


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
    base = np.uint64 if dtype.kind == "u" else np.int64
    methods = {"read_as": dtype, "__slots__": ()}
    for name in ("add", "sub", "mul", "floordiv", "mod", "and", "or", "xor", "lshift", "rshift"):
        op = getattr(operator, name + "_" if name in ("and", "or") else name)
        methods[f"__{name}__"], methods[f"__r{name}__"] = _numba_binary(op, shift=name.endswith("shift"))
    methods["__invert__"] = lambda self: ~_wide(self)
    return type(f"{dtype.name}_as_read", (base,), methods)


_READ_TYPES = {np.dtype(t): _read_type(np.dtype(t))
               for t in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32)}


_NOT_NARROW = {float, int, bool, np.float16, np.float32, np.float64, np.int64, np.uint64, np.bool_}


def widened(value):
    """An integer read from an array, as numba computes with it: arithmetic on integers narrower than
    64 bits gives 64 bits in numba (uint8 + uint8 is a uint64: 200 + 100 = 300), where NumPy keeps the
    narrow type and wraps (200 + 100 = 44). So a sum of uint8 pixels, right on a GPU, is right here.
    The value itself keeps its type where numba's does: `read_as` tells the intrinsics (clz of an
    int32 element counts 32 bits, a shuffle of it is an int32 shuffle)."""
    if type(value) in _NOT_NARROW:  # most reads: a float, at the cost of one set lookup
        return value
    if isinstance(value, np.integer):
        read_type = _READ_TYPES.get(value.dtype)
        if read_type is not None:
            return read_type(value)
    return value


def declared_types(func_or_sig):
    """The argument types of one declared signature ("void(int32[:], int32)"), else None."""
    from numba.core import sigutils

    if not (isinstance(func_or_sig, str) or sigutils.is_signature(func_or_sig)) or isinstance(func_or_sig, list):
        return None
    try:
        arguments, _ = sigutils.normalize_signature(func_or_sig)
    except Exception:  # noqa: BLE001  (numba's own jit reports a bad signature)
        return None
    return tuple(arguments)


def as_declared(args, declared):
    """Integer arguments converted to their declared widths, wrapping as a GPU launch converts them
    (0xFFFFFFFF declared int32 is -1), as a `DeclaredInt`. Floats are left as given:
    converting them changes what the simulator's Python `round` computes, which numba emulates
    differently anyway."""
    from numba.core import types
    from numba.np import numpy_support

    converted = []
    for value, declared_type in zip(args, declared, strict=False):
        if (isinstance(declared_type, types.Integer) and isinstance(value, int | np.integer)
                and not isinstance(value, bool)):
            dtype = numpy_support.as_dtype(declared_type)
            value = DeclaredInt(np.array(int(value) % (1 << 64), np.uint64).astype(dtype)[()], dtype)
        converted.append(value)
    return tuple(converted) + tuple(args[len(converted):])
