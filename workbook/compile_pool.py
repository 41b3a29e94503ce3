"""Compiling kernels side by side on a GPU machine: `warm_up(functions)`.

numba compiles a kernel at its first launch, in the launching process, one kernel at a time (a
global compiler lock, and most of a compile is Python). A table of twelve GEMM tiles is twelve
compiles of 2-4 s each, one after the other, while the other cores of the machine wait.

On a GPU, `warm_up({name: fn})` calls each function once, each in its own thread, and sends every
kernel compile those calls start to a pool of worker processes (numba-cuda without a GPU context;
the cubin is linked there by nvJitLink, as numba would link it here). The compiled kernel comes
back as numba's own disk cache stores one (`_Kernel._reduce_states`) and is added to the kernel's
dispatcher as its own compile adds it: later launches find it, and nothing else changes. A compile
the worker could not do (a kernel that cannot travel, a typing error) is done again here, where
numba raises its own error. The calls' outputs are thrown away: the caller calls each function
again, alone, and checks that call, so a function may only be warmed up this way if running it
twice, or beside the others, changes nothing it is checked on (not an update in place).

In the simulator, where nothing is compiled in this process, warm_up does nothing.
"""

import os
import pickle
import queue
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

from . import ON_GPU
from .compiler import ROOT, _NoDevice, _receive, _send

WORKERS = max(1, min(12, (os.cpu_count() or 2) - 2))  # compiles at once; this process keeps a core

_local = threading.local()  # .pooled: True in a warm-up thread, whose compiles go to the pool
_installed = []
_compiled = [0]  # kernels compiled in this process or the pool so far (see compiles())


def compiles():
    """How many kernels this process has compiled so far (on a GPU; 0 in the simulator): a caller
    that saw its first function compile can warm the others up side by side."""
    if ON_GPU:
        _install()
    return _compiled[0]


def warming_up():
    """Is this thread making a warm-up call (warm_up's)? Its outputs are thrown away and the caller's
    own call of the same function is checked: a check inside the warm-up call can be skipped."""
    return getattr(_local, "pooled", False)


def warm_up(functions):
    """On a GPU: call each of {name: fn} (or a list of fns) once, all at the same time, their
    kernel compiles in worker processes; the caller then calls them as it would have. Errors are
    not raised here: the caller's own call of the failing function raises them, where they belong.
    In the simulator (nothing to compile in this process) and for a single function: nothing."""
    functions = list(functions.values() if isinstance(functions, dict) else functions)
    if not ON_GPU or len(functions) < 2:
        return
    _install()
    from numba import cuda

    def pooled(function):
        _local.pooled = True
        try:
            _quietly(function)
            cuda.synchronize()  # numba makes the GPU's context current in each thread
        finally:
            _local.pooled = False

    with ThreadPoolExecutor(max_workers=len(functions), thread_name_prefix="workbook-warm-up") as threads:
        list(threads.map(pooled, functions))


def _quietly(function):
    try:
        function()
    except Exception:  # noqa: BLE001, S110  (raised again by the caller's own call)
        pass


# ---------------------------------------------------------------------------------------------
# This process: numba's compile, with a detour for the warm-up threads


def _install():
    if _installed:
        return
    from numba.cuda import dispatcher
    from numba.cuda.core import sigutils
    from numba.cuda.core.compiler_lock import global_compiler_lock

    stock = dispatcher.CUDADispatcher.compile

    def compile(self, sig):
        argtypes, _ = sigutils.normalize_signature(sig)
        if self.specialized or self.targetoptions.get("device") or argtypes in self.overloads:
            return stock(self, sig)
        _compiled[0] += 1
        if not getattr(_local, "pooled", False):
            return stock(self, sig)
        states = _pool().compile(self, argtypes)  # waits without the GIL or numba's lock
        with global_compiler_lock:
            kernel = self.overloads.get(argtypes)  # another thread's call may have added it
            if kernel is not None:
                return kernel
            if states is None:
                return stock(self, sig)  # compiled here, and numba's own error if it fails
            kernel = dispatcher._Kernel._rebuild(**pickle.loads(states))
            kernel.bind()
            self.add_overload(kernel, argtypes)
            return kernel

    dispatcher.CUDADispatcher.compile = compile
    _installed.append(stock)


