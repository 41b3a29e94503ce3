"""Chapter 12's kernels, in one namespace: `from chapters.ch12_attention import kernels as k`.

Attention forward, O = softmax(Q K^T / sqrt(d)) V, for every head at once: q, k, v and o are
(heads, N, d) float16 arrays (batch and heads flattened into one axis), d = 64 or 128, any N. The
modules, in reading order:

    reference.py    the float64 NumPy reference and the tolerance, derived from FP16's rounding of
                    P and O and float32's sums
    tiles.py        64-row tiles in swizzled shared memory: their cp.async copies and the ldmatrix
                    fragments of Q, K, V and P
    naive.py        three kernels: S to global memory, a row softmax to P, then P V
    fused.py        one kernel (FlashAttention-2's structure): K and V tiles streamed through two
                    stages, S in registers, the online softmax
    hopper.py       the same loop on Hopper's wgmma (sm_90a, head dimension 128): Q, K and V read
                    by the tensor cores from shared memory, P handed over in registers

attention(q, k, v, o, causal=..., variant="fused", "naive" or "wgmma") checks the arguments and launches.
"""

import math
from functools import lru_cache

import numpy as np

from workbook import ON_GPU, capability
from workbook.inputs import require
from workbook.launch import LaunchCache, allow_shared_memory
from workbook.memory import aligned
from workbook.tensor_cores import wgmma_compile

from . import fused, hopper, naive
from .reference import attention_reference, operands, tolerance, values
from .tiles import THREADS

__all__ = ["attention", "attention_reference", "operands", "tolerance", "values", "bytes_moved", "flops", "HEAD_DIMS",
           "fused", "hopper", "naive"]

HEAD_DIMS = (64, 128)
LOG2_E = math.log2(math.e)


@lru_cache(maxsize=None)
def _gpu_has_tensor_cores():
    capability.require(*capability.MMA_SYNC, what="this chapter's kernels")
    return True


@lru_cache(maxsize=None)
def forward_kernel(d, causal, precision="f16"):
    return fused.make_forward(d, causal, precision=precision)


@lru_cache(maxsize=None)
def _gpu_has_bf16():
    capability.require("mma.sync.bf16", "cvt.bf16x2", what="the BF16 attention kernel")
    return True


@lru_cache(maxsize=None)
def wgmma_kernel(causal):
    return hopper.make_forward(causal)


@lru_cache(maxsize=None)
def _gpu_has_wgmma():
    capability.require("wgmma", what="the wgmma attention kernel (take variant='fused')")
    return True


@lru_cache(maxsize=None)
def naive_kernels(d, causal):
    return naive.make_scores(d, causal), naive.make_values(d)


_launches = LaunchCache()
_opted_in = set()


