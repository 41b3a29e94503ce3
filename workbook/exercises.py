"""Exercises: a stub the student fills in, a check that says what is wrong, a solution that cannot drift.

A chapter with exercises has three more files beside its kernels:

    exercises.py   what the student edits. Each exercise's code sits between two markers:
                       # >>> ch01.2 (stub 3f9c0a1b)
                       raise NotImplementedError("ch01.2: ...")
                       # <<< ch01.2
    solutions.py   the same file, every region answered; it ends with PLANTED_WRONG_ANSWERS,
                   edits of the answers that each check must reject (so no check is vacuous)
    checks.py      EXERCISES: for each exercise its title, kind, and the check that runs it

The number in the opening marker is a fingerprint of the stub as shipped: a region that still has
it is "not attempted". Outside the regions the two files are identical, which a test enforces, so
exercises, solutions and checks never drift apart. A handout (`python -m workbook handout DIR`) is
the workbook without solutions.py.

    status          meaning
    not attempted   the region is still the stub
    wrong           the check failed: the checker's message says where (element, block, thread, bit)
    correct         the check passed (in the simulator, or on a GPU with no speed target)
    fast enough     on a GPU, the speed target met (a ratio to the chapter's kernel, same run)
    too slow        correct but under the speed target (on a GPU, a time; in the simulator, the
                    memory traffic); or, in the simulator, correct values from kernels that read
                    and write more than WASTE_LIMIT times the bytes of the reference answer on
                    the same check (EXERCISE_TRAFFIC; wasted_work): work done more than once
"""

import contextlib
import hashlib
import importlib
import importlib.util
import os
import re
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from . import ON_GPU, tables
from .check import poisoned  # noqa: F401  (the chapters' checks import it from here)
from .check import CheckError

CHAPTERS = Path(__file__).resolve().parent.parent / "chapters"
OPEN = re.compile(r"^(?P<indent>\s*)# >>> (?P<id>ch\d\d\.\d+) \(stub (?P<stub>[0-9a-f]{8})\)\s*$")
CLOSE = re.compile(r"^\s*# <<< (?P<id>ch\d\d\.\d+)\s*$")
PLANTED = "PLANTED_WRONG_ANSWERS"

NOT_ATTEMPTED, WRONG, CORRECT, FAST, SLOW = "not attempted", "wrong", "correct", "fast enough", "too slow"
PASSING = (CORRECT, FAST)
KINDS = {
    "complete": "complete a line or an expression",
    "write": "write a kernel from its spec",
    "fix": "find and fix a planted bug",
    "faster": "make a correct kernel faster (judged on a GPU)",
}


@dataclass
class Exercise:
    """One exercise. `check(m)` runs the student's module `m` and raises CheckError if it is wrong.

    speed(m) -> (ratio, what): on a GPU, the student's code against the chapter's kernel in the same
    run (higher is better); `target` is the ratio a "faster" exercise must reach.
    """

    id: str
    title: str
    kind: str
    show: tuple  # names in exercises.py that the notebook shows: the code to edit
    check: object
    speed: object = None
    target: float = None
    # In the simulator the check runs again with the kernels on these grids (simulator.GRIDS): every
    # kernel must leave threads past its data idle and take its block size from the launch; a
    # grid-stride loop must also go round one block.
    grids: tuple = ("more blocks", "smaller blocks")
    # The spec asks for coalesced accesses: in the simulator the check runs again under the memory
    # trace, and an answer whose kernels move more than COALESCING_LIMIT times the reference answer's
    # 32-byte sectors per byte used is too slow (lanes far apart: right values, many times the traffic).
    coalesced: bool = False
    # What the check's data must cover (workbook/check_data.py): {what the spec fixes: why} is exempt
    # from the classes ("kernel argument 2", "kernel argument 0 axis 1", "kernel warp residues");
    # {(kernel, argument, axis): tile} an axis a tiled loop steps along, every residue of which is tried.
    fixed: dict = field(default_factory=dict)
    tiles: dict = field(default_factory=dict)
    chapter: str = field(default="", init=False)

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"{self.id}: kind must be one of {sorted(KINDS)}, not {self.kind!r}")
        if self.kind == "faster" and (self.speed is None or self.target is None):
            raise ValueError(f"{self.id}: a 'faster' exercise needs speed= and target=")
        self.show = (self.show,) if isinstance(self.show, str) else tuple(self.show)
        self.chapter = self.id.split(".")[0]


