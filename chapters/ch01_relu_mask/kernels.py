"""Chapter 01's ReLU kernels: the forward pass that keeps one bit per element instead of y, built
sequentially (naive) or with a warp ballot (optimized), and the backward passes that read the bits
or read y.

The mask layout everywhere: uint32[ceil(n / 32)], bit i % 32 of word i // 32 is (x[i] > 0), and the
padding bits past n in the last word are 0. It is exactly np.packbits(x > 0, bitorder="little")
viewed as uint32. NaN > 0 is False, so a NaN input gets bit 0 (and a zero gradient); +inf gets 1;
-0.0 and +0.0 get 0.

Every kernel here is what the chapter shows and what tests/test_ch01_relu_mask.py tests.
"""


import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.check import pack_bitmask
from workbook.host import by_rows
from workbook.inputs import require, sm_count
from workbook.launch import LaunchCache, PreparedLaunch, TensorCalls, cdiv
from workbook.memory import aligned, load4, store4

THREADS_PER_BLOCK = 256
BLOCKS_PER_SM = 8  # 8 x 256 = 2048 threads, the most a Hopper SM holds (needs <= 32 registers/thread)
WORDS_PER_TRIP = 8  # a warp handles 8 mask words = 256 elements per trip: 8 loads in flight per lane
ELEMENTS_PER_TRIP = 32 * WORDS_PER_TRIP
FULL_MASK = 0xFFFFFFFF  # every lane of the warp takes part in the ballot
ZERO = np.float32(0.0)  # a float32 constant: a bare 0.0 would be a float64

# The 8-byte-word kernels work on the bits of two float32 held in one uint64. Every constant is a
# uint64: numba types a uint64 mixed with a plain int as float64.
LOW32 = np.uint64(0xFFFFFFFF)
HIGH32 = np.uint64(0xFFFFFFFF00000000)
SHIFT32 = np.uint64(32)
ZERO64 = np.uint64(0)
INF_BITS = np.uint64(0x7F800000)  # +inf; larger patterns with the sign bit clear are NaN
ABS_BITS = np.uint64(0x7FFFFFFF)  # everything but the sign bit
PAIRS_PER_LANE = 4  # 4 uint64 loads in flight per lane (32 bytes, as in the 4-byte kernels): 256 elements a trip

# Tell the compiler that 8 blocks of 256 threads must fit on an SM: it then keeps each kernel within
# 32 registers a thread (without the hint it takes 40, only 6 blocks fit, and a grid of 8 per SM runs
# in 1.33 waves). The simulator's jit has no such option.
FILL_THE_SM = {"launch_bounds": (THREADS_PER_BLOCK, BLOCKS_PER_SM)} if ON_GPU else {}


# ---------------------------------------------------------------------------------------------
# NumPy references


@by_rows  # on every core for a GPU's tensors (workbook/host.py); the same result
def relu_reference(x):
    """y = max(x, 0) with NaN kept (as torch.relu does) and -0.0 turned into +0.0."""
    return np.where(np.isnan(x) | (x > 0), x, np.zeros_like(x))


@by_rows(multiple=32)  # pieces of whole mask words
def relu_mask_reference(x):
    """(y, mask): the forward pass and the packed bits (x > 0) the backward pass needs."""
    return relu_reference(x), pack_bitmask(x > 0)


@by_rows
def relu_backward_reference(dy, positive):
    """dx = dy where the input was positive, else 0: a select, so a masked inf or NaN in dy gives 0
    (dy * 0 would give NaN)."""
    return np.where(positive, dy, np.zeros_like(dy))


def mask_words(n):
    """Words in the mask of n elements."""
    return cdiv(n, 32)


