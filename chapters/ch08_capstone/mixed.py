"""The capstone network in mixed precision: its convolutions and linear layer multiply float16 on
tensor cores (chapter 09), everything else stays float32, and the weights the optimizer updates
are the float32 masters. What a step adds to network.Network's:

    forward    the masters cast to float16 in one launch (forward and turned filters, the linear
               layer's weight and its transpose); each convolution's input cast to float16
               channels last, its float32 product written in NCHW (chapter 09's out_layout="nchw"),
               as chapter 01's BatchNorm reads it
    backward   d_logits multiplied by the loss scale (read on the GPU); each convolution's output
               gradient cast to float16 -- where a scaled gradient passes 65504 it becomes Inf --
               then the weight gradient (half.wgrad_half) and the data gradient (chapter 09's
               convolution on the turned filters) on tensor cores, into float32 gradients
    update     chapter 03's fused check-finite-and-unscale over the flat gradient buffer; the SGD
               kernel skips the step if it found an Inf or a NaN; the scale follows torch's
               GradScaler rule (halved on overflow, doubled after growth_interval clean steps),
               updated on the GPU by chapter 03's rule, so that a CUDA graph replays all of it

Nothing of the loss scaling leaves the GPU: a captured step replays it as it is.
"""

import numpy as np
from numba import cuda

from workbook import capability
from workbook.launch import LaunchCache, cdiv

from chapters.ch03_amp_unscale.kernels import DynamicLossScaler, GradientList, unscale_fused, update_scale
from chapters.ch09_tensor_cores import kernels as tc

from . import layers
from .half import cast_filters, cast_matrix, padded, scale_to_half, to_half, turn_filters, wgrad_half
from .layers import record_and_advance, workspace
from .network import CLASSES, HISTORY, IMAGE, Network

PIXELS = IMAGE * IMAGE
NEEDS = ("mma.sync.f16", "cp.async", "ldmatrix")  # chapter 09's FP16 convolution and half.wgrad_half: 8.0 and up
_launches = LaunchCache()


@cuda.jit
def end_mixed_step_kernel(counter, loss, history, scale, inv_scale, found_inf, good_steps, scales, skipped, growth,
                          backoff, growth_interval):
    """The last launch of a mixed step (one thread): the loss, the scale this step used and whether
    it was skipped kept per step; the next scale; the step counter advanced."""
    if cuda.grid(1) == 0:
        step = record_and_advance(counter, loss, history)
        at = step % np.uint64(scales.size)
        scales[at] = scale[0]
        skipped[at] = found_inf[0]
        update_scale(scale, inv_scale, found_inf, good_steps, growth, backoff, growth_interval)


@cuda.jit
def half_weights_kernel(w1, w2, w3, fc, w16_1, w16_2, w16_3, wt16_2, wt16_3, fc16, fc16_t):
    """Every float16 copy of the masters a step multiplies with, in one launch: the filters (KRSC),
    the turned filters of convolutions 2 and 3 (their data gradients), the linear weight and its
    transpose."""
    first, stride = cuda.grid(1), cuda.gridsize(1)
    cast_filters(w1, w16_1, first, stride)
    cast_filters(w2, w16_2, first, stride)
    cast_filters(w3, w16_3, first, stride)
    turn_filters(w2, wt16_2, first, stride)
    turn_filters(w3, wt16_3, first, stride)
    cast_matrix(fc, fc16, fc16_t, first, stride)


