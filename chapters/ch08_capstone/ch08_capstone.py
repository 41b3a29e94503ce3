# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Chapter 08 — Capstone: training a network with nothing but the workbook's kernels
#
# Each chapter optimized one layer of a training step on its own. Here they meet: a small
# ResNet-style network learns to read handwritten digits, and every forward and backward pass, the
# loss and the optimizer are numba kernels of this workbook:
#
# | layer | forward | backward | from |
# |---|---|---|---|
# | conv 3x3 (x3) | implicit GEMM | data gradient: the same kernel, filters flipped; weight gradient: a new implicit GEMM | chapter 04, this chapter |
# | BatchNorm + ReLU, 1-bit mask | fused | fused | chapter 01 |
# | BatchNorm + Add + ReLU | fused | fused, with the identity's gradient | chapter 01 |
# | global average pool | a warp per plane | elementwise | this chapter |
# | dropout | Philox bitmask, offset read from the GPU | from the mask | chapter 02 |
# | linear | chapter 04's GEMM + bias | two GEMMs, two transposes, a column sum | chapter 04, this chapter |
# | softmax cross-entropy | fused | fused | chapter 06 |
# | SGD with momentum | — | one launch over a flat buffer of every parameter | this chapter (chapter 03's idea) |
#
# and the step is replayed as one CUDA graph (chapter 07). In this chapter you will learn
# - how a convolution's two gradients are GEMMs too, and how they map onto the forward's tile;
# - how to check a whole training step: every gradient against a float64 NumPy network, which is
#   itself checked by finite differences;
# - what a step costs end to end, GPU and host, against the same network in torch.
#
# Without a GPU the notebook checks and trains a tiny network for one step, and shows the full
# training from the reference GPU's stored run. The data is scikit-learn's digits
# (`pip install -e ".[capstone]"`): 1,797 images of 8x8 pixels.

# %%
# %load_ext autoreload
# %autoreload 2
import numpy as np

import workbook
from workbook import bench, capability, cuda, host, timeline

from chapters.ch04_implicit_gemm import kernels as conv
from chapters.ch08_capstone import gradcheck, training
from chapters.ch08_capstone import layers as L
from chapters.ch08_capstone import network as nw

print(f"running on: {workbook.MODE}")
chapter = workbook.Chapter("ch08", "Capstone: a network trained with the workbook's kernels")
rng = np.random.default_rng(0)
torch = bench.optional_torch()
if torch is not None:  # float32 means float32 in torch too: no TF32 in its convolutions or GEMMs
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False

BATCH = workbook.size(gpu=256, sim=2)
WIDTH = workbook.size(gpu=64, sim=2)
EPOCHS = workbook.size(gpu=40, sim=1)

# %% [markdown]
# ## The data
#
# 1,437 training images and 360 held out, split with a fixed seed; pixels scaled to mean ~0 and
# standard deviation ~1. Each epoch takes the training set in a new shuffled order, 256 at a time;
# the last 157 images of an order wait for the next epoch.

# %%
train_x, train_y, test_x, test_y = nw.load_digits()
print(f"train {train_x.shape}, test {test_x.shape}; classes {np.bincount(train_y)}")
if not workbook.ON_GPU:  # the simulator trains on a sliver of the data: one batch, one step
    train_x, train_y = train_x[:BATCH], train_y[:BATCH]
    test_x, test_y = test_x[:4], test_y[:4]

# %% [markdown]
# ## The convolution's data gradient is a convolution
#
# For stride 1, the gradient of `out = conv(x, w)` with respect to x is a convolution of `dy`
# with the filters transposed (`C` and `K` swapped) and turned by 180 degrees:
#
#     dx[n, c, h, w] = sum over k, r, s of dy[n, k, h + ph - r, w + pw - s] * w[k, c, r, s]
#                    = conv(dy, wt, padding = R - 1 - ph)     wt[c, k, r, s] = w[k, c, R-1-r, S-1-s]
#
# so chapter 04's implicit GEMM runs it unchanged, with M = C rows, N·H·W columns and a depth of
# K·R·S: only a 36 KB filter transform is new. This is how CUTLASS's unit-stride "dgrad" works;
# with a stride, dy has holes where the forward skipped positions, and CUTLASS splits the work by
# the stride's phases (not done here: `conv2d_dgrad` rejects a stride).

