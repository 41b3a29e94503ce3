"""Running chapters headless (a notebook through nbconvert, or its paired script), timing each,
and keeping a chapter's .ipynb in step with its .py."""

import json
import os
import subprocess
import sys
import time

import workbook
from workbook import results, tables
from workbook.report import chapter_scripts, summary

def _env():
    return dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
                PYTHONPATH=os.pathsep.join([str(results.ROOT), os.environ.get("PYTHONPATH", "")]))


def _run_one(script, log_path, use_notebook):
    if use_notebook:
        notebook = script.with_suffix(".ipynb")
        command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                   "--ExecutePreprocessor.timeout=1800", "--output-dir", str(log_path.parent),
                   str(notebook)]
        with open(log_path, "w") as log:
            return subprocess.run(command, cwd=script.parent, env=_env(), stdout=log, stderr=subprocess.STDOUT).returncode
    with open(log_path, "w") as log:  # as _Ahead runs it, without the wait
        return subprocess.run([sys.executable, "-c", _READY, script.name], cwd=script.parent, env=_env(), input="go\n",
                              text=True, stdout=log, stderr=subprocess.STDOUT).returncode


# A chapter script's process, started while the previous chapter runs: it imports what every chapter
# imports (seconds of CPU, no GPU work: no context is made), then waits for "go" on stdin and runs
# the script as `python script.py` would. It ends with os._exit once the script is done: a process
# that has recorded a timeline with torch's profiler (workbook.timeline) can abort in its native
# teardown ("free(): invalid pointer", pytorch/pytorch#195207: torch frees CUPTI buffers CUPTI still
# holds), as chapter 08's did on the H100 after printing and storing everything.
_READY = """
import os, runpy, sys
import workbook
import matplotlib.pyplot, numba.cuda, numpy
if workbook.ON_GPU:
    try:
        import torch
    except ImportError:
        pass
if sys.stdin.readline().strip() != "go":
    sys.exit(0)
sys.argv = sys.argv[1:]
sys.path.insert(0, os.getcwd())
runpy.run_path(sys.argv[0], run_name="__main__")
for stream in (sys.stdout, sys.stderr):
    stream.flush()
os._exit(0)  # done: no native teardown
"""


class _Ahead:
    """One chapter's script process, started ahead of its turn (see _READY)."""

    def __init__(self, script, log_path):
        self.log = open(log_path, "w")  # noqa: SIM115  (closed in finish())
        self.process = subprocess.Popen([sys.executable, "-c", _READY, script.name], cwd=script.parent, env=_env(),
                                        stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT, text=True)

    def go(self):
        self.process.stdin.write("go\n")
        self.process.stdin.close()

    def finish(self):
        code = self.process.wait()
        self.log.close()
        return code


def _one_after_another(scripts, out_dir):
    """(chapter_id, exit code, seconds) of each script, one at a time, the next one's process
    started (and its imports done) while the previous one runs; the seconds of a chapter run from
    its "go" to its end."""
    items = list(scripts.items())
    ahead = _Ahead(items[0][1], out_dir / f"{items[0][0]}.log") if items else None
    for index, (chapter_id, _) in enumerate(items):
        current = ahead
        started = time.perf_counter()
        current.go()
        if index + 1 < len(items):
            next_id, next_script = items[index + 1]
            ahead = _Ahead(next_script, out_dir / f"{next_id}.log")
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

    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    scripts = chapter_scripts(chapters)
    use_notebook = {"notebook": True, "script": False, "auto": _can_execute_notebooks()}[how]
    jobs = jobs or default_jobs()
    out_dir = results.device_dir()
    console = tables.console()
    console.print(f"[bold]workbook run[/]: {len(scripts)} chapter(s) in {workbook.MODE} mode on "
                  f"{results.device_facts()['name']}, as {'notebooks' if use_notebook else 'scripts'}, "
                  f"{jobs} at a time; logs in {out_dir}/")
    failed = []
    run_started = time.perf_counter()

    def one(chapter_id, script):
        started = time.perf_counter()
        code = _run_one(script, out_dir / f"{chapter_id}.log", use_notebook)
        return code, time.perf_counter() - started

    def in_chapter_order(pool):
        if jobs == 1 and not use_notebook:
            yield from _one_after_another(scripts, out_dir)
            return
        running = {chapter_id: pool.submit(one, chapter_id, script) for chapter_id, script in scripts.items()}
        for chapter_id in scripts:
            yield chapter_id, *running[chapter_id].result()

    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console) as progress, ThreadPoolExecutor(max_workers=jobs) as pool:
        task = progress.add_task("chapters", total=len(scripts))
        names = [script.parent.name for script in scripts.values()] + ["done"]
        progress.update(task, description=f"running {names[0]}")
        for index, (chapter_id, code, seconds) in enumerate(in_chapter_order(pool)):  # in chapter order
            script = scripts[chapter_id]
            progress.update(task, description=f"running {names[index + 1]}")
            log_path = out_dir / f"{chapter_id}.log"
            if code == 0:
                _store_wall_time(out_dir / f"{chapter_id}.json", seconds, use_notebook, jobs)
            status = "[green]ok[/]" if code == 0 else f"[red]FAILED (exit {code})[/], see {log_path}"
            progress.console.print(f"{script.parent.name}: {status} in {seconds:.0f} s")
            if code:
                failed.append(chapter_id)
                progress.console.print("".join(log_path.read_text().splitlines(True)[-25:]))
            progress.advance(task)
    console.print(f"{len(scripts)} chapter(s) in {time.perf_counter() - run_started:.0f} s")
    summary(console, list(scripts), results.device_facts()["slug"], out_dir.parent)
    if failed:
        console.print(f"[red]failed chapters: {', '.join(failed)}[/]")
        return 1
    return 0


def _store_wall_time(path, seconds, as_notebook, jobs=1):
    """Keep how long the chapter took, start to end (beside `jobs` - 1 others; one at a time, from
    its "go": its process started and imported during the previous chapter), with its results."""
    if not path.exists():
        return
    record = json.loads(path.read_text())
    record["wall"] = {"seconds": round(seconds, 1), "as": "notebook" if as_notebook else "script",
                      "cpus": os.cpu_count(), "chapters at once": jobs}
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