@dataclass
class Result:
    exercise: Exercise
    status: str
    message: str = ""
    ratio: float = None
    traffic: dict = None  # in the simulator: the bytes each launch of the answer's kernels moved (_Traffic.summary)

    @property
    def passed(self):
        return self.status in PASSING

    def line(self):
        text = f"{self.exercise.id} {self.exercise.title}: {self.status}"
        if self.ratio is not None:
            text += f" ({self.ratio:.2f} of the chapter's kernel" + (
                f", target {self.exercise.target:g})" if self.exercise.target else ")")
        return text + (f"\n{self.message}" if self.message else "")


# ---------------------------------------------------------------------------------------------
# Regions and fingerprints


def fingerprint(code):
    """8 hex digits of the region's code, blank lines and trailing spaces ignored."""
    lines = [line.rstrip() for line in code.splitlines() if line.strip()]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:8]


@dataclass
class Region:
    id: str
    stub: str  # the fingerprint in the marker
    code: str  # the lines between the markers
    start: int  # line index of the opening marker

    @property
    def untouched(self):
        return fingerprint(self.code) == self.stub


def regions(text):
    """Every marked region of a file, in order. Raises ValueError on unbalanced markers."""
    found, lines, current = [], text.splitlines(keepends=True), None
    for number, line in enumerate(lines):
        opened, closed = OPEN.match(line), CLOSE.match(line)
        if opened:
            if current:
                raise ValueError(f"line {number + 1}: region {opened['id']} opens inside {current.id}")
            current = Region(opened["id"], opened["stub"], "", number)
        elif closed:
            if not current or closed["id"] != current.id:
                raise ValueError(f"line {number + 1}: '# <<< {closed['id']}' closes no open region")
            found.append(current)
            current = None
        elif current:
            current.code += line
    if current:
        raise ValueError(f"region {current.id} is never closed ('# <<< {current.id}')")
    return found


def skeleton(text):
    """The file with every region emptied, its docstring and its planted wrong answers removed:
    what exercises.py and solutions.py must share."""
    kept, inside = [], False
    for line in _without_docstring(text).splitlines():
        if line.startswith((PLANTED, "# Planted wrong answers")):
            break
        if OPEN.match(line):
            kept.append(line)
            inside = True
        elif CLOSE.match(line):
            kept.append(line)
            inside = False
        elif not inside:
            kept.append(line.rstrip())
    while kept and not kept[-1]:
        kept.pop()
    return "\n".join(kept)


def _without_docstring(text):
    match = re.match(r'\s*(""".*?""")\s*\n', text, re.S)
    return text[match.end():] if match else text


def replace_region(text, exercise_id, code):
    """text with the code of every region of `exercise_id` replaced by `code`."""
    lines, out, inside = text.splitlines(keepends=True), [], False
    for line in lines:
        opened, closed = OPEN.match(line), CLOSE.match(line)
        if opened and opened["id"] == exercise_id:
            out.append(line)
            out.append(code)
            inside = True
        elif closed and closed["id"] == exercise_id:
            out.append(line)
            inside = False
        elif not inside:
            out.append(line)
    return "".join(out)


def stamp(text):
    """exercises.py with every marker's fingerprint recomputed from its stub (maintainers only)."""
    out, current = [], None
    lines = text.splitlines(keepends=True)
    spans = {r.start: r for r in regions(text)}
    for number, line in enumerate(lines):
        if number in spans:
            current = spans[number]
            line = re.sub(r"\(stub [0-9a-f]{8}\)", f"(stub {fingerprint(current.code)})", line)
        out.append(line)
    return "".join(out)


# ---------------------------------------------------------------------------------------------
# Finding and loading


def chapters():
    """{chapter id: folder} of every chapter that has exercises, in order."""
    return {folder.name[:4]: folder for folder in sorted(CHAPTERS.glob("ch[0-9][0-9]_*"))
            if (folder / "checks.py").exists() and (folder / "exercises.py").exists()}


