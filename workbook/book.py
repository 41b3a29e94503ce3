"""The workbook as a website: `python -m workbook book` writes its pages and builds them with Jupyter
Book into build/book/_build/html (static files: open index.html, or publish them on GitHub Pages,
.github/workflows/book.yml).

    index        the README
    chapters     each chapter's notebook, with the outputs of the reference GPU's stored run: what
                 each code cell printed and the plots it saved (results/<device>/<id>.json, `cells`,
                 written by runner.run_cells), never the simulator's times
    exercises    a page a chapter: each exercise's spec and code to edit, and the check that grades it
    reference    docs/, results/README.md, chapters/README.md, tools/README.md

Jupyter Book 1 (Sphinx, MyST Markdown, myst-nb: the `book` extra) builds it offline. Jupyter Book
2 and mystmd fetch their site theme from the network at every build, which CI, a class's machines
and this workbook's own runs cannot count on.
"""

import base64
import inspect
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

from . import results
from .report import chapter_scripts

ROOT = results.ROOT
BUILD = ROOT / "build" / "book"
DOCS = ("docs/simulator.md", "docs/teaching.md", "docs/architecture.md", "results/README.md",
        "chapters/README.md", "tools/README.md")


def _stored(notebook_id, device):
    try:
        return json.loads((results.RESULTS / device / f"{notebook_id}.json").read_text())
    except (OSError, ValueError):
        return {}


def _first_code_line(source):
    return next((line for line in source.splitlines() if line.strip() and not line.startswith(("#", "%"))), "")[:60]


def _matched(code, rows):
    """[(cell, its stored row)]: the cells in order, each with the next stored row whose first line of
    code is its own (a cell added since the run, or changed in its first line, gets none)."""
    pairs, next_row = [], 0
    for cell in code:
        first = _first_code_line(cell.source)
        for at in range(next_row, len(rows)):
            if rows[at]["code"].strip() == first.strip():
                pairs.append((cell, rows[at]))
                next_row = at + 1
                break
    return pairs


def chapter_notebook(notebook_id, script, device):
    """The chapter's notebook (nbformat) with the stored run's outputs in its code cells, and the
    number of cells that got them. Cells are matched to the stored run's by their first line of code,
    so a cell that has changed since shows no outputs rather than another version's."""
    import jupytext
    import nbformat

    notebook = jupytext.read(script)
    stored = _stored(notebook_id, device)
    rows = [row for row in stored.get("cells", []) if "output" in row]
    pairs = _matched([cell for cell in notebook.cells if cell.cell_type == "code"], rows)
    same = bool(pairs)
    filled = 0
    if same:
        for cell, row in pairs:
            cell.outputs = []
            if row["output"]:
                cell.outputs.append(nbformat.v4.new_output("stream", name="stdout", text=row["output"]))
            for name in row.get("figures", []):
                png = results.RESULTS / device / name
                if png.exists():
                    data = {"image/png": base64.b64encode(png.read_bytes()).decode("ascii")}
                    cell.outputs.append(nbformat.v4.new_output("display_data", data=data))
            filled += bool(cell.outputs)
    stamp = stored.get("stamp", {})
    if same:
        note = (f"*The outputs below are those of the stored run on {stamp.get('device', device)} "
                f"({stamp.get('date', 'undated')[:10]}): run the notebook to see your own machine's.*")
    else:
        note = (f"*No outputs: the stored run on {device} is of another version of this notebook. "
                "Run it to see them.*")
    notebook.cells.insert(1 if notebook.cells and notebook.cells[0].cell_type == "markdown" else 0,
                          nbformat.v4.new_markdown_cell(note))
    return notebook, filled


def exercise_page(chapter_id, folder):
    """A chapter's exercises page (MyST Markdown): spec, the code to edit, the check's source."""
    from . import exercises

    module = exercises.load(chapter_id)
    lines = [f"# Exercises of chapter {chapter_id[2:]}", "",
             f"Edit `chapters/{folder.name}/exercises.py` between each exercise's markers, then run "
             f"`python -m pytest --exercises -k {chapter_id}`: each check's message says what is wrong.", ""]
    for exercise in exercises.all_exercises((chapter_id,)):
        lines += [f"## {exercise.id}: {exercise.title}", "",
                  f"*{exercises.KINDS[exercise.kind]}*" + (f", target {exercise.target:g} of the chapter's kernel"
                                                          if exercise.target else ""), ""]
        for name in exercise.show:
            lines += ["```python", inspect.getsource(getattr(module, name)).rstrip(), "```", ""]
        lines += [f"({exercise.id.replace('.', '-')}-check)=", f"### How {exercise.id} is checked", "",
                  f"`python -m pytest --exercises -k {exercise.id}` runs `{exercise.check.__name__}` "
                  f"(chapters/{folder.name}/checks.py):", "",
                  "```python", inspect.getsource(exercise.check).rstrip(), "```", ""]
    return "\n".join(lines) + "\n"


def _page_of(notebook_scripts):
    """{chapter folder name: path of its first notebook's page}, for the README's links."""
    pages = {}
    for script in notebook_scripts.values():
        pages.setdefault(script.parent.name, f"chapters/{script.stem}.ipynb")
    return pages


