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


@cuda.jit
def atomic_on_a_row_kernel(a):
    i = cuda.grid(1)
    if i < a.shape[0]:
        cuda.atomic.add(a, i, 1.0)  # a is 2-D: numba wants an index for each dimension


@sim_only
@needs_compiler
def test_a_plain_error_out_of_numbas_typing_is_the_kernels_fault(private_compiler):
    """numba's typing of an atomic on a 2-D array given one index raises a plain TypeError, not a
    TypingError: still the kernel's fault, named as such (not 'could not be compiled here')."""
    with pytest.raises(compiler.GPUCompileError) as raised:
        atomic_on_a_row_kernel[1, 32](cuda.to_device(np.zeros((4, 3), np.float32)))
    message = str(raised.value)
    assert "atomic_on_a_row_kernel" in message and "would not compile for a GPU" in message
    assert "TypeError in numba's typing or lowering" in message and "2-D array with 1-D index" in message


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
def test_wgmma_kernels_compile_for_sm_90a_alone(private_compiler):
    from numba import typeof

    from chapters.ch09_tensor_cores import pipelined, wgmma

    gemm, conv = wgmma.KERNELS["f16"]
    a = np.zeros((130, 72), np.float16)
    answer = private_compiler.compile(gemm, tuple(map(typeof, (a, a, np.zeros((130, 130), np.float32)))))
    hopper, t4 = answer["targets"]
    assert hopper["target"] == "9.0" and hopper["cc"] == "9.0a" and "wgmma" in answer["needs"]
    assert t4["target"] == "7.5" and "wgmma (sm_90a only)" in t4["skipped"]
    ptx = workbook.show_ptx(gemm, a, a, np.zeros((130, 130), np.float32), grep=r"wgmma|\.target|fence\.proxy")
    assert ".target sm_90a" in ptx and ptx.count("wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16") == 4
    assert "wgmma.wait_group.sync.aligned 0" in ptx and "fence.proxy.async.shared::cta" in ptx
    # mma.sync: 9.0 as itself; a T4 has ldmatrix but neither the m16n8k16 mma nor cp.async
    a16, c = np.zeros((128, 64), np.float16), np.zeros((128, 128), np.float32)
    answer = private_compiler.compile(pipelined.gemm_f16_pipelined, tuple(map(typeof, (a16, a16.T.copy(), c))))
    assert [t.get("cc") for t in answer["targets"]] == ["9.0", None]
    assert answer["targets"][1]["skipped"] == "7.5 lacks mma.sync.f16 (8.0+), cp.async (8.0+)"
    with pytest.raises(ValueError, match="7.5: this kernel is not built for it: 7.5 lacks mma.sync.f16"):
        workbook.show_ptx(pipelined.gemm_f16_pipelined, a16, a16.T.copy(), c, cc=(7, 5))


# Every target the installed compiler supports (python -m workbook compile), and what each kernel needs


