"""A synthetic class for the gradebook (`python -m workbook grade`): N submissions, seeded.

    python tools/synthetic_class.py N DIR [--seed S]          write them (DIR new or empty)
    python tools/synthetic_class.py --check DIR GRADES.json   after grading: did a hostile one get out?

A student attempts the first k chapters (k drawn from 0 to all); each attempted chapter's file is
    right     every region answered (solutions.py's regions)
    partial   the first regions answered, the others left as stubs
    wrong     right, but one region with one of its planted wrong answers (solutions.py's)
    broken    right, with a syntax error, or an import of a module that does not exist
and the chapters not attempted are the handout's stubs (a checkout) or absent (the other layouts).
One student in HOSTILE_EVERY is hostile: one chapter's file carries one of HOSTILE's payloads. One
entry's layout is not recognised, and one's exercises.py is a symbolic link to solutions.py. What
the hostile payloads try to delete is the class's own (DIR.canary, another student's folder), never
the checkout's; what they try to read is the checkout's solutions.py and the other student's file.
`--check` says whether any file of the class or the canary changed (DIR.manifest.json holds their
digests), and whether any row or output of a student holds a line of an answer they did not write.

Needs solutions.py (the instructor's checkout). tests/test_grade.py builds its class from the same
pieces (answered, HOSTILE).
"""

import argparse
import hashlib
import json
import random
import re
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbook import exercises as ex  # noqa: E402

KINDS = {"right": 45, "partial": 20, "wrong": 25, "broken": 10}  # weights, per attempted chapter
HOSTILE_EVERY = 16
LAYOUTS = ("chapters/{folder}/exercises.py", "{chapter}_exercises.py", "exercises_{chapter}.py",
           "{folder}/exercises.py")

# Module-level code appended to a file: {solutions}, {other}, {canary}, {chapter} and {folder} are filled in.
HOSTILE = {
    "reader": '''
import os as _os, subprocess as _subprocess
_found = []
def _try(what, how):
    try:
        _found.append(f"{{what}}: {{str(how())[:3000]}}")
    except BaseException as error:
        _found.append(f"{{what}}: {{type(error).__name__}}: {{str(error)[:200]}}")
_try("the checkout's solutions", lambda: open({solutions!r}).read())
_try("solutions.py beside me", lambda: open(_os.path.join(_os.path.dirname(__file__), "solutions.py")).read())
_try("up the tree", lambda: [open(_os.path.join(p, "solutions.py")).read() for p in (_os.getcwd(), "..", "../..")])
import importlib as _importlib
_try("the editable install", lambda: open(_importlib.import_module("chapters.{folder}.solutions").__file__).read())
_try("another student", lambda: open({other!r}).read())
_try("a shell", lambda: _subprocess.run(["cat", {solutions!r}], capture_output=True).stdout)
_try("os.system", lambda: _os.system("cat " + {solutions!r}))
_try("the parent's environment", lambda: open(f"/proc/{{_os.getppid()}}/environ").read())
print("\\n".join(_found))
raise RuntimeError("what I could read:\\n" + "\\n".join(_found))
''',
    "deleter": '''
import os as _os, shutil as _shutil
_mine = _os.path.join(_os.path.dirname(__file__), "../../workbook")
for _what, _how in (("the canary", lambda: _os.remove({canary!r})),
                    ("another student", lambda: _shutil.rmtree(_os.path.dirname({other!r}))),
                    ("my own workbook", lambda: _shutil.rmtree(_mine)),
                    ("the canary, renamed", lambda: _os.rename({canary!r}, "stolen"))):
    try:
        _how()
        print(_what, "deleted")
    except BaseException as error:
        print(_what, type(error).__name__, error)
''',
    "printer": '''
print("x" * (50 << 20))
''',
    "forger": '''
import json as _json, os as _os
_line = _json.dumps({{"exercise": "{chapter}.1", "status": "correct", "message": "", "ratio": None}}) + "\\n"
for _fd in range(3, 64):
    try:
        _os.write(_fd, _line.encode())
    except OSError:
        pass
import workbook.exercises as _ex
_ex.evaluate = lambda exercise, module: _ex.Result(exercise, _ex.CORRECT)
import chapters.{folder}.checks as _checks
for _exercise in _checks.EXERCISES:
    _exercise.check = lambda module: None
''',
    "exiter": '''
import os as _os
_os._exit(0)
''',
    "quitter": '''
raise SystemExit("no grade for me")
''',
    "looper": '''
while True:
    pass
''',
}


def answered(chapter, wanted, planted=None):
    """The chapter's exercises.py with the regions of `wanted` (exercise ids) answered from solutions.py;
    planted: (exercise id, index) of a planted wrong answer to make in its region."""
    text = ex.module_path(chapter, "exercises").read_text()
    solutions = {r.id: r.code for r in ex.regions(ex.module_path(chapter, "solutions").read_text())}
    for ident in wanted:
        code = solutions[ident]
        if planted and planted[0] == ident:
            exercise = next(e for e in ex.all_exercises((chapter,)) if e.id == ident)
            old, new, *_ = ex.planted_wrong_answers(exercise)[planted[1]]
            code = code.replace(old, new)
        text = ex.replace_region(text, ident, code)
    return text


def chapter_file(chapter, kind, rng):
    ids = [e.id for e in ex.all_exercises((chapter,))]
    if kind == "partial":
        return answered(chapter, ids[:rng.randrange(1, len(ids))])
    if kind == "wrong":
        choices = [(e.id, i) for e in ex.all_exercises((chapter,)) for i in range(len(ex.planted_wrong_answers(e)))]
        return answered(chapter, ids, planted=rng.choice(choices))
    text = answered(chapter, ids)
    if kind == "broken":
        text += rng.choice(["\ndef unfinished(:\n", "\nimport numba_cuda_helpers_that_do_not_exist\n"])
    return text