def _rewrite_links(text, source, pages):
    """Links between the copied pages, as the book lays them out: a chapter folder to its notebook."""
    base = Path(source).parent

    def link(match):
        target = match.group(2)
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            return match.group(0)
        resolved = (base / target).as_posix()
        resolved = re.sub(r"(^|/)[^/]+/\.\./", r"\1", resolved)
        folder = re.fullmatch(r"(?:\./)?chapters/(ch\d\d_[a-z0-9_]+)/?", resolved)
        if folder and folder.group(1) in pages:
            resolved = pages[folder.group(1)]
        depth = len(Path(source).parent.parts)
        return f"{match.group(1)}({'../' * depth}{resolved})"

    return re.sub(r"(\[[^\]]*\])\(([^)\s]+)\)", link, text)


def _notebook_path(script):
    return script.relative_to(ROOT).with_suffix(".ipynb").as_posix()


def write_sources(out=BUILD / "src", device=None, repository=None, branch="main"):
    """The book's sources (MyST pages, notebooks with stored outputs, _config.yml, _toc.yml) in `out`;
    returns {notebook id: code cells with outputs}. With `repository`, the GitHub repository of a
    handout written for hosted notebooks (hosted.py), each chapter page and the front page carry the
    "Open in Colab" badges of that handout's notebooks."""
    import nbformat

    from . import exercises

    device = device or results.REFERENCE_DEVICE
    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    (out / "chapters").mkdir(parents=True)
    scripts = chapter_scripts()
    pages = _page_of(scripts)
    index = _rewrite_links((ROOT / "README.md").read_text(), "README.md", pages)
    if repository:
        from . import hosted

        index += "\n## Open a chapter in a hosted notebook\n\n" + "".join(
            f"- {notebook_id} {hosted.badge(repository, _notebook_path(script), branch)}\n"
            for notebook_id, script in scripts.items())
    (out / "index.md").write_text(index)
    for relative in DOCS:
        (out / relative).parent.mkdir(parents=True, exist_ok=True)
        (out / relative).write_text(_rewrite_links((ROOT / relative).read_text(), relative, pages))
    filled = {}
    for notebook_id, script in scripts.items():
        notebook, filled[notebook_id] = chapter_notebook(notebook_id, script, device)
        if repository:
            from . import hosted

            notebook.cells.insert(1, nbformat.v4.new_markdown_cell(hosted.badge(repository, _notebook_path(script),
                                                                                branch)))
        if (script.parent / "exercises.py").exists() and script.stem == next(
                s.stem for s in scripts.values() if s.parent == script.parent):
            notebook.cells.append(nbformat.v4.new_markdown_cell(
                f"Exercises of this chapter, with their checks: [](../exercises/{notebook_id[:4]}.md)"))
        nbformat.write(notebook, out / "chapters" / f"{script.stem}.ipynb")
    (out / "exercises").mkdir()
    for chapter_id, folder in exercises.chapters().items():
        (out / "exercises" / f"{chapter_id}.md").write_text(exercise_page(chapter_id, folder))
    (out / "_config.yml").write_text(_CONFIG)
    toc = ["format: jb-book", "root: index", "parts:", "  - caption: Chapters", "    chapters:"]
    toc += [f"      - file: chapters/{script.stem}" for script in scripts.values()]
    toc += ["  - caption: Exercises", "    chapters:"]
    toc += [f"      - file: exercises/{chapter_id}" for chapter_id in exercises.chapters()]
    toc += ["  - caption: Reference", "    chapters:"]
    toc += [f"      - file: {relative[:-3]}" for relative in DOCS]
    (out / "_toc.yml").write_text("\n".join(toc) + "\n")
    return filled


_CONFIG = """\
title: The numba.cuda kernel workbook
author: the workbook's authors
only_build_toc_files: true
execute:
  execute_notebooks: "off"  # the outputs are the reference GPU's stored run's
html:
  use_search_button: true
sphinx:
  config:
    suppress_warnings: ["myst.header", "myst.xref_missing", "misc.highlighting_failure"]
    html_show_copyright: false
"""


def build(out=None, device=None, repository=None, branch="main"):
    """Write the sources and build the HTML; returns the folder holding index.html."""
    out = Path(out or BUILD)
    command = shutil.which("jupyter-book", path=str(Path(sys.executable).parent)) or shutil.which("jupyter-book")
    if command is None:
        raise SystemExit('the book needs Jupyter Book: pip install -e ".[book]"')
    filled = write_sources(out / "src", device, repository, branch)
    done = subprocess.run([command, "build", str(out / "src"), "--path-output", str(out), "--builder", "html"],
                          capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"jupyter-book failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    html = out / "_build" / "html"
    empty = [notebook_id for notebook_id, count in filled.items() if not count]
    print(f"built {html / 'index.html'}: {len(filled)} chapter notebooks"
          + (f"; without stored outputs (run them on the reference GPU): {', '.join(empty)}" if empty else ""))
    return html
