"""Step 4, after Baidu's Persistent RNNs: one launch per layer for the whole sequence. Each block
owns a few hidden units (all four gates of each), loads their rows of W_hh into shared memory once,
and keeps them there for every time step; the blocks meet at a grid-wide barrier after each step,
when every h_t is written and the next step may read it. W_hh is read from DRAM once per sequence
instead of once per step, and a step costs one barrier instead of two launches.

A grid barrier needs every block resident at once: numba launches a kernel that calls
`cuda.cg.this_grid()` cooperatively, and the grid may not exceed what
`max_cooperative_grid_blocks` allows (one block per SM here). The input term of every step is
still step 2's big GEMM, before the launch."""


import numpy as np
from numba import cuda, float32

from workbook import ON_GPU
from workbook.inputs import sm_count
from workbook.launch import cdiv, cooperative_launch

from .fused import FusedLSTM
from .layer import lstm_cell

THREADS = 256 if ON_GPU else 64
CHUNK = 4  # batch rows a block's warps multiply together (their h rows staged in shared memory)
SHARED_LIMIT = 48 * 1024  # a block's static + dynamic shared memory without an opt-in


def shared_words(units, hidden):
    """float32 words of a block's shared memory: its weight rows, a chunk of h, its gate sums."""
    return 4 * units * hidden + CHUNK * hidden + 4 * units * CHUNK


@cuda.jit
def persistent_layer_kernel(x_terms, w_hh, bias, h, c, y, units):
    """A whole layer: y[t] = h_t for t < T. x_terms (T, B, 4H): the input GEMM's terms; w_hh (4H, H);
    bias (4H,); h, c (B, H): the initial state, left holding the last. Block k owns hidden units
    k*units .. k*units + units - 1."""
    T, B, H = y.shape
    grid = cuda.cg.this_grid()
    shared = cuda.shared.array(0, dtype=float32)
    w_s = shared[:4 * units * H]  # row r = gate * units + u: w_hh[gate*H + j0 + u, :]
    h_s = shared[4 * units * H:4 * units * H + CHUNK * H]  # h_{t-1}[b0 + bb, :]
    z_s = shared[4 * units * H + CHUNK * H:]  # the recurrent sums, z_s[r * CHUNK + bb]
    tid, threads = cuda.threadIdx.x, cuda.blockDim.x
    warp, lane, warps = tid // 32, tid % 32, threads // 32
    j0 = cuda.blockIdx.x * units
    for n in range(tid, 4 * units * H, threads):  # once per sequence: this block's rows of W_hh
        r, k = n // H, n % H
        j = j0 + r % units
        w_s[n] = w_hh[(r // units) * H + j, k] if j < H else float32(0.0)
    cuda.syncthreads()
    for t in range(T):
        for b0 in range(0, B, CHUNK):
            rows = min(CHUNK, B - b0)
            for n in range(tid, rows * H, threads):
                b, k = b0 + n // H, n % H
                h_s[n] = h[b, k] if t == 0 else y[t - 1, b, k]
            cuda.syncthreads()
            for r in range(warp, 4 * units, warps):  # a warp per weight row, all the chunk's rows at once
                acc = cuda.local.array(CHUNK, float32)
                for bb in range(CHUNK):
                    acc[bb] = 0
                for k in range(lane, H, 32):
                    w = w_s[r * H + k]
                    for bb in range(CHUNK):
                        acc[bb] += w * h_s[bb * H + k]  # rows past the batch hold stale h: never stored
                for bb in range(CHUNK):
                    if bb < rows:  # the same for the whole warp: no divergence
                        v = acc[bb]
                        step = 16
                        while step > 0:
                            v += cuda.shfl_xor_sync(0xFFFFFFFF, v, step)
                            step >>= 1
                        if lane == 0:
                            z_s[r * CHUNK + bb] = v
            cuda.syncthreads()
            for n in range(tid, units * rows, threads):  # the cell, a thread per (unit, batch row)
                u, bb = n // rows, n % rows
                j, b = j0 + u, b0 + bb
                if j < H:
                    c[b, j], y[t, b, j] = lstm_cell(
                        z_s[u * CHUNK + bb] + x_terms[t, b, j] + bias[j],
                        z_s[(units + u) * CHUNK + bb] + x_terms[t, b, H + j] + bias[H + j],
                        z_s[(2 * units + u) * CHUNK + bb] + x_terms[t, b, 2 * H + j] + bias[2 * H + j],
                        z_s[(3 * units + u) * CHUNK + bb] + x_terms[t, b, 3 * H + j] + bias[3 * H + j], c[b, j])
            cuda.syncthreads()  # h_s and z_s are refilled by the next chunk
        grid.sync()  # every h_t written before any block reads it as h_{t-1}
    for n in range(tid, units * B, threads):  # h_n: the units this block owns, written by it
        u, b = n // B, n % B
        if j0 + u < H:
            h[b, j0 + u] = y[T - 1, b, j0 + u]


class PersistentLSTM(FusedLSTM):
    """Step 2's input GEMM, then one cooperative launch per layer for the whole sequence."""

    def __init__(self, weights, blocks=None):
        super().__init__(weights)
        self.w_hh = [cuda.to_device(w["w_hh"]) for w in weights]
        H = self.hidden
        resident = sm_count() if blocks is None else blocks  # one block an SM: 8 warps, ~40 KB
        self.units = cdiv(H, resident)
        self.blocks = cdiv(H, self.units)
        self.shared_bytes = 4 * shared_words(self.units, H)
        if self.shared_bytes > SHARED_LIMIT:
            raise ValueError(f"hidden size {H} over {self.blocks} blocks puts {self.units} units' weights "
                             f"({self.shared_bytes} bytes with the h chunk) in each block's shared memory, "
                             f"over {SHARED_LIMIT}: use FusedLSTM, or more blocks")

    def _layer(self, layer, x, h, c, y, stream):
        x_terms = self.input_terms(layer, x, stream)
        args = (x_terms, self.w_hh[layer], self.bias[layer], h, c, y, np.int32(self.units))
        cooperative_launch(persistent_layer_kernel, self.blocks, THREADS, self.shared_bytes, stream, *args)
