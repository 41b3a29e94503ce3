"""The simulator's block scheduler: a greenlet per CUDA thread, warps cut from the linear thread
index, and when a collective or a barrier completes.

A block's threads take turns in one OS thread. A thread that must wait switches back to the block's
scheduler; the last lane to arrive at a collective computes every participant's result
(collectives.py) and puts them back in line; an exiting thread re-checks the collectives and the
barrier it might have been holding up. syncthreads completes when all *live* threads have arrived
(exited threads do not block it, as on sm_70+). Nothing polls. When every live thread of a block
waits and nothing can be released, the launch raises WarpDeadlockError with a report of who waits
where (see the package docstring).
"""

import collections
import ctypes
import itertools
import os
import sys
import threading

import greenlet
import numpy as np
from numba.cuda.simulator.kernelapi import Dim3

from .collectives import RESOLVERS, WARP_SIZE, StrictModeError, _Raise

# What the threads' accesses are reported to (watch.py reports them, watch.listening() adds one): a
# trace or a sanitizer, each with .access() (or .count()) and .launch_ended(); one wanting lines
# (.wants_lines) is handed every line a thread runs too (line_tracer). Here, below watch.py, so that
# both modules read the same list without importing each other.
listeners = []
# The draws of an interleaved launch (interleave.py sets it for a launch): a random.Random, or None
# for the default order, threads in order of their index.
order = [None]

FULL_MASK = 0xFFFFFFFF
STRICT_ENV = "WORKBOOK_SIM_STRICT"


class WarpDeadlockError(RuntimeError):
    """Raised from a kernel launch when a block's live threads all wait for something that cannot happen."""


class KernelTimeoutError(RuntimeError):
    """Raised when a block runs past its time limit (strict mode): a loop that never ends, most likely."""


class GridSyncError(RuntimeError):
    """A cooperative launch whose blocks did not all reach the same cuda.cg.this_grid().sync()."""


class _Abort(BaseException):
    """Unwinds a simulated thread after another thread of its block failed.

    A BaseException, so that a kernel's own `except Exception:` cannot swallow it."""


class _TimeUp(_Abort):
    """What the watchdog of a time limit raises in the OS thread running a block (_time_out)."""


_ABORT = object()  # handed to a waiting thread instead of a result when its block fails


def strict_mode():
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")


TIME_LIMIT_ENV = "WORKBOOK_SIM_BLOCK_SECONDS"


def block_time_limit():
    """Seconds a block may run before it is stopped and reported: WORKBOOK_SIM_BLOCK_SECONDS, else 60
    in strict mode (exercise checks: a student's loop that never ends must not hang the grading),
    else none."""
    value = os.environ.get(TIME_LIMIT_ENV, "").strip()
    if value:
        return float(value) or None
    return 60.0 if strict_mode() else None


def lane_list(mask):
    """0b1111_0010 -> 'lanes 1, 4-7', 0b100 -> 'lane 2': lanes as a reader wants them in an error message."""
    lanes = [lane for lane in range(WARP_SIZE) if mask >> lane & 1]
    runs = []
    for lane in lanes:
        if runs and runs[-1][1] == lane - 1:
            runs[-1][1] = lane
        else:
            runs.append([lane, lane])
    listed = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)
    return f"lane {listed}" if len(lanes) == 1 else f"lanes {listed or 'none'}"


# --------------------------------------------------------------------------------------------------
# The block scheduler: replaces numba's BlockManager (same constructor, same run()).


