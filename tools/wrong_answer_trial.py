"""A trial of the exercise checks: plausible wrong answers, written fresh (not the planted ones of
solutions.py), graded as a student's answer is graded (`workbook.exercises.evaluate`: strict
simulator, sanitizer, other grids).

    python tools/wrong_answer_trial.py [ch03 ...] [--store]   # --store: results/wrong_answer_trial.json

Each answer is one edit of the reference answer, in one of the classes that lucky code falls in:
  grid   launch geometry: a stride by the block, an index from threadIdx, a block size hard-coded
  data   symmetric or mid-range data: H for W, a max started at 0, NaN or -inf forgotten, a carry lost
  index  an index or mask past what the data has: named by the sanitizer's memcheck or synccheck
  waste  the right values, with work done several times: not wrong, but not what was asked
A "grid", "data" or "index" answer must be graded wrong, a "waste" answer too slow (in the simulator,
on the bytes its kernels move against the reference answer's: exercises.wasted_work). A maintainer's
tool.
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("WORKBOOK_DEVICE", "sim")
os.environ.setdefault("WORKBOOK_COMPILE", "0")  # wrong answers need no GPU compile

from workbook import exercises as ex  # noqa: E402

# exercise: [(class, old, new, what the student got wrong)]
ANSWERS = {
    "ch00.1": [("grid", "i += cuda.gridsize(1)", "i += cuda.blockDim.x", "strides by the block: blocks overlap"),
               ("grid", "i += cuda.gridsize(1)", "i += 256 * cuda.gridDim.x", "the block size hard-coded")],
    "ch00.2": [("grid", "i = cuda.grid(1)", "i = cuda.threadIdx.x", "the index of the first block only"),
               ("waste", "    if i < n:  # the last block is partly past the end\n        dst[i] = src[n - 1 - i]",
                "    for j in range(n):\n        dst[j] = src[n - 1 - j]", "every thread reverses the whole array")],
    "ch00.3": [("index", "    if i < n:\n        dst[i] = src[i]", "    dst[i] = src[i]", "the tail without its test")],
    "ch00.4": [("grid", "col, row = cuda.grid(2)", "row, col = cuda.grid(2)", "x along the rows"),
               ("waste", "        dst[row, col] = src[row, col]",
                "        for _ in range(2):\n            dst[row, col] = src[row, col]", "each element copied twice")],
    "ch01.1": [("data", "v > ZERO", "not (v <= ZERO)", "NaN counted as positive")],
    "ch01.2": [("grid", "i = cuda.grid(1)", "i = cuda.threadIdx.x + cuda.blockIdx.x * 256", "the block size hard-coded"),
               ("index", "if i < out.size:", "if i < mask.size * 32:", "the padding bits of the last word")],
    "ch01.3": [("data", "dy[i] if bit else ZERO", "dy[i] * bit", "a product, not a select: inf * 0")],
    "ch01.4": [("grid", "step = (cuda.gridsize(1) >> 5) * ROWS_PER_TRIP",
                "step = (cuda.blockDim.x >> 5) * ROWS_PER_TRIP", "strides by the block: warps overlap")],
    "ch02.1": [("data", "off_lo, off_hi, seed_lo, seed_hi)", "off_lo, np.uint32(0), seed_lo, seed_hi)",
                "the offset's high word dropped")],
    "ch02.2": [("grid", "i = cuda.grid(1)", "i = cuda.threadIdx.x", "the index of the first block only"),
               ("data", "dy[i] * scale if (word >> (i & 31)) & 1 else ZERO", "dy[i] * scale * ((word >> (i & 31)) & 1)",
                "a product, not a select: inf * 0")],
    "ch02.3": [("data", "keep = flag and i < n", "keep = flag", "bits past n set")],
    "ch02.4": [("data", "dx[i] = dy[i] * scale if keep else ZERO", "dx[i] = dy[i] * scale * keep",
                "a product, not a select: inf * 0")],
    "ch03.1": [("data", "if not math.isfinite(value):", "if value != value or value == math.inf:", "-inf missed")],
    "ch03.2": [("data", "middle = (low + high + 1) >> 1", "middle = (low + high) >> 1",
                "the midpoint rounded down: low = middle never moves"),
               ("data", "low, high = 0, count - 1", "low, high = 0, count - 2", "the last tensor never found")],
    "ch03.3": [("grid", "range(start, grad.size, stride)", "range(start, grad.size, cuda.blockDim.x)",
                "strides by the block: elements scaled twice")],
    "ch03.4": [("grid", "if cuda.grid(1) != 0:", "if cuda.threadIdx.x != 0:", "one thread per block, not per grid")],
    "ch04.1": [("data", "0 <= w < W", "0 <= w < H", "H for W"),
               ("data", "h = h0 + table[1, row]\n            w = w0 + table[2, row]",
                "h = h0 + table[2, row]\n            w = w0 + table[1, row]", "the table's rows swapped")],
    "ch04.2": [("grid", "col, row = cuda.grid(2)", "row, col = cuda.grid(2)", "x along the rows")],
    "ch04.3": [("data", "(depth + TILE - 1) // TILE", "depth // TILE", "the partial step lost"),
               ("waste", "(depth + TILE - 1) // TILE", "depth // TILE + 1", "a step of zeros where depth is whole")],
    "ch04.4": [("data", "h = p * sh - ph + r * dh", "h = p * sh - ph + r * dw", "the dilations swapped"),
               ("data", "p = (index // Q) % P", "p = (index // P) % P", "P for Q")],
    "ch05.1": [("data", "(np.int32(a[i]) + np.int32(b[i]) + np.int32(1)) >> np.int32(1)", "(a[i] >> 1) + (b[i] >> 1)",
                "halves first: the carry and the rounding lost")],
    "ch05.2": [("grid", "c, r = cuda.grid(2)", "r, c = cuda.grid(2)", "x along the rows"),
               ("data", "rr = min(max(r + dr, 0), height - 1)", "rr = min(max(r + dr, 0), width - 1)", "width for height")],
    "ch05.3": [("index", "rr = min(max(r + dr, 0), height - 1)", "rr = min(max(r + dr, 0), height)",
                "the bottom edge clamped one row too far")],
    "ch05.4": [("waste", "start, stride = cuda.grid(1), cuda.gridsize(1)", "start, stride = cuda.grid(1), cuda.blockDim.x",
                "strides by the block: pixels merged several times")],
    "ch06.1": [("index", "cuda.shfl_xor_sync(FULL_MASK, total, offset)", "cuda.shfl_xor_sync(0xFFFF, total, offset)",
                "a mask of half the warp")],
    "ch06.2": [("data", "top = NEG_INF", "top = ZERO", "the max started at 0"),
               ("grid", "row = cuda.grid(1)", "row = cuda.threadIdx.x", "the rows of the first block only")],
    "ch06.3": [("index", "cuda.shfl_xor_sync(FULL_MASK, top, offset)", "cuda.shfl_down_sync(FULL_MASK, top, offset)",
                "only lane 0 ends with the max")],
    "ch06.4": [("data", "        top = NEG_INF", "        top = ZERO", "the max started at 0"),
               ("grid", "row = cuda.grid(1) >> 5", "row = cuda.threadIdx.x >> 5", "the rows of the first block only")],
    "ch08.1": [("data", "w[k, c, R - 1 - r, S - 1 - s]", "w[k, c, R - 1 - r, R - 1 - s]", "R for S")],
    "ch08.2": [("waste", "rows * size, cuda.gridsize(1)", "rows * size, cuda.blockDim.x", "strides by the block")],
    "ch08.3": [("data", "params[i] = w - lr * v", "params[i] = w - lr * (grads[i] + weight_decay * w)",
                "the momentum ignored")],
    "ch08.4": [("waste", "cols, cuda.gridsize(1) // 32)", "cols, cuda.blockDim.x // 32)", "strides by the block")],
}


def trial(chapters=()):
    rows = []
    exercises = {e.id: e for e in ex.all_exercises()}
    with tempfile.TemporaryDirectory() as directory:
        for exercise_id, answers in ANSWERS.items():
            if chapters and exercise_id[:4] not in chapters:
                continue
            exercise = exercises[exercise_id]
            text = ex.module_path(exercise.chapter, "solutions").read_text()
            (region,) = [r for r in ex.regions(text) if r.id == exercise_id]
            for number, (kind, old, new, why) in enumerate(answers):
                if region.code.count(old) != 1:
                    raise ValueError(f"{exercise_id}: {old!r} must occur once in the reference answer")
                module = ex.load_source(ex.replace_region(text, exercise_id, region.code.replace(old, new)),
                                        Path(directory), f"{exercise_id.replace('.', '_')}_trial{number}")
                started = time.perf_counter()
                result = ex.evaluate(exercise, module)
                rows.append({"exercise": exercise_id, "class": kind, "answer": why, "edit": [old, new],
                             "graded": result.status, "passed": result.passed, "seconds":
                             round(time.perf_counter() - started, 1), "message": (result.message or "")[:300]})
                expected = result.status == ex.SLOW if kind == "waste" else not result.passed
                print(f"{exercise_id} {kind:5s} {why[:46]:46s} -> {result.status:16s} "
                      f"{'' if expected else '<- graded correct'} {rows[-1]['seconds']:5.1f} s  "
                      f"{(result.message or '').splitlines()[0][:90] if result.message else ''}", flush=True)
    return rows


def main():
    chapters = [a for a in sys.argv[1:] if a.startswith("ch")]
    rows = trial(chapters)
    wrong = [r for r in rows if r["class"] != "waste"]
    waste = [r for r in rows if r["class"] == "waste"]
    caught = sum(not r["passed"] for r in wrong)
    print(f"{caught} of {len(wrong)} wrong answers graded wrong; "
          f"{sum(r['graded'] == ex.SLOW for r in waste)} of {len(waste)} wasteful ones too slow")
    if "--store" in sys.argv:
        target = ROOT / "results" / "wrong_answer_trial.json"
        target.write_text(json.dumps({"date": time.strftime("%Y-%m-%d"), "rows": rows}, indent=1) + "\n")
        print(f"stored {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
