"""Another order for the simulated threads, seeded: a race that the default order hides shows.

By default a block's threads run in order of their index, and one switches to the next only where
it must wait (a barrier, a collective, an atomic it spins on). Code whose result depends on that
order (a plain read of a word that other threads update atomically, a flag set before the data it
guards is written, warps assumed to finish in index order) passes there and fails on a GPU. In an
interleaved run, `interleaved(seed)` or `WORKBOOK_INTERLEAVE=seed` for every launch:

- each block starts its threads in a shuffled order, and whenever a thread gives way the next to
  run is drawn from all that can (simulator/scheduler.py);
- a thread gives way, with probability RATE, at each of its global-memory accesses and atomics
  (watch.py reports them here, as it reports them to a trace or the sanitizer).

The draws come from the seed and the launch's place among those run in that order, so a run is
reproducible from its seed.
Exercise checks grade an answer once more in such an order (workbook/exercises.py)."""

import contextlib
import os
import random

from . import scheduler, watch

ENV = "WORKBOOK_INTERLEAVE"
RATE = 0.25  # a thread's chance of giving way at each global access or atomic


def seed_from_env():
    """WORKBOOK_INTERLEAVE's seed (an int), or None: the default order."""
    value = os.environ.get(ENV, "").strip()
    return int(value) if value else None


class Interleaver:
    """A listener (watch.py) that makes the running thread give way at global accesses and atomics,
    now and then, and that sets each launch's draws (scheduler.BlockScheduler reads them)."""

    def __init__(self, seed, rate=RATE):
        self.seed, self.rate = seed, rate
        self.draws, self.launches = None, 0

    def launch_started(self, number, kernel):
        self.launches += 1  # the draws of the n-th launch since this order began: the same in every run
        self.draws = random.Random(f"{self.seed}:{self.launches}")
        scheduler.order[0] = self.draws

    def launch_ended(self, number, kernel, failed=False):
        scheduler.order[0] = None

    def count(self, space, size):  # a plain access (watch.report): bytes only, no Access built
        if space.startswith("global"):
            self._maybe_give_way()

    def atomic(self, access):
        self._maybe_give_way()

    def _maybe_give_way(self):
        if self.draws is not None and self.draws.random() < self.rate:
            me = scheduler.current()
            me.block.pause(me)


@contextlib.contextmanager
def interleaved(seed, rate=RATE):
    """A context in which every launch runs its threads in the order `seed` draws."""
    with watch.listening(Interleaver(seed, rate)) as listener:
        yield listener