def _is_integer(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _integer_predicate(op, predicate):
    if not _is_integer(predicate):
        raise TypeError(
            f"{op} takes an integer predicate: numba does not compile it for a {type(predicate).__name__} "
            "on a GPU (write `1 if condition else 0`)"
        )
    return bool(predicate)


class _Warp:
    def __init__(self, index, lanes):
        self.index = index
        self.existing = (1 << lanes) - 1  # a partial last warp has fewer than 32 lanes
        self.live = self.existing  # existing lanes that have not exited
        self.running = lanes  # live lanes not waiting for anything
        self.pending = {}  # (kind, mask) -> _Collective still missing some lanes
        self.syncs = 0  # syncwarp() calls completed: what orders the warp's memory accesses (sanitizer.py)
        self.at_activemask = {}  # call site -> lanes waiting there for the warp to settle


class _Collective:
    """One warp-level call in progress: who has arrived, and with what."""

    def __init__(self, kind, mask):
        self.kind = kind
        self.mask = mask
        self.arrived = 0
        self.calls = {}  # lane -> (thread, op name, operands)


class _Thread(greenlet.greenlet):
    """One simulated CUDA thread: a greenlet, which its block's scheduler switches to while it can run.
    FakeCUDAModule finds it with threading.current_thread(), which install() points at current().

    Every thread of a block runs in the launching OS thread, one at a time: a thread runs until it
    waits (a barrier, a collective) or exits, then hands back to the scheduler, which switches to
    the next thread that can run: no OS thread to wake, no GIL to hand over."""

    def __init__(self, block, block_idx, thread_idx, thread_id):
        super().__init__()  # its parent is the scheduler's greenlet, which creates it
        self.block = block
        self.blockIdx = Dim3(*block_idx)
        self.threadIdx = Dim3(*thread_idx)
        self.indices = (tuple(block_idx), tuple(thread_idx))  # for messages, made once
        self.in_atomic = False  # inside a cuda.atomic.* call: its accesses are not reported (watch.py)
        self.thread_id = thread_id
        self.lane = thread_id % WARP_SIZE
        self.bit = 1 << self.lane
        self.warp = block.warps[thread_id // WARP_SIZE]
        self.result = None  # what a wait returns, set by whoever releases the thread
        self.waiting_in = None  # (op name, mask) while waiting: what a deadlock report shows

    def run(self):
        block = self.block
        try:
            # A GPU computes with NaN and Inf without a word: so does a simulated thread (NumPy
            # would warn at every one); numba's debug mode still raises on a division by zero.
            with np.errstate(divide="raise") if block.debug else np.errstate(all="ignore"):
                if block.tracer is not None:
                    sys.settrace(block.tracer)  # the lines this thread runs, for a memory trace that asks
                block.kernel(*block.args)
        except _Abort as abort:
            block.time_up_landed |= isinstance(abort, _TimeUp)
        except Exception as error:
            block.thread_failed(self, error, sys.exc_info()[2])
        finally:
            block.thread_exited(self)

    # numba's FakeCUDAModule (and GridGroup.sync) call these on the current thread.
    def syncthreads(self):
        self.block.barrier(self, "syncthreads", None)

    def syncthreads_count(self, predicate):
        count, _ = self.block.barrier(self, "syncthreads_count", _integer_predicate("syncthreads_count", predicate))
        return count

    def syncthreads_and(self, predicate):
        count, voters = self.block.barrier(self, "syncthreads_and", _integer_predicate("syncthreads_and", predicate))
        return 1 if count == voters else 0

    def syncthreads_or(self, predicate):
        count, _ = self.block.barrier(self, "syncthreads_or", _integer_predicate("syncthreads_or", predicate))
        return 1 if count else 0


_NOT_KERNELS = (sys.prefix, sys.base_prefix, sys.exec_prefix, "<", os.path.dirname(os.path.dirname(__file__)))


def _is_kernel_code(filename, _seen={}):  # noqa: B006  (a cache)
    """Code a student or a chapter wrote: not Python's, not a package's, not the workbook's own."""
    known = _seen.get(filename)
    if known is None:
        known = _seen[filename] = not filename.startswith(_NOT_KERNELS) and "site-packages" not in filename
    return known


def line_tracer():
    """A sys.settrace function that hands each line of kernel code a simulated thread runs to the
    listeners that want lines (a memory trace's), or None when none does."""
    wanting = [listener for listener in listeners if getattr(listener, "wants_lines", False)]
    if not wanting:
        return None

    def local(frame, event, _):
        if event == "line":
            thread = current()
            for listener in wanting:
                listener.line(thread, frame.f_code, frame.f_lineno)
        return local

    def calls(frame, event, _):
        return local if _is_kernel_code(frame.f_code.co_filename) else None

    return calls


current = greenlet.getcurrent  # the simulated CUDA thread running now (outside a kernel: not one)
_block_serials = itertools.count()


class BlockScheduler:
    """Runs one thread block: a greenlet per CUDA thread, each switched to when it can run.

    Threads start in order of their linear index; one that must wait (a barrier, a collective)
    records why (for deadlock reports), lowers the running counts and switches back here; whoever
    completes the wait puts it back in line. Every method that touches the shared state holds
    self.lock, which only the watchdog of a time limit, on another OS thread, ever contends for."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self.kernel = f
        self.kernel_code = getattr(f, "__code__", None)
        self.grid_dim = grid_dim
        self.block_dim = block_dim
        self.debug = debug
        self.lock = threading.Lock()
        self.grid = None  # the GridBarrier of a cooperative launch (GridLaunch), else None
        self.shared = None  # in a cooperative launch, this block's own shared memory (watch.py)

    def run(self, grid_point, *args):
        bx, by, bz = self.block_dim
        n_threads = bx * by * bz
        self.args = args
        self.strict = strict_mode()
        self.block_idx = tuple(grid_point)
        self.serial = next(_block_serials)  # names this block's accesses in a trace or the sanitizer
        self.barriers = 0  # syncthreads completed so far: what orders the block's memory accesses
        self.grid_syncs = 0  # grid.sync() completed so far: what orders them with other blocks' accesses
        self.warps = [_Warp(w, min(WARP_SIZE, n_threads - w * WARP_SIZE)) for w in range(-(-n_threads // WARP_SIZE))]
        self.live = n_threads
        self.running = n_threads
        self.at_barrier = []  # (thread, predicate or None) waiting in syncthreads*
        self.exited_since_barrier = []  # threadIdx of threads that exited since the last syncthreads opened
        self.barrier_line = None  # where the first thread to arrive at the pending syncthreads called it
        self.barrier_op = None  # what the pending barrier is: "syncthreads", ..., or "grid.sync"
        self.failure = None  # (exception, traceback) of the first thread that failed, or a deadlock
        self.finished = False
        self.timed_out = self.time_up_landed = False
        self.hub = current()  # where a thread that waits or exits switches back to
        self.tracer = line_tracer()
        thread_indices = ((x, y, z) for z in range(bz) for y in range(by) for x in range(bx))
        self.threads = [_Thread(self, grid_point, idx, tid) for tid, idx in enumerate(thread_indices)]
        self.draws = order[0]  # an interleaved launch's (interleave.py): who runs next is drawn
        starting = list(self.threads)
        if self.draws is not None:
            self.draws.shuffle(starting)
        self.ready = collections.deque(starting)  # threads that can run, in the order they will
        limit = block_time_limit()
        watchdog = None
        if limit:
            watchdog = threading.Timer(limit, self._time_out, args=(limit, threading.get_ident()))
            watchdog.daemon = True
            watchdog.start()
        try:
            self._run_until_all_wait_or_exit()
        finally:
            if self.tracer is not None:
                sys.settrace(None)
            if watchdog is not None:
                self._stop(watchdog)
        if self.failure is not None:
            error, traceback = self.failure
            raise error.with_traceback(traceback)

    def _run_until_all_wait_or_exit(self):
        ready = self.ready
        while True:
            try:
                while ready:
                    if self.draws is not None and len(ready) > 1:
                        ready.rotate(-self.draws.randrange(len(ready)))
                    thread = ready.popleft()
                    if self.failure is not None and not thread:  # the block failed before it started
                        continue
                    thread.switch()
                return
            except _TimeUp:  # the watchdog's, landing here between two threads: go on unwinding them
                self.time_up_landed = True

    def _stop(self, watchdog):
        """Stop the watchdog; if it fired, take its exception here, so that it cannot land after the launch."""
        while True:
            try:
                with self.lock:
                    self.finished = True
                    watchdog.cancel()
                while self.timed_out and not self.time_up_landed:
                    pass  # raised at the loop's next jump back
                return
            except _TimeUp:
                self.time_up_landed = True

    def pause(self, me):
        """Let the other threads that can run go first (a thread spinning on an atomic waits for them)."""
        if self.ready:
            self.ready.append(me)
            self.hub.switch()
            if self.failure is not None:
                raise _Abort()

    # -- called by the simulated threads ------------------------------------------------------------

    def warp_collective(self, me, kind, op, mask, operands):
        mask = int(mask) & FULL_MASK
        if not mask & me.bit:
            if self.strict:
                raise StrictModeError(
                    f"lane {me.lane} of warp {me.warp.index} calls {op}(mask={mask:#010x}), a mask without "
                    "its own lane: undefined on a GPU"
                )
            mask |= me.bit
        with self.lock:
            if self.failure is not None:
                raise _Abort()
            warp = me.warp
            key = (kind, mask)
            call = warp.pending.get(key)
            if call is None:
                call = warp.pending[key] = _Collective(kind, mask)
            call.arrived |= me.bit
            call.calls[me.lane] = (me, op, operands)
            if call.arrived == mask & warp.live:
                del warp.pending[key]
                return self._complete(call, me)
            me.waiting_in = (op, mask)
            self._wait(me)
        return self._sleep(me)

    def barrier(self, me, op, predicate):
        with self.lock:
            if self.failure is not None:
                raise _Abort()
            if not self.at_barrier:
                self.barrier_op = op
                if self.strict:
                    self.barrier_line = kernel_line(sys._getframe(1))
            self.at_barrier.append((me, predicate))
            if len(self.at_barrier) == self.live:
                return self._open_barrier(me)
            me.waiting_in = (op, None)
            self._wait(me)
        return self._sleep(me)

    def grid_sync(self, me):
        """cuda.cg.this_grid().sync(): a syncthreads whose opening waits for every block of the grid."""
        self.barrier(me, "grid.sync", None)

    def activemask(self, me, site):
        with self.lock:
            if self.failure is not None:
                raise _Abort()
            me.warp.at_activemask.setdefault(site, []).append(me)
            me.waiting_in = ("activemask", None)
            self._wait(me)  # settles at once if every other lane of the warp already waits or has exited
        return self._sleep(me)

    def thread_failed(self, me, error, traceback):
        if getattr(error, "names_thread", False):  # the message already says which (watch.py, sanitizer.py)
            wrapped = error
        else:
            where = f"tid={list(me.threadIdx)} ctaid={list(me.blockIdx)}"
            message = f"{where}: {error}" if str(error) else where
            try:
                wrapped = type(error)(message)
            except Exception:  # an exception type whose constructor wants more than a message
                wrapped = RuntimeError(message)
        with self.lock:
            self._fail(wrapped, traceback)

    def thread_exited(self, me):
        with self.lock:
            warp = me.warp
            warp.live &= ~me.bit
            warp.running -= 1
            self.live -= 1
            if self.strict:
                self.exited_since_barrier.append(tuple(me.threadIdx))
            self.running -= 1
            if self.failure is None:
                # This lane may have been the last one a collective or the barrier was waiting for.
                for key, call in list(warp.pending.items()):
                    if call.arrived == call.mask & warp.live:
                        del warp.pending[key]
                        self._complete(call, None)
                if self.at_barrier and len(self.at_barrier) == self.live:
                    self._open_barrier(None)
                self._check_progress(warp)

    # -- internals, all called with self.lock held ------------------------------------------------

    def _sleep(self, me):
        self.hub.switch()
        result, me.result = me.result, None
        if result is _ABORT or self.failure is not None:
            raise _Abort()
        return _unwrap(result)

    def _wait(self, me):
        me.warp.running -= 1
        self.running -= 1
        self._check_progress(me.warp)

    def _release(self, thread, result):
        thread.result = result
        thread.waiting_in = None
        thread.warp.running += 1
        self.running += 1
        self.ready.append(thread)

    def _check_progress(self, warp):
        if warp.running == 0 and warp.at_activemask:
            self._settle_activemask(warp)
        if self.running == 0 and self.live > 0 and self.failure is None:
            self._fail(WarpDeadlockError(self._deadlock_report()), None)

    def _settle_activemask(self, warp):
        """No lane of this warp can progress: each group of lanes waiting at one activemask() call site
        gets its own mask, as the lanes a GPU would be executing together there."""
        sites, warp.at_activemask = warp.at_activemask, {}
        for threads in sites.values():
            mask = np.uint32(sum(thread.bit for thread in threads))
            for thread in threads:
                self._release(thread, mask)

    def _complete(self, call, me):
        """Every live lane named in the mask has arrived: compute each lane's result and wake the others."""
        results = RESOLVERS[call.kind](call, self)
        if call.kind == "syncwarp":
            next(iter(call.calls.values()))[0].warp.syncs += 1
        skipped = self._skipped_by_exited_lanes(call) if self.strict and call.kind in ("vote", "match") else None
        if skipped is not None:
            results = dict.fromkeys(results, _Raise(skipped))
        for lane, (thread, _, _) in call.calls.items():
            if thread is not me:
                self._release(thread, results[lane])
        return _unwrap(results[me.lane]) if me is not None else None

    def _skipped_by_exited_lanes(self, call):
        """Strict mode, for votes and matches: a StrictModeError if lanes the mask names exited without
        making the call (a GPU goes on without them, so their bits of the result are silently
        missing), else None. A shuffle needs no such check: reading an exited lane is named where
        it happens (_resolve_shuffle)."""
        warp = next(thread for thread, _, _ in call.calls.values()).warp
        missing = call.mask & warp.existing & ~call.arrived
        if not missing:
            return None
        lanes = [lane for lane in range(WARP_SIZE) if missing >> lane & 1]
        op = next(iter(call.calls.values()))[1]
        shown = ", ".join(str(lane) for lane in lanes[:8]) + (" ..." if len(lanes) > 8 else "")
        return StrictModeError(
            f"in block {self.block_idx}, lane(s) {shown} of warp {warp.index} (thread {32 * warp.index + lanes[0]}"
            f"{' ...' if len(lanes) > 1 else ''}) exited without calling {op}(mask={call.mask:#010x}), which "
            f"{bin(call.arrived).count('1')} other lane(s) of the warp called with them in the mask: their part "
            "of the result is missing. Every lane a mask names must make the call: call it outside the "
            "branch that skips it (e.g. before `if i < n:`), or leave the skipping lanes out of the mask."
        )

    def _open_barrier(self, me):
        if self.strict and self.exited_since_barrier:
            self._fail(self._skipped_barrier(), None)
            if me is not None:
                raise _Abort()
            return None
        if self.barrier_op == "grid.sync" and self.grid is not None:
            self.grid.wait(self)  # this block's threads are all here: hold them until every block is
            self.grid_syncs += 1
        arrivals, self.at_barrier = self.at_barrier, []
        self.barriers += 1
        self.exited_since_barrier = []
        voters = [predicate for _, predicate in arrivals if predicate is not None]
        outcome = (sum(voters), len(voters))
        for thread, _ in arrivals:
            if thread is not me:
                self._release(thread, outcome)
        return outcome

    def _skipped_barrier(self):
        """Strict mode (synccheck): threads exited while the rest of their block went on to a syncthreads()."""
        gone = sorted(self.exited_since_barrier, key=lambda t: t[::-1])
        shown = ", ".join(str(t) for t in gone[:4]) + (f" and {len(gone) - 4} more" if len(gone) > 4 else "")
        op = "grid.sync()" if self.barrier_op == "grid.sync" else "syncthreads()"
        return StrictModeError(
            f"kernel '{getattr(self.kernel, '__name__', '?')}', block {self.block_idx}: {len(self.at_barrier)} "
            f"thread(s) wait in {op} at {self.barrier_line}, which thread(s) {shown} never reached: they "
            f"exited first. Every thread of a block must reach each {op} (not one inside a branch some "
            "threads skip, nor after a `return` some threads take): on a GPU this is undefined and may hang. "
            f"Keep out-of-range threads in the kernel, doing no work, until the last {op}.")

    def _fail(self, error, traceback):
        if self.failure is None:
            self.failure = (error, traceback)
        for thread in self.threads:
            if thread.waiting_in is not None:
                thread.waiting_in = None
                thread.result = _ABORT
                self.ready.append(thread)  # to unwind: it raises _Abort where it waits

    def _time_out(self, limit, os_thread):
        """The watchdog, on its own OS thread: the block ran past its limit. Say where each thread that
        can still run is, and stop the one running (it unwinds; the others are aborted where they wait)."""
        frames = sys._current_frames()
        with self.lock:
            if self.finished:
                return
            where = {}
            running = [t for t in self.threads if t and t.waiting_in is None]
            for thread in running:
                frame = frames.get(os_thread) if thread is self.running_now() else thread.gr_frame
                where.setdefault(kernel_line(frame), []).append(tuple(thread.threadIdx))
            shown = "; ".join(f"thread {ids[0]}{f' and {len(ids) - 1} more' if len(ids) > 1 else ''} at {line}"
                              for line, ids in where.items())
            self._fail(KernelTimeoutError(
                f"kernel '{getattr(self.kernel, '__name__', '?')}' did not finish block {self.block_idx} within "
                f"{limit:g} s: {shown or 'no thread is running'}. A loop whose condition never changes? (On a GPU "
                f"the launch would hang.)"), None)
            self.timed_out = True
            # Raised at the running thread's next bytecode: it unwinds, and the rest follow.
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(os_thread), ctypes.py_object(_TimeUp))

    def running_now(self):
        """The thread of this block that holds the OS thread now (the one not suspended in a switch)."""
        return next((t for t in self.threads if t and t.gr_frame is None), None)

    def _deadlock_report(self):
        name = getattr(self.kernel, "__name__", "?")
        lines = [
            f"kernel '{name}' deadlocked in block {self.block_idx}: every live thread waits, and none of "
            "the calls they wait in can complete.",
        ]
        for warp in self.warps:
            waiting = {}  # (op, mask) -> lanes
            for thread in self.threads[warp.index * WARP_SIZE : (warp.index + 1) * WARP_SIZE]:
                if thread.waiting_in is not None:
                    waiting[thread.waiting_in] = waiting.get(thread.waiting_in, 0) | thread.bit
            for (op, mask), lanes in waiting.items():
                if mask is None:
                    verb = "waits" if lanes & (lanes - 1) == 0 else "wait"
                    lines.append(f"  warp {warp.index}: {lane_list(lanes)} {verb} in {op}()")
                    continue
                call = next(c for c in warp.pending.values() if c.mask == mask and c.arrived & lanes)
                missing = mask & warp.live & ~call.arrived
                first = warp.index * WARP_SIZE
                elsewhere = {self.threads[first + lane].waiting_in[0] for lane in range(WARP_SIZE) if missing >> lane & 1}
                verb = "waits" if lanes & (lanes - 1) == 0 else "wait"
                lines.append(
                    f"  warp {warp.index}: {lane_list(lanes)} {verb} in {op}(mask={mask:#010x}) "
                    f"for {lane_list(missing)}, which wait in {', '.join(sorted(elsewhere))}"
                )
        if self.at_barrier:
            lines.append(
                f"  syncthreads() needs all {self.live} live threads of the block; "
                f"{len(self.at_barrier)} have arrived."
            )
        lines.append(
            "On a GPU this hangs or gives undefined results: every live lane named in a *_sync mask must "
            "reach the same kind of call with the same mask, and every live thread must reach syncthreads()."
        )
        return "\n".join(lines)


def kernel_line(frame):
    """'file.py:41': the innermost frame outside the simulator's own code (the kernel's line)."""
    while frame is not None and any(part in frame.f_code.co_filename for part in ("/workbook/", "/numba/", "/numpy/")):
        frame = frame.f_back
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno}" if frame is not None else "?"


