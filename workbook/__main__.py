"""The workbook's commands.

    python -m workbook info                 mode, device, versions, and (on a GPU) the copy ceiling
    python -m workbook run [ch00 ch01 ...]  run chapters headless, every check asserted; summary table
    python -m workbook table [--markdown]   the summary of stored GPU results (--readme: into README.md)
    python -m workbook notebooks [--check]  write each chapter's .ipynb from its .py (or check they agree)
    python -m workbook exercises [chNN ...] the progress table of your exercises (--solutions: of solutions.py)
    python -m workbook handout DIR          a copy of the workbook for students: no solutions.py
    python -m workbook compile [chNN ...]   every kernel the chapters' tests launch, compiled for a GPU
                                            (cc 9.0 and 7.5) on this machine, GPU or not: a table
"""

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import workbook
from workbook import results, tables
from workbook.chapter import MET, NOT_MET, WITHIN_NOISE, bar_figure, bar_spread, verdict

CHAPTERS = results.ROOT / "chapters"
README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def chapter_scripts(wanted=()):
    """{chapter id: its notebook source chapters/chNN_name/chNN_name.py}, in order."""
    found = {}
    for folder in sorted(CHAPTERS.glob("ch[0-9][0-9]_*")):
        script = folder / f"{folder.name}.py"
        chapter_id = folder.name[:4]
        if script.exists() and (not wanted or {chapter_id, folder.name, folder.name[5:]} & set(wanted)):
            found[chapter_id] = script  # asked for as ch08, ch08_capstone or capstone
    missing = set(wanted) - set(found) - {p.parent.name for p in found.values()} - {
        p.parent.name[5:] for p in found.values()}
    if missing:
        raise SystemExit(f"no such chapter: {', '.join(sorted(missing))}; have {', '.join(found)}")
    return found


def info(_args):
    from numba import cuda

    facts = results.device_facts()
    stamp = results.stamp()
    print(f"mode        {workbook.MODE} (WORKBOOK_DEVICE={os.environ.get('WORKBOOK_DEVICE', 'auto')})")
    for key, value in facts.items():
        print(f"{key:<12}{value}")
    for key in ("python", "numba", "numba_cuda", "numpy", "torch", "cupy"):
        print(f"{key:<12}{stamp[key]}")
    if workbook.ON_GPU:
        from workbook import bench

        ceiling = bench.copy_ceiling()
        for how, rate in ceiling["all"].items():
            print(f"copy        {rate:.0f} GB/s ({how}, bytes read + written)")
        cuda.synchronize()
    else:
        print("copy        not measured: simulator (see results/ for stored GPU figures)")
        from workbook import compiler

        reason = compiler.missing() if compiler.wanted() else "WORKBOOK_COMPILE=0"
        print("compiler    " + (f"each launch also compiled for a GPU (cc {', '.join(f'{a}.{b}' for a, b in compiler.CCS)})"
                                if reason is None else f"kernels not compiled for a GPU: {reason}"))


def _run_one(script, log_path, use_notebook):
    env = dict(os.environ, MPLBACKEND="Agg", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(results.ROOT), os.environ.get("PYTHONPATH", "")]))
    if use_notebook:
        notebook = script.with_suffix(".ipynb")
        command = [sys.executable, "-m", "jupyter", "nbconvert", "--to", "notebook", "--execute",
                   "--ExecutePreprocessor.timeout=1800", "--output-dir", str(log_path.parent),
                   str(notebook)]
    else:
        command = [sys.executable, script.name]
    with open(log_path, "w") as log:
        return subprocess.run(command, cwd=script.parent, env=env, stdout=log, stderr=subprocess.STDOUT).returncode


def _can_execute_notebooks():
    try:
        import ipykernel  # noqa: F401
        import nbconvert  # noqa: F401
    except ImportError:
        return False
    return True


def run(args):
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    scripts = chapter_scripts(args.chapters)
    use_notebook = {"notebook": True, "script": False, "auto": _can_execute_notebooks()}[args.how]
    out_dir = results.device_dir()
    console = tables.console()
    console.print(f"[bold]workbook run[/]: {len(scripts)} chapter(s) in {workbook.MODE} mode on "
                  f"{results.device_facts()['name']}, as {'notebooks' if use_notebook else 'scripts'}; "
                  f"logs in {out_dir}/")
    failed = []
    run_started = time.perf_counter()
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console) as progress:
        task = progress.add_task("chapters", total=len(scripts))
        for chapter_id, script in scripts.items():
            progress.update(task, description=f"running {script.parent.name}")
            started = time.perf_counter()
            log_path = out_dir / f"{chapter_id}.log"
            code = _run_one(script, log_path, use_notebook)
            seconds = time.perf_counter() - started
            if code == 0:
                _store_wall_time(out_dir / f"{chapter_id}.json", seconds, use_notebook)
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


