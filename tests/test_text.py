"""The chapters' text stays true to the stored results.

Measured figures belong in a chapter's closing `chapter.show_figures(...)`, read from the run or the
stored GPU results. A figure typed into a Markdown cell (a time, a rate) must still be one that the
stored results hold, at the precision it is written with: this test names every one that is not,
so that text cannot drift from the measurements it describes."""

import json
import re

import pytest

from workbook import results
from workbook.report import chapter_scripts

SCRIPTS = chapter_scripts()
UNITS = r"ms|us|µs|TFLOP/s|GB/s|TB/s"
NUMBER = r"\d[\d,]*(?:\.\d+)?"
FIGURE = re.compile(rf"(?<![\w.^])({NUMBER})(?:\s*(?:-|–|to)\s*({NUMBER}))?\s*(?:{UNITS})(?![\w/])")


def stored_values():
    """Every number in the stored GPU results (and its x1000 and /1000: ms and us, GB/s and TB/s)."""
    values = []

    def walk(node):
        if isinstance(node, bool) or node is None:
            return
        if isinstance(node, int | float):
            values.extend((node, node * 1000, node / 1000))
        elif isinstance(node, dict):
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)
        elif isinstance(node, str):  # a bar's target, ">= 10"
            found = re.fullmatch(r"[<>]= (\S+)", node)
            if found:
                values.append(float(found[1]))

    for path in sorted((results.RESULTS / results.REFERENCE_DEVICE).glob("*.json")):
        walk(json.loads(path.read_text()))
    return values


def markdown_lines(script):
    """(line number, text) of the Markdown cells of a jupytext percent script."""
    in_markdown = False
    for number, line in enumerate(script.read_text().splitlines(), 1):
        if line.startswith("# %%"):
            in_markdown = "[markdown]" in line
        elif in_markdown:
            yield number, line


def typed_figures(text):
    """The figures with a unit of time or rate in a line of prose, as written."""
    for match in FIGURE.finditer(text):
        yield from (figure for figure in match.groups() if figure)


def agrees(written, values):
    """Does some stored value print as `written`, at the number of decimals it is written with?"""
    decimals = len(written.split(".")[1]) if "." in written else 0
    typed = float(written.replace(",", ""))
    half_unit = 0.5 * 10**-decimals * (1 + 1e-9)
    return any(abs(value - typed) <= half_unit for value in values)


def test_the_figure_pattern_reads_prose_as_written():
    assert list(typed_figures("takes 0.56 ms against 1,900-2,800 us, 45.6 TFLOP/s at 2^28 and 3 TB/s")) == \
        ["0.56", "1,900", "2,800", "45.6", "3"]
    assert list(typed_figures("a 50 MB L2, 132 SMs, 2^26 elements, 16-byte loads")) == []
    assert agrees("0.56", [0.5612]) and agrees("1,900", [1900.4]) and not agrees("99.4", [99.17])


@pytest.mark.parametrize("chapter", list(SCRIPTS))
def test_typed_figures_agree_with_the_stored_results(chapter):
    values = stored_values()
    script = SCRIPTS[chapter]
    drifted = [f"{script.name}:{number}: {figure} in: {line.strip()}"
               for number, line in markdown_lines(script) for figure in typed_figures(line)
               if not agrees(figure, values)]
    assert not drifted, ("figures typed into the text that no stored result holds (put them in the chapter's "
                         "`chapter.show_figures(...)` from the results, or in EXPERIMENTS.md with their date):\n"
                         + "\n".join(drifted))


# ---------------------------------------------------------------------------------------------
# The front page and the pages it points to

PAGES = [results.ROOT / "README.md", results.ROOT / "results" / "README.md", results.ROOT / "tools" / "README.md",
         *sorted((results.ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def test_the_front_page_is_a_newcomers_page():
    lines = (results.ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 120, f"README.md has {len(lines)} lines: the manuals belong in docs/"
    text = "\n".join(lines)
    assert 'pip install -e ".[dev,compile,capstone]"' in text and "python -m pytest -n auto" in text
    for page in ("docs/simulator.md", "docs/teaching.md", "docs/architecture.md", "results/README.md",
                 "tools/README.md"):
        assert f"]({page})" in text, f"README.md does not point to {page}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(results.ROOT)))
def test_every_relative_link_of_a_page_leads_somewhere(page):
    broken = [target for target in LINK.findall(page.read_text())
              if "://" not in target and not (page.parent / target).exists()]
    assert not broken, f"{page.name}: links to nothing: {broken}"


def test_every_tool_has_a_row():
    listed = (results.ROOT / "tools" / "README.md").read_text()
    tools = [p.name for p in (results.ROOT / "tools").iterdir() if p.suffix in (".py", ".sh")]
    assert not [name for name in tools if f"`{name}`" not in listed], "tools/README.md misses a script"
    probes = [p.relative_to(results.ROOT).as_posix() for p in (results.ROOT / "chapters").glob("*/probes/*.py")]
    assert not [path for path in probes if f"(../{path})" not in listed], "tools/README.md misses a chapter's probe"


@pytest.mark.parametrize("chapter", list(SCRIPTS))
def test_the_close_is_markdown_then_one_table_of_figures(chapter):
    """"What the numbers mean": at most eight bullets of Markdown (no prose assembled by code), then
    one code cell that prints the figures they point to (chapter.show_figures)."""
    cells = re.split(r"^# %%", SCRIPTS[chapter].read_text(), flags=re.M)
    close = next((i for i, cell in enumerate(cells) if cell.startswith(" [markdown]")
                  and "## What the numbers mean" in cell), None)
    assert close is not None, f"{chapter} has no 'What the numbers mean'"
    bullets = [line for line in cells[close].splitlines() if line.startswith("# - ")]
    assert 1 <= len(bullets) <= 8, f"{chapter}'s close has {len(bullets)} bullets"
    figures = cells[close + 1]
    assert not figures.startswith(" [markdown]") and "chapter.show_figures(" in figures, \
        f"{chapter}: the close's next cell does not print its figures"


LESSON_LINES = 420  # "about 400": a notebook a student reads and runs in a class hour


@pytest.mark.parametrize("chapter", list(SCRIPTS))
def test_a_notebook_is_read_in_one_sitting(chapter):
    """A chapter's notebook, every cell's source counted, stays within about 400 lines: what is not
    the lesson (timing plumbing, twins, plots) lives in the chapter's modules."""
    notebook = json.loads(SCRIPTS[chapter].with_suffix(".ipynb").read_text())
    lines = sum(len("".join(cell["source"]).splitlines()) for cell in notebook["cells"])
    assert lines <= LESSON_LINES, f"{chapter}'s notebook is {lines} lines of source (at most {LESSON_LINES})"
