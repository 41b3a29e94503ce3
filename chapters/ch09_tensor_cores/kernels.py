"""Chapter 09's kernels, in one namespace: `from chapters.ch09_tensor_cores import kernels as k`.

C = A @ B on tensor cores, TF32 (float32 data) or FP16 (float16 data, float32 accumulation). The
modules, in reading order:

    reference.py    NumPy references and the tolerance, derived from TF32's rounding and the
                    float32 accumulation
    naive.py        one warp per 16x8 tile, fragments straight from global memory (any shape)
    pipelined.py    128x128 block tiles, a 3-stage cp.async pipeline, ldmatrix from swizzled shared
                    memory, 64x64 per warp (K and N multiples of 16 bytes); TF32 multiplies
                    A by B^T, made (and rounded) by a transpose kernel first
    conv.py         the convolution as an implicit GEMM on the pipelined kernel, channels last:
                    A's tile gathered from x by cp.async, 16 bytes of channels at a time
    wgmma.py        Hopper's own instruction: the GEMM (by B^T) and the convolution on wgmma, tiles
                    in its 128-byte swizzle, read from shared memory by the tensor cores

gemm() picks the kernel for the precision and the variant, checks the arguments and launches it;
gemm_bt() multiplies by B^T on wgmma; conv2d() does the same for the convolution (variant
"pipelined" or "wgmma").
The instructions themselves are workbook/tensor_cores.py's.
"""

from functools import lru_cache

import numpy as np

from workbook import ON_GPU, capability
from workbook.inputs import require
from workbook.launch import LaunchCache
from workbook.memory import aligned
from workbook.tensor_cores import wgmma_compile

from chapters.ch04_implicit_gemm.kernels import conv_geometry

from . import conv, naive, pipelined, wgmma
from .reference import conv_as_gemm, conv_reference, gemm_reference, operands, tf32_input_error, tolerance

__all__ = ["gemm", "gemm_bt", "conv2d", "KERNELS", "PRECISIONS", "conv_as_gemm", "conv_reference", "gemm_reference", "operands",
           "tf32_input_error", "tolerance", "conv", "naive", "pipelined", "wgmma"]

PRECISIONS = {np.dtype(np.float32): "tf32", np.dtype(np.float16): "f16"}
KERNELS = {("tf32", "naive"): naive.gemm_tf32_naive, ("f16", "naive"): naive.gemm_f16_naive,
           ("tf32", "pipelined"): pipelined.gemm_tf32_pipelined, ("f16", "pipelined"): pipelined.gemm_f16_pipelined}


@lru_cache(maxsize=None)
def _gpu_has_tensor_cores():
    capability.require(*capability.MMA_SYNC, what="this chapter's tensor-core kernels")
    return True


