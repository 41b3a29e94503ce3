"""What the chapter's two notebooks (10a, launches; 10b, wavefront and tiled steps) compare with:
the LSTM's sizes, its weights and inputs, the check against the float64 reference, and cuDNN's
LSTM (`torch.nn.LSTM`) with the same weights.

The book's sizes on a GPU; a small LSTM with awkward sizes in the simulator.
"""

import numpy as np

import workbook
from workbook import bench

from . import reference as ref

STEPS = workbook.size(gpu=512, sim=3)
HIDDEN = workbook.size(gpu=512, sim=33)
INPUT = workbook.size(gpu=512, sim=7)
LAYERS = workbook.size(gpu=4, sim=2)
BATCHES = (1, 8, 64) if workbook.ON_GPU else (3,)

weights = ref.init_lstm(INPUT, HIDDEN, LAYERS, seed=0)
rtol, atol = ref.tolerance(HIDDEN, INPUT)


def inputs(batch, seed=1):
    """x (T, B, I), h0 and c0 (L, B, H): float32, on the host."""
    r = np.random.default_rng(seed)
    x = r.standard_normal((STEPS, batch, INPUT)).astype(np.float32)
    h0, c0 = (0.5 * r.standard_normal((LAYERS, batch, HIDDEN))).astype(np.float32), \
        (0.5 * r.standard_normal((LAYERS, batch, HIDDEN))).astype(np.float32)
    return x, h0, c0


def check(out, expected, name):
    """One output (y, h_n or c_n) against the float64 reference's."""
    workbook.assert_close(workbook.check.to_host(out), np.asarray(expected, np.float32), rtol=rtol, atol=atol,
                          name=name)


def optional_cudnn():
    """torch, with TF32 off (float32 means float32 for cuDNN too: no TF32 tensor cores in its GEMMs),
    or None without torch."""
    torch = bench.optional_torch()
    if torch is not None:
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
    return torch


def torch_lstm(dtype=None):
    """torch.nn.LSTM (cuDNN) with the same weights (dtype: torch.float16 for cuDNN's FP16 LSTM); any batch."""
    torch = optional_cudnn()
    lstm = torch.nn.LSTM(INPUT, HIDDEN, LAYERS).cuda()
    with torch.no_grad():
        for layer, w in enumerate(weights):
            for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
                getattr(lstm, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l{layer}").copy_(
                    torch.from_numpy(w[name]))
    return lstm if dtype is None else lstm.to(dtype)


def cudnn_call(lstm, *inputs):
    """A call of `lstm` on (x, h0, c0), torch tensors, without autograd: (y, h_n, c_n)."""
    torch = optional_cudnn()

    def call():
        with torch.no_grad():
            y, (h, c) = lstm(inputs[0], inputs[1:])
        return y, h, c
    return call