# %%
workbook.show(L.conv2d_dgrad)

# %% [markdown]
# ## The weight gradient is a GEMM over another depth
#
#     dw[k, (c, r, s)] = sum over (n, p, q) of dy[n, k, p, q] * X[(c, r, s), (n, p, q)]
#
# The same X as the forward's (the im2col matrix, never built), but now it is the *depth* that
# runs over N·P·Q positions (16,384 at batch 256), into a small K x 9·C output: a few tiles with a
# very long depth. The kernel splits that depth into hundreds of slices, one per block, and the blocks add
# their partial tiles into dw with atomics (split-K, as chapter 04 can; there stream-K won). Each
# thread owns one depth position per step, decodes its (n, p, q) once, and loads its A and B values
# down that position — consecutive threads, consecutive q: every load coalesced.

# %%
workbook.show(L._make_wgrad_kernel)

# %%
g = conv.conv_geometry((BATCH, WIDTH, 8, 8), (WIDTH, WIDTH, 3, 3), 1, 1, 1)
x_c = rng.standard_normal((g.N, g.C, g.H, g.W), dtype=np.float32)
w_c = (rng.standard_normal((g.K, g.C, 3, 3)) * 0.1).astype(np.float32)
dy_c = rng.standard_normal(g.out_shape, dtype=np.float32)
d_x, d_w, d_dy = cuda.to_device(x_c), cuda.to_device(w_c), cuda.to_device(dy_c)
dx_out, dw_out = cuda.device_array_like(d_x), cuda.device_array_like(d_w)
run_dgrad = lambda: L.conv2d_dgrad(d_dy, d_w, dx_out, padding=1, tile=nw.CAPSTONE_TILE)  # noqa: E731
run_wgrad = lambda: L.conv2d_wgrad(d_x, d_dy, dw_out, padding=1)  # noqa: E731
# both gradients' kernels and the forward's compile side by side while the references are computed
warming = host.in_background(bench.warm_up, [run_dgrad, run_wgrad, lambda: conv.conv2d_implicit(
    d_x, d_w, cuda.device_array(g.out_shape, np.float32), padding=1, tile=nw.CAPSTONE_TILE)],
    keep=[run_dgrad, run_wgrad])
dx_ref, dw_ref = L.conv2d_backward_reference(x_c, w_c, dy_c, 1, 1, 1)
warming.result()
rtol, atol = conv.tolerance(g.gemm_depth)
flops = 2.0 * g.K * g.gemm_depth * g.gemm_columns  # one multiply-add per (output, c, r, s), as the forward
dgrad_torch, wgrad_torch = {}, {}
if torch is not None:
    t_x, t_w, t_dy = (bench.torch_view(a) for a in (d_x, d_w, d_dy))
    dgrad_torch["torch conv2d_input (cuDNN)"] = lambda: torch.nn.grad.conv2d_input(t_x.shape, t_w, t_dy, padding=1)
    wgrad_torch["torch conv2d_weight (cuDNN)"] = lambda: torch.nn.grad.conv2d_weight(t_x, t_w.shape, t_dy, padding=1)
chapter.compare("conv dgrad", {"flipped filters + implicit GEMM": run_dgrad}, reference=dx_ref.astype(np.float32),
                baselines=dgrad_torch, flops=flops, size=f"N={g.N} C=K={g.K} 8x8 3x3",
                check=lambda out, ref, name: workbook.assert_close(out, ref, rtol=rtol, atol=atol, name=name))
chapter.compare("conv wgrad", {"split-K implicit GEMM": run_wgrad}, reference=dw_ref.astype(np.float32),
                baselines=wgrad_torch, flops=flops,
                size=f"N={g.N} C=K={g.K} 8x8 3x3, {L.wgrad_slices(g)} depth slices",
                check=lambda out, ref, name: workbook.assert_close(out, ref, rtol=1e-4,
                                                                   atol=2e-6 * g.N * g.P * g.Q + 1e-5, name=name))

