"""Naive: the LSTM as "Learn CUDA Programming" writes it with cuBLAS, made correct. At every time
step, for every gate, one GEMM for the input term and one for the recurrent term, then element-wise
kernels: each gate's sum and activation, the cell state, the hidden state. 14 launches a step a
layer, each small (B x H), and the input term recomputed step by step although it depends on no
earlier step. The book's own emulation wrote past its buffers and never fed h back; here h_{t-1} is
the previous step's output and c is carried in place."""

import math

import numpy as np
from numba import cuda

from chapters.ch04_implicit_gemm.kernels import gemm

from .layer import LSTM, sigmoid

THREADS = 256
GATES = ("i", "f", "g", "o")


@cuda.jit
def gate_kernel(x_term, h_term, bias, tanh_gate, out):
    """out = act(x_term + h_term + bias), act = tanh for the cell gate g, else sigmoid; all (B, H)
    but bias (H,)."""
    B, H = out.shape
    for n in range(cuda.grid(1), B * H, cuda.gridsize(1)):
        b, j = n // H, n % H
        z = x_term[b, j] + h_term[b, j] + bias[j]
        out[b, j] = math.tanh(z) if tanh_gate else sigmoid(z)


@cuda.jit
def cell_kernel(i, f, g, c):
    """c = f * c + i * g, in place."""
    B, H = c.shape
    for n in range(cuda.grid(1), B * H, cuda.gridsize(1)):
        b, j = n // H, n % H
        c[b, j] = f[b, j] * c[b, j] + i[b, j] * g[b, j]


@cuda.jit
def hidden_kernel(o, c, h):
    """h = o * tanh(c)."""
    B, H = h.shape
    for n in range(cuda.grid(1), B * H, cuda.gridsize(1)):
        b, j = n // H, n % H
        h[b, j] = o[b, j] * math.tanh(c[b, j])


class NaiveLSTM(LSTM):
    """Per step and gate: x_t @ W_ih[gate]^T and h_{t-1} @ W_hh[gate]^T (chapter 04's GEMM), then
    the element-wise kernels."""

    def __init__(self, weights):
        super().__init__(weights)
        H = self.hidden
        # per gate, transposed for gemm's c = a @ b: W_ih[gate]^T (I, H), W_hh[gate]^T (H, H)
        self.w_ih = [[cuda.to_device(np.ascontiguousarray(w["w_ih"][q * H:(q + 1) * H].T)) for q in range(4)]
                     for w in weights]
        self.w_hh = [[cuda.to_device(np.ascontiguousarray(w["w_hh"][q * H:(q + 1) * H].T)) for q in range(4)]
                     for w in weights]
        self.gate_bias = [[bias[q * H:(q + 1) * H] for q in range(4)] for bias in self.bias]

    def _layer(self, layer, x, h, c, y, stream):
        T, B, _ = x.shape
        H = self.hidden
        x_term = [self._buffer(f"x term {q}", (B, H), stream) for q in GATES]
        h_term = [self._buffer(f"h term {q}", (B, H), stream) for q in GATES]
        act = [self._buffer(f"gate {q}", (B, H), stream) for q in GATES]
        blocks = min(-(-B * H // THREADS), 1024)
        xs, ys = self._steps(x), self._steps(y)
        for t in range(T):
            h_prev = h if t == 0 else ys[t - 1]
            for q in range(4):
                gemm(xs[t], self.w_ih[layer][q], x_term[q], stream=stream)
                gemm(h_prev, self.w_hh[layer][q], h_term[q], stream=stream)
                gate_kernel[blocks, THREADS, stream](x_term[q], h_term[q], self.gate_bias[layer][q], q == 2, act[q])
            cell_kernel[blocks, THREADS, stream](act[0], act[1], act[2], c)
            hidden_kernel[blocks, THREADS, stream](act[3], c, ys[t])
        h.copy_to_device(y[T - 1], stream=stream)

    def warm_ups(self, batch):
        """The launches of a step, each on its own, on buffers of this batch: for bench.warm_up to
        compile their kernels side by side, where a forward, a chain of launches, compiles each one
        when it comes to it. Buffers of their own: a forward may run beside them."""
        H = self.hidden
        x_t, h, c, x_term, h_term, act = (self._buffer(f"warm-up {name}", (batch, size), 0) for name, size in (
            ("x", self.input_size), ("h", H), ("c", H), ("x term", H), ("h term", H), ("gate", H)))
        blocks = min(-(-batch * H // THREADS), 1024)
        return [lambda: gemm(x_t, self.w_ih[0][0], x_term), lambda: gemm(h, self.w_hh[0][0], h_term),
                lambda: gate_kernel[blocks, THREADS, 0](x_term, h_term, self.gate_bias[0][0], False, act),
                lambda: cell_kernel[blocks, THREADS, 0](act, act, act, c),
                lambda: hidden_kernel[blocks, THREADS, 0](act, c, h)]