def _fused_plan(q, k, v, o, scale_log2, d, causal, precision):
    """The fused kernel's launch: past 48 KB of shared memory (d = 128), allowed on its first use."""
    kernel = forward_kernel(d, causal, precision)
    if ON_GPU:
        from numba import typeof

        types = tuple(typeof(a) for a in (q, k, v, o, scale_log2))
        if (kernel, types) not in _opted_in:
            allow_shared_memory(kernel.compile(types), fused.shared_bytes(d))
            _opted_in.add((kernel, types))
    heads, n = q.shape[:2]
    return kernel, (-(-n // fused.BM), heads), THREADS


def _wgmma_plan(q, k, v, o, scale_log2, causal):
    """The wgmma kernel's launch: on a GPU, compiled for sm_90a and allowed its shared memory on its
    first use with these argument types."""
    kernel = wgmma_kernel(causal)
    if ON_GPU:
        _gpu_has_wgmma()
        from numba import typeof

        types = tuple(typeof(a) for a in (q, k, v, o, scale_log2))
        if (kernel, types) not in _opted_in:
            wgmma_compile(kernel, types, hopper.shared_bytes())
            _opted_in.add((kernel, types))
    heads, n = q.shape[:2]
    return kernel, (-(-n // hopper.BM), heads), hopper.THREADS


_scratch_buffers = {}


def _scratch(shape, dtype):
    """S or P of the naive kernels, kept per shape: an allocation per call would cost the host more
    than a small attention (chapter 07)."""
    key = (shape, np.dtype(dtype))
    if key not in _scratch_buffers:
        from workbook import cuda

        _scratch_buffers[key] = cuda.device_array(shape, dtype)
    return _scratch_buffers[key]


def attention(q, k, v, o, *, causal=False, variant="fused", precision="f16", stream=0):
    """o = softmax(q k^T / sqrt(d)) v per head; q, k, v, o (heads, N, d) device arrays, d = 64 or
    128; causal: key j is seen by query i only when j <= i. precision "f16": float16 arrays;
    "bf16" (variant "fused" only): uint16 or int16 arrays of BF16's bits (a torch bfloat16 tensor:
    x.view(torch.int16)). Returns o."""
    if precision not in ("f16", "bf16"):
        raise ValueError(f"precision must be 'f16' or 'bf16', not {precision!r}")
    dtype = np.float16 if precision == "f16" else (np.uint16, np.int16)
    q = require(q, "q", dtype=dtype, ndim=3)
    heads, n, d = q.shape
    if d not in HEAD_DIMS:
        raise ValueError(f"the head dimension (q.shape[2]) must be 64 or 128, not {d}")
    k = require(k, "k", dtype=q.dtype, shape=q.shape)
    v = require(v, "v", dtype=q.dtype, shape=q.shape)
    o = require(o, "o", dtype=q.dtype, shape=q.shape)
    for name, array in (("q", q), ("k", k), ("v", v)):
        if not aligned(array, 16):
            raise ValueError(f"{name}'s first element is not 16-byte aligned (a view at an odd offset?): cp.async "
                             "needs it; copy it to a fresh array")
    if variant not in ("fused", "naive", "wgmma"):
        raise ValueError(f"variant must be 'fused', 'naive' or 'wgmma', not {variant!r}")
    if precision == "bf16" and variant != "fused":
        raise ValueError(f"precision='bf16' runs on variant='fused' (mma.sync) only, not {variant!r}")
    if variant == "wgmma" and d != hopper.D:
        raise ValueError(f"variant='wgmma' takes head dimension {hopper.D} only, not {d}: take variant='fused'")
    if ON_GPU:
        _gpu_has_tensor_cores()
        if precision == "bf16":
            _gpu_has_bf16()
    if variant == "fused":
        scale_log2 = np.float32(LOG2_E / math.sqrt(d))
        _launches.launch_planned(_fused_plan, (q, k, v, o, scale_log2), (d, causal, precision), stream=stream,
                                 shared=fused.shared_bytes(d))
        return o
    if variant == "wgmma":
        scale_log2 = np.float32(LOG2_E / math.sqrt(d))
        _launches.launch_planned(_wgmma_plan, (q, k, v, o, scale_log2), (causal,), stream=stream,
                                 shared=hopper.shared_bytes())
        return o
    scores, values = naive_kernels(d, causal)
    s = _scratch((heads, n, naive.padded(n)), np.float32)
    p = _scratch((heads, n, naive.padded(n)), np.float16)
    _launches.launch(scores, naive.blocks_of_scores(heads, n), THREADS, (q, k, s), (np.float32(1 / math.sqrt(d)),),
                     stream=stream)
    _launches.launch(naive.softmax, naive.blocks_of_softmax(heads, n), naive.SOFTMAX_THREADS, (s, p), (n,),
                     stream=stream)
    _launches.launch(values, naive.blocks_of_values(heads, n), THREADS, (p, v, o), stream=stream)
    return o


def flops(heads, n, d, causal=False):
    """4·heads·N²·d: the two products' multiply-adds, half of them under a causal mask."""
    return 4 * heads * n * n * d // (2 if causal else 1)


def bytes_moved(heads, n, d, variant):
    """Bytes one call must move at the least: Q, K, V read and O written (2 bytes each); the naive
    kernels also write S (4 bytes a score) and read it back, write P (2 bytes) and read it back."""
    qkvo = 4 * heads * n * d * 2
    if variant in ("fused", "wgmma"):
        return qkvo
    return qkvo + heads * n * naive.padded(n) * (4 + 4 + 2 + 2)
