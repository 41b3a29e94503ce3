"""Warp-level intrinsics and bit helpers against hand-computed expectations, on a GPU and in the simulator.

The same file runs in both modes: on a GPU the hardware answers, in the simulator workbook/simulator.py
does, and both must agree with the expectations below. Only what a GPU defines is checked -- no lane
reads another lane that exited or does not exist. Deadlock reports, strict mode and the speed bound are
simulator features and are skipped on a GPU (a deadlocked GPU kernel hangs rather than raising).

Launch shapes are deliberately awkward: n = 100 threads in a block of 128 (a tail warp of 4 live lanes),
blocks of 48 and 96 threads (a partial last warp), lanes that return early in the middle of a warp,
divergent branches with different masks, a 16 x 3 block and a 4 x 2 x 5 block.

    python -m pytest tests/test_warp_intrinsics.py -q           (WORKBOOK_DEVICE=sim or gpu)
"""

import workbook  # first: applies WORKBOOK_DEVICE before numba.cuda is imported

import threading
import time

import numba
import numpy as np
import pytest
from numba import cuda

WARP = 32
FULL_MASK = 0xFFFFFFFF
EVEN_LANES = 0x55555555
ODD_LANES = 0xAAAAAAAA
NOT_WRITTEN = -7  # what an output holds where no thread wrote it

sim_only = pytest.mark.skipif(
    workbook.ON_GPU, reason="simulator feature: on a GPU a deadlock hangs and undefined reads are not flagged"
)


# --------------------------------------------------------------------------------------------------
# Helpers: run a kernel on host arrays, and the plain-Python model the expectations are built from.


def launch(kernel, blocks, threads_per_block, *args):
    """Run kernel[blocks, threads_per_block] on copies of the host arrays in args; return the arrays."""
    on_device = [cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args]
    kernel[blocks, threads_per_block](*on_device)
    cuda.synchronize()
    return [d.copy_to_host() for a, d in zip(args, on_device) if isinstance(a, np.ndarray)]


SUCCESSOR = workbook.device.choose_compiler() == workbook.device.SUCCESSOR  # WORKBOOK_COMPILER


def signed32(bits):
    """A 32-bit lane mask as the compiler returns it from ballot_sync and match_*_sync: numba-cuda's
    signed int32, or numba-cuda-mlir's uint32 (WORKBOOK_COMPILER=numba-cuda-mlir)."""
    return bits if SUCCESSOR else bits - (1 << 32) if bits & 0x80000000 else bits


def live_warps(n, blocks, threads_per_block, exited=None):
    """For every warp of a 1-D launch: {lane: global thread index} of its threads with i < n that did
    not return early (exited[i])."""
    for block in range(blocks):
        for first in range(0, threads_per_block, WARP):
            lanes = {}
            for lane in range(min(WARP, threads_per_block - first)):
                i = block * threads_per_block + first + lane
                if i < n and not (exited is not None and exited[i]):
                    lanes[lane] = i
            yield lanes


def unwritten(size, dtype=np.int64, columns=None):
    shape = size if columns is None else (size, columns)
    return np.full(shape, NOT_WRITTEN, dtype)


# 1-D shapes: (n, blocks, threads_per_block). Tail warps, partial warps, a single thread.
SHAPES_1D = [
    pytest.param(64, 1, 64, id="full-warps"),
    pytest.param(100, 1, 128, id="n100-in-128"),
    pytest.param(1, 1, 32, id="one-thread"),
    pytest.param(48, 1, 48, id="block48"),
    pytest.param(200, 3, 96, id="n200-3x96"),
    pytest.param(70, 2, 48, id="n70-2x48"),
]


# --------------------------------------------------------------------------------------------------
# Votes: ballot_sync, all_sync, any_sync, eq_sync


@cuda.jit
def ballot_kernel(x, out, n):
    i = cuda.grid(1)
    if i >= n or x[i] < 0:  # the tail, and a few lanes in the middle of a warp, leave early
        return
    out[i] = cuda.ballot_sync(FULL_MASK, x[i] % 3 != 0)


@pytest.mark.parametrize("n, blocks, threads_per_block", SHAPES_1D)
def test_ballot_skips_exited_and_missing_lanes(n, blocks, threads_per_block):
    size = blocks * threads_per_block
    x = (np.arange(size, dtype=np.int64) * 7) % 11
    x[5::13] = -1  # these threads return before the ballot
    (out,) = launch(ballot_kernel, blocks, threads_per_block, x, unwritten(size), n)[1:]
    expected = unwritten(size)
    for lanes in live_warps(n, blocks, threads_per_block, exited=x < 0):
        bits = sum(1 << lane for lane, i in lanes.items() if x[i] % 3 != 0)
        for i in lanes.values():
            expected[i] = signed32(bits)
    np.testing.assert_array_equal(out, expected)


