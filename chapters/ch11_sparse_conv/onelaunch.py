"""The implicit GEMM's maps in one launch, into buffers allocated once.

Built as maps.py and grouping.py build them, the maps of one active set take six launches, ten
allocations and copies from the host (the empty hash table, zeroed counters); on the GPU each
launch from Python costs tens of microseconds of host time and each allocation more, against a
few microseconds of work. Here the same steps are phases of one kernel, launched cooperatively (every block resident,
so a grid-wide barrier, `cuda.cg.this_grid().sync()`, can separate the phases), over buffers that
a `MapBuilder` allocates once for up to `max_sites` sites and reuses at every build, as a
network's workspace (or torch's caching allocator, which spconv uses) would:

    phase 1  empty the hash table, zero the counts and tile masks  (every thread, grid-stride)
    phase 2  insert every site                                     maps.insert_site
    phase 3  its pair-table row and mask; count its bucket         maps.pair_row, grouping.claim
    phase 4  each block scans a chunk of the bucket counts;        grouping.block_scan
             after a barrier, adds the chunks' totals before it
    phase 5  every row to its place in the grouped order           grouping.claim
    phase 6  each tile's mask: the OR of its rows'                 (an atomic OR a row)

The device functions are the separate kernels' own, so the two ways compute the same maps. One
small copy to the host at the end reports sites that cannot be keyed or repeat a coordinate.
A build's maps live in the builder's buffers: the next build replaces them."""

import numpy as np
from numba import cuda, int32

from workbook.launch import cooperative_limit
from workbook.inputs import require

from .grouping import BUCKETS, SCAN_THREADS, block_scan, bucket, claim
from .maps import EMPTY, LIMIT, Pairs, capacity, insert_site, offsets_on_device, pair_row
from .reference import TAPS

THREADS = SCAN_THREADS  # block_scan's block


