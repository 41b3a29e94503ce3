"""What the validation tools' GPU sides share: they run in the simulator's process and start the
GPU work (under ncu or compute-sanitizer) as child processes, which need this environment."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def env():
    """A child process's environment: the GPU, and this checkout importable."""
    return dict(os.environ, WORKBOOK_DEVICE="gpu",
                PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


def stamp():
    """results.stamp() as a process on the GPU sees it (device, driver, versions, date)."""
    done = subprocess.run([sys.executable, "-c", "import json, workbook; from workbook import results; "
                           "print(json.dumps(results.stamp()))"], env=env(), capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])
