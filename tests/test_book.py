"""The book (workbook/book.py): the chapters' notebooks carry the reference GPU's stored outputs, the
exercise pages their checks, the pages link to each other; built with Jupyter Book, a chapter page
shows its stored plots in a real browser (headless Chromium, where installed)."""

import re
import shutil
import subprocess

import nbformat
import pytest

from workbook import book, results
from workbook import exercises as ex
from workbook.report import chapter_scripts


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    out = tmp_path_factory.mktemp("book") / "src"
    return out, book.write_sources(out)


def test_every_chapter_page_has_the_stored_gpu_outputs(sources):
    out, filled = sources
    assert set(filled) == set(chapter_scripts())
    assert all(count > 0 for count in filled.values()), filled
    for notebook_id, script in chapter_scripts().items():
        notebook = nbformat.read(out / "chapters" / f"{script.stem}.ipynb", as_version=4)
        stored = book._stored(notebook_id, results.REFERENCE_DEVICE)
        text = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
        assert "running on: simulator" not in text
        # its bars, as the GPU judged them (ch12a's kernels are held to part b's bars, beside wgmma's)
        assert "bar:" in text or notebook_id in ("ch07", "ch12a"), notebook_id
        assert stored["stamp"]["device"] in notebook.cells[1].source or stored["stamp"]["device"] in notebook.cells[0].source
        figures = {name for row in stored["cells"] for name in row.get("figures", [])}
        shown = sum("image/png" in o.get("data", {}) for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
        assert shown == len(figures), (notebook_id, shown, figures)


def test_a_changed_cell_shows_no_stale_output():
    code = [nbformat.v4.new_code_cell("x = 1\nprint(x)"), nbformat.v4.new_code_cell("y = 2  # new"),
            nbformat.v4.new_code_cell("print(3)")]
    rows = [{"code": "x = 1", "output": "1\n"}, {"code": "y = 3", "output": ""}, {"code": "print(3)", "output": "3\n"}]
    pairs = book._matched(code, rows)
    assert [(cell.source.splitlines()[0], row["output"]) for cell, row in pairs] == [("x = 1", "1\n"), ("print(3)", "3\n")]


def test_exercise_pages_show_the_code_and_the_check(sources):
    out, _ = sources
    for exercise in ex.all_exercises():
        page = (out / "exercises" / f"{exercise.chapter}.md").read_text()
        assert f"## {exercise.id}: {exercise.title}" in page
        assert f"def {exercise.check.__name__}(" in page
        assert f"python -m pytest --exercises -k {exercise.id}" in page


def test_links_point_at_pages_of_the_book(sources):
    out, _ = sources
    index = (out / "index.md").read_text()
    assert "(chapters/ch00_measuring.ipynb)" in index and "(docs/teaching.md)" in index
    assert "(chapters/ch00_measuring/)" not in index
    assert "(../README.md)" in (out / "results" / "README.md").read_text()  # back to the front page (index)
    toc = (out / "_toc.yml").read_text()
    for script in chapter_scripts().values():
        assert f"file: chapters/{script.stem}" in toc


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
HEADLESS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    if not (shutil.which("jupyter-book") or (shutil.which("python") and _has_jupyter_book())):
        pytest.skip('Jupyter Book is not installed (pip install -e ".[book]")')
    return book.build(tmp_path_factory.mktemp("site"))


def _has_jupyter_book():
    try:
        import jupyter_book  # noqa: F401
    except ImportError:
        return False
    return True


def test_the_book_builds_with_plots_search_and_navigation(site):
    page = (site / "chapters" / "ch01_relu_mask.html").read_text()
    images = re.findall(r'<img[^>]+src="([^"]+\.png)"', page)
    assert images, "no plot on chapter 01's page"
    assert all((site / "chapters" / src).resolve().exists() for src in images)
    assert "bar:" in page and "running on: gpu" in page
    assert (site / "search.html").exists() and (site / "searchindex.js").exists()
    assert 'href="../exercises/ch01.html"' in page  # the chapter links to its exercises
    exercises_page = (site / "exercises" / "ch01.html").read_text()
    assert "check_relu_mask" in exercises_page


@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here: the browser test needs one")
def test_a_chapter_page_renders_its_plots_in_a_browser(site, tmp_path):
    """Chromium loads the page and runs its scripts; the DOM it ends with holds the plots, each image
    decoded (naturalWidth > 0, written into the page by a script run there), and the search box."""
    page = site / "chapters" / "ch01_relu_mask.html"
    probe = tmp_path / "probe.html"  # the page plus a script that records what the browser decoded
    probe_text = page.read_text().replace("</body>", """<script>
window.addEventListener('load', () => {
  const images = [...document.querySelectorAll('img')].filter(i => i.src.endsWith('.png'));
  const out = document.createElement('pre'); out.id = 'probe';
  out.textContent = 'decoded ' + images.filter(i => i.complete && i.naturalWidth > 0).length + ' of ' + images.length;
  document.body.appendChild(out);
});
</script></body>""")
    (page.parent / probe.name).write_text(probe_text)
    done = subprocess.run([CHROMIUM, *HEADLESS, f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=5000",
                           "--dump-dom", (page.parent / probe.name).as_uri()], capture_output=True, text=True, timeout=120)
    decoded = re.search(r'id="probe"[^>]*>decoded (\d+) of (\d+)<', done.stdout)
    assert decoded, done.stdout[-2000:] + done.stderr[-2000:]
    assert int(decoded.group(2)) > 0 and decoded.group(1) == decoded.group(2), decoded.group(0)
    assert "search" in done.stdout.lower()
    shot = tmp_path / "page.png"
    subprocess.run([CHROMIUM, *HEADLESS, f"--user-data-dir={tmp_path / 'profile2'}", "--window-size=1200,2000",
                    f"--screenshot={shot}", page.as_uri()], capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 50_000  # a page drawn, not a blank one


def test_with_a_hosted_handouts_repository_every_page_has_its_badge(tmp_path):
    from workbook import hosted

    url = "https://github.com/acme/kernel-workbook"
    book.write_sources(tmp_path / "src", repository=url, branch="fall")
    index = (tmp_path / "src" / "index.md").read_text()
    for notebook_id, script in chapter_scripts().items():
        link = hosted.colab_url(url, script.relative_to(results.ROOT).with_suffix(".ipynb").as_posix(), "fall")
        notebook = nbformat.read(tmp_path / "src" / "chapters" / f"{script.stem}.ipynb", as_version=4)
        assert link in notebook.cells[1].source and link in index, notebook_id
