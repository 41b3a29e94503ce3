"""Compare a kernel's output with a NumPy reference, and say exactly where it went wrong.

    assert_close(out, ref)            floats: dtype-aware tolerance, NaN/Inf must match exactly
    assert_close(out, ref, exact=True) integers, masks, anything that must be bit-identical
    assert_bitmask(words, bits)       a packed uint32 mask (bit i % 32 of word i // 32) vs a bool array

Every failure is a CheckError (an AssertionError) whose message counts the wrong elements, lists the
first few by index and, given the launch (`Launch(blocks, threads_per_block, ...)`), names the block
and thread that wrote them. Outputs a loose tolerance would let through are rejected by name: wrong
shape or dtype, all zeros, NaN where the reference is finite, an output left equal to its input,
and elements left unwritten: `poison(out)` (or `poisoned(shape, dtype)`) fills an output with 0xFF
bytes before the call, and an element that still holds them is named as never written.
"""

from dataclasses import dataclass

import numpy as np

from .launch import cdiv

# (rtol, atol) by dtype: float32 leaves room for a different summation order in reductions.
DEFAULT_TOLERANCE = {
    np.dtype(np.float16): (1e-2, 1e-3),
    np.dtype(np.float32): (1e-5, 1e-6),
    np.dtype(np.float64): (1e-12, 1e-14),
}
SHOW_FIRST = 8


class CheckError(AssertionError):
    pass


@dataclass(frozen=True)
class Launch:
    """How output elements map to threads, so that a wrong element can be traced to its thread.

    items_per_thread consecutive elements per thread (contiguous), or, with grid_stride=True,
    element i handled by global thread i % (blocks * threads_per_block). For any other layout (a
    2-D grid, a warp per row), Launch.mapped(owner_of): owner_of(position) -> (block, thread), where
    position is the element's index tuple and block and thread are numbers or (x, y) pairs.
    """

    blocks: int
    threads_per_block: int
    items_per_thread: int = 1
    grid_stride: bool = False
    owner_of: object = None

    @classmethod
    def mapped(cls, owner_of):
        return cls(0, 0, owner_of=owner_of)

    def owner(self, flat_index, shape=None):
        if self.owner_of is not None:
            position = np.unravel_index(int(flat_index), shape) if shape is not None else (int(flat_index),)
            block, thread = self.owner_of(tuple(int(p) for p in position))
            return block, thread
        if self.grid_stride:
            thread = flat_index % (self.blocks * self.threads_per_block)
        else:
            thread = flat_index // self.items_per_thread
        return divmod(int(thread), self.threads_per_block)


def smallest_first(cases, size=None):
    """The cases in order of size (`size(case)`; by default the product of a shape, or the number
    itself): a check that stops at its first failure then names the smallest case that fails."""
    import math

    return sorted(cases, key=size or (lambda case: math.prod(case) if isinstance(case, tuple) else case))


def to_host(array):
    """A NumPy copy of a device array, a torch tensor, or a host array."""
    if hasattr(array, "copy_to_host"):
        return array.copy_to_host()
    if type(array).__module__.startswith("torch"):
        return array.detach().cpu().numpy()
    if hasattr(array, "get") and type(array).__module__.startswith("cupy"):
        return array.get()
    return np.asarray(array)


def _where(index, shape, launch):
    position = np.unravel_index(index, shape) if len(shape) > 1 else (int(index),)
    text = "[" + ", ".join(str(int(p)) for p in position) + "]"
    if launch is not None:
        block, thread = launch.owner(index, shape)
        text += f" (block {block}, thread {thread})"
    return text


def _fail(name, message, bad, out, ref, launch):
    lines = [f"{name}: {message}"]
    if bad is not None:
        flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
        for index in bad[:SHOW_FIRST]:
            where = _where(index, ref.shape, launch)
            lines.append(f"  at {where}: got {flat_out[index]!r}, expected {flat_ref[index]!r}")
        if launch is not None and len(bad):
            blocks = sorted({launch.owner(i, ref.shape)[0] for i in bad})
            lines.append(f"  wrong elements come from {len(blocks)} block(s): {blocks[:SHOW_FIRST]}"
                         + (" ..." if len(blocks) > SHOW_FIRST else ""))
    raise CheckError("\n".join(lines))


# ---------------------------------------------------------------------------------------------
# Poisoned outputs: an element a kernel never writes can never pass for one


def poison(output):
    """Fill an output with 0xFF bytes (NaN for floats, -1 or the maximum for integers), so that an
    element the kernel never writes cannot pass for one an earlier variant wrote."""
    from numba import cuda

    if type(output).__module__.startswith("torch"):
        torch = __import__("torch")
        # a channels-last tensor is dense but not contiguous: its NCHW-ordered view has no flat view
        dense = output if output.is_contiguous() else output.permute(
            *sorted(range(output.dim()), key=lambda d: -output.stride(d)))
        if dense.is_contiguous():
            dense.reshape(-1).view(torch.uint8).fill_(255)
        else:
            output.fill_(float("nan") if output.is_floating_point() else -1)
    elif hasattr(output, "copy_to_host") and output.size:
        from . import ON_GPU

        if ON_GPU and output.is_c_contiguous():  # the driver's memset: no host copy of a large output
            from numba.cuda.cudadrv import driver

            driver.device_memset(output, 255, output.nbytes)
            return
        as_bytes = output.reshape(output.size).view(np.uint8)
        cuda.to_device(np.full(as_bytes.size, 255, dtype=np.uint8), to=as_bytes)


