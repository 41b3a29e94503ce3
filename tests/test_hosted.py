"""Hosted notebooks (workbook/hosted.py): a handout written for a GitHub repository gives every
chapter notebook an "Open in Colab" badge and a first cell that installs the workbook where it is
missing, and lists the badges in its README. (tools/hosted_trial.py runs such a notebook in a fresh
environment with numpy 2.5, as a hosted service would.)"""

import json

import jupytext
import pytest

from workbook import handout, hosted
from workbook.report import chapter_scripts

URL = "https://github.com/acme/kernel-workbook"


def test_github_urls():
    assert hosted.github_slug("https://github.com/acme/kernel-workbook.git") == "acme/kernel-workbook"
    assert hosted.github_slug("git@github.com:acme/kernel-workbook.git") == "acme/kernel-workbook"
    assert hosted.github_slug("https://gitlab.com/acme/kernel-workbook") is None
    assert hosted.colab_url(URL, "chapters/ch01_relu_mask/ch01_relu_mask.ipynb", "fall") == (
        "https://colab.research.google.com/github/acme/kernel-workbook/blob/fall/chapters/ch01_relu_mask/ch01_relu_mask.ipynb")
    with pytest.raises(ValueError, match="not a GitHub repository"):
        hosted.colab_url("https://gitlab.com/acme/x", "a.ipynb")


@pytest.fixture(scope="module")
def hosted_handout(tmp_path_factory):
    root = tmp_path_factory.mktemp("hosted") / "handout"
    handout.write(root, force=True, repository=URL)
    return root


def test_every_notebook_has_the_badge_and_the_install_cell(hosted_handout):
    readme = (hosted_handout / "README.md").read_text()
    for notebook_id, script in chapter_scripts().items():
        relative = script.relative_to(script.parents[2]).with_suffix(".ipynb")
        notebook = json.loads((hosted_handout / relative).read_text())
        sources = ["".join(cell["source"]) for cell in notebook["cells"]]
        code = [s for cell, s in zip(notebook["cells"], sources) if cell["cell_type"] == "code"]
        url = hosted.colab_url(URL, relative.as_posix())
        assert any(url in s for s in sources[:3]), notebook_id  # the badge, under the title
        assert code[0].startswith(hosted.MARK) and f'"{URL}"' in code[0], notebook_id
        assert f'"chapters", "{script.parent.name}"' in code[0]
        assert url in readme
        # the .py and the .ipynb stay a pair (jupytext): the same cells
        paired = jupytext.read(hosted_handout / relative.with_suffix(".py"))
        assert [c.source for c in paired.cells] == [c.source for c in jupytext.read(hosted_handout / relative).cells]


def test_the_install_cell_does_nothing_where_the_workbook_is_installed(hosted_handout):
    script = next(iter(chapter_scripts().values()))
    cell = jupytext.read(hosted_handout / script.relative_to(script.parents[2])).cells
    code = next(c.source for c in cell if c.cell_type == "code")
    namespace = {}
    exec(compile(code, "install-cell", "exec"), namespace)  # noqa: S102  (workbook is importable here)
    assert "root" not in namespace  # it never got past the find_spec test


def test_without_a_repository_the_handout_is_unchanged(tmp_path):
    handout.write(tmp_path / "plain", force=True)
    script = next(iter(chapter_scripts().values()))
    assert hosted.MARK not in (tmp_path / "plain" / script.relative_to(script.parents[2])).read_text()


def test_a_repository_that_is_not_on_github_is_refused_before_anything_is_written(tmp_path):
    with pytest.raises(ValueError, match="not a GitHub repository"):
        handout.write(tmp_path / "h", force=True, repository="https://example.org/workbook.git")


def test_the_book_workflow_publishes_the_hosted_handout_it_links_to(tmp_path):
    """The Pages workflow's own step, run against a bare repository standing in for GitHub: branch
    "hosted" gets the handout whose notebooks install the workbook, and the book's badges open it."""
    import os
    import subprocess
    from pathlib import Path

    import yaml

    root = Path(__file__).resolve().parents[1]
    if not (root / ".github/workflows/book.yml").exists():
        pytest.skip("no Pages workflow here (a handout): the workbook's own repository publishes the book")
    workflow = yaml.safe_load((root / ".github/workflows/book.yml").read_text())
    steps = workflow["jobs"]["build"]["steps"]
    publish = next(step for step in steps if "hosted" in step.get("name", ""))
    book = next(step["run"] for step in steps if "workbook book" in step.get("run", ""))
    assert '--repository "${{ github.server_url }}/${{ github.repository }}" --branch hosted' in book
    assert workflow["permissions"]["contents"] == "write"

    remote = tmp_path / "github.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    env = {**os.environ, "REPOSITORY": URL, "PUSH_TO": str(remote), "GITHUB_SHA": "abc123"}
    script = publish["run"].replace("build/hosted", str(tmp_path / "hosted"))
    script = script.replace("--branch hosted", "--branch hosted --force")  # a fresh checkout there; maybe not here
    done = subprocess.run(["bash", "-e", "-c", script], cwd=root, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    files = subprocess.run(["git", "ls-tree", "-r", "--name-only", "hosted"], cwd=remote, check=True,
                           capture_output=True, text=True).stdout.split()
    assert not [f for f in files if f.startswith(".github/workflows/")]
    assert not [f for f in files if f.endswith("solutions.py")]
    for script in chapter_scripts().values():
        relative = script.relative_to(script.parents[2]).with_suffix(".ipynb").as_posix()
        assert relative in files
        notebook = subprocess.run(["git", "show", f"hosted:{relative}"], cwd=remote, check=True,
                                  capture_output=True, text=True).stdout
        assert hosted.MARK in notebook and hosted.colab_url(URL, relative, "hosted") in notebook
