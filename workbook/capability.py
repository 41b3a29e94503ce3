"""Which instructions a GPU has: one table, read by the chapters and by the compile check.

A class brings every GPU generation: T4s (compute capability 7.5), A100s and RTX 30s (8.0, 8.6),
RTX 40s and L4s (8.9), H100s and H200s (9.0), Blackwell cards (10.0, 12.0). Most of the workbook's
kernels run on all of them. A few use an instruction that older GPUs lack (or, for wgmma, that only
one GPU has); each is emitted by an intrinsic of workbook/tensor_cores.py or workbook/memory.py, and
each is listed below, once, with the first compute capability that has it and how it looks in PTX.

A chapter asks before it runs such a kernel:

    capability.supports("wgmma")                  -> bool, for the GPU this runs on
    capability.check("wgmma", instead="the mma.sync kernels run alone")
                                                  -> the same bool; when False it also prints why
    capability.require("mma.sync.f16", "cp.async", what="the FP16 convolution")
                                                  -> raises RuntimeError saying why (a wrapper's check)
    capability.message(...), capability.lacking(...), capability.current()

The simulator runs every instruction: it answers as the GPUs the workbook is measured on (H100 and
H200, compute capability 9.0). With WORKBOOK_SIM_CC=7.5 (any capability of SHARED_OPT_IN) it answers
as that GPU instead: `current()` is 7.5, a block may have its shared memory (64 KB on a T4), and an
intrinsic whose instruction that GPU lacks raises where a kernel runs it (`guard`), as that GPU's
compiler would refuse the kernel. A chapter run so shows what a class's T4s will do with it.
`python -m workbook compile` uses the same table: it finds the instructions in each kernel's PTX
(the `ptx` patterns) and builds the kernel only for the targets that have them, reporting the others
as skipped with the reason (`skip_reason`). An instruction ptxas rejects for a target that this
table does not list is a compile error: add it here, and make the kernel's wrapper ask.
"""

import re
from dataclasses import dataclass

REFERENCE = (9, 0)  # what the simulator answers as: the Hopper GPUs (H100, H200) the workbook is measured on
SIMULATED_ENV = "WORKBOOK_SIM_CC"  # "7.5": the simulator answers as a GPU of that capability instead
# Dynamic shared memory a block may have when it asks (cudaDevAttrMaxSharedMemoryPerBlockOptin)
SHARED_OPT_IN = {(7, 5): 64 * 1024, (8, 0): 163 * 1024, (8, 6): 99 * 1024, (8, 7): 163 * 1024,
                 (8, 9): 99 * 1024, (9, 0): 227 * 1024, (10, 0): 227 * 1024, (12, 0): 99 * 1024}


@dataclass(frozen=True)
class Instruction:
    name: str
    first: tuple  # the first compute capability that has it
    ptx: str  # a regular expression its PTX statements start with
    what: str  # what it is, for a reader
    by: tuple  # the intrinsics that emit it (module.function, in workbook/)
    only: tuple | None = None  # an architecture-specific instruction: this capability alone (built as sm_XXa)

    def on(self, cc):
        """Does a GPU of compute capability `cc` have it?"""
        cc = tuple(cc[:2])
        return cc == self.only if self.only else cc >= self.first

    def needs(self, short=False):
        """What it asks of a GPU: 'compute capability 8.0 and later' ('8.0+' if short), or for an
        architecture-specific one 'compute capability 9.0 alone (sm_90a)' ('sm_90a only')."""
        arch = f"sm_{''.join(map(str, self.only or ()))}a"
        if short:
            return f"{arch} only" if self.only else f"{_text(self.first)}+"
        if self.only:
            return f"compute capability {_text(self.only)} alone ({arch})"
        return f"compute capability {_text(self.first)} and later"