def special_inputs(n, seed=0):
    """n float32 inputs for the checks: normal values with zeros, negative zeros, NaN (both signs)
    and +-inf mixed in; the first four are always NaN, -NaN, inf, -inf (where n allows)."""
    rng = np.random.default_rng(seed + n)
    x = rng.standard_normal(n, dtype=np.float32)
    x[rng.random(n) < 0.1] = 0.0
    x[rng.random(n) < 0.1] = -0.0
    specials = np.array([np.nan, -np.nan, np.inf, -np.inf], dtype=np.float32)
    picks = rng.random(n) < 0.05
    x[picks] = rng.choice(specials, int(picks.sum()))
    x[: min(n, 4)] = specials[: min(n, 4)]
    return x


# ---------------------------------------------------------------------------------------------
# Device functions shared by the kernels


@cuda.jit(device=True, forceinline=True)
def relu(v):
    # NaN <= 0 is False, so NaN passes through; -0.0 <= 0 is True, so it becomes +0.0.
    return ZERO if v <= ZERO else v


# ---------------------------------------------------------------------------------------------
# Naive: sequential bits. Thread t reads elements 8t .. 8t+7 and writes byte t of the mask.
#
#   thread:     t0                 t1                 t2           ...
#   reads:      x[0]  ... x[7]     x[8]  ... x[15]    x[16] ... x[23]
#   writes:     mask byte 0        mask byte 1        mask byte 2       (coalesced: 32 bytes a warp)
#
# The byte writes of a warp are 32 consecutive bytes: coalesced. The reads are not: on each of its
# 8 load instructions, lane k reads x[8k + j], so the warp's 32 addresses are 32 bytes apart and
# touch 32 different sectors (1 KiB) to use 128 bytes; the next 7 instructions hit the same sectors
# again, which works only as long as they stay in L1. The y stores have the same stride.


@cuda.jit
def relu_mask_sequential_kernel(x, y, mask_bytes):
    t = cuda.grid(1)
    if t < mask_bytes.size:  # mask_bytes has 4 * ceil(n / 32) bytes: the last few are padding
        n = x.size
        bits = 0
        for j in range(8):
            i = t * 8 + j
            if i < n:
                v = x[i]  # read 4 bytes, 32 bytes away from the neighbouring lane's
                y[i] = relu(v)  # write 4 bytes, same stride
                if v > ZERO:
                    bits |= 1 << j
        mask_bytes[t] = bits  # write 1 byte; padding bytes past n get 0


# ---------------------------------------------------------------------------------------------
# Optimized: warp ballot. A warp owns rows of 32 consecutive elements; lane k tests element k of
# the row, and ballot_sync hands every lane the 32 predicates as one word, bit k from lane k: the
# mask word of that row, with no shifting or OR-ing by anyone.
#
#   one trip of warp w (WORDS_PER_TRIP = 8 rows = 256 elements, 1 KiB of x):
#     row 0:  lanes 0..31 read x[256w + 0 .. 31]     -> ballot -> word 8w + 0, kept by lane 0
#     row 1:  lanes 0..31 read x[256w + 32 .. 63]    -> ballot -> word 8w + 1, kept by lane 1
#     ...
#     row 7:  lanes 0..31 read x[256w + 224 .. 255]  -> ballot -> word 8w + 7, kept by lane 7
#     lanes 0..7 store their words together (and lanes 8..31 the same words again): 32 consecutive
#     bytes, one full sector.
#
# Every load and store of x and y is a coalesced 128-byte row, and all 8 loads are issued before the
# first ballot, so each lane has 8 loads in flight. Per element: 4 bytes read, 4 bytes written, 1/8
# byte of mask written: 8.125 bytes against torch.relu's 8.
#
# ballot_sync(FULL_MASK, ...) must be reached by all 32 lanes: the loop over trips depends only on
# the warp's index (never on the lane), so a warp goes round it as one. The last, partial trip is
# done with bounds checks (`check=True`); lanes past n vote 0, so padding bits come out 0.


