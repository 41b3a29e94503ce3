"""Kernels compiled side by side in worker processes (workbook/compile_pool.py).

Without a GPU: the worker's kernel is the one numba compiles in-process (same PTX but for the
generated names), run in a compile-mode child process. On a GPU: warm_up compiles in the workers,
and the kernels it installs compute what the reference says."""

import workbook  # noqa: I001  (first: it picks GPU or simulator before numba.cuda is imported)

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from workbook import cuda, compile_pool

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Run in a compile-mode process: chapter 04's GEMM (device functions made per tile, closures) and
# a module-level kernel, through the pool and in-process; their PTX must agree.
_SAME_PTX = textwrap.dedent("""
    import pickle, re
    from types import SimpleNamespace
    import numba, workbook
    from numba import float32, int64
    from numba.cuda import codegen, dispatcher
    from workbook import compile_pool, compiler
    dispatcher.get_current_device = lambda: compiler._NoDevice
    codegen.devices = SimpleNamespace(get_context=lambda devnum=None: SimpleNamespace(device=compiler._NoDevice))
    numba.cuda.get_current_device = lambda: compiler._NoDevice
    from chapters.ch04_implicit_gemm import gemm, tiles
    from chapters.ch01_relu_mask import kernels as relu
    A = lambda ndim: numba.types.Array(float32, ndim, "C")
    cases = [(gemm.make_gemm_kernel(tiles.pick_tile("16x32")), (A(2), A(2), int64, A(3))),
             (relu.relu_backward_from_y_kernel, (A(1), A(1), A(1)))]
    pool = compile_pool._Pool(2)
    names = lambda ptx: [re.sub(r"_cudapy_smem_[0-9]+", "S", re.sub(r"_ZN[0-9A-Za-z_]+", "N", line))
                         for line in ptx.splitlines() if not line.startswith("//")]
    for kernel, argtypes in cases:
        states = pool.compile(kernel, argtypes)
        assert states is not None, kernel
        pooled = dispatcher._Kernel._rebuild(**pickle.loads(states))
        here = dispatcher._Kernel(kernel.py_func, argtypes, **kernel.targetoptions)
        assert names(pooled._codelibrary.get_asm_str()) == names(here._codelibrary.get_asm_str()), kernel
        assert pooled._codelibrary._cubin_cache, "the cubin is linked in the worker"
    print("same PTX")
""")


@pytest.mark.skipif(workbook.ON_GPU, reason="a compile-mode process beside a GPU one: run without a GPU")
def test_the_workers_kernel_is_the_one_numba_compiles_here():
    from workbook import compiler

    reason = compiler.missing()
    if reason:
        pytest.skip(f"no GPU compiler here: {reason}")
    env = dict(os.environ, WORKBOOK_DEVICE="compile", NUMBA_ENABLE_CUDASIM="0", PYTHONPATH=ROOT)
    done = subprocess.run([sys.executable, "-c", _SAME_PTX], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and "same PTX" in done.stdout, done.stderr[-3000:]


@cuda.jit
def _add_one(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = x[i] + 1


@cuda.jit
def _twice(x, out):
    i = cuda.grid(1)
    if i < x.size:
        out[i] = 2 * x[i]


def test_warm_up_compiles_each_kernel_and_they_compute_the_reference():
    x = cuda.to_device(np.arange(1000, dtype=np.float32))
    out = cuda.device_array(1000, np.float32)
    x64 = cuda.to_device(np.arange(33, dtype=np.float64))
    out64 = cuda.device_array(33, np.float64)
    calls = {"add one": lambda: _add_one[4, 256](x, out), "twice": lambda: _twice[1, 64](x64, out64),
             "broken": lambda: 1 / 0}  # an error is left to the caller's own call
    compile_pool.warm_up(calls)
    if workbook.ON_GPU:
        assert len(_add_one.overloads) == 1 and len(_twice.overloads) == 1
        assert compile_pool._pool().started >= 1, "the compiles went to the workers"
    _add_one[4, 256](x, out)
    _twice[1, 64](x64, out64)
    workbook.assert_close(out, np.arange(1000, dtype=np.float32) + 1, name="add one")
    workbook.assert_close(out64, 2 * np.arange(33, dtype=np.float64), name="twice")


def test_a_check_inside_a_warm_up_call_is_left_to_the_callers_own_call():
    wrong = np.zeros(4, np.float32)
    compile_pool._local.pooled = True  # as in warm_up's threads
    try:
        assert compile_pool.warming_up()
        workbook.assert_close(wrong, np.ones(4, np.float32), name="thrown away")  # no error: the call is redone
    finally:
        compile_pool._local.pooled = False
    assert not compile_pool.warming_up()
    with pytest.raises(workbook.check.CheckError, match="checked"):
        workbook.assert_close(wrong, np.ones(4, np.float32), name="checked")
