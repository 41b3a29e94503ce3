"""A sanitizer for the simulator, in the spirit of compute-sanitizer's racecheck and initcheck.

    with sanitizing():          # on in every exercise check (workbook.exercises.strict_simulator)
        kernel[blocks, threads](...)

While it listens (simulator/watch.py hands it every element access), it stops a launch at the
first access a GPU does not order, with an error naming the kernel, both threads, both source
lines, the array and the index:

- **a race**: one thread writes a word that another thread reads or writes, with nothing between
  them that orders the two: no syncthreads() in their block, no syncwarp() in their warp, and
  between two blocks of one launch no grid.sync() (a cooperative launch's). Shared memory, and
  global memory within a block and across blocks. Two writes of the same value are not reported (a flag every block sets to 1).
  An atomic (`cuda.atomic.*`) and a plain read or write of the same word race too (a counter read,
  then added to atomically, by other threads); two atomics do not.
- **an uninitialized read**: a shared-memory word read before any thread of the block wrote it
  (on a GPU: whatever the previous block left there; the simulator's shared arrays keep the last
  block's values, so without this check such a kernel can look right).

How "ordered" is decided: each block counts its completed syncthreads() and grid.sync() calls and
each warp its completed syncwarp() calls (scheduler.py). An access remembers the counts; two
accesses of one block with different barrier counts have a syncthreads() between them, two of one
warp with different syncwarp counts a syncwarp(), two of different blocks with different grid.sync
counts a grid.sync() (every block passes the same ones, in the same order). A syncwarp with a partial mask counts for the whole warp
here, a simplification that can hide a race between lanes it left out.
"""

import sys
import threading

from .watch import array_name, named


class RaceError(RuntimeError):
    """Two threads of a launch touch one word, at least one writing, with nothing ordering them."""


class UninitializedReadError(RuntimeError):
    """A thread reads a shared-memory word no thread of its block has written."""


def sanitizing(budget=None):
    """A context in which kernel launches are sanitized: all of them (budget=None), or each kernel's
    launches until `budget` of its accesses were checked (exercise checks: Sanitizer.BUDGET)."""
    from . import watch

    return watch.listening(Sanitizer(budget))


class _Stamp:
    """Who touched a word, and when in the block's and the warp's synchronisation."""

    __slots__ = ("serial", "thread", "barriers", "grid_syncs", "warp", "syncs", "where", "block_idx", "thread_idx",
                 "value", "op")

    def __init__(self, access):
        me = access.thread
        self.serial, self.thread = me.block.serial, me.thread_id
        self.barriers, self.warp, self.syncs = me.block.barriers, me.warp.index, me.warp.syncs
        self.grid_syncs = me.block.grid_syncs
        self.where = access  # its .where (file:line) is worked out only for a report
        self.block_idx, self.thread_idx = me.indices
        self.value, self.op = access.value, access.op

    def same_thread(self, other):
        return self.serial == other.serial and self.thread == other.thread

    def unordered(self, other):
        """True if nothing orders the two accesses (see the module docstring)."""
        if self.serial != other.serial:
            return self.grid_syncs == other.grid_syncs  # two blocks of one launch: only a grid.sync() orders them
        if self.barriers != other.barriers:
            return False
        return self.warp != other.warp or self.syncs == other.syncs

    def who(self, verb):
        return f"thread {self.thread_idx} of block {self.block_idx} {verb} it at {self.where.where}"


class _Word:
    __slots__ = ("write", "reads", "atomics")

    def __init__(self):
        self.write, self.reads, self.atomics = None, [], []


