"""Chapter 02's kernels: dropout, y = x * keep / (1 - p), and its backward, dx = dy * keep / (1 - p).

    naive          numba's xoroshiro128p, one state per thread in global memory, one draw per
                   element, a byte (uint8) of mask per element -- what torch's native_dropout stores
    bitmask        Philox4x32-10 (stateless, one call = four elements), the mask packed 32 to a word
                   with warp shuffles, 16-byte loads and stores
    seed-only      the same forward without a mask; the backward regenerates the mask from
                   (seed, offset) instead of reading it

Which random number belongs to which element is fixed, independent of the launch and the device:

    element i  ->  Philox4x32-10(counter = (i // 4, offset), key = seed), output word i % 4
    keep[i]    =   that word >= threshold,  threshold = ceil(p * 2^32)   (p = 0: all kept, p = 1: none)

so keep_reference() in NumPy reproduces every mask exactly, and a call with (seed, offset) gives the
same mask on any GPU, any grid, and in the simulator. Successive calls take successive offsets
(PhiloxDropout below), so no two calls ever share a counter, hence never a random number.

Every kernel here is what the chapter shows and what tests/test_ch02_dropout.py tests.
"""

import math
from functools import lru_cache

import numpy as np
from numba import cuda
from numba.cuda.random import xoroshiro128p_dtype, xoroshiro128p_uniform_float32

import workbook
from workbook.inputs import empty_like_input, is_torch_tensor, require, sm_count
from workbook.launch import LaunchCache, PreparedLaunch, TensorCalls, cdiv

from .philox import philox4x32, philox4x32_reference
from workbook.memory import aligned, load4, store4

THREADS_PER_BLOCK = 256
# How many blocks: "data" gives every thread exactly one quad (4 elements), the way torch's
# elementwise kernels are launched; an int launches that many blocks per SM and loops (grid-stride).
# 8 blocks of 256 threads fill a Hopper SM (2048 threads; the kernels use <= 32 registers). On the
# H100 each step to a larger grid was faster, and one quad per thread fastest of all: the block
# scheduler balances the work across 132 SMs better than a fixed share per thread (see the
# chapter's grid-size tables).
BLOCKS_PER_SM = "data"
NAIVE_BLOCKS_PER_SM = 8  # the naive grid: one xoroshiro state per resident thread
FULL_MASK = 0xFFFFFFFF
MASK32 = np.uint64(0xFFFFFFFF)
SHIFT32 = np.uint64(32)
DTYPES = (np.float32, np.float16)

if not workbook.ON_GPU:
    import warnings

    # In the simulator xoroshiro128p runs on NumPy uint64 scalars, whose wrap-around (intended, as
    # on the GPU) NumPy reports as an overflow.
    warnings.filterwarnings("ignore", message="overflow encountered in scalar", category=RuntimeWarning)


# ---------------------------------------------------------------------------------------------
# References (NumPy): the mask bit for bit, then dropout on top of it.


def threshold_for(p):
    """keep iff a uint32 random word >= ceil(p * 2^32): P(keep) = 1 - p to within 2^-32.

    An integer compare, exact at both ends: p = 0 gives 0 (every word passes), p = 1 gives 2^32
    (no uint32 does). That is why it is a uint64."""
    return np.uint64(min(2**32, math.ceil(p * 2**32)))


def scale_for(p):
    """1 / (1 - p) as float32; 0 for p = 1, where nothing is kept (no division by zero)."""
    return np.float32(0.0) if p >= 1 else np.float32(1.0 / (1.0 - p))


def check_p(p):
    if isinstance(p, (bool, np.bool_)) or not isinstance(p, (int, float, np.integer, np.floating)):
        raise TypeError(f"p must be a number in [0, 1], not {type(p).__name__}")
    if not 0.0 <= float(p) <= 1.0:  # also rejects NaN
        raise ValueError(f"dropout probability p must be in [0, 1], got {p!r}")
    return float(p)


