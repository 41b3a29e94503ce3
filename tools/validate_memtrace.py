"""The simulator's memory trace against Nsight Compute: the same kernels, launches and data, counted
by `workbook.memtrace` on a CPU and by the H100's counters under `ncu`.

    python tools/validate_memtrace.py sim  OUT.json    # the trace's counts (CPU, WORKBOOK_DEVICE=sim)
    python tools/validate_memtrace.py gpu  OUT.json    # on the GPU: runs the cases under ncu, parses its CSV
    python tools/validate_memtrace.py compare SIM.json GPU.json [--store]   # the table; --store keeps it
                                                       # in results/<device>/memtrace_validation.json

Each case launches one kernel once with an explicit grid and block, on data made from a fixed seed,
so that both sides see the same accesses (the chapters' wrappers size grids from the SM count,
which the simulator does not share). The counters compared, per launch:

    global loads    l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum   l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum
    global stores   l1tex__t_requests_pipe_lsu_mem_global_op_st.sum   l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum
    shared          l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum / _st.sum
                    l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum / _st.sum

A maintainer's tool: the GPU side needs a GPU, ncu and the rights to read its counters.
"""

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
# The mode is chosen before numba.cuda is imported: the trace in the simulator, the launches on the GPU.
os.environ["WORKBOOK_DEVICE"] = {"sim": "sim", "launch": "gpu"}.get((sys.argv + [""])[1], "sim")

import numpy as np  # noqa: E402

import gpu_side  # noqa: E402  (tools/gpu_side.py: this script's folder is on sys.path)
from workbook import cuda  # noqa: E402

METRICS = {
    ("global ld", "requests"): "l1tex__t_requests_pipe_lsu_mem_global_op_ld.sum",
    ("global ld", "sectors"): "l1tex__t_sectors_pipe_lsu_mem_global_op_ld.sum",
    ("global st", "requests"): "l1tex__t_requests_pipe_lsu_mem_global_op_st.sum",
    ("global st", "sectors"): "l1tex__t_sectors_pipe_lsu_mem_global_op_st.sum",
    ("shared ld", "bank_conflicts"): "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    ("shared st", "bank_conflicts"): "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    ("shared ld", "wavefronts"): "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    ("shared st", "wavefronts"): "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum",
}


def cases():
    """[(name, kernel, grid, block, args)]: each launched once, in this order, on both sides."""
    from chapters.ch00_measuring import kernels as ch00
    from chapters.ch01_relu_mask import kernels as ch01
    from chapters.ch04_implicit_gemm import kernels as ch04_gemm
    from chapters.ch04_implicit_gemm import solutions as ch04
    from chapters.ch06_softmax import naive as ch06_naive
    from chapters.ch06_softmax import rows as ch06_rows

    rng = np.random.default_rng(0)
    n = 8192
    x = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    y = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    out = cuda.device_array(n, np.float32)
    words = cuda.device_array(ch01.mask_words(n), np.uint32)
    made = [
        ("ch00 copy, one per thread", ch00.copy_one_per_thread_kernel, 32, 256, (x, out)),
        ("ch00 copy, grid-stride", ch00.copy_grid_stride_kernel, 4, 256, (x, out)),
        ("ch00 copy, 16-byte quads", ch00.copy_quads_kernel, 8, 256, (x, out)),
        ("ch00 axpy, one per thread", ch00.axpy_one_per_thread_kernel, 32, 256, (np.float32(2.5), x, y, out)),
    ]
    for stride in (1, 2, 4, 8, 32):  # 256 outputs: src[255 * 32] is still inside x
        made.append((f"ch00 gather, stride {stride}", ch00.gather_strided_kernel, 1, 256,
                     (x, cuda.device_array(256, np.float32), stride)))
    made += [
        ("ch01 relu mask, sequential", ch01.relu_mask_sequential_kernel, 4, 256,
         (x, out, words.view(np.uint8))),
        ("ch01 relu mask, ballot", ch01.relu_mask_ballot_kernel, 4, 256, (x, out, words)),
        ("ch01 relu mask, 16-byte quads", ch01.relu_mask_quads_kernel, 8, 256, (x, out, words)),
        ("ch01 relu backward from mask", ch01.relu_backward_from_mask_kernel, 4, 256, (y, words, out)),
    ]
    a = cuda.to_device(rng.standard_normal((40, 56), dtype=np.float32))
    b = cuda.to_device(rng.standard_normal((56, 48), dtype=np.float32))
    made.append(("ch04 tiled GEMM (8x8 shared tiles)", ch04.gemm_tiled_kernel, (6, 5), (8, 8),
                 (a, b, cuda.device_array((40, 48), np.float32))))
    # The chapter's GEMM with the GPU's 128x128 tile (BK = 8), one block, two depth steps: the A
    # tile's transposed stores with and without the row padding (GEMM_PADDING_CASES).
    a128 = cuda.to_device(rng.standard_normal((128, 16), dtype=np.float32))
    b128 = cuda.to_device(rng.standard_normal((16, 128), dtype=np.float32))
    for case, padded in GEMM_PADDING_CASES.items():
        tile = ch04_gemm.Tile(128, 128, 8, 8, 8, min_blocks=2, padded=padded)
        made.append((case, ch04_gemm.make_gemm_kernel(tile), 1, tile.threads,
                     (a128, b128, 128, cuda.device_array((1, 128, 128), np.float32))))
    square = cuda.to_device(rng.standard_normal((32, 32), dtype=np.float32))
    made += [("transpose through a 32x32 tile", transpose_tile, 1, (32, 32), (square, cuda.device_array_like(square))),
             ("transpose through a 32x33 tile", transpose_padded_tile, 1, (32, 32),
              (square, cuda.device_array_like(square)))]
    logits = cuda.to_device(rng.standard_normal((64, 40), dtype=np.float32))  # rows 160 bytes apart
    made += [
        ("ch06 softmax, a thread per row", ch06_naive.softmax_naive_kernel, 1, 64,
         (logits, cuda.device_array_like(logits))),
        ("ch06 softmax, a warp per row", ch06_rows.row_kernels(32).softmax, 1, 256,
         (logits, cuda.device_array_like(logits))),
    ]
    wide = cuda.to_device(rng.standard_normal((2, 1000), dtype=np.float32))
    made.append(("ch06 softmax, a block per row", ch06_rows.row_kernels(256).softmax, 2, 256,
                 (wide, cuda.device_array_like(wide))))
    return made


