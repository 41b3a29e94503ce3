"""The workbook's intrinsics, written again for numba-cuda-mlir (see successor.py).

numba-cuda's versions (memory.py, tensor_cores.py, barrier.py) are numba `@intrinsic`s whose bodies
are LLVM IR. The successor lowers through MLIR and has no LLVM-IR intrinsics; it has what these need
instead:

    cuda.vector.load/store(array, index, n, 16)   one n-wide access (ld.global.v4.f32)
    cuda.experimental.inline_ptx(text, constraint, value, ...)
                                                          inline PTX; each "=" operand is returned
    array.ctypes.data                                      the address of an array's data (for PTX)

Each name below is typed by the successor through `overload`: the typing function sees the argument
types (an array's dtype, a tuple's length) and returns the body for them, as numba's intrinsics do.
Importing this module needs numba-cuda-mlir; successor.py imports it only when a kernel is rebuilt.
"""

import functools

from numba_cuda_mlir import cuda, types
from numba_cuda_mlir._mlir.dialects import nvvm as _nvvm
from numba_cuda_mlir.extending import lower_builtin as _lower_builtin
from numba_cuda_mlir.extending import overload as _overload
from numba_cuda_mlir.extending import refresh_registries as _refresh_registries
from numba_cuda_mlir.extending import type_callable as _type_callable
from numba_cuda_mlir.extending import typing_registry
from numba_cuda_mlir.numba_cuda import stubs as _stubs

overload = functools.partial(_overload, typing_registry=typing_registry)

NAMES = ("load4", "store4", "shared_load4", "shared_store4", "load16", "store16", "atomic_add4",
         "arrive", "arrived",
         "mma_f16", "mma_bf16", "mma_tf32", "to_tf32", "pack_f16x2", "pack_bf16x2",
         "ldmatrix_x1", "ldmatrix_x2", "ldmatrix_x4", "ldmatrix_x1_trans", "ldmatrix_x2_trans", "ldmatrix_x4_trans",
         "cp_async16", "cp_async_commit", "cp_async_wait", "shared_address",
         "wgmma_f16", "wgmma_tf32", "wgmma_f16_from_registers", "wgmma_fence", "wgmma_commit", "wgmma_wait",
         "fence_proxy_async")
WGMMA = frozenset(NAMES[-7:])  # the instructions of sm_90a alone: a kernel using one is built for it


def _stub(name):
    def stub(*args):
        raise NotImplementedError(f"{name} runs in a kernel compiled by numba-cuda-mlir")

    stub.__name__ = stub.__qualname__ = name
    return stub


load4, store4, shared_load4, shared_store4, load16, store16, atomic_add4 = (
    _stub(n) for n in ("load4", "store4", "shared_load4", "shared_store4", "load16", "store16", "atomic_add4"))
arrive, arrived = _stub("arrive"), _stub("arrived")
(mma_f16, mma_bf16, mma_tf32, to_tf32, pack_f16x2, pack_bf16x2, ldmatrix_x1, ldmatrix_x2, ldmatrix_x4,
 ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans, cp_async16, cp_async_commit, cp_async_wait,
 shared_address, wgmma_f16, wgmma_tf32, wgmma_f16_from_registers, wgmma_fence, wgmma_commit, wgmma_wait,
 fence_proxy_async) = (_stub(n) for n in NAMES[9:])


# ---------------------------------------------------------------------------------------------
# memory.py: wide loads and stores


def _flat_ok(array, index):
    return isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)


def _width(dtype, n):
    """Elements per access: n, or None (load16/store16) for 16 bytes of this dtype."""
    return n if n is not None else 16 // (dtype.bitwidth // 8)


