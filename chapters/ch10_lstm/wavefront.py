"""Step 5: every layer in one persistent kernel, in a wavefront, after Baidu's persistent RNNs.

At wavefront step s, layer l works on time step t = s - l: layer l+1 multiplies layer l's h_t while
layer l is on h_{t+1}. The layers run side by side on blocks of their own, and a forward takes
T + L - 1 grid barriers instead of T * L. Each block owns `units` hidden units of one layer, their
four gates' rows: 64 rows at H = 512 over 32 blocks a layer, and keeps both of its weight matrices
on chip for the whole sequence:
- W_hh in shared memory (128 KB a block, padded rows: past the 48 KB a kernel gets without
  asking, so the launch asks);
- W_ih (layers past the first; the first one's input term is step 2's hoisted GEMM) in registers:
  a row's SLICES threads each hold every SLICES-th value of it, 64 floats a thread. They stay in
  registers only if the compiler unrolls the loop over them, which it does for one batch row at a
  time: so the batch is taken one row at a time (CHUNK = 1).

The kernel is made for its sizes (make_wavefront_kernel): a loop over k must have a trip count the
compiler knows, or W_ih lands in local memory."""

import math
from functools import lru_cache

import numba
import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.inputs import sm_count
from workbook.launch import allow_shared_memory

from .fused import FusedLSTM
from .layer import sigmoid
from .persistent import cooperative_limit

MAX_THREADS = 512 if ON_GPU else 128
SHARED_LIMIT = 227 * 1024  # a block's dynamic shared memory on an H100, asked for
ZERO = float32(0.0)


