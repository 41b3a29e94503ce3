"""The tiles both attention kernels are made of: 64 rows of 16-bit values in shared memory, copied
in by cp.async and handed to the tensor cores by ldmatrix.

A tile is 64 rows (or `rows`) of `width` halves (64 or 128: the head dimension, or 64 keys of P), stored as
16-byte chunks with chunk c of row r at c ^ (r % 8): the 8 rows one ldmatrix matrix reads down a
chunk column land in 8 different groups of banks (no conflict), and every copy stays a whole
16-byte chunk. `tile_ops(width)` gives the device functions for one width:

    copy(tile, base, x, start, stride, rows_left, tid)
        cp.async of rows start.., `stride` halves apart in x (flattened), into tile[base..]; rows
        past rows_left are zero-filled. 128 threads, rows x width / 1024 chunks each.
    row_fragments(tile, base, row0, kk, lane) -> 4 uint32
        the mma A fragment (16 x 16, row-major) of rows row0..row0+15, columns 16kk..: Q, or P
    key_fragments(tile, base, j, kk, lane) -> 4 uint32
        the B fragments of S = Q K^T for key columns 8j..8j+15 (two n8 tiles), depth 16kk..: K's
        rows are its columns, so ldmatrix reads them as they are (b0, b1 of tile j, of tile j + 1)
    value_fragments(tile, base, s, c, lane) -> 4 uint32
        the B fragments of O = P V for keys 16s..16s+15 and output columns 8c..8c+15: V is keys x
        columns, and the mma wants it by columns: ldmatrix .trans
"""

from numba import cuda

from workbook.tensor_cores import cp_async16, ldmatrix_x4, ldmatrix_x4_trans

ROWS = 64  # every tile: 64 queries, or 64 keys
THREADS = 128  # 4 warps, 16 rows of queries each
CHUNK = 8  # halves in 16 bytes


@cuda.jit(device=True, forceinline=True)
def at(row, chunk, width):
    """The element where 16-byte chunk `chunk` of row `row` starts, in a tile of `width` halves a row."""
    return row * width + (chunk ^ (row & 7)) * CHUNK


def tile_ops(width, rows=ROWS):
    chunks = width // CHUNK  # in a row
    rows_apart = THREADS // chunks  # between one thread's rows
    per_thread = rows // rows_apart

    @cuda.jit(device=True, forceinline=True)
    def copy(tile, base, x, start, stride, rows_left, tid):
        row, chunk = tid // chunks, tid % chunks
        for i in range(per_thread):  # stepping rows_apart (a multiple of 8) keeps the row's swizzle
            r = row + rows_apart * i
            cp_async16(tile, base + at(r, chunk, width), x, start + r * stride + chunk * CHUNK,
                       16 if r < rows_left else 0)

    @cuda.jit(device=True, forceinline=True)
    def row_fragments(tile, base, row0, kk, lane):
        # matrices: rows 0-7 | 8-15 at chunk 2kk, then at 2kk + 1: a0, a1, a2, a3
        return ldmatrix_x4(tile, base + at(row0 + lane % 16, 2 * kk + lane // 16, width))

    @cuda.jit(device=True, forceinline=True)
    def key_fragments(tile, base, j, kk, lane):
        # matrices: keys of tile j at chunks 2kk | 2kk + 1, then tile j + 1's
        m = lane // 8
        return ldmatrix_x4(tile, base + at(8 * (j + m // 2) + lane % 8, 2 * kk + m % 2, width))

    @cuda.jit(device=True, forceinline=True)
    def value_fragments(tile, base, s, c, lane):
        # matrices: keys 0-7 | 8-15 of step s at chunk c, then at chunk c + 1 (transposed)
        return ldmatrix_x4_trans(tile, base + at(16 * s + lane % 16, c + lane // 16, width))

    return copy, row_fragments, key_fragments, value_fragments