_LDMATRIX = tuple(f"tensor_cores.ldmatrix_x{n}{trans}" for n in (1, 2, 4) for trans in ("", "_trans"))
INSTRUCTIONS = {instruction.name: instruction for instruction in (
    Instruction("ldmatrix", (7, 5), r"ldmatrix\.", "a warp reads 8x8 matrices from shared memory", _LDMATRIX),
    Instruction("mma.sync.f16", (8, 0), r"mma\.sync\.aligned\.m16n8k16\.\w+\.\w+\.f32\.f16\.",
                "tensor-core MMA m16n8k16, FP16 operands, FP32 sums", ("tensor_cores.mma_f16",)),
    Instruction("mma.sync.bf16", (8, 0), r"mma\.sync\.aligned\.m16n8k16\.\w+\.\w+\.f32\.bf16\.",
                "tensor-core MMA m16n8k16, BF16 operands, FP32 sums", ("tensor_cores.mma_bf16",)),
    Instruction("mma.sync.tf32", (8, 0), r"mma\.sync\.aligned\.m16n8k8\.\w+\.\w+\.f32\.tf32\.",
                "tensor-core MMA m16n8k8, TF32 operands", ("tensor_cores.mma_tf32",)),
    Instruction("cvt.tf32", (8, 0), r"cvt\.rna\.tf32\.f32\b", "float32 rounded to TF32", ("tensor_cores.to_tf32",)),
    # pack_f16x2 emits it for float32 values only (float16 ones are packed as they are): no intrinsic
    # is refused for it, and every kernel that packs float32 for an mma needs 8.0 for the mma anyway
    Instruction("cvt.f16x2", (8, 0), r"cvt\.rn\.f16x2\.f32\b", "two float32 rounded to FP16 in one register", ()),
    Instruction("cvt.bf16x2", (8, 0), r"cvt\.rn\.bf16x2\.f32\b", "two float32 rounded to BF16 in one register",
                ("tensor_cores.pack_bf16x2",)),
    Instruction("cp.async", (8, 0), r"cp\.async\.(?!bulk)", "copies global -> shared memory without registers",
                ("tensor_cores.cp_async16", "tensor_cores.cp_async_commit", "tensor_cores.cp_async_wait")),
    Instruction("red.v4.f32", (9, 0), r"red\.global\.add\.v4\.f32\b", "four float32 added atomically at once",
                ("memory.atomic_add4",)),
    Instruction("fence.proxy.async", (9, 0), r"fence\.proxy\.async\b",
                "shared-memory writes made visible to the tensor cores' reads", ("tensor_cores.fence_proxy_async",)),
    Instruction("wgmma", (9, 0), r"wgmma\.", "Hopper's warpgroup MMA from shared memory; Blackwell's tensor "
                "cores take other instructions", tuple(f"tensor_cores.wgmma_{name}" for name in (
                    "f16", "f16_from_registers", "tf32", "fence", "commit", "wait")), only=(9, 0)),
)}

# What chapter 09's mma.sync kernels (and those built on them in chapters 08, 10 and 11) use.
MMA_SYNC = ("mma.sync.f16", "mma.sync.tf32", "cvt.tf32", "cp.async", "ldmatrix")


def _text(cc):
    return f"{cc[0]}.{cc[1]}" + "".join(str(part) for part in cc[2:])


def _and(names):
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _instructions(names):
    unknown = [name for name in names if name not in INSTRUCTIONS]
    if unknown:
        raise ValueError(f"no instruction {', '.join(map(repr, unknown))} in workbook.capability.INSTRUCTIONS; "
                         f"it has {', '.join(INSTRUCTIONS)}")
    return [INSTRUCTIONS[name] for name in names]


# ---------------------------------------------------------------------------------------------
# The chapters' questions


_current = []


def current():
    """(major, minor) of the GPU the chapters run on: the device's, or in the simulator REFERENCE
    (or what WORKBOOK_SIM_CC says)."""
    if not _current:
        from . import MODE

        if MODE == "gpu":
            from numba import cuda

            _current.append(tuple(cuda.get_current_device().compute_capability))
        else:
            _current.append(simulated())
    return _current[0]


def simulated():
    """The capability the simulator answers as: WORKBOOK_SIM_CC ("7.5"), else REFERENCE."""
    import os

    text = os.environ.get(SIMULATED_ENV, "").strip()
    if not text:
        return REFERENCE
    try:
        cc = tuple(int(part) for part in text.split("."))
    except ValueError:
        cc = ()
    if cc not in SHARED_OPT_IN:
        raise ValueError(f"{SIMULATED_ENV}={text!r}: the simulator answers as one of "
                         f"{', '.join(_text(c) for c in SHARED_OPT_IN)}")
    return cc


def shared_limit(cc=None):
    """Bytes of dynamic shared memory a block may ask for on a GPU of capability `cc` (default this one)."""
    return SHARED_OPT_IN.get(tuple(current() if cc is None else cc)[:2], SHARED_OPT_IN[REFERENCE])


def guard(namespace, module):
    """In the simulator answering as a GPU other than REFERENCE: wrap each intrinsic of `namespace` (a
    module's globals; `module` its name in INSTRUCTIONS' `by`, "tensor_cores") whose instruction that
    GPU lacks, so that a kernel calling it raises, naming the instruction, as the GPU's compiler
    would refuse it. Nothing changes for the reference GPU or on a real one."""
    from . import MODE

    if MODE == "gpu" or simulated() == REFERENCE:
        return
    for instruction in INSTRUCTIONS.values():
        if instruction.on(current()):
            continue
        for name in instruction.by:
            owner, _, function = name.partition(".")
            if owner == module and function in namespace:
                namespace[function] = _refusing(namespace[function], instruction, name)


