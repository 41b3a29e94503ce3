"""numba-cuda and numba-cuda-mlir side by side on a GPU: `python -m workbook compilers [chNN ...]`.

For each chapter, its tests run once with every launch compiled by the successor
(WORKBOOK_COMPILER=numba-cuda-mlir, see successor.py), under this module as a pytest plugin. The
plugin notes every kernel launched: the tests that launched it and whether they passed (the tests
check every kernel against its NumPy reference, so a kernel is correct under the successor when
every test that launched it passed), and its largest launch. When the tests end, each kernel's
largest launch is timed under both compilers on the same buffers, interleaved (bench.time_interleaved:
CUDA events, the GPU held until the call is queued, the L2 flushed before each call), and ptxas -v
reads each compiler's PTX for registers and spilled bytes a thread. The test workers take their turn
at the GPU one after the other, once all of them have finished their tests.

The rows go to results/<device>/compilers.json, with the device stamp; `python -m workbook table
--readme` writes them as results/<device>/COMPILERS.md and the summary in docs/compilers.md. What the
timings are: one launch of the size the tests made, cold in the L2, GPU time; not a chapter's benchmark.
"""

import fcntl
import json
import os
import sys
import time
from pathlib import Path

import pytest
from numba import cuda

from . import results, successor, successor_mends

OUT = "WORKBOOK_COMPILERS_OUT"  # where the plugin writes (set by the command)
# The rebuild's version (successor.py): a chapter measured with an older one says so in the tables.
TRANSLATION = 2
OLDER = {1: "measured with an older rebuild, which handed numba-cuda's inline='never' to the successor as "
            "'never inline': every device function a real call. Its kernels passed their checks with that "
            "rebuild; measure again"}
# How rows are told apart (variant): 2 looks into the closures of the device functions a kernel calls.
# A chapter measured under rule 1 may hold one row for kernels of a factory that differ only there.
VARIANT_RULE = 2
REPEATS = 11

_kernels = {}  # (kernel, signature) -> what was seen of it
_launched_now = set()


# ---------------------------------------------------------------------------------------------
# The plugin, in each test process


def _name(dispatcher):
    fn = dispatcher.py_func
    return f"{fn.__module__}.{fn.__qualname__}"


def variant(fn, _seen=()):
    """What tells apart the kernels one factory makes (`_make_fused_kernel(np.float16)`): the numbers,
    strings, dtypes and device functions' names its closure holds, "element=float16"; for a device
    function a factory made, what its own closure holds, "forward.load4=load_each4"; "" for a kernel
    made once."""
    import numpy as np

    parts, _seen = [], (*_seen, fn)
    for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            value = cell.cell_contents
        except ValueError:  # not assigned yet
            continue
        if isinstance(value, type) and issubclass(value, np.generic):
            value = value.__name__
        elif isinstance(value, tuple) and all(isinstance(v, (int, np.integer)) for v in value):
            value = "x".join(str(v) for v in value)
        elif callable(python := getattr(value, "py_func", getattr(value, "fn", value))) and hasattr(python, "__name__"):
            # a device function (a dispatcher, the simulator's, or plain): what its closure holds, or its name
            jitted = python is not value and hasattr(python, "__code__")  # not an intrinsic, not plain Python
            inner = variant(python, _seen) if jitted and python not in _seen else ""
            if inner:
                parts.extend(f"{name}.{part}" for part in inner.split(", "))
                continue
            value = python.__name__
        elif not isinstance(value, (bool, int, float, str, np.generic, np.dtype)):
            continue  # an object: its settings are in the numbers beside it
        parts.append(f"{name}={value}")
    return ", ".join(parts)


