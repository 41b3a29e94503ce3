"""A chapter's record: every comparison it ran, the bars it was held to, its plots.

    chapter = Chapter("ch00", "Measuring a kernel")
    result = chapter.compare("copy", {...}, reference=..., bytes=..., size="n=2^26")
    chapter.bar("optimized copy vs torch copy", result.ratio("torch copy", "grid-stride x4"), at_least=0.9)
    chapter.save()        # results/<device>/ch00.json, read by `python -m workbook run` and `table`

In the simulator the same calls run (and check) every kernel, and each comparison is followed by the
stored GPU figures for the same case, so a student without a GPU still sees what the GPU does.
"""


from . import ON_GPU, bench, results, tables


def meets(value, target):
    """Does `value` meet a bar's target, written ">= limit" or "<= limit"?"""
    sign, limit = target.split()
    return value >= float(limit) if sign == ">=" else value <= float(limit)


MET, WITHIN_NOISE, NOT_MET = "met", "within noise", "not met"


def verdict(record):
    """A bar's verdict from its figure, its spread and its target (None: not judged).

    met: the whole measured spread (25th-75th percentile of the per-repeat figures) clears the
    target; within noise: the median does but the spread straddles it, so another run may read
    either way; not met: the median misses. A bar without a spread (a count, an accuracy) is
    judged on its value."""
    if record.get("met") is None or record["measured"] != record["measured"]:
        return None
    spread = record.get("spread") or [record["measured"]]
    if not meets(record["measured"], record["target"]):
        return NOT_MET
    return MET if all(meets(value, record["target"]) for value in spread) else WITHIN_NOISE


def bar_figure(record):
    """A bar's measured figure as text: 3 significant digits, more where rounding would make a
    missed bar read as its target (1.4976 against ">= 1.5" prints 1.498, not 1.5), and the
    spread beside it where the run measured one."""
    digits = 3
    text = f"{record['measured']:.{digits}g}"
    missed = not meets(record["measured"], record["target"])
    while missed and meets(float(text), record["target"]) and digits < 9:
        digits += 1
        text = f"{record['measured']:.{digits}g}"
    return text


