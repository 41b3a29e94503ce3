"""The real CUDA compiler on a machine without a GPU: every kernel the simulator runs is also compiled.

numba's simulator runs a kernel as Python and never types it, so a kernel the GPU compiler would
reject (a float ballot mask, a Python list, a float used as an index) can pass every check on a
laptop. The compiler itself needs no GPU: numba-cuda's cu12 extra brings NVVM, and ptxas from the
same wheels reports registers and spills. In simulator mode, `install()` (called by `import
workbook`) makes every launch

    1. type the kernel's arguments as a GPU launch would (dtype, dimensions, layout of each array),
    2. compile the kernel once per signature, for compute capability 9.0 (the H100 the workbook is
       measured on) and 7.5 (a T4, the GPU of free hosted notebooks), in a separate worker process,
    3. raise GPUCompileError, with numba's message, if the GPU compiler rejects it (numba, NVVM, or
       ptxas for 9.0, which checks the inline PTX of workbook/memory.py and tensor_cores.py; the 7.5
       PTX is not assembled, so an instruction a T4 lacks -- tensor_cores' TF32 mma, cp.async -- is
       not reported: those kernels' wrappers check the GPU's capability instead). A compile that
       could not run at all (no driver where a module wants one, a kernel that cannot travel to the
       worker) is not the kernel's fault: it is said once on stderr, and the launch goes on.

Why a worker process: in simulator mode `numba.cuda` *is* the simulator, and the real compiler
cannot be imported beside it. The kernel travels to the worker by value (cloudpickle): its code, the
constants it reads, and its device functions, each rebuilt there with the real `cuda.jit`. The
module-level functions it calls travel by name, so the worker (which imports the workbook in
compile mode) gets their GPU versions: workbook/memory.py's intrinsics, chapter 03's address helpers.

    WORKBOOK_COMPILE=auto   compile when the compiler is installed (the default; says once if not)
    WORKBOOK_COMPILE=0      never (a launch costs no compile)
    WORKBOOK_COMPILE_LOG=D  also append one JSON line per compile to D/compile-<pid>.jsonl
                            (read by `python -m workbook compile`)

Results are cached on disk (build/compile-cache/), so parallel test workers and later runs share them.
"""

import hashlib
import json
import os
import pickle
import struct
import subprocess
import sys
import threading
from pathlib import Path

# The H100 the workbook is measured on, and the T4 of free hosted notebooks (7.5: the oldest GPU that
# CUDA 13 still supports).
CCS = ((9, 0), (7, 5))
# A kernel that uses wgmma (workbook/tensor_cores.py) is compiled for the H100's architecture-specific
# target alone: no other GPU has the instruction, and ptxas rejects it for plain sm_90.
SM_90A = (9, 0, "a")
ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "build" / "compile-cache"
CACHE_FORMAT = 3  # bump when what a cached answer holds changes


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


def _rebuild(fn, options):
    """In the worker: the real cuda.jit of a function the simulator had. A device function that
    arrives again (another kernel of the same factory calls it) is the one rebuilt before, so numba
    types and lowers it once per signature, as it does a module-level device function."""
    from numba import cuda

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
# The worker: reads (fn, argument types, ccs) requests, answers with PTX facts or the error


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

        raise NumbaError(f"ptxas -arch={_arch(cc)} rejects the kernel's PTX: {text.strip()[:2000]}")
    registers = re.findall(r"Used (\d+) registers", text)
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)]
    return {"registers": max(map(int, registers)) if registers else None,
            "spill_bytes": max(spills) if spills else None}


def _arch(cc):
    return "sm_" + "".join(str(part) for part in cc)


def ccs_for(fn):
    """The capabilities a kernel is compiled for: sm_90a alone if it (or a device function it calls)
    uses wgmma, else CCS."""
    for value in _names_seen_by(fn).values():
        if (getattr(value, "__module__", "") == "workbook.tensor_cores"
                and getattr(value, "__name__", "").startswith("wgmma_")):
            return (SM_90A,)
    return CCS


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


def _compile_one(payload, argtypes, ccs):
    from numba.cuda import dispatcher

    # numba compiles a kernel's device functions for get_current_device()'s capability, which
    # would need a driver: answer it without one.
    dispatcher.get_current_device = lambda: _NoDevice
    results = []
    for cc, ptx in zip(ccs, _ptx_for_each(payload, argtypes, ccs)):
        facts = {"cc": f"{cc[0]}.{cc[1]}{''.join(cc[2:])}", "ptx_lines": ptx.count("\n"), "ptx": ptx}
        if cc == ccs[0]:
            facts.update(_ptx_facts(ptx, cc))
        results.append(facts)
    return results


