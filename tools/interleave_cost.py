"""What grading in a second thread order costs: each exercise's reference answer graded as a
student's answer is (`workbook.exercises.evaluate`), and the second order's run alone
(`_wrong_in_another_order`), on this machine's cores, in the simulator.

    python tools/interleave_cost.py [--store]   # --store: results/interleave_cost.json
"""

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WORKBOOK_DEVICE", "sim")
os.environ.setdefault("WORKBOOK_COMPILE", "0")

from workbook import exercises as ex  # noqa: E402


def main():
    rows = []
    for exercise in ex.all_exercises():
        if not ex.has_solutions(exercise.chapter):
            continue
        module = ex.load(exercise.chapter, "solutions")
        ex.evaluate(exercise, module)  # imports and first launches out of the way
        started = time.perf_counter()
        result = ex.evaluate(exercise, module)
        graded = time.perf_counter() - started
        started = time.perf_counter()
        wrong = ex._wrong_in_another_order(exercise, module)
        order = time.perf_counter() - started
        rows.append({"exercise": exercise.id, "graded_s": round(graded, 2), "second_order_s": round(order, 2),
                     "status": result.status, "right_in_the_second_order": wrong is None})
        print(f"{exercise.id}: graded in {graded:5.2f} s, of which the second order {order:5.2f} s", flush=True)
    if not rows:
        print("no solutions.py here (a handout): nothing to grade")
        return
    total, second = sum(r["graded_s"] for r in rows), sum(r["second_order_s"] for r in rows)
    print(f"{len(rows)} exercises graded in {total:.1f} s, the second order {second:.1f} s of it "
          f"({second / total:.0%}); the most for one exercise {max(r['second_order_s'] for r in rows):.1f} s")
    if "--store" in sys.argv:
        target = ROOT / "results" / "interleave_cost.json"
        target.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "cpus": os.cpu_count(), "rows": rows},
                                     indent=1) + "\n")
        print(f"stored {target}")


if __name__ == "__main__":
    main()