def _store_wall_time(path, seconds, as_notebook):
    """Keep how long the chapter took, start to end, with its stored results."""
    if not path.exists():
        return
    record = json.loads(path.read_text())
    record["wall"] = {"seconds": round(seconds, 1), "as": "notebook" if as_notebook else "script",
                      "cpus": os.cpu_count()}
    path.write_text(json.dumps(record, indent=1) + "\n")


def _load(chapter_id, slug, base=None):
    path = (base or results.RESULTS) / slug / f"{chapter_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def summary_rows(chapter_ids, slug, base=None):
    """Rows of the summary: this run's correctness, and times from this run or (simulator) stored.

    base: the folder this run wrote to (results/ unless WORKBOOK_RESULTS says otherwise)."""
    rows, bars = [], []
    for chapter_id in chapter_ids:
        record = _load(chapter_id, slug, base)
        if record is None:
            continue
        timed = record if record["stamp"]["mode"] == "gpu" else _load(chapter_id, results.REFERENCE_DEVICE)
        timed_cases = {case["key"]: case for case in (timed or {}).get("cases", [])}
        keys = [case["key"] for case in record["cases"]]
        for case in record["cases"]:
            if keys.count(case["key"]) > 1:
                continue  # the points of a sweep: the chapter's plot shows them
            timed_case = timed_cases.get(case["key"], {})
            timed_rows = {row["variant"]: row for row in timed_case.get("rows", [])}
            for row in case["rows"]:
                t = timed_rows.get(row["variant"], {})
                vs_first, vs_base = t.get("speedup_vs_first"), t.get("speedup_vs_baseline")
                rate = tables.fmt(t.get("tflops"), ".2f", " TFLOP/s") if t.get("tflops") else tables.fmt(
                    t.get("gbps"), ".0f", " GB/s")
                rows.append({
                    "chapter": chapter_id, "case": f"{case['key']} ({timed_case.get('size') or case['size']})",
                    "kernel": row["variant"] + (" (baseline)" if row["kind"] == "baseline" else ""),
                    "correct": {None: "-", True: "yes", False: "NO"}[row["correct"]],
                    "time": tables.fmt(t.get("median_ms"), ".4g", " ms"), "rate": rate,
                    "ceiling": tables.fmt(t.get("fraction_of_ceiling"), ".0%"),
                    "vs naive": "-" if not vs_first else f"{vs_first[0]:.2f}x",
                    "vs baseline": "-" if not vs_base else f"{vs_base[0]:.2f}x",
                    "host/call": tables.fmt(t.get("host_us"), ".0f", " us") + (" (sync)" if t.get("synchronises") else ""),
                    "1 call": tables.fmt(t.get("latency_us"), ".0f", " us"),
                })
        for bar in (timed or {}).get("bars", []):
            bars.append({"chapter": chapter_id, **bar})
    return rows, bars


SHORT_HEADERS = {"correct": "ok", "ceiling": "ceil", "vs naive": "naive", "vs baseline": "base",
                 "host/call": "host"}  # the console's table; the Markdown one keeps the long names
COLUMNS = ("chapter", "case", "kernel", "correct", "time", "rate", "ceiling", "vs naive", "vs baseline",
           "host/call", "1 call")