@sim_only
@needs_compiler
def test_the_targets_are_the_compilers_own_from_a_t4_up():
    """NVRTC's list, as numba-cuda reads it in compile mode, from 7.5 up; one build a family."""
    import json
    import os
    import subprocess
    import sys

    program = ("import json, workbook\nfrom numba.cuda.cudadrv import nvrtc\n"
               "print(json.dumps(nvrtc.get_supported_ccs()))")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                          env={**os.environ, "WORKBOOK_DEVICE": "compile", "NUMBA_ENABLE_CUDASIM": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    numbas = [tuple(cc) for cc in json.loads(done.stdout)]
    targets = compiler.supported_targets()
    assert targets == [cc for cc in numbas if cc >= compiler.OLDEST]
    # the GPUs a class brings: T4, A100 and RTX 30, RTX 40 and L4, H100 and H200, Blackwell
    assert {(7, 5), (8, 0), (8, 6), (8, 9), (9, 0), (10, 0), (12, 0)} <= set(targets)
    families = compiler.families(targets)
    assert families[8][0] == (8, 0) and set(families[8]) >= {(8, 6), (8, 9)}
    assert compiler.plan() == [members[0] for members in families.values()]
    assert compiler.plan()[:3] == [(7, 5), (8, 0), (9, 0)] and compiler.plan(every_target=True) == targets


def test_what_each_target_lacks_is_said_and_wgmma_is_built_as_sm_90a():
    from workbook import capability

    mma = ["ldmatrix", "mma.sync.f16", "cp.async"]
    assert capability.skip_reason(mma, (7, 5)) == "7.5 lacks mma.sync.f16 (8.0+), cp.async (8.0+)"
    assert capability.skip_reason(mma, (8, 0)) is None and capability.skip_reason(mma, (12, 0)) is None
    assert capability.skip_reason(["ldmatrix"], (7, 5)) is None
    assert capability.skip_reason(["red.v4.f32"], (8, 9)) == "8.9 lacks red.v4.f32 (9.0+)"
    wgmma = ["cp.async", "wgmma"]
    assert capability.skip_reason(wgmma, (9, 0)) is None and capability.build_target(wgmma, (9, 0)) == (9, 0, "a")
    for blackwell in ((10, 0), (12, 0)):  # a later GPU, but not Hopper's instruction
        assert capability.skip_reason(wgmma, blackwell) == f"{blackwell[0]}.0 lacks wgmma (sm_90a only)"
    assert capability.skip_reason(wgmma, (7, 5)) == "7.5 lacks wgmma (sm_90a only), cp.async (8.0+)"
    assert capability.build_target(mma, (9, 0)) == (9, 0)
    ptx = "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%r1}, [%r2];\ncp.async.commit_group;\n" \
          "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1}, {%r1}, {%r2}, {%f1};"
    assert capability.found_in(ptx) == ["ldmatrix", "mma.sync.tf32", "cp.async"]


# One line of PTX per instruction of workbook/capability.py: ptxas must take it exactly where the
# table says the target has it (every family's oldest target, and sm_90a).
PTX_SAMPLES = {
    "ldmatrix": "ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2,%r3,%r4}, [%r0];",
    "mma.sync.f16": "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, "
                    "{%r5,%r6}, {%f1,%f2,%f3,%f4};",
    "mma.sync.bf16": "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, "
                     "{%r5,%r6}, {%f1,%f2,%f3,%f4};",
    "mma.sync.tf32": "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%f1,%f2,%f3,%f4}, {%r1,%r2,%r3,%r4}, "
                     "{%r5,%r6}, {%f1,%f2,%f3,%f4};",
    "cvt.tf32": "cvt.rna.tf32.f32 %r1, %f1;",
    "cvt.f16x2": "cvt.rn.f16x2.f32 %r1, %f1, %f2;",
    "cvt.bf16x2": "cvt.rn.bf16x2.f32 %r1, %f1, %f2;",
    "cp.async": "cp.async.cg.shared.global [%r0], [%rd1], 16, %r1; cp.async.commit_group; cp.async.wait_group 0;",
    "red.v4.f32": "red.global.add.v4.f32 [%rd1], {%f1,%f2,%f3,%f4};",
    "fence.proxy.async": "fence.proxy.async.shared::cta;",
    "wgmma": "wgmma.fence.sync.aligned; wgmma.commit_group.sync.aligned; wgmma.wait_group.sync.aligned 0;",
}


def _sample_ptx(line, arch):
    return f""".version 8.8
.target {arch}
.address_size 64
.visible .entry sample(.param .u64 p) {{
.reg .b32 %r<8>; .reg .f32 %f<8>; .reg .b64 %rd<4>;
ld.param.u64 %rd1, [p];
mov.b32 %r0, 0; mov.b32 %r1, 0; mov.b32 %r2, 0; mov.b32 %r3, 0; mov.b32 %r4, 0; mov.b32 %r5, 0; mov.b32 %r6, 0;
mov.f32 %f1, 0f00000000; mov.f32 %f2, 0f00000000; mov.f32 %f3, 0f00000000; mov.f32 %f4, 0f00000000;
{line}
st.global.f32 [%rd1], %f1; st.global.b32 [%rd1+4], %r1;
ret;
}}
"""


@sim_only
@needs_compiler
def test_the_instruction_table_agrees_with_ptxas():
    import importlib

    from numba.core.errors import NumbaError

    from workbook import capability

    assert set(PTX_SAMPLES) == set(capability.INSTRUCTIONS), "every instruction of the table needs a sample here"
    for instruction in capability.INSTRUCTIONS.values():  # the intrinsics named as emitting it exist
        for name in instruction.by:
            module, function = name.split(".")
            assert hasattr(importlib.import_module(f"workbook.{module}"), function), name
    for name, line in PTX_SAMPLES.items():
        assert capability.found_in(line) == [name]
        for cc in [*compiler.plan(), (9, 0, "a")]:
            has = capability.INSTRUCTIONS[name].on(cc) and (capability.build_target([name], cc) == cc)
            try:
                compiler._ptx_facts(_sample_ptx(line, compiler._arch(cc)), cc)
                took = True
            except NumbaError as error:
                took = False
                assert "workbook/capability.py does not list" in str(error)  # the hint, for an instruction not listed
            assert took == has, f"{name} on {compiler._arch(cc)}: ptxas {'took' if took else 'rejected'} it"


@sim_only
@needs_compiler
def test_compile_builds_every_target_and_says_why_it_skips_one(private_compiler, tmp_path, capsys):
    from workbook.__main__ import main

    from chapters.ch01_relu_mask import kernels as k1
    from chapters.ch09_tensor_cores import pipelined

    x = np.zeros(64, np.float32)
    workbook.show_ptx(k1.relu_mask_ballot_kernel, x, x, np.zeros(2, np.uint32), grep="x^")
    a16, c = np.zeros((128, 64), np.float16), np.zeros((128, 128), np.float32)
    workbook.show_ptx(pipelined.gemm_f16_pipelined, a16, a16.T.copy(), c, grep="x^")
    capsys.readouterr()
    assert main(["compile", "--all", "--log", str(tmp_path)]) == 0
    printed = " ".join(capsys.readouterr().out.split())  # the lines as rich wrapped them, joined
    assert "relu_mask_ballot_kernel" in printed and "gemm_f16_pipelined" in printed
    assert "7.5 lacks mma.sync.f16 (8.0+), cp.async (8.0+)" in printed  # the reason, under the table
    plan = compiler.plan()
    assert f"{2 * len(plan) - 1} built, 1 skipped" in printed and "0 would not compile" in printed
    assert "8.0 (+8.6" in printed  # a family's later targets run its oldest's build
    # cached: a second run builds nothing
    assert main(["compile", "--all", "--log", str(tmp_path)]) == 0
    assert "built 0 more" in capsys.readouterr().out


def test_the_simulator_answers_as_the_reference_gpu(capsys):
    from workbook import capability

    if SIM:
        assert capability.current() == capability.REFERENCE == (9, 0)
        assert capability.supports("wgmma") and capability.supports(*capability.MMA_SYNC, "red.v4.f32")
        assert capability.check("wgmma", instead="not printed") and capsys.readouterr().out == ""
    assert capability.supports("wgmma", cc=(9, 0)) and not capability.supports("wgmma", cc=(10, 0))
    assert capability.supports("ldmatrix", cc=(7, 5)) and not capability.supports("ldmatrix", "cp.async", cc=(7, 5))
    assert [i.name for i in capability.lacking(*capability.MMA_SYNC, cc=(7, 5))] == [
        "mma.sync.f16", "mma.sync.tf32", "cvt.tf32", "cp.async"]
    said = capability.message("wgmma", cc=(8, 6), what="the wgmma GEMM", instead="the mma.sync kernels run alone")
    assert said.startswith("a GPU of compute capability 8.6 lacks wgmma (Hopper's warpgroup MMA")
    assert said.endswith("which the wgmma GEMM uses: wgmma needs compute capability 9.0 alone (sm_90a). The mma.sync "
                         "kernels run alone")
    assert capability.message("cp.async", cc=(8, 0)) == ""
    with pytest.raises(RuntimeError, match=r"7.5 lacks mma.sync.f16 \(.*\), cp.async \(.*\), which the FP16 "
                                           "convolution uses: mma.sync.f16 and cp.async need compute capability 8.0"):
        capability.require("mma.sync.f16", "cp.async", what="the FP16 convolution", cc=(7, 5))
    with pytest.raises(ValueError, match="no instruction 'tcgen05'"):
        capability.supports("tcgen05")


@sim_only
def test_a_target_that_cannot_be_built_is_skipped_with_why_and_an_error_is_an_error():
    """compiler._build: an instruction the target lacks is skipped before NVVM; a known limit of the
    installed compiler (COMPILER_LIMITS) is skipped with its reason; any other error is the kernel's."""
    def ptx_for(cc):
        if cc == (10, 0):
            raise RuntimeError("NVVM: atomicrmw does not support operation: 'fadd'.")
        if cc == (12, 0):
            raise RuntimeError("NVVM: something else")
        return f".target {compiler._arch(cc)}\ncp.async.commit_group;"

    entries, needs = compiler._build(ptx_for, [(9, 0), (7, 5), (10, 0), (12, 0)], assemble=[], errors_raise=False)
    assert needs == ["cp.async"]
    hopper, t4, b200, rtx50 = entries
    assert hopper["cc"] == "9.0" and "skipped" not in hopper and "error" not in hopper
    assert t4 == {"target": "7.5", "skipped": "7.5 lacks cp.async (8.0+)"}
    assert b200["compiler"] and "fixed in CUDA 13" in b200["skipped"]
    assert rtx50["error"] == "RuntimeError: NVVM: something else"
    with pytest.raises(RuntimeError, match="something else"):  # a launch's compile: the kernel's error
        compiler._build(ptx_for, [(12, 0)], assemble=[])


def test_the_table_counts_built_skipped_and_errors(capsys):
    from workbook import report, tables

    def record(**everywhere):
        return {"ok": True, "everywhere": {cc.replace("_", "."): entry for cc, entry in everywhere.items()}}

    records = {
        ("chapters.ch09_tensor_cores.pipelined.gemm_f16", "array(float16, 2d, C)"): record(
            **{"7_5": {"skipped": "7.5 lacks cp.async (8.0+)"}, "9_0": {"registers": 238, "spill_bytes": 0},
               "12_0": {"registers": 72, "stack_bytes": 640}}),
        ("chapters.ch08_capstone.layers.wgrad", "array(float32, 1d, C)"): record(
            **{"7_5": {"registers": 40}, "9_0": {"registers": 40},
               "12_0": {"skipped": "NVVM 12.9's verifier rejects ...", "compiler": True}}),
        ("chapters.ch01_relu_mask.kernels.broken", "float32"): record(
            **{"7_5": {"registers": 10}, "9_0": {"registers": 10}, "12_0": {"error": "NvvmError: no"}}),
    }
    errors = report.compile_table(records, tables.console(), [(7, 5), (9, 0), (12, 0)])
    printed = " ".join(capsys.readouterr().out.split())  # the lines as rich wrapped them, joined
    assert errors == 1
    assert "6 built, 1 skipped for an instruction the target lacks" in printed
    assert "1 not built by the installed compiler" in printed and "1 would not compile" in printed
    assert "7.5 lacks cp.async (8.0+)" in printed and "broken (float32) for 12.0: NvvmError: no" in printed
    assert "72 L640" in printed and "float16[:, ::1]" in printed  # local memory; numba's own notation


def test_an_instruction_is_found_where_ptx_states_it_not_where_a_name_says_it():
    from workbook import capability

    ptx = ('.file 1 "/work/chapters/ch09_tensor_cores/wgmma.py"\n// wgmma.fence in a comment\n'
           ".visible .entry _ZN8chapters5wgmma6kernelE()\n{\n\t@%p1 bra $L__BB0_2;\n"
           "\t// begin inline asm\n\t@!%p2 cp.async.cg.shared.global [%r1], [%rd1], 16, %r2;\n"
           "\tcp.async.commit_group; ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r1,%r2,%r3,%r4}, [%r5];\n}")
    assert capability.found_in(ptx) == ["ldmatrix", "cp.async"]
