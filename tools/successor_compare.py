"""Two runs of `python -m workbook compilers` compared row by row: did a change to the successor's
translation (a mend, a new version) make kernels faster or slower?

    python tools/successor_compare.py results/nvidia-h200/compilers.json OTHER.json [--chapters ch02 ch06]

Each run times a kernel under both compilers, interleaved, in one process, so the comparison is of
the ratio successor / numba-cuda of each run: numba-cuda's build is the same in both, and the ratio
carries the run's own drift out. A row counts as faster or slower only when the two ratios' spreads do
not overlap. A kernel whose successor PTX the change leaves alone can still land there: the spreads are
of one run's repeats, not of two runs' (check with tools/successor_ptx.py --save, mend on and off).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from workbook.compilers import row_key, short_name  # noqa: E402  (the project root first)


def _label(row):
    name = short_name(row["kernel"])
    return f"{name} ({row['variant'][:60]})" if row.get("variant") else name


def compare(before, after, chapters=None):
    """(rows compared, slower, faster, unmatched, not correct): slower and faster as (chapter, label,
    ratio before, spread before, ratio after, spread after)."""
    slower, faster, unmatched, wrong, ratios = [], [], [], [], []
    for chapter_id, chapter in sorted(after["chapters"].items()):
        if chapters and chapter_id not in chapters:
            continue
        old = {row_key(row): row for row in before["chapters"].get(chapter_id, {}).get("rows", [])}
        for row in chapter["rows"]:
            if not row.get("correct"):
                wrong.append((chapter_id, _label(row)))
            was = old.get(row_key(row))
            if was is None:
                unmatched.append((chapter_id, _label(row)))
                continue
            if not (row.get("timed") and was.get("timed")):
                continue
            a, b = was["time_ratio"], row["time_ratio"]
            ratios.append(b["median"] / a["median"])
            line = (chapter_id, _label(row), a["median"], a["spread"], b["median"], b["spread"])
            if b["spread"][0] > a["spread"][1]:
                slower.append(line)
            elif b["spread"][1] < a["spread"][0]:
                faster.append(line)
    return ratios, slower, faster, unmatched, wrong


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--chapters", nargs="*")
    args = parser.parse_args()
    before, after = (json.loads(open(path).read()) for path in (args.before, args.after))
    ratios, slower, faster, unmatched, wrong = compare(before, after, args.chapters)
    median = statistics.median(ratios) if ratios else float("nan")
    print(f"{len(ratios)} rows compared; the ratio after / before: median {median:.3f}; "
          f"{len(faster)} faster, {len(slower)} slower, {len(wrong)} not correct, {len(unmatched)} without a row before")
    for title, lines in (("slower", slower), ("faster", faster)):
        for chapter_id, label, a, sa, b, sb in sorted(lines, key=lambda line: line[4] / line[2]):
            print(f"{title:7s} {chapter_id} {label}: {a:.2f} [{sa[0]:.2f}-{sa[1]:.2f}] -> {b:.2f} [{sb[0]:.2f}-{sb[1]:.2f}]")
    for chapter_id, label in wrong:
        print(f"WRONG   {chapter_id} {label}")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main())
