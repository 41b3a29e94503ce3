"""Every kernel of one capstone training step with its GPU time, for ncu (float32 or mixed):

    ncu --cache-control none --clock-control none --profile-from-start off \
        --metrics gpu__time_duration.sum python chapters/ch08_capstone/probes/step_kernels.py mixed [wgmma] > ncu.txt
    python chapters/ch08_capstone/probes/step_kernels.py summary ncu.txt      # the time per kernel, summed by name

The step runs twice first (compiles, workspaces); the third is profiled, between cuda.profile_start
and cuda.profile_stop. (Without the two "none"s ncu flushes the caches and locks the clocks before
each kernel: every kernel of this step then reads from DRAM and takes longer than in a step.)"""

import collections
import re
import sys


def summary(path):
    rows, name = [], None
    for line in open(path):
        if "Context" in line and "Device" in line:
            name = line.strip().split("(")[0].split("[")[0]
        found = re.search(r"gpu__time_duration.sum\s+(\S+)\s+([\d.,]+)", line)
        if found and name:
            value = float(found.group(2).replace(",", ""))
            rows.append((name, value * {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[found.group(1)]))
            name = None
    total, count = collections.defaultdict(float), collections.Counter()
    for name, us in rows:
        total[name] += us
        count[name] += 1
    print(f"{len(rows)} kernels, {sum(us for _, us in rows):.1f} us")
    for name, us in sorted(total.items(), key=lambda item: -item[1]):
        print(f"{us:8.1f} us  x{count[name]}  {name[:80]}")


if sys.argv[1] == "summary":
    summary(sys.argv[2])
    sys.exit()

from numba import cuda

from chapters.ch08_capstone import mixed, network as nw

train_x, train_y, _, _ = nw.load_digits()
initial = nw.init_parameters(32, seed=0)
net = (mixed.MixedNetwork(initial, 256, variant=sys.argv[2] if len(sys.argv) > 2 else "pipelined")
       if sys.argv[1] == "mixed" else nw.Network(initial, 256))
net.attach(train_x, train_y)
for _ in range(2):
    net.step()
cuda.synchronize()
cuda.profile_start()
net.step()
cuda.synchronize()
cuda.profile_stop()
