"""Checks of chapter 12's exercises against the chapter's float64 NumPy reference: lengths around a
warp and a tile of keys (5, 32, 33, 67), one and more heads, both masks; keys whose
scores grow along the sequence (every tile raises the maximum), queries whose every score is -inf,
and NaN in a query. Outputs are poisoned. See workbook/exercises.py."""

import collections
import contextlib

import numpy as np

import workbook
from workbook import cuda
from workbook.check import Launch, smallest_first
from workbook.exercises import Exercise, poisoned

from .reference import attention_reference

D = 32
# (heads, N, causal): smallest first; every N's residue modulo 32 (a tile of keys, a warp) differs
CASES = smallest_first([(1, 5, True), (1, 32, False), (2, 33, True), (1, 67, False)], size=lambda c: c[0] * c[1])
SMALL = CASES[:3]  # one tile of keys or two: what the bound and an empty row need
TOLERANCE = 2e-5  # float32 sums of 32 products and up to 67 weights, against float64


def owner(m):
    """Which block and thread wrote o[h, i, c], as attention_rows launches: a warp a query, lane c % 32."""
    return Launch.mapped(lambda at: ((at[1] // m.ROWS, at[0]), 32 * (at[1] % m.ROWS) + at[2] % 32))


def operands(heads, n, seed, growing=False):
    """Q, K, V (heads, n, 32) float32. `growing`: K's first column rises along the sequence and Q's
    is large, so that each tile's scores pass the last tile's maximum."""
    rng = np.random.default_rng(seed + 7 * n + heads)
    q, k, v = (rng.standard_normal((heads, n, D)).astype(np.float32) for _ in range(3))
    if growing:
        q[:, :, 0] = np.abs(q[:, :, 0]) + 8
        k[:, :, 0] += np.linspace(0, 3, n, dtype=np.float32)
    return q, k, v


def run_case(m, q, k, v, causal, name):
    o = poisoned(q.shape, np.float32)
    m.attention_rows(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), o, causal)
    expected = attention_reference(q, k, v, causal).astype(np.float32)
    workbook.assert_close(o, expected, rtol=TOLERANCE, atol=TOLERANCE, name=name, launch=owner(m))


def check_rescale(m):
    for heads, n, causal in CASES:  # the maximum must grow from tile to tile: 67 keys are three tiles
        q, k, v = operands(heads, n, 1, growing=True)
        run_case(m, q, k, v, causal, f"o, {heads} x {n}, causal={causal}, scores growing along the keys")


def check_causal_bound(m):
    for heads, n, causal in SMALL:
        q, k, v = operands(heads, n, 2)
        run_case(m, q, k, v, causal, f"o, {heads} x {n}, causal={causal}")
    if not workbook.ON_GPU:  # right, and no tile past the block's last query loaded: the trace says
        _loads_only_the_tiles_it_needs(m, *operands(2, 40, 2))


def _loads_only_the_tiles_it_needs(m, q, k, v):
    """The global bytes each block loads under the causal mask, traced: its queries, and K and V's
    tiles up to the one holding its last query's key, not one more."""
    from workbook import memtrace

    heads, n = q.shape[:2]
    with memtrace.trace() as trace:
        m.attention_rows(cuda.to_device(q), cuda.to_device(k), cuda.to_device(v), poisoned(q.shape, np.float32), True)
    loaded = collections.Counter()
    for request in trace.requests("attention_rows_kernel"):
        if request.space == memtrace.GLOBAL and request.op == memtrace.LOAD:
            loaded[request.block[0]] += request.bytes_requested / heads
    rows, keys = m.ROWS, m.KEYS
    for block, got in sorted(loaded.items()):
        end = min(n, rows * block + rows)  # keys the block's queries see
        tiles = -(-end // keys)
        expected = 4 * D * (min(max(n - rows * block, 0), rows) + 2 * sum(min(keys, n - keys * j) for j in range(tiles)))
        if got != expected:
            raise workbook.CheckError(
                f"causal, {heads} x {n}: block {block} (queries {rows * block}..{rows * block + rows - 1}) loads "
                f"{got:,.0f} bytes a head, where its queries and the {tiles} tile(s) of keys up to its last query's "
                f"are {expected:,} bytes: " + ("tiles past its last query are loaded too" if got > expected
                                               else "some of its keys are never loaded"))


def check_empty_rows(m):
    """Rows of -inf scores (a query's -inf against keys positive there) give 0; a NaN stays in its row."""
    for heads, n, causal in SMALL:
        q, k, v = operands(heads, n, 3)
        if n > 5:  # the smallest case stays finite
            k[:, :, 0] = np.abs(k[:, :, 0]) + 0.5
            q[0, n // 2, 0] = -np.inf  # every score of this query is -inf
            q[-1, n - 3, 5] = np.nan  # and this query's are NaN
            q[0, 1, 0] = -np.inf
        run_case(m, q, k, v, causal, f"o, {heads} x {n}, causal={causal}, rows of -inf scores and NaN")


def _sanitized():
    """In the simulator, a race as an error naming both threads (simulator/sanitizer.py), even where
    the check is run plainly; on a GPU, nothing."""
    if workbook.ON_GPU:
        return contextlib.nullcontext()
    from workbook.simulator import sanitizing

    return sanitizing()


def check_stages(m):
    for heads, n, causal in CASES:  # 67: three tiles, so that both stages are loaded again
        q, k, v = operands(heads, n, 4)
        with _sanitized() if n == 67 else contextlib.nullcontext():  # three tiles: both stages reused
            run_case(m, q, k, v, causal, f"o, {heads} x {n}, causal={causal}")


SPEC = {"attention_rows_kernel argument 0 axis 2": "the exercises' head dimension: 32",
        "attention_rows_kernel argument 1 axis 2": "the exercises' head dimension: 32",
        "attention_rows_kernel argument 2 axis 2": "the exercises' head dimension: 32",
        "attention_rows_kernel argument 3 axis 2": "the exercises' head dimension: 32"}

EXERCISES = [
    Exercise("ch12.1", "the causal bound of the key loop", "complete", "attention_rows_kernel", check_causal_bound,
             grids=("more blocks",), fixed=SPEC),
    Exercise("ch12.2", "the online rescale", "complete", "attention_rows_kernel", check_rescale,
             grids=("more blocks",), fixed=SPEC),
    Exercise("ch12.3", "a row with no finite score", "fix", "attention_rows_kernel", check_empty_rows,
             grids=("more blocks",), fixed=SPEC),
    Exercise("ch12.4", "a race between stages", "fix", "attention_rows_kernel", check_stages,
             grids=("more blocks",), fixed=SPEC),
]