def _observe(dispatcher, args, launch_config):
    import numpy as np
    from numba.cuda.cudadrv.devicearray import DeviceNDArray

    name = _name(dispatcher)
    if not name.startswith("chapters."):
        return  # the tests' own kernels and the workbook's helpers
    signature = ", ".join(str(dispatcher.typeof_pyval(arg)) for arg in args)
    key = (name, variant(dispatcher.py_func), signature)  # a factory's kernels apart: each its own launches
    entry = _kernels.setdefault(key, {"passed": 0, "failed": 0, "error": None, "bytes": -1, "launch": None,
                                      "dispatcher": dispatcher})
    _launched_now.add(key)
    # A table of addresses (chapter 03's) names the arrays it points at in `addressed`: they count
    # toward the launch's size, and the replay, which holds the table, keeps them alive.
    size = sum(getattr(arg, "nbytes", 0) + sum(a.nbytes for a in getattr(arg, "addressed", ())) for arg in args)
    replayable = all(isinstance(arg, DeviceNDArray) or not isinstance(arg, np.ndarray) for arg in args)
    if replayable and size > entry["bytes"]:
        entry["bytes"] = size
        entry["launch"] = (tuple(args), launch_config.griddim, launch_config.blockdim, launch_config.sharedmem)
        entry["dispatcher"] = dispatcher  # the kernel that made the launch replays it, whatever shares its row


def pytest_configure(config):
    import workbook

    if workbook.ON_GPU and _observe not in successor.observers:
        successor.install(observed=True)
        successor.observers.append(_observe)


def pytest_runtest_setup(item):
    _launched_now.clear()


def pytest_runtest_logreport(report):
    if report.when == "call" or report.failed:
        for key in _launched_now:
            entry = _kernels[key]
            if report.failed:
                entry["failed"] += 1
                entry["error"] = entry["error"] or f"{report.nodeid}: {report.longreprtext[-1500:]}"
            elif report.when == "call" and not report.skipped:
                entry["passed"] += 1
    if report.when == "teardown":
        _launched_now.clear()


