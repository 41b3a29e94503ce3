"""Launches: how many blocks (cdiv), a cooperative launch (chapters 10 and 11), and the cheaper ones
of chapter 07, a prepared launch and a step captured into a CUDA graph.

    blocks = cdiv(n, threads)  # ceil(n / threads) in integers: enough blocks for n threads
    cooperative_launch(kernel, blocks, threads, shared_bytes, stream, *args)  # refused unless all resident

    launch = PreparedLaunch(kernel, blocks, threads, *args, returns=out)
    launch()        # the same kernel, buffers and configuration: the driver's cost, not numba's
    graph = StepGraph(step)     # step(stream) launches its kernels on `stream`
    graph()         # all of them, one cuGraphLaunch

A plain `kernel[grid, block](*args)` types every argument, finds (or compiles) the overload and
marshals every array into its 5 + 2*ndim parameters at every call. A PreparedLaunch does that once
(numba's own `_prepare_args`) and keeps the packed parameters; each call hands them to the driver,
through cuda.core's `launch` or `cuLaunchKernel` itself. In the simulator there is no driver: a
PreparedLaunch calls `kernel[grid, block](*args)` and a StepGraph calls the step, so results and
checks are the same and only the cost differs; `.how` says which path ran.
"""

import ctypes
from collections import OrderedDict

import numpy as np
from numba import cuda, typeof

from . import ON_GPU
from .device import SUCCESSOR, choose_compiler


_PREPARED = ON_GPU and choose_compiler() != SUCCESSOR  # the choice is made once, at import


def prepared():
    """Are launches prepared here (packed once, handed to the driver)? On a GPU under numba-cuda. Not
    in the simulator (no driver), nor where every launch is the successor compiler's
    (WORKBOOK_COMPILER=numba-cuda-mlir, successor.py: it packs its own arguments): there a
    PreparedLaunch is kernel[grid, block](*args) and a LaunchCache keeps nothing."""
    return _PREPARED


