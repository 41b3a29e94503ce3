"""The chapter's comparisons: its kernels beside torch's attention on the same device buffers.

    compare(chapter, heads, n, d, causal, variants)   one case: checked on its first heads against
                                                      the float64 reference, then timed
    mma_ceiling()                                     mma.sync FP16's TFLOP/s on this GPU, measured
                                                      now (chapter 09's ceiling kernel)
    wgmma_ceiling()                                   wgmma's (m64n128k16 FP16) on an H100/H200: the
                                                      instruction issued from shared tiles, nothing else

torch's baselines: `scaled_dot_product_attention` with the backend it picks (cuDNN's on an H100 or
H200), with its FlashAttention-2 backend forced, and its own unfused matmul, softmax, matmul.
"""

import math

import numpy as np
from numba import float32

import workbook
from workbook import bench, capability, cuda
from workbook.check import to_host
from workbook.tensor_cores import (SWIZZLE_ATOM, WGMMA_ACCUMULATORS, fence_proxy_async, shared_address, wgmma_commit,
                                   wgmma_compile, wgmma_f16, wgmma_fence, wgmma_wait)

from chapters.ch09_tensor_cores import ceiling

from . import hopper
from . import kernels as k
from .reference import values

CHECKED_HEADS = 2  # the float64 reference of every head of a GPU-sized case would take the host minutes


def _torch_baselines(torch, q, kk, v, causal, precision="f16"):
    if torch is None:
        return {}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    heads, n, d = q.shape
    if precision == "bf16":  # BF16's bits, seen by torch as bfloat16; its outputs handed back as bits
        tq, tk, tv = (bench.torch_view(x.view(np.int16)).view(torch.bfloat16).view(1, heads, n, d) for x in (q, kk, v))

        def bits(t):
            return t.view(torch.int16)
    else:
        tq, tk, tv = (bench.torch_view(x).view(1, heads, n, d) for x in (q, kk, v))

        def bits(t):
            return t
    mask = torch.ones(n, n, dtype=torch.bool, device=tq.device).tril() if causal else None

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return bits(sdpa(tq, tk, tv, is_causal=causal)[0])

    def unfused():
        scores = (tq @ tk.transpose(-1, -2)) * (1 / math.sqrt(d))
        if causal:
            scores = scores.masked_fill(~mask, float("-inf"))
        return bits((scores.softmax(-1) @ tv)[0])

    return {"torch SDPA (its default backend)": lambda: bits(sdpa(tq, tk, tv, is_causal=causal)[0]),
            "torch SDPA, FlashAttention-2 backend": flash,
            "torch matmul-softmax-matmul": unfused}


def compare(chapter, heads, n, d, causal, variants=("naive", "fused"), rng=None, key=None, precision="f16"):
    """Check and time one case ("f16", or "bf16": BF16's bits in uint16); returns the comparison (its
    .ratio(a, b) for the bars)."""
    rng = rng or np.random.default_rng(0)
    q, kk, v = (cuda.to_device(x) for x in k.operands(rng, heads, n, d, np.float16 if precision == "f16" else "bf16"))
    o = cuda.device_array((heads, n, d), q.dtype)
    checked = min(heads, CHECKED_HEADS)
    first = tuple(x[:checked].copy_to_host() for x in (q, kk, v))
    atol = float(k.tolerance(first[2], d, n, precision).max())

    def check(got, ref, name):
        # torch's output and ours round alike: the same tolerance
        workbook.assert_close(values(to_host(got[:checked])), ref, rtol=0, atol=atol, name=name)

    mode = "causal" if causal else "full"
    return chapter.compare(
        key or f"attention d={d} {mode}",
        {variant: (lambda variant=variant: k.attention(q, kk, v, o, causal=causal, variant=variant,
                                                       precision=precision))
         for variant in variants},
        reference=lambda: k.attention_reference(*first, causal=causal),
        check=check,
        baselines=_torch_baselines(bench.optional_torch(), q, kk, v, causal, precision),
        flops=k.flops(heads, n, d, causal),
        size=f"{heads} heads x {n} x {d} {'float16' if precision == 'f16' else 'bfloat16'}",
    )


def mma_ceiling():
    """mma.sync FP16's TFLOP/s on this GPU, measured now (None in the simulator)."""
    if not workbook.ON_GPU:
        return None
    blocks, threads, loops = 132 * 64, 128, 4096
    sink = cuda.device_array(blocks * threads, np.float32)

    def run():
        ceiling.ceiling_f16[blocks, threads](sink, loops)

    run()
    times = bench.time_interleaved({"ceiling": run}, repeats=7)["ceiling"]
    return ceiling.flops("f16", blocks, threads, loops) / float(np.median(times)) / 1e9


CEILING_A = 64 * 64  # halves: a warpgroup's 64 rows of A, 64 deep (one 128-byte row each)
CEILING_B = 128 * 64  # 128 rows of B^T


def ceiling_bytes():
    return (CEILING_A + CEILING_B) * 2 + SWIZZLE_ATOM


@cuda.jit
def wgmma_ceiling_kernel(sink, loops):
    """Two warpgroups issuing wgmma after wgmma, 8 a commit group, on the same zeroed shared tiles:
    no loads, no softmax, the instruction's own rate."""
    smem = cuda.shared.array(0, np.float16)
    pad = hopper.aligned(smem)
    tid = cuda.threadIdx.x
    for i in range(tid, CEILING_A + CEILING_B, cuda.blockDim.x):
        smem[pad + i] = 0
    fence_proxy_async()
    cuda.syncthreads()
    acc = cuda.local.array(WGMMA_ACCUMULATORS, float32)
    for i in range(WGMMA_ACCUMULATORS):
        acc[i] = 0
    a_at = shared_address(smem, pad)
    b_at = a_at + CEILING_A * 2
    for _ in range(loops):
        wgmma_fence()
        for kk in range(8):
            wgmma_f16(acc, hopper.describe(a_at + 32 * (kk % 4), SWIZZLE_ATOM),
                      hopper.describe(b_at + 32 * (kk % 4), SWIZZLE_ATOM))
        wgmma_commit()
        wgmma_wait(0)
    total = float32(0)
    for i in range(WGMMA_ACCUMULATORS):
        total += acc[i]
    sink[cuda.blockIdx.x * cuda.blockDim.x + tid] = total


def wgmma_ceiling():
    """wgmma FP16's TFLOP/s on this GPU, measured now (None in the simulator, or without wgmma)."""
    if not workbook.ON_GPU or not capability.supports("wgmma"):
        return None
    from numba import typeof

    blocks, threads, loops = cuda.get_current_device().MULTIPROCESSOR_COUNT * 4, 256, 2048
    sink = cuda.device_array(blocks * threads, np.float32)
    wgmma_compile(wgmma_ceiling_kernel, (typeof(sink), typeof(loops)), ceiling_bytes())

    def run():
        wgmma_ceiling_kernel[blocks, threads, 0, ceiling_bytes()](sink, loops)

    run()
    times = bench.time_interleaved({"ceiling": run}, repeats=7)["ceiling"]
    flops = blocks * (threads // 128) * loops * 8 * 2 * 64 * 128 * 16
    return flops / float(np.median(times)) / 1e9
