"""The persistent LSTMs against cuDNN on a GPU, without the naive and fused ones (which take
seconds): T = 512, I = H = 512, 4 layers; correctness at batch 1, then CUDA-event times.

    python chapters/ch10_lstm/probes/lstm_bench.py [variant,variant...] [batch ...]
        variants: persistent, wavefront, layerwise, streams, streams+graph (replayed as one CUDA graph),
        half (the FP16 wavefront on tensor cores; cuDNN in FP16 is timed beside it)
"""

import sys
import time

import numpy as np
import torch

import workbook
from workbook import bench, cuda

from chapters.ch10_lstm import reference as ref
from chapters.ch10_lstm.half import HalfLSTM
from chapters.ch10_lstm.persistent import PersistentLSTM
from chapters.ch10_lstm.streams import StreamsLSTM
from chapters.ch10_lstm.layerwise import LayerwiseLSTM
from chapters.ch10_lstm.wavefront import WavefrontLSTM

torch.backends.cudnn.allow_tf32 = False
torch.backends.cuda.matmul.allow_tf32 = False
T, H, L = 512, 512, 4
weights = ref.init_lstm(H, H, L, seed=0)
chosen = sys.argv[1].split(",") if len(sys.argv) > 1 else ["persistent", "wavefront"]
KINDS = {"persistent": PersistentLSTM, "wavefront": WavefrontLSTM, "layerwise": LayerwiseLSTM, "streams": StreamsLSTM,
         "half": HalfLSTM}
nets = {name: KINDS[name.removesuffix("+graph")](weights) for name in chosen}
lstm = torch.nn.LSTM(H, H, L).cuda()
with torch.no_grad():
    for layer, w in enumerate(weights):
        for name in ("w_ih", "w_hh", "b_ih", "b_hh"):
            getattr(lstm, f"{name.replace('w_', 'weight_').replace('b_', 'bias_')}_l{layer}").copy_(torch.from_numpy(w[name]))
lstm16 = torch.nn.LSTM(H, H, L).cuda().half() if "half" in chosen else None
if lstm16 is not None:
    lstm16.load_state_dict({k: v.half() for k, v in lstm.state_dict().items()})
rtol, atol = ref.tolerance(H, H)
for batch in [int(b) for b in sys.argv[2:]] or [1, 8, 64]:
    rng = np.random.default_rng(batch)
    x = rng.standard_normal((T, batch, H)).astype(np.float32)
    d_x = cuda.to_device(x)
    y_ref = ref.lstm_reference(x, weights)[0] if batch == 1 else None
    y16_ref = ref.lstm_reference(x, weights, fp16=True)[0] if batch == 1 and lstm16 is not None else None
    calls = {name: net.graph(d_x) if name.endswith("+graph") else (lambda net=net: net(d_x))
             for name, net in nets.items()}
    t_x = bench.torch_view(d_x)

    def cudnn():
        with torch.no_grad():
            return lstm(t_x)
    calls["cudnn"] = cudnn
    if lstm16 is not None:
        t_x16 = t_x.half()

        def cudnn16():
            with torch.no_grad():
                return lstm16(t_x16)
        calls["cudnn fp16"] = cudnn16
    for name, net in nets.items():
        if name.endswith("+graph"):
            calls[name]()
            y = net.outputs(d_x)[0].copy_to_host()
        else:
            y = net(d_x)[0].copy_to_host()
        if y_ref is not None and name == "half":
            print(f"half: max |y - float64| {np.abs(y - y_ref).max():.2e}, against the FP16 model "
                  f"{np.abs(y - y16_ref).max():.2e}")
            r16, a16 = ref.tolerance_fp16(H, H)
            workbook.assert_close(y, y16_ref.astype(np.float32), rtol=r16, atol=a16, name=f"{name} batch {batch}")
        elif y_ref is not None:
            workbook.assert_close(y, y_ref.astype(np.float32), rtol=rtol, atol=atol, name=f"{name} batch {batch}")
    if y_ref is not None and lstm16 is not None:
        print(f"cudnn fp16: max |y - float64| {np.abs(cudnn16()[0].float().cpu().numpy() - y_ref).max():.2e}")
    started = time.perf_counter()
    times = bench.time_interleaved(calls, repeats=15)
    base = np.median(times["cudnn"])
    print(f"batch {batch}: " + ", ".join(f"{k} {np.median(v):.2f} ms ({base / np.median(v):.2f}x cuDNN)"
                                        for k, v in times.items()) + f"  [{time.perf_counter() - started:.1f} s timing]", flush=True)
