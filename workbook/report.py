"""What the commands print and write: the chapters found, the summary of a run or of stored
results (console and Markdown, results/README.md's bar table), and the table of kernels compiled for a GPU."""

import json
import re
from pathlib import Path

import workbook
from workbook import results, tables
from workbook.chapter import MET, NOT_MET, WITHIN_NOISE, bar_figure, bar_spread, verdict

CHAPTERS = results.ROOT / "chapters"
README_BEGIN, README_END = "<!-- results:begin -->", "<!-- results:end -->"


def chapter_scripts(wanted=()):
    """{notebook id: its source}, in order. A chapter's folder chapters/chNN_name/ holds one notebook,
    chNN_name.py (id chNN), or its parts chNNa_part.py, chNNb_part.py ... (ids chNNa, chNNb), each
    a notebook of its own with its own results. `wanted`: ids or folder names (ch08, ch08_capstone,
    capstone); a chapter's id or folder selects all its parts."""
    found, matched = {}, set()
    for folder in sorted(CHAPTERS.glob("ch[0-9][0-9]_*")):
        chapter_id = folder.name[:4]
        for script in sorted(folder.glob(f"{chapter_id}*_*.py")):
            notebook_id = script.name.split("_", 1)[0]
            if not re.fullmatch(rf"{chapter_id}[a-z]?", notebook_id):
                continue
            names = {chapter_id, notebook_id, folder.name, folder.name[5:]}
            if not wanted or names & set(wanted):
                found[notebook_id] = script
                matched |= names
    missing = set(wanted) - matched
    if missing:
        raise SystemExit(f"no such chapter: {', '.join(sorted(missing))}; have {', '.join(found)}")
    return found


def chapter_of(notebook_id):
    """The chapter a notebook id belongs to: ch09 for ch09a (its folder, tests and exercises)."""
    return notebook_id[:4]



def _load(chapter_id, slug, base=None):
    path = (base or results.RESULTS) / slug / f"{chapter_id}.json"
    return json.loads(path.read_text()) if path.exists() else None


def summary_rows(chapter_ids, slug, base=None):
    """Rows of the summary: this run's correctness, and times from this run or (simulator) stored.

    base: the folder this run wrote to (results/ unless WORKBOOK_RESULTS says otherwise)."""
    rows, bars = [], []
    for chapter_id in chapter_ids:
        record = _load(chapter_id, slug, base)
        if record is None:
            continue
        timed = record if record["stamp"]["mode"] == "gpu" else _load(chapter_id, results.REFERENCE_DEVICE)
        timed_cases = {case["key"]: case for case in (timed or {}).get("cases", [])}
        keys = [case["key"] for case in record["cases"]]
        cases = [(case, False) for case in record["cases"]]
        if timed is not record:  # the simulator: the reference GPU's cases it did not run (other sizes)
            stored_keys = [case["key"] for case in timed_cases.values()]
            cases += [(case, True) for case in (timed or {}).get("cases", [])
                      if case["key"] not in keys and stored_keys.count(case["key"]) == 1]
        for case, stored_only in cases:
            if keys.count(case["key"]) > 1:
                continue  # the points of a sweep: the chapter's plot shows them
            timed_case = timed_cases.get(case["key"], {})
            timed_rows = {row["variant"]: row for row in timed_case.get("rows", [])}
            for row in case["rows"]:
                t = timed_rows.get(row["variant"], {})
                vs_first, vs_base = t.get("speedup_vs_first"), t.get("speedup_vs_baseline")
                rate = tables.fmt(t.get("tflops"), ".2f", " TFLOP/s") if t.get("tflops") else tables.fmt(
                    t.get("gbps"), ".0f", " GB/s")
                rows.append({
                    "chapter": chapter_id, "case": case["key"] + (f" ({size})" if (size := timed_case.get("size")
                                                                                    or case["size"]) else ""),
                    "timed": bool(t), "stored only": stored_only,
                    "kernel": row["variant"] + (" (baseline)" if row["kind"] == "baseline" else ""),
                    "correct": {None: "-", True: "yes", False: "NO"}[row["correct"]],
                    "time": tables.fmt(t.get("median_ms"), ".4g", " ms"), "rate": rate,
                    "ceiling": tables.fmt(t.get("fraction_of_ceiling"), ".0%"),
                    "vs naive": "-" if not vs_first else f"{vs_first[0]:.2f}x",
                    "vs baseline": "-" if not vs_base else f"{vs_base[0]:.2f}x",
                    "host/call": tables.fmt(t.get("host_us"), ".0f", " us") + (" (sync)" if t.get("synchronises") else ""),
                    "1 call": tables.fmt(t.get("latency_us"), ".0f", " us"),
                })
        for bar in (timed or {}).get("bars", []):
            bars.append({"chapter": chapter_id, **bar})
    return rows, bars