def check_u64(value, name):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be an integer, not {type(value).__name__}")
    if not 0 <= int(value) < 2**64:
        raise ValueError(f"{name} must be in [0, 2^64), got {value!r}")
    return int(value)


def split_u64(value):
    """(low, high) 32-bit words of a 64-bit integer, as uint32."""
    return np.uint32(value & 0xFFFFFFFF), np.uint32(value >> 32)


def _philox_words(quads, seed, offset):
    """uint32[len(quads), 4]: the four random words of each quad, counter (quad, offset)."""
    off_lo, off_hi = split_u64(offset)
    counters = np.stack([quads & MASK32, quads >> SHIFT32,
                         np.full_like(quads, off_lo), np.full_like(quads, off_hi)], axis=1)
    return philox4x32_reference(counters, split_u64(seed))


def keep_reference(n, p, seed, offset):
    """bool[n]: which elements a (seed, offset) call keeps -- the Philox mapping of the docstring."""
    words = _philox_words(np.arange(cdiv(n, 4), dtype=np.uint64), seed, offset).reshape(-1)[:n]
    return words.astype(np.uint64) >= threshold_for(p)


def dropout_reference(x, p, seed, offset):
    """(y, packed mask): y = x * scale where kept, 0 where dropped (a dropped NaN or Inf becomes 0).

    The product is formed in float32 and rounded once to x's dtype, as the kernels do."""
    keep = keep_reference(x.size, p, seed, offset)
    y = np.where(keep, x.astype(np.float32) * scale_for(p), np.float32(0)).astype(x.dtype)
    return y, workbook.pack_bitmask(keep)


def keep_reference_at(indices, p, seed, offset):
    """keep_reference at chosen element indices only: for spot checks of very large outputs."""
    indices = np.asarray(indices, dtype=np.uint64)
    words = _philox_words(indices >> np.uint64(2), seed, offset)
    chosen = words[np.arange(len(indices)), (indices & np.uint64(3)).astype(np.intp)]
    return chosen.astype(np.uint64) >= threshold_for(p)


def backward_reference(dy, keep, p):
    return np.where(keep, dy.astype(np.float32) * scale_for(p), np.float32(0)).astype(dy.dtype)


# ---------------------------------------------------------------------------------------------
# Naive: one thread per element... almost. xoroshiro128p keeps a 16-byte state per thread in
# global memory, so a state per *element* would be 16 bytes of state per 4 bytes of data (and
# initialising 2^28 states on the host takes minutes). The naive kernel does what numba's
# documentation does: a machine-sized grid, one state per thread, one draw per element, and the
# mask as one byte per element.
#
#   per element: read x 4 B, read + write the state 16 + 16 B (L2-resident: 2^18 states = 4 MiB),
#                write y 4 B, write mask 1 B   -> 9 B of HBM traffic, like torch's native_dropout


@cuda.jit
def dropout_naive_kernel(x, y, mask, p, scale, states):
    t = cuda.grid(1)
    for i in range(t, x.size, cuda.gridsize(1)):
        u = xoroshiro128p_uniform_float32(states, t)  # uniform in [0, 1)
        keep = u >= p  # P(keep) = 1 - p; p = 1 never keeps
        y[i] = x[i] * scale if keep else np.float32(0)
        mask[i] = keep


@cuda.jit
def dropout_backward_bytemask_kernel(dy, mask, dx, scale):
    # read dy 4 B, read mask 1 B, write dx 4 B per element: 9 B
    i = cuda.grid(1)
    if i < dy.size:
        dx[i] = dy[i] * scale if mask[i] else np.float32(0)


