"""The capstone's network, trained with nothing but the workbook's kernels.

    x (B, 1, 8, 8) -> conv 3x3 -> BN -> ReLU ------------------------------+ a1    chapter 04, 01
                      conv 3x3 -> BN -> ReLU -> conv 3x3 -> BN -> (+ a1) -> ReLU   chapter 01's fused BN+Add+ReLU
                   -> global average pool -> dropout -> linear -> softmax cross-entropy   02, 04, 06

Every convolution keeps 8x8 planes (padding 1) and `width` channels. The parameters, their
gradients and their momentum buffers are three flat device buffers, each layer's tensors views
of them, so that the optimizer is one launch. Also here: the same network in float64 NumPy (the
reference for the checks) and in torch (the twin it is raced against).
"""

import importlib.util
import math
from pathlib import Path

import numpy as np
from numba import cuda

from workbook import ON_GPU
from workbook.launch import StepGraph, cdiv
from workbook.timeline import span

from chapters.ch01_relu_mask import batchnorm as bn
from chapters.ch02_dropout import kernels as drop
from chapters.ch04_implicit_gemm.kernels import Tile, conv2d_implicit
from chapters.ch06_softmax import kernels as ce

from . import layers

CLASSES = 10
IMAGE = 8  # sklearn's digits are 8x8: three 3x3 convolutions see 7x7 of them, nearly the whole digit
ALIGN = 32  # each tensor of a flat buffer starts on 128 bytes: every 16-byte path stays open
HISTORY = 4096  # losses kept on the GPU, one per step, read back once per epoch
EPS, BN_MOMENTUM = 1e-5, 0.1

# Chapter 04's tiles are 128 x 128 (or 64 x 64) outputs; these layers have only `width` (32 or 64)
# output channels, so a 32-row tile wastes nothing: 8 x 32 threads of 4 x 4 outputs, wide loads.
CAPSTONE_TILE = (Tile(32, 128, 8, 4, 4, min_blocks=2, wide=True, prefetch=True) if ON_GPU
                 else Tile(8, 16, 4, 2, 2))


def parameter_shapes(width):
    """The network's parameters in their order in the flat buffer: {name: shape}."""
    return {"conv1": (width, 1, 3, 3), "bn1.gamma": (width,), "bn1.beta": (width,),
            "conv2": (width, width, 3, 3), "bn2.gamma": (width,), "bn2.beta": (width,),
            "conv3": (width, width, 3, 3), "bn3.gamma": (width,), "bn3.beta": (width,),
            "fc.wt": (width, CLASSES), "fc.b": (CLASSES,)}


def init_parameters(width, seed=0):
    """float32 host arrays, as torch initialises these layers: He-normal convolutions (fan-in, ReLU
    gain; torch's default is a uniform of the same scale family), BN gamma 1 and beta 0, and the
    linear layer uniform in +-1/sqrt(fan-in)."""
    rng = np.random.default_rng(seed)
    params = {}
    for name, shape in parameter_shapes(width).items():
        if name.startswith("conv"):
            fan_in = shape[1] * shape[2] * shape[3]
            params[name] = rng.normal(0.0, math.sqrt(2.0 / fan_in), shape)
        elif name.endswith("gamma"):
            params[name] = np.ones(shape)
        elif name.endswith("beta"):
            params[name] = np.zeros(shape)
        else:
            params[name] = rng.uniform(-1, 1, shape) / math.sqrt(width)
    return {name: value.astype(np.float32) for name, value in params.items()}


# ---------------------------------------------------------------------------------------------
# Data: scikit-learn's handwritten digits (1,797 images of 8x8, shipped with the package)


def load_digits(test_size=360, seed=0):
    """(train_x, train_y, test_x, test_y): float32 (n, 1, 8, 8) images scaled to mean ~0 and std ~1,
    int32 labels; a fixed, seeded split.

    The images are the file scikit-learn ships (datasets/data/digits.csv.gz: 64 pixels and the
    label per row), read where the installed package keeps it: what sklearn.datasets.load_digits
    returns, without importing scikit-learn and the SciPy it needs."""
    spec = importlib.util.find_spec("sklearn")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("the capstone's data comes with scikit-learn: pip install -e '.[capstone]'")
    path = Path(spec.submodule_search_locations[0]) / "datasets" / "data" / "digits.csv.gz"
    table = np.loadtxt(path, delimiter=",")  # 1,797 rows
    images = ((table[:, :64] / 16.0 - 0.3) / 0.4).reshape(-1, 1, IMAGE, IMAGE).astype(np.float32)  # pixels 0..16
    labels = table[:, 64].astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(images))
    test, train = order[:test_size], order[test_size:]
    return images[train], labels[train], images[test], labels[test]


