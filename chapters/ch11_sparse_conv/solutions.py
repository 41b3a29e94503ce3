"""Chapter 11 — solutions: a hash probe, a rulebook entry, a scatter race.

Each exercise is the code between `# >>> ch11.N` and `# <<< ch11.N`; edit only there. Check your
work with `python -m pytest --exercises -k ch11` (or run the exercise cells of the chapter's
notebook). References are NumPy (reference.py); the hash table is maps.py's.
"""

import math

import numba
import numpy as np
from numba import cuda

from workbook.inputs import require

from chapters.ch11_sparse_conv.maps import EMPTY, first_slot

THREADS = 64


def _blocks(n, threads=THREADS):
    return max(1, math.ceil(n / threads))


# ---------------------------------------------------------------------------------------------
# ch11.1 (write a kernel) — look keys up in maps.SiteTable's hash table. table_keys (S,) int64 holds
# a key or EMPTY (-1) in each of its S slots (S a power of 2), table_values (S,) int32 the index
# stored beside each key. A key's probe sequence starts at first_slot(key, shift) and goes on at
# the next slot, wrapping from S - 1 to 0, until it meets the key (found: its value) or an EMPTY
# slot (absent: -1). For every query q: found[q] = the index stored with queries[q], or -1.
# Grid-stride over the queries (the grid may be smaller than the queries).


@cuda.jit
def lookup_kernel(table_keys, table_values, shift, queries, found):
    # >>> ch11.1 (stub 4c0a4505)
    mask = table_keys.shape[0] - 1
    for q in range(cuda.grid(1), queries.shape[0], cuda.gridsize(1)):
        key = queries[q]
        result = -1
        if key != EMPTY:  # EMPTY is no key: it would "find" an empty slot
            slot = first_slot(key, shift)
            while True:
                stored = table_keys[slot]
                if stored == key:
                    result = table_values[slot]
                    break
                if stored == EMPTY:  # the key would have been put here: it is absent
                    break
                slot = (slot + 1) & mask  # the next slot, wrapping around
        found[q] = result
    # <<< ch11.1


def lookup(table_keys, table_values, queries, found):
    table_keys = require(table_keys, "table_keys", dtype=np.int64, ndim=1)
    slots = table_keys.shape[0]
    if slots & (slots - 1):
        raise ValueError(f"table_keys has {slots} slots, not a power of 2")
    table_values = require(table_values, "table_values", dtype=np.int32, shape=(slots,))
    queries = require(queries, "queries", dtype=np.int64, ndim=1)
    found = require(found, "found", dtype=np.int32, shape=queries.shape)
    shift = np.int64(64 - (slots.bit_length() - 1))
    lookup_kernel[min(_blocks(queries.shape[0]), 4), THREADS](table_keys, table_values, shift, queries, found)
    return found


# ---------------------------------------------------------------------------------------------
# ch11.2 (complete three lines) — one site's entries of the rulebook. neighbours (N, 27) int32 is
# the pair table: neighbours[i, k] is the input site under tap k of output site i, or -1. The
# rulebook lists, for each tap k, its pairs (input, output): rule_in[k, p] and rule_out[k, p] for
# p < counts[k]. Threads append their pairs side by side, so each needs a place of its own in tap
# k's list: take it from counts[k] with an atomic add (it returns the count before the add). The
# order of a tap's pairs may be any; every pair must be there once.


@cuda.jit
def rulebook_kernel(neighbours, counts, rule_in, rule_out):
    for i in range(cuda.grid(1), neighbours.shape[0], cuda.gridsize(1)):
        for k in range(neighbours.shape[1]):
            j = neighbours[i, k]
            if j >= 0:
                # >>> ch11.2 (stub 84545c64)
                at = cuda.atomic.add(counts, k, 1)  # this pair's place: no other thread gets it
                rule_in[k, at] = j
                rule_out[k, at] = i
                # <<< ch11.2