SHORT_HEADERS = {"correct": "ok", "ceiling": "ceil", "vs naive": "naive", "vs baseline": "base",
                 "host/call": "host"}  # the console's table; the Markdown one keeps the long names
COLUMNS = ("chapter", "case", "kernel", "correct", "time", "rate", "ceiling", "vs naive", "vs baseline",
           "host/call", "1 call")


def summary(console, chapter_ids, slug, base=None):
    from rich.table import Table

    rows, bars = summary_rows(chapter_ids, slug, base)
    if not workbook.ON_GPU:
        return simulator_summary(console, chapter_ids, slug, bars, base)
    source = "this run" if workbook.ON_GPU else f"stored {results.REFERENCE_DEVICE} results"
    from rich import box

    console.print(f"[bold]Summary[/]: correctness from this run ({workbook.MODE}); times, rates and speed-ups "
                  f"from {source}. Per case: time of a call on the GPU, GB/s or TFLOP/s, fraction of the copy "
                  "ceiling, speed-up vs the naive kernel and vs the baseline, host cost per call, one call "
                  "synchronised.")
    shown = [c for c in COLUMNS if c not in ("chapter", "case")]
    by_case = {}
    for row in rows:
        by_case.setdefault(f"{row['chapter']} {row['case']}", []).append(row)
    for case, case_rows in by_case.items():  # a table per case: its title heads it, and 100 columns fit
        if not any(row["timed"] for row in case_rows):  # the simulator's sizes or variants only: no figures
            correct = sum(row["correct"] == "yes" for row in case_rows)
            console.print(f"[bold]{case}[/]: {correct} of {len(case_rows)} correct here; the reference GPU ran "
                          "other sizes or variants (their tables follow the chapter's)")
            continue
        if case_rows[0]["stored only"]:
            case += " [dim](the reference GPU's run, not the simulator's)[/]"
        table = Table(title=case, title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, pad_edge=False)
        for column in shown:
            table.add_column(SHORT_HEADERS.get(column, column), justify="left" if column == "kernel" else "right",
                             no_wrap=column != "kernel", ratio=1 if column == "kernel" else None)
        for row in case_rows:
            table.add_row(*(row[c].replace("TFLOP/s", "TF/s").replace(" (sync)", " sync") for c in shown))
        console.print(table)
    if bars:
        bar_table = Table(title=f"Bars ({source})")
        for column in ("chapter", "bar", "measured [p25-p75]", "target", "verdict"):
            bar_table.add_column(column)
        for bar in bars:
            bar_table.add_row(bar["chapter"], bar["what"], f"{bar_figure(bar)} {bar_spread(bar)}", bar["target"],
                              _VERDICT[verdict(bar)])
        console.print(bar_table)


_VERDICT = {MET: "[green]met[/]", WITHIN_NOISE: "[yellow]within noise[/]", NOT_MET: "[red]not met[/]", None: "-"}


def simulator_summary(console, chapter_ids, slug, bars, base=None):
    """The main job's end in the simulator, a few lines a chapter: how many kernels this run checked
    and whether they were right (its times mean nothing), then the chapter's bars as the reference
    GPU measured them. Every case's stored figures are in that GPU's SUMMARY.md."""
    from rich.markup import escape

    reference = results.REFERENCE_DEVICE
    console.print(f"[bold]Summary[/]: the kernels checked in the simulator; the bars as the reference GPU measured "
                  f"them (stored in results/{reference}/, every case's figures in results/{reference}/SUMMARY.md).")
    for chapter_id in chapter_ids:
        record = _load(chapter_id, slug, base)
        if record is None:
            continue
        checked = [(case["key"], row["variant"], row["correct"]) for case in record["cases"] for row in case["rows"]
                   if row.get("correct") is not None]
        wrong = [f"{key}: {variant}" for key, variant, correct in checked if not correct]
        status = "[green]all correct[/]" if not wrong else f"[red]{len(wrong)} wrong[/] ({'; '.join(wrong)})"
        console.print(f"[bold]{chapter_id}[/] {record.get('title', '')}: {len(checked)} kernel runs checked in "
                      f"{len(record['cases'])} cases, {status}")
        for bar in (b for b in bars if b["chapter"] == chapter_id):
            spread = bar_spread(bar)
            console.print(f"  {_VERDICT[verdict(bar)]}  {escape(bar['what'])}: {bar_figure(bar)}"
                          f"{' ' + spread if spread else ''} (target {bar['target']})", highlight=False)


