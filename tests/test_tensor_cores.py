"""workbook/tensor_cores.py: each instruction against a NumPy model written from the PTX ISA's tables
(not from the simulator's code). On a GPU these tests check the hardware against the model; in the
simulator, the simulator against it."""

import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from workbook import cuda
from workbook import tensor_cores as tc
from workbook.tensor_cores import (cp_async16, cp_async_commit, cp_async_wait, ldmatrix_x1, ldmatrix_x1_trans,
                                   ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4, ldmatrix_x4_trans, mma_bf16,
                                   mma_f16, mma_tf32, pack_bf16x2, pack_f16x2, to_tf32)

SIM = not workbook.ON_GPU
only_sim = pytest.mark.skipif(not SIM, reason="what the simulator reports as an error is undefined on a GPU")


def test_fragment_tables_cover_each_element_once():
    for kind, (m, n, k) in tc.MMA_SHAPES.items():
        where = tc.fragment_coordinates(kind)
        pair = 1 if kind == "tf32" else 2
        a = [(r, c + h) for r, c in where["a"].reshape(-1, 2) for h in range(pair)]
        b = [(r + h, c) for r, c in where["b"].reshape(-1, 2) for h in range(pair)]
        assert sorted(a) == [(r, c) for r in range(m) for c in range(k)]
        assert sorted(b) == [(r, c) for r in range(k) for c in range(n)]
        assert sorted(map(tuple, where["c"].reshape(-1, 2))) == [(r, c) for r in range(m) for c in range(n)]


@cuda.jit
def _round_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = to_tf32(x[i])


def test_to_tf32_rounds_to_nearest_ties_away():
    ones = np.float32(1).view(np.uint32)
    ties = np.array([ones + 0x1000, ones + 0x3000, (ones + 0x1000) | 0x80000000], np.uint32).view(np.float32)
    rng = np.random.default_rng(0)
    x = np.concatenate([ties, rng.standard_normal(200).astype(np.float32) * 1e3,
                        np.array([0, -0.0, np.inf, -np.inf, np.nan, 3.4e38, 1e-40], np.float32)])
    out = cuda.to_device(np.zeros_like(x))
    _round_kernel[1, x.size](cuda.to_device(x), out)
    got = out.copy_to_host()
    want = tc.round_tf32(x)
    finite = np.isfinite(want)
    np.testing.assert_array_equal(got[finite].view(np.uint32), want[finite].view(np.uint32))
    assert np.isnan(got[~finite]).sum() == np.isnan(want).sum()
    assert got[0] == np.float32(1 + 2 ** -10) and got[2] == -got[0]  # a tie goes away from zero


def _c_fragment(c, lane):
    g, t = lane // 4, lane % 4
    return (c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])


@cuda.jit
def _tf32_tile(a, b, c, d, rounded):
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    fa = (a[g, t], a[g + 8, t], a[g, t + 4], a[g + 8, t + 4])
    fb = (b[t, g], b[t + 4, g])
    if rounded:
        fa = (to_tf32(fa[0]), to_tf32(fa[1]), to_tf32(fa[2]), to_tf32(fa[3]))
        fb = (to_tf32(fb[0]), to_tf32(fb[1]))
    out = mma_tf32(fa, fb, (c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1]))
    d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1] = out


@pytest.mark.parametrize("rounded", [True, False], ids=["to_tf32 first", "raw float32"])
def test_mma_tf32_one_tile_exactly(rounded):
    # A's values have bits below TF32's last place: 1.5 of TF32's units past a whole number of them,
    # so rounding goes up and truncation down. B picks columns (and sums two), C adds integers:
    # every sum is exact, so the result must match the model bit for bit.
    rng = np.random.default_rng(1)
    a = (1 + rng.integers(0, 64, (16, 8)) * 2.0 ** -10 + 3 * 2.0 ** -12).astype(np.float32)
    b = np.eye(8, dtype=np.float32)
    b[0, 5] = 2
    c = rng.integers(-4, 5, (16, 8)).astype(np.float32)
    d = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    _tf32_tile[1, 32](cuda.to_device(a), cuda.to_device(b), cuda.to_device(c), d, rounded)
    model = tc.round_tf32(a) if rounded else tc.truncate_tf32(a)
    np.testing.assert_array_equal(d.copy_to_host(), model.astype(np.float64) @ b + c)


