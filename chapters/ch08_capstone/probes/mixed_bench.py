"""The capstone's mixed-precision step against the float32 one on a GPU: GPU time per step (graph
replays, CUDA events, interleaved), and a training run of both, the same batches and masks.

    python chapters/ch08_capstone/probes/mixed_bench.py [epochs] [repeats] [slices...]      WIDTH=64 for a wider network

FP32_TILES="64x128 wide, prefetch;64x64 wide, prefetch" adds float32 networks on chapter 04's tiles
of those names (the capstone's own tile is "fp32").
"""

import os

import sys
import time

import numpy as np

from workbook import bench, cuda

from chapters.ch04_implicit_gemm import tiles
from chapters.ch08_capstone import half, mixed, network as nw

epochs = int(sys.argv[1]) if len(sys.argv) > 1 else 40
repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 30
train_x, train_y, test_x, test_y = nw.load_digits()
WIDTH = int(os.environ.get("WIDTH", 32))
initial = nw.init_parameters(WIDTH, seed=0)
nets = {"fp32": nw.Network(initial, 256), "mixed": mixed.MixedNetwork(initial, 256),
        "mixed wgmma": mixed.MixedNetwork(initial, 256, variant="wgmma")}
for tile_name in filter(None, os.environ.get("FP32_TILES", "").split(";")):
    nets[f"fp32 {tile_name}"] = nw.Network(initial, 256, tile=tiles.TILES[tile_name])
graphs = {}
for name, net in nets.items():
    net.attach(train_x, train_y)
    graphs[name] = net.graph()
    net.reset(initial)
orders = nw.epoch_orders(len(train_x), epochs)
for name, net in nets.items():
    start = time.perf_counter()
    accuracy = []
    for order in orders:
        net.set_order(order, stream=graphs[name].stream)
        for _ in range(net.steps_per_epoch):
            graphs[name]()
        cuda.synchronize()
        accuracy.append(net.accuracy(test_x, test_y))
    losses = net.losses_so_far(epochs * net.steps_per_epoch)
    extra = ""
    if isinstance(net, mixed.MixedNetwork):
        scales, skipped = net.scales_so_far(epochs * net.steps_per_epoch)
        extra = f" scales {scales.min():.0f}..{scales.max():.0f}, skipped {skipped.sum()}"
    print(f"width {WIDTH} {name}: final acc {accuracy[-1]:.4f}, mean last 10 {np.mean(accuracy[-10:]):.4f}, "
          f"loss {losses[-5:].mean():.4f}, finite {np.isfinite(losses).all()}{extra} ({time.perf_counter() - start:.1f} s)")
times = bench.time_interleaved(graphs, repeats=repeats)
base = np.median(times["fp32"])
for name, t in times.items():
    print(f"step {name}: {np.median(t) * 1e3:.1f} us [{np.percentile(t, 25) * 1e3:.1f}-{np.percentile(t, 75) * 1e3:.1f}]"
          f" = {np.median(t) / base:.3f} of fp32")
for name in ("fp32", "mixed"):
    net = nets[name]
    parts = bench.time_interleaved({"forward": net.forward, "backward": net.backward, "update": net.update}, repeats=repeats)
    print(name, {k: f"{np.median(v) * 1e3:.1f} us" for k, v in parts.items()})
net = nets["mixed"]
b, w = 256, WIDTH
for slices in [None] + [int(s) for s in sys.argv[3:]]:
    t = bench.time_interleaved({"wgrad": lambda: half.wgrad_half(net.half_input(2, b), net.d_z16, net.grads["conv2"],
                                                                 padding=1, slices=slices)}, repeats=repeats)["wgrad"]
    print(f"wgrad_half slices {slices}: {np.median(t) * 1e3:.1f} us")
