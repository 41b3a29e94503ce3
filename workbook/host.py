"""NumPy references on every core of the host.

On a GPU the chapters check kernels on tensors of a gigabyte, and a NumPy reference of one takes
seconds on one core: NumPy computes an array operation in one thread. But it lets go of Python's
lock while it does, so pieces of one array computed in threads run side by side. A reference whose
rows are independent (each output row depends only on the same rows of its inputs) can be cut into
pieces of rows, computed at once and joined again, with the same result to the bit:

    @by_rows                  # y[i] depends on x[i] only
    def relu_reference(x): ...

    @by_rows(multiple=32)     # pieces of whole 32-bit mask words
    def relu_mask_reference(x): ...

Small arrays (all of the simulator's) are computed in one call, as if undecorated. The inputs of
such references are drawn the same way: `standard_normal(rng, shape)`. A reference that is a loop
(an LSTM's steps) can instead be computed while the GPU's kernels compile and run: in a process of
its own (`in_process`), where it neither waits for this process's launches nor keeps them waiting.
"""

import functools
import os
import pickle
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from .launch import cdiv

SMALL = 1 << 20  # elements of the largest argument below which one call does it all

_pools = []
_in_piece = threading.local()  # .active: this thread computes a piece (a reference calling another)


def _pool():
    if not _pools:
        _pools.append(ThreadPoolExecutor(max_workers=_cores(), thread_name_prefix="workbook-host"))
    return _pools[0]


def _cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _join(parts):
    if isinstance(parts[0], tuple):
        return tuple(_join(list(column)) for column in zip(*parts, strict=True))
    return np.concatenate(parts)


def by_rows(function=None, *, multiple=1):
    """Decorator: `function(*args, **kwargs)` on pieces of rows in threads, its results (an array,
    or a tuple of arrays) joined along their first axis.

    Every NumPy array among the positional arguments is cut along its first axis at the same rows:
    they must all have as many rows, or the call is made whole. `multiple`: each piece but the last
    has a multiple of this many rows (32 where a result packs 32 rows into one bitmask word)."""
    if function is None:
        return functools.partial(by_rows, multiple=multiple)

    @functools.wraps(function)
    def pieced(*args, **kwargs):
        cut = [i for i, a in enumerate(args) if isinstance(a, np.ndarray) and a.ndim > 0]
        rows = {args[i].shape[0] for i in cut}
        if len(rows) != 1 or getattr(_in_piece, "active", False):
            return function(*args, **kwargs)
        (rows,) = rows
        pieces = min(_cores(), rows // multiple)
        if pieces < 2 or max(args[i].size for i in cut) < SMALL:
            return function(*args, **kwargs)
        step = -(-rows // pieces // multiple) * multiple
        starts = range(0, rows, step)

        def piece(start):
            _in_piece.active = True  # a reference it calls is computed whole, in this thread
            try:
                return function(*(a[start:start + step] if i in cut else a for i, a in enumerate(args)), **kwargs)
            finally:
                _in_piece.active = False

        return _join(list(_pool().map(piece, starts)))

    return pieced


def each(function, items):
    """[function(item) for item in items], the items in threads when there is much to do (a list of
    large arrays): a reference over a list of independent tensors."""
    items = list(items)
    if len(items) < 2 or getattr(_in_piece, "active", False) or sum(getattr(item, "size", 0) for item in items) < SMALL:
        return [function(item) for item in items]

    def one(item):
        _in_piece.active = True
        try:
            return function(item)
        finally:
            _in_piece.active = False

    return list(_pool().map(one, items))


def in_background(function, *args, **kwargs):
    """function(*args, **kwargs) started now in a thread of its own; returns a Future (its .result()
    waits, and returns or raises). For work that mostly waits (a GPU's kernel compiles, in worker
    processes) while this thread computes (the NumPy references of the same chapter)."""
    from concurrent.futures import Future

    future = Future()

    def run():
        try:
            future.set_result(function(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001  (raised again by .result())
            future.set_exception(error)

    threading.Thread(target=run, name="workbook-background", daemon=True).start()
    return future


BLAS_THREADS = 1  # in_process's matrix-product threads a process

# A child of in_process: this process's sys.path first (so the function's module imports as it does
# here), then (function, args); prints are sent to stderr, the pickled result alone to stdout.
_CHILD = """
import pickle, sys
sys.path[:0] = pickle.load(sys.stdin.buffer)
function, args = pickle.load(sys.stdin.buffer)
result, sys.stdout = sys.stdout.buffer, sys.stderr
pickle.dump(function(*args), result, protocol=pickle.HIGHEST_PROTOCOL)
"""


def in_process(function, *args):
    """function(*args) computed in a new Python process, started now; returns a Future of its result.

    For a NumPy reference that is a long Python loop of small array operations (an LSTM's steps):
    in a thread of this process it would hold Python's lock between its operations, and every
    launch the GPU is given meanwhile would wait for it (and it for them). function must be found by
    its module and name (a module's function, not a notebook's); it and args are pickled. The
    process's matrix products run in one thread (BLAS_THREADS): a few such processes side by side,
    beside the kernels' compiles in their workers, each have a core of their own, where threads
    of a library's pool on every core would take turns with all of them."""
    payload = pickle.dumps(list(sys.path)) + pickle.dumps((function, args), protocol=pickle.HIGHEST_PROTOCOL)
    name = getattr(function, "__qualname__", repr(function))
    threads = str(BLAS_THREADS)
    env = dict(os.environ, OPENBLAS_NUM_THREADS=threads, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)

    def run():
        done = subprocess.run([sys.executable, "-c", _CHILD], input=payload, capture_output=True, env=env,
                              check=False)
        if done.returncode != 0:
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-12:]
            raise RuntimeError(f"{name} failed in its own process:\n" + "\n".join(tail))
        return pickle.loads(done.stdout)

    return in_background(run)


def standard_normals(rng, sizes, dtype=np.float32):
    """A list of 1-D arrays of standard normal float32 values, of these sizes, astype(dtype): each
    drawn from its own generator spawned from `rng`, the arrays side by side on every core where
    there is much to draw (a list of gradients), so the numbers depend on rng's seed only."""
    jobs = list(zip((int(n) for n in sizes), rng.spawn(len(sizes))))

    def one(job):
        n, generator = job
        return generator.standard_normal(n, dtype=np.float32).astype(dtype, copy=False)

    if sum(n for n, _ in jobs) < SMALL:
        return [one(job) for job in jobs]
    return list(_pool().map(one, jobs))


PIECES = 16  # random inputs are drawn in this many pieces, whatever the machine: the same numbers


def standard_normal(rng, shape, dtype=np.float32):
    """Like rng.standard_normal(shape, dtype=np.float32), astype(dtype): small sizes exactly that;
    a GPU's sizes drawn in PIECES pieces on every core, each from its own generator spawned from
    `rng` (Generator.spawn), so the numbers depend on rng's seed only, not on the machine."""
    shape = (shape,) if np.ndim(shape) == 0 else tuple(shape)
    size = int(np.prod(shape))
    if size < SMALL:
        return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)
    out = np.empty(size, dtype)
    step = cdiv(size, PIECES)

    def piece(job):
        start, generator = job
        out[start:start + step] = generator.standard_normal(min(step, size - start), dtype=np.float32)

    list(_pool().map(piece, zip(range(0, size, step), rng.spawn(PIECES), strict=False)))
    return out.reshape(shape)