# ---------------------------------------------------------------------------------------------
# Optimized forward. Each lane owns a *quad* of 4 consecutive elements: one Philox call gives the
# four random words, one 16-byte load brings the four inputs. A warp covers 32 quads = 128
# elements = 4 mask words per trip:
#
#   lane:          0          1          ...   7        |  8   ...  15     | ... | 24 ... 31
#   elements:      0-3        4-7        ...   28-31    |  32  ...  63     | ... | 96 ... 127
#   keep nibble:   bits 0-3   bits 4-7   ...   28-31    |  of word 1       | ... | of word 3
#
# Bit i % 32 of word i // 32 must hold keep[i], so word w is the OR of the nibbles of lanes
# 8w .. 8w+7, each shifted to 4 * (lane % 8). numba has no reduce_or_sync; two ways remain:
#   - 4 ballot_sync (one per element of the quad) give words whose bits are interleaved (bit l of
#     ballot j is element 4l + j): they would still need a 4-way bit interleave;
#   - a shuffle-OR butterfly over the 8 lanes of a word: 3 shfl_xor_sync + 3 ORs, and every lane of
#     the group ends with the whole word. We use this.
# Every lane of the warp must reach the shuffles, so the loop runs over warp-sized tiles with a trip
# count that is the same for all 32 lanes (the tile index is per warp); lanes past the end take part
# with an empty nibble. Bytes per element: read x 4, write y 4, write mask 1/8  -> 8.125 B.


# The quads move with workbook.memory's load4/store4 (chapter 00): one 16-byte access of float32,
# one 8-byte access of float16. Arrays that do not start on such a boundary (a view such as x[1:])
# take the same kernels built with these element-by-element stand-ins, which accept any address.


@cuda.jit(device=True, forceinline=True)
def load_each4(array, i):
    """array[i..i+3] with four plain loads: any dtype, any alignment."""
    return array[i], array[i + 1], array[i + 2], array[i + 3]


@cuda.jit(device=True, forceinline=True)
def store_each4(array, i, quad):
    a, b, c, d = quad
    array[i] = a
    array[i + 1] = b
    array[i + 2] = c
    array[i + 3] = d


@cuda.jit(device=True, forceinline=True)
def keep4(quad, threshold, seed_lo, seed_hi, off_lo, off_hi):
    """Keep flags of elements 4*quad .. 4*quad+3: one Philox call, counter (quad, offset), key seed."""
    r0, r1, r2, r3 = philox4x32(np.uint32(quad & 0xFFFFFFFF), np.uint32(quad >> 32),
                                off_lo, off_hi, seed_lo, seed_hi)
    return (np.uint64(r0) >= threshold, np.uint64(r1) >= threshold,
            np.uint64(r2) >= threshold, np.uint64(r3) >= threshold)


