"""Tensor cores from numba.cuda: warp-wide matrix multiply-accumulate, ldmatrix and cp.async.

numba has no tensor-core API, but it does not need one: like workbook/memory.py's wide loads, each
function here is a numba `@intrinsic` whose body emits one PTX instruction (inline assembly through
llvmlite). What a kernel gets:

    mma_tf32(a, b, c) -> d     mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32: D = A·B + C for a
                               16x8 tile, K = 8. a: 4 values, b: 2 values (float32, or their bits as
                               uint32), c and d: 4 float32. The whole warp computes one tile together.
    mma_f16(a, b, c) -> d      mma.sync.aligned.m16n8k16...f32.f16.f16.f32: K = 16, a and b packed
    mma_bf16(a, b, c) -> d     two halves per uint32 register (4 and 2 registers), FP32 accumulators
    to_tf32(x) -> float32      cvt.rna.tf32.f32: x rounded to TF32 (10 mantissa bits, nearest, ties
                               away from zero), kept in a float32; given a uint32 (a float32's bits,
                               as ldmatrix hands them out), the rounded bits
    pack_f16x2(lo, hi) -> uint32   two float16 in one register: lo in bits 0-15, as mma wants them;
                               float32 values are rounded (to nearest) by one cvt.rn.f16x2.f32 (8.0+)
    pack_bf16x2(lo, hi) -> uint32  two float32 rounded to BF16 (to nearest, ties to even) and packed
                               the same way, by one cvt.rn.bf16x2.f32 (8.0+): mma_bf16's operands.
                               BF16 data lives in uint16 arrays of its bits (NumPy has no bfloat16):
                               to_bf16 and from_bf16 convert on the host
    ldmatrix_x1/_x2/_x4(s, i) -> 1/2/4 uint32      ldmatrix.sync.aligned.m8n8.xN.shared.b16: the warp
    ldmatrix_x1/_x2/_x4_trans(s, i)                reads 1, 2 or 4 8x8 matrices of 16-bit elements
                               from shared memory; lane L gives the address of row L % 8 of matrix
                               L // 8 (s[i], 16 bytes), and gets back, from each matrix, the two
                               elements of row L // 4 at columns 2·(L % 4) and +1, packed in one
                               uint32: exactly an mma fragment. `_trans` hands out the transposed
                               matrix (a column pair instead of a row pair). A float32 array works
                               too: a row is then 4 floats, and lane L gets column L % 4 of row
                               L // 4 -- TF32's A fragment.
    cp_async16(s, i, g, j, n)  cp.async.cg.shared.global: copy 16 bytes g[j..] -> s[i..] without
                               passing through registers; only the first n bytes (0..16) are read and
                               the rest of the 16 are zero-filled (a tile's ragged edge). It lands
                               only once waited for:
    cp_async_commit()          cp.async.commit_group: close the group of copies issued since the last
    cp_async_wait(n)           cp.async.wait_group n: wait until at most n committed groups are still
                               in flight (n a constant); cp_async_wait(0) waits for all of them

On an H100 (sm_90a, "architecture-accelerated": a kernel using these is compiled for sm_90a only,
see wgmma_compile), the warpgroup MMA reads A and B straight from shared memory:

    wgmma_f16(acc, da, db)     wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 (tf32: m64n128k8):
    wgmma_tf32(acc, da, db)    acc (a local float32 array of 64) += A (64 x 16 halves / 8 floats) @
                               B^T's rows (128 of them, same depth), the 4 warps of a warpgroup (128
                               threads) together; A and B^T K-major in shared memory, described by
                               da and db (shared_descriptor). Asynchronous: acc is written, and the
                               tiles may be read, until the wgmma_wait that covers it
    wgmma_f16_from_registers(acc, a, db)    the same product with A from registers and B N-major:
                               a is the warp's 16 rows of A (16 deep) as mma_f16's A fragment (4
                               uint32; warp w of the warpgroup gives rows 16w..16w+15), so an
                               accumulator tile turned to FP16 is the next product's A (attention's
                               P); B (16 x 128) is 16 rows of K in shared memory, each 64 halves of N
                               wide, panels of 64 columns `panel_stride` apart (n_major_descriptor):
                               a row-major tile such as V's, as it is
    wgmma_fence()              wgmma.fence: before a warpgroup's first wgmma on registers that other
                               instructions wrote (each step, as CUTLASS does)
    wgmma_commit()             wgmma.commit_group: close the group of wgmma issued since the last
    wgmma_wait(n)              wgmma.wait_group n: at most n groups still running (n a constant)
    fence_proxy_async()        fence.proxy.async.shared::cta: this thread's earlier shared-memory writes
                               (cp.async's, once waited for) made visible to wgmma's reads
    shared_address(s, i)       the shared-memory address of s[i] (uint32), for a descriptor

    wgmma's accumulators: warp w of the warpgroup holds rows 16w + g and 16w + g + 8 of the 64 x 128
    tile, acc[4j + q] at columns 8j + 2t + q % 2 (q < 2: row 16w + g; q >= 2: row 16w + g + 8), with
    g = lane // 4, t = lane % 4: mma's C layout, sixteen n8 tiles side by side.
    The tiles' layout this workbook uses is the 128-byte swizzle (descriptor layout type 1): rows of
    128 bytes, 16-byte unit u of row r stored at unit u ^ (r % 8), in atoms of 8 rows (1024 bytes,
    1024-aligned); a descriptor's start steps 32 bytes along a row per instruction.

Fragment layouts (PTX ISA, "Matrix fragments for mma.m16n8k8 / m16n8k16"), with g = lane // 4 and
t = lane % 4:

    m16n8k8 TF32   A 16x8:  a0 (g, t)   a1 (g+8, t)   a2 (g, t+4)   a3 (g+8, t+4)
                   B 8x8:   b0 (k=t, n=g)   b1 (k=t+4, n=g)
    m16n8k16 F16   A 16x16: a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
                   B 16x8:  b0 (k=2t..2t+1, n=g)   b1 (k=2t+8.., n=g)
    both           C, D 16x8:  c0 (g, 2t)  c1 (g, 2t+1)  c2 (g+8, 2t)  c3 (g+8, 2t+1)

`fragment_coordinates(kind)` (host side) gives these tables as arrays.

The rules are the hardware's. Every lane of the warp must execute each mma and ldmatrix (`.sync
.aligned`): one inside a branch some lanes skip, or in a warp cut short by the block size, is
undefined on a GPU. ldmatrix and cp.async need 16-byte-aligned rows. The instructions need compute
capability 8.0 (TF32, BF16, m16n8k16, cp.async) or 7.5 (ldmatrix), wgmma 9.0 alone (sm_90a):
workbook/capability.py lists them, and the chapters' wrappers ask it (`capability.supports`) and say so
instead of failing to load.

In the simulator each is plain Python with the same effect: an mma or ldmatrix is a warp collective
(simulator/collectives.py) that gathers every lane's fragment into the matrices, multiplies them in
float64 and rounds to float32 (a GPU's accumulation order is not IEEE's, which the tolerances allow
for), and hands each lane its part of the result; a lane that skips it, a partial warp, a misaligned
or out-of-range row is an error that says so. mma_tf32 keeps only the top 19 bits of each A and B
value it is given (the tensor core ignores the rest: round with to_tf32 first). A cp.async reads its
source when issued and writes shared memory only at the cp_async_wait that covers it, so a missing
wait reads the stale tile there as it may on a GPU.
"""

