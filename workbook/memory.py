"""Wide loads and stores for numba.cuda kernels: four elements in one instruction.

numba turns `x[i]` on a float32 array into a 4-byte load (`ld.global.f32`) and offers nothing wider.
A GPU can move 16 bytes per thread in one instruction (`ld.global.v4.f32`): a quarter of the load
instructions for the same bytes, and four times the bytes each load keeps in flight, which is what
a memory-bound kernel needs to get close to the copy ceiling. These four functions reach it:

    load4(a, i)              -> (a[i], a[i+1], a[i+2], a[i+3])     one 4-wide load from global memory
    store4(a, i, quad)       a[i..i+3] = quad (a 4-tuple)            one 4-wide store to global memory
    shared_load4(s, i)       the same on a cuda.shared.array        ld.shared.v4
    shared_store4(s, i, quad)                                       st.shared.v4
    atomic_add4(a, i, quad)  a[i..i+3] += quad, atomically          red.global.add.v4.f32 (float32;
                             compute capability 9.0 and up: the caller checks `vector_atomics()`)
    load16(a, i), store16(a, i, values)
                             16 bytes whatever the dtype: 4 float32 (the same as load4) or 8 float16,
                             so that one kernel moves 16 bytes per access in both precisions;
                             `per16(dtype)` says how many elements that is (host side)

`a` is a C-contiguous array of any dimension and `i` a flat element index (row * ncols + col for a
2-D array). Four elements of a's dtype move at once: 16 bytes of float32 or int32/uint32
(`.v4.f32`, `.v4.b32`), 8 bytes of float16. The tuple has a's dtype; a store converts to it.

The rules are the hardware's: the address of a[i] must be a multiple of the width (16 bytes for
float32: i % 4 == 0 and the array's first element 16-byte aligned), and a[i+3] must exist. A GPU
faults on a misaligned vector access ("misaligned address") and reads or writes past the end
without a word. So a kernel uses them for the whole quads of an aligned array and plain indexing
for the tail, and its host wrapper checks `aligned(a)` and takes a scalar kernel when it is not.

How: each is a numba `@intrinsic`, a function whose body is LLVM IR written at compile time. It
takes the array's data pointer, steps to element i, casts the pointer to global (address space 1)
or shared (3) memory and to a pointer to a vector of 4 elements, and loads or stores that vector
with its alignment. NVVM turns a 16-byte-aligned <4 x float> access in address space 1 into
`ld.global.v4.f32`; `workbook.show_ptx(kernel, ..., grep=r"\\.v4")` shows it. (The other route,
inline PTX through `llvmlite.ir.InlineAsm`, works too, but a store written as inline assembly has no
outputs, so unless it is declared to have side effects LLVM deletes it as dead code; and the
compiler cannot schedule around assembly it does not understand. A vector access in IR has neither
problem.)

`atomic_add4` is the one written as inline PTX: NVVM has no vector atomic in its IR, and PTX has one
since Hopper (a quarter of the atomic operations for a tile's partial sums, chapter 04). It has no
result, so it is declared with side effects, or LLVM would delete it (the trap above).

In the simulator the same names are plain Python, element by element, and they check what the
GPU would not forgive: a misaligned index or array, and a quad past the end, raise an error that
says so. `python -m workbook compile` (the compile extra) compiles the real intrinsics without a
GPU, so a kernel using them is typed and compiled on a laptop too.
"""


import numpy as np

from . import MODE

WIDTH = 4  # elements per access of load4/store4
WIDE_BYTES = 16  # bytes per access of load16/store16
GLOBAL, SHARED = 1, 3  # NVVM's address spaces


def per16(dtype):
    """Elements of `dtype` in one 16-byte access: 4 float32, 8 float16."""
    return WIDE_BYTES // np.dtype(dtype).itemsize


def vector_atomics(compute_capability):
    """Does a GPU of this compute capability have atomic_add4's instruction (sm_90 and up: see
    workbook/capability.py, where every instruction's first GPU is written once)?"""
    from .capability import supports

    return supports("red.v4.f32", cc=tuple(compute_capability))


def aligned(array, bytes_=None):
    """Is the array's first element aligned for 4-wide access (16 bytes for float32)? Host side:
    a device array on a GPU, a simulator device array, or a NumPy array."""
    itemsize = np.dtype(array.dtype).itemsize
    bytes_ = bytes_ or WIDTH * itemsize
    if MODE == "gpu" and hasattr(array, "device_ctypes_pointer"):  # numba's device arrays
        address = array.device_ctypes_pointer.value or 0  # 0.1 us; the interface's dict costs 2 (ch07)
    elif MODE == "gpu" and hasattr(array, "__cuda_array_interface__"):  # torch, CuPy
        address = array.__cuda_array_interface__["data"][0] or 0
    else:
        host = getattr(array, "_ary", array)
        address = np.asarray(host).__array_interface__["data"][0]
    return address % bytes_ == 0


