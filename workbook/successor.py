"""numba-cuda-mlir, numba-cuda's successor, as a second compiler for the same kernel source.

numba-cuda is in maintenance mode (NVIDIA/numba-cuda#902); its successor, numba-cuda-mlir, reads
the same Python (`from numba_cuda_mlir import cuda` in place of `from numba import cuda`) and lowers
it through MLIR. The workbook's kernels stay written for numba-cuda; this module rebuilds any of
them for the successor from its Python function, without a copy of the source:

    WORKBOOK_COMPILER=numba-cuda        every kernel compiled by numba-cuda (the default)
    WORKBOOK_COMPILER=numba-cuda-mlir   on a GPU, every launch runs the successor's build of the
                                        kernel; in the simulator, the compile check of each launch
                                        (workbook/compiler.py) uses the successor instead

How a kernel is rebuilt (`Translation.jit`): the same code object, with the globals and closure
values it reads swapped for the successor's: the `cuda` module, numba's types, the device functions
it calls (rebuilt the same way), and the workbook's intrinsics (memory.py, tensor_cores.py,
barrier.py), which `successor_intrinsics.py` writes again on the successor's own features (vector
loads and stores, inline PTX). A launch hands the successor numba's device arrays and streams as
the successor's own (the same memory: `__cuda_array_interface__`, the same stream handle).

The two compilers differ (WORKAROUNDS below, each with the upstream issue it mirrors):
`cuda.grid(1)` is int32 under the successor (int64 under numba-cuda), `ballot_sync` and
`match_any_sync` return uint32, `fastmath` is all or nothing. The simulator gives numba-cuda's
types, or the successor's when WORKBOOK_COMPILER names it (workbook/simulator/collectives.py).
"""

import types as _py
import weakref

from .device import STOCK_COMPILER as STOCK
from .device import SUCCESSOR as NAME
from .device import choose_compiler as chosen

VARIABLE = "WORKBOOK_COMPILER"