def _define_wide(load, store, n):
    @overload(load)
    def typed_load(array, index):
        if not _flat_ok(array, index):
            return None
        count = _width(array.dtype, n)
        size = count * array.dtype.bitwidth // 8
        if count == 4:
            def quad(array, index):
                v = cuda.vector.load(array.ravel(), index, 4, size)  # ravel: a view, 1-D
                return (v.x, v.y, v.z, v.w)

            return quad
        if count == 8:  # 8 halves: two 8-byte accesses (the successor's vectors stop at four elements)
            def halves(array, index):
                flat = array.ravel()
                lo = cuda.vector.load(flat, index, 4, 16)
                hi = cuda.vector.load(flat, index + 4, 4, 8)
                return (lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w)

            return halves
        return None

    @overload(store)
    def typed_store(array, index, quad):
        if not _flat_ok(array, index) or not isinstance(quad, types.BaseTuple):
            return None
        count = _width(array.dtype, n)
        if len(quad) != count:
            return None
        dtype = array.dtype
        size = count * dtype.bitwidth // 8
        make = getattr(cuda, f"{dtype}x4")
        if count == 4:
            def quad4(array, index, quad):
                cuda.vector.store(array.ravel(), index,
                                  make(dtype(quad[0]), dtype(quad[1]), dtype(quad[2]), dtype(quad[3])), size)

            return quad4
        if count == 8:
            def halves(array, index, quad):
                flat = array.ravel()
                cuda.vector.store(flat, index, make(dtype(quad[0]), dtype(quad[1]), dtype(quad[2]), dtype(quad[3])),
                                  16)
                cuda.vector.store(flat, index + 4,
                                  make(dtype(quad[4]), dtype(quad[5]), dtype(quad[6]), dtype(quad[7])), 8)

            return halves
        return None


_define_wide(load4, store4, 4)
_define_wide(load16, store16, None)


# A shared array handed to an overload's body is taken for global memory (ld.global.nc on a shared
# address: an illegal address; successor.WORKAROUNDS): the shared accesses are written in PTX, on
# the address cvta.to.shared makes of the array's.

_SHARED_KIND = {"float32": ("f32", "f"), "int32": ("b32", "r"), "uint32": ("b32", "r")}


@overload(shared_load4)
def _shared_load4(array, index):
    if not (_flat_ok(array, index) and str(array.dtype) in _SHARED_KIND):
        return None
    kind, letter = _SHARED_KIND[str(array.dtype)]
    text = "{ .reg .u64 t; .reg .u32 a; cvta.to.shared.u64 t, %4; cvt.u32.u64 a, t; " \
           f"ld.shared.v4.{kind} {{%0, %1, %2, %3}}, [a]; }}"
    out, dtype = "=" + letter, array.dtype
    zero = dtype(0)

    def body(array, index):
        a, b, c, d = cuda.experimental.inline_ptx(text, out, zero, out, zero, out, zero, out, zero,
                                                  "l", array.ctypes.data + index * 4)
        return (dtype(a), dtype(b), dtype(c), dtype(d))

    return body


@overload(shared_store4)
def _shared_store4(array, index, quad):
    if not (_flat_ok(array, index) and str(array.dtype) in _SHARED_KIND and isinstance(quad, types.BaseTuple)
            and len(quad) == 4):
        return None
    kind, letter = _SHARED_KIND[str(array.dtype)]
    text = "{ .reg .u64 t; .reg .u32 a; cvta.to.shared.u64 t, %0; cvt.u32.u64 a, t; " \
           f"st.shared.v4.{kind} [a], {{%1, %2, %3, %4}}; }}"
    value = types.float32 if letter == "f" else types.int32

    def body(array, index, quad):
        cuda.experimental.inline_ptx(text, "l", array.ctypes.data + index * 4, letter, value(quad[0]),
                                     letter, value(quad[1]), letter, value(quad[2]), letter, value(quad[3]))

    return body


@overload(atomic_add4)
def _atomic_add4(array, index, quad):
    if not (_flat_ok(array, index) and array.dtype == types.float32 and isinstance(quad, types.BaseTuple)
            and len(quad) == 4):
        return None

    def red(array, index, quad):
        cuda.experimental.inline_ptx("red.global.add.v4.f32 [%0], {%1, %2, %3, %4};", "l", array.ctypes.data + index * 4,
             "f", types.float32(quad[0]), "f", types.float32(quad[1]), "f", types.float32(quad[2]),
             "f", types.float32(quad[3]))

    return red


