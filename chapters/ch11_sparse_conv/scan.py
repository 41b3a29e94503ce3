"""Chapter 11's data: a LiDAR-like scan, made deterministically, and the voxels it occupies.

A spinning sensor 1.8 m above the ground sends `beams` rays at elevations between -25 and +3
degrees, at `steps` azimuths a turn. Each ray stops at the first thing it meets, within `reach`:
the ground (z = 0), two long walls beside the road, and boxes standing on the ground (cars, bins).
The points it returns are quantised to voxels of `voxel` metres: a scan touches a few percent of
its voxel grid, and the active voxels lie on surfaces (a plane, the sides of boxes), which is
what a sparse convolution's neighbour maps see. Everything here is NumPy on the host: the data,
not the lesson.

    lidar_scan(beams, steps, ...) -> points (P, 3) float64, metres
    voxelize(points, voxel) -> coords (N, 3) int32, unique, sorted by key: the active voxels
    TINY: named tiny voxel sets (one voxel, a line, a plane, no neighbours) for the tests
"""

import numpy as np

from workbook.host import by_rows

SENSOR_HEIGHT = 1.8


def _boxes(rng, count, reach):
    """(count, 2, 3) axis-aligned boxes on the ground: lower and upper corners, metres."""
    centre = np.stack([rng.uniform(-reach, reach, count), rng.uniform(-9, 9, count)], axis=1)
    size = np.stack([rng.uniform(1.5, 4.5, count), rng.uniform(1.0, 2.0, count), rng.uniform(0.8, 2.2, count)], axis=1)
    lower = np.concatenate([centre - size[:, :2] / 2, np.zeros((count, 1))], axis=1)
    return np.stack([lower, lower + size], axis=1)


def lidar_scan(beams=64, steps=2048, *, reach=60.0, walls=12.0, boxes=40, seed=0):
    """The points a scan returns, (P, 3) float64 in metres: rays from (0, 0, SENSOR_HEIGHT) at
    `beams` elevations x `steps` azimuths, each stopped by the ground, the walls at y = +-walls, or
    a box; rays that meet nothing within `reach` return nothing."""
    rng = np.random.default_rng(seed)
    elevation = np.radians(np.linspace(-25.0, 3.0, beams))
    azimuth = np.linspace(0, 2 * np.pi, steps, endpoint=False)
    el, az = np.meshgrid(elevation, azimuth, indexing="ij")
    d = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], axis=-1).reshape(-1, 3)
    origin = np.array([0.0, 0.0, SENSOR_HEIGHT])
    hit = _first_hits(d, origin=origin, walls=walls, boxes=_boxes(rng, boxes, reach))
    keep = hit < reach
    noise = rng.normal(0, 0.01, (int(keep.sum()), 3))  # a centimetre of range noise
    return origin + d[keep] * hit[keep, None] + noise


@by_rows  # a ray's hit depends on its own direction only: pieces of the rays on every core
def _first_hits(d, *, origin, walls, boxes):
    """How far along each ray d (P, 3) it first meets the ground, a wall or a box (inf: nothing)."""
    d = np.ascontiguousarray(d.T)  # (3, P): an axis's components side by side, read at full speed
    with np.errstate(divide="ignore", invalid="ignore"):
        hit = np.full(d.shape[1], np.inf)
        ground = -origin[2] / d[2]
        hit = np.where((ground > 0), np.minimum(hit, ground), hit)
        for y in (-walls, walls):
            t = (y - origin[1]) / d[1]
            hit = np.where(t > 0, np.minimum(hit, t), hit)
        for lower, upper in boxes:  # the slab test: entry = the largest near face
            t1, t2 = (lower - origin)[:, None] / d, (upper - origin)[:, None] / d
            # each ray's largest near face and smallest far face, NaN (0 / 0) left out as np.nanmax does
            near, far = np.minimum(t1, t2), np.maximum(t1, t2)
            near = np.fmax(np.fmax(near[0], near[1]), near[2])
            far = np.fmin(np.fmin(far[0], far[1]), far[2])
            enters = (near <= far) & (near > 0)
            hit = np.where(enters, np.minimum(hit, near), hit)
    return hit


def voxelize(points, voxel=0.1):
    """The voxels the points fall in: (N, 3) int32 coordinates >= 0 (the scan shifted to start at
    0), each once, in the order of their keys (reference.key)."""
    from .reference import key

    cells = np.floor(np.asarray(points) / voxel).astype(np.int64)
    cells -= cells.min(axis=0)
    unique = np.unique(key(cells))
    return decode(unique)


def decode(keys):
    """reference.key's inverse: (N, 3) int32."""
    keys = np.asarray(keys, np.int64)
    return np.stack([keys >> 42, (keys >> 21) & 0x1FFFFF, keys & 0x1FFFFF], axis=1).astype(np.int32)


def _line(n):
    return np.stack([np.arange(n), np.zeros(n, int), np.zeros(n, int)], axis=1)


def _plane(n):
    x, y = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    return np.stack([x.ravel(), y.ravel(), np.zeros(n * n, int)], axis=1)


TINY = {  # small voxel sets whose neighbours are known by hand
    "one voxel": np.array([[3, 4, 5]]),
    "a line of 33": _line(33),
    "a 6 x 6 plane": _plane(6),
    "no neighbours": np.array([[0, 0, 0], [2, 0, 0], [0, 2, 0], [0, 0, 2], [2, 2, 2], [4, 0, 4]]),
}