# What the successor does otherwise, or not yet, and what the rebuild does about it: (what, whose it
# is: "by design", or a gap of numba-cuda-mlir 0.6.0 not found among its issues (to report, with the
# repro), what the workbook does). One place, so that a fix upstream is one line here.
WORKAROUNDS = (
    ("fastmath takes True or False, not numba-cuda's set of flags ({'contract', 'afn'})", "by design",
     "a set of flags becomes fastmath=True"),
    ("inline=True is spelled inline='always', and inline='never' (numba-cuda's default, about numba's IR "
     "only) forbids any inlining: every device function a real call", "by design",
     "'never' is left out, True becomes 'always'"),
    ("a numba-cuda device array passed to a successor kernel is typed with numba-cuda's own types and "
     "refused ('expected a type instance')", "by design: two type systems",
     "each array argument is handed over as the successor's view of the same memory"),
    ("numba-cuda's Stream is refused ('Unsupported stream type Stream')", "by design",
     "the stream is handed over by its handle (cuda.external_stream)"),
    ("vector types stop at 4 elements: 8 halves in one 16-byte access cannot be taken apart",
     "0.6.0, to report",
     "load16/store16 of a 16-bit dtype use two 8-byte accesses"),
    ("an unsigned 64-bit constant of 2^63 or more (np.uint64(0xFFFFFFFF00000000)) crashes the lowering "
     "(RuntimeError: std::bad_cast)", "0.6.0, to report",
     "successor_mends hands MLIR the same bits as a signed value"),
    ("a device function that declares a shared array and returns a tuple fails to compile "
     "('memref.get_global' op 'static_shared_memory_1' does not reference a valid global memref)",
     "0.6.0, to report",
     "a device function that declares a shared array is inlined into its caller (inline='always')"),
    ("shfl_sync, shfl_up_sync, shfl_down_sync and shfl_xor_sync shuffle one 32-bit word as float32 or int32: a "
     "float64 comes back rounded to float32 and an int64 without its high word, with no warning",
     "0.6.0, to report",
     "successor_mends._patch_shuffles shuffles a 64-bit value's two halves, a narrower one widened"),
    ("a loop over a tuple (`for v in values`) stays a run-time loop over a copy of the tuple in local memory, "
     "its index stepped by the iterator's 'valid' flag, so no trip count to unroll; over a tuple of float16 NVVM "
     "answers 'unsupported operation'", "0.6.0, to report",
     "chapter 06's helpers loop over range(len(values)): unrolled by both, the same PTX under numba-cuda"),
    ("range(start, stop, step) with a step known at run time only counts its trips with two 64-bit unsigned "
     "divisions, for a positive and a negative step, and chooses after; one always has a negative operand "
     "(-step, or stop - start past the end), so every warp runs the 64-bit division subroutine at each "
     "grid-stride loop's entry (chapter 02's float16 backward: two thirds of the instructions it executes "
     "more than numba-cuda's build)", "0.6.0, to report (tools/successor_repro_range.py)",
     "successor_mends._patch_range_count counts with one division by |step| of a span clamped at zero, "
     "constant steps left alone; off until measured on every chapter (WORKBOOK_SUCCESSOR_RANGE_MEND=1; "
     "ten measured, chapter 08's EXPERIMENTS.md)"),
    ("match_any_sync and match_all_sync of a float32 or float64 fail to compile (nvvm.match.sync takes "
     "integers only: an internal compiler error)", "0.6.0, to report",
     "successor_mends._patch_matches hands it the float's bits, which numba-cuda compares"),
    ("cuda.atomic.cas converts its expected value to the array's type but not its new one: an int32 array "
     "and a literal new value fail to compile ('arith.select' op ... same type)", "0.6.0, to report",
     "successor_mends._patch_compare_and_swap converts the new value too"),
    ("cuda.threadfence, threadfence_block and threadfence_system are typed but have no lowering",
     "0.6.0, to report", "successor_intrinsics lowers them as nvvm.memory.barrier of the GPU, the block and "
     "the system (membar.gl, membar.cta, membar.sys)"),
    ("cuda.lanemask_lt is typed but has no lowering ('No definition for lowering')",
     "0.6.0, to report",
     "successor_intrinsics lowers it as (1 << laneid) - 1 (its NVVM translation has no "
     "nvvm.read.ptx.sreg.lanemask.lt, and its inline PTX cannot name a special register)"),
    ("a shared array handed to an overload's body (the intrinsics of successor_intrinsics.py) is taken for "
     "global memory: ld.global.nc on a shared address, an illegal address", "0.6.0, to report",
     "shared_load4/shared_store4 are written in PTX on the array's address (cvta.to.shared)"),
    ("an inline_ptx call of more than 15 operands (a wgmma's 64 accumulators): Python 3.11 and later pass more "
     "than 30 arguments as one tuple, whose strings the successor no longer types as literals", "0.6.0, to report",
     "the wgmma's asm block loads and stores the accumulator through its address, and waits for itself: correct, "
     "not overlapped (successor_intrinsics.py)"),
    ("an overload's body is compiled for the default target, not the kernel's chip (sm_90a): ptxas refuses "
     "wgmma there", "0.6.0, to report", "the wgmma intrinsics are inlined into their caller (inline='always')"),
    ("inline_ptx numbers its operands %0..%9 only: '%1' also rewrites '%10'", "0.6.0, to report",
     "operands from the tenth on are written as the placeholders the lowering produces ({$r10})"),
    ("a typed pointer is made from an address by ctypes.cast only, and ctypes has no half type: no pointer to "
     "float16", "0.6.0, to report", "successor_intrinsics types the cast itself (CPointer of float32 or float16) "
     "and lowers it as llvm.inttoptr, as ctypes.cast does"),
)


# What is not mended yet: (what fails, where it shows, what would mend it). Empty: every chapter's
# kernels compile and run under the successor.
UNMENDED = ()


def missing():
    """Why the successor cannot be used here, or None."""
    try:
        import numba_cuda_mlir  # noqa: F401
    except ImportError as error:
        return f"numba-cuda-mlir is not installed (pip install numba-cuda-mlir): {error}"
    return None