def all_exercises(wanted=()):
    """Every Exercise of every chapter (or of the chapters in `wanted`), in order."""
    found = []
    for chapter_id, folder in chapters().items():
        if wanted and chapter_id not in wanted and folder.name not in wanted:
            continue
        checks = importlib.import_module(f"chapters.{folder.name}.checks")
        found.extend(checks.EXERCISES)
    return found


def module_path(exercise_or_chapter, which):
    chapter_id = getattr(exercise_or_chapter, "chapter", exercise_or_chapter)
    return chapters()[chapter_id] / f"{which}.py"


def load(chapter_id, which="exercises"):
    """The chapter's exercises or solutions module (imported once; autoreload picks up edits)."""
    return importlib.import_module(f"chapters.{chapters()[chapter_id].name}.{which}")


def has_solutions(chapter_id):
    return module_path(chapter_id, "solutions").exists()


_variants = 0


def load_source(text, directory, label):
    """Import `text` as a fresh module from a file in `directory` (numba needs a real file to read
    kernels' source in the simulator and to name lines in errors)."""
    global _variants
    _variants += 1
    name = f"_exercise_variant_{_variants}_{re.sub(r'[^0-9A-Za-z]', '_', label)}"
    path = Path(directory) / f"{name}.py"
    path.write_text(text)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def right_on_a_gpu(exercise):
    """[(old, new), ...]: edits of the solution's region that are right on a GPU, which its check
    must grade correct (solutions.py's RIGHT_ON_A_GPU, kept there: they are pieces of the answer)."""
    solutions = load(exercise.chapter, "solutions")
    return getattr(solutions, "RIGHT_ON_A_GPU", {}).get(exercise.id, [])


def planted_wrong_answers(exercise):
    """[(old, new), ...]: edits of the solution's region that its check must reject; (old, new,
    "simulator"): one that only the simulator reveals, on its extra grids (exercises.Exercise.grids)
    or by the bytes it moves (wasted_work)."""
    solutions = load(exercise.chapter, "solutions")
    return getattr(solutions, PLANTED).get(exercise.id, [])


# ---------------------------------------------------------------------------------------------
# Running a check


def _message(error):
    """What a student should read: the checker's text, or the last frames of anything else."""
    name = type(error).__name__
    if isinstance(error, CheckError):
        return str(error)
    if isinstance(error, NotImplementedError):
        return f"NotImplementedError: {error}"
    if name == "StrictModeError":
        return f"not what a GPU guarantees (strict simulator):\n{error}"
    if name in ("RaceError", "UninitializedReadError"):
        return f"not what a GPU guarantees (sanitizer):\n{error}"
    if name == "KernelTimeoutError":
        return f"stopped (on a GPU this launch would hang):\n{error}"
    if name == "WarpDeadlockError":
        return f"warp deadlock (on a GPU this launch would hang):\n{error}"
    if name == "GPUCompileError":
        return str(error)
    if isinstance(error, IndexError) and getattr(error, "names_thread", False):
        return f"out of bounds (memcheck):\n{error}"
    frames = traceback.format_exception(type(error), error, error.__traceback__, limit=-3)
    return "".join(frames).rstrip()


def _wrong_on_another_grid(exercise, module):
    """In the simulator: the check again with the module's kernels on each of exercise.grids, so that
    an answer right only for the grid its wrapper picks is not graded correct. The message, or None."""
    if ON_GPU or not exercise.grids:
        return None
    from .simulator import GRIDS, EnoughLaunches, regridded

    for how in exercise.grids:
        try:  # the geometry only (no sanitizer), on the check's first launches (its small, awkward sizes)
            with strict_simulator(sanitize=False), regridded(module.__name__, how, launches=REGRIDDED_LAUNCHES):
                exercise.check(module)
        except EnoughLaunches:
            pass
        except Exception as error:  # noqa: BLE001
            return f"right on the wrapper's grid, wrong on {GRIDS[how]}:\n{_message(error)}"
    return None


REGRIDDED_LAUNCHES = 8  # launches of the student's kernels tried on each other grid


def order_seed(exercise):
    """The seed of the thread order an exercise is checked in again (the same at every grading)."""
    import zlib

    return 1 + zlib.crc32(exercise.id.encode()) % 997