class MixedNetwork(Network):
    """Network with float16 tensor-core convolutions and linear layer, float32 masters and a dynamic
    loss scale. Used as Network is (attach, set_order, step, graph, predict); also:

        net.set_scale(2.0**30)     # the next step's loss scale (a planted overflow)
        net.scales_so_far(steps)   # (scale used, skipped?) of each step

    variant: chapter 09's convolution, "pipelined" (mma.sync, any GPU from compute capability 8.0)
    or "wgmma" (an H100)."""

    def __init__(self, params, batch, *, init_scale=2.0**16, growth_interval=100, variant="pipelined", **options):
        capability.require(*NEEDS, what="the mixed-precision network")
        super().__init__(params, batch, **options)
        if variant not in ("pipelined", "wgmma"):
            raise ValueError(f"variant must be 'pipelined' or 'wgmma', not {variant!r}")
        self.variant, self.init_scale = variant, float(init_scale)
        w, b = self.width, batch
        self.channels = {1: padded(1), 2: padded(w), 3: padded(w)}  # each convolution's input, padded

        def halves(shape):
            return cuda.to_device(np.zeros(shape, np.float16))

        self.w16 = {i: halves((w, 3, 3, self.channels[i])) for i in (1, 2, 3)}  # KRSC, forward
        self.wt16 = {i: halves((w, 3, 3, padded(w))) for i in (2, 3)}  # (C, R, S, K) turned: data gradient
        self.fc16, self.fc16_t = halves((w, 1, CLASSES)), halves((1, CLASSES, w))  # wt and wt^T
        self.d_z16 = halves((b, IMAGE, IMAGE, padded(w)))  # a convolution's output gradient, scaled
        self.d_logits16, self.dropped16_t = halves((b, 1, CLASSES)), halves((1, w, b))
        self.scaler = DynamicLossScaler(init_scale, growth_interval=growth_interval, max_steps=1)
        self.gradient_list = GradientList([self.grads.flat])  # one tensor: the whole flat buffer
        self.scales = cuda.to_device(np.full(HISTORY, np.nan, np.float32))
        self.skipped = cuda.to_device(np.zeros(HISTORY, np.float32))

    def reset(self, params):
        super().reset(params)
        self.set_scale(self.init_scale)
        s = self.scaler
        s.good_steps.copy_to_device(np.zeros(1, np.int32))
        s.found_inf.copy_to_device(np.zeros(1, np.float32))
        self.scales.copy_to_device(np.full(HISTORY, np.nan, np.float32))
        self.skipped.copy_to_device(np.zeros(HISTORY, np.float32))

    def set_scale(self, value):
        """The loss scale of the next step (the rule takes it from there)."""
        self.scaler.scale.copy_to_device(np.array([value], np.float32))
        self.scaler.inv_scale.copy_to_device(np.array([1.0 / value], np.float32))

    def scales_so_far(self, steps):
        """(scale, skipped) of steps 0 .. steps-1: the loss scale each used, and whether its
        gradients held an Inf or a NaN (its update was skipped)."""
        scales, skipped = self.scales.copy_to_host(), self.skipped.copy_to_host()
        at = [s % HISTORY for s in range(max(0, steps - HISTORY), steps)]
        return scales[at], skipped[at] != 0

    # -- float16 operands ------------------------------------------------------------------------

    def half_weights(self, stream=0):
        """The float32 masters, cast for this step's multiplies (one launch)."""
        p, w = self.params, self.width
        # a thread per element of the largest array: each array's grid-stride loop is one trip
        _launches.launch(half_weights_kernel, cdiv(self.w16[2].size, layers.THREADS), layers.THREADS,
                         (p["conv1"], p["conv2"], p["conv3"], p["fc.wt"], self.w16[1], self.w16[2], self.w16[3],
                          self.wt16[2], self.wt16[3], self.fc16.reshape(w, CLASSES), self.fc16_t.reshape(CLASSES, w)),
                         stream=stream)

    def half_input(self, i, n):
        """Convolution i's float16 input for n images (kept: the weight gradient reads it again)."""
        return workspace(f"mixed conv{i} input", (n, IMAGE, IMAGE, self.channels[i]), np.float16)

    def convolve(self, i, source, z, stream=0):
        n = source.shape[0]
        x16 = self.half_input(i, n)
        to_half(source.reshape(n, -1, PIXELS), x16.reshape(n, PIXELS, -1), stream=stream)
        tc.conv2d(x16, self.w16[i], z, padding=1, variant=self.variant, out_layout="nchw", stream=stream)

    def linear(self, x, logits, stream=0):
        n, w = x.shape
        x16 = workspace("mixed fc input", (n, 1, w), np.float16)
        to_half(x.reshape(n, w, 1), x16, stream=stream)
        tc.gemm(x16.reshape(n, w), self.fc16.reshape(w, CLASSES), logits, variant="naive", stream=stream)
        layers.add_bias(logits, self.params["fc.b"], stream=stream)

    # -- the step --------------------------------------------------------------------------------

    def forward(self, stream=0):
        self.half_weights(stream)
        super().forward(stream)

    def backward(self, stream=0):
        # the weight gradients are added into by split-K blocks: the whole buffer zeroed, one launch
        layers.zero(self.grads.flat, stream=stream)
        super().backward(stream)

    def linear_backward(self, stream=0):
        """Scale the loss's gradient first: everything after it is scaled, the float16 casts included."""
        b, w, g = self.batch, self.width, self.grads
        scale_to_half(self.d_logits, self.scaler.scale, self.d_logits16, stream=stream)
        to_half(self.dropped.reshape(1, b, w), self.dropped16_t, stream=stream)
        d16 = self.d_logits16.reshape(b, CLASSES)
        tc.gemm(d16, self.fc16_t.reshape(CLASSES, w), self.d_dropped, variant="naive", stream=stream)
        tc.gemm(self.dropped16_t.reshape(w, b), d16, g["fc.wt"], variant="naive", stream=stream)
        layers.column_sum(self.d_logits, g["fc.b"], stream=stream)

    def convolve_backward(self, i, stream=0):
        b, w = self.batch, self.width
        to_half(self.d_z[i].reshape(b, w, PIXELS), self.d_z16.reshape(b, PIXELS, -1), stream=stream)
        wgrad_half(self.half_input(i, b), self.d_z16, self.grads[f"conv{i}"], padding=1, stream=stream)
        if i > 1:  # the data gradient: chapter 09's convolution of d_z with the turned filters
            tc.conv2d(self.d_z16, self.wt16[i], self.d_a[i - 1], padding=1, variant=self.variant, out_layout="nchw",
                      stream=stream)
        if i == 2:  # a1 fed both conv2 and the residual: its two gradients add up
            layers.add_into(self.d_a[1], self.d_identity, stream=stream)

    def unscale(self, stream=0):
        """Chapter 03's fused kernel: every gradient times 1/scale, found_inf set by any Inf or NaN."""
        s = self.scaler
        unscale_fused(self.gradient_list, s.found_inf, s.inv_scale, stream=stream)

    def update(self, stream=0):
        s = self.scaler
        self.unscale(stream)
        layers.sgd_momentum(self.params.flat, self.grads.flat, self.velocity.flat, lr=self.lr, momentum=self.momentum,
                            weight_decay=self.weight_decay, skip_if=s.found_inf, stream=stream)
        _launches.launch(end_mixed_step_kernel, 1, 32,
                         (self.counter, self.loss, self.history, s.scale, s.inv_scale, s.found_inf, s.good_steps,
                          self.scales, self.skipped, s.growth, s.backoff, s.growth_interval), stream=stream)

    def predict(self, images, batch=None):
        self.half_weights()
        return super().predict(images, batch)

    def warm_ups(self):
        """Network's, with the calls a mixed step adds: the masters' casts, the gradients zeroed."""
        return [self.half_weights, lambda: layers.zero(self.grads.flat), *super().warm_ups()]
