"""Attention's NumPy reference, in float64, and the tolerance a half-precision kernel is held to.

O = softmax(Q K^T · scale) V, one head at a time, scale = 1 / sqrt(d). Masked scores (causal: a key
after its query) are left out of the softmax, not set to a number. A row whose every score is -inf
has no distribution: its output is defined as 0 (what the kernels write). A NaN in a score reaches
its row, and only its row.
"""

import numpy as np

FP16_UNIT = 2.0 ** -11  # half of FP16's spacing at 1: one rounding's relative error
FP32_UNIT = 2.0 ** -24


def attention_reference(q, k, v, causal=False):
    """float64 O for q, k, v (heads, N, d), in any float dtype."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
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


def tolerance(v, d, n):
    """Largest |kernel - reference| allowed for each head: the kernel rounds P to FP16 (one unit
    on each weight, so up to 2^-11 of sum |p| |v| <= max |v|), its output to FP16 (2^-11 of |O|),
    and sums in float32 over n keys and d dimensions (n + d units of 2^-24 on sum |p v|); and exp2
    with a rescaled maximum is a few float32 units per weight. Twice that, per head, over the largest
    |v| in the head."""
    largest = np.abs(np.asarray(v, dtype=np.float64)).max(axis=(1, 2), initial=0.0)
    per_head = largest * (2 * FP16_UNIT + (n + d + 8) * FP32_UNIT)
    return 2 * per_head


def operands(rng, heads, n, d, dtype=np.float16):
    """Q, K, V (heads, n, d) with standard normal entries, in `dtype`."""
    return tuple(rng.standard_normal((heads, n, d)).astype(dtype) for _ in range(3))