@cuda.jit(device=True, forceinline=True)
def _relu_mask_trip(x, y, mask, word, lane, check):
    """One trip: rows `word` .. `word + 7` (warp-uniform), this lane's column `lane`."""
    n = x.size
    first = word * 32 + lane
    values = cuda.local.array(WORDS_PER_TRIP, float32)  # 8 registers: the loop below is unrolled
    for j in range(WORDS_PER_TRIP):
        i = first + 32 * j
        values[j] = x[i] if (not check or i < n) else ZERO  # 8 independent loads in flight
    row = lane & (WORDS_PER_TRIP - 1)  # the row whose word this lane stores: lanes j, j+8, j+16, j+24 -> row j
    mine = 0
    for j in range(WORDS_PER_TRIP):
        i = first + 32 * j
        v = values[j]
        if not check or i < n:
            y[i] = relu(v)
        bits = cuda.ballot_sync(FULL_MASK, v > ZERO)  # lanes past n hold 0.0: they vote 0
        if row == j:
            mine = bits  # a select, not a branch
    # Every lane stores, 4 lanes per word with the same value: the store is one 32-byte sector and no
    # lane branches. (`if lane < 8: store` looks cheaper, but the compiler then splits the whole trip
    # loop into a copy for lanes 0-7 and one for lanes 8-31, and the warp runs both, one after the other.)
    if not check or word + row < mask.size:
        mask[word + row] = mine


@cuda.jit(**FILL_THE_SM)
def relu_mask_ballot_kernel(x, y, mask):
    n = x.size
    lane = cuda.laneid
    warp = cuda.grid(1) >> 5  # global warp index (blocks are whole warps)
    warps = cuda.gridsize(1) >> 5
    word = warp * WORDS_PER_TRIP
    step = warps * WORDS_PER_TRIP
    while word * 32 + ELEMENTS_PER_TRIP <= n:  # whole trips: no bounds checks
        _relu_mask_trip(x, y, mask, word, lane, False)
        word += step
    if word * 32 < n:  # at most one warp of the grid gets the partial trip
        _relu_mask_trip(x, y, mask, word, lane, True)


# ---------------------------------------------------------------------------------------------
# Optimized further: 8-byte words. Chapter 00 showed that a numba kernel moving 8-byte words gets
# closer to the copy ceiling than one moving 4-byte floats. Lane k loads the uint64 that holds
# elements 2k and 2k+1 of a row of 64, and works on their bits (no float is ever formed):
#
#   positive:  0 < bits <= 0x7F800000        (sign clear, not +0, not NaN; +inf included)
#   y:         bits if positive or NaN, else 0
#
# Two ballots per row: `low` (bit k = element 2k > 0) and `high` (bit k = element 2k+1 > 0). The
# mask word of elements 0..31 interleaves the low 16 bits of both, elements 32..63 the high 16 bits:
#
#   low  = ... l3 l2 l1 l0        word = ... h1 l1 h0 l0   (bit 2k from low, bit 2k+1 from high)
#   high = ... h3 h2 h1 h0
#
# `_spread16` moves bit k of a 16-bit value to bit 2k in four shift-and-mask steps.


@cuda.jit(device=True, forceinline=True)
def _spread16(v):
    v &= 0xFFFF
    v = (v | (v << 8)) & 0x00FF00FF
    v = (v | (v << 4)) & 0x0F0F0F0F
    v = (v | (v << 2)) & 0x33333333
    return (v | (v << 1)) & 0x55555555


@cuda.jit(device=True, forceinline=True)
def _relu_bits(bits):
    """(the bits of relu(x), x > 0) for a float32 x given as its bit pattern in a uint64's low half."""
    positive = bits != ZERO64 and bits <= INF_BITS
    keep = positive or (bits & ABS_BITS) > INF_BITS  # NaN passes through, as in torch.relu
    return (bits if keep else ZERO64), positive