# ---------------------------------------------------------------------------------------------
# barrier.py: release and acquire on a grid barrier's counter


def _counter_ok(counter):
    return isinstance(counter, types.Array) and counter.dtype == types.uint64


@overload(arrive)
def _arrive(counter):
    if not _counter_ok(counter):
        return None

    def body(counter):
        cuda.experimental.inline_ptx("red.release.gpu.global.add.u64 [%0], 1;", "l", counter.ctypes.data)

    return body


@overload(arrived)
def _arrived(counter):
    if not _counter_ok(counter):
        return None

    def body(counter):
        return types.uint64(cuda.experimental.inline_ptx("ld.acquire.gpu.global.u64 %0, [%1];", "=l", 0, "l", counter.ctypes.data))

    return body


# ---------------------------------------------------------------------------------------------
# tensor_cores.py: mma.sync, the packs, ldmatrix, cp.async


def _tuple_of(value, n, kinds):
    return isinstance(value, types.BaseTuple) and len(value) == n and all(isinstance(v, kinds) for v in value)


def _define_mma(stub, instruction, a_kinds, tf32):
    @overload(stub)
    def typed(a, b, c):
        if not (_tuple_of(a, 4, a_kinds) and _tuple_of(b, 2, a_kinds) and _tuple_of(c, 4, types.Number)):
            return None
        text = (f"{instruction} {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, "
                "{{$r10},{$r11},{$r12},{$r13}};")  # see successor.WORKAROUNDS: operands past %9
        bits = (_bits_of_float if tf32 and isinstance(a[0], types.Float) else _bits_of_int)

        def body(a, b, c):
            return cuda.experimental.inline_ptx(text, "=f", types.float32(0), "=f", types.float32(0), "=f", types.float32(0),
                        "=f", types.float32(0),
                        "r", bits(a[0]), "r", bits(a[1]), "r", bits(a[2]), "r", bits(a[3]),
                        "r", bits(b[0]), "r", bits(b[1]),
                        "f", types.float32(c[0]), "f", types.float32(c[1]), "f", types.float32(c[2]),
                        "f", types.float32(c[3]))

        return body


@cuda.jit(device=True, forceinline=True)
def _bits_of_int(value):
    return types.int32(value)


@cuda.jit(device=True, forceinline=True)
def _bits_of_float(value):
    return cuda.experimental.inline_ptx("mov.b32 %0, %1;", "=r", types.int32(0), "f", types.float32(value))


_define_mma(mma_f16, "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", types.Integer, False)
_define_mma(mma_bf16, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", types.Integer, False)
_define_mma(mma_tf32, "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", (types.Float, types.Integer), True)


@overload(to_tf32)
def _to_tf32(x):
    if isinstance(x, types.Integer):
        def from_bits(x):
            return types.uint32(cuda.experimental.inline_ptx("{ .reg .f32 t; mov.b32 t, %1; cvt.rna.tf32.f32 %0, t; }", "=r", types.int32(0),
                                     "r", types.int32(x)))

        return from_bits
    if isinstance(x, types.Float):
        def from_float(x):
            return cuda.experimental.inline_ptx("{ .reg .b32 t; cvt.rna.tf32.f32 t, %1; mov.b32 %0, t; }", "=f", types.float32(0),
                        "f", types.float32(x))

        return from_float
    return None


def _define_pack(stub, instruction):
    @overload(stub)
    def typed(lo, hi):
        if not (isinstance(lo, types.Number) and isinstance(hi, types.Number)):
            return None

        def body(lo, hi):
            return types.uint32(cuda.experimental.inline_ptx(instruction, "=r", types.int32(0), "f", types.float32(hi), "f", types.float32(lo)))

        return body


_define_pack(pack_f16x2, "cvt.rn.f16x2.f32 %0, %1, %2;")
_define_pack(pack_bf16x2, "cvt.rn.bf16x2.f32 %0, %1, %2;")


def _array_ok(array, index):
    return (isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)
            and array.dtype.bitwidth in (16, 32))


