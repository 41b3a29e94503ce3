"""The workbook's commands.

    python -m workbook info                 mode, device, versions, and (on a GPU) the copy ceiling
    python -m workbook run [ch00 ch01 ...]  run chapters headless, every check asserted; summary table
    python -m workbook table [--markdown]   the summary of stored GPU results (--readme: into results/README.md)
    python -m workbook notebooks [--check]  write each chapter's .ipynb from its .py (or check they agree)
    python -m workbook exercises [chNN ...] the progress table of your exercises (--solutions: of solutions.py;
                                            --audit: what each check's data leaves open, workbook/check_data.py)
    python -m workbook handout DIR          a copy of the workbook for students: no solutions.py
    python -m workbook book                 the workbook as a website, the reference GPU's outputs in its
                                            notebooks (the `book` extra): build/book/_build/html
    python -m workbook grade DIR --out F    a class's submissions (one entry per student in DIR) graded
                                            as pytest --exercises grades one, each in a sandbox of its
                                            own: grades.csv, --json with every message, a summary
    python -m workbook compile [chNN ...]   every kernel the chapters' tests launch, compiled for every
                                            GPU target the installed compiler supports (7.5 and up)
                                            on this machine, GPU or not: a table (with
                                            WORKBOOK_COMPILER=numba-cuda-mlir: by the successor, for 9.0
                                            and 7.5)
    python -m workbook compilers [chNN ...] on a GPU: every kernel the chapters' tests launch, run by
                                            numba-cuda-mlir and checked, then timed under both compilers
                                            (results/<device>/compilers.json)
"""

import argparse
import os
import re
import subprocess
import sys

import workbook
from workbook import report, results, runner, tables

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



def run(args):
    return runner.run(args.chapters, args.how, args.jobs)


def table(args):
    if args.readme:
        readme, summary_path = report.write_readme(args.device)
        print(f"updated {readme} and {summary_path}")
        from workbook import compilers

        if compilers.write_tables(args.device):
            print("updated the compilers' tables (results/<device>/COMPILERS.md, docs/compilers.md)")
    elif args.markdown:
        bars, full, stamps = report.markdown_tables(args.device)
        print(f"{bars}\n\n{full}\n\n{stamps}")
    else:
        report.summary(tables.console(), list(report.chapter_scripts()), args.device)


def notebooks(args):
    return runner.notebooks(args.chapters, args.check)


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
    if args.store_traffic:  # maintainers, in the simulator: what the reference answers' kernels move
        import json

        traffic = {}
        ex.EXERCISE_TRAFFIC.unlink(missing_ok=True)  # the reference answers are measured, not judged
        for exercise in ex.all_exercises():
            result = ex.evaluate(exercise, ex.load(exercise.chapter, "solutions"))
            if result.status == ex.CORRECT and result.traffic:  # (None: no launch of its own kernels)
                traffic[exercise.id] = result.traffic
        ex.EXERCISE_TRAFFIC.write_text(json.dumps(traffic, indent=1) + "\n")
        print(f"wrote {ex.EXERCISE_TRAFFIC.relative_to(results.ROOT)}: {len(traffic)} exercises")
        return 0
    if args.audit:  # maintainers, in the simulator: what each check's data leaves open (check_data.py)
        from workbook import check_data

        open_classes = 0
        for exercise in ex.all_exercises(args.chapters):
            found = check_data.audit(exercise)
            open_classes += len(found)
            print(f"{exercise.id}: " + ("covers every class" if not found else "\n    ".join(["", *found])))
        return 1 if open_classes else 0
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