@pytest.hookimpl(tryfirst=True)  # before xdist's: a worker reports itself finished after its rows are written
def pytest_sessionfinish(session):
    import workbook

    out = os.environ.get(OUT)
    if not (workbook.ON_GPU and out):
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    sizes = {repr(key): entry["bytes"] for key, entry in _kernels.items()  # what this worker can time
             if entry["launch"] is not None and entry["passed"] and not entry["failed"]}
    Path(out, f"sizes-{worker}.json").write_text(json.dumps(sizes))
    Path(out, f"done-{worker}").touch()  # every worker says so, kernels or none
    if not _kernels:
        return
    deadline = time.time() + 120
    while len(list(Path(out).glob("done-*"))) < workers and time.time() < deadline:
        time.sleep(0.5)  # every worker's tests are over: nothing else is on the GPU
    largest = {}  # the worker with each (kernel, signature)'s largest launch times it
    for path in sorted(Path(out).glob("sizes-*.json")):
        for key, size in json.loads(path.read_text()).items():
            if key not in largest or size > largest[key][0]:
                largest[key] = (size, path.stem[len("sizes-"):])
    with open(Path(out, "gpu.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one worker at the GPU at a time
        rows = [_measure(key, entry, largest.get(repr(key), (None, None))[1] == worker)
                for key, entry in sorted(_kernels.items(), key=lambda item: item[0])]
    with open(Path(out, f"rows-{worker}.jsonl"), "w") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")


# ---------------------------------------------------------------------------------------------
# Timing and ptxas


def _facts(ptx):
    from . import compiler

    try:
        return compiler._ptx_facts(ptx, (9, 0))
    except Exception as error:  # noqa: BLE001  (ptxas's message is the answer)
        return {"error": f"{type(error).__name__}: {error}"[:500]}


def _ptx_of(dispatcher, signature_text):
    """The PTX a dispatcher holds for the signature launched (the only one, or the one whose text matches)."""
    sources = dispatcher.inspect_asm()
    if not isinstance(sources, dict):
        return sources
    wanted = signature_text.replace(" ", "")
    for signature, text in sources.items():
        if ",".join(str(t) for t in signature).replace(" ", "") == wanted:
            return text
    return next(iter(sources.values())) if len(sources) == 1 else None


def _measure(key, entry, time_it=True):
    import numpy as np

    from . import bench

    name, made_with, signature = key
    row = {"kernel": name, "variant": made_with, "signature": signature, "tests_passed": entry["passed"], "tests_failed": entry["failed"],
           "correct": entry["failed"] == 0 and entry["passed"] > 0, "error": entry["error"], "bytes": entry["bytes"]}
    dispatcher, launch = entry["dispatcher"], entry["launch"]
    if launch is None or not row["correct"] or not time_it:
        row["timed"] = False
        return row
    args, griddim, blockdim, sharedmem = launch
    launcher = successor.launcher() or successor.Launcher()
    try:
        try:
            cuda.synchronize()
        except Exception as error:  # noqa: BLE001
            raise RuntimeError(f"an earlier launch left the GPU in error: {type(error).__name__}: {error}") from error
        mlir = launcher.kernel(dispatcher)
        mlir_args = [launcher.argument(arg) for arg in args]
        stock_config = dispatcher.configure(griddim, blockdim, 0, sharedmem)

        def stock():
            successor._stock_call(dispatcher, args, stock_config)

        def successor_launch():
            mlir[griddim, blockdim, 0, sharedmem](*mlir_args)

        functions = {successor.STOCK: stock, successor.NAME: successor_launch}
        for which, function in functions.items():  # compiled before anything is timed
            try:
                function()
                cuda.synchronize()
            except Exception as error:  # noqa: BLE001  (which compiler's launch failed is the news)
                raise RuntimeError(f"{which}'s launch, replayed: {type(error).__name__}: {error}") from error
        times = bench.time_interleaved(functions, repeats=REPEATS, flush=True)
        for which, values in times.items():
            low, high = (float(v) for v in np.percentile(values, [25, 75]))
            row[which] = {"median_ms": float(np.median(values)), "spread_ms": [low, high]}
        ratios = times[successor.NAME] / times[successor.STOCK]  # repeat by repeat, over interleaved pairs
        low, high = (float(v) for v in np.percentile(ratios, [25, 75]))
        row["time_ratio"] = {"median": float(np.median(ratios)), "spread": [low, high]}
        row["timed"] = True
        for which, source in ((successor.STOCK, dispatcher), (successor.NAME, mlir)):
            ptx = _ptx_of(source, signature)
            row.setdefault(which, {}).update(_facts(ptx) if ptx else {"error": "no PTX for this signature"})
    except Exception as error:  # noqa: BLE001  (recorded: the row says what went wrong)
        row["timed"] = False
        row["timing_error"] = f"{type(error).__name__}: {error}"[:1500]
    return row


# ---------------------------------------------------------------------------------------------
# The command


def run(chapters, jobs=8, timeout=1200):
    """Run each chapter's tests under the successor with the plugin; merge into compilers.json.
    timeout: seconds a chapter's tests may take (a kernel that hangs under the successor costs one
    chapter, not the whole run)."""
    import shutil
    import subprocess
    import tempfile

    import workbook

    from . import report

    if not workbook.ON_GPU:
        print("`compilers` measures on a GPU. Without one, `WORKBOOK_COMPILER=numba-cuda-mlir python -m workbook "
              "compile` compiles every kernel with the successor.")
        return 2
    reason = successor.missing()
    if reason:
        print(f"cannot compare: {reason}")
        return 2
    cuda_bin = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin"
    if shutil.which("ptxas") is None and (cuda_bin / "ptxas").exists():
        os.environ["PATH"] += os.pathsep + str(cuda_bin)  # ptxas -v: registers and spills of each build
    names = [c for c in chapters if c != "launch"]  # "launch": the launch overhead alone
    wanted = list(dict.fromkeys(map(report.chapter_of, report.chapter_scripts(names)))) if names or not chapters else []
    path = results.device_dir() / "compilers.json"
    stored = json.loads(path.read_text()) if path.exists() else {"chapters": {}}
    if not chapters or "launch" in chapters:
        stored["launch"] = launch_overhead()
        print("launch overhead:", json.dumps(stored["launch"]))
        path.write_text(json.dumps(stored, indent=1) + "\n")
    for chapter_id in wanted:
        tests = sorted(str(p) for p in (results.ROOT / "tests").glob(f"test_{chapter_id}_*.py"))
        if not tests:
            continue
        out = tempfile.mkdtemp(prefix=f"compilers-{chapter_id}-")
        env = dict(os.environ, WORKBOOK_COMPILER=successor.NAME, **{OUT: out})
        started = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
                                   "workbook.compilers", "-n", str(jobs), "-m", "not notebook", *tests],
                                  cwd=results.ROOT, env=env, timeout=timeout)
        except subprocess.TimeoutExpired:
            done = subprocess.CompletedProcess([], returncode=f"timed out after {timeout} s")
        rows = _merged([json.loads(line) for p in sorted(Path(out).glob("rows-*.jsonl"))
                        for line in p.read_text().splitlines()])
        stored["stamp"] = {**results.stamp(), "numba_cuda_mlir": _version()}
        stored["chapters"][chapter_id] = {"rows": rows, "translation": TRANSLATION, "timing_rule": "largest launch",
                                          "pytest_exit": done.returncode, "date": stored["stamp"]["date"],
                                          "variant_rule": VARIANT_RULE, "range_mend": successor_mends.range_mend_on(),
                                          "seconds": round(time.perf_counter() - started, 1)}
        path.write_text(json.dumps(stored, indent=1) + "\n")
        print(f"{chapter_id}: {len(rows)} kernels, pytest exit {done.returncode}, "
              f"{stored['chapters'][chapter_id]['seconds']} s -> {path}")
    return 0


