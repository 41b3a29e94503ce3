"""One kernel compiled by both compilers without a GPU: numba-cuda and numba-cuda-mlir, side by side.

    PYTHONPATH=<numba-cuda-mlir's site> python tools/successor_ptx.py \\
        chapters.ch01_relu_mask.kernels:relu_mask_ballot_kernel "float32[::1], float32[::1], uint32[::1]" \\
        --launch-bounds 256,8 [--grep 'mul.lo|ld.global'] [--save DIR]

For each compiler: ptxas -v's registers, spilled and stack bytes a thread, then counts of the PTX
instructions that tell the two apart (integer multiplies, parameter loads, global loads, local
memory). numba-cuda's build runs in a worker process (the simulator owns `numba.cuda` here), as
workbook/compiler.py's does; the successor's is `successor.Translation`, as a launch gets it.
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
           "global loads": r"ld\.global", "local memory": r"(ld|st)\.local"}


def _kernel(target):
    module, name = target.rsplit(":", 1)
    value = importlib.import_module(module)
    for part in name.split("."):
        value = getattr(value, part)
    return value


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
print(json.dumps(cuda.compile_ptx(kernel.py_func, signature, cc=(9, 0), launch_bounds={launch_bounds!r})[0]))
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
    return translation.cuda.compile_ptx(kernel.py_func, argtypes, cc=(9, 0), launch_bounds=launch_bounds)[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kernel", help="module:name of a kernel, e.g. chapters.ch00_measuring.kernels:copy_quads_kernel")
    parser.add_argument("signature", help="its argument types, numba's notation: 'float32[::1], int64'")
    parser.add_argument("--launch-bounds", help="threads,blocks an SM, as the kernel's launch_bounds on a GPU")
    parser.add_argument("--grep", help="print the PTX lines matching this regular expression")
    parser.add_argument("--save", help="write stock.ptx and successor.ptx into this folder")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    bounds = tuple(int(v) for v in args.launch_bounds.split(",")) if args.launch_bounds else None
    from workbook import compiler

    for name, ptx in (("numba-cuda", stock_ptx(args.kernel, args.signature, bounds)),
                      ("numba-cuda-mlir", successor_ptx(args.kernel, args.signature, bounds))):
        facts = compiler._ptx_facts(ptx, (9, 0))
        counts = {what: len(re.findall(pattern, ptx, flags=re.M)) for what, pattern in COUNTED.items()}
        print(f"{name}: {facts.get('registers')} registers, {facts.get('spill_bytes')} bytes spilled, "
              f"{facts.get('stack_bytes')} bytes of stack; " + ", ".join(f"{v} {k}" for k, v in counts.items()))
        if args.grep:
            print("\n".join("    " + line.strip() for line in ptx.splitlines() if re.search(args.grep, line)))
        if args.save:
            Path(args.save).mkdir(parents=True, exist_ok=True)
            (Path(args.save) / ("stock.ptx" if name == "numba-cuda" else "successor.ptx")).write_text(ptx)


if __name__ == "__main__":
    main()