@cuda.jit(device=True, forceinline=True)
def _relu_mask_wide_trip(x, y, pairs_in, pairs_out, mask, row, lane, check):
    """One trip: rows `row` .. `row + 3` (warp-uniform; a row is 32 uint64 = 64 elements)."""
    pairs = pairs_in.size
    first = row * 32 + lane
    words = cuda.local.array(PAIRS_PER_LANE, np.uint64)
    for r in range(PAIRS_PER_LANE):
        p = first + 32 * r
        words[r] = pairs_in[p] if (not check or p < pairs) else ZERO64  # 8-byte loads in flight
    pick = (lane >> 1) & (PAIRS_PER_LANE - 1)  # the row whose words this lane builds
    low_mine = 0
    high_mine = 0
    for r in range(PAIRS_PER_LANE):
        p = first + 32 * r
        y_low, low = _relu_bits(words[r] & LOW32)
        y_high, high = _relu_bits(words[r] >> SHIFT32)
        if not check or p < pairs:
            pairs_out[p] = y_low | (y_high << SHIFT32)
        elif p == pairs and x.size & 1:  # n odd: the last element has no partner; do it as a float
            v = x[x.size - 1]
            y[x.size - 1] = relu(v)
            low = v > ZERO
        low_bits = cuda.ballot_sync(FULL_MASK, low)
        high_bits = cuda.ballot_sync(FULL_MASK, high)
        if pick == r:
            low_mine = low_bits
            high_mine = high_bits
    # Lane k builds word 2 * (row + pick) + (k & 1): from the low or the high 16 lanes of its row.
    # Lanes k, k + 8, k + 16, k + 24 build the same word and store it together (one 32-byte store per
    # warp, no branch).
    shift = (lane & 1) * 16
    word = _spread16(int(low_mine >> shift) & 0xFFFF) | (_spread16(int(high_mine >> shift) & 0xFFFF) << 1)
    index = 2 * row + (lane & (2 * PAIRS_PER_LANE - 1))
    if not check or index < mask.size:
        mask[index] = word


@cuda.jit(**FILL_THE_SM)
def relu_mask_wide_kernel(x, y, pairs_in, pairs_out, mask):
    """pairs_in, pairs_out: x and y without their last element if n is odd, viewed as uint64."""
    lane = cuda.laneid
    row = (cuda.grid(1) >> 5) * PAIRS_PER_LANE
    step = (cuda.gridsize(1) >> 5) * PAIRS_PER_LANE
    while (row + PAIRS_PER_LANE) * 32 <= pairs_in.size:  # whole trips
        _relu_mask_wide_trip(x, y, pairs_in, pairs_out, mask, row, lane, False)
        row += step
    if row * 64 < x.size:  # the partial trip, odd last element included
        _relu_mask_wide_trip(x, y, pairs_in, pairs_out, mask, row, lane, True)


# ---------------------------------------------------------------------------------------------
# Backward: dx = dy where the input was positive, else 0. Both versions use the same trips as the
# forward pass; they differ only in what tells them "positive":
#
#   from y:     reads dy (4 bytes) + y (4 bytes), writes dx (4 bytes)   = 12 bytes per element
#   from mask:  reads dy (4 bytes) + 1 bit,      writes dx (4 bytes)    = 8.125 bytes per element
#
# In the mask version the 32 lanes of a row all read the same word: one broadcast load per row.


@cuda.jit(device=True, forceinline=True)
def _backward_from_y_trip(dy, y, dx, first, check):
    n = dy.size
    grads = cuda.local.array(WORDS_PER_TRIP, float32)
    outputs = cuda.local.array(WORDS_PER_TRIP, float32)
    for j in range(WORDS_PER_TRIP):
        i = first + 32 * j
        if not check or i < n:
            grads[j] = dy[i]
            outputs[j] = y[i]
    for j in range(WORDS_PER_TRIP):
        i = first + 32 * j
        if not check or i < n:
            dx[i] = grads[j] if outputs[j] > ZERO else ZERO  # a select: inf * 0 would be NaN


