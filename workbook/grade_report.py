"""The gradebook's outputs: grades.csv (a row per student and exercise), a JSON with everything, and
the summary printed with rich: per student, then per exercise, the exercises the class fails most first.
"""

import csv
import io
import json
import os
from pathlib import Path

from .exercises import CORRECT, FAST, NOT_ATTEMPTED, PASSING, SLOW, WRONG
from .grade_one import NOT_GRADED

TIMED_OUT = "timed out"  # the unit's process was stopped before it graded this exercise
ORDER = (CORRECT, FAST, SLOW, WRONG, NOT_ATTEMPTED, TIMED_OUT, NOT_GRADED)
COLOURS = {CORRECT: "green", FAST: "green", SLOW: "yellow", WRONG: "red", NOT_ATTEMPTED: "dim",
           TIMED_OUT: "magenta", NOT_GRADED: "magenta"}
CSV_COLUMNS = ("student", "chapter", "exercise", "status", "points", "message")


def points_table(path, exercises, known):
    """{exercise id: {status: points}} of `exercises`: 1 for correct or fast enough, 0 otherwise, unless the
    JSON file at `path` says otherwise: {"ch01.4": 2} (for passing) or {"ch01.4": {"fast enough": 2,
    "too slow": 1}}. known: every exercise's id (one the file names that is not graded now is left aside)."""
    table = {e.id: {status: 1.0 for status in PASSING} for e in exercises}
    given = json.loads(Path(path).read_text()) if path else {}
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise SystemExit(f"{path}: there is no exercise {', '.join(unknown)}")
    for ident, value in given.items():
        if ident in table:
            table[ident] = ({status: float(p) for status, p in value.items()} if isinstance(value, dict)
                            else {status: float(value) for status in PASSING})
    return table


def rows(students, exercises):
    """The CSV's rows, student by student, exercise by exercise."""
    found = []
    for student, graded in students.items():
        for exercise in exercises:
            record = graded["exercises"][exercise.id]
            found.append({"student": student, "chapter": exercise.chapter, "exercise": exercise.id,
                          "status": record["status"], "points": record["points"],
                          "message": (record["message"] or "").strip().split("\n", 1)[0]})
    return found


def write_atomically(path, text):
    """Write a file whole, replacing what is there (a link a submission left at that path included)."""
    path = Path(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text, encoding="utf-8")
    os.replace(temporary, path)


def write_csv(path, table):
    """The rows; a cell that a spreadsheet would take for a formula (=, +, -, @: a student's name, an
    exception's text) starts with a quote instead."""
    def cell(value):
        return "'" + value if isinstance(value, str) and value[:1] in ("=", "+", "-", "@") else value

    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS)
    writer.writeheader()
    writer.writerows({key: cell(value) for key, value in row.items()} for row in table)
    write_atomically(path, buffer.getvalue())


def write_json(path, everything):
    write_atomically(path, json.dumps(everything, indent=1) + "\n")


def summary(console, students, exercises, maximum):
    """Per student: points and how many of each status; per exercise: how many passed, fewest first."""
    from rich.markup import escape
    from rich.table import Table

    every = [r for graded in students.values() for r in graded["exercises"].values()]
    shown = [status for status in ORDER if any(r["status"] == status for r in every)]
    per_student = Table(title=f"Grades: {len(students)} submissions, {len(exercises)} exercises each")
    per_student.add_column("student")
    per_student.add_column("points", justify="right")
    for status in shown:
        per_student.add_column(f"[{COLOURS[status]}]{status}[/]", justify="right")
    for student, graded in students.items():
        counts = count_statuses(graded["exercises"].values())
        per_student.add_row(escape(student), f"{graded['points']:g} / {maximum:g}",
                            *[str(counts.get(status) or "") for status in shown])
    console.print(per_student)

    per_exercise = Table(title="Exercises, the ones the class fails most first")
    for column in ("exercise", "title", "passed", WRONG, SLOW, NOT_ATTEMPTED, "other"):
        per_exercise.add_column(column, justify="left" if column in ("exercise", "title") else "right")
    tallies = []
    for exercise in exercises:
        counts = count_statuses(graded["exercises"][exercise.id] for graded in students.values())
        passed = sum(counts.get(status, 0) for status in PASSING)
        tallies.append((passed, exercise.id, exercise.title, counts))
    for passed, ident, title, counts in sorted(tallies):
        other = counts.get(TIMED_OUT, 0) + counts.get(NOT_GRADED, 0)
        shown = [str(counts.get(status) or "") for status in (WRONG, SLOW, NOT_ATTEMPTED)]
        per_exercise.add_row(ident, title, f"{passed} / {len(students)}", *shown, str(other or ""))
    console.print(per_exercise)


def count_statuses(records):
    """{status: how many of `records` have it}."""
    counts = {}
    for record in records:
        counts[record["status"]] = counts.get(record["status"], 0) + 1
    return counts
