"""Chapter 10's NumPy LSTM (float64) and the weights every variant shares.

One layer, torch's gate order (input i, forget f, cell g, output o), for each time step t:

    z = x_t @ W_ih^T + h_{t-1} @ W_hh^T + b_ih + b_hh         (B, 4H): the four gates side by side
    i, f, o = sigmoid(z[:, 0:H]), sigmoid(z[:, H:2H]), sigmoid(z[:, 3H:4H]);   g = tanh(z[:, 2H:3H])
    c_t = f * c_{t-1} + i * g;     h_t = o * tanh(c_t)

A stack of layers feeds each layer's h sequence to the next as its x. Shapes, as torch.nn.LSTM's:
x (T, B, I), W_ih (4H, I) (I = H past the first layer), W_hh (4H, H), b_ih and b_hh (4H,);
outputs y (T, B, H) (the last layer's h at every step), h_n and c_n (L, B, H).
"""

import math

import numpy as np


def init_lstm(input_size, hidden, layers, seed=0):
    """Weights as torch.nn.LSTM draws them: uniform in +-1/sqrt(hidden); a list of per-layer dicts
    of float32 arrays (w_ih, w_hh, b_ih, b_hh)."""
    rng = np.random.default_rng(seed)
    bound = 1 / math.sqrt(hidden)
    weights = []
    for layer in range(layers):
        fan_in = input_size if layer == 0 else hidden
        shapes = {"w_ih": (4 * hidden, fan_in), "w_hh": (4 * hidden, hidden), "b_ih": (4 * hidden,),
                  "b_hh": (4 * hidden,)}
        weights.append({name: rng.uniform(-bound, bound, shape).astype(np.float32) for name, shape in shapes.items()})
    return weights


def sigmoid(z):
    return 1 / (1 + np.exp(-z))


def half(a):
    """a rounded to FP16 (nearest, ties to even), kept in float64."""
    return np.asarray(a).astype(np.float16).astype(np.float64)


def lstm_reference(x, weights, h0=None, c0=None, fp16=False):
    """(y, h_n, c_n) in float64 for x (T, B, I) and init_lstm's weights; h0, c0 (L, B, H) or zeros.
    fp16=True: what the FP16 kernel (half.py) multiplies, exactly: W_hh and h_{t-1}, and past the
    first layer W_ih and x_t, rounded to FP16 first; the first layer's input term, the sums and the
    cell stay exact."""
    x = np.asarray(x, np.float64)
    T, B, _ = x.shape
    L, H = len(weights), weights[0]["w_hh"].shape[1]
    h0 = np.zeros((L, B, H)) if h0 is None else np.asarray(h0, np.float64)
    c0 = np.zeros((L, B, H)) if c0 is None else np.asarray(c0, np.float64)
    h_n, c_n = np.empty((L, B, H)), np.empty((L, B, H))
    sequence = x
    for layer, w in enumerate(weights):
        w_ih, w_hh = w["w_ih"].astype(np.float64), w["w_hh"].astype(np.float64)
        to_x = half if fp16 and layer > 0 else np.asarray
        to_h = half if fp16 else np.asarray
        w_ih, w_hh = to_x(w_ih), to_h(w_hh)
        bias = w["b_ih"].astype(np.float64) + w["b_hh"].astype(np.float64)
        # the layer's whole input sequence is known: its input term for every step in one GEMM (the
        # hoisting of fused.py), then only the recurrent product is left in the loop
        x_terms = (to_x(sequence).reshape(T * B, -1) @ w_ih.T).reshape(T, B, 4 * H) + bias
        w_hh_t = np.ascontiguousarray(w_hh.T)
        h, c = h0[layer], c0[layer]
        out = np.empty((T, B, H))
        for t in range(T):
            z = x_terms[t] + to_h(h) @ w_hh_t
            i, f, g, o = sigmoid(z[:, :H]), sigmoid(z[:, H:2 * H]), np.tanh(z[:, 2 * H:3 * H]), sigmoid(z[:, 3 * H:])
            c = f * c + i * g
            h = o * np.tanh(c)
            out[t] = h
        h_n[layer], c_n[layer] = h, c
        sequence = out
    return sequence, h_n, c_n


def lstm_references(inputs, weights, fp16=False):
    """[lstm_reference(x, weights, h0, c0, fp16) for (x, h0, c0) in inputs] (the same number of steps
    each), computed as one LSTM of all their rows side by side: the rows of a batch are independent,
    so one loop over the steps serves every batch."""
    x, h0, c0 = (np.concatenate([part[i] for part in inputs], axis=1) for i in range(3))
    y, h_n, c_n = lstm_reference(x, weights, h0, c0, fp16=fp16)
    starts = np.cumsum([0] + [part[0].shape[1] for part in inputs])
    return [(y[:, a:b], h_n[:, a:b], c_n[:, a:b]) for a, b in zip(starts, starts[1:])]


def tolerance(hidden, input_size):
    """(rtol, atol) for a float32 LSTM against lstm_reference. Each gate's pre-activation is a sum
    of I + H + 2 float32 products of values below ~1 in size: off by at most about (I + H) * 2^-24
    of the sum of their magnitudes, a few 1e-6 at 512 + 512. The gates' derivatives are at most 1,
    and the forget gate (below 1) shrinks an error carried in c at every step, so errors do not
    grow along the sequence; atol leaves 30x room over the per-step bound, a wrong gate is off by
    far more."""
    per_step = (hidden + input_size + 2) * 2.0 ** -24
    return 1e-4, max(30 * per_step, 2e-6)


def tolerance_fp16(hidden, input_size):
    """(rtol, atol) for the FP16 kernel against lstm_reference(..., fp16=True). Its products are
    exact (two FP16 values multiply exactly in FP32) and summed in FP32, as the float32 LSTM's; but
    it rounds a float32 h whose float64 twin may round to the neighbouring FP16 value: each such
    flip moves a pre-activation by an FP16 step of h (at most 2^-11 for |h| < 1) times a weight (at
    most 1/sqrt(H)). atol leaves room for 4 flips in one sum."""
    rtol, atol = tolerance(hidden, input_size)
    return rtol, max(atol, 4 * 2.0 ** -11 / math.sqrt(hidden))
