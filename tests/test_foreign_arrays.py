"""Foreign device arrays (torch, CuPy) through the wrappers' checks: workbook/inputs.py's ForeignViews.

In the simulator a device array's memory is host memory, so a foreign array is played by
`HostTensor`: a NumPy array's memory described by `__cuda_array_interface__`, viewed by
`host_view` (the simulator's stand-in for numba's `from_cuda_array_interface`); `TorchLike` plays a
torch tensor, read through torch's accessors. What runs is the real cache, the real checks and the
real wrappers. The tests at the end take real torch CUDA tensors: GPU and torch only.
"""

import workbook  # noqa: I001  (first: it picks the GPU or the simulator before numba.cuda is imported)

import ctypes
import gc
import weakref

import numpy as np
import pytest

from workbook import bench, cuda, inputs
from workbook.inputs import require

from chapters.ch00_measuring import kernels as ch00
from chapters.ch01_relu_mask import kernels as ch01
from chapters.ch02_dropout import kernels as ch02
from chapters.ch06_softmax import kernels as ch06


class HostTensor:
    """A foreign device array as the simulator can have one: a NumPy array's memory, described by
    __cuda_array_interface__ (counting how often it is read)."""

    def __init__(self, array):
        self.array, self.reads = array, 0

    @property
    def __cuda_array_interface__(self):
        self.reads += 1
        a = self.array
        return {"data": (a.__array_interface__["data"][0], False), "shape": a.shape,
                "strides": None if a.flags.c_contiguous else a.strides, "typestr": a.dtype.str, "version": 3,
                "stream": None}


def host_view(description):
    """A simulator device array on the memory an interface describes, holding nothing (as
    inputs._numba_view does on a GPU)."""
    dtype, shape = np.dtype(description["typestr"]), tuple(description["shape"])
    strides = description.get("strides") or tuple(int(s) for s in np.empty(shape, dtype).strides)
    span = dtype.itemsize + sum((n - 1) * s for n, s in zip(shape, strides)) if all(shape) else 0
    memory = (ctypes.c_char * max(span, 1)).from_address(description["data"][0])
    return type(cuda.device_array(1, np.uint8))(np.ndarray(shape, dtype, buffer=memory, strides=strides))


@pytest.fixture
def views(monkeypatch):
    """The wrappers' cache of foreign views, replaced by one that can view a HostTensor."""
    if workbook.ON_GPU:
        pytest.skip("host memory stands in for device memory in the simulator only; on a GPU the torch "
                    "tests below take real tensors")
    foreign = inputs.ForeignViews(size=4, make=host_view)
    monkeypatch.setattr(inputs, "FOREIGN", foreign)
    return foreign


def address(array):
    return array.__array_interface__["data"][0]


# ---------------------------------------------------------------------------------------------
# The cache: its key, its bound, what a view holds


def test_a_view_is_made_once_per_memory_and_layout(views):
    a = np.arange(12, dtype=np.float32)
    first = require(HostTensor(a), "x")
    again = require(HostTensor(a), "x")  # another object on the same memory, the same layout: found
    assert views.misses == 1 and first is not again  # each call its own copy of the kept view
    np.testing.assert_array_equal(again.copy_to_host(), a)
    require(HostTensor(a.reshape(3, 4)), "x")  # the same memory, another shape
    require(HostTensor(a.view(np.int32)), "x")  # another dtype
    require(HostTensor(a[4:]), "x")  # another address
    assert views.misses == 4
    assert list(views.views)[0] == (address(a), (12,), None, "<f4", None)  # (pointer, shape, strides, dtype, stream)


def test_the_key_holds_the_strides(views):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with pytest.raises(ValueError, match="x must be C-contiguous"):  # viewed, then refused by the check
        require(HostTensor(a[:, :2]), "x")
    require(HostTensor(a.reshape(-1)[:6].reshape(3, 2)), "x")  # the same address and shape, contiguous
    assert views.misses == 2
    assert [key[1:3] for key in views.views] == [((3, 2), (16, 4)), ((3, 2), None)]


