"""The implicit GEMM's row order, made on the GPU: rows grouped by their tap masks, a counting sort.

A block of the implicit GEMM runs every tap any of its rows has, so it wants rows with the same
taps side by side. A full sort of the 27-bit masks is not needed: a counting sort on their top
GROUP_BITS bits (on a GPU 16: taps 11-26) puts equal masks in one bucket and similar ones in neighbouring
buckets, in one pass and three kernels:

    histogram   a thread per row: counts[bucket] += 1 (an atomic add a warp and bucket: claim)
    scan        one block: starts[b] = counts[0] + ... + counts[b - 1] (each thread sums a run of
                buckets, the block scans the threads' sums in shared memory, Hillis and Steele)
    scatter     a thread per row: its place = starts[bucket]++ (claim again): order[place] = row

Rows within a bucket come in whatever order the atomics gave them: the order is not the same from
run to run, the result is (each output row's sums do not depend on the block that computes it).
Then each tile of `rows` consecutive rows gets the OR of its rows' masks (tile_masks_kernel)."""

import numpy as np
from numba import cuda, int32

from workbook import ON_GPU
from workbook.launch import cdiv

from .reference import TAPS

GROUP_BITS = 16 if ON_GPU else 8  # the simulator: fewer buckets to scan, the same code
BUCKETS = 1 << GROUP_BITS
SCAN_THREADS = 512 if ON_GPU else 64  # also the block of the maps in one launch (onelaunch.py)
THREADS = 256


@cuda.jit(device=True, inline=True)
def bucket(mask):
    """A row's bucket: its mask's top GROUP_BITS bits."""
    return mask >> (TAPS - GROUP_BITS)


@cuda.jit(device=True, inline=True)
def claim(counts, b):
    """counts[b] += 1 for this lane, with one atomic add for all the lanes of its warp that have
    bucket b (match_any_sync finds them: rows side by side often share a mask, and an atomic a row
    would queue them on one address); returns counts[b] before this lane's 1: its place."""
    peers = cuda.match_any_sync(cuda.activemask(), b)
    leader = cuda.ffs(peers) - 1
    before = 0
    if cuda.laneid == leader:
        before = cuda.atomic.add(counts, b, cuda.popc(peers))
    return cuda.shfl_sync(peers, before, leader) + cuda.popc(peers & cuda.lanemask_lt())


@cuda.jit
def histogram_kernel(masks, counts):
    i = cuda.grid(1)
    if i < masks.shape[0]:
        claim(counts, bucket(masks[i]))


@cuda.jit
def scan_kernel(counts, starts):
    """starts = the exclusive prefix sums of counts; one block of SCAN_THREADS threads."""
    sums = cuda.shared.array(SCAN_THREADS, int32)
    block_scan(counts, starts, sums)


@cuda.jit(device=True)
def block_scan(counts, starts, sums):
    """scan_kernel's work, by one block of SCAN_THREADS threads; sums: a shared array of that many."""
    t = cuda.threadIdx.x
    per = (counts.shape[0] + SCAN_THREADS - 1) // SCAN_THREADS
    first = t * per
    total = 0
    for b in range(first, min(first + per, counts.shape[0])):
        total += counts[b]
    sums[t] = total
    cuda.syncthreads()
    step = 1
    while step < SCAN_THREADS:  # after the round of `step`, sums[t] covers threads t - 2 step + 1 .. t
        before = sums[t - step] if t >= step else 0
        cuda.syncthreads()
        sums[t] += before
        cuda.syncthreads()
        step *= 2
    running = sums[t] - total  # the threads before this one
    for b in range(first, min(first + per, counts.shape[0])):
        starts[b] = running
        running += counts[b]


@cuda.jit
def scatter_kernel(masks, starts, order):
    i = cuda.grid(1)
    if i < masks.shape[0]:
        order[claim(starts, bucket(masks[i]))] = i


@cuda.jit
def tile_masks_kernel(masks, order, rows, tile_masks):
    """tile_masks[r // rows] |= the mask of row order[r] (a thread a row; tile_masks zeroed)."""
    r = cuda.grid(1)
    if r < order.shape[0]:
        cuda.atomic.or_(tile_masks, r // rows, masks[order[r]])


def group_by_mask(masks, stream=0):
    """order (N,) int32 on the device: the rows, grouped by the top GROUP_BITS bits of their masks."""
    n = masks.shape[0]
    counts = cuda.to_device(np.zeros(BUCKETS, np.int32), stream=stream)
    starts = cuda.device_array(BUCKETS, np.int32, stream=stream)
    order = cuda.device_array(n, np.int32, stream=stream)
    blocks = max(1, cdiv(n, THREADS))
    histogram_kernel[blocks, THREADS, stream](masks, counts)
    scan_kernel[1, SCAN_THREADS, stream](counts, starts)
    scatter_kernel[blocks, THREADS, stream](masks, starts, order)
    return order


@cuda.jit(device=True, inline=True)
def next_tap(taps, k):
    """The first tap after k whose bit is set in a tile mask `taps`, or TAPS (the kernels' tap loop)."""
    k += 1
    while k < TAPS and taps & (1 << k) == 0:
        k += 1
    return k


def row_order(masks, rows, group=True, stream=0, grouped=None):
    """(order, tile_masks) of a kernel that takes `rows` output rows a block: the rows grouped by
    mask (group=False: in the pair table's order) and each tile's mask; or `grouped`, the pair
    already made (onelaunch.MapBuilder), checked to be in tiles of `rows`."""
    if grouped is not None:
        order, tiles = grouped
        if tiles.shape[0] != cdiv(order.shape[0], rows):
            raise ValueError(f"grouped: {tiles.shape[0]} tile masks for {order.shape[0]} rows: made for tiles "
                             f"of another size than this kernel's {rows} rows")
        return order, tiles
    order = group_by_mask(masks, stream) if group else cuda.to_device(np.arange(masks.shape[0], dtype=np.int32),
                                                                      stream=stream)
    return order, tile_masks(masks, order, rows, stream)


def tile_masks(masks, order, rows, stream=0):
    """The OR of each `rows` consecutive rows' masks in `order` (device arrays in and out)."""
    tiles = max(1, cdiv(order.shape[0], rows))
    out = cuda.to_device(np.zeros(tiles, np.int32), stream=stream)
    tile_masks_kernel[max(1, cdiv(order.shape[0], THREADS)), THREADS, stream](masks, order, rows, out)
    return out
