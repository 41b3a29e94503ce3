"""Chapter 04's gather: the implicit GEMM's B tile, loaded from x through the tap table.

Where the explicit GEMM loads B[k, column] from the im2col matrix, the implicit one computes where
that element is in x: each thread decodes its column (n, p, q) once per output tile (column_taps),
then per depth step reads the table entries of its rows (load_tap_entries) and gathers them
(gather_b_tile). make_gather(tile, tap_field=..., table_words=...) compiles the three for a tile
and a table format (geometry.tap_field, shared_table_words).
"""

from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda, float32

from workbook.memory import load4, shared_load4, shared_store4
from workbook.launch import cdiv

from .geometry import column_origin
from .tiles import U64, jit_options, layout

# The implicit GEMM's table in shared memory: its size is fixed when the kernel is compiled, so
# tables are given room in steps of SHARED_TABLE_STEP words (one kernel per step, not per depth);
# a table larger than SHARED_TABLE_WORDS (12 KB: C*R*S up to 3072 packed rows, e.g. 341 channels
# of a 3x3 filter) stays in global memory, where every block reads it through L1 (the gathers then
# wait for their entries: slower, still right). 12 KB keeps the largest tile (33 KB of tiles)
# under the 48 KB of static shared memory a block may declare.
SHARED_TABLE_STEP = 1024
SHARED_TABLE_WORDS = 3072


def shared_table_words(table_words):
    """The room the implicit GEMM gives a table of table_words words in shared memory; 0: none."""
    if table_words > SHARED_TABLE_WORDS:
        return 0
    return cdiv(table_words, SHARED_TABLE_STEP) * SHARED_TABLE_STEP



class Gather(NamedTuple):
    column_taps: object
    load_tap_entries: object
    copy_table: object
    gather_b_tile: object
    ENTRY_WORDS: int  # table words a thread reads per depth step
    TABLE_WORDS: int  # the shared table's size (at least 4 words: numba needs a shape)


@lru_cache(maxsize=None)
def make_gather(tile, *, tap_field=0, table_words=0):
    """The gather's device functions for `tile` and a table format.

    tap_field: geometry.tap_field(g): R*S for packed entries (one 32-bit word per row, a 32-bit
    on_image mask), 0 for (offset, tap) pairs (a 64-bit mask).
    table_words: the kernel copies its table into a shared array of this many words (at least the
    table's length; see shared_table_words), or reads it from global memory if 0.
    """
    BK, BN = tile.BK, tile.BN
    THREADS = layout(tile).THREADS
    B_LOADS = BK * BN // THREADS  # B rows a thread gathers per depth step
    TapWord = np.uint32 if tap_field else np.uint64  # the on_image mask
    FIELD = np.uint32(tap_field)
    SHARED_TABLE = table_words > 0
    load_table_quad = shared_load4 if SHARED_TABLE else load4
    ROW_WORDS = 1 if tap_field else 2  # table words per GEMM row
    ENTRY_WORDS = ROW_WORDS * B_LOADS  # and for the B rows a thread gathers in one step
    ENTRY_QUADS = ENTRY_WORDS % 4 == 0 and ROW_WORDS * BK % 4 == 0  # whole, 16-byte aligned quads
    _, inline = jit_options(tile)

    @cuda.jit(**inline)
    def column_taps(column, NC, PQ, Q, R, S, sh, sw, ph, pw, dh, dw, H, W, CHW):
        """This thread's B column (n, p, q), decoded once per output tile: its base offset into x
        (mod 2^32: negative at a padded corner, as the 32-bit sums in gather_b_tile wrap) and which
        of the R*S filter taps fall on the image for it, bit r*S + s of on_image. Columns past the
        end: no tap."""
        base, h0, w0 = column_origin(column, PQ, Q, sh, sw, ph, pw, W, CHW)
        base = np.uint32(base & 0xFFFFFFFF)
        on_image = 0
        if column < NC:
            for r in range(R):
                for s in range(S):
                    h, w = h0 + r * dh, w0 + s * dw
                    if h >= 0 and h < H and w >= 0 and w < W:
                        on_image |= 1 << (r * S + s)
        return base, TapWord(on_image)

    @cuda.jit(**inline)
    def load_tap_entries(table, k, entries):
        """The table entries of B rows k .. k + B_LOADS - 1 into entries (ENTRY_WORDS words), from
        the block's shared copy of the table (SHARED_TABLE) or from global memory.

        The same for the whole warp (a broadcast); the rows are consecutive, so their entries come
        16 bytes per load where they fill whole, aligned quads (ROW_WORDS * k a multiple of 4)."""
        if ENTRY_QUADS:
            for q in range(ENTRY_WORDS // 4):
                (entries[4 * q], entries[4 * q + 1],
                 entries[4 * q + 2], entries[4 * q + 3]) = load_table_quad(table, U64(ROW_WORDS * k + 4 * q))
        else:
            for e in range(ENTRY_WORDS):
                entries[e] = table[U64(ROW_WORDS * k + e)]

    @cuda.jit(**inline)
    def copy_table(taps_table, table_s, t):
        """The whole table into shared memory, 16 bytes per load and store (its length is a
        multiple of TABLE_ALIGN rows)."""
        for q in range(t, taps_table.size // 4, THREADS):
            e0, e1, e2, e3 = load4(taps_table, U64(4 * q))
            shared_store4(table_s, U64(4 * q), (e0, e1, e2, e3))

    @cuda.jit(**inline)
    def gather_b_tile(x, entries, base, on_image, next_b):
        """The B_LOADS rows of this thread's column whose table entries load_tap_entries put in
        `entries`, gathered from x: zeros off the image.

        x offsets are 32-bit (the wrapper checked that x has fewer than 2^31 elements): one 32-bit
        add, and the address is one multiply-add, x + 4 * offset."""
        for l in range(B_LOADS):
            if tap_field:  # packed: one AND tests the row's bit, one shift extracts its offset
                on = on_image & entries[l]
                offset = entries[l] >> FIELD
            else:  # pairs: the offset, and the tap's bit of a 64-bit mask
                offset = entries[2 * l]
                on = (on_image >> entries[2 * l + 1]) & TapWord(1)
            value = float32(0)
            if on:  # predicate: padding reads as zero
                value = x[U64(np.uint32(U64(base) + U64(offset)))]  # the 32-bit sum wraps to the offset
            next_b[l] = value


    return Gather(column_taps, load_tap_entries, copy_table, gather_b_tile, ENTRY_WORDS, max(table_words, 4))
