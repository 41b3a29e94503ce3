"""Chapter 11's maps, built on the GPU: which input site feeds which output site under which tap.

A sparse convolution first finds, for each output site and each of the 27 taps, the input site at
that offset, if there is one. Built once, the maps serve every layer with the same active sites
(a submanifold network keeps them for many layers), so their cost is shown apart.

- The coordinate hash table: open addressing, linear probing, at most half full. Each site's
  thread claims a slot with an atomic compare-and-swap on the key (EMPTY -> its key): the thread
  that wins writes its index beside it, and a thread that finds the slot taken moves to the next.
  A lookup walks the same sequence until it finds the key or an EMPTY slot.
- The pair table, (N, 27) int32: for output site i and tap k, the input site or -1, and a 27-bit
  mask of the taps that have one. This is what the implicit GEMM reads (output-stationary).
- The rulebook, per tap: the (input, output) pairs, compacted (an atomic counter a tap). This is
  what gather-GEMM-scatter reads.

    SiteTable(coords)            the hash table of N sites; .probes: each insert's probe count
    table.pairs() -> Pairs       pair table and masks, on the device (submanifold: outputs = inputs)
    table.strided() -> (coords, Pairs)
                                 a stride-2 convolution's output sites (new ones: found by inserting
                                 every input's candidate outputs into a second table) and its pairs
    rulebook(pairs) -> Rulebook  per-tap pair lists, and their lengths on the host
"""

from dataclasses import dataclass

import numba
import numpy as np
from numba import cuda

from workbook.inputs import require
from workbook.launch import cdiv

from .reference import BITS, OFFSETS, TAPS

EMPTY = -1
LOAD = 0.5  # the table's largest fill: short probe sequences
THREADS = 256
GOLDEN = numba.uint64(0x9E3779B97F4A7C15)  # 2^64 / the golden ratio: multiplicative hashing's constant
LIMIT = 1 << BITS


def capacity(n):
    """Slots for n keys: a power of 2 at least n / LOAD."""
    slots = 1
    while slots * LOAD < n:
        slots *= 2
    return slots


@cuda.jit(device=True, inline=True)
def key_of(x, y, z):
    """The 64-bit key of a coordinate (reference.key), or EMPTY outside 0 .. 2^21 - 1."""
    if x < 0 or y < 0 or z < 0 or x >= LIMIT or y >= LIMIT or z >= LIMIT:
        return numba.int64(EMPTY)
    return (numba.int64(x) << 42) | (numba.int64(y) << 21) | numba.int64(z)


@cuda.jit(device=True, inline=True)
def first_slot(key, shift):
    """The slot a key's probe sequence starts at: the top bits of key * GOLDEN (Knuth's
    multiplicative hash: neighbouring coordinates land far apart)."""
    return numba.int64((numba.uint64(key) * GOLDEN) >> numba.uint64(shift))


@cuda.jit
def insert_kernel(coords, table_keys, table_values, shift, probes, bad):
    """Site i's key into the table, its index beside it; shift = 64 - log2(slots). bad[0]: sites
    outside the key range; bad[1]: a key already there (a duplicate coordinate)."""
    i = cuda.grid(1)
    if i < coords.shape[0]:
        insert_site(coords, i, table_keys, table_values, shift, probes, bad)


@cuda.jit(device=True, inline=True)
def insert_site(coords, i, table_keys, table_values, shift, probes, bad):
    """insert_kernel's work for site i (also a phase of the maps in one launch, onelaunch.py)."""
    key = key_of(coords[i, 0], coords[i, 1], coords[i, 2])
    if key == EMPTY:
        cuda.atomic.add(bad, 0, 1)
        return
    mask = table_keys.size - 1
    slot = first_slot(key, shift)
    count = 1
    while True:
        previous = cuda.atomic.cas(table_keys, slot, numba.int64(EMPTY), key)
        if previous == EMPTY:
            table_values[slot] = i
            break
        if previous == key:
            cuda.atomic.add(bad, 1, 1)
            break
        slot = (slot + 1) & mask
        count += 1
    probes[i] = count


@cuda.jit(device=True, inline=True)
def lookup(table_keys, table_values, shift, key):
    """The index stored with `key`, or -1."""
    if key == EMPTY:
        return -1
    mask = table_keys.size - 1
    slot = first_slot(key, shift)
    while True:
        found = table_keys[slot]
        if found == key:
            return table_values[slot]
        if found == EMPTY:
            return -1
        slot = (slot + 1) & mask


