"""Running chapters headless (a notebook through nbconvert, or its paired script), timing each,
and keeping a chapter's .ipynb in step with its .py.

A chapter's results JSON gets, beside its `wall` time, where that time went: `cells`, one entry a
code cell (as numbered in the notebook), with its wall-clock seconds and, run as a script on a GPU,
the kernels compiled in it (`compiles`: in this process or side by side in compile_pool's workers)
and the seconds this process spent compiling (`compile_s`: the compiles it waited for one by one;
the workers' run beside each other, and the cell's seconds include the wait for them). A script is
run cell by cell (its `# %%` marks) in one module, as `python script.py` runs it; a notebook's times
are nbclient's, recorded in the executed notebook. Nothing is added to the run but a clock read per
cell and per compile.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import workbook
from workbook import capability, results, tables
from workbook.report import chapter_scripts, summary

def _env():
    return dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(results.ROOT), os.environ.get("PYTHONPATH", "")]))


def _run_one(script, log_path, use_notebook, cells_path):
    if use_notebook:
        notebook = script.with_suffix(".ipynb")
        command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                   "--ExecutePreprocessor.timeout=1800", "--output-dir", str(log_path.parent),
                   str(notebook)]
        with open(log_path, "w") as log:
            code = subprocess.run(command, cwd=script.parent, env=_env(), stdout=log, stderr=subprocess.STDOUT).returncode
        _notebook_cell_times(log_path.parent / notebook.name, cells_path)
        stopped = re.search(r"(?:NotOnThisGPU|This notebook stops here): (.*)", log_path.read_text()) if code else None
        if stopped:  # (nbconvert stops at the exception; the notebook is skipped here, not failed)
            Path(cells_path).write_text(json.dumps([{"cell": None, "skipped": stopped.group(1)}]))
            return 0
        return code
    with open(log_path, "w") as log:  # as _Ahead runs it, without the wait
        return subprocess.run([sys.executable, "-c", _READY, script.name, str(cells_path)], cwd=script.parent,
                              env=_env(), input="go\n", text=True, stdout=log, stderr=subprocess.STDOUT).returncode


# A chapter script's process, started while the previous chapter runs: it imports what every chapter
# imports (seconds of CPU, no GPU work: no context is made), and on a GPU the optional libraries its
# package names in PRELUDE (chapter 11's spconv: seconds of imports) and starts its compile workers
# (compile_pool.start: their imports and first compiles), then waits for "go" on stdin and runs
# the script as `python script.py` would, cell by cell (run_cells). It ends with os._exit once the
# script is done: a process that has recorded a timeline with torch's profiler (workbook.timeline)
# can abort in its native teardown ("free(): invalid pointer", pytorch/pytorch#195207: torch frees
# CUPTI buffers CUPTI still holds), as chapter 08's did on the H100 after printing and storing everything.
_READY = """
import os, sys
import workbook
import workbook.runner
import matplotlib.pyplot, numba.cuda, numpy
if workbook.ON_GPU:
    import importlib
    try:
        import torch
    except ImportError:
        pass
    try:
        prelude = importlib.import_module("chapters." + os.path.basename(os.getcwd())).__dict__.get("PRELUDE", ())
    except ImportError:
        prelude = ()
    for name in prelude:
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    from workbook import compile_pool
    compile_pool.start()  # the compile workers ready, numba's compiler set up: no GPU context
if sys.stdin.readline().strip() != "go":
    sys.exit(0)
script, cells_path = sys.argv[1:3]
sys.argv = [script]
sys.path.insert(0, os.getcwd())
workbook.runner.run_cells(script, cells_path)
for stream in (sys.stdout, sys.stderr):
    stream.flush()
