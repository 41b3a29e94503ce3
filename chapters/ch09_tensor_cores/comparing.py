"""The 4096^3 comparisons' operands, references and checks, shared by the chapter's two notebooks
(09a, mma.sync; 09b, wgmma and the convolution).

The host's float64 work on these operands takes seconds at 4096^3: each reference and tolerance is
computed once, in a thread of its own from where it is first needed (`on_the_side`), beside the
others and the GPU's warm-ups; a check waits for it, and the checks come before anything is timed.
"""

import numpy as np

import workbook
from workbook import bench, cuda
from workbook.check import to_host
from workbook.host import in_background

from chapters.ch04_implicit_gemm import kernels as fp32

from . import kernels as k

_on_the_side = {}


def operands(rng, n):
    """A and B (n x n) from rng, float32 and their float16 roundings: host and device copies, and
    torch views of the device ones (None without torch)."""
    a32, b32 = rng.standard_normal((n, n)).astype(np.float32), rng.standard_normal((n, n)).astype(np.float32)
    d_a32, d_b32 = cuda.to_device(a32), cuda.to_device(b32)
    d_a16, d_b16 = cuda.to_device(a32.astype(np.float16)), cuda.to_device(b32.astype(np.float16))
    a16, b16 = d_a16.copy_to_host(), d_b16.copy_to_host()
    views = tuple(bench.torch_view(x) for x in (d_a32, d_b32, d_a16, d_b16))
    return (a32, b32, a16, b16), (d_a32, d_b32, d_a16, d_b16), views


def on_the_side(function, *args):
    """in_background(function, *args) the first time (arrays told apart by identity); its Future."""
    key = (function, *(id(arg) if isinstance(arg, np.ndarray) else arg for arg in args))
    if key not in _on_the_side:
        _on_the_side[key] = in_background(function, *args)
    return _on_the_side[key]


def largest_tolerance(a, b, precision):
    """The derived tolerance's largest element: the checks' atol."""
    return float(k.tolerance(a, b, precision).max())


def product_reference(precision, a, b):
    """The product of the rounded inputs in float64, as float32: what a comparison checks against."""
    return on_the_side(k.gemm_reference, a, b, precision).result().astype(np.float32)


def checker(precision, a, b):
    """Tensor-core results against the rounded reference within the derived tolerance (wgmma's TF32,
    which truncates its inputs, against the truncated one); chapter 04's FP32 result against the
    float32 product, within chapter 04's own tolerance; cuBLAS's FP16 output with one rounding more."""
    atol = on_the_side(largest_tolerance, a, b, precision)  # a Future: the checks wait for it

    def check(got, ref, name):
        if name.startswith("chapter 04"):
            rtol_fp32, atol_fp32 = fp32.tolerance(a.shape[1])
            workbook.assert_close(got, fp32.gemm_reference(a, b), rtol=rtol_fp32, atol=atol_fp32, name=name)
        elif name.startswith("wgmma") and precision == "tf32":  # the reference and the tolerance side by side
            truncated, atol_t = (on_the_side(f, a, b, "tf32-truncated") for f in (k.gemm_reference, largest_tolerance))
            workbook.assert_close(got, truncated.result().astype(np.float32), rtol=0, atol=atol_t.result(), name=name)
        elif precision == "f16" and name.startswith("torch"):  # cuBLAS writes FP16: one rounding more
            host = to_host(got).astype(np.float32)
            workbook.assert_close(host, ref, rtol=2.0 ** -11, atol=atol.result(), name=name)
        else:
            workbook.assert_close(got, ref, rtol=0, atol=atol.result(), name=name)
    return check