def epoch_orders(n_train, epochs, seed=1):
    """One shuffled order of the training set per epoch, the same for the workbook and the twin."""
    rng = np.random.default_rng(seed)
    return [rng.permutation(n_train).astype(np.int32) for _ in range(epochs)]


# ---------------------------------------------------------------------------------------------
# The network on the GPU


class FlatBuffer:
    """One float32 device buffer holding every tensor of a layout, each a view of it."""

    def __init__(self, shapes, values=None):
        self.offsets, total = {}, 0
        for name, shape in shapes.items():
            self.offsets[name] = (total, shape)
            total += cdiv(math.prod(shape), ALIGN) * ALIGN
        host = np.zeros(total, np.float32)
        for name, value in (values or {}).items():
            start, shape = self.offsets[name]
            host[start:start + value.size] = value.reshape(-1)
        self.flat = cuda.to_device(host)
        self.views = {name: self.flat[start:start + math.prod(shape)].reshape(shape)
                      for name, (start, shape) in self.offsets.items()}

    def __getitem__(self, name):
        return self.views[name]

    def to_host(self):
        host = self.flat.copy_to_host()
        return {name: host[start:start + math.prod(shape)].reshape(shape).copy()
                for name, (start, shape) in self.offsets.items()}


class Network:
    """The capstone network's buffers and its training step, for one batch size.

        net = Network(init_parameters(32), batch=256)
        net.attach(train_x, train_y)       # the data set on the GPU, once
        net.set_order(order)               # each epoch: the shuffled order
        net.step()                         # one training step: the next batch of the order
        graph = net.graph()                # the same step captured: graph() replays it

    Everything a step touches is allocated here, so that a step allocates nothing and can be
    captured into a CUDA graph. The step number lives on the GPU (`counter`): the batch gather and
    the dropout read it, the step's last kernel advances it.
    """

    def __init__(self, params, batch, *, p_drop=0.1, seed=1234, lr=0.1, momentum=0.9, weight_decay=5e-4,
                 tile=CAPSTONE_TILE):
        width = params["conv2"].shape[0]
        shapes = parameter_shapes(width)
        if set(params) != set(shapes) or any(params[k].shape != s for k, s in shapes.items()):
            raise ValueError(f"params must be {shapes}")
        if not isinstance(batch, int) or batch < 1:
            raise ValueError(f"batch must be a positive int, not {batch!r}")
        self.width, self.batch, self.tile = width, batch, tile
        self.p_drop, self.seed = drop.check_p(p_drop), drop.check_u64(seed, "seed")
        self.lr, self.momentum, self.weight_decay = lr, momentum, weight_decay
        self.params = FlatBuffer(shapes, params)
        self.grads = FlatBuffer(shapes)
        self.velocity = FlatBuffer(shapes)
        self.running = {f"bn{i}.{what}": cuda.to_device(np.full(width, fill, np.float32))
                        for i in (1, 2, 3) for what, fill in (("mean", 0.0), ("var", 1.0))}
        b, w, hw = batch, width, (IMAGE, IMAGE)
        planes = (b, w, *hw)

        def zeros(shape, dtype=np.float32):
            return cuda.to_device(np.zeros(shape, dtype))

        self.x, self.targets = zeros((b, 1, *hw)), zeros(b, np.int32)
        self.z = {i: zeros(planes) for i in (1, 2, 3)}  # convolution outputs
        self.a = {i: zeros(planes) for i in (1, 2, 3)}  # after BN (+ identity) + ReLU
        self.mask = {i: zeros((b, w, bn.plane_words(*hw)), np.uint32) for i in (1, 2, 3)}
        self.saved = {i: zeros((2, w), np.float64) for i in (1, 2, 3)}
        self.pooled, self.dropped = zeros((b, w)), zeros((b, w))
        self.drop_mask = zeros(cdiv(b * w, 32), np.uint32)
        self.logits, self.losses, self.lse, self.loss = zeros((b, CLASSES)), zeros(b), zeros(b), zeros(1)
        self.d_logits, self.d_dropped, self.d_pooled = zeros((b, CLASSES)), zeros((b, w)), zeros((b, w))
        self.d_a = {i: zeros(planes) for i in (1, 2, 3)}
        self.d_z = {i: zeros(planes) for i in (1, 2, 3)}
        self.d_identity = zeros(planes)
        self.counter = zeros(1, np.uint64)  # the step number: batch and dropout offset
        self.history = cuda.to_device(np.full(HISTORY, np.nan, np.float32))
        self.data = None

    def reset(self, params):
        """Back to the start of a training: these weights, zero momentum, fresh running statistics,
        step 0 (the graph captured from this network replays on the same buffers)."""
        for name, value in params.items():
            self.params[name].copy_to_device(np.ascontiguousarray(value, np.float32))
        self.velocity.flat.copy_to_device(np.zeros(self.velocity.flat.shape, np.float32))
        for name, array in self.running.items():
            array.copy_to_device(np.full(self.width, 1.0 if name.endswith("var") else 0.0, np.float32))
        self.history.copy_to_device(np.full(HISTORY, np.nan, np.float32))
        self.set_step(0)

    # -- the data ------------------------------------------------------------------------------

    def attach(self, images, labels):
        """Put a training set on the GPU (once); steps then gather their batches from it."""
        images = np.ascontiguousarray(images, np.float32).reshape(len(images), -1)
        if images.shape[1] != IMAGE * IMAGE or len(labels) != len(images) or len(images) < self.batch:
            raise ValueError(f"need at least {self.batch} images of {IMAGE}x{IMAGE} and one label each")
        self.data = (cuda.to_device(images), cuda.to_device(np.asarray(labels, np.int32)),
                     cuda.to_device(np.arange(len(images), dtype=np.int32)))
        self.steps_per_epoch = len(images) // self.batch  # the last, partial batch is dropped

    def set_order(self, order, stream=0):
        """The next epoch's order of the training set (copied into the buffer the gather reads)."""
        order = np.asarray(order, np.int32)
        if order.shape != (len(self.data[0]),):
            raise ValueError(f"order must be a permutation of {len(self.data[0])} indices")
        self.data[2].copy_to_device(order, stream=stream)

    def set_step(self, step):
        """Where the step counter stands (the next batch is step % steps_per_epoch)."""
        self.counter.copy_to_device(np.array([step], np.uint64))

    def load_batch(self, x, targets):
        """Put one batch in place directly (the checks use it instead of gather)."""
        self.x.copy_to_device(np.ascontiguousarray(x, np.float32))
        self.targets.copy_to_device(np.ascontiguousarray(targets, np.int32))

    # -- the step -------------------------------------------------------------------------------

    def convolve(self, i, source, z, stream=0):
        """z = convolution i of source (both float32 NCHW). MixedNetwork's runs on tensor cores."""
        conv2d_implicit(source, self.params[f"conv{i}"], z, padding=1, tile=self.tile, stream=stream)

    def linear(self, x, logits, stream=0):
        """logits = the linear layer of x (float32 (n, width))."""
        p = self.params
        layers.linear_forward(x, p["fc.wt"], p["fc.b"], logits, tile=self.tile, stream=stream)

    def forward(self, stream=0):
        p = self.params
        source = self.x
        for i in (1, 2, 3):
            self.convolve(i, source, self.z[i], stream)
            bn.batchnorm_relu_forward(self.z[i], p[f"bn{i}.gamma"], p[f"bn{i}.beta"], self.running[f"bn{i}.mean"],
                                      self.running[f"bn{i}.var"], self.a[i], self.mask[i], self.saved[i],
                                      identity=self.a[1] if i == 3 else None, momentum=BN_MOMENTUM, eps=EPS,
                                      stream=stream)
            source = self.a[i]
        layers.global_avg_pool(self.a[3], self.pooled, stream=stream)
        drop.dropout_bitmask_counted(self.pooled.reshape(-1), self.p_drop, self.seed, self.counter,
                                     self.dropped.reshape(-1), self.drop_mask, stream=stream)
        self.linear(self.dropped, self.logits, stream)
        ce.cross_entropy(self.logits, self.targets, self.losses, self.lse, self.loss, check_targets=False,
                         stream=stream)

    def linear_backward(self, stream=0):
        """d_dropped and the linear layer's gradients, from d_logits."""
        p, g = self.params, self.grads
        layers.linear_backward(self.dropped, p["fc.wt"], self.d_logits, self.d_dropped, g["fc.wt"], g["fc.b"],
                               tile=self.tile, stream=stream)

    def convolve_backward(self, i, stream=0):
        """Convolution i's weight gradient and (but for the first) its data gradient, from d_z[i]."""
        p, g = self.params, self.grads
        source = self.x if i == 1 else self.a[i - 1]
        layers.conv2d_wgrad(source, self.d_z[i], g[f"conv{i}"], padding=1, stream=stream)
        if i > 1:  # the input needs no gradient
            layers.conv2d_dgrad(self.d_z[i], p[f"conv{i}"], self.d_a[i - 1], padding=1, tile=self.tile,
                                stream=stream)
        if i == 2:  # a1 fed both conv2 and the residual: its two gradients add up
            layers.add_into(self.d_a[1], self.d_identity, stream=stream)

    def backward(self, stream=0):
        p, g = self.params, self.grads
        ce.cross_entropy_backward(self.logits, self.targets, self.lse, self.d_logits, check_targets=False,
                                  stream=stream)
        self.linear_backward(stream)
        drop.dropout_backward_bitmask(self.d_dropped.reshape(-1), self.drop_mask, self.p_drop,
                                      self.d_pooled.reshape(-1), stream=stream)
        layers.global_avg_pool_backward(self.d_pooled, self.d_a[3], stream=stream)
        for i in (3, 2, 1):
            # block 3's BN+Add+ReLU also returns the gradient of its identity, a1: d_identity
            bn.batchnorm_relu_backward(self.d_a[i], self.mask[i], self.z[i], p[f"bn{i}.gamma"], self.saved[i],
                                       self.d_z[i], g[f"bn{i}.gamma"], g[f"bn{i}.beta"],
                                       d_identity=self.d_identity if i == 3 else None, stream=stream)
            self.convolve_backward(i, stream)

    def update(self, stream=0):
        layers.sgd_momentum(self.params.flat, self.grads.flat, self.velocity.flat, lr=self.lr,
                            momentum=self.momentum, weight_decay=self.weight_decay, stream=stream)
        layers.end_step(self.counter, self.loss, self.history, stream=stream)

    def step(self, stream=0):
        """One training step on the next batch of the attached data: 28 wrapper calls, 47 launches
        (on the GPU: the split-K zeroing launches depend on its size), no synchronisation."""
        if self.data is None:
            raise RuntimeError("no training set on the GPU: call attach(images, labels) first")
        with span("gather"):
            layers.gather_batch(*self.data, self.counter, self.steps_per_epoch,
                                self.x.reshape(self.batch, IMAGE * IMAGE), self.targets, stream=stream)
        with span("forward"):  # named ranges: NVTX where installed, and workbook.timeline's recordings
            self.forward(stream)
        with span("backward"):
            self.backward(stream)
        with span("update"):
            self.update(stream)

    def graph(self):
        """The step captured into a CUDA graph (chapter 07): one launch per step. In the simulator,
        the step's launches one by one."""
        return StepGraph(self.step)

    def warm_ups(self):
        """The wrapper calls of a step, each on its own, for workbook.warm_up to make side by side:
        a GPU then compiles their kernels at once, where a step, a chain of launches, compiles each
        kernel when it comes to it. They leave this network's values meaningless: warm up a network
        of the same shapes, not the one to be checked or trained."""
        p, g, a = self.params, self.grads, self.a
        calls = []
        if self.data is not None:
            calls.append(lambda: layers.gather_batch(*self.data, self.counter, self.steps_per_epoch,
                                                     self.x.reshape(self.batch, IMAGE * IMAGE), self.targets))
        for i in (1, 2, 3):  # as forward() and backward() call them
            calls += [lambda i=i: self.convolve(i, self.x if i == 1 else a[i - 1], self.z[i]),
                      lambda i=i: bn.batchnorm_relu_forward(
                          self.z[i], p[f"bn{i}.gamma"], p[f"bn{i}.beta"], self.running[f"bn{i}.mean"],
                          self.running[f"bn{i}.var"], a[i], self.mask[i], self.saved[i],
                          identity=a[1] if i == 3 else None, momentum=BN_MOMENTUM, eps=EPS),
                      lambda i=i: bn.batchnorm_relu_backward(
                          self.d_a[i], self.mask[i], self.z[i], p[f"bn{i}.gamma"], self.saved[i], self.d_z[i],
                          g[f"bn{i}.gamma"], g[f"bn{i}.beta"], d_identity=self.d_identity if i == 3 else None),
                      lambda i=i: self.convolve_backward(i)]
        return calls + [
            lambda: layers.global_avg_pool(a[3], self.pooled),
            lambda: drop.dropout_bitmask_counted(self.pooled.reshape(-1), self.p_drop, self.seed, self.counter,
                                                 self.dropped.reshape(-1), self.drop_mask),
            lambda: self.linear(self.dropped, self.logits),
            lambda: ce.cross_entropy(self.logits, self.targets, self.losses, self.lse, self.loss, check_targets=False),
            lambda: ce.cross_entropy_backward(self.logits, self.targets, self.lse, self.d_logits, check_targets=False),
            self.linear_backward,
            lambda: drop.dropout_backward_bitmask(self.d_dropped.reshape(-1), self.drop_mask, self.p_drop,
                                                  self.d_pooled.reshape(-1)),
            lambda: layers.global_avg_pool_backward(self.d_pooled, self.d_a[3]),
            self.update]

    def losses_so_far(self, steps):
        """The losses of steps 0 .. steps-1 (kept on the GPU by end_step_kernel)."""
        history = self.history.copy_to_host()
        return np.array([history[s % HISTORY] for s in range(max(0, steps - HISTORY), steps)])

    # -- evaluation -----------------------------------------------------------------------------

    def predict(self, images, batch=None):
        """Class scores for images (n, 1, 8, 8), BatchNorm on its running statistics, no dropout."""
        batch = batch or self.batch
        p, out = self.params, []
        for start in range(0, len(images), batch):
            chunk = np.ascontiguousarray(images[start:start + batch], np.float32)
            n = len(chunk)
            x = cuda.to_device(chunk)
            a = {}
            source = x
            for i in (1, 2, 3):
                z = layers.workspace(f"eval z{i}", (n, self.width, IMAGE, IMAGE))
                self.convolve(i, source, z)
                a[i] = layers.workspace(f"eval a{i}", z.shape)
                layers.batchnorm_eval_relu(z, p[f"bn{i}.gamma"], p[f"bn{i}.beta"], self.running[f"bn{i}.mean"],
                                           self.running[f"bn{i}.var"], a[i], identity=a[1] if i == 3 else None,
                                           eps=EPS)
                source = a[i]
            pooled = layers.global_avg_pool(a[3], layers.workspace("eval pooled", (n, self.width)))
            logits = layers.workspace("eval logits", (n, CLASSES))
            self.linear(pooled, logits)
            out.append(logits.copy_to_host())
        return np.concatenate(out)

    def accuracy(self, images, labels):
        return float((self.predict(images).argmax(axis=1) == labels).mean())


