"""Step 2, after NVIDIA's "Optimizing Recurrent Neural Networks in cuDNN 5": the four gates as one
GEMM (W_hh stacked, (H, 4H) once transposed), the input term of *every* time step as one big GEMM
before the loop ((T*B, I) @ (I, 4H): it depends on no h, so nothing waits for it), and one fused
kernel for the cell (the three sums, the four activations, c and h in one pass). Two launches a
step a layer instead of 14, and the big GEMM keeps the GPU busy where 512 small ones did not."""


import numpy as np
from numba import cuda

from chapters.ch04_implicit_gemm.kernels import gemm
from workbook import ON_GPU
from workbook.timeline import span

from .layer import LSTM, lstm_cell

THREADS = 256
# the hoisted GEMM's tile: chapter 04's fastest on (T*B, I) x (I, 4H) on the H100 at the chapter's
# sizes (`python chapters/ch10_lstm/probes/lstm_probe.py gemm` times each searched tile; EXPERIMENTS.md has the figures)
INPUT_TILE = "128x128 wide, 16x8/thread, BK=16" if ON_GPU else None


@cuda.jit
def fused_cell_kernel(x_terms, h_terms, bias, c, h):
    """One step of the cell, a thread per (b, j): the gates from x_terms (B, 4H) (the hoisted input
    GEMM's rows of this step) + h_terms (B, 4H) + bias (4H,); c (B, H) updated in place, h (B, H)
    written."""
    B, H = c.shape
    for n in range(cuda.grid(1), B * H, cuda.gridsize(1)):
        b, j = n // H, n % H
        c[b, j], h[b, j] = lstm_cell(x_terms[b, j] + h_terms[b, j] + bias[j],
                                     x_terms[b, H + j] + h_terms[b, H + j] + bias[H + j],
                                     x_terms[b, 2 * H + j] + h_terms[b, 2 * H + j] + bias[2 * H + j],
                                     x_terms[b, 3 * H + j] + h_terms[b, 3 * H + j] + bias[3 * H + j], c[b, j])


class FusedLSTM(LSTM):
    """The input projection hoisted out of the time loop, one recurrent GEMM and one fused cell per step."""

    def __init__(self, weights):
        super().__init__(weights)
        self.w_ih_t = [cuda.to_device(np.ascontiguousarray(w["w_ih"].T)) for w in weights]  # (I, 4H)
        self.w_hh_t = [cuda.to_device(np.ascontiguousarray(w["w_hh"].T)) for w in weights]  # (H, 4H)

    def input_terms(self, layer, x, stream=0):
        """x_t @ W_ih^T for every t at once: (T*B, I) @ (I, 4H), viewed as (T, B, 4H)."""
        T, B, I = x.shape
        terms = self._buffer("x terms", (T, B, 4 * self.hidden), stream)
        gemm(x.reshape(T * B, I), self.w_ih_t[layer], terms.reshape(T * B, 4 * self.hidden), tile=INPUT_TILE,
             stream=stream)
        return terms

    def _layer(self, layer, x, h, c, y, stream):
        T, B, _ = x.shape
        with span(f"layer {layer}: input GEMM"):
            x_terms = self.input_terms(layer, x, stream)
        h_terms = self._buffer("h terms", (B, 4 * self.hidden), stream)
        blocks = min(-(-B * self.hidden // THREADS), 1024)
        x_steps, ys = self._steps(x_terms), self._steps(y)
        for t in range(T):
            with span(f"step {t}"):
                # splits=1: one launch (stream-K, the wrapper's choice for so few rows, adds a zeroing one)
                gemm(h if t == 0 else ys[t - 1], self.w_hh_t[layer], h_terms, splits=1, stream=stream)
                fused_cell_kernel[blocks, THREADS, stream](x_steps[t], h_terms, self.bias[layer], c, ys[t])
        h.copy_to_device(y[T - 1], stream=stream)

    def warm_ups(self, x):
        """The launches of a forward on x (T, B, I), each on its own: for bench.warm_up to compile
        their kernels side by side (a forward compiles each when it comes to it). Buffers of their
        own: a forward may run beside them."""
        T, B, I = x.shape
        H = self.hidden
        h, c = (self._buffer(f"warm-up {name}", (B, H), 0) for name in ("h", "c"))
        h_terms = self._buffer("warm-up h terms", (B, 4 * H), 0)
        x_terms = self._buffer("warm-up x terms", (T, B, 4 * H), 0)
        blocks = min(-(-B * H // THREADS), 1024)
        return [lambda: gemm(x.reshape(T * B, I), self.w_ih_t[0], x_terms.reshape(T * B, 4 * H), tile=INPUT_TILE),
                lambda: gemm(h, self.w_hh_t[0], h_terms, splits=1),
                lambda: fused_cell_kernel[blocks, THREADS, 0](x_terms[0], h_terms, self.bias[0], c, h)]
