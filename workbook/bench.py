"""Time kernels the way GPU engineers do, and compare them in one call.

    result = compare({"naive": run_naive, "optimized": run_optimized},
                     reference=expected, baselines={"torch.relu": run_torch}, bytes=8 * n)

Each callable launches its kernel(s) and returns the output(s). compare() calls each once (the
warm-up: compilation is never timed; on a GPU the kernels' warm-ups are made all at once, their
kernels compiled side by side, see compile_pool.py, and a chapter may have made them earlier,
beside other work: `warm_up(keep=True)`) and checks that output against the reference, then times all
of them interleaved (naive, optimized, baseline, naive, ...) with CUDA events, so that clock or
thermal drift hits every variant alike; before each timed call the GPU is held until the host has
queued the whole call (see `held`), so the times are the GPU's, whatever the call costs in Python.
What the call costs the CPU is measured apart: `host_us` (calls queued back to back, per call) and
`latency_us` (one call and a synchronize, as `%timeit` sees it). It reports the median and the
spread (25th-75th percentile) of the GPU time, GB/s from the bytes the caller counted, the fraction of the device-to-device copy ceiling measured
in this same process, TFLOP/s from the FLOPs the caller counted, and speed-ups with their spread
(the ratio is taken repeat by repeat, over interleaved pairs).

A slow variant (a forward of seconds beside kernels of milliseconds) is measured the same way in
fewer calls. Its checked call says how long a call takes before anything is timed, and whether the
call waits for the GPU itself (it is made held for 0.1 s, see `synchronises`: no call of its own).
Its repeats are as many as fit `REPEATS_SECONDS`, never fewer than `MIN_REPEATS` (a spread needs
three) nor more than asked: it takes part in the first rounds, the others go on being interleaved
among themselves, and a speed-up is taken over the rounds both made. A call of `SLOW_CALL_MS` or
more, or one that synchronises, is not called again for its host cost and latency (a microsecond's
spread does not show in a call of a second, and a call that waits for the GPU costs its host its
wall clock): they come from its timed repeats, exactly. Held, the host's time inside the hold
is one sample of `host_cost_us`, and its latency is timed once. Unheld (it synchronises), each of its
repeats runs from an idle GPU to a synchronize, outside its events, and that wall clock is one sample
of `latency_us`, and of `host_cost_us`, which for such a call is its loop's wall time per call. Each
row stores its own number of repeats.

In the simulator nothing about time is meaningful: variants are run once and checked (the outputs
they write are found by a call whose launches are skipped, and poisoned first), and the report
says so. The chapter shows the stored GPU results instead (see chapter.py).
"""

import time
from dataclasses import dataclass, field

import numpy as np
from numba import cuda

from . import ON_GPU, tables
from .check import assert_close, poison
from .compile_pool import warm_up as _side_by_side
from .host import in_background

DEFAULT_REPEATS = 50


@dataclass
class Timing:
    name: str
    kind: str  # "kernel" or "baseline"
    times_ms: np.ndarray
    correct: bool | None = None
    bytes: float | None = None
    flops: float | None = None
    ceiling_gbps: float | None = None
    host_us: float | None = None  # what one call costs the CPU (see host_cost_us)
    latency_us: float | None = None  # one call, synchronised: host + GPU + the wait, wall clock
    synchronises: bool = False  # the call waits for the GPU itself (see compare)
    extra: dict = field(default_factory=dict)

    @property
    def median_ms(self):
        return float(np.median(self.times_ms)) if len(self.times_ms) else float("nan")

    @property
    def spread_ms(self):
        """25th and 75th percentile of the repeats."""
        return tuple(float(v) for v in np.percentile(self.times_ms, [25, 75])) if len(self.times_ms) else (
            float("nan"), float("nan"))

    @property
    def gbps(self):
        return self.bytes / (self.median_ms * 1e-3) / 1e9 if self.bytes else None

    @property
    def tflops(self):
        return self.flops / (self.median_ms * 1e-3) / 1e12 if self.flops else None

    @property
    def fraction_of_ceiling(self):
        return self.gbps / self.ceiling_gbps if self.gbps and self.ceiling_gbps else None


