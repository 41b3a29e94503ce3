"""A copy of the workbook for a class: what is committed, without the solutions or anything that
holds pieces of them (LEAVES_OUT, LEAVES_OUT_PATHS).

    python -m workbook handout DIR            refuses if the checkout has uncommitted or untracked
                                             files, or an exercise region that is not its stub
    python -m workbook handout DIR --force    writes the committed files all the same

In a git checkout the handout is `git archive HEAD`: an instructor's uncommitted answers and stray
files never reach the students. Outside one (a handout of a handout), every file is copied. Either
way the handout gets GitHub Classroom's autograding workflow (classroom.py).
"""

import io
import shutil
import subprocess
import tarfile
from pathlib import Path

from . import classroom, exercises
from .results import ROOT

LEAVES_OUT = ("solutions.py",)  # every chapter's
# A maintainer's trial of wrong answers: each is an edit of a solution, so it holds pieces of them.
LEAVES_OUT_PATHS = ("tools/wrong_answer_trial.py", "results/wrong_answer_trial.json",
                    ".github/workflows/book.yml")  # (and the workbook's website: not the class's to publish)


def left_out(relative):
    """Does the handout leave this file (a path relative to the root) out?"""
    relative = Path(relative)
    return relative.name in LEAVES_OUT or relative.as_posix() in LEAVES_OUT_PATHS
INSTALL = 'pip install -e ".[dev,compile,capstone]"'  # the README's install line
_NOT_A_CHECKOUT_SKIPS = {".git", ".venv", "__pycache__", ".pytest_cache", ".whl", "build"}


def _git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)


def is_checkout():
    return _git("rev-parse", "--is-inside-work-tree").returncode == 0


def problems():
    """Why a handout of this tree would not be what the class should get, one line each."""
    found = []
    if is_checkout():
        status = [line for line in _git("status", "--porcelain", "--untracked-files=all").stdout.splitlines() if line]
        untracked = [line[3:] for line in status if line.startswith("??")]
        changed = [line[3:] for line in status if not line.startswith("??")]
        if changed:
            found.append(f"uncommitted changes (the handout takes the committed version): {', '.join(changed[:8])}"
                         + (" ..." if len(changed) > 8 else ""))
        if untracked:
            found.append(f"untracked files (left out of the handout): {', '.join(untracked[:8])}"
                         + (" ..." if len(untracked) > 8 else ""))
        read = lambda path: _git("show", f"HEAD:{path.relative_to(ROOT).as_posix()}").stdout  # noqa: E731
    else:
        read = Path.read_text
    for chapter_id in exercises.chapters():
        path = exercises.module_path(chapter_id, "exercises")
        try:
            text = read(path)
        except OSError:
            continue
        solved = [r.id for r in exercises.regions(text) if not r.untouched]
        if solved:
            found.append(f"{path.relative_to(ROOT)} as committed has exercise regions that are not their stubs "
                         f"(answers the students would get): {', '.join(sorted(set(solved)))}")
    return found


def _files_of_this_tree():
    return [p.relative_to(ROOT) for p in ROOT.rglob("*")
            if p.is_file() and not _NOT_A_CHECKOUT_SKIPS.intersection(p.relative_to(ROOT).parts)]


def write(destination, force=False, repository=None, branch="main"):
    """Write the handout into `destination` (new or empty); returns the files written. Raises
    SystemExit naming the problems (see `problems`) unless `force`. With `repository` (the GitHub
    URL the handout will be pushed to), its notebooks are made ready for hosted services (hosted.py)."""
    destination = Path(destination)
    if repository:
        from . import hosted

        hosted.colab_url(repository, "")  # a GitHub URL, or say so before anything is written
    if destination.exists() and any(destination.iterdir()):
        raise SystemExit(f"{destination} exists and is not empty")
    found = problems()
    if found and not force:
        raise SystemExit("not writing a handout:\n" + "\n".join(f"- {line}" for line in found)
                         + "\nCommit or clean these first, or pass --force to write the committed files anyway.")
    destination.mkdir(parents=True, exist_ok=True)
    written = []
    if is_checkout():
        archive = subprocess.run(["git", "archive", "--format=tar", "HEAD"], cwd=ROOT, capture_output=True, check=True)
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            members = [m for m in tar.getmembers() if m.isfile() and not left_out(m.name)]
            tar.extractall(destination, members=members, filter="data")
        written = [m.name for m in members]
    else:
        for relative in _files_of_this_tree():
            if left_out(relative):
                continue
            (destination / relative).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / relative, destination / relative)
            written.append(relative.as_posix())
    workflow = destination / classroom.PATH  # GitHub Classroom's autograding, one test an exercise
    workflow.parent.mkdir(parents=True, exist_ok=True)
    workflow.write_text(classroom.workflow())
    written.append(classroom.PATH)
    if repository:
        from . import hosted

        hosted.make_handout_hosted(destination, repository, branch)
    return written, found