def gemm(a, b, c, *, variant="pipelined", stream=0):
    """c = a @ b on tensor cores: a (M, K), b (K, N), both float32 (TF32 multiplies) or both float16;
    c (M, N) float32. variant: "naive" (any shape) or "pipelined" (K and N multiples of 4 for
    float32, 8 for float16: every row 16-byte aligned, which cp.async needs)."""
    a = require(a, "a", dtype=(np.float32, np.float16), ndim=2)
    b = require(b, "b", dtype=a.dtype, ndim=2)
    if b.shape[0] != a.shape[1]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}")
    c = require(c, "c", dtype=np.float32, shape=(a.shape[0], b.shape[1]))
    precision = PRECISIONS[np.dtype(a.dtype)]
    if (precision, variant) not in KERNELS:
        raise ValueError(f"variant must be 'naive' or 'pipelined', not {variant!r}")
    if ON_GPU:
        _gpu_has_tensor_cores()
    (M, K), N = a.shape, b.shape[1]
    kernel = KERNELS[precision, variant]
    if variant == "naive":
        _launches.launch(kernel, naive.blocks_for(M, N), naive.THREADS, (a, b, c), stream=stream)
        return c
    per_chunk = 16 // a.dtype.itemsize
    if K % per_chunk or N % per_chunk:
        raise ValueError(f"the pipelined kernel copies 16-byte chunks (cp.async): K and N must be multiples of "
                         f"{per_chunk} for {np.dtype(a.dtype)}, not K={K}, N={N}. Pad them with zeros, or take "
                         "variant='naive'")
    _require_aligned(a=a, b=b)
    if precision == "tf32":  # B^T, rounded: its fragments come by ldmatrix as A's do (pipelined.py)
        bt = _scratch((N, K))
        T = pipelined.TRANSPOSE
        _launches.launch(pipelined.transpose_to_tf32, ((N + T - 1) // T, (K + T - 1) // T), (T, 8), (b, bt),
                         stream=stream)
        b = bt
    _launches.launch(kernel, pipelined.grid_for(M, N), pipelined.THREADS, (a, b, c), stream=stream)
    return c


@lru_cache(maxsize=None)
def _gpu_has_wgmma():
    capability.require("wgmma", what="the wgmma kernels (take variant='pipelined')")
    return True


# Every launch goes through a cache of prepared launches: the same buffers again cost the driver's
# launch, not numba's typing and packing of every argument (chapter 07).
_launches = LaunchCache()
_compiled_for = set()


def _wgmma_plan(*args_kernel_grid):
    """The launch of a wgmma kernel on new buffers (LaunchCache.launch_planned): on a GPU, each
    signature's first launch compiles it for sm_90a and raises its shared memory limit."""
    *args, kernel, grid = args_kernel_grid
    if ON_GPU:
        _gpu_has_wgmma()
        from numba import typeof

        types = tuple(typeof(a) for a in args)
        if (kernel, types) not in _compiled_for:
            wgmma_compile(kernel, types, wgmma.shared_bytes())
            _compiled_for.add((kernel, types))
    return kernel, grid, wgmma.THREADS


def _launch_wgmma(kernel, grid, stream, *args):
    """kernel[grid, wgmma.THREADS, stream, wgmma.shared_bytes()](*args), compiled for sm_90a on a
    GPU, prepared once per set of buffers."""
    _launches.launch_planned(_wgmma_plan, args, (kernel, grid), stream=stream, shared=wgmma.shared_bytes())


def gemm_bt(a, bt, c, *, stream=0):
    """c = a @ bt.T on wgmma (an H100): a (M, K), bt (N, K), both float16 or both float32 (TF32, which
    wgmma truncates: see wgmma.py); c (M, N) float32; K a multiple of 8 (float16) or 4 (float32)."""
    a = require(a, "a", dtype=(np.float32, np.float16), ndim=2)
    bt = require(bt, "bt", dtype=a.dtype, ndim=2)
    if bt.shape[1] != a.shape[1]:
        raise ValueError(f"a and bt must have the same number of columns (K): a is {tuple(a.shape)}, "
                         f"bt is {tuple(bt.shape)}")
    c = require(c, "c", dtype=np.float32, shape=(a.shape[0], bt.shape[0]))
    per_chunk = 16 // a.dtype.itemsize
    if a.shape[1] % per_chunk:
        raise ValueError(f"wgmma's tiles are copied in 16-byte chunks: K must be a multiple of {per_chunk} for "
                         f"{np.dtype(a.dtype)}, not {a.shape[1]}. Pad it with zeros")
    _require_aligned(a=a, bt=bt)
    _launch_wgmma(wgmma.KERNELS[PRECISIONS[np.dtype(a.dtype)]][0], wgmma.grid_for(a.shape[0], bt.shape[0]), stream,
                  a, bt, c)
    return c


def conv2d(x, w, out, *, stride=1, padding=0, dilation=1, variant="pipelined", out_layout="nhwc", stream=0):
    """out = the convolution of x with w on tensor cores, channels last: x (N, H, W, C), w (K, R, S, C),
    both float16 (FP16 multiplies) or both float32 (TF32); out (N, P, Q, K) float32, or (N, K, P, Q)
    with out_layout="nchw". C must be a multiple of 8 (float16) or 4 (float32): a pixel's channels
    are copied 16 bytes at a time.
    variant: "pipelined" (mma.sync, any GPU with tensor cores from 8.0) or "wgmma" (an H100)."""
    x = require(x, "x", dtype=(np.float32, np.float16), ndim=4)
    w = require(w, "w", dtype=x.dtype, ndim=4)
    (N, H, W, C), (K, R, S, Cw) = x.shape, w.shape
    g = conv_geometry((N, C, H, W), (K, Cw, R, S), stride, padding, dilation)
    if out_layout not in ("nhwc", "nchw"):
        raise ValueError(f"out_layout must be 'nhwc' or 'nchw', not {out_layout!r}")
    nchw = out_layout == "nchw"
    out = require(out, "out", dtype=np.float32, shape=(N, K, g.P, g.Q) if nchw else (N, g.P, g.Q, K))
    per_chunk = 16 // x.dtype.itemsize
    if C % per_chunk:
        raise ValueError(f"x has C={C} channels: the tensor-core convolution copies 16 bytes of channels at a time, "
                         f"so C must be a multiple of {per_chunk} for {np.dtype(x.dtype)}. Pad the channels (and "
                         "w's) with zeros")
    _require_aligned(x=x, w=w)
    if variant not in ("pipelined", "wgmma"):
        raise ValueError(f"variant must be 'pipelined' or 'wgmma', not {variant!r}")
    if ON_GPU:
        _gpu_has_tensor_cores()
    M = N * g.P * g.Q
    args = (x.reshape(-1), w.reshape(K, -1), out.reshape(N, K, g.P * g.Q) if nchw else out.reshape(M, K), H, W, C,
            g.P * g.Q, g.Q, S, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw)
    precision = PRECISIONS[np.dtype(x.dtype)]
    if variant == "wgmma":
        kernel = wgmma.NCHW_KERNELS[precision] if nchw else wgmma.KERNELS[precision][1]
        _launch_wgmma(kernel, wgmma.grid_for(M, K), stream, *args)
    else:
        kernel = (conv.NCHW_KERNELS if nchw else conv.KERNELS)[precision]
        _launches.launch(kernel, conv.grid_for(M, K), pipelined.THREADS, args, stream=stream)
    return out


def _require_aligned(**arrays):
    for name, array in arrays.items():
        if not aligned(array, 16):
            raise ValueError(f"{name}'s first element is not 16-byte aligned (a view at an odd offset?): cp.async "
                             "needs it; copy it to a fresh array")


_scratch_buffers = {}


def _scratch(shape):
    """A float32 device buffer for B^T, kept per shape: an allocation per call would cost the host
    more than a small GEMM (chapter 07)."""
    if shape not in _scratch_buffers:
        from numba import cuda

        _scratch_buffers[shape] = cuda.device_array(shape, np.float32)
    return _scratch_buffers[shape]
