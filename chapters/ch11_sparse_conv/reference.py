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


def neighbours(coords):
    """(N, 27) int32: for site i and tap k, the index of the site at coords[i] + OFFSETS[k], or -1."""
    keys = key(coords)
    order = np.argsort(keys)
    sorted_keys = keys[order]
    wanted = key(np.asarray(coords, np.int64)[:, None, :] + OFFSETS[None])
    at = np.clip(np.searchsorted(sorted_keys, wanted), 0, len(keys) - 1)
    found = (sorted_keys[at] == wanted) & (wanted >= 0)
    return np.where(found, order[at], -1).astype(np.int32)


def submanifold_direct(coords, x, w):
    """out (N, K) float64: the submanifold 3x3x3 convolution, tap by tap through neighbours()."""
    nbr = neighbours(coords)
    x, w = np.asarray(x, np.float64), np.asarray(w, np.float64)
    out = np.zeros((len(x), w.shape[2]))
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
