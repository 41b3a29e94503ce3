"""Naive, after spconv 1.x: gather, GEMM, scatter, one tap at a time.

For tap k the rulebook lists n_k pairs (input j, output i). The input rows are gathered into a
dense (n_k, C) buffer, multiplied by w[k] (C, K) with chapter 04's GEMM, and the (n_k, K) result
is added into the output rows. Three launches a tap, 81 for a 3x3x3 layer, and every pair's
features go through global memory three extra times: gathered (written, then read by the GEMM),
its product written and read again by the scatter. Within one tap no output appears twice (an
offset maps each input to one output), so the scatter's adds need no atomics; the taps run one
after the other on one stream, so they never race either."""

import numpy as np
from numba import cuda

from workbook.launch import cdiv

from chapters.ch04_implicit_gemm.kernels import gemm

from .maps import check_layer
from .reference import TAPS

THREADS = 256


@cuda.jit
def gather_kernel(x, rows, n, gathered):
    """gathered[p, :] = x[rows[p], :] for p < n: a thread per value, a row's values side by side."""
    C = x.shape[1]
    for at in range(cuda.grid(1), n * C, cuda.gridsize(1)):
        p, c = at // C, at % C
        gathered[p, c] = x[rows[p], c]


@cuda.jit
def scatter_add_kernel(products, rows, n, out):
    """out[rows[p], :] += products[p, :] for p < n (rows distinct within a tap)."""
    K = out.shape[1]
    for at in range(cuda.grid(1), n * K, cuda.gridsize(1)):
        p, c = at // K, at % K
        out[rows[p], c] += products[p, c]


@cuda.jit
def zero_kernel(out):
    """out[:] = 0 on the stream."""
    K = out.shape[1]
    for at in range(cuda.grid(1), out.shape[0] * K, cuda.gridsize(1)):
        out[at // K, at % K] = 0


def _grid(values):
    return min(4096, max(1, cdiv(values, THREADS)))


class GatherGemmScatter:
    """The submanifold convolution through a rulebook (maps.rulebook): out = conv(x, w)."""

    def __init__(self, rules, channels, out_channels, stream=0):
        self.rules = rules
        self.C, self.K = channels, out_channels
        largest = max(1, int(rules.counts.max()))
        self.gathered = cuda.device_array((largest, channels), np.float32, stream=stream)
        self.products = cuda.device_array((largest, out_channels), np.float32, stream=stream)

    def __call__(self, x, w, out, stream=0):
        """x (N, C), w (27, C, K), out (N, K): float32 device arrays."""
        x, w, out = check_layer(x, w, out, self.rules.inputs, self.rules.rule_in.shape[1])
        zero_kernel[_grid(out.size), THREADS, stream](out)
        for k in range(TAPS):
            n = int(self.rules.counts[k])
            if n == 0:  # a tap no site has: nothing to do (and a GEMM of no rows is refused)
                continue
            gather_kernel[_grid(n * self.C), THREADS, stream](x, self.rules.rule_in[k], n, self.gathered)
            gemm(self.gathered[:n], w[k], self.products[:n], splits=1, stream=stream)
            scatter_add_kernel[_grid(n * self.K), THREADS, stream](self.products, self.rules.rule_out[k], n, out)
        return out
