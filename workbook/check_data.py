"""What an exercise's check gives the kernels it grades: the data, sizes and parameters of every
launch, recorded in the simulator, and the classes of lucky answer that data would let pass.

A check that runs an answer at one size, with one value of a parameter, on data symmetric across a
warp's lanes, grades correct the answer that is right only there: a constant where the parameter
belongs, a step count right for some residues of the size only, a shuffle in the wrong direction.
`audit(exercise)` runs the check on the reference answer with a recorder (a simulator listener) and
names each such class the recorded launches leave open:

    class                   the launches of the answer's kernels must ...
    parameters              give every scalar argument, and every array's extent along each axis,
                            at least two values (a constant that equals the only one passes)
    warp residues           give some size (an array axis, an array's elements, an integer argument)
                            values under a warp, whole warps, a partial warp past the first and at
                            least three residues modulo 32 (a partial last warp tried at one size
                            only); modulo block.x where blocks are narrower (a 16 x 16 tile)
    tile residues           give the axis a tiled loop steps along every residue of its tile
                            (Exercise.tiles)
    past one launch         for a grid-stride kernel (Exercise.grids has "one block"), hold more
                            elements than the launch has threads, at the wrapper's grid or on one
                            block in a launch the check runs again there
    asymmetric data         hand each input, in some launch, values that vary and do not read the
                            same forwards and backwards across a warp's 32 lanes (a reversed
                            shuffle passes there)
    several bad values      where an input holds NaN or Inf, hold two or more in one array in some
                            launch, and none in another (a count passes where a flag is asked)

And the cases run smallest first (each launch holds at least as many elements as the one before),
so that a check, which stops at its first failure, names the smallest case that fails.

What a spec fixes (a 3x3 filter, 32 bits a mask word) is exempt by name: Exercise.fixed, each with
its reason. tests/test_check_data.py holds every check to this; `python -m workbook exercises
--audit` prints the table.
"""

import contextlib
import sys
from dataclasses import dataclass, field

import numpy as np

WARP = 32
KEPT = 1 << 16  # input elements kept per launch (the simulator's sizes are far smaller)


@dataclass
class Argument:
    position: int
    shape: tuple = None  # an array's; None for a scalar
    dtype: str = ""
    value: object = None  # a scalar's value, or an input array's elements (None for an output)


@dataclass
class Launch:
    kernel: str
    grid: tuple
    block: tuple
    arguments: list = field(default_factory=list)

    @property
    def threads(self):
        return int(np.prod(self.grid)) * int(np.prod(self.block))

    def largest(self):
        arrays = [a for a in self.arguments if a.shape is not None]
        return max((int(np.prod(a.shape)) for a in arrays), default=0)


def _poisoned(values):
    """An output the check poisoned (workbook.check.poison: every byte 0xFF)."""
    if values.dtype.kind not in "fiub" or values.itemsize not in (1, 2, 4, 8) or not values.size:
        return False
    return bool((values.reshape(-1).view(f"u{values.itemsize}") == np.iinfo(f"u{values.itemsize}").max).all())


def _argument(position, value):
    host = getattr(value, "_ary", value)  # a simulator device array holds a NumPy one
    if isinstance(host, np.ndarray) and host.ndim > 0:
        kept = None if _poisoned(host) else np.array(host.reshape(-1)[:KEPT])
        return Argument(position, tuple(host.shape), str(host.dtype), kept)
    if isinstance(value, (bool, int, float, np.number)):
        return Argument(position, None, type(value).__name__, value)
    return Argument(position, None, type(value).__name__, None)


class Recorder:
    """A simulator listener: every launch of one module's kernels, and of kernels that module's code
    launches, with its geometry and arguments."""

    def __init__(self, module_name):
        self.module = module_name
        self.launches = []

    def launch_arguments(self, number, kernel, args):
        from .exercises import launched_by

        if launched_by(self.module, kernel, sys._getframe(1)):
            self.launches.append(Launch(kernel.fn.__name__, tuple(kernel.grid_dim), tuple(kernel.block_dim),
                                        [_argument(i, a) for i, a in enumerate(args)]))

    def launch_started(self, number, kernel):
        pass

    def launch_ended(self, number, kernel, failed=False):
        pass

    def count(self, space, size):  # accesses: not wanted (watch.report then builds no Access)
        pass


