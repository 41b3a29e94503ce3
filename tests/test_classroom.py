"""GitHub Classroom's autograding workflow (workbook/classroom.py): a valid workflow with one graded
test per exercise, written into every handout, whose commands grade a handout's exercises as
`python -m pytest --exercises` does."""

import os
import re
import subprocess
import sys

import pytest
import yaml

from workbook import classroom
from workbook import exercises as ex
from workbook import handout

EXERCISES = ex.all_exercises()


def test_the_workflow_is_one_graded_test_an_exercise_then_the_reporter():
    flow = yaml.safe_load(classroom.workflow())
    assert set(flow[True]) == {"push", "workflow_dispatch", "repository_dispatch"}  # YAML 1.1 reads `on` as True
    assert flow["permissions"] == {"checks": "write", "actions": "read", "contents": "read"}
    job = flow["jobs"]["autograding"]
    assert job["runs-on"] == "ubuntu-latest" and job["env"]["WORKBOOK_DEVICE"] == "sim"
    steps = job["steps"]
    graders = [s for s in steps if s.get("uses") == "classroom-resources/autograding-command-grader@v1"]
    assert [g["id"] for g in graders] == [classroom.step_id(e) for e in EXERCISES]
    assert all(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", g["id"]) for g in graders)
    install = next(i for i, s in enumerate(steps) if s.get("name") == "Install the workbook")
    assert install < steps.index(graders[0])
    for exercise, grader in zip(EXERCISES, graders):
        assert grader["with"]["command"] == classroom.command(exercise)
        assert grader["with"]["max-score"] == classroom.POINTS and grader["with"]["timeout"] == classroom.MINUTES
        assert grader["with"]["test-name"].startswith(exercise.id + " ")
    reporter = steps[-1]
    assert reporter["uses"] == "classroom-resources/autograding-grading-reporter@v1"
    runners = reporter["with"]["runners"].split(",")
    assert runners == [g["id"] for g in graders]
    # the reporter reads each runner's result from <ID>_RESULTS (upper case)
    assert reporter["env"] == {f"{r.upper()}_RESULTS": f"${{{{steps.{r}.outputs.result}}}}" for r in runners}


def test_each_command_collects_its_exercise_and_nothing_else():
    node_ids = [re.search(r'"(tests/[^"]+)"', classroom.command(e)).group(1) for e in EXERCISES]
    done = subprocess.run([sys.executable, "-m", "pytest", "--exercises", "--collect-only", "-q",
                           "-p", "no:cacheprovider", *node_ids],
                          capture_output=True, text=True, cwd=ex.CHAPTERS.parent, env=_sim())
    collected = [line for line in done.stdout.splitlines() if line.startswith("tests/")]
    assert collected == node_ids, done.stdout + done.stderr


def _sim():
    return {**os.environ, "WORKBOOK_DEVICE": "sim", "WORKBOOK_COMPILE": "0"}


def _grade(root, exercise):
    """The workflow's command for `exercise`, run in a handout at `root`: (exit status, output)."""
    flow = yaml.safe_load((root / classroom.PATH).read_text())
    step = next(s for s in flow["jobs"]["autograding"]["steps"] if s.get("id") == classroom.step_id(exercise))
    done = subprocess.run(step["with"]["command"], shell=True, cwd=root, capture_output=True, text=True,
                          env={**_sim(), "PYTHONPATH": str(root)})
    return done.returncode, done.stdout + done.stderr


def test_a_handout_carries_the_workflow_and_its_commands_grade_it(tmp_path):
    """In a fresh handout a stub scores nothing ("not attempted"); with the answer in, it scores."""
    root = tmp_path / "handout"
    written, _ = handout.write(root, force=True)
    assert classroom.PATH in written
    assert (root / classroom.PATH).read_text() == classroom.workflow()
    assert not (root / ".github" / "workflows" / "book.yml").exists()  # the workbook's website is not the class's
    exercise = next(e for e in EXERCISES if e.id == "ch00.1")
    status, output = _grade(root, exercise)
    assert status != 0 and "not attempted" in output, output
    if not ex.has_solutions(exercise.chapter):
        pytest.skip("no solutions.py here (a handout): no answer to put in")
    answer = next(r for r in ex.regions(ex.module_path(exercise, "solutions").read_text()) if r.id == exercise.id)
    mine = root / ex.module_path(exercise, "exercises").relative_to(ex.CHAPTERS.parent)
    mine.write_text(ex.replace_region(mine.read_text(), exercise.id, answer.code))
    status, output = _grade(root, exercise)
    assert status == 0 and "1 passed" in output, output
