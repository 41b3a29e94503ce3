"""What a kernel's memory accesses cost, measured in the simulator: no GPU needed.

    from workbook import memtrace
    with memtrace.trace() as t:          # off unless asked for: plain runs keep their speed
        kernel[blocks, threads](x, out)
    t.show()                             # per kernel and source line, like Nsight Compute's source view
    t.kernels()["kernel"]                # the same figures as a dict

The simulator runs every thread, so it sees every access (simulator/watch.py). A GPU does not
serve threads one by one: the 32 lanes of a warp execute a load together, and the memory system
sees one *request* per warp and instruction. The trace groups accesses the same way: the lanes of
one warp at the same point of the kernel (the same bytecode of the same line), the k-th time each
lane got there, form one request.

Global memory moves 32-byte *sectors*. A request costs the distinct sectors its lanes touch:

    x[i], 4-byte floats, lanes 0..31 at i = 0..31      ->  128 bytes in  4 sectors   (4 per request)
    x[32 * i]  (a stride of 32 elements)                ->  32 sectors for 128 useful bytes
    load4(x, 4 * i)  (16 bytes a lane)                  ->  512 bytes in 16 sectors  (16, all used)

Shared memory has 32 banks of 4-byte words. A request takes one pass (a wavefront) per distinct
word that any bank must deliver, the most over the banks; lanes reading the same word share it (a
broadcast). 8- and 16-byte accesses are served a half and a quarter warp per pass. Bank conflicts
are the passes beyond the fewest possible (Nsight Compute's l1tex__data_bank_conflicts_*):

    s[lane] (4 bytes)            32 lanes -> 32 banks            1 pass,  0 conflicts
    s[lane * 32]  (a column)     32 lanes -> bank 0, 32 words   32 passes, 31 conflicts
    s[0]                         32 lanes -> one word            1 pass (broadcast)

Addresses are taken from each array's start, which the model assumes 256-byte aligned, as
cudaMalloc's are; an access's offset in a view counts from its allocation.
"""

import collections
import contextlib

WARP = 32
SECTOR = 32
BANKS = 32
LOAD, STORE = "ld", "st"
GLOBAL, SHARED = "global", "shared"


@contextlib.contextmanager
def trace(lines=False):
    """Record every global and shared access of the kernels launched inside (simulator only);
    lines=True also records which lanes of each warp ran each line (`divergence()`), at a few
    times the cost."""
    import workbook

    if workbook.ON_GPU:
        raise RuntimeError("memtrace.trace() runs in the simulator (WORKBOOK_DEVICE=sim): on a GPU use "
                           "Nsight Compute, whose counters it models")
    from .simulator import watch  # here, not at import: a GPU machine without greenlet imports memtrace too

    recorder = Trace(lines)
    with watch.listening(recorder):
        yield recorder


def measured(case):
    """Nsight Compute's counts of one launch of tools/validate_memtrace.py, as stored with the GPU
    they were measured on: {"global ld sectors": ..., "shared st bank_conflicts": ..., ...}."""
    import json

    from . import results

    stored = json.loads(results.stored_path("memtrace_validation.json").read_text())
    counts = {row["counter"]: row["ncu"] for row in stored["rows"] if row["case"] == case}
    if not counts:
        raise KeyError(f"no stored Nsight Compute counts for {case!r}: run tools/validate_memtrace.py")
    return counts