def _make_forward_kernel(load4, store4, write_mask, offset_in_memory=False):
    """The bitmask (write_mask=True) or seed-only forward, with the given quad load/store.

    offset_in_memory: the kernel takes `counter`, a uint64[1] device array (after the mask), instead
    of (off_lo, off_hi), and uses counter[0] as the Philox offset. A CUDA graph replays its kernels with the
    arguments they were captured with, so a graph that drops out must read its offset from memory,
    which a kernel of the step then advances (torch's graph-safe generator does the same)."""

    @cuda.jit(device=True, forceinline=True)
    def forward(x, y, mask, threshold, scale, seed_lo, seed_hi, off_lo, off_hi):
        n = x.size
        full_quads = n >> 2  # quads with all 4 elements in range: the 16-byte path
        tiles = (((n + 3) >> 2) + 31) >> 5  # warp tiles of 32 quads
        lane = cuda.laneid
        tile = cuda.grid(1) >> 5  # this warp's first tile: the same in all 32 lanes
        warps_in_grid = cuda.gridsize(1) >> 5
        zero = np.float32(0)
        while tile < tiles:  # warp-uniform: no lane leaves before the shuffles
            quad = (tile << 5) + lane
            first = quad << 2
            if quad < full_quads:
                x0, x1, x2, x3 = load4(x, first)  # 16 B in one request, issued before the Philox
                keep0, keep1, keep2, keep3 = keep4(quad, threshold, seed_lo, seed_hi, off_lo, off_hi)
                store4(y, first, (  # rounds, so that its ~600 ns of latency overlap them
                       np.float32(x0) * scale if keep0 else zero,
                       np.float32(x1) * scale if keep1 else zero,
                       np.float32(x2) * scale if keep2 else zero,
                       np.float32(x3) * scale if keep3 else zero))
            else:
                # The last, partial quad (n % 4 elements), and quads past the end: element by
                # element, and a dropped bit for every element that does not exist.
                keep0, keep1, keep2, keep3 = keep4(quad, threshold, seed_lo, seed_hi, off_lo, off_hi)
                keep0 = keep0 and first < n
                keep1 = keep1 and first + 1 < n
                keep2 = keep2 and first + 2 < n
                keep3 = keep3 and first + 3 < n
                if first < n:
                    y[first] = np.float32(x[first]) * scale if keep0 else zero
                if first + 1 < n:
                    y[first + 1] = np.float32(x[first + 1]) * scale if keep1 else zero
                if first + 2 < n:
                    y[first + 2] = np.float32(x[first + 2]) * scale if keep2 else zero
            if write_mask:
                # (all in uint64: numba and NumPy then agree on every intermediate type)
                nibble = (np.uint64(keep0) | np.uint64(keep1) << np.uint64(1)
                          | np.uint64(keep2) << np.uint64(2) | np.uint64(keep3) << np.uint64(3))
                # numba shuffles signed 32-bit ints only: carry the word as int32 (same bits)
                bits = np.int32((nibble << np.uint64((lane & 7) * 4)) & MASK32)
                # OR across the 8 lanes of a word: after 3 butterfly steps each lane holds all 8 nibbles
                bits = np.int32(bits | cuda.shfl_xor_sync(FULL_MASK, bits, 1))
                bits = np.int32(bits | cuda.shfl_xor_sync(FULL_MASK, bits, 2))
                bits = np.int32(bits | cuda.shfl_xor_sync(FULL_MASK, bits, 4))
                word = (tile << 2) + (lane >> 3)
                if (lane & 7) == 0 and word < mask.size:
                    mask[word] = np.uint32(bits)  # lanes 0, 8, 16, 24: 4 consecutive words, 16 B
            tile += warps_in_grid

    if offset_in_memory:
        @cuda.jit
        def counted(x, y, mask, counter, threshold, scale, seed_lo, seed_hi):
            offset = np.uint64(counter[0])  # the same word for every thread: a broadcast from cache
            forward(x, y, mask, threshold, scale, seed_lo, seed_hi,
                    np.uint32(offset & MASK32), np.uint32(offset >> SHIFT32))

        return counted

    @cuda.jit
    def kernel(x, y, mask, threshold, scale, seed_lo, seed_hi, off_lo, off_hi):
        forward(x, y, mask, threshold, scale, seed_lo, seed_hi, off_lo, off_hi)

    return kernel


# ---------------------------------------------------------------------------------------------
# Backward. Lane-to-data is per thread (no collectives): thread t handles quad q, reads its nibble
# from word q // 8 (8 neighbouring lanes read the same word: one request for the warp's 4 words),
# grid-striding over quads.
#   from the bitmask:  read dy 4 B, read mask 1/8 B, write dx 4 B  -> 8.125 B per element
#   seed-only:         read dy 4 B, write dx 4 B                   -> 8 B, plus one Philox per quad