class Sanitizer:
    """The listener: words touched in the current launch, checked at every access."""

    MAX_READERS = 4  # per word: enough to find one unordered reader other than a writer
    # Accesses checked per kernel, launch after launch, before its later launches go unchecked: races
    # show at the small sizes a check starts with, and checking every access of every size would
    # cost a check ten times its plain time (a simulated access costs a few microseconds, checking
    # it fifteen). None: no limit (sanitizing(budget=None), and WORKBOOK_SANITIZE=1).
    BUDGET = 20_000

    def __init__(self, budget=BUDGET):
        self.budget = budget
        self.lock = threading.Lock()
        self.checked = {}  # kernel name -> accesses checked so far
        self.kernel = None  # the name of the kernel launched now
        self.stepped_aside = False
        self._reset()

    def _reset(self):
        self.words = {}  # (allocation id, block serial or None, byte offset) -> _Word
        self.written = set()  # (allocation id, block serial, byte offset) of shared words written
        self.roots = {}  # allocation id -> allocation, kept alive so that ids stay unique
        self.uninitialized = None  # the first read of an unwritten shared word, as a message

    def launch_started(self, number, kernel):
        from . import watch

        self._reset()
        self.kernel = kernel.fn.__name__
        if self.budget is not None and self.checked.get(self.kernel, 0) >= self.budget and not self.stepped_aside:
            watch._listeners.remove(self)  # this launch runs unchecked, at the simulator's plain speed
            self.stepped_aside = True

    def launch_ended(self, number, kernel, failed=False):
        from . import watch

        if self.stepped_aside:
            watch._listeners.append(self)
            self.stepped_aside = False
        uninitialized = self.uninitialized
        self._reset()
        if uninitialized and not failed:
            raise UninitializedReadError(uninitialized)

    def atomic(self, a):
        """An atomic on a word (watch.report_atomic): it races with the plain accesses of other threads
        that nothing orders with it, not with other atomics."""
        self.access(a)

    def access(self, a):
        checked = self.checked[self.kernel] = self.checked.get(self.kernel, 0) + 1
        if self.budget is not None and checked >= self.budget and not self.stepped_aside:
            from . import watch

            watch._listeners.remove(self)  # the rest runs unchecked (launch_ended comes back)
            self.stepped_aside = True
        shared = a.space == "shared"
        serial = a.thread.block.serial
        stamp = _Stamp(a)
        granules = range(a.offset, a.offset + a.size, 4) if a.size > 4 else (a.offset,)
        root = id(a.root)
        # A simulated thread gives way only where it waits (scheduler.py), never in here; but the blocks
        # of a cooperative launch run on OS threads of their own, which may: one word's check at a time.
        with self.lock:
            self._check(a, shared, serial, stamp, granules, root)

    def _check(self, a, shared, serial, stamp, granules, root):
        if root not in self.roots:
            self.roots[root] = a.root
        for offset in granules:
            if (shared and a.op == "ld" and self.uninitialized is None
                    and (root, serial, offset) not in self.written):
                # Reported when the launch ends, unless a race on the word is reported first
                # (another thread writing it with nothing in between: the read came too early).
                self.uninitialized = (
                    f"kernel '{a.thread.block.kernel.__name__}': thread {stamp.thread_idx} of block "
                    f"{stamp.block_idx} reads {_name(a)} at {a.where} before any thread of its block "
                    "wrote it (on a GPU: whatever was there before)")
            key = (root, serial if shared else None, offset)
            word = self.words.get(key)
            if word is None:
                word = self.words[key] = _Word()
            if a.op.startswith("atomic."):
                self._atomic(a, word, stamp)
                if shared:
                    self.written.add((root, serial, offset))
            elif a.op == "ld":
                self._read(a, word, stamp)
            else:
                self._write(a, word, stamp)
                if shared:
                    self.written.add((root, serial, offset))

    def _atomic(self, a, word, stamp):
        verb = f"updates (cuda.{a.op})"
        w = word.write
        if w is not None and not w.same_thread(stamp) and w.unordered(stamp):
            raise _race(a, w.who("wrote"), stamp.who(verb), w, stamp)
        for r in word.reads:
            if not r.same_thread(stamp) and r.unordered(stamp):
                raise _race(a, r.who("read"), stamp.who(verb), r, stamp)
        word.atomics = self._recent(word.atomics, stamp)

    def _recent(self, stamps, stamp):
        """`stamps` with those ordered before `stamp` dropped, `stamp` added (up to MAX_READERS)."""
        kept = [s for s in stamps if not (s.grid_syncs != stamp.grid_syncs or s.serial == stamp.serial and
                                           (s.barriers != stamp.barriers or s.thread == stamp.thread))]
        if len(kept) < self.MAX_READERS:
            kept.append(stamp)
        return kept

    def _unordered_atomic(self, a, word, stamp, verb):
        for t in word.atomics:
            if not t.same_thread(stamp) and t.unordered(stamp):
                raise _race(a, t.who(f"updated (cuda.{t.op})"), stamp.who(verb), t, stamp)

    def _read(self, a, word, stamp):
        w = word.write
        if w is not None and not w.same_thread(stamp) and w.unordered(stamp):
            raise _race(a, w.who("wrote"), stamp.who("reads"), w, stamp)
        self._unordered_atomic(a, word, stamp, "reads")
        reads = [r for r in word.reads if not (r.grid_syncs != stamp.grid_syncs or r.serial == stamp.serial and
                                                (r.barriers != stamp.barriers or r.thread == stamp.thread))]
        if len(reads) < self.MAX_READERS:
            reads.append(stamp)
        word.reads = reads

    def _write(self, a, word, stamp):
        w = word.write
        if (w is not None and not w.same_thread(stamp) and w.unordered(stamp)
                and not _same_value(w.value, stamp.value)):
            raise _race(a, w.who("wrote"), stamp.who("writes"), w, stamp)
        for r in word.reads:
            if not r.same_thread(stamp) and r.unordered(stamp):
                raise _race(a, r.who("read"), stamp.who("writes"), r, stamp)
        self._unordered_atomic(a, word, stamp, "writes")
        word.write = stamp


def _same_value(a, b):
    try:
        return a is not None and b is not None and (a == b or (a != a and b != b))
    except (TypeError, ValueError):
        return False


def _race(a, first, second, earlier, now):
    # a launch that syncs its grid (the simulator's launch noted it on the kernel: uses_grid_sync)
    grid = " or grid.sync()" if getattr(a.thread.block.kernel, "_workbook_grid_sync", False) else ""
    between = (("two blocks of one launch, with no grid.sync() between them" if grid else
                "two blocks of one launch are never ordered") if earlier.serial != now.serial
               else f"with no syncthreads(){grid} between them" if earlier.warp != now.warp
               else f"with no syncwarp(), syncthreads() or grid.sync() between them" if grid
               else "with no syncwarp() or syncthreads() between them")
    return named(RaceError(f"race on {_name(a)} in kernel '{a.thread.block.kernel.__name__}': {first}, and "
                           f"{second}, {between}"))


def _name(a):
    """'shared array sA[3, 5]' (the kernel's own name for the array, where one of its variables holds it)."""
    index = ", ".join(str(v) for v in a.index) if isinstance(a.index, tuple) else str(a.index)
    frame = sys._getframe(0)
    while frame is not None and frame.f_code is not a.code:
        frame = frame.f_back
    name = array_name(frame, a.root) if frame is not None else None
    return f"{a.space} array {name or ''}[{index}]"
