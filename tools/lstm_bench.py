"""The persistent LSTMs against cuDNN on a GPU, without the naive and fused ones (which take
seconds): T = 512, I = H = 512, 4 layers; correctness at batch 1, then CUDA-event times.

    python tools/lstm_bench.py [variant,variant...] [batch ...]
        variants: persistent, wavefront, layerwise, streams, streams+graph (replayed as one CUDA graph)
"""

import sys
import time

import numpy as np
import torch

import workbook
from workbook import bench, cuda

from chapters.ch10_lstm import reference as ref
from chapters.ch10_lstm.persistent import PersistentLSTM
from chapters.ch10_lstm.streams import StreamsLSTM
from chapters.ch10_lstm.layerwise import LayerwiseLSTM
from chapters.ch10_lstm.wavefront import WavefrontLSTM

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
T, H, L = 512, 512, 4
weights = ref.init_lstm(H, H, L, seed=0)
chosen = sys.argv[1].split(",") if len(sys.argv) > 1 else ["persistent", "wavefront"]
KINDS = {"persistent": PersistentLSTM, "wavefront": WavefrontLSTM, "layerwise": LayerwiseLSTM, "streams": StreamsLSTM}
nets = {name: KINDS[name.removesuffix("+graph")](weights) for name in chosen}
lstm = torch.nn.LSTM(H, H, L).cuda()
with torch.no_grad():
    for layer, w in enumerate(weights):
        for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
            getattr(lstm, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l{layer}").copy_(torch.from_numpy(w[name]))
rtol, atol = ref.tolerance(H, H)
for batch in [int(b) for b in sys.argv[2:]] or [1, 8, 64]:
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((T, batch, H)).astype(np.float32)
    d_x = cuda.to_device(x)
    y_ref = ref.lstm_reference(x, weights)[0] if batch == 1 else None
    calls = {name: net.graph(d_x) if name.endswith("+graph") else (lambda net=net: net(d_x))
             for name, net in nets.items()}
    t_x = bench.torch_view(d_x)

    def cudnn():
        with torch.no_grad():
            return lstm(t_x)
    calls["cudnn"] = cudnn
    for name, net in nets.items():
        if name.endswith("+graph"):
            calls[name]()
            y = net.outputs(d_x)[0].copy_to_host()
        else:
            y = net(d_x)[0].copy_to_host()
        if y_ref is not None:
            workbook.assert_close(y, y_ref.astype(np.float32), rtol=rtol, atol=atol, name=f"{name} batch {batch}")
    started = time.perf_counter()
    times = bench.time_interleaved(calls, repeats=15)
    base = np.median(times["cudnn"])
    print(f"batch {batch}: " + ", ".join(f"{k} {np.median(v):.2f} ms ({base / np.median(v):.2f}x cuDNN)"
                                        for k, v in times.items()) + f"  [{time.perf_counter() - started:.1f} s timing]", flush=True)
