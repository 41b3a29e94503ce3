"""Every chapter notebook: its .ipynb agrees with its .py source, and it runs end to end.

With Jupyter installed the .ipynb is executed by a real kernel (nbclient); without it (the GPU
machine has no Jupyter) the paired .py is run as a script: the same cells, in the same order.
Each chapter asserts its own checks, so "runs end to end" means "every kernel was right".
"""

import workbook  # noqa: F401,I001

import json
import os
import subprocess
import sys

import pytest

from workbook.report import chapter_scripts
from workbook.runner import _cells

SCRIPTS = chapter_scripts()


@pytest.mark.parametrize("chapter", list(SCRIPTS))
def test_notebook_matches_its_source(chapter):
    jupytext = pytest.importorskip("jupytext")
    script = SCRIPTS[chapter]
    expected = jupytext.writes(jupytext.read(script), fmt="ipynb")
    assert _cells(script.with_suffix(".ipynb").read_text()) == _cells(expected), (
        f"{script.with_suffix('.ipynb').name} is out of date: run `python -m workbook notebooks {chapter}`")


@pytest.mark.notebook
@pytest.mark.parametrize("chapter", list(SCRIPTS))
def test_chapter_runs_end_to_end(chapter, tmp_path):
    script = SCRIPTS[chapter]
    # Results go to tmp_path: a test run never overwrites the stored GPU results, and chapters
    # running side by side (pytest -n) could not be timed honestly anyway.
    env = dict(os.environ, MPLBACKEND="Agg", WORKBOOK_DEVICE=workbook.MODE, WORKBOOK_RESULTS=str(tmp_path),
               PYTHONPATH=os.pathsep.join([str(script.parents[2]), os.environ.get("PYTHONPATH", "")]))
    try:
        import nbclient
        import nbformat

        nbclient.NotebookClient(nbformat.read(script.with_suffix(".ipynb"), as_version=4), timeout=1200,
                                kernel_name="python3",
                                resources={"metadata": {"path": str(script.parent)}}).execute(env=env)
    except ImportError:
        completed = subprocess.run([sys.executable, script.name], cwd=script.parent, env=env,
                                   capture_output=True, text=True, timeout=1800)
        assert completed.returncode == 0, completed.stdout[-3000:] + completed.stderr[-3000:]
    saved = json.loads((tmp_path / workbook.results.device_facts()["slug"] / f"{chapter}.json").read_text())
    assert saved["cases"], "the chapter recorded no comparison"
    assert all(row["correct"] is not False for case in saved["cases"] for row in case["rows"])