# ---------------------------------------------------------------------------------------------
# The same network in float64 NumPy: the reference of the checks


def _conv64(x, w):
    """float64 'same' 3x3 convolution (padding 1)."""
    padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # (N, C, H, W, 3, 3)
    return np.einsum("nchwrs,kcrs->nkhw", windows, w, optimize=True)


def _conv64_backward(x, w, dy):
    return layers.conv2d_backward_reference(x, w, dy, 1, 1, 1)


def _bn64(z, gamma, beta):
    mean, var = z.mean(axis=(0, 2, 3)), z.var(axis=(0, 2, 3))
    invstd = 1.0 / np.sqrt(var + EPS)
    xhat = (z - mean[:, None, None]) * invstd[:, None, None]
    return xhat * gamma[:, None, None] + beta[:, None, None], (xhat, invstd)


def _bn64_backward(dy, gamma, cache):
    xhat, invstd = cache
    count = dy.shape[0] * dy.shape[2] * dy.shape[3]
    dbeta, dgamma = dy.sum(axis=(0, 2, 3)), (dy * xhat).sum(axis=(0, 2, 3))
    dz = (gamma * invstd)[:, None, None] * (dy - dbeta[:, None, None] / count - xhat * dgamma[:, None, None] / count)
    return dz, dgamma, dbeta