# %% [markdown]
# The dot-product test, which needs no reference at all: for any x and dy,
# `<dy, conv(x, w)> = <dgrad(dy), x>` and `<dy, conv(x, w)> = <wgrad(x, dy), w>` — a gradient is
# the forward's adjoint. In float32 both sides agree to ~1e-6 of their size.

# %%
out_c = cuda.device_array(g.out_shape, np.float32)
conv.conv2d_implicit(d_x, d_w, out_c, padding=1, tile=nw.CAPSTONE_TILE)
L.conv2d_dgrad(d_dy, d_w, dx_out, padding=1, tile=nw.CAPSTONE_TILE)
L.conv2d_wgrad(d_x, d_dy, dw_out, padding=1)
forward_side = float(np.vdot(dy_c.astype(np.float64), out_c.copy_to_host()))
for name, gradient, against in (("dgrad", dx_out, x_c), ("wgrad", dw_out, w_c)):
    other = float(np.vdot(gradient.copy_to_host().astype(np.float64), against))
    print(f"<dy, conv(x, w)> = {forward_side:.6g}, <{name}, {'x' if name == 'dgrad' else 'w'}> = {other:.6g}")
    assert abs(forward_side - other) <= 1e-5 * np.sqrt(g.N * g.P * g.Q * g.K) * np.abs(dy_c).max() * 10 + 1e-4 * abs(forward_side)

# %% [markdown]
# ## The small layers: pooling, linear, the optimizer
#
# Global average pooling is a warp per (n, c) plane; the linear layer runs on chapter 04's GEMM,
# which multiplies row-major matrices, so its backward transposes x and the weight first (the
# classic shared-memory transpose, a 33-word pitch so that a column of the tile hits 32 banks);
# the optimizer is torch's SGD with momentum, one launch over every parameter at once because
# they all live in one flat buffer (chapter 03 fused hundreds of launches the same way).

# %%
workbook.show(L.transpose_kernel)
workbook.show(L.sgd_momentum_kernel)

# %% [markdown]
# ## One whole step, checked
#
# The reference is the same network written in float64 NumPy (`reference_loss_and_grads`), fed
# the workbook's dropout mask (chapter 02's Philox mapping reproduces it exactly on the host). It
# is checked first by central finite differences, then the workbook's gradients are checked
# against it: all of them, parameter by parameter, to a relative error (in norm) below 1e-4.

# %%
check_batch, check_width, p_check = workbook.size(gpu=8, sim=3), workbook.size(gpu=8, sim=2), 0.25
check_params = nw.init_parameters(check_width, seed=3)
x_small = rng.standard_normal((check_batch, 1, 8, 8), dtype=np.float32)
t_small = rng.integers(0, nw.CLASSES, check_batch).astype(np.int32)
# a GPU compiles the step's kernels side by side first, on a network of the same shapes
workbook.warm_up(nw.Network(check_params, check_batch, p_drop=p_check).warm_ups())
small = nw.Network(check_params, check_batch, p_drop=p_check, seed=99)
small.set_step(7)  # the dropout offset: counter[0]
small.load_batch(x_small, t_small)
small.forward()
small.backward()
fd_worst = gradcheck.finite_differences(check_params, x_small, t_small, p_check, seed=99, step=7)
print(f"float64 reference vs finite differences: worst relative error {fd_worst:.1e}")
assert fd_worst < 1e-4
loss_got, loss_ref, worst = gradcheck.step_errors(small, check_params, x_small, t_small, p_check, seed=99, step=7)
print(f"loss: workbook {loss_got:.7f}, float64 reference {loss_ref:.7f}")
print("relative error of each gradient:", {k: f"{v:.1e}" for k, v in worst.items()})
assert abs(loss_got - loss_ref) < 1e-5 * max(1.0, abs(loss_ref)) and max(worst.values()) < 1e-4, worst

