"""assert_close's tests, run on the GPU for a large output that lives there.

On a GPU the chapters check outputs of 2^26 to 2^28 elements. Copying each one to the host and
testing it there took most of a check (about a second per output, two minutes of a full run). Here
one kernel counts, without a copy, what assert_close rejects: elements left unwritten (0xFF bytes
where the reference has none), NaN where the reference is finite, elements outside the tolerance
(or not bit-identical, for exact comparisons), and whether the output and the reference hold any
nonzero element. A clean count passes; any other goes to the host test, which names the elements.
So the device answer only ever decides that an output is right, and both tests agree element by
element: the same float64 arithmetic, NaN matching NaN, an infinity only itself.

The reference is copied to the device once and kept for the next check against the same array
(`compare` checks every variant against one reference). Within `keeping()`, every reference is
kept: a list of them (a gradient per tensor) checked for each variant is copied up once.
"""

import contextlib

import numpy as np

from numba import cuda

from . import ON_GPU
from .launch import cdiv

# Counts kept by the kernel, in this order.
UNWRITTEN, NAN_WHERE_FINITE, DIFFER, OUT_NONZERO, REF_NONZERO = range(5)
BLOCKS, THREADS = 1024, 256


@cuda.jit
def count_mismatches_kernel(out, ref, out_bits, ref_bits, poison_bits, rtol, atol, exact, is_float, counts):
    """Grid-stride over the flat arrays; `*_bits` are the same memory as unsigned integers."""
    unwritten = nan_where_finite = differ = out_nonzero = ref_nonzero = 0
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, out.size, stride):
        o_bits, r_bits = out_bits[i], ref_bits[i]
        if o_bits == poison_bits and r_bits != poison_bits:
            unwritten += 1
        if is_float:
            o, r = np.float64(out[i]), np.float64(ref[i])
            o_nan, r_nan = o != o, r != r
            if o != 0:
                out_nonzero += 1
            if r != 0:
                ref_nonzero += 1
            if exact:
                if not ((o_bits == r_bits) or (o_nan and r_nan)):
                    differ += 1
            elif o_nan or r_nan:
                if o_nan and not r_nan and abs(r) != np.inf:
                    nan_where_finite += 1
                if o_nan != r_nan:
                    differ += 1
            elif abs(r) == np.inf:
                if o != r:
                    differ += 1
            elif not abs(o - r) <= atol + rtol * abs(r):
                differ += 1
        else:
            if o_bits != 0:
                out_nonzero += 1
            if r_bits != 0:
                ref_nonzero += 1
            if o_bits != r_bits:
                differ += 1
    cuda.atomic.add(counts, UNWRITTEN, unwritten)
    cuda.atomic.add(counts, NAN_WHERE_FINITE, nan_where_finite)
    cuda.atomic.add(counts, DIFFER, differ)
    cuda.atomic.add(counts, OUT_NONZERO, out_nonzero)
    cuda.atomic.add(counts, REF_NONZERO, ref_nonzero)


def device_view(array):
    """A numba view of a C-contiguous device array or CUDA torch tensor, else None."""
    if type(array).__module__.startswith("torch"):
        if not (array.is_cuda and array.is_contiguous()):
            return None
        array = cuda.as_cuda_array(array.detach())
    if not (hasattr(array, "copy_to_host") and hasattr(array, "is_c_contiguous")):
        return None
    return array if array.is_c_contiguous() else None


_uploaded = {}  # id(reference) -> (reference, its flat device copy): the last one, or all in keeping()
_keeping = []  # one entry per keeping() block open


@contextlib.contextmanager
def keeping():
    """Inside the block, the device copy of every reference checked stays until the block ends,
    not only the last one's: for a list of references, each checked once per variant."""
    _keeping.append(True)
    try:
        yield
    finally:
        _keeping.pop()
        if not _keeping:
            _uploaded.clear()  # their device memory goes with the block


def _on_device(ref):
    held = _uploaded.get(id(ref))
    if held is None or held[0] is not ref:
        if not _keeping:
            _uploaded.clear()
        held = (ref, cuda.to_device(np.ascontiguousarray(ref).reshape(-1)))
        _uploaded[id(ref)] = held
    return held[1]


def count_mismatches(out, ref, *, rtol, atol, exact):
    """The five counts above for a flat device view `out` and a host array `ref` of the same dtype
    and size (float, integer or bool dtypes of 1, 2, 4 or 8 bytes)."""
    bits = np.dtype(f"u{ref.itemsize}")
    ref_dev = _on_device(ref)
    counts = cuda.to_device(np.zeros(5, np.int64))
    blocks = max(1, min(BLOCKS, cdiv(out.size, THREADS)))
    count_mismatches_kernel[blocks, THREADS](
        out, ref_dev, out.view(bits), ref_dev.view(bits), bits.type(np.iinfo(bits).max),
        np.float64(rtol), np.float64(atol), bool(exact), ref.dtype.kind == "f", counts)
    return counts.copy_to_host()


def testable(ref):
    return ref.dtype.kind in "fiub" and ref.itemsize in (1, 2, 4, 8) and ref.size > 0


def passes(view, ref, *, rtol, atol, exact):
    """True if the device test finds nothing to reject in `view` (see device_view; of ref's shape,
    dtype testable()); False when the host must look (it then names what is wrong)."""
    counts = count_mismatches(view.reshape(view.size), ref, rtol=rtol, atol=atol, exact=exact)
    clean = counts[UNWRITTEN] == counts[NAN_WHERE_FINITE] == counts[DIFFER] == 0
    all_zero_wrongly = counts[OUT_NONZERO] == 0 and counts[REF_NONZERO] > 0
    return bool(clean and not all_zero_wrongly)


@cuda.jit
def _gather_kernel(flat, indices, out):
    for i in range(cuda.grid(1), indices.size, cuda.gridsize(1)):
        out[i] = flat[indices[i]]


def at(array, indices):
    """The elements of `array` (flattened) at `indices` (NumPy integers, each in range), as a NumPy
    array: on a GPU gathered where they lie, so that a check of a sample of a large output copies
    the sample, not the output; else read from a host copy."""
    indices = np.asarray(indices, np.int64)
    size = int(np.prod(array.shape))
    if indices.size and (indices.min() < 0 or indices.max() >= size):
        raise IndexError(f"indices from {indices.min()} to {indices.max()} for an array of {size} elements")
    view = device_view(array) if ON_GPU else None  # the simulator: its device arrays are host memory
    if view is None:  # the simulator's device arrays, or host arrays
        return np.asarray(array.copy_to_host() if hasattr(array, "copy_to_host") else array).reshape(-1)[indices]
    out = cuda.device_array(indices.size, view.dtype)
    if indices.size:
        _gather_kernel[min(BLOCKS, cdiv(indices.size, THREADS)), THREADS](view.reshape(-1), cuda.to_device(indices),
                                                                          out)
    return out.copy_to_host()
