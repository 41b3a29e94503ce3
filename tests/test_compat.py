"""numba-cuda 0.30 on numpy 2.5 (workbook/compat.py): kernels compile, and numpy is left as it was."""

import os
import subprocess
import sys

import numpy as np
import pytest

from workbook import compat, compiler

NUMPY_2_5 = tuple(int(part) for part in np.__version__.split(".")[:2]) >= (2, 5)


def test_it_touches_nothing_where_numpy_still_has_row_stack(monkeypatch):
    monkeypatch.setattr(np, "row_stack", np.vstack, raising=False)
    assert compat.allow_numpy_2_5("gpu") is False
    assert np.row_stack is np.vstack


def test_the_simulator_needs_nothing():
    assert compat.allow_numpy_2_5("sim") is False


@pytest.mark.skipif(bool(compiler.missing()), reason="the GPU compiler is not installed (the compile extra)")
def test_a_kernel_compiles_for_a_gpu_and_numpy_keeps_its_namespace():
    """In compile mode (numba's real CUDA target, no GPU needed): with numpy 2.5 this is the import
    that failed before compat.py; with numpy < 2.5 it shows nothing was changed."""
    program = (
        "import numpy as np\n"
        "had = hasattr(np, 'row_stack')\n"
        "import workbook\n"
        "from numba.core import types\n"
        "from numba.cuda import compile_ptx\n"
        "def kernel(a):\n"
        "    a[0] = 1.0\n"
        "ptx, _ = compile_ptx(kernel, (types.float32[:],), cc=(9, 0))\n"
        "assert '.entry' in ptx or '.func' in ptx\n"
        "assert hasattr(np, 'row_stack') == had, 'numpy namespace changed'\n"
        "print('row_stack' if had else 'no row_stack')\n"
    )
    env = {"WORKBOOK_DEVICE": "compile", "NUMBA_ENABLE_CUDASIM": "0"}
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, **env})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == ("no row_stack" if NUMPY_2_5 else "row_stack")
