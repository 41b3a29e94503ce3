"""A class's submissions: one entry per student in a folder, the entry's name the student's id.

What a student's folder may hold, one of (LAYOUTS):

    chapters/ch01_relu_mask/exercises.py     their checkout or handout, as it is (other files ignored)
    ch01_relu_mask/exercises.py              each chapter's file in a folder of its own
    ch01/exercises.py
    ch01_exercises.py                        the files side by side
    exercises_ch01.py

A chapter with no file is the handout's stub (not attempted). Only regular files are read: a
symbolic link (to the instructor's solutions.py, say) or a file over MAX_BYTES is reported and not
graded; so is a chapter with two files, or an entry with none of these.
"""

import os
import re
from dataclasses import dataclass, field
from pathlib import Path

LAYOUTS = (
    re.compile(r"^chapters/(?P<chapter>ch\d\d)(?:_[^/]*)?/exercises\.py$"),
    re.compile(r"^(?P<chapter>ch\d\d)(?:_[^/]*)?/exercises\.py$"),
    re.compile(r"^(?P<chapter>ch\d\d)_exercises\.py$"),
    re.compile(r"^exercises_(?P<chapter>ch\d\d)\.py$"),
)
MAX_BYTES = 1 << 20
SKIPPED = {".git", "__pycache__", ".venv", "build", ".ipynb_checkpoints", "node_modules"}
DEPTH = 3  # chapters/chNN_name/exercises.py


@dataclass
class Submission:
    student: str
    files: dict = field(default_factory=dict)  # chapter id -> the bytes of its exercises.py
    not_graded: dict = field(default_factory=dict)  # chapter id -> why (every chapter: "*")
    problems: list = field(default_factory=list)  # what the report says about this entry


def find(folder, chapters):
    """[Submission] of every entry of `folder` (hidden ones skipped), by name; `chapters`: the ids graded."""
    found = []
    for entry in sorted(Path(folder).iterdir(), key=lambda p: p.name):
        if not entry.name.startswith("."):
            found.append(read(entry, chapters))
    return found


def read(entry, chapters):
    submission = Submission(entry.name)
    if entry.is_symlink() or not entry.is_dir():
        submission.not_graded["*"] = "layout not recognised: not a folder"
        return submission
    matched, seen = {}, []
    for relative, path in _files(entry):
        seen.append(relative)
        for layout in LAYOUTS:
            match = layout.match(relative)
            if match:
                matched.setdefault(match["chapter"], []).append((relative, path))
                break
    if not matched:
        listed = ", ".join(seen[:5]) + (" ..." if len(seen) > 5 else "") if seen else "nothing"
        submission.not_graded["*"] = (
            "layout not recognised: no chapters/chNN_*/exercises.py, chNN_*/exercises.py, chNN/exercises.py, "
            f"chNN_exercises.py or exercises_chNN.py in it (found {listed})")
        return submission
    for chapter, candidates in sorted(matched.items()):
        if chapter not in chapters:
            submission.problems.append(f"{candidates[0][0]}: no chapter {chapter} is graded; ignored")
            continue
        if len(candidates) > 1:
            submission.not_graded[chapter] = f"two files for {chapter}: {', '.join(c[0] for c in candidates)}"
            continue
        relative, path = candidates[0]
        why = _unreadable(path)
        if why:
            submission.not_graded[chapter] = f"{relative}: {why}"
        else:
            submission.files[chapter] = path.read_bytes()
    for chapter, why in submission.not_graded.items():
        submission.problems.append(f"{chapter} not graded: {why}")
    return submission


def _files(entry):
    """(relative path, path) of the files under `entry`, DEPTH deep, never through a link."""
    for directory, folders, files in os.walk(entry, followlinks=False):
        depth = len(Path(directory).relative_to(entry).parts)
        folders[:] = sorted(f for f in folders if f not in SKIPPED and depth < DEPTH - 1)
        for name in sorted(files):
            path = Path(directory) / name
            yield path.relative_to(entry).as_posix(), path


def _unreadable(path):
    if path.is_symlink():
        return "a symbolic link, not a file: not followed"
    if not path.is_file():
        return "not a regular file"
    if path.stat().st_size > MAX_BYTES:
        return f"larger than {MAX_BYTES} bytes"
    return None