def successor_cuda(gpu):
    """The successor's `cuda` module. Without a GPU its compiler would ask the driver for the
    device's capability: it is told 9.0, the capability the workbook compiles for first."""
    if not gpu:
        import numba_cuda_mlir.tools as tools

        if getattr(tools, "_cached_cc", None) is None:
            tools._cached_cc = (9, 0)
    from numba_cuda_mlir import cuda

    from . import successor_mends

    successor_mends.apply()
    return cuda


# ---------------------------------------------------------------------------------------------
# Rebuilding a kernel for the successor


class Deferred:
    """A device function not yet built by any compiler (the compile worker's payloads hold these)."""

    def __init__(self, fn, options):
        self.fn, self.options = fn, options


def _options(options):
    """numba-cuda's cuda.jit options, as the successor's jit takes them."""
    kept = {}
    for key, value in options.items():
        if value is None:
            continue  # numba-cuda's "not set"; the successor takes the option's type only
        if key in ("fastmath", "debug", "lineinfo", "device", "forceinline"):
            value = bool(value)  # numba-cuda keeps some as 0/1, or fastmath as a set of flags
        elif key == "inline":
            # numba-cuda's inline (default "never") is about numba's IR: LLVM still inlines. The
            # successor's "never" forbids inlining altogether (every call a real call): left out,
            # but for "always"
            if value not in (True, "always"):
                continue
            value = "always"
        elif key not in ("launch_bounds", "max_registers", "opt"):
            continue
        kept[key] = value
    return kept


def source_of(value):
    """(python function, jit options) of a kernel or device function from either side, else None:
    numba-cuda's dispatcher, the simulator's fake kernel, or a Deferred."""
    if isinstance(value, Deferred):
        return value.fn, dict(value.options)
    fn = getattr(value, "py_func", None)
    if fn is not None and hasattr(value, "targetoptions") and type(value).__module__.startswith("numba.cuda"):
        return fn, dict(value.targetoptions)
    if type(value).__name__ == "CPUDispatcher" and fn is not None:  # the simulator's numba.cuda.random
        return fn, {"device": True}
    if type(value).__name__ == "FakeCUDAKernel":
        options = {"fastmath": value._fastmath}
        if value._device:
            options["device"] = True
        if getattr(value, "_forceinline", False):
            options["forceinline"] = True
        return value.fn, options
    return None