# %% [markdown]
# ## Training
#
# `Network` allocates every buffer once; `net.step()` gathers the next batch (its number read from
# `counter` on the GPU), runs the forward and backward passes and the optimizer, and advances the
# counter: 28 wrapper calls, 47 launches, no synchronisation. `net.graph()` captures that step into
# a CUDA graph, replayed with one `cuGraphLaunch` a step. The dropout draws new numbers at every
# replay because its Philox offset is `counter[0]`, read on the GPU (a graph replays the arguments
# it captured). The torch twin has the same layers, initial weights and batches in the same order.

# %%
workbook.show(nw.Network.step)

# %%
initial = nw.init_parameters(WIDTH, seed=0)
net = nw.Network(initial, BATCH)
net.attach(train_x, train_y)
graph = net.graph()  # captures (on the GPU: after one warm-up step) ...
print("step:", graph.how)
net.reset(initial)  # ... so start the training again from the initial weights
orders = nw.epoch_orders(len(train_x), EPOCHS)
twin = None if torch is None else training.TorchTwin(torch, nw.torch_twin(initial, p_drop=net.p_drop), net,
                                                     train_x, train_y, test_x)
history = training.train(net, graph, orders, test_x, test_y, twin)
chapter.record("training", {key: values for key, values in history.items() if values})
chapter.savefig(training.plot_training(history), "training")
chapter.bar("test accuracy of the workbook's network", history["workbook accuracy"][-1], at_least=0.97)
if history["torch accuracy"]:  # one epoch's accuracy moves by a few held-out digits from run to run: a mean
    last = min(10, len(history["torch accuracy"]))
    chapter.bar(f"test accuracy, mean of the last {last} epochs: workbook - torch twin (points)",
                100 * abs(np.mean(history["workbook accuracy"][-last:]) - np.mean(history["torch accuracy"][-last:])),
                at_most=1.0)

# %% [markdown]
# ## What a step costs
#
# The workbook's wrappers called one by one (chapter 07's plain path), the same step replayed as one
# CUDA graph, and torch eager. **median ms** is the GPU's time for a step, **host us/call** what
# issuing it costs the CPU; the wall time a step of a loop, what a training run pays, is about the
# larger of the two.

# %%
step_variants = {"workbook, plain launches": net.step, "workbook, one CUDA graph": graph}
step_baselines = {"torch eager": twin.step} if twin is not None else {}
steps = chapter.compare("training step", step_variants, baselines=step_baselines,
                        size=f"batch {BATCH}, width {WIDTH}, 8x8", repeats=30)
if workbook.ON_GPU:
    wall = {name: bench.loop_us(function, calls=100) for name, function in {**step_variants, **step_baselines}.items()}
    chapter.record("wall us per step", wall)
    print("wall time per step, host included (a loop of 100 steps):", {k: f"{us:.0f} us" for k, us in wall.items()})
    if "torch eager" in wall:
        chapter.bar("training step wall time: workbook graph / torch eager", wall["workbook, one CUDA graph"]
                    / wall["torch eager"], at_most=1.0)
else:
    chapter.record("wall us per step", {})

# %% [markdown]
# ## Where the GPU time goes
#
# The step's three parts timed on their own (GPU time; the buffers hold the last step's values, so
# each part computes what it would in a step).

# %%
parts = chapter.compare("training step, by part", {"forward (gather not included)": net.forward,
                                                    "backward": net.backward, "optimizer + counter": net.update},
                        size=f"batch {BATCH}, width {WIDTH}, 8x8", repeats=30)

# %% [markdown]
# ## A step on a timeline
#
# `net.step` names each of its phases (`workbook.timeline.span`: gather, forward, backward,
# update; NVTX ranges too with the `nvtx` package). Below, one step call by call and one graph
# replay, recorded as chapter 10 records its LSTM: a row for the ranges, one for the host's launch
# calls, one per GPU stream. Compare how long the step lasts with how long the GPU row is busy:
# where the GPU row has gaps, it waits for the host. Without a GPU only the ranges are recorded.

