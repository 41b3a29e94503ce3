"""Probe (GPU only, sm_90a): what wgmma reaches from numba on an H100, beside chapter 09's mma.sync
GEMMs and cuBLAS, FP16 and TF32 at n^3. Not part of the chapter yet: there is no simulator model of
wgmma, and the sm_90a target is set for the whole process here (numba's FORCE_CUDA_CC).

    python tools/wgmma_probe.py [n] [repeats] [conv]

A block of two warpgroups (256 threads) computes a 128x128 tile of C = A @ B^T, each warpgroup 64x128
with wgmma.mma_async (m64n128k16 FP16, m64n128k8 TF32; 64 FP32 accumulators a thread). A and B^T
tiles, K-major, 128 bytes deep a stage (64 halves, 32 floats), are copied by cp.async into the
layout of wgmma's 128-byte swizzle (unit u of 16 bytes of row r at u ^ (r % 8), 8-row atoms of
1024 bytes, 1024-aligned); wgmma reads them from shared memory through descriptors. With no
swizzle ("interleaved" 8x16-byte core matrices) the same kernel ran at a third of the speed.
Stages in dynamic shared memory (over 48 KB: the limit raised by cuKernelSetAttribute). Full tiles
only (n a multiple of 128). TF32: the tensor core reads the float32 bits and drops the low 13
(truncation, no cvt.rna), as the chapter's mma.sync kernels do for A.
"""
import sys

import workbook  # noqa: F401, I001

import numpy as np
from llvmlite import ir
from numba import cuda, float32, int32, uint32, uint64
from numba.cuda import config, types
from numba.cuda.extending import intrinsic

from chapters.ch09_tensor_cores import kernels as k
from workbook import bench
from workbook.tensor_cores import cp_async16, cp_async_commit, cp_async_wait

config.FORCE_CUDA_CC = (9, 0, "a")  # wgmma is an sm_90a ("architecture-accelerated") instruction

_i32, _i64, _f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()


def _asm(builder, text, constraints="~{memory}"):
    builder.call(ir.InlineAsm(ir.FunctionType(ir.VoidType(), []), text, constraints, side_effect=True), [])


@intrinsic
def shared_address(typingctx, array, index):
    """&array[index] in the shared window, as wgmma's descriptors want it."""
    def codegen(context, builder, signature, args):
        a_type, i_type = signature.args
        data = context.make_array(a_type)(context, builder, args[0]).data
        index = context.cast(builder, args[1], i_type, types.intp)
        pointer = builder.addrspacecast(builder.gep(data, [index]), ir.PointerType(context.get_data_type(a_type.dtype), 3))
        return builder.trunc(builder.ptrtoint(pointer, _i64), _i32)
    return types.uint32(array, index), codegen


def _simple(text):
    @intrinsic
    def instruction(typingctx):
        def codegen(context, builder, signature, args):
            _asm(builder, text)
            return context.get_dummy_value()
        return types.none(), codegen
    return instruction


wgmma_fence = _simple("wgmma.fence.sync.aligned;")
wgmma_commit = _simple("wgmma.commit_group.sync.aligned;")
fence_proxy_async = _simple("fence.proxy.async.shared::cta;")


@intrinsic
def wgmma_wait(typingctx, n):
    if not isinstance(n, types.IntegerLiteral):
        return None
    groups = n.literal_value

    def codegen(context, builder, signature, args):
        _asm(builder, f"wgmma.wait_group.sync.aligned {groups};")
        return context.get_dummy_value()
    return types.none(n), codegen


ACC = 64  # m64n128: 64 x 128 / 128 threads
INSTRUCTIONS = {"f16": "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {{{outs}}}, $64, $65, 1, 1, 1, 0, 0;",
                "tf32": "wgmma.mma_async.sync.aligned.m64n128k8.f32.tf32.tf32 {{{outs}}}, $64, $65, 1, 1, 1;"}


