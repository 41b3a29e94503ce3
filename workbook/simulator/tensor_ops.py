"""workbook/tensor_cores.py in the simulator: mma and ldmatrix as warp collectives (what they compute
is in collectives.py), cp.async as copies that land at their wait, TF32 rounding as cvt.rna rounds.
Each function is named, and says it lives, where the compile worker finds its GPU twin."""

import numpy as np

from ..tensor_layouts import decode_descriptor, round_tf32, swizzle128, to_bf16
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

    x = as_read(x)
    if isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)):
        return round_tf32(np.uint32(int(x) & FULL_MASK).view(np.float32)).view(np.uint32)[()]
    return round_tf32(np.float32(x))[()]


def pack_f16x2(lo, hi):
    return np.uint32(int(np.float16(as_read(lo)).view(np.uint16)) | int(np.float16(as_read(hi)).view(np.uint16)) << 16)


def pack_bf16x2(lo, hi):
    return np.uint32(int(to_bf16(np.float32(as_read(lo)))) | int(to_bf16(np.float32(as_read(hi)))) << 16)


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


# ---------------------------------------------------------------------------------------------
# wgmma: a warpgroup's MMA from shared memory, asynchronous. Each thread computes its own 64
# accumulators (wgmma's layout: tensor_cores.wgmma_coordinates) from the tiles its descriptors point
# at, read when the wgmma_wait that covers the instruction runs: the latest moment a GPU may read
# them, so that a stage refilled before the wait gives the refill's data here every time.

SHARED_START = 0x80  # the first shared array's address here: 128-aligned, not 1024-aligned, so
                     # that a kernel must align its swizzled tiles itself, as on a GPU


def _roots(array):
    host = _host_of(array)
    root = host
    while isinstance(root.base, np.ndarray):
        root = root.base
    return host, root


def _registry(me):
    """This block's shared arrays by address: {memory: (base address, bytes, its bytes)}, new for each
    block (the scheduler's block object runs every block of a launch in turn)."""
    block = me.block
    held = block.__dict__.get("shared_addresses")
    if held is None or held[0] != block.serial:
        held = block.shared_addresses = (block.serial, {})
    return held[1]


