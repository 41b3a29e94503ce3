"""Chapter 09's NumPy references, and how far a tensor core's answer may be from them.

A tensor-core GEMM differs from float64 arithmetic in two places, and the tolerance is built from both:

1. **The inputs.** TF32 keeps 10 of float32's 23 mantissa bits: `to_tf32` rounds each A and B value
   to the nearest (relative error at most 2^-11), and a value never rounded is truncated by the
   tensor core (at most 2^-10). FP16 inputs are exact: they *are* what the kernel reads. So the
   reference rounds its inputs as the kernel does, and what remains is:
2. **The accumulation.** Each output is a sum of K products added into a float32 accumulator, one
   mma (8 or 16 products) at a time; each addition may lose half a float32 unit (2^-24 of the
   running sum), and a tensor core's internal adder is not IEEE (it may truncate). Bound: the sum
   of |products| times K·2^-23, the classic worst case of recursive summation with a truncating
   adder -- loose, but never wrong, and a missing tile or a wrong lane is off by far more.

`tf32_input_error` measures step 1 on its own: the same product with unrounded float32 inputs, what
TF32 costs a float32 program (the chapter's "what TF32 rounds away").
"""

import numpy as np

from chapters.ch04_implicit_gemm.kernels import conv_geometry, im2col_reference
from workbook.tensor_cores import round_tf32, truncate_tf32

UNIT = 2.0 ** -23  # one float32 unit at 1.0, truncating


def operands(a, b, precision):
    """a and b as the tensor core sees them, in float64: TF32-rounded for "tf32", truncated for
    "tf32-truncated" (wgmma), else as stored (FP16; or "fp32": float32 inputs unrounded, what a
    CUDA-core kernel multiplies)."""
    if precision == "tf32":
        return round_tf32(a).astype(np.float64), round_tf32(b).astype(np.float64)
    if precision == "tf32-truncated":  # wgmma reads float32 from shared memory and drops 13 bits
        return truncate_tf32(a).astype(np.float64), truncate_tf32(b).astype(np.float64)
    return np.asarray(a, np.float64), np.asarray(b, np.float64)


def gemm_reference(a, b, precision):
    """a @ b in float64 on the inputs the tensor core multiplies; a (M, K), b (K, N)."""
    a64, b64 = operands(a, b, precision)
    return a64 @ b64


def tolerance(a, b, precision):
    """Per element: how far a correct kernel's float32 result may be from gemm_reference."""
    a64, b64 = operands(a, b, precision)
    magnitude = np.abs(a64) @ np.abs(b64)
    return a.shape[1] * UNIT * magnitude + np.finfo(np.float32).tiny


def tf32_input_error(a, b):
    """max |TF32 product - float32-input product| / max |product|: what rounding the inputs costs."""
    exact = np.asarray(a, np.float64) @ np.asarray(b, np.float64)
    return float(np.abs(gemm_reference(a, b, "tf32") - exact).max() / max(np.abs(exact).max(), 1e-30))


def conv_as_gemm(x, w, stride=1, padding=0, dilation=1):
    """A convolution of x (N, H, W, C) with w (K, R, S, C), channels last, as the GEMM it is:
    (A, B, geometry) with A (N*P*Q, C*R*S) the im2col rows and B (C*R*S, K) the filters. The depth's
    order differs from the kernel's (r, s, c), which changes no sum, so gemm_reference and tolerance
    hold for the convolution as they are."""
    x_nchw, w_kcrs = np.transpose(x, (0, 3, 1, 2)), np.transpose(w, (0, 3, 1, 2))
    g = conv_geometry(x_nchw.shape, w_kcrs.shape, stride, padding, dilation)
    return im2col_reference(x_nchw, g).T, w_kcrs.reshape(g.K, -1).T, g


def conv_reference(x, w, precision, stride=1, padding=0, dilation=1):
    """The convolution in float64 on the inputs the tensor core multiplies: out (N, P, Q, K)."""
    a, b, g = conv_as_gemm(x, w, stride, padding, dilation)
    return gemm_reference(a, b, precision).reshape(g.N, g.P, g.Q, g.K)
