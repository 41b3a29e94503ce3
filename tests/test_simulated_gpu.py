"""The simulator answering as another GPU (WORKBOOK_SIM_CC, workbook/capability.py): a T4's capability,
its shared memory per block, and its compiler's refusal of instructions it lacks."""

import os
import subprocess
import sys

import numpy as np
import pytest

import workbook
from workbook import capability, cuda

pytestmark = pytest.mark.skipif(workbook.ON_GPU, reason="the simulator answering as another GPU")


@pytest.fixture
def as_gpu(monkeypatch):
    """Answer as the capability given, for this test (current() is cached: the cache is reset)."""

    def answer(text):
        monkeypatch.setenv(capability.SIMULATED_ENV, text)
        monkeypatch.setattr(capability, "_current", [])

    yield answer
    capability._current.clear()


def test_the_simulator_answers_as_the_reference_gpu_by_default(monkeypatch):
    monkeypatch.delenv(capability.SIMULATED_ENV, raising=False)
    assert capability.simulated() == capability.REFERENCE
    assert capability.shared_limit(capability.REFERENCE) == 227 * 1024


def test_a_t4(as_gpu):
    as_gpu("7.5")
    assert capability.current() == (7, 5)
    assert capability.shared_limit() == 64 * 1024
    assert not capability.supports("mma.sync.f16") and capability.supports("ldmatrix")
    assert "answering as compute capability 7.5" in capability.message("cp.async")


def test_an_unknown_capability_is_refused(as_gpu):
    as_gpu("6.1")
    with pytest.raises(ValueError, match="WORKBOOK_SIM_CC='6.1'.*7.5"):
        capability.current()


def test_a_block_asking_for_more_shared_memory_than_a_t4_has_fails(as_gpu):
    @cuda.jit
    def fill(out):
        shared = cuda.shared.array(0, np.float32)
        shared[cuda.threadIdx.x] = cuda.threadIdx.x
        cuda.syncthreads()
        out[cuda.threadIdx.x] = shared[31 - cuda.threadIdx.x]

    out = cuda.device_array(32, np.float32)
    fill[1, 32, 0, 100 * 1024](out)  # 100 KB: an H100 block may have 227 KB
    assert out.copy_to_host()[0] == 31
    as_gpu("7.5")
    with pytest.raises(RuntimeError, match=r"fill: a launch with 102,400 bytes of dynamic shared memory a block, "
                                           r"more than the 65,536"):
        fill[1, 32, 0, 100 * 1024](out)


_MMA_ON_A_T4 = """
import numpy as np
import workbook
from workbook import cuda, tensor_cores as tc

@cuda.jit
def kernel(out):
    out[cuda.threadIdx.x] = tc.pack_f16x2(1.0, 2.0)  # a plain conversion: every GPU has it
    a = tc.pack_f16x2(1.0, 1.0)
    tc.mma_f16((a, a, a, a), (a, a), (0.0, 0.0, 0.0, 0.0))  # refused before its operands are read

try:
    kernel[1, 32](cuda.device_array(32, np.uint32))
except Exception as error:
    print(type(error).__name__, error)
"""


def test_a_t4_refuses_an_instruction_it_lacks_where_the_kernel_runs_it():
    done = subprocess.run([sys.executable, "-c", _MMA_ON_A_T4], capture_output=True, text=True, timeout=300,
                          env={**os.environ, capability.SIMULATED_ENV: "7.5", "WORKBOOK_DEVICE": "sim",
                               "WORKBOOK_COMPILE": "0"})
    assert "lacks mma.sync.f16" in done.stdout and "tensor_cores.mma_f16" in done.stdout, done.stdout + done.stderr


def test_a_notebook_a_t4_cannot_run_stops_saying_why_and_the_run_goes_on(tmp_path):
    """Chapter 09a needs mma.sync FP16 and TF32 and cp.async everywhere: on a T4 it stops at its first
    cell with the reason, and `python -m workbook run` reports it skipped, not failed."""
    done = subprocess.run([sys.executable, "-m", "workbook", "run", "ch09a", "--how", "script"], capture_output=True,
                          text=True, timeout=600, cwd=capability.__file__.rsplit("/workbook/", 1)[0],
                          env={**os.environ, capability.SIMULATED_ENV: "7.5", "WORKBOOK_DEVICE": "sim",
                               "WORKBOOK_COMPILE": "0", "WORKBOOK_RESULTS": str(tmp_path)})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    said = " ".join(done.stdout.split())
    assert "ch09a_mma_sync: skipped on this GPU" in said and "lacks mma.sync.f16" in said, said[-3000:]
    log = (tmp_path / "simulator" / "ch09a.log").read_text()
    assert "This notebook stops here" in log and "Traceback" not in log