@dataclass
class Comparison:
    """The result of compare(): timings in the order given, kernels first, then baselines."""

    title: str
    timings: list
    meaningful: bool
    ceiling: dict | None = None

    def __getitem__(self, name):
        for timing in self.timings:
            if timing.name == name:
                return timing
        raise KeyError(f"no variant {name!r}; have {[t.name for t in self.timings]}")

    def fastest(self, names=None):
        """The variant with the smallest median time among `names` (default: the kernels). In the
        simulator, where times mean nothing, the last of them (a chapter names its own last)."""
        names = list(names) if names is not None else [t.name for t in self.timings if t.kind == "kernel"]
        if not self.meaningful:
            return names[-1]
        return min(names, key=lambda name: self[name].median_ms)

    def gbps(self, name):
        """GB/s of variant `name`, or None if it did not run (a torch baseline without torch)."""
        return next((t.gbps for t in self.timings if t.name == name), None)

    def tflops(self, name):
        """TFLOP/s of variant `name`, or None if it did not run."""
        return next((t.tflops for t in self.timings if t.name == name), None)

    def ratio(self, slower, faster):
        """Speed-up of `faster` over `slower`: (median, 25th, 75th percentile) of per-repeat ratios,
        over the rounds both took part in (a slow variant makes fewer repeats: the first rounds).

        NaNs where a variant was not run (a baseline without torch) or in the simulator."""
        names = {t.name for t in self.timings}
        if not self.meaningful or slower not in names or faster not in names:
            return (float("nan"),) * 3
        a, b = self[slower].times_ms, self[faster].times_ms
        rounds = min(len(a), len(b))
        ratios = a[:rounds] / b[:rounds]
        return float(np.median(ratios)), *(float(v) for v in np.percentile(ratios, [25, 75]))

    def fraction(self, name):
        """Variant `name`'s fraction of the copy ceiling measured in this run: (median, 25th, 75th
        percentile) over its repeats. The figure that travels between GPUs, where a ratio to torch
        moves with torch's own kernels. NaNs where it was not run, counts no bytes, or in the simulator."""
        names = {t.name for t in self.timings}
        if not self.meaningful or name not in names or not self[name].bytes or not self.ceiling:
            return (float("nan"),) * 3
        fractions = self[name].bytes / (self[name].times_ms * 1e-3) / 1e9 / self.ceiling["gbps"]
        return float(np.median(fractions)), *(float(v) for v in np.percentile(fractions, [25, 75]))

    @property
    def first_kernel(self):
        return next(t.name for t in self.timings if t.kind == "kernel")

    @property
    def first_baseline(self):
        return next((t.name for t in self.timings if t.kind == "baseline"), None)

    def rows(self):
        """One dict per variant: what the tables and the JSON files hold."""
        rows = []
        for t in self.timings:
            low, high = t.spread_ms
            row = {
                "variant": t.name, "kind": t.kind, "correct": t.correct,
                "median_ms": t.median_ms if self.meaningful else None,
                "p25_ms": low if self.meaningful else None, "p75_ms": high if self.meaningful else None,
                "repeats": len(t.times_ms), "bytes": t.bytes, "flops": t.flops,
                "gbps": t.gbps if self.meaningful else None,
                "tflops": t.tflops if self.meaningful else None,
                "fraction_of_ceiling": t.fraction_of_ceiling if self.meaningful else None,
                "host_us": t.host_us if self.meaningful else None,
                "latency_us": t.latency_us if self.meaningful else None,
                **({"synchronises": True} if t.synchronises else {}),
                **t.extra,
            }
            if self.meaningful:
                row["speedup_vs_first"] = self.ratio(self.first_kernel, t.name)
                if self.first_baseline:
                    row["speedup_vs_baseline"] = self.ratio(self.first_baseline, t.name)
            rows.append(row)
        return rows

    def table(self):
        return tables.comparison(self.title, self.rows(), ceiling=self.ceiling, timed=self.meaningful)

    def show(self):

        tables.console().print(self.table())

    def __repr__(self):

        console = tables.console(record=True, file=open("/dev/null", "w"), force_terminal=False)
        console.print(self.table())
        return console.export_text()