# %%
step_timelines = {"one by one": timeline.record(net.step), "one CUDA graph": timeline.record(graph)}
for name, events in step_timelines.items():
    rows, end = timeline.summary(events)
    print(f"{name}: {end:.0f} us from first to last event; " + ", ".join(
        f"{row} busy {busy:.0f} us ({count} events)" for row, (busy, count) in rows.items()))
chapter.savefig(timeline.figure(step_timelines, f"training step, batch {BATCH}, width {WIDTH}"), "timeline")

# %% [markdown]
# ## Mixed precision: float16 on tensor cores, float32 masters, a loss scale
#
# `mixed.MixedNetwork` is the same network, trained the way torch's AMP trains it: the
# convolutions and the linear layer multiply float16 on tensor cores (chapter 09's kernels) with
# float32 sums, and everything else (BatchNorm, pooling, dropout, the loss, the optimizer) stays
# float32. What it adds to a step:
#
# | where | what | kernel |
# |---|---|---|
# | forward | the float32 master weights cast to float16: KRSC filters, turned ones for the data gradients, the linear weight and its transpose, in one launch | `mixed.half_weights_kernel` |
# | forward | each convolution's input cast to float16, channels last, padded to 8 channels (16 bytes) | `half.to_half` |
# | forward, backward | the convolutions on tensor cores, output written straight to NCHW for chapter 01's BatchNorm | chapter 09's `conv2d(out_layout="nchw")` |
# | backward | the loss gradient times the loss scale (a device scalar), and its float16 copy | `half.scale_to_half` |
# | backward | the weight gradient on tensor cores, split over N·P·Q, atomics into float32 | `half.wgrad_half` |
# | update | every gradient times 1/scale, found_inf set by any Inf or NaN | chapter 03's fused kernel |
# | update | SGD skipped if found_inf; scale halved on overflow, doubled after 100 clean steps | `sgd_momentum(skip_if=)`, chapter 03's rule |
#
# Why scale at all: a gradient below float16's smallest subnormal (6e-8) becomes 0 when cast, so
# the loss's gradient is multiplied by 2^16 first and the product divided out in float32. Too large
# a scale overflows instead: a cast past 65504 is Inf, the unscale finds it, and the step is skipped.
# All of it stays on the GPU, so the step is captured into one CUDA graph as before.
#
# The weight gradient is the new tensor-core kernel: dw = dy^T X, its depth the N·P·Q positions.
# Both operands are channels last, rows of positions in shared memory; the mma wants pairs along
# the depth, down those columns, which ldmatrix's `.trans` hands out for A and B alike. Its loop is
# chapter 09's `make_mainloop`; the kernel passes its copies (`H.issue`), fragments and multiply.

# %%
from chapters.ch08_capstone import half as H  # noqa: E402
from chapters.ch08_capstone import mixed  # noqa: E402

workbook.show(H.wgrad_half_kernel)
HAS_MMA = capability.check(*mixed.NEEDS, what="mixed precision", instead="the mixed-precision cells leave it out")

# %% [markdown]
# One mixed step against the float64 reference, told where the mixed network rounds to float16
# (`half_scale`: the operands of each convolution and of the linear layer, the backward's times the
# loss scale), so that only the order of the float32 sums is left between them; against the plain
# reference a pre-activation within a float16 rounding of 0 could flip a ReLU. In the simulator this
# check is `tests/test_ch08_mixed.py`'s, and the planted overflow runs on 2 images.

# %%
batch16 = workbook.size(gpu=check_batch, sim=2)
if HAS_MMA:
    workbook.warm_up(mixed.MixedNetwork(check_params, batch16, p_drop=p_check).warm_ups())  # as above
    small16 = mixed.MixedNetwork(check_params, batch16, p_drop=p_check, seed=99)
    small16.set_step(7)
    small16.load_batch(x_small[:batch16], t_small[:batch16])
    small16.forward()
