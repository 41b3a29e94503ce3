"""The chapter's comparisons: its kernels beside torch's attention on the same device buffers.

    compare(chapter, heads, n, d, causal, variants)   one case: checked on its first heads against
                                                      the float64 reference, then timed
    mma_ceiling()                                     mma.sync FP16's TFLOP/s on this GPU, measured
                                                      now (chapter 09's ceiling kernel)

torch's baselines: `scaled_dot_product_attention` with the backend it picks (cuDNN's on an H100 or
H200), with its FlashAttention-2 backend forced, and its own unfused matmul, softmax, matmul.
"""

import math

import numpy as np

import workbook
from workbook import bench, cuda
from workbook.check import to_host

from chapters.ch09_tensor_cores import ceiling

from . import kernels as k

CHECKED_HEADS = 2  # the float64 reference of every head of a GPU-sized case would take the host minutes


def _torch_baselines(torch, q, kk, v, causal):
    if torch is None:
        return {}
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    heads, n, d = q.shape
    tq, tk, tv = (bench.torch_view(x).view(1, heads, n, d) for x in (q, kk, v))
    mask = torch.ones(n, n, dtype=torch.bool, device=tq.device).tril() if causal else None

    def flash():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(tq, tk, tv, is_causal=causal)[0]

    def unfused():
        scores = (tq @ tk.transpose(-1, -2)) * (1 / math.sqrt(d))
        if causal:
            scores = scores.masked_fill(~mask, float("-inf"))
        return (scores.softmax(-1) @ tv)[0]

    return {"torch SDPA (its default backend)": lambda: sdpa(tq, tk, tv, is_causal=causal)[0],
            "torch SDPA, FlashAttention-2 backend": flash,
            "torch matmul-softmax-matmul": unfused}


def compare(chapter, heads, n, d, causal, variants=("naive", "fused"), rng=None, key=None):
    """Check and time one case; returns the comparison (its .ratio(a, b) for the bars)."""
    rng = rng or np.random.default_rng(0)
    q, kk, v = (cuda.to_device(x) for x in k.operands(rng, heads, n, d))
    o = cuda.device_array((heads, n, d), np.float16)
    checked = min(heads, CHECKED_HEADS)
    first = tuple(x[:checked].copy_to_host() for x in (q, kk, v))
    atol = float(k.tolerance(first[2], d, n).max())

    def check(got, ref, name):
        # torch's FP16 output and ours round alike: the same tolerance
        workbook.assert_close(to_host(got[:checked]).astype(np.float64), ref, rtol=0, atol=atol, name=name)

    mode = "causal" if causal else "full"
    return chapter.compare(
        key or f"attention d={d} {mode}",
        {variant: (lambda variant=variant: k.attention(q, kk, v, o, causal=causal, variant=variant))
         for variant in variants},
        reference=lambda: k.attention_reference(*first, causal=causal),
        check=check,
        baselines=_torch_baselines(bench.optional_torch(), q, kk, v, causal),
        flops=k.flops(heads, n, d, causal),
        size=f"{heads} heads x {n} x {d} float16",
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
