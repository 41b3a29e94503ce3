"""Where chapter 11's maps spend their time, on a GPU: each step's host cost (wall clock with a
synchronise) and each kernel's GPU time (CUDA events), median of 30, then the build in one launch.

    python chapters/ch11_sparse_conv/probes/sparse_maps_probe.py [beams steps]
"""

import sys
import time

import numpy as np

import workbook
from workbook import cuda

from chapters.ch11_sparse_conv import grouping, implicit, maps, onelaunch, scan

if not workbook.ON_GPU:
    sys.exit("times need a GPU")
beams, steps = (int(v) for v in sys.argv[1:3]) if len(sys.argv) > 2 else (256, 4096)
coords = scan.voxelize(scan.lidar_scan(beams, steps))
n = len(coords)
d_coords = cuda.to_device(coords)


def wall(name, fn, repeats=30):
    fn()
    cuda.synchronize()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        cuda.synchronize()
        times.append((time.perf_counter() - started) * 1e6)
    print(f"wall  {name:48s} {np.median(times):8.1f} us [{np.percentile(times, 25):.1f}-{np.percentile(times, 75):.1f}]")


def gpu(name, fn, repeats=30):
    fn()
    times = []
    for _ in range(repeats):
        start, end = cuda.event(), cuda.event()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cuda.event_elapsed_time(start, end) * 1e3)
    print(f"GPU   {name:48s} {np.median(times):8.1f} us")


@cuda.jit
def empty(a, b):
    pass


tiny = cuda.device_array(4, np.int32)
table = maps.SiteTable(d_coords)
pairs = table.pairs()
print(f"N = {n} sites, {table.keys.size} slots")
wall("an empty kernel, 2 arrays", lambda: empty[1, 32](tiny, tiny))
wall("cuda.device_array((N, 27), int32)", lambda: cuda.device_array((n, 27), np.int32))
wall("cuda.to_device: the empty table", lambda: cuda.to_device(np.full(table.keys.size, maps.EMPTY, np.int64)))
wall("SiteTable (with its wait)", lambda: maps.SiteTable(d_coords))
wall("SiteTable.pairs()", table.pairs)
wall("grouping.group_by_mask", lambda: grouping.group_by_mask(pairs.masks))
order = grouping.group_by_mask(pairs.masks)
wall("grouping.tile_masks", lambda: grouping.tile_masks(pairs.masks, order, implicit.BM))

blocks = max(1, -(-n // maps.THREADS))
bad = cuda.to_device(np.zeros(2, np.int64))
counts = cuda.to_device(np.zeros(grouping.BUCKETS, np.int32))
starts = cuda.device_array_like(counts)
tiles = cuda.to_device(np.zeros(-(-n // implicit.BM), np.int32))
gpu("insert_kernel (into a full table)",
    lambda: maps.insert_kernel[blocks, maps.THREADS](d_coords, table.keys, table.values, table.shift, table.probes, bad))
gpu("pairs_kernel", lambda: maps.pairs_kernel[blocks, maps.THREADS](d_coords, 1, table.keys, table.values, table.shift,
                                                                    maps.offsets_on_device(), pairs.neighbours, pairs.masks))
gpu("histogram_kernel", lambda: grouping.histogram_kernel[blocks, grouping.THREADS](pairs.masks, counts))
gpu("scan_kernel (one block)", lambda: grouping.scan_kernel[1, grouping.SCAN_THREADS](counts, starts))
gpu("scatter_kernel", lambda: grouping.scatter_kernel[blocks, grouping.THREADS](pairs.masks, starts, order))
gpu("tile_masks_kernel", lambda: grouping.tile_masks_kernel[blocks, grouping.THREADS](pairs.masks, order, implicit.BM,
                                                                                     tiles))
builder = onelaunch.MapBuilder(n, implicit.BM)
wall("MapBuilder.build (one launch)", lambda: builder.build(d_coords))
gpu("MapBuilder.build (one launch)", lambda: builder.build(d_coords))
print(f"one launch: {builder.blocks} blocks of {onelaunch.THREADS} threads")
