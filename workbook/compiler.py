"""The real CUDA compiler on a machine without a GPU: every kernel the simulator runs is also compiled.

numba's simulator runs a kernel as Python and never types it, so a kernel the GPU compiler would
reject (a float ballot mask, a Python list, a float used as an index) can pass every check on a
laptop. The compiler itself needs no GPU: numba-cuda's cu12 extra brings NVVM, and ptxas from the
same wheels reports registers and spills. In simulator mode, `install()` (called by `import
workbook`) makes every launch

    1. type the kernel's arguments as a GPU launch would (dtype, dimensions, layout of each array),
    2. compile the kernel once per signature, for compute capability 9.0 (the H100 the workbook is
       measured on) and 7.5 (a T4, the GPU of free hosted notebooks), in a separate worker process:
       typed and lowered once, then NVVM for each, ptxas for 9.0,
    3. raise GPUCompileError, with numba's message, if the GPU compiler rejects it (numba, NVVM, or
       ptxas for 9.0, which checks the inline PTX of workbook/memory.py and tensor_cores.py). A
       compile that could not run at all (no driver where a module wants one, a kernel that cannot
       travel to the worker) is not the kernel's fault: it is said once on stderr, and the launch
       goes on.

A kernel whose PTX uses an instruction that a target lacks (workbook/capability.py lists them: cp.async
and TF32 mma need 8.0, wgmma is sm_90a's alone) is not built for that target: its answer says
"skipped" and why. A wgmma kernel is built for 9.0 as sm_90a.

Every other GPU a class may bring is `python -m workbook compile`'s: it reads the log of every
signature the tests launched and builds each for the targets the installed compiler supports
(`supported_targets()`: NVRTC's list, which numba-cuda also reads, that ptxas also accepts, from
OLDEST up), one per family (`families()`: 8.6, 8.7 and 8.9 run 8.0's build, a cubin running on every
later minor version of its major; `--every-target` builds each, whose registers differ by a few), from
the LLVM IR the hook stored: no typing again, only NVVM and ptxas, in worker processes side by side
(`build_everywhere`). What the installed compiler itself cannot build for a target (COMPILER_LIMITS:
NVVM 12.9 and a float atomic add for Blackwell) is reported as such, with the reason, not as the
kernel's error.

Why a worker process: in simulator mode `numba.cuda` *is* the simulator, and the real compiler
cannot be imported beside it. The kernel travels to the worker by value (cloudpickle): its code, the
constants it reads, and its device functions, each rebuilt there with the real `cuda.jit`. The
module-level functions it calls travel by name, so the worker (which imports the workbook in
compile mode) gets their GPU versions: workbook/memory.py's intrinsics, chapter 03's address helpers.

    WORKBOOK_COMPILE=auto   compile when the compiler is installed (the default; says once if not)
    WORKBOOK_COMPILE=0      never (a launch costs no compile)
    WORKBOOK_COMPILER=numba-cuda-mlir
                            compile with the successor compiler instead (successor.py): the worker
                            rebuilds each kernel for it, for 9.0 (sm_90a for wgmma) and 7.5
    WORKBOOK_COMPILE_LOG=D  also append one JSON line per compile to D/compile-<pid>.jsonl
                            (read by `python -m workbook compile`)

Results are cached on disk (build/compile-cache/: an answer per signature, its LLVM IR, and an
answer per other target), so parallel test workers and later runs share them.
"""

import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
import zlib
from pathlib import Path

from . import capability

# Every launch: the H100 the workbook is measured on, and the T4 of free hosted notebooks.
CCS = ((9, 0), (7, 5))
# The oldest GPU the workbook supports (README): a T4, the oldest that CUDA 13 still supports. The
# CUDA 12 compiler also builds for 5.0-7.2; `python -m workbook compile` leaves those out.
OLDEST = (7, 5)
# What the installed compiler, not the GPU, cannot build: (a regular expression on NVVM's log, why). The
# kernel is reported as not built by this compiler, with the reason, and the check goes on.
COMPILER_LIMITS = (
    (r"atomicrmw does not support operation: 'fadd'",
     "NVVM 12.9's verifier rejects a float atomic add (cuda.atomic.add on float32 or float64) for Blackwell "
     "targets, a compiler bug fixed in CUDA 13 (numba-cuda issue #603): on such a GPU, install the cu13 extra"),
)
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "compile-cache"
CACHE_FORMAT = 4  # bump when what a cached answer holds changes


class GPUCompileError(RuntimeError):
    """A kernel that runs in the simulator but that the GPU compiler rejects."""


# ---------------------------------------------------------------------------------------------
# Is the compiler here?


_missing = []  # the answer of missing(), once known: it costs a Python start-up