os._exit(0)  # done: no native teardown
"""


class CompileClock:
    """Seconds and count of the outermost kernel compiles in this process while installed
    (numba-cuda's CUDADispatcher.compile; nothing in the simulator, where nothing is compiled here)."""

    def __init__(self):
        self.seconds, self.count, self._depth = 0.0, 0, 0

    def install(self):
        from numba.cuda import dispatcher

        original = getattr(dispatcher.CUDADispatcher, "compile", None)
        if original is None:  # the simulator
            return self
        clock = self

        def compile(self, sig):
            if sig in getattr(self, "overloads", {}) or (
                    getattr(self, "specialized", False) and self.overloads):
                return original(self, sig)
            clock._depth += 1
            started = time.perf_counter()
            try:
                return original(self, sig)
            finally:
                clock._depth -= 1
                if clock._depth == 0:
                    clock.seconds += time.perf_counter() - started
                    clock.count += 1

        dispatcher.CUDADispatcher.compile = compile
        return self


def code_cells(script):
    """[(line of its `# %%` mark, source)] of each code cell of a percent-format script, the source
    padded with blank lines so that compiled it keeps the script's line numbers."""
    current = [0, []]  # before the first mark: run too, where there is code
    cells = [current]
    for number, line in enumerate(Path(script).read_text().splitlines(), 1):
        if line.startswith("# %%"):
            current = None if "[markdown]" in line else [number, [""] * number]
            if current is not None:
                cells.append(current)
        elif current is not None:
            current[1].append(line)
    if not any(line.strip() and not line.lstrip().startswith("#") for line in cells[0][1]):
        cells.pop(0)
    return [(number, "\n".join(source) + "\n") for number, source in cells]


OUTPUT_KEPT = 40_000  # characters of a cell's printed output kept with its results (the book shows them)


class _Tee:
    """sys.stdout for one cell: what it prints goes on to the log, and is kept for the cell's row."""

    def __init__(self, stream):
        self.stream, self.kept = stream, []

    def write(self, text):
        self.kept.append(text)
        return self.stream.write(text)

    def __getattr__(self, name):  # flush, isatty, encoding, fileno: the real stream's
        return getattr(self.stream, name)

    def text(self):
        text = "".join(self.kept)
        return text if len(text) <= OUTPUT_KEPT else text[:OUTPUT_KEPT] + "\n[... cut: the rest is in the chapter's log]\n"


def _figures_now():
    """{name: modification time} of the plots in this run's results folder."""
    return {p.name: p.stat().st_mtime_ns for p in results.device_dir().glob("*.png")}


def run_cells(script, cells_path=None):
    """Run a chapter's script as `python script.py` (runpy.run_path, run_name "__main__") would, one
    code cell at a time, writing each cell's times to cells_path (JSON, after every cell), with what
    it printed (`output`) and the plots it saved (`figures`): a notebook's outputs, for the book."""
    import __future__
    import builtins
    import types

    module = types.ModuleType("__main__")
    module.__dict__.update(__file__=script, __cached__=None, __loader__=None, __spec__=None, __package__="",
                           __builtins__=builtins)
    sys.modules["__main__"] = module
    from workbook import compile_pool

    clock = CompileClock().install()
    everywhere = compile_pool._compiled  # [kernels compiled so far, here or in the pool] once it is installed
    future = 0  # a `from __future__ import` holds for the cells after it, as in the whole script
    features = sum(getattr(__future__, name).compiler_flag for name in __future__.all_feature_names)
    rows = []
    for index, (line, source) in enumerate(code_cells(script)):
        compiling, compiles, all_compiles = clock.seconds, clock.count, everywhere[0]
        started, figures, tee = time.perf_counter(), _figures_now(), _Tee(sys.stdout)
        code = compile(source, script, "exec", flags=future, dont_inherit=True)
        future |= code.co_flags & features
        sys.stdout = tee
        try:
            exec(code, module.__dict__)  # noqa: S102  (the chapter's own code)
        except capability.NotOnThisGPU as why:  # the notebook needs what this GPU lacks: it stops, not fails
            print(f"This notebook stops here: {why}")
            rows.append({"cell": index, "line": line, "skipped": str(why)})
            if cells_path:
                Path(cells_path).write_text(json.dumps(rows))
            return rows
        finally:
            sys.stdout = tee.stream
        row = {"cell": index, "line": line, "seconds": round(time.perf_counter() - started, 2)}
        count = max(clock.count - compiles, everywhere[0] - all_compiles)
        if count:
            row.update(compile_s=round(clock.seconds - compiling, 2), compiles=count)
        first = next((text for text in source.splitlines() if text.strip() and not text.startswith("#")), "")
        saved = sorted(name for name, stamp in _figures_now().items() if figures.get(name) != stamp)
        rows.append({**row, "code": first[:60], "output": tee.text(), **({"figures": saved} if saved else {})})
        if cells_path:
            Path(cells_path).write_text(json.dumps(rows))
    return rows


def _notebook_cell_times(executed, cells_path):
    """Each code cell's seconds from an executed notebook's metadata (nbclient's record_timing)."""
    from datetime import datetime

    try:
        cells = [c for c in json.loads(Path(executed).read_text())["cells"] if c["cell_type"] == "code"]
    except (OSError, ValueError, KeyError):
        return
    rows = []
    for index, cell in enumerate(cells):
        times = cell.get("metadata", {}).get("execution", {})
        if "iopub.execute_input" not in times or "shell.execute_reply" not in times:
            continue
        seconds = (datetime.fromisoformat(times["shell.execute_reply"].replace("Z", "+00:00"))
                   - datetime.fromisoformat(times["iopub.execute_input"].replace("Z", "+00:00"))).total_seconds()
        source = "".join(cell["source"]).splitlines()
        first = next((text for text in source if text.strip() and not text.startswith(("#", "%"))), "")
        rows.append({"cell": index, "seconds": round(seconds, 2), "code": first[:60]})
    Path(cells_path).write_text(json.dumps(rows))


class _Ahead:
    """One chapter's script process, started ahead of its turn (see _READY)."""

    def __init__(self, script, log_path, cells_path):
        self.log = open(log_path, "w")  # noqa: SIM115  (closed in finish())
        self.process = subprocess.Popen([sys.executable, "-c", _READY, script.name, str(cells_path)],
                                        cwd=script.parent, env=_env(), stdin=subprocess.PIPE, stdout=self.log,
                                        stderr=subprocess.STDOUT, text=True)

    def go(self):
        self.process.stdin.write("go\n")
        self.process.stdin.close()

    def finish(self):
        code = self.process.wait()
        self.log.close()
        return code


def _one_after_another(scripts, out_dir, cells_dir):
    """(chapter_id, exit code, seconds) of each script, one at a time, the next one's process
    started (and its imports done) while the previous one runs; the seconds of a chapter run from
    its "go" to its end."""
    items = list(scripts.items())

    def ahead_of(chapter_id, script):
        return _Ahead(script, out_dir / f"{chapter_id}.log", _cells_path(cells_dir, chapter_id))

    ahead = ahead_of(*items[0]) if items else None
    for index, (chapter_id, _) in enumerate(items):
        current = ahead
        started = time.perf_counter()
        current.go()
        if index + 1 < len(items):
            ahead = ahead_of(*items[index + 1])
        code = current.finish()
        yield chapter_id, code, time.perf_counter() - started


def _can_execute_notebooks():
    try:
        import ipykernel  # noqa: F401
        import nbconvert  # noqa: F401
    except ImportError:
        return False
    return True


def default_jobs():
    """Chapters run at once: one on a GPU (their timings must not share it), one per core (up to 4)
    in the simulator, where times mean nothing and each chapter is a single busy Python process."""
    return 1 if workbook.ON_GPU else max(1, min(4, os.cpu_count() or 1))


def run(chapters=(), how="auto", jobs=None):
    """Run the chapters (all by default), `jobs` at a time (default_jobs()), store each one's wall
    time, print the summary; 1 if one failed."""
    from concurrent.futures import ThreadPoolExecutor

    from rich.markup import escape
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    scripts = chapter_scripts(chapters)
    use_notebook = {"notebook": True, "script": False, "auto": _can_execute_notebooks()}[how]
    jobs = jobs or default_jobs()
    out_dir = results.device_dir()
    console = tables.console()
    console.print(f"[bold]workbook run[/]: {len(scripts)} notebook(s) in {workbook.MODE} mode on "
                  f"{results.device_facts()['name']}, as {'notebooks' if use_notebook else 'scripts'}, "
                  f"{jobs} at a time; logs in {out_dir}/")
    failed = []
    run_started = time.perf_counter()
    cells_dir = tempfile.TemporaryDirectory(prefix="workbook-cells-")

    def one(chapter_id, script):
        started = time.perf_counter()
        code = _run_one(script, out_dir / f"{chapter_id}.log", use_notebook, _cells_path(cells_dir.name, chapter_id))
        return code, time.perf_counter() - started

    def in_chapter_order(pool):
        if jobs == 1 and not use_notebook:
            yield from _one_after_another(scripts, out_dir, cells_dir.name)
            return
        running = {chapter_id: pool.submit(one, chapter_id, script) for chapter_id, script in scripts.items()}
        for chapter_id in scripts:
            yield chapter_id, *running[chapter_id].result()

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console) as progress, ThreadPoolExecutor(max_workers=jobs) as pool:
        task = progress.add_task("chapters", total=len(scripts))
        names = [script.stem for script in scripts.values()] + ["done"]
        progress.update(task, description=f"running {names[0]}")
        for index, (chapter_id, code, seconds) in enumerate(in_chapter_order(pool)):  # in chapter order
            script = scripts[chapter_id]
            progress.update(task, description=f"running {names[index + 1]}")
            log_path = out_dir / f"{chapter_id}.log"
            if code == 0:
                _store_wall_time(out_dir / f"{chapter_id}.json", seconds, use_notebook, jobs,
                                 _cells_path(cells_dir.name, chapter_id))
            status = "[green]ok[/]" if code == 0 else f"[red]FAILED (exit {code})[/], see {log_path}"
            skipped = _skipped(_cells_path(cells_dir.name, chapter_id)) if code == 0 else None
            if skipped:
                status = "[yellow]skipped on this GPU[/]"
            progress.console.print(f"{script.stem}: {status} in {seconds:.0f} s"
                                   + _slowest_cells(_cells_path(cells_dir.name, chapter_id)))
            if skipped:
                progress.console.print(f"  {escape(skipped)}", soft_wrap=True)
            if code:
                failed.append(chapter_id)
                progress.console.print("".join(log_path.read_text().splitlines(True)[-25:]))
            progress.advance(task)
    cells_dir.cleanup()
    console.print(f"{len(scripts)} notebook(s) in {time.perf_counter() - run_started:.0f} s")
    summary(console, list(scripts), results.device_facts()["slug"], out_dir.parent)
    if failed:
        console.print(f"[red]failed chapters: {', '.join(failed)}[/]")
        return 1
    return 0


