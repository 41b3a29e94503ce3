"""What the exercise checks give the kernels they grade (workbook/check_data.py): every check's data
covers the classes of lucky answer, and each class's rule finds the data that leaves it open."""

import numpy as np
import pytest

import workbook
from workbook import check_data as cd
from workbook import exercises as ex

pytestmark = pytest.mark.skipif(workbook.ON_GPU, reason="the launches are recorded in the simulator")


@pytest.mark.parametrize("exercise", ex.all_exercises(), ids=lambda e: e.id)
def test_every_check_covers_the_classes(exercise):
    if not ex.has_solutions(exercise.chapter):
        pytest.skip("no solutions.py here (a handout): the audit runs the reference answers")
    assert cd.audit(exercise) == []


# ---------------------------------------------------------------------------------------------
# Each rule, on launches written out by hand


def launch(*arguments, grid=(1, 1, 1), block=(128, 1, 1), kernel="k"):
    made = []
    for position, a in enumerate(arguments):
        if isinstance(a, np.ndarray):
            made.append(cd.Argument(position, a.shape, str(a.dtype), a.reshape(-1)))
        elif isinstance(a, tuple):  # an output: its shape only
            made.append(cd.Argument(position, a, "float32", None))
        else:
            made.append(cd.Argument(position, None, type(a).__name__, a))
    return cd.Launch(kernel, grid, block, made)


def ramp(n):
    return np.arange(n, dtype=np.float32) * 0.5 - 3


def test_a_parameter_with_one_value_is_named():
    launches = [launch(ramp(n), (n,), 60) for n in (5, 40)]
    assert cd.one_point("k", launches, set()) == ["k: argument 2 is always 60"]
    assert cd.one_point("k", launches, {"k argument 2"}) == []
    launches = [launch(ramp(n), (n, 16), 60 + n) for n in (5, 40)]
    assert cd.one_point("k", launches, set()) == ["k: argument 1's axis 1 is always 16"]
    assert cd.one_point("k", launches, {"k argument 1 axis 1"}) == []


@pytest.mark.parametrize("sizes, covered", [
    ((1, 33, 1000), False),  # no whole warps
    ((32, 64, 33), False),  # nothing under a warp
    ((1, 31, 64), False),  # no partial warp past the first
    ((1, 33, 65, 64), False),  # residues 1 and 0 only
    ((1, 31, 33, 64), True),
])
def test_warp_residues(sizes, covered):
    launches = [launch(ramp(n), (n,)) for n in sizes]
    assert (cd.warp_residues("k", launches, set()) == []) == covered


def test_a_narrow_block_counts_its_own_width():
    """A 16 x 16 tile's last partial row of threads: residues modulo 16, not 32."""
    shapes = [(1, 3), (16, 5), (17, 9), (35, 2)]
    tiles = [launch(ramp(m * n).reshape(m, n), (m, n), block=(16, 16, 1)) for m, n in shapes]
    assert cd.warp_residues("k", tiles, set()) == []
    warps = [launch(ramp(m * n).reshape(m, n), (m, n), block=(256, 1, 1)) for m, n in shapes]
    assert cd.warp_residues("k", warps, set()) != []


def test_tile_residues_name_the_missing_ones():
    launches = [launch(ramp(3 * k).reshape(3, k), (3, 2)) for k in (1, 8, 9, 17)]
    found = cd.tile_residues("k", launches, {("k", 0, 1): 8})
    assert found == ["k: argument 0's axis 1 (tiles of 8) never has residue 2, 3, 4, 5, 6, 7"]
    launches += [launch(ramp(3 * k).reshape(3, k), (3, 2)) for k in range(10, 16)]
    assert cd.tile_residues("k", launches, {("k", 0, 1): 8}) == []


def test_a_grid_stride_kernel_needs_data_past_its_threads():
    fits = [launch(ramp(n), (n,)) for n in (1, 100, 128)]  # one block of 128 threads each time
    assert cd.past_one_launch("k", fits, regridded=8) != []
    # a grid of a thread an element, re-run on one block (it had several): 1000 elements, 128 threads
    grid_stride = [launch(ramp(n), (n,), grid=(8, 1, 1)) for n in (1, 100, 1000)]
    assert cd.past_one_launch("k", grid_stride, regridded=8) == []
    # ... but not if the first launches of several blocks (those re-run on one) fit a block
    assert cd.past_one_launch("k", grid_stride, regridded=2) != []
    # a grid smaller than the data: the loop goes round at the wrapper's own grid
    assert cd.past_one_launch("k", [launch(ramp(1000), (1000,), grid=(2, 1, 1))], regridded=0) == []


