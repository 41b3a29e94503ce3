"""The simulator's sanitizer against compute-sanitizer, on kernels planted with a race and on their
correct twins.

    python tools/validate_sanitizer.py sim [OUT.json] # the simulator's verdicts (CPU)
    python tools/validate_sanitizer.py gpu OUT.json   # on the GPU: each case under compute-sanitizer
                                                      # --tool racecheck (shared memory: all it checks)
    python tools/validate_sanitizer.py launch NAME    # (what the gpu side runs: one case, on the GPU)
    python tools/validate_sanitizer.py compare SIM.json GPU.json [--store]   # the table; --store keeps
                                                      # it in results/<device>/sanitizer_validation.json

Each case is one launch. compute-sanitizer's racecheck sees shared memory only; the global-memory
races the simulator names (a read-modify-write from many threads, two blocks on one word) have no
counterpart there, so only the shared-memory cases are compared. A maintainer's tool.
"""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ["WORKBOOK_DEVICE"] = {"sim": "sim", "launch": "gpu"}.get((sys.argv + [""])[1], "sim")

import numpy as np  # noqa: E402

import gpu_side  # noqa: E402  (tools/gpu_side.py: this script's folder is on sys.path)
from workbook import cuda  # noqa: E402


@cuda.jit
def reverse_in_shared(x, out, sync):
    s = cuda.shared.array(256, np.float32)
    t = cuda.threadIdx.x
    s[t] = x[t]
    if sync:
        cuda.syncthreads()
    out[t] = s[255 - t]  # another warp's word: a race without the barrier


@cuda.jit
def neighbour_in_warp(x, out, sync):
    s = cuda.shared.array(32, np.float32)
    lane = cuda.threadIdx.x
    s[lane] = x[lane]
    if sync:
        cuda.syncwarp()
    out[lane] = s[(lane + 1) % 32]  # the next lane's word: a race without the warp barrier


@cuda.jit
def tile_sum(x, out, second_barrier):
    """out[b] = sum of x over 4 tiles of 64, staged in one shared tile: without the second barrier,
    the next tile overwrites words that slower threads are still reading."""
    tile = cuda.shared.array(64, np.float32)
    t = cuda.threadIdx.x
    total = np.float32(0)
    for step in range(4):
        tile[t] = x[step * 64 + t]
        cuda.syncthreads()
        total += tile[63 - t]
        if second_barrier:
            cuda.syncthreads()
    out[t] = total


def cases():
    """{name: (kernel, grid, block, args, racy)}"""
    x256 = np.arange(256, dtype=np.float32)
    return {
        "reverse in shared, no barrier": (reverse_in_shared, 1, 256, (x256, np.zeros(256, np.float32), False), True),
        "reverse in shared, barrier": (reverse_in_shared, 1, 256, (x256, np.zeros(256, np.float32), True), False),
        "next lane's word, no syncwarp": (neighbour_in_warp, 1, 32, (x256[:32], np.zeros(32, np.float32), False), True),
        "next lane's word, syncwarp": (neighbour_in_warp, 1, 32, (x256[:32], np.zeros(32, np.float32), True), False),
        "tiles, one barrier a step": (tile_sum, 1, 64, (x256, np.zeros(64, np.float32), False), True),
        "tiles, two barriers a step": (tile_sum, 1, 64, (x256, np.zeros(64, np.float32), True), False),
    }


def simulated(path=None):
    from workbook.simulator import RaceError, UninitializedReadError, sanitizing

    verdicts = {}
    for name, (kernel, grid, block, args, racy) in cases().items():
        try:
            with sanitizing():
                kernel[grid, block](*args)
            verdicts[name] = "clean"
        except (RaceError, UninitializedReadError) as error:
            verdicts[name] = f"{type(error).__name__}: {error}"
        print(f"{name:34s} planted race: {'yes' if racy else 'no ':3s}  simulator: {verdicts[name][:90]}")
    if path:
        Path(path).write_text(json.dumps(verdicts, indent=1))
    return verdicts


def compare(sim_path, gpu_path, store=False):
    """One row per case: the planted race, the simulator's verdict, compute-sanitizer's hazards."""
    sim, gpu = json.loads(Path(sim_path).read_text()), json.loads(Path(gpu_path).read_text())
    rows = []
    for name, (*_, racy) in cases().items():
        simulator_says = "race" if sim[name].startswith("RaceError") else sim[name].split(":")[0]
        hazards = gpu.get(name, {}).get("hazards")
        rows.append({"case": name, "planted race": racy, "simulator": simulator_says,
                     "simulator report": sim[name], "compute-sanitizer hazards": hazards,
                     "agree": hazards is not None and (hazards > 0) == (simulator_says == "race")})
        print(f"{name:34s} planted: {'race' if racy else 'none':5s} simulator: {simulator_says:6s} "
              f"compute-sanitizer: {hazards} hazard(s){'' if rows[-1]['agree'] else '   <- differs'}")
    print(f"{sum(r['agree'] for r in rows)} of {len(rows)} verdicts agree")
    if store:
        from workbook import results

        target = results.ROOT / "results" / results.REFERENCE_DEVICE / "sanitizer_validation.json"
        target.write_text(json.dumps({"stamp": gpu.get("stamp"), "rows": rows}, indent=1) + "\n")
        print(f"stored {target}")


def measured(path):
    verdicts = {}
    for name in cases():
        run = subprocess.run(["compute-sanitizer", "--tool", "racecheck", "--racecheck-report", "hazard",
                              sys.executable, __file__, "launch", name], capture_output=True, text=True,
                             env=gpu_side.env())
        text = run.stdout + run.stderr
        races = [line.strip() for line in text.splitlines() if "race reported" in line.lower()]
        counted = re.search(r"RACECHECK SUMMARY: (\d+) hazards? displayed", text)
        hazards = int(counted[1]) if counted else None  # None: the tool did not run the kernel
        verdicts[name] = {"hazards": hazards, "races": races[:3], "exit": run.returncode,
                          "summary": [line for line in text.splitlines() if "RACECHECK SUMMARY" in line],
                          "tail": text[-1500:]}
        print(f"{name:34s} compute-sanitizer: {hazards} hazard(s) {verdicts[name]['summary']}")
    verdicts["stamp"] = gpu_side.stamp()
    Path(path).write_text(json.dumps(verdicts, indent=1))


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "sim":
        simulated(sys.argv[2] if len(sys.argv) > 2 else None)
    elif what == "compare":
        compare(sys.argv[2], sys.argv[3], store="--store" in sys.argv)
    elif what == "gpu":
        measured(sys.argv[2])
    elif what == "launch":
        kernel, grid, block, args, _ = cases()[sys.argv[2]]
        kernel[grid, block](*(cuda.to_device(a) if isinstance(a, np.ndarray) else a for a in args))
        cuda.synchronize()
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