def _wrong_in_another_order(exercise, module):
    """In the simulator: the check again with every block's threads in another order, switching at
    global accesses and atomics (simulator/interleave.py, seeded), so that an answer right only in the
    simulator's default order (a plain read racing an atomic, data published before it is written) is
    not graded correct. The message, or None."""
    if ON_GPU:
        return None
    from .simulator.interleave import ENV, interleaved

    seed = order_seed(exercise)
    try:
        with strict_simulator(sanitize=False), interleaved(seed):
            exercise.check(module)
    except Exception as error:  # noqa: BLE001
        return (f"right in the simulator's usual thread order, wrong in another (threads shuffled and switched "
                f"at global accesses and atomics, as a GPU may run them; {ENV}={seed} runs every launch in "
                f"that order):\n{_message(error)}")
    return None

WASTE_LIMIT = 1.5  # bytes an answer's kernels may move, as a multiple of the reference answer's (wasted_work)
EXERCISE_TRAFFIC = CHAPTERS / "exercise_traffic.json"  # {exercise: _Traffic.summary()}: `exercises --store-traffic`


def reference_traffic():
    """{exercise id: the bytes each launch of the reference answer's kernels reads and writes in its check,
    global and shared memory apart, in the simulator}, as stored (a handout has no solutions.py, but has this)."""
    import json

    return json.loads(EXERCISE_TRAFFIC.read_text()) if EXERCISE_TRAFFIC.exists() else {}


def launched_by(module_name, kernel, frame):
    """Is `kernel` one of module `module_name`'s, or launched from that module's code (a wrapper that
    calls a chapter's GEMM)? `frame`: the launch's, walked outward."""
    if getattr(kernel.fn, "__module__", None) == module_name:
        return True
    while frame is not None:
        if frame.f_globals.get("__name__") == module_name:
            return True
        frame = frame.f_back
    return False


class _Traffic:
    """A simulator listener (simulator/watch.py): the global- and shared-memory bytes each launch of one
    module's kernels reads and writes, and of any kernel that module's code launches (a wrapper that
    calls a chapter's GEMM twice pays for both)."""

    def __init__(self, module_name):
        self.module, self._counting = module_name, False
        self.kernels, self.global_bytes, self.shared_bytes = [], [], []  # one entry per launch

    def launch_started(self, number, kernel):
        self._counting = launched_by(self.module, kernel, sys._getframe(1))
        if self._counting:
            self.kernels.append(kernel.fn.__name__)
            self.global_bytes.append(0)
            self.shared_bytes.append(0)

    def launch_ended(self, number, kernel, failed=False):
        self._counting = False

    def count(self, space, size):  # (watch.report: bytes only, no Access built)
        if self._counting:
            if space == "global":
                self.global_bytes[-1] += size
            elif space == "shared":
                self.shared_bytes[-1] += size

    def summary(self):
        if not self.kernels:
            return None
        return {"kernels": self.kernels, "global": self.global_bytes, "shared": self.shared_bytes}


def wasted_work(mine, reference):
    """Why an answer's kernels did work more than once, or None. Measured against the reference
    answer's kernels on the same check: more than WASTE_LIMIT times its global-memory bytes in all;
    or, launch by launch where the reference stages data in shared memory (a tiled loop), more than
    WASTE_LIMIT times its global and shared bytes together (an extra step of zeros moves no global
    bytes, but a tile's worth of shared ones)."""
    if not (mine and reference):  # on a GPU nothing is counted: a time judges speed there
        return None
    total, reference_total = sum(mine["global"]), sum(reference["global"])
    if reference_total and total > WASTE_LIMIT * reference_total:
        return (f"right values, but your kernels read and wrote {total / reference_total:.1f}x the global-memory "
                f"bytes the reference answer does on the same check ({total:,} against {reference_total:,}; "
                "counted in the simulator): work done more than once? (a grid-stride loop that strides by "
                "less than the grid, threads that each redo the whole array)")
    launches = len(reference["global"])
    if len(mine["global"]) != launches:
        return None
    for i in range(launches):
        if not reference["shared"][i]:
            continue
        moved = mine["global"][i] + mine["shared"][i]
        expected = reference["global"][i] + reference["shared"][i]
        if moved > WASTE_LIMIT * expected:
            return (f"right values, but launch {i + 1} of {launches} ({mine['kernels'][i]}) read and wrote "
                    f"{moved / expected:.1f}x the global- and shared-memory bytes of the reference answer's same "
                    f"launch ({moved:,} against {expected:,}; counted in the simulator): work done more than "
                    "once? (a loop step that adds only zeros, a tile staged twice)")
    return None


