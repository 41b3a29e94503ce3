"""Chapter 04's implicit GEMM: the tiled GEMM with its B tile gathered from x, and its wrapper.

make_implicit_kernel(tile, ...) is make_gemm_kernel's kernel with one part swapped: the B tile's
loader is the gather (gather.py), so that X = im2col(x) is never written.
"""

from functools import lru_cache

import numpy as np
from numba import cuda, float32, uint32

from workbook.launch import TensorCalls

from .gather import make_gather, shared_table_words
from .geometry import MAX_TAPS, conv_args, device_tap_table, tap_field
from .schedule import launch_gemm, make_schedule
from .tile_memory import make_epilogue, make_tile_loads
from .tiles import U64, jit_options, layout, make_tile_math, pick_tile, quad_outputs_fit, quads_fit, register


@lru_cache(maxsize=None)
def make_implicit_kernel(tile, *, quads=False, quad_outputs=False, tap_field=0, table_words=0):
    """implicit_conv_kernel(x, a, taps_table, H, W, PQ, Q, R, S, sh, sw, ph, pw, dh, dw, c) with the
    tiling of `tile`. quads: 16-byte loads of the filters a (tiles.quads_fit); quad_outputs: 16-byte
    stores of c; tap_field, table_words: the table's format and room in shared memory (make_gather)."""
    BM, BN, BK, TM, TN = tile.BM, tile.BN, tile.BK, tile.TM, tile.TN
    A_PITCH = layout(tile).A_PITCH
    tile_math = make_tile_math(tile)
    thread_position, multiply_tile = tile_math.thread_position, tile_math.multiply_tile
    load_a_tile, store_a_tile, _, _, A_LOADS, B_LOADS = make_tile_loads(tile, quads=quads)
    epilogue = make_epilogue(tile, quad_outputs=quad_outputs)
    block_share, start_tile_run = make_schedule(tile)
    column_taps, load_tap_entries, copy_table, gather_b_tile, ENTRY_WORDS, TABLE_WORDS = make_gather(
        tile, tap_field=tap_field, table_words=table_words)
    SHARED_TABLE = table_words > 0
    # The next B tile is gathered after SPLIT of the BK rows of FMAs (an even number with prefetch,
    # which multiplies rows in pairs), not right after the barrier: see the loop.
    SPLIT = 2 * (BK // 4) if tile.prefetch else BK // 2
    options, _ = jit_options(tile)

    @cuda.jit(**options)
    def implicit_conv_kernel(x, a, taps_table, H, W, PQ, Q, R, S, sh, sw, ph, pw, dh, dw, c):
        """gemm_kernel with b = im2col(x) never built: each B element is loaded from x directly.

        x: the input, flat; a: filters (K, C*R*S); taps_table: tap_table(); c: out (N, K, P*Q).
        """
        M, KD = a.shape
        NC = c.shape[0] * PQ
        CHW = x.size // c.shape[0]
        t = cuda.threadIdx.x
        tx, ty = thread_position(t)
        a_s = cuda.shared.array((2, BK, A_PITCH), float32)
        b_s = cuda.shared.array((2, BK, BN), float32)
        acc = cuda.local.array((TM, TN), float32)
        ra = cuda.local.array((2, TM), float32)
        rb = cuda.local.array((2, TN), float32)
        next_a = cuda.local.array(A_LOADS, float32)
        next_b = cuda.local.array(B_LOADS, float32)
        entries = cuda.local.array(ENTRY_WORDS, uint32)  # table entries of the B rows of a step
        table = taps_table
        if SHARED_TABLE:  # a copy per block, read once from global memory: entries in ~30 cycles
            table = cuda.shared.array(TABLE_WORDS, uint32)
            copy_table(taps_table, table, t)
            cuda.syncthreads()
        bk, bn = t // BN, t % BN  # this thread gathers B[k0 + bk*B_LOADS + l, col0 + bn], l < B_LOADS
        tiles_across, steps = (NC + BN - 1) // BN, (KD + BK - 1) // BK
        unit, end = block_share(tiles_across * ((M + BM - 1) // BM), steps)
        while unit < end:
            first, last, row0, col0 = start_tile_run(unit, end, steps, tiles_across, acc)
            # This thread's B column (n, p, q) is fixed for the tile: decode it once (gather.py).
            base, on_image = column_taps(col0 + bn, NC, PQ, Q, R, S, sh, sw, ph, pw, dh, dw, H, W, CHW)

            load_a_tile(a, row0, first * BK, t, next_a)
            load_tap_entries(table, first * BK + bk * B_LOADS, entries)
            gather_b_tile(x, entries, base, on_image, next_b)
            step, stop = np.uint32(first), np.uint32(last)  # in 32 bits, as in gemm_kernel
            while step < stop:
                buf = step & np.uint32(1)
                store_a_tile(a_s, buf, t, next_a)
                for l in range(B_LOADS):
                    b_s[U64(buf), U64(bk * B_LOADS + l), U64(bn)] = next_b[l]
                cuda.syncthreads()
                # The next step's loads go between two halves of the FMAs, not right after the
                # barrier: there the 4 warps of a block would all issue their gathers' chains
                # (entry, test, offset, address, load) at once, with nothing to overlap them.
                multiply_tile(a_s, b_s, buf, 0, SPLIT, ty, tx, ra, rb, acc)
                step = np.uint32(step + np.uint32(1))
                if step < stop:
                    load_a_tile(a, row0, step * np.uint32(BK), t, next_a)
                    load_tap_entries(table, step * np.uint32(BK) + bk * B_LOADS, entries)
                    gather_b_tile(x, entries, base, on_image, next_b)
                # A fence for the scheduler, not for the data: in this loop ptxas would sink the
                # loads below the second half's FMAs on some tiles (64x128: to the end of the step,
                # where nothing hides their latency; 0.285 ms instead of 0.233 on the 64-channel
                # layer). Memory accesses do not cross a syncwarp, so they stay above it.
                cuda.syncwarp()
                multiply_tile(a_s, b_s, buf, SPLIT, BK - SPLIT, ty, tx, ra, rb, acc)
            epilogue(c, acc, row0, col0, ty, tx, M, NC, PQ, first == 0 and last == steps)
            unit += last - first
            cuda.syncthreads()

    description = ("implicit_conv_kernel" + (", 16-byte global loads" if quads else "")
                   + (", 16-byte outputs" if quad_outputs else "")
                   + (f", packed table ({tap_field}-bit taps)" if tap_field else ", table of pairs")
                   + (f" in shared memory ({4 * table_words // 1024} KB)" if table_words else ""))
    return register(tile, description, implicit_conv_kernel)


_torch_calls = TensorCalls()  # conv2d_implicit on torch tensors met before: its launches (chapter 07)


def conv2d_implicit(x, w, out, *, stride=1, padding=0, dilation=1, workspace=None, tile=None,
                    splits=None, stream=0):
    """Implicit GEMM: the same tiling, B tiles gathered from x through the tap table.

    `workspace` is accepted (and ignored) so that both paths share one calling convention.
    """
    given = (x, w, out)
    key = _torch_calls.key(("x", "w", "out"), given, stride, padding, dilation, tile, splits, stream)
    found = _torch_calls.find(key)
    if found is not None:  # torch tensors met before, every check passed then: the same launches
        return found(None, given)[0]
    x, w, out, g = conv_args(x, w, out, stride, padding, dilation)
    if g.R * g.S > MAX_TAPS:
        raise ValueError(f"implicit GEMM supports filters of at most {MAX_TAPS} taps (R*S), "
                         f"not {g.R}x{g.S}; use conv2d_explicit")
    if x.size >= 2**31:
        raise ValueError(f"implicit GEMM indexes x with 32-bit offsets: x has {x.size} elements, "
                         "at most 2^31 - 1; use conv2d_explicit or a smaller batch")
    tile = pick_tile(tile)
    a = w.reshape(g.K, g.gemm_depth)
    table = device_tap_table(g)
    # quads: the A tile (filters) only; B is gathered element by element
    kernel = make_implicit_kernel(tile, quads=quads_fit(tile, a), quad_outputs=quad_outputs_fit(tile, out, g.P * g.Q),
                                  tap_field=tap_field(g), table_words=shared_table_words(table.size))
    entries = launch_gemm(kernel, tile, g.K, g.gemm_columns, g.gemm_depth, splits,
                          out.reshape(g.N, g.K, g.P * g.Q), x.reshape(-1), a,
                          table, g.H, g.W, g.P * g.Q, g.Q, g.R, g.S, g.sh, g.sw, g.ph, g.pw, g.dh, g.dw, stream=stream)
    # the tap table is the launch's own: cached per geometry, but it may be evicted while kept here
    _torch_calls.keep(key, entries, returns=(out,), owners=(2,), holds=(table,))
    return out