if MODE != "sim":  # a GPU, or the compile worker (workbook/compiler.py): the real intrinsics
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    def _width(dtype, width):
        return width or WIDE_BYTES * 8 // dtype.bitwidth  # None: as many as fill 16 bytes

    def _quad_pointer(context, builder, array_type, array, index, index_type, address_space, width):
        """&a[index] as a pointer to <width x dtype> in the given address space, and its alignment."""
        element = context.get_data_type(array_type.dtype)
        data = context.make_array(array_type)(context, builder, array).data
        index = context.cast(builder, index, index_type, types.intp)
        address = builder.addrspacecast(builder.gep(data, [index]), ir.PointerType(element, address_space))
        vector = _memory_vector(element, width, array_type.dtype.bitwidth)
        return builder.bitcast(address, ir.PointerType(vector, address_space)), width * array_type.dtype.bitwidth // 8

    def _memory_vector(element, width, bits):
        """The vector type the memory access uses. Elements narrower than 32 bits travel as 32-bit
        words: NVVM splits a <8 x half> access into two 8-byte ones, but not a <4 x i32>."""
        if bits < 32 and width * bits % 32 == 0:
            return ir.VectorType(ir.IntType(32), width * bits // 32)
        return ir.VectorType(element, width)

    def _unpack(builder, loaded, element, n):
        """The n elements of a loaded vector. 32-bit words of two 16-bit elements are split with
        shifts: a bitcast to <8 x half> would be folded back into a <8 x half> load, which NVVM
        splits into two 8-byte loads."""
        if loaded.type.element == element:
            return [builder.extract_element(loaded, ir.Constant(ir.IntType(32), k)) for k in range(n)]
        bits = 32 // (n // loaded.type.count)
        values = []
        for word in range(loaded.type.count):
            value = builder.extract_element(loaded, ir.Constant(ir.IntType(32), word))
            for part in range(32 // bits):
                piece = builder.trunc(builder.lshr(value, ir.Constant(ir.IntType(32), part * bits)), ir.IntType(bits))
                values.append(builder.bitcast(piece, element))
        return values

    def _pack(builder, values, vector_type):
        """The vector to store: the values themselves, or 32-bit words of two 16-bit values."""
        vector = ir.Constant(vector_type, ir.Undefined)
        per_word = len(values) // vector_type.count
        for word in range(vector_type.count):
            if per_word == 1:
                value = values[word]
            else:
                bits = 32 // per_word
                value = ir.Constant(ir.IntType(32), 0)
                for part in range(per_word):
                    piece = builder.zext(builder.bitcast(values[word * per_word + part], ir.IntType(bits)), ir.IntType(32))
                    value = builder.or_(value, builder.shl(piece, ir.Constant(ir.IntType(32), part * bits)))
            vector = builder.insert_element(vector, value, ir.Constant(ir.IntType(32), word))
        return vector

    def _wide_types_ok(array, index):
        return (isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)
                and isinstance(array.dtype, (types.Float, types.Integer)))

    def _make_load(address_space, width=WIDTH):
        def load(typingctx, array, index):
            if not _wide_types_ok(array, index):
                return None
            n = _width(array.dtype, width)
            quad = types.UniTuple(array.dtype, n)

            def codegen(context, builder, signature, args):
                pointer, alignment = _quad_pointer(context, builder, signature.args[0], args[0], args[1],
                                                   signature.args[1], address_space, n)
                element = context.get_data_type(signature.args[0].dtype)
                loaded = builder.load(pointer, align=alignment)
                values = _unpack(builder, loaded, element, n)
                return context.make_tuple(builder, quad, values)

            return quad(array, index), codegen

        return load

    def _make_store(address_space, width=WIDTH):
        def store(typingctx, array, index, quad):
            if not _wide_types_ok(array, index) or not isinstance(quad, types.BaseTuple):
                return None
            n = _width(array.dtype, width)
            if len(quad) != n:
                return None

            def codegen(context, builder, signature, args):
                array_type, index_type, quad_type = signature.args
                pointer, alignment = _quad_pointer(context, builder, array_type, args[0], args[1], index_type,
                                                   address_space, n)
                values = [context.cast(builder, builder.extract_value(args[2], k), quad_type[k], array_type.dtype)
                          for k in range(n)]
                builder.store(_pack(builder, values, pointer.type.pointee), pointer, align=alignment)
                return context.get_dummy_value()

            return types.none(array, index, quad), codegen

        return store

    @intrinsic
    def atomic_add4(typingctx, array, index, quad):
        if not (_wide_types_ok(array, index) and array.dtype == types.float32
                and isinstance(quad, types.BaseTuple) and len(quad) == WIDTH):
            return None

        def codegen(context, builder, signature, args):
            array_type, index_type, quad_type = signature.args
            pointer, _ = _quad_pointer(context, builder, array_type, args[0], args[1], index_type, GLOBAL, WIDTH)
            values = [context.cast(builder, builder.extract_value(args[2], k), quad_type[k], types.float32)
                      for k in range(WIDTH)]
            f32 = ir.FloatType()
            red = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [ir.IntType(64)] + [f32] * WIDTH),
                               "red.global.add.v4.f32 [$0], {$1, $2, $3, $4};", "l,f,f,f,f,~{memory}",
                               side_effect=True)  # no outputs: without side effects LLVM drops it
            builder.call(red, [builder.ptrtoint(pointer, ir.IntType(64))] + values)
            return context.get_dummy_value()

        return types.none(array, index, quad), codegen

    load4 = intrinsic(_make_load(GLOBAL))
    store4 = intrinsic(_make_store(GLOBAL))
    shared_load4 = intrinsic(_make_load(SHARED))
    shared_store4 = intrinsic(_make_store(SHARED))
    load16 = intrinsic(_make_load(GLOBAL, None))
    store16 = intrinsic(_make_store(GLOBAL, None))