def missing():
    """None if kernels can be compiled here, else what is missing (one line)."""
    if not _missing:
        _missing.append(_probe())
    return _missing[0]


def _probe():
    try:
        import cloudpickle  # noqa: F401
    except ImportError:
        return "cloudpickle is not installed"
    probe = subprocess.run([sys.executable, "-c", "import cuda.bindings.nvvm"], capture_output=True, text=True,
                           env=_worker_env())
    if probe.returncode:
        return "NVVM is not installed (pip install -e '.[compile]', which brings numba-cuda[cu12])"
    return None


def _worker_env():
    return dict(os.environ, NUMBA_ENABLE_CUDASIM="0", WORKBOOK_DEVICE="compile",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


_targets = []  # the answer of supported_targets(), once known


def supported_targets(oldest=OLDEST):
    """The compute capabilities the installed compiler builds for, from `oldest` up: NVRTC's list
    (nvrtcGetSupportedArchs, the list numba-cuda picks a GPU's target from; NVRTC comes with NVVM in
    the same CUDA wheels) that ptxas also assembles. [(7, 5), (8, 0), ..., (12, 1)] with CUDA 12.9."""
    if not _targets:
        import re

        asked = subprocess.run([sys.executable, "-c", "from cuda.bindings import nvrtc; "
                                "error, archs = nvrtc.nvrtcGetSupportedArchs(); print(int(error), *archs)"],
                               capture_output=True, text=True, env=_worker_env())
        if asked.returncode or not asked.stdout.split() or asked.stdout.split()[0] != "0":
            raise RuntimeError(f"NVRTC could not list its targets: {(asked.stderr or asked.stdout).strip()[-500:]}")
        archs = [int(arch) for arch in asked.stdout.split()[1:]]
        ptxas = _ptxas()
        if ptxas:  # its --help lists the values -arch takes
            assembled = set(re.findall(r"'sm_(\d+)'", subprocess.run([ptxas, "--help"], capture_output=True,
                                                                      text=True).stdout))
            archs = [arch for arch in archs if str(arch) in assembled] if assembled else archs
        _targets.append(tuple((arch // 10, arch % 10) for arch in archs))
    return [cc for cc in _targets[0] if cc >= tuple(oldest)]


def families(targets):
    """{major: [its targets, oldest first]}: a cubin built for the oldest runs on every later minor
    version of its major (8.0's on 8.6, 8.7 and 8.9), so one build a family shows that all compile."""
    grouped = {}
    for cc in sorted(targets):
        grouped.setdefault(cc[0], []).append(cc)
    return grouped


# ---------------------------------------------------------------------------------------------
# The simulator side: what a launch sends


def argument_types(args):
    """numba types of a launch's arguments, as a GPU launch would see them."""
    import numpy as np
    from numba import typeof

    from numba.cuda.simulator.args import ArgHint

    typed = []
    for arg in args:
        if isinstance(arg, ArgHint):  # cuda.In(x), cuda.InOut(x): the launch types the array itself
            arg = arg.value
        host = getattr(arg, "_ary", arg)  # the simulator's device arrays wrap a NumPy array
        if isinstance(host, np.ndarray):
            typed.append(typeof(host))
        else:
            typed.append(typeof(arg))
    return tuple(typed)


class _Pickler:
    """cloudpickle, with the simulator's kernels turned into 'rebuild me with the real cuda.jit'."""

    def __init__(self):
        import cloudpickle

        from numba.cuda.simulator.kernel import FakeCUDAKernel

        class Pickler(cloudpickle.Pickler):
            def reducer_override(self, obj):
                if isinstance(obj, FakeCUDAKernel):
                    options = {"fastmath": obj._fastmath}
                    if obj._device:
                        options["device"] = True
                    if getattr(obj, "_forceinline", False):
                        options["forceinline"] = True
                    return (_rebuild, (obj.fn, options))
                if isinstance(obj, type) and obj.__module__ == "numba.cuda.simulator.vector_types":
                    return (_real_vector_type, (obj.__name__,))  # cuda.float32x2 as the simulator has it
                return super().reducer_override(obj)

        self.pickler = Pickler

    def dumps(self, value):
        import io

        buffer = io.BytesIO()
        self.pickler(buffer, protocol=pickle.HIGHEST_PROTOCOL).dump(value)
        return buffer.getvalue()


def _sources_by_name(fn):
    """The text of the modules whose functions travel by name (the payload holds only their names):
    workbook/memory.py's and tensor_cores.py's intrinsics and the kernel's own module (chapter 03's address helpers).
    Part of the cache key, so that editing an intrinsic recompiles the kernels that call it."""
    paths = {Path(__file__).with_name("memory.py"), Path(__file__).with_name("tensor_cores.py")}
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    if getattr(module, "__file__", None):
        paths.add(Path(module.__file__))
    return b"".join(path.read_bytes() for path in sorted(paths) if path.is_file())  # not python's <stdin>


def _real_vector_type(name):
    from numba import cuda

    return getattr(cuda, name)


_rebuilt = {}  # in the worker: device functions already rebuilt, by what they are (see _identity)
_for_successor = False  # in the worker: compiling with numba-cuda-mlir (WORKBOOK_COMPILER)


def _rebuild(fn, options):
    """In the worker: the real cuda.jit of a function the simulator had. A device function that
    arrives again (another kernel of the same factory calls it) is the one rebuilt before, so numba
    types and lowers it once per signature, as it does a module-level device function. In a worker
    for the successor compiler it stays Python until the successor rebuilds it (successor.py)."""
    from numba import cuda

    if _for_successor:
        from .successor import Deferred

        return Deferred(fn, options)
    key = _identity(fn, options) if options.get("device") else None
    if key is None:
        return cuda.jit(**options)(fn)
    if key not in _rebuilt:
        _rebuilt[key] = cuda.jit(**options)(fn)
    return _rebuilt[key]


def _identity(fn, options):
    """What makes two device functions compile alike: their code, closure, defaults and the globals
    they name, each value with its type (np.float32(1) == 1.0, but they compile differently); None
    when a value cannot be compared that way (an array)."""
    def typed(value):
        if isinstance(value, tuple):
            return (tuple, tuple(typed(item) for item in value))
        return (type(value), value)

    try:
        names = tuple((name, typed(fn.__globals__[name])) for name in fn.__code__.co_names if name in fn.__globals__)
        key = (fn.__module__, fn.__qualname__, fn.__code__, typed(tuple(c.cell_contents for c in fn.__closure__ or ())),
               typed(fn.__defaults__), names, tuple(sorted(options.items())))
        hash(key)
    except (TypeError, ValueError):  # an unhashable value, or a cell not yet filled
        return None
    return key


# ---------------------------------------------------------------------------------------------
# The worker: reads requests (a kernel and its argument types, or a kernel's stored LLVM IR, and the
# targets), answers with each target's PTX facts, the reason it was skipped, or the error


def _send(stream, value):
    data = pickle.dumps(value)
    stream.write(struct.pack("<Q", len(data)) + data)
    stream.flush()


def _receive(stream):
    header = stream.read(8)
    if len(header) < 8:
        return None
    (size,) = struct.unpack("<Q", header)
    return pickle.loads(stream.read(size))


def _ptx_facts(ptx, cc):
    """Registers and spill bytes per thread from ptxas -v, where ptxas is installed."""
    import re
    import tempfile

    ptxas = _ptxas()
    if ptxas is None:
        return {}
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as handle:
        handle.write(ptx)
    try:
        done = subprocess.run([ptxas, f"-arch={_arch(cc)}", "-v", handle.name, "-o", os.devnull],
                              capture_output=True, text=True, timeout=120)
    finally:
        os.unlink(handle.name)
    text = done.stderr + done.stdout
    if done.returncode and "error" in text:  # inline PTX (workbook/tensor_cores.py) that ptxas rejects
        from numba.core.errors import NumbaError

        hint = ""
        if re.search(r"not supported on \.target|requires \.target|requires sm_", text):
            hint = ("\n(an instruction this target lacks that workbook/capability.py does not list: add it there, "
                    "and have the kernel's wrapper ask capability.supports)")
        raise NumbaError(f"ptxas -arch={_arch(cc)} rejects the kernel's PTX: {text.strip()[:2000]}{hint}")
    registers = re.findall(r"Used (\d+) registers", text)
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)]
    stacks = [int(a) for a in re.findall(r"(\d+) bytes stack frame", text)]  # local arrays, spills included
    return {"registers": max(map(int, registers)) if registers else None,
            "spill_bytes": max(spills) if spills else None, "stack_bytes": max(stacks) if stacks else None,
            "assembled": True}


def _arch(cc):
    return "sm_" + "".join(str(part) for part in cc)


def _text(cc):
    return f"{cc[0]}.{cc[1]}" + "".join(str(part) for part in cc[2:])


def _ptxas():
    from shutil import which

    try:
        import nvidia.cuda_nvcc

        candidate = Path(list(nvidia.cuda_nvcc.__path__)[0]) / "bin" / "ptxas"
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return which("ptxas")


class _NoDevice:
    """What numba asks of "the current device" while compiling a device function: only its compute
    capability. There is no GPU in the worker, so it answers the capability being compiled for."""

    compute_capability = CCS[0]


def _build(ptx_for, ccs, assemble, needs=None, keep_ptx=True, errors_raise=True):
    """Each target of `ccs`: skipped (an instruction of workbook/capability.py it lacks), or built:
    PTX from `ptx_for(cc)`, assembled by ptxas where `cc` is in `assemble`. `needs`: the instructions
    the kernel uses; None: found in the PTX of the first target (NVVM copies inline PTX as it is, so
    any target's PTX shows them). errors_raise=False: a target's error is its entry's, not raised."""
    ptxes = {}

    def ptx(cc):
        if cc not in ptxes:
            ptxes[cc] = ptx_for(cc)
        return ptxes[cc]

    if needs is None:
        needs = capability.found_in(ptx(tuple(ccs[0][:2])))
    entries = []
    for cc in ccs:
        entry = {"target": _text(cc)}
        reason = capability.skip_reason(needs, cc)
        if reason:
            entries.append({**entry, "skipped": reason})
            continue
        built = capability.build_target(needs, cc)
        try:
            text = ptx(built)
            entry.update({"cc": _text(built), "ptx_lines": text.count("\n")})
            if keep_ptx:
                entry["ptx"] = text
            if cc in assemble:
                entry.update(_ptx_facts(text, built))
        except Exception as error:  # noqa: BLE001  (NVVM's or ptxas's message is the answer)
            import re

            limit = next((why for pattern, why in COMPILER_LIMITS if re.search(pattern, str(error))), None)
            if limit:
                entry.update({"skipped": limit, "compiler": True})
            elif errors_raise:
                raise
            else:
                entry["error"] = f"{type(error).__name__}: {error}"
        entries.append(entry)
    return entries, needs


def _with_nvvm_log(ptx_for, irs, options):
    """ptx_for, raising numba's NvvmError with NVVM's own log when NVVM rejects the IR (numba-cuda 0.30
    raises cuda.bindings' nvvmError, 'ERROR_INVALID_IR (6)', and the log that says why is lost)."""

    def wrapped(cc):
        try:
            return ptx_for(cc)
        except Exception as error:
            if type(error).__name__ != "nvvmError":
                raise
            from numba.cuda.cudadrv import nvrtc, nvvm
            from numba.cuda.cudadrv.error import NvvmError

            unit = nvvm.CompilationUnit({**{k: v for k, v in options.items() if k != "fastmath"},
                                         "arch": nvrtc.get_arch_option(*cc)})
            for module in irs:
                unit.add_module(nvvm.llvm_replace(module).encode("utf8"))
            try:
                unit.verify()
            except Exception:  # noqa: BLE001  (the log is what is wanted)
                pass
            raise NvvmError(f"NVVM for {_arch(cc)}: {error}\n{unit.get_log().strip()[:3000]}") from error

    return wrapped


def _compile_one(payload, argtypes, ccs):
    """A kernel the simulator launched: typed and lowered once, then NVVM for each target (as numba's
    code library does for a kernel it loads on another GPU: the LLVM IR does not depend on the
    capability, and typing is most of a compile), ptxas for the first. Its LLVM IR comes back too,
    for the other targets of `python -m workbook compile`."""
    import cloudpickle

    from numba.cuda import dispatcher

    # numba compiles a kernel's device functions for get_current_device()'s capability, which
    # would need a driver: answer it without one.
    dispatcher.get_current_device = lambda: _NoDevice
    _NoDevice.compute_capability = tuple(ccs[0][:2])
    try:
        from numba.cuda.compiler import _compile_pyfunc_with_fixup  # numba-cuda 0.30: compile_ptx's first half
    except ImportError:
        _compile_pyfunc_with_fixup = None
    if _compile_pyfunc_with_fixup is None:  # another numba-cuda: type it again for each capability
        from numba.cuda import compile_ptx

        def ptx_for(cc):
            _NoDevice.compute_capability = cc[:2]
            return compile_ptx(cloudpickle.loads(payload), argtypes, cc=cc)[0]

        ir = None
    else:
        kernel = cloudpickle.loads(payload)  # an error here is the compile's, not the kernel's
        try:
            library, _ = _compile_pyfunc_with_fixup(kernel, argtypes, device=False, abi="numba",
                                                    cc=tuple(ccs[0][:2]))
        except (TypeError, NotImplementedError) as error:  # raised by numba's typing or lowering
            raise KernelRejected(f"{type(error).__name__} in numba's typing or lowering: {error}") from error

        ir = (list(library.llvm_strs), dict(library._nvvm_options))
        ptx_for = _with_nvvm_log(lambda cc: "\n".join(library.get_asm_strs(cc=cc)), *ir)
    targets, needs = _build(ptx_for, [tuple(cc) for cc in ccs], assemble=[tuple(ccs[0])])
    return {"targets": targets, "needs": needs, "ir": ir}


_translation = []  # in a successor worker: its one successor.Translation


def _compile_successor(payload, argtypes, ccs):
    """A kernel the simulator launched, rebuilt and compiled by numba-cuda-mlir (successor.py): PTX
    for each target, ptxas for the first. No LLVM IR comes back: the other targets of `python -m
    workbook compile` are built from numba-cuda's."""
    global _for_successor
    import cloudpickle

    from . import successor

    _for_successor = True
    if not _translation:
        _translation.append(successor.Translation(gpu=False))
    translation = _translation[0]
    fn = cloudpickle.loads(payload)  # an error here is the compile's, not the kernel's
    try:
        kernel = translation.jit(fn, {})
        signature = tuple(successor.argument_type(translation, t) for t in argtypes)
    except (TypeError, NotImplementedError) as error:
        raise KernelRejected(f"{type(error).__name__} rebuilding the kernel for {successor.NAME}: {error}") from error

    def ptx_for(cc):
        if getattr(kernel, "_workbook_sm_90a", False):  # built for sm_90a by its own options (chip)
            kernel.compile(signature)
            return kernel.inspect_asm(signature)
        return translation.cuda.compile_ptx(kernel.py_func, signature, cc=tuple(cc[:2]))[0]

    targets, needs = _build(ptx_for, [tuple(cc) for cc in ccs], assemble=[tuple(ccs[0])])
    return {"targets": targets, "needs": needs, "ir": None}


def _compile_ir(ir, needs, ccs):
    """A kernel's stored LLVM IR (and numba's NVVM options for it), built for other targets: NVVM and
    ptxas, each target's error its own."""
    from numba.cuda.cudadrv import nvrtc, nvvm

    irs, options = ir

    def ptx_for(cc):
        text = nvvm.compile_ir(irs, **dict(options, arch=nvrtc.get_arch_option(*cc)))
        return text.decode().strip("\x00").strip()

    ccs = [tuple(cc) for cc in ccs]
    return _build(_with_nvvm_log(ptx_for, irs, options), ccs, assemble=ccs, needs=needs, keep_ptx=False,
                  errors_raise=False)[0]


class KernelRejected(Exception):
    """A plain TypeError or NotImplementedError out of numba's typing or lowering of a kernel (an
    atomic on a 2-D array given one index): the kernel's fault, as a TypingError is."""


def is_the_kernels_fault(error):
    """Did the compiler reject the kernel (numba's typing or lowering, NVVM), as opposed to the
    compile not being able to run here (no driver, a module that cannot be imported or pickled)?"""
    from numba.core.errors import NumbaError
    from numba.cuda.cudadrv.error import NvvmError

    if isinstance(error, KernelRejected):
        return True
    if type(error).__module__.startswith("numba_cuda_mlir"):  # the successor's typing, lowering or compiler error
        return True
    return isinstance(error, NumbaError | NvvmError) and "CudaSupportError" not in str(error)


def serve():
    """Worker loop on stdin/stdout (binary): one request, one answer. It ends when stdin closes."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C or a notebook kernel's shutdown: the client ends us
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed while compiling must not corrupt the pipe
    while True:
        request = _receive(stdin)
        if request is None:
            return
        try:
            if "ir" in request:
                answer = {"ok": True, "targets": _compile_ir(request["ir"], request["needs"], request["ccs"])}
            elif request.get("compiler") == _SUCCESSOR:
                answer = {"ok": True, **_compile_successor(request["kernel"], request["argtypes"], request["ccs"])}
            else:
                answer = {"ok": True, **_compile_one(request["kernel"], request["argtypes"], request["ccs"])}
        except Exception as error:  # noqa: BLE001  (numba's error is the answer)
            # ok None: the compile could not run, which says nothing about the kernel
            answer = {"ok": False if is_the_kernels_fault(error) else None,
                      "error": f"{type(error).__name__}: {error}"}
        _send(stdout, answer)


# ---------------------------------------------------------------------------------------------
# The client, in the simulator process


class Compiler:
    def __init__(self):
        self.lock = threading.Lock()
        self.process = None
        self.seen = {}  # (function, argument types) -> answer
        self.pickler = _Pickler()
        self.log_dir = os.environ.get("WORKBOOK_COMPILE_LOG")
        self.tag = _compiler_tag()

    def _worker(self):
        if self.process is None or self.process.poll() is not None:
            # its own session: a Ctrl-C or a notebook's shutdown reaches this process, which closes
            # the pipe, and the worker ends quietly
            self.process = subprocess.Popen([sys.executable, "-c", "from workbook.compiler import serve; serve()"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env(),
                                            cwd=ROOT, start_new_session=True)
        return self.process

    def compile(self, kernel, argtypes, ccs=CCS):
        """The worker's answer for this kernel and signature (cached in memory and on disk)."""
        return self.start(kernel, argtypes, ccs)()

    def start(self, kernel, argtypes, ccs=CCS):
        """Look the answer up, or pickle the kernel for the worker, now (before the simulator swaps
        the `cuda` in its globals for the fake one); returns a function that gets the answer, which
        another thread may call. ccs: the targets (a launch's are CCS, and only those are logged)."""
        ccs = tuple(tuple(cc) for cc in ccs)
        key = (kernel.fn, argtypes, ccs)  # the function, not its code: closures share code (ch03's per-dtype kernels)
        with self.lock:
            if key in self.seen:
                answer = self.seen[key]
                return lambda: answer
            try:
                payload = self.pickler.dumps(kernel.fn)
                pickle.dumps(argtypes)  # a namedtuple class made inside a function cannot travel
            except Exception as error:  # noqa: BLE001  (the compile cannot run: not the kernel's fault)
                answer = self.seen[key] = {"ok": None, "error": f"{type(error).__name__}: {error}"}
                return lambda: answer
            digest = hashlib.sha256(payload + repr((argtypes, ccs, CACHE_FORMAT)).encode()
                                    + _sources_by_name(kernel.fn)
                                    + _TABLE + self.tag).hexdigest()
            cached = CACHE / f"{digest}.json"
            if cached.exists():
                answer = self.seen[key] = json.loads(cached.read_text())
                self._log(kernel, argtypes, ccs, digest, answer)
                return lambda: answer

        def finish():
            with self.lock:
                if key in self.seen:
                    return self.seen[key]
                worker = self._worker()
                _send(worker.stdin, {"kernel": payload, "argtypes": argtypes, "ccs": ccs,
                                     "compiler": _SUCCESSOR if self.tag else None})
                answer = _receive(worker.stdout)
                if answer is None:
                    raise RuntimeError("the compile worker died; run `python -m workbook compile` to see why")
                ir = answer.pop("ir", None)
                if answer["ok"] is not None:  # a compile that could not run is tried again next time
                    CACHE.mkdir(parents=True, exist_ok=True)
                    if answer["ok"] and ir is not None:  # for the other targets (build_everywhere)
                        _write(ir_path(digest), zlib.compress(pickle.dumps(ir), 1))
                    _write(cached, json.dumps(answer).encode())
                self.seen[key] = answer
                self._log(kernel, argtypes, ccs, digest, answer)
                return answer

        return finish

    def _log(self, kernel, argtypes, ccs, digest, answer):
        if not self.log_dir or ccs != CCS:  # a launch's compile, not show_ptx for another target
            return
        fn = kernel.fn
        record = {"kernel": f"{fn.__module__}.{fn.__qualname__}", "file": fn.__code__.co_filename,
                  "line": fn.__code__.co_firstlineno, "signature": ", ".join(str(t) for t in argtypes),
                  "ok": answer["ok"], "error": answer.get("error"), "digest": digest,
                  "compiler": _SUCCESSOR if self.tag else "numba-cuda",
                  "needs": answer.get("needs", []),
                  "targets": [{k: v for k, v in t.items() if k != "ptx"} for t in answer.get("targets", [])]}
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.log_dir) / f"compile-{os.getpid()}.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")


