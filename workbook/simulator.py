"""Warp-level intrinsics for numba's CUDA simulator, with the semantics of a GPU of compute capability 7.0+.

Students without a GPU, and CI, run the workbook in numba's simulator (NUMBA_ENABLE_CUDASIM=1), which
runs each CUDA thread of a block as a Python thread. The stock simulator has no warp-level operations
(`cuda.ballot_sync` is an AttributeError) and schedules its threads with a busy polling loop.
`install()` -- called by `import workbook` in simulator mode; nothing for a reader to call -- adds

    ballot_sync  all_sync  any_sync  eq_sync          votes            (mask, predicate)
    shfl_sync  shfl_up_sync  shfl_down_sync  shfl_xor_sync   shuffles  (mask, value, lane/delta/lane_mask)
    match_any_sync  match_all_sync                    compare          (mask, value)
    syncwarp([mask])  activemask()  lanemask_lt()

corrects popc, brev, clz and ffs for negative and 64-bit values, and replaces the block scheduler by an
event-driven one (below), which also serves syncthreads and syncthreads_count/and/or.

Threads, warps and lanes
------------------------
Warps are cut from the *linear* thread index x + y*bx + z*bx*by; lane = linear % 32. A block of
16 x 3 threads has two warps, the second one half empty:

    threadIdx.y = 0:  x = 0..15  -> linear  0..15  -> warp 0, lanes  0..15
    threadIdx.y = 1:  x = 0..15  -> linear 16..31  -> warp 0, lanes 16..31
    threadIdx.y = 2:  x = 0..15  -> linear 32..47  -> warp 1, lanes  0..15   (lanes 16..31 do not exist)

What a `*_sync(mask, ...)` call waits for
-----------------------------------------
A lane calling ballot_sync(0xFFFFFFFF, p) waits until every lane named in the mask that exists and has
not exited has reached a call of the same kind (any vote / any shuffle / any match / syncwarp) with the
same mask. Exited and missing lanes are skipped, as on the hardware, so the tail pattern
`if i >= n: return` followed by a full-mask collective works:

    warp 3 of a 128-thread block, n = 100      ballot_sync(0xFFFFFFFF, p)
    lane:   0  1  2  3 |  4  5 ... 31
            =  =  =  = |  x  x ...  x          = arrived   x exited: skipped
    the call completes once lanes 0-3 have arrived; bits 4-31 of the ballot are 0

Results have numba's types on a GPU: ballot_sync and match_any_sync return a *signed* int32 (lane 31 set
means negative), match_all_sync a tuple (int32 mask, bool), all/any/eq_sync a bool, activemask and
lanemask_lt a uint32, a shuffle whatever it was given. laneid and warpsize are plain ints, like
threadIdx in the simulator.

activemask()
------------
On a GPU it returns the lanes executing the call together. The model here: a lane calling activemask()
waits until no lane of its warp can make progress (each one has exited or waits somewhere), then gets
the mask of the lanes waiting at the same call site (same line, same chain of device-function calls).
So after `if i >= n: return` the tail warp sees only its live lanes, and inside `if lane % 2 == 0:`
the even lanes see 0x55555555.

Shuffles
--------
As in PTX shfl.sync, only the low 5 bits of the lane/delta operand count: shfl_sync(m, v, 33) reads
lane 1 and shfl_sync(m, v, -1) lane 31; shfl_up/shfl_down past the edge of the warp return the
caller's own value. Reading a lane that does not take part in the shuffle (exited, missing from a
partial warp, or not in the mask) is undefined on a GPU; here it returns the caller's own value, or,
with WORKBOOK_SIM_STRICT=1, raises StrictModeError naming both lanes. Strict mode also rejects a
collective whose mask leaves out the calling lane (by default the caller is added to the mask).

Types numba refuses
-------------------
Where numba would not compile a call for a GPU, the simulator raises TypeError instead of quietly
working: shuffling anything but an int32/int64/float32/float64 (activemask() is a uint32!), a bool
predicate for syncthreads_count/and/or (they take integers), a float vote predicate. popc and clz keep
the argument's width (a Python int is an int64: popc(-1) == 64), ffs returns a uint32, and brev has
only uint32 and uint64 versions: numba converts every other integer, int64 included, to uint32.

Deadlocks
---------
A collective that can never complete -- half a warp in shfl_sync and the other half in ballot_sync,
or one lane in syncthreads while the rest of its warp waits for it in a shuffle -- would hang a GPU.
Here, once every live thread of the block waits and nothing can be released, the launch raises
WarpDeadlockError naming the kernel, the block and, per warp, which lanes wait where for whom.

Scheduling (why it is fast)
---------------------------
Each simulated thread sleeps on its own lock while it waits. The last lane to arrive at a collective
computes every participant's result and wakes them; an exiting thread re-checks the collectives and
the barrier it might have been holding up. syncthreads completes when all *live* threads have arrived
(exited threads do not block it, as on sm_70+). Nothing polls.

Measured 2026-11-21 on 2 shared CPU cores (AMD EPYC), Python 3.11, numba-cuda 0.30.4; 16 blocks x 256
threads, best of several runs (ranges: other jobs were running); stock = numba's own BlockManager:
    ballot_sync + 5-step shfl_xor_sync reduction   0.95-1.5 s   stock: no warp intrinsics
        (tests/test_warp_intrinsics.py -k speed -s prints it; the test's bound is 20 s)
    elementwise `out[i] = x[i] + 1`                 0.32-0.59 s  stock: 0.35-0.63 s (same runs, interleaved)
    the same between two syncthreads()              0.84-1.05 s  stock: 2.1-2.7 s
Most of what is left is starting one Python thread per CUDA thread, which the stock simulator pays too.

tests/test_warp_intrinsics.py checks all of the above against hand-computed expectations; the same file
passed on an H100 (results/nvidia-h100-80gb-hbm3/test_warp_intrinsics.log).
"""

