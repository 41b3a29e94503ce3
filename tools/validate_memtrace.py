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
    from chapters.ch04_implicit_gemm import solutions as ch04

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
    square = cuda.to_device(rng.standard_normal((32, 32), dtype=np.float32))
    made += [("transpose through a 32x32 tile", transpose_tile, 1, (32, 32), (square, cuda.device_array_like(square))),
             ("transpose through a 32x33 tile", transpose_padded_tile, 1, (32, 32),
              (square, cuda.device_array_like(square)))]
    return made


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
    env = dict(os.environ, WORKBOOK_DEVICE="gpu", PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    text = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
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
    stamp = subprocess.run([sys.executable, "-c", "import json, workbook; from workbook import results; "
                            "print(json.dumps(results.stamp()))"], env=env, capture_output=True, text=True, check=True)
    counts["stamp"] = json.loads(stamp.stdout.strip().splitlines()[-1])
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

        target = results.ROOT / "results" / results.REFERENCE_DEVICE / "memtrace_validation.json"
        target.write_text(json.dumps({"stamp": gpu.get("stamp"), "rows": rows}, indent=1) + "\n")
        print(f"stored {target}")


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
