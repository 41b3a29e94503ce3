"""Choose between a real GPU and numba's CUDA simulator, once, before numba.cuda is imported.

    WORKBOOK_DEVICE=auto   a usable CUDA GPU if the driver finds one, else the simulator (default)
    WORKBOOK_DEVICE=gpu    the GPU, or a clear error
    WORKBOOK_DEVICE=sim    the simulator, even on a GPU machine
    WORKBOOK_DEVICE=compile  numba's real CUDA target with no GPU needed: compiling only (the
                           worker of workbook/compiler.py; nothing can be launched)

numba reads NUMBA_ENABLE_CUDASIM when numba.cuda is first imported, so the choice must be made
before that import; `import workbook` does it, which is why chapters and tests import workbook first.
"""

import ctypes
import os
import sys

MODES = ("auto", "gpu", "sim", "compile")


def _driver_sees_a_gpu():
    """Ask the CUDA driver directly (no numba import) whether a device is usable."""
    for name in ("libcuda.so.1", "libcuda.so", "nvcuda.dll"):
        try:
            libcuda = ctypes.CDLL(name)
        except OSError:
            continue
        count = ctypes.c_int(0)
        if libcuda.cuInit(0) != 0:
            return False
        return libcuda.cuDeviceGetCount(ctypes.byref(count)) == 0 and count.value > 0
    return False


def choose_mode():
    wanted = os.environ.get("WORKBOOK_DEVICE", "auto").strip().lower() or "auto"
    if wanted not in MODES:
        raise ValueError(f"WORKBOOK_DEVICE must be one of {MODES}, not {wanted!r}")
    already = "numba.cuda" in sys.modules
    if already:
        # Too late to choose: report what numba already decided.
        from numba.cuda.core import config

        mode = "sim" if config.ENABLE_CUDASIM else "gpu"
        if wanted == "compile" and mode == "gpu":
            return "compile"
        if wanted != "auto" and wanted != mode:
            raise RuntimeError(
                f"numba.cuda was imported before workbook in {mode} mode, but WORKBOOK_DEVICE={wanted}. "
                "Import workbook first (or restart the kernel)."
            )
        return mode
    if wanted == "compile":
        os.environ["NUMBA_ENABLE_CUDASIM"] = "0"
        return "compile"
    # NUMBA_ENABLE_CUDASIM=1 (inherited from a simulated parent process, say) decides only "auto":
    # WORKBOOK_DEVICE=gpu asked for the GPU by name.
    if wanted == "sim" or (wanted == "auto" and os.environ.get("NUMBA_ENABLE_CUDASIM") == "1"):
        mode = "sim"
    elif wanted == "gpu":
        if not _driver_sees_a_gpu():
            raise RuntimeError("WORKBOOK_DEVICE=gpu but the CUDA driver reports no usable GPU")
        mode = "gpu"
    else:
        mode = "gpu" if _driver_sees_a_gpu() else "sim"
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if mode == "sim" else "0"
    return mode


STOCK_COMPILER, SUCCESSOR = "numba-cuda", "numba-cuda-mlir"


def choose_compiler():
    """The compiler WORKBOOK_COMPILER names: "numba-cuda" (the default) or "numba-cuda-mlir" (see successor.py)."""
    value = os.environ.get("WORKBOOK_COMPILER", STOCK_COMPILER).strip().lower() or STOCK_COMPILER
    if value not in (STOCK_COMPILER, SUCCESSOR):
        raise ValueError(f"WORKBOOK_COMPILER={value!r}: choose {STOCK_COMPILER!r} (the default) or {SUCCESSOR!r}")
    return value