def test_the_cache_keeps_the_most_recently_used_views(views):
    arrays = [np.full(8, k, np.float32) for k in range(6)]
    for a in arrays[:4]:
        require(HostTensor(a), "x")
    require(HostTensor(arrays[0]), "x")  # a hit: the first is now the most recent
    require(HostTensor(arrays[4]), "x")  # one past the bound of 4: the least recently used goes
    kept = {key[0] for key in views.views}
    assert len(views.views) == 4
    assert address(arrays[0]) in kept and address(arrays[1]) not in kept and address(arrays[4]) in kept
    assert views.misses == 5


def test_a_kept_view_does_not_hold_its_tensor(views):
    tensor = HostTensor(np.arange(8, dtype=np.float32))
    owner = weakref.ref(tensor)
    view = require(tensor, "x")
    del tensor
    gc.collect()
    assert owner() is not None  # the view handed out holds it, as cuda.as_cuda_array's views do
    np.testing.assert_array_equal(view.copy_to_host(), np.arange(8, dtype=np.float32))
    del view
    gc.collect()
    assert owner() is None  # ... and the kept view, still in the cache, does not
    assert len(views.views) == 1


def test_what_is_refused_before_any_view_is_made(views):
    with pytest.raises(TypeError, match="x must be a device array, not list"):
        require([1.0, 2.0], "x")
    with pytest.raises(TypeError, match=r"host \(NumPy\) array"):
        require(np.zeros(4, np.float32), "x")
    memory = np.zeros(9, np.float32)
    misaligned = np.ndarray((8,), np.float32, buffer=memory.data, offset=2)  # 2 bytes into a float
    with pytest.raises(ValueError, match="not a multiple of its 4-byte elements"):
        require(HostTensor(misaligned), "x")
    assert views.misses == 0


def test_the_simulator_refuses_gpu_memory():
    # the cache as the simulator has it: no way to read GPU memory
    if workbook.ON_GPU:
        pytest.skip("on a GPU a foreign array is viewed")
    with pytest.raises(TypeError, match="the simulator runs kernels on the host"):
        require(HostTensor(np.zeros(4, np.float32)), "x")


def the_error(call):
    with pytest.raises((TypeError, ValueError)) as caught:
        call()
    return type(caught.value), str(caught.value)


CHECKS = [  # (what require is asked, the array): each refused
    ({"dtype": np.float16}, np.zeros(6, np.float32)),
    ({"dtype": (np.float16, np.int32)}, np.zeros(6, np.float32)),
    ({"ndim": 2}, np.zeros(6, np.float32)),
    ({"shape": (5,)}, np.zeros(6, np.float32)),
    ({"shape": (3, 2)}, np.zeros((2, 3), np.float32)),
    ({}, np.zeros((4, 6), np.float32)[:, ::2]),  # not C-contiguous
]


@pytest.mark.parametrize("asked, array", CHECKS, ids=lambda v: str(v) if isinstance(v, dict) else v.dtype.name)
def test_the_checks_say_the_same_of_a_foreign_array(views, asked, array):
    numba_array = cuda.to_device(np.ascontiguousarray(array))
    if not array.flags.c_contiguous:
        numba_array = cuda.to_device(np.ascontiguousarray(array.base))[:, ::2]
    assert the_error(lambda: require(HostTensor(array), "x", **asked)) == \
        the_error(lambda: require(numba_array, "x", **asked))


# ---------------------------------------------------------------------------------------------
# torch tensors, read through torch's accessors (a stand-in with torch's names, in the simulator)


class FakeDtype:
    def __init__(self, name):
        self.name = name

    def __str__(self):
        return f"torch.{self.name}"


FLOAT32, BFLOAT16 = FakeDtype("float32"), FakeDtype("bfloat16")