COALESCING_LIMIT = 2.0  # sectors moved per byte used, as a multiple of the reference answer's


def _sectors(exercise, module, kernels):
    """The check again under the memory trace (simulator/memtrace): the global-memory bytes the
    module's kernels asked for and the 32-byte sectors' bytes their warps' requests moved."""
    from . import memtrace

    with strict_simulator(sanitize=False), memtrace.trace() as traced:
        exercise.check(module)
    totals = [t for name, spaces in traced.kernels().items() if name in kernels
              for space, t in spaces.items() if space.startswith("global")]
    return {"requested": sum(t.requested for t in totals), "moved": sum(t.moved for t in totals)}


def uncoalesced(mine, reference):
    """Why an answer's accesses are scattered, or None: its global requests moved more than
    COALESCING_LIMIT times the sectors per byte used that the reference answer's did on the same check."""
    if not (reference and reference.get("requested") and mine.get("requested")):
        return None
    ours, theirs = mine["moved"] / mine["requested"], reference["moved"] / reference["requested"]
    if ours <= COALESCING_LIMIT * theirs:
        return None
    return (f"right values, but your kernels' warps moved {ours:.1f} bytes of 32-byte sectors for each byte they "
            f"used, where the reference answer's move {theirs:.1f} ({mine['moved']:,} bytes moved for "
            f"{mine['requested']:,} used; traced in the simulator): lanes of a warp far apart in memory? A warp's "
            "32 lanes should touch neighbouring words (coalesced), as the spec asks")


def _listening(listener):
    if ON_GPU:
        return contextlib.nullcontext()
    from .simulator import watch

    return watch.listening(listener)


@contextlib.contextmanager
def strict_simulator(sanitize=True):
    """Checks run the simulator strictly: a shuffle that reads a lane which did not take part, or a
    collective whose mask leaves out its caller, is an error naming the lanes (undefined on a GPU,
    where it reads garbage), not a quietly wrong value; and sanitized (simulator/sanitizer.py): a
    race or a read of unwritten shared memory is named with both threads and lines. Nothing
    changes on a GPU."""
    if ON_GPU:
        yield
        return
    from .simulator import STRICT_ENV, Sanitizer, sanitizing

    before = os.environ.get(STRICT_ENV)
    os.environ[STRICT_ENV] = "1"
    try:
        with sanitizing(Sanitizer.BUDGET) if sanitize else contextlib.nullcontext():
            yield
    finally:
        if before is None:
            del os.environ[STRICT_ENV]
        else:
            os.environ[STRICT_ENV] = before


def evaluate(exercise, module):
    """Result of one exercise against a module (the student's exercises.py, or solutions.py)."""
    source = Path(module.__file__).read_text()
    mine = [r for r in regions(source) if r.id == exercise.id]
    if not mine:
        return Result(exercise, WRONG, f"no region '# >>> {exercise.id}' in {Path(module.__file__).name}")
    if all(r.untouched for r in mine):
        if exercise.kind != "fix":
            return Result(exercise, NOT_ATTEMPTED)
        try:  # the planted bug is where the student starts: show what the check says of it
            with warnings.catch_warnings():  # (NumPy's complaints about the bug's NaNs are noise here)
                warnings.simplefilter("ignore", RuntimeWarning)
                exercise.check(module)
        except Exception as error:  # noqa: BLE001
            return Result(exercise, NOT_ATTEMPTED, "what the check says of the planted bug:\n" + _message(error))
        return Result(exercise, NOT_ATTEMPTED)
    traffic = _Traffic(module.__name__)
    try:
        with strict_simulator(), _listening(traffic):
            exercise.check(module)
    except Exception as error:  # noqa: BLE001  (whatever the student's code raises is the answer)
        return Result(exercise, WRONG, _message(error))
    wrong = _wrong_on_another_grid(exercise, module) or _wrong_in_another_order(exercise, module)
    if wrong:
        return Result(exercise, WRONG, wrong)
    if exercise.speed is None:
        mine = traffic.summary()
        reference = reference_traffic().get(exercise.id)
        waste = wasted_work(mine, reference)
        if waste:
            return Result(exercise, SLOW, waste, traffic=mine)
        if exercise.coalesced and mine:
            mine.update(_sectors(exercise, module, set(mine["kernels"])))
            scattered = uncoalesced(mine, reference)
            if scattered:
                return Result(exercise, SLOW, scattered, traffic=mine)
        return Result(exercise, CORRECT, traffic=mine)
    ratio, what = exercise.speed(module)
    if not ON_GPU:
        what += " (in the simulator: the global-memory sectors both move, traced; not a time)"
    if exercise.target is None:
        return Result(exercise, CORRECT, what, ratio)
    status = FAST if ratio >= exercise.target else SLOW
    return Result(exercise, status, what, ratio)