# ---------------------------------------------------------------------------------------------
# GPU timing


@cuda.jit
def _fill(buffer, value):
    # Grid-stride write: used to evict the L2 between timed runs.
    start, stride = cuda.grid(1), cuda.gridsize(1)
    for i in range(start, buffer.size, stride):
        buffer[i] = value


_scratch = None


def flush_l2():
    """Write 256 MiB so that nothing a timed kernel reads is still in the 50 MB L2."""
    global _scratch
    if _scratch is None:
        _scratch = cuda.device_array(2**26, dtype=np.float32)
    _fill[1024, 256](_scratch, 0.0)


# Holding the GPU while the host queues a call (nvbench's "blocking kernel"). Events time what the
# GPU does between them; if the GPU is idle when the start event is recorded, it also times the
# host's work between that event and the call's first kernel (argument checks, launches), and a
# short kernel then reads as long as its wrapper's Python. So before each timed call a one-thread
# kernel spins until the host says "queued" through a flag in mapped host memory: the GPU then
# runs the start event, the call's kernels and the end event back to back. What the host spends
# is measured apart (host_cost_us).

HOLD_SECONDS = 2.0  # a hold gives up after this long (a call that waits for the GPU itself)
HOST_HOLD_SECONDS = 0.5  # host_cost_us's hold: ten calls are queued well within it, unless they
                         # queue more launches than the driver holds, which it then finds out sooner
_flag = None  # mapped host memory: [0] the last ticket the host released, [1] holds that gave up
_ticket = 0
_nap_ns = None  # how long one round of _hold's loop takes on this GPU (nanosleep's time is loose)


if ON_GPU:
    from llvmlite import ir
    from numba.cuda import types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def _read_volatile(typingctx, array):
        """array[0] read from memory each time it is called (`ld.volatile`): the host writes it
        while a kernel spins on it. A plain load would be hoisted out of the loop; an atomic
        would write back the value it read, over the host's write (atomics on mapped host memory
        are not atomic for the host)."""
        if not (isinstance(array, types.Array) and array.dtype == types.int32):
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            load = ir.InlineAsm(ir.FunctionType(ir.IntType(32), [data.type]), "ld.volatile.u32 $0, [$1];",
                                "=r,l", side_effect=True)
            return builder.call(load, [data])

        return types.int32(array), codegen

    @cuda.jit
    def _hold(flag, ticket, naps):
        for _ in range(naps):
            if _read_volatile(flag) >= ticket:
                return
            cuda.nanosleep(1000)
        flag[1] += 1  # gave up: the host never released this ticket in time (one thread: no race)


def _naps(seconds):
    """Rounds of _hold's loop that last about `seconds`, measured once (a hold never released)."""
    global _flag, _nap_ns
    if _flag is None:
        _flag = cuda.mapped_array(2, dtype=np.int32)
        _flag[:] = 0
    if _nap_ns is None:
        rounds, start, end = 20_000, cuda.event(), cuda.event()
        _hold[1, 1](_flag, 2**31 - 1, 10)  # compile
        start.record()
        _hold[1, 1](_flag, 2**31 - 1, rounds)
        end.record()
        end.synchronize()
        _nap_ns = max(cuda.event_elapsed_time(start, end) * 1e6 / rounds, 1.0)
    return int(seconds * 1e9 / _nap_ns)


