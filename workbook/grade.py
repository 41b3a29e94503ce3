"""The gradebook: a class's submissions graded as `python -m pytest --exercises` grades one.

    python -m workbook grade SUBMISSIONS --out grades.csv [--json grades.json] [--jobs N] [--timeout S]
        [--points FILE] [--only ch00,ch01.2] [--cache DIR | --no-cache] [--isolation auto|namespaces|process]

SUBMISSIONS holds one entry per student (grade_submissions.py says which layouts are read). Each
exercise is graded by `workbook.exercises.evaluate`, in a process of its own per chapter file and
submission, in a copy of the handout with that one file in it (grade_sandbox.py, grade_one.py,
grade_guard.py); grade_report.py writes the CSV, the JSON and the summary.

What is graded once:

    a unit     one chapter's exercises.py, by its bytes: students whose files are the same byte for
               byte (the stub, a shared answer) share one grading
    the cache  build/grade-cache/VERSION/chNN-SHA256.json, kept from run to run: each exercise's grade
               for that file. VERSION is a digest of the handout the file is graded in (every file
               but the exercises.py, the grader's own included) and of the mode and the versions of
               Python and numba, so that a change to a check, the simulator or the grader grades
               everything again. A unit stopped by its timeout or its process's end is not kept.
"""

import hashlib
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path

from rich.markup import escape  # a student's name or a file's as printed: its brackets are not markup

from . import grade_report as report
from . import grade_sandbox as sandbox
from . import grade_submissions as submissions
from .exercises import WRONG
from .grade_one import NOT_GRADED

@dataclass
class Unit:
    chapter: str
    folder: str
    source: bytes
    digest: str
    exercise_ids: list
    holders: list = field(default_factory=list)  # the students whose file this is
    graded: dict = field(default_factory=dict)  # exercise id -> {status, message, ratio}
    output: str = ""


class Cache:
    """Grades by (chapter, sha256 of the file, exercise), one JSON file per chapter file."""

    def __init__(self, folder, version):
        self.folder = Path(folder) / version if folder else None
        if self.folder:
            self.folder.mkdir(parents=True, exist_ok=True)

    def get(self, chapter, digest):
        path = self.folder and self.folder / f"{chapter}-{digest}.json"
        return json.loads(path.read_text()) if path and path.exists() else {}

    def put(self, chapter, digest, graded):
        if self.folder:
            report.write_json(self.folder / f"{chapter}-{digest}.json", {**self.get(chapter, digest), **graded})


def main(args):
    import workbook
    from workbook import exercises as ex
    from workbook import tables

    console, started = tables.console(), time.monotonic()
    wanted = {item.strip() for item in (args.only or "").split(",") if item.strip()}
    every = ex.all_exercises()
    graded_exercises = [e for e in every if not wanted or e.id in wanted or e.chapter in wanted]
    if not graded_exercises:
        raise SystemExit(f"--only {args.only}: no such exercise or chapter")
    points = report.points_table(args.points, graded_exercises, {e.id for e in every})
    klass = submissions.find(args.submissions, ex.chapters())  # every chapter's file recognised, wanted or not
    if not klass:
        raise SystemExit(f"{args.submissions}: no submissions in it")
    isolation = _isolation(args.isolation)
    jobs = args.jobs or (1 if workbook.ON_GPU else os.cpu_count() or 1)  # on a GPU, timings must not share it
    grades, outputs, version = grade_class(klass, graded_exercises, args, isolation, jobs, console)
    students = assemble(klass, graded_exercises, grades, outputs, points)
    maximum = sum(max(points[e.id].values(), default=0) for e in graded_exercises)
    report.write_csv(args.out, report.rows(students, graded_exercises))
    if args.json:
        report.write_json(args.json, {"mode": workbook.MODE, "isolation": isolation, "workbook": version,
                                      "maximum": maximum, "seconds": round(time.monotonic() - started, 1),
                                      "exercises": {e.id: {"chapter": e.chapter, "title": e.title, "kind": e.kind}
                                                    for e in graded_exercises},
                                      "students": students})
    report.summary(console, students, graded_exercises, maximum)
    for submission in klass:
        for line in submission.problems:
            console.print(f"[magenta]{escape(submission.student)}[/]: {escape(line)}")
    console.print(f"wrote {args.out}" + (f" and {args.json}" if args.json else "")
                  + f" in {time.monotonic() - started:.0f} s")
    return 0


