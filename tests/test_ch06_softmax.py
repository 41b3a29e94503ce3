import workbook  # noqa: I001  (first: chooses GPU or simulator)

import numpy as np
import pytest

from chapters.ch06_softmax import kernels as k
from workbook import assert_close, cuda

# (rows, columns): 1, a warp +-1, the warp/block boundary 1024/1025, a vocabulary-sized row, rows
# that do not fill the last block (4 rows per block for the register kernel, 8 for warp groups,
# 128 for the naive kernels), and a large odd shape.
SHAPES = [(1, 1), (3, 31), (5, 32), (9, 33), (2, 1000), (6, 1024), (3, 1025),
          (workbook.size(gpu=131, sim=2), 32000),
          workbook.size(gpu=(4099, 1003), sim=(37, 97))]
# float16 at every shape on a GPU; in the simulator (one Python thread per CUDA thread, and every
# shuffle a rendezvous of 32 of them) at the shapes that take the other code paths.
CASES = [(shape, np.float32) for shape in SHAPES] + [
    (shape, np.float16) for shape in SHAPES if workbook.ON_GPU or shape[1] in (33, 1025, 32000)]
CASE_IDS = [f"{s[0]}x{s[1]}-{np.dtype(d).name}" for s, d in CASES]


def variant_cases(variants):
    """(variant, shape, dtype) for every case; a "4-byte" variant only where the default would take
    16-byte accesses (elsewhere the two are the same kernel)."""
    return [pytest.param(name, shape, dtype, id=f"{name}-{case_id}")
            for name in variants for (shape, dtype), case_id in zip(CASES, CASE_IDS)
            if not (name.endswith("4-byte") and shape[1] % (16 // np.dtype(dtype).itemsize))]
# The optimized kernels take 16-byte accesses wherever the rows allow (a multiple of 4 float32 or
# 8 float16 columns, aligned arrays) and element-by-element ones elsewhere; "4-byte" forces the
# latter (the chapter's earlier step) at every shape.
SOFTMAXES = {
    "naive": k.softmax_naive,
    "registers": k.softmax,
    "registers 4-byte": lambda x, out: k.softmax(x, out, wide=False),
    "two passes": lambda x, out: k.softmax(x, out, registers=False),
}
FORWARDS = {"naive": k.cross_entropy_naive, "fused": k.cross_entropy,
            "fused 4-byte": lambda *args, **options: k.cross_entropy(*args, wide=False, **options)}
BACKWARDS = {"naive": k.cross_entropy_backward_naive, "fused": k.cross_entropy_backward,
             "fused 4-byte": lambda *args, **options: k.cross_entropy_backward(*args, wide=False, **options)}


def logits_for(shape, dtype=np.float32, seed=0):
    return (np.random.default_rng(seed + shape[0] * 7 + shape[1]).standard_normal(shape) * 4).astype(dtype)


def targets_for(rows, ncols, dtype=np.int32, seed=1):
    return np.random.default_rng(seed + rows).integers(0, ncols, rows).astype(dtype)


def tolerance(dtype, ncols=1):
    # float32: the naive kernels add a row's exps one after another, which drifts by ~1e-4
    # relative over 32000 terms (the tree sums of the warp/block kernels stay near 1e-6); float16
    # outputs are rounded to 11 bits.
    if dtype == np.float16:
        return {"rtol": 1e-2, "atol": 1e-3}
    return {"rtol": 1e-4 if ncols <= 1025 else 1e-3, "atol": 1e-6}


def run_forward(forward, logits, targets, **options):
    rows = logits.shape[0]
    outputs = (cuda.device_array(rows, np.float32), cuda.device_array(rows, np.float32),
               cuda.device_array(1, np.float32))
    return forward(cuda.to_device(logits), cuda.to_device(targets), *outputs, **options)


def check_forward(got, logits, targets, rtol=1e-4, atol=1e-5):
    for out, ref, name in zip(got, k.cross_entropy_reference(logits, targets), ("mean", "loss", "lse")):
        assert_close(out, ref, rtol=rtol, atol=atol, name=name)


@pytest.mark.parametrize("variant, shape, dtype", variant_cases(SOFTMAXES))
def test_softmax(variant, shape, dtype):
    x = logits_for(shape, dtype)
    out = SOFTMAXES[variant](cuda.to_device(x), cuda.device_array(shape, dtype))
    assert_close(out, k.softmax_reference(x), **tolerance(dtype, shape[1]))


@pytest.mark.parametrize("variant, shape, dtype", variant_cases(FORWARDS))
def test_cross_entropy_forward(variant, shape, dtype):
    x = logits_for(shape, dtype)
    t = targets_for(shape[0], shape[1], np.int64 if dtype == np.float16 else np.int32)
    check_forward(run_forward(FORWARDS[variant], x, t), x, t)


@pytest.mark.parametrize("variant, shape, dtype", variant_cases(BACKWARDS))
def test_cross_entropy_backward(variant, shape, dtype):
    x = logits_for(shape, dtype)
    t = targets_for(shape[0], shape[1])
    lse = cuda.to_device(k.cross_entropy_reference(x, t)[2])
    grad = BACKWARDS[variant](cuda.to_device(x), cuda.to_device(t), lse, cuda.device_array(shape, dtype))
    assert_close(grad, k.cross_entropy_backward_reference(x, t), **tolerance(dtype, shape[1]))


def test_lse_gives_log_softmax():
    """log_softmax = x - lse: the forward's lse is all a backward (or a log-softmax) needs."""
    x = logits_for((3, 1025))
    t = targets_for(3, 1025)
    _, _, lse = run_forward(k.cross_entropy, x, t)
    assert_close((x - lse.copy_to_host()[:, None]).astype(np.float64), k.log_softmax_reference(x),
                 rtol=1e-5, atol=1e-5)


def extreme_logits(ncols):
    """Rows that break a naive exp: +-1e4, -inf entries, a target with probability ~0 or exactly 0."""
    x = np.zeros((5, ncols), dtype=np.float32)
    x[0, ::2] = 1e4  # exp(1e4) overflows float32: only exp(x - max) is safe
    x[0, 1::2] = -1e4
    x[1, :] = -1e4  # a row all at -1e4
    x[1, ncols // 2] = -1e4 + 1
    x[2, ::3] = -np.inf  # masked entries, as in attention
    x[2, 1::3] = 2.0
    x[3, :] = 5.0
    x[3, 0] = -1e4  # the target (column 0) has probability ~e^-10005: loss ~1e4, not inf
    x[4, :] = 1.0
    x[4, ncols - 1] = -np.inf  # the target's probability is exactly 0: loss = +inf
    targets = np.array([0, ncols // 2, 1, 0, ncols - 1], dtype=np.int32)
    return x, targets


@pytest.mark.parametrize("ncols", [33, 1025])
def test_extreme_logits(ncols):
    x, t = extreme_logits(ncols)
    reference = k.softmax_reference(x)
    assert np.all(np.isfinite(reference))
    for name, softmax in SOFTMAXES.items():
        assert_close(softmax(cuda.to_device(x), cuda.device_array_like(x)), reference, rtol=1e-4,
                     atol=1e-6, name=f"softmax {name}")
    for name, forward in FORWARDS.items():
        mean, losses, lse = run_forward(forward, x, t)
        _, ref_losses, ref_lse = k.cross_entropy_reference(x, t)
        assert np.isinf(ref_losses[4]) and ref_losses[3] > 9999
        # (max - x[t]) + log(sum) keeps the small losses exact even next to logits of 1e4.
        assert_close(losses, ref_losses, rtol=1e-5, atol=1e-5, name=f"loss {name}")
        assert_close(lse, ref_lse, rtol=1e-6, name=f"lse {name}")
        assert np.isinf(mean.copy_to_host()[0])
    for name, backward in BACKWARDS.items():
        lse = cuda.to_device(k.cross_entropy_reference(x, t)[2])
        grad = backward(cuda.to_device(x), cuda.to_device(t), lse, cuda.device_array_like(x))
        # lse stored in float32 is off by up to |lse| * 2^-24 ~ 6e-4 at 1e4: exp(x - lse) inherits it.
        assert_close(grad, k.cross_entropy_backward_reference(x, t), rtol=1e-3, atol=1e-6,
                     name=f"grad {name}")


@pytest.mark.parametrize("n", [1, 255, 257, workbook.size(gpu=100_003, sim=1001)])
def test_batch_mean_past_one_block(n):
    """Bug 2 of the book: its batch mean forgets every loss past the first block of 256."""
    values = np.random.default_rng(n).standard_normal(n).astype(np.float32) + 3
    mean = cuda.device_array(1, np.float32)
    k.batch_mean_kernel[1, k.TREE_THREADS](cuda.to_device(values), mean)
    assert_close(mean, np.array([values.astype(np.float64).mean()], np.float32), rtol=1e-5)


def test_naive_forward_batch_past_one_block():
    rows = k.TREE_THREADS + 45  # 3 blocks of the naive kernel, and the mean over all 301 rows
    x = logits_for((rows, 3))
    t = targets_for(rows, 3)
    check_forward(run_forward(k.cross_entropy_naive, x, t), x, t)


@pytest.mark.parametrize("variant", list(FORWARDS))
def test_target_out_of_range_is_a_clear_error(variant):
    x = logits_for((4, 10))
    for bad in (10, -1):
        t = np.array([1, 2, bad, 3], dtype=np.int32)
        with pytest.raises(ValueError, match=rf"targets\[2\] = {bad} is out of range for 10 classes"):
            run_forward(FORWARDS[variant], x, t)
    # Unchecked (the timed path), a bad target still reads nothing outside its row: NaN loss.
    mean, losses, _ = run_forward(FORWARDS[variant], x, t, check_targets=False)
    got = losses.copy_to_host()
    assert np.isnan(got[2]) and np.all(np.isfinite(got[[0, 1, 3]])) and np.isnan(mean.copy_to_host()[0])


@pytest.mark.parametrize("variant", list(BACKWARDS))
def test_backward_target_out_of_range(variant):
    x = logits_for((3, 40))
    t = cuda.to_device(np.array([0, 40, 5], dtype=np.int32))
    lse = cuda.to_device(np.zeros(3, np.float32))
    with pytest.raises(ValueError, match=r"targets\[1\] = 40 is out of range"):
        BACKWARDS[variant](cuda.to_device(x), t, lse, cuda.device_array_like(x))
    grad = BACKWARDS[variant](cuda.to_device(x), t, lse, cuda.device_array_like(x), check_targets=False)
    got = grad.copy_to_host()
    assert np.all(np.isnan(got[1])) and np.all(np.isfinite(got[[0, 2]]))


@pytest.mark.parametrize("softmax", [k.softmax_naive, k.softmax], ids=["naive", "optimized"])
def test_softmax_bad_input(softmax):
    x = logits_for((4, 8))
    d_x = cuda.to_device(x)
    with pytest.raises(TypeError, match="host"):
        softmax(x, cuda.device_array_like(d_x))
    with pytest.raises(TypeError, match="dtype float64"):
        softmax(cuda.to_device(x.astype(np.float64)), cuda.device_array((4, 8), np.float64))
    with pytest.raises(TypeError, match="out has dtype float16"):
        softmax(d_x, cuda.device_array((4, 8), np.float16))
    with pytest.raises(ValueError, match=r"shape \(4, 9\)"):
        softmax(d_x, cuda.device_array((4, 9), np.float32))
    with pytest.raises(ValueError, match="1 dimensions, expected 2"):
        softmax(cuda.to_device(x.reshape(-1)), cuda.device_array(32, np.float32))
    with pytest.raises(ValueError, match="at least one row and one column"):
        softmax(cuda.device_array((4, 0), np.float32), cuda.device_array((4, 0), np.float32))


@pytest.mark.parametrize("forward", list(FORWARDS))
def test_cross_entropy_bad_input(forward):
    forward = FORWARDS[forward]
    x = cuda.to_device(logits_for((4, 8)))
    t = cuda.to_device(targets_for(4, 8))
    good = dict(losses=cuda.device_array(4, np.float32), lse=cuda.device_array(4, np.float32),
                mean=cuda.device_array(1, np.float32))
    with pytest.raises(TypeError, match="targets has dtype float32"):
        forward(x, cuda.device_array(4, np.float32), **good)
    with pytest.raises(ValueError, match=r"targets has shape \(5,\)"):
        forward(x, cuda.to_device(targets_for(5, 8)), **good)
    with pytest.raises(TypeError, match="targets is a host"):
        forward(x, targets_for(4, 8), **good)
    with pytest.raises(ValueError, match=r"mean has shape \(4,\)"):
        forward(x, t, **{**good, "mean": cuda.device_array(4, np.float32)})
    with pytest.raises(TypeError, match="lse has dtype float16"):
        forward(x, t, **{**good, "lse": cuda.device_array(4, np.float16)})


@pytest.mark.parametrize("ncols", [32, 64, 1024])
def test_full_rows_take_the_unchecked_kernel(ncols):
    """Rows of exactly 32*slots columns run the variant without bounds checks: same answers."""
    x = logits_for((5, ncols))
    for full in (False, True):
        out = cuda.device_array_like(x)
        k.warp_softmax_kernel(k._slots(ncols), full=full)[2, 128](cuda.to_device(x), out)
        assert_close(out, k.softmax_reference(x), rtol=1e-4, atol=1e-6, name=f"full={full}")


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("ncols", [8, 96, 256, 1024])
def test_16_byte_paths(ncols, dtype):
    """Rows a multiple of 16 bytes take the 16-byte kernels (the register kernel once a lane has a
    whole access, the row kernels above 1024 columns); each agrees with the element-by-element one."""
    rows = 5
    x = logits_for((rows, ncols), dtype)
    t = targets_for(rows, ncols)
    d_x, d_t = cuda.to_device(x), cuda.to_device(t)
    assert k._width(ncols, d_x) == 16 // x.itemsize
    assert_close(k.softmax(d_x, cuda.device_array_like(x)), k.softmax_reference(x), **tolerance(dtype, ncols))
    check_forward(run_forward(k.cross_entropy, x, t), x, t)
    lse = cuda.to_device(k.cross_entropy_reference(x, t)[2])
    assert_close(k.cross_entropy_backward(d_x, d_t, lse, cuda.device_array_like(x)),
                 k.cross_entropy_backward_reference(x, t), **tolerance(dtype, ncols))


@pytest.mark.parametrize("offset", [1, 2, 3])
def test_misaligned_rows_take_the_4_byte_kernels(offset):
    """A view that starts 4, 8 or 12 bytes past a 16-byte boundary: every row is misaligned, so the
    wrappers fall back to element-by-element access (a 16-byte access there would fault)."""
    rows, ncols = 3, 64
    x = logits_for((rows, ncols))
    d_flat = cuda.to_device(np.concatenate([np.zeros(offset, np.float32), x.reshape(-1)]))
    d_x = d_flat[offset:].reshape(rows, ncols)
    assert k._width(ncols, d_x) == 1
    assert_close(k.softmax(d_x, cuda.device_array_like(x)), k.softmax_reference(x), **tolerance(np.float32))
    t = targets_for(rows, ncols)
    got = k.cross_entropy(d_x, cuda.to_device(t), cuda.device_array(rows, np.float32),
                          cuda.device_array(rows, np.float32), cuda.device_array(1, np.float32))
    check_forward(got, x, t)


def test_slots_are_powers_of_two():
    assert [k._slots(n) for n in (1, 32, 33, 64, 65, 1000, 1024)] == [1, 1, 2, 2, 4, 32, 32]