def markdown_tables(slug):
    """(bars, full table, stamps) in Markdown, from the stored results of device `slug`."""
    ids = list(chapter_scripts())
    rows, bars = summary_rows(ids, slug)
    shown = {MET: "met", WITHIN_NOISE: "*within noise*", NOT_MET: "**not met**", None: "-"}
    bar_lines = ["| chapter | bar (from the issue) | measured | p25-p75 | target | verdict |", "|---|---|---|---|---|---|"]
    bar_lines += [f"| {b['chapter']} | {b['what']} | {bar_figure(b)} | {bar_spread(b)[1:-1] or '-'} | {b['target']} "
                  f"| {shown[verdict(b)]} |" for b in bars]
    full_lines = ["| " + " | ".join(COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    full_lines += ["| " + " | ".join(row[c] for c in COLUMNS) + " |" for row in rows]
    stamps = []
    for chapter_id in ids:
        record = _load(chapter_id, slug)
        if record:
            s = record["stamp"]
            stamps.append(f"- {chapter_id}: {s['device']}, driver {s['device_facts'].get('driver')}, numba "
                          f"{s['numba']}, numba-cuda {s['numba_cuda']}, numpy {s['numpy']}, torch {s['torch']}, "
                          f"{s['date']}")
    return "\n".join(bar_lines), "\n".join(full_lines), "\n".join(stamps)



def main_job_walls(slug):
    """(total seconds, {chapter: seconds}) of the stored chapters' walls on device `slug`: what
    `python -m workbook run` took there, a chapter at a time."""
    walls = {}
    for chapter_id in chapter_scripts():
        record = _load(chapter_id, slug)
        if record and (record.get("wall") or {}).get("seconds") is not None:
            walls[chapter_id] = record["wall"]["seconds"]
    return sum(walls.values()), walls


def write_readme(slug):
    """The bar table into results/README.md (between its markers) and every row into
    results/<slug>/SUMMARY.md."""
    bars, full, stamps = markdown_tables(slug)
    summary_path = results.RESULTS / slug / "SUMMARY.md"
    summary_path.write_text(f"# Stored results on {slug}\n\n(generated by `python -m workbook table "
                            f"--readme` from the JSON files beside this one)\n\n{full}\n\n{stamps}\n")
    readme = results.RESULTS / "README.md"
    content = readme.read_text()
    before, rest = content.split(README_BEGIN, 1)
    _, after = rest.split(README_END, 1)
    generated = (f"(generated by `python -m workbook table --readme` from results/{slug}/; every "
                 f"kernel, time, rate and speed-up is in [its summary]({slug}/SUMMARY.md))")
    total, walls = main_job_walls(slug)
    if walls:
        generated += (f"\n\nThe main job there, a chapter at a time: {total:.0f} s in all ("
                      + ", ".join(f"{chapter} {seconds:.0f}" for chapter, seconds in walls.items()) + ").")
    readme.write_text(f"{before}{README_BEGIN}\n{generated}\n\n{bars}\n\nStamps:\n{stamps}\n{README_END}{after}")
    return readme, summary_path


def compile_records(log_dir):
    """{(kernel, signature): record} from the JSON lines the simulator's compile hook wrote."""
    records = {}
    for path in sorted(Path(log_dir).glob("compile-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["kernel"].startswith("_exercise_variant"):
                continue  # the tests' stubs and planted wrong answers: not the workbook's kernels
            records[(record["kernel"], record["signature"])] = record
    return records


def module_kernels(chapter_ids, skip=("exercises",)):
    """'module.name' of every kernel defined at the top level of the chapters' modules (but those
    named in `skip`: the stubs of exercises.py are not launched when the solutions are checked)."""
    import importlib

    from numba.cuda.simulator.kernel import FakeCUDAKernel

    names = set()
    scripts = chapter_scripts(chapter_ids).values()
    notebooks = {script.stem for script in scripts}
    for folder in dict.fromkeys(script.parent for script in scripts):  # a chapter's parts share a folder
        for path in sorted(folder.glob("*.py")):
            if path.stem in ("checks", "__init__", *notebooks, *skip):
                continue
            module = importlib.import_module(f"chapters.{folder.name}.{path.stem}")
            for value in vars(module).values():
                if isinstance(value, FakeCUDAKernel) and not value._device and \
                        value.fn.__module__ == module.__name__:
                    names.add(f"{module.__name__}.{value.fn.__qualname__}")
    return names


# The GPUs of each compute capability, for the table's header (the targets themselves come from the
# installed compiler: workbook/compiler.py's supported_targets)
GPUS = {(7, 5): "T4, RTX 20", (8, 0): "A100, A30", (8, 6): "RTX 30, A10, A40", (8, 7): "Jetson Orin",
        (8, 9): "RTX 40, L4, L40", (9, 0): "H100, H200", (10, 0): "B200", (10, 1): "Jetson Thor",
        (10, 3): "B300", (12, 0): "RTX 50, RTX PRO 6000", (12, 1): "DGX Spark"}


def _cc_text(cc):
    return f"{cc[0]}.{cc[1]}"


def _numba_notation(signature):
    """array(float32, 2d, C) as numba's error messages write it, float32[:, ::1]: a row fits."""
    import re

    def short(match):
        dims = [":"] * int(match[2])
        if match[3] in ("C", "F") and dims:
            dims[-1 if match[3] == "C" else 0] = "::1"
        return f"{match[1]}[{', '.join(dims)}]"

    return re.sub(r"\barray\((\w+), (\d+)d, ([CFA])\)", short, signature)


def compile_table(records, console, targets, never_launched=(), family_of=None):
    """The table of every (kernel, signature) and target: registers, local memory and spilled bytes
    a thread (ptxas) where it was built, "skip" with the reason where the kernel uses an instruction the
    target lacks or the installed compiler cannot build it (compiler.COMPILER_LIMITS; a footnote under
    the table each), the error where it would not compile. Returns the number of errors.

    records: report.compile_records after compiler.build_everywhere (each with "everywhere");
    targets: the (major, minor) built; family_of: {target: the later targets running its build}."""
    from rich.markup import escape
    from rich.table import Table

    family_of = family_of or {}
    table = Table(title="Every kernel launched, built for each GPU target without a GPU: registers a thread, "
                        "L bytes of local memory (arrays not kept in registers), S bytes spilled")
    table.add_column("kernel, where, signature", ratio=1, min_width=34, overflow="fold")  # a name to search for
    for cc in targets:
        later = family_of.get(tuple(cc), [])
        table.add_column(_cc_text(cc) + (f" (+{', '.join(map(_cc_text, later))})" if later else ""),
                         overflow="fold", justify="right", max_width=12)
    notes, built, skipped, not_here, errors = {}, 0, 0, 0, 0

    def note(text):
        return notes.setdefault(text, len(notes) + 1)

    for (kernel, signature), record in sorted(records.items()):
        short = kernel.replace("chapters.", "").replace("_exercise_variant", "variant")
        cells = []
        if record["ok"] is not True:
            errors += 1
            mark = note(f"{short} ({signature}): {record['error'][:1500]}")
            cells = [f"[red]ERROR[/] [{mark}]"] * len(targets)
        for cc in targets if record["ok"] is True else ():
            entry = record.get("everywhere", {}).get(_cc_text(cc), {"not_built": "not built"})
            if "skipped" in entry and entry.get("compiler"):  # this compiler's limit, not the GPU's
                not_here += 1
                cells.append(f"[magenta]skip[/] [{note(entry['skipped'])}]")
            elif "skipped" in entry:
                skipped += 1
                cells.append(f"[yellow]skip[/] [{note(entry['skipped'])}]")
            elif "error" in entry or "not_built" in entry:
                errors += 1
                why = entry.get("error") or f"not built: {entry['not_built']}"
                cells.append(f"[red]ERROR[/] [{note(f'{short} ({signature}) for {_cc_text(cc)}: {why[:1500]}')}]")
            else:
                built += 1
                registers, spills, stack = (entry.get(key) for key in ("registers", "spill_bytes", "stack_bytes"))
                text = "yes" if registers is None else str(registers)
                cells.append(("" if entry.get("cc", _cc_text(cc)) == _cc_text(cc) else f"{entry['cc']}: ") + text
                             + (f" [yellow]L{stack}[/]" if stack else "") + (f" [red]S{spills}[/]" if spills else ""))
        where, _, name = short.rpartition(".")
        shown = _numba_notation(signature)
        shown = shown if len(shown) < 160 else shown[:157] + "..."
        table.add_row(f"{escape(name)}\n[dim]{escape(where)} ({escape(shown)})[/]", *cells)
    width = console.width
    console.width = max(width, 40 + 14 * len(targets))  # a column a target: wider than a notebook's tables
    console.print(table)
    console.width = width
    for text, number in notes.items():
        console.print(f"[{number}] {text}", highlight=False, markup=False)
    kernels = {kernel for kernel, _ in records}
    console.print(f"{len(records)} (kernel, signature) pairs of {len(kernels)} kernels, for "
                  + ", ".join(_cc_text(cc) + (f" ({GPUS[tuple(cc)]})" if tuple(cc) in GPUS else "") for cc in targets)
                  + f": {built} built, {skipped} skipped for an instruction the target lacks (the reasons above), "
                  + (f"{not_here} not built by the installed compiler for a limit of its own (above), " if not_here
                     else "") + f"{errors} would not compile")
    if never_launched:
        console.print("defined but launched by no test, so not compiled here: " + ", ".join(sorted(never_launched)))
    return errors
