"""Step 5 (not yet in the chapter: measured on no GPU so far, see EXPERIMENTS.md): every layer in
one persistent kernel, in a wavefront, after Baidu's persistent RNNs.

At wavefront step s, layer l works on time step t = s - l: layer l+1 multiplies layer l's h_t while
layer l is on h_{t+1}. The layers run side by side on blocks of their own, and a forward takes
T + L - 1 grid barriers instead of T * L. Each block owns `units` hidden units of one layer, their
four gates' rows (64 rows at H = 512 over 32 blocks a layer), and keeps both of its weight
matrices on chip for the whole sequence:
- W_hh in shared memory (128 KB a block, rows padded: past the 48 KB a kernel gets without asking,
  so the launch asks);
- W_ih (layers past the first; the first one's input term is step 2's hoisted GEMM): a row's
  SLICES neighbouring threads each take every SLICES-th value of it, 64 floats a thread, of which
  the first KR stay in registers and the rest in the shared memory W_hh leaves. Registers hold
  them only if the loops over them are unrolled (sizes known when the kernel is made:
  make_wavefront_kernel) and nothing saves them to the stack: the barrier between wavefront steps
  is a counter the blocks add to, not numba's grid.sync(), a call into the device runtime around
  which every live register is saved; indices are unsigned, so that each address is a base and a
  constant offset (numba tests a signed index for wrap-around).
The launch is still cooperative (the kernel calls cuda.cg.this_grid()), so the grid is resident."""

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
W_IH_REGISTERS = 24  # W_ih values a thread keeps in registers; the rest of its share in shared memory


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
    threads, slices = block_shape(hidden, units)
    kpt = -(-hidden // slices)
    return 4 * units * (hidden + 1) + 2 * hidden + 4 * units + (kpt - min(kpt, W_IH_REGISTERS)) * threads


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
    KR = min(KPT, W_IH_REGISTERS)
    WS = ZS + R  # the shared W_ih: value m >= KR of thread tid at WS + (m - KR) * THREADS + tid
    EXACT = H % SLICES == 0  # every k = m * SLICES + part is below H: no guard
    # a block of THREADS must fit an SM: at most 65536 / THREADS registers a thread (128 at 512)
    options = {"launch_bounds": (THREADS, 1)} if ON_GPU else {}

    @cuda.jit(**options)
    def wavefront_kernel(x_terms, w_ih, w_hh, bias, h, c, y, T, B, arrived):
        """Flat float32 arrays, every index an unsigned 64-bit integer from compile-time sizes."""
        u64 = numba.uint64
        T, B = u64(T), u64(B)
        cuda.cg.this_grid()  # unused but for this: numba launches the kernel cooperatively (all blocks resident)
        shared = cuda.shared.array(0, dtype=float32)
        tid = u64(cuda.threadIdx.x)
        row, part = tid // u64(SLICES), tid % u64(SLICES)
        per_layer = u64(cuda.gridDim.x) // u64(L)
        layer = u64(cuda.blockIdx.x) // per_layer
        j0 = (u64(cuda.blockIdx.x) % per_layer) * u64(U)
        live = row < u64(R) and j0 + row % u64(U) < u64(H)
        for n in range(tid, u64(R * H), u64(THREADS)):
            r, k = n // u64(H), n % u64(H)
            src = (layer * u64(4 * H) + (r // u64(U)) * u64(H) + j0 + r % u64(U)) * u64(H) + k
            shared[r * u64(PITCH) + k] = w_hh[src] if j0 + r % u64(U) < u64(H) else ZERO
        for k in range(tid, u64(H), u64(THREADS)):
            shared[u64(XS) + k] = ZERO
        wih = cuda.local.array(KR, float32)
        w_from = (layer * u64(4 * H) + (row // u64(U)) * u64(H) + j0 + row % u64(U)) * u64(H) + part
        for m in range(KPT):
            value = w_ih[w_from + u64(m * SLICES)] if (layer > u64(0) and live and (EXACT or m * SLICES + part < H)) else ZERO
            if m < KR:
                wih[m] = value
            else:
                shared[u64(WS + (m - KR) * THREADS) + tid] = value
        cuda.syncthreads()
        w_at, h_at, x_at = row * u64(PITCH) + part, u64(HS) + part, u64(XS) + part
        for s in range(T + u64(L - 1)):
            if s >= layer and s - layer < T:
                t = s - layer
                for b in range(B):
                    for k in range(tid, u64(H), u64(THREADS)):
                        shared[u64(HS) + k] = h[(layer * B + b) * u64(H) + k] if t == u64(0) else \
                            y[((layer * T + t - u64(1)) * B + b) * u64(H) + k]
                        if layer > u64(0):
                            shared[u64(XS) + k] = y[(((layer - u64(1)) * T + t) * B + b) * u64(H) + k]
                    cuda.syncthreads()
                    acc = ZERO
                    if row < u64(R):
                        for m in range(KR):
                            if EXACT or m * SLICES + part < H:
                                step_k = u64(m * SLICES)
                                acc += shared[w_at + step_k] * shared[h_at + step_k] + wih[m] * shared[x_at + step_k]
                        for m in range(KR, KPT):
                            if EXACT or m * SLICES + part < H:
                                step_k = u64(m * SLICES)
                                acc += shared[w_at + step_k] * shared[h_at + step_k] + \
                                    shared[u64(WS + (m - KR) * THREADS) + tid] * shared[x_at + step_k]
                    step = SLICES // 2
                    while step > 0:
                        acc += cuda.shfl_xor_sync(0xFFFFFFFF, acc, step)
                        step //= 2
                    if part == u64(0) and row < u64(R):
                        shared[u64(ZS) + row] = acc
                    cuda.syncthreads()
                    if tid < u64(U) and j0 + tid < u64(H):
                        j = j0 + tid
                        zi = shared[u64(ZS) + tid] + bias[layer * u64(4 * H) + j]
                        zf = shared[u64(ZS + U) + tid] + bias[layer * u64(4 * H) + u64(H) + j]
                        zg = shared[u64(ZS + 2 * U) + tid] + bias[layer * u64(4 * H) + u64(2 * H) + j]
                        zo = shared[u64(ZS + 3 * U) + tid] + bias[layer * u64(4 * H) + u64(3 * H) + j]
                        if layer == u64(0):
                            at = (t * B + b) * u64(4 * H) + j
                            zi += x_terms[at]
                            zf += x_terms[at + u64(H)]
                            zg += x_terms[at + u64(2 * H)]
                            zo += x_terms[at + u64(3 * H)]
                        state = (layer * B + b) * u64(H) + j
                        cell = sigmoid(zf) * c[state] + sigmoid(zi) * math.tanh(zg)
                        c[state] = cell
                        y[((layer * T + t) * B + b) * u64(H) + j] = sigmoid(zo) * math.tanh(cell)
                    cuda.syncthreads()
            cuda.syncthreads()  # a grid barrier without a call: a counter every block adds 1 to
            if tid == u64(0):
                cuda.threadfence()
                cuda.atomic.add(arrived, 0, 1)
                target = (s + u64(1)) * u64(cuda.gridDim.x)
                while u64(cuda.atomic.add(arrived, 0, 0)) < target:
                    pass
                cuda.threadfence()
            cuda.syncthreads()
        for n in range(tid, u64(U) * B, u64(THREADS)):
            u, b = n // B, n % B
            if j0 + u < u64(H):
                h[(layer * B + b) * u64(H) + j0 + u] = y[((layer * T + T - u64(1)) * B + b) * u64(H) + j0 + u]

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
        if not hasattr(self, "arrived"):
            self.arrived = cuda.to_device(np.zeros(1, np.uint64))
        self.arrived.copy_to_device(np.zeros(1, np.uint64), stream=stream)  # the barrier's counter starts at 0
        args = (x_terms.reshape(-1), self.w_ih_all.reshape(-1), self.w_hh_all.reshape(-1), self.bias_all.reshape(-1),
                h_n.reshape(-1), c_n.reshape(-1), y.reshape(-1), np.int64(T), np.int64(B), self.arrived)
        if ON_GPU:
            allow_shared_memory(self.kernel.compile(tuple(numba.typeof(a) for a in args)), self.shared_bytes)
        limit = cooperative_limit(self.kernel, args, self.threads, self.shared_bytes)
        if self.blocks > limit:
            raise ValueError(f"{self.blocks} blocks of {self.threads} threads and {self.shared_bytes} bytes of shared "
                             f"memory cannot all be resident at once (at most {limit}): a grid barrier would hang")
        self.kernel[self.blocks, self.threads, stream, self.shared_bytes](*args)
        return y[self.layers - 1]