def reference_loss_and_grads(params, x, targets, keep, p_drop, *, half_scale=None):
    """The loss and every parameter's gradient, in float64, for one batch. keep: bool (B, width),
    the dropout's keep mask (the workbook's Philox mask, so both networks drop the same values).

    half_scale: mixed.MixedNetwork's reference: every operand of a convolution or of the linear
    layer rounded to float16 where that network rounds it, the backward's after multiplying by
    the loss scale half_scale (and dividing again: a power of two, exact). What is left between the
    two is the order of the float32 sums."""
    if half_scale is None:
        def h(v, scale=1.0):
            return v
    else:
        def h(v, scale=1.0):
            return (v * scale).astype(np.float16).astype(np.float64) / scale
    S = half_scale or 1.0
    q = {name: value.astype(np.float64) for name, value in params.items()}
    x = x.astype(np.float64)
    z, a, caches = {}, {0: x}, {}
    for i in (1, 2, 3):
        z[i] = _conv64(h(a[i - 1]), h(q[f"conv{i}"]))
        normed, caches[i] = _bn64(z[i], q[f"bn{i}.gamma"], q[f"bn{i}.beta"])
        if i == 3:
            normed = normed + a[1]
        a[i] = np.maximum(normed, 0.0)
    pooled = a[3].mean(axis=(2, 3))
    scale = 1.0 / (1.0 - p_drop) if p_drop < 1 else 0.0
    dropped = np.where(keep, pooled * scale, 0.0)
    logits = h(dropped) @ h(q["fc.wt"]) + q["fc.b"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    batch = len(x)
    loss = -log_probs[np.arange(batch), targets].mean()

    grads = {}
    d_logits = np.exp(log_probs)
    d_logits[np.arange(batch), targets] -= 1.0
    d_logits /= batch
    grads["fc.wt"], grads["fc.b"] = h(dropped).T @ h(d_logits, S), d_logits.sum(axis=0)
    d_pooled = np.where(keep, (h(d_logits, S) @ h(q["fc.wt"]).T) * scale, 0.0)
    d_a3 = np.broadcast_to(d_pooled[:, :, None, None] / (IMAGE * IMAGE), a[3].shape)
    g3 = np.where(a[3] > 0, d_a3, 0.0)  # through the last ReLU; also the identity's gradient
    dz, grads["bn3.gamma"], grads["bn3.beta"] = _bn64_backward(g3, q["bn3.gamma"], caches[3])
    d_a2, grads["conv3"] = _conv64_backward(h(a[2]), h(q["conv3"]), h(dz, S))
    g2 = np.where(a[2] > 0, d_a2, 0.0)
    dz, grads["bn2.gamma"], grads["bn2.beta"] = _bn64_backward(g2, q["bn2.gamma"], caches[2])
    d_a1, grads["conv2"] = _conv64_backward(h(a[1]), h(q["conv2"]), h(dz, S))
    g1 = np.where(a[1] > 0, d_a1 + g3, 0.0)  # a1 fed conv2 and the residual: both gradients
    dz, grads["bn1.gamma"], grads["bn1.beta"] = _bn64_backward(g1, q["bn1.gamma"], caches[1])
    _, grads["conv1"] = _conv64_backward(h(x), h(q["conv1"]), h(dz, S))
    return loss, grads


# ---------------------------------------------------------------------------------------------
# The same network in torch: the twin it is raced against


def torch_twin(params, p_drop=0.1, device="cuda"):
    """A torch module with the same layers and the same initial weights."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    width = params["conv2"].shape[0]

    class Twin(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(1, width, 3, padding=1, bias=False)
            self.bn1 = nn.BatchNorm2d(width, eps=EPS, momentum=BN_MOMENTUM)
            self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width, eps=EPS, momentum=BN_MOMENTUM)
            self.conv3 = nn.Conv2d(width, width, 3, padding=1, bias=False)
            self.bn3 = nn.BatchNorm2d(width, eps=EPS, momentum=BN_MOMENTUM)
            self.drop = nn.Dropout(p_drop)
            self.fc = nn.Linear(width, CLASSES)

        def forward(self, x):
            a1 = F.relu(self.bn1(self.conv1(x)))
            a2 = F.relu(self.bn2(self.conv2(a1)))
            a3 = F.relu(self.bn3(self.conv3(a2)) + a1)
            return self.fc(self.drop(a3.mean(dim=(2, 3))))

    twin = Twin()
    with torch.no_grad():
        for name, value in params.items():
            layer, what = name.split(".") if "." in name else (name, "weight")
            target = getattr(twin, layer)
            if name == "fc.wt":
                target.weight.copy_(torch.from_numpy(value.T.copy()))
            elif name == "fc.b":
                target.bias.copy_(torch.from_numpy(value))
            else:
                getattr(target, {"gamma": "weight", "beta": "bias"}.get(what, what)).copy_(torch.from_numpy(value))
    return twin.to(device)