def _axpy(a, x, y, out):
    i = cuda.grid(1)
    if i < out.size:
        out[i] = a * x[i] + y[i]


def launch_overhead(samples=7, calls=200):
    """What one launch of a small kernel (three arrays and a scalar, chapter 07's case) costs its
    host under each compiler, microseconds a launch [25th-75th percentile of `samples` loops of
    `calls` launches queued while the GPU is held]: numba-cuda's `kernel[grid, block](...)`; the
    successor's, on its own device arrays; and the successor's as the workbook routes it
    (WORKBOOK_COMPILER=numba-cuda-mlir: numba's arrays and stream handed over at each launch)."""
    import numpy as np

    from . import bench

    launcher = successor.Launcher()
    mlir_cuda = launcher.translation.cuda
    stock = cuda.jit(_axpy)
    mlir = launcher.kernel(stock)
    n = 1 << 12
    x, y, out = (cuda.to_device(np.ones(n, np.float32)) for _ in range(3))
    mx, my, mout = (mlir_cuda.to_device(np.ones(n, np.float32)) for _ in range(3))
    grid, block = n // 256, 256
    ways = {"numba-cuda": lambda: stock[grid, block](np.float32(2), x, y, out),
            "numba-cuda-mlir, its own arrays": lambda: mlir[grid, block](np.float32(2), mx, my, mout),
            "numba-cuda-mlir, as the workbook routes it": lambda: launcher.launch(stock, (np.float32(2), x, y, out),
                                                                                   (grid,), (block,), 0, 0)}
    for way in ways.values():
        way()  # compiled
    cuda.synchronize()
    measured = {}
    for way, function in ways.items():
        values = [bench.host_cost_us(function, calls=calls) for _ in range(samples)]
        measured[way] = {"host_us": float(np.median(values)),
                         "spread_us": [float(v) for v in np.percentile(values, [25, 75])]}
    return measured


def row_key(row):
    """What makes a row one: (kernel, variant, signature); rows stored before variants have none."""
    return row["kernel"], row.get("variant") or "", row["signature"]