def poisoned(shape, dtype):
    """A new device array filled with 0xFF bytes: see poison()."""
    from numba import cuda

    out = cuda.device_array(shape, dtype)
    poison(out)
    return out


def _poison_left(flat):
    """Which elements hold nothing but 0xFF bytes."""
    return flat.view(f"u{flat.itemsize}") == np.iinfo(f"u{flat.itemsize}").max if flat.dtype.kind in "fiub" and \
        flat.itemsize in (1, 2, 4, 8) else np.zeros(flat.shape, bool)


def _same_bytes(out, ref):
    """Whether `out` and `ref` (one shape, one dtype) hold the same bytes; False for a dtype whose
    equal bytes need not be equal values under the tests below (complex, long double, objects)."""
    if ref.dtype.kind not in "fiub" or ref.itemsize not in (1, 2, 4, 8):
        return False
    if out.flags.c_contiguous and ref.flags.c_contiguous and out.nbytes % 8 == 0:
        return np.array_equal(out.reshape(-1).view(np.uint64), ref.reshape(-1).view(np.uint64))
    bits = f"u{ref.itemsize}"
    return np.array_equal(out.view(bits), ref.view(bits))


def _within(out, ref, rtol, atol, chunk=1 << 20):
    """|out - ref| <= atol + rtol * |ref| in float64, element by element; NaN matches NaN, an
    infinity only itself. In chunks, so that the float64 temporaries stay in the CPU's cache."""
    same = np.empty(out.shape, bool)
    with np.errstate(invalid="ignore", over="ignore"):
        for start in range(0, out.size, chunk):
            o, r = out[start:start + chunk], ref[start:start + chunk]
            wide_out, wide_ref = o.astype(np.float64), r.astype(np.float64)
            near = np.abs(wide_out - wide_ref) <= atol + rtol * np.abs(wide_ref)
            same[start:start + chunk] = np.where(np.isnan(r), np.isnan(o), np.where(np.isinf(r), wide_out == wide_ref, near))
    return same


def _same_kind(name, out, ref):
    if out.shape != ref.shape:
        raise CheckError(f"{name}: shape {out.shape}, expected {ref.shape}")
    if out.dtype != ref.dtype:
        raise CheckError(f"{name}: dtype {out.dtype}, expected {ref.dtype}")


def assert_close(out, ref, *, rtol=None, atol=None, exact=False, name="output", launch=None,
                 input=None):
    """Raise CheckError unless `out` matches the NumPy reference `ref`.

    `input`: the kernel's input, when the output must differ from it (catches a kernel that wrote
    nothing to an output initialised as a copy of its input, or an in-place kernel that did nothing).
    On a GPU, a large output is first tested where it is (device_check.py); only one that fails
    there is copied to the host, to be tested again and described.
    """
    from .compile_pool import warming_up

    if warming_up():  # a warm-up call: thrown away, and the caller's own call of it is checked
        return
    ref = np.asarray(ref)
    is_float = np.issubdtype(ref.dtype, np.floating)
    if is_float and not exact:
        default_rtol, default_atol = DEFAULT_TOLERANCE.get(ref.dtype, (1e-5, 1e-6))
        rtol = default_rtol if rtol is None else rtol
        atol = default_atol if atol is None else atol
    view = _device_view(out, ref, input)
    if view is not None:
        from . import device_check

        _same_kind(name, view, ref)
        if device_check.passes(view, ref, rtol=rtol or 0.0, atol=atol or 0.0, exact=exact or not is_float):
            return
    out = to_host(out)
    _same_kind(name, out, ref)
    if out.size == 0:
        return
    # An output holding its reference's bytes passes every test below: no element is then unwritten
    # or NaN where the reference is finite, none differs (in value, sign or NaN-ness) or lies outside
    # a finite tolerance >= 0, the output is all zeros only if the reference is, and equal to its
    # input only if the reference is. One pass over the bytes then decides a right kernel's check.
    tolerant = exact or not is_float or (0 <= rtol < np.inf and 0 <= atol < np.inf)
    if tolerant and _same_bytes(out, ref):
        return
    flat_out, flat_ref = out.reshape(-1), ref.reshape(-1)
    unwritten = np.flatnonzero(_poison_left(flat_out) & ~_poison_left(flat_ref))
    if len(unwritten):
        _fail(name, f"{len(unwritten)} of {ref.size} elements left unwritten (they still hold the 0xFF bytes the "
                    "output was filled with before the call)", unwritten, out, ref, launch)

    # Only the elements that are not equal need the slower tests below (NaN is never equal): on a
    # GPU's full-size outputs (2^28 elements) this is most of the check's cost.
    unequal = flat_out != flat_ref
    if np.count_nonzero(unequal) > unequal.size // 4:  # most differ: test them all, in place
        differ, out_d, ref_d = np.arange(unequal.size), flat_out, flat_ref
    else:
        differ = np.flatnonzero(unequal)
        out_d, ref_d = flat_out[differ], flat_ref[differ]
    if exact or not is_float:
        # Bit-identical for integers and masks; for floats, NaN == NaN (any payload) but -0 != +0.
        if is_float:
            same = (out_d == ref_d) | (np.isnan(out_d) & np.isnan(ref_d))
            zeros = np.flatnonzero((flat_out == 0) & (flat_ref == 0))  # equal, but maybe not in sign
            signs = zeros[np.signbit(flat_out[zeros]) != np.signbit(flat_ref[zeros])]
            differ, same = np.concatenate([differ, signs]), np.concatenate([same, np.zeros(len(signs), bool)])
        else:
            same = out_d == ref_d
        bad = differ[~same]
        if len(bad):
            _fail(name, f"{len(bad)} of {ref.size} elements differ (exact comparison)", np.sort(bad), out, ref,
                  launch)
    else:
        nan_where_finite = differ[np.isnan(out_d) & np.isfinite(ref_d)]
        if len(nan_where_finite):
            _fail(name, f"NaN in {len(nan_where_finite)} elements where the reference is finite",
                  nan_where_finite, out, ref, launch)
        same = _within(out_d, ref_d, rtol, atol)
        bad = differ[~same]
        if len(bad):
            _fail(name, f"{len(bad)} of {ref.size} elements differ (rtol={rtol:g}, atol={atol:g})", bad,
                  out, ref, launch)

    # Degenerate outputs that a tolerance could let through.
    if not np.any(flat_out) and np.any(flat_ref):
        _fail(name, "output is all zeros but the reference is not", None, out, ref, launch)
    if input is not None:
        before = to_host(input)
        if before.shape == out.shape and before.dtype == out.dtype and np.array_equal(
                before, out, equal_nan=is_float) and not np.array_equal(ref, before, equal_nan=is_float):
            _fail(name, "output is left equal to its input", None, out, ref, launch)