class held:
    """`with held(): ...` - the GPU waits at this point of the default stream until the block ends."""

    def __init__(self, seconds=HOLD_SECONDS):
        self.seconds = seconds

    def __enter__(self):
        global _ticket
        naps = _naps(self.seconds)
        _ticket += 1
        self.ticket, self.gave_up_before = _ticket, int(_flag[1])
        _hold[1, 1](_flag, self.ticket, naps)
        return self

    def __exit__(self, *exc):
        _flag[0] = self.ticket

    @property
    def gave_up(self):
        """After a synchronize: did the hold time out (the host blocked inside the block)?"""
        return int(_flag[1]) > self.gave_up_before


SYNC_TEST_SECONDS = 0.1  # the hold that tells whether a call synchronises


def synchronises(function):
    """Does a call wait for the GPU itself (a copy to the host, a synchronize)? Then the host blocks
    inside the held block, and the hold gives up."""
    return checked_call(function)[2]


def checked_call(function):
    """One call that `synchronises` holds: (about how many milliseconds the call takes, its output,
    whether it synchronises). compare() makes its checked call this way, so that one call both checks
    a variant and tells how to time it. The milliseconds are the wall clock of the call and a
    synchronize, less the hold's timeout where the call sat in it (then a lower bound): the size of
    the call, for a budget of repeats, not a measurement."""
    cuda.synchronize()
    with held(seconds=SYNC_TEST_SECONDS) as hold:
        start = time.perf_counter()
        output = function()
    cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3
    gave_up = hold.gave_up
    return (max(ms - 1e3 * SYNC_TEST_SECONDS, 0.0) if gave_up else ms), output, gave_up


def time_interleaved(functions, repeats=DEFAULT_REPEATS, flush=False, unheld=(), *, counts=None, host=None):
    """{name: fn} -> {name: per-repeat milliseconds}, fn timed between two CUDA events each repeat.

    The events are recorded on the default stream, where numba launches by default and where torch
    launches unless told otherwise. Each timed call is held (see `held`): the milliseconds are the
    GPU's time for the call, whatever its host cost. Functions named in `unheld` (they synchronise
    themselves, see `synchronises`) are timed without a hold: their time includes host waits.

    counts: {name: repeats} for names that make fewer than `repeats` (slow calls, see compare()):
    they take part in the first rounds only. host: {name: []} for names whose host time is also
    wanted, each list filled with one figure a repeat, in milliseconds: held, the host's time
    inside the hold (a sample of host_cost_us); unheld, the wall clock of the call from an idle GPU
    to a synchronize after it, both outside its events (a sample of latency_us). A held name's list
    is removed if a hold gave up (the host then waited for the GPU inside it).
    """
    counts = {name: min(repeats, (counts or {}).get(name, repeats)) for name in functions}
    host = {} if host is None else host
    if host:
        _naps(HOLD_SECONDS)  # the flag exists: count the holds that give up from here
    gave_up_before = int(_flag[1]) if host else None
    events = {name: [(cuda.event(), cuda.event()) for _ in range(counts[name])] for name in functions}
    for repeat in range(max(counts.values(), default=0)):
        for name, function in functions.items():
            if repeat >= counts[name]:
                continue
            if flush:
                flush_l2()
            start, end = events[name][repeat]
            if name in unheld:
                if name in host:
                    cuda.synchronize()
                    started = time.perf_counter()
                start.record()
                function()
                end.record()
                if name in host:
                    cuda.synchronize()
                    host[name].append((time.perf_counter() - started) * 1e3)
                continue
            with held():
                start.record()
                started = time.perf_counter()
                function()
                queued = time.perf_counter()
                end.record()
            if name in host:
                host[name].append((queued - started) * 1e3)
    cuda.synchronize()
    if host and int(_flag[1]) > gave_up_before:
        for name in [name for name in host if name not in unheld]:
            del host[name]
    return {name: np.array([cuda.event_elapsed_time(s, e) for s, e in pairs])
            for name, pairs in events.items()}