from numba import cuda as _cuda

from . import MODE
from .tensor_layouts import (MMA_SHAPES, SWIZZLE_ATOM, SWIZZLE_ROW, TF32_MASK, WGMMA_ACCUMULATORS,  # noqa: F401
                             WGMMA_SHAPES, decode_descriptor, fragment_coordinates, from_bf16, n_major_descriptor,
                             round_tf32, shared_descriptor, swizzle128, to_bf16, truncate_tf32, wgmma_coordinates)

ROW_BYTES = 16  # one ldmatrix row, one cp.async


@_cuda.jit(device=True, forceinline=True)
def swizzled_chunk_64(row, chunk):
    """The chunk where 16-byte chunk `chunk` of row `row` of a tile of 64-byte rows is stored.

    A tile in shared memory is rows of 16-byte chunks (an ldmatrix row, a cp.async), and chunk c of
    row r is stored at chunk c XOR some bits of r. The 8 rows an ldmatrix matrix reads down one
    chunk column then sit in 8 different chunks of their 128 bytes: 8 different groups of 4 banks,
    no conflict. Stored as they come, rows of 64 bytes would put 2 of them in each group, rows of
    128 bytes all 8 in one. Two 64-byte rows share 128 bytes, so bits 1-2 of the row pick the
    pattern here; a 128-byte row is a group by itself, and its bits 0-2 do (swizzled_chunk_128,
    wgmma's 128-byte swizzle):

        64-byte rows (4 chunks): c ^ ((r >> 1) & 3)       128-byte rows (8 chunks): c ^ (r & 7)
            r 0, 1:  0 1 2 3                                  r 0:  0 1 2 3 4 5 6 7
            r 2, 3:  1 0 3 2                                  r 1:  1 0 3 2 5 4 7 6
            r 4, 5:  2 3 0 1                                  r 2:  2 3 0 1 6 7 4 5
            r 6, 7:  3 2 1 0                                  ...
    """
    return chunk ^ ((row >> 1) & 3)