def record(exercise, module):
    """The launches `exercise.check(module)` makes, in the simulator's default order."""
    from . import ON_GPU
    from .exercises import strict_simulator

    if ON_GPU:
        raise RuntimeError("the launches are recorded in the simulator: run with WORKBOOK_DEVICE=sim")
    from .simulator import watch

    recorder = Recorder(module.__name__)
    with strict_simulator(sanitize=False), watch.listening(recorder), _outputs_poisoned():
        exercise.check(module)
    return recorder.launches


@contextlib.contextmanager
def _outputs_poisoned():
    """cuda.device_array hands out poisoned memory while launches are recorded: an output the code
    allocates (im2col's col) is then seen as an output (_poisoned), not as an input holding
    whatever np.empty left there (a stray NaN in it once made the audit of ch04.1 fail)."""
    from numba import cuda

    from .check import poison

    stock = cuda.device_array

    def device_array(*args, **kwargs):
        out = stock(*args, **kwargs)
        poison(out)
        return out

    cuda.device_array = device_array
    try:
        yield
    finally:
        cuda.device_array = stock


# ---------------------------------------------------------------------------------------------
# The classes


def _by_kernel(launches):
    kernels = {}
    for launch in launches:
        kernels.setdefault(launch.kernel, []).append(launch)
    return kernels


def _axes(launches):
    """{(argument position, axis): [extent at each launch]} of a kernel's array arguments."""
    axes = {}
    for launch in launches:
        for a in launch.arguments:
            if a.shape is not None:
                for axis, extent in enumerate(a.shape):
                    axes.setdefault((a.position, axis), []).append(extent)
    return axes


def _sizes(launches):
    """What a kernel's threads may be mapped over, each as [its value at each launch]: every array
    axis's extent, every array's element count, every integer argument (a size passed as a scalar)."""
    sizes = list(_axes(launches).values())
    flat, scalars = {}, {}
    for launch in launches:
        for a in launch.arguments:
            if a.shape is not None:
                flat.setdefault(a.position, []).append(int(np.prod(a.shape)))
            elif isinstance(a.value, (int, np.integer)) and not isinstance(a.value, bool):
                scalars.setdefault(a.position, []).append(int(a.value))
    return sizes + list(flat.values()) + list(scalars.values())


def one_point(kernel, launches, fixed):
    found = []
    scalars = {}
    for launch in launches:
        for a in launch.arguments:
            if a.shape is None and a.value is not None:
                scalars.setdefault(a.position, set()).add(a.value)
    for position, values in scalars.items():
        if len(values) < 2 and f"{kernel} argument {position}" not in fixed:
            found.append(f"{kernel}: argument {position} is always {next(iter(values))!r}")
    for (position, axis), extents in _axes(launches).items():
        if len(set(extents)) < 2 and f"{kernel} argument {position} axis {axis}" not in fixed \
                and f"{kernel} argument {position}" not in fixed:
            found.append(f"{kernel}: argument {position}'s axis {axis} is always {extents[0]}")
    return found


def warp_residues(kernel, launches, fixed):
    """Lanes run along a block's x: a warp of 32 where blocks are that wide, else a row of block.x
    threads (a 16 x 16 tile) is what the last partial one leaves idle."""
    if f"{kernel} warp residues" in fixed:
        return []
    width = min(WARP, min(launch.block[0] for launch in launches))
    if width < 3:
        return []
    for extents in _sizes(launches):
        values = set(extents)
        residues = {v % width for v in values}
        if any(v < width for v in values) and 0 in residues and any(v > width and v % width for v in values) \
                and len(residues) >= 3:
            return []
    return [f"{kernel}: no size (array axis, element count, integer argument) takes a value under {width} (the block's width in lanes), a multiple of it, "
            f"a partial one past the first and three residues modulo {width}"]


def tile_residues(kernel, launches, tiles):
    found = []
    for (name, position, axis), tile in tiles.items():
        if name != kernel:
            continue
        extents = _axes(launches).get((position, axis), [])
        missing = sorted(set(range(tile)) - {e % tile for e in extents})
        if missing:
            found.append(f"{kernel}: argument {position}'s axis {axis} (tiles of {tile}) never has residue "
                         f"{', '.join(map(str, missing[:8]))}{' ...' if len(missing) > 8 else ''}")
    return found