def _unwrap(result):
    if isinstance(result, _Raise):
        raise result.error
    return result


class GridBarrier:
    """cuda.cg.this_grid().sync() across the blocks of a cooperative launch, each block running in
    an OS thread of its own (GridLaunch). A block arrives when all its live threads have; the
    barrier opens when every block has arrived. A block that ends while others wait at the barrier
    (or before they reach it) would hang a GPU: here it is a GridSyncError naming the block."""

    TIMEOUT_S = 600

    def __init__(self, blocks):
        self.blocks = blocks
        self.cond = threading.Condition()
        self.arrived, self.generation = 0, 0
        self.ended, self.error = [], None

    def wait(self, block):
        with self.cond:
            self._raise_if_broken(block)
            generation = self.generation
            self.arrived += 1
            if self.arrived == self.blocks:
                self.arrived, self.generation = 0, generation + 1
                self.cond.notify_all()
                return
            if not self.cond.wait_for(lambda: self.generation != generation or self.error or self.ended,
                                      timeout=self.TIMEOUT_S):
                self.error = GridSyncError(f"block {block.block_idx} waited {self.TIMEOUT_S} s in grid.sync()")
            if self.generation == generation:
                self._raise_if_broken(block)

    def _raise_if_broken(self, block):
        if self.ended:
            raise GridSyncError(
                f"block {block.block_idx} waits in cuda.cg.this_grid().sync(), which block(s) "
                f"{', '.join(str(b) for b in self.ended[:4])} will never reach: they ended first. Every "
                "block must reach each grid.sync() (not one inside a branch some blocks skip); on a GPU "
                "this launch would hang.")
        if self.error is not None:
            raise GridSyncError(f"block {block.block_idx}: another block failed ({self.error})")

    def block_ended(self, block_idx, error=None):
        with self.cond:
            if error is not None:
                self.error = self.error or error
            else:
                self.ended.append(tuple(block_idx))
            self.cond.notify_all()