_SUCCESSOR = "numba-cuda-mlir"  # successor.NAME (imported late: successor.py imports this package)


def _compiler_tag():
    """Which compiler a launch's compile check uses (WORKBOOK_COMPILER), as part of its cache key."""
    from . import successor

    if successor.chosen() != successor.NAME:
        return b""
    from importlib.metadata import version

    here = Path(__file__).parent  # the rebuild, its mends and intrinsics: editing them recompiles
    return f"{successor.NAME} {version('numba-cuda-mlir')}".encode() + b"".join(
        (here / name).read_bytes() for name in ("successor.py", "successor_mends.py", "successor_intrinsics.py"))


# the instruction table's facts, part of each answer's key: what a target skips follows the table
_TABLE = repr([(i.name, i.first, i.only, i.ptx) for i in capability.INSTRUCTIONS.values()]).encode()


def ir_path(digest):
    """Where a compiled signature's LLVM IR and NVVM options are kept (zlib of a pickle)."""
    return CACHE / f"{digest}.ir"


def _write(path, data):
    """Write a cache file whole: another process sees the old one or the new one, never half."""
    temporary = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    temporary.write_bytes(data)
    temporary.replace(path)


# ---------------------------------------------------------------------------------------------
# Every other target: `python -m workbook compile`


def plan(every_target=False):
    """The targets `python -m workbook compile` builds each kernel for: the oldest of each family of
    supported_targets() (every one with every_target=True)."""
    targets = supported_targets()
    return targets if every_target else [members[0] for members in families(targets).values()]