DEVICE_CHECK_FROM = 1 << 16  # elements: below this, the host test is as quick


def _device_view(out, ref, input):
    """A numba view of `out` where assert_close tests it on the device first, else None."""
    from . import ON_GPU

    if not (ON_GPU and input is None and ref.size >= DEVICE_CHECK_FROM):
        return None
    from . import device_check

    return device_check.device_view(out) if device_check.testable(ref) else None


def unpack_bitmask(words, n):
    """The first n bits of a packed mask: bit i % 32 of 32-bit word i // 32 (little-endian bit order)."""
    words = np.ascontiguousarray(to_host(words))
    if words.dtype.kind not in "iu":
        raise CheckError(f"bitmask: dtype {words.dtype} is not an integer type")
    return np.unpackbits(words.view(np.uint8), bitorder="little")[:n].astype(bool)


def pack_bitmask(bits):
    """NumPy reference for a packed mask: uint32[ceil(n / 32)], unused high bits of the last word 0."""
    bits = np.asarray(bits, dtype=bool).reshape(-1)
    padded = np.zeros(cdiv(bits.size, 32) * 32, dtype=bool)
    padded[: bits.size] = bits
    return np.packbits(padded, bitorder="little").view(np.uint32)


def assert_bitmask(words, bits, *, name="mask", launch=None):
    """Raise CheckError unless the packed mask `words` holds exactly the booleans `bits`.

    The padding bits past n in the last word must be zero, so that popcounts of the mask are right.
    `launch` maps an element (bit) index to its owner, like assert_close.
    """
    bits = np.asarray(bits, dtype=bool).reshape(-1)
    expected = pack_bitmask(bits)
    got = to_host(words).reshape(-1)
    if got.shape != expected.shape:
        raise CheckError(f"{name}: {got.size} words, expected ceil({bits.size} / 32) = {expected.size}")
    if got.dtype.itemsize != 4:
        raise CheckError(f"{name}: dtype {got.dtype}, expected a 32-bit word type")
    if np.array_equal(got.view(np.uint32), expected):  # right: no need to look bit by bit
        return got
    got_bits = np.unpackbits(np.ascontiguousarray(got).view(np.uint8), bitorder="little").astype(bool)
    wrong = np.flatnonzero(got_bits != np.unpackbits(expected.view(np.uint8), bitorder="little").astype(bool))
    if len(wrong):
        first = int(wrong[0])
        word, bit = divmod(first, 32)
        where = f"element {first} (word {word}, bit {bit})"
        if first >= bits.size:
            where += f", a padding bit past n={bits.size}"
        elif launch is not None:
            block, thread = launch.owner(first)
            where += f" (block {block}, thread {thread})"
        padding = int(np.count_nonzero(wrong >= bits.size))
        counted = f"{len(wrong) - padding} of {bits.size} bits" + (f" and {padding} padding bits" if padding else "")
        raise CheckError(f"{name}: {counted} wrong; first wrong bit is {where}: "
                         f"got {int(got_bits[first])}, expected {int(first < bits.size and bits[first])}")
    return got
