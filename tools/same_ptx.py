"""Does a change to the kernels' source compile to the same code? Every kernel and signature that two
runs launched in the simulator, its PTX for 9.0 (what the GPU runs) compared before and after.

    WORKBOOK_COMPILE_LOG=build/ptx-before python -m pytest tests/test_ch10_lstm.py    # before the change
    WORKBOOK_COMPILE_LOG=build/ptx-after python -m pytest tests/test_ch10_lstm.py     # after it
    python tools/same_ptx.py build/ptx-before build/ptx-after [--diff]

A refactor of a kernel (a device function pulled out, a loop written once) that leaves its PTX the
same, but for the names numba gives functions, runs the same instructions on a GPU: its measured
figures still hold. Where the PTX differs, the registers and spills ptxas reports are printed beside
it (`--diff`: the first lines that differ), and that kernel needs measuring again on a GPU. The PTX
comes from the compile cache (build/compile-cache/, workbook/compiler.py), which keeps it for 9.0.
Exit status 1 if any kernel's PTX differs, or a kernel of one run is missing from the other.
"""

import argparse
import difflib
import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbook.compiler import CACHE  # noqa: E402

NAME = re.compile(r"_ZN[0-9A-Za-z_$]+|__numba_[0-9A-Za-z_$]+|\$[0-9A-Za-z_.]+|_cudapy_[a-z]+_\d+")  # numba's generated names
# comments, debug lines, and numba's 8-byte global a device function may keep its exception state in
# (one per function, so a function pulled out of a kernel adds one; nothing reads it)
NOISE = re.compile(r"^\s*(//|\.file|\.loc|\.section\s+\.debug)|^\.common \.global \.align 8 \.u64 \S+;$")


def compiled(log_dir):
    """{(kernel, signature): {digest: 9.0 target facts}} from the JSON lines of one run's log: a
    kernel made by a function (one per tile or size) has one digest for each constant it was made with."""
    found = {}
    for path in sorted(Path(log_dir).glob("compile-*.jsonl")):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record["ok"] and not record["kernel"].split(".")[-1].startswith("_exercise_variant"):
                target = next((t for t in record["targets"] if t.get("target") == "9.0"), {})
                found.setdefault((record["kernel"], record["signature"]), {})[record["digest"]] = target
    return found


def normalized_ptx(digest):
    """The kernel's PTX for 9.0 with numba's generated names numbered in order of appearance, and
    comments, debug lines and exception-state globals left out; None if the cache no longer holds it."""
    path = CACHE / f"{digest}.json"
    if not path.exists():
        return None
    ptx = next((t.get("ptx") for t in json.loads(path.read_text())["targets"] if t.get("target") == "9.0"), None)
    if ptx is None:
        return None
    names = {}
    lines = [NAME.sub(lambda m: names.setdefault(m.group(0), f"name{len(names)}"), line)
             for line in ptx.splitlines() if line.strip() and not NOISE.match(line)]
    return lines


def registers(digest):
    """Registers a thread and spill bytes of the kernel from ptxas -v, compiled alone (-c: calls
    into CUDA's device runtime, a grid's sync, left to the linker), or None without ptxas."""
    from workbook.compiler import _ptxas

    ptxas = _ptxas()
    path = CACHE / f"{digest}.json"
    ptx = next((t.get("ptx") for t in json.loads(path.read_text())["targets"] if t.get("target") == "9.0"), None)
    if ptxas is None or ptx is None:
        return None
    with tempfile.TemporaryDirectory() as folder:
        source = Path(folder) / "kernel.ptx"
        source.write_text(ptx)
        done = subprocess.run([ptxas, "-arch=sm_90a", "-c", "-v", str(source), "-o", str(Path(folder) / "k.o")],
                              capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    used = [int(n) for n in re.findall(r"Used (\d+) registers", text)]
    spills = [int(a) + int(b) for a, b in re.findall(r"(\d+) bytes spill stores, (\d+) bytes spill loads", text)]
    return (max(used), max(spills, default=0)) if used else None


def instructions(ptx):
    """How many of each instruction (opcode with its type suffixes) the PTX holds."""
    return Counter(line.split()[0] for line in ptx if line[:1].isspace() and line.split()[0][0] not in "{}.@"
                   and not line.strip().endswith(":")) + Counter(
        line.split()[1] for line in ptx if line.strip().startswith("@") and len(line.split()) > 1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--diff", action="store_true", help="show the first lines where the PTX differs")
    options = parser.parse_args(argv)
    before, after = compiled(options.before), compiled(options.after)
    if not before or not after:
        print(f"no compiles logged in {options.before if not before else options.after}")
        return 1
    same, differ, unknown = 0, [], []
    for key in sorted(before.keys() & after.keys()):  # each kernel made with each of its constants, as a set
        old_ptx = {digest: normalized_ptx(digest) for digest in before[key]}
        new_ptx = {digest: normalized_ptx(digest) for digest in after[key]}
        if None in old_ptx.values() or None in new_ptx.values():
            unknown.append(key)
        elif sorted(map(tuple, old_ptx.values())) == sorted(map(tuple, new_ptx.values())):
            same += 1
        else:
            differ.append((key, before[key], after[key], old_ptx, new_ptx))
    for (kernel, signature), old, new, old_ptx, new_ptx in differ:
        counts = [sum((instructions(ptx) for ptx in side.values()), Counter()) for side in (old_ptx, new_ptx)]
        moved = {op: counts[1][op] - counts[0][op] for op in counts[0] | counts[1] if counts[1][op] != counts[0][op]}
        what = ("the same instructions, in another order" if not moved else
                "instructions " + ", ".join(f"{op} {change:+d}" for op, change in sorted(moved.items())))
        print(f"DIFFERS {kernel}({signature}): {what}; (registers, spill bytes) "
              f"{sorted(map(str, map(registers, old)))} -> {sorted(map(str, map(registers, new)))}")
        if options.diff:
            left, right = sorted(old_ptx.values(), key=len)[0], sorted(new_ptx.values(), key=len)[0]
            print("\n".join(list(difflib.unified_diff(left, right, "before", "after", n=1, lineterm=""))[:40]))
    for name, keys in (("only before", before.keys() - after.keys()), ("only after", after.keys() - before.keys()),
                       ("no PTX in the cache", unknown)):
        for kernel, signature in sorted(keys):
            print(f"{name}: {kernel}({signature})")
    print(f"{same} of {len(before.keys() & after.keys())} kernel signatures compile to the same PTX")
    return 1 if differ or before.keys() != after.keys() or unknown else 0


if __name__ == "__main__":
    sys.exit(main())