def test_constant_or_lane_symmetric_data_is_named():
    symmetric = np.tile(np.concatenate([ramp(16), ramp(16)[::-1]]), 3)  # every warp a palindrome
    assert cd.asymmetric_data("k", [launch(symmetric, (96,))], set()) == [
        "k: argument 0 is the same forwards and backwards across every warp's lanes in every launch"]
    constant = np.full(40, 2.5, np.float32)
    assert cd.asymmetric_data("k", [launch(constant, (40,))], set()) == ["k: argument 0 is constant (np.float32(2.5)) in every launch"]
    # a launch of zeros beside one of varied data is fine (a buffer that starts at zero)
    assert cd.asymmetric_data("k", [launch(np.zeros(40, np.float32), (40,)), launch(ramp(40), (40,))], set()) == []


def test_a_flag_needs_several_bad_values_and_none():
    one_nan = ramp(40)
    one_nan[7] = np.nan
    two = one_nan.copy()
    two[30] = np.inf
    assert cd.several_bad_values("k", [launch(one_nan, (1,)), launch(ramp(40), (1,))]) == [
        "k: no launch holds more than one NaN or Inf in an input"]
    assert cd.several_bad_values("k", [launch(two, (1,))]) == [
        "k: every launch holds a NaN or Inf (none with all values finite)"]
    assert cd.several_bad_values("k", [launch(two, (1,)), launch(ramp(40), (1,))]) == []


def test_the_recorder_sees_a_checks_launches():
    """A check of chapter 00's grid-stride copy at one size, on the reference answer: its launches are
    recorded with their geometry, and the audit names what one size leaves open."""
    from workbook import cuda

    copy = next(e for e in ex.all_exercises(("ch00",)) if e.id == "ch00.1")
    solutions = ex.load("ch00", "solutions") if ex.has_solutions("ch00") else ex.load("ch00")

    def one_size(m):
        src = ramp(1000)
        m.copy_grid_stride(cuda.to_device(src), cuda.device_array(1000, np.float32))

    narrow = ex.Exercise("ch00.1", "one size", "complete", copy.show, one_size, grids=copy.grids)
    if not ex.has_solutions("ch00"):
        pytest.skip("no solutions.py here (a handout)")
    launches = cd.record(narrow, solutions)
    assert [(l.kernel, l.arguments[0].shape) for l in launches] == [("copy_grid_stride_kernel", (1000,))]
    found = cd.audit(narrow, solutions)
    assert any("argument 0's axis 0 is always 1000" in f for f in found)
    assert any("no size" in f for f in found)


def test_an_exemption_for_a_kernel_never_launched_is_named():
    if not ex.has_solutions("ch00"):
        pytest.skip("no solutions.py here (a handout)")
    copy = next(e for e in ex.all_exercises(("ch00",)) if e.id == "ch00.1")
    typo = ex.Exercise("ch00.1", "a typo", "complete", copy.show, copy.check, grids=copy.grids,
                       fixed={"copy_gridstride_kernel argument 1": "a typo", "copy_grid_stride_kernel argument 0": ""})
    found = cd.audit(typo)
    assert "ch00.1: Exercise.fixed or .tiles names copy_gridstride_kernel, which the check never launches" in found
    assert "ch00.1: Exercise.fixed exempts 'copy_grid_stride_kernel argument 0' without a reason" in found


def test_an_output_the_code_allocates_is_not_taken_for_an_input():
    """While launches are recorded, cuda.device_array is poisoned: what np.empty left in an output
    (a stray NaN) cannot pass for an input value."""
    from numba import cuda

    stock = cuda.device_array
    with cd._outputs_poisoned():
        fresh = cuda.device_array((3, 5), np.float32)
        given = cuda.to_device(np.ones(4, np.float32))
    assert cd._argument(0, fresh).value is None  # seen as an output
    np.testing.assert_array_equal(cd._argument(1, given).value, 1)  # an input keeps its values
    assert cuda.device_array is stock
