"""How the workbook draws its tables: one width, one way to print a figure.

Every table fits a 100-column terminal or notebook cell; rich wraps the text of a cell that would
not fit rather than the table."""

WIDTH = 100


def console(**options):
    """A rich Console of the workbook's width (options: rich's, e.g. record=True)."""
    from rich.console import Console

    return Console(width=WIDTH, **options)


def fmt(value, spec, suffix=""):
    """A figure as text, "-" where there is none."""
    return "-" if value is None else format(value, spec) + suffix


def yes_no(value):
    return "-" if value is None else ("yes" if value else "NO")


def ratio(triple):
    """A speed-up's median, from the (median, p25, p75) a comparison stores."""
    return "-" if not triple or triple[0] != triple[0] else f"{triple[0]:.2f}x"


def comparison(title, rows, *, ceiling=None, timed=True):
    """A comparison's rows (bench.Comparison.rows(), or the same rows stored in a chapter's JSON) as
    a rich Table: the speed-up columns are named in the caption, and the rate columns that no
    variant has are left out. timed=False (the simulator): which variant is correct, nothing else."""
    from rich import box
    from rich.table import Table

    if not timed:
        table = Table(title=title, caption="simulator: times are not meaningful", box=box.SIMPLE_HEAD)
        table.add_column("variant")
        table.add_column("correct", justify="right")
        for row in rows:
            table.add_row(row["variant"], yes_no(row["correct"]))
        return table
    first = next((r["variant"] for r in rows if r["kind"] == "kernel"), rows[0]["variant"] if rows else "-")
    base = next((r["variant"] for r in rows if r["kind"] == "baseline"), None)
    caption = (f"ms: GPU time of a call, median \\[p25-p75]; vs 1st: speed-up over {first}"
               + (f"; vs base: over {base}" if base else "")
               + "; host: what a call costs the CPU, us; 1 call: one call synchronised, wall clock, us")
    if ceiling:
        caption += f"; ceil: of the copy ceiling, {ceiling['gbps']:.0f} GB/s ({ceiling['how']})"

    def spread(r):
        low, high = r.get("p25_ms"), r.get("p75_ms")
        return f"{r['median_ms']:.4g}" + (f" [{low:.3g}-{high:.3g}]" if low is not None else "")

    columns = [("ms", spread), ("GB/s", lambda r: fmt(r.get("gbps"), ".0f")),
               ("ceil", lambda r: fmt(r.get("fraction_of_ceiling"), ".0%")), ("TFLOP/s", lambda r: fmt(r.get("tflops"), ".2f")),
               ("vs 1st", lambda r: ratio(r.get("speedup_vs_first")))]
    if base:
        columns.append(("vs base", lambda r: ratio(r.get("speedup_vs_baseline"))))
    columns += [("host", lambda r: fmt(r.get("host_us"), ".0f") + (" sync" if r.get("synchronises") else "")),
                ("1 call", lambda r: fmt(r.get("latency_us"), ".0f"))]
    columns = [(name, cell) for name, cell in columns if any(cell(r) != "-" for r in rows)]
    table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD)
    table.add_column("variant", ratio=1)
    table.add_column("ok", justify="right", no_wrap=True)
    for name, _ in columns:
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row["variant"], yes_no(row["correct"]), *(cell(row) for _, cell in columns))
    return table