class TorchLike:
    """What ForeignViews reads of a torch tensor, on a NumPy array's memory. Named as torch names
    its class (torch.Tensor), so that the reader takes torch's accessors; its interface must never
    be read."""

    def __init__(self, array, *, device="cuda", requires_grad=False, dtype=FLOAT32):
        self.array, self.device, self.requires_grad, self.dtype = array, device, requires_grad, dtype
        self.shape = array.shape

    def data_ptr(self):
        return address(self.array)

    def stride(self):
        return tuple(s // self.array.itemsize for s in self.array.strides)

    def get_device(self):
        return 0 if self.device == "cuda" else -1

    def is_contiguous(self):
        return self.array.flags.c_contiguous

    def numel(self):
        return self.array.size

    @property
    def __cuda_array_interface__(self):
        raise AssertionError("the interface was read: torch's accessors are the fast path")


TorchLike.__name__, TorchLike.__module__ = "Tensor", "torch"


def test_a_torch_tensor_is_read_through_its_accessors(views):
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    view = require(TorchLike(a), "x", dtype=np.float32, shape=(2, 3))
    np.testing.assert_array_equal(view.copy_to_host(), a)
    require(TorchLike(a), "x")
    assert views.misses == 1
    assert list(views.views) == [(address(a), (2, 3), (3, 1), FLOAT32, 0)]  # torch's dtype, mapped once per view
    with pytest.raises(TypeError, match="x has dtype float32, expected float16"):
        require(TorchLike(a), "x", dtype=np.float16)


def test_torch_tensors_that_cannot_be_taken_say_why(views):
    a = np.zeros(4, np.float32)
    with pytest.raises(TypeError, match=r"x is a torch tensor that requires grad.*x\.detach\(\)"):
        require(TorchLike(a, requires_grad=True), "x")
    fix = r"x\.cuda\(\)" if workbook.ON_GPU else r"cuda\.to_device\(x\.numpy\(\)\)"
    with pytest.raises(TypeError, match=f"x is a torch tensor on cpu; .*{fix}"):
        require(TorchLike(a, device="cpu"), "x")
    with pytest.raises(TypeError, match="x has dtype torch.bfloat16, which NumPy .* has no dtype for"):
        require(TorchLike(a.view(np.uint16), dtype=BFLOAT16), "x")
    assert views.misses == 0


def test_tensor_calls_find_a_call_again_from_its_tensors(views, monkeypatch):
    # launch.TensorCalls' bookkeeping, with a stand-in for the launch cache's entry (on a GPU the
    # wrappers' own calls go through it: test_torch_tensors_take_the_short_path_when_met_again)
    from workbook import launch

    monkeypatch.setattr(launch, "ON_GPU", True)
    a, b = TorchLike(np.zeros(8, np.float32)), TorchLike(np.zeros(8, np.float32))
    view_b = require(b, "b")
    launched = []

    class Prepared:
        def set(self, index, value):
            launched.append(("set", index, value))

        def __call__(self):
            launched.append("launch")

    calls = launch.TensorCalls(size=2)
    key = calls.key(("a", "b"), (a, b), 0.5)
    assert calls.find(key) is None
    calls.keep(key, [Prepared(), (None, None, 1)], returns=(view_b,), owners=(1,))
    found = calls.find(calls.key(("a", "b"), (a, b), 0.5))
    (out,) = found((None, None, 2), (a, b))
    assert launched == [("set", 2, 2), "launch"]  # only the scalar that changed is stored
    assert out.__dict__.get("gpu_data", out).__dict__["_owner"] is b  # the view holds the tensor it views
    assert calls.found == 1
    assert calls.find(calls.key(("a", "b"), (a, b), 0.25)) is None  # other options: the full path
    assert calls.find(calls.key(("a", "b"), (a, TorchLike(np.zeros(8, np.float32))), 0.5)) is None  # other memory
    assert calls.key(("a", "b"), (a, HostTensor(np.zeros(8, np.float32))), 0.5) is None  # not torch: the full path
    assert calls.find(calls.key(("a",), (a,), [1])) is None  # an option that cannot be hashed: the full path
    with pytest.raises(TypeError, match="b is a torch tensor that requires grad"):
        calls.key(("a", "b"), (a, TorchLike(np.zeros(8, np.float32), requires_grad=True)))
    monkeypatch.setattr(launch, "ON_GPU", False)
    assert calls.key(("a", "b"), (a, b), 0.5) is None  # the simulator: every call takes the full path


def test_tensor_calls_relaunch_every_launch_of_a_call(views, monkeypatch):
    # a call of several launches (a zeroing kernel and a GEMM), each with the scalars it had
    from workbook import launch

    monkeypatch.setattr(launch, "ON_GPU", True)
    x = TorchLike(np.zeros(8, np.float32))
    view = require(x, "x")
    launched = []

    class Prepared:
        def __init__(self, name):
            self.name = name

        def set(self, index, value):
            launched.append((self.name, "set", index, value))

        def __call__(self):
            launched.append(self.name)

    calls = launch.TensorCalls()
    key = calls.key(("x",), (x,), "options")
    calls.keep(key, ([Prepared("zero"), (None,)], [Prepared("gemm"), (None, 3, 4.0)]), returns=(view,), owners=(0,))
    (out,) = calls.find(calls.key(("x",), (x,), "options"))(None, (x,))
    assert launched == ["zero", "gemm"]  # in their order, no scalar stored again
    assert out.__dict__.get("gpu_data", out).__dict__["_owner"] is x
    calls.keep(calls.key(("x",), (x,), "other"), ([Prepared("zero"), (None,)], None), returns=(view,), owners=(0,))
    assert calls.find(calls.key(("x",), (x,), "other")) is None  # a launch that was not cached: never kept


# ---------------------------------------------------------------------------------------------
# The wrappers on foreign arrays: the same answers, the views found again at the next call


def test_wrappers_take_foreign_arrays(views):
    rng = np.random.default_rng(0)
    n = 1000
    x = rng.standard_normal(n).astype(np.float32)
    y, mask = np.full(n, np.nan, np.float32), np.zeros(ch01.mask_words(n), np.uint32)
    tx, ty, tmask = HostTensor(x), HostTensor(y), HostTensor(mask)
    for _ in range(2):  # the second call finds every view
        got_y, got_mask = ch01.relu_mask_quads(tx, ty, tmask)
    assert views.misses == 3
    expected_y, expected_mask = ch01.relu_mask_reference(x)
    workbook.assert_close(y, expected_y, exact=True, name="y, in the caller's memory")
    workbook.assert_close(got_mask, expected_mask, exact=True, name="mask, the view returned")

    drop_y, drop_mask = HostTensor(np.zeros(n, np.float32)), HostTensor(np.zeros(-(-n // 32), np.uint32))
    got_y, got_mask = ch02.dropout_bitmask(tx, 0.25, 7, 3, drop_y, drop_mask)
    expected_y, expected_mask = ch02.dropout_reference(x, 0.25, 7, 3)
    workbook.assert_close(got_y, expected_y, exact=True, name="dropout y")
    workbook.assert_close(drop_mask.array, expected_mask, exact=True, name="dropout mask")

    logits = rng.standard_normal((5, 70)).astype(np.float32)
    probabilities = np.zeros_like(logits)
    ch06.softmax(HostTensor(logits), HostTensor(probabilities))
    workbook.assert_close(probabilities, ch06.softmax_reference(logits), name="softmax")

    copied = np.zeros(n, np.float32)
    ch00.copy_quads(tx, HostTensor(copied))
    np.testing.assert_array_equal(copied, x)


def test_a_wrapper_returns_a_view_that_holds_the_callers_output(views):
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    y = HostTensor(np.zeros(64, np.float32))
    owner = weakref.ref(y)
    got_y, _ = ch01.relu_mask_quads(HostTensor(x), y, HostTensor(np.zeros(2, np.uint32)))
    del y
    gc.collect()
    assert owner() is not None
    workbook.assert_close(got_y, np.maximum(x, 0), exact=True)


def test_gemm_bt_takes_foreign_arrays(views):
    from chapters.ch09_tensor_cores import kernels as ch09

    rng = np.random.default_rng(1)
    a, bt = (rng.standard_normal(shape).astype(np.float16) for shape in ((9, 16), (8, 16)))
    c = np.full((9, 8), 7.0, np.float32)
    ch09.gemm_bt(HostTensor(a), HostTensor(bt), HostTensor(c))
    workbook.assert_close(c, ch09.gemm_reference(a, bt.T, "f16").astype(np.float32), rtol=0,
                          atol=float(ch09.tolerance(a, bt.T, "f16").max()), name="gemm_bt")


@cuda.jit
def reverse_through_shared_kernel(x, out):
    staged = cuda.shared.array(0, np.float32)  # dynamic: as many floats as the launch gives bytes
    i = cuda.threadIdx.x
    if i < x.size:
        staged[i] = x[i]
    cuda.syncthreads()
    if i < x.size:
        out[i] = staged[x.size - 1 - i]


def test_the_launch_cache_passes_dynamic_shared_memory():
    # what the wgmma wrappers (chapter 09) now launch through: kernel[grid, block, stream, shared]
    from workbook.launch import LaunchCache

    cache, n = LaunchCache(size=2), 33
    x, out = cuda.to_device(np.arange(n, dtype=np.float32)), cuda.device_array(n, np.float32)
    for _ in range(2):  # prepared on the first call, found on the second (on a GPU)
        cache.launch(reverse_through_shared_kernel, 1, 64, (x, out), shared=4 * n)
        workbook.assert_close(out, np.arange(n, dtype=np.float32)[::-1], exact=True)


# ---------------------------------------------------------------------------------------------
# Real torch CUDA tensors: GPU and torch only

torch = bench.optional_torch()
needs_torch = pytest.mark.skipif(torch is None, reason="torch CUDA tensors need a GPU and torch (the simulator "
                                                       "has no torch device; the stand-ins above run there)")


@needs_torch
def test_torch_tensors_through_the_wrappers():
    n = 4099
    x = torch.randn(n, device="cuda")
    y, mask = torch.empty_like(x), torch.empty(ch01.mask_words(n), dtype=torch.uint32, device="cuda")
    ch01.relu_mask_quads(x, y, mask)  # three views made (or found: torch may reuse an earlier test's memory)
    misses = inputs.FOREIGN.misses
    for _ in range(2):
        got_y, got_mask = ch01.relu_mask_quads(x, y, mask)
    assert inputs.FOREIGN.misses == misses  # found again at the next calls
    expected_y, expected_mask = ch01.relu_mask_reference(x.cpu().numpy())
    workbook.assert_close(y, expected_y, exact=True, name="relu y (the torch tensor)")
    workbook.assert_close(got_mask, expected_mask, exact=True, name="relu mask (the view returned)")

    got_y, got_mask = ch02.dropout_bitmask(x, 0.1, 42, 5)  # no outputs: torch allocates them
    expected_y, expected_mask = ch02.dropout_reference(x.cpu().numpy(), 0.1, 42, 5)
    workbook.assert_close(got_y, expected_y, exact=True, name="dropout y")
    workbook.assert_close(got_mask, expected_mask, exact=True, name="dropout mask")

    logits = torch.randn(64, 1000, device="cuda")
    probabilities = torch.empty_like(logits)
    ch06.softmax(logits, probabilities)
    torch.testing.assert_close(probabilities, torch.softmax(logits, -1), rtol=1e-5, atol=1e-6)

    copied = torch.empty_like(x)
    ch00.copy_quads(x, copied)
    assert torch.equal(copied, x)


@needs_torch
def test_torch_tensors_take_the_short_path_when_met_again():
    n = 4099 * 4  # quads: relu_mask_quads' own kernel (16-byte aligned, as torch allocates)
    x = torch.randn(n, device="cuda")
    y, mask = torch.empty_like(x), torch.empty(ch01.mask_words(n), dtype=torch.uint32, device="cuda")
    ch01.relu_mask_quads(x, y, mask)  # the full path (or found: torch may reuse an earlier test's memory)
    found, misses = ch01._torch_calls.found, inputs.FOREIGN.misses
    x.copy_(torch.randn(n, device="cuda"))  # new data, the same memory
    got_y, got_mask = ch01.relu_mask_quads(x, y, mask)
    assert ch01._torch_calls.found == found + 1 and inputs.FOREIGN.misses == misses  # no check, no view
    expected_y, expected_mask = ch01.relu_mask_reference(x.cpu().numpy())
    workbook.assert_close(got_y, expected_y, exact=True, name="relu y, the view returned by the short path")
    workbook.assert_close(got_mask, expected_mask, exact=True, name="relu mask, the view returned by the short path")
    owner = weakref.ref(mask)
    del mask
    gc.collect()
    assert owner() is not None  # the returned view holds the caller's tensor
    with pytest.raises(TypeError, match="requires grad"):  # the short path checks what can change in place
        ch01.relu_mask_quads(x.requires_grad_(), y, owner())

    x = torch.randn(n, device="cuda")
    drop_y, drop_mask = torch.empty_like(x), torch.empty(-(-n // 32), dtype=torch.uint32, device="cuda")
    for offset in (3, 4, 4, 9):  # the offset's words stored into the kept launch when they change
        got_y, got_mask = ch02.dropout_bitmask(x, 0.25, 7, offset, drop_y, drop_mask)
        expected_y, expected_mask = ch02.dropout_reference(x.cpu().numpy(), 0.25, 7, offset)
        workbook.assert_close(got_y, expected_y, exact=True, name=f"dropout y, offset {offset}")
        workbook.assert_close(got_mask, expected_mask, exact=True, name=f"dropout mask, offset {offset}")
    assert ch02._torch_calls.found >= 3
    # numba's views of the same memory share the launch cache's entry: the offset it holds is right
    numba_x, numba_y, numba_mask = (cuda.as_cuda_array(t) for t in (x, drop_y, drop_mask))
    ch02.dropout_bitmask(numba_x, 0.25, 7, 3, numba_y, numba_mask)
    workbook.assert_close(drop_y, ch02.dropout_reference(x.cpu().numpy(), 0.25, 7, 3)[0], exact=True,
                          name="dropout y through numba's views after the short path")
    with pytest.raises(TypeError, match="p must be a number"):  # p=True is refused, though p=1 was met
        ch02.dropout_bitmask(x, 1, 7, 0, drop_y, drop_mask)
        ch02.dropout_bitmask(x, True, 7, 0, drop_y, drop_mask)


@needs_torch
def test_every_short_path_launches_what_the_full_path_did():
    from chapters.ch03_amp_unscale import kernels as ch03
    from chapters.ch04_implicit_gemm import implicit as ch04
    from chapters.ch05_directives import kernels as ch05

    def twice(module, call, fresh, expected):
        """call() on the tensors twice, new data (fresh()) before the second: found, and right."""
        call()
        found = module._torch_calls.found
        fresh()
        got = call()
        assert module._torch_calls.found == found + 1, module.__name__
        torch.testing.assert_close(torch.as_tensor(got if not isinstance(got, tuple) else got[0], device="cuda"),
                                   expected(), rtol=1e-5, atol=1e-5)

    x, y = torch.randn(4096, device="cuda"), torch.empty(4096, device="cuda")
    twice(ch00, lambda: ch00.copy_quads(x, y), lambda: x.copy_(torch.randn_like(x)), lambda: x)
    logits, probabilities = torch.randn(8, 1000, device="cuda"), torch.empty(8, 1000, device="cuda")
    twice(ch06, lambda: ch06.softmax(logits, probabilities), lambda: logits.copy_(torch.randn_like(logits)),
          lambda: torch.softmax(logits, -1))
    a, b, out = (torch.randint(0, 256, (64, 96), dtype=torch.uint8, device="cuda") for _ in range(3))
    twice(ch05, lambda: ch05.merge(a, b, out), lambda: a.copy_(torch.randint_like(a, 0, 256)),
          lambda: torch.as_tensor(ch05.merge_reference(a.cpu().numpy(), b.cpu().numpy()), device="cuda"))
    images, filters = torch.randn(2, 8, 9, 9, device="cuda"), torch.randn(16, 8, 3, 3, device="cuda")
    convolved = torch.empty(2, 16, 9, 9, device="cuda")
    twice(ch04, lambda: ch04.conv2d_implicit(images, filters, convolved, padding=1),
          lambda: images.copy_(torch.randn_like(images)),
          lambda: torch.nn.functional.conv2d(images.cpu(), filters.cpu(), padding=1).cuda())  # no TF32 there
    grads = [torch.randn(n, device="cuda") for n in (5, 4096, 33)]
    listed = ch03.GradientList(grads)
    found_inf, inv_scale = torch.zeros(1, device="cuda"), torch.full((1,), 0.5, device="cuda")
    originals = [g.clone() for g in grads]
    twice(ch03, lambda: ch03.unscale_fused(listed, found_inf, inv_scale),
          lambda: [g.copy_(o) for g, o in zip(grads, originals)], lambda: torch.zeros(1, device="cuda"))
    torch.testing.assert_close(grads[1], originals[1] * 0.5)


@needs_torch
def test_torch_memory_freed_and_reused_finds_the_same_view():
    n = 1 << 12
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    ch00.copy_quads(x, y)
    pointer, misses = y.data_ptr(), inputs.FOREIGN.misses
    del y
    y = torch.empty_like(x)  # torch's caching allocator hands the same block back
    if y.data_ptr() != pointer:
        pytest.skip("torch gave another block this time")
    ch00.copy_quads(x, y)
    assert inputs.FOREIGN.misses == misses
    assert torch.equal(x, y)


@needs_torch
def test_torch_views_hold_only_what_they_are_handed_out_with():
    t = torch.arange(64, dtype=torch.float32, device="cuda")
    owner = weakref.ref(t)
    view = require(t, "t")
    tail = view[8:]  # numba's slice of the view: its memory names the same owner
    del t, view
    gc.collect()
    assert owner() is not None
    np.testing.assert_array_equal(tail.copy_to_host(), np.arange(8, 64, dtype=np.float32))
    del tail
    gc.collect()
    assert owner() is None  # the cache's own view holds nothing


@needs_torch
def test_torch_tensors_that_cannot_be_taken():
    with pytest.raises(TypeError, match=r"requires grad.*detach"):
        require(torch.ones(4, device="cuda", requires_grad=True), "x")
    with pytest.raises(TypeError, match=r"torch tensor on cpu.*\.cuda\(\)"):
        require(torch.ones(4), "x")
    with pytest.raises(TypeError, match="bfloat16"):
        require(torch.ones(4, device="cuda", dtype=torch.bfloat16), "x")
    with pytest.raises(ValueError, match="C-contiguous"):
        require(torch.ones(4, 4, device="cuda").t(), "x")


@needs_torch
def test_torch_gemm_bt():
    from numba import cuda as real

    from chapters.ch09_tensor_cores import kernels as ch09

    if tuple(real.get_current_device().compute_capability) != (9, 0):
        pytest.skip("wgmma needs an H100 (compute capability 9.0)")
    a, bt = torch.randn(130, 136, device="cuda").half(), torch.randn(72, 136, device="cuda").half()
    c = torch.empty(130, 72, device="cuda")
    ch09.gemm_bt(a, bt, c)
    a16, bt16 = a.cpu().numpy(), bt.cpu().numpy()
    workbook.assert_close(c, ch09.gemm_reference(a16, bt16.T, "f16").astype(np.float32), rtol=0,
                          atol=float(ch09.tolerance(a16, bt16.T, "f16").max()), name="gemm_bt")


def test_a_torch_tensor_is_known_before_any_check_has_read_one():
    """TensorCalls asks before require() reads: the first call of a process on torch tensors is kept."""
    tensor = type("Tensor", (), {"__module__": "torch"})  # a type never met: torch's by its name
    parameter = type("Parameter", (tensor,), {"__module__": "torch.nn.parameter"})
    assert inputs.is_torch_tensor(parameter()) and inputs.is_torch_tensor(tensor())
    assert not inputs.is_torch_tensor(np.zeros(3)) and not inputs.is_torch_tensor(cuda.to_device(np.zeros(3)))
