"""Hosted notebooks (Colab, Kaggle, ...): a handout whose notebooks install the workbook themselves.

`python -m workbook handout DIR --repository https://github.com/ORG/REPO` writes, in each chapter's
notebook of the handout (its .py and .ipynb, kept paired):

    a badge     "Open in Colab", to that notebook in the repository the handout is pushed to
    a first     when `import workbook` fails (a hosted notebook: nothing of ours is installed), it
    code cell   clones the repository, installs it (with the CUDA 12 libraries where `nvidia-smi`
                finds a GPU, a free T4 among them; without one the simulator runs everything), and
                moves into the chapter's folder. Where the workbook is installed it does nothing.

The numpy and torch such services have are kept: the workbook takes numpy 2.x (2.5 included) and
torch as found. The handout's README lists every notebook's badge. Without --repository the handout
is unchanged: the repository a class opens from is the instructor's to name.
"""

import re
from pathlib import Path

from .report import chapter_scripts

BADGE = "https://colab.research.google.com/assets/colab-badge.svg"
MARK = "# Hosted notebooks (Colab, Kaggle, ...)"  # the install cell's first line


def github_slug(repository):
    """'ORG/REPO' of a GitHub URL (https or git@), or None."""
    found = re.fullmatch(r"(?:https://github\.com/|git@github\.com:)([\w.-]+)/([\w.-]+?)(?:\.git)?/?", repository)
    return f"{found.group(1)}/{found.group(2)}" if found else None


def colab_url(repository, path, branch="main"):
    slug = github_slug(repository)
    if slug is None:
        raise ValueError(f"{repository!r} is not a GitHub repository's URL (https://github.com/ORG/REPO): "
                         "hosted notebooks open from GitHub")
    return f"https://colab.research.google.com/github/{slug}/blob/{branch}/{path}"


def badge(repository, path, branch="main"):
    return f"[![Open in Colab]({BADGE})]({colab_url(repository, path, branch)})"


def install_cell(repository, folder):
    """The notebook's first code cell (percent format), for the chapter in chapters/`folder`."""
    return f'''# %%
{MARK}: fetch and install the workbook first; where it is installed this does nothing
import importlib.util, os, subprocess, sys  # noqa: E401
if importlib.util.find_spec("workbook") is None:
    root = os.path.abspath("numba-cuda-workbook")
    if not os.path.isdir(root):
        subprocess.run(["git", "clone", "-q", "--depth", "1", "{repository}", root], check=True)
    extra = "[cu12]" if subprocess.run("nvidia-smi", shell=True, capture_output=True).returncode == 0 else ""
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "-e", root + extra], check=True)
    import site  # the import hooks pip just installed (.pth files: numba-cuda's numba.cuda), in this kernel too
    for packages in site.getsitepackages():
        site.addsitedir(packages)
    sys.path.insert(0, root)
    os.chdir(os.path.join(root, "chapters", "{folder}"))

'''


def make_hosted(script, repository, root, branch="main"):
    """Add the badge and the install cell to a chapter's percent script (`script`, in the handout at
    `root`), and write its .ipynb from it."""
    import jupytext

    text = script.read_text()
    if MARK in text:
        return
    relative = script.with_suffix(".ipynb").relative_to(root).as_posix()
    cells = re.split(r"(?m)^(?=# %%)", text)
    # after the header and the title's Markdown cell: the badge, then the install cell
    at = next(i for i, cell in enumerate(cells) if cell.startswith("# %% [markdown]")) + 1
    cells[at:at] = [f"# %% [markdown]\n# {badge(repository, relative, branch)}\n\n",
                    install_cell(repository, script.parent.name)]
    script.write_text("".join(cells))
    notebook = jupytext.read(script)
    jupytext.write(notebook, script.with_suffix(".ipynb"), fmt="ipynb")


def make_handout_hosted(root, repository, branch="main"):
    """Every chapter notebook of the handout at `root` hosted-ready, and the README's list of badges."""
    root = Path(root)
    lines = ["", "## Open a chapter in a hosted notebook", "",
             "Each opens on Colab with a first cell that installs the workbook (a GPU if the service gives "
             "one, the simulator otherwise):", ""]
    for notebook_id, script in chapter_scripts().items():
        mine = root / script.relative_to(script.parents[2])
        make_hosted(mine, repository, root, branch)
        lines.append(f"- {notebook_id} {badge(repository, mine.with_suffix('.ipynb').relative_to(root).as_posix(), branch)}")
    readme = root / "README.md"
    readme.write_text(readme.read_text().rstrip("\n") + "\n" + "\n".join(lines) + "\n")
