"""Warp-level intrinsics for numba's CUDA simulator, with the semantics of a GPU of compute capability 7.0+.

Students without a GPU, and CI, run the workbook in numba's simulator (NUMBA_ENABLE_CUDASIM=1), which
runs each CUDA thread of a block as a Python thread. The stock simulator has no warp-level operations
(`cuda.ballot_sync` is an AttributeError) and schedules its threads with a busy polling loop.
`install()` -- called by `import workbook` in simulator mode; nothing for a reader to call -- adds
(the intrinsics are in intrinsics.py, the scheduler in scheduler.py, what each collective computes in
collectives.py)

    ballot_sync  all_sync  any_sync  eq_sync          votes            (mask, predicate)
    shfl_sync  shfl_up_sync  shfl_down_sync  shfl_xor_sync   shuffles  (mask, value, lane/delta/lane_mask)
    match_any_sync  match_all_sync                    compare          (mask, value)
    syncwarp([mask])  activemask()  lanemask_lt()

corrects popc, brev, clz and ffs for negative and 64-bit values, and replaces the block scheduler by
one that switches between greenlets (below), which also serves syncthreads and syncthreads_count/and/or.
workbook/tensor_cores.py's mma and ldmatrix are warp collectives of the same scheduler, and its
cp.async copies land at their wait (tensor_ops.py; what each collective computes: collectives.py).
Its wgmma needs no collective: each thread computes its own 64 accumulators from the tiles its
descriptors point at, when the wgmma_wait that covers them runs (tensor_ops.py).

Threads, warps and lanes
------------------------
Warps are cut from the *linear* thread index x + y*bx + z*bx*by; lane = linear % 32. A block of
16 x 3 threads has two warps, the second one half empty:

    threadIdx.y = 0:  x = 0..15  -> linear  0..15  -> warp 0, lanes  0..15
    threadIdx.y = 1:  x = 0..15  -> linear 16..31  -> warp 0, lanes 16..31
    threadIdx.y = 2:  x = 0..15  -> linear 32..47  -> warp 1, lanes  0..15   (lanes 16..31 do not exist)

What a `*_sync(mask, ...)` call waits for
-----------------------------------------
A lane calling ballot_sync(0xFFFFFFFF, p) waits until every lane named in the mask that exists and has
not exited has reached a call of the same kind (any vote / any shuffle / any match / syncwarp) with the
same mask. Exited and missing lanes are skipped, as on the hardware, so the tail pattern
`if i >= n: return` followed by a full-mask collective works:

    warp 3 of a 128-thread block, n = 100      ballot_sync(0xFFFFFFFF, p)
    lane:   0  1  2  3 |  4  5 ... 31
            =  =  =  = |  x  x ...  x          = arrived   x exited: skipped
    the call completes once lanes 0-3 have arrived; bits 4-31 of the ballot are 0

Results have numba's types on a GPU: ballot_sync and match_any_sync return a *signed* int32 (lane 31 set
means negative), match_all_sync a tuple (int32 mask, bool), all/any/eq_sync a bool, activemask and
lanemask_lt a uint32, a shuffle whatever it was given. laneid and warpsize are plain ints, like
threadIdx in the simulator.

activemask()
------------
On a GPU it returns the lanes executing the call together. The model here: a lane calling activemask()
waits until no lane of its warp can make progress (each one has exited or waits somewhere), then gets
the mask of the lanes waiting at the same call site (same line, same chain of device-function calls).
So after `if i >= n: return` the tail warp sees only its live lanes, and inside `if lane % 2 == 0:`
the even lanes see 0x55555555.

Shuffles
--------
As in PTX shfl.sync, only the low 5 bits of the lane/delta operand count: shfl_sync(m, v, 33) reads
lane 1 and shfl_sync(m, v, -1) lane 31; shfl_up/shfl_down past the edge of the warp return the
caller's own value. Reading a lane that does not take part in the shuffle (exited, missing from a
partial warp, or not in the mask) is undefined on a GPU; here it returns the caller's own value, or,
with WORKBOOK_SIM_STRICT=1, raises StrictModeError naming both lanes. Strict mode also rejects a
collective whose mask leaves out the calling lane (by default the caller is added to the mask), and
a vote or match that lanes named in its mask exited without making (a GPU completes it without
them, so their bits of a ballot are silently missing; by default the simulator does the same).

Types numba refuses
-------------------
Where numba would not compile a call for a GPU, the simulator raises TypeError instead of quietly
working: shuffling anything but an int32/int64/float32/float64 (activemask() is a uint32!), a bool
predicate for syncthreads_count/and/or (they take integers), a float vote predicate. popc and clz keep
the argument's width (a Python int is an int64: popc(-1) == 64), ffs returns a uint32, and brev has
only uint32 and uint64 versions: numba converts every other integer, int64 included, to uint32.
With WORKBOOK_COMPILER=numba-cuda-mlir the results take that compiler's types instead: ballot_sync
and the match masks are uint32, popc, clz and ffs int32. cuda.grid stays a Python int: the
successor's int32 index is not modelled (NumPy's int32 scalars do not follow numba's typing: `i &
0xFFFFFFFF` is an int64 in a kernel, an OverflowError on a NumPy int32).

Deadlocks
---------
A collective that can never complete -- half a warp in shfl_sync and the other half in ballot_sync,
or one lane in syncthreads while the rest of its warp waits for it in a shuffle -- would hang a GPU.
Here, once every live thread of the block waits and nothing can be released, the launch raises
WarpDeadlockError naming the kernel, the block and, per warp, which lanes wait where for whom.

Scheduling (why it is fast)
---------------------------
Each simulated thread is a greenlet, and a block's threads take turns in the launching OS thread:
in order of their linear index, each runs until it waits (a barrier, a collective) or exits, then
switches back to the block's scheduler, which switches to the next thread that can run. The last
lane to arrive at a collective computes every participant's result and puts them back in line; an
exiting thread re-checks the collectives and the barrier it might have been holding up. syncthreads
completes when all *live* threads have arrived (exited threads do not block it, as on sm_70+).
Nothing polls, and no OS thread is woken: a switch is a call into greenlet, not a context switch and
a hand-off of the GIL. A thread that spins on cuda.atomic.cas or exch (a lock) lets the others run
at each call. Because the order is fixed, a race may well give the right values here: the sanitizer
(on in exercise checks) names it whatever the order.

Measured 2026-11-26 on 2 shared CPU cores (AMD EPYC), Python 3.11, numba-cuda 0.30.4; 16 blocks x 256
threads, best of 3, two runs each; "threads" = this package's previous scheduler, one pooled Python
thread per CUDA thread, each sleeping on its own lock (numba's own runs a busy polling loop):
    ballot_sync + 5-step shfl_xor_sync reduction   0.40-0.61 s   threads: 1.23-1.35 s
        (tests/test_warp_intrinsics.py -k speed -s prints it; the test's bound is 20 s)
    elementwise `out[i] = x[i] + 1`                 0.19-0.20 s   threads: 0.29-0.38 s
    the same between two syncthreads()              0.25-0.30 s   threads: 0.54-0.64 s

tests/test_warp_intrinsics.py checks all of the above against hand-computed expectations; the same file
passed on an H100 (results/nvidia-h100-80gb-hbm3/test_warp_intrinsics.log).
"""

