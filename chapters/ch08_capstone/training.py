"""The capstone's training runs, which the notebook calls: the workbook's network replayed as one
CUDA graph a step, beside its torch twin on the same batches in the same order, epoch by epoch; the
mixed-precision run with a loss scale planted after it; and the plots of what they learned.

    TorchTwin        torch's copy of the network (network.torch_twin), float32 or AMP (autocast
                     to float16, GradScaler with chapter 03's rule), stepped as the workbook is
    train            epochs of graph replays, and of the twin's steps: losses and held-out accuracy
    plant_overflow   a loss scale of 2^40 in a trained mixed network, then steps until one fits
    plot_training, plot_mixed   the figures the notebook saves
"""

import numpy as np

from workbook import cuda


class TorchTwin:
    """The network in torch, fed what the workbook's `net` is fed: the same initial weights, the
    same batches in the same order (only the dropout masks differ: torch has its own generator)."""

    def __init__(self, torch, twin, net, train_x, train_y, test_x, *, amp=False):
        self.torch, self.model, self.net, self.amp = torch, twin, net, amp
        self.optimizer = torch.optim.SGD(twin.parameters(), lr=net.lr, momentum=net.momentum,
                                         weight_decay=net.weight_decay)
        self.scaler = torch.amp.GradScaler("cuda", init_scale=2.0**16, growth_interval=100) if amp else None
        self.x, self.y = torch.from_numpy(train_x).cuda(), torch.from_numpy(train_y).long().cuda()
        self.test_x = torch.from_numpy(test_x).cuda()
        self.order, self.at = None, 0

    def step(self):
        """One training step on the next batch of the current order; returns the loss (on the GPU)."""
        torch, batch = self.torch, self.net.batch
        idx = self.order[self.at * batch:(self.at + 1) * batch]
        self.at = (self.at + 1) % self.net.steps_per_epoch
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.float16, enabled=self.amp):
            loss = torch.nn.functional.cross_entropy(self.model(self.x[idx]), self.y[idx])
        if self.scaler is None:
            loss.backward()
            self.optimizer.step()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
        return loss

    def epoch(self, order):
        """An epoch's steps in `order` (a NumPy permutation); the losses, as floats."""
        self.model.train()
        self.order, self.at = self.torch.from_numpy(order).long().cuda(), 0
        losses = [self.step() for _ in range(self.net.steps_per_epoch)]
        return [float(v) for v in self.torch.stack(losses).detach().cpu()]

    def accuracy(self, test_y):
        self.model.eval()
        with self.torch.no_grad(), self.torch.autocast("cuda", dtype=self.torch.float16, enabled=self.amp):
            right = self.model(self.test_x).argmax(1).cpu().numpy() == test_y
        self.model.train()
        return float(right.mean())


def train(net, graph, orders, test_x, test_y, twin=None, *, name="workbook", twin_name="torch", every=5):
    """Every epoch: `net`'s order set, its graph replayed once a step, the twin's epoch on the same
    order; then both held-out accuracies. Returns {name loss, name accuracy, twin_name loss,
    twin_name accuracy} (the twin's empty without one); the losses are every step's batch mean."""
    history = {f"{name} loss": [], f"{name} accuracy": [], f"{twin_name} loss": [], f"{twin_name} accuracy": []}
    for epoch, order in enumerate(orders):
        net.set_order(order, stream=graph.stream)
        for _ in range(net.steps_per_epoch):
            graph()
        if twin is not None:
            history[f"{twin_name} loss"] += twin.epoch(order)
            history[f"{twin_name} accuracy"].append(twin.accuracy(test_y))
        cuda.synchronize()
        history[f"{name} accuracy"].append(net.accuracy(test_x, test_y))
        if every and (epoch % every == every - 1 or epoch == len(orders) - 1):
            print(f"epoch {epoch + 1}: {name} test accuracy {history[f'{name} accuracy'][-1]:.4f}"
                  + (f", {twin_name} {history[f'{twin_name} accuracy'][-1]:.4f}" if twin is not None else ""))
    history[f"{name} loss"] = [float(v) for v in net.losses_so_far(len(orders) * net.steps_per_epoch)]
    assert np.isfinite(history[f"{name} loss"]).all(), f"the {name} training diverged"
    return history


def plant_overflow(net16, graph16, steps_before, scale=2.0**40, steps=30):
    """A loss scale of `scale` planted in a trained mixed network, then `steps` replays: every
    float16 gradient overflows until the halved scale fits. Returns the record the notebook keeps:
    the scales of those steps, the skipped ones in a row and in all."""
    net16.set_scale(scale)
    for _ in range(steps):
        graph16()
    cuda.synchronize()
    scales, skipped = (v[-steps:] for v in net16.scales_so_far(steps_before + steps))
    in_a_row = int(np.argmin(skipped))  # the skipped steps in a row, until a scale fits float16
    assert skipped[0] and not skipped[in_a_row], "the scale should fall until a step fits"
    return {"scales": [float(v) for v in scales], "skipped": in_a_row, "skipped in all": int(skipped.sum())}


def plot_training(history):
    """Loss a step and held-out accuracy an epoch, the workbook's and torch's."""
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    for who, style in (("workbook", "-"), ("torch", "--")):
        if history[f"{who} loss"]:
            left.plot(history[f"{who} loss"], style, label=who)
            right.plot(np.arange(1, len(history[f"{who} accuracy"]) + 1), history[f"{who} accuracy"], style,
                       marker=".", label=who)  # a marker: one epoch (the simulator's run) is one point
    left.set(xlabel="step", ylabel="training loss (batch mean)", yscale="log", title="loss")
    lowest = min(history["workbook accuracy"] + history["torch accuracy"])
    right.set(xlabel="epoch", ylabel="held-out accuracy", title="test accuracy", ylim=(min(0.5, lowest - 0.05), 1.0))
    for axis in (left, right):
        axis.legend()
        axis.grid(alpha=0.3)
    return figure


def plot_mixed(float32_loss, mixed_loss, scales, skipped, planted_at):
    """Both losses, and the loss scale of every step with the skipped ones marked, the planted
    scale at step `planted_at`."""
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
    left.plot(float32_loss, label="float32")
    left.plot(mixed_loss, "--", label="mixed precision")
    left.set(xlabel="step", ylabel="training loss (batch mean)", yscale="log", title="loss")
    right.step(np.arange(len(scales)), scales, where="post", label="loss scale")
    skipped_at = np.flatnonzero(skipped)
    right.plot(skipped_at, scales[skipped_at], "x", color="tab:red", label="step skipped (Inf or NaN found)")
    right.axvline(planted_at, color="gray", lw=0.8, ls=":")
    right.annotate("2^40 planted", (planted_at, scales[planted_at]), xytext=(-90, -10), textcoords="offset points",
                   arrowprops={"arrowstyle": "->"})
    right.set(xlabel="step", ylabel="loss scale", title="the loss scale (GradScaler's rule, on the GPU)")
    right.set_yscale("log", base=2)
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    return figure
