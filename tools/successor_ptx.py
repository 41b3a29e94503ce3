"""One kernel compiled by both compilers without a GPU: numba-cuda and numba-cuda-mlir, side by side.

    PYTHONPATH=<numba-cuda-mlir's site> python tools/successor_ptx.py \\
        chapters.ch01_relu_mask.kernels:relu_mask_ballot_kernel "float32[::1], float32[::1], uint32[::1]" \\
        --launch-bounds 256,8 [--grep 'mul.lo|ld.global'] [--save DIR]

For each compiler: ptxas -v's registers, spilled and stack bytes a thread, then counts of the PTX
instructions that tell the two apart (integer multiplies, parameter loads, global loads, local
memory, tensor-core instructions). numba-cuda's build runs in a worker process (the simulator owns
`numba.cuda` here), as workbook/compiler.py's does; the successor's is `successor.Translation`, as a
launch gets it. Both compile with the kernel's own launch bounds and fastmath unless told others.

    PYTHONPATH=<numba-cuda-mlir's site> python tools/successor_ptx.py --slower results/nvidia-h200/compilers.json

does the same for every kernel that file measured more than 10% slower under the successor, one line
each (kernels made inside a function, `<locals>`, are not importable: named and left out).
"""

import argparse
import importlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
COUNTED = {"lines": r"^\s+[a-z@]", "integer multiplies": r"\bmul(\.lo|\.wide|\.hi)|\bmad\.", "parameter loads": r"ld\.param",
           "global loads": r"ld\.global", "local memory": r"(ld|st)\.local", "tensor-core": r"\b(mma|wgmma\.mma_async)\."}


def _kernel(target):
    """module:expression, the expression read in the module's namespace: `kernels:relu_kernel`, or a
    kernel a function makes, `rows:row_kernels(32, 4).cross_entropy`."""
    module, expression = target.split(":", 1)
    return eval(expression, vars(importlib.import_module(module)))  # noqa: S307  (a name the user typed)


def stock_ptx(target, signature, launch_bounds):
    """numba-cuda's PTX, from a worker in compile mode (no driver needed)."""
    code = f"""
import json, sys
sys.path.insert(0, {str(ROOT)!r})
import workbook
from numba import cuda, types
from numba.cuda import dispatcher
from workbook import compiler
dispatcher.get_current_device = lambda: compiler._NoDevice
sys.path.insert(0, {str(ROOT / 'tools')!r})
from successor_ptx import _kernel
kernel = _kernel({target!r})
signature = eval({"(" + signature + ",)"!r}, vars(types))
options = kernel.targetoptions
bounds = {launch_bounds!r} or options.get("launch_bounds")
print(json.dumps(cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0), launch_bounds=bounds,
                                  fastmath=bool(options.get("fastmath")))[0]))
"""
    env = dict(os.environ, WORKBOOK_DEVICE="compile", NUMBA_ENABLE_CUDASIM="0")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    if done.returncode:
        raise SystemExit(f"numba-cuda could not compile it:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def successor_ptx(target, signature, launch_bounds):
    import workbook  # noqa: F401  (the simulator: numba.cuda here is numba's simulator)
    from numba.core import types

    from workbook import successor

    translation = successor.Translation(gpu=False)
    fn, options = successor.source_of(_kernel(target))
    kernel = translation.jit(fn, options)
    argtypes = tuple(successor.argument_type(translation, t) for t in eval("(" + signature + ",)", vars(types)))
    return translation.cuda.compile_ptx(kernel.py_func, argtypes, cc=(9, 0),
                                        launch_bounds=launch_bounds or options.get("launch_bounds"),
                                        fastmath=bool(options.get("fastmath")))[0]


def numba_signature(text):
    """numba's printed signature ("array(float32, 2d, C), int64") in the notation eval() reads back."""
    def array(match):
        dtype, dims, layout = match.group(1), int(match.group(2)), match.group(3)
        axes = [":"] * dims
        if layout == "C":
            axes[-1] = "::1"
        return f"{dtype}[{', '.join(axes)}]"

    return re.sub(r"array\((\w+), (\d)d, (\w)\)", array, text)


def counts(ptx):
    from workbook import compiler

    facts = compiler._ptx_facts(ptx, (9, 0))
    found = {what: len(re.findall(pattern, ptx, flags=re.M)) for what, pattern in COUNTED.items()}
    return facts, found


def slower(path, threshold=1.1):
    """One line for each kernel `path` (a compilers.json) measured more than 10% slower."""
    stored = json.loads(Path(path).read_text())
    print("kernel | signature | ratio | registers | spilled | stack | " + " | ".join(COUNTED) + "   (numba-cuda / successor)")
    for chapter in stored["chapters"].values():
        for row in chapter["rows"]:
            ratio = (row.get("time_ratio") or {}).get("median")
            if not ratio or ratio <= threshold:
                continue
            module, _, name = row["kernel"].rpartition(".")
            if "<locals>" in module:
                print(f"{row['kernel']} | {row['signature'][:50]} | {ratio:.2f} | made inside a function: left out")
                continue
            signature = numba_signature(row["signature"])
            try:
                both = [counts(stock_ptx(f"{module}:{name}", signature, None)),
                        counts(successor_ptx(f"{module}:{name}", signature, None))]
            except (Exception, SystemExit) as error:  # noqa: BLE001  (the line says why)
                print(f"{row['kernel']} | {signature} | {ratio:.2f} | not compiled here: {str(error)[-200:]}")
                continue
            cells = [f"{both[0][0].get(k)} / {both[1][0].get(k)}" for k in ("registers", "spill_bytes", "stack_bytes")]
            cells += [f"{both[0][1][k]} / {both[1][1][k]}" for k in COUNTED]
            print(f"{row['kernel'].removeprefix('chapters.')} | {signature} | {ratio:.2f} | " + " | ".join(cells), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", nargs="?", help="module:name of a kernel, e.g. chapters.ch00_measuring.kernels:copy_quads_kernel")
    parser.add_argument("signature", nargs="?", help="its argument types, numba's notation: 'float32[::1], int64'")
    parser.add_argument("--slower", metavar="COMPILERS_JSON", help="every kernel that file measured more than 10%% slower")
    parser.add_argument("--launch-bounds", help="threads,blocks an SM, as the kernel's launch_bounds on a GPU")
    parser.add_argument("--grep", help="print the PTX lines matching this regular expression")
    parser.add_argument("--save", help="write stock.ptx and successor.ptx into this folder")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.slower:
        return slower(args.slower)
    if not (args.kernel and args.signature):
        parser.error("name a kernel and its signature, or --slower")
    bounds = tuple(int(v) for v in args.launch_bounds.split(",")) if args.launch_bounds else None

    for name, ptx in (("numba-cuda", stock_ptx(args.kernel, args.signature, bounds)),
                      ("numba-cuda-mlir", successor_ptx(args.kernel, args.signature, bounds))):
        facts, found = counts(ptx)
        print(f"{name}: {facts.get('registers')} registers, {facts.get('spill_bytes')} bytes spilled, "
              f"{facts.get('stack_bytes')} bytes of stack; " + ", ".join(f"{v} {k}" for k, v in found.items()))
        if args.grep:
            print("\n".join("    " + line.strip() for line in ptx.splitlines() if re.search(args.grep, line)))
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            (Path(args.save) / ("stock.ptx" if name == "numba-cuda" else "successor.ptx")).write_text(ptx)


if __name__ == "__main__":
    main()