import contextlib
import copy
import os
import struct
import sys
import threading

import numpy as np
from numba.cuda.simulator.kernelapi import Dim3

WARP_SIZE = 32
FULL_MASK = 0xFFFFFFFF
STRICT_ENV = "WORKBOOK_SIM_STRICT"

# The four modes of PTX shfl.sync; numba always shuffles across the whole warp (no `width`).
SHFL_IDX, SHFL_UP, SHFL_DOWN, SHFL_BFLY = "idx", "up", "down", "bfly"


class WarpDeadlockError(RuntimeError):
    """Raised from a kernel launch when a block's live threads all wait for something that cannot happen."""


class StrictModeError(RuntimeError):
    """Raised under WORKBOOK_SIM_STRICT=1 where a kernel relies on behaviour a GPU leaves undefined."""


class _Abort(BaseException):
    """Unwinds a simulated thread after another thread of its block failed.

    A BaseException, so that a kernel's own `except Exception:` cannot swallow it."""


_ABORT = object()  # handed to a waiting thread instead of a result when its block fails


class _Raise:
    """A result the woken lane must raise: a strict-mode error found by whichever lane completed the call."""

    def __init__(self, error):
        self.error = error


def strict_mode():
    return os.environ.get(STRICT_ENV, "").strip() not in ("", "0")


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


def as_int32(bits):
    """A 32-bit lane mask as numba returns it from ballot_sync / match_*_sync: a signed int32."""
    return np.int32(bits - (1 << 32) if bits & 0x80000000 else bits)


# --------------------------------------------------------------------------------------------------
# The block scheduler: replaces numba's BlockManager (same constructor, same run()).


class _Warp:
    def __init__(self, index, lanes):
        self.index = index
        self.existing = (1 << lanes) - 1  # a partial last warp has fewer than 32 lanes
        self.live = self.existing  # existing lanes that have not exited
        self.running = lanes  # live lanes not waiting for anything
        self.pending = {}  # (kind, mask) -> _Collective still missing some lanes
        self.at_activemask = {}  # call site -> lanes waiting there for the warp to settle


class _Collective:
    """One warp-level call in progress: who has arrived, and with what."""

    def __init__(self, kind, mask):
        self.kind = kind
        self.mask = mask
        self.arrived = 0
        self.calls = {}  # lane -> (thread, op name, operands)