def summary(console, chapter_ids, slug, base=None):
    from rich.table import Table

    rows, bars = summary_rows(chapter_ids, slug, base)
    source = "this run" if workbook.ON_GPU else f"stored {results.REFERENCE_DEVICE} results"
    from rich import box

    console.print(f"[bold]Summary[/]: correctness from this run ({workbook.MODE}); times, rates and speed-ups "
                  f"from {source}. Per case: time of a call on the GPU, GB/s or TFLOP/s, fraction of the copy "
                  "ceiling, speed-up vs the naive kernel and vs the baseline, host cost per call, one call "
                  "synchronised.")
    shown = [c for c in COLUMNS if c not in ("chapter", "case")]
    by_case = {}
    for row in rows:
        by_case.setdefault(f"{row['chapter']} {row['case']}", []).append(row)
    for case, case_rows in by_case.items():  # a table per case: its title heads it, and 100 columns fit
        table = Table(title=case, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in shown:
            table.add_column(SHORT_HEADERS.get(column, column), justify="left" if column == "kernel" else "right",
                             no_wrap=column != "kernel", ratio=1 if column == "kernel" else None)
        for row in case_rows:
            table.add_row(*(row[c].replace("TFLOP/s", "TF/s").replace(" (sync)", " sync") for c in shown))
        console.print(table)
    if bars:
        bar_table = Table(title=f"Bars ({source})")
        for column in ("chapter", "bar", "measured [p25-p75]", "target", "verdict"):
            bar_table.add_column(column)
        colour = {MET: "[green]met[/]", WITHIN_NOISE: "[yellow]within noise[/]", NOT_MET: "[red]not met[/]", None: "-"}
        for bar in bars:
            bar_table.add_row(bar["chapter"], bar["what"], f"{bar_figure(bar)} {bar_spread(bar)}", bar["target"],
                              colour[verdict(bar)])
        console.print(bar_table)


def markdown_tables(slug):
    """(bars, full table, stamps) in Markdown, from the stored results of device `slug`."""
    ids = list(chapter_scripts())
    rows, bars = summary_rows(ids, slug)
    shown = {MET: "met", WITHIN_NOISE: "*within noise*", NOT_MET: "**not met**", None: "-"}
    bar_lines = ["| chapter | bar (from the issue) | measured | p25-p75 | target | verdict |", "|---|---|---|---|---|---|"]
    bar_lines += [f"| {b['chapter']} | {b['what']} | {bar_figure(b)} | {bar_spread(b)[1:-1] or '-'} | {b['target']} "
                  f"| {shown[verdict(b)]} |" for b in bars]
    full_lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    full_lines += ["| " + " | ".join(row[c] for c in COLUMNS) + " |" for row in rows]
    stamps = []
    for chapter_id in ids:
        record = _load(chapter_id, slug)
        if record:
            s = record["stamp"]
            stamps.append(f"- {chapter_id}: {s['device']}, driver {s['device_facts'].get('driver')}, numba "
                          f"{s['numba']}, numba-cuda {s['numba_cuda']}, numpy {s['numpy']}, torch {s['torch']}, "
                          f"{s['date']}")
    return "\n".join(bar_lines), "\n".join(full_lines), "\n".join(stamps)


def table(args):
    bars, full, stamps = markdown_tables(args.device)
    if args.readme:
        summary_path = results.RESULTS / args.device / "SUMMARY.md"
        summary_path.write_text(f"# Stored results on {args.device}\n\n(generated by `python -m workbook table "
                                f"--readme` from the JSON files beside this one)\n\n{full}\n\n{stamps}\n")
        readme = results.ROOT / "README.md"
        content = readme.read_text()
        before, rest = content.split(README_BEGIN, 1)
        _, after = rest.split(README_END, 1)
        generated = (f"(generated by `python -m workbook table --readme` from results/{args.device}/; every "
                     f"kernel, time, rate and speed-up is in [its summary](results/{args.device}/SUMMARY.md))")
        readme.write_text(f"{before}{README_BEGIN}\n{generated}\n\n{bars}\n\nStamps:\n{stamps}\n{README_END}{after}")
        print(f"updated {readme} and {summary_path}")
    elif args.markdown:
        print(f"{bars}\n\n{full}\n\n{stamps}")
    else:

        summary(tables.console(), list(chapter_scripts()), args.device)


def notebooks(args):
    import jupytext

    stale = []
    for script in chapter_scripts(args.chapters).values():
        notebook_path = script.with_suffix(".ipynb")
        notebook = jupytext.read(script)
        text = jupytext.writes(notebook, fmt="ipynb")
        current = notebook_path.exists() and _cells(notebook_path.read_text()) == _cells(text)
        if args.check:
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


def exercises(args):
    from workbook import exercises as ex

    if args.stamp:
        for chapter_id in ex.chapters():
            exercises_path, solutions_path = (ex.module_path(chapter_id, w) for w in ("exercises", "solutions"))
            stamped = ex.stamp(exercises_path.read_text())
            exercises_path.write_text(stamped)
            if solutions_path.exists():
                stubs = iter(r.stub for r in ex.regions(stamped))
                solutions_path.write_text(re.sub(r"(# >>> ch\d\d\.\d+) \(stub [0-9a-f]{8}\)",
                                                 lambda m: f"{m[1]} (stub {next(stubs)})",
                                                 solutions_path.read_text()))
            print(f"stamped {exercises_path.relative_to(results.ROOT)}")
        return 0
    which = "solutions" if args.solutions else "exercises"
    found = ex.all_exercises(args.chapters)
    rows, passed, fresh = [], 0, 0
    for exercise in found:
        result = ex.evaluate(exercise, ex.load(exercise.chapter, which))
        rows += ex.progress_rows([result])
        passed += result.passed
        fresh += result.status == ex.NOT_ATTEMPTED
        if args.verbose and result.message:
            print(result.line() + "\n")
    ex.print_progress(rows, title=f"Exercises: {which}.py, {workbook.MODE} mode")
    if args.fresh:  # CI, on a fresh clone: every stub must read as not attempted
        if fresh != len(found):
            print(f"expected every exercise to be 'not attempted' on a fresh clone; {len(found) - fresh} are not")
            return 1
        return 0
    return 0 if passed == len(found) else 1


def compile_records(log_dir):
    """{(kernel, signature): record} from the JSON lines the simulator's compile hook wrote."""
    records = {}
    for path in sorted(Path(log_dir).glob("compile-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["kernel"].startswith("_exercise_variant"):
                continue  # the tests' stubs and planted wrong answers: not the workbook's kernels
            records[(record["kernel"], record["signature"])] = record
    return records


def module_kernels(chapter_ids, skip=("exercises",)):
    """'module.name' of every kernel defined at the top level of the chapters' modules (but those
    named in `skip`: the stubs of exercises.py are not launched when the solutions are checked)."""
    import importlib

    from numba.cuda.simulator.kernel import FakeCUDAKernel

    names = set()
    for chapter_id, script in chapter_scripts(chapter_ids).items():
        for path in sorted(script.parent.glob("*.py")):
            if path.stem in ("checks", script.stem, "__init__", *skip):
                continue
            module = importlib.import_module(f"chapters.{script.parent.name}.{path.stem}")
            for value in vars(module).values():
                if isinstance(value, FakeCUDAKernel) and not value._device and \
                        value.fn.__module__ == module.__name__:
                    names.add(f"{module.__name__}.{value.fn.__qualname__}")
    return names


def compile_table(records, console, never_launched=()):
    from rich.table import Table

    table = Table(title="Every kernel launched, compiled for a GPU (cc 9.0, and 7.5) without one")
    longest = max((len(kernel.replace("chapters.", "").replace("_exercise_variant", "variant"))
                   for kernel, _ in records), default=10)
    table.add_column("kernel", min_width=min(longest, 48), overflow="fold")  # a name a reader can search for
    for column in ("signature", "compiled", "registers", "spills (B)"):
        table.add_column(column, overflow="fold")
    errors = 0
    for (kernel, signature), record in sorted(records.items()):
        short = kernel.replace("chapters.", "").replace("_exercise_variant", "variant")
        if record["ok"] is True:
            first = record["targets"][0] if record["targets"] else {}
            status = "[green]yes[/] (" + ", ".join(t["cc"] for t in record["targets"]) + ")"
            registers, spills = first.get("registers"), first.get("spill_bytes")
        else:
            errors += 1
            status, registers, spills = f"[red]ERROR[/]: {record['error'][:1500]}", None, None
        table.add_row(short, signature if len(signature) < 120 else signature[:117] + "...", status,
                      "-" if registers is None else str(registers), "-" if spills is None else str(spills))
    console.print(table)
    kernels = {kernel for kernel, _ in records}
    console.print(f"{len(records)} (kernel, signature) pairs of {len(kernels)} kernels; {errors} would not compile")
    if never_launched:
        console.print("defined but launched by no test, so not compiled here: " + ", ".join(sorted(never_launched)))
    return errors


def compile_kernels(args):
    """Run the chapters' tests in the simulator with every launch compiled, then print the table."""
    import tempfile


    from workbook import compiler

    console = tables.console()
    if workbook.MODE != "sim":
        console.print("`compile` works in the simulator (WORKBOOK_DEVICE=sim); on a GPU every launch compiles anyway")
        return 2
    reason = compiler.missing()
    if reason:
        console.print(f"[red]cannot compile here[/]: {reason}")
        return 2
    wanted = list(chapter_scripts(args.chapters))
    log_dir = args.log
    if not log_dir:
        log_dir = tempfile.mkdtemp(prefix="workbook-compile-")
        tests = [str(p) for chapter_id in wanted for p in (results.ROOT / "tests").glob(f"test_{chapter_id}_*.py")]
        exercise_args = ["--exercises"] + ([] if args.exercises else ["--solutions"])
        env = dict(os.environ, WORKBOOK_DEVICE="sim", WORKBOOK_COMPILE="1", WORKBOOK_COMPILE_LOG=log_dir)
        for command in ([*tests, "-m", "not notebook"],
                        ["tests/test_exercises.py", *exercise_args, "-k", " or ".join(wanted)]):
            console.print(f"running {' '.join(command[:3])} ... with every launch compiled")
            subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "auto",
                            *command], cwd=results.ROOT, env=env, stdout=subprocess.DEVNULL)
    records = compile_records(log_dir)
    if not args.all:  # the workbook's kernels; the tests' own (some written not to compile) with --all
        records = {key: r for key, r in records.items()
                   if key[0].startswith("chapters.") and any(f".{c}_" in key[0] for c in wanted)}
    launched = {kernel for kernel, _ in records}
    never = module_kernels(wanted, skip=("solutions",) if args.exercises else ("exercises",)) - launched
    errors = compile_table(records, console, never)
    return 1 if errors or not records else 0


def handout(args):
    from workbook import handout as handouts

    written, problems = handouts.write(args.directory, force=args.force)
    for line in problems:
        print(f"warning (--force): {line}")
    print(f"wrote {len(written)} committed files to {args.directory} (no solutions.py). There, as a student "
          f"would:\n  {handouts.INSTALL}\n  python -m pytest --exercises")
    return 0


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="mode, device, versions, copy ceiling").set_defaults(func=info)
    run_parser = commands.add_parser("run", help="run chapters headless and summarise")
    run_parser.add_argument("chapters", nargs="*", help="chapter ids (ch00 ...) or folder names; default all")
    run_parser.add_argument("--how", choices=("auto", "notebook", "script"), default="auto",
                            help="execute the .ipynb (needs Jupyter) or its paired .py; auto: notebook if possible")
    run_parser.set_defaults(func=run)
    table_parser = commands.add_parser("table", help="summary of stored GPU results")
    table_parser.add_argument("--device", default=results.REFERENCE_DEVICE)
    table_parser.add_argument("--markdown", action="store_true")
    table_parser.add_argument("--readme", action="store_true", help="write it into README.md")
    table_parser.set_defaults(func=table)
    nb_parser = commands.add_parser("notebooks", help="chapters' .ipynb from their .py (jupytext)")
    nb_parser.add_argument("chapters", nargs="*")
    nb_parser.add_argument("--check", action="store_true")
    nb_parser.set_defaults(func=notebooks)
    ex_parser = commands.add_parser("exercises", help="progress table of the exercises")
    ex_parser.add_argument("chapters", nargs="*")
    ex_parser.add_argument("--solutions", action="store_true", help="check solutions.py instead")
    ex_parser.add_argument("--verbose", "-v", action="store_true", help="print each check's message")
    ex_parser.add_argument("--fresh", action="store_true", help="exit 0 only if every exercise is untouched")
    ex_parser.add_argument("--stamp", action="store_true",
                           help="maintainers: recompute the stub fingerprints in the region markers")
    ex_parser.set_defaults(func=exercises)
    compile_parser = commands.add_parser("compile", help="compile every chapter kernel for a GPU, no GPU needed")
    compile_parser.add_argument("chapters", nargs="*")
    compile_parser.add_argument("--exercises", action="store_true",
                                help="compile your exercises.py's kernels (default: solutions.py's)")
    compile_parser.add_argument("--log", help="read a compile log a test run wrote (WORKBOOK_COMPILE_LOG)")
    compile_parser.add_argument("--all", action="store_true",
                                help="also the kernels the tests define (some are written not to compile)")
    compile_parser.set_defaults(func=compile_kernels)
    handout_parser = commands.add_parser("handout", help="a copy of the workbook without solutions")
    handout_parser.add_argument("directory")
    handout_parser.add_argument("--force", action="store_true",
                                help="write the committed files even if the checkout has uncommitted or untracked "
                                     "files, or exercise regions that are not their stubs")
    handout_parser.set_defaults(func=handout)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