def _make_wgmma(precision):
    def wgmma(typingctx, acc, desc_a, desc_b):
        """acc (a local float32 array of 64) += A (64 x k, desc_a) @ B (k x 128, desc_b), the warpgroup
        together; k = 16 halves or 8 floats: 32 bytes of each row."""
        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            slots = [builder.gep(data, [ir.Constant(_i64, i)]) for i in range(ACC)]
            values = [builder.load(slot) for slot in slots]
            text = INSTRUCTIONS[precision].format(outs=",".join(f"${i}" for i in range(ACC)))
            constraints = ",".join(["=f"] * ACC + ["l", "l"] + [str(i) for i in range(ACC)]) + ",~{memory}"
            asm = ir.InlineAsm(ir.FunctionType(ir.LiteralStructType([_f32] * ACC), [_i64, _i64] + [_f32] * ACC),
                               text, constraints, side_effect=True)
            out = builder.call(asm, [args[1], args[2]] + values)
            for i in range(ACC):
                builder.store(builder.extract_value(out, i), slots[i])
            return context.get_dummy_value()
        return types.none(acc, desc_a, desc_b), codegen
    return intrinsic(wgmma)


WGMMA = {p: _make_wgmma(p) for p in INSTRUCTIONS}
BM, BN, THREADS = 128, 128, 256
ROW_BYTES, UNITS = 128, 8  # a tile row a stage: 128 bytes, 8 units of 16
ATOM = 1024  # bytes: 8 rows of 128, the swizzle's repeat; stages start on such a boundary
CHUNKS = BM * UNITS // THREADS  # a thread's 16-byte chunks of a tile a stage: 4
# the descriptor's fixed fields: leading offset (unused by this layout: K stays within a 128-byte row),
# stride offset (the next 8 rows: one atom), layout type 1 (128-byte swizzle) in bits 62-63
DESCRIPTOR_FIELDS = uint64((16 >> 4) << 16) | uint64((ATOM >> 4) << 32) | uint64(1 << 62)


@cuda.jit(device=True)
def descriptor(address):
    return uint64((address >> 4) & 0x3FFF) | DESCRIPTOR_FIELDS


