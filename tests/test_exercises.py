"""The exercises: every check run against solutions.py (the default) or your exercises.py (--exercises),
and the proofs that exercises, solutions and checks cannot drift apart or pass vacuously.

    python -m pytest --exercises              your exercises.py: not attempted / wrong / correct, a table
    python -m pytest --exercises -k ch01      one chapter
    python -m pytest --exercises --solutions  the solutions (the README's test command runs them too)
"""

import os
import workbook  # noqa: I001


import pytest

from workbook import exercises as ex

EXERCISES = ex.all_exercises()
CHAPTERS = ex.chapters()
pytestmark = pytest.mark.exercise


def _solutions_or_skip(chapter_id):
    if not ex.has_solutions(chapter_id):
        pytest.skip("no solutions.py here (a handout): the solutions are the instructor's")


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_exercise(exercise, request, record_property):
    students = request.config.getoption("--exercises") and not request.config.getoption("--solutions")
    if not students:
        _solutions_or_skip(exercise.chapter)
    result = ex.evaluate(exercise, ex.load(exercise.chapter, "exercises" if students else "solutions"))
    record_property("exercise", ex.progress_rows([result])[0])
    if not result.passed:
        pytest.fail(result.line(), pytrace=False)
    if not students and not workbook.ON_GPU and exercise.speed is None:  # what "work done twice" is measured against
        assert result.traffic == ex.reference_traffic().get(exercise.id), (
            f"{exercise.id}: chapters/exercise_traffic.json is stale: python -m workbook exercises --store-traffic")


# ---------------------------------------------------------------------------------------------
# Exercises and solutions agree, and no check passes vacuously


@pytest.mark.parametrize("chapter", list(CHAPTERS))
def test_exercises_and_solutions_share_everything_outside_the_regions(chapter):
    _solutions_or_skip(chapter)
    exercises = ex.module_path(chapter, "exercises").read_text()
    solutions = ex.module_path(chapter, "solutions").read_text()
    assert ex.skeleton(exercises) == ex.skeleton(solutions), (
        f"{chapter}: exercises.py and solutions.py differ outside the '# >>>' regions")
    ids = {e.id for e in EXERCISES if e.chapter == chapter}
    assert {r.id for r in ex.regions(exercises)} == ids, f"{chapter}: regions and checks.py disagree"
    for region in ex.regions(solutions):
        assert not region.untouched, f"{region.id}: the solution is still the stub"
    planted = ex.load(chapter, "solutions").PLANTED_WRONG_ANSWERS
    assert set(planted) == ids and all(planted.values()), f"{chapter}: every exercise needs a planted wrong answer"


@pytest.fixture
def not_compiled(monkeypatch):
    """Stubs and planted wrong answers must fail their check, not the GPU compiler (and compiling
    code written to be wrong would only cost time)."""
    monkeypatch.setenv("WORKBOOK_COMPILE", "0")


def _variant(exercise, code, tmp_path, label):
    """solutions.py with this exercise's region(s) replaced by `code`, imported from tmp_path."""
    solutions = ex.module_path(exercise, "solutions").read_text()
    return ex.load_source(ex.replace_region(solutions, exercise.id, code), tmp_path, label)


@pytest.mark.parametrize("exercise", EXERCISES, ids=lambda e: e.id)
def test_check_fails_on_the_untouched_stub(exercise, tmp_path, not_compiled):
    _solutions_or_skip(exercise.chapter)
    stubs = [r for r in ex.regions(ex.module_path(exercise, "exercises").read_text()) if r.id == exercise.id]
    if not all(r.untouched for r in stubs):
        pytest.skip(f"{exercise.id} is edited in exercises.py: the untouched stub is checked on a fresh clone")
    if len(stubs) != 1:
        pytest.skip("several regions: the stub is checked through the status")
    stub = _variant(exercise, stubs[0].code, tmp_path, f"{exercise.id}_stub")
    if exercise.kind == "faster":  # correct by design; too slow (on a GPU) or too much traffic (simulator)
        exercise.check(stub)
        ratio, what = exercise.speed(stub)
        assert ratio < exercise.target, f"the untouched stub already meets the target: {ratio:.2f} ({what})"
        return
    with pytest.raises(Exception) as failure:  # noqa: PT011  (a stub may fail any way it likes)
        exercise.check(stub)
    print(f"{exercise.id} on its stub: {failure.value}")
    if exercise.kind == "fix" and not workbook.ON_GPU:  # the planted bug runs: what it says must not vary
        with pytest.raises(Exception) as again:  # noqa: PT011
            exercise.check(stub)
        assert str(again.value) == str(failure.value), (
            f"{exercise.id}: the stub's message changed from one run to the next:\n{failure.value}\n---\n{again.value}")