_TO_SHARED = "{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }"


@overload(shared_address)
def _shared_address(array, index):
    if not _array_ok(array, index):
        return None
    size = array.dtype.bitwidth // 8

    def body(array, index):
        return types.uint32(cuda.experimental.inline_ptx(_TO_SHARED, "=r", types.int32(0), "l", array.ctypes.data + index * size))

    return body


def _define_ldmatrix(stub, count, trans):
    text = (f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16 "
            f"{{{','.join(f'%{k}' for k in range(count))}}}, [%{count}];")

    @overload(stub)
    def typed(array, index):
        if not _array_ok(array, index):
            return None
        size = array.dtype.bitwidth // 8
        if count == 1:
            def one(array, index):
                address = cuda.experimental.inline_ptx(_TO_SHARED, "=r", types.int32(0), "l", array.ctypes.data + index * size)
                return (types.uint32(cuda.experimental.inline_ptx(text, "=r", types.int32(0), "r", address)),)

            return one
        if count == 2:
            def two(array, index):
                address = cuda.experimental.inline_ptx(_TO_SHARED, "=r", types.int32(0), "l", array.ctypes.data + index * size)
                r0, r1 = cuda.experimental.inline_ptx(text, "=r", types.int32(0), "=r", types.int32(0), "r", address)
                return (types.uint32(r0), types.uint32(r1))

            return two

        def four(array, index):
            address = cuda.experimental.inline_ptx(_TO_SHARED, "=r", types.int32(0), "l", array.ctypes.data + index * size)
            r0, r1, r2, r3 = cuda.experimental.inline_ptx(text, "=r", types.int32(0), "=r", types.int32(0), "=r", types.int32(0),
                                  "=r", types.int32(0), "r", address)
            return (types.uint32(r0), types.uint32(r1), types.uint32(r2), types.uint32(r3))

        return four


for _stub_, _count, _trans in ((ldmatrix_x1, 1, False), (ldmatrix_x2, 2, False), (ldmatrix_x4, 4, False),
                               (ldmatrix_x1_trans, 1, True), (ldmatrix_x2_trans, 2, True),
                               (ldmatrix_x4_trans, 4, True)):
    _define_ldmatrix(_stub_, _count, _trans)


@overload(cp_async16)
def _cp_async16(shared, shared_index, source, source_index, source_bytes):
    if not (_array_ok(shared, shared_index) and _array_ok(source, source_index)
            and isinstance(source_bytes, types.Integer)):
        return None
    s_size, g_size = shared.dtype.bitwidth // 8, source.dtype.bitwidth // 8

    def body(shared, shared_index, source, source_index, source_bytes):
        address = cuda.experimental.inline_ptx(_TO_SHARED, "=r", types.int32(0), "l", shared.ctypes.data + shared_index * s_size)
        cuda.experimental.inline_ptx("cp.async.cg.shared.global [%0], [%1], 16, %2;", "r", address,
             "l", source.ctypes.data + source_index * g_size, "r", types.int32(source_bytes))

    return body


@overload(cp_async_commit)
def _cp_async_commit():
    def body():
        cuda.experimental.inline_ptx("cp.async.commit_group;")

    return body


@overload(cp_async_wait, prefer_literal=True)  # the count is an immediate: typed as its literal
def _cp_async_wait(n):
    if not isinstance(n, types.IntegerLiteral):  # PTX takes the count as an immediate
        return None
    text = f"cp.async.wait_group {n.literal_value};"

    def body(n):
        cuda.experimental.inline_ptx(text)

    return body


# ---------------------------------------------------------------------------------------------
# tensor_cores.py: wgmma (sm_90a). The accumulator is a thread's 64 float32 of a local array. An
# inline_ptx call cannot take them as 64 operands: Python 3.11 and later pass more than 30
# arguments to a call as one tuple, whose strings the successor no longer sees as literals
# (successor.WORKAROUNDS). So the asm block takes the array's address: it loads the 64 values, issues
# the wgmma, waits for it, and stores them back. Correct, but each wgmma waits for itself, and the
# accumulator lives in local memory: none of numba-cuda's overlap of a wgmma with the next one.
# These are built for sm_90a (the overload's own compile too: jit_options).

