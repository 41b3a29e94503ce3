"""GitHub Classroom: the autograding workflow a handout carries, `.github/workflows/classroom.yml`.

GitHub Classroom gives each student a repository made from the instructor's template (a handout:
`python -m workbook handout DIR`, pushed as a template repository). On every push the workflow below
runs in the student's own repository, on GitHub's CPU runners, in the simulator: one graded test an
exercise, each the same check `python -m pytest --exercises` runs, worth `POINTS` points when it
passes (correct, or fast enough). What the student reads in the Actions log is the check's message.
The reporter step hands the scores to Classroom.

The workflow is written from the exercises (`workflow()`), so a new exercise is graded without
editing YAML; an instructor who wants other points edits `max-score` in the handout's copy.
"""

from . import exercises

PATH = ".github/workflows/classroom.yml"
POINTS = 1  # an exercise's points when it passes
MINUTES = 10  # a check's time limit on the runner (the slowest takes under a minute on two cores)
INSTALL = 'python -m pip install -q -e ".[dev,compile]"'  # the README's, less the capstone's data


def step_id(exercise):
    """ch01.2 -> ch01-2 (a step id: letters, digits, '-' and '_')."""
    return exercise.id.replace(".", "-")


def command(exercise):
    """The command that grades one exercise as `python -m pytest --exercises` grades it."""
    return (f'python -m pytest --exercises -q -p no:cacheprovider "tests/test_exercises.py::test_exercise'
            f'[{exercise.id}]"')


def _quoted(text):
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def workflow(found=None):
    """The workflow's YAML text: one graded step per exercise, then the reporter."""
    found = exercises.all_exercises() if found is None else found
    lines = [
        "# Written by `python -m workbook handout` (workbook/classroom.py): one graded test per exercise.",
        "name: Autograding",
        "on:",
        "  push:",
        "  workflow_dispatch:",
        "  repository_dispatch:",
        "permissions:",
        "  checks: write",
        "  actions: read",
        "  contents: read",
        "jobs:",
        "  autograding:",
        "    runs-on: ubuntu-latest",
        "    if: github.actor != 'github-classroom[bot]'",
        "    env:",
        "      WORKBOOK_DEVICE: sim  # GitHub's runners have no GPU: every check runs in the simulator",
        "    steps:",
        "      - uses: actions/checkout@v4",
        "      - uses: actions/setup-python@v5",
        "        with:",
        "          python-version: '3.12'",
        "          cache: pip",
        "      - name: Install the workbook",
        f"        run: {INSTALL}",
    ]
    for exercise in found:
        lines += [
            f"      - name: {_quoted(exercise.id + ' ' + exercise.title)}",
            f"        id: {step_id(exercise)}",
            "        uses: classroom-resources/autograding-command-grader@v1",
            "        with:",
            f"          test-name: {_quoted(exercise.id + ' ' + exercise.title)}",
            f"          command: {_quoted(command(exercise))}",
            f"          timeout: {MINUTES}",
            f"          max-score: {POINTS}",
        ]
    lines += [
        "      - name: Autograding reporter",
        "        uses: classroom-resources/autograding-grading-reporter@v1",
        "        env:",
        *(f"          {step_id(e).upper()}_RESULTS: \"${{{{steps.{step_id(e)}.outputs.result}}}}\"" for e in found),
        "        with:",
        f"          runners: {','.join(step_id(e) for e in found)}",
    ]
    return "\n".join(lines) + "\n"
