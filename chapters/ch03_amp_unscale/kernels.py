"""Chapter 03's kernels: check_finite_and_unscale over a list of gradient tensors.

Mixed-precision training multiplies every gradient by 1/scale after the backward pass and checks
that none of them holds an Inf or a NaN (PyTorch: `torch._amp_foreach_non_finite_check_and_unscale_`,
PaddlePaddle: `check_finite_and_unscale`). A model has hundreds of gradient tensors, each allocated
on its own. Two ways to do it:

    naive:  for each tensor: one launch, one element per thread      300 tensors = 300 launches
    fused:  one launch for the whole list, through a device table     300 tensors = 1 launch

The fused kernel reaches many independently allocated arrays through one int64 table:

    table[ADDRESS, t]     base address of tensor t (an integer: where its first element lives)
    table[SIZE, t]        its number of elements
    table[TILE_START, t]  index of its first tile; table[TILE_START, n] = tiles in all

Every tensor is cut into tiles of TILE elements (its last tile may be partial), so a tile belongs to
exactly one tensor. The grid has one block per tile (sized to the data: chapter 00's copy found it
faster than a grid-stride loop, and here it measured 0.998 of the copy ceiling against 0.94 for
8 resident blocks per SM looping). Block b handles tiles b, b + blocks, ... (with one block per
tile, just tile b; the loop keeps any grid correct) and finds the tensor of a tile by a binary
search over the tile starts, staged in shared memory.

The convention (PyTorch's): a value is checked *before* the multiply. A finite float16 gradient
that overflows after unscaling (60000 * 2 with inv_scale = 2) is stored as Inf and does not set
found_inf; with a loss scale >= 1 (inv_scale <= 1) this cannot happen.

Every kernel here is what the chapter shows and what tests/test_ch03_amp_unscale.py tests.
"""

import math
import weakref

import numpy as np

import workbook
from workbook import cuda
from workbook.host import each
from workbook.inputs import require
from workbook.launch import LaunchCache, TensorCalls, cdiv

GRAD_DTYPES = (np.float32, np.float16)  # gradients; the arithmetic is float32 for both

# The simulator runs every CUDA thread in Python: 32-thread blocks keep it quick there.
# The kernel source is the same; only the tile is smaller.
THREADS_PER_BLOCK = 256 if workbook.ON_GPU else 32
VECTOR = 4  # elements per vector load: 16 bytes of float32, 8 bytes of float16
VECTORS_PER_THREAD = 4  # independent vector loads each thread has in flight in a full tile
TILE = THREADS_PER_BLOCK * VECTOR * VECTORS_PER_THREAD  # 4096 elements on a GPU, 512 in the simulator
BLOCKS_PER_SM = 8  # 8 x 256 threads = 2048, all a Hopper SM holds: launch_bounds keeps it reachable
MAX_BLOCKS = 2**31 - 1  # the grid's x limit; more tiles than this are strided over
MAX_TENSORS_PER_LAUNCH = 4096  # tensors one launch can take (longer lists take more launches)
SHARED_TILE_STARTS = MAX_TENSORS_PER_LAUNCH + 1  # int32 staged in shared memory: 16 KiB per block

ADDRESS, SIZE, TILE_START = 0, 1, 2  # rows of the device table


# ---------------------------------------------------------------------------------------------
# Reference


def unscale_reference(grads, inv_scale):
    """NumPy: (each gradient * inv_scale, computed in float32, stored in its dtype; found_inf).

    found_inf is 1.0 if any *input* value is Inf or NaN (checked before the multiply), else 0.0.
    """
    inv = np.float32(inv_scale)

    def one(g):  # (g unscaled, whether g held an Inf or NaN)
        with np.errstate(over="ignore", invalid="ignore"):
            return (g.astype(np.float32) * inv).astype(g.dtype), not np.all(np.isfinite(g))

    done = each(one, grads)  # the tensors side by side on a GPU's sizes (workbook/host.py)
    found = any(bad for _, bad in done)
    return [scaled for scaled, _ in done], np.array([1.0 if found else 0.0], dtype=np.float32)