_N = 64  # WGMMA_ACCUMULATORS
_SM_90A = {"chip": "sm_90a"}


def _wgmma_text(instruction, operands, tail):
    registers = ",".join(f"d{i}" for i in range(_N))
    loads = " ".join(f"ld.f32 d{i}, [%0+{4 * i}];" for i in range(_N))
    stores = " ".join(f"st.f32 [%0+{4 * i}], d{i};" for i in range(_N))
    return (f"{{ .reg .f32 d<{_N}>; {loads} wgmma.fence.sync.aligned; {instruction} {{{registers}}}, {operands}, "
            f"{tail}; wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0; {stores} }}")


def _accumulator_ok(acc):
    return isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.ndim == 1


def _define_wgmma(stub, instruction, tail):
    text = _wgmma_text(instruction, "%1, %2", tail)

    @overload(stub, jit_options=_SM_90A, inline="always")
    def typed(acc, desc_a, desc_b):
        if not (_accumulator_ok(acc) and isinstance(desc_a, types.Integer) and isinstance(desc_b, types.Integer)):
            return None

        def body(acc, desc_a, desc_b):
            cuda.experimental.inline_ptx(text, "l", acc.ctypes.data, "l", types.int64(desc_a),
                                         "l", types.int64(desc_b))

        return body