class GridLaunch:
    """Stands in for the block scheduler of a kernel that calls cuda.cg.this_grid().sync(): at the
    first grid point the stock simulator hands it, it runs every block of the grid at once, each
    on an OS thread of its own with a BlockScheduler, sharing a GridBarrier (on a GPU, a
    cooperative launch: all blocks resident together); later grid points find the work done."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self.f, self.grid_dim, self.block_dim, self.debug = f, grid_dim, block_dim, debug

    def run(self, grid_point, *args):
        if any(grid_point):
            return
        points = list(np.ndindex(*self.grid_dim))
        barrier = GridBarrier(len(points))
        errors = {}

        def one_block(point):
            block = BlockScheduler(self.f, self.grid_dim, self.block_dim, self.debug)
            block.grid = barrier
            try:
                block.run(point, *args)
            except BaseException as error:  # noqa: BLE001 (handed to the launching thread below)
                errors[point] = error
                barrier.block_ended(point, error)
            else:
                barrier.block_ended(point)

        threads = [threading.Thread(target=one_block, args=(point,), daemon=True) for point in points]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:  # the first failure that is not just another block's failure reported back
            first = sorted(errors.items(), key=lambda item: (isinstance(item[1], GridSyncError)
                                                             and "another block failed" in str(item[1]), item[0]))
            raise first[0][1]