@_cuda.jit(device=True, forceinline=True)
def swizzled_chunk_128(row, chunk):
    """The chunk where 16-byte chunk `chunk` of row `row` of a tile of 128-byte rows is stored."""
    return chunk ^ (row & 7)


def make_mainloop(issue, fragments, multiply, stages=3):
    """The mainloop of an mma.sync kernel, written once; a kernel passes what is its own (CuTe's
    split of a GEMM into a mainloop and its copies, fragments and MMA). Three device functions of
    `operands`, a tuple the kernel packs (its arrays, shared tiles, copy plans, the warp's place):

        issue(operands, state, stage, step) -> state   this thread's cp.async copies of step `step`
                                                       into `stage`; `state` what a copy carries to
                                                       the next (a gather's position), else 0
        fragments(operands, stage, half, a, b)         the warp's fragments of half `half` of a stage
        multiply(a, b, acc)                            acc += A x B on the tensor cores

    mainloop(operands, state, steps, acc, a0, a1, b0, b1), `stages` steps of copies deep:
      1. the prologue: steps 0 .. stages - 2 issued, a commit group each (empty or not, so that
         cp_async_wait's count of groups still in flight stays right);
      2. wait for step 0, load the first half of its fragments;
      3. every step: load its second half while the first half is multiplied; refill the stage the
         last step read (every warp passed the barrier after reading it); wait for step + 1 and
         sync; load step + 1's first half while this step's second half is multiplied.
    """
    wait_for = stages - 2  # copy groups still in flight after a wait: the later steps

    @_cuda.jit(device=True, forceinline=True)
    def next_stage(stage):
        return stage + 1 if stage < stages - 1 else 0  # not step % stages: a 64-bit division

    @_cuda.jit(device=True, forceinline=True)
    def mainloop(operands, state, steps, acc, a0, a1, b0, b1):
        for s in range(stages - 1):
            if s < steps:
                state = issue(operands, state, s, s)
            cp_async_commit()
        cp_async_wait(wait_for)  # this thread's copies of step 0 have landed ...
        _cuda.syncthreads()  # ... and everyone's
        fragments(operands, 0, 0, a0, b0)
        read, write = 0, stages - 1  # the stage this step reads, the stage it refills
        for step in range(steps):
            fragments(operands, read, 1, a1, b1)
            multiply(a0, b0, acc)
            if step + stages - 1 < steps:
                state = issue(operands, state, write, step + stages - 1)
            cp_async_commit()
            cp_async_wait(wait_for)  # step + 1's copies have landed, and every warp is done reading
            _cuda.syncthreads()  # this step's stage (both halves' fragments are in registers)
            read, write = next_stage(read), next_stage(write)
            if step + 1 < steps:
                fragments(operands, read, 0, a0, b0)
            multiply(a1, b1, acc)

    return mainloop


def tensor_cores(compute_capability):
    """Does a GPU of this compute capability have every mma.sync instruction here (sm_80 and up)?
    workbook/capability.py's table says which instruction needs what."""
    from . import capability

    return capability.supports(*capability.MMA_SYNC, "mma.sync.bf16", cc=compute_capability)


def wgmma_compile(kernel, argtypes, shared_bytes=0):
    """On a GPU: compile `kernel` for `argtypes` as sm_90a (wgmma needs it), and let it have
    `shared_bytes` of dynamic shared memory (past 48 KB a kernel must ask). numba compiles for the
    GPU's capability, 9.0; its FORCE_CUDA_CC, set only around this compile (and the cubin it
    builds), asks NVVM for compute_90a. Later launches with these argument types find the kernel."""
    from numba.cuda import config

    from .launch import allow_shared_memory

    saved = config.FORCE_CUDA_CC
    config.FORCE_CUDA_CC = (9, 0, "a")
    try:
        compiled = kernel.compile(tuple(argtypes))
        compiled._codelibrary.get_cufunc()  # the PTX and cubin now, while compute_90a is asked for
    finally:
        config.FORCE_CUDA_CC = saved
    return allow_shared_memory(compiled, shared_bytes)

