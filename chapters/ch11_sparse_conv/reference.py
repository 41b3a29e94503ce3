"""Chapter 11's NumPy references: the sparse convolution as a masked dense one, and directly.

A sparse tensor is N active sites with coordinates coords (N, 3) and features x (N, C). A 3x3x3
convolution with weights w (27, C, K) (tap k = (dx + 1) * 9 + (dy + 1) * 3 + (dz + 1), offsets
-1..1) computes, for each output site o,

    out[o] = sum over taps k of x[site at coords[o] + offset_k] @ w[k]      (absent sites: zeros)

Submanifold: the output sites are the input sites, so the active set never grows (a network keeps
its maps for many layers). The dense reference scatters x into a dense grid, convolves it, and
reads the result back at the active sites: the definition, for small grids; the direct reference
looks up each tap's neighbours by key (np.searchsorted on the sorted keys) and works at any size.
"""

import numpy as np

OFFSETS = np.array([(dx, dy, dz) for dx in (-1, 0, 1) for dy in (-1, 0, 1) for dz in (-1, 0, 1)])  # (27, 3)
TAPS = len(OFFSETS)
CENTRE = TAPS // 2
BITS = 21  # a coordinate's bits in a key: up to 2,097,151 voxels along an axis


def key(coords):
    """A coordinate's 64-bit key: x << 42 | y << 21 | z (int64), for coordinates 0 .. 2^21 - 1;
    outside that range: -1 (a key no site has)."""
    c = np.asarray(coords, np.int64)
    inside = ((c >= 0) & (c < 1 << BITS)).all(axis=-1)
    return np.where(inside, (c[..., 0] << 2 * BITS) | (c[..., 1] << BITS) | c[..., 2], -1)


def neighbours(coords, out_coords=None, stride=1):
    """(M, 27) int32: for output site o and tap k, the index of the input site at
    stride * out_coords[o] + OFFSETS[k], or -1 (out_coords: the input sites by default)."""
    keys = key(coords)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    out_coords = coords if out_coords is None else out_coords
    wanted = key(stride * np.asarray(out_coords, np.int64)[:, None, :] + OFFSETS[None])
    at = np.clip(np.searchsorted(sorted_keys, wanted), 0, len(keys) - 1)
    found = (sorted_keys[at] == wanted) & (wanted >= 0)
    return np.where(found, order[at], -1).astype(np.int32)


def submanifold_direct(coords, x, w, out_coords=None, stride=1):
    """out (M, K) float64: the 3x3x3 convolution at the output sites, tap by tap through
    neighbours() (submanifold: out_coords = coords, stride 1)."""
    nbr = neighbours(coords, out_coords, stride)
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    out = np.zeros((len(nbr), w.shape[2]))
    for k in range(TAPS):
        has = nbr[:, k] >= 0
        out[has] += x[nbr[has, k]] @ w[k]
    return out


def submanifold_dense(coords, x, w):
    """The same by definition: x scattered into a dense grid (zeros elsewhere), a dense 3x3x3
    convolution with zero padding, read back at the active sites. Small grids only."""
    coords = np.asarray(coords)
    shape = coords.max(axis=0) + 3  # one voxel of padding on each side
    C, K = x.shape[1], w.shape[2]
    grid = np.zeros((*shape, C))
    grid[tuple((coords + 1).T)] = x
    out = np.zeros((len(coords), K))
    for k, (dx, dy, dz) in enumerate(OFFSETS):
        out += grid[tuple((coords + 1 + (dx, dy, dz)).T)] @ np.asarray(w[k], np.float64)
    return out


def strided_outputs(coords):
    """The output sites of a stride-2 3x3x3 convolution with padding 1, by definition: every p whose
    window 2p - 1 .. 2p + 1 (each axis) holds an active input; (M, 3) in key order."""
    c = np.asarray(coords, np.int64)
    # along an even axis p = c / 2; along an odd one both (c - 1) / 2 and (c + 1) / 2
    p = np.concatenate([c // 2 + np.asarray(shift) * (c % 2) for shift in np.ndindex(2, 2, 2)])
    keys = np.unique(key(p))
    return np.stack([keys >> 2 * BITS, (keys >> BITS) & ((1 << BITS) - 1), keys & ((1 << BITS) - 1)], axis=1)


def strided_dense(coords, x, w):
    """(out_coords, out): the stride-2 convolution by definition: a dense grid, every output p whose
    window holds an active input, out[p] = sum over taps of grid[2p + offset] @ w[k]. Small grids."""
    coords = np.asarray(coords)
    shape = coords.max(axis=0) + 4
    grid = np.zeros((*shape, x.shape[1]))
    grid[tuple((coords + 1).T)] = x
    active = np.zeros(shape, bool)
    active[tuple((coords + 1).T)] = True
    outputs = [p for p in np.ndindex(*(shape // 2)) if any(
        active[tuple(2 * np.asarray(p) + 1 + o)] for o in OFFSETS if (2 * np.asarray(p) + 1 + o < shape).all())]
    outputs = np.asarray(outputs, np.int64).reshape(-1, 3)
    out = np.zeros((len(outputs), w.shape[2]))
    for k, o in enumerate(OFFSETS):
        at = 2 * outputs + 1 + o
        inside = (at < shape).all(axis=1)
        out[inside] += grid[tuple(at[inside].T)] @ np.asarray(w[k], np.float64)
    return outputs, out


def tolerance(channels, taps_used=TAPS):
    """(rtol, atol) for float32 against these float64 references: a sum of taps_used * C products
    of values of order 1 (x) and 1/sqrt(27 C) (w), accumulated in float32."""
    terms = taps_used * channels
    return 1e-4, 4 * terms * 2.0 ** -24


def features(n, channels, seed=0):
    """x (n, C) float32, standard normal; w (27, C, K) are made by weights()."""
    return np.random.default_rng(seed).standard_normal((n, channels)).astype(np.float32)


def weights(channels, out_channels, seed=1):
    """w (27, C, K) float32, uniform in +-1/sqrt(27 C) (a layer's fan-in)."""
    bound = 1 / np.sqrt(TAPS * channels)
    return np.random.default_rng(seed).uniform(-bound, bound, (TAPS, channels, out_channels)).astype(np.float32)
