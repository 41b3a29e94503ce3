# `import workbook` first: it chooses GPU or simulator (WORKBOOK_DEVICE) before numba.cuda is imported.
import workbook

print(f"workbook tests in {workbook.MODE} mode")


def pytest_addoption(parser):
    group = parser.getgroup("workbook exercises")
    group.addoption("--exercises", action="store_true",
                    help="check the exercises only: your chapters/*/exercises.py, with a progress table")
    group.addoption("--solutions", action="store_true",
                    help="with --exercises: check solutions.py instead (what the default run does too)")


def pytest_configure(config):
    config.addinivalue_line("markers", "exercise: an exercise check (selected by --exercises)")


# The slowest tests (a whole chapter in the simulator, 10-35 s each) go first: with pytest -n the
# workers then share them out and end together, instead of one worker finishing a chapter alone.
_SLOW_FIRST = ("test_chapter_runs_end_to_end",)


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--exercises"):
        items.sort(key=lambda item: getattr(item, "originalname", item.name) not in _SLOW_FIRST)  # stable
        return
    kept = [item for item in items if item.get_closest_marker("exercise")]
    if not config.getoption("--solutions"):  # a student's run: their exercises, nothing else
        kept = [item for item in kept if item.originalname == "test_exercise"]
    config.hook.pytest_deselected(items=[item for item in items if item not in kept])
    items[:] = kept


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    """The progress table: one row per exercise checked in this run (workers' rows included)."""
    rows = []
    for reports in terminalreporter.stats.values():
        for report in reports:
            for key, value in getattr(report, "user_properties", ()):
                if key == "exercise" and getattr(report, "when", "call") == "call":
                    rows.append(tuple(value))
    if not rows:
        return
    from workbook.exercises import print_progress

    which = "solutions.py" if config.getoption("--solutions") or not config.getoption("--exercises") \
        else "your exercises.py"
    terminalreporter.write_sep("=", "exercises")
    print_progress(sorted(rows, key=lambda row: (row[0], int(row[1].split(".")[1]))),
                   title=f"Exercises: {which}, {workbook.MODE} mode")
