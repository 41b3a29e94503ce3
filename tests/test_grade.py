"""The gradebook (`python -m workbook grade`): a tiny class graded end to end, hostile submissions
among it, on one cheap exercise (`--only ch00.1`) so that a run takes seconds.

The class is built as tools/synthetic_class.py builds one (its `answered` and `HOSTILE`): a right
answer and a planted wrong one from solutions.py, files that do not import, and files that read the
instructor's solutions.py, delete what is not theirs, print 50 MB, write into the grader's results,
replace the grader's functions, end the process or never finish importing.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import time

import pytest

from workbook import exercises as ex
from workbook import grade_guard, grade_sandbox, grade_submissions
from workbook.results import ROOT

EXERCISE, CHAPTER, FOLDER = "ch00.1", "ch00", "ch00_measuring"
pytestmark = pytest.mark.skipif(not ex.has_solutions(CHAPTER),
                                reason="no solutions.py here (a handout): the right answers are the instructor's")


def _synthetic():
    spec = importlib.util.spec_from_file_location("synthetic_class", ROOT / "tools" / "synthetic_class.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _student(klass, name, text, layout="chapters/{folder}/exercises.py"):
    path = klass / name / layout.format(folder=FOLDER, chapter=CHAPTER)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _grade(klass, tmp_path, *options, timeout=120):
    out, everything = tmp_path / "grades.csv", tmp_path / "grades.json"
    cache = [] if "--cache" in options else ["--no-cache"]
    done = subprocess.run([sys.executable, "-m", "workbook", "grade", str(klass), "--out", str(out), "--json",
                           str(everything), "--only", EXERCISE, "--jobs", "1", *cache, *options],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "WORKBOOK_DEVICE": "sim"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(everything.read_text()), out.read_text(), done.stdout


def _status(grades, student):
    return grades["students"][student]["exercises"][EXERCISE]


ISOLATIONS = ["process", pytest.param("namespaces", marks=pytest.mark.skipif(
    not grade_sandbox.namespaces_work(), reason="unprivileged user namespaces are not available here"))]


@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_class_with_hostile_submissions_costs_them_their_own_rows_only(tmp_path, isolation):
    synthetic, klass = _synthetic(), tmp_path / "class"
    solutions = ex.module_path(CHAPTER, "solutions")
    canary = tmp_path / "class.canary"
    canary.write_text("a file no submission may touch\n")
    before = {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in (solutions, canary)}
    right = synthetic.answered(CHAPTER, [EXERCISE])
    other = _student(klass, "right", right)
    _student(klass, "wrong", synthetic.answered(CHAPTER, [EXERCISE], planted=(EXERCISE, 0)), "{chapter}_exercises.py")
    _student(klass, "broken", right + "\ndef unfinished(:\n", "exercises_{chapter}.py")
    _student(klass, "stub", synthetic.answered(CHAPTER, []), "{folder}/exercises.py")
    for name, payload in synthetic.HOSTILE.items():
        if name != "looper":  # an endless import: the test below, with a short --timeout
            base = right if name == "deleter" else synthetic.answered(CHAPTER, [])
            _student(klass, name, base + payload.format(solutions=str(solutions), other=str(other), canary=str(canary),
                                                        chapter=CHAPTER, folder=FOLDER))
    submitted = {p: p.read_bytes() for p in klass.rglob("*.py")}

    grades, table, _ = _grade(klass, tmp_path, "--isolation", isolation)

    assert grades["isolation"] == isolation
    assert _status(grades, "right")["status"] == "correct"
    assert _status(grades, "wrong")["status"] == "wrong"
    assert _status(grades, "stub")["status"] == "not attempted"
    assert _status(grades, "broken")["message"].startswith("your exercises.py does not import: SyntaxError")
    assert _status(grades, "deleter")["status"] == "correct"  # its deletions refused, its answer graded as any
    reader = _status(grades, "reader")
    assert reader["status"] == "wrong" and "what I could read" in reader["message"]
    assert "the checkout's solutions: PermissionError" in reader["message"]  # the guard; namespaces: the test below
    assert "File too large" in _status(grades, "printer")["message"]
    assert len(json.dumps(grades["students"]["printer"])) < 100_000  # its output cut off, not 50 MB of it
    forged = _status(grades, "forger")
    assert forged["status"] == "wrong" and ("grader" in forged["message"]), forged
    assert _status(grades, "exiter")["status"] == "not graded"
    assert _status(grades, "quitter")["message"].startswith("your exercises.py does not import: SystemExit")
    answers = _synthetic().answer_lines()
    text = json.dumps(grades) + table
    assert not [line for line in answers if line in text or json.dumps(line)[1:-1] in text]
    assert {path: hashlib.sha256(path.read_bytes()).hexdigest() for path in before} == before
    assert {p: p.read_bytes() for p in klass.rglob("*.py")} == submitted


@pytest.mark.skipif(not grade_sandbox.namespaces_work(), reason="unprivileged user namespaces are not available here")
def test_namespaces_hide_the_checkout_and_leave_the_unit_alone_writable(tmp_path):
    """The layer under the guard, without it: what a process that got round the audit hook would see."""
    unit, elsewhere = tmp_path / "unit", tmp_path / "elsewhere"
    unit.mkdir()
    elsewhere.mkdir()
    script = (f"cat {ex.module_path(CHAPTER, 'solutions')} || echo hidden; touch {unit}/mine && echo written; "
              f"touch {elsewhere}/theirs || echo read-only; touch /usr/x 2>/dev/null || echo read-only; "
              "(exec 3<>/dev/tcp/127.0.0.1/9) 2>/dev/null || echo offline")
    command = grade_sandbox._namespace_command(["bash", "-c", script], hide=[str(ROOT), str(elsewhere)],
                                               keep=[str(unit), *grade_sandbox.python_folders()])
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.stdout.split() == ["hidden", "written", "read-only", "read-only", "offline"], done.stdout + done.stderr
    assert (unit / "mine").exists() and not (elsewhere / "theirs").exists()


def test_an_endless_import_is_timed_out_and_the_rest_is_graded(tmp_path):
    synthetic, klass = _synthetic(), tmp_path / "class"
    _student(klass, "right", synthetic.answered(CHAPTER, [EXERCISE]))
    _student(klass, "looper", synthetic.answered(CHAPTER, []) + synthetic.HOSTILE["looper"])
    started = time.monotonic()
    grades, _, _ = _grade(klass, tmp_path, "--timeout", "6")
    assert time.monotonic() - started < 60
    assert _status(grades, "right")["status"] == "correct"
    assert _status(grades, "looper")["status"] == "timed out"


def test_identical_files_are_graded_once_and_cached(tmp_path):
    synthetic, klass = _synthetic(), tmp_path / "class"
    right = synthetic.answered(CHAPTER, [EXERCISE])
    for name in ("a", "b", "c"):
        _student(klass, name, right)
    _student(klass, "d", synthetic.answered(CHAPTER, []))
    cache = tmp_path / "cache"
    first, _, said = _grade(klass, tmp_path, "--cache", str(cache))
    assert "2 chapter files to grade" in said
    again, _, said = _grade(klass, tmp_path, "--cache", str(cache))
    assert "0 chapter files to grade" in said
    assert again["students"] == first["students"]
    assert [_status(again, s)["status"] for s in "abcd"] == ["correct"] * 3 + ["not attempted"]


def test_layouts_are_read_and_links_are_not_followed(tmp_path):
    chapters = {"ch00": FOLDER, "ch01": "ch01_relu_mask"}
    (tmp_path / "checkout" / "chapters" / FOLDER).mkdir(parents=True)
    (tmp_path / "checkout" / "chapters" / FOLDER / "exercises.py").write_text("a = 1\n")
    (tmp_path / "checkout" / "README.md").write_text("mine")
    (tmp_path / "flat").mkdir()
    (tmp_path / "flat" / "ch00_exercises.py").write_text("a = 2\n")
    (tmp_path / "flat" / "exercises_ch01.py").write_text("a = 3\n")
    (tmp_path / "flat" / "exercises_ch07.py").write_text("a = 4\n")
    (tmp_path / "twice" / "ch00").mkdir(parents=True)
    (tmp_path / "twice" / "ch00" / "exercises.py").write_text("a = 5\n")
    (tmp_path / "twice" / "ch00_exercises.py").write_text("a = 6\n")
    (tmp_path / "linked").mkdir()
    (tmp_path / "linked" / "ch00_exercises.py").symlink_to(ex.module_path(CHAPTER, "solutions"))
    (tmp_path / "notes").mkdir()
    (tmp_path / "notes" / "answers.txt").write_text("")
    (tmp_path / "archive.zip").write_bytes(b"PK")
    found = {s.student: s for s in grade_submissions.find(tmp_path, chapters)}
    assert found["checkout"].files == {"ch00": b"a = 1\n"} and not found["checkout"].not_graded
    assert found["flat"].files == {"ch00": b"a = 2\n", "ch01": b"a = 3\n"}
    assert any("ch07" in line for line in found["flat"].problems)
    assert "two files for ch00" in found["twice"].not_graded["ch00"]
    assert "symbolic link" in found["linked"].not_graded["ch00"] and not found["linked"].files
    assert "layout not recognised" in found["notes"].not_graded["*"]
    assert "not a folder" in found["archive.zip"].not_graded["*"]


def test_the_guard_refuses_what_grading_never_needs(tmp_path):
    """The audit hook alone, in a process of its own: reads outside `read`, writes outside `write`,
    processes, sockets, ctypes' dlopen, a rebound os.path.realpath changing nothing."""
    (tmp_path / "home").mkdir()
    outside = tmp_path / "outside.txt"
    outside.write_text("secret")
    script = f"""
import ctypes, os, os.path, shutil, socket, subprocess, sys
sys.path.insert(0, {str(ROOT)!r})
from workbook import grade_guard
grade_guard.install(read=[sys.prefix, sys.base_prefix], write=[{str(tmp_path / 'home')!r}])
os.path.realpath = lambda path: {str(tmp_path / 'home')!r}
attempts = {{
    "read": lambda: open({str(outside)!r}).read(),
    "write": lambda: open({str(tmp_path / 'new.txt')!r}, "w"),
    "remove": lambda: os.remove({str(outside)!r}),
    "rmtree": lambda: shutil.rmtree({str(tmp_path)!r}),
    "link": lambda: os.link({str(outside)!r}, {str(tmp_path / 'home' / 'in.txt')!r}),
    "listdir": lambda: os.listdir({str(tmp_path)!r}),
    "subprocess": lambda: subprocess.run(["true"]),
    "system": lambda: os.system("true"),
    "socket": lambda: socket.create_connection(("127.0.0.1", 9)),
    "dlopen": lambda: ctypes.CDLL("libc.so.6"),
    "kill": lambda: os.kill(os.getppid(), 0),
}}
refused = []
for name, attempt in attempts.items():
    try:
        attempt()
    except PermissionError as error:
        refused.append(name) if "refused while grading" in str(error) else None
open({str(tmp_path / 'home' / 'mine.txt')!r}, "w").write("allowed")
print(",".join(refused))
"""
    done = subprocess.run([sys.executable, "-I", "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().split(",") == ["read", "write", "remove", "rmtree", "link", "listdir", "subprocess",
                                              "system", "socket", "dlopen", "kill"]
    assert outside.read_text() == "secret" and (tmp_path / "home" / "mine.txt").read_text() == "allowed"


def test_the_tripwire_names_a_replaced_function_and_a_replaced_check():
    exercise = next(e for e in ex.all_exercises((CHAPTER,)) if e.id == EXERCISE)
    tripwire = grade_guard.Tripwire(objects=[exercise])
    assert tripwire.changed() == []
    evaluate, check = ex.evaluate, exercise.check
    try:
        ex.evaluate = lambda exercise, module: ex.Result(exercise, ex.CORRECT)
        exercise.check = lambda module: None
        assert tripwire.changed() == ["workbook.exercises.evaluate", f"<{EXERCISE}>.check"]
    finally:
        ex.evaluate, exercise.check = evaluate, check
    assert tripwire.changed() == []
