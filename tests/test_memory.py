"""workbook.memory: 4-wide loads and stores, the same results in the simulator and on a GPU, and
the instructions they claim in the PTX."""

import workbook  # noqa: I001  (first: it picks GPU or simulator before numba.cuda is imported)

import re

import numpy as np
import pytest

from workbook import assert_close, compiler, cuda, memory
from workbook.memory import (atomic_add4, load4, load16, per16, shared_load4, shared_store4, store4,
                             store16)

SIM = workbook.MODE == "sim"
BIG = workbook.size(gpu=(1 << 22) + 5, sim=1029)


@cuda.jit
def scale_quads_kernel(src, dst, factor):
    # dst = src * factor: whole quads 4-wide, the n % 4 tail one element per thread
    n = src.size
    q = cuda.grid(1)
    while q < n // 4:
        a, b, c, d = load4(src, 4 * q)
        store4(dst, 4 * q, (a * factor, b * factor, c * factor, d * factor))
        q += cuda.gridsize(1)
    i = (n // 4) * 4 + cuda.grid(1)
    if i < n:
        dst[i] = src[i] * factor


@cuda.jit(device=True, inline=True)
def _negate4(values):
    # in float32: numba's float16 operators pass their operands through local memory
    a, b, c, d = values
    return (-np.float32(a), -np.float32(b), -np.float32(c), -np.float32(d))


@cuda.jit(device=True, inline=True)
def _negate8(values):
    a, b, c, d, e, f, g, h = values
    return (-np.float32(a), -np.float32(b), -np.float32(c), -np.float32(d),
            -np.float32(e), -np.float32(f), -np.float32(g), -np.float32(h))


def negate_16_bytes_kernel(dtype):
    """dst = -src, 16 bytes per access whatever the dtype (4 float32, 8 float16), the tail one by
    one. A kernel per width: a tuple's length is part of its type."""
    width = per16(dtype)
    negate = _negate4 if width == 4 else _negate8

    @cuda.jit
    def kernel(src, dst):
        n = src.size
        i = cuda.grid(1) * width
        if i + width <= n:
            store16(dst, i, negate(load16(src, i)))
        elif i < n:
            for j in range(i, n):
                dst[j] = -np.float32(src[j])

    return kernel


@cuda.jit
def reverse_quads_in_shared_kernel(src, dst):
    # One block of 64 threads: stage 256 float32 in shared memory 4-wide, read them back reversed
    # quad by quad (a barrier between): shared_store4 / shared_load4 of other threads' quads.
    tile = cuda.shared.array(256, np.float32)
    t = cuda.threadIdx.x
    shared_store4(tile, 4 * t, load4(src, 4 * t))
    cuda.syncthreads()
    store4(dst, 4 * t, shared_load4(tile, 4 * (63 - t)))


@cuda.jit
def load_quad_kernel(src, index, out):
    a, b, c, d = load4(src, index)
    out[0], out[1], out[2], out[3] = a, b, c, d


def scale_quads(src, dst, factor):
    threads = 64
    blocks = max(1, min(64, -(-src.size // (4 * threads))))
    scale_quads_kernel[blocks, threads](src, dst, src.dtype.type(factor))
    return dst


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.int32])
@pytest.mark.parametrize("n", [*range(1, 34), BIG])
def test_quads_and_tail_at_every_size(dtype, n):
    src = (np.random.default_rng(n).standard_normal(n) * 50).astype(dtype)
    out = scale_quads(cuda.to_device(src), cuda.to_device(np.full(n, 7, dtype)), 3)
    assert_close(out, src * dtype(3), exact=True, name=f"{np.dtype(dtype).name} n={n}")


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
def test_alignment_offsets(offset):
    # A view `offset` elements into an aligned buffer is 16-byte aligned only for offset 0.
    n = 37
    base = cuda.to_device(np.arange(n + 3, dtype=np.float32))
    view = base[offset:offset + n]
    assert memory.aligned(view) == (offset == 0)
    if offset == 0:
        out = scale_quads(view, cuda.device_array(n, np.float32), 2)
        assert_close(out, 2 * np.arange(n, dtype=np.float32), exact=True)


def test_shared_quads():
    src = np.arange(256, dtype=np.float32)
    out = cuda.to_device(np.full(256, -1, np.float32))
    reverse_quads_in_shared_kernel[1, 64](cuda.to_device(src), out)
    expected = src.reshape(64, 4)[::-1].reshape(-1)
    assert_close(out, expected, exact=True)


def test_float16_rounds_like_numpy():
    src = np.array([1.0, 2049.0, 65504.0, 1e-8], np.float32)
    out = cuda.to_device(np.zeros(4, np.float16))

    # store4 converts each value to the array's dtype (round to nearest even), as `out[i] = v` does
    @cuda.jit
    def half_store_kernel(src, out):
        store4(out, 0, load4(src, 0))

    half_store_kernel[1, 1](cuda.to_device(src), out)
    np.testing.assert_array_equal(out.copy_to_host(), src.astype(np.float16))


@pytest.mark.skipif(not SIM, reason="on a GPU a misaligned quad faults the context and one past the end is unchecked")
def test_simulator_rejects_what_a_gpu_would_fault_on():
    src = cuda.to_device(np.arange(12, dtype=np.float32))
    out = cuda.device_array(4, np.float32)
    with pytest.raises(ValueError, match="misaligned address: element 2 is not a multiple of 4"):
        load_quad_kernel[1, 1](src, 2, out)
    with pytest.raises(ValueError, match="first element is not 16-byte aligned"):
        load_quad_kernel[1, 1](src[1:], 0, out)
    with pytest.raises(IndexError, match="past the end"):
        load_quad_kernel[1, 1](src, 12, out)
    load_quad_kernel[1, 1](src, 8, out)
    np.testing.assert_array_equal(out.copy_to_host(), [8, 9, 10, 11])


@cuda.jit
def add_quads_kernel(values, out, quads):
    # Every thread adds its 4 values into quad (thread % quads) of out: many threads per quad, so
    # the adds must be atomic to sum up.
    t = cuda.grid(1)
    if t < values.shape[0]:
        q = t % quads
        atomic_add4(out, 4 * q, (values[t, 0], values[t, 1], values[t, 2], values[t, 3]))


def _has_vector_atomics():
    return SIM or memory.vector_atomics(cuda.get_current_device().compute_capability)


@pytest.mark.skipif(not _has_vector_atomics(), reason="red.global.add.v4.f32 needs compute capability 9.0")
@pytest.mark.parametrize("threads, quads", [(1, 1), (33, 1), (100, 7), (workbook.size(gpu=4099, sim=67), 33)])
def test_atomic_add4_sums(threads, quads):
    # Integers in float32: the sum is exact whatever order the atomics land in.
    values = np.random.default_rng(threads).integers(-50, 50, (threads, 4)).astype(np.float32)
    out = cuda.to_device(np.ones(4 * quads, np.float32))
    add_quads_kernel[(threads + 63) // 64, 64](cuda.to_device(values), out, quads)
    expected = np.ones((quads, 4), np.float32)
    np.add.at(expected, np.arange(threads) % quads, values)
    np.testing.assert_array_equal(out.copy_to_host(), expected.reshape(-1))


@pytest.mark.skipif(not SIM, reason="on a GPU a misaligned vector atomic faults the context")
def test_simulator_checks_atomic_add4():
    out = cuda.to_device(np.zeros(8, np.float32))
    values = cuda.to_device(np.ones((1, 4), np.float32))
    with pytest.raises(ValueError, match="misaligned address"):
        add_quads_kernel[1, 1](values, out[1:], 1)
    # float64: the GPU compiler (where installed) rejects the call before the simulator runs it
    with pytest.raises((TypeError, compiler.GPUCompileError), match="atomic_add4"):
        add_quads_kernel[1, 1](values, cuda.to_device(np.zeros(8, np.float64)), 1)


def test_vector_atomics_by_compute_capability():
    assert memory.vector_atomics((9, 0)) and memory.vector_atomics((10, 0))
    assert not memory.vector_atomics((8, 9)) and not memory.vector_atomics((7, 0))


@cuda.jit
def negate_each_kernel(src, dst):
    i = cuda.grid(1)
    if i < src.size:
        dst[i] = -np.float32(src[i])


def negate(src, dst):
    """dst = -src: 16-byte accesses when both arrays start on a 16-byte boundary, else one element
    per thread (a 16-byte access at a misaligned address faults on a GPU)."""
    width = per16(src.dtype)
    if memory.aligned(src, 16) and memory.aligned(dst, 16):
        negate_16_bytes_kernel(src.dtype)[(src.size + 64 * width - 1) // (64 * width), 64](src, dst)
    else:
        negate_each_kernel[(src.size + 63) // 64, 64](src, dst)
    return dst


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("n", [*range(1, 34), BIG])
def test_16_byte_accesses(dtype, n):
    # load16/store16: 4 float32 or 8 float16 per access, the same 16 bytes; the tail one by one
    width = per16(dtype)
    assert width * np.dtype(dtype).itemsize == 16
    x = (np.arange(n) % 97 - 40).astype(dtype)
    out = negate(cuda.to_device(x), cuda.device_array(n, dtype))
    np.testing.assert_array_equal(out.copy_to_host(), -x)


@pytest.mark.parametrize("dtype, offset", [(np.float32, k) for k in range(4)] + [(np.float16, k) for k in range(8)])
def test_16_byte_alignment_offsets(dtype, offset):
    # A view `offset` elements into an aligned buffer is 16-byte aligned only for offset 0; the
    # others must take the element-by-element kernel, and every path gives the same answer.
    n = 45
    x = (np.arange(n + offset) % 13 - 6).astype(dtype)
    src = cuda.to_device(x)[offset:]
    dst = cuda.device_array(n + offset, dtype)[offset:]
    assert memory.aligned(src, 16) == (offset == 0)
    np.testing.assert_array_equal(negate(src, dst).copy_to_host(), -x[offset:])


@pytest.mark.skipif(not SIM, reason="the simulator's checks; a GPU faults instead")
def test_simulator_checks_16_byte_accesses():
    src = cuda.to_device(np.arange(24, dtype=np.float16))
    out = cuda.device_array(8, np.float16)

    @cuda.jit
    def load_kernel(src, index, out):
        store16(out, 0, load16(src, index))

    with pytest.raises(ValueError, match="element 4 is not a multiple of 8"):
        load_kernel[1, 1](src, 4, out)
    with pytest.raises(IndexError, match="past the end"):
        load_kernel[1, 1](src, 24, out)
    load_kernel[1, 1](src, 16, out)
    np.testing.assert_array_equal(out.copy_to_host(), np.arange(16, 24))


# The instructions: checked on a GPU, and on a laptop through the compile extra.

needs_compiler = pytest.mark.skipif(SIM and __import__("workbook.compiler").compiler.missing() is not None,
                                    reason="no GPU compiler here (pip install -e '.[compile]')")


@needs_compiler
@pytest.mark.parametrize("dtype, load, store", [
    (np.float32, "ld.global.v4.f32", "st.global.v4.f32"),
    (np.int32, "ld.global.v4.u32", "st.global.v4.u32"),
    (np.float16, "ld.global.v2.u32", "st.global.v2.u32"),  # 8 bytes: four halves, as two 32-bit words
])
def test_ptx_has_the_wide_instructions(dtype, load, store):
    x = np.zeros(8, dtype)
    ptx = workbook.show_ptx(scale_quads_kernel, x, x, np.dtype(dtype).type(1), grep=r"\.global")
    assert load in ptx and store in ptx


@needs_compiler
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_ptx_of_16_byte_accesses(dtype):
    x = np.zeros(8, dtype)
    ptx = workbook.show_ptx(negate_16_bytes_kernel(dtype), x, x, grep=r"\.global")
    # float16: 8 halves move as 4 x 32 bits (.v4.u32), not as two 8-byte accesses; and no local
    # memory (the tuples stay in registers)
    assert ".local" not in ptx and re.search(r"ld\.global\.v4\.(f32|u32|b32)", ptx) and re.search(r"st\.global\.v4\.(f32|u32|b32)", ptx)


@needs_compiler
def test_ptx_of_shared_quads():
    x = np.zeros(256, np.float32)
    ptx = workbook.show_ptx(reverse_quads_in_shared_kernel, x, x, grep=r"\.shared")
    assert "st.shared.v4.f32" in ptx and "ld.shared.v4.f32" in ptx


@needs_compiler
@pytest.mark.parametrize("dtype, load", [(np.float32, "ld.global.v4.f32"), (np.float16, "ld.global.v4.u16")])
def test_ptx_of_chapter_03s_fused_unscale(dtype, load):
    # Chapter 03 reaches every tensor of a list through an address table, with its own vector
    # intrinsics (tensor_pointer/load4/store4): 4 elements per load and per store.
    from chapters.ch03_amp_unscale import kernels as k

    ptx = workbook.show_ptx(k.unscale_fused_kernels[np.dtype(dtype)], np.zeros((3, 2), np.int64), np.zeros(1, np.float32),
                            np.zeros(1, np.float32), grep=r"\.v4")
    assert load in ptx and load.replace("ld.", "st.") in ptx


@needs_compiler
def test_ptx_of_atomic_add4():
    # One vector reduction, kept although it has no result (declared with side effects).
    ptx = workbook.show_ptx(add_quads_kernel, np.zeros((4, 4), np.float32), np.zeros(8, np.float32), 2,
                            grep=r"red\.")
    assert "red.global.add.v4.f32" in ptx


@needs_compiler
def test_ptx_of_chapter_04s_wide_gemm():
    # The wide tile reads its fragments 16 bytes at a time: per depth row, TM/4 + TN/4 = 4 shared
    # loads of 4 words for 64 FMAs (the 4-byte tile: 16 loads); its tile loader, 16-byte global loads.
    from chapters.ch04_implicit_gemm import kernels as k

    tile = k.Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True, prefetch=True)
    a = np.zeros((8, 8), np.float32)
    gemm_kernel = k.make_gemm_kernel(tile, quads=True)
    ptx = workbook.show_ptx(gemm_kernel, a, a, 8, np.zeros((1, 8, 8), np.float32), grep=r"\.v4")
    assert "ld.shared.v4.f32" in ptx and "ld.global.v4.f32" in ptx and "st.shared.v4.f32" in ptx
    assert not re.search(r"ld\.shared\.f32", ptx)  # no 4-byte fragment loads left
    # Its outputs 16 bytes at a time: stored whole, or added with one vector atomic when shared.
    gemm_kernel = k.make_gemm_kernel(tile, quads=True, quad_outputs=True)
    ptx = workbook.show_ptx(gemm_kernel, a, a, 8, np.zeros((1, 8, 8), np.float32), grep=r"\.v4")
    assert "st.global.v4.f32" in ptx and "red.global.add.v4.f32" in ptx
