"""The gaps of numba-cuda-mlir 0.6.0 that a kernel's source cannot avoid, mended in its lowering.

Each is listed in successor.WORKAROUNDS with what it is and what is done here; `apply()` patches the
successor in place once, before a kernel is rebuilt (successor.successor_cuda). A fix upstream is
one function less here and one line less there.
"""


import os

_applied = []
# A mend tried, not yet on by default: WORKBOOK_SUCCESSOR_RANGE_MEND=1 applies _patch_range_count
# (chapter 08's EXPERIMENTS.md says why it waits for a measurement on a GPU).
RANGE_MEND = "WORKBOOK_SUCCESSOR_RANGE_MEND"


def range_mend_on():
    """Whether kernels are built with _patch_range_count (WORKBOOK_SUCCESSOR_RANGE_MEND=1)."""
    return os.environ.get(RANGE_MEND) == "1"


def apply():
    """The successor's bugs that a kernel's source cannot avoid, mended in place (once)."""
    if _applied:
        return
    _patch_constants()
    _patch_shuffles()
    _patch_matches()
    _patch_compare_and_swap()
    if range_mend_on():
        _patch_range_count()
    from . import successor_intrinsics  # noqa: F401  (registers the lowerings of lanemask_lt and the fences)

    _applied.append(True)


def _patch_constants():
    """An unsigned constant of 2^63 or more (np.uint64(0xFFFFFFFF00000000)) is handed to MLIR's
    IntegerAttr as a Python int too large for a signed 64-bit one: std::bad_cast (WORKAROUNDS). The
    same bits as a signed value are the same constant (MLIR's integers have no sign)."""
    from numba_cuda_mlir._mlir import ir
    from numba_cuda_mlir._mlir.dialects import arith

    stock = arith.constant

    def constant(result, value, *args, **kwargs):
        if isinstance(value, int) and not isinstance(value, bool) and isinstance(result, ir.IntegerType):
            width = result.width
            if 1 << (width - 1) <= value < 1 << width:
                value -= 1 << width
        return stock(result, value, *args, **kwargs)

    arith.constant = constant


def _patch_matches():
    """match_any_sync/match_all_sync of a float compare its bits, as numba-cuda does (WORKAROUNDS): the
    successor hands the float itself to nvvm.match.sync, which takes integers only."""
    from numba_cuda_mlir._mlir import ir
    from numba_cuda_mlir._mlir.dialects import arith, nvvm

    stock = nvvm.match_sync

    def match_sync(mask, value, kind, *args, **kwargs):
        if isinstance(value.type, ir.FloatType):
            width = value.type.width
            bits = arith.bitcast(ir.IntegerType.get_signless(width), value)
            value = bits if width in (32, 64) else arith.extui(ir.IntegerType.get_signless(32), bits)
        return stock(mask, value, kind, *args, **kwargs)

    nvvm.match_sync = match_sync


def _patch_compare_and_swap():
    """cuda.atomic.cas's new value converted to the array's type, as its expected value already is
    (WORKAROUNDS): cas(int32 array, i, 0, 1) has an int64 `1`, and the module fails to verify."""
    import numba_cuda_mlir.lowering.cuda as lowering

    stock = lowering.cuda_atomic_cas_cg

    def compare_and_swap(builder, target, mr, indices, old, value):
        return stock(builder, target, mr, indices, old, lowering.convert(value, mr.type.element_type))

    lowering.cuda_atomic_cas_cg = compare_and_swap