def _merged(rows):
    """One row per (kernel, variant, signature) from the workers' rows: the tests of all of them
    counted, the timing of the one that timed it."""
    merged = {}
    for row in rows:
        key = row_key(row)
        if key not in merged:
            merged[key] = row
            continue
        kept = merged[key]
        if row.get("timed") and not kept.get("timed"):
            row, kept = kept, row
            merged[key] = kept
        kept["tests_passed"] += row["tests_passed"]
        kept["tests_failed"] += row["tests_failed"]
        kept["error"] = kept["error"] or row["error"]
        kept["correct"] = kept["tests_failed"] == 0 and kept["tests_passed"] > 0
    return [merged[key] for key in sorted(merged)]


def _version():
    from importlib.metadata import version

    return version("numba-cuda-mlir")


# ---------------------------------------------------------------------------------------------
# The tables (results/<device>/COMPILERS.md, and the summary in docs/compilers.md)

SLOWER = 1.10  # "more than 10% slower": the kernels EXPERIMENTS.md must explain


def short_name(kernel):
    return kernel.replace("chapters.", "").replace(".<locals>.", ":")


def chapter_summary(stored):
    """[(chapter, kernels, correct, timed, median ratio, slower than SLOWER, spilling more)] per chapter."""
    import numpy as np

    rows = []
    for chapter_id, chapter in sorted(stored.get("chapters", {}).items()):
        kernels = chapter["rows"]
        ratios = [r["time_ratio"]["median"] for r in kernels if r.get("timed")]
        slower = slower_rows(chapter)
        spills = [r for r in kernels if r.get("timed")
                  and (r[NAME_MLIR].get("spill_bytes") or 0) > (r[NAME_STOCK].get("spill_bytes") or 0)]
        rows.append((chapter_id, len(kernels), sum(r["correct"] for r in kernels), len(ratios),
                     float(np.median(ratios)) if ratios else None, len(slower), len(spills)))
    return rows


NAME_STOCK, NAME_MLIR = successor.STOCK, successor.NAME


def markdown(stored):
    """(summary table, every kernel's table, stamp line) in Markdown."""
    lines = ["| chapter | kernels (by signature) | correct under numba-cuda-mlir | timed | time, successor / numba-cuda "
             "(median) | more than 10% slower | spilling more | measured |", "|---|---|---|---|---|---|---|---|"]
    for chapter_id, total, correct, timed, ratio, slower, spills in chapter_summary(stored):
        lines.append(f"| {chapter_id} | {total} | {correct} | {timed} | {'-' if ratio is None else f'{ratio:.2f}'} | "
                     f"{slower} | {spills} | {stored['chapters'][chapter_id].get('date', '-')[:10]} |")
    summary = "\n".join(lines)
    older = sorted({c.get("translation", 1) for c in stored.get("chapters", {}).values()} - {TRANSLATION})
    for version in older:
        chapters = [k for k, c in sorted(stored["chapters"].items()) if c.get("translation", 1) == version]
        summary += f"\n\n{', '.join(chapters)}: {OLDER[version]}."
    anyone = [k for k, c in sorted(stored.get("chapters", {}).items()) if c.get("timing_rule") == "any launch"]
    if anyone:
        summary += (f"\n\n{', '.join(anyone)}: each kernel timed at one launch of the tests, not yet the largest "
                    "one (measured before that rule).")
    mended = [k for k, c in sorted(stored.get("chapters", {}).items()) if c.get("range_mend")]
    if mended:
        summary += (f"\n\n{', '.join(mended)}: measured with successor_mends._patch_range_count on "
                    "(WORKBOOK_SUCCESSOR_RANGE_MEND=1).")
    merged = [k for k, c in sorted(stored.get("chapters", {}).items()) if c.get("variant_rule", 1) < VARIANT_RULE]
    if merged:
        summary += (f"\n\n{', '.join(merged)}: measured before the rows told apart kernels of one factory that "
                    "differ only in the device functions they call: such kernels may share a row, timed on one of "
                    "them; measure again.")
    full = ["| kernel | signature | correct | numba-cuda [spread] | numba-cuda-mlir [spread] | ratio [spread] | "
            "registers | spilled bytes | stack bytes |", "|---|---|---|---|---|---|---|---|---|"]
    for chapter_id, chapter in sorted(stored.get("chapters", {}).items()):
        labels = _labels(chapter["rows"])
        full += ["| " + " | ".join(_kernel_cells(row, labels[id(row)])) + " |" for row in chapter["rows"]]
    return summary, "\n".join(full), stamp_line(stored.get("stamp", {}))


