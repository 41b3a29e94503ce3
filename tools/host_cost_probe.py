"""Host cost per call of each chapter's main wrapper, with numba arrays and with torch tensors, beside
torch's nearest op on the same tensors (the issue "torch tensors at torch's host cost"):

    python tools/host_cost_probe.py                  # every case, a table
    python tools/host_cost_probe.py --json out.json  # and the figures as JSON
    python tools/host_cost_probe.py --only ch01,ch09 --calls 50 --repeats 7

A GPU with torch is needed (host costs mean nothing in the simulator). Each case's three callables
work on the same memory: torch tensors allocated by torch, the numba arrays numba's views of them
(DeviceNDArrays made once, before the timing). Host microseconds per call are bench.host_cost_us's: `calls` calls
queued while the GPU is held, the median of `repeats` such runs. "views made" counts the foreign
views ForeignViews made during the timed calls: 0 when every call found its views.
"""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEADLINE_S = 40  # cases not started by then are skipped (their kernels' first compile is what costs)


def cases(torch, cuda):
    """{chapter: make} where make() -> (wrapper on numba arrays, wrapper on torch tensors, torch op,
    wrapper's name, torch op's name, size); each make allocates its tensors and is called once."""
    from workbook.inputs import require

    def numba(*tensors):
        """numba's DeviceNDArrays on the tensors' memory (holding them), made once: the numba column."""
        return [require(t, "tensor") for t in tensors]

    def randn(*shape, dtype=None):
        return torch.randn(*shape, device="cuda", dtype=dtype or torch.float32)

    def uint32(n):
        return torch.empty(n, dtype=torch.uint32, device="cuda")

    def ch00():
        from chapters.ch00_measuring import kernels as k

        n = 1 << 20
        src, dst = randn(n), torch.empty(n, device="cuda")
        s, d = numba(src, dst)
        return (lambda: k.copy_quads(s, d), lambda: k.copy_quads(src, dst), lambda: dst.copy_(src),
                "copy_quads", "Tensor.copy_", f"n={n}")

    def ch01():
        from chapters.ch01_relu_mask import kernels as k

        n = 1 << 16
        x, y, mask = randn(n), torch.empty(n, device="cuda"), uint32(k.mask_words(n))
        nx, ny, nm = numba(x, y, mask)
        return (lambda: k.relu_mask_quads(nx, ny, nm), lambda: k.relu_mask_quads(x, y, mask), lambda: torch.relu(x),
                "relu_mask_quads", "torch.relu", f"n={n}")

    def ch02():
        from chapters.ch02_dropout import kernels as k

        n = 1 << 16
        x, y, mask = randn(n), torch.empty(n, device="cuda"), uint32(-(-n // 32))
        nx, ny, nm = numba(x, y, mask)
        return (lambda: k.dropout_bitmask(nx, 0.1, 42, 0, ny, nm), lambda: k.dropout_bitmask(x, 0.1, 42, 0, y, mask),
                lambda: torch.native_dropout(x, 0.1, True), "dropout_bitmask", "torch.native_dropout", f"n={n}")

    def ch03():
        from chapters.ch03_amp_unscale import kernels as k

        grads = [randn(4096) for _ in range(32)]
        found, inv = torch.zeros(1, device="cuda"), torch.full((1,), 0.5, device="cuda")
        n_grads, (n_found, n_inv) = k.GradientList(numba(*grads)), numba(found, inv)
        t_grads = k.GradientList(grads)  # built once, as an optimizer holds its parameters
        return (lambda: k.unscale_fused(n_grads, n_found, n_inv), lambda: k.unscale_fused(t_grads, found, inv),
                lambda: torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv),
                "unscale_fused", "torch._amp_foreach_non_finite_check_and_unscale_", "32 x 4096")

    def ch04():
        from chapters.ch04_implicit_gemm import kernels as k

        x, w = randn(8, 64, 28, 28), randn(64, 64, 3, 3)
        out = torch.empty(8, 64, 28, 28, device="cuda")
        nx, nw, no = numba(x, w, out)
        conv = torch.nn.functional.conv2d
        return (lambda: k.conv2d_implicit(nx, nw, no, padding=1), lambda: k.conv2d_implicit(x, w, out, padding=1),
                lambda: conv(x, w, padding=1), "conv2d_implicit", "F.conv2d", "8x64x28x28, 3x3")

    def ch05():
        from chapters.ch05_directives import kernels as k

        a, b = (torch.randint(0, 256, (512, 512), dtype=torch.uint8, device="cuda") for _ in range(2))
        out = torch.empty_like(a)
        na, nb, no = numba(a, b, out)
        return (lambda: k.merge(na, nb, no), lambda: k.merge(a, b, out), lambda: torch.add(a, b, out=out),
                "merge", "torch.add(out=)", "512x512 uint8")

    def ch06():
        from chapters.ch06_softmax import kernels as k

        x = randn(64, 1024)
        out = torch.empty_like(x)
        nx, no = numba(x, out)
        return (lambda: k.softmax(nx, no), lambda: k.softmax(x, out), lambda: torch.softmax(x, -1),
                "softmax", "torch.softmax", "64x1024")

    def ch09():
        from chapters.ch09_tensor_cores import kernels as k

        size = 4096  # the case
        a = randn(size, size, dtype=torch.float16)
        c = torch.empty(size, size, device="cuda")
        if tuple(cuda.get_current_device().compute_capability) == (9, 0):
            bt = randn(size, size, dtype=torch.float16)
            na, nbt, nc = numba(a, bt, c)
            return (lambda: k.gemm_bt(na, nbt, nc), lambda: k.gemm_bt(a, bt, c), lambda: torch.matmul(a, bt.T),
                    "gemm_bt (wgmma)", "torch.matmul", f"{size}^3 FP16")
        b = randn(size, size, dtype=torch.float16)  # not an H100: the mma.sync kernel
        na, nb, nc = numba(a, b, c)
        return (lambda: k.gemm(na, nb, nc), lambda: k.gemm(a, b, c), lambda: torch.matmul(a, b),
                "gemm (pipelined)", "torch.matmul", f"{size}^3 FP16")

    return {"ch00": ch00, "ch01": ch01, "ch02": ch02, "ch03": ch03, "ch05": ch05, "ch06": ch06, "ch09": ch09,
            "ch04": ch04}  # ch04 last: its implicit GEMM takes the longest to compile


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", metavar="PATH", help="write the figures to PATH as JSON")
    parser.add_argument("--only", help="comma-separated chapters (ch00,ch01,...)")
    parser.add_argument("--calls", type=int, default=20, help="calls queued per measurement (default 20)")
    parser.add_argument("--repeats", type=int, default=5, help="measurements per figure, median (default 5)")
    args = parser.parse_args(argv)
    started = time.perf_counter()

    os.environ.setdefault("WORKBOOK_DEVICE", "auto")
    import workbook

    if not workbook.ON_GPU:
        print("host_cost_probe: no GPU here (workbook runs the simulator, where host costs mean nothing); "
              "run it on a GPU machine with torch installed", file=sys.stderr)
        return 2
    from workbook import bench, cuda, inputs

    torch = bench.optional_torch()
    if torch is None:
        print("host_cost_probe: torch is not installed (or sees no GPU): pip install torch, matching the "
              "CUDA driver, then run it again", file=sys.stderr)
        return 2
    if not hasattr(torch, "uint32"):
        print(f"host_cost_probe: torch {torch.__version__} has no uint32 (the masks of chapters 01 and 02): "
              "torch 2.3 or later", file=sys.stderr)
        return 2

    def host_us(function):
        runs = [bench.host_cost_us(function, calls=args.calls) for _ in range(args.repeats)]
        return statistics.median(runs)

    wanted = set(args.only.split(",")) if args.only else None
    rows = []
    for chapter, make in cases(torch, cuda).items():
        if wanted and chapter not in wanted:
            continue
        if time.perf_counter() - started > DEADLINE_S:
            print(f"{chapter}: skipped, past {DEADLINE_S} s (run it alone with --only {chapter})")
            continue
        try:
            with_numba, with_torch, torch_op, wrapper, op, size = make()
            for function in (with_numba, with_torch, torch_op):  # compile, make the views and launches
                function()
                function()
            cuda.synchronize()
            misses = inputs.FOREIGN.misses
            figures = {"numba arrays": host_us(with_numba), "torch tensors": host_us(with_torch),
                       "torch op": host_us(torch_op)}
            made = inputs.FOREIGN.misses - misses
        except Exception as error:  # one chapter's failure is a row, not the end of the probe
            print(f"{chapter}: failed: {type(error).__name__}: {error}")
            rows.append({"chapter": chapter, "error": f"{type(error).__name__}: {error}"})
            continue
        rows.append({"chapter": chapter, "wrapper": wrapper, "torch_op": op, "size": size, "views_made": made,
                     "host_us": figures,
                     "torch_tensors_over_torch_op": figures["torch tensors"] / figures["torch op"],
                     "numba_arrays_over_torch_op": figures["numba arrays"] / figures["torch op"]})

    device = cuda.get_current_device().name
    device = device.decode() if isinstance(device, bytes) else device
    header = (f"{'chapter':7s} {'wrapper':18s} {'size':16s} {'numba us':>9s} {'torch-tensor us':>15s} "
              f"{'torch op us':>11s} {'tensors/op':>10s} {'numba/op':>8s} {'views made':>10s}  torch op")
    print(f"\nhost microseconds per call on {device}, torch {torch.__version__} (median of {args.repeats} x "
          f"{args.calls} calls queued while the GPU is held)")
    print(header)
    print("-" * len(header))
    for row in rows:
        if "error" in row:
            print(f"{row['chapter']:7s} failed: {row['error']}")
            continue
        us = row["host_us"]
        print(f"{row['chapter']:7s} {row['wrapper']:18s} {row['size']:16s} {us['numba arrays']:9.1f} "
              f"{us['torch tensors']:15.1f} {us['torch op']:11.1f} {row['torch_tensors_over_torch_op']:10.2f} "
              f"{row['numba_arrays_over_torch_op']:8.2f} {row['views_made']:10d}  {row['torch_op']}")
    print(f"\n{time.perf_counter() - started:.0f} s in all")
    if args.json:
        Path(args.json).write_text(json.dumps({"device": device, "torch": torch.__version__, "calls": args.calls,
                                               "repeats": args.repeats, "rows": rows}, indent=1))
        print(f"wrote {args.json}")
    return 1 if any("error" in row for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
