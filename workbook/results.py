"""Where results live, and the stamp every stored result carries.

    results/<device>/<chapter>.json   e.g. results/nvidia-h100-80gb-hbm3/ch00.json
    results/<device>/<chapter>_*.png  the chapter's plots

<device> is the GPU's name made into a folder name, or "simulator". GPU results are committed with
their stamp; simulator results are not (their times mean nothing). WORKBOOK_RESULTS=<folder>
sends what a run writes elsewhere (the tests do, so that they never overwrite stored results);
stored results are always read from results/.
"""

import datetime
import json
import os
import platform
import re
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from numba import cuda

from . import MODE

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "results"
REFERENCE_DEVICE = "nvidia-h200"  # the GPU the results' figures come from (results/nvidia-h100-80gb-hbm3/: a second device)


def _version(package):
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


@lru_cache(maxsize=None)
def device_facts():
    """Name, compute capability, SMs, memory and L2 of the current device, or the simulator's."""
    if MODE == "sim":
        return {"name": "CUDA simulator", "slug": "simulator"}
    device = cuda.get_current_device()
    name = device.name.decode() if isinstance(device.name, bytes) else str(device.name)
    free, total = cuda.current_context().get_memory_info()
    from numba.cuda.cudadrv import driver

    return {
        "name": name,
        "slug": re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-"),
        "compute_capability": "%d.%d" % device.compute_capability,
        "sms": device.MULTIPROCESSOR_COUNT,
        "memory_gib": round(total / 2**30, 1),
        "l2_mb": round(device.L2_CACHE_SIZE / 1e6, 1),
        "driver": _driver_release(),
        "cuda_driver_api": "%d.%d" % driver.driver.get_version(),
    }


def _driver_release():
    """The kernel driver's release (e.g. 580.159.04), as nvidia-smi shows it, where Linux tells."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9.]+)", text)
    return found.group(1) if found else None


def stamp():
    """What a stored number needs to be believed: device, versions, date, mode."""
    facts = device_facts()
    return {
        "device": facts["name"],
        "device_facts": facts,
        "mode": MODE,
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "numba": _version("numba"),
        "numba_cuda": _version("numba-cuda"),
        "numpy": _version("numpy"),
        "torch": _version("torch"),
        "cupy": _version("cupy-cuda13x") or _version("cupy-cuda12x") or _version("cupy"),
    }


def device_dir(slug=None):
    """Where this run writes: results/<device>/, or $WORKBOOK_RESULTS/<device>/."""
    path = Path(os.environ.get("WORKBOOK_RESULTS") or RESULTS) / (slug or device_facts()["slug"])
    path.mkdir(parents=True, exist_ok=True)
    return path


def save_json(chapter, payload, slug=None):
    path = device_dir(slug) / f"{chapter}.json"
    path.write_text(json.dumps(payload, indent=1, default=float) + "\n")
    return path


def stored_path(name):
    """results/<device>/<name> of the reference GPU, or, for a file measured on another GPU only (a
    validation made against that GPU's profiler), the first device folder that holds it."""
    reference = RESULTS / REFERENCE_DEVICE / name
    if reference.exists():
        return reference
    return next(iter(sorted(RESULTS.glob(f"*/{name}"))), reference)


def load_json(chapter, slug=REFERENCE_DEVICE):
    path = RESULTS / slug / f"{chapter}.json"
    return json.loads(path.read_text()) if path.exists() else None


def other_devices(chapter):
    """(device name, {ceiling_gbps, sms, latency_ns or None}) for every GPU other than this one with
    stored results for `chapter`: what chapter 00 needs to draw their Little's-law lines."""
    mine = device_facts()["slug"]
    found = []
    for path in sorted(RESULTS.glob(f"*/{chapter}.json")):
        if path.parent.name in (mine, "simulator"):
            continue
        stored = json.loads(path.read_text())
        ceilings = [case["ceiling"]["gbps"] for case in stored["cases"] if case.get("ceiling")]
        facts = stored["stamp"].get("device_facts", {})
        if not ceilings or not facts.get("sms"):
            continue
        latency = (stored.get("records", {}).get("bytes in flight") or {}).get("latency_ns")
        found.append((stored["stamp"]["device"], {"ceiling_gbps": max(ceilings), "sms": facts["sms"],
                                                  "latency_ns": latency}))
    return found