def grade_class(klass, graded_exercises, args, isolation, jobs, console):
    """Every file of the class graded once, in a temporary run folder: ({(chapter, sha256): {exercise id:
    grade}}, {(chapter, sha256): the grading process's output}, the workbook's version)."""
    import numba

    import workbook
    from workbook import exercises as ex
    from workbook import results

    folders = {c: f.name for c, f in ex.chapters().items() if any(e.chapter == c for e in graded_exercises)}
    compiler_ok = workbook.ON_GPU or _compiler_ok()
    run_dir = Path(tempfile.mkdtemp(prefix="workbook-grade-"))
    try:
        handout_dir, problems = sandbox.build_handout(run_dir)
        for line in problems:
            console.print(f"[yellow]note[/]: graded with the committed workbook: {escape(line)}")
        version = sandbox.handout_version(handout_dir, f"{workbook.MODE} {sys.version} numba {numba.__version__}")
        cache = Cache(None if args.no_cache else args.cache or results.ROOT / "build" / "grade-cache", version)
        stubs = {c: (handout_dir / "chapters" / folder / "exercises.py").read_bytes() for c, folder in folders.items()}
        units, grades = plan(klass, graded_exercises, folders, stubs, cache)
        console.print(f"{len(klass)} submissions, {len(graded_exercises)} exercises: {len(units)} chapter files to "
                      f"grade ({sum(len(u.holders) for u in units)} with the students sharing them), {jobs} at a time, "
                      f"isolation: {isolation}, {workbook.MODE} mode")
        run_units(units, run_dir, handout_dir, args, isolation, _hidden(results.ROOT, args, cache), compiler_ok,
                  jobs, console)
    finally:
        if not args.keep:
            shutil.rmtree(run_dir, ignore_errors=True)
    for unit in units:
        grades[(unit.chapter, unit.digest)] = {**grades[(unit.chapter, unit.digest)], **unit.graded}
        if unit.graded and all(r.get("cacheable") for r in unit.graded.values()):
            cache.put(unit.chapter, unit.digest, {i: _public(r) for i, r in unit.graded.items()})
    for submission in klass:  # a chapter with no file is the stub: its grade is the stub's
        for chapter, stub in stubs.items():
            submission.files.setdefault(chapter, stub)
    return grades, {(u.chapter, u.digest): u.output for u in units}, version


def _isolation(asked):
    works = asked != "process" and sandbox.namespaces_work()
    if asked == "namespaces" and not works:
        raise SystemExit("--isolation namespaces: `unshare --user --map-root-user --mount --pid` does not work here "
                         "(no unprivileged user namespaces, or no unshare or bash); --isolation process does")
    return "namespaces" if works else "process"


def _compiler_ok():
    from workbook import compiler

    return not compiler.wanted() or compiler.missing() is None


def _public(record):
    return {k: record[k] for k in ("status", "message", "ratio")}


def plan(klass, graded_exercises, folders, stubs, cache):
    """The units to grade (each file once, only the exercises the cache lacks), and the cached grades."""
    units, grades = {}, {}
    for submission in klass:
        if "*" in submission.not_graded:
            continue
        for chapter, folder in folders.items():
            if chapter in submission.not_graded:
                continue
            source = submission.files.get(chapter, stubs[chapter])
            digest = hashlib.sha256(source).hexdigest()
            key = (chapter, digest)
            if key not in units and key not in grades:
                cached = cache.get(chapter, digest)
                missing = [e.id for e in graded_exercises if e.chapter == chapter and e.id not in cached]
                grades[key] = cached
                if missing:
                    units[key] = Unit(chapter, folder, source, digest, missing)
            if key in units:
                units[key].holders.append(submission.student)
    stub_digests = {hashlib.sha256(s).hexdigest() for s in stubs.values()}
    return sorted(units.values(), key=lambda u: u.digest in stub_digests), grades  # the stubs, quick, last