def _cells_path(cells_dir, chapter_id):
    return Path(cells_dir) / f"{chapter_id}.cells.json"


def _skipped(cells_path):
    """Why a notebook stopped short (capability.NotOnThisGPU), or None."""
    try:
        cells = json.loads(Path(cells_path).read_text())
    except (OSError, ValueError):
        return None
    return next((cell["skipped"] for cell in cells if "skipped" in cell), None)


def _slowest_cells(cells_path, count=3):
    """'; slowest cells: 9 31 s (12 compiles), ...' from a chapter's cell times, or '' without them."""
    try:
        cells = json.loads(Path(cells_path).read_text())
    except (OSError, ValueError):
        return ""
    slowest = sorted((cell for cell in cells if "seconds" in cell), key=lambda cell: -cell["seconds"])[:count]
    return "; slowest cells: " + ", ".join(
        f"{cell['cell']} {cell['seconds']:.0f} s" + (f" ({cell['compiles']} compiles)" if cell.get("compiles") else "")
        for cell in slowest)


def _store_wall_time(path, seconds, as_notebook, jobs=1, cells_path=None):
    """Keep how long the chapter took, start to end (beside `jobs` - 1 others; one at a time, from
    its "go": its process started and imported during the previous chapter), with its results, and
    beside it each code cell's time, where the run recorded them (see the module docstring)."""
    if not path.exists():
        return
    record = json.loads(path.read_text())
    record["wall"] = {"seconds": round(seconds, 1), "as": "notebook" if as_notebook else "script",
                      "cpus": os.cpu_count(), "chapters at once": jobs}
    record.pop("cells", None)
    if cells_path is not None and Path(cells_path).exists():
        record["cells"] = json.loads(Path(cells_path).read_text())
    path.write_text(json.dumps(record, indent=1) + "\n")


def notebooks(chapters=(), check=False):
    """Write each chapter's .ipynb from its .py where they differ (check=True: only list those); 1 if stale."""
    import jupytext

    stale = []
    for script in chapter_scripts(chapters).values():
        notebook_path = script.with_suffix(".ipynb")
        notebook = jupytext.read(script)
        text = jupytext.writes(notebook, fmt="ipynb")
        current = notebook_path.exists() and _cells(notebook_path.read_text()) == _cells(text)
        if check:
            if not current:
                stale.append(str(notebook_path.relative_to(results.ROOT)))
        elif not current:  # unchanged notebooks keep their cell ids: no noise in git
            notebook_path.write_text(text)
            print(f"wrote {notebook_path.relative_to(results.ROOT)}")
    if stale:
        print("out of date (run `python -m workbook notebooks`): " + ", ".join(stale))
        return 1
    return 0


def _cells(ipynb_text):
    return [(c["cell_type"], "".join(c["source"])) for c in json.loads(ipynb_text)["cells"]]


