"""A chapter opened as a hosted notebook opens it: a fresh Python 3.12 environment that starts with
numpy 2.5 and Jupyter installed (as Colab's and Kaggle's do) and nothing of the workbook; the
handout's notebook, alone in an empty folder; its first cell clones the repository and installs the
workbook; the whole notebook executed (no GPU here: the simulator).

    python tools/hosted_trial.py [ch01 ...] [--torch] [--store]

The handout is written with --repository https://github.com/acme/kernel-workbook, pushed to a local
bare repository, and git is told (in the trial's own git config) to fetch that URL from it: the
notebook's cell runs unchanged. --torch installs torch in the fresh environment first (a CUDA build
of several GB from PyPI), as the services preinstall it. --store writes results/hosted_trial.json.
A maintainer's tool: minutes, and the package registries.
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
URL = "https://github.com/acme/kernel-workbook"


def _run(command, **kwargs):
    print("$", " ".join(map(str, command)), flush=True)
    return subprocess.run(command, check=True, **kwargs)


def _python312():
    """A Python 3.12 that runs (as .ci/run finds one: a pyenv shim may name one it will not start)."""
    import glob

    for candidate in [shutil.which("python3.12"), *sorted(glob.glob("/root/.pyenv/versions/3.12*/bin/python3"))]:
        if candidate and subprocess.run([candidate, "-c", "import sys; sys.exit(sys.version_info[:2] != (3, 12))"],
                                        capture_output=True).returncode == 0:
            return candidate
    return None


def main(argv):
    chapters = [a for a in argv if not a.startswith("--")] or ["ch01"]
    work = Path(tempfile.mkdtemp(prefix="hosted-trial-"))
    env = {key: value for key, value in os.environ.items() if not key.startswith(("WORKBOOK_", "PYTHON", "VIRTUAL_ENV"))}
    env.update(HOME=str(work / "home"), GIT_CONFIG_GLOBAL=str(work / "gitconfig"), PATH=f"{work / 'venv' / 'bin'}:{env['PATH']}")
    (work / "home").mkdir()
    # the handout, as the instructor pushes it
    _run([sys.executable, "-m", "workbook", "handout", str(work / "handout"), "--force", "--repository", URL], cwd=ROOT)
    bare = work / "handout.git"
    git = ["git", "-c", "user.name=trial", "-c", "user.email=trial@example.org"]
    _run([*git, "init", "-q", "-b", "main"], cwd=work / "handout")
    _run([*git, "add", "-A"], cwd=work / "handout")
    _run([*git, "commit", "-qm", "handout"], cwd=work / "handout")
    _run(["git", "clone", "-q", "--bare", str(work / "handout"), str(bare)])
    _run(["git", "config", "--file", env["GIT_CONFIG_GLOBAL"], f"url.{bare.as_uri()}.insteadOf", URL])
    # the hosted service's Python: numpy 2.5 and Jupyter, nothing else of ours
    python = _python312() or sys.exit("needs Python 3.12 (numpy 2.5 needs it)")
    _run([python, "-m", "venv", str(work / "venv")])
    pip = [str(work / "venv" / "bin" / "python"), "-m", "pip", "install", "-q"]
    _run([*pip, "numpy==2.5.*", "nbclient", "nbconvert", "ipykernel", "matplotlib"], env=env)
    if "--torch" in argv:
        _run([*pip, "torch"], env=env)
    rows = []
    for chapter in chapters:
        notebook = next((work / "handout" / "chapters").glob(f"{chapter[:4]}_*/{chapter}*.ipynb"))
        content = work / f"content-{chapter}"
        content.mkdir()
        shutil.copy(notebook, content / notebook.name)  # what the service opens: the notebook alone
        started = time.perf_counter()
        done = subprocess.run([str(work / "venv" / "bin" / "python"), "-m", "jupyter", "nbconvert", "--to", "notebook",
                               "--execute", "--ExecutePreprocessor.timeout=1800", "--output", "executed.ipynb",
                               notebook.name], cwd=content, env=env, capture_output=True, text=True)
        seconds = round(time.perf_counter() - started, 1)
        versions = subprocess.run([str(work / "venv" / "bin" / "python"), "-c",
                                   "import numpy, numba; print(numpy.__version__, numba.__version__)"],
                                  env=env, capture_output=True, text=True).stdout.split()
        ok = done.returncode == 0
        rows.append({"notebook": notebook.name, "ok": ok, "seconds": seconds, "numpy": versions[:1],
                     "numba": versions[1:2], "torch": "--torch" in argv, "tail": (done.stdout + done.stderr)[-1500:]})
        print(f"{notebook.name}: {'ran end to end' if ok else 'FAILED'} in {seconds} s (numpy {versions[:1]})")
        if not ok:
            print(rows[-1]["tail"])
    if "--store" in argv:
        record = {"date": time.strftime("%Y-%m-%d"), "command": "python tools/hosted_trial.py " + " ".join(argv),
                  "python": "3.12", "rows": rows}
        (ROOT / "results" / "hosted_trial.json").write_text(json.dumps(record, indent=1) + "\n")
    return 0 if all(row["ok"] for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