class _Thread(threading.Thread):
    """A Python thread that plays one simulated CUDA thread at a time; FakeCUDAModule finds the one
    it is playing with threading.current_thread().

    Starting a Python thread costs far more than waking one (a launch of 256 threads x 200 blocks
    would start 51,200), so threads are kept in a pool: between jobs a thread sleeps on `go`, and
    `assign` gives it the next CUDA thread to play."""

    def __init__(self):
        super().__init__(daemon=True, name="simulated cuda thread")
        # Read by a failing thread's BlockScheduler._fail for every thread of the launch, including
        # those not yet assigned: a new thread must already say "not waiting".
        self.waiting_in = None
        self.go = threading.Lock()
        self.go.acquire()  # released by assign(): "play this CUDA thread"

    def assign(self, block, block_idx, thread_idx, thread_id):
        self.block = block
        self.blockIdx = Dim3(*block_idx)
        self.threadIdx = Dim3(*thread_idx)
        self.thread_id = thread_id
        self.lane = thread_id % WARP_SIZE
        self.bit = 1 << self.lane
        self.warp = block.warps[thread_id // WARP_SIZE]
        # Held while the thread runs; released by whoever wakes it, so acquiring it is "sleep until woken".
        self.wake = threading.Lock()
        self.wake.acquire()
        self.result = None
        self.waiting_in = None  # (op name, mask) while waiting: what a deadlock report shows
        if not self.is_alive():
            self.start()
        self.go.release()

    def run(self):
        while True:
            self.go.acquire()
            block = self.block
            try:
                with np.errstate(divide="raise") if block.debug else contextlib.nullcontext():
                    block.kernel(*block.args)
            except _Abort:
                pass
            except Exception as error:
                block.thread_failed(self, error, sys.exc_info()[2])
            finally:
                block.thread_exited(self)
                self.block = block = None  # nothing of this launch stays reachable from the pool
                _IDLE.append(self)  # last: from here on the next assign() may reuse this thread

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


_IDLE = []  # pooled threads waiting for a CUDA thread to play (list.append/pop are atomic)


def _pooled_thread():
    try:
        return _IDLE.pop()
    except IndexError:
        return _Thread()


class BlockScheduler:
    """Runs one thread block: one Python thread per CUDA thread, woken by events rather than polled.

    Every method that touches the shared state holds self.lock; a thread that must wait records why
    (for deadlock reports), lowers the running counts and sleeps on its own lock outside self.lock."""

    def __init__(self, f, grid_dim, block_dim, debug):
        self.kernel = f
        self.kernel_code = getattr(f, "__code__", None)
        self.grid_dim = grid_dim
        self.block_dim = block_dim
        self.debug = debug
        self.lock = threading.Lock()

    def run(self, grid_point, *args):
        bx, by, bz = self.block_dim
        n_threads = bx * by * bz
        self.args = args
        self.strict = strict_mode()
        self.block_idx = tuple(grid_point)
        self.warps = [_Warp(w, min(WARP_SIZE, n_threads - w * WARP_SIZE)) for w in range(-(-n_threads // WARP_SIZE))]
        self.live = n_threads
        self.running = n_threads
        self.at_barrier = []  # (thread, predicate or None) waiting in syncthreads*
        self.failure = None  # (exception, traceback) of the first thread that failed, or a deadlock
        self.done = threading.Lock()
        self.done.acquire()
        self.finished = False
        self.started = self.exited = 0
        self.all_exited = threading.Condition(self.lock)
        self.threads = [_pooled_thread() for _ in range(n_threads)]
        thread_indices = ((x, y, z) for z in range(bz) for y in range(by) for x in range(bx))
        for thread_id, (thread, thread_idx) in enumerate(zip(self.threads, thread_indices)):
            if self.failure is not None:
                _IDLE.extend(self.threads[thread_id:])  # a thread already failed: the launch is over
                del self.threads[thread_id:]
                break
            thread.assign(self, grid_point, thread_idx, thread_id)
            self.started += 1
        self.done.acquire()
        if self.failure is not None:
            self._let_threads_unwind(seconds=2.0)
            error, traceback = self.failure
            raise error.with_traceback(traceback)

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
            self.at_barrier.append((me, predicate))
            if len(self.at_barrier) == self.live:
                return self._open_barrier(me)
            me.waiting_in = (op, None)
            self._wait(me)
        return self._sleep(me)

    def activemask(self, me, site):
        with self.lock:
            if self.failure is not None:
                raise _Abort()
            me.warp.at_activemask.setdefault(site, []).append(me)
            me.waiting_in = ("activemask", None)
            self._wait(me)  # settles at once if every other lane of the warp already waits or has exited
        return self._sleep(me)

    def thread_failed(self, me, error, traceback):
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
            if self.live == 0:
                self._finish()
            self.exited += 1
            self.all_exited.notify_all()

    # -- internals, all called with self.lock held ------------------------------------------------

    def _sleep(self, me):
        me.wake.acquire()
        result, me.result = me.result, None
        if result is _ABORT:
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
        thread.wake.release()

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
        results = _RESOLVERS[call.kind](call, self)
        for lane, (thread, _, _) in call.calls.items():
            if thread is not me:
                self._release(thread, results[lane])
        return _unwrap(results[me.lane]) if me is not None else None

    def _open_barrier(self, me):
        arrivals, self.at_barrier = self.at_barrier, []
        voters = [predicate for _, predicate in arrivals if predicate is not None]
        outcome = (sum(voters), len(voters))
        for thread, _ in arrivals:
            if thread is not me:
                self._release(thread, outcome)
        return outcome

    def _fail(self, error, traceback):
        if self.failure is None:
            self.failure = (error, traceback)
        for thread in self.threads:
            if thread.waiting_in is not None:
                thread.waiting_in = None
                thread.result = _ABORT
                thread.wake.release()
        self._finish()

    def _finish(self):
        if not self.finished:
            self.finished = True
            self.done.release()

    def _let_threads_unwind(self, seconds):
        """Give aborted threads a moment to leave the kernel, so that they do not overlap the next launch."""
        with self.lock:
            self.all_exited.wait_for(lambda: self.exited == self.started, timeout=seconds)

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


def _unwrap(result):
    if isinstance(result, _Raise):
        raise result.error
    return result


# --------------------------------------------------------------------------------------------------
# What each kind of collective computes once all its lanes have arrived: {lane: result}.


def _resolve_vote(call, block):
    predicates = {lane: predicate for lane, (_, _, (predicate,)) in call.calls.items()}
    ballot = sum(1 << lane for lane, predicate in predicates.items() if predicate)
    everyone, anyone = all(predicates.values()), any(predicates.values())
    results = {}
    for lane, (_, op, _) in call.calls.items():
        if op == "ballot_sync":
            results[lane] = as_int32(ballot)
        elif op == "all_sync":
            results[lane] = everyone
        elif op == "any_sync":
            results[lane] = anyone
        else:  # eq_sync: the predicates are uniform
            results[lane] = everyone or not anyone
    return results


def shfl_source_lane(mode, lane, operand):
    """The lane a shuffle reads, as PTX shfl.sync computes it with numba's clamp values.

    Only operand bits 4..0 count, so a source lane of 33 means lane 1 and -1 means lane 31;
    up/down past the edge of the warp read the caller's own lane."""
    b = int(operand) & (WARP_SIZE - 1)
    if mode == SHFL_IDX:
        return b
    if mode == SHFL_UP:
        return lane - b if lane - b >= 0 else lane
    if mode == SHFL_DOWN:
        return lane + b if lane + b < WARP_SIZE else lane
    return lane ^ b


def _resolve_shuffle(call, block):
    warp = next(thread for thread, _, _ in call.calls.values()).warp
    results = {}
    for lane, (thread, op, (mode, value, operand)) in call.calls.items():
        source = shfl_source_lane(mode, lane, operand)
        if source in call.calls:
            results[lane] = call.calls[source][2][1]
        elif block.strict:
            if not warp.existing >> source & 1:
                why = f"does not exist (warp {warp.index} has {warp.existing.bit_length()} lanes)"
            elif not warp.live >> source & 1:
                why = "has exited"
            else:
                why = f"is not in the mask {call.mask:#010x}"
            results[lane] = _Raise(
                StrictModeError(
                    f"lane {lane} of warp {warp.index} reads lane {source} in {op}(mask={call.mask:#010x}), "
                    f"but lane {source} {why}: the value is undefined on a GPU"
                )
            )
        else:
            results[lane] = value  # undefined on a GPU; the caller's own value here
    return results


def bit_pattern(value):
    """What match_*_sync compares: the bits, so 0.0 != -0.0 and a NaN matches the same NaN."""
    if isinstance(value, np.floating):
        return int(value.view(np.int64 if value.dtype.itemsize == 8 else np.int32))
    if isinstance(value, float):
        return struct.unpack("<q", struct.pack("<d", value))[0]
    return int(value)


def _resolve_match(call, block):
    patterns = {lane: bit_pattern(value) for lane, (_, _, (value,)) in call.calls.items()}
    uniform = len(set(patterns.values())) == 1
    results = {}
    for lane, (_, op, _) in call.calls.items():
        if op == "match_any_sync":
            same = sum(1 << other for other, pattern in patterns.items() if pattern == patterns[lane])
            results[lane] = as_int32(same)
        else:
            results[lane] = (as_int32(call.arrived), True) if uniform else (np.int32(0), False)
    return results


def _resolve_syncwarp(call, block):
    return dict.fromkeys(call.calls)


_RESOLVERS = {"vote": _resolve_vote, "shfl": _resolve_shuffle, "match": _resolve_match, "syncwarp": _resolve_syncwarp}


# --------------------------------------------------------------------------------------------------
# The intrinsics, as methods of FakeCUDAModule (`cuda` inside a simulated kernel). The argument order
# and return types are numba-cuda's (numba/cuda/intrinsics.py, cudadecl.py, cudaimpl.py), and so are
# the operand types: what numba would refuse to compile for a GPU is a TypeError here too.


def _is_integer(value):
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def _integer_predicate(op, predicate):
    if not _is_integer(predicate):
        raise TypeError(
            f"{op} takes an integer predicate: numba does not compile it for a {type(predicate).__name__} "
            "on a GPU (write `1 if condition else 0`)"
        )
    return bool(predicate)


def _vote_predicate(op, predicate):
    if not (_is_integer(predicate) or isinstance(predicate, (bool, np.bool_))):
        raise TypeError(f"{op} takes a bool or integer predicate, not a {type(predicate).__name__} (as numba on a GPU)")
    return bool(predicate)


def _shuffle_value(op, value):
    # A Python int or float is an int64 or float64 to numba.
    if not (isinstance(value, (np.int32, np.int64, np.float32, np.float64)) or type(value) in (int, float)):
        raise TypeError(
            f"{op} shuffles int32, int64, float32 and float64 values only; numba does not compile it for a "
            f"{type(value).__name__} on a GPU (convert first, e.g. numba.int64(value))"
        )
    return value


def _collective(kind, op, mask, *operands):
    me = threading.current_thread()
    return me.block.warp_collective(me, kind, op, mask, operands)


def ballot_sync(self, mask, predicate):
    return _collective("vote", "ballot_sync", mask, _vote_predicate("ballot_sync", predicate))


def all_sync(self, mask, predicate):
    return _collective("vote", "all_sync", mask, _vote_predicate("all_sync", predicate))


def any_sync(self, mask, predicate):
    return _collective("vote", "any_sync", mask, _vote_predicate("any_sync", predicate))


def eq_sync(self, mask, predicate):
    return _collective("vote", "eq_sync", mask, _vote_predicate("eq_sync", predicate))


def shfl_sync(self, mask, value, src_lane):
    return _collective("shfl", "shfl_sync", mask, SHFL_IDX, _shuffle_value("shfl_sync", value), src_lane)


def shfl_up_sync(self, mask, value, delta):
    return _collective("shfl", "shfl_up_sync", mask, SHFL_UP, _shuffle_value("shfl_up_sync", value), delta)


def shfl_down_sync(self, mask, value, delta):
    return _collective("shfl", "shfl_down_sync", mask, SHFL_DOWN, _shuffle_value("shfl_down_sync", value), delta)


def shfl_xor_sync(self, mask, value, lane_mask):
    return _collective("shfl", "shfl_xor_sync", mask, SHFL_BFLY, _shuffle_value("shfl_xor_sync", value), lane_mask)


def match_any_sync(self, mask, value):
    return _collective("match", "match_any_sync", mask, value)


def match_all_sync(self, mask, value):
    return _collective("match", "match_all_sync", mask, value)


def syncwarp(self, mask=FULL_MASK):
    _collective("syncwarp", "syncwarp", mask)


def activemask(self):
    me = threading.current_thread()
    # The call site: each frame from the caller up to the kernel, so that one device function called
    # from two branches counts as two sites, as two program counters would on a GPU.
    site, frame = [], sys._getframe(1)
    while frame is not None:
        site.append((frame.f_code, frame.f_lasti))
        if frame.f_code is me.block.kernel_code:
            break
        frame = frame.f_back
    return me.block.activemask(me, tuple(site))


def lanemask_lt(self):
    return np.uint32(threading.current_thread().bit - 1)


# Bit manipulation. numba types a numpy integer as itself and a plain Python int as int64 (uint64 from
# 2**63 up); popc and clz return that type, ffs a uint32, and brev exists only for uint32 and uint64:
# numba converts every other integer (int64 included) to uint32, keeping the low 32 bits.


def _bits_and_width(value):
    if isinstance(value, (bool, np.bool_)):
        return int(value), 8  # numba picks the int8 overload for a boolean
    width = value.dtype.itemsize * 8 if isinstance(value, np.integer) else 64
    return int(value) & ((1 << width) - 1), width


def _like(value, result):
    return type(value)(result) if isinstance(value, np.integer) else result


def popc(self, value):
    bits, _ = _bits_and_width(value)
    return _like(value, bin(bits).count("1"))


def clz(self, value):
    bits, width = _bits_and_width(value)
    return _like(value, width - bits.bit_length())


def ffs(self, value):
    bits, _ = _bits_and_width(value)
    return np.uint32((bits & -bits).bit_length())  # lowest set bit, counted from 1; 0 for 0


def brev(self, value):
    if isinstance(value, np.uint64) or (type(value) is int and value >= 1 << 63):  # numba's uint64 overload
        return np.uint64(int(f"{int(value):064b}"[::-1], 2))
    low_bits = int(value) & FULL_MASK  # anything else is converted to uint32
    return np.uint32(int(f"{low_bits:032b}"[::-1], 2))


_INTRINSICS = {
    "ballot_sync": ballot_sync,
    "all_sync": all_sync,
    "any_sync": any_sync,
    "eq_sync": eq_sync,
    "shfl_sync": shfl_sync,
    "shfl_up_sync": shfl_up_sync,
    "shfl_down_sync": shfl_down_sync,
    "shfl_xor_sync": shfl_xor_sync,
    "match_any_sync": match_any_sync,
    "match_all_sync": match_all_sync,
    "syncwarp": syncwarp,
    "activemask": activemask,
    "lanemask_lt": lanemask_lt,
    "popc": popc,
    "clz": clz,
    "ffs": ffs,
    "brev": brev,
}


def install():
    """Patch numba's CUDA simulator (idempotent; does nothing unless the simulator is enabled)."""
    from numba.cuda.core import config

    if not config.ENABLE_CUDASIM:
        return
    from numba.cuda.simulator import kernel, kernelapi

    if getattr(kernel, "_workbook_simulator_installed", False):
        return
    for name, function in _INTRINSICS.items():
        setattr(kernelapi.FakeCUDAModule, name, function)
    kernel.BlockManager = BlockScheduler
    global _stock_getitem
    _stock_getitem = kernel.FakeCUDAKernel.__getitem__
    kernel.FakeCUDAKernel.__getitem__ = _configured_copy
    global _stock_call
    _stock_call = kernel.FakeCUDAKernel.__call__
    kernel.FakeCUDAKernel.__call__ = _compiled_call
    kernel._workbook_simulator_installed = True


_stock_getitem = None
_stock_call = None


def _compiled_call(self, *args):
    """A launch from the host is first compiled for a GPU with its argument types (workbook/compiler.py):
    a kernel the GPU compiler rejects fails here, with numba's message, instead of passing a check."""
    from numba.cuda.simulator import kernel

    if not self._device and not kernel._kernel_context:
        from . import compiler

        compiler.check_launch(self, args)
    return _stock_call(self, *args)


def _configured_copy(self, configuration):
    """`kernel[grid, block, stream]` as on a GPU: a new configured launcher, the kernel untouched.

    The stock simulator configures the kernel object itself and returns it, so launchers kept for
    later (`launches = [k[g, b, s] for s in streams]`) would all run with the last configuration.
    """
    return _stock_getitem(copy.copy(self), configuration)