def build_everywhere(records, targets, jobs=None):
    """Give each record of the compile log (a launched kernel's signature, its answer for CCS) an
    entry for every target of `targets`: from the log where the launch's compile assembled it,
    skipped where the kernel uses an instruction the target lacks, else built from the stored LLVM IR
    in `jobs` worker processes (default: one per core) and cached. Returns how many were built."""
    from concurrent.futures import ThreadPoolExecutor

    work = []  # (record, targets still to build)
    for record in records:
        entries = {entry["target"]: entry for entry in record.get("targets", [])
                   if entry.get("assembled") or "skipped" in entry}
        record["everywhere"] = everywhere = {}
        if record["ok"] is not True:
            continue
        wanted = []
        for cc in targets:
            name = _text(cc)
            reason = capability.skip_reason(record.get("needs", []), cc)
            cached = CACHE / f"{record.get('digest')}.{_arch(cc)}.json"
            if name in entries:
                everywhere[name] = entries[name]
            elif reason:
                everywhere[name] = {"target": name, "skipped": reason}
            elif cached.exists():
                everywhere[name] = json.loads(cached.read_text())
            else:
                wanted.append(cc)
        if wanted:
            work.append((record, wanted))
    if not work:
        return 0
    # the largest IR first: the longest builds start first, and the workers finish together
    work.sort(key=lambda item: -(ir_path(item[0].get("digest", "-")).stat().st_size
                                 if ir_path(item[0].get("digest", "-")).exists() else 0))
    queue = list(reversed(work))
    lock = threading.Lock()

    def worker_loop():
        process = subprocess.Popen([sys.executable, "-c", "from workbook.compiler import serve; serve()"],
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env(), cwd=ROOT,
                                   start_new_session=True)
        try:
            while True:
                with lock:
                    if not queue:
                        return
                    record, wanted = queue.pop()
                _build_from_ir(process, record, wanted)
        finally:
            process.stdin.close()
            process.wait()

    jobs = max(1, min(jobs or os.cpu_count() or 1, len(work)))
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for done in [pool.submit(worker_loop) for _ in range(jobs)]:
            done.result()
    return sum(len(wanted) for _, wanted in work)