def host_cost_us(function, calls=10, synchronous=False, hold_seconds=HOST_HOLD_SECONDS):
    """Microseconds of CPU per call: `calls` calls queued back to back while the GPU is held (so the
    host never waits for it), synchronised once at the end. A call that cannot be queued that way -
    it synchronises itself, or queues more launches than the driver holds (a loop of hundreds of
    launches) - is timed unheld: the loop's wall time per call, GPU time included."""
    if not synchronous:
        with held(seconds=hold_seconds) as hold:
            start = time.perf_counter()
            for _ in range(calls):
                function()
            elapsed = time.perf_counter() - start
        cuda.synchronize()
        if not hold.gave_up:
            return elapsed / calls * 1e6
    return loop_us(function, calls)


def loop_us(function, calls=20):
    """Wall-clock microseconds per call of `calls` calls back to back, synchronised once at the
    end: host and GPU together, overlapped as they are in a training loop."""
    cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        function()
    cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def latency_us(function, calls=5):
    """Median wall-clock microseconds of one call followed by a synchronize: what `%timeit` sees."""
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        function()
        cuda.synchronize()
        samples.append((time.perf_counter() - start) * 1e6)
    return float(np.median(samples))


def _outputs_in_simulator(function):
    from .simulator import outputs_of

    return outputs_of(function)


def time_once_on_host(function):
    """Wall-clock milliseconds of one call (simulator: for the record only, never for comparison)."""
    start = time.perf_counter()
    output = function()
    cuda.synchronize()
    return (time.perf_counter() - start) * 1e3, output


_ceiling = None


def copy_ceiling():
    """The device-to-device copy rate of this GPU, in GB/s of bytes read + written, measured once.

    Two 512 MiB buffers (10x the L2). cuMemcpyDtoD (what numba's copy_to_device does between device
    arrays) and, if installed, torch's copy_; the faster is the ceiling. None in the simulator.
    """
    global _ceiling
    if _ceiling is not None or not ON_GPU:
        return _ceiling
    n = 2**27
    source = cuda.device_array(n, dtype=np.float32)
    target = cuda.device_array(n, dtype=np.float32)
    _fill[1024, 256](source, 1.0)
    candidates = {"cuMemcpyDtoD": lambda: target.copy_to_device(source)}
    torch = optional_torch()
    if torch is not None:
        t_source, t_target = torch.as_tensor(source, device="cuda"), torch.as_tensor(target, device="cuda")
        candidates["torch copy_"] = lambda: t_target.copy_(t_source)
    for function in candidates.values():
        function()
    times = time_interleaved(candidates, repeats=20)
    rates = {name: 2 * 4 * n / (np.median(ms) * 1e-3) / 1e9 for name, ms in times.items()}
    best = max(rates, key=rates.get)
    _ceiling = {"gbps": rates[best], "how": f"{best}, 2 x 512 MiB", "all": rates}
    return _ceiling


def optional_torch():
    """torch if it is installed and sees the GPU, else None: baselines are never required."""
    if not ON_GPU:
        return None
    try:
        import torch
    except ImportError:
        return None
    return torch if torch.cuda.is_available() else None


def torch_view(device_array):
    """A torch tensor on the same device memory as a numba device array (zero-copy)."""
    torch = optional_torch()
    return None if torch is None else torch.as_tensor(device_array, device="cuda")


HOST_TIMING_MS = 100  # GPU time that host_cost_us and latency_us may take per variant, about
MIN_REPEATS = 3  # a slow variant's fewest repeats: a median and a spread
REPEATS_SECONDS = 3.0  # about how long one variant's repeats may take; a slower call makes fewer
SLOW_CALL_MS = 100.0  # a call this long: host cost and latency from its repeats (module docstring)


def _calls_within(budget_ms, call_ms):
    """Calls of call_ms each that fit budget_ms, at least 2: a call of 60 ms is timed twice on the
    host, not 10 times, where a microsecond's spread would not show in it anyway."""
    return max(2, int(budget_ms / max(call_ms, 1e-3)))