import contextlib
import copy
import itertools
import os
import threading

import numpy as np

from . import gpu_math, interleave, watch
from .intrinsics import INTRINSICS
from .numba_typing import as_declared, declared_types
from .sanitizer import RaceError, Sanitizer, UninitializedReadError, sanitizing  # noqa: F401
from .scheduler import (FULL_MASK, STRICT_ENV, TIME_LIMIT_ENV, WARP_SIZE, BlockScheduler,  # noqa: F401
                        GridLaunch, GridSyncError, KernelTimeoutError, StrictModeError,
                        WarpDeadlockError, current, strict_mode)


SANITIZE_ENV = "WORKBOOK_SANITIZE"


class _ThreadingForKernels:
    """The `threading` numba's kernelapi sees: current_thread() is the simulated CUDA thread running
    now (a greenlet, scheduler.py), everything else the real module."""

    current_thread = staticmethod(current)

    def __getattr__(self, name):
        return getattr(threading, name)


COOPERATIVE_BLOCKS = 4  # what max_cooperative_grid_blocks says here: blocks that run at once, an OS thread each


def _grid_sync(self):
    current().block.grid_sync(current())


def uses_grid_sync(function, _seen=None):
    """Does this kernel (or a device function it calls) call cuda.cg.this_grid()? Then it launches
    cooperatively, as numba launches it on a GPU."""
    seen = set() if _seen is None else _seen
    code = getattr(function, "__code__", None)
    if code is None or code in seen:
        return False
    seen.add(code)
    codes = [code]
    while codes:
        c = codes.pop()
        if "this_grid" in c.co_names:
            return True
        codes.extend(k for k in c.co_consts if hasattr(k, "co_names"))
        named = [getattr(function, "__globals__", {}).get(name) for name in c.co_names]
        for cell in getattr(function, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # a cell not yet filled
                named.append(cell.cell_contents)
        for called in named:
            if getattr(called, "_device", False) and uses_grid_sync(called.fn, seen):
                return True
    return False


def _block_manager(f, grid_dim, block_dim, debug):
    cooperative = getattr(f, "_workbook_grid_sync", None)
    if cooperative is None:
        cooperative = uses_grid_sync(f)
        with contextlib.suppress(AttributeError, TypeError):
            f._workbook_grid_sync = cooperative
    if cooperative and int(np.prod(grid_dim)) > 1:
        return GridLaunch(f, grid_dim, block_dim, debug)
    return BlockScheduler(f, grid_dim, block_dim, debug)


def install():
    """Patch numba's CUDA simulator (idempotent; does nothing unless the simulator is enabled)."""
    from numba.cuda.core import config

    if not config.ENABLE_CUDASIM:
        return
    from numba.cuda.simulator import kernel, kernelapi

    if getattr(kernel, "_workbook_simulator_installed", False):
        return
    from .. import device
    from . import collectives

    collectives.SUCCESSOR_TYPES = device.choose_compiler() == device.SUCCESSOR
    for name, function in INTRINSICS.items():
        setattr(kernelapi.FakeCUDAModule, name, function)
    kernel.BlockManager = _block_manager
    kernelapi.GridGroup.sync = _grid_sync
    kernel.FakeOverload.max_cooperative_grid_blocks = lambda self, blockdim, dynsmemsize=0: COOPERATIVE_BLOCKS
    kernelapi.threading = _ThreadingForKernels()  # threadIdx & co. come from the running greenlet
    global _stock_getitem
    _stock_getitem = kernel.FakeCUDAKernel.__getitem__
    kernel.FakeCUDAKernel.__getitem__ = _configured_copy
    watch.install()  # bounds named with block, thread and line; accesses reported to a trace or sanitizer
    gpu_math.install()  # math.log(0.0) is -inf in a kernel, as on a GPU, not a ValueError
    _launches(kernel)
    _jit_options()
    kernel._workbook_simulator_installed = True
    if os.environ.get(SANITIZE_ENV, "").strip() not in ("", "0"):  # every launch of this process sanitized
        watch._listeners.append(Sanitizer(budget=None))
    if interleave.seed_from_env() is not None:  # every launch of this process in that seed's order
        watch._listeners.append(interleave.Interleaver(interleave.seed_from_env()))


_stock_getitem = None


def _configured_copy(self, configuration):
    """`kernel[grid, block, stream]` as on a GPU: a new configured launcher, the kernel untouched.

    The stock simulator configures the kernel object itself and returns it, so launchers kept for
    later (`launches = [k[g, b, s] for s in streams]`) would all run with the last configuration.
    Inside `regridded(...)`, the grid is changed on the way (exercise checks, see there).
    """
    if _regrid is not None:
        configuration = _regrid(self, configuration)
    return _stock_getitem(copy.copy(self), configuration)


_regrid = None  # (kernel, configuration) -> configuration, while regridded() is in force

GRIDS = {
    "one block": "one block in place of the wrapper's grid, so that a grid-stride loop must go round",
    "more blocks": "one more block along each dimension of the wrapper's grid, so that threads past the data "
                   "must do nothing",
    "smaller blocks": "blocks of half the wrapper's threads and twice the blocks, so that a kernel that takes "
                      "its block size for granted is caught",
}


class EnoughLaunches(BaseException):
    """Raised by the launch after `regridded(..., launches=N)`'s N-th: the check has been tried enough
    (a BaseException, so that no check's own `except Exception` swallows it)."""


def regridded(module_name, how, launches=None):
    """A context in which kernels defined in `module_name` launch on another grid (`how`, a key of
    GRIDS), their blocks unchanged: a check run this way finds an answer that is right only for the
    grid its wrapper happens to pick. With `launches`, the launch after that many raises
    EnoughLaunches: a check's first cases (its small, awkward sizes) are where such answers fail.
    On "one block", a launch whose grid is one block already is not counted (it changes nothing, and
    a check's small sizes would use up the count before a grid-stride loop has to go round)."""

    made = [0]

    def change(kernel, configuration):
        if getattr(kernel.fn, "__module__", None) != module_name:
            return configuration
        grid, rest = configuration[0], tuple(configuration[1:])
        dims = (grid,) if isinstance(grid, int | np.integer) else tuple(grid)
        if how == "one block" and all(int(d) == 1 for d in dims):
            return configuration
        made[0] += 1
        if launches is not None and made[0] > launches:
            raise EnoughLaunches()
        if how == "smaller blocks":
            return _halved(dims, rest)
        if how == "one block":
            dims = (1,) * len(dims)
        else:
            dims = tuple(int(d) + 1 for d in dims)
        return (dims[0] if len(dims) == 1 else dims, *rest)

    @contextlib.contextmanager
    def regrid():
        global _regrid
        before, _regrid = _regrid, change
        try:
            yield
        finally:
            _regrid = before

    return regrid()


def _halved(grid, rest):
    """(grid, block, ...) with the block halved along its first dimension that stays whole warps
    (x if x is a multiple of 64, else an even y), and twice the blocks along it; unchanged if none."""
    block = (rest[0],) if isinstance(rest[0], int | np.integer) else tuple(rest[0])
    block = tuple(int(b) for b in block)
    grid = tuple(int(g) for g in grid) + (1,) * (len(block) - len(grid))
    for axis, size in enumerate(block):
        if (axis == 0 and size % 64 == 0) or (axis > 0 and size % 2 == 0 and block[0] % 32 == 0):
            block = block[:axis] + (size // 2,) + block[axis + 1:]
            grid = grid[:axis] + (2 * grid[axis],) + grid[axis + 1:]
            break
    unwrap = lambda dims: dims[0] if len(dims) == 1 else dims  # noqa: E731
    return (unwrap(grid), unwrap(block), *rest[1:])


_launch_numbers = itertools.count(1)


def _launches(kernel):
    """Each kernel launch tells the registered listeners (watch.py) where it starts and ends: a
    trace counts per launch, the sanitizer forgets a launch's accesses after it. A device function's
    call costs a dictionary lookup (see _held)."""
    stock_call = kernel.FakeCUDAKernel.__call__

    def call(self, *args):
        if self._device or kernel._kernel_context:
            if id(self.fn.__globals__) in _held:
                return self.fn(*args)
            return _hold_and_call(kernel, stock_call, self, args)
        if _skipping:
            return None
        declared = getattr(self, "_declared", None)
        if declared is not None:
            args = as_declared(args, declared)
        _check_shared_memory(self)
        try:
            return _launch(kernel, stock_call, self, args)
        finally:
            _let_go()

    kernel.FakeCUDAKernel.__call__ = call


def _check_shared_memory(kernel):
    """A launch asking for more dynamic shared memory than a block may have on the GPU the simulator
    answers as fails, as the driver's would (227 KB on an H100, 64 KB on a T4: workbook/capability.py)."""
    asked = int(getattr(kernel, "dynshared_size", 0) or 0)
    if asked:
        from .. import capability

        limit = capability.shared_limit()
        if asked > limit:
            raise RuntimeError(f"{kernel.fn.__name__}: a launch with {asked:,} bytes of dynamic shared memory a "
                               f"block, more than the {limit:,} a block may have on "
                               f"{capability._device_name(capability.current())}")


_skipping = False  # inside outputs_of(): host launches do nothing


def outputs_of(function):
    """What `function()` returns, run with every kernel launch skipped (nothing is computed): the
    output arrays a call writes, found for the cost of its host code. A function whose host code
    fails that way (it reads back what a kernel should have written) is called for real."""
    global _skipping
    _skipping = True
    try:
        return function()
    except Exception:  # noqa: BLE001  (its host code needs what the kernels compute)
        pass
    finally:
        _skipping = False
    return function()


# The stock simulator swaps `cuda` (and gpu_math.py: `math`) in a device function's module globals
# at every call of it and back when the last caller leaves: a scan of the module's globals per call.
# Here a module is swapped at its first call in a launch and stays swapped until the launch ends
# (only one simulated launch runs at a time).
_held = set()  # id(module globals) of the modules swapped for this launch
_holding = contextlib.ExitStack()  # their swaps, undone when the launch ends
_hold_lock = threading.Lock()


def _hold_and_call(kernel, stock_call, device_function, args):
    globs = device_function.fn.__globals__
    context = kernel._get_kernel_context()
    if context is None:  # a thread still unwinding after its launch failed
        return stock_call(device_function, *args)
    with _hold_lock:
        if id(globs) not in _held:
            _holding.enter_context(kernel.swapped_cuda_module(device_function.fn, context))
            _held.add(id(globs))
    return device_function.fn(*args)


def _let_go():
    with _hold_lock:
        _holding.close()
        _held.clear()


def _launch(kernel, stock_call, self, args):
    if not watch.active():
        return stock_call(self, *args)
    number = next(_launch_numbers)
    listeners = list(watch._listeners)  # told of the end too, even if one stepped aside meanwhile
    watch.forget_arrays()
    for listener in listeners:
        if hasattr(listener, "launch_arguments"):  # (check_data.py: what a check's launches are given)
            listener.launch_arguments(number, self, args)
        listener.launch_started(number, self)
    try:
        result = stock_call(self, *args)
    except BaseException:
        for listener in listeners:
            listener.launch_ended(number, self, failed=True)
        raise
    for listener in listeners:
        listener.launch_ended(number, self)  # the sanitizer may raise what it found at the end
    return result


def _jit_options():
    """Two things numba's cuda.jit does that the simulator's did not.

    `cuda.jit(device=True, forceinline=True)`, as numba-cuda spells it: LLVM inlines the device
    function into its callers (numba's inline="always" inlines at its own IR level: the same
    instructions in another order, at several times the compile time; chapter 02's kernels took
    33 s to compile that way and 5 s this way, on a laptop). The simulator runs Python and inlines
    nothing; the option is kept on the kernel for workbook/compiler.py, which compiles it for a GPU.

    `cuda.jit("void(int32[:], int32)")`: a declared signature. On a GPU the launch converts each
    argument to its declared type, so `cuda.clz(c)` sees an int32 where the caller passed the Python
    int 0x00100000; the stock simulator ignored the signature and computed with whatever it was
    given (a Python int: 64 bits). The declared types are kept on the kernel (`_declared`); a launch
    converts its integer arguments to them (`numba_typing.as_declared`) and the compile hook compiles for them."""
    import numba.cuda
    from numba.cuda import simulator
    from numba.cuda.simulator import api, kernel

    stock = api.jit

    def jit(func_or_sig=None, *args, forceinline=False, **options):
        made = stock(func_or_sig, *args, **options)
        declared = declared_types(func_or_sig)

        def mark(decorated):
            if forceinline:
                decorated._forceinline = True
            if declared is not None and not decorated._device:
                decorated._declared = declared
            return decorated

        if isinstance(made, kernel.FakeCUDAKernel):
            return mark(made)
        return lambda fn: mark(made(fn))

    api.jit = simulator.jit = numba.cuda.jit = jit