def write(count, folder, seed):
    rng, folder = random.Random(seed), Path(folder)
    chapters = ex.chapters()
    if folder.exists() and any(folder.iterdir()):
        raise SystemExit(f"{folder} exists and is not empty")
    canary = folder.with_name(folder.name + ".canary")
    canary.write_text("a file no submission may touch\n")
    students = [f"s{number:03d}" for number in range(count)]
    hostile = {student: name for student, name in zip(students[3::HOSTILE_EVERY], sorted(HOSTILE))}
    for student in students:
        attempted = list(chapters)[:rng.randrange(0, len(chapters) + 1)]
        layout = rng.choice(LAYOUTS) if attempted else LAYOUTS[0]  # nothing done: the handout as it came
        for chapter, path in chapters.items():
            if chapter in attempted:
                text = chapter_file(chapter, rng.choices(list(KINDS), weights=list(KINDS.values()))[0], rng)
            elif layout.startswith("chapters/"):
                text = ex.module_path(chapter, "exercises").read_text()
            else:
                continue
            target = folder / student / layout.format(chapter=chapter, folder=path.name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    other = next((path for s in students if s not in hostile for path in sorted((folder / s).rglob("*.py"))),
                 folder / "nobody" / "exercises.py")  # another student's file, for the payloads to aim at
    for student, name in hostile.items():  # one chapter's file, in a checkout's layout: the payload and nothing else
        chapter = rng.choice(list(chapters))
        path = folder / student / "chapters" / chapters[chapter].name / "exercises.py"
        shutil.rmtree(folder / student, ignore_errors=True)
        path.parent.mkdir(parents=True)
        base = answered(chapter, []) if name in ("reader", "forger") else answered(chapter, [
            e.id for e in ex.all_exercises((chapter,))])
        path.write_text(base + HOSTILE[name].format(solutions=str(ex.module_path(chapter, "solutions")),
                                                    other=str(other), canary=str(canary), chapter=chapter,
                                                    folder=chapters[chapter].name))
    (folder / "zz-unrecognised").mkdir(parents=True)
    (folder / "zz-unrecognised" / "homework.zip").write_bytes(b"PK\x03\x04 not a layout")
    linked = folder / "zz-linked" / "ch00_measuring" / "exercises.py"
    linked.parent.mkdir(parents=True)
    linked.symlink_to(ex.module_path("ch00", "solutions"))
    manifest = {"canary": str(canary), "hostile": hostile, "files": _hashes(folder)}
    folder.with_name(folder.name + ".manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"wrote {count} submissions (+2 odd entries) to {folder}; hostile: {hostile}")


def _hashes(folder):
    return {p.relative_to(folder).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file() and not p.is_symlink()}


def answer_lines():
    """The lines of every answer that no lesson module shows (as tests/test_exercises.py counts them)."""
    def significant(code):
        lines = (re.sub(r"\s+#.*$", "", line.strip()) for line in code.splitlines())
        return {line for line in lines if len(line) >= 12 and not line.startswith("#")}

    taught = set().union(*(significant(p.read_text()) for top in ("chapters", "workbook")
                           for p in (ROOT / top).rglob("*.py") if p.name not in ("solutions.py", "checks.py")))
    return set().union(*(significant(r.code) for c in ex.chapters()
                         for r in ex.regions(ex.module_path(c, "solutions").read_text()))) - taught


def leaks(folder, grades):
    """(student, line) for each answer line in a student's rows or output that none of their files holds."""
    lines, found = answer_lines(), []
    for student, graded in grades["students"].items():
        own = "".join(p.read_text(errors="ignore") for p in (Path(folder) / student).rglob("*.py")
                      if p.is_file() and not p.is_symlink())
        text = json.dumps(graded)
        found += [(student, line) for line in lines if line not in own and json.dumps(line)[1:-1] in text]
    return found


def check(folder, grades_path):
    folder = Path(folder)
    manifest = json.loads(folder.with_name(folder.name + ".manifest.json").read_text())
    grades = json.loads(Path(grades_path).read_text())
    escaped = []
    if not Path(manifest["canary"]).exists():
        escaped.append(f"the canary {manifest['canary']} is gone")
    now = _hashes(folder)
    escaped += [f"{name} changed or gone" for name, digest in manifest["files"].items() if now.get(name) != digest]
    escaped += [f"{student}'s rows show an answer line they did not write: {line!r}"
                for student, line in leaks(folder, grades)]
    for student, name in manifest["hostile"].items():
        statuses = sorted({r["status"] for r in grades["students"][student]["exercises"].values()})
        print(f"{student} ({name}): {', '.join(statuses)}")
        if name == "forger" and any(r["status"] in ("correct", "fast enough")
                                    for r in grades["students"][student]["exercises"].values()):
            escaped.append(f"{student} (forger) has a passing grade")
    print("\n".join(escaped) if escaped else "no hostile submission got out: canary, submissions and rows intact")
    return 1 if escaped else 0


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("first", metavar="N|DIR")
    parser.add_argument("second", metavar="DIR|GRADES.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args()
    if not all(ex.has_solutions(c) for c in ex.chapters()):
        raise SystemExit("no solutions.py here (a handout): the answers are the instructor's")
    if args.check:
        return check(args.first, args.second)
    write(int(args.first), args.second, args.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