def repeats_within(call_ms, repeats, seconds=None):
    """A variant's repeats: `repeats`, or as many calls of call_ms as fit `seconds` (default
    REPEATS_SECONDS) where fewer, but at least MIN_REPEATS (and never more than asked)."""
    seconds = REPEATS_SECONDS if seconds is None else seconds
    return min(repeats, max(MIN_REPEATS, int(seconds * 1e3 / max(call_ms, 1e-3))))


_kept = {}  # id(function) -> (function, the outputs of its call): warm_up(keep=True)'s, until compare() takes them


def warm_up(functions, keep=()):
    """On a GPU: call each of `functions` (a list, or {name: fn}) once, all at the same time, every
    kernel they launch compiled side by side in worker processes (compile_pool.warm_up; nothing in
    the simulator). keep: the functions among them (True: all) whose call's outputs are kept until
    compare() is given the same function object; compare then poisons and checks those instead of
    calling the function once more for them: a call of seconds made once before its check, beside
    other work."""
    functions = list(functions.values() if isinstance(functions, dict) else functions)
    keep = {id(function) for function in (functions if keep is True else keep)}

    def keeping(function):
        def call():
            _kept[id(function)] = (function, function())
        return call

    calls = [keeping(function) if id(function) in keep else function for function in functions]
    if ON_GPU and len(calls) == 1:  # nothing to compile beside it: called here (compare's background thread)
        try:
            calls[0]()
        except Exception:  # noqa: BLE001  (the caller's own call raises it, where it belongs)
            _kept.pop(id(functions[0]), None)
        return
    _side_by_side(calls)


def _warmed_up(variants):
    """{name: outputs} of the variants called once already: by warm_up(keep=True) before, or here,
    the others side by side (a lone one called as it is)."""
    def take():
        kept = {}
        for name, function in variants.items():
            if _kept.get(id(function), (None,))[0] is function:
                kept[name] = _kept.pop(id(function))[1]
        return kept

    kept = take()
    warm_up([function for name, function in variants.items() if name not in kept], keep=True)
    return {**kept, **take()}


def _check(name, output, reference, check):
    if reference is None:
        return None
    outputs = output if isinstance(output, tuple) else (output,)
    references = reference if isinstance(reference, tuple) else (reference,)
    if len(outputs) != len(references):
        raise ValueError(f"{name} returned {len(outputs)} outputs, the reference has {len(references)}")
    for index, (out, ref) in enumerate(zip(outputs, references)):
        label = name if len(outputs) == 1 else f"{name} output {index}"
        if check is not None:
            check(out, ref, label)
        else:
            assert_close(out, ref, name=label)
    return True