class _Pool:
    """Worker processes, each serving one compile at a time; one request per (kernel, types)."""

    def __init__(self, size):
        self.idle, self.started, self.size = queue.Queue(), 0, size
        self.lock = threading.Lock()
        self.answers = {}  # (dispatcher, argtypes) -> Future

    def compile(self, kernel, argtypes):
        from concurrent.futures import Future

        key = (id(kernel), argtypes)
        with self.lock:
            future = self.answers.get(key)
            mine = future is None
            if mine:
                future = self.answers[key] = Future()
        if mine:
            try:
                future.set_result(self._run(kernel, argtypes))
            except Exception:  # noqa: BLE001  (compiled here instead)
                future.set_result(None)
        return future.result()

    def _run(self, kernel, argtypes):
        import cloudpickle

        from numba.cuda import get_current_device

        payload = cloudpickle.dumps((kernel.py_func, kernel.targetoptions))
        request = (payload, argtypes, tuple(get_current_device().compute_capability))
        worker = self._take()
        try:
            _send(worker.stdin, request)
            answer = _receive(worker.stdout)
        except BaseException:
            worker.kill()
            raise
        if answer is None:  # the worker died
            return None
        self.idle.put(worker)
        return answer.get("states")

    def _take(self):
        with self.lock:
            if self.idle.empty() and self.started < self.size:
                return self._start()
        return self.idle.get()

    def _start(self):
        self.started += 1
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="0", WORKBOOK_DEVICE="compile",
                   NUMBA_DISABLE_ERROR_MESSAGE_HIGHLIGHTING="1",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.getcwd(), os.environ.get("PYTHONPATH", "")]))
        return subprocess.Popen([sys.executable, "-c", "from workbook.compile_pool import serve; serve()"],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True)

    def start_all(self):
        """Every worker started now, idle: each imports numba and makes a first compile while this
        process does something else (a chapter's process, before its turn)."""
        with self.lock:
            while self.started < self.size:
                self.idle.put(self._start())


    def close(self):
        """Close the workers' pipes (each then ends) and wait for them, at exit."""
        while not self.idle.empty():
            worker = self.idle.get()
            worker.stdin.close()
            worker.wait(timeout=10)


_the_pool = []


def start():
    """On a GPU, before any kernel is compiled: start the workers, and make this process's first
    compile (numba sets up its typing and LLVM then: a second or so), so that neither waits in the
    first warm-up. Creates no GPU context. In the simulator: nothing."""
    if not ON_GPU:
        return
    _pool().start_all()
    _first_compile()


def _first_compile():
    from numba import cuda

    def tiny(x):
        x[0] = 1.0

    cuda.compile_ptx(tiny, "void(float32[:])", cc=(7, 5))  # any target: what is set up is not per target


def _pool():
    if not _the_pool:
        import atexit

        _the_pool.append(_Pool(WORKERS))
        atexit.register(_the_pool[0].close)
    return _the_pool[0]


# ---------------------------------------------------------------------------------------------
# The worker


def _compile(payload, argtypes, cc):
    import cloudpickle

    from numba.cuda import dispatcher

    _NoDevice.compute_capability = cc
    py_func, options = cloudpickle.loads(payload)
    kernel = dispatcher._Kernel(py_func, argtypes, **options)
    kernel._codelibrary.get_cubin()  # linked here (for numba's choice of target, e.g. sm_90a), not at bind()
    return pickle.dumps(kernel._reduce_states())


def serve():
    """Worker loop on stdin/stdout: (payload, argtypes, cc) in, {"states": bytes or None} out."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the client ends us by closing the pipe
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    sys.stdout = sys.stderr  # anything printed while compiling must not corrupt the pipe
    import workbook  # noqa: F401  (compile mode: numba's CUDA target, no driver)
    from types import SimpleNamespace

    from numba.cuda import codegen, dispatcher

    # numba asks the current device for its compute capability: answer the client's, with no driver
    dispatcher.get_current_device = lambda: _NoDevice
    codegen.devices = SimpleNamespace(get_context=lambda devnum=None: SimpleNamespace(device=_NoDevice))
    _first_compile()  # before the first request: it need not wait for numba's set-up
    while True:
        request = _receive(stdin)
        if request is None:
            return
        try:
            answer = {"states": _compile(*request)}
        except Exception as error:  # noqa: BLE001  (compiled again in the client, which raises)
            answer = {"states": None, "error": f"{type(error).__name__}: {error}"}
        _send(stdout, answer)