class Trace:
    """The accesses of the kernels launched while it listened, grouped into warp-level requests."""

    def __init__(self, lines=False):
        self.wants_lines = lines  # scheduler.line_tracer hands this trace every line a thread runs
        self._ran = collections.defaultdict(int)  # (kernel, file, line, block, warp) -> lanes (bits) that ran it
        self._occurrence = collections.Counter()  # (block, thread, code, lasti) -> times reached
        self._roots = {}  # id -> allocation, kept alive so that ids stay unique
        self._requests = {}  # request key -> Request
        self.launches = collections.Counter()  # kernel name -> launches traced
        self.threads = collections.defaultdict(collections.Counter)  # (kernel, block, thread) -> counts

    # -- listener interface (simulator/watch.py) ---------------------------------------------------

    def launch_started(self, number, kernel):
        self.launches[kernel.py_func.__name__] += 1

    def launch_ended(self, number, kernel, failed=False):
        pass

    def access(self, a):
        me = a.thread
        block = me.block
        kernel = block.kernel.__name__
        # Where in the kernel: the line, the array and the direction. (The bytecode offset would
        # split `x[i] + y[i]` better, but Python's specialising interpreter moves it between runs
        # of the same line.) The k-th such access of each lane falls in the k-th request.
        site = (a.code, a.line, id(a.root), a.op)
        occurrence_key = (block.serial, me.thread_id) + site
        occurrence = self._occurrence[occurrence_key]
        self._occurrence[occurrence_key] = occurrence + 1
        self._roots[id(a.root)] = a.root
        key = (block.serial, me.thread_id // WARP, site, occurrence, a.space)
        request = self._requests.get(key)
        if request is None:
            request = self._requests[key] = Request(kernel, a.code.co_filename, a.line, a.space, a.op,
                                                    tuple(block.block_idx), me.thread_id // WARP)
        request.lanes.append((me.lane, id(a.root), a.offset, a.size))
        self.threads[(kernel, tuple(me.blockIdx), tuple(me.threadIdx))][f"{a.space} {a.op}"] += 1

    def line(self, thread, code, line):
        key = (thread.block.kernel.__name__, code.co_filename, line, tuple(thread.block.block_idx),
               thread.thread_id // WARP)
        self._ran[key] |= thread.bit

    # -- what it measured ---------------------------------------------------------------------------

    def divergence(self, kernel=None):
        """{(kernel, file, line): [(block, warp, lanes that ran it, lanes of the warp that ran the
        kernel)]}, for the lines some lanes of a warp ran and others did not: where the warp split.
        Needs trace(lines=True)."""
        if not self.wants_lines:
            raise RuntimeError("divergence needs memtrace.trace(lines=True)")
        live = collections.defaultdict(int)  # (kernel, block, warp) -> lanes that ran any line
        for (name, _, _, block, warp), lanes in self._ran.items():
            live[name, block, warp] |= lanes
        split = {}
        for (name, file, line, block, warp), lanes in sorted(self._ran.items()):
            everyone = live[name, block, warp]
            if (kernel is None or name == kernel) and lanes != everyone:
                split.setdefault((name, file, line), []).append((block, warp, bin(lanes).count("1"),
                                                                  bin(everyone).count("1")))
        return split

    def requests(self, kernel=None):
        return [r for r in self._requests.values() if kernel is None or r.kernel == kernel]

    def lines(self, kernel=None):
        """{(kernel, file, line, space, op): Totals} - the source view."""
        totals = {}
        for r in self.requests(kernel):
            key = (r.kernel, r.file, r.line, r.space, r.op)
            totals.setdefault(key, Totals()).add(r)
        return dict(sorted(totals.items(), key=lambda item: (item[0][0], item[0][2], item[0][3], item[0][4])))

    def kernels(self):
        """{kernel: {"global ld": Totals, "global st": ..., "shared ld": ..., "shared st": ...}}."""
        result = {}
        for r in self._requests.values():
            result.setdefault(r.kernel, {}).setdefault(f"{r.space} {r.op}", Totals()).add(r)
        return result

    def per_thread(self, kernel):
        """{(block, thread): Counter({"global ld": n, ...})} for one kernel."""
        return {(b, t): counts for (k, b, t), counts in self.threads.items() if k == kernel}

    def show(self, console=None, kernel=None):
        """Print the source view: per kernel and line, requests, sectors per request, efficiency,
        shared-memory wavefronts and bank conflicts; with trace(lines=True), the lines where warps split."""
        from rich.table import Table

        from . import tables

        console = console or tables.console()
        for name, spaces in self.kernels().items():
            if kernel is not None and name != kernel:
                continue
            table = Table(title=f"{name}: {self.launches[name]} launch(es), memory as the simulator traced it",
                          title_justify="left")
            for column in ("line", "access", "requests", "sectors/req", "bytes used/moved", "bank confl."):
                table.add_column(column, justify="left" if column in ("line", "access") else "right")
            for (k, file, line, space, op), totals in self.lines(name).items():
                table.add_row(f"{file.rsplit('/', 1)[-1]}:{line}", f"{space} {op}", str(totals.requests),
                              *totals.cells())
            for label, totals in sorted(spaces.items()):
                table.add_row("[bold]all", label, str(totals.requests), *totals.cells())
            console.print(table)
            if self.wants_lines:
                self._show_divergence(console, name)

    def _show_divergence(self, console, kernel):
        from rich.table import Table

        split = self.divergence(kernel)
        if not split:
            console.print(f"{kernel}: every warp ran every line with all its lanes (no divergence)")
            return
        table = Table(title=f"{kernel}: lines some lanes of a warp skipped", title_justify="left")
        for column in ("line", "warps split", "lanes that ran it (of the warp's)", "first such warp"):
            table.add_column(column)
        for (_, file, line), warps in split.items():
            ran = sorted({f"{r}/{of}" for _, _, r, of in warps})
            block, warp, _, _ = warps[0]
            table.add_row(f"{file.rsplit('/', 1)[-1]}:{line}", str(len(warps)), ", ".join(ran[:4])
                          + (" ..." if len(ran) > 4 else ""), f"block {block}, warp {warp}")
        console.print(table)


    def draw(self, kernel, line=None, space=GLOBAL, op=LOAD, axes=None):
        """A picture of one request (the first of `kernel`'s at `line`, or at any line): which
        lane touched which address, and what that costs. Global memory: the 32-byte sectors moved,
        shaded, and the bytes used in them. Shared memory: each lane's bank, the words of a bank
        that needs more than one pass marked red."""
        import matplotlib.pyplot as plt

        request = min((r for r in self.requests(kernel) if r.space == space and r.op == op
                       and (line is None or r.line == line)), key=lambda r: (r.block[::-1], r.warp), default=None)
        if request is None:
            raise LookupError(f"no {space} {op} request of {kernel!r}" + (f" at line {line}" if line else ""))
        if axes is None:
            _, axes = plt.subplots(figsize=(9, 3.2))
        lanes = sorted(request.lanes)
        first = min(offset for _, _, offset, _ in lanes)
        if space == GLOBAL:
            for _, sector in sorted(request.sectors()):
                axes.axvspan(sector * SECTOR - first, (sector + 1) * SECTOR - first, color="0.85", lw=0)
                axes.axvline(sector * SECTOR - first, color="0.6", lw=0.5)
            for lane, _, offset, size in lanes:
                axes.plot([offset - first, offset - first + size], [lane, lane], color="C0", lw=3,
                          solid_capstyle="butt")
            axes.set_xlabel(f"byte address from {first} (grey: the {len(request.sectors())} sectors moved)")
            totals = Totals()
            totals.add(request)
            title = f"{len(request.sectors())} sectors for {totals.requested} bytes used ({totals.efficiency:.0%})"
        else:
            passes, fewest = request.wavefronts()
            banks = collections.defaultdict(set)  # bank -> distinct words asked of it
            for _, root, offset, _ in lanes:
                banks[offset // 4 % BANKS].add((root, offset // 4))
            for lane, _, offset, _ in lanes:
                bank = offset // 4 % BANKS
                axes.scatter([bank], [lane], color="C3" if len(banks[bank]) > 1 else "C0", s=18)
            axes.set_xlim(-1, BANKS)
            axes.set_xlabel("bank (red: a bank asked for more than one word: a conflict)")
            title = f"{passes} pass(es), {passes - fewest} more than the fewest"
        axes.set_ylabel("lane")
        axes.figure.tight_layout()
        axes.set_title(f"{kernel}, {request.file.rsplit('/', 1)[-1]}:{request.line} ({space} {op}), "
                       f"block {request.block}, warp {request.warp}: {title}", fontsize=9)
        return axes.figure


class Request:
    """One warp-level access: the lanes of one warp at one point of the kernel, one time."""

    __slots__ = ("kernel", "file", "line", "space", "op", "block", "warp", "lanes")

    def __init__(self, kernel, file, line, space, op, block, warp):
        self.kernel, self.file, self.line, self.space, self.op = kernel, file, line, space, op
        self.block, self.warp = block, warp
        self.lanes = []  # (lane, allocation id, byte offset, bytes)

    @property
    def bytes_requested(self):
        return sum(size for _, _, _, size in self.lanes)

    def sectors(self):
        """The distinct 32-byte sectors the lanes touch: what global memory moves for the request."""
        return {(root, sector) for _, root, offset, size in self.lanes
                for sector in range(offset // SECTOR, (offset + size - 1) // SECTOR + 1)}

    def wavefronts(self):
        """(passes, fewest passes) of a shared-memory request: see the module's docstring."""
        width = max(size for _, _, _, size in self.lanes)
        per_pass = WARP * 4 // max(4, width)  # lanes served together: 32, 16 (8 B) or 8 (16 B)
        phases = collections.defaultdict(lambda: collections.defaultdict(set))  # phase -> bank -> words
        for lane, root, offset, size in self.lanes:
            for word in range(offset // 4, (offset + max(size, 1) - 1) // 4 + 1):
                phases[lane // per_pass][word % BANKS].add((root, word))
        passes = sum(max(len(words) for words in banks.values()) for banks in phases.values())
        return passes, len(phases)


class Totals:
    """Requests added up: a line's or a kernel's."""

    def __init__(self):
        self.requests = self.sectors = self.requested = 0
        self.passes = self.fewest = 0
        self.space = None

    def add(self, request):
        self.space = request.space
        self.requests += 1
        self.requested += request.bytes_requested
        if request.space == GLOBAL:
            self.sectors += len(request.sectors())
        else:
            passes, fewest = request.wavefronts()
            self.passes += passes
            self.fewest += fewest

    @property
    def sectors_per_request(self):
        return self.sectors / self.requests if self.requests else 0.0

    @property
    def moved(self):
        return self.sectors * SECTOR

    @property
    def efficiency(self):
        """Bytes the lanes asked for over bytes moved (global memory)."""
        return min(1.0, self.requested / self.moved) if self.moved else None

    @property
    def conflicts(self):
        """Shared memory: passes beyond the fewest (Nsight Compute's bank conflicts)."""
        return self.passes - self.fewest

    def cells(self):
        if self.space == GLOBAL:
            return (f"{self.sectors_per_request:.1f}", f"{self.requested}/{self.moved} ({self.efficiency:.0%})", "-")
        return ("-", f"{self.requested} B", f"{self.conflicts} ({self.passes / self.requests:.1f} passes/req)")

    def as_dict(self):
        if self.space == GLOBAL:
            return {"requests": self.requests, "sectors": self.sectors,
                    "sectors_per_request": round(self.sectors_per_request, 3),
                    "bytes_requested": self.requested, "bytes_moved": self.moved}
        return {"requests": self.requests, "wavefronts": self.passes, "bank_conflicts": self.conflicts,
                "bytes_requested": self.requested}
