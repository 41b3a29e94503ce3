"""What the sanitizer costs an exercise check: each reference answer's check timed in the strict
simulator with and without it (simulator/sanitizer.py, Sanitizer.BUDGET accesses per kernel), best
of 3, interleaved; the compile hook off, so that only the simulation is timed.

    python tools/sanitizer_cost.py [ch03 ...] [--store]   # --store: results/sanitizer_cost.json

A maintainer's tool: docs/simulator.md's figure for the sanitizer's cost comes from its stored run.
"""

import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WORKBOOK_DEVICE", "sim")
os.environ.setdefault("WORKBOOK_COMPILE", "0")

from workbook import exercises as ex  # noqa: E402

REPEATS = 3


def timed(exercise, module, sanitize):
    started = time.perf_counter()
    with ex.strict_simulator(sanitize=sanitize):
        exercise.check(module)
    return time.perf_counter() - started


def main():
    chapters = [a for a in sys.argv[1:] if a.startswith("ch")]
    rows = []
    for exercise in ex.all_exercises(chapters):
        module = ex.load(exercise.chapter, "solutions")
        times = {False: [], True: []}
        for _ in range(REPEATS):
            for sanitize in (False, True):
                times[sanitize].append(timed(exercise, module, sanitize))
        plain, sanitized = min(times[False]), min(times[True])
        rows.append({"exercise": exercise.id, "plain_s": round(plain, 3), "sanitized_s": round(sanitized, 3),
                     "ratio": round(sanitized / plain, 2)})
        print(f"{exercise.id:7s} plain {plain:6.2f} s  sanitized {sanitized:6.2f} s  {sanitized / plain:4.2f}x", flush=True)
    plain = sum(r["plain_s"] for r in rows)
    sanitized = sum(r["sanitized_s"] for r in rows)
    worst = max(rows, key=lambda r: r["ratio"])
    summary = {"plain_s": round(plain, 2), "sanitized_s": round(sanitized, 2), "ratio": round(sanitized / plain, 2),
               "worst": worst, "over_2x": [r["exercise"] for r in rows if r["ratio"] > 2]}
    print(f"all {len(rows)} checks: plain {plain:.1f} s, sanitized {sanitized:.1f} s ({summary['ratio']:.2f}x); "
          f"the largest ratio {worst['ratio']:.2f}x ({worst['exercise']}, {worst['plain_s']:.2f} s plain)")
    if "--store" in sys.argv:
        target = ROOT / "results" / "sanitizer_cost.json"
        target.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "machine": f"{os.cpu_count()} cores, "
                                      f"{platform.processor() or platform.machine()}", "budget":
                                      __import__("workbook.simulator", fromlist=["Sanitizer"]).Sanitizer.BUDGET,
                                      "summary": summary, "rows": rows}, indent=1) + "\n")
        print(f"stored {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