def _build_from_ir(process, record, wanted):
    everywhere = record["everywhere"]
    stored = ir_path(record.get("digest", "-"))
    if not stored.exists():
        for cc in wanted:
            everywhere[_text(cc)] = {"target": _text(cc), "not_built": f"no LLVM IR stored for it ({stored.name}): "
                                     "run the tests again with the compile hook on"}
        return
    _send(process.stdin, {"ir": pickle.loads(zlib.decompress(stored.read_bytes())), "needs": record.get("needs", []),
                          "ccs": wanted})
    answer = _receive(process.stdout)
    if answer is None or answer["ok"] is not True:
        why = "the compile worker died" if answer is None else answer["error"]
        for cc in wanted:
            everywhere[_text(cc)] = {"target": _text(cc), "not_built": why}
        if answer is None:
            raise RuntimeError("the compile worker died; its error is above")
        return
    for cc, entry in zip(wanted, answer["targets"]):
        everywhere[_text(cc)] = entry
        if "error" not in entry and "skipped" not in entry:  # what this compiler cannot build: asked again
            _write(CACHE / f"{record['digest']}.{_arch(cc)}.json", json.dumps(entry).encode())


_compiler = None
_said_missing = False
_could_not_check = set()  # kernels whose compile could not run here: said once each


_stock_call = None


