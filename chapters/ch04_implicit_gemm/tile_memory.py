"""Chapter 04's tile traffic: the A and B tiles from global memory into registers and shared
memory (double buffered), and the epilogue that writes a thread's outputs into the NKPQ output.

make_tile_loads(tile, quads=...) and make_epilogue(tile, quad_outputs=...) compile them for a tile;
the implicit GEMM loads its A tile with the same functions and gathers its B tile (gather.py).
"""

from functools import lru_cache
from typing import NamedTuple

from numba import cuda, float32

from workbook.memory import atomic_add4, load4, shared_store4, store4

from .tiles import U64, jit_options, layout, make_tile_math


class TileLoads(NamedTuple):
    load_a_tile: object
    store_a_tile: object
    load_b_tile: object
    store_b_tile: object
    A_LOADS: int  # A tile elements a thread loads per depth step
    B_LOADS: int


@lru_cache(maxsize=None)
def make_tile_loads(tile, *, quads=False):
    """A tile's loaders and shared-memory stores. quads: load the A and B tiles from global memory
    16 bytes at a time (load4); the caller checked that the rows of a and b are whole, 16-byte
    aligned quads (tiles.quads_fit)."""
    BM, BN, BK = tile.BM, tile.BN, tile.BK
    THREADS = layout(tile).THREADS
    V = 4 if quads else 1  # elements per global load
    if (BM * BK) % (V * THREADS) or (BK * BN) % (V * THREADS) or BK % V:
        raise ValueError(f"tile {tile}: 16-byte tile loads need BK a multiple of 4 and whole quads per thread")
    A_LOADS, A_STEP = BM * BK // THREADS, THREADS // BK  # A tile elements per thread, row stride
    B_LOADS, B_STEP = BK * BN // THREADS, THREADS // BN
    A_QUADS, A_QUAD_STEP = A_LOADS // V, THREADS * V // BK  # the same, one quad per load
    B_QUADS, B_QUAD_STEP = B_LOADS // V, THREADS * V // BN
    _, inline = jit_options(tile)

    @cuda.jit(**inline)
    def load_a_tile(a, row0, k0, t, next_a):
        """The A tile of depth step k0 into registers: zeros past the matrix's edges."""
        M, KD = a.shape
        if V == 1:
            ak, am = t % BK, t // BK  # A[row0 + am + A_STEP*l, k0 + ak]: a warp reads 4 rows of 32 bytes
            for l in range(A_LOADS):
                m = row0 + am + A_STEP * l
                next_a[l] = a[U64(m), U64(k0 + ak)] if m < M and k0 + ak < KD else float32(0)
        else:
            ak, am = V * (t % (BK // V)), t // (BK // V)  # a quad A[m, k0+ak .. k0+ak+3]
            for l in range(A_QUADS):
                m = row0 + am + A_QUAD_STEP * l
                quad = (float32(0), float32(0), float32(0), float32(0))
                if m < M and k0 + ak < KD:  # KD % 4 == 0: the quad is whole
                    quad = load4(a, U64(m) * U64(KD) + U64(k0 + ak))
                next_a[4 * l], next_a[4 * l + 1], next_a[4 * l + 2], next_a[4 * l + 3] = quad

    @cuda.jit(**inline)
    def store_a_tile(a_s, buf, t, next_a):  # transposed: a_s[k, m] = A[m, k]
        if V == 1:
            ak, am = t % BK, t // BK
            for l in range(A_LOADS):
                a_s[U64(buf), U64(ak), U64(am + A_STEP * l)] = next_a[l]
        else:
            ak, am = V * (t % (BK // V)), t // (BK // V)
            for l in range(A_QUADS):
                for e in range(4):
                    a_s[U64(buf), U64(ak + e), U64(am + A_QUAD_STEP * l)] = next_a[4 * l + e]

    @cuda.jit(**inline)
    def load_b_tile(b, col0, k0, t, next_b):
        KD, NC = b.shape
        if V == 1:
            bk, bn = t // BN, t % BN  # B[k0 + bk + B_STEP*l, col0 + bn]: a warp reads 128 bytes
            for l in range(B_LOADS):
                k = k0 + bk + B_STEP * l
                next_b[l] = b[U64(k), U64(col0 + bn)] if k < KD and col0 + bn < NC else float32(0)
        else:
            bk, bn = t // (BN // V), V * (t % (BN // V))  # a warp reads 512 bytes of one row
            for l in range(B_QUADS):
                k = k0 + bk + B_QUAD_STEP * l
                quad = (float32(0), float32(0), float32(0), float32(0))
                if k < KD and col0 + bn < NC:  # NC % 4 == 0: the quad is whole
                    quad = load4(b, U64(k) * U64(NC) + U64(col0 + bn))
                next_b[4 * l], next_b[4 * l + 1], next_b[4 * l + 2], next_b[4 * l + 3] = quad

    @cuda.jit(**inline)
    def store_b_tile(b_s, buf, t, next_b):
        if V == 1:
            bk, bn = t // BN, t % BN
            for l in range(B_LOADS):
                b_s[U64(buf), U64(bk + B_STEP * l), U64(bn)] = next_b[l]
        else:
            bk, bn = t // (BN // V), V * (t % (BN // V))
            for l in range(B_QUADS):
                shared_store4(b_s, U64((buf * BK + bk + B_QUAD_STEP * l) * BN + bn),
                              (next_b[4 * l], next_b[4 * l + 1], next_b[4 * l + 2], next_b[4 * l + 3]))


    return TileLoads(load_a_tile, store_a_tile, load_b_tile, store_b_tile, A_LOADS, B_LOADS)


@lru_cache(maxsize=None)
def make_epilogue(tile, *, quad_outputs=False):
    """The device function that writes (or, for a tile whose depth was shared, adds) a thread's
    outputs. quad_outputs: 16 bytes at a time; the caller checked tiles.quad_outputs_fit."""
    if quad_outputs and not tile.wide:
        raise ValueError(f"tile {tile}: only a wide tile writes its outputs in quads")
    TM, TN = tile.TM, tile.TN
    tile_math = make_tile_math(tile)
    output_row, output_column = tile_math.output_row, tile_math.output_column
    _, inline = jit_options(tile)

    @cuda.jit(**inline)
    def store_outputs(c, acc, row0, col0, ty, tx, M, NC, PQ, whole):
        """Epilogue: column -> (image n, position pq) of the NKPQ output. A tile whose depth was
        shared between blocks (not `whole`) adds its partial sums into c, which the host zeroed."""
        for j in range(TN):
            col = col0 + output_column(j, tx)
            if col < NC:
                n = col // PQ
                pq = col - n * PQ
                for i in range(TM):
                    m = row0 + output_row(i, ty)
                    if m < M:
                        if whole:
                            c[n, m, pq] = acc[i, j]
                        else:
                            cuda.atomic.add(c, (n, m, pq), acc[i, j])

    @cuda.jit(**inline)
    def store_output_quads(c, acc, row0, col0, ty, tx, M, NC, PQ, whole):
        """store_outputs 16 bytes at a time: a wide tile's 4 adjacent columns are 4 adjacent
        positions of one image (PQ % 4 == 0), stored with one st.global.v4 or, for a partial tile,
        added with one red.global.add.v4: a quarter of the atomics."""
        for jq in range(TN // 4):
            col = col0 + output_column(4 * jq, tx)
            if col < NC:  # NC % 4 == 0: the quad is whole
                n = col // PQ
                pq = col - n * PQ
                for i in range(TM):
                    m = row0 + output_row(i, ty)
                    if m < M:
                        index = (U64(n) * U64(M) + U64(m)) * U64(PQ) + U64(pq)
                        quad = (acc[i, 4 * jq], acc[i, 4 * jq + 1], acc[i, 4 * jq + 2], acc[i, 4 * jq + 3])
                        if whole:
                            store4(c, index, quad)
                        else:
                            atomic_add4(c, index, quad)

    return store_output_quads if quad_outputs else store_outputs
