"""Chapter 04's GEMM tiling: the Tile, the tiles the chapter runs, and a block tile's arithmetic.

Shared by the explicit GEMM (gemm.py) and the implicit convolution (implicit.py). make_tile_math(tile)
compiles the device functions that multiply the shared A and B tiles into a thread's registers;
tile_memory.py moves the tiles, schedule.py shares the work out between blocks.
"""

from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np
from numba import cuda

from workbook import ON_GPU
from workbook.memory import aligned, shared_load4, vector_atomics

# ---------------------------------------------------------------------------------------------
# The GEMM tiling, shared by the explicit GEMM and the implicit convolution.
#
#   block tile: BM rows x BN columns of the output, marching over the depth in steps of BK
#
#            BK                  BN                       threads: TY x TX = (BM/TM) x (BN/TN)
#         +-----+         +-------------+                 thread (ty, tx) owns the TM x TN outputs
#      BM | A_s |  x   BK |     B_s     |                   rows ty + TY*i, columns tx + TX*j
#         +-----+         +-------------+                 (interleaved, so that a warp's 16 tx read
#     A tile stored transposed (BK, BM+pad):               16 consecutive words of B_s: no bank
#     a column of A is a row of A_s                        conflicts; its 2 ty read 2 broadcast words)
#
# Per step of the depth each thread reads TM + TN words of shared memory and does TM*TN FMAs:
# 8x8 -> 16 loads for 64 FMAs. The tile comes from global memory once per block: the arithmetic
# intensity is BM*BN*2 FLOPs per (BM+BN)*4 bytes per depth step = 32 FLOP/byte at 128x128.
#
# Double buffering: the global loads of step k+1 are issued into registers before step k's FMAs,
# so their latency hides behind the arithmetic; after the FMAs the registers go to the other
# shared buffer. One syncthreads per step suffices (see the loop).


@dataclass(frozen=True)
class Tile:
    BM: int  # block tile rows (output channels K)
    BN: int  # block tile columns (N*P*Q)
    BK: int  # depth step (C*R*S)
    TM: int  # outputs per thread, rows
    TN: int  # outputs per thread, columns
    min_blocks: int = 1  # launch bound: blocks per SM the compiler must fit (caps registers)
    wide: bool = False  # 16-byte shared loads of the fragments (and 16-byte global loads when it can)
    warp_columns: int = 0  # a warp's 32 threads cover (32 / warp_columns) x warp_columns of the
    #                        TY x TX thread grid (0: min(TX, 32), whole rows of the grid)
    prefetch: bool = False  # load the fragments of row kk + 1 of the tile before row kk's FMAs
    padded: bool = True  # A_s rows padded (see layout); False only to see what the padding saves

    @property
    def threads(self):
        return (self.BM // self.TM) * (self.BN // self.TN)

    def __str__(self):
        return f"{self.BM}x{self.BN}x{self.BK}, {self.TM}x{self.TN}/thread" + ("" if self.padded else ", unpadded")


# On the GPU: 256 threads, 8x8 outputs each. In the simulator (every CUDA thread run in Python),
# 64 threads of 2x4 (and 32 of 2x2): the same code, small enough to run in seconds.
GPU_TILES = {
    "128x128": Tile(128, 128, 8, 8, 8, min_blocks=2),  # 2 blocks of 8 warps per SM: <= 128 registers
    "128x128, BK=16": Tile(128, 128, 16, 8, 8),  # half the syncthreads per FMA; 1 block per SM
    "64x128": Tile(64, 128, 8, 4, 8, min_blocks=2),  # K = 64 fills it
    "64x64": Tile(64, 64, 8, 4, 4, min_blocks=3),  # 4x the blocks: for layers with few columns
    # The optimized step: fragments read 16 bytes at a time (4 shared loads per 64 FMAs instead of
    # 16), tiles loaded from global memory 16 bytes at a time where the shapes allow, and (prefetch)
    # the next row's fragments loaded while this row's FMAs run.
    "128x128 wide": Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True),
    "128x128 wide, prefetch": Tile(128, 128, 8, 8, 8, min_blocks=2, wide=True, prefetch=True),
    "128x128 wide, prefetch, BK=16": Tile(128, 128, 16, 8, 8, min_blocks=2, wide=True, prefetch=True),
    "64x128 wide, prefetch": Tile(64, 128, 8, 4, 8, min_blocks=2, wide=True, prefetch=True),
    "64x64 wide, prefetch": Tile(64, 64, 8, 4, 4, min_blocks=3, wide=True, prefetch=True),
    # 128 threads of 8x16 (or 16x8) outputs: 128 FMAs per 6 shared loads instead of 64 per 4, and
    # 2 x 128 threads per SM leave up to 255 registers to each: no spills, BK = 16 affordable.
    "128x128 wide, 8x16/thread, BK=16": Tile(128, 128, 16, 8, 16, min_blocks=2, wide=True, prefetch=True),
    "128x128 wide, 16x8/thread, BK=16": Tile(128, 128, 16, 16, 8, min_blocks=2, wide=True, prefetch=True),
    # 256 threads of 16x8, one block of 8 warps per SM: the B tile serves twice the rows, so a
    # thread gathers 4 B elements per 1,024 FMAs where the 128x128 tile gathers 16 per 2,048. BK = 8
    # keeps the tiles (24 KB) and the implicit GEMM's table (12 KB) under the 48 KB of static shared
    # memory; the price is a barrier per 1,024 FMAs that 8 warps wait at with no second block to run.
    "256x128 wide, 16x8/thread": Tile(256, 128, 8, 16, 8, min_blocks=1, wide=True, prefetch=True),
}
SIM_TILES = {"16x32": Tile(16, 32, 4, 2, 4), "8x16": Tile(8, 16, 4, 2, 2),
             "16x32 wide, prefetch": Tile(16, 32, 8, 4, 4, wide=True, prefetch=True),
             # more threads than columns, as in the 256x128 tile: each B column gathered by two
             "32x16 wide, prefetch": Tile(32, 16, 8, 4, 4, wide=True, prefetch=True)}