def _make_backward_kernel(load4, store4, from_mask):

    @cuda.jit
    def kernel(dy, mask, dx, threshold, scale, seed_lo, seed_hi, off_lo, off_hi):
        n = dy.size
        quads = (n + 3) >> 2
        full_quads = n >> 2
        zero = np.float32(0)
        for quad in range(cuda.grid(1), quads, cuda.gridsize(1)):
            if quad < full_quads:
                d0, d1, d2, d3 = load4(dy, quad << 2)  # first: the mask or the Philox overlap it
            if from_mask:
                nibble = np.uint32(mask[quad >> 3]) >> np.uint32((quad & 7) * 4)
                keep0 = (nibble & np.uint32(1)) != 0
                keep1 = (nibble & np.uint32(2)) != 0
                keep2 = (nibble & np.uint32(4)) != 0
                keep3 = (nibble & np.uint32(8)) != 0
            else:  # regenerate exactly what the forward drew for this quad
                keep0, keep1, keep2, keep3 = keep4(quad, threshold, seed_lo, seed_hi, off_lo, off_hi)
            if quad < full_quads:
                store4(dx, quad << 2, (
                       np.float32(d0) * scale if keep0 else zero,
                       np.float32(d1) * scale if keep1 else zero,
                       np.float32(d2) * scale if keep2 else zero,
                       np.float32(d3) * scale if keep3 else zero))
            else:
                first = quad << 2  # the partial last quad: n % 4 elements (at most 3)
                dx[first] = np.float32(dy[first]) * scale if keep0 else zero
                if first + 1 < n:
                    dx[first + 1] = np.float32(dy[first + 1]) * scale if keep1 else zero
                if first + 2 < n:
                    dx[first + 2] = np.float32(dy[first + 2]) * scale if keep2 else zero

    return kernel


# One compiled kernel per (wide path?, variant); misaligned arrays take the element-by-element one.
_VECTOR, _SCALAR = (load4, store4), (load_each4, store_each4)
dropout_bitmask_kernel = _make_forward_kernel(*_VECTOR, write_mask=True)
dropout_bitmask_scalar_kernel = _make_forward_kernel(*_SCALAR, write_mask=True)
dropout_bitmask_counted_kernel = _make_forward_kernel(*_VECTOR, write_mask=True, offset_in_memory=True)
dropout_bitmask_counted_scalar_kernel = _make_forward_kernel(*_SCALAR, write_mask=True, offset_in_memory=True)
dropout_seed_only_kernel = _make_forward_kernel(*_VECTOR, write_mask=False)
dropout_seed_only_scalar_kernel = _make_forward_kernel(*_SCALAR, write_mask=False)
backward_bitmask_kernel = _make_backward_kernel(*_VECTOR, from_mask=True)
backward_bitmask_scalar_kernel = _make_backward_kernel(*_SCALAR, from_mask=True)
backward_seed_only_kernel = _make_backward_kernel(*_VECTOR, from_mask=False)
backward_seed_only_scalar_kernel = _make_backward_kernel(*_SCALAR, from_mask=False)


# ---------------------------------------------------------------------------------------------
# Host wrappers: check everything, size the grid, launch.


def quads_aligned(*arrays):
    """Whether the wide path may be used: every array starts on a 4-element boundary (16 bytes of
    float32, 8 of float16). numba's and torch's allocations are 256-byte aligned; x[1:] is not."""
    return all(aligned(a) for a in arrays)


def _blocks_for_quads(quads, blocks_per_sm=None):
    """blocks_per_sm (default BLOCKS_PER_SM) blocks per SM, never more than the data needs (a quad
    per thread per trip); "data" sizes the grid by the data: every thread one quad, no second trip."""
    needed = cdiv(quads, THREADS_PER_BLOCK)
    blocks_per_sm = BLOCKS_PER_SM if blocks_per_sm is None else blocks_per_sm
    if blocks_per_sm == "data":
        return max(1, needed)
    if not isinstance(blocks_per_sm, int) or blocks_per_sm < 1:
        raise ValueError(f'blocks_per_sm must be a positive int or "data", not {blocks_per_sm!r}')
    return max(1, min(sm_count() * blocks_per_sm, needed))


def _output(out, like, name, given=None):
    """out checked, or a fresh output shaped like `like` (the checked input) and allocated like
    `given` (the caller's input: torch's caching allocator for a torch tensor, see empty_like_input)."""
    if out is None:
        return empty_like_input(given, like.shape, like.dtype)
    return require(out, name, dtype=like.dtype, shape=like.shape)


def _mask_output(mask, n, given=None):
    words = cdiv(n, 32)
    if mask is None:
        return empty_like_input(given, (words,), np.uint32)
    return require(mask, "mask", dtype=np.uint32, shape=(words,))


_placeholders = {}
_launches = LaunchCache()
_torch_calls = TensorCalls()  # dropout_bitmask on torch tensors met before: one launch (chapter 07)