def show(exercise_id, run=True):
    """For a notebook cell: the exercise's spec and code as it stands in exercises.py, then its status."""
    from . import show as show_source

    exercise = next(e for e in all_exercises((exercise_id.split(".")[0],)) if e.id == exercise_id)
    module = load(exercise.chapter)
    print(f"Exercise {exercise.id} ({KINDS[exercise.kind]}): {exercise.title}\n"
          f"Edit chapters/{module_path(exercise, 'exercises').parent.name}/exercises.py between "
          f"'# >>> {exercise.id}' and '# <<< {exercise.id}'.")
    for name in exercise.show:
        show_source(getattr(module, name))
    if run:
        result = evaluate(exercise, module)
        print(("PASS  " if result.passed else "----  ") + result.line())


# ---------------------------------------------------------------------------------------------
# The progress table


def progress_rows(results):
    return [(r.exercise.chapter, r.exercise.id, r.exercise.title, r.exercise.kind, r.status,
             "" if r.ratio is None else f"{r.ratio:.2f}") for r in results]


def print_progress(rows, console=None, title="Exercises"):
    """rows: (chapter, id, title, kind, status, ratio) tuples."""
    from rich.table import Table

    colour = {NOT_ATTEMPTED: "dim", WRONG: "red", CORRECT: "green", FAST: "green", SLOW: "yellow"}
    table = Table(title=title)
    for column in ("chapter", "exercise", "title", "kind", "status", "vs chapter"):
        table.add_column(column)
    for chapter, ident, name, kind, status, ratio in rows:
        table.add_row(chapter, ident, name, kind, f"[{colour.get(status, 'red')}]{status}[/]", ratio)
    counts = {}
    for row in rows:
        counts[row[4]] = counts.get(row[4], 0) + 1
    console = console or tables.console()
    console.print(table)
    console.print("  ".join(f"{status}: {count}" for status, count in counts.items()))


# ---------------------------------------------------------------------------------------------
# Helpers for checks.py


def speed_ratio(mine, chapters, repeats=30):
    """On a GPU: the median over interleaved repeats of chapter_ms / mine_ms; 1.0 is as fast as the
    chapter's kernel, 0.5 twice as slow. Both are called once first (compilation excluded).
    In the simulator, where times mean nothing: chapter's / mine's memory traffic, the 32-byte
    sectors of global memory their requests move, traced (workbook.memtrace): a kernel whose warps
    touch 8 times the sectors for the same bytes scores 0.125, whatever a GPU's caches would save."""
    if not ON_GPU:
        return traffic(chapters) / max(1, traffic(mine))
    import numpy as np

    from .bench import time_interleaved

    mine(), chapters()
    times = time_interleaved({"mine": mine, "chapter": chapters}, repeats)
    return float(np.median(times["chapter"] / times["mine"]))


def traffic(call):
    """Global-memory sectors moved by the kernels `call` launches, traced in the simulator."""
    from . import memtrace

    with memtrace.trace() as trace:
        call()
    return sum(totals.sectors for spaces in trace.kernels().values() for what, totals in spaces.items()
               if what.startswith("global"))