def install():
    """In simulator mode: make every kernel launch from the host go through check_launch first (a
    kernel the GPU compiler rejects fails its launch, with numba's message). Idempotent."""
    global _stock_call
    from numba.cuda.simulator import kernel

    if _stock_call is not None:
        return
    _stock_call = kernel.FakeCUDAKernel.__call__

    def compiled_call(self, *args):
        if self._device or kernel._kernel_context:
            return _stock_call(self, *args)
        # The GPU compile runs in its worker while the simulator runs the launch (two cores, not
        # one after the other); its verdict is waited for when the launch ends, and a rejection
        # fails the launch, before anything the simulated run raised.
        verdict = check_launch(self, args, wait=False)
        try:
            result = _stock_call(self, *args)
        except BaseException:
            verdict()
            raise
        verdict()
        return result

    kernel.FakeCUDAKernel.__call__ = compiled_call


def wanted():
    return os.environ.get("WORKBOOK_COMPILE", "auto").strip().lower() not in ("0", "no", "off", "false")


def check_launch(kernel, args, wait=True):
    """Called by the simulator before each kernel launch: compile it for the GPU, raise if rejected.

    wait=False: start the compile in the background and return a function that waits for it and
    raises if the kernel was rejected."""
    global _compiler, _said_missing
    if not wanted():
        return _nothing
    if _compiler is None:
        reason = missing()
        if reason:
            if not _said_missing:
                print(f"workbook: kernels are not compiled for the GPU in this simulator run: {reason}.",
                      file=sys.stderr)
                _said_missing = True
            os.environ["WORKBOOK_COMPILE"] = "0"
            return _nothing
        _compiler = Compiler()
    argtypes = getattr(kernel, "_declared", None) or argument_types(args)  # a declared signature wins
    if wait:
        return _judge(kernel, argtypes, _compiler.compile(kernel, argtypes))
    future = _background().submit(_compiler.start(kernel, argtypes))
    return lambda: _judge(kernel, argtypes, future.result())