TILES = GPU_TILES if ON_GPU else SIM_TILES
DEFAULT_TILE = next(iter(TILES.values()))
# The tiles kernels.fastest_tile tries on a layer: on the GPU, the four that won or came second on
# some layer when every tile was tried (EXPERIMENTS.md has their times); each try is a compile.
SEARCH_TILES = (("64x128 wide, prefetch", "128x128 wide, 8x16/thread, BK=16", "128x128 wide, 16x8/thread, BK=16",
                 "256x128 wide, 16x8/thread") if ON_GPU else tuple(SIM_TILES))


# numba gives every signed index a test "if i < 0: i += length" (Python's negative indexing): 5
# instructions on 64-bit ints. Indices known to be >= 0 are cast to unsigned, which skips it; and
# LLVM then folds a thread's stores into a shared tile to one address plus constant offsets (the
# 8x16 tile's stores: 69 instructions per step fewer in the GEMM, 155 in the implicit kernel).
U64 = np.uint64


class Layout(NamedTuple):
    """What the factories derive from a tile: its thread grid and the shared A tile's row pitch."""

    TY: int  # thread rows: BM // TM
    TX: int  # thread columns: BN // TN
    THREADS: int
    G: int  # 4 for a wide tile (a thread's outputs in 4x4 groups of adjacent ones), else 1
    A_PITCH: int  # words per row of the transposed A tile in shared memory
    WARP_TX: int  # a warp covers (32 // WARP_TX) x WARP_TX of the thread grid
    WARPS_ACROSS: int  # warps side by side along a row of the thread grid


