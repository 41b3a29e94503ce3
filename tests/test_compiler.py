"""The real CUDA compiler without a GPU (workbook/compiler.py), and the PTX the chapters claim.

In the simulator these need the `compile` extra (NVVM, cloudpickle); without it they are skipped,
saying so. On a GPU every launch compiles anyway, and the PTX tests run there too."""

import workbook  # noqa: I001  (first: it picks GPU or simulator before numba.cuda is imported)

import numpy as np
import pytest

from workbook import cuda

SIM = workbook.MODE == "sim"

if SIM:
    from workbook import compiler

    WHY_NOT = compiler.missing()
else:
    WHY_NOT = None

needs_compiler = pytest.mark.skipif(WHY_NOT is not None, reason=f"no GPU compiler here: {WHY_NOT}")
sim_only = pytest.mark.skipif(not SIM, reason="the compile hook is the simulator's; a GPU compiles every launch")


# A kernel the simulator runs happily: it casts 1.5 to a mask of all ones... but numba's CUDA
# typing wants an integer mask, so the GPU compiler rejects it.
@cuda.jit
def float_mask_ballot_kernel(x, out):
    i = cuda.grid(1)
    if i < x.size:
        bits = cuda.ballot_sync(1.5, x[i] > 0)
        if i % 32 == 0:
            out[i // 32] = bits


@pytest.fixture
def private_compiler(monkeypatch, tmp_path):
    """A compile client of this test's own, logging to tmp_path (not to the run's compile log)."""
    client = compiler.Compiler()
    client.log_dir = str(tmp_path)
    monkeypatch.setattr(compiler, "_compiler", client)
    monkeypatch.setenv("WORKBOOK_COMPILE", "auto")
    return client


@sim_only
@needs_compiler
def test_uncompilable_kernel_fails_its_launch_with_numbas_message(private_compiler):
    x = cuda.to_device(np.arange(-16, 48, dtype=np.float32))
    out = cuda.to_device(np.zeros(2, np.uint32))
    with pytest.raises(compiler.GPUCompileError) as raised:
        float_mask_ballot_kernel[2, 32](x, out)
    message = str(raised.value)
    assert "float_mask_ballot_kernel" in message and "would not compile for a GPU" in message
    assert "TypingError" in message and "array(float32, 1d, C)" in message


@sim_only
@needs_compiler
def test_compile_command_names_the_kernel_and_exits_non_zero(private_compiler, tmp_path, capsys):
    from workbook.__main__ import main

    x = cuda.to_device(np.ones(32, np.float32))
    with pytest.raises(compiler.GPUCompileError):
        float_mask_ballot_kernel[1, 32](x, cuda.to_device(np.zeros(1, np.uint32)))
    assert main(["compile", "--all", "--log", str(tmp_path)]) == 1
    printed = capsys.readouterr().out
    assert "float_mask_ballot_kernel" in printed and "ERROR" in printed and "1 would not compile" in printed


@sim_only
@needs_compiler
def test_each_signature_compiles_once(private_compiler, tmp_path):
    from chapters.ch01_relu_mask import kernels as k

    for _ in range(3):
        x = cuda.to_device(np.linspace(-1, 1, 65, dtype=np.float32))
        k.relu_mask_ballot(x, cuda.device_array_like(x), cuda.device_array(k.mask_words(65), np.uint32))
    lines = [line for path in tmp_path.glob("compile-*.jsonl") for line in path.read_text().splitlines()]
    assert len(lines) == 1 and '"ok": true' in lines[0]


@sim_only
def test_without_the_compiler_it_says_so_once_and_goes_on(monkeypatch, capsys):
    from workbook import compiler

    monkeypatch.setattr(compiler, "_compiler", None)
    monkeypatch.setattr(compiler, "_said_missing", False)
    monkeypatch.setattr(compiler, "missing", lambda: "NVVM is not installed (for this test)")
    monkeypatch.setenv("WORKBOOK_COMPILE", "auto")
    x = cuda.to_device(np.ones(32, np.float32))
    float_mask_ballot_kernel[1, 32](x, cuda.to_device(np.zeros(1, np.uint32)))  # runs: nothing compiles
    float_mask_ballot_kernel[1, 32](x, cuda.to_device(np.zeros(1, np.uint32)))
    said = capsys.readouterr().err
    assert said.count("not compiled for the GPU") == 1 and "NVVM is not installed" in said


# The instructions the chapters' lessons are about, in the PTX of the kernels that teach them.


@needs_compiler
def test_ballot_kernel_votes_in_one_instruction(capsys):
    from chapters.ch01_relu_mask import kernels as k

    x = np.zeros(64, np.float32)
    ptx = workbook.show_ptx(k.relu_mask_ballot_kernel, x, x, np.zeros(2, np.uint32), grep=r"vote\.")
    assert "vote.sync.ballot.b32" in ptx
    assert "vote.sync.ballot" in capsys.readouterr().out  # show_ptx printed the matching lines


@needs_compiler
def test_warp_softmax_reduces_with_butterfly_shuffles():
    from chapters.ch06_softmax import kernels as k

    x = np.zeros((4, 64), np.float32)
    ptx = workbook.show_ptx(k.warp_softmax_kernel(k._slots(64), full=True), x, x, grep=r"shfl")
    # max and sum over 32 lanes: log2(32) = 5 butterfly steps each, unrolled
    assert ptx.count("shfl.sync.bfly.b32") >= 10


@needs_compiler
def test_ptx_targets_the_requested_capability():
    from chapters.ch01_relu_mask import kernels as k

    x = np.zeros(64, np.float32)
    assert ".target sm_90" in workbook.show_ptx(k.relu_mask_ballot_kernel, x, x, np.zeros(2, np.uint32), grep="x^")
    t4 = workbook.show_ptx(k.relu_mask_ballot_kernel, x, x, np.zeros(2, np.uint32), grep="x^", cc=(7, 5))
    assert ".target sm_75" in t4  # a T4, the GPU of free hosted notebooks


@needs_compiler
def test_pipelined_gemms_feed_the_tensor_cores_with_ldmatrix_and_cp_async():
    from chapters.ch09_tensor_cores import pipelined as p

    a16, c = np.zeros((128, 64), np.float16), np.zeros((128, 128), np.float32)
    f16 = workbook.show_ptx(p.gemm_f16_pipelined, a16, np.zeros((64, 128), np.float16), c, grep=r"mma|ldmatrix|cp\.async")
    assert f16.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 2 * 32  # two k16 halves x 4 x 8 tiles
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in f16 and "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in f16
    assert "cp.async.cg.shared.global" in f16 and "cp.async.wait_group 1" in f16
    a32 = np.zeros((128, 64), np.float32)
    tf32 = workbook.show_ptx(p.gemm_tf32_pipelined, a32, a32, c, grep=r"mma|cvt\.rna")
    assert tf32.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == 2 * 32
    assert "cvt.rna" not in tf32  # rounded by an add on the bits, the tensor core truncating the rest


@needs_compiler
def test_tensor_core_convolution_gathers_with_cp_async_and_compiles_for_sm_90():
    from chapters.ch09_tensor_cores import conv

    ints = (5, 7, 16, 35, 7, 3, 1, 1, 1, 1, 1, 1)  # H W C PQ Q S sh sw ph pw dh dw
    for precision, dtype, mma in (("f16", np.float16, "m16n8k16.row.col.f32.f16.f16.f32"),
                                  ("tf32", np.float32, "m16n8k8.row.col.f32.tf32.tf32.f32")):
        ptx = workbook.show_ptx(conv.KERNELS[precision], np.zeros(560, dtype), np.zeros((17, 144), dtype),
                                np.zeros((35, 17), np.float32), *ints, grep=r"mma|ldmatrix|cp\.async")
        assert ptx.count(f"mma.sync.aligned.{mma}") == 2 * 32
        assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx and ".trans" not in ptx  # B^T: no transpose
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group 1" in ptx


@needs_compiler
@sim_only
def test_wgmma_kernels_compile_for_sm_90a_alone():
    from chapters.ch09_tensor_cores import pipelined, wgmma
    from workbook import compiler

    gemm, conv = wgmma.KERNELS["f16"]
    assert compiler.ccs_for(gemm.py_func if hasattr(gemm, "py_func") else gemm.fn) == (compiler.SM_90A,)
    assert compiler.ccs_for(pipelined.gemm_f16_pipelined.py_func) == compiler.CCS  # mma.sync: 9.0 and 7.5
    a = np.zeros((130, 72), np.float16)
    ptx = workbook.show_ptx(gemm, a, a, np.zeros((130, 130), np.float32), grep=r"wgmma|\.target|fence\.proxy")
    assert ".target sm_90a" in ptx and ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16") == 4
    assert "wgmma.wait_group.sync.aligned 0" in ptx and "fence.proxy.async.shared::cta" in ptx