def make_gemm(precision, STAGES=3):
    """C = A @ B^T on wgmma, STAGES stages of 128 bytes of K, copied STAGES - 1 steps ahead; each step's
    wgmma waited for before the next barrier (so that a refilled stage is no longer read)."""
    wgmma = WGMMA[precision]
    dtype = np.float16 if precision == "f16" else np.float32
    EL = 16 // np.dtype(dtype).itemsize  # elements a 16-byte unit
    BK = UNITS * EL  # elements of K a stage
    STAGE = BM * BK  # elements of one tile's stage (A's and B^T's are both 128 rows)
    B_AT = STAGES * STAGE  # B^T's stages follow A's in the one dynamic array

    @cuda.jit(device=True)
    def issue(x, smem, at, row0, k0, tid):
        """This thread's chunks of a 128 x BK tile of x (rows row0.., K-major), swizzled."""
        K = x.shape[1]
        for i in range(CHUNKS):
            c = tid + THREADS * i  # chunk c: row c / 8, unit c % 8
            r, u = c // UNITS, c % UNITS
            cp_async16(smem, at + (r * UNITS + (u ^ (r % 8))) * EL, x, (row0 + r) * K + k0 + u * EL, 16)

    @cuda.jit
    def gemm_wgmma(a, bt, c):
        K = a.shape[1]
        smem = cuda.shared.array(0, dtype)
        acc = cuda.local.array(ACC, float32)
        for i in range(ACC):
            acc[i] = 0
        tid = cuda.threadIdx.x
        wg = tid // 128
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        steps = K // BK
        pad = (ATOM - shared_address(smem, 0) % ATOM) % ATOM // (16 // EL)  # elements, to the next atom
        for s in range(STAGES - 1):
            issue(a, smem, pad + s * STAGE, row0, s * BK, tid)
            issue(bt, smem, pad + B_AT + s * STAGE, col0, s * BK, tid)
            cp_async_commit()
        base = shared_address(smem, pad)
        read, write = 0, STAGES - 1
        for step in range(steps):
            cp_async_wait(1)  # this thread's copies of `step` have landed (one later step in flight)
            fence_proxy_async()  # the copies' writes, visible to wgmma's (async proxy) reads
            cuda.syncthreads()  # everyone's; and every warpgroup's wgmma of step - 1 is done
            wgmma_fence()
            for kk in range(ROW_BYTES // 32):  # 32 bytes of K an instruction
                da = descriptor(base + uint32((read * STAGE) * (16 // EL) + wg * 64 * ROW_BYTES + kk * 32))
                db = descriptor(base + uint32((B_AT + read * STAGE) * (16 // EL) + kk * 32))
                wgmma(acc, da, db)
            wgmma_commit()
            if step + STAGES - 1 < steps:
                issue(a, smem, pad + write * STAGE, row0, (step + STAGES - 1) * BK, tid)
                issue(bt, smem, pad + B_AT + write * STAGE, col0, (step + STAGES - 1) * BK, tid)
            cp_async_commit()
            wgmma_wait(0)
            read = read + 1 if read < STAGES - 1 else 0
            write = write + 1 if write < STAGES - 1 else 0
        w, lane = (tid % 128) // 32, tid % 32  # D: warp w of the warpgroup holds rows 16w.., as mma's C
        g, t = lane // 4, lane % 4
        for j in range(BN // 8):
            for half in range(2):
                row, col = row0 + 64 * wg + 16 * w + g + 8 * half, col0 + 8 * j + 2 * t
                c[row, col] = acc[4 * j + 2 * half]
                c[row, col + 1] = acc[4 * j + 2 * half + 1]

    return gemm_wgmma, 2 * STAGES * STAGE * np.dtype(dtype).itemsize + ATOM


def make_conv():
    """FP16 convolution, channels last, 3x3, stride 1, pad 1, C a multiple of 64 (a stage is one filter
    tap: 64 channels), on make_gemm's pipeline: A's tile gathered from x (N*H*W*C flat) by cp.async,
    16 bytes of channels a chunk, zero-filled in the padding; wt (K, 9*C) is B^T. out (N*H*W, K)."""
    EL, BK = 8, 64
    STAGES = 3
    wgmma = WGMMA["f16"]
    STAGE = BM * BK
    B_AT = STAGES * STAGE

    @cuda.jit(device=True)
    def issue(x, wt, smem, stage, k0, tap, top, left, start, to, b_source, H, W, C):
        """Step k0's A chunks (this thread's unit of 4 rows, gathered) and B^T chunks into `stage`."""
        tap_r, tap_s, c0 = tap
        shift = (tap_r * W + tap_s) * C + c0
        for i in range(CHUNKS):
            y, v = top[i] + tap_r, left[i] + tap_s
            ok = 0 <= y and y < H and 0 <= v and v < W
            cp_async16(smem, stage * STAGE + to[i], x, start[i] + shift, 16 if ok else 0)
            cp_async16(smem, B_AT + stage * STAGE + to[i], wt, b_source[i] + k0, 16)
        c0 += BK
        if c0 == C:
            c0 = 0
            tap_s += 1
            if tap_s == 3:
                tap_s = 0
                tap_r += 1
        return tap_r, tap_s, c0

    @cuda.jit
    def conv_wgmma(x, wt, out, H, W, C):
        M, KD = out.shape[0], wt.shape[1]
        smem = cuda.shared.array(0, np.float16)
        acc = cuda.local.array(ACC, float32)
        for i in range(ACC):
            acc[i] = 0
        tid = cuda.threadIdx.x
        wg = tid // 128
        row0, col0 = cuda.blockIdx.y * BM, cuda.blockIdx.x * BN
        steps = KD // BK
        pad = (ATOM - shared_address(smem, 0) % ATOM) % ATOM // 2
        # this thread's unit u of rows tid / 8 + 32i of each tile: where each pixel's window starts
        u = tid % UNITS
        top = cuda.local.array(CHUNKS, int32)
        left = cuda.local.array(CHUNKS, int32)
        start = cuda.local.array(CHUNKS, int32)
        to = cuda.local.array(CHUNKS, int32)
        b_source = cuda.local.array(CHUNKS, int32)
        for i in range(CHUNKS):
            r = tid // UNITS + 32 * i
            m = row0 + r
            n = m // (H * W)
            p = (m - n * H * W) // W
            q = m - n * H * W - p * W
            top[i] = p - 1 if m < M else -(1 << 30)
            left[i] = q - 1
            start[i] = ((n * H + top[i]) * W + left[i]) * C + u * EL
            to[i] = pad + (r * UNITS + (u ^ (r % 8))) * EL
            b_source[i] = (col0 + r) * KD + u * EL
        tap = (0, 0, 0)
        for s in range(STAGES - 1):
            tap = issue(x, wt, smem, s, s * BK, tap, top, left, start, to, b_source, H, W, C)
            cp_async_commit()
        base = shared_address(smem, pad)
        read, write = 0, STAGES - 1
        for step in range(steps):
            cp_async_wait(1)
            fence_proxy_async()
            cuda.syncthreads()
            wgmma_fence()
            for kk in range(ROW_BYTES // 32):
                da = descriptor(base + uint32(read * STAGE * 2 + wg * 64 * ROW_BYTES + kk * 32))
                db = descriptor(base + uint32((B_AT + read * STAGE) * 2 + kk * 32))
                wgmma(acc, da, db)
            wgmma_commit()
            if step + STAGES - 1 < steps:
                tap = issue(x, wt, smem, write, (step + STAGES - 1) * BK, tap, top, left, start, to, b_source, H, W, C)
            cp_async_commit()
            wgmma_wait(0)
            read = read + 1 if read < STAGES - 1 else 0
            write = write + 1 if write < STAGES - 1 else 0
        w, lane = (tid % 128) // 32, tid % 32
        g, t = lane // 4, lane % 4
        for j in range(BN // 8):
            for half in range(2):
                row, col = row0 + 64 * wg + 16 * w + g + 8 * half, col0 + 8 * j + 2 * t
                out[row, col] = acc[4 * j + 2 * half]
                out[row, col + 1] = acc[4 * j + 2 * half + 1]

    return conv_wgmma, 2 * STAGES * STAGE * 2 + ATOM


def launcher(kernel, shared_bytes, a, bt, c):
    """kernel's dynamic shared memory limit raised to shared_bytes, and a function launching it."""
    from numba import typeof
    from numba.cuda.cudadrv.driver import binding, driver

    function = kernel.compile((typeof(a), typeof(bt), typeof(c)))._codelibrary.get_cufunc()
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attribute, shared_bytes, function.handle, function.device.id)
    return lambda: kernel[(c.shape[1] // BN, c.shape[0] // BM), THREADS, 0, shared_bytes](a, bt, c)


if __name__ == "__main__":
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 9
    torch = bench.optional_torch()
    torch.backends.cuda.matmul.allow_tf32 = True
    rng = np.random.default_rng(0)
    a32, b32 = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    variants, checks = {}, {}
    for precision, dtype in (("f16", np.float16), ("tf32", np.float32)):
        a, b = a32.astype(dtype), b32.astype(dtype)
        da, db, dbt = cuda.to_device(a), cuda.to_device(b), cuda.to_device(np.ascontiguousarray(b.T))
        out_w, out_p = cuda.device_array((n, n), np.float32), cuda.device_array((n, n), np.float32)
        kernel, shared_bytes = make_gemm(precision)
        ta, tb = torch.as_tensor(da, device="cuda"), torch.as_tensor(db, device="cuda")
        variants[f"{precision} wgmma (A @ B^T)"] = launcher(kernel, shared_bytes, da, dbt, out_w)
        variants[f"{precision} mma.sync pipelined"] = lambda da=da, db=db, out_p=out_p: k.gemm(da, db, out_p)
        variants[f"{precision} cuBLAS"] = lambda ta=ta, tb=tb: torch.matmul(ta, tb)
        checks[precision] = (a, b, out_w, out_p)
    for f in variants.values():
        f()
    cuda.synchronize()
    m = min(n, 512)
    for precision, (a, b, out_w, out_p) in checks.items():
        exact = a[:m].astype(np.float64) @ b.astype(np.float64)
        # TF32: the tensor core truncates what it is given (wgmma) or what was rounded (mma.sync)
        bound = float(k.tolerance(a[:m], b, precision).max())
        if precision == "tf32":  # each input truncated: 2^-10 of it at most, 2^-9 of a product
            bound += 2.0 ** -9 * float((np.abs(a[:m].astype(np.float64)) @ np.abs(b.astype(np.float64))).max())
        for name, out in (("wgmma", out_w), ("pipelined", out_p)):
            err = float(np.abs(out.copy_to_host()[:m] - exact).max())
            print(f"{precision} {name}: max |err| {err:.3e} over the first {m} rows (bound {bound:.3e}): "
                  f"{'ok' if err <= bound else 'WRONG'}")
    if "conv" in sys.argv:  # N=32 C=K=256 56x56 3x3 pad 1, against cuDNN FP16 channels last and the chapter's
        N_, C_, H_ = 32, 256, 56
        x = rng.standard_normal((N_, H_, H_, C_)).astype(np.float16)
        w = (rng.standard_normal((C_, 3, 3, C_)) / np.sqrt(9 * C_)).astype(np.float16)
        dx, dw = cuda.to_device(x), cuda.to_device(w)
        out_c, out_k = (cuda.device_array((N_ * H_ * H_, C_), np.float32) for _ in range(2))
        kernel, shared_bytes = make_conv()
        dx_flat, dw2 = dx.reshape(-1), dw.reshape(C_, -1)
        from numba import typeof
        from numba.cuda.cudadrv.driver import binding, driver
        function = kernel.compile((typeof(dx_flat), typeof(dw2), typeof(out_c), typeof(1), typeof(1), typeof(1)))
        function = function._codelibrary.get_cufunc()
        driver.cuKernelSetAttribute(binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                    shared_bytes, function.handle, function.device.id)
        grid = (C_ // BN, N_ * H_ * H_ // BM)
        tx, tw = (torch.as_tensor(d, device="cuda").permute(0, 3, 1, 2) for d in (dx, dw))
        torch.backends.cudnn.benchmark = True
        conv_variants = {
            "conv wgmma": lambda: kernel[grid, THREADS, 0, shared_bytes](dx_flat, dw2, out_c, H_, H_, C_),
            "conv mma.sync (chapter)": lambda: k.conv2d(dx, dw, out_k.reshape(N_, H_, H_, C_), padding=1),
            "conv cuDNN FP16 NHWC": lambda: torch.nn.functional.conv2d(tx, tw, padding=1)}
        for f in conv_variants.values():
            f()
        cuda.synchronize()
        x0 = x[:1]
        a0, b0, _ = k.conv_as_gemm(x0, w, 1, 1, 1)
        ref = k.conv_reference(x0, w, "f16", 1, 1, 1).reshape(H_ * H_, C_)
        bound = float(k.tolerance(a0, b0, "f16").max())
        for name, o in (("wgmma", out_c), ("mma.sync", out_k)):
            err = float(np.abs(o.copy_to_host()[:H_ * H_] - ref).max())
            print(f"conv {name}: image 0 max |err| {err:.3e} (bound {bound:.3e}): {'ok' if err <= bound else 'WRONG'}")
        variants.update(conv_variants)
    t = bench.time_interleaved(variants, repeats=repeats)
    med = {name: float(np.median(ms)) for name, ms in t.items()}
    print(f"{cuda.get_current_device().name} n={n} repeats={repeats}")
    for name, ms in t.items():
        flops = 2 * 32 * 56 * 56 * 256 * 256 * 9 if name.startswith("conv") else 2 * n**3
        print(f"{name:26s} median {med[name]:.3f} ms [{ms.min():.3f}-{ms.max():.3f}] {flops / med[name] / 1e9:7.1f} TFLOP/s")
    if "conv" in sys.argv:
        ratios = t["conv cuDNN FP16 NHWC"] / t["conv wgmma"]
        print(f"conv: wgmma / cuDNN {np.median(ratios):.3f} [{ratios.min():.3f}-{ratios.max():.3f}], "
              f"mma.sync / cuDNN {med['conv cuDNN FP16 NHWC'] / med['conv mma.sync (chapter)']:.3f}")
    for precision in checks:
        ratios = t[f"{precision} cuBLAS"] / t[f"{precision} wgmma (A @ B^T)"]
        print(f"{precision}: wgmma / cuBLAS {np.median(ratios):.3f} [{ratios.min():.3f}-{ratios.max():.3f}], "
              f"mma.sync / cuBLAS {med[f'{precision} cuBLAS'] / med[f'{precision} mma.sync pipelined']:.3f}")