def stamp_line(stamp, date=None):
    """The device and versions of a run; `date`: when a chapter was measured (the latest run's if None)."""
    return (f"{stamp.get('device')}, driver {stamp.get('device_facts', {}).get('driver')}, numba-cuda "
            f"{stamp.get('numba_cuda')}, numba-cuda-mlir {stamp.get('numba_cuda_mlir')}, "
            f"numpy {stamp.get('numpy')}, {date or stamp.get('date')}")


def _us(figures):
    low, high = figures["spread_ms"]
    return f"{figures['median_ms'] * 1e3:.1f} us [{low * 1e3:.1f}-{high * 1e3:.1f}]"


def _labels(rows):
    """{id(row): what tells the row's kernel apart from the same factory's other kernels among `rows`}:
    the fewest of a variant's settings that, with the signature, leave no two rows alike
    ("BN=32, causal=True"), chosen one at a time, the setting that splits most first."""
    settings, labels = {}, {}
    for row in rows:
        pairs = [part.split("=", 1) for part in row.get("variant", "").split(", ") if "=" in part]
        settings.setdefault(row["kernel"], []).append((row, dict(pairs)))
    for kernel_rows in settings.values():
        keys, chosen = sorted({key for _, pairs in kernel_rows for key in pairs}), []

        def classes(keys_):
            return len({(row["signature"], *(pairs.get(k) for k in keys_)) for row, pairs in kernel_rows})

        while classes(chosen) < len(kernel_rows):
            best = max((key for key in keys if key not in chosen), key=lambda k: classes(chosen + [k]), default=None)
            if best is None or classes(chosen + [best]) == classes(chosen):
                break
            chosen.append(best)
        for row, pairs in kernel_rows:
            labels[id(row)] = ", ".join(f"{key}={pairs[key]}" for key in sorted(chosen) if key in pairs)
    return labels


def _kernel_cells(row, label=""):
    """One kernel's cells: kernel, signature, correct, both times, ratio, registers, spilled, stack.
    `label` tells a factory's kernels apart (_labels)."""
    if row["correct"]:
        verdict = "yes"
    else:
        last = (row.get("error") or "").strip().splitlines()
        verdict = f"**no** ({last[-1][:80] if last else 'not launched by a passing test'})"
    kernel = short_name(row["kernel"]) + (f" ({label})" if label else "")
    cells = [kernel, row["signature"].replace("array(", "").replace(", C)", "")[:60], verdict]
    if row.get("timed"):
        stock, mlir, ratio = row[NAME_STOCK], row[NAME_MLIR], row["time_ratio"]
        cells += [_us(stock), _us(mlir), f"{ratio['median']:.2f} [{ratio['spread'][0]:.2f}-{ratio['spread'][1]:.2f}]",
                  f"{stock.get('registers')} / {mlir.get('registers')}",
                  f"{stock.get('spill_bytes')} / {mlir.get('spill_bytes')}",
                  f"{stock.get('stack_bytes')} / {mlir.get('stack_bytes')}"]
    else:
        cells += ["-"] * 6
    return [str(cell).replace("|", "/") for cell in cells]


def launch_markdown(stored):
    """The launch-overhead table (launch_overhead), or a line saying it was not measured."""
    launch = stored.get("launch")
    if not launch:
        return "(the launch overhead was not measured: `python -m workbook compilers launch`)"
    lines = ["What one launch of a small kernel (three arrays and a scalar) costs its host, as chapter 07 "
             "measures it:", "", "| launch | host us a launch [spread] |", "|---|---|"]
    for way, figures in launch.items():
        low, high = figures["spread_us"]
        lines.append(f"| {way} | {figures['host_us']:.1f} [{low:.1f}-{high:.1f}] |")
    return "\n".join(lines)