def _refusing(function, instruction, name):
    def refused(*args, **kwargs):
        raise RuntimeError(f"{_device_name(current())} lacks {instruction.name} ({instruction.what}), which "
                           f"{name} emits: it needs {instruction.needs()}, and a GPU without it cannot compile "
                           "this kernel. Ask first: workbook.capability.check / require")

    # named as the intrinsic it stands for: pickled by that name, the compile worker gets the GPU's own
    refused.__module__, refused.__qualname__, refused.__name__ = function.__module__, function.__qualname__, \
        function.__name__
    return refused


def _device_name(cc):
    from . import MODE

    if MODE != "gpu":
        return f"the simulator (answering as compute capability {_text(cc)})"
    from numba import cuda

    name = cuda.get_current_device().name
    return f"{name.decode() if isinstance(name, bytes) else name} (compute capability {_text(cc)})"


def lacking(*names, cc=None):
    """The instructions of `names` that a GPU of capability `cc` (default: this one) does not have."""
    cc = current() if cc is None else tuple(cc)
    return [instruction for instruction in _instructions(names) if not instruction.on(cc)]


def supports(*names, cc=None):
    """Does the GPU (of capability `cc`, default this one) have every instruction named?"""
    return not lacking(*names, cc=cc)


def message(*names, cc=None, what=None, instead=None):
    """One line saying what this GPU lacks, what needs it and what runs instead; "" if it lacks nothing."""
    this_gpu = cc is None
    cc = current() if this_gpu else tuple(cc)
    missing = lacking(*names, cc=cc)
    if not missing:
        return ""
    by_need = {}
    for instruction in missing:
        by_need.setdefault(instruction.needs(), []).append(instruction.name)
    who = _device_name(cc) if this_gpu else f"a GPU of compute capability {_text(cc)}"
    lacks = ", ".join(f"{i.name} ({i.what})" for i in missing)
    needs = "; ".join(f"{_and(names)} need{'s' if len(names) == 1 else ''} {need}" for need, names in by_need.items())
    return (f"{who} lacks {lacks}" + (f", which {what} uses" if what else "") + f": {needs}"
            + (f". {instead[0].upper()}{instead[1:]}" if instead else ""))


def check(*names, instead=None, what=None):
    """supports(*names) for this GPU; when False, also print why (and `instead`: what runs in its place)."""
    said = message(*names, what=what, instead=instead)
    if said:
        print(said)
    return not said


class NotOnThisGPU(RuntimeError):
    """A notebook that cannot run on this GPU stops here, saying why (`needed`). In Jupyter it shows
    its message, not a traceback; `python -m workbook run` reports the notebook skipped, not failed."""

    def _render_traceback_(self):  # (IPython's hook for an exception's display)
        return [f"This notebook stops here: {self}"]


def needed(*names, what, instead=None):
    """At the top of a notebook every part of which needs the instructions `names`: on a GPU that
    lacks one, raise NotOnThisGPU saying what it lacks and what to do instead."""
    said = message(*names, what=what, instead=instead)
    if said:
        raise NotOnThisGPU(said)


def require(*names, what, cc=None):
    """Raise RuntimeError, saying why, if the GPU lacks an instruction `what` (a kernel, a chapter) uses."""
    said = message(*names, cc=cc, what=what)
    if said:
        raise RuntimeError(said)


# ---------------------------------------------------------------------------------------------
# The compile check's questions (workbook/compiler.py)


def found_in(ptx):
    """The names of the instructions of the table that a kernel's PTX uses: statements that start
    with one (after a predicate such as `@%p1`), not a comment, a name or a `.file` path that says it."""
    return [name for name, instruction in INSTRUCTIONS.items()
            if re.search(rf"(?m)(?:^|;)[ \t]*(?:@!?%\w+[ \t]+)?{instruction.ptx}", ptx)]


def skip_reason(needs, target):
    """Why a kernel using the instructions `needs` is not built for `target` ((major, minor)), or None."""
    missing = [INSTRUCTIONS[name] for name in needs if not INSTRUCTIONS[name].on(target)]
    if not missing:
        return None
    missing.sort(key=lambda i: (i.only is None, [-part for part in i.first]))  # the rarest first: wgmma, 9.0+, 8.0+
    return f"{_text(target)} lacks " + ", ".join(f"{i.name} ({i.needs(short=True)})" for i in missing)


def build_target(needs, target):
    """The target a kernel is built as for a GPU of capability `target`: (9, 0, "a") where it uses an
    architecture-specific instruction of 9.0 (wgmma), else the target itself."""
    target = tuple(target)
    if any(INSTRUCTIONS[name].only == target[:2] for name in needs):
        return (*target[:2], "a")
    return target