def test_ballot_is_a_signed_int32():
    # Every lane votes yes: bit 31 is set, so numba's int32 result is -1, not 0xFFFFFFFF (the
    # successor's uint32 is 0xFFFFFFFF).
    x = np.ones(WARP, np.int64)
    (out,) = launch(ballot_kernel, 1, WARP, x, unwritten(WARP), WARP)[1:]
    assert (out == signed32(FULL_MASK)).all()


@cuda.jit
def shifted_ballot_kernel(out):
    i = cuda.grid(1)
    mask = cuda.ballot_sync(FULL_MASK, True)
    out[i, 0] = mask >> 31  # an arithmetic shift of a signed mask, a logical one of an unsigned
    out[i, 1] = cuda.popc(np.uint64(7)) + cuda.ffs(np.uint32(8)) * 10


@pytest.mark.skipif(workbook.ON_GPU, reason="the simulator's model of the two compilers' types")
@pytest.mark.parametrize("successor, shifted", [(False, -1), (True, 1)])
def test_the_simulator_gives_the_types_of_the_compiler_chosen(monkeypatch, successor, shifted):
    """numba-cuda's ballot is an int32 (bit 31 set: negative), numba-cuda-mlir's a uint32; the
    successor's popc and ffs are int32 (WORKBOOK_COMPILER=numba-cuda-mlir)."""
    from workbook.simulator import collectives

    monkeypatch.setattr(collectives, "SUCCESSOR_TYPES", successor)
    out = cuda.to_device(np.zeros((WARP, 2), np.int64))
    shifted_ballot_kernel[1, WARP](out)
    np.testing.assert_array_equal(out.copy_to_host(), [[shifted, 3 + 4 * 10]] * WARP)
    seen = []
    monkeypatch.setenv("WORKBOOK_COMPILE", "0")  # a kernel that reads Python's types runs in the simulator only

    @cuda.jit
    def types_kernel(out):
        seen.append((type(cuda.popc(np.uint64(7))), type(cuda.ffs(np.uint32(8)))))

    types_kernel[1, 1](out)
    expected = (np.int32, np.int32) if successor else (np.uint64, np.uint32)
    assert seen == [expected]


