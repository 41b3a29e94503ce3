import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from chapters.ch00_measuring import kernels as k
from workbook import Launch, assert_close, cuda

SIZES = [1, 31, 32, 33, 255, 257, 1000, workbook.size(gpu=(1 << 22) + 7, sim=2049)]
COPIES = [k.copy_one_per_thread, k.copy_grid_stride, k.copy_grid_stride_wide, k.copy_quads]
AXPYS = [k.axpy_one_per_thread, k.axpy_grid_stride, k.axpy_quads]


def data(n, dtype=np.float32, seed=0):
    return np.random.default_rng(seed + n).standard_normal(n).astype(dtype)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("copy", COPIES, ids=lambda f: f.__name__)
def test_copy(copy, n):
    src = data(n)
    src[: min(n, 3)] = [np.nan, np.inf, -0.0][: min(n, 3)]  # bits must travel unchanged
    dst = cuda.to_device(np.full(n, 7.0, dtype=np.float32))
    out = copy(cuda.to_device(src), dst)
    assert_close(out, k.copy_reference(src), exact=True, launch=Launch(-(-n // 256), 256))


@pytest.mark.parametrize("dtype", [np.float64, np.int32])
def test_copy_other_dtypes(dtype):
    src = (data(101) * 100).astype(dtype)
    out = k.copy_grid_stride_wide(cuda.to_device(src), cuda.device_array(101, dtype=dtype))
    assert_close(out, src, exact=True)


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("axpy", AXPYS, ids=lambda f: f.__name__)
def test_axpy(axpy, n):
    x, y = data(n), data(n, seed=1)
    out = axpy(-1.5, cuda.to_device(x), cuda.to_device(y), cuda.device_array(n, dtype=np.float32))
    assert_close(out, k.axpy_reference(-1.5, x, y))


@pytest.mark.parametrize("stride", [1, 2, 3, 8, 32])
def test_gather_strided(stride):
    src = data(1000)
    out = k.gather_strided(cuda.to_device(src), cuda.device_array(1000 // stride, np.float32), stride)
    assert_close(out, k.gather_reference(src, stride), exact=True)


def test_bad_input_is_a_clear_error():
    src = data(10)
    with pytest.raises(TypeError, match="host"):
        k.copy_grid_stride(src, cuda.device_array(10, np.float32))
    with pytest.raises(ValueError, match="shape"):
        k.copy_grid_stride(cuda.to_device(src), cuda.device_array(9, np.float32))
    with pytest.raises(TypeError, match="dtype"):
        k.copy_one_per_thread(cuda.to_device(src), cuda.device_array(10, np.float64))
    with pytest.raises(TypeError, match="dtype"):
        k.axpy_grid_stride(2.0, cuda.to_device(src.astype(np.int32)), cuda.to_device(src),
                           cuda.to_device(src))
    with pytest.raises(ValueError, match="stride"):
        k.gather_strided(cuda.to_device(src), cuda.device_array(10, np.float32), 0)


@pytest.mark.parametrize("offset", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 3, 4, 5, 33, 1001])
def test_quads_at_every_alignment(offset, n):
    # Views starting 0..3 elements into an aligned buffer: only offset 0 is 16-byte aligned, the
    # others must take the 4-byte kernel (a quad there would fault on a GPU), all must be right.
    base_x, base_y = data(n + 3), data(n + 3, seed=1)
    x, y = cuda.to_device(base_x)[offset:offset + n], cuda.to_device(base_y)[offset:offset + n]
    out = cuda.to_device(np.full(n + 3, 7.0, np.float32))[offset:offset + n]
    assert_close(k.copy_quads(x, out), base_x[offset:offset + n], exact=True, name=f"copy offset {offset}")
    assert_close(k.axpy_quads(0.5, x, y, out), k.axpy_reference(0.5, base_x[offset:offset + n],
                                                                base_y[offset:offset + n]),
                 name=f"axpy offset {offset}")


@pytest.mark.parametrize("dtype", [np.float64, np.int32, np.uint32])
def test_copy_quads_moves_any_4_or_8_byte_dtype(dtype):
    src = (data(103) * 1000).astype(dtype)
    out = k.copy_quads(cuda.to_device(src), cuda.device_array(103, dtype=dtype))
    assert_close(out, src, exact=True)


# ---------------------------------------------------------------------------------------------
# Bytes in flight (in_flight.py)


@pytest.mark.parametrize("n", [1, 3, 4, 31, 33, 4099])
@pytest.mark.parametrize("blocks_per_sm", [1, 8])
def test_in_flight_copy_at_awkward_sizes(n, blocks_per_sm):
    from chapters.ch00_measuring import in_flight

    src = np.random.default_rng(n).standard_normal(n, dtype=np.float32)
    dst = cuda.device_array(n, np.float32)
    workbook.check.poison(dst)
    in_flight.in_flight_copy(cuda.to_device(src), dst, blocks_per_sm)
    workbook.assert_close(dst, src, exact=True, name=f"in_flight_copy n={n}")


def test_in_flight_copy_rejects_what_it_cannot_do():
    from chapters.ch00_measuring import in_flight

    x = cuda.device_array(64, np.float32)
    with pytest.raises(ValueError, match="blocks_per_sm"):
        in_flight.in_flight_copy(x, cuda.device_array_like(x), 9)
    with pytest.raises(ValueError, match="16-byte"):
        in_flight.in_flight_copy(x[1:], cuda.device_array(63, np.float32), 1)


@pytest.mark.parametrize("n, stride, steps", [(1 << 10, 97, 40), (33, 1, 0), (31, 30, 65)])
def test_chase_follows_the_chain(n, stride, steps):
    from chapters.ch00_measuring import in_flight

    out = in_flight.chase(cuda.to_device(in_flight.chain(n, stride)), steps, cuda.device_array(1, np.int32))
    workbook.assert_close(out, in_flight.chase_reference(n, stride, steps), exact=True, name="chase")
    with pytest.raises(ValueError, match="stride"):
        in_flight.chain(n, n)


def test_littles_law_arithmetic():
    from chapters.ch00_measuring import in_flight

    assert in_flight.bytes_in_flight_per_sm(8) == 8 * 256 * 16
    assert in_flight.needed_per_sm(1000.0, 500.0, 100) == 5000.0  # 1 TB/s x 500 ns / 100 SMs = 5 KB