@lru_cache(maxsize=64)
def _fixed_scalars(p, seed):
    """The kernels' scalars that a training loop keeps from step to step: (threshold, scale, seed
    low, seed high), made once per (p, seed), the same objects at every call (the launch cache
    then sees them unchanged at a glance); only the offset's two words are new at each step."""
    return (threshold_for(p), scale_for(p), *split_u64(seed))


def _launch(kernel, blocks, threads, args, scalars, repeats, stream=0):
    """Through the cache of prepared launches when the buffers come back at the next call (the
    caller's, or torch's: its caching allocator hands the same memory back), where a launch costs
    the driver's time only (chapter 07); a plain launch for fresh numba outputs, whose launch
    would never be found again. Returns the launch cache's entry, or None."""
    if repeats:
        return _launches.launch(kernel, blocks, threads, args, scalars, stream=stream)
    kernel[blocks, threads, stream](*args, *scalars)
    return None


def _placeholder():
    """A 1-word array for the mask argument of kernels that store no mask (made once: an
    allocation per call would be timed with the kernel)."""
    if "mask" not in _placeholders:
        _placeholders["mask"] = cuda.device_array(1, dtype=np.uint32)
    return _placeholders["mask"]


def _forward(x, p, seed, offset, y, mask, write_mask, vector=True, blocks_per_sm=None):
    x_given, x = x, require(x, "x", dtype=DTYPES, ndim=1)
    p = check_p(p)
    seed, offset = check_u64(seed, "seed"), check_u64(offset, "offset")
    # buffers the caller keeps, or torch's (its caching allocator hands the same memory back)
    repeats = y is not None and (mask is not None or not write_mask) or is_torch_tensor(x_given)
    y = _output(y, x, "y", x_given)
    mask = _mask_output(mask, x.size, x_given) if write_mask else _placeholder()
    if x.size == 0:
        return y, mask, None
    wide = vector and quads_aligned(x, y)
    if write_mask:
        kernel = dropout_bitmask_kernel if wide else dropout_bitmask_scalar_kernel
    else:
        kernel = dropout_seed_only_kernel if wide else dropout_seed_only_scalar_kernel
    quads = cdiv(x.size, 4)
    blocks = _blocks_for_quads(quads, blocks_per_sm)
    entry = _launch(kernel, blocks, THREADS_PER_BLOCK, (x, y, mask), (*_fixed_scalars(p, seed), *split_u64(offset)),
                    repeats)
    return y, mask, entry


def dropout_bitmask(x, p, seed, offset, y=None, mask=None, vector=True, blocks_per_sm=None):
    """Dropout of a float32/float16 device vector x: (y, mask), mask packed as uint32[ceil(n / 32)].

    (seed, offset) pick the random numbers (see the module docstring); y and mask may be given to
    avoid an allocation. vector=False forces 4-byte loads, blocks_per_sm overrides the grid size
    (both to measure what they buy)."""
    given = (x, y, mask)
    # the options as given, with their types: the checks passed for p=1 do not pass p=True
    key = _torch_calls.key(("x", "y", "mask"), given, p, type(p), seed, type(seed), vector, blocks_per_sm)
    found = _torch_calls.find(key)
    if found is not None:  # torch tensors met before, every check passed then: the same launch
        return found((None, None, None, *_fixed_scalars(p, seed), *split_u64(check_u64(offset, "offset"))), given)
    y, mask, entry = _forward(x, p, seed, offset, y, mask, write_mask=True, vector=vector,
                              blocks_per_sm=blocks_per_sm)
    _torch_calls.keep(key, entry, returns=(y, mask), owners=(1, 2))
    return y, mask