# ---------------------------------------------------------------------------------------------
# From an address to memory: four small helpers, the only part that differs between the GPU and
# the simulator.
#
#   tensor_pointer(address, element)  a typed pointer to the memory at `address`
#   load4(p, i) -> (a, b, c, d)       elements i..i+3 as float32, one vector load (i % 4 == 0)
#   store4(p, i, (a, b, c, d))        the same four, converted back to the pointee type
#
# On a GPU they are numba intrinsics: a few lines of LLVM IR each (inttoptr, one <4 x T> load or
# store in the global address space, which NVPTX turns into ld.global.v4.f32 / st.global.v4.f32).
# The simulator has no device addresses: there, an "address" is where NumPy keeps the array's data,
# GradientList registers each array under it, and tensor_pointer hands the array back. So the
# kernel's source is the same in both modes.

# [address helpers: begin]
GLOBAL_ADDRESS_SPACE = 1  # NVVM's number for global memory

if workbook.MODE != "sim":  # a GPU, or the compile worker of workbook/compiler.py
    from llvmlite import ir
    from numba.cuda import types as _types
    from numba.cuda.extending import intrinsic

    @intrinsic
    def tensor_pointer(typingctx, address, element):
        pointer_type = _types.CPointer(element.instance_type)
        signature = pointer_type(_types.int64, element)

        def codegen(context, builder, signature, args):
            return builder.inttoptr(args[0], context.get_value_type(pointer_type))

        return signature, codegen

    def _vector_pointer(context, builder, pointer_type, pointer, index):
        # &p[index] as a pointer to <4 x T> in the global address space: 16-byte aligned for float32
        # because the base is (GradientList checks it) and index is a multiple of 4.
        element = context.get_value_type(pointer_type.dtype)
        address = builder.gep(pointer, [index])
        global_address = builder.addrspacecast(address, ir.PointerType(element, GLOBAL_ADDRESS_SPACE))
        vector = ir.VectorType(element, VECTOR)
        return builder.bitcast(global_address, ir.PointerType(vector, GLOBAL_ADDRESS_SPACE)), vector

    @intrinsic
    def load4(typingctx, pointer, index):
        quad = _types.UniTuple(_types.float32, VECTOR)
        signature = quad(pointer, _types.int64)

        def codegen(context, builder, signature, args):
            pointer_type = signature.args[0]
            vector_pointer, vector = _vector_pointer(context, builder, pointer_type, *args)
            size = pointer_type.dtype.bitwidth // 8
            loaded = builder.load(vector_pointer, align=VECTOR * size)
            values = [context.cast(builder, builder.extract_element(loaded, ir.Constant(ir.IntType(32), k)),
                                   pointer_type.dtype, _types.float32) for k in range(VECTOR)]
            return context.make_tuple(builder, quad, values)

        return signature, codegen

    @intrinsic
    def store4(typingctx, pointer, index, quad):
        signature = _types.none(pointer, _types.int64, _types.UniTuple(_types.float32, VECTOR))

        def codegen(context, builder, signature, args):
            pointer_type = signature.args[0]
            pointer, index, values = args
            vector_pointer, vector = _vector_pointer(context, builder, pointer_type, pointer, index)
            packed = ir.Constant(vector, ir.Undefined)
            for k in range(VECTOR):
                value = context.cast(builder, builder.extract_value(values, k), _types.float32,
                                     pointer_type.dtype)
                packed = builder.insert_element(packed, value, ir.Constant(ir.IntType(32), k))
            builder.store(packed, vector_pointer, align=VECTOR * (pointer_type.dtype.bitwidth // 8))
            return context.get_dummy_value()

        return signature, codegen

    def device_address(array):
        return int(array.__cuda_array_interface__["data"][0] or 0)

    _launch_bounds = {"launch_bounds": (THREADS_PER_BLOCK, BLOCKS_PER_SM)}

else:
    _SIMULATED_MEMORY = {}  # "address" -> the flat array whose data is there

    def tensor_pointer(address, element):
        return _SIMULATED_MEMORY[int(address)]

    def load4(p, i):
        return (np.float32(p[i]), np.float32(p[i + 1]), np.float32(p[i + 2]), np.float32(p[i + 3]))

    def store4(p, i, quad):
        for k in range(VECTOR):
            p[i + k] = quad[k]  # NumPy rounds float32 -> float16 to nearest even, as the GPU does

    def device_address(array):
        return int(array.__array_interface__["data"][0])

    _launch_bounds = {}  # the simulator's cuda.jit takes no launch bounds
# [address helpers: end]


# ---------------------------------------------------------------------------------------------
# Naive: one launch per tensor, one element per thread. Each launch reads 2 or 4 bytes and writes
# as many per element; at 4096 elements per tensor that is ~3 ns of HBM time per launch, against
# ~20 us to launch from Python: the loop measures launch cost and nothing else.


@cuda.jit
def unscale_one_tensor_kernel(grad, found_inf, inv_scale):
    i = cuda.grid(1)
    if i < grad.size:
        value = np.float32(grad[i])  # float16 gradients are widened: the arithmetic is float32
        if not math.isfinite(value):  # checked before the multiply (PyTorch's convention)
            found_inf[0] = np.float32(1.0)  # every writer writes the same 1.0: no atomic needed
        grad[i] = value * inv_scale[0]


# ---------------------------------------------------------------------------------------------
# Fused: one launch for the whole list.
#
#   tiles:   | t0: tile 0 | t0: tile 1 (partial) | t1: tile 2 | t2 (empty): - | t3: tile 3 ...
#   blocks:    block 0      block 1                block 2                       block 0 (2nd trip)
#
# In a full tile, thread k of the block loads four 4-element vectors, THREADS_PER_BLOCK vectors
# apart, before it stores any: lanes of a warp read 32 consecutive 16-byte vectors (512 bytes, a
# coalesced request) and each thread has 64 bytes in flight. The last, partial tile of a tensor
# goes one element at a time with a bounds check.


@cuda.jit(device=True)
def find_tensor(tile_starts, n_tensors, tile):
    """The last tensor t with tile_starts[t] <= tile (empty tensors own no tile and are skipped)."""
    low, high = 0, n_tensors - 1
    while low < high:
        middle = (low + high + 1) >> 1
        if tile_starts[middle] <= tile:
            low = middle
        else:
            high = middle - 1
    return low


@cuda.jit(device=True)
def all_finite4(q):
    # Bitwise &, not `and`: no branches, four compares and three ANDs.
    return math.isfinite(q[0]) & math.isfinite(q[1]) & math.isfinite(q[2]) & math.isfinite(q[3])


@cuda.jit(device=True)
def scaled4(q, s):
    return (q[0] * s, q[1] * s, q[2] * s, q[3] * s)


def _make_fused_kernel(element):
    """The fused kernel for gradients of one dtype (`element`: np.float32 or np.float16)."""

    @cuda.jit(**_launch_bounds)
    def unscale_fused_kernel(table, found_inf, inv_scale):
        n_tensors = table.shape[1] - 1
        thread = cuda.threadIdx.x

        # Stage the tile starts in shared memory: the binary search below reads ~log2(n) of them
        # per tile, and all threads of a block read the same word (a broadcast, no conflict).
        tile_starts = cuda.shared.array(SHARED_TILE_STARTS, np.int32)
        for t in range(thread, n_tensors + 1, THREADS_PER_BLOCK):
            tile_starts[t] = table[TILE_START, t]
        cuda.syncthreads()

        scale = inv_scale[0]  # read on the device: the host never waits for the scale
        found = False  # this thread's verdict, in a register until the end
        for tile in range(cuda.blockIdx.x, tile_starts[n_tensors], cuda.gridDim.x):
            t = find_tensor(tile_starts, n_tensors, tile)
            p = tensor_pointer(table[ADDRESS, t], element)
            size = table[SIZE, t]
            first = (tile - tile_starts[t]) * TILE  # the tile's first element in tensor t
            if first + TILE <= size:
                # A full tile: 4 vector loads in flight, no bounds checks. Per thread: reads
                # 16 elements (64 bytes of float32), writes 16.
                stride = THREADS_PER_BLOCK * VECTOR
                i = first + thread * VECTOR
                a = load4(p, i)
                b = load4(p, i + stride)
                c = load4(p, i + 2 * stride)
                d = load4(p, i + 3 * stride)
                found |= not (all_finite4(a) & all_finite4(b) & all_finite4(c) & all_finite4(d))
                store4(p, i, scaled4(a, scale))
                store4(p, i + stride, scaled4(b, scale))
                store4(p, i + 2 * stride, scaled4(c, scale))
                store4(p, i + 3 * stride, scaled4(d, scale))
            else:
                # The tensor's last tile, partial: one element per thread per step, coalesced.
                for i in range(first + thread, size, THREADS_PER_BLOCK):
                    value = np.float32(p[i])
                    found |= not math.isfinite(value)
                    p[i] = value * scale

        # One vote per block, one write per block that saw a non-finite value.
        if cuda.syncthreads_or(np.int32(found)) and thread == 0:
            found_inf[0] = np.float32(1.0)

    return unscale_fused_kernel


unscale_fused_kernels = {np.dtype(dtype): _make_fused_kernel(dtype) for dtype in GRAD_DTYPES}
unscale_fused_kernel = unscale_fused_kernels[np.dtype(np.float32)]  # the one the chapter shows


# ---------------------------------------------------------------------------------------------
# The list of gradients, described once


class GradientList:
    """A fixed list of gradient device arrays (one dtype, any shapes, each allocated on its own),
    checked once and described once in a device table for the fused kernel.

    Build it once per set of gradients (as an optimizer holds its parameters) and reuse it: the
    per-call host work of unscale_fused is then one launch. It holds references to the arrays, so
    the addresses in its table stay valid.
    """

    def __init__(self, grads, *, max_tensors_per_launch=MAX_TENSORS_PER_LAUNCH, max_blocks=MAX_BLOCKS):
        if isinstance(grads, np.ndarray) or hasattr(grads, "copy_to_host"):
            raise TypeError("grads must be a list of device arrays, not one array")
        grads = list(grads)
        if not grads:
            raise ValueError("grads is an empty list")
        if not 1 <= max_tensors_per_launch <= MAX_TENSORS_PER_LAUNCH:
            raise ValueError(f"max_tensors_per_launch must be in 1..{MAX_TENSORS_PER_LAUNCH}")
        if not 1 <= max_blocks <= MAX_BLOCKS:
            raise ValueError(f"max_blocks must be in 1..{MAX_BLOCKS}")
        arrays = [require(g, f"grads[{n}]", dtype=GRAD_DTYPES) for n, g in enumerate(grads)]
        dtypes = sorted({str(a.dtype) for a in arrays})
        if len(dtypes) > 1:
            raise TypeError(f"grads mixes dtypes {dtypes}: make one GradientList per dtype")
        self.dtype = np.dtype(dtypes[0])
        self.arrays = arrays
        self.flat = [a.reshape(a.size) for a in arrays]  # views, no copy
        self.sizes = np.array([a.size for a in arrays], dtype=np.int64)
        self.addresses = np.array([device_address(a) if a.size else 0 for a in self.flat], dtype=np.int64)
        alignment = VECTOR * self.dtype.itemsize
        for n, (address, size) in enumerate(zip(self.addresses, self.sizes)):
            if size and address % alignment:
                raise ValueError(f"grads[{n}] starts at an address that is not a multiple of {alignment} "
                                 "bytes (a sliced view?): the fused kernel loads 4 elements at a time")
        if not workbook.ON_GPU:
            _SIMULATED_MEMORY.update({int(a): f for a, f in zip(self.addresses, self.flat) if f.size})

        # One table (and one launch) per group of at most max_tensors_per_launch tensors.
        kernel = self.kernel = unscale_fused_kernels[self.dtype]
        self.launches, self.blocks = [], []
        for begin in range(0, len(arrays), max_tensors_per_launch):
            end = min(begin + max_tensors_per_launch, len(arrays))
            tiles = cdiv(self.sizes[begin:end], TILE)  # ceil: a tensor's last tile may be partial
            table = np.zeros((3, end - begin + 1), dtype=np.int64)
            table[ADDRESS, :-1] = self.addresses[begin:end]
            table[SIZE, :-1] = self.sizes[begin:end]
            table[TILE_START, 1:] = np.cumsum(tiles)
            n_tiles = int(table[TILE_START, -1])
            if n_tiles >= 2**31:
                raise ValueError(f"{n_tiles} tiles do not fit the kernel's int32 tile index")
            if n_tiles == 0:
                continue  # only empty tensors: nothing to launch
            blocks = min(n_tiles, max_blocks)  # a block per tile, unless told fewer
            # The configured launch is built once, too: kernel[blocks, threads] costs host time.
            on_device = cuda.to_device(table)
            on_device.addressed = tuple(self.flat[begin:end])  # what it points at lives as long as it does
            self.launches.append((kernel[blocks, THREADS_PER_BLOCK], on_device))
            self.blocks.append(blocks)

    def __len__(self):
        return len(self.arrays)

    @property
    def size(self):
        return int(self.sizes.sum())

    def copy_to_host(self):
        """A NumPy copy of every gradient, in their shapes."""
        return [a.copy_to_host() for a in self.arrays]


def _flag_args(grads, found_inf, inv_scale):
    if not isinstance(grads, GradientList):
        raise TypeError(f"grads must be a GradientList (build it once: GradientList(list_of_arrays)), "
                        f"not {type(grads).__name__}")
    found_inf = require(found_inf, "found_inf", dtype=np.float32, shape=(1,))
    inv_scale = require(inv_scale, "inv_scale", dtype=np.float32, shape=(1,))
    return found_inf, inv_scale


# ---------------------------------------------------------------------------------------------
# Host wrappers. Both take (GradientList, found_inf, inv_scale), unscale in place, set found_inf
# to 1.0 if any input value is not finite (they never clear it: zero it before a step), and return
# (found_inf, grads).


def unscale_per_tensor(grads, found_inf, inv_scale):
    """Naive: one launch per non-empty tensor."""
    found_inf, inv_scale = _flag_args(grads, found_inf, inv_scale)
    for grad in grads.flat:
        if grad.size:
            blocks = cdiv(grad.size, THREADS_PER_BLOCK)
            unscale_one_tensor_kernel[blocks, THREADS_PER_BLOCK](grad, found_inf, inv_scale)
    return found_inf, grads


_launches = LaunchCache()
_torch_calls = TensorCalls()  # unscale_fused with torch flags met before: its launches (chapter 07)


def unscale_fused(grads, found_inf, inv_scale, *, stream=0):
    """Fused: one launch per MAX_TENSORS_PER_LAUNCH tensors (one launch for any list up to 4096),
    through a cache of prepared launches: the same table and flags again cost the driver's launch,
    not numba's typing of three arrays (chapter 07). `stream`: where they go (a step captured into
    a graph, chapter 08, launches on its capture stream)."""
    given = (found_inf, inv_scale)
    # the list by a weak reference: found while it lives, never kept alive by the cache
    listed = weakref.ref(grads) if isinstance(grads, GradientList) else None  # else: the full path says why
    key = _torch_calls.key(("found_inf", "inv_scale"), given, listed, stream)
    found = _torch_calls.find(key)
    if found is not None:  # torch flags met before with this list, every check passed then
        return found(None, given)[0], grads
    found_inf, inv_scale = _flag_args(grads, found_inf, inv_scale)
    entries = tuple(_launches.launch(grads.kernel, blocks, THREADS_PER_BLOCK, (table, found_inf, inv_scale),
                                     stream=stream) for (_, table), blocks in zip(grads.launches, grads.blocks))
    _torch_calls.keep(key, entries, returns=(found_inf,), owners=(0,))
    return found_inf, grads


def assert_unscaled(out, ref, name="output"):
    """Check one output of the wrappers against unscale_reference: a GradientList (every tensor,
    bit-exact: the float32 multiply is IEEE in both) or found_inf."""
    if isinstance(out, GradientList):
        if len(out) != len(ref):
            raise workbook.CheckError(f"{name}: {len(out)} tensors, expected {len(ref)}")
        for n, (grad, expected) in enumerate(zip(out.arrays, ref)):
            workbook.assert_close(grad, expected, exact=True, name=f"{name} tensor {n}")
    else:
        workbook.assert_close(out, ref, exact=True, name=f"{name} found_inf")


# ---------------------------------------------------------------------------------------------
# A dynamic loss scaler that never leaves the device (torch.amp.GradScaler's rule):
#   non-finite gradients: skip the step, scale *= backoff, reset the count of good steps;
#   growth_interval good steps in a row: scale *= growth.


@cuda.jit(device=True)
def update_scale(scale, inv_scale, found_inf, good_steps, growth, backoff, growth_interval):
    """The rule, for one thread: a few words of state; found_inf is cleared for the next step."""
    if found_inf[0] != 0:
        scale[0] = scale[0] * backoff
        good_steps[0] = 0
    else:
        good_steps[0] += 1
        if good_steps[0] == growth_interval:
            scale[0] = scale[0] * growth
            good_steps[0] = 0
    inv_scale[0] = np.float32(1.0) / scale[0]
    found_inf[0] = np.float32(0.0)  # ready for the next step


@cuda.jit
def update_scale_kernel(scale, inv_scale, found_inf, good_steps, history, step,
                        growth, backoff, growth_interval):
    # history[step] keeps the scale used at this step.
    if cuda.grid(1) == 0:
        history[step] = scale[0]
        update_scale(scale, inv_scale, found_inf, good_steps, growth, backoff, growth_interval)


@cuda.jit
def sgd_step_kernel(weights, grad, lr, found_inf):
    # w -= lr * g, unless this step's gradients were not finite (then the step is skipped).
    i = cuda.grid(1)
    if i < weights.size and found_inf[0] == 0:
        weights[i] -= lr * np.float32(grad[i])


@cuda.jit
def scale_to_half_kernel(grad32, scale, grad16):
    # What a backward pass of (loss * scale) in float16 produces: scale * g rounded to float16,
    # Inf where it overflows 65504.
    i = cuda.grid(1)
    if i < grad32.size:
        grad16[i] = grad32[i] * scale[0]


class DynamicLossScaler:
    """Loss scale, its inverse, found_inf and the good-step count, all in device memory."""

    def __init__(self, init_scale=2.0**16, growth=2.0, backoff=0.5, growth_interval=2000, max_steps=1024):
        if not (init_scale > 0 and growth > 1 and 0 < backoff < 1 and growth_interval >= 1):
            raise ValueError("need init_scale > 0, growth > 1, 0 < backoff < 1, growth_interval >= 1")
        self.growth, self.backoff = np.float32(growth), np.float32(backoff)
        self.growth_interval = int(growth_interval)
        self.scale = cuda.to_device(np.array([init_scale], dtype=np.float32))
        self.inv_scale = cuda.to_device(np.array([1.0 / init_scale], dtype=np.float32))
        self.found_inf = cuda.to_device(np.zeros(1, dtype=np.float32))
        self.good_steps = cuda.to_device(np.zeros(1, dtype=np.int32))
        self.history = cuda.to_device(np.zeros(max_steps, dtype=np.float32))
        self.steps = 0

    def unscale_(self, grads):
        return unscale_fused(grads, self.found_inf, self.inv_scale)

    def update(self):
        if self.steps >= self.history.size:
            raise ValueError(f"history holds {self.history.size} steps")
        update_scale_kernel[1, 32](self.scale, self.inv_scale, self.found_inf, self.good_steps,
                                   self.history, self.steps, self.growth, self.backoff,
                                   self.growth_interval)
        self.steps += 1