def compare(variants, *, reference=None, baselines=None, bytes=None, flops=None, repeats=None,
            flush=False, check=None, check_baselines=True, poison_outputs=True, title="", seconds=None,
            wall_clock=()):
    """Check, then time, kernels that compute the same thing; see the module docstring.

    Before the checked call, the outputs of the warm-up call are poisoned (see poison()) and the
    function is called again, so a variant that skips elements fails even when it shares its output
    buffer with a variant that wrote them. On a GPU the kernels' warm-up calls are made side by side
    (see warm_up): a variant must give the same result whatever runs beside it. Pass
    poison_outputs=False for functions that work in place on their input (poisoning would destroy
    it) and reset their input themselves: each is then called alone, its first call checked.

    variants, baselines: {name: fn}; fn() launches and returns its output (or a tuple of outputs).
    reference: the expected output(s), or a callable returning them (called once).
    check(out, ref, name): how to compare (default: assert_close); raises on a mismatch.
    bytes, flops: what one call must move and compute, counted by the caller.
    seconds: about how long a slow variant's repeats may take (default REPEATS_SECONDS): more, for
    a ratio of slow calls whose rounds vary (host-bound calls of a second).
    wall_clock: names of variants timed as calls that synchronise are, by their wall clock, whatever
    the test of the checked call says: host-bound calls compared with each other. A call whose host
    takes about SYNC_TEST_SECONDS would otherwise be timed on the host's clock in one run and at its
    GPU time in another, and a ratio of two of them would change its meaning.
    """
    baselines = dict(baselines or {}) if ON_GPU and optional_torch() is not None else {}
    # the kernels' warm-up calls: on a GPU, all at once, their kernels compiled side by side, each
    # one's outputs kept for its check (a call an earlier warm_up(keep=True) made counts); started
    # in the background while this thread computes the reference (the warm-up calls write only
    # their outputs, which no reference reads)
    warming = in_background(_warmed_up, variants) if ON_GPU and poison_outputs else None
    try:
        if callable(reference):
            reference = reference()
    finally:
        kept = warming.result() if warming is not None else {}
    timings, sync_known = [], set()
    for kind, functions in (("kernel", variants), ("baseline", baselines)):
        for name, function in functions.items():
            warmed_up = kind == "kernel" and name in kept
            checking = reference is not None and poison_outputs
            if checking:
                # the outputs this call writes: from the warm-up (which compiles), or in the
                # simulator (nothing to compile here) from a call whose launches are skipped
                if warmed_up:
                    output = kept[name]
                else:
                    output = time_once_on_host(function)[1] if ON_GPU else _outputs_in_simulator(function)
                for out in output if isinstance(output, tuple) else (output,):
                    poison(out)
            if ON_GPU and (checking or warmed_up):  # compiled: the call also says whether it synchronises
                host_ms, output, synchronous = checked_call(function)
                sync_known.add(name)
            else:  # the warm-up if not checked, else the checked call
                (host_ms, output), synchronous = time_once_on_host(function), False
            correct = _check(name, output, reference, check) if (kind == "kernel" or check_baselines) else None
            timings.append(Timing(name, kind, np.array([host_ms]), correct, bytes, flops, synchronises=synchronous))
    meaningful = ON_GPU
    ceiling = None
    if ON_GPU:
        ceiling = copy_ceiling() if bytes else None
        functions = {**variants, **baselines}
        for timing in timings:
            if timing.name in wall_clock:
                timing.synchronises = True
            elif timing.name not in sync_known:
                timing.synchronises = synchronises(functions[timing.name])
        unheld = {t.name for t in timings if t.synchronises}
        once = {t.name: float(t.times_ms[0]) for t in timings}  # the checked call, on the host's clock
        repeats = repeats or DEFAULT_REPEATS
        counts = {name: repeats_within(ms, repeats, seconds) for name, ms in once.items()}
        # slow calls, and calls that wait for the GPU themselves (their host cost is their wall
        # clock, which their unheld repeats measure): host cost and latency from the repeats
        host = {name: [] for name, ms in once.items() if ms >= SLOW_CALL_MS or name in unheld}
        measured = time_interleaved(functions, repeats, flush, unheld, counts=counts, host=host)
        for timing in timings:
            once_ms, function = once[timing.name], functions[timing.name]
            timing.times_ms = measured[timing.name]
            timing.ceiling_gbps = ceiling["gbps"] if ceiling else None
            if timing.name in host:  # slow or synchronising: from its repeats (module docstring)
                timing.host_us = float(np.median(host[timing.name])) * 1e3
                timing.latency_us = timing.host_us if timing.synchronises else latency_us(function, calls=1)
                continue
            calls = min(10, _calls_within(HOST_TIMING_MS, float(np.median(timing.times_ms))))
            timing.host_us = host_cost_us(function, calls=calls, synchronous=timing.synchronises,
                                          hold_seconds=min(HOLD_SECONDS, max(HOST_HOLD_SECONDS, 3 * calls * once_ms / 1e3)))
            timing.latency_us = latency_us(function, calls=min(5, calls))
    return Comparison(title, timings, meaningful, ceiling)