def _ptx_for_each(payload, argtypes, ccs):
    """The kernel's PTX for each capability: typed and lowered once (for the first), then NVVM once
    per capability, as numba's code library does for a kernel it loads on another GPU (the LLVM IR
    does not depend on the capability; typing is most of a compile)."""
    import cloudpickle

    from numba.cuda import compile_ptx

    _NoDevice.compute_capability = ccs[0]
    try:
        from numba.cuda.compiler import _compile_pyfunc_with_fixup  # numba-cuda 0.30: compile_ptx's first half
    except ImportError:
        _compile_pyfunc_with_fixup = None
    if _compile_pyfunc_with_fixup is None:  # another numba-cuda: type it again for each capability
        ptxes = []
        for cc in ccs:
            _NoDevice.compute_capability = cc
            ptxes.append(compile_ptx(cloudpickle.loads(payload), argtypes, cc=cc)[0])
        return ptxes
    library, _ = _compile_pyfunc_with_fixup(cloudpickle.loads(payload), argtypes, device=False, abi="numba",
                                            cc=ccs[0])
    return ["\n".join(library.get_asm_strs(cc=cc)) for cc in ccs]


def is_the_kernels_fault(error):
    """Did the compiler reject the kernel (numba's typing or lowering, NVVM), as opposed to the
    compile not being able to run here (no driver, a module that cannot be imported or pickled)?"""
    from numba.core.errors import NumbaError
    from numba.cuda.cudadrv.error import NvvmError

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
        payload, argtypes, ccs = request
        try:
            answer = {"ok": True, "targets": _compile_one(payload, argtypes, ccs)}
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

    def _worker(self):
        if self.process is None or self.process.poll() is not None:
            # its own session: a Ctrl-C or a notebook's shutdown reaches this process, which closes
            # the pipe, and the worker ends quietly
            self.process = subprocess.Popen([sys.executable, "-c", "from workbook.compiler import serve; serve()"],
                                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_worker_env(),
                                            cwd=ROOT, start_new_session=True)
        return self.process

    def compile(self, kernel, argtypes):
        """The worker's answer for this kernel and signature (cached in memory and on disk)."""
        return self.start(kernel, argtypes)()

    def start(self, kernel, argtypes):
        """Look the answer up, or pickle the kernel for the worker, now (before the simulator swaps
        the `cuda` in its globals for the fake one); returns a function that gets the answer, which
        another thread may call."""
        key = (kernel.fn, argtypes)  # the function, not its code: closures share code (ch03's per-dtype kernels)
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
            ccs = ccs_for(kernel.fn)
            digest = hashlib.sha256(payload + repr((argtypes, ccs, CACHE_FORMAT)).encode()
                                    + _sources_by_name(kernel.fn)).hexdigest()
            cached = CACHE / f"{digest}.json"
            if cached.exists():
                answer = self.seen[key] = json.loads(cached.read_text())
                self._log(kernel, argtypes, answer)
                return lambda: answer

        def finish():
            with self.lock:
                if key in self.seen:
                    return self.seen[key]
                worker = self._worker()
                _send(worker.stdin, (payload, argtypes, ccs))
                answer = _receive(worker.stdout)
                if answer is None:
                    raise RuntimeError("the compile worker died; run `python -m workbook compile` to see why")
                if answer["ok"] is not None:  # a compile that could not run is tried again next time
                    CACHE.mkdir(parents=True, exist_ok=True)
                    temporary = cached.with_suffix(f".{os.getpid()}.tmp")
                    temporary.write_text(json.dumps(answer))
                    temporary.replace(cached)
                self.seen[key] = answer
                self._log(kernel, argtypes, answer)
                return answer

        return finish

    def _log(self, kernel, argtypes, answer):
        if not self.log_dir:
            return
        fn = kernel.fn
        record = {"kernel": f"{fn.__module__}.{fn.__qualname__}", "file": fn.__code__.co_filename,
                  "line": fn.__code__.co_firstlineno, "signature": ", ".join(str(t) for t in argtypes),
                  "ok": answer["ok"], "error": answer.get("error"),
                  "targets": [{k: v for k, v in t.items() if k != "ptx"} for t in answer.get("targets", [])]}
        Path(self.log_dir).mkdir(parents=True, exist_ok=True)
        with open(Path(self.log_dir) / f"compile-{os.getpid()}.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")


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
    """The PTX of a kernel for the given numba argument types (simulator mode, via the worker)."""
    global _compiler
    if _compiler is None:
        reason = missing()
        if reason:
            raise RuntimeError(f"cannot compile here: {reason}")
        _compiler = Compiler()
    ccs = ccs_for(kernel.fn)
    if tuple(cc) not in ccs and not (ccs == (SM_90A,) and tuple(cc) == CCS[0]):
        raise ValueError(f"compute capability {cc}: this kernel is compiled for {ccs} only")
    answer = _compiler.compile(kernel, tuple(argtypes))
    if answer["ok"] is None:
        raise RuntimeError(f"could not compile here: {answer['error']}")
    if not answer["ok"]:
        raise GPUCompileError(answer["error"])
    return answer["targets"][0 if ccs == (SM_90A,) else ccs.index(tuple(cc))]["ptx"]