@cuda.jit(**FILL_THE_SM)
def relu_backward_from_y_kernel(dy, y, dx):
    n = dy.size
    lane = cuda.laneid
    first = (cuda.grid(1) >> 5) * ELEMENTS_PER_TRIP + lane
    step = (cuda.gridsize(1) >> 5) * ELEMENTS_PER_TRIP
    while first - lane + ELEMENTS_PER_TRIP <= n:
        _backward_from_y_trip(dy, y, dx, first, False)
        first += step
    if first - lane < n:
        _backward_from_y_trip(dy, y, dx, first, True)


@cuda.jit(device=True, forceinline=True)
def _backward_from_mask_trip(dy, mask, dx, first, lane, check):
    n = dy.size
    word = (first - lane) >> 5
    grads = cuda.local.array(WORDS_PER_TRIP, float32)
    for j in range(WORDS_PER_TRIP):
        i = first + 32 * j
        if not check or i < n:
            grads[j] = dy[i]
    for j in range(WORDS_PER_TRIP):
        i = first + 32 * j
        if not check or i < n:
            bits = mask[word + j]  # the same word for all 32 lanes: one broadcast load
            dx[i] = grads[j] if (bits >> lane) & 1 else ZERO


@cuda.jit(**FILL_THE_SM)
def relu_backward_from_mask_kernel(dy, mask, dx):
    n = dy.size
    lane = cuda.laneid
    first = (cuda.grid(1) >> 5) * ELEMENTS_PER_TRIP + lane
    step = (cuda.gridsize(1) >> 5) * ELEMENTS_PER_TRIP
    while first - lane + ELEMENTS_PER_TRIP <= n:
        _backward_from_mask_trip(dy, mask, dx, first, lane, False)
        first += step
    if first - lane < n:
        _backward_from_mask_trip(dy, mask, dx, first, lane, True)


# Backward with 8-byte words: lane k handles the pair of elements 2p, 2p+1, whose bits are bits
# 2p % 32 and 2p % 32 + 1 of word p // 16 (lanes 0-15 of a row read one word, lanes 16-31 the next).
# dx is dy with each half kept or zeroed by an AND: a select on bits, never a multiply.


@cuda.jit(device=True, forceinline=True)
def _backward_wide_trip(grad_pairs, mask, out_pairs, first, check):
    pairs = grad_pairs.size
    grads = cuda.local.array(PAIRS_PER_LANE, np.uint64)
    for r in range(PAIRS_PER_LANE):
        p = first + 32 * r
        grads[r] = grad_pairs[p] if (not check or p < pairs) else ZERO64
    for r in range(PAIRS_PER_LANE):
        p = first + 32 * r
        if not check or p < pairs:
            two = (mask[p >> 4] >> ((p & 15) << 1)) & 3  # the bits of elements 2p and 2p+1
            keep = (LOW32 if two & 1 else ZERO64) | (HIGH32 if two & 2 else ZERO64)
            out_pairs[p] = grads[r] & keep


@cuda.jit(**FILL_THE_SM)
def relu_backward_from_mask_wide_kernel(dy, grad_pairs, mask, dx, out_pairs):
    lane = cuda.laneid
    first = (cuda.grid(1) >> 5) * (32 * PAIRS_PER_LANE) + lane
    step = (cuda.gridsize(1) >> 5) * (32 * PAIRS_PER_LANE)
    while first - lane + 32 * PAIRS_PER_LANE <= grad_pairs.size:
        _backward_wide_trip(grad_pairs, mask, out_pairs, first, False)
        first += step
    if first - lane < grad_pairs.size:
        _backward_wide_trip(grad_pairs, mask, out_pairs, first, True)
    if dy.size & 1 and cuda.grid(1) == 0:  # n odd: the last element, alone
        i = dy.size - 1
        dx[i] = dy[i] if (mask[i >> 5] >> (i & 31)) & 1 else ZERO