PLANTED = [(e, index) for e in EXERCISES if ex.has_solutions(e.chapter)
           for index in range(len(ex.planted_wrong_answers(e)))]


@pytest.mark.parametrize("exercise, index", PLANTED, ids=lambda v: v.id if hasattr(v, "id") else str(v))
def test_check_fails_on_a_planted_wrong_answer(exercise, index, tmp_path, not_compiled):
    old, new, *where = ex.planted_wrong_answers(exercise)[index]
    if where == ["simulator"] and workbook.ON_GPU:
        pytest.skip("revealed by the simulator only: by its extra grids (a grid hard-coded to the wrapper's) "
                    "or by the bytes it moves (wasted work)")
    answers = [r for r in ex.regions(ex.module_path(exercise, "solutions").read_text()) if r.id == exercise.id]
    assert len(answers) == 1 and answers[0].code.count(old) == 1, (
        f"{exercise.id}: the planted edit {old!r} must occur exactly once in the answer")
    wrong = _variant(exercise, answers[0].code.replace(old, new), tmp_path, f"{exercise.id}_wrong{index}")
    result = ex.evaluate(exercise, wrong)  # as a student's answer is graded: strict, sanitized, on other grids
    assert not result.passed, f"{exercise.id} with {old!r} -> {new!r} is graded {result.status}"
    print(f"{exercise.id} with {old!r} -> {new!r}: {result.message}")


# Answers that are right on a GPU and that the simulator once graded wrong (solutions.py's
# RIGHT_ON_A_GPU: pieces of the answers, so they stay out of the handout with them).
GPU_CORRECT = [(e.id, old, new) for e in EXERCISES if ex.has_solutions(e.chapter) for old, new in ex.right_on_a_gpu(e)]


@pytest.mark.parametrize("exercise_id, old, new", GPU_CORRECT, ids=[g[0] for g in GPU_CORRECT])
def test_an_answer_right_on_a_gpu_is_graded_correct(exercise_id, old, new, tmp_path):
    exercise = next(e for e in EXERCISES if e.id == exercise_id)
    (answer,) = [r for r in ex.regions(ex.module_path(exercise, "solutions").read_text()) if r.id == exercise.id]
    assert answer.code.count(old) == 1
    module = _variant(exercise, answer.code.replace(old, new), tmp_path, f"{exercise.id}_gpu_correct")
    result = ex.evaluate(exercise, module)
    assert result.passed, result.line()


def _checkout_copy(tmp_path):
    """A git clone of this checkout at its HEAD, with the workbook's handout module to run there."""
    import subprocess

    from workbook import results

    from workbook import handout

    if not handout.is_checkout():
        pytest.skip("not a git checkout: the handout is built from a checkout's committed files")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(results.ROOT), str(clone)], check=True)
    return clone


def _handout(clone, destination, *extra):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "workbook", "handout", str(destination), *extra], cwd=clone,
                          capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(clone),
                                                               "WORKBOOK_DEVICE": "sim", "WORKBOOK_COMPILE": "0"})


def test_handout_is_the_committed_workbook_without_the_solutions(tmp_path):
    clone = _checkout_copy(tmp_path)
    done = _handout(clone, tmp_path / "handout")
    assert done.returncode == 0, done.stdout + done.stderr
    handout = tmp_path / "handout"
    names = {p.name for p in handout.rglob("*") if p.is_file()}
    assert "solutions.py" not in names and "exercises.py" in names and "checks.py" in names
    assert not (handout / ".git").exists()
    assert 'pip install -e ".[dev,compile,capstone]"' in done.stdout  # the README's install line
    assert 'pip install -e ".[dev,compile,capstone]"' in (handout / "README.md").read_text()


def _significant_lines(code):
    """The lines of code that say something (12 characters or more, comments and blanks dropped)."""
    import re

    lines = (re.sub(r"\s+#.*$", "", line.strip()) for line in code.splitlines())
    return {line for line in lines if len(line) >= 12 and not line.startswith("#")}