def rulebook(neighbours, counts, rule_in, rule_out):
    neighbours = require(neighbours, "neighbours", dtype=np.int32, ndim=2)
    n, taps = neighbours.shape
    counts = require(counts, "counts", dtype=np.int32, shape=(taps,))
    rule_in = require(rule_in, "rule_in", dtype=np.int32, shape=(taps, n))
    rule_out = require(rule_out, "rule_out", dtype=np.int32, shape=(taps, n))
    rulebook_kernel[min(_blocks(n), 4), THREADS](neighbours, counts, rule_in, rule_out)
    return counts, rule_in, rule_out


# ---------------------------------------------------------------------------------------------
# ch11.3 (fix a planted bug) — the scatter of gather-GEMM-scatter, every tap at once. products
# (27, P, K) holds tap k's product rows, counts[k] of them; rule_out (27, P) the output row each
# goes to. out (N, K) += every product row at its output row. One thread a (tap, pair, channel):
# all taps in one launch instead of one launch a tap. Within a tap no output row appears twice, but
# across taps it does (a site is the neighbour of up to 27 others): as written, two threads can
# read the same out value, each add its own product, and write back: one of the adds is lost. The
# simulator's sanitizer names both threads. Make the adds safe.


@cuda.jit
def scatter_all_taps_kernel(products, rule_out, counts, out):
    taps, pairs, K = products.shape
    for at in range(cuda.grid(1), taps * pairs * K, cuda.gridsize(1)):
        k, rest = at // (pairs * K), at % (pairs * K)
        p, c = rest // K, rest % K
        if p < counts[k]:
            # >>> ch11.3 (stub 514f1585)
            cuda.atomic.add(out, (rule_out[k, p], c), products[k, p, c])  # read, add, write as one
            # <<< ch11.3


def scatter_all_taps(products, rule_out, counts, out):
    products = require(products, "products", dtype=np.float32, ndim=3)
    taps, pairs, K = products.shape
    rule_out = require(rule_out, "rule_out", dtype=np.int32, shape=(taps, pairs))
    counts = require(counts, "counts", dtype=np.int32, shape=(taps,))
    out = require(out, "out", dtype=np.float32, ndim=2)
    if out.shape[1] != K:
        raise ValueError(f"out has {out.shape[1]} channels, products have {K}")
    scatter_all_taps_kernel[min(_blocks(taps * pairs * K), 8), THREADS](products, rule_out, counts, out)
    return out


# Planted wrong answers: plausible mistakes each check must catch (see chapters/README.md).
PLANTED_WRONG_ANSWERS = {
    "ch11.1": [("slot = (slot + 1) & mask  # the next slot, wrapping around", "slot = slot + 1 if slot + 1 < mask else 0"),  # skips the last slot
               ("slot = (slot + 1) & mask  # the next slot, wrapping around", "break"),  # the first slot only: no probing
               ("                    result = table_values[slot]", "                    result = slot"),  # the slot, not the index
               ("    mask = table_keys.shape[0] - 1", "    mask = 15"),  # a constant: one table size's
               ("slot = first_slot(key, shift)", "slot = first_slot(key, 60)")],  # a constant: one shift's
    "ch11.2": [("at = cuda.atomic.add(counts, k, 1)  # this pair's place: no other thread gets it",
                "at = counts[k]\n                counts[k] = at + 1", "simulator"),  # two threads can take one place
               ("                rule_in[k, at] = j\n                rule_out[k, at] = i", "                rule_in[k, at] = i\n                rule_out[k, at] = j"),  # swapped
               ("at = cuda.atomic.add(counts, k, 1)  # this pair's place: no other thread gets it",
                "cuda.atomic.add(counts, k, 1)\n                at = cuda.atomic.add(counts, k, 0) - 1", "simulator")],  # another thread may add between: only another order shows it
    "ch11.3": [("cuda.atomic.add(out, (rule_out[k, p], c), products[k, p, c])  # read, add, write as one",
                "out[rule_out[k, p], c] += products[k, p, c]", "simulator"),  # the stub's race
               ("cuda.atomic.add(out, (rule_out[k, p], c), products[k, p, c])  # read, add, write as one",
                "out[rule_out[k, p], c] = products[k, p, c]")],  # overwrites
}