@cuda.jit
def _f16_tile(a, b, c, d, bf16):
    lane = cuda.threadIdx.x
    g, t = lane // 4, lane % 4
    k = 2 * t
    fa = (a[g, k], a[g + 8, k], a[g, k + 8], a[g + 8, k + 8])  # packed pairs, prepared on the host
    fb = (b[k // 2, g], b[k // 2 + 4, g])
    acc = (c[g, 2 * t], c[g, 2 * t + 1], c[g + 8, 2 * t], c[g + 8, 2 * t + 1])
    out = mma_bf16(fa, fb, acc) if bf16 else mma_f16(fa, fb, acc)
    d[g, 2 * t], d[g, 2 * t + 1], d[g + 8, 2 * t], d[g + 8, 2 * t + 1] = out


def _bf16_bits(x):
    return (np.asarray(x, np.float32).view(np.uint32) >> 16).astype(np.uint16)


@pytest.mark.parametrize("kind", ["f16", "bf16"])
def test_mma_16bit_one_tile_exactly(kind):
    rng = np.random.default_rng(2)
    a = rng.integers(-8, 9, (16, 16)).astype(np.float32)
    b = rng.integers(-8, 9, (16, 8)).astype(np.float32)
    c = rng.integers(-100, 101, (16, 8)).astype(np.float32)
    bits = (lambda x: x.astype(np.float16).view(np.uint16)) if kind == "f16" else _bf16_bits
    ab, bb = bits(a).astype(np.uint32), bits(b).astype(np.uint32)
    # registers: A's (row, 2j) and (row, 2j+1) in one word, low half first; B's (2j, n) and (2j+1, n)
    a_packed = np.zeros((16, 16), np.uint32)
    a_packed[:, 0::2] = ab[:, 0::2] | ab[:, 1::2] << 16
    b_packed = (bb[0::2] | bb[1::2] << 16).astype(np.uint32)  # (8, 8): row j holds k = 2j, 2j+1
    d = cuda.to_device(np.full((16, 8), np.nan, np.float32))
    _f16_tile[1, 32](cuda.to_device(a_packed), cuda.to_device(b_packed), cuda.to_device(c), d, kind == "bf16")
    np.testing.assert_array_equal(d.copy_to_host(), a.astype(np.float64) @ b + c)


def _ldmatrix_model(m, trans):
    """Lane L's register from one 8x8 matrix of 16-bit values: row L//4's elements 2(L%4), 2(L%4)+1
    (transposed: column L//4's), the first in the low half."""
    lanes = np.arange(32)
    g, t = lanes // 4, lanes % 4
    m = m.T if trans else m
    return m[g, 2 * t].astype(np.uint32) | m[g, 2 * t + 1].astype(np.uint32) << 16


def _make_ldmatrix_kernel(load, count):
    @cuda.jit
    def kernel(source, out):
        s = cuda.shared.array((4, 8, 8), np.uint16)
        lane = cuda.threadIdx.x
        for i in range(lane, 256, 32):
            s[i // 64, i // 8 % 8, i % 8] = source[i // 64, i // 8 % 8, i % 8]
        cuda.syncthreads()
        regs = load(s, (lane // 8 % count) * 64 + (lane % 8) * 8)  # lane L: row L%8 of matrix L//8
        for r in range(count):
            out[lane, r] = regs[r]
    return kernel


LOADS = {(ldmatrix_x1, 1, False), (ldmatrix_x2, 2, False), (ldmatrix_x4, 4, False),
         (ldmatrix_x1_trans, 1, True), (ldmatrix_x2_trans, 2, True), (ldmatrix_x4_trans, 4, True)}
KERNELS = {(count, trans): _make_ldmatrix_kernel(load, count) for load, count, trans in LOADS}


@pytest.mark.parametrize("count, trans", sorted(KERNELS), ids=lambda v: str(v))
def test_ldmatrix_hands_each_lane_its_pairs(count, trans):
    source = np.arange(256, dtype=np.uint16).reshape(4, 8, 8) * 7 + 1
    out = cuda.to_device(np.zeros((32, count), np.uint32))
    KERNELS[count, trans][1, 32](cuda.to_device(source), out)
    want = np.stack([_ldmatrix_model(source[i], trans) for i in range(count)], axis=1)
    np.testing.assert_array_equal(out.copy_to_host(), want)


@cuda.jit
def _ldmatrix_f32(source, out):
    s = cuda.shared.array(64, np.float32)  # an 8 x 8 tile of floats, 16 bytes = 4 floats a row of a matrix
    lane = cuda.threadIdx.x
    s[lane], s[lane + 32] = source[lane], source[lane + 32]
    cuda.syncthreads()
    regs = ldmatrix_x2(s, (lane % 8) * 8 + (lane // 8 % 2) * 4)  # matrix 0: columns 0-3, matrix 1: 4-7
    out[lane, 0], out[lane, 1] = regs


def test_ldmatrix_on_float32_gives_the_tf32_a_layout():
    source = np.arange(64, dtype=np.float32) + 0.5
    out = cuda.to_device(np.zeros((32, 2), np.uint32))
    _ldmatrix_f32[1, 32](cuda.to_device(source), out)
    lanes = np.arange(32)
    tile = source.reshape(8, 8)
    want = np.stack([tile[lanes // 4, lanes % 4], tile[lanes // 4, lanes % 4 + 4]], axis=1)
    np.testing.assert_array_equal(out.copy_to_host().view(np.float32), want)


@cuda.jit
def _copy_with_tail(source, out, valid_bytes, wait):
    s = cuda.shared.array(128, np.float32)
    lane = cuda.threadIdx.x
    s[lane * 4], s[lane * 4 + 1], s[lane * 4 + 2], s[lane * 4 + 3] = -1.0, -1.0, -1.0, -1.0
    cuda.syncthreads()
    cp_async16(s, lane * 4, source, lane * 4, valid_bytes[lane])
    cp_async_commit()
    if wait:
        cp_async_wait(0)
    for q in range(4):
        out[lane * 4 + q] = s[lane * 4 + q]  # its own chunk: no other thread's copy to wait for


def test_cp_async_copies_and_zero_fills():
    source = np.arange(128, dtype=np.float32) + 1
    valid = (np.arange(32) % 5 * 4).astype(np.int32)  # 0, 4, 8, 12, 16 bytes
    out = cuda.to_device(np.zeros(128, np.float32))
    _copy_with_tail[1, 32](cuda.to_device(source), out, cuda.to_device(valid), True)
    want = np.where(np.arange(128) % 4 < np.repeat(valid // 4, 4), source, 0)
    np.testing.assert_array_equal(out.copy_to_host(), want)


@only_sim
def test_cp_async_without_its_wait_reads_the_stale_tile():
    source = np.arange(128, dtype=np.float32) + 1
    out = cuda.to_device(np.zeros(128, np.float32))
    _copy_with_tail[1, 32](cuda.to_device(source), out, cuda.to_device(np.full(32, 16, np.int32)), False)
    np.testing.assert_array_equal(out.copy_to_host(), -1)


@cuda.jit
def _two_groups(source, out):
    s = cuda.shared.array(8, np.float32)
    if cuda.threadIdx.x == 0:
        s[0], s[4] = -1.0, -1.0
        cp_async16(s, 0, source, 0, 16)
        cp_async_commit()
        cp_async16(s, 4, source, 4, 16)
        cp_async_commit()
        cp_async_wait(1)  # the older group has landed; the newer may not have
        out[0] = s[0]
        cp_async_wait(0)
        out[1], out[2] = s[4], s[7]


def test_cp_async_wait_group_counts_groups():
    out = cuda.to_device(np.zeros(3, np.float32))
    _two_groups[1, 32](cuda.to_device(np.arange(8, dtype=np.float32)), out)
    np.testing.assert_array_equal(out.copy_to_host(), [0, 4, 7])


@cuda.jit
def _mma_in_a_branch(d):
    lane = cuda.threadIdx.x
    if lane < 16:
        zero, nothing = np.uint32(0), np.float32(0)
        out = mma_f16((zero, zero, zero, zero), (zero, zero), (nothing, nothing, nothing, nothing))
        d[lane] = out[0]


@only_sim
def test_a_lane_skipping_an_mma_is_an_error():
    with pytest.raises(RuntimeError, match=r"lane\(s\) 16, 17.*skipped it.*all 32 lanes"):
        _mma_in_a_branch[1, 32](cuda.to_device(np.zeros(32, np.float32)))


@only_sim
def test_a_partial_warp_cannot_mma():
    with pytest.raises(RuntimeError, match="only 16 lanes"):
        _mma_in_a_branch[1, 16](cuda.to_device(np.zeros(32, np.float32)))


@cuda.jit
def _ldmatrix_at(offset, out):
    s = cuda.shared.array(512, np.float16)
    regs = ldmatrix_x1(s, cuda.threadIdx.x * 8 + offset)
    out[cuda.threadIdx.x] = regs[0]


@cuda.jit
def _ldmatrix_global(g, out):
    regs = ldmatrix_x1(g, cuda.threadIdx.x * 8)
    out[cuda.threadIdx.x] = regs[0]


@cuda.jit
def _copy_at(source, shared_offset, source_offset, out):
    s = cuda.shared.array(32, np.float16)
    if cuda.threadIdx.x == 0:
        cp_async16(s, shared_offset, source, source_offset, 16)
        cp_async_wait(0)
        out[0] = s[0]


@only_sim
@pytest.mark.parametrize("offset", range(1, 8))
def test_every_misaligned_offset_is_named(offset):
    # 16 bytes of float16 are 8 elements: any start that is not a multiple of 8 is misaligned, on
    # either side of a cp.async, and for an ldmatrix row
    source, out = cuda.to_device(np.zeros(32, np.float16)), cuda.to_device(np.zeros(1, np.float16))
    with pytest.raises(ValueError, match="misaligned address"):
        _copy_at[1, 32](source, offset, 0, out)
    with pytest.raises(ValueError, match="misaligned address"):
        _copy_at[1, 32](source, 0, offset, out)
    with pytest.raises(ValueError, match="misaligned address"):
        _ldmatrix_at[1, 32](offset, cuda.to_device(np.zeros(32, np.uint32)))


@cuda.jit
def _copy_tail_f16(source, valid_bytes, out):
    s = cuda.shared.array(32 * 8, np.float16)
    lane = cuda.threadIdx.x
    for q in range(8):
        s[lane * 8 + q] = -1.0
    cp_async16(s, lane * 8, source, lane * 8, valid_bytes[lane])
    cp_async_commit()
    cp_async_wait(0)
    for q in range(8):
        out[lane * 8 + q] = s[lane * 8 + q]


def test_cp_async_zero_fills_every_tail_of_halves():
    source = (np.arange(256) % 97 + 1).astype(np.float16)
    valid = (np.arange(32) % 9 * 2).astype(np.int32)  # 0, 2, ..., 16 bytes: 0 to 8 halves
    out = cuda.to_device(np.zeros(256, np.float16))
    _copy_tail_f16[1, 32](cuda.to_device(source), cuda.to_device(valid), out)
    want = np.where(np.arange(256) % 8 < np.repeat(valid // 2, 8), source, 0)
    np.testing.assert_array_equal(out.copy_to_host(), want)


@only_sim
def test_ldmatrix_errors_name_what_a_gpu_would_fault_on():
    out = cuda.to_device(np.zeros(32, np.uint32))
    with pytest.raises(ValueError, match="misaligned address"):
        _ldmatrix_at[1, 32](4, out)
    with pytest.raises(IndexError, match="out of bounds"):
        _ldmatrix_at[1, 32](504, out)
    with pytest.raises(TypeError, match="reads shared memory"):
        _ldmatrix_global[1, 32](cuda.to_device(np.zeros(512, np.float16)), out)


@cuda.jit
def _copy_bytes(n, out):
    s = cuda.shared.array(8, np.float32)
    cp_async16(s, 0, out, 0, n)
    cp_async_wait(0)


@only_sim
def test_cp_async_takes_0_to_16_source_bytes():
    with pytest.raises(ValueError, match="0..16"):
        _copy_bytes[1, 1](17, cuda.to_device(np.zeros(8, np.float32)))


@cuda.jit
def _pack(lo, hi, out):
    i = cuda.threadIdx.x
    out[i] = pack_f16x2(lo[i], hi[i])


def test_pack_f16x2_puts_the_first_value_in_the_low_half():
    lo = np.array([1, -2, 65504, np.inf], np.float16)
    hi = np.array([0.5, 3, -0.0, np.nan], np.float16)
    out = cuda.to_device(np.zeros(4, np.uint32))
    _pack[1, 4](cuda.to_device(lo), cuda.to_device(hi), out)
    got = out.copy_to_host()
    np.testing.assert_array_equal(got & 0xFFFF, lo.view(np.uint16))
    np.testing.assert_array_equal((got >> 16)[:3], hi.view(np.uint16)[:3])
    assert np.isnan(np.uint16(got[3] >> 16).view(np.float16))


@cuda.jit
def _pack_bf16(lo, hi, out):
    i = cuda.threadIdx.x
    out[i] = pack_bf16x2(lo[i], hi[i])


def test_pack_bf16x2_rounds_to_nearest_even_as_to_bf16_does():
    # 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even (1); 1 + 3·2^-8 rounds up to 1 + 2^-6
    lo = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, -3.0e38, np.inf, 1e-40, np.nan], np.float32)
    hi = np.array([-2.5, 65504, 1 + 2.0 ** -9, -np.inf, -0.0, 7], np.float32)
    np.testing.assert_array_equal(tc.from_bf16(tc.to_bf16(lo[:2])), [1, 1 + 2.0 ** -6])
    out = cuda.to_device(np.zeros(len(lo), np.uint32))
    _pack_bf16[1, len(lo)](cuda.to_device(lo), cuda.to_device(hi), out)
    got = out.copy_to_host()
    np.testing.assert_array_equal((got & 0xFFFF)[:5], tc.to_bf16(lo)[:5])
    np.testing.assert_array_equal(got >> 16, tc.to_bf16(hi))
    assert np.isnan(tc.from_bf16(np.uint16(got[5] & 0xFFFF)))
    x = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    assert np.abs(tc.from_bf16(tc.to_bf16(x)) - x).max() <= np.abs(x).max() * 2.0 ** -8


def test_half_a_unit_then_truncation_is_rounding_for_finite_values():
    # chapter 09's TF32 kernel rounds with `bits + 0x1000`, leaving the truncation to the tensor core
    rng = np.random.default_rng(5)
    x = np.concatenate([rng.standard_normal(10000).astype(np.float32) * 10.0 ** rng.integers(-30, 30, 10000),
                        np.array([0, -0.0, 1e-40, 3.3e38], np.float32)]).astype(np.float32)
    added = (x.view(np.uint32) + np.uint32(0x1000)).view(np.float32)
    np.testing.assert_array_equal(tc.truncate_tf32(added).view(np.uint32), tc.round_tf32(x).view(np.uint32))


def test_the_128_byte_swizzle_and_its_descriptor():
    """tensor_cores' models of wgmma's shared layout: the swizzle permutes the 16-byte units of each
    128-byte row by the row's place in its 1024-byte atom, and a descriptor holds what it says."""
    from workbook.tensor_cores import decode_descriptor, shared_descriptor, swizzle128

    for row in range(16):
        units = [(swizzle128(1024 * 3 + 128 * row + 16 * u) - 1024 * 3 - 128 * row) // 16 for u in range(8)]
        assert units == [u ^ (row % 8) for u in range(8)]
    fields = decode_descriptor(shared_descriptor(0x4A40))
    assert fields == {"start": 0x4A40, "leading": 16, "stride": 1024, "base_offset": 0, "layout": 1}
    from workbook.tensor_cores import n_major_descriptor  # V's panels of 64 columns, 16 KB apart

    fields = decode_descriptor(n_major_descriptor(0x8800, 16384))
    assert fields == {"start": 0x8800, "leading": 16384, "stride": 1024, "base_offset": 0, "layout": 1}


def test_wgmma_accumulators_are_mma_c_tiles_side_by_side():
    from workbook.tensor_cores import fragment_coordinates, wgmma_coordinates

    where = wgmma_coordinates()
    assert sorted(map(tuple, where.reshape(-1, 2))) == [(r, c) for r in range(64) for c in range(128)]  # each once
    c = fragment_coordinates("f16")["c"]  # (32 lanes, 4, 2)
    for tid in (0, 37, 127):
        w, lane = tid // 32, tid % 32
        for j in (0, 15):
            np.testing.assert_array_equal(where[tid, 4 * j:4 * j + 4], c[lane] + [16 * w, 8 * j])