# ---------------------------------------------------------------------------------------------
# Optimized with 16-byte quads (workbook/memory.py, chapter 00): one quad of 4 floats per thread, on
# a grid sized to the data, as chapter 00's fastest copy. A warp covers 32 quads = 128 elements =
# 4 mask words. Four ballots, one per position j in the quad, give bit k = element 4k + j; word w
# of the warp takes byte w of each ballot, each bit spread 4 apart and shifted by j:
#
#   ballot j, byte w:   bit i = element 32w + 4i + j        (lanes 8w .. 8w + 7)
#   word w:             bit 4i + j = element 32w + 4i + j    = OR over j of _spread8(byte) << j
#
# Lane k builds word (k & 3) of its warp, so 8 lanes store each word, the same value: 16 bytes per
# warp and no branch on the lane. Per element: 4 bytes read, 4 written, 1/8 of mask, as before.

QUAD_THREADS = 256


@cuda.jit(device=True, forceinline=True)
def _spread8(v):
    """Bit i of an 8-bit value to bit 4i: 0babcdefgh -> 0b000a000b...000h."""
    v &= 0xFF
    v = (v | (v << 12)) & 0x000F000F
    v = (v | (v << 6)) & 0x03030303
    return (v | (v << 3)) & 0x11111111


@cuda.jit(device=True, forceinline=True)
def _element_or_zero(x, i):
    return x[i] if i < x.size else ZERO


@cuda.jit
def relu_mask_quads_kernel(x, y, mask):
    n = x.size
    q = cuda.grid(1)  # this thread's quad: elements 4q .. 4q + 3
    first = 4 * q
    if first + 3 < n:
        a, b, c, d = load4(x, first)  # 16 bytes in one load
        store4(y, first, (relu(a), relu(b), relu(c), relu(d)))
    else:  # the last partial quad, or past the end: lanes past n vote 0
        a = _element_or_zero(x, first)
        b = _element_or_zero(x, first + 1)
        c = _element_or_zero(x, first + 2)
        d = ZERO  # first + 3 >= n here
        for i in range(first, min(first + 3, n)):
            y[i] = relu(x[i])
    # every lane of every warp gets here: the grid is whole warps and nobody returned
    ballot_a = cuda.ballot_sync(FULL_MASK, a > ZERO)
    ballot_b = cuda.ballot_sync(FULL_MASK, b > ZERO)
    ballot_c = cuda.ballot_sync(FULL_MASK, c > ZERO)
    ballot_d = cuda.ballot_sync(FULL_MASK, d > ZERO)
    lane = cuda.laneid
    shift = 8 * (lane & 3)  # this lane builds word (lane & 3) of the warp's four
    word = (_spread8(ballot_a >> shift) | (_spread8(ballot_b >> shift) << 1)
            | (_spread8(ballot_c >> shift) << 2) | (_spread8(ballot_d >> shift) << 3))
    index = 4 * (q >> 5) + (lane & 3)
    if index < mask.size:
        mask[index] = word


@cuda.jit
def relu_backward_from_mask_quads_kernel(dy, mask, dx):
    # dx = dy where the bit is set: 16 bytes of dy, 4 bits of mask (a nibble), 16 bytes of dx per thread.
    n = dy.size
    q = cuda.grid(1)
    first = 4 * q
    # The whole-quad test first, and the mask read inside it: written as "if first < n: read the
    # mask; if first + 3 < n: ..." the same kernel ran 4% slower on the H100 (1.40x vs 1.46x
    # threshold_backward's speed), measured, not explained.
    if first + 3 < n:
        nibble = (mask[q >> 3] >> (4 * (q & 7))) & 0xF  # 8 quads per word; 8 lanes share a word
        a, b, c, d = load4(dy, first)
        store4(dx, first, (a if nibble & 1 else ZERO, b if nibble & 2 else ZERO,
                           c if nibble & 4 else ZERO, d if nibble & 8 else ZERO))
    elif first < n:  # the last, partial quad
        nibble = (mask[q >> 3] >> (4 * (q & 7))) & 0xF
        for i in range(first, n):
            dx[i] = dy[i] if (nibble >> (i - first)) & 1 else ZERO


