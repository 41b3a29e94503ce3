"""What every LSTM variant of chapter 10 shares: its weights on the GPU, its inputs checked, its
outputs, and the gate functions the kernels call. Each variant (naive.py, fused.py, persistent.py)
subclasses LSTM and writes `_layer`: one layer over the whole sequence (wavefront.py writes
`_layers`: all of them at once)."""

import math

import numpy as np
from numba import cuda, float32

from workbook.inputs import require
from workbook.launch import cdiv

ONE = float32(1.0)


@cuda.jit(device=True, forceinline=True)
def sigmoid(z):
    return ONE / (ONE + math.exp(-z))


@cuda.jit(device=True, forceinline=True)
def lstm_cell(z_i, z_f, z_g, z_o, c_old):
    """The cell, from its four gates' sums (torch's order: input, forget, cell, output) and the old
    c: returns (c, h), c = sigmoid(f) * c_old + sigmoid(i) * tanh(g), h = sigmoid(o) * tanh(c).
    Every kernel of the chapter ends its step here; they differ in where the sums come from."""
    c = sigmoid(z_f) * c_old + sigmoid(z_i) * math.tanh(z_g)
    return c, sigmoid(z_o) * math.tanh(c)


@cuda.jit
def zero_kernel(a):
    """a[:] = 0 on the stream (numba's `a[:] = 0` waits for the GPU: a timed call would then time the host)."""
    for i in range(cuda.grid(1), a.size, cuda.gridsize(1)):
        a[i] = 0


class LSTM:
    """A stack of LSTM layers on the GPU. weights: reference.init_lstm's list (float32, host)."""

    def __init__(self, weights):
        if not weights:
            raise ValueError("an LSTM needs at least one layer")
        self.hidden = weights[0]["w_hh"].shape[1]
        self.input_size = weights[0]["w_ih"].shape[1]
        self.layers = len(weights)
        for number, w in enumerate(weights):
            fan_in = self.input_size if number == 0 else self.hidden
            expected = {"w_ih": (4 * self.hidden, fan_in), "w_hh": (4 * self.hidden, self.hidden),
                        "b_ih": (4 * self.hidden,), "b_hh": (4 * self.hidden,)}
            for name, shape in expected.items():
                require(w[name], f"layer {number} {name}", dtype=np.float32, shape=shape, device=False)
        self.bias = [cuda.to_device(w["b_ih"] + w["b_hh"]) for w in weights]
        self._workspaces = {}
        self._views = {}

    def __call__(self, x, h0=None, c0=None, stream=0):
        """(y, h_n, c_n) for x (T, B, I) on the GPU; h0, c0 (L, B, H) or None (zeros)."""
        x = require(x, "x", dtype=np.float32, ndim=3)
        T, B, I = x.shape
        if I != self.input_size:
            raise ValueError(f"x has {I} features per step, the first layer takes {self.input_size}")
        if T == 0 or B == 0:
            raise ValueError(f"x of shape {tuple(x.shape)} has no steps or no batch")
        state_shape = (self.layers, B, self.hidden)
        h_n, c_n = self._buffer("h_n", state_shape, stream), self._buffer("c_n", state_shape, stream)
        for name, given, out in (("h0", h0, h_n), ("c0", c0, c_n)):
            if given is None:  # zeros; each layer reads its slice, then overwrites it
                zero_kernel[cdiv(out.size, 256), 256, stream](out.reshape(-1))
            else:
                out.copy_to_device(require(given, name, dtype=np.float32, shape=state_shape), stream=stream)
        return self._layers(x, h_n, c_n, stream), h_n, c_n

    def _layers(self, x, h_n, c_n, stream):
        """Every layer, one after the other; returns the last one's outputs (T, B, H)."""
        T, B, _ = x.shape
        sequence = x
        for layer in range(self.layers):
            y = self._buffer(f"y{layer % 2}", (T, B, self.hidden), stream)
            self._layer(layer, sequence, h_n[layer], c_n[layer], y, stream)
            sequence = y
        return sequence

    def _buffer(self, name, shape, stream):
        """A device array kept between calls of the same shapes (two y buffers, each layer's input
        the previous one's output)."""
        key = (name, shape)
        if key not in self._workspaces:
            self._workspaces[key] = cuda.device_array(shape, np.float32, stream=stream)
        return self._workspaces[key]

    def _steps(self, sequence):
        """[sequence[t] for every t]: the steps of a (T, ...) device array as views. numba takes
        tens of microseconds of host time to make a view, as long as a launch: the views of our own
        buffers are made once and kept with them, those of an input at every call."""
        kept = self._views.get(id(sequence))
        if kept is not None and kept[0] is sequence:
            return kept[1]
        views = [sequence[t] for t in range(sequence.shape[0])]
        if any(sequence is buffer for buffer in self._workspaces.values()):
            self._views[id(sequence)] = (sequence, views)
        return views

    def _layer(self, layer, x, h, c, y, stream):
        """One layer over the sequence: y[t] = h_t; h and c (B, H) hold the initial state and are
        left holding the last one."""
        raise NotImplementedError