def bar_spread(record):
    """The bar's measured spread as text, "[low-high]", or "" where it has none."""
    spread = record.get("spread")
    return f"[{spread[0]:.3g}-{spread[1]:.3g}]" if spread else ""


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

        `measured` may be a number or the (median, p25, p75) triple that Comparison.ratio returns;
        with a spread, the bar is met only when all of it clears the target (see `verdict`).
        In the simulator a bar is not judged (times mean nothing there).
        """
        value, *spread = (float(v) for v in (measured if isinstance(measured, tuple) else (measured,)))
        target = f">= {at_least:g}" if at_least is not None else f"<= {at_most:g}"
        # None in the simulator, or for a NaN: a baseline that could not run
        judged = ON_GPU and value == value  # not in the simulator, nor for a NaN: a baseline that could not run
        record = {"what": what, "measured": value, "spread": spread or None, "target": target,
                  "met": True if judged else None}
        record["verdict"] = verdict(record)
        record["met"] = None if not judged else record["verdict"] == MET
        self.bars.append(record)
        said = record["verdict"] or "not judged: " + ("simulator" if not ON_GPU else "not measured")
        print(f"bar: {what}: {bar_figure(record)} {bar_spread(record)} (target {target}) -> {said}")
        return record["met"]

    def savefig(self, figure, name):
        path = results.device_dir() / f"{self.id}_{name}.png"
        figure.savefig(path, dpi=110, bbox_inches="tight")
        self.figures.append(path.name)
        if not ON_GPU:
            print(f"This run's {path.name} is the simulator's (drawn at the end of this cell in a notebook): "
                  "tiny sizes, and times that mean nothing.")
            self.show_stored_figure(name)
        return path

    def show_stored_figure(self, name):
        """In the simulator: the same plot as measured on the reference GPU, shown inline in a notebook."""
        stored = results.RESULTS / results.REFERENCE_DEVICE / f"{self.id}_{name}.png"
        if not stored.exists():
            print(f"(no stored GPU plot {stored.name} yet)")
            return
        device = self.stored["stamp"]["device"] if self.stored else results.REFERENCE_DEVICE
        print(f"The same plot measured on {device}: {stored.relative_to(results.ROOT)}")
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
            print(f"stored on {self.stored['stamp']['device']}: {_brief(stored)}" if stored else
                  f"(no stored GPU figures for {key!r} yet)")

    def save(self):
        payload = {"chapter": self.id, "title": self.title, "stamp": results.stamp(),
                   "cases": self.cases, "bars": self.bars, "figures": self.figures, "records": self.records}
        path = results.save_json(self.id, payload)
        print(f"saved {path}")  # nothing returned: a notebook's last line would echo it

    # -- figures for the text: never typed by hand ------------------------------------------------

    def figures_source(self):
        """Where the text's figures come from: this run on a GPU, the stored GPU run in the simulator."""
        if ON_GPU:
            return {"cases": self.cases, "bars": self.bars, "records": self.records,
                    "stamp": results.stamp()}
        if not self.stored:
            raise LookupError(f"no stored GPU results for {self.id} (results/{results.REFERENCE_DEVICE}/"
                              f"{self.id}.json): run the chapter on a GPU first")
        return self.stored

    def figure(self, name, variant=None, field="median_ms", *, size=None):
        """A measured figure, for the chapter's closing figures (see `show_figures`).

        name: a bar's text (its measured value, or field "p25"/"p75" for its spread), a record's key
        (with `variant`: one of its values; an int `field` indexes a series), or a case's key with `variant`: that row's `field`
        (median_ms, gbps, tflops, fraction_of_ceiling, host_us, latency_us, speedup_vs_first,
        speedup_vs_baseline). `size` (the start of the case's size text) picks one of the cases that
        share a key (the points of a sweep, the layers of a split).
        Raises LookupError, naming what exists, if there is no such figure."""
        source = self.figures_source()
        for bar in source["bars"]:
            if bar["what"] == name:
                if field in ("p25", "p75"):
                    return bar["spread"][field == "p75"]
                return bar["measured"]
        if name in source["records"]:
            values = source["records"][name]
            values = values if variant is None else values[variant]
            return values[field] if isinstance(field, int) else values  # a series' point: field -1, its last
        cases = [c for c in source["cases"] if c["key"] == name and (size is None or c["size"].startswith(size))]
        if not cases:
            known = sorted({c["key"] for c in source["cases"]} | {b["what"] for b in source["bars"]}
                           | set(source["records"]))
            raise LookupError(f"{self.id} has no case, bar or record {name!r}" + (f" of size {size!r}" if size else "")
                              + f"; it has: {known}")
        rows = {row["variant"]: row for row in cases[-1]["rows"]}
        if variant not in rows:
            raise LookupError(f"{self.id} case {name!r} has no variant {variant!r}; it has: {sorted(rows)}")
        value = rows[variant][field]
        return value[0] if isinstance(value, list | tuple) else value  # a ratio: its median

    def show_figures(self, figures):
        """The measured figures a chapter's closing bullets point to, a row each, so that the bullets
        themselves hold no figure that could age: {label: (format, *figures)}, format a str.format
        spec ("{:.1f} / {:.1f} ms") and each figure one of
            ("case", "variant", "field")   self.figure's arguments (a str alone: a bar or a record)
            chapter.ratio(a, b)            figure a / figure b, each as above
            a function of no arguments     anything else (a record's last value, a count)
        From this run on a GPU, from the stored GPU run in the simulator; a row whose figures are not
        all there reads "not measured here" (a GPU without the instruction, a run without torch)."""
        try:
            stamp = self.figures_source()["stamp"]
            origin = ("this run" if ON_GPU else "the stored run") + f" on {stamp['device']}, {stamp['date'][:10]}"
        except LookupError:
            origin = "no GPU run yet"
        rows = []
        for label, (spec, *wanted) in figures.items():
            try:
                rows.append((label, spec.format(*(self._read(w) for w in wanted))))
            except (LookupError, TypeError, ZeroDivisionError):
                rows.append((label, "not measured here"))
        width = max(len(label) for label, _ in rows) if rows else 0
        print(f"Figures from {origin}:")
        for label, value in rows:
            print(f"  {label:<{width}}  {value}")

    def ratio(self, a, b):
        """A figure for show_figures: figure a / figure b (each a figure's arguments, or a function)."""
        return lambda: self._read(a) / self._read(b)

    def _read(self, wanted):
        if callable(wanted):
            return wanted()
        return self.figure(*((wanted,) if isinstance(wanted, str) else wanted))

    def show_stored(self, key):
        """Print the stored GPU result for case `key`, if the repository has one."""
        if not self.stored:
            print(f"(no stored GPU results for {self.id} yet)")
            return
        stamp = self.stored["stamp"]
        for case in self.stored["cases"]:
            if case["key"] == key:
                title = f"stored on {stamp['device']} ({case['size']}), {stamp['date'][:10]}"
                tables.console().print(tables.comparison(title, case["rows"], ceiling=case.get("ceiling")))


def _brief(values):
    """A record as a reader wants it printed: figures to 4 digits, a long series as its length and
    its last value."""
    if isinstance(values, dict):
        return "{" + ", ".join(f"{key}: {_brief(value)}" for key, value in values.items()) + "}"
    if isinstance(values, list):
        return f"{len(values)} values, the last {_brief(values[-1])}" if len(values) > 4 else str(
            [float(f"{v:.4g}") for v in values])
    return f"{values:.4g}" if isinstance(values, float) else str(values)