@cuda.jit
def pairs_kernel(coords, stride, table_keys, table_values, shift, offsets, neighbours, masks):
    """neighbours[i, k]: the input site at stride * coords[i] + offsets[k], or -1 (coords: the output
    sites); masks[i]: bit k set where there is one."""
    i = cuda.grid(1)
    if i < coords.shape[0]:
        pair_row(coords, i, stride, table_keys, table_values, shift, offsets, neighbours, masks)


@cuda.jit(device=True, inline=True)
def pair_row(coords, i, stride, table_keys, table_values, shift, offsets, neighbours, masks):
    """pairs_kernel's work for output site i; returns its mask."""
    mask = 0
    for k in range(offsets.shape[0]):
        key = key_of(stride * coords[i, 0] + offsets[k, 0], stride * coords[i, 1] + offsets[k, 1],
                     stride * coords[i, 2] + offsets[k, 2])
        j = lookup(table_keys, table_values, shift, key)
        neighbours[i, k] = j
        if j >= 0:
            mask |= 1 << k
    masks[i] = mask
    return mask


@cuda.jit
def strided_outputs_kernel(coords, table_keys, table_values, shift, count, out_coords):
    """The output sites of a stride-2, 3x3x3 convolution (padding 1): output p sees inputs 2p - 1 ..
    2p + 1 on each axis, so input c feeds p = c / 2 where c is even, (c - 1) / 2 and (c + 1) / 2
    where it is odd: up to 8 candidates. Each goes into the output table; the thread whose
    compare-and-swap claims a key numbers it (an atomic counter) and writes its coordinate."""
    i = cuda.grid(1)
    if i >= coords.shape[0]:
        return
    mask = table_keys.size - 1
    for corner in range(8):
        p = cuda.local.array(3, np.int32)
        whole = True
        for axis in range(3):
            c = coords[i, axis]
            up = (corner >> axis) & 1
            if c % 2 == 0:
                whole = whole and up == 0  # one candidate along an even axis
                p[axis] = c // 2
            else:
                p[axis] = (c + 1) // 2 if up else (c - 1) // 2
        if not whole:
            continue
        key = key_of(p[0], p[1], p[2])
        slot = first_slot(key, shift)
        while True:
            previous = cuda.atomic.cas(table_keys, slot, numba.int64(EMPTY), key)
            if previous == EMPTY:
                at = cuda.atomic.add(count, 0, 1)
                table_values[slot] = at
                for axis in range(3):
                    out_coords[at, axis] = p[axis]
                break
            if previous == key:  # another input's candidate: numbered by its thread
                break
            slot = (slot + 1) & mask


@cuda.jit
def rulebook_kernel(neighbours, counts, rule_in, rule_out):
    """Tap k's pairs (neighbours[i, k], i), appended at counts[k] (an atomic counter a tap)."""
    i = cuda.grid(1)
    if i >= neighbours.shape[0]:
        return
    for k in range(neighbours.shape[1]):
        j = neighbours[i, k]
        if j >= 0:
            at = cuda.atomic.add(counts, k, 1)
            rule_in[k, at] = j
            rule_out[k, at] = i


def _blocks(n):
    return max(1, cdiv(n, THREADS))


@dataclass
class Pairs:
    """The pair table of N output sites: neighbours (N, 27) int32 and masks (N,) int32, on the
    device; inputs: the number of input sites the neighbours index."""
    neighbours: object
    masks: object
    inputs: int


@dataclass
class Rulebook:
    """Per tap k: rule_in[k, :counts[k]] -> rule_out[k, :counts[k]] (device, (27, N) int32, N the
    output sites); inputs: the number of input sites."""
    rule_in: object
    rule_out: object
    counts: np.ndarray  # on the host: the GEMM sizes
    inputs: int


