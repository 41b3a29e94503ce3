"""Chapter 10's profiling section, alone: the fused LSTM's timeline, launched one by one and as one
CUDA graph; prints each row's busy time and writes the events and the plot to DIR (on the H100,
results/nvidia-h100-80gb-hbm3/ch10_timeline.{json,png} come from here).

    python chapters/ch10_lstm/probes/timeline_probe.py DIR
"""

import json
import sys
from pathlib import Path

import matplotlib
import numpy as np

import workbook
from workbook import cuda, timeline

from chapters.ch10_lstm import fused, profiling
from chapters.ch10_lstm import reference as ref

matplotlib.use("Agg")
out = Path(sys.argv[1] if len(sys.argv) > 1 else ".")
out.mkdir(parents=True, exist_ok=True)
T, B, H = 8, workbook.size(gpu=8, sim=2), workbook.size(gpu=512, sim=8)
net = fused.FusedLSTM(ref.init_lstm(H, H, 1, seed=0))
rng = np.random.default_rng(0)
d_x = cuda.to_device(rng.standard_normal((T, B, H)).astype(np.float32))
d_h0, d_c0 = (cuda.to_device(np.zeros((1, B, H), np.float32)) for _ in range(2))
recorded = profiling.timelines(net, d_x, d_h0, d_c0)
for name, events in recorded.items():
    rows, end = timeline.summary(events)
    print(name, f"{end:.0f} us:", {row: f"{busy:.0f} us in {n}" for row, (busy, n) in rows.items()})
(out / "ch10_timeline.json").write_text(json.dumps(recorded))
profiling.figure(recorded, f"T={T} B={B} H={H}").savefig(out / "ch10_timeline.png", dpi=110)