def _nothing():
    return None


_pool = None


def _background():
    """One thread that hands compiles to the worker process and waits for its answers."""
    global _pool
    if _pool is None:
        from concurrent.futures import ThreadPoolExecutor

        _pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="workbook-compile")
    return _pool


def _missed_a_global(kernel, error):
    """The worker's compile failed on a name this process knows and the worker does not: a global
    set at run time (a test assigning `global cufoo`: the worker imports the module anew), or a
    function with an `@overload` registered here at run time. Not the kernel's fault."""
    import re

    names = _names_seen_by(kernel.fn)
    missing = re.search(r"NameError: name '(\w+)' is not defined", error)
    if missing:
        return missing[1] in names
    untyped = re.search(r"Untyped global name '(\w+)': Cannot determine Numba type of <class 'function'>", error)
    if untyped and untyped[1] in names:  # a plain Python function is the kernel's fault; an @overload not
        from numba.core.typing import templates as core
        from numba.cuda.typing import templates as cuda

        function = names[untyped[1]]
        return any(value is function for registry in (cuda.builtin_registry, core.builtin_registry)
                   for value, _ in registry.globals)
    return False


def _names_seen_by(fn, depth=3):
    """The globals and closure variables of a kernel and of the device functions it calls."""
    names = dict(getattr(fn, "__globals__", {}))
    names.update(zip(fn.__code__.co_freevars, (cell.cell_contents for cell in fn.__closure__ or ())))
    if depth:
        for value in list(names.values()):
            inner = getattr(value, "py_func", None)  # a device function (the simulator's FakeCUDAKernel)
            if inner is not None and inner is not fn and hasattr(inner, "__code__"):
                names = {**_names_seen_by(inner, depth - 1), **names}
    return names