def cdiv(a, b):
    """ceil(a / b) for integers a >= 0 and b > 0, exactly (a float division is not, past 2^53): the
    blocks n threads need, the tiles a size takes."""
    return -(-a // b)


# ---------------------------------------------------------------------------------------------
# A cooperative launch: every block resident at once, so that a grid barrier cannot hang


def cooperative_limit(kernel, args, threads, shared_bytes):
    """Blocks of `kernel` that can be resident at once (a cooperative launch's largest grid)."""
    if not ON_GPU:
        return kernel.overloads[None].max_cooperative_grid_blocks(threads)
    compiled = kernel.compile(tuple(typeof(a) for a in args))
    return compiled.max_cooperative_grid_blocks(threads, shared_bytes)


def cooperative_launch(kernel, blocks, threads, shared_bytes, stream, *args):
    """kernel[blocks, threads, stream, shared_bytes](*args), refused if its blocks cannot all be
    resident at once; past 48 KB of shared memory, asked for first."""
    if ON_GPU:
        allow_shared_memory(kernel.compile(tuple(typeof(a) for a in args)), shared_bytes)
    limit = cooperative_limit(kernel, args, threads, shared_bytes)
    if blocks > limit:
        raise ValueError(f"{blocks} blocks of {threads} threads and {shared_bytes} bytes of shared memory "
                         f"cannot all be resident at once (at most {limit}): a grid barrier would hang")
    kernel[blocks, threads, stream, shared_bytes](*args)


# ---------------------------------------------------------------------------------------------
# A prepared launch


def _driver():
    from cuda.bindings import driver

    return driver


def _check(result):
    """cuda.bindings returns (error, values...): raise on an error, else the values."""
    error, *values = result if isinstance(result, tuple) else (result,)
    if int(error) != 0:
        raise RuntimeError(f"CUDA driver error {error!r}")
    return values[0] if len(values) == 1 else values


def stream_handle(stream):
    """A CUstream for a numba stream, a cuda.core stream or 0 (the default stream)."""
    driver = _driver()
    handle = getattr(stream, "handle", stream) or 0
    return driver.CUstream(int(getattr(handle, "value", handle) or 0) if not isinstance(handle, driver.CUstream)
                           else int(handle))


SHARED_WITHOUT_OPT_IN = 48 * 1024  # dynamic shared memory a kernel may have without asking
_shared_limit = None


def shared_memory_limit():
    """Bytes of dynamic shared memory a block may have on this GPU when it asks (227 KB on an H100,
    64 KB on a T4); in the simulator, the reference GPU's (or WORKBOOK_SIM_CC's: capability.py), so
    that kernels are sized as they will be there."""
    global _shared_limit
    if not ON_GPU:
        from . import capability

        return capability.shared_limit()
    if _shared_limit is None:
        _shared_limit = cuda.get_current_device().MAX_SHARED_MEMORY_PER_BLOCK_OPTIN
    return _shared_limit


def allow_shared_memory(compiled, shared_bytes):
    """Let a compiled kernel (`kernel.compile(argtypes)`) have `shared_bytes` of dynamic shared
    memory: past 48 KB a kernel must ask the driver (up to shared_memory_limit()). Nothing to
    ask in the simulator or below 48 KB. Returns `compiled`."""
    if not ON_GPU or shared_bytes <= SHARED_WITHOUT_OPT_IN:
        return compiled
    from numba.cuda.cudadrv.driver import binding, driver

    function = compiled._codelibrary.get_cufunc()
    attribute = binding.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    driver.cuKernelSetAttribute(attribute, shared_bytes, function.handle, function.device.id)
    return compiled


class PreparedLaunch:
    """One kernel, one launch configuration, one set of arguments, checked and packed once.

    `launch = PreparedLaunch(kernel, blocks, threads, *args)` types the arguments and compiles,
    as a first call would; `launch()` then costs what the driver costs. The arguments are fixed:
    the device arrays must stay alive and keep their shape (a new buffer needs a new
    PreparedLaunch; the data in them may change freely). `via`: "driver" (cuLaunchKernel with a
    parameter block built once) or "cuda.core" (cuda.core.launch with the packed list). shared:
    bytes of dynamic shared memory, as the fourth item of `kernel[grid, block, stream, shared]`
    (past 48 KB the kernel must have been allowed them: allow_shared_memory).
    """

    def __init__(self, kernel, blocks, threads, *args, stream=0, via="driver", returns=None, keep_args=True,
                 shared=0):
        for index, arg in enumerate(args):
            if isinstance(arg, np.ndarray):
                raise TypeError(f"argument {index} is a host (NumPy) array: a prepared launch takes device "
                                "arrays only (numba would copy a host array to the GPU and back at every call)")
        if via not in ("driver", "cuda.core"):
            raise ValueError(f"via must be 'driver' or 'cuda.core', not {via!r}")
        self.kernel, self.args, self.stream, self.returns = kernel, args, stream, returns
        self.blocks, self.threads, self.shared = blocks, threads, shared
        self.plain = not _PREPARED
        if self.plain:
            self.how = "simulator: kernel[grid, block](*args)" if not ON_GPU else f"{SUCCESSOR}: kernel[grid, block](*args)"
            self._launcher = kernel[blocks, threads, stream, shared]
            return
        from numba.cuda.cudadrv import driver as numba_driver

        stream = numba_driver._to_core_stream(stream)  # what numba's own launch does with it
        argument_types = tuple(kernel.typeof_pyval(arg) for arg in args)
        compiled = kernel.compile(argument_types)  # what the first plain call would compile
        packed, writebacks, self._slots = [], [], []
        for ty, value in zip(compiled.argument_types, args):
            start = len(packed)
            compiled._prepare_args(ty, value, stream, writebacks, packed)  # numba's own marshalling
            self._slots.append((start, len(packed), ty))
        if writebacks:
            raise TypeError("an argument needs a copy back after the launch: device arrays only")
        function = compiled._codelibrary.get_cufunc()
        grid = blocks if isinstance(blocks, tuple) else (blocks,)
        block = threads if isinstance(threads, tuple) else (threads,)
        grid, block = (tuple(grid) + (1, 1))[:3], (tuple(block) + (1, 1))[:3]
        if via == "cuda.core":
            from cuda.core import LaunchConfig, launch

            config = LaunchConfig(grid=grid, block=block, shmem_size=shared)
            self._packed = packed
            kernel_object = function.kernel
            self._launcher = lambda: launch(stream, config, kernel_object, *packed)
            self.how = "cuda.core.launch, arguments packed once"
            return
        driver = _driver()
        # numba passes plain ints as intptr_t and keeps ctypes values as they are; the driver
        # wants one pointer per parameter: keep the values alive, and the array of their addresses.
        self._packed = packed
        self._values = [value if isinstance(value, ctypes._SimpleCData) else
                        (ctypes.c_bool(value) if isinstance(value, (bool, np.bool_)) else ctypes.c_ssize_t(value))
                        for value in packed]
        self._pointers = (ctypes.c_void_p * max(1, len(self._values)))(
            *[ctypes.addressof(value) for value in self._values])
        handle = function.kernel._handle  # a CUkernel: the driver takes it where a CUfunction goes
        function_handle = driver.CUfunction(int(handle))
        driver_stream = stream_handle(stream)
        parameters = ctypes.addressof(self._pointers)
        launch_kernel = driver.cuLaunchKernel

        def launcher():
            error, = launch_kernel(function_handle, *grid, *block, shared, driver_stream, parameters, 0)
            if error:
                raise RuntimeError(f"cuLaunchKernel failed: {error!r}")

        self._launcher = launcher
        self.how = "cuLaunchKernel, parameter block built once"
        if not keep_args:  # the packed pointers are all it needs (LaunchCache keeps no array)
            self.args = None

    def set(self, index, value):
        """Change scalar argument `index` (an int or float of the type it had) for the next calls:
        one store into the packed parameter, no new packing (e.g. a random-number offset per step)."""
        if self.plain:
            self.args = self.args[:index] + (value,) + self.args[index + 1:]
            return
        start, stop, ty = self._slots[index]
        holder = self._packed[start] if start < len(self._packed) else None
        if stop - start != 1 or not isinstance(holder, ctypes._SimpleCData):
            raise TypeError(f"argument {index} ({ty}) is not a scalar: only scalars can be changed")
        holder.value = value  # the same object the parameter block points to (or cuda.core packs)

    def __call__(self):
        """Launch; returns `returns` (the outputs, for a caller that wants them back)."""
        if self.plain:
            self._launcher(*self.args)
        else:
            self._launcher()
        return self.returns


# ---------------------------------------------------------------------------------------------
# A step captured into a CUDA graph


class StepGraph:
    """`graph = StepGraph(step)`: run `step(stream)` once on a capture stream, recording every kernel
    it launches on that stream into a CUDA graph; `graph()` replays them all with one launch.

    step must launch on the stream it is given and do nothing else the driver would have to wait
    for: no allocation, no copy to the host, no synchronize (the capture fails with the driver's
    error if it does). What it reads and writes are the same buffers at every replay. The step is
    run once before the capture, to compile its kernels and allocate its workspaces; warmed_up=True
    skips that run, for a step that has already run on these buffers (a long step costs its host
    as much to run as to capture).
    """

    def __init__(self, step, stream=None, warmed_up=False):
        self.step = step
        self.stream = stream or cuda.stream()
        if not ON_GPU:
            self.how = "simulator: the step's launches, one by one (no graphs)"
            return
        driver = _driver()
        handle = stream_handle(self.stream)
        if not warmed_up:
            step(self.stream)  # warm-up: compiles, allocates workspaces, loads modules, outside the capture
        self.stream.synchronize()
        _check(driver.cuStreamBeginCapture(handle, driver.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL))
        try:
            step(self.stream)
        finally:
            graph = _check(driver.cuStreamEndCapture(handle))
        self._graph = graph
        self._exec = _check(driver.cuGraphInstantiate(graph, 0))
        self._handle = handle
        self._launch = driver.cuGraphLaunch
        self.how = "one cuGraphLaunch"

    def __call__(self):
        if not ON_GPU:
            self.step(self.stream)
            return
        error, = self._launch(self._exec, self._handle)
        if error:
            raise RuntimeError(f"cuGraphLaunch failed: {error!r}")


# ---------------------------------------------------------------------------------------------
# A plain wrapper that prepares itself


class LaunchCache:
    """The PreparedLaunches of a wrapper's last few calls, for calls that repeat with the same
    buffers (a training loop). The wrapper still checks its arguments at every call; what happens
    once per set of buffers instead of once per call is numba's typing and packing.

        _cache = LaunchCache()
        _cache.launch(kernel, blocks, threads, (x, y, mask, threshold, scale), stream=stream)
        _cache.launch_planned(choose, (x, out), options)  # choose(x, out, *options) -> kernel, grid, block

    The arguments are the kernel's, device arrays and scalars in any order. An entry is keyed by
    the kernel, the configuration, the stream, each array's device address, shape, strides and
    dtype, and each scalar's type: a new view of the same memory (`x.reshape(-1)` made afresh at
    every call) finds the launch made for the first one. A scalar's value is stored into the
    packed parameters when it changes (PreparedLaunch.set). No array is kept: the packed parameters
    hold addresses, and an entry is only ever used for arrays with exactly those addresses, shapes
    and dtypes, which is exactly the launch they need. In the simulator it is a plain launch.
    """

    def __init__(self, size=64):
        self.size, self.entries = size, OrderedDict()

    @staticmethod
    def _signature(arg):
        """What a launch depends on in one argument: the memory and layout of an array, the type
        of a scalar (its value can be changed in place)."""
        pointer = getattr(arg, "device_ctypes_pointer", None)  # numba's device arrays and views
        if pointer is not None:
            return pointer.value, arg.shape, arg.strides, arg.dtype
        interface = getattr(arg, "__cuda_array_interface__", None)  # torch, cupy
        if interface is not None:
            return interface["data"][0], interface["shape"], interface.get("strides"), interface["typestr"]
        return type(arg)

    def launch(self, kernel, blocks, threads, args, scalars=(), stream=0, shared=0):
        """Launch kernel[blocks, threads, stream, shared](*args, *scalars), prepared once per
        signature (shared: bytes of dynamic shared memory). Returns the cache's entry for it (None
        in the simulator): `again(entry, scalars)` launches it once more."""
        config = (kernel, blocks, threads)
        return self._launch((*config, shared), lambda: config, (*args, *scalars), stream, shared)

    def launch_planned(self, plan, args, options=(), stream=0, shared=0):
        """Launch the kernel that `plan(*args, *options)` picks, as (kernel, blocks, threads), on
        args. The plan must depend only on what the key holds (the arrays' shapes, dtypes and
        addresses, the scalars' types) and on the options: it is worked out on the first call
        with these buffers, not at every call (a plan may compile there, too). Returns the entry."""
        return self._launch((plan, options, shared), lambda: plan(*args, *options), args, stream, shared)

    @staticmethod
    def again(entry, scalars):
        """Launch an entry that launch() returned once more, on the same buffers, with `scalars`:
        one item per kernel argument, None for an array, the value for a scalar (its new value is
        stored into the packed parameters where it changed)."""
        prepared, last = entry
        for index, (old, new) in enumerate(zip(last, scalars)):
            if old is not new and old != new:  # a scalar that changed (arrays are None on both sides)
                prepared.set(index, new)
        entry[1] = scalars
        prepared()

    def _launch(self, what, plan, args, stream, shared=0):
        """what: the head of the key; plan(): (kernel, blocks, threads), called on a miss only."""
        if not _PREPARED:
            kernel, blocks, threads = plan()
            kernel[blocks, threads, stream, shared](*args)
            return None
        signature = tuple(map(self._signature, args))
        scalars = tuple(a if isinstance(kind, type) else None for kind, a in zip(signature, args))  # arrays: None
        key = (what, signature, int(stream_handle(stream)) if stream else 0)
        entry = self.entries.get(key)
        if entry is not None:
            try:
                self.entries.move_to_end(key)
            except KeyError:  # dropped by another thread in between (warm-ups side by side): still right
                pass
            self.again(entry, scalars)
            return entry
        kernel, blocks, threads = plan()
        prepared = PreparedLaunch(kernel, blocks, threads, *args, stream=stream, keep_args=False, shared=shared)
        entry = self.entries[key] = [prepared, scalars]
        if len(self.entries) > self.size:
            try:
                self.entries.popitem(last=False)
            except KeyError:  # emptied by another thread in between
                pass
        prepared()
        return entry


# ---------------------------------------------------------------------------------------------
# A wrapper's calls on torch tensors, found again from the tensors alone


class TensorCalls:
    """The launches of a wrapper's last few calls on torch tensors, found again from the tensors
    themselves, before any check or view is made (chapter 07).

        _calls = TensorCalls()

        def wrapper(x, y):
            key = _calls.key(("x", "y"), (x, y))       # None unless both are torch tensors on a GPU
            found = _calls.find(key)
            if found is not None:
                return found(scalars, (x, y))          # one launch; (y,) as views again
            x, y = require(x, ...), require(y, ...)    # the full path: every check, the views
            entry = _launches.launch(kernel, blocks, threads, (x, y), scalars)
            _calls.keep(key, entry, returns=(y,), owners=(1,))
            return y

    A call on torch tensors reads each tensor's key through torch's C accessors (data pointer,
    shape, strides, dtype, device: `require`'s reader, with its checks of the device and of
    requires_grad), and the wrapper's options that decided its launch (`extra`: p and seed, a
    block count...). A call met before, with exactly those tensors' memory and layout and those
    options, passed every check then and picks the same kernel and grid now: it is the same launch,
    so what is left is the launch (LaunchCache.again, which stores the scalars that changed, such
    as a random-number offset) and the return values, numba views of the tensors as the full path
    returns them, each made to hold its tensor (inputs.held). An entry holds no tensor: the packed
    parameters hold addresses, and the kept views name no owner (see inputs.ForeignViews: an
    entry is only found for live tensors with those addresses and layouts). In the simulator there
    are no torch tensors: key() is None, and every call takes the full path.
    """

    def __init__(self, size=64):
        self.size, self.entries = size, OrderedDict()
        self.found = 0  # calls found: a count for the tests

    @staticmethod
    def key(names, tensors, *extra):
        """The key of a call on `tensors` (named `names`, for the checks' messages) with the options
        `extra` (hashable), or None where one of them is not a torch tensor, or in the simulator."""
        if not ON_GPU:
            return None
        from .inputs import is_torch_tensor, torch_key

        for tensor in tensors:
            if not is_torch_tensor(tensor):
                return None
        return tuple(map(torch_key, tensors, names)), extra

    def find(self, key):
        """A callable for a call met before: found(scalars, tensors) launches (scalars as
        LaunchCache.again takes them) and returns the kept return values, each holding its tensor
        (tensors: the call's, in the key's order); else None."""
        if key is None:
            return None
        try:
            kept = self.entries.get(key)
        except TypeError:  # an option that cannot be hashed: the full path's checks say what is wrong
            return None
        if kept is None:
            return None
        try:
            self.entries.move_to_end(key)
        except KeyError:  # dropped by another thread in between: still the right launch
            pass
        self.found += 1
        return kept

    def keep(self, key, entry, returns=(), owners=(), holds=()):
        """Keep the launch of a call that took the full path: `entry` from LaunchCache.launch (or a
        tuple of them, the call's launches in their order), `returns` the wrapper's return values
        (numba views of the tensors), `owners` the index in the key's tensors of the tensor that
        each return value views, `holds` the device arrays the launches read that are not the
        caller's (a table the wrapper made and caches): kept alive as long as the entry is."""
        entries = entry if isinstance(entry, tuple) else (entry,)  # an entry itself is a list
        if key is None or not entries or any(e is None for e in entries):
            return
        from .inputs import unheld

        try:
            self.entries[key] = _Found(entries, tuple(map(unheld, returns)), tuple(owners), tuple(holds))
        except TypeError:  # an option that cannot be hashed: such calls take the full path
            return
        if len(self.entries) > self.size:
            self.entries.popitem(last=False)


class _Found:
    """A kept call of TensorCalls: called with the scalars, it launches and returns the views."""

    __slots__ = ("entries", "views", "owners", "holds")

    def __init__(self, entries, views, owners, holds=()):
        self.entries, self.views, self.owners, self.holds = entries, views, owners, holds

    def __call__(self, scalars, tensors):
        """scalars: the one launch's, as LaunchCache.again takes them; None: every launch with the
        scalars it had (a call whose options are all in its key)."""
        from .inputs import held

        for entry in self.entries:
            LaunchCache.again(entry, entry[1] if scalars is None else scalars)
        return tuple(held(view, tensors[index]) for view, index in zip(self.views, self.owners))
