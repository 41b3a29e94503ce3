"""numba-cuda's own simulator tests, with and without the workbook: the same results?

    python tools/numba_sim_parity.py                       # every cudasim and cudapy module (minutes)
    python tools/numba_sim_parity.py test_intrinsics ...   # some modules of numba.cuda.tests.cudapy/cudasim

Each side runs in its own process with NUMBA_ENABLE_CUDASIM=1: one plain, one that imports
`workbook` first (its simulator patches and, where the `compile` extra is installed, its compile
hook). Prints the tests whose outcome differs; exits 1 if any does. A maintainer's tool; a quick
subset runs in tests/test_simulator_checks.py. numba-cuda's test support needs the `filecheck`
package (pip install filecheck).
"""

import json
import os
import subprocess
import sys
import tempfile

RUNNER = r'''
import json, pkgutil, sys, unittest
if sys.argv[1] == "workbook":
    import workbook  # noqa: F401
import numba.cuda.tests.cudapy as cudapy, numba.cuda.tests.cudasim as cudasim
wanted = set(sys.argv[3:])
names = [f"{package.__name__}.{module.name}" for package in (cudasim, cudapy)
         for module in pkgutil.iter_modules(package.__path__)
         if module.name.startswith("test_") and (not wanted or module.name in wanted)]

def load(name):
    try:
        return unittest.defaultTestLoader.loadTestsFromName(name)
    except BaseException as error:  # a module that skips itself in the simulator
        if type(error).__name__ not in ("SkipTest", "Skipped"):
            raise
        return unittest.TestSuite()

class Outcomes(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.seen = {}
    def addSuccess(self, test): self.seen[test.id()] = "ok"
    def addFailure(self, test, err): self.seen[test.id()] = "fail"; super().addFailure(test, err)
    def addError(self, test, err): self.seen[test.id()] = "error"; super().addError(test, err)
    def addSkip(self, test, reason): self.seen[test.id()] = "skip"
    def addExpectedFailure(self, test, err): self.seen[test.id()] = "xfail"
    def addUnexpectedSuccess(self, test): self.seen[test.id()] = "xpass"

result = Outcomes()
unittest.TestSuite(load(name) for name in names).run(result)
for test, text in result.errors + result.failures:
    result.seen[test.id()] += ": " + text.strip().splitlines()[-1][:300]
json.dump(result.seen, open(sys.argv[2], "w"))
'''


def outcomes(side, modules):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "outcomes.json")
        env = dict(os.environ, NUMBA_ENABLE_CUDASIM="1", WORKBOOK_DEVICE="sim")
        subprocess.run([sys.executable, "-c", RUNNER, side, path, *modules], env=env, check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        with open(path) as file:
            return json.load(file)


def differences(modules=()):
    """{test id: (plain outcome, outcome with the workbook)} where they differ, and the counts."""
    plain, patched = outcomes("plain", modules), outcomes("workbook", modules)
    kind = lambda outcome: (outcome or "missing").split(":")[0]  # noqa: E731
    differ = {test: (plain.get(test), patched.get(test)) for test in set(plain) | set(patched)
              if kind(plain.get(test)) != kind(patched.get(test))}
    return differ, len(plain)


def main():
    modules = sys.argv[1:]
    differ, count = differences(modules)
    print(f"{count} tests; {len(differ)} with another outcome when the workbook is imported")
    for test, (plain, patched) in sorted(differ.items()):
        print(f"  {test}\n    plain:    {plain}\n    workbook: {patched}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