def _judge(kernel, argtypes, answer):
    """Raise GPUCompileError if the GPU compiler rejected the kernel; say once if it could not run."""
    if answer["ok"] is False and _missed_a_global(kernel, answer["error"]):
        answer = dict(answer, ok=None)
    if answer["ok"] is None:
        fn = kernel.fn
        if fn not in _could_not_check:
            _could_not_check.add(fn)
            print(f"workbook: {fn.__qualname__} could not be compiled for a GPU here, which says nothing about "
                  f"the kernel: {answer['error'].splitlines()[0]}", file=sys.stderr)
        return
    if answer["ok"] is False:
        fn = kernel.fn
        raise GPUCompileError(
            f"{fn.__qualname__} ({fn.__code__.co_filename}:{fn.__code__.co_firstlineno}) runs in the simulator "
            f"but would not compile for a GPU with argument types ({', '.join(map(str, argtypes))}):\n"
            f"{with_source_lines(answer['error'])}")


def with_source_lines(message):
    """numba's message with the kernel's own lines where the worker could not read them (it got the
    kernel by value, so it prints `<source missing, REPL/exec in use?>`): this process can."""
    import linecache
    import re

    def quote(match):
        line = linecache.getline(match[1], int(match[2])).rstrip()
        return f'File "{match[1]}", line {match[2]}:\n{line}' if line else match[0]

    return re.sub(r'File "([^"]+)", line (\d+):\n<source missing, REPL/exec in use\?>', quote, message)


def ptx(kernel, argtypes, cc=CCS[0]):
    """The PTX of a kernel for the given numba argument types (simulator mode, via the worker), for
    compute capability `cc`: a launch's targets (CCS) come from its compile, another is built for it."""
    global _compiler
    if _compiler is None:
        reason = missing()
        if reason:
            raise RuntimeError(f"cannot compile here: {reason}")
        _compiler = Compiler()
    cc = tuple(cc)[:2]
    answer = _compiler.compile(kernel, tuple(argtypes), CCS if cc in CCS else (cc,))
    if answer["ok"] is None:
        raise RuntimeError(f"could not compile here: {answer['error']}")
    if not answer["ok"]:
        raise GPUCompileError(answer["error"])
    entry = next(entry for entry in answer["targets"] if entry["target"] == _text(cc))
    if "skipped" in entry:
        raise ValueError(f"compute capability {_text(cc)}: this kernel is not built for it: {entry['skipped']}")
    return entry["ptx"]