COMPILERS_BEGIN, COMPILERS_END = "<!-- compilers:begin -->", "<!-- compilers:end -->"
SLOWER_BEGIN, SLOWER_END = "<!-- successor-slower:begin -->", "<!-- successor-slower:end -->"


def slower_rows(chapter):
    """A chapter's kernels measured more than 10% slower under the successor (the spread clears it)."""
    return [row for row in chapter["rows"] if row.get("timed") and row["time_ratio"]["spread"][0] > SLOWER]


def slower_markdown(chapter_id, chapter, slug, stamp_line):
    """The generated block of a chapter's EXPERIMENTS.md: its kernels more than 10% slower."""
    rows = slower_rows(chapter)
    head = (f"(generated by `python -m workbook table --readme` from results/{slug}/compilers.json: "
            f"{stamp_line}; time: one launch of the tests' largest size, L2 flushed; registers, spilled "
            "and stack bytes a thread: numba-cuda / numba-cuda-mlir)")
    if not rows:
        return f"{head}\n\nNo kernel of {chapter_id} is more than 10% slower under the successor."
    lines = [head, "", "| kernel | signature | numba-cuda [spread] | numba-cuda-mlir [spread] | ratio [spread] | "
             "registers | spilled bytes | stack bytes |", "|---|---|---|---|---|---|---|---|"]
    labels = _labels(chapter["rows"])
    for row in rows:
        cells = _kernel_cells(row, labels[id(row)])
        lines.append("| " + " | ".join(cells[:2] + cells[3:]) + " |")
    return "\n".join(lines)


def _replace_block(text, begin, end, block):
    before, rest = text.split(begin, 1)
    _, after = rest.split(end, 1)
    return f"{before}{begin}\n{block}\n{end}{after}"


def experiments_files(stored):
    """{chapter id: its EXPERIMENTS.md} for the chapters in `stored` that have one."""
    found = {}
    for chapter_id in stored.get("chapters", {}):
        for folder in sorted((results.ROOT / "chapters").glob(f"{chapter_id}_*")):
            if (folder / "EXPERIMENTS.md").exists():
                found[chapter_id] = folder / "EXPERIMENTS.md"
    return found


def write_tables(slug):
    """results/<slug>/COMPILERS.md and the summary in docs/compilers.md, from compilers.json."""
    path = results.RESULTS / slug / "compilers.json"
    if not path.exists():
        return
    stored = json.loads(path.read_text())
    summary, full, stamp = markdown(stored)
    launch = launch_markdown(stored)
    (results.RESULTS / slug / "COMPILERS.md").write_text(
        f"# numba-cuda and numba-cuda-mlir on {slug}\n\n(generated by `python -m workbook table --readme` from "
        f"compilers.json, written by `python -m workbook compilers`)\n\n{stamp}\n\n{summary}\n\n{launch}\n\n"
        f"Every kernel, by signature (time: one launch of the tests' largest size, L2 flushed):\n\n{full}\n")
    doc = results.ROOT / "docs" / "compilers.md"
    before, rest = doc.read_text().split(COMPILERS_BEGIN, 1)
    _, after = rest.split(COMPILERS_END, 1)
    doc.write_text(f"{before}{COMPILERS_BEGIN}\n(generated by `python -m workbook table --readme` from "
                   f"results/{slug}/compilers.json: {stamp})\n\n{summary}\n\n{launch}\n{COMPILERS_END}{after}")
    for chapter_id, path in experiments_files(stored).items():
        text = path.read_text()
        if SLOWER_BEGIN in text:
            chapter = stored["chapters"][chapter_id]
            block = slower_markdown(chapter_id, chapter, slug, stamp_line(stored["stamp"], chapter.get("date")))
            path.write_text(_replace_block(text, SLOWER_BEGIN, SLOWER_END, block))
    return True