def block_shape(hidden, units):
    """(threads, slices): a weight row is shared by `slices` neighbouring lanes (a power of 2 that
    divides 32), as many as MAX_THREADS allows; the block is rounded up to whole warps."""
    rows = 4 * units
    slices = 1
    while slices < 32 and rows * slices * 2 <= MAX_THREADS:
        slices *= 2
    return -(-rows * slices // 32) * 32, slices


def shared_words(units, hidden):
    """float32 words of a block's shared memory: its W_hh rows (padded), h_{t-1} and the input of
    one batch row, the gate sums."""
    return 4 * units * (hidden + 1) + 2 * hidden + 4 * units


@lru_cache(maxsize=None)
def make_wavefront_kernel(H, U, L):
    """The wavefront kernel for hidden size H, U units a block, L layers."""
    R = 4 * U  # weight rows a block owns
    THREADS, SLICES = block_shape(H, U)
    KPT = -(-H // SLICES)  # k values a thread takes: k = m * SLICES + part
    PITCH = H + 1  # padded shared rows: a warp's rows start in different banks
    HS = R * PITCH  # h_{t-1}, one batch row
    XS = HS + H  # the layer's input (h_t of the layer below), one batch row
    ZS = XS + H  # the gate sums, one per row
    # a block of THREADS must fit an SM: at most 65536 / THREADS registers a thread (128 at 512)
    options = {"launch_bounds": (THREADS, 1)} if ON_GPU else {}

    @cuda.jit(**options)
    def wavefront_kernel(x_terms, w_ih, w_hh, bias, h, c, y):
        """Every layer of the LSTM. x_terms (T, B, 4H): layer 0's input GEMM; w_ih, w_hh (L, 4H, H)
        (w_ih[0] unused); bias (L, 4H); h, c (L, B, H): the initial states, left holding the last;
        y (L, T, B, H): every layer's outputs. The grid is L groups of blocks, one per layer."""
        T, B = y.shape[1], y.shape[2]
        grid = cuda.cg.this_grid()
        shared = cuda.shared.array(0, dtype=float32)
        tid = cuda.threadIdx.x
        row, part = tid // SLICES, tid % SLICES  # this thread's weight row and its share of k
        per_layer = cuda.gridDim.x // L
        layer = cuda.blockIdx.x // per_layer
        j0 = (cuda.blockIdx.x % per_layer) * U
        live = row < R and j0 + row % U < H
        for n in range(tid, R * H, THREADS):  # W_hh rows into shared memory, once
            r, k = n // H, n % H
            shared[r * PITCH + k] = w_hh[layer, (r // U) * H + j0 + r % U, k] if j0 + r % U < H else ZERO
        for k in range(tid, H, THREADS):
            shared[XS + k] = ZERO  # the first layer's input term is x_terms: its x_s stays 0
        wih = cuda.local.array(KPT, float32)  # W_ih: registers, once
        for m in range(KPT):
            k = m * SLICES + part
            wih[m] = w_ih[layer, (row // U) * H + j0 + row % U, k] if (layer > 0 and live and k < H) else ZERO
        cuda.syncthreads()
        for s in range(T + L - 1):
            t = s - layer
            if 0 <= t < T:  # the same for the whole block
                for b in range(B):
                    for k in range(tid, H, THREADS):
                        shared[HS + k] = h[layer, b, k] if t == 0 else y[layer, t - 1, b, k]
                        if layer > 0:
                            shared[XS + k] = y[layer - 1, t, b, k]
                    cuda.syncthreads()
                    acc = ZERO
                    if row < R:
                        for m in range(KPT):
                            k = m * SLICES + part
                            if k < H:
                                acc += shared[row * PITCH + k] * shared[HS + k] + wih[m] * shared[XS + k]
                    step = SLICES // 2
                    while step > 0:  # a row's SLICES threads are neighbouring lanes
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, step)
                        step //= 2
                    if part == 0 and row < R:
                        shared[ZS + row] = acc
                    cuda.syncthreads()
                    if tid < U and j0 + tid < H:  # the cell: a thread per unit
                        j = j0 + tid
                        zi = shared[ZS + tid] + bias[layer, j]
                        zf = shared[ZS + U + tid] + bias[layer, H + j]
                        zg = shared[ZS + 2 * U + tid] + bias[layer, 2 * H + j]
                        zo = shared[ZS + 3 * U + tid] + bias[layer, 3 * H + j]
                        if layer == 0:
                            zi += x_terms[t, b, j]
                            zf += x_terms[t, b, H + j]
                            zg += x_terms[t, b, 2 * H + j]
                            zo += x_terms[t, b, 3 * H + j]
                        cell = sigmoid(zf) * c[layer, b, j] + sigmoid(zi) * math.tanh(zg)
                        c[layer, b, j] = cell
                        y[layer, t, b, j] = sigmoid(zo) * math.tanh(cell)
                    cuda.syncthreads()  # shared h, x and sums are refilled for the next batch row
            grid.sync()  # every h_t of this wavefront step written before the next one reads it
        for n in range(tid, U * B, THREADS):  # h_n: the units this block owns, written by it
            u, b = n // B, n % B
            if j0 + u < H:
                h[layer, b, j0 + u] = y[layer, T - 1, b, j0 + u]

    return wavefront_kernel


class WavefrontLSTM(FusedLSTM):
    """Step 2's input GEMM for the first layer, then one cooperative launch for every layer and step."""

    def __init__(self, weights, blocks=None):
        super().__init__(weights)
        L, H = self.layers, self.hidden
        w_ih = np.zeros((L, 4 * H, H), np.float32)  # layer 0's slot unused: its input is the hoisted GEMM's
        for layer in range(1, L):
            w_ih[layer] = weights[layer]["w_ih"]
        self.w_ih_all = cuda.to_device(w_ih)
        self.w_hh_all = cuda.to_device(np.stack([w["w_hh"] for w in weights]))
        self.bias_all = cuda.to_device(np.stack([w["b_ih"] + w["b_hh"] for w in weights]))
        resident = sm_count() if blocks is None else blocks  # one block an SM
        if resident < L:
            raise ValueError(f"{L} layers need at least {L} blocks, one a layer; {resident} given")
        self.units = -(-H // (resident // L))
        self.blocks = L * -(-H // self.units)
        self.threads, _ = block_shape(H, self.units)
        self.shared_bytes = 4 * shared_words(self.units, H)
        if 4 * self.units > MAX_THREADS or self.shared_bytes > SHARED_LIMIT:
            raise ValueError(f"hidden size {H} over {self.blocks // L} blocks a layer gives each block {self.units} "
                             f"units: {4 * self.units} weight rows (at most {MAX_THREADS}, a thread each) and "
                             f"{self.shared_bytes} bytes of shared memory (at most {SHARED_LIMIT}): use "
                             "PersistentLSTM, or more blocks")
        self.kernel = make_wavefront_kernel(H, self.units, L)

    def _layers(self, x, h_n, c_n, stream):
        T, B, _ = x.shape
        x_terms = self.input_terms(0, x, stream)
        y = self._buffer("y, every layer", (self.layers, T, B, self.hidden), stream)
        args = (x_terms, self.w_ih_all, self.w_hh_all, self.bias_all, h_n, c_n, y)
        if ON_GPU:
            allow_shared_memory(self.kernel.compile(tuple(numba.typeof(a) for a in args)), self.shared_bytes)
        limit = cooperative_limit(self.kernel, args, self.threads, self.shared_bytes)
        if self.blocks > limit:
            raise ValueError(f"{self.blocks} blocks of {self.threads} threads and {self.shared_bytes} bytes of shared "
                             f"memory cannot all be resident at once (at most {limit}): a grid barrier would hang")
        self.kernel[self.blocks, self.threads, stream, self.shared_bytes](*args)
        return y[self.layers - 1]