def test_the_handout_ships_no_answer(tmp_path):
    """No file of the handout holds an answer: of each solution region's lines that no lesson module
    of any chapter (nor workbook/) has, none in tools/ or in stored results other than the chapters'
    run logs (which print what the lessons show), and never more than half of them in any one file."""
    from workbook import handout as ho

    if not CHAPTERS or not all(ex.has_solutions(c) for c in CHAPTERS):
        pytest.skip("no solutions.py here (a handout): nothing to compare with")
    clone = _checkout_copy(tmp_path)
    assert _handout(clone, tmp_path / "handout").returncode == 0
    root = tmp_path / "handout"
    for path in ho.LEAVES_OUT_PATHS:
        assert (clone / path).exists() and not (root / path).exists(), path
    texts = {p.relative_to(root).as_posix(): p.read_text(errors="ignore") for p in root.rglob("*")
             if p.is_file() and p.suffix in (".py", ".json", ".md", ".log", ".txt", ".ipynb", ".toml", ".yml", ".sh")}
    taught = set().union(*(_significant_lines(text) for name, text in texts.items() if name.endswith(".py")
                           and name.startswith(("chapters/", "workbook/")) and not name.endswith("/checks.py")))
    held = []
    for chapter_id in CHAPTERS:
        handed = texts[ex.module_path(chapter_id, "exercises").relative_to(ex.CHAPTERS.parent).as_posix()]
        for region in ex.regions(ex.module_path(chapter_id, "solutions").read_text()):
            # (a line the stub or its spec already holds, as ch00.2's "dst[i] = src[n - 1 - i]", gives nothing away)
            answer = {line for line in _significant_lines(region.code) - taught if line not in handed}
            for name, text in texts.items():
                found = [line for line in answer if line in text]
                strict = name.startswith("tools/") or (name.startswith("results/") and not name.endswith(".log"))
                if found and (strict or (len(answer) >= 2 and 2 * len(found) > len(answer))):
                    held.append(f"{name} holds {len(found)} of {region.id}'s {len(answer)} answer lines: {found[:2]}")
    assert not held, "\n".join(held)


def test_handout_refuses_uncommitted_answers_and_stray_files(tmp_path):
    from workbook import exercises as ex

    clone = _checkout_copy(tmp_path)
    (clone / "notes.html").write_text("<p>an instructor's notes</p>")
    exercises_py = clone / ex.module_path("ch01", "exercises").relative_to(ex.CHAPTERS.parent)
    exercises_py.write_text(exercises_py.read_text().replace(
        'raise NotImplementedError("ch01.1', 'bits = 0  # an answer\n        raise NotImplementedError("ch01.1', 1))
    refused = _handout(clone, tmp_path / "refused")
    assert refused.returncode != 0
    assert "notes.html" in refused.stderr and "exercises.py" in refused.stderr and "--force" in refused.stderr
    assert not (tmp_path / "refused").exists()

    forced = _handout(clone, tmp_path / "forced", "--force")  # the committed files, without the edits
    assert forced.returncode == 0, forced.stderr
    assert not (tmp_path / "forced" / "notes.html").exists()
    shipped = tmp_path / "forced" / exercises_py.relative_to(clone)
    assert "# an answer" not in shipped.read_text()

    import subprocess  # an answer committed is refused too: it is in the regions, not in git's status

    subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "answer"], cwd=clone,
                   check=True)
    (clone / "notes.html").unlink()
    refused = _handout(clone, tmp_path / "refused-again")
    assert refused.returncode != 0 and "ch01.1" in refused.stderr


def test_wasted_work_is_judged_in_all_and_launch_by_launch_where_the_reference_uses_shared_memory():
    reference = {"kernels": ["k", "k"], "global": [100, 100], "shared": [0, 1000]}

    def mine(global_bytes, shared_bytes):
        return {"kernels": ["k", "k"], "global": global_bytes, "shared": shared_bytes}

    assert ex.wasted_work(mine([100, 100], [0, 1000]), reference) is None
    assert "1.6x the global-memory bytes" in ex.wasted_work(mine([200, 120], [0, 1000]), reference)
    # An extra step of zeros: no more global bytes, twice the shared ones, in launch 2
    assert "launch 2 of 2 (k)" in ex.wasted_work(mine([100, 100], [0, 2000]), reference)
    # Shared memory where the reference uses none is a way of doing it, not waste
    assert ex.wasted_work(mine([100, 100], [5000, 1000]), reference) is None
    # Another number of launches: only the totals compare
    assert ex.wasted_work({"kernels": ["k"], "global": [200], "shared": [9000]}, reference) is None
    assert ex.wasted_work(mine([100, 100], [0, 2000]), None) is None