def _patch_shuffles():
    """shfl_*_sync of a value that is not 32 bits wide, by its bits (WORKAROUNDS): the successor's
    lowering rounds a float64 to float32, keeps an int64's low word only, and hands a float16 back
    as float32. A 64-bit value is shuffled as its two 32-bit halves, a narrower one widened."""
    import numba_cuda_mlir.lowering.cuda as lowering
    from numba_cuda_mlir._mlir import ir
    from numba_cuda_mlir._mlir.dialects import arith, nvvm

    stock = lowering._shfl_sync_lowering

    def shuffle(builder, target, args, kwargs, kind):
        value = builder.load_var(args[1])
        width = value.type.width
        if width == 32:
            return stock(builder, target, args, kwargs, kind)
        i32, bits_type = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(width)
        mask = lowering.int_of(builder.load_var(args[0]), i32)
        offset = lowering.int_of(builder.load_var(args[2]), i32)
        clamp = lowering.constant(0 if kind == nvvm.ShflKind.up else 0x1F, i32)
        bits = arith.bitcast(bits_type, value) if isinstance(value.type, ir.FloatType) else value

        def word(word_bits):
            return nvvm.shfl_sync(mask, word_bits, offset, clamp, kind)

        if width == 64:
            thirty_two = arith.constant(bits_type, 32)
            low = word(arith.trunci(i32, bits))
            high = word(arith.trunci(i32, arith.shrui(bits, thirty_two)))
            bits = arith.ori(arith.extui(bits_type, low), arith.shli(arith.extui(bits_type, high), thirty_two))
        else:
            bits = arith.trunci(bits_type, word(arith.extui(i32, bits)))
        builder.store_var(target, arith.bitcast(value.type, bits) if isinstance(value.type, ir.FloatType) else bits)

    lowering._shfl_sync_lowering = shuffle


def _is_constant(value):
    """Whether an MLIR value is a constant, through the casts between (the step of range(a, b, 4))."""
    while True:
        owner = value.owner
        name = getattr(owner, "name", None)
        if name in ("arith.extsi", "arith.extui", "arith.trunci", "arith.index_cast", "arith.bitcast"):
            value = owner.operands[0]
            continue
        return name == "arith.constant"


def _patch_range_count():
    """A range whose step is known at run time only counts its trips with one division, of two
    non-negative numbers (WORKAROUNDS). The successor divides twice, for a positive step and for a
    negative one, and chooses after: one of the two always has a negative operand read as unsigned
    (-step, or stop - start for a thread that starts past the end), which never fits 32 bits, so
    ptxas's shortcut never applies and each warp calls the 64-bit division subroutine at every
    grid-stride loop's entry. Here the step's sign chooses first: |step| and the span in its
    direction, clamped at zero, then one division that takes the 32-bit path whenever both fit.
    A constant step is left to the successor, whose count then folds to one division by a
    constant (changing that form made the tile kernels' loops slower: chapter 08's EXPERIMENTS.md).
    The successor's own store of the count is overwritten before anything reads it."""
    from numba_cuda_mlir import lowering_utilities as lu

    stock = lu.RangeObject.__init__
    arith, memref = lu.arith, lu.memref

    def __init__(self, lower, start, stop, step):
        stock(self, lower, start, stop, step)
        if _is_constant(step):
            return
        i64 = lu.T.i64()
        start, stop, step = (lu.convert(memref.load(self._memref, [lu.index_of(k)]), i64, signed=True)
                             for k in range(3))
        zero, one = arith.constant(i64, 0), arith.constant(i64, 1)
        upward = arith.cmpi(arith.CmpIPredicate.sgt, lhs=step, rhs=zero)
        size = arith.select(upward, step, arith.subi(lhs=zero, rhs=step))  # |step|
        span = arith.select(upward, arith.subi(lhs=stop, rhs=start), arith.subi(lhs=start, rhs=stop))
        ahead = arith.cmpi(arith.CmpIPredicate.sgt, lhs=span, rhs=zero)
        numerator = arith.select(ahead, arith.addi(lhs=span, rhs=arith.subi(lhs=size, rhs=one)), zero)
        count = arith.divui(lhs=numerator, rhs=size)
        memref.store(lu.convert(count, self._memref.type.element_type, signed=True), self._memref,
                     [lu.index_of(3)])

    lu.RangeObject.__init__ = __init__