def compile_kernels(args):
    """Run the chapters' tests in the simulator with every launch compiled (for 9.0 and 7.5), build
    each signature they launched for every other target, then print the table."""
    import tempfile
    import time


    from workbook import compiler

    console = tables.console()
    if workbook.MODE != "sim":
        console.print("`compile` works in the simulator (WORKBOOK_DEVICE=sim); on a GPU every launch compiles anyway")
        return 2
    reason = compiler.missing()
    if reason:
        console.print(f"[red]cannot compile here[/]: {reason}")
        return 2
    wanted = list(dict.fromkeys(map(report.chapter_of, report.chapter_scripts(args.chapters))))  # ch09, not ch09a
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
    records = report.compile_records(log_dir)
    if not args.all:  # the workbook's kernels; the tests' own (some written not to compile) with --all
        records = {key: r for key, r in records.items()
                   if key[0].startswith("chapters.") and any(f".{c}_" in key[0] for c in wanted)}
    launched = {kernel for kernel, _ in records}
    never = report.module_kernels(wanted, skip=("solutions",) if args.exercises else ("exercises",)) - launched
    from workbook import successor

    if successor.chosen() == successor.NAME:  # the successor's build of each launch: for 9.0 and 7.5
        targets, family_of = [tuple(cc) for cc in compiler.CCS], {}
        for record in records.values():
            record["everywhere"] = {t["target"]: t for t in record.get("targets", [])}
        console.print(f"compiled by {successor.NAME}, for {', '.join(f'{a}.{b}' for a, b in targets)} (the "
                      "targets of every launch)")
    else:  # every other GPU: each signature the tests launched, built from its stored IR for each target
        targets = compiler.plan(every_target=args.every_target)
        family_of = {} if args.every_target else {
            members[0]: members[1:] for members in compiler.families(compiler.supported_targets()).values()}
        started = time.perf_counter()
        built = compiler.build_everywhere(list(records.values()), targets, jobs=args.jobs)
        console.print(f"built {built} more (kernel, signature, target) for "
                      f"{', '.join(f'{a}.{b}' for a, b in targets)} in {time.perf_counter() - started:.0f} s "
                      "(the rest from the tests' compiles and build/compile-cache/)")
    errors = report.compile_table(records, console, targets, never, family_of)
    return 1 if errors or not records else 0


def compilers(args):
    from workbook import compilers as both

    return both.run(args.chapters, jobs=args.jobs, timeout=args.timeout)


def profile(args):
    """An exercise's check run under the memory trace: its kernels' accesses, line by line."""
    from workbook import exercises as ex
    from workbook import memtrace

    if workbook.ON_GPU:
        print("`profile` traces in the simulator (WORKBOOK_DEVICE=sim); on a GPU, run Nsight Compute (ncu)")
        return 2
    found = {e.id: e for e in ex.all_exercises()}
    if args.exercise not in found:
        print(f"no exercise {args.exercise!r}; there are {', '.join(found)}")
        return 2
    exercise = found[args.exercise]
    module = ex.load(exercise.chapter, "solutions" if args.solutions else "exercises")
    with memtrace.trace(lines=True) as trace:
        result = ex.evaluate(exercise, module)
    console = tables.console()
    console.print(f"[bold]{exercise.id}[/] ({exercise.title}): {result.status}"
                  + (f"\n{result.message}" if result.message and not result.passed else ""))
    trace.show(console)
    return 0 if result.passed else 1


def book(args):
    from workbook import book as site

    site.build(args.out, args.device, args.repository, args.branch)
    return 0


def handout(args):
    from workbook import handout as handouts

    written, problems = handouts.write(args.directory, force=args.force, repository=args.repository,
                                       branch=args.branch)
    for line in problems:
        print(f"warning (--force): {line}")
    print(f"wrote {len(written)} committed files to {args.directory} (no solutions.py). There, as a student "
          f"would:\n  {handouts.INSTALL}\n  python -m pytest --exercises")
    return 0