class Translation:
    """Builds numba-cuda kernels again with the successor. One per process: a device function is
    rebuilt once and shared by every kernel that calls it."""

    def __init__(self, gpu):
        self.cuda = successor_cuda(gpu)
        from numba_cuda_mlir import types

        self.types = types
        self.built = {}  # id(python function) -> (the function, the successor's dispatcher)
        self._intrinsics = None
        self._wgmma = None

    def jit(self, fn, options):
        """The successor's dispatcher for this python function (a kernel or, device=True, a device function)."""
        entry = self.built.get(id(fn))
        if entry is not None and entry[0] is fn:
            return entry[1]
        closure = None
        if fn.__closure__:
            closure = tuple(_cell(self.value(cell.cell_contents)) for cell in fn.__closure__)
        names = set(_names(fn.__code__))
        env = dict(fn.__globals__)
        from . import successor_intrinsics

        for name in names & env.keys():
            own = successor_intrinsics.BY_NAME.get(f"{fn.__module__}.{name}")  # a chapter's own intrinsic
            env[name] = own if own is not None else self.value(env[name])
        rebuilt = _py.FunctionType(fn.__code__, env, fn.__name__, fn.__defaults__, closure)
        rebuilt.__qualname__, rebuilt.__module__ = fn.__qualname__, fn.__module__
        rebuilt.__kwdefaults__, rebuilt.__doc__ = fn.__kwdefaults__, fn.__doc__
        options = _options(options)
        if options.get("device") and "shared" in set(_names(fn.__code__)):
            options["inline"] = "always"  # WORKAROUNDS: a device function's shared array, inlined by numba's IR
        read = [env[name] for name in names & env.keys()] + [cell.cell_contents for cell in closure or ()]
        sm_90a = any(self._needs_sm_90a(value) for value in read)  # what this function reads, rebuilt
        if sm_90a and not options.get("device"):
            options["chip"] = "sm_90a"  # wgmma: Hopper's own instructions (numba-cuda: tensor_cores.wgmma_compile)
        dispatcher = self.cuda.jit(**options)(rebuilt)
        dispatcher._workbook_sm_90a = sm_90a
        self.built[id(fn)] = (fn, dispatcher)
        return dispatcher

    def value(self, value):
        """What a global or closure value of a numba-cuda kernel is for the successor."""
        if isinstance(value, _py.ModuleType):
            return self._module(value)
        if isinstance(value, tuple):
            return tuple(self.value(item) for item in value)
        intrinsics = self.intrinsics()
        if id(value) in intrinsics:
            return intrinsics[id(value)]
        source = source_of(value)
        if source is not None:
            return self.jit(*source)
        kind = type(value)
        if kind.__module__.startswith("numba.core.types") or kind.__module__.startswith("numba.cuda.types"):
            return getattr(self.types, str(value), value)
        if kind.__name__ == "VectorType" or kind.__module__ == "numba.cuda.simulator.vector_types":
            return getattr(self.cuda, getattr(value, "__name__", str(value)), value)
        if isinstance(value, type) and value.__module__ == "numba.cuda.simulator.vector_types":
            return getattr(self.cuda, value.__name__, value)
        return value

    def _module(self, module):
        name = module.__name__
        if name in ("numba.cuda", "numba.cuda.simulator", "numba.cuda.simulator.api") or \
                name.startswith("numba.cuda.simulator"):
            return self.cuda
        if name == "numba":
            return self.types  # numba.uint64(...) and the like, in kernels
        if name.startswith("numba.cuda."):
            import importlib

            try:
                return importlib.import_module("numba_cuda_mlir.cuda." + name[len("numba.cuda."):])
            except ImportError:
                return module
        return module

    def _needs_sm_90a(self, value):
        """Is this (a rebuilt global) a wgmma intrinsic, or a device function that uses one?"""
        if getattr(value, "_workbook_sm_90a", False):
            return True
        if self._wgmma is None:
            from . import successor_intrinsics

            self._wgmma = {id(getattr(successor_intrinsics, name)) for name in successor_intrinsics.WGMMA}
        return id(value) in self._wgmma

    def intrinsics(self):
        """id(the workbook's intrinsic, as this process has it) -> the successor's."""
        if self._intrinsics is None:
            from . import barrier, memory, successor_intrinsics, tensor_cores

            table = {}
            for module in (memory, tensor_cores, barrier):
                for name in successor_intrinsics.NAMES:
                    ours = getattr(module, name, None)
                    if ours is not None:
                        table[id(ours)] = getattr(successor_intrinsics, name)
            self._intrinsics = table
        return self._intrinsics


def _cell(value):
    return (lambda: value).__closure__[0]


def _names(code):
    """Every global name a code object (and the code nested in it) reads."""
    yield from code.co_names
    for constant in code.co_consts:
        if isinstance(constant, _py.CodeType):
            yield from _names(constant)


# ---------------------------------------------------------------------------------------------
# Types and launches


def argument_type(translation, numba_type):
    """A numba-cuda type of a launch argument as the successor's type (for compile_ptx)."""
    types = translation.types
    name = type(numba_type).__name__
    if name == "Array":
        return types.Array(argument_type(translation, numba_type.dtype), numba_type.ndim, numba_type.layout,
                           readonly=not numba_type.mutable)
    if name in ("UniTuple", "Tuple"):
        return types.Tuple([argument_type(translation, t) for t in numba_type])
    if name == "Record":
        from numba.np.numpy_support import as_dtype
        from numba_cuda_mlir.numba_cuda.np.numpy_support import from_dtype

        return from_dtype(as_dtype(numba_type))
    mapped = getattr(types, str(numba_type), None)
    if mapped is None:
        raise TypeError(f"no successor type for the argument type {numba_type}")
    return mapped