def past_one_launch(kernel, launches, regridded):
    """A grid-stride loop that never goes round passes on data that fits the launch's threads. Some
    launch must hold more elements than it has threads: at the wrapper's grid, or on one block, where
    the check runs again its first `regridded` launches of more than one block
    (exercises._wrong_on_another_grid)."""
    changed = [launch for launch in launches if int(np.prod(launch.grid)) > 1][:regridded]
    if any(launch.largest() > launch.threads for launch in launches) or \
            any(launch.largest() > int(np.prod(launch.block)) for launch in changed):
        return []
    return [f"{kernel}: a grid-stride kernel, but no launch holds more elements than it has threads, at the "
            f"wrapper's grid or on one block (the first {regridded} launches of more than one block): the loop "
            f"never has to go round"]


def _symmetric(values):
    """Every warp's 32 values read the same forwards and backwards (a shuffle's direction cannot show)."""
    whole = values.size - values.size % WARP
    if not whole:
        return False
    chunks = values[:whole].reshape(-1, WARP)
    return np.array_equal(chunks, chunks[:, ::-1], equal_nan=chunks.dtype.kind in "fc")


def asymmetric_data(kernel, launches, fixed):
    """Per input argument: a finding if no launch gives it data that varies and is not symmetric
    across every warp (a launch of zeros or of one value is fine beside others that are not)."""
    verdicts = {}
    for launch in launches:
        for a in launch.arguments:
            if a.shape is None or a.value is None or a.value.size < 2 or \
                    f"{kernel} argument {a.position}" in fixed:
                continue
            if np.unique(a.value).size < 2 and not (a.value.dtype.kind == "f" and np.isnan(a.value).all()):
                verdicts.setdefault(a.position, []).append(f"constant ({a.value[0]!r})")
            elif _symmetric(a.value):
                verdicts.setdefault(a.position, []).append("the same forwards and backwards across every warp's lanes")
            else:
                verdicts.setdefault(a.position, []).append(None)
    return [f"{kernel}: argument {position} is {next(v for v in seen if v)} in every launch"
            for position, seen in sorted(verdicts.items()) if all(seen)]


def several_bad_values(kernel, launches):
    bad = []  # per launch: the most non-finite values in one input array
    for launch in launches:
        floats = [a.value for a in launch.arguments if a.value is not None and a.shape is not None
                  and a.value.dtype.kind == "f"]
        bad.append(max((int((~np.isfinite(v)).sum()) for v in floats), default=None))
    seen = [b for b in bad if b is not None]
    if not seen or max(seen) == 0:
        return []
    found = []
    if max(seen) < 2:
        found.append(f"{kernel}: no launch holds more than one NaN or Inf in an input")
    if min(seen) > 0:
        found.append(f"{kernel}: every launch holds a NaN or Inf (none with all values finite)")
    return found


def smallest_first(kernel, launches):
    """A check stops at its first failure: its cases must grow, so that the message names the smallest."""
    sizes = [launch.largest() for launch in launches]
    drops = [i for i in range(1, len(sizes)) if sizes[i] < sizes[i - 1]]
    if not drops:
        return []
    i = drops[0]
    return [f"{kernel}: launch {i + 1} of {len(sizes)} holds {sizes[i]} elements after one of {sizes[i - 1]} "
            f"(the cases are not smallest first: a failure would be named at a larger case than needed)"]


def audit(exercise, module=None):
    """[finding, ...]: the classes of lucky answer the check's data leaves open (none: it covers them)."""
    from . import exercises

    module = module or exercises.load(exercise.chapter, "solutions")
    launches = record(exercise, module)
    if not launches:
        return [f"{exercise.id}: the check launched no kernel of the answer's module"]
    fixed, tiles = set(exercise.fixed), dict(exercise.tiles)
    launched = {launch.kernel for launch in launches}
    named = {what.split()[0] for what in fixed} | {kernel for kernel, _, _ in tiles}
    found = [f"{exercise.id}: Exercise.fixed or .tiles names {kernel}, which the check never launches"
             for kernel in sorted(named - launched)]
    found += [f"{exercise.id}: Exercise.fixed exempts {what!r} without a reason"
              for what, why in exercise.fixed.items() if not str(why).strip()]
    for kernel, mine in _by_kernel(launches).items():
        found += one_point(kernel, mine, fixed)
        found += warp_residues(kernel, mine, fixed)
        found += tile_residues(kernel, mine, tiles)
        if "one block" in exercise.grids and f"{kernel} past one launch" not in fixed:
            found += past_one_launch(kernel, mine, exercises.REGRIDDED_LAUNCHES)
        found += asymmetric_data(kernel, mine, fixed)
        found += several_bad_values(kernel, mine)
        found += smallest_first(kernel, mine)
    return found
