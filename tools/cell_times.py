"""Where a chapter's time goes: run its paired script cell by cell and print each code cell's wall
time and the time spent compiling kernels in it (numba-cuda's CUDADispatcher.compile).

    python tools/cell_times.py ch04 [ch06 ...] [--json out.json]

Run it as the main job runs a chapter (WORKBOOK_DEVICE=gpu on a GPU); a maintainer's tool, not a lesson.
`python -m workbook run` now stores each cell's wall and compile time in the chapter's results
(`cells`, see workbook/runner.py) at no cost; this tool adds the sampled profile (--sample).
"""

import argparse
import json
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


class Sampler:
    """Every `interval` seconds, which functions the main thread is in (inclusive counts): a cheap
    profile of where the wall time goes, compiles and GPU waits included."""

    def __init__(self, interval=0.02):
        import collections
        import threading

        self.interval, self.samples = interval, 0
        self.inclusive = collections.Counter()
        self._main = threading.main_thread().ident
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.wait(self.interval):
            frame = sys._current_frames().get(self._main)
            seen = set()
            while frame is not None:
                code = frame.f_code
                key = f"{Path(code.co_filename).name}:{code.co_firstlineno} {code.co_name}"
                if key not in seen:
                    seen.add(key)
                    self.inclusive[key] += 1
                frame = frame.f_back
            self.samples += 1

    def start(self):
        self._thread.start()

    def top(self, n=60):
        return [(key, round(count * self.interval, 1)) for key, count in self.inclusive.most_common(n)]


def run_chapter(chapter_id, clock):
    from workbook.runner import code_cells

    script = next(ROOT.glob(f"chapters/{chapter_id}_*/{chapter_id}_*.py"))
    os.chdir(script.parent)
    namespace = {"__name__": "__main__", "__file__": str(script)}
    rows, started = [], time.perf_counter()
    for number, (_, source) in enumerate(code_cells(script)):  # line numbers kept: tracebacks name the script's
        first = next((l for l in source.splitlines() if l.strip() and not l.startswith("#")), "")
        compile_before, count_before = clock.seconds, clock.count
        cell_started = time.perf_counter()
        exec(compile(source, str(script), "exec"), namespace)
        rows.append({"cell": number, "seconds": round(time.perf_counter() - cell_started, 2),
                     "compile_s": round(clock.seconds - compile_before, 2),
                     "compiles": clock.count - count_before, "first_line": first[:70]})
    total = time.perf_counter() - started
    print(f"\n== {chapter_id}: {total:.1f} s, compiling {sum(r['compile_s'] for r in rows):.1f} s "
          f"in {sum(r['compiles'] for r in rows)} compiles", file=sys.__stderr__)
    for r in sorted(rows, key=lambda r: -r["seconds"])[:12]:
        print(f"  cell {r['cell']:3d} {r['seconds']:7.2f} s  compile {r['compile_s']:6.2f} s "
              f"({r['compiles']:3d})  {r['first_line']}", file=sys.__stderr__)
    return {"total": round(total, 1), "cells": rows}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("chapters", nargs="+")
    parser.add_argument("--json")
    parser.add_argument("--sample", action="store_true", help="also sample the main thread's stack")
    args = parser.parse_args()
    os.environ.setdefault("MPLBACKEND", "Agg")
    process_started = time.perf_counter()
    import workbook  # noqa: F401  (the package picks the mode before numba.cuda is used)
    from workbook.runner import CompileClock

    clock = CompileClock().install()
    sampler = Sampler() if args.sample else None
    if sampler:
        sampler.start()
    print(f"importing workbook: {time.perf_counter() - process_started:.1f} s", file=sys.__stderr__)
    report = {}
    for chapter in args.chapters:  # written after each chapter: a run cut short keeps what it measured
        report[chapter] = run_chapter(chapter, clock)
        if sampler:
            report["sampled"] = sampler.top(150)
        if args.json:
            Path(args.json).write_text(json.dumps(report, indent=1))
    for key, seconds in report.get("sampled", [])[:40]:  # (stored with the last chapter)
        print(f"  {seconds:7.1f} s  {key}", file=sys.__stderr__)


if __name__ == "__main__":
    main()
