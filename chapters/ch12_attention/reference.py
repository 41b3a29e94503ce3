"""Attention's NumPy reference, in float64, and the tolerance a half-precision kernel is held to.

FP16 data is float16; BF16 data is kept as its bits in uint16 arrays (NumPy has no bfloat16:
`to_bf16` and `from_bf16` convert), and read as such by everything here.

O = softmax(Q K^T · scale) V, one head at a time, scale = 1 / sqrt(d). Masked scores (causal: a key
after its query) are left out of the softmax, not set to a number. A row whose every score is -inf
has no distribution: its output is defined as 0 (what the kernels write). A NaN in a score reaches
its row, and only its row.
"""

import numpy as np

from workbook.tensor_layouts import from_bf16, to_bf16

UNITS = {"f16": 2.0 ** -11, "bf16": 2.0 ** -8}  # half of each format's spacing at 1
FP32_UNIT = 2.0 ** -24


def values(x):
    """An array's values as float64: float arrays as they are, 16-bit integers as BF16's bits."""
    x = np.asarray(x)
    return from_bf16(x.view(np.uint16)).astype(np.float64) if x.dtype in (np.uint16, np.int16) else x.astype(np.float64)


def attention_reference(q, k, v, causal=False):
    """float64 O for q, k, v (heads, N, d), in any float dtype, or BF16 bits (uint16)."""
    q, k, v = (values(x) for x in (q, k, v))
    d = q.shape[-1]
    scores = q @ k.transpose(0, 2, 1) / np.sqrt(d)
    n = q.shape[1]
    if causal:
        scores = np.where(np.tril(np.ones((n, n), bool)), scores, -np.inf)
    with np.errstate(invalid="ignore", over="ignore"):
        top = scores.max(axis=-1, keepdims=True)
        empty = np.isneginf(top)  # no finite score: output 0
        weights = np.exp(scores - np.where(empty, 0.0, top))
        total = weights.sum(axis=-1, keepdims=True)
        probabilities = np.where(empty, 0.0, weights / np.where(empty, 1.0, total))
        return probabilities @ v


def tolerance(v, d, n, precision="f16"):
    """Largest |kernel - reference| allowed for each head: the kernel rounds P to FP16 (one unit
    on each weight, so up to 2^-11 of sum |p| |v| <= max |v|; BF16: 2^-8), its output likewise,
    and sums in float32 over n keys and d dimensions (n + d units of 2^-24 on sum |p v|); and exp2
    with a rescaled maximum is a few float32 units per weight. Twice that, per head, over the largest
    |v| in the head."""
    largest = np.abs(values(v)).max(axis=(1, 2), initial=0.0)
    per_head = largest * (2 * UNITS[precision] + (n + d + 8) * FP32_UNIT)
    return 2 * per_head


def operands(rng, heads, n, d, dtype=np.float16):
    """Q, K, V (heads, n, d) with standard normal entries, in `dtype`; "bf16": BF16's bits (uint16)."""
    if isinstance(dtype, str) and dtype == "bf16":
        return tuple(to_bf16(rng.standard_normal((heads, n, d)).astype(np.float32)) for _ in range(3))
    return tuple(rng.standard_normal((heads, n, d)).astype(dtype) for _ in range(3))