class SiteTable:
    """The hash table of N active sites, coords (N, 3) int32 on the device."""

    def __init__(self, coords, stream=0):
        coords = require(coords, "coords", dtype=np.int32, ndim=2)
        if coords.shape[1] != 3 or coords.shape[0] == 0:
            raise ValueError(f"coords has shape {tuple(coords.shape)}, expected (N, 3) with N >= 1")
        self.coords, n = coords, coords.shape[0]
        self.keys = cuda.to_device(np.full(capacity(n), EMPTY, np.int64), stream=stream)
        self.values = cuda.device_array(capacity(n), np.int32, stream=stream)
        self.probes = cuda.device_array(n, np.int32, stream=stream)
        self.shift = np.int64(64 - (capacity(n).bit_length() - 1))
        bad = cuda.to_device(np.zeros(2, np.int64), stream=stream)
        insert_kernel[_blocks(n), THREADS, stream](coords, self.keys, self.values, self.shift, self.probes, bad)
        outside, duplicates = bad.copy_to_host(stream=stream)
        if outside:
            raise ValueError(f"coords: {outside} sites lie outside 0 .. {LIMIT - 1} on some axis: shift them first")
        if duplicates:
            raise ValueError(f"coords: {duplicates} sites repeat a coordinate another site has: voxelize first")

    def pairs(self, stream=0):
        n = self.coords.shape[0]
        out = Pairs(cuda.device_array((n, TAPS), np.int32, stream=stream), cuda.device_array(n, np.int32, stream=stream),
                    n)
        pairs_kernel[_blocks(n), THREADS, stream](self.coords, 1, self.keys, self.values, self.shift, offsets_on_device(),
                                                   out.neighbours, out.masks)
        return out

    def strided(self, stream=0):
        """(out_coords, Pairs) of the stride-2 convolution: its output sites (device, (M, 3) int32, in
        the order their threads numbered them) and, for each, its input neighbours under each tap."""
        n = self.coords.shape[0]
        slots = capacity(8 * n)  # at most 8 candidates an input
        keys = cuda.to_device(np.full(slots, EMPTY, np.int64), stream=stream)
        values = cuda.device_array(slots, np.int32, stream=stream)
        count = cuda.to_device(np.zeros(1, np.int32), stream=stream)
        found = cuda.device_array((8 * n, 3), np.int32, stream=stream)
        strided_outputs_kernel[_blocks(n), THREADS, stream](self.coords, keys, values,
                                                            np.int64(64 - (slots.bit_length() - 1)), count, found)
        m = int(count.copy_to_host(stream=stream)[0])
        out_coords = cuda.device_array((m, 3), np.int32, stream=stream)
        out_coords.copy_to_device(found[:m], stream=stream)
        out = Pairs(cuda.device_array((m, TAPS), np.int32, stream=stream), cuda.device_array(m, np.int32, stream=stream),
                    n)
        pairs_kernel[_blocks(m), THREADS, stream](out_coords, 2, self.keys, self.values, self.shift, offsets_on_device(),
                                                   out.neighbours, out.masks)
        return out_coords, out


_OFFSETS_ON_DEVICE = {}


def offsets_on_device():
    if "offsets" not in _OFFSETS_ON_DEVICE:
        _OFFSETS_ON_DEVICE["offsets"] = cuda.to_device(OFFSETS.astype(np.int32))
    return _OFFSETS_ON_DEVICE["offsets"]


def rulebook(pairs, stream=0):
    """The rulebook of a pair table (its tap lengths copied to the host: the GEMMs need them)."""
    n = pairs.neighbours.shape[0]
    counts = cuda.to_device(np.zeros(TAPS, np.int32), stream=stream)
    rule_in = cuda.device_array((TAPS, n), np.int32, stream=stream)
    rule_out = cuda.device_array((TAPS, n), np.int32, stream=stream)
    rulebook_kernel[_blocks(n), THREADS, stream](pairs.neighbours, counts, rule_in, rule_out)
    return Rulebook(rule_in, rule_out, counts.copy_to_host(stream=stream), pairs.inputs)


def check_layer(x, w, out, sites, out_sites):
    """A layer's arrays, checked against each other and the maps' input and output sites (both
    variants' wrappers)."""
    x = require(x, "x", dtype=np.float32, ndim=2)
    w = require(w, "w", dtype=np.float32, ndim=3)
    if x.shape[0] != sites:
        raise ValueError(f"x has {x.shape[0]} rows, the maps have {sites} input sites")
    if w.shape[0] != TAPS or w.shape[1] != x.shape[1]:
        raise ValueError(f"w has shape {tuple(w.shape)}, expected ({TAPS}, {x.shape[1]}, K): a 3x3x3 filter "
                         f"over x's {x.shape[1]} channels")
    return x, w, require(out, "out", dtype=np.float32, shape=(out_sites, w.shape[2]))
