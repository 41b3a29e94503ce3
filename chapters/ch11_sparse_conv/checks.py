"""Checks of chapter 11's exercises against NumPy: a hash table built on the host with a cluster of
keys that share their first slot and wrap around the end, queries present and absent; rulebooks of
the tiny voxel sets and a small scan; a scatter whose outputs repeat across taps. Outputs are
poisoned. See workbook/exercises.py."""

import contextlib

import numpy as np

import workbook
from workbook import cuda
from workbook.exercises import poisoned

from chapters.ch11_sparse_conv import scan
from chapters.ch11_sparse_conv.maps import EMPTY
from chapters.ch11_sparse_conv.reference import TAPS, key, neighbours
from workbook.exercises import Exercise

GOLDEN = 0x9E3779B97F4A7C15
CUBE = np.stack(np.meshgrid(*[np.arange(4)] * 3, indexing="ij"), axis=-1).reshape(-1, 3)  # 64 sites: whole warps
SETS = {**scan.TINY, "a 4 x 4 x 4 cube": CUBE, "a small scan": scan.voxelize(scan.lidar_scan(3, 40))}


def host_slot(k, shift):
    """maps.first_slot on the host."""
    return ((int(k) * GOLDEN) & (2**64 - 1)) >> shift


def host_table(keys, slots):
    """A table as maps.SiteTable fills it (linear probing), on the host: (table_keys, table_values, shift)."""
    shift = 64 - (slots.bit_length() - 1)
    table_keys, table_values = np.full(slots, EMPTY, np.int64), np.full(slots, -7, np.int32)
    for index, k in enumerate(keys):
        slot = host_slot(k, shift)
        while table_keys[slot] != EMPTY:
            slot = (slot + 1) % slots
        table_keys[slot], table_values[slot] = k, 100 + index
    return table_keys, table_values, shift


def _cluster_at_the_end(slots, count):
    """count keys whose probe sequences all start at the last slot but one: they fill it and the
    last, and wrap to 0, 1, ..."""
    shift = 64 - (slots.bit_length() - 1)
    found, k = [], 1
    while len(found) < count:
        if host_slot(k, shift) == slots - 2:
            found.append(k)
        k += 1
    return found


def check_lookup(m):
    # (slots, keys, queries): a table of 16, 64 and 32 slots (another shift each); queries under a warp,
    # past the wrapper's threads (the loop must go round) and whole warps
    cases = {"keys sharing a slot near the end, wrapping to slot 0": (16, _cluster_at_the_end(16, 4), None),
             "a quarter-full table, queries in whole warps": (32, list(key(scan.TINY["a line of 33"][:8])), 64),
             "a half-full table of coordinates": (64, list(key(scan.TINY["a 6 x 6 plane"][:32])), 300)}
    for name, (slots, keys, count) in cases.items():
        table_keys, table_values, _ = host_table(keys, slots)
        absent = [k + 1 for k in keys if k + 1 not in keys][:5] + [EMPTY, 123456789]
        queries = np.array(list(keys)[::-1] + absent, np.int64)
        if count:
            queries = np.resize(queries, count)
        expected = np.array([100 + list(keys).index(q) if q in keys else -1 for q in queries], np.int32)
        found = poisoned(len(queries), np.int32)
        m.lookup(cuda.to_device(table_keys), cuda.to_device(table_values), cuda.to_device(queries), found)
        got = workbook.check.to_host(found)
        if not np.array_equal(got, expected):
            q = int(np.flatnonzero(got != expected)[0])
            raise workbook.CheckError(f"{name}: query {q} (key {queries[q]}) found {got[q]}, expected {expected[q]} "
                                      "(-1: absent)")


def check_rulebook(m):
    for name, coords in sorted(SETS.items(), key=lambda item: len(item[1])):  # smallest first
        nbr = neighbours(np.asarray(coords))
        n = len(nbr)
        counts = cuda.to_device(np.zeros(TAPS, np.int32))
        rule_in, rule_out = poisoned((TAPS, n), np.int32), poisoned((TAPS, n), np.int32)
        m.rulebook(cuda.to_device(nbr), counts, rule_in, rule_out)
        counts, rule_in, rule_out = (workbook.check.to_host(a) for a in (counts, rule_in, rule_out))
        for k in range(TAPS):
            expected = sorted((int(nbr[i, k]), i) for i in np.flatnonzero(nbr[:, k] >= 0))
            if counts[k] != len(expected):
                raise workbook.CheckError(f"{name}: tap {k} has {counts[k]} pairs, expected {len(expected)}")
            got = sorted(zip(rule_in[k, :counts[k]].tolist(), rule_out[k, :counts[k]].tolist()))
            if got != expected:
                wrong = next(p for p in got if p not in expected) if set(got) - set(expected) else None
                raise workbook.CheckError(f"{name}: tap {k}'s pairs (input, output) differ from the pair table's"
                                          + (f": ({wrong[0]}, {wrong[1]}) is not one of them" if wrong else
                                             ": some pair is missing or listed twice"))


def _sanitized(on):
    """In the simulator, a race as an error naming both threads (simulator/sanitizer.py), even where
    the check is run plainly; on a GPU, nothing."""
    if workbook.ON_GPU or not on:
        return contextlib.nullcontext()
    from workbook.simulator import sanitizing

    return sanitizing()


def check_scatter(m):
    for name, channels in (("no neighbours", 3), ("a line of 33", 1), ("a 6 x 6 plane", 3), ("a 4 x 4 x 4 cube", 2),
                           ("a small scan", 2)):
        nbr = neighbours(np.asarray(SETS[name]))
        n = len(nbr)
        rng = np.random.default_rng(n)
        counts = (nbr >= 0).sum(axis=0).astype(np.int32)
        rule_out = np.zeros((TAPS, n), np.int32)
        for k in range(TAPS):
            rule_out[k, :counts[k]] = np.flatnonzero(nbr[:, k] >= 0)
        products = rng.standard_normal((TAPS, n, channels)).astype(np.float32)
        out0 = rng.standard_normal((n, channels)).astype(np.float32)
        expected = out0.astype(np.float64)
        for k in range(TAPS):
            np.add.at(expected, rule_out[k, :counts[k]], products[k, :counts[k]])
        out = cuda.to_device(out0)
        with _sanitized(name == "a line of 33"):  # the smallest case: every access checked
            m.scatter_all_taps(cuda.to_device(products), cuda.to_device(rule_out), cuda.to_device(counts), out)
        workbook.assert_close(out, expected.astype(np.float32), rtol=1e-5, atol=1e-5, name=f"out, {name}")


EXERCISES = [
    Exercise("ch11.1", "a hash probe", "write", "lookup_kernel", check_lookup, grids=("more blocks", "one block")),
    Exercise("ch11.2", "a rulebook entry", "complete", "rulebook_kernel", check_rulebook,
             grids=("more blocks", "one block"),
             fixed={"rulebook_kernel argument 0 axis 1": "a 3 x 3 x 3 kernel: 27 taps",
                    "rulebook_kernel argument 1": "the taps' counts: 27, from zero",
                    "rulebook_kernel argument 2 axis 0": "27 taps", "rulebook_kernel argument 3 axis 0": "27 taps"}),
    Exercise("ch11.3", "a scatter race", "fix", "scatter_all_taps_kernel", check_scatter,
             grids=("more blocks", "one block"),
             fixed={"scatter_all_taps_kernel argument 0 axis 0": "a 3 x 3 x 3 kernel: 27 taps",
                    "scatter_all_taps_kernel argument 1 axis 0": "27 taps",
                    "scatter_all_taps_kernel argument 2": "the taps' counts: 27"}),
]