# ---------------------------------------------------------------------------------------------
# Host wrappers: check the arguments, size the grid, launch. The two forward kernels take the same
# arguments (x, y, mask), so one call checks and times both. Every launch goes through a cache of
# prepared launches: the same buffers again cost the driver's launch, not numba's typing and
# packing of every argument (chapter 07).

_launches = LaunchCache()
_torch_calls = TensorCalls()  # relu_mask_quads on torch tensors met before: one launch (chapter 07)


def _trip_blocks(n):
    # Enough blocks to fill every SM once, never more than the data has trips for.
    trips_per_block = THREADS_PER_BLOCK // 32
    return max(1, min(sm_count() * BLOCKS_PER_SM, cdiv(n, ELEMENTS_PER_TRIP * trips_per_block)))


def _forward_args(x, y, mask):
    x = require(x, "x", dtype=np.float32, ndim=1)
    if x.size == 0:
        raise ValueError("x is empty: there is nothing to mask")
    y = require(y, "y", dtype=np.float32, shape=x.shape)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(x.size),))
    return x, y, mask


def relu_mask_sequential(x, y, mask):
    """Naive: y = relu(x), mask = packed (x > 0), one byte of mask per thread. Returns (y, mask)."""
    x, y, mask = _forward_args(x, y, mask)
    mask_bytes = mask.view(np.uint8)  # the same memory, byte by byte (little-endian: byte b = bits 8b..8b+7)
    blocks = cdiv(mask_bytes.size, THREADS_PER_BLOCK)
    _launches.launch(relu_mask_sequential_kernel, blocks, THREADS_PER_BLOCK, (x, y, mask_bytes))
    return y, mask


def relu_mask_ballot(x, y, mask, *, blocks=None):
    """Optimized: y = relu(x), mask = packed (x > 0), one ballot per 32 elements. Returns (y, mask).

    blocks: override the grid (the tests use 1 block to make every warp loop over several trips)."""
    x, y, mask = _forward_args(x, y, mask)
    _launches.launch(relu_mask_ballot_kernel, blocks or _trip_blocks(x.size), THREADS_PER_BLOCK, (x, y, mask))
    return y, mask


def _pairs(array, name):
    """A float32 device array without its odd last element, viewed as uint64 (the same memory)."""
    if ON_GPU and not aligned(array, 8):  # numba's pointer: no interface dict built at every call
        raise ValueError(f"{name} must start on an 8-byte boundary for the 8-byte-word kernels")
    return array[: array.size - array.size % 2].view(np.uint64)


def _wide_blocks(n):
    trips_per_block = THREADS_PER_BLOCK // 32
    return max(1, min(sm_count() * BLOCKS_PER_SM, cdiv(n, 64 * PAIRS_PER_LANE * trips_per_block)))


def relu_mask_wide(x, y, mask, *, blocks=None):
    """Optimized with 8-byte words: y = relu(x), mask = packed (x > 0). Returns (y, mask)."""
    x, y, mask = _forward_args(x, y, mask)
    # through the launch cache, as every wrapper here: the 8-byte views are made afresh at each call,
    # but they find the launch prepared for the same memory (chapter 07)
    _launches.launch(relu_mask_wide_kernel, blocks or _wide_blocks(x.size), THREADS_PER_BLOCK,
                     (x, y, _pairs(x, "x"), _pairs(y, "y"), mask))
    return y, mask