def grade(args):
    from workbook import grade as gradebook

    return gradebook.main(args)


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("info", help="mode, device, versions, copy ceiling").set_defaults(func=info)
    run_parser = commands.add_parser("run", help="run chapters headless and summarise")
    run_parser.add_argument("chapters", nargs="*", help="chapter ids (ch00 ...) or folder names; default all")
    run_parser.add_argument("--how", choices=("auto", "notebook", "script"), default="auto",
                            help="execute the .ipynb (needs Jupyter) or its paired .py; auto: notebook if possible")
    run_parser.add_argument("--jobs", "-j", type=int, default=None,
                            help="chapters run at once (default: 1 on a GPU, one per core up to 4 in the simulator)")
    run_parser.set_defaults(func=run)
    table_parser = commands.add_parser("table", help="summary of stored GPU results")
    table_parser.add_argument("--device", default=results.REFERENCE_DEVICE)
    table_parser.add_argument("--markdown", action="store_true")
    table_parser.add_argument("--readme", action="store_true", help="write it into results/README.md")
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
    ex_parser.add_argument("--store-traffic", action="store_true",
                           help="maintainers (simulator): store the reference answers' global-memory bytes")
    ex_parser.add_argument("--audit", action="store_true",
                           help="maintainers (simulator): the classes of lucky answer each check's data leaves open")
    ex_parser.set_defaults(func=exercises)
    compilers_parser = commands.add_parser("compilers", help="on a GPU: every chapter kernel under numba-cuda and "
                                           "numba-cuda-mlir, checked, timed, registers (results/<device>/compilers.json)")
    compilers_parser.add_argument("chapters", nargs="*")
    compilers_parser.add_argument("--jobs", "-j", type=int, default=8, help="pytest workers (default 8)")
    compilers_parser.add_argument("--timeout", type=int, default=1200, help="seconds a chapter's tests may take")
    compilers_parser.set_defaults(func=compilers)
    compile_parser = commands.add_parser("compile", help="compile every chapter kernel for a GPU, no GPU needed")
    compile_parser.add_argument("chapters", nargs="*")
    compile_parser.add_argument("--exercises", action="store_true",
                                help="compile your exercises.py's kernels (default: solutions.py's)")
    compile_parser.add_argument("--log", help="read a compile log a test run wrote (WORKBOOK_COMPILE_LOG)")
    compile_parser.add_argument("--all", action="store_true",
                                help="also the kernels the tests define (some are written not to compile)")
    compile_parser.add_argument("--every-target", action="store_true",
                                help="build for every supported target, not one a family (8.0 for 8.x ...)")
    compile_parser.add_argument("--jobs", "-j", type=int, default=None,
                                help="worker processes building the other targets (default: one per core)")
    compile_parser.set_defaults(func=compile_kernels)
    profile_parser = commands.add_parser("profile", help="an exercise's memory accesses, traced in the simulator")
    profile_parser.add_argument("exercise", help="an exercise id, e.g. ch01.1")
    profile_parser.add_argument("--solutions", action="store_true", help="the reference answer instead of yours")
    profile_parser.set_defaults(func=profile)
    book_parser = commands.add_parser("book", help="the workbook as a website (Jupyter Book), with stored GPU outputs")
    book_parser.add_argument("--out", default=None, help="build folder (default build/book)")
    book_parser.add_argument("--device", default=None, help="whose stored run the pages show (default the reference GPU)")
    book_parser.add_argument("--repository", help="the GitHub repository of a handout written for hosted notebooks "
                             "(handout --repository): its Open-in-Colab badges on every chapter page")
    book_parser.add_argument("--branch", default="main", help="the branch the badges open (default main)")
    book_parser.set_defaults(func=book)
    handout_parser = commands.add_parser("handout", help="a copy of the workbook without solutions")
    handout_parser.add_argument("directory")
    handout_parser.add_argument("--force", action="store_true",
                                help="write the committed files even if the checkout has uncommitted or untracked "
                                     "files, or exercise regions that are not their stubs")
    handout_parser.add_argument("--repository", help="the GitHub repository the handout is pushed to: each notebook "
                                "gets an 'Open in Colab' badge and a first cell that installs the workbook there")
    handout_parser.add_argument("--branch", default="main", help="the branch the badges open (default main)")
    handout_parser.set_defaults(func=handout)
    grade_parser = commands.add_parser("grade", help="grade a class's submissions, each in a sandbox")
    grade_parser.add_argument("submissions", help="a folder with one entry per student (the entry's name is the id)")
    grade_parser.add_argument("--out", required=True, help="the CSV: a row per student and exercise")
    grade_parser.add_argument("--json", help="also everything as JSON: full messages, each process's output")
    grade_parser.add_argument("--jobs", "-j", type=int, default=None,
                              help="grading processes at once (default: one per core; 1 on a GPU)")
    grade_parser.add_argument("--timeout", type=float, default=300,
                              help="wall-clock seconds for one chapter's file of one submission (default 300)")
    grade_parser.add_argument("--points", help='a JSON file: {"ch01.4": 2} or {"ch01.4": {"fast enough": 2, '
                                               '"too slow": 1}}; default 1 for correct or fast enough')
    grade_parser.add_argument("--only", help="grade these exercises or chapters only: ch00,ch01.2")
    grade_parser.add_argument("--cache", help="where grades of files already seen are kept "
                                              "(default build/grade-cache)")
    grade_parser.add_argument("--no-cache", action="store_true", help="grade every file, keep nothing")
    grade_parser.add_argument("--isolation", choices=("auto", "namespaces", "process"), default="auto",
                              help="namespaces: also hide the machine from each grading process (Linux, "
                                   "unprivileged user namespaces); auto: where they work")
    grade_parser.add_argument("--keep", action="store_true", help="keep the temporary sandboxes (to debug)")
    grade_parser.set_defaults(func=grade)
    args = parser.parse_args(argv)
    return args.func(args) or 0


if __name__ == "__main__":
    sys.exit(main())
