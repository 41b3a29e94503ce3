"""workbook/tensor_cores.py in the simulator: mma and ldmatrix as warp collectives (what they compute
is in collectives.py), cp.async as copies that land at their wait, TF32 rounding as cvt.rna rounds.
Each function is named, and says it lives, where the compile worker finds its GPU twin."""

import numpy as np

from . import watch
from .numba_typing import as_read
from .scheduler import FULL_MASK, current

ROW_BYTES = 16


def _bits32(op, value, floats_allowed):
    """A 32-bit register's bits: a float32's bits (TF32 operands), or an integer's low 32 bits."""
    value = as_read(value)
    if isinstance(value, (float, np.floating)):
        if not floats_allowed:
            raise TypeError(f"{op}: A and B registers are uint32, two 16-bit values each (pack_f16x2 or "
                            f"ldmatrix make them), not a {type(value).__name__}")
        return int(np.float32(value).view(np.uint32))
    if isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)):
        return int(value) & FULL_MASK
    raise TypeError(f"{op}: a register is a number, not a {type(value).__name__}")


def _fragment(op, values, n, floats_allowed):
    if not isinstance(values, tuple) or len(values) != n:
        raise TypeError(f"{op}: {n} registers in a tuple, not {values!r}")
    return tuple(_bits32(op, v, floats_allowed) for v in values)


def _make_mma(op, kind):
    floats_allowed = kind == "tf32"

    def mma(a, b, c):
        a = _fragment(op, a, 4, floats_allowed)
        b = _fragment(op, b, 2, floats_allowed)
        if not isinstance(c, tuple) or len(c) != 4:
            raise TypeError(f"{op}: 4 float32 accumulators in a tuple, not {c!r}")
        c = tuple(np.float32(as_read(v)) for v in c)
        me = current()
        return me.block.warp_collective(me, "mma", op, FULL_MASK, (kind, a, b, c))

    return mma


mma_tf32 = _make_mma("mma_tf32", "tf32")
mma_f16 = _make_mma("mma_f16", "f16")
mma_bf16 = _make_mma("mma_bf16", "bf16")


