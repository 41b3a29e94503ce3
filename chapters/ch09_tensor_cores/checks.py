"""Checks of chapter 09's exercises against the chapter's NumPy references (gemm_reference, rounded
as the tensor core rounds, within reference.tolerance) and a float64 column sum, at awkward sizes,
into poisoned outputs. See workbook/exercises.py.

The kernels are warp-wide (mma, ldmatrix) or sized to their data (one thread a column), so they run
on their own grids only (grids=()): a smaller block would cut a warp short, which is an error."""

import numpy as np

import workbook
from workbook import cuda
from workbook.check import Launch, smallest_first
from workbook.exercises import Exercise, poisoned, speed_ratio

from . import kernels as k

# (M, K, N); with the one-tile cases (16, 16 + r, 8), every residue of K modulo 16 (an FP16 mma's
# depth) and so of 8 (a TF32 one's)
GEMM_SHAPES = smallest_first([(1, 1, 1), (16, 8, 8), (31, 17, 33), (33, 40, 31), (18, 23, 9),
                              *((16, 16 + r, 8) for r in (0, 2, 3, 4, 5, 6, 10, 11, 12, 13, 14, 15)),
                              workbook.size(gpu=(257, 131, 129), sim=(37, 41, 29))],
                             lambda mkn: max(mkn[0] * mkn[1], mkn[1] * mkn[2], mkn[0] * mkn[2]))
# every residue of a stage's TILE_ROWS (32) rows, then whole stages, several, large and odd
ROWS = smallest_first([*range(1, 34), 64, 100, workbook.size(gpu=5001, sim=77)])


def _tile_owner(N, warps, width=8):
    """Element (i, j) of C is held by lane 4·(i % 8) + (j % 8) // 2 of the warp of its 16 x width tile
    (the chapter's warp_tile, or ch09.4's wide_tile: `warps` tiles a block, row after row): (block, thread)."""
    def owner(at):
        i, j = at
        tile = i // 16 * ((N + width - 1) // width) + j // width
        return divmod(tile, warps)[0], tile % warps * 32 + 4 * (i % 8) + j % 8 // 2
    return Launch.mapped(owner)


def _gemm_case(gemm, precision, name, width=8):
    dtype = np.float32 if precision == "tf32" else np.float16
    for M, K, N in GEMM_SHAPES:
        rng = np.random.default_rng(M * 1000 + N)
        a, b = rng.standard_normal((M, K)).astype(dtype), rng.standard_normal((K, N)).astype(dtype)
        c = gemm(cuda.to_device(a), cuda.to_device(b), poisoned((M, N), np.float32))
        workbook.assert_close(c, k.gemm_reference(a, b, precision).astype(np.float32), rtol=0,
                              atol=float(k.tolerance(a, b, precision).max()), name=f"{name} M={M} K={K} N={N}",
                              launch=_tile_owner(N, k.naive.WARPS, width))


def check_tf32_tile(m):
    _gemm_case(m.gemm_tf32_tile, "tf32", "gemm_tf32_tile")


def check_column_sums(m):
    for rows in ROWS:
        x = np.random.default_rng(rows).standard_normal((rows, m.COLUMNS)).astype(np.float32)
        out = m.column_sums(cuda.to_device(x), poisoned((m.COLUMNS,), np.float32))
        atol = rows * 2.0 ** -23 * float(np.abs(x).sum(axis=0).max()) + 1e-30
        workbook.assert_close(out, x.astype(np.float64).sum(axis=0).astype(np.float32), rtol=0, atol=atol,
                              name=f"column_sums of {rows} rows", launch=Launch(1, m.COLUMNS))


def check_f16_ldmatrix(m):
    _gemm_case(m.gemm_f16_ldmatrix, "f16", "gemm_f16_ldmatrix")


def check_f16_wide(m):
    if m.TILE_N % 8 or m.TILE_N < 8:
        raise workbook.CheckError(f"TILE_N is {m.TILE_N}: a warp's tile is a whole number of 8-column mma tiles")
    _gemm_case(m.gemm_f16_wide, "f16", "gemm_f16_wide", width=m.TILE_N)


def speed_f16_wide(m):
    side = workbook.size(gpu=2048, sim=48)
    rng = np.random.default_rng(11)
    a, b = (cuda.to_device(rng.standard_normal((side, side)).astype(np.float16)) for _ in range(2))
    c1, c2 = cuda.device_array((side, side), np.float32), cuda.device_array((side, side), np.float32)
    ratio = speed_ratio(lambda: m.gemm_f16_wide(a, b, c1), lambda: k.gemm(a, b, c2, variant="naive"))
    return ratio, f"gemm_f16_wide {side}^3 vs the chapter's naive FP16 kernel"


EXERCISES = [
    Exercise("ch09.1", "TF32 fragments: which lane holds what", "complete", "gemm_tf32_tile_kernel", check_tf32_tile,
             grids=(), tiles={("gemm_tf32_tile_kernel", 0, 1): 8}),  # (a's depth K, in steps of an mma's)
    Exercise("ch09.2", "a cp.async pipeline that reads too early", "fix", "column_sums_kernel", check_column_sums,
             grids=(), tiles={("column_sums_kernel", 0, 0): 32},  # (x's rows, a stage's TILE_ROWS at a time)
             fixed={"column_sums_kernel argument 0 axis 1": "x has COLUMNS (128) columns, a thread each",
                    "column_sums_kernel argument 1": "out: COLUMNS sums"}),
    Exercise("ch09.3", "an ldmatrix address", "complete", "gemm_f16_ldmatrix_kernel", check_f16_ldmatrix, grids=(),
             tiles={("gemm_f16_ldmatrix_kernel", 0, 1): 16}),
    Exercise("ch09.4", "a wider tile: one A fragment, four mma", "faster", ("gemm_f16_wide_kernel", "gemm_f16_wide"),
             check_f16_wide, speed=speed_f16_wide, target=1.5, grids=(), tiles={("gemm_f16_wide_kernel", 0, 1): 16}),
]
