"""A chapter's record: every comparison it ran, the bars it was held to, its plots.

    chapter = Chapter("ch00", "Measuring a kernel")
    result = chapter.compare("copy", {...}, reference=..., bytes=..., size="n=2^26")
    chapter.bar("optimized copy vs torch copy", result.ratio("torch copy", "grid-stride x4"), at_least=0.9)
    chapter.save()        # results/<device>/ch00.json, read by `python -m workbook run` and `table`

In the simulator the same calls run (and check) every kernel, and each comparison is followed by the
stored GPU figures for the same case, so a student without a GPU still sees what the GPU does.
"""

import sys

from . import ON_GPU, bench, results


def meets(value, target):
    """Does `value` meet a bar's target, written ">= limit" or "<= limit"?"""
    sign, limit = target.split()
    return value >= float(limit) if sign == ">=" else value <= float(limit)


def bar_figure(record):
    """A bar's measured figure as text: 3 significant digits, more where rounding would make a
    missed bar read as its target (1.4976 against ">= 1.5" prints 1.498, not 1.5)."""
    digits = 3
    text = f"{record['measured']:.{digits}g}"
    while record["met"] is False and meets(float(text), record["target"]) and digits < 9:
        digits += 1
        text = f"{record['measured']:.{digits}g}"
    return text


class Chapter:
    def __init__(self, chapter_id, title):
        self.id, self.title = chapter_id, title
        self.cases, self.bars, self.figures, self.records = [], [], [], {}
        self.stored = None if ON_GPU else results.load_json(chapter_id)

    def compare(self, key, variants, *, size="", show=True, **options):
        """bench.compare() under a case `key` (stable across devices; `size` says how big it was)."""
        title = f"{self.id} {key}" + (f" ({size})" if size else "")
        comparison = bench.compare(variants, title=title, **options)
        self.cases.append({"key": key, "size": size, "ceiling": comparison.ceiling,
                           "rows": comparison.rows()})
        if show:
            comparison.show()
            if not ON_GPU:
                self.show_stored(key)
        return comparison

    def bar(self, what, measured, *, at_least=None, at_most=None):
        """A target from the issue, held against a measured figure (median of a ratio or a value).

        `measured` may be a number or the (median, p25, p75) triple that Comparison.ratio returns.
        In the simulator a bar is not judged (times mean nothing there).
        """
        value, *spread = (float(v) for v in (measured if isinstance(measured, tuple) else (measured,)))
        target = f">= {at_least:g}" if at_least is not None else f"<= {at_most:g}"
        # None in the simulator, or for a NaN: a baseline that could not run
        met = None if not ON_GPU or value != value else meets(value, target)
        record = {"what": what, "measured": value, "spread": spread or None, "target": target, "met": met}
        self.bars.append(record)
        verdict = {True: "MET", False: "NOT MET",
                   None: "not judged: " + ("simulator" if not ON_GPU else "not measured")}[met]
        print(f"bar: {what}: {bar_figure(record)} (target {target}) -> {verdict}")
        return met

    def savefig(self, figure, name):
        path = results.device_dir() / f"{self.id}_{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        self.figures.append(path.name)
        if not ON_GPU:
            self.show_stored_figure(name)
        return path

    def show_stored_figure(self, name):
        """In the simulator: the same plot as measured on the reference GPU, shown inline in a notebook."""
        stored = results.RESULTS / results.REFERENCE_DEVICE / f"{self.id}_{name}.png"
        if not stored.exists():
            print(f"(no stored GPU plot {stored.name} yet)")
            return
        device = self.stored["stamp"]["device"] if self.stored else results.REFERENCE_DEVICE
        print(f"The plot above is from the simulator (its times mean nothing). The same plot measured on "
              f"{device}: {stored.relative_to(results.ROOT)}")
        try:
            from IPython import get_ipython
            from IPython.display import Image, display
        except ImportError:
            return
        if get_ipython() is not None:
            display(Image(filename=str(stored)))

    def record(self, key, values):
        """Figures that are not a comparison (e.g. {variant: wall us per step}), stored with the
        chapter; in the simulator the stored GPU ones are printed after them."""
        self.records[key] = values
        if not ON_GPU:
            stored = (self.stored or {}).get("records", {}).get(key)
            print(f"stored on {self.stored['stamp']['device']}: {stored}" if stored else
                  f"(no stored GPU figures for {key!r} yet)")

    def save(self):
        payload = {"chapter": self.id, "title": self.title, "stamp": results.stamp(),
                   "cases": self.cases, "bars": self.bars, "figures": self.figures, "records": self.records}
        path = results.save_json(self.id, payload)
        print(f"saved {path}", file=sys.stderr)
        return path

    def show_stored(self, key):
        """Print the stored GPU result for case `key`, if the repository has one."""
        if not self.stored:
            print(f"(no stored GPU results for {self.id} yet)")
            return
        stamp = self.stored["stamp"]
        for case in self.stored["cases"]:
            if case["key"] == key:
                from rich.console import Console
                from rich.table import Table

                table = Table(title=f"stored on {stamp['device']} ({case['size']}), {stamp['date'][:10]}")
                for column in ("variant", "median ms", "GB/s", "of ceiling", "TFLOP/s", "vs first",
                               "host us/call", "1 call us"):
                    table.add_column(column, justify="left" if column == "variant" else "right")
                for row in case["rows"]:
                    speedup = row.get("speedup_vs_first")
                    table.add_row(row["variant"], _fmt(row["median_ms"], ".4g"), _fmt(row["gbps"], ".0f"),
                                  _fmt(row["fraction_of_ceiling"], ".0%"), _fmt(row["tflops"], ".2f"),
                                  "-" if not speedup else f"{speedup[0]:.2f}x", _fmt(row.get("host_us"), ".0f"),
                                  _fmt(row.get("latency_us"), ".0f"))
                Console(width=140).print(table)


def _fmt(value, spec):
    return "-" if value is None else format(value, spec)