def to_tf32(x):
    """cvt.rna.tf32.f32, as tensor_cores.round_tf32 models it; given an integer (a float32's bits,
    as ldmatrix hands them out), the rounded bits."""
    from ..tensor_cores import round_tf32  # here, not above: tensor_cores imports this module

    x = as_read(x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return round_tf32(np.uint32(int(x) & FULL_MASK).view(np.float32)).view(np.uint32)[()]
    return round_tf32(np.float32(x))[()]


def pack_f16x2(lo, hi):
    return np.uint32(int(np.float16(as_read(lo)).view(np.uint16)) | int(np.float16(as_read(hi)).view(np.uint16)) << 16)


def _is_shared(array):
    return isinstance(array, (np.ndarray, watch.SharedArray))


def _host_of(array):
    host = getattr(array, "_ary", array)
    return np.asarray(host)


def _check_row(op, array, index, space):
    """The flat array and its byte offset for a 16-byte access of array[index]: errors a GPU would fault on."""
    host = _host_of(array)
    if not host.flags.c_contiguous:
        raise TypeError(f"{op}: the array must be C-contiguous (numba's compiler would reject it)")
    if host.dtype.itemsize not in (2, 4):
        raise TypeError(f"{op}: an array of 16- or 32-bit elements, not {host.dtype}")
    index = int(as_read(index))
    per_row = ROW_BYTES // host.dtype.itemsize
    if index % per_row or host.__array_interface__["data"][0] % ROW_BYTES:
        raise ValueError(f"{op}: misaligned address: element {index} of the {space} array is not on a 16-byte "
                         f"boundary (a multiple of {per_row} {host.dtype} elements); a GPU faults here")
    if not 0 <= index <= host.size - per_row:
        raise IndexError(f"{op}: elements {index}..{index + per_row - 1} of a {space} array of {host.size}: "
                         "out of bounds")
    return host.reshape(-1), index


def _make_ldmatrix(count, trans):
    op = f"ldmatrix_x{count}{'_trans' if trans else ''}"

    def ldmatrix(array, index):
        me = current()
        row = None
        if me.lane < 8 * count:  # the lanes whose addresses the instruction uses
            if not _is_shared(array):
                raise TypeError(f"{op} reads shared memory: lane {me.lane} gave it a device (global) array")
            flat, index = _check_row(op, array, index, "shared")
            if watch.active():
                watch.report("shared", "ld", flat, index, size=ROW_BYTES)
            row = (flat, index)
        return me.block.warp_collective(me, "ldmatrix", op, FULL_MASK, (count, trans, row))

    ldmatrix.__name__ = ldmatrix.__qualname__ = op
    return ldmatrix


ldmatrix_x1, ldmatrix_x2, ldmatrix_x4 = (_make_ldmatrix(n, False) for n in (1, 2, 4))
ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans = (_make_ldmatrix(n, True) for n in (1, 2, 4))


class _Copies:
    """One thread's cp.async copies: those issued since the last commit, and the committed groups."""

    def __init__(self):
        self.open = []
        self.groups = []


def _copies(me):
    copies = getattr(me, "cp_async", None)
    if copies is None:
        copies = me.cp_async = _Copies()
    return copies


def cp_async16(shared, shared_index, source, source_index, source_bytes):
    me = current()
    if not _is_shared(shared):
        raise TypeError("cp_async16 copies into shared memory: its first array is a device (global) array")
    if _is_shared(source):
        raise TypeError("cp_async16 copies from global memory: its source is a shared or local array")
    count = int(as_read(source_bytes))
    if not 0 <= count <= ROW_BYTES:
        raise ValueError(f"cp_async16: source_bytes is {count}; it must be 0..16 (the rest of the 16 is zero-filled)")
    destination, shared_index = _check_row("cp_async16", shared, shared_index, "shared")
    origin = _host_of(source).reshape(-1)
    source_index = int(as_read(source_index))
    if origin.itemsize != destination.itemsize:
        raise TypeError(f"cp_async16: copies between arrays of one element size, not {origin.dtype} -> "
                        f"{destination.dtype}")
    data = bytearray(ROW_BYTES)
    if count:
        origin, source_index = _check_row("cp_async16", source, source_index, "global")
        start = source_index * origin.itemsize
        data[:count] = origin.view(np.uint8)[start:start + count].tobytes()
        if watch.active():
            watch.report("global", "ld", origin, source_index, size=count)
    _copies(me).open.append((destination, shared_index, bytes(data)))


def cp_async_commit():
    copies = _copies(current())
    copies.groups.append(copies.open)
    copies.open = []


def cp_async_wait(n):
    """The copies of every committed group but the newest n land now, in this thread's name."""
    n = int(as_read(n))
    if n < 0:
        raise ValueError(f"cp_async_wait: {n} groups; the count is 0 or more")
    copies = _copies(current())
    landing = copies.groups[:max(len(copies.groups) - n, 0)]
    copies.groups = copies.groups[len(landing):]
    for group in landing:
        for destination, index, data in group:
            start = index * destination.itemsize
            destination.view(np.uint8)[start:start + ROW_BYTES] = np.frombuffer(data, np.uint8)
            if watch.active():
                per_row = ROW_BYTES // destination.itemsize
                watch.report("shared", "st", destination, index, tuple(destination[index:index + per_row]),
                             size=ROW_BYTES)


for _function in (mma_tf32, mma_f16, mma_bf16, to_tf32, pack_f16x2, ldmatrix_x1, ldmatrix_x2, ldmatrix_x4,
                  ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans, cp_async16, cp_async_commit,
                  cp_async_wait):
    _function.__module__ = "workbook.tensor_cores"  # pickled by name: the compile worker gets the GPU twin
    _function.__qualname__ = _function.__name__ = next(name for name, value in globals().items()
                                                        if value is _function and not name.startswith("_"))