if HAS_MMA and workbook.ON_GPU:
    small16.backward()
    small16.unscale()
    _, _, worst16 = gradcheck.step_errors(small16, check_params, x_small[:batch16], t_small[:batch16], p_check,
                                          seed=99, step=7, half_scale=small16.init_scale)
    print("mixed precision, relative error of each gradient:", {k: f"{v:.1e}" for k, v in worst16.items()})
    assert max(worst16.values()) < 1e-3, worst16

# %% [markdown]
# **A planted overflow.** The same step's backward with a loss scale of 2^60: every float16
# gradient overflows, chapter 03's kernel finds the Infs, the SGD kernel leaves every weight as it
# was, and the scale is halved for the next step.

# %%
if HAS_MMA:
    before16 = small16.params.to_host()
    small16.set_scale(2.0**60)
    small16.backward()  # the forward's buffers are this batch's still
    small16.update()
    scales16, skipped16 = small16.scales_so_far(8)
    unchanged = all(np.array_equal(small16.params.to_host()[k], v) for k, v in before16.items())
    print(f"step 7: scale {scales16[7]:.3g}, skipped {bool(skipped16[7])}, weights unchanged {unchanged}; "
          f"next scale {float(small16.scaler.scale.copy_to_host()[0]):.3g}")
    assert skipped16[7] and unchanged

# %% [markdown]
# **Training in mixed precision**, beside the float32 run above: the same initial weights, batches
# and dropout masks; torch's AMP twin (autocast, `GradScaler` with the same rule) beside it. On a
# Hopper GPU the convolutions run on wgmma. Then a loss scale of 2^40 is planted and 30 more steps
# run: the right panel marks every skipped step. Without a GPU this is the stored run's.

# %%
VARIANT = "wgmma" if workbook.ON_GPU and capability.supports("wgmma") else "pipelined"
if workbook.ON_GPU and HAS_MMA:
    net16 = mixed.MixedNetwork(initial, BATCH, variant=VARIANT)
    net16.attach(train_x, train_y)
    graph16 = net16.graph()
    net16.reset(initial)
    amp = None if torch is None else training.TorchTwin(torch, nw.torch_twin(initial, p_drop=net16.p_drop), net16,
                                                        train_x, train_y, test_x, amp=True)
    mixed_history = training.train(net16, graph16, orders, test_x, test_y, amp, name="mixed",
                                   twin_name="torch AMP", every=0)
    steps16 = len(orders) * net16.steps_per_epoch
    scales_used, skipped_steps = net16.scales_so_far(steps16)
    mixed_history.update({"loss scale": [float(v) for v in scales_used], "skipped steps": int(skipped_steps.sum())})
    chapter.record("mixed training", {key: values for key, values in mixed_history.items() if values != []})
    print(f"mixed precision ({VARIANT}): test accuracy {mixed_history['mixed accuracy'][-1]:.4f}; "
          f"loss scale {min(scales_used):.0f}..{max(scales_used):.0f}, {int(skipped_steps.sum())} steps skipped")
    last = min(10, len(mixed_history["mixed accuracy"]))
    chapter.bar("mixed precision: test accuracy", mixed_history["mixed accuracy"][-1], at_least=0.97)
    gap = np.mean(mixed_history["mixed accuracy"][-last:]) - np.mean(history["workbook accuracy"][-last:])
    chapter.bar(f"test accuracy, mean of the last {last} epochs: mixed - float32 (points)", 100 * abs(gap),
                at_most=0.5)

    planted = training.plant_overflow(net16, graph16, steps16)  # 2^40, then 30 more steps
    planted["accuracy after"] = net16.accuracy(test_x, test_y)
    chapter.record("planted overflow", planted)
    print(f"planted scale 2^40: {planted['skipped']} steps skipped in a row (scale {planted['scales'][0]:.3g} -> "
          f"{planted['scales'][planted['skipped']]:.3g}), {planted['skipped in all']} of the 30 in all; test accuracy "
          f"{planted['accuracy after']:.4f}")
    all_scales, all_skipped = net16.scales_so_far(steps16 + 30)
    chapter.savefig(training.plot_mixed(history["workbook loss"], mixed_history["mixed loss"], all_scales,
                                        all_skipped, steps16), "mixed")