def run_units(units, run_dir, handout_dir, args, isolation, hide, compiler_ok, jobs, console):
    """Grade each unit in a sandbox of its own (grade_sandbox.py), `jobs` at a time; progress printed."""
    lock, done = threading.Lock(), [0]

    def one(index, unit):
        unit_dir = run_dir / f"u{index:04d}"
        root, home = sandbox.prepare(unit_dir, handout_dir, unit.folder, unit.source)
        outcome = sandbox.run(unit_dir, root, home, unit.chapter, unit.exercise_ids, args.timeout, isolation, hide,
                              compiler_ok)
        unit.graded, unit.output = outcome_grades(unit, outcome, args.timeout), outcome["output"]
        if not args.keep:
            shutil.rmtree(unit_dir, ignore_errors=True)
        with lock:
            done[0] += 1
            counts = report.count_statuses(unit.graded.values())
            who = unit.holders[0] + (f" and {len(unit.holders) - 1} more" if len(unit.holders) > 1 else "")
            console.print(f"[{done[0]}/{len(units)}] {unit.chapter} of {escape(who)}: "
                          + ", ".join(f"{s} {n}" for s, n in counts.items()) + f" ({outcome['seconds']:.0f} s)")

    with ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = [pool.submit(one, index, unit) for index, unit in enumerate(units)]
        try:
            for future in as_completed(futures):
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            sandbox.stop_all()
            raise


def outcome_grades(unit, outcome, timeout):
    """Each exercise of the unit: the child's result, or why there is none. Cacheable: a clean run's."""
    if outcome["problems"]:  # the submission wrote into the grader's results: nothing of them is trusted
        why = "the submission wrote into the grader's results: " + "; ".join(outcome["problems"][:3])
        return {i: {"status": WRONG, "message": why, "ratio": None, "cacheable": True} for i in unit.exercise_ids}
    clean = not outcome["timed_out"] and outcome["returncode"] == 0
    graded = {}
    for ident in unit.exercise_ids:
        if ident in outcome["results"]:
            graded[ident] = {**outcome["results"][ident], "cacheable": clean}
        elif outcome["timed_out"]:
            graded[ident] = {"status": report.TIMED_OUT, "ratio": None, "message":
                             f"grading this chapter's file took longer than --timeout {timeout:g} s of wall clock: "
                             "stopped (an endless loop, at import or in a check?)"}
        else:
            graded[ident] = {"status": NOT_GRADED, "ratio": None, "message":
                             f"the grading process ended ({_ended(outcome['returncode'])}) before grading this "
                             f"exercise: the submission's code ended it (os._exit, a crash, a limit)? Its output:\n"
                             + outcome["output"][-1500:]}
    return graded


def _ended(returncode):
    import signal

    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name
        return {"SIGXCPU": "out of CPU time", "SIGKILL": "killed: out of memory?"}.get(name, name)
    return f"exit status {returncode}"


def assemble(klass, graded_exercises, grades, outputs, points):
    """{student: {points, exercises: {id: {status, points, message, ratio}}, problems, output}}."""
    students = {}
    for submission in klass:
        records, output = {}, {}
        for exercise in graded_exercises:
            why = submission.not_graded.get("*") or submission.not_graded.get(exercise.chapter)
            if why:
                record = {"status": NOT_GRADED, "message": why, "ratio": None}
            else:
                key = (exercise.chapter, hashlib.sha256(submission.files[exercise.chapter]).hexdigest())
                record = _public(grades[key][exercise.id])
                if outputs.get(key):
                    output[exercise.chapter] = outputs[key]
            records[exercise.id] = {**record, "points": points[exercise.id].get(record["status"], 0.0)}
        students[submission.student] = {"points": sum(r["points"] for r in records.values()), "exercises": records,
                                        "problems": submission.problems, "output": output}
    return students


def _hidden(checkout, args, cache):
    """What a namespaced child must not see: the checkout, the submissions, the cache, the temporary
    folder (other units, earlier outputs), HOME, and where the outputs go (the outermost of each)."""
    candidates = [checkout, args.submissions, cache.folder and cache.folder.parent, tempfile.gettempdir(),
                  os.path.expanduser("~"), Path(args.out).resolve().parent,
                  args.json and Path(args.json).resolve().parent]
    folders = {os.path.realpath(c) for c in candidates if c and os.path.isdir(c) and os.path.realpath(c) != "/"}
    return sorted(f for f in folders if not any(f.startswith(other + os.sep) for other in folders))