@cuda.jit
def divergent_ballot_kernel(x, out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    if cuda.laneid % 2 == 0:
        out[i] = cuda.ballot_sync(EVEN_LANES, x[i] > 0)
    else:
        out[i] = cuda.ballot_sync(ODD_LANES, x[i] > 0)


@pytest.mark.parametrize("n", [64, 45, 3])
def test_divergent_ballots_with_different_masks(n):
    x = np.array([(i * 5) % 3 for i in range(64)], np.int64)
    (out,) = launch(divergent_ballot_kernel, 1, 64, x, unwritten(64), n)[1:]
    expected = unwritten(64)
    for lanes in live_warps(n, 1, 64):
        for parity in (0, 1):
            bits = sum(1 << lane for lane, i in lanes.items() if lane % 2 == parity and x[i] > 0)
            for lane, i in lanes.items():
                if lane % 2 == parity:
                    expected[i] = signed32(bits)
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def votes_kernel(x, out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    out[i, 0] = cuda.all_sync(FULL_MASK, x[i] != 0)
    out[i, 1] = cuda.any_sync(FULL_MASK, x[i] != 0)
    out[i, 2] = cuda.eq_sync(FULL_MASK, x[i] != 0)


VOTE_INPUTS = {
    "all-yes": lambda i: 1,
    "all-no": lambda i: 0,
    "one-no": lambda i: 0 if i % WARP == 3 else 1,
    "one-yes": lambda i: 1 if i % WARP == 2 else 0,
    "alternating": lambda i: i % 2,
}


@pytest.mark.parametrize("pattern", VOTE_INPUTS)
@pytest.mark.parametrize("n, blocks, threads_per_block", SHAPES_1D)
def test_all_any_eq_sync(pattern, n, blocks, threads_per_block):
    size = blocks * threads_per_block
    x = np.array([VOTE_INPUTS[pattern](i) for i in range(size)], np.int64)
    (out,) = launch(votes_kernel, blocks, threads_per_block, x, unwritten(size, columns=3), n)[1:]
    expected = unwritten(size, columns=3)
    for lanes in live_warps(n, blocks, threads_per_block):
        votes = [x[i] != 0 for i in lanes.values()]
        for i in lanes.values():
            expected[i] = (all(votes), any(votes), all(votes) or not any(votes))
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------------------------------
# Shuffles


@cuda.jit
def shuffle_kernel(x, out, mode, operand):
    i = cuda.grid(1)
    if mode == 0:
        out[i] = cuda.shfl_sync(FULL_MASK, x[i], operand)
    elif mode == 1:
        out[i] = cuda.shfl_up_sync(FULL_MASK, x[i], operand)
    elif mode == 2:
        out[i] = cuda.shfl_down_sync(FULL_MASK, x[i], operand)
    else:
        out[i] = cuda.shfl_xor_sync(FULL_MASK, x[i], operand)


def source_lane(mode, lane, operand):
    """The lane a shuffle reads on the hardware: only the operand's low 5 bits count, and up/down past
    the edge of the warp read the caller's own value."""
    b = operand & 31
    if mode == "shfl_sync":
        return b
    if mode == "shfl_up_sync":
        return lane - b if lane - b >= 0 else lane
    if mode == "shfl_down_sync":
        return lane + b if lane + b < WARP else lane
    return lane ^ b


SHUFFLE_MODES = ["shfl_sync", "shfl_up_sync", "shfl_down_sync", "shfl_xor_sync"]
SHUFFLE_CASES = (
    [("shfl_sync", s) for s in (0, 5, 31, 32, 33, 63, -1)]
    + [("shfl_up_sync", d) for d in (0, 1, 5, 31, 32, 33)]
    + [("shfl_down_sync", d) for d in (0, 1, 5, 31, 32, 33)]
    + [("shfl_xor_sync", m) for m in (1, 16, 31, 32, 33)]
)
SHUFFLE_VALUES = {  # distinct per thread, and for 64-bit types distinct in both 32-bit halves
    np.int32: lambda i: i * 1000 - 7,
    np.int64: lambda i: i * (2**33 + 5) - 2**40,
    np.float32: lambda i: i * 0.5 - 3.25,
    np.float64: lambda i: i * 1.5e10 + 0.125,
}


@pytest.mark.parametrize("dtype", list(SHUFFLE_VALUES), ids=lambda t: t.__name__)
@pytest.mark.parametrize("mode, operand", SHUFFLE_CASES)
def test_shuffle_lanes_and_out_of_range(mode, operand, dtype):
    size = 2 * WARP
    x = np.array([SHUFFLE_VALUES[dtype](i) for i in range(size)], dtype)
    (out,) = launch(shuffle_kernel, 1, size, x, np.zeros(size, dtype), SHUFFLE_MODES.index(mode), operand)[1:]
    expected = np.array([x[(i // WARP) * WARP + source_lane(mode, i % WARP, operand)] for i in range(size)], dtype)
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def warp_sum_kernel(x, out):
    i = cuda.grid(1)
    total = x[i]
    for offset in (16, 8, 4, 2, 1):  # butterfly: after 5 steps every lane holds the warp's sum
        total += cuda.shfl_xor_sync(FULL_MASK, total, offset)
    out[i, 0] = total
    partial = x[i]
    for offset in (16, 8, 4, 2, 1):  # tree: lane 0 ends with the sum
        partial += cuda.shfl_down_sync(FULL_MASK, partial, offset)
    out[i, 1] = partial


def test_warp_sum_reductions():
    x = np.arange(4 * WARP, dtype=np.float32) % 10  # small integers: float32 sums are exact
    (out,) = launch(warp_sum_kernel, 2, 2 * WARP, x, np.zeros((4 * WARP, 2), np.float32))[1:]
    sums = x.reshape(-1, WARP).sum(axis=1)
    np.testing.assert_array_equal(out[:, 0], np.repeat(sums, WARP))
    np.testing.assert_array_equal(out[::WARP, 1], sums)


@cuda.jit
def tail_shuffle_kernel(x, out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    # The 4 live lanes of the tail warp pass values among themselves only.
    out[i, 0] = cuda.shfl_sync(FULL_MASK, x[i], 3 - cuda.laneid % 4)
    out[i, 1] = cuda.shfl_up_sync(FULL_MASK, x[i], 1)


def test_shuffles_among_live_lanes_of_a_tail_warp():
    n, size = 100, 128
    x = np.arange(size, dtype=np.int64) * 10
    (out,) = launch(tail_shuffle_kernel, 1, size, x, unwritten(size, columns=2), n)[1:]
    for i in range(96, 100):  # the tail warp: lanes 0-3
        lane = i % WARP
        assert out[i, 0] == x[96 + 3 - lane % 4]
        assert out[i, 1] == x[i - 1 if lane > 0 else i]
    assert (out[n:] == NOT_WRITTEN).all()


# --------------------------------------------------------------------------------------------------
# 2-D and 3-D blocks: lanes follow the linear index x + y*bx + z*bx*by


@cuda.jit
def block_shape_kernel(out):
    bx, by = cuda.blockDim.x, cuda.blockDim.y
    t = cuda.threadIdx.x + cuda.threadIdx.y * bx + cuda.threadIdx.z * bx * by
    n_threads = bx * by * cuda.blockDim.z
    lanes_in_my_warp = min(WARP, n_threads - (t // WARP) * WARP)
    lane = cuda.laneid
    out[t, 0] = lane
    out[t, 1] = cuda.warpsize
    out[t, 2] = cuda.lanemask_lt()
    out[t, 3] = cuda.ballot_sync(FULL_MASK, cuda.threadIdx.y % 2 == 0 and cuda.threadIdx.z != 1)
    out[t, 4] = cuda.shfl_sync(FULL_MASK, t * 10, (lane + 1) % lanes_in_my_warp)  # rotate within the warp
    out[t, 5] = cuda.shfl_up_sync(FULL_MASK, t * 10, 1)
    out[t, 6] = cuda.activemask()


BLOCK_SHAPES = [(16, 3, 1), (4, 2, 5), (8, 8, 1), (33, 1, 1), (2, 3, 4)]


@pytest.mark.parametrize("shape", BLOCK_SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_2d_and_3d_blocks(shape):
    bx, by, bz = shape
    n_threads = bx * by * bz
    (out,) = launch(block_shape_kernel, 1, shape, unwritten(n_threads, columns=7))
    threads = [(x, y, z) for z in range(bz) for y in range(by) for x in range(bx)]  # linear order
    for t, (x, y, z) in enumerate(threads):
        lane, first = t % WARP, (t // WARP) * WARP
        lanes_in_warp = min(WARP, n_threads - first)
        voters = [first + k for k in range(lanes_in_warp) if threads[first + k][1] % 2 == 0 and threads[first + k][2] != 1]
        expected = [
            lane,
            WARP,
            (1 << lane) - 1,
            signed32(sum(1 << (v - first) for v in voters)),
            (first + (lane + 1) % lanes_in_warp) * 10,
            (t - 1 if lane > 0 else t) * 10,
            (1 << lanes_in_warp) - 1,
        ]
        assert list(out[t]) == expected, f"thread {(x, y, z)} (linear {t})"


# --------------------------------------------------------------------------------------------------
# match_any_sync, match_all_sync


@cuda.jit
def match_kernel(x, out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    out[i, 0] = cuda.match_any_sync(FULL_MASK, x[i])
    mask, all_equal = cuda.match_all_sync(FULL_MASK, x[i])
    out[i, 1] = mask
    out[i, 2] = all_equal


def bits_of(value):
    """match_* compare bit patterns (0.0 and -0.0 differ); value is a numpy scalar."""
    return value.tobytes()


MATCH_INPUTS = {
    "lane-mod-3": (np.int32, lambda i: (i % WARP) % 3),
    "int64-halves": (np.int64, lambda i: (i % 2) << 32),  # equal low halves, different high halves
    "all-equal": (np.int64, lambda i: -5),
    "one-differs": (np.int32, lambda i: 7 if i % WARP == 30 else 1),
    "signed-zeros": (np.float64, lambda i: -0.0 if i % 4 == 1 else 0.0),
    "float32": (np.float32, lambda i: float(i % 5 == 0)),
}


@pytest.mark.parametrize("n, blocks, threads_per_block", [(64, 1, 64), (100, 1, 128), (40, 1, 48)])
@pytest.mark.parametrize("pattern", MATCH_INPUTS)
def test_match_any_and_match_all(pattern, n, blocks, threads_per_block):
    dtype, value = MATCH_INPUTS[pattern]
    size = blocks * threads_per_block
    x = np.array([value(i) for i in range(size)], dtype)
    (out,) = launch(match_kernel, blocks, threads_per_block, x, unwritten(size, columns=3), n)[1:]
    expected = unwritten(size, columns=3)
    for lanes in live_warps(n, blocks, threads_per_block):
        live_bits = sum(1 << lane for lane in lanes)
        uniform = len({bits_of(x[i]) for i in lanes.values()}) == 1
        for i in lanes.values():
            same = sum(1 << lane for lane, j in lanes.items() if bits_of(x[j]) == bits_of(x[i]))
            expected[i] = (signed32(same), signed32(live_bits) if uniform else 0, uniform)
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------------------------------
# activemask, syncwarp


@cuda.jit
def activemask_kernel(out, n, modulus):
    i = cuda.grid(1)
    if i >= n:
        return
    if cuda.laneid % modulus == 0:  # one branch only, so the compiler cannot merge two calls
        out[i] = cuda.activemask()


@pytest.mark.parametrize("modulus", [1, 2, 3], ids=["no-branch", "even-lanes", "every-third-lane"])
@pytest.mark.parametrize("n, blocks, threads_per_block", [(64, 1, 64), (100, 1, 128), (70, 2, 48)])
def test_activemask_is_the_converged_lanes(modulus, n, blocks, threads_per_block):
    size = blocks * threads_per_block
    (out,) = launch(activemask_kernel, blocks, threads_per_block, unwritten(size), n, modulus)
    expected = unwritten(size)
    for lanes in live_warps(n, blocks, threads_per_block):
        taken = {lane: i for lane, i in lanes.items() if lane % modulus == 0}
        for i in taken.values():
            expected[i] = sum(1 << lane for lane in taken)  # a uint32: never negative
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def syncwarp_exchange_kernel(out, n):
    buffer = cuda.shared.array(128, numba.int64)
    t = cuda.threadIdx.x
    i = cuda.grid(1)
    if i >= n:
        return
    buffer[t] = i * 10
    cuda.syncwarp(FULL_MASK)  # exited lanes are skipped, so the tail warp does not wait for them
    if i ^ 1 < n:
        out[i, 0] = buffer[t ^ 1]  # the neighbour's write is visible after syncwarp
    cuda.syncwarp()
    buffer[t] = -i  # no neighbour can still be reading the old value
    cuda.syncwarp(FULL_MASK)
    if i ^ 1 < n:
        out[i, 1] = buffer[t ^ 1]


@pytest.mark.parametrize("n, blocks, threads_per_block", [(128, 1, 128), (100, 1, 128), (75, 2, 48)])
def test_syncwarp_orders_shared_memory(n, blocks, threads_per_block):
    size = blocks * threads_per_block
    (out,) = launch(syncwarp_exchange_kernel, blocks, threads_per_block, unwritten(size, columns=2), n)
    expected = unwritten(size, columns=2)
    for i in range(n):
        if i ^ 1 < n:
            expected[i] = ((i ^ 1) * 10, -(i ^ 1))
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------------------------------
# popc, clz, ffs, brev on negative and 64-bit values. numba types a Python int as int64; brev has only
# uint32 and uint64 versions, and numba converts every other integer -- int64 too -- to uint32.


@cuda.jit
def bit_ops_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i, 0] = cuda.popc(x[i])
        out[i, 1] = cuda.clz(x[i])
        out[i, 2] = cuda.ffs(x[i])
        out[i, 3] = cuda.brev(x[i])


BIT_CASES = {  # dtype: [(value, popc, clz, ffs, brev)], worked out by hand
    np.int32: [
        (-1, 32, 0, 1, 0xFFFFFFFF),
        (-2, 31, 0, 2, 0x7FFFFFFF),
        (1, 1, 31, 1, 0x80000000),
        (0, 0, 32, 0, 0),
        (-(2**31), 1, 0, 32, 1),
        (0xF0, 4, 24, 5, 0x0F000000),
    ],
    np.uint32: [
        (0xFFFFFFFF, 32, 0, 1, 0xFFFFFFFF),
        (1, 1, 31, 1, 0x80000000),
        (0, 0, 32, 0, 0),
        (0x80000000, 1, 0, 32, 1),
        (0xF0, 4, 24, 5, 0x0F000000),
    ],
    np.int64: [  # brev: the low 32 bits, reversed as a uint32
        (-1, 64, 0, 1, 0xFFFFFFFF),
        (-2, 63, 0, 2, 0x7FFFFFFF),
        (1, 1, 63, 1, 0x80000000),
        (0, 0, 64, 0, 0),
        (-(2**63), 1, 0, 64, 0),
        (0xF0, 4, 56, 5, 0x0F000000),
        (1 << 32, 1, 31, 33, 0),
    ],
    np.uint64: [
        (2**64 - 1, 64, 0, 1, 2**64 - 1),
        (1, 1, 63, 1, 1 << 63),
        (0, 0, 64, 0, 0),
        (1 << 63, 1, 0, 64, 1),
        (0xF0, 4, 56, 5, 0x0F00000000000000),
        (1 << 32, 1, 31, 33, 1 << 31),
    ],
}


@pytest.mark.parametrize("dtype", list(BIT_CASES), ids=lambda t: t.__name__)
def test_popc_clz_ffs_brev(dtype):
    cases = BIT_CASES[dtype]
    x = np.array([value for value, *_ in cases], dtype)
    (out,) = launch(bit_ops_kernel, 1, 32, x, np.zeros((len(cases), 4), np.uint64))[1:]
    expected = np.array([results for _, *results in cases], np.uint64)
    np.testing.assert_array_equal(out, expected)


@cuda.jit
def python_int_bit_ops_kernel(out, value):
    # A literal and a plain Python int argument are both int64 to numba.
    out[0] = cuda.popc(-1)
    out[1] = cuda.clz(1)
    out[2] = cuda.ffs(-8)
    out[3] = cuda.brev(1)
    out[4] = cuda.brev(-2)  # int64 -> uint32 0xFFFFFFFE -> 0x7FFFFFFF
    out[5] = cuda.popc(value)
    out[6] = cuda.clz(value)
    out[7] = cuda.ffs(value)


def test_bit_ops_on_python_ints_are_64_bit():
    (out,) = launch(python_int_bit_ops_kernel, 1, 1, np.zeros(8, np.int64), -(2**40))
    np.testing.assert_array_equal(out, [64, 63, 4, 0x80000000, 0x7FFFFFFF, 24, 0, 41])


# --------------------------------------------------------------------------------------------------
# syncthreads still works with warp collectives, and exited threads do not hold it up (sm_70+).


@cuda.jit
def block_votes_kernel(x, out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    # numba's syncthreads_count/and/or take an integer predicate (not a bool): nonzero means true.
    out[i, 0] = cuda.syncthreads_count(x[i])
    out[i, 1] = cuda.syncthreads_and(x[i])
    out[i, 2] = cuda.syncthreads_or(x[i])
    cuda.syncthreads()
    out[i, 3] = cuda.ballot_sync(FULL_MASK, x[i] != 0)


@pytest.mark.parametrize("fill", ["mixed", "all-positive", "all-zero"])
@pytest.mark.parametrize("n, blocks, threads_per_block", [(128, 1, 128), (100, 1, 128), (70, 2, 48)])
def test_syncthreads_predicates_count_live_threads(fill, n, blocks, threads_per_block):
    size = blocks * threads_per_block
    x = {"mixed": np.arange(size) % 4, "all-positive": np.ones(size), "all-zero": np.zeros(size)}[fill].astype(np.int64)
    (out,) = launch(block_votes_kernel, blocks, threads_per_block, x, unwritten(size, columns=4), n)[1:]
    expected = unwritten(size, columns=4)
    for block in range(blocks):
        live = [i for i in range(block * threads_per_block, (block + 1) * threads_per_block) if i < n]
        count = sum(1 for i in live if x[i] != 0)
        for i in live:
            expected[i, :3] = (count, int(count == len(live)), int(count > 0))
    for lanes in live_warps(n, blocks, threads_per_block):
        for i in lanes.values():
            expected[i, 3] = signed32(sum(1 << lane for lane, j in lanes.items() if x[j] != 0))
    np.testing.assert_array_equal(out, expected)


# --------------------------------------------------------------------------------------------------
# Operand types numba refuses on a GPU are refused by the simulator too.


@cuda.jit
def shuffle_a_uint32_kernel(out):
    i = cuda.grid(1)
    out[i] = cuda.shfl_sync(FULL_MASK, cuda.activemask(), 0)  # activemask() is a uint32: not shuffleable


@cuda.jit
def bool_block_predicate_kernel(x, out):
    i = cuda.grid(1)
    out[i] = cuda.syncthreads_count(x[i] > 0)  # a bool: numba wants an integer here


@pytest.mark.parametrize(
    "kernel, args, op",
    [
        (shuffle_a_uint32_kernel, (np.zeros(WARP, np.int64),), "shfl_sync"),
        (bool_block_predicate_kernel, (np.ones(WARP, np.int64), np.zeros(WARP, np.int64)), "syncthreads_count"),
    ],
    ids=["shfl-of-uint32", "syncthreads_count-of-bool"],
)
def test_operand_types_a_gpu_rejects(kernel, args, op):
    with pytest.raises(Exception, match=op):  # a TypingError at compile time on a GPU, a TypeError here
        launch(kernel, 1, WARP, *args)


# --------------------------------------------------------------------------------------------------
# Simulator only: deadlock reports, strict mode, errors, speed.


def run_with_deadline(seconds, work):
    """Run work() in a helper thread; fail the test if it is still running after `seconds` (a hang)."""
    outcome = {}

    def target():
        try:
            work()
        except BaseException as error:  # noqa: B036  (handed back to the test)
            outcome["error"] = error

    helper = threading.Thread(target=target, daemon=True)
    started = time.perf_counter()
    helper.start()
    helper.join(seconds)
    assert not helper.is_alive(), f"still running after {seconds} s: the simulator hung instead of reporting"
    return outcome.get("error"), time.perf_counter() - started


@cuda.jit
def divergent_collectives_kernel(out):
    i = cuda.grid(1)
    if cuda.blockIdx.x == 1 and cuda.laneid < 16:
        out[i] = cuda.shfl_sync(FULL_MASK, i, 0)  # waits for lanes 16-31 ...
    else:
        out[i] = cuda.ballot_sync(FULL_MASK, True)  # ... which wait in a different collective


@sim_only
def test_divergent_collectives_are_reported_not_hung():
    from workbook.simulator import WarpDeadlockError

    error, seconds = run_with_deadline(10, lambda: launch(divergent_collectives_kernel, 2, 32, np.zeros(64, np.int64)))
    assert isinstance(error, WarpDeadlockError), error
    message = str(error)
    assert "divergent_collectives_kernel" in message
    assert "block (1, 0, 0)" in message
    assert "lanes 0-15 wait in shfl_sync(mask=0xffffffff) for lanes 16-31" in message
    assert "lanes 16-31 wait in ballot_sync(mask=0xffffffff) for lanes 0-15" in message
    assert seconds < 5


@cuda.jit
def syncthreads_in_one_lane_kernel(out):
    i = cuda.grid(1)
    if cuda.laneid == 0:
        cuda.syncthreads()  # lane 0 waits for the block; the rest of its warp waits for lane 0
    else:
        out[i] = cuda.shfl_down_sync(FULL_MASK, i, 1)


@sim_only
def test_syncthreads_against_a_shuffle_is_reported():
    from workbook.simulator import WarpDeadlockError

    error, seconds = run_with_deadline(10, lambda: launch(syncthreads_in_one_lane_kernel, 1, 64, np.zeros(64, np.int64)))
    assert isinstance(error, WarpDeadlockError), error
    message = str(error)
    assert "syncthreads_in_one_lane_kernel" in message and "block (0, 0, 0)" in message
    assert "warp 0: lane 0 waits in syncthreads()" in message
    assert "warp 1: lanes 1-31 wait in shfl_down_sync(mask=0xffffffff) for lane 0," in message
    assert seconds < 5


@cuda.jit
def read_exited_lane_kernel(out, n):
    i = cuda.grid(1)
    if i >= n:
        return
    out[i] = cuda.shfl_down_sync(FULL_MASK, i * 10, 2)  # lanes 2 and 3 of the tail warp read lanes 4 and 5


@sim_only
def test_reading_an_exited_lane_gives_own_value_or_strict_error(monkeypatch):
    from workbook.simulator import StrictModeError

    monkeypatch.delenv("WORKBOOK_SIM_STRICT", raising=False)
    (out,) = launch(read_exited_lane_kernel, 1, 128, unwritten(128), 100)
    assert list(out[96:100]) == [980, 990, 980, 990]  # lanes 2, 3 get their own value back

    monkeypatch.setenv("WORKBOOK_SIM_STRICT", "1")
    # Lanes 2 and 3 both fail; whichever reports first is raised.
    with pytest.raises(StrictModeError, match=r"lane ([23]) of warp 3 reads lane ([45]) .* lane \2 has exited"):
        launch(read_exited_lane_kernel, 1, 128, unwritten(128), 100)


@cuda.jit
def mask_without_own_lane_kernel(out):
    i = cuda.grid(1)
    out[i] = cuda.ballot_sync(0x1, True)  # lane 1 is not in its own mask


@sim_only
def test_strict_mode_rejects_a_mask_without_the_caller(monkeypatch):
    from workbook.simulator import StrictModeError

    monkeypatch.setenv("WORKBOOK_SIM_STRICT", "1")
    with pytest.raises(StrictModeError, match="lane 1 of warp 0 calls ballot_sync"):
        launch(mask_without_own_lane_kernel, 1, 2, np.zeros(2, np.int64))


@cuda.jit
def failing_lane_kernel(out):
    i = cuda.grid(1)
    if i == 5:
        raise ValueError("lane 5 gives up")
    out[i] = cuda.ballot_sync(FULL_MASK, True)  # the others would wait for lane 5 forever


@sim_only
def test_an_exception_in_one_lane_is_raised_not_hung():
    error, seconds = run_with_deadline(10, lambda: launch(failing_lane_kernel, 1, 32, np.zeros(32, np.int64)))
    assert isinstance(error, ValueError) and "lane 5 gives up" in str(error) and "tid=[5, 0, 0]" in str(error)
    assert seconds < 5


@cuda.jit
def lock_held_across_a_shuffle_kernel(lock, total):
    i = cuda.threadIdx.x
    if i == 0:  # takes the lock, then meets lane 1 in a shuffle while holding it
        while cuda.atomic.cas(lock, 0, 0, 1) != 0:
            pass
    partner = cuda.shfl_sync(0x3, i + 1, i ^ 1)
    if i == 1:  # spins on the lock lane 0 holds
        while cuda.atomic.cas(lock, 0, 0, 1) != 0:
            pass
    total[0] += partner
    cuda.threadfence()
    cuda.atomic.exch(lock, 0, 0)


@sim_only
def test_a_thread_spinning_on_a_lock_lets_its_holder_run():
    # The threads of a block take turns in one OS thread: lane 1, spinning on cuda.atomic.cas, must
    # give way to lane 0 (which holds the lock) or it would spin forever.
    out = []
    error, seconds = run_with_deadline(10, lambda: out.extend(
        launch(lock_held_across_a_shuffle_kernel, 1, 2, np.zeros(1, np.int32), np.zeros(1, np.int64))))
    assert error is None, error
    lock, total = out
    assert list(lock) == [0] and list(total) == [3]  # lane 0 added 2 (lane 1's i + 1), lane 1 added 1
    assert seconds < 5


@sim_only
def test_install_is_idempotent():
    from workbook import simulator

    simulator.install()
    simulator.install()
    (out,) = launch(ballot_kernel, 1, WARP, np.ones(WARP, np.int64), unwritten(WARP), WARP)[1:]
    assert (out == signed32(FULL_MASK)).all()


@cuda.jit
def ballot_and_warp_sum_kernel(x, out):
    i = cuda.grid(1)
    votes = cuda.ballot_sync(FULL_MASK, x[i] > 0)
    total = x[i]
    for offset in (16, 8, 4, 2, 1):
        total += cuda.shfl_xor_sync(FULL_MASK, total, offset)
    out[i] = total + cuda.popc(votes)


@sim_only
def test_speed_of_4096_threads_with_collectives():
    blocks, threads_per_block = 16, 256
    x = np.arange(blocks * threads_per_block, dtype=np.int64) % 3
    started = time.perf_counter()
    (out,) = launch(ballot_and_warp_sum_kernel, blocks, threads_per_block, x, np.zeros_like(x))[1:]
    seconds = time.perf_counter() - started
    per_warp = x.reshape(-1, WARP)
    expected = np.repeat(per_warp.sum(axis=1) + (per_warp > 0).sum(axis=1), WARP)
    np.testing.assert_array_equal(out, expected)
    print(f"\n4096 threads, ballot + 5 shuffles: {seconds:.2f} s")
    assert seconds < 20


@cuda.jit
def _write_block_index(out):
    out[cuda.grid(1)] = cuda.blockIdx.x + 1


def test_launch_configurations_kept_for_later_are_independent():
    # On a GPU kernel[grid, block] returns a new launcher; the simulator must not share one.
    small, large = _write_block_index[1, 4], _write_block_index[2, 4]
    out_small, out_large = cuda.to_device(np.zeros(8, np.int32)), cuda.to_device(np.zeros(8, np.int32))
    small(out_small)
    large(out_large)
    assert list(out_small.copy_to_host()) == [1, 1, 1, 1, 0, 0, 0, 0]
    assert list(out_large.copy_to_host()) == [1, 1, 1, 1, 2, 2, 2, 2]


_FAILING_LAUNCH = """
import workbook
import numpy as np
from numba import cuda

@cuda.jit
def first_thread_raises(out):
    if cuda.grid(1) < out.size:  # a stub behind a bounds check: only thread 0 raises
        raise NotImplementedError("a student's stub")

try:
    first_thread_raises[2, 1024](cuda.device_array(1, np.float32))
except NotImplementedError as error:
    print("raised:", error)
"""


@sim_only
def test_a_failing_first_launch_raises_instead_of_hanging():
    # The first launch of a process meets an empty thread pool: every simulated thread is new. When
    # thread 0 raises (a stub's NotImplementedError) before the others are assigned, the launch must
    # end with the error. It once hung here (a new thread had no `waiting_in` for the failure handler
    # to read), and only in a fresh process, which is why this runs in one.
    import os
    import subprocess
    import sys

    env = dict(os.environ, WORKBOOK_DEVICE="sim", WORKBOOK_COMPILE="0")
    result = subprocess.run([sys.executable, "-c", _FAILING_LAUNCH], capture_output=True, text=True,
                            timeout=120, env=env, cwd=os.path.dirname(os.path.dirname(__file__)))
    assert result.returncode == 0, result.stderr
    assert "raised:" in result.stdout and "a student's stub" in result.stdout
    assert "Exception in thread" not in result.stderr, result.stderr


# numba-cuda's own warp-operation suite, run in this simulator. Its tests of what the compiler emits
# (the LLVM IR's constant mode, PTX for sm_100, typing errors raised when a signature is given and
# nothing is launched) are about code generation, which the simulator leaves to the real compiler
# (workbook/compiler.py, at each launch); every test of what the operations do runs here.
NUMBA_CODEGEN_TESTS = {"test_shfl_sync_const_mode_val", "test_shfl_sync_const_mode_val_sm100",
                       "test_vote_sync_const_mode_val", "test_vote_sync_const_mode_val_sm100",
                       "test_vote_sync_type_validation"}


def numba_warp_tests():
    from numba.cuda.tests.cudapy import test_warp_ops

    suite = test_warp_ops.TestCudaWarpOperations
    return suite, sorted(name for name in dir(suite) if name.startswith("test_") and name not in NUMBA_CODEGEN_TESTS)


@pytest.mark.parametrize("name", numba_warp_tests()[1])
def test_numba_cudas_warp_operation_suite(name):
    """Each behavioural test of numba-cuda's test_warp_ops.py (skipped there on its simulator) gives
    here what it gives on a GPU: shuffles of declared int32 and int64 arguments included."""
    import unittest

    suite, _ = numba_warp_tests()
    here = type("InThisSimulator", (suite,), {"__unittest_skip__": False})  # numba-cuda skips it on its simulator
    case = here(name)
    result = unittest.TestResult()
    case.run(result)
    problems = [text for _, text in result.errors + result.failures]
    assert not problems and not result.skipped, "\n".join(problems) or str(result.skipped)