else:
    chapter.show_stored_figure("mixed")

# %% [markdown]
# What a mixed step costs on the GPU, against the float32 step, both replayed as one graph (and
# torch's AMP step, eager).

# %%
if workbook.ON_GPU and HAS_MMA:  # a mixed step takes seconds in the simulator, its times mean nothing there
    steps16_cmp = chapter.compare("training step, mixed precision",
                                  {"float32, one CUDA graph": graph, "mixed, one CUDA graph": graph16},
                                  baselines={"torch AMP eager": amp.step} if amp is not None else {},
                                  size=f"batch {BATCH}, width {WIDTH}, 8x8, {VARIANT}", repeats=30)
    chapter.bar("GPU time per step: mixed / float32",
                steps16_cmp.ratio("mixed, one CUDA graph", "float32, one CUDA graph"), at_most=0.8)
    chapter.compare("mixed step, by part", {"forward (gather not included)": net16.forward,
                                            "backward": net16.backward, "optimizer + counter": net16.update},
                    size=f"batch {BATCH}, width {WIDTH}, 8x8, {VARIANT}", repeats=30)
    # the same two steps with half the channels: the convolutions do 1/4 of the arithmetic, the rest 1/2
    narrow = nw.init_parameters(WIDTH // 2, seed=0)
    narrow_nets = {"float32": nw.Network(narrow, BATCH), "mixed": mixed.MixedNetwork(narrow, BATCH, variant=VARIANT)}
    for narrow_net in narrow_nets.values():
        narrow_net.attach(train_x, train_y)
    chapter.compare("training step, mixed precision, half as wide",
                    {f"{name}, one CUDA graph": narrow_net.graph() for name, narrow_net in narrow_nets.items()},
                    size=f"batch {BATCH}, width {WIDTH // 2}, 8x8, {VARIANT}", repeats=30)
else:
    for key in ("training step, mixed precision", "mixed step, by part", "training step, mixed precision, half as wide"):
        chapter.show_stored(key)

# %% [markdown]
# ## What the numbers mean
#
# - **It learns as well as torch.** The two loss curves lie on each other (only the dropout masks
#   differ): the end-to-end check that every gradient is right at full size.
# - **A step as a graph beats torch eager in wall time**, through its host more than its kernels:
#   torch's host issues every kernel through autograd at every step, the graph is one launch.
# - **Wrapper by wrapper**, the same step costs its host 28 calls (47 launches), each checking its
#   arguments and building its views. Graphs exist for exactly this.
# - **Mixed precision learns as well**: chapter 03's loss scale moves as the steps allow, and a
#   planted 2^40 skips steps in a row, halving the scale each time, until the steps fit float16.
# - **What a mixed step costs**: the tensor cores shorten the convolutions and weight gradients;
#   BatchNorm, pooling and the loss stay float32, and the casts are launches of their own. At half
#   the width every kernel is bound by latency, and mixed precision pays less.
# - **The backward is several times the forward**: on layers this small a launch and its first
#   loads are much of a kernel's time, and the weight gradient's slices meet in dw by atomics;
#   chapter 01's BatchNorm gives each 64-value plane 256 threads, three quarters of them idle.
#
# Host figures move by 10-50% between runs. The figures these bullets point to:

# %%
G, P, T, M = "workbook, one CUDA graph", "workbook, plain launches", "torch eager", "mixed, one CUDA graph"
STEP, STEP16, PARTS, PARTS16 = ("training step", "training step, mixed precision", "training step, by part",
                                "mixed step, by part")
FWD, NARROW = "forward (gather not included)", "training step, mixed precision, half as wide"
scales = lambda f: lambda: f(chapter.figure("mixed training", "loss scale"))  # noqa: E731
chapter.show_figures({
    "held-out accuracy: ours / torch's": ("{:.1%} / {:.1%}", ("training", "workbook accuracy", -1),
                                          ("training", "torch accuracy", -1)),
    "wall a step in a loop: graph / torch eager": ("{:.0f} / {:.0f} us", ("wall us per step", G), ("wall us per step", T)),
    "GPU time a step: graph / torch": ("{:.2f} / {:.2f} ms", (STEP, G), (STEP, T)),
    "host a step: graph / torch eager / wrapper by wrapper": ("{:.0f} / {:.0f} / {:.0f} us", (STEP, G, "host_us"),
                                                              (STEP, T, "host_us"), (STEP, P, "host_us")),
    "mixed precision: held-out accuracy / torch AMP's": ("{:.1%} / {:.1%}", ("mixed training", "mixed accuracy", -1),
                                                         ("mixed training", "torch AMP accuracy", -1)),
    "  loss scale: lowest / highest; steps skipped": ("{:.0f} / {:.0f}; {}", scales(min), scales(max),
                                                      ("mixed training", "skipped steps")),
    "  planted 2^40: skipped in a row / the scale then / skipped of 30": (
        "{} / {:.3g} / {}", ("planted overflow", "skipped"), lambda: chapter.figure("planted overflow", "scales")[
            chapter.figure("planted overflow", "skipped")], ("planted overflow", "skipped in all")),
    "GPU time a step: mixed / float32 (ratio)": ("{:.2f} / {:.2f} ms ({:.2f})", (STEP16, M), (STEP, G),
                                                 "GPU time per step: mixed / float32"),
    "  half as wide: mixed / float32": ("{:.2f} / {:.2f} ms", (NARROW, M), (NARROW, "float32, one CUDA graph")),
    "backward / forward: float32; mixed": ("{:.2f} / {:.2f}; {:.2f} / {:.2f} ms", (PARTS, "backward"), (PARTS, FWD),
                                           (PARTS16, "backward"), (PARTS16, FWD)),
    "conv dgrad / wgrad: ours; cuDNN": ("{:.1f} / {:.1f}; {:.1f} / {:.1f} TFLOP/s",
                                        ("conv dgrad", "flipped filters + implicit GEMM", "tflops"),
                                        ("conv wgrad", "split-K implicit GEMM", "tflops"),
                                        ("conv dgrad", "torch conv2d_input (cuDNN)", "tflops"),
                                        ("conv wgrad", "torch conv2d_weight (cuDNN)", "tflops")),
})

# %% [markdown]
# ## Exercises you can check
#
# `exercises.py` beside this notebook holds four exercises on the layers this chapter added, each a
# stub with its spec. Each cell below shows one and runs its check: *not attempted*, *wrong* (with
# what is wrong) or *correct*. Edit `exercises.py` between `# >>> ch08.N` and `# <<< ch08.N`, save,
# and re-run the cell. `python -m pytest --exercises -k ch08` checks them all at once.

# %%
from workbook import exercises  # noqa: E402

exercises.show("ch08.1")

# %%
exercises.show("ch08.2")

# %%
exercises.show("ch08.3")

# %%
exercises.show("ch08.4")

# %% [markdown]
# ## More to try
# 1. Make the mixed step pay at half the width, where every kernel is latency-bound and the
#    float16 casts cost launches of their own: a channels-last BatchNorm whose store writes the
#    float16 copy the next convolution reads (chapter 01's blocks own one plane each, so a
#    channels-last store from there is 2-byte writes 64 bytes apart).
# 2. Fuse the global average pool's backward into the last BatchNorm's backward (its dy is the
#    same value over a whole plane), and the bias add into the GEMM's epilogue.
# 3. Give the weight gradient a tile of 32 x 96 with 16-byte shared loads (chapter 04's wide
#    fragments) and measure TFLOP/s against cuDNN's.
#
# ## References
# - NVIDIA CUTLASS, *Implicit GEMM convolution* (fprop, dgrad, wgrad); PyTorch's CUDA graphs.
# - scikit-learn, *Optical recognition of handwritten digits* dataset (`load_digits`).

# %%
chapter.save()
