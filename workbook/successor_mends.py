"""The gaps of numba-cuda-mlir 0.6.0 that a kernel's source cannot avoid, mended in its lowering.

Each is listed in successor.WORKAROUNDS with what it is and what is done here; `apply()` patches the
successor in place once, before a kernel is rebuilt (successor.successor_cuda). A fix upstream is
one function less here and one line less there.
"""


_applied = []


def apply():
    """The successor's bugs that a kernel's source cannot avoid, mended in place (once)."""
    if _applied:
        return
    _patch_constants()
    _patch_shuffles()
    _patch_matches()
    _patch_compare_and_swap()
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