def prepare_dropout_bitmask(x, p, seed, y, mask):
    """dropout_bitmask's checks, kernel choice and grid done once for these buffers (chapter 07).
    Returns step(offset) -> (y, mask): each step a new Philox offset (two 32-bit words stored into
    the packed parameters) and one launch at the driver's cost."""
    x = require(x, "x", dtype=DTYPES, ndim=1)
    if x.size == 0:
        raise ValueError("x is empty: nothing to prepare")
    p, seed = check_p(p), check_u64(seed, "seed")
    y, mask = require(y, "y", dtype=x.dtype, shape=x.shape), _mask_output(mask, x.size)
    kernel = dropout_bitmask_kernel if quads_aligned(x, y) else dropout_bitmask_scalar_kernel
    args = (x, y, mask, threshold_for(p), scale_for(p), *split_u64(seed))
    offset_at = len(args)  # the offset's two words follow
    launch = PreparedLaunch(kernel, _blocks_for_quads(cdiv(x.size, 4)), THREADS_PER_BLOCK, *args,
                            *split_u64(0), returns=(y, mask))

    def step(offset):
        low, high = split_u64(check_u64(offset, "offset"))
        launch.set(offset_at, low)
        launch.set(offset_at + 1, high)
        return launch()

    step.how = launch.how
    return step


def dropout_bitmask_counted(x, p, seed, counter, y, mask, *, stream=0):
    """dropout_bitmask with its Philox offset read on the GPU from counter[0] (a uint64[1] device
    array), so that a graph replaying the launch draws new numbers whenever a kernel of the step
    advances the counter. y and mask must be given (a graph replays into the same buffers)."""
    x = require(x, "x", dtype=DTYPES, ndim=1)
    p, seed = check_p(p), check_u64(seed, "seed")
    counter = require(counter, "counter", dtype=np.uint64, shape=(1,))
    y, mask = require(y, "y", dtype=x.dtype, shape=x.shape), _mask_output(mask, x.size)
    if x.size:
        wide = quads_aligned(x, y)
        kernel = dropout_bitmask_counted_kernel if wide else dropout_bitmask_counted_scalar_kernel
        _launches.launch(kernel, _blocks_for_quads(cdiv(x.size, 4)), THREADS_PER_BLOCK, (x, y, mask, counter),
                         _fixed_scalars(p, seed), stream=stream)
    return y, mask


def dropout_seed_only(x, p, seed, offset, y=None):
    """Dropout that stores no mask: the backward regenerates it from (seed, offset)."""
    return _forward(x, p, seed, offset, y, None, write_mask=False)[0]


def dropout_backward_bitmask(dy, mask, p, dx=None, vector=True, blocks_per_sm=None, stream=0):
    """dx = dy * keep / (1 - p), keep read from the packed mask written by dropout_bitmask."""
    dy_given, dy = dy, require(dy, "dy", dtype=DTYPES, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(cdiv(dy.size, 32),))
    p = check_p(p)
    dx = _output(dx, dy, "dx", dy_given)
    if dy.size:
        wide = vector and quads_aligned(dy, dx)
        kernel = backward_bitmask_kernel if wide else backward_bitmask_scalar_kernel
        quads = cdiv(dy.size, 4)
        _launches.launch(kernel, _blocks_for_quads(quads, blocks_per_sm), THREADS_PER_BLOCK,  # (seed, offset): unused
                         (dy, mask, dx, *_fixed_scalars(p, 0), *split_u64(0)), stream=stream)
    return dx


def dropout_backward_seed_only(dy, p, seed, offset, dx=None):
    """dx = dy * keep / (1 - p), keep regenerated from the forward's (seed, offset)."""
    dy_given, dy = dy, require(dy, "dy", dtype=DTYPES, ndim=1)
    p = check_p(p)
    seed, offset = check_u64(seed, "seed"), check_u64(offset, "offset")
    repeats = dx is not None or is_torch_tensor(dy_given)
    dx = _output(dx, dy, "dx", dy_given)
    if dy.size:
        kernel = backward_seed_only_kernel if quads_aligned(dy, dx) else backward_seed_only_scalar_kernel
        quads = cdiv(dy.size, 4)
        _launch(kernel, _blocks_for_quads(quads), THREADS_PER_BLOCK, (dy, _placeholder(), dx),
                (*_fixed_scalars(p, seed), *split_u64(offset)), repeats)
    return dx