@cuda.jit
def maps_kernel(coords, keys, values, shift, probes, bad, offsets, neighbours, masks, counts, starts, totals,
                order, rows, tile_masks):
    """coords (N, 3) -> neighbours (N, 27), masks (N,), order (N,), tile_masks (tiles,); keys and
    values: a hash table of a power-of-2 slots; counts and starts: BUCKETS each; totals: a word a
    block; bad (2,): sites that cannot be keyed, sites that repeat a coordinate."""
    grid = cuda.cg.this_grid()
    first, step = cuda.grid(1), cuda.gridsize(1)
    n, t, block = coords.shape[0], cuda.threadIdx.x, cuda.blockIdx.x
    sums = cuda.shared.array(SCAN_THREADS, int32)
    for s in range(first, keys.size, step):  # phase 1: empty the table, zero the counts
        keys[s] = EMPTY
    for b in range(first, counts.size, step):
        counts[b] = 0
    for tile in range(first, tile_masks.size, step):
        tile_masks[tile] = 0
    if first < 2:
        bad[first] = 0
    grid.sync()
    for i in range(first, n, step):  # phase 2: insert every site
        insert_site(coords, i, keys, values, shift, probes, bad)
    grid.sync()
    for i in range(first, n, step):  # phase 3: pair-table rows, masks, bucket counts
        claim(counts, bucket(pair_row(coords, i, 1, keys, values, shift, offsets, neighbours, masks)))
    grid.sync()
    chunk = -(-BUCKETS // cuda.gridDim.x)  # phase 4: each block scans a chunk of the buckets ...
    lo, hi = min(block * chunk, BUCKETS), min(block * chunk + chunk, BUCKETS)
    block_scan(counts[lo:hi], starts[lo:hi], sums)
    if t == 0:
        totals[block] = sums[SCAN_THREADS - 1]  # the chunk's total
    grid.sync()
    partial = 0  # ... and adds the totals of the chunks before its own
    for b in range(t, block, SCAN_THREADS):
        partial += totals[b]
    before = block_sum(partial, sums)
    for b in range(lo + t, hi, SCAN_THREADS):
        starts[b] += before
    grid.sync()
    for i in range(first, n, step):  # phase 5: every row to its place
        order[claim(starts, bucket(masks[i]))] = i
    grid.sync()
    for r in range(first, n, step):  # phase 6: the tiles' masks
        cuda.atomic.or_(tile_masks, r // rows, masks[order[r]])


@cuda.jit(device=True)
def block_sum(value, sums):
    """The sum of `value` over the block's SCAN_THREADS threads (a tree in shared memory)."""
    t = cuda.threadIdx.x
    cuda.syncthreads()  # sums may still be read from the last use
    sums[t] = value
    cuda.syncthreads()
    half = SCAN_THREADS // 2
    while half > 0:
        if t < half:
            sums[t] += sums[t + half]
        cuda.syncthreads()
        half //= 2
    return sums[0]


class MapBuilder:
    """Builds the submanifold maps of the implicit GEMM, rows grouped by mask in tiles of `rows`,
    for active sets of up to `max_sites` sites, in one launch each."""

    def __init__(self, max_sites, rows, stream=0):
        if max_sites < 1:
            raise ValueError(f"max_sites = {max_sites}: a builder needs room for at least one site")
        self.max_sites, self.rows, self.stream = max_sites, rows, stream
        self.keys = cuda.device_array(capacity(max_sites), np.int64, stream=stream)
        self.values = cuda.device_array(capacity(max_sites), np.int32, stream=stream)
        self.probes = cuda.device_array(max_sites, np.int32, stream=stream)
        self.neighbours = cuda.device_array((max_sites, TAPS), np.int32, stream=stream)
        self.masks, self.order = (cuda.device_array(max_sites, np.int32, stream=stream) for _ in range(2))
        self.counts, self.starts, self.totals = (cuda.device_array(BUCKETS, np.int32, stream=stream)
                                                 for _ in range(3))
        self.tile_masks = cuda.device_array(-(-max_sites // rows), np.int32, stream=stream)
        self.bad = cuda.device_array(2, np.int64, stream=stream)
        self.bad_host = cuda.pinned_array(2, np.int64)
        self.blocks = None  # the cooperative grid: as many blocks as can be resident, found at the first build
        self.n, self.views = None, None  # the last build's size, the buffers' views for it (a view costs host time)

    def build(self, coords):
        """(Pairs, order, tile_masks) of coords (N, 3) int32 on the device, N <= max_sites: views of
        the builder's buffers, valid until its next build."""
        coords = require(coords, "coords", dtype=np.int32, ndim=2)
        n = coords.shape[0]
        if coords.shape[1] != 3 or not 1 <= n <= self.max_sites:
            raise ValueError(f"coords has shape {tuple(coords.shape)}, expected (N, 3) with 1 <= N <= "
                             f"{self.max_sites} (the builder's max_sites)")
        if n != self.n:
            slots = capacity(n)
            self.n, self.views = n, (self.keys[:slots], self.values[:slots], np.int64(64 - (slots.bit_length() - 1)),
                                     self.probes[:n], self.neighbours[:n], self.masks[:n], self.order[:n],
                                     self.tile_masks[:-(-n // self.rows)])
        keys, values, shift, probes, neighbours, masks, order, tile_masks = self.views
        args = (coords, keys, values, shift, probes, self.bad, offsets_on_device(), neighbours, masks, self.counts,
                self.starts, self.totals, order, np.int32(self.rows), tile_masks)
        if self.blocks is None:
            self.blocks = min(cooperative_limit(maps_kernel, args, THREADS, 0), BUCKETS)
        maps_kernel[self.blocks, THREADS, self.stream](*args)
        self.bad.copy_to_host(self.bad_host, stream=self.stream)  # the one wait for the GPU
        if self.stream:
            self.stream.synchronize()
        outside, duplicates = self.bad_host
        if outside:
            raise ValueError(f"coords: {outside} sites lie outside 0 .. {LIMIT - 1} on some axis: shift them first")
        if duplicates:
            raise ValueError(f"coords: {duplicates} repeat a coordinate another site has: voxelize first")
        return Pairs(neighbours, masks, n), order, tile_masks