@lru_cache(maxsize=None)
def layout(tile):
    """The tile's Layout, or a ValueError naming what does not fit."""
    BM, BN, BK, TM, TN = tile.BM, tile.BN, tile.BK, tile.TM, tile.TN
    TY, TX = BM // TM, BN // TN
    THREADS = TY * TX
    # A thread's outputs come in groups of G adjacent rows and G adjacent columns: G = 1 is the
    # interleaved layout drawn above; G = 4 (a wide tile) lets one ld.shared.v4 read 4 of its
    # A values and one 4 of its B values.
    G = 4 if tile.wide else 1
    if THREADS % BK or THREADS % BN or (BM * BK) % THREADS or (BK * BN) % THREADS:
        raise ValueError(f"tile {tile}: every thread must load whole rows of the A and B tiles")
    if TM % G or TN % G or (tile.prefetch and BK % 2):
        raise ValueError(f"tile {tile}: a wide tile needs TM, TN, BK multiples of 4 and whole quads per thread; "
                         "prefetch an even BK")
    if tile.prefetch and not tile.wide:
        raise ValueError(f"tile {tile}: prefetch reads 16-byte fragments (load_fragment_quads): it needs a wide tile")
    WARP_TX = tile.warp_columns or min(TX, 32)
    if 32 % WARP_TX or TX % WARP_TX or (THREADS >= 32 and TY % (32 // WARP_TX)):
        raise ValueError(f"tile {tile}: a warp's {32 // WARP_TX} x {WARP_TX} threads must tile the "
                         f"{TY} x {TX} thread grid")
    # A_s row padding: a warp stores 32/BK consecutive rows of A into BK rows of A_s; a row pitch of
    # BM + 32/BK words puts those 32 stores into 32 different banks. A wide tile reads A_s rows 16
    # bytes at a time, so its pitch stays a multiple of 4 words.
    A_PITCH = BM + (max(G, 32 // BK) if tile.padded else 0)
    return Layout(TY, TX, THREADS, G, A_PITCH, WARP_TX, TX // WARP_TX)


# Every kernel made for a tile, by a description of its options: what kernels.resources() reports.
MADE = {}


def register(tile, description, kernel):
    MADE.setdefault(tile, {})[description] = kernel
    return kernel


def shared_bytes(tile):
    """Shared memory a block of this tile declares for its double-buffered A and B tiles (the
    implicit GEMM adds its table: gather.SHARED_TABLE_WORDS words at most)."""
    return 4 * 2 * tile.BK * (layout(tile).A_PITCH + tile.BN)


def jit_options(tile):
    """(kernel options, device-function options) for a tile's kernels and helpers."""
    options, inline = {"fastmath": True}, {"device": True}
    if ON_GPU:  # what the GPU runs depends on these; the simulator and its compile check need neither
        options["launch_bounds"] = (tile.threads, tile.min_blocks)
        # The helpers take the thread's register arrays: inlined into the kernel (NVVM IR level),
        # their constant indices let LLVM keep the arrays in registers.
        inline["forceinline"] = True
    return options, inline


def pick_tile(tile):
    """A Tile from a Tile, a name in TILES, or None (DEFAULT_TILE)."""
    if tile is None:
        return DEFAULT_TILE
    if isinstance(tile, str):
        if tile not in TILES:
            raise ValueError(f"unknown tile {tile!r}; have {list(TILES)}")
        return TILES[tile]
    if not isinstance(tile, Tile):
        raise TypeError(f"tile must be a Tile or one of {list(TILES)}, not {type(tile).__name__}")
    return tile


def tile_takes_quads(tile):
    """Does every thread of this wide tile load whole quads (4 floats) of its A and B tiles?"""
    per_thread = 4 * tile.threads
    return tile.wide and (tile.BM * tile.BK) % per_thread == 0 and (tile.BK * tile.BN) % per_thread == 0


def quads_fit(tile, *matrices):
    """Can a wide tile load these row-major matrices from global memory 16 bytes at a time? Every
    row a whole number of quads, the first element 16-byte aligned, and a whole number of quads per
    thread in each tile (else: 4-byte loads)."""
    return tile_takes_quads(tile) and all(m.shape[1] % 4 == 0 and aligned(m) for m in matrices)


def quad_outputs_fit(tile, out, PQ):
    """Can a wide tile write `out` 16 bytes at a time? Its 4 adjacent columns must be 4 positions
    of one image (PQ % 4 == 0), the output 16-byte aligned, and the GPU have vector atomics."""
    return tile.wide and PQ % 4 == 0 and aligned(out) and _vector_atomics()


@lru_cache(maxsize=None)
def _vector_atomics():
    # The simulator has them (workbook.memory), so that they are checked on a laptop too.
    return vector_atomics(cuda.get_current_device().compute_capability) if ON_GPU else True


class TileMath(NamedTuple):
    thread_position: object
    output_row: object
    output_column: object
    load_fragments: object
    fragment_starts: object
    load_fragment_quads: object
    rank1_update: object
    multiply_tile: object


@lru_cache(maxsize=None)
def make_tile_math(tile):
    """The device functions of a block tile's arithmetic, compiled for `tile`: where a thread sits
    in the thread grid, which outputs it owns, and acc += A_s x B_s over rows of the shared tiles."""
    BN, BK, TM, TN = tile.BN, tile.BK, tile.TM, tile.TN
    TY, TX, THREADS, G, A_PITCH, WARP_TX, WARPS_ACROSS = layout(tile)
    PREFETCH = tile.prefetch
    _, inline = jit_options(tile)

    @cuda.jit(**inline)
    def load_fragments(a_s, b_s, buf, kk, ty, tx, ra, rb, slot):
        """This thread's TM values of A_s row kk and TN values of B_s row kk into ra[slot], rb[slot]."""
        if G == 1:
            # Views starting at this thread's first word: the loads below have constant offsets
            # from one address per kk, not one 64-bit sum per load.
            a_k = a_s[buf, kk, ty:]
            b_k = b_s[buf, kk, tx:]
            for i in range(TM):
                ra[slot, i] = a_k[TY * i]  # a warp reads 2 broadcast words
            for j in range(TN):
                rb[slot, j] = b_k[TX * j]  # a warp reads 16 consecutive words: no bank conflict
        else:
            a_k, b_k = fragment_starts(buf, kk, ty, tx)
            load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, slot)

    @cuda.jit(**inline)
    def fragment_starts(buf, kk, ty, tx):
        """Flat indices of this thread's first A_s and B_s words in row kk of buffer buf (a wide tile)."""
        return U64((buf * BK + kk) * A_PITCH + 4 * ty), U64((buf * BK + kk) * BN + 4 * tx)

    @cuda.jit(**inline)
    def load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, slot):
        """A wide tile's load_fragments, from the flat indices of this thread's first A_s and B_s
        words of the row: 16 bytes per load, TM/4 + TN/4 shared loads instead of TM + TN."""
        for i in range(TM // 4):
            (ra[slot, 4 * i], ra[slot, 4 * i + 1],
             ra[slot, 4 * i + 2], ra[slot, 4 * i + 3]) = shared_load4(a_s, a_k + U64(4 * TY * i))
        for j in range(TN // 4):
            (rb[slot, 4 * j], rb[slot, 4 * j + 1],
             rb[slot, 4 * j + 2], rb[slot, 4 * j + 3]) = shared_load4(b_s, b_k + U64(4 * TX * j))

    @cuda.jit(**inline)
    def rank1_update(acc, ra, rb, slot):
        for i in range(TM):
            for j in range(TN):
                acc[i, j] += ra[slot, i] * rb[slot, j]

    @cuda.jit(**inline)
    def multiply_tile(a_s, b_s, buf, first_row, rows, ty, tx, ra, rb, acc):
        """acc += A_s[buf] x B_s[buf] over the tile's rows first_row .. first_row + rows - 1 (all
        BK of them in the GEMM): rank-1 updates of this thread's TM x TN outputs. The kernels pass
        constants: once inlined, the loop counts are known.

        With PREFETCH, the fragments of row kk + 1 are loaded before row kk's FMAs, into the other
        half of ra and rb, so that the FMAs need not wait for the shared loads (16 more registers).
        The loop is unrolled by two by hand: NVVM does not unroll it (512 FMAs), and an array
        indexed by a variable cannot live in registers. Its overhead is paid per 2*TM*TN FMAs, so it
        is kept small: the last pair is peeled off (no "is there a next row" test inside), the
        fragments' indices move on by two rows per trip (not recomputed from buf and kk), and the
        trips are counted in 32 bits (numba's range counts in 64): 10 instructions per 256 FMAs
        instead of 19 (SASS of the 8x16 tile)."""
        if not PREFETCH:
            for kk in range(first_row, first_row + rows):
                load_fragments(a_s, b_s, buf, kk, ty, tx, ra, rb, 0)
                rank1_update(acc, ra, rb, 0)
        else:
            a_k, b_k = fragment_starts(buf, first_row, ty, tx)
            load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, 0)
            pair = np.uint32(0)
            while pair < np.uint32(rows // 2 - 1):
                load_fragment_quads(a_s, b_s, a_k + U64(A_PITCH), b_k + U64(BN), ra, rb, 1)
                rank1_update(acc, ra, rb, 0)
                a_k += U64(2 * A_PITCH)
                b_k += U64(2 * BN)
                load_fragment_quads(a_s, b_s, a_k, b_k, ra, rb, 0)
                rank1_update(acc, ra, rb, 1)
                pair += np.uint32(1)
            load_fragment_quads(a_s, b_s, a_k + U64(A_PITCH), b_k + U64(BN), ra, rb, 1)
            rank1_update(acc, ra, rb, 0)
            rank1_update(acc, ra, rb, 1)

    @cuda.jit(**inline)
    def thread_position(t):
        """(tx, ty) of thread t in the TY x TX grid: each warp a (32 / WARP_TX) x WARP_TX patch of it."""
        warp, lane = t // 32, t % 32
        return ((warp % WARPS_ACROSS) * WARP_TX + lane % WARP_TX,
                (warp // WARPS_ACROSS) * (32 // WARP_TX) + lane // WARP_TX)

    @cuda.jit(**inline)
    def output_row(i, ty):  # the tile row of this thread's i-th register row
        return (i // G) * (G * TY) + G * ty + i % G

    @cuda.jit(**inline)
    def output_column(j, tx):
        return (j // G) * (G * TX) + G * tx + j % G


    return TileMath(thread_position, output_row, output_column, load_fragments, fragment_starts,
                    load_fragment_quads, rank1_update, multiply_tile)