else:  # the simulator: element by element, checking what a GPU would fault on
    from .simulator import watch

    def _check(array, index, name, width):
        host = getattr(array, "_ary", array)
        itemsize = host.dtype.itemsize
        n = width or per16(host.dtype)
        if not host.flags.c_contiguous:
            raise TypeError(f"{name}: the array must be C-contiguous (numba's compiler would reject it)")
        if index % n:
            raise ValueError(f"{name}: misaligned address: element {index} is not a multiple of {n} "
                             f"({n * itemsize}-byte access); a GPU faults here")
        if host.__array_interface__["data"][0] % (n * itemsize):
            raise ValueError(f"{name}: misaligned address: the array's first element is not "
                             f"{n * itemsize}-byte aligned (a view at an odd offset?); a GPU faults here")
        if not 0 <= index <= host.size - n:
            raise IndexError(f"{name}: elements {index}..{index + n - 1} of an array of {host.size}: "
                             "past the end (a GPU would not notice; handle the tail with plain indexing)")
        return host.reshape(-1)

    def _simulated(name, loads, width=WIDTH):
        space = "shared" if name.startswith("shared") else "global"

        def load(array, index):
            flat = _check(array, index, name, width)
            n = width or per16(flat.dtype)
            if watch.active():  # one access of n elements, as the hardware makes it
                watch.report(space, "ld", flat, index, size=n * flat.itemsize)
            return tuple(flat[index + k] for k in range(n))

        def store(array, index, quad):
            flat = _check(array, index, name, width)
            if len(quad) != (width or per16(flat.dtype)):
                raise TypeError(f"{name}: {len(quad)} values for a {width or per16(flat.dtype)}-wide store")
            for k in range(len(quad)):
                flat[index + k] = quad[k]  # NumPy converts (and rounds float32 -> float16) as the GPU does
            if watch.active():
                watch.report(space, "st", flat, index, tuple(flat[index:index + len(quad)]),
                             size=len(quad) * flat.itemsize)

        function = load if loads else store
        # named as the module attribute it becomes: the compile worker finds the real one by that name
        function.__name__ = function.__qualname__ = name
        return function

    load4, store4 = _simulated("load4", True), _simulated("store4", False)

    def atomic_add4(array, index, quad):
        dtype = getattr(array, "_ary", array).dtype
        if dtype != np.float32 or len(quad) != WIDTH:  # before the alignment, which depends on the dtype
            raise TypeError(f"atomic_add4: 4 values into a float32 array, not {len(quad)} into {dtype}")
        flat = _check(array, index, "atomic_add4", WIDTH)
        for k in range(WIDTH):  # whole: a simulated thread gives way only where it waits (simulator/scheduler.py)
            flat[index + k] += np.float32(quad[k])
    shared_load4, shared_store4 = _simulated("shared_load4", True), _simulated("shared_store4", False)
    load16, store16 = _simulated("load16", True, None), _simulated("store16", False, None)
    from . import capability

    capability.guard(globals(), "memory")  # (answering as an older GPU: what it lacks raises)