_define_wgmma(wgmma_f16, "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "1, 1, 1, 0, 0")
_define_wgmma(wgmma_tf32, "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32", "1, 1, 1")
# A from registers, B transposed (N-major): scale-d, -a, -b 1, tnspB 1
_FROM_REGISTERS = _wgmma_text("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16", "{%1,%2,%3,%4}, %5", "1, 1, 1, 1")


@overload(wgmma_f16_from_registers, jit_options=_SM_90A, inline="always")
def _wgmma_f16_from_registers(acc, a, desc_b):
    if not (_accumulator_ok(acc) and _tuple_of(a, 4, types.Integer) and isinstance(desc_b, types.Integer)):
        return None

    def body(acc, a, desc_b):
        cuda.experimental.inline_ptx(_FROM_REGISTERS, "l", acc.ctypes.data, "r", types.int32(a[0]),
                                     "r", types.int32(a[1]), "r", types.int32(a[2]), "r", types.int32(a[3]),
                                     "l", types.int64(desc_b))

    return body


def _define_fixed(stub, text):
    @overload(stub, jit_options=_SM_90A, inline="always")
    def typed():
        def body():
            cuda.experimental.inline_ptx(text)

        return body


_define_fixed(wgmma_fence, "wgmma.fence.sync.aligned;")
_define_fixed(wgmma_commit, "wgmma.commit_group.sync.aligned;")
_define_fixed(fence_proxy_async, "fence.proxy.async.shared::cta;")


@overload(wgmma_wait, prefer_literal=True, jit_options=_SM_90A, inline="always")  # the count is an immediate: typed as its literal
def _wgmma_wait(n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    text = f"wgmma.wait_group.sync.aligned {n.literal_value};"

    def body(n):
        cuda.experimental.inline_ptx(text)

    return body


# ---------------------------------------------------------------------------------------------
# What the successor's cuda module names but cannot lower


@_lower_builtin(_stubs.lanemask_lt)
def _lanemask_lt(lower, target, args, kwargs):
    """cuda.lanemask_lt(): typed by the successor, lowered here (successor.WORKAROUNDS)."""
    from numba_cuda_mlir._mlir.dialects import arith
    from numba_cuda_mlir._mlir.extras import types as mlir_types

    # (1 << laneid) - 1: the successor's NVVM translation has no nvvm.read.ptx.sreg.lanemask.lt, and
    # its inline PTX turns every % into an operand's $ (a special register cannot be named)
    one = arith.constant(mlir_types.i32(), 1)
    lane = _nvvm.read_ptx_sreg_laneid()
    lower.store_var(target, arith.subi(arith.shli(one, lane), one))


def _fence(scope):
    def lowering(lower, target, args, kwargs):
        """cuda.threadfence and its kin: typed by the successor, lowered here (successor.WORKAROUNDS)."""
        _nvvm.memory_barrier(getattr(_nvvm.MemScopeKind, scope))

    return lowering


for _fenced, _scope in ((_stubs.threadfence, "GPU"), (_stubs.threadfence_block, "CTA"), (_stubs.threadfence_system, "SYS")):
    _lower_builtin(_fenced)(_fence(_scope))


# ---------------------------------------------------------------------------------------------
# A chapter's own intrinsics, by the name the chapter gives them ("module.name")


def tensor_pointer(address, element):
    raise NotImplementedError("tensor_pointer runs in a kernel compiled by numba-cuda-mlir")


def pointer_load4(pointer, index):
    raise NotImplementedError("load4 runs in a kernel compiled by numba-cuda-mlir")


def pointer_store4(pointer, index, quad):
    raise NotImplementedError("store4 runs in a kernel compiled by numba-cuda-mlir")


POINTEES = (types.float32, types.float16)  # chapter 03's gradients


def _address_as_pointer(address, element):
    raise NotImplementedError("a typed pointer is made in a kernel compiled by numba-cuda-mlir")


@_type_callable(_address_as_pointer, typing_registry=typing_registry)
def _type_address_as_pointer(context):
    def typer(address, element):
        dtype = getattr(element, "dtype", None)
        return types.CPointer(dtype) if isinstance(address, types.Integer) and dtype in POINTEES else None

    return typer


@_lower_builtin(_address_as_pointer, types.Integer, types.Any)
def _lower_address_as_pointer(lower, target, args, kwargs):
    """An integer address as a typed pointer (llvm.inttoptr): what the successor's ctypes.cast does,
    for float16 too, which ctypes has no type for (successor.WORKAROUNDS)."""
    from numba_cuda_mlir._mlir.dialects import llvm
    from numba_cuda_mlir._mlir.extras import types as mlir_types
    from numba_cuda_mlir.lowering_utilities import convert

    address = convert(lower.load_var(args[0]), mlir_types.i64())
    lower.store_var(target, llvm.inttoptr(res=llvm.PointerType.get(), arg=address))


@overload(tensor_pointer)
def _tensor_pointer(address, element):
    """Chapter 03's typed pointer to a gradient tensor at `address` (float32 or float16)."""
    if not isinstance(address, types.Integer) or getattr(element, "dtype", None) not in POINTEES:
        return None

    def body(address, element):
        return _address_as_pointer(address, element)

    return body


def _quad_bytes(pointer):
    """The size of a four-element access through a pointer to chapter 03's gradients, or None."""
    if isinstance(pointer, types.CPointer) and pointer.dtype in POINTEES:
        return 4 * pointer.dtype.bitwidth // 8
    return None


@overload(pointer_load4)
def _pointer_load4(pointer, index):
    size = _quad_bytes(pointer)
    if size is None:
        return None

    def body(pointer, index):
        v = cuda.vector.load(pointer, index, 4, size)
        return (types.float32(v.x), types.float32(v.y), types.float32(v.z), types.float32(v.w))

    return body


@overload(pointer_store4)
def _pointer_store4(pointer, index, quad):
    size = _quad_bytes(pointer)
    if size is None:
        return None
    dtype = pointer.dtype
    make = getattr(cuda, f"{dtype}x4")

    def body(pointer, index, quad):
        cuda.vector.store(pointer, index, make(dtype(quad[0]), dtype(quad[1]), dtype(quad[2]), dtype(quad[3])), size)

    return body


BY_NAME = {
    "chapters.ch03_amp_unscale.kernels.tensor_pointer": tensor_pointer,
    "chapters.ch03_amp_unscale.kernels.load4": pointer_load4,
    "chapters.ch03_amp_unscale.kernels.store4": pointer_store4,
}

_refresh_registries()  # the lowerings above, registered after the successor's own