class Launcher:
    """On a GPU: numba-cuda's launches, run by the successor's build of each kernel."""

    def __init__(self):
        self.translation = Translation(gpu=True)
        self.streams = {}
        self.views = {}  # id(array) -> (a weak reference to it, its memory as a key, the successor's view)

    def kernel(self, dispatcher):
        return self.translation.jit(dispatcher.py_func, dispatcher.targetoptions)

    def argument(self, value):
        if hasattr(value, "__cuda_array_interface__") and not type(value).__module__.startswith("numba_cuda_mlir"):
            return self.view(value)
        if isinstance(value, tuple):
            return tuple(self.argument(item) for item in value)
        return value

    def view(self, array):
        """The successor's view of a device array, made once per array: making one costs the host
        more than the launch itself. It is made again if the array's memory, shape or strides have
        changed (a torch tensor can be resized in place), and forgotten when the array is."""
        interface = array.__cuda_array_interface__
        memory = (interface["data"][0], interface["shape"], interface.get("strides"), interface["typestr"])
        kept = self.views.get(id(array))
        if kept is not None and kept[0]() is array and kept[1] == memory:
            return kept[2]
        # The owner handed over carries the dtype alone (a record's fields are not in the interface's
        # typestr): the view must not keep the array alive, or the array would never be forgotten.
        # The caller holds the array through the launch, as it does under numba-cuda.
        owner = _py.SimpleNamespace(dtype=getattr(array, "dtype", None))
        view = self.translation.cuda.from_cuda_array_interface(interface, owner=owner, sync=False)
        try:
            key = id(array)
            reference = weakref.ref(array, lambda _, key=key: self.views.pop(key, None))
        except TypeError:  # an array that cannot be referred to weakly is converted at each launch
            return view
        self.views[key] = (reference, memory, view)
        return view

    def stream(self, stream):
        if not stream:
            return 0
        handle = getattr(stream, "handle", stream)
        handle = int(getattr(handle, "value", handle) or 0)
        if handle == 0:
            return 0
        if handle not in self.streams:
            self.streams[handle] = self.translation.cuda.external_stream(handle)
        return self.streams[handle]

    def launch(self, dispatcher, args, griddim, blockdim, stream, sharedmem):
        kernel = self.kernel(dispatcher)
        converted = [self.argument(arg) for arg in args]
        kernel[griddim, blockdim, self.stream(stream), sharedmem](*converted)
        return kernel


_launcher = None
_stock_call = None
observers = []  # functions (dispatcher, args, launch_config) called before each launch


def install(observed=False):
    """On a GPU: route every numba-cuda launch through the successor when WORKBOOK_COMPILER names it
    (`import workbook` calls this), and, observed=True, tell `observers` about each launch under
    either compiler (compilers.py). Under numba-cuda and unobserved, launches are left as they are.
    Idempotent."""
    global _stock_call, _launcher
    from numba.cuda import dispatcher as numba_dispatcher

    successor = chosen() == NAME
    if _stock_call is not None or not (successor or observed):
        return
    _stock_call = numba_dispatcher.CUDADispatcher.call
    if successor:
        reason = missing()
        if reason:
            raise RuntimeError(f"{VARIABLE}={NAME}, but {reason}")
        _launcher = Launcher()

    def call(self, args, launch_config):
        for observer in observers:  # before the launch: one that fails is seen too
            observer(self, args, launch_config)
        if _launcher is None or self.py_func.__module__.startswith("workbook."):
            return _stock_call(self, args, launch_config)  # the workbook's own (bench.held's spin) stay numba-cuda's
        _launcher.launch(self, args, launch_config.griddim, launch_config.blockdim, launch_config.stream,
                         launch_config.sharedmem)
        return None

    numba_dispatcher.CUDADispatcher.call = call


def launcher():
    """The active Launcher, or None under numba-cuda."""
    return _launcher