def shared_address(array, index):
    """A shared array element's address: each shared array of the block (by its memory) gets a base,
    so that a descriptor can be traced back to the array and the bytes it describes."""
    if not _is_shared(array):
        raise TypeError("shared_address: the array must be a shared array")
    me = current()
    host, root = _roots(array)
    pointer = root.__array_interface__["data"][0]
    registry = _registry(me)
    if pointer not in registry:
        top = max((base + size for base, size, _ in registry.values()), default=SHARED_START)
        registry[pointer] = ((top + 127) // 128 * 128, root.nbytes, root.reshape(-1).view(np.uint8))
    base = registry[pointer][0]
    return np.uint32(base + host.__array_interface__["data"][0] - pointer + int(as_read(index)) * host.itemsize)


def _resolve(me, op, addresses):
    """The bytes at shared addresses (an integer array), from the one shared array they fall in."""
    low, high = int(addresses.min()), int(addresses.max())
    for base, size, data in _registry(me).values():
        if base <= low and high + 16 <= base + size:
            return data[addresses - base]
    raise IndexError(f"{op}: shared addresses {low:#x}..{high + 15:#x} are not inside one shared array (a "
                     "descriptor built from shared_address of the tile's array?)")


def _operand(me, op, descriptor, rows, kind):
    """Rows `rows` of a K-major tile described by `descriptor`, 32 bytes of depth each, as float64."""

    fields = decode_descriptor(descriptor)
    if fields["layout"] != 1 or fields["base_offset"]:
        raise ValueError(f"{op}: the simulator models the 128-byte swizzle (layout type 1, base offset 0) "
                         f"only; this descriptor has layout {fields['layout']}, base offset {fields['base_offset']}")
    rows = np.asarray(rows)
    logical = (fields["start"] + (rows // 8) * fields["stride"] + (rows % 8) * 128)[:, None] + np.arange(32)[None, :]
    raw = _resolve(me, op, swizzle128(logical)).copy()  # (rows, 32) bytes
    if kind == "f16":
        return raw.view(np.float16).astype(np.float64)
    bits = raw.view(np.uint32) & np.uint32(0xFFFFE000)  # the tensor core reads TF32: the low 13 bits dropped
    return bits.view(np.float32).astype(np.float64)


def _n_major_operand(me, op, descriptor, cols):
    """Columns `cols` of an N-major B (16 rows of K, panels of 64 columns: n_major_descriptor), as
    float64 (len(cols), 16)."""
    fields = decode_descriptor(descriptor)
    if fields["layout"] != 1 or fields["base_offset"] or fields["stride"] != 1024:
        raise ValueError(f"{op}: the simulator models B N-major in the 128-byte swizzle with 8 rows of K 1024 bytes "
                         f"apart (n_major_descriptor); this descriptor has {fields}")
    cols, k = np.asarray(cols)[:, None], np.arange(16)[None, :]
    logical = fields["start"] + (cols // 64) * fields["leading"] + (k // 8) * 1024 + (k % 8) * 128 + (cols % 64) * 2
    physical = swizzle128(logical)
    low, high = _resolve(me, op, physical), _resolve(me, op, physical + 1)
    return (low.astype(np.uint16) | high.astype(np.uint16) << np.uint16(8)).view(np.float16).astype(np.float64)


class _Wgmma:
    def __init__(self):
        self.open = []
        self.groups = []


def _wgmma_state(me):
    state = getattr(me, "wgmma", None)
    if state is None:
        state = me.wgmma = _Wgmma()
    return state


def _make_wgmma(kind):
    op = f"wgmma_{kind}"

    def wgmma(acc, desc_a, desc_b):
        host = _host_of(acc)
        if host.dtype != np.float32 or host.shape != (64,):
            raise TypeError(f"{op}: the accumulators are a local float32 array of 64, not {host.dtype} {host.shape}")
        me = current()
        threads = int(np.prod(me.block.block_dim))
        if threads % 128:
            raise ValueError(f"{op}: a warpgroup is 128 threads (4 whole warps); this block has {threads}")
        _wgmma_state(me).open.append((op, kind, host, int(as_read(desc_a)), int(as_read(desc_b))))

    wgmma.__name__ = wgmma.__qualname__ = op
    return wgmma


wgmma_f16, wgmma_tf32 = _make_wgmma("f16"), _make_wgmma("tf32")


def wgmma_f16_from_registers(acc, a, desc_b):
    """A's rows gathered from the warp's fragments now (a warp collective: every lane must issue it);
    B read at the wait, as wgmma_f16's tiles are."""
    op = "wgmma_f16_from_registers"
    host = _host_of(acc)
    if host.dtype != np.float32 or host.shape != (64,):
        raise TypeError(f"{op}: the accumulators are a local float32 array of 64, not {host.dtype} {host.shape}")
    a = _fragment(op, a, 4, False)
    me = current()
    threads = int(np.prod(me.block.block_dim))
    if threads % 128:
        raise ValueError(f"{op}: a warpgroup is 128 threads (4 whole warps); this block has {threads}")
    rows = me.block.warp_collective(me, "fragment_rows", op, FULL_MASK, a)
    _wgmma_state(me).open.append((op, "f16", host, rows, int(as_read(desc_b))))


def wgmma_fence():
    """No reordering to prevent here: every instruction runs in program order."""


def fence_proxy_async():
    """cp.async's data is in shared memory once waited for, and every read sees it."""


def wgmma_commit():
    state = _wgmma_state(current())
    state.groups.append(state.open)
    state.open = []


def wgmma_wait(n):
    """The wgmma of every committed group but the newest n run now: read their tiles, accumulate."""
    n = int(as_read(n))
    if n < 0:
        raise ValueError(f"wgmma_wait: {n} groups; the count is 0 or more")
    me = current()
    state = _wgmma_state(me)
    running = state.groups[:max(len(state.groups) - n, 0)]
    state.groups = state.groups[len(running):]
    tid = me.thread_id % 128
    w, lane = tid // 32, tid % 32
    g, t = lane // 4, lane % 4
    rows = np.array([16 * w + g, 16 * w + g + 8])
    cols = (8 * np.arange(16)[:, None] + 2 * t + np.arange(2)[None, :]).reshape(-1)  # j-major, then q % 2
    for group in running:
        for op, kind, acc, desc_a, desc_b in group:
            if isinstance(desc_a, np.ndarray):  # A from registers, B N-major
                a, b = desc_a, _n_major_operand(me, op, desc_b, cols)
            else:
                a = _operand(me, op, desc_a, rows, kind)  # (2, depth)
                b = _operand(me, op, desc_b, cols, kind)  # (32, depth)
            d = (a @ b.T).reshape(2, 16, 2)  # [half][j][q % 2]
            sums = acc.astype(np.float64).reshape(16, 2, 2) + d.transpose(1, 0, 2)  # acc[4j + 2 half + q]
            acc[:] = sums.reshape(-1).astype(np.float32)


for _function in (mma_tf32, mma_f16, mma_bf16, to_tf32, pack_f16x2, pack_bf16x2, ldmatrix_x1, ldmatrix_x2,
                  ldmatrix_x4, ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans, cp_async16, cp_async_commit,
                  cp_async_wait, shared_address, wgmma_f16, wgmma_f16_from_registers, wgmma_tf32, wgmma_fence,
                  fence_proxy_async,
                  wgmma_commit, wgmma_wait):
    _function.__module__ = "workbook.tensor_cores"  # pickled by name: the compile worker gets the GPU twin
    _function.__qualname__ = _function.__name__ = next(name for name, value in globals().items()
                                                        if value is _function and not name.startswith("_"))