if MODE != "sim":  # a GPU, or the compile worker: the real instructions
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    _i32, _f32 = ir.IntType(32), ir.FloatType()

    def _bits(context, builder, value, numba_type):
        """A 32-bit register's worth: a float's float32 bits, an integer converted to uint32."""
        if isinstance(numba_type, types.Float):
            return builder.bitcast(context.cast(builder, value, numba_type, types.float32), _i32)
        return context.cast(builder, value, numba_type, types.uint32)

    def _tuple_of(value, n, kinds):
        return isinstance(value, types.BaseTuple) and len(value) == n and all(isinstance(v, kinds) for v in value)

    def _make_mma(instruction, a_kinds):
        def mma(typingctx, a, b, c):
            if not (_tuple_of(a, 4, a_kinds) and _tuple_of(b, 2, a_kinds) and _tuple_of(c, 4, types.Number)):
                return None
            result = types.UniTuple(types.float32, 4)

            def codegen(context, builder, signature, args):
                a_type, b_type, c_type = signature.args
                operands = [_bits(context, builder, builder.extract_value(args[0], k), a_type[k]) for k in range(4)]
                operands += [_bits(context, builder, builder.extract_value(args[1], k), b_type[k]) for k in range(2)]
                operands += [context.cast(builder, builder.extract_value(args[2], k), c_type[k], types.float32)
                             for k in range(4)]
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_f32] * 4), [_i32] * 6 + [_f32] * 4),
                                   f"{instruction} {{$0,$1,$2,$3}}, {{$4,$5,$6,$7}}, {{$8,$9}}, {{$10,$11,$12,$13}};",
                                   "=f,=f,=f,=f,r,r,r,r,r,r,0,1,2,3")  # C tied to D: accumulate in place
                out = builder.call(asm, operands)
                return context.make_tuple(builder, result, [builder.extract_value(out, k) for k in range(4)])

            return result(a, b, c), codegen

        return mma

    mma_tf32 = intrinsic(_make_mma("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32",
                                   (types.Float, types.Integer)))
    mma_f16 = intrinsic(_make_mma("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", types.Integer))
    mma_bf16 = intrinsic(_make_mma("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", types.Integer))

    @intrinsic
    def to_tf32(typingctx, x):
        if not isinstance(x, (types.Float, types.Integer)):
            return None
        bits = isinstance(x, types.Integer)  # a float32's bits (from ldmatrix): rounded bits back

        def codegen(context, builder, signature, args):
            if bits:
                value = builder.bitcast(context.cast(builder, args[0], signature.args[0], types.uint32), _f32)
            else:
                value = context.cast(builder, args[0], signature.args[0], types.float32)
            cvt = ir.InlineAsm(ir.FunctionType(_i32, [_f32]), "cvt.rna.tf32.f32 $0, $1;", "=r,f")
            rounded = builder.call(cvt, [value])
            return rounded if bits else builder.bitcast(rounded, _f32)

        return (types.uint32 if bits else types.float32)(x), codegen

    @intrinsic
    def pack_f16x2(typingctx, lo, hi):
        if not (isinstance(lo, types.Number) and isinstance(hi, types.Number)):
            return None

        halves_given = all(t == types.float16 for t in (lo, hi))

        def codegen(context, builder, signature, args):
            if not halves_given:  # two float32 rounded to FP16 and packed by one instruction (8.0+)
                cvt = ir.InlineAsm(ir.FunctionType(_i32, [_f32, _f32]), "cvt.rn.f16x2.f32 $0, $1, $2;", "=r,f,f")
                hi_value, lo_value = (context.cast(builder, v, t, types.float32)
                                      for v, t in zip(args[::-1], signature.args[::-1]))
                return builder.call(cvt, [hi_value, lo_value])
            halves = [builder.zext(builder.bitcast(context.cast(builder, v, t, types.float16), ir.IntType(16)), _i32)
                      for v, t in zip(args, signature.args)]
            return builder.or_(halves[0], builder.shl(halves[1], ir.Constant(_i32, 16)))

        return types.uint32(lo, hi), codegen

    @intrinsic
    def pack_bf16x2(typingctx, lo, hi):
        if not (isinstance(lo, types.Number) and isinstance(hi, types.Number)):
            return None

        def codegen(context, builder, signature, args):
            cvt = ir.InlineAsm(ir.FunctionType(_i32, [_f32, _f32]), "cvt.rn.bf16x2.f32 $0, $1, $2;", "=r,f,f")
            hi_value, lo_value = (context.cast(builder, v, t, types.float32) for v, t in zip(args[::-1], signature.args[::-1]))
            return builder.call(cvt, [hi_value, lo_value])

        return types.uint32(lo, hi), codegen

    def _address(context, builder, array_type, array, index, index_type, space):
        """&a[index] in state space `space` (1 global, 3 shared) as an integer: 32 bits for shared."""
        element = context.get_data_type(array_type.dtype)
        data = context.make_array(array_type)(context, builder, array).data
        index = context.cast(builder, index, index_type, types.intp)
        pointer = builder.addrspacecast(builder.gep(data, [index]), ir.PointerType(element, space))
        address = builder.ptrtoint(pointer, ir.IntType(64))
        return builder.trunc(address, _i32) if space == 3 else address

    def _array_ok(array, index):
        return (isinstance(array, types.Array) and array.layout == "C" and isinstance(index, types.Integer)
                and array.dtype.bitwidth in (16, 32))

    def _make_ldmatrix(count, trans):
        def ldmatrix(typingctx, array, index):
            if not _array_ok(array, index):
                return None
            result = types.UniTuple(types.uint32, count)
            outputs = ",".join(f"${k}" for k in range(count))

            def codegen(context, builder, signature, args):
                address = _address(context, builder, signature.args[0], args[0], args[1], signature.args[1], 3)
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_i32] * count) if count > 1 else _i32, [_i32]),
                                   f"ldmatrix.sync.aligned.m8n8.x{count}{'.trans' if trans else ''}.shared.b16 "
                                   f"{{{outputs}}}, [${count}];",
                                   ",".join(["=r"] * count + ["r"]), side_effect=True)
                out = builder.call(asm, [address])
                values = [builder.extract_value(out, k) for k in range(count)] if count > 1 else [out]
                return context.make_tuple(builder, result, values)

            return result(array, index), codegen

        return ldmatrix

    ldmatrix_x1, ldmatrix_x2, ldmatrix_x4 = (intrinsic(_make_ldmatrix(n, False)) for n in (1, 2, 4))
    ldmatrix_x1_trans, ldmatrix_x2_trans, ldmatrix_x4_trans = (intrinsic(_make_ldmatrix(n, True)) for n in (1, 2, 4))

    @intrinsic
    def cp_async16(typingctx, shared, shared_index, source, source_index, source_bytes):
        if not (_array_ok(shared, shared_index) and _array_ok(source, source_index)
                and isinstance(source_bytes, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            s_type, si_type, g_type, gi_type, n_type = signature.args
            destination = _address(context, builder, s_type, args[0], args[1], si_type, 3)
            origin = _address(context, builder, g_type, args[2], args[3], gi_type, 1)
            count = context.cast(builder, args[4], n_type, types.uint32)
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), [_i32, ir.IntType(64), _i32]),
                               "cp.async.cg.shared.global [$0], [$1], 16, $2;", "r,l,r,~{memory}", side_effect=True)
            builder.call(asm, [destination, origin, count])
            return context.get_dummy_value()

        return types.none(shared, shared_index, source, source_index, source_bytes), codegen

    @intrinsic
    def cp_async_commit(typingctx):
        def codegen(context, builder, signature, args):
            asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), "cp.async.commit_group;", "~{memory}",
                               side_effect=True)
            builder.call(asm, [])
            return context.get_dummy_value()

        return types.none(), codegen

    def _make_wait(instruction):
        def wait(typingctx, n):
            if not isinstance(n, types.IntegerLiteral):  # PTX takes the count as an immediate
                return None
            groups = n.literal_value

            def codegen(context, builder, signature, args):
                asm = ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), f"{instruction} {groups};", "~{memory}",
                                   side_effect=True)
                builder.call(asm, [])
                return context.get_dummy_value()

            return types.none(n), codegen

        return wait

    cp_async_wait = intrinsic(_make_wait("cp.async.wait_group"))

    _WGMMA = {"f16": "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {{{outs}}}, $64, $65, 1, 1, 1, 0, 0;",
              "tf32": "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {{{outs}}}, $64, $65, 1, 1, 1;"}

    def _make_wgmma(kind):
        def wgmma(typingctx, acc, desc_a, desc_b):
            if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.ndim == 1
                    and isinstance(desc_a, types.Integer) and isinstance(desc_b, types.Integer)):
                return None

            def codegen(context, builder, signature, args):
                a_type, da_type, db_type = signature.args
                data = context.make_array(a_type)(context, builder, args[0]).data
                slots = [builder.gep(data, [ir.Constant(ir.IntType(64), i)]) for i in range(WGMMA_ACCUMULATORS)]
                values = [builder.load(slot) for slot in slots]  # a local array: registers, once LLVM is done
                n = WGMMA_ACCUMULATORS
                text = _WGMMA[kind].format(outs=",".join(f"${i}" for i in range(n)))
                constraints = ",".join(["=f"] * n + ["l", "l"] + [str(i) for i in range(n)]) + ",~{memory}"
                asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_f32] * n), [ir.IntType(64)] * 2 + [_f32] * n),
                                   text, constraints, side_effect=True)
                descriptors = [context.cast(builder, v, t, types.uint64) for v, t in ((args[1], da_type), (args[2], db_type))]
                out = builder.call(asm, descriptors + values)
                for i in range(n):
                    builder.store(builder.extract_value(out, i), slots[i])
                return context.get_dummy_value()

            return types.none(acc, desc_a, desc_b), codegen

        return wgmma

    wgmma_f16, wgmma_tf32 = intrinsic(_make_wgmma("f16")), intrinsic(_make_wgmma("tf32"))

    @intrinsic
    def wgmma_f16_from_registers(typingctx, acc, a, desc_b):
        if not (isinstance(acc, types.Array) and acc.dtype == types.float32 and acc.ndim == 1
                and _tuple_of(a, 4, types.Integer) and isinstance(desc_b, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            acc_type, a_type, db_type = signature.args
            data = context.make_array(acc_type)(context, builder, args[0]).data
            n = WGMMA_ACCUMULATORS
            slots = [builder.gep(data, [ir.Constant(ir.IntType(64), i)]) for i in range(n)]
            values = [builder.load(slot) for slot in slots]
            registers = [_bits(context, builder, builder.extract_value(args[1], k), a_type[k]) for k in range(4)]
            outs = ",".join(f"${i}" for i in range(n))
            text = (f"wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {{{outs}}}, {{${n},${n + 1},${n + 2},"
                    f"${n + 3}}}, ${n + 4}, 1, 1, 1, 1;")  # scale-d, scale-a, scale-b 1; B transposed (N-major)
            constraints = ",".join(["=f"] * n + ["r"] * 4 + ["l"] + [str(i) for i in range(n)]) + ",~{memory}"
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_f32] * n), [_i32] * 4 + [ir.IntType(64)] + [_f32] * n),
                               text, constraints, side_effect=True)
            out = builder.call(asm, registers + [context.cast(builder, args[2], db_type, types.uint64)] + values)
            for i in range(n):
                builder.store(builder.extract_value(out, i), slots[i])
            return context.get_dummy_value()

        return types.none(acc, a, desc_b), codegen

    def _make_fixed(text):
        def fixed(typingctx):
            def codegen(context, builder, signature, args):
                builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, "~{memory}", side_effect=True), [])
                return context.get_dummy_value()

            return types.none(), codegen

        return fixed

    wgmma_fence = intrinsic(_make_fixed("wgmma.fence.sync.aligned;"))
    wgmma_commit = intrinsic(_make_fixed("wgmma.commit_group.sync.aligned;"))
    fence_proxy_async = intrinsic(_make_fixed("fence.proxy.async.shared::cta;"))

    wgmma_wait = intrinsic(_make_wait("wgmma.wait_group.sync.aligned"))

    @intrinsic
    def shared_address(typingctx, array, index):
        if not _array_ok(array, index):
            return None

        def codegen(context, builder, signature, args):
            return _address(context, builder, signature.args[0], args[0], args[1], signature.args[1], 3)

        return types.uint32(array, index), codegen

else:  # the simulator
    from .simulator.tensor_ops import (cp_async16, cp_async_commit, cp_async_wait, fence_proxy_async,  # noqa: F401
                                       ldmatrix_x1, ldmatrix_x1_trans, ldmatrix_x2, ldmatrix_x2_trans, ldmatrix_x4,
                                       ldmatrix_x4_trans, mma_bf16, mma_f16, mma_tf32, pack_bf16x2, pack_f16x2,
                                       shared_address,
                                       to_tf32, wgmma_commit, wgmma_f16, wgmma_f16_from_registers, wgmma_fence,
                                       wgmma_tf32, wgmma_wait)
    from . import capability

    capability.guard(globals(), "tensor_cores")  # (answering as an older GPU: what it lacks raises)
