"""16-byte loads and stores of four float32 (`ld.global.v4.f32`), which numba does not emit by itself.

    x0, x1, x2, x3 = load_f32x4(x, q)          x[4q], x[4q+1], x[4q+2], x[4q+3] in one instruction
    store_f32x4(y, q, y0, y1, y2, y3)

Why: numba's array accesses are 4-byte loads (it cannot prove that x[4q] is 16-byte aligned, so LLVM
never merges four of them). A warp of 4-byte loads asks for 128 bytes per instruction; a warp of
16-byte loads asks for 512: the same bytes in a quarter of the load/store instructions, and, where a
thread would otherwise have a single 4-byte load outstanding, four times the bytes in flight (what
sets the bandwidth, by Little's law). torch's elementwise kernels use 16-byte accesses too.

This is not in the workbook helper package, so it lives in the chapter: a numba `@intrinsic` that
emits the PTX instruction through LLVM inline assembly (the way numba-cuda's own cache-hint loads
`cuda.ldcs` are built). The caller must guarantee that the array's data is 16-byte aligned and that
4q + 3 < x.size; the host wrappers check the alignment (see kernels.is_aligned16) and fall back to
the scalar versions below otherwise. In the simulator, the scalar versions are all there is.
"""

from llvmlite import ir
from numba import cuda, types

import workbook


@cuda.jit(device=True, inline=True)
def load_scalar_x4(array, quad):
    """Four 4- or 2-byte loads: any dtype, any alignment."""
    i = quad * 4
    return array[i], array[i + 1], array[i + 2], array[i + 3]


@cuda.jit(device=True, inline=True)
def store_scalar_x4(array, quad, v0, v1, v2, v3):
    i = quad * 4
    array[i] = v0
    array[i + 1] = v1
    array[i + 2] = v2
    array[i + 3] = v3


def _element_pointer(context, builder, array_type, array, quad):
    """Address of array[4 * quad] (a float*), computed from the array's data pointer."""
    data = context.make_array(array_type)(context, builder, value=array).data
    index = builder.mul(builder.sext(quad, ir.IntType(64)) if quad.type.width < 64 else quad,
                        ir.Constant(ir.IntType(64), 4))
    return builder.gep(data, [index])


def make_load_f32x4(instruction="ld.global.v4.f32"):
    """An intrinsic emitting `instruction` (a 4 x f32 vector load; a cache hint may be added)."""
    from numba.cuda.extending import intrinsic

    @intrinsic
    def load_f32x4(typingctx, array, quad):
        if not (isinstance(array, types.Array) and array.dtype == types.float32
                and isinstance(quad, types.Integer)):
            return None
        signature = types.UniTuple(types.float32, 4)(array, quad)

        def codegen(context, builder, sig, args):
            pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1])
            f32 = ir.FloatType()
            function = ir.FunctionType(ir.LiteralStructType([f32] * 4), [pointer.type])
            # Not marked side-effecting: the load may be scheduled early, which is what we want.
            load = ir.InlineAsm(function, instruction + " {$0, $1, $2, $3}, [$4];", "=f,=f,=f,=f,l")
            four = builder.call(load, [pointer])
            values = [builder.extract_value(four, j) for j in range(4)]
            return context.make_tuple(builder, sig.return_type, values)

        return signature, codegen

    return load_f32x4


def make_store_f32x4(instruction="st.global.v4.f32"):
    """An intrinsic emitting `instruction` (a 4 x f32 vector store)."""
    from numba.cuda.extending import intrinsic

    @intrinsic
    def store_f32x4(typingctx, array, quad, v0, v1, v2, v3):
        if not (isinstance(array, types.Array) and array.dtype == types.float32
                and isinstance(quad, types.Integer)):
            return None
        signature = types.void(array, quad, types.float32, types.float32, types.float32,
                               types.float32)

        def codegen(context, builder, sig, args):
            pointer = _element_pointer(context, builder, sig.args[0], args[0], args[1])
            f32 = ir.FloatType()
            function = ir.FunctionType(ir.VoidType(), [pointer.type] + [f32] * 4)
            store = ir.InlineAsm(function, instruction + " [$0], {$1, $2, $3, $4};", "l,f,f,f,f",
                                 side_effect=True)
            builder.call(store, [pointer, *args[2:]])
            return context.get_dummy_value()

        return signature, codegen

    return store_f32x4


if workbook.ON_GPU:
    load_f32x4 = make_load_f32x4()
    store_f32x4 = make_store_f32x4()
else:
    load_f32x4 = load_scalar_x4
    store_f32x4 = store_scalar_x4