GEMM_PADDING_CASES = {"ch04 GEMM, 128x128 tile, A tile padded": True,
                      "ch04 GEMM, 128x128 tile, A tile unpadded": False}


@cuda.jit
def transpose_tile(src, dst):
    tile = cuda.shared.array((32, 32), np.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = src[ty, tx]
    cuda.syncthreads()
    dst[ty, tx] = tile[tx, ty]  # a column: 32 words in one bank


@cuda.jit
def transpose_padded_tile(src, dst):
    tile = cuda.shared.array((32, 33), np.float32)
    tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
    tile[ty, tx] = src[ty, tx]
    cuda.syncthreads()
    dst[ty, tx] = tile[tx, ty]  # a column of a 33-word row: 32 banks


def launch_all():
    for _, kernel, grid, block, args in cases():
        kernel[grid, block](*args)
    cuda.synchronize()


def simulated(path):
    from workbook import memtrace

    counts = {}
    for name, kernel, grid, block, args in cases():
        with memtrace.trace() as trace:
            kernel[grid, block](*args)
        (spaces,) = trace.kernels().values()
        row = {}
        for what, totals in spaces.items():
            if what.startswith("global"):
                row[f"{what} requests"], row[f"{what} sectors"] = totals.requests, totals.sectors
            else:
                row[f"{what} bank_conflicts"], row[f"{what} wavefronts"] = totals.conflicts, totals.passes
        counts[name] = row
    Path(path).write_text(json.dumps(counts, indent=1))
    print(f"wrote {path}: {len(counts)} cases")


def measured(path):
    """Run launch_all() under ncu, one profiled launch per case, in case order."""
    command = ["ncu", "--csv", "--page", "raw", "--metrics", ",".join(METRICS.values()),
               sys.executable, __file__, "launch"]
    run = subprocess.run(command, env=gpu_side.env(), capture_output=True, text=True)
    text = run.stdout
    if run.returncode or '"ID"' not in text:
        raise RuntimeError(f"ncu exited {run.returncode}:\n{(run.stdout + run.stderr)[-3000:]}")
    rows = [r for r in csv.DictReader(io.StringIO(text[text.index('"ID"'):])) if r.get("ID", "").isdigit()]
    names = [name for name, *_ in _case_names()]
    if len(rows) != len(names):
        raise RuntimeError(f"ncu profiled {len(rows)} launches for {len(names)} cases: "
                           f"{[r['Kernel Name'][:40] for r in rows]}")
    counts = {}
    for name, row in zip(names, rows, strict=True):
        counts[name] = {f"{what} {field}": float(row[metric].replace(",", "")) for (what, field), metric
                        in METRICS.items() if row.get(metric) not in (None, "", "n/a")}
        counts[name]["kernel"] = row["Kernel Name"][:80]
    counts["stamp"] = gpu_side.stamp()
    Path(path).write_text(json.dumps(counts, indent=1))
    print(f"wrote {path}: {len(counts)} cases")


def _case_names():
    return [(name,) for name, *_ in cases()]  # made in the simulator: the names, no GPU needed


def compare(sim_path, gpu_path, store=False):
    sim, gpu = json.loads(Path(sim_path).read_text()), json.loads(Path(gpu_path).read_text())
    rows, same, compared = [], 0, 0
    for name, counted in sim.items():
        for field, value in sorted(counted.items()):
            measured_value = gpu.get(name, {}).get(field)
            if measured_value is None:
                continue
            compared += 1
            same += value == measured_value
            rows.append({"case": name, "counter": field, "simulator": value, "ncu": measured_value,
                         "equal": value == measured_value})
    for row in rows:
        mark = "" if row["equal"] else "   <- differs"
        print(f"{row['case'][:38]:38s} {row['counter']:26s} {row['simulator']:>10g} {row['ncu']:>10g}{mark}")
    print(f"{same} of {compared} counts equal")
    if store:
        from workbook import results

        folder = results.ROOT / "results" / results.REFERENCE_DEVICE
        (folder / "memtrace_validation.json").write_text(
            json.dumps({"stamp": gpu.get("stamp"), "rows": rows, "why": WHY}, indent=1) + "\n")
        (folder / "MEMTRACE_VALIDATION.md").write_text(markdown(sim, gpu))
        print(f"stored {folder}/memtrace_validation.json and MEMTRACE_VALIDATION.md")


# Where the counts differ, why (read in each kernel's SASS on the H100, 2026-11-26).
WHY = {
    "ch04 tiled GEMM (8x8 shared tiles)":
        "ptxas joins each thread's loads of a_tile[ty, kk .. kk + 3] (4 adjacent words of one row) into "
        "one 16-byte load: the SASS has 2 LDS.128 and 8 LDS a depth step where the source has 16 "
        "loads, and the H100 served each of those broadcast 16-byte loads in 2 passes: 12 a step, "
        "against the simulator's 16. The simulator counts the source's accesses.",
    "ch06 softmax, a block per row":
        "The compiler splits the tail loop (`while c < ncols`) into up to 3 single loads and a loop "
        "unrolled by 4 (SASS). A lane with 4 columns left takes the unrolled loop, one with 3 the "
        "single loads; the warp holding both kinds issues both, 7 requests where the source's loop "
        "makes 4, for the same sectors. The simulator follows the source.",
}


def markdown(sim, gpu):
    """Per kernel: sectors per request and bank conflicts, the simulator's beside the H100's."""
    def ratio(counts, what):
        requests, sectors = counts.get(f"{what} requests"), counts.get(f"{what} sectors")
        return f"{sectors / requests:.2f}" if requests else "-"

    stamp = gpu.get("stamp", {})
    lines = [f"# The simulator's memory trace against Nsight Compute on {stamp.get('device', 'the GPU')}",
             "", f"(generated by `python tools/validate_memtrace.py compare ... --store`; the H100 side "
             f"measured {stamp.get('date', '?')[:10]}; every count in memtrace_validation.json)", "",
             "| kernel | ld sectors/request: sim / ncu | st sectors/request: sim / ncu | shared bank conflicts "
             "(ld, st): sim / ncu | every count equal |", "|---|---|---|---|---|"]
    for name, counts in sim.items():
        measured = gpu.get(name, {})
        shared = (f"{counts.get('shared ld bank_conflicts', 0):g}, {counts.get('shared st bank_conflicts', 0):g} / "
                  f"{measured.get('shared ld bank_conflicts', 0):g}, {measured.get('shared st bank_conflicts', 0):g}"
                  if any(k.startswith("shared") for k in counts) else "-")
        equal = all(measured.get(k) == v for k, v in counts.items())
        lines.append(f"| {name} | {ratio(counts, 'global ld')} / {ratio(measured, 'global ld')} | "
                     f"{ratio(counts, 'global st')} / {ratio(measured, 'global st')} | {shared} | "
                     f"{'yes' if equal else 'no: see below'} |")
    lines += ["", "Where they differ:", ""] + [f"- **{name}**: {why}" for name, why in WHY.items() if name in sim]
    return "\n".join(lines) + "\n"


def main():
    what = sys.argv[1] if len(sys.argv) > 1 else ""
    if what == "sim":
        simulated(sys.argv[2])
    elif what == "gpu":
        measured(sys.argv[2])
    elif what == "launch":
        launch_all()
    elif what == "compare":
        compare(sys.argv[2], sys.argv[3], store="--store" in sys.argv)
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