def relu_backward_from_mask_wide(dy, mask, dx, *, blocks=None):
    """dx = dy where the mask bit is set, else 0, moving 8-byte words. Returns dx."""
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(dy.size),))
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    if dy.size:
        _launches.launch(relu_backward_from_mask_wide_kernel, blocks or _wide_blocks(dy.size), THREADS_PER_BLOCK,
                         (dy, _pairs(dy, "dy"), mask, dx, _pairs(dx, "dx")))
    return dx


def _quad_blocks(n):
    return max(1, cdiv(cdiv(n, 4), QUAD_THREADS))


def relu_mask_quads(x, y, mask):
    """Optimized with 16-byte quads: y = relu(x), mask = packed (x > 0). Returns (y, mask). Arrays
    not 16-byte aligned (views at an odd offset) take relu_mask_ballot: a quad there would fault."""
    given = (x, y, mask)
    key = _torch_calls.key(("x", "y", "mask"), given)
    found = _torch_calls.find(key)
    if found is not None:  # torch tensors met before, every check passed then: the same launch
        return found(_NO_SCALARS, given)
    x, y, mask = _forward_args(x, y, mask)
    if not (aligned(x, 16) and aligned(y, 16)):
        return relu_mask_ballot(x, y, mask)
    # launched through a cache of prepared launches: the same buffers again cost the driver's
    # launch, not numba's typing and packing (chapter 07)
    entry = _launches.launch(relu_mask_quads_kernel, _quad_blocks(x.size), QUAD_THREADS, (x, y, mask))
    _torch_calls.keep(key, entry, returns=(y, mask), owners=(1, 2))
    return y, mask


_NO_SCALARS = (None, None, None)  # relu_mask_quads_kernel's arguments: three arrays


def prepare_relu_mask_quads(x, y, mask):
    """relu_mask_quads with its checks, grid and arguments done once, for a loop that calls it on
    the same buffers: returns a call that costs what the driver costs (chapter 07). It returns
    (y, mask), like the wrapper."""
    x, y, mask = _forward_args(x, y, mask)
    if not (aligned(x, 16) and aligned(y, 16)):
        return PreparedLaunch(relu_mask_ballot_kernel, _trip_blocks(x.size), THREADS_PER_BLOCK, x, y, mask,
                              returns=(y, mask))
    return PreparedLaunch(relu_mask_quads_kernel, _quad_blocks(x.size), QUAD_THREADS, x, y, mask, returns=(y, mask))


def relu_backward_from_mask_quads(dy, mask, dx):
    """dx = dy where the mask bit is set, else 0, moving 16-byte quads. Returns dx."""
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(dy.size),))
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    if not (aligned(dy, 16) and aligned(dx, 16)):
        return relu_backward_from_mask(dy, mask, dx)
    if dy.size:
        _launches.launch(relu_backward_from_mask_quads_kernel, _quad_blocks(dy.size), QUAD_THREADS, (dy, mask, dx))
    return dx


def relu_backward_from_y(dy, y, dx, *, blocks=None):
    """dx = dy where y > 0, else 0 (what torch's threshold_backward computes). Returns dx."""
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    y = require(y, "y", dtype=np.float32, shape=dy.shape)
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    if dy.size:
        _launches.launch(relu_backward_from_y_kernel, blocks or _trip_blocks(dy.size), THREADS_PER_BLOCK, (dy, y, dx))
    return dx


def relu_backward_from_mask(dy, mask, dx, *, blocks=None):
    """dx = dy where the mask bit is set, else 0. Returns dx."""
    dy = require(dy, "dy", dtype=np.float32, ndim=1)
    mask = require(mask, "mask", dtype=np.uint32, shape=(mask_words(dy.size),))
    dx = require(dx, "dx", dtype=np.float32, shape=dy.shape)
    if dy.size:
        _launches.launch(relu_backward_from_mask_kernel, blocks or _trip_blocks(dy.size), THREADS_PER_BLOCK,
                         (dy, mask, dx))
    return dx