_naive_states = {}


def _splitmix64(z):
    """Sebastiano Vigna's SplitMix64 finaliser, vectorised over a uint64 array (wraps mod 2^64)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def naive_states(seed, threads):
    """xoroshiro128p states, one per thread of the naive grid, made once per (seed, threads) and
    never timed.

    numba's create_xoroshiro128p_states jumps each state 2^64 steps past the previous one, a loop
    on the host that costs about a second per million states (and minutes in the simulator). Here
    each state is seeded by SplitMix64 of (seed, thread) instead -- how xoroshiro's authors
    recommend seeding it; the generator itself is numba's."""
    key = (seed, threads)
    if key not in _naive_states:
        thread = np.arange(threads, dtype=np.uint64)
        base = _splitmix64(np.full(threads, seed, dtype=np.uint64))
        states = np.empty(threads, dtype=xoroshiro128p_dtype)
        states["s0"] = _splitmix64(base + np.uint64(2) * thread)
        states["s1"] = _splitmix64(base + np.uint64(2) * thread + np.uint64(1))
        _naive_states[key] = cuda.to_device(states)
    return _naive_states[key]


def naive_grid(n):
    blocks = max(1, min(sm_count() * NAIVE_BLOCKS_PER_SM, cdiv(n, THREADS_PER_BLOCK)))
    return blocks, THREADS_PER_BLOCK


def dropout_naive(x, p, seed, y=None, mask=None):
    """(y, uint8 mask) with numba's xoroshiro128p: random, but not reproducible across grids."""
    x_given, x = x, require(x, "x", dtype=(np.float32,), ndim=1)
    p = check_p(p)
    seed = check_u64(seed, "seed")
    repeats = y is not None and mask is not None or is_torch_tensor(x_given)
    y = _output(y, x, "y", x_given)
    if mask is None:
        mask = empty_like_input(x_given, x.shape, np.uint8)
    mask = require(mask, "mask", dtype=np.uint8, shape=x.shape)
    if x.size:
        blocks, threads = naive_grid(x.size)
        states = naive_states(seed, blocks * threads)
        _launch(dropout_naive_kernel, blocks, threads, (x, y, mask), (np.float32(p), scale_for(p), states), repeats)
    return y, mask


def dropout_backward_bytemask(dy, mask, p, dx=None):
    """The naive backward: dx = dy * mask / (1 - p) from a byte per element."""
    dy_given, dy = dy, require(dy, "dy", dtype=(np.float32,), ndim=1)
    mask = require(mask, "mask", dtype=(np.uint8, np.bool_), shape=dy.shape)
    p = check_p(p)
    repeats = dx is not None or is_torch_tensor(dy_given)
    dx = _output(dx, dy, "dx", dy_given)
    if dy.size:
        blocks = cdiv(dy.size, THREADS_PER_BLOCK)
        _launch(dropout_backward_bytemask_kernel, blocks, THREADS_PER_BLOCK, (dy, mask, dx), (scale_for(p),), repeats)
    return dx


class PhiloxDropout:
    """Dropout with a (seed, offset) generator: each forward takes the next offset, so no two calls
    reuse a random number, and (seed, offset, n) always gives the same mask.

        drop = PhiloxDropout(p=0.1, seed=1234)
        y, mask, offset = drop.forward(x)       # offset 0, then 1, 2, ...
        dx = drop.backward(dy, mask)
    """

    def __init__(self, p, seed, offset=0):
        self.p = check_p(p)
        self.seed = check_u64(seed, "seed")
        self.offset = check_u64(offset, "offset")

    def next_offset(self):
        offset = self.offset
        self.offset += 1
        return offset

    def forward(self, x, y=None, mask=None):
        offset = self.next_offset()
        y, mask = dropout_bitmask(x, self.p, self.seed, offset, y, mask)
        return y, mask, offset

    def backward(self, dy, mask, dx=None):
        return dropout_backward_bitmask(dy, mask, self.p, dx)
