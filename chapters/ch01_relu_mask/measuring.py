"""What chapter 01's notebook measures with, so that the notebook shows the kernels and the
figures rather than the plumbing:

    traced_forward_table   the forward kernels' global traffic as the simulator's memory trace counts
                           it, beside the reference GPU's stored times
    bn_case, fused_step    one BatchNorm (+ Add) + ReLU step's buffers and float64 references, and
                           the four fused kernels run on them
    torch_bn_step          the same step in torch's autograd, on the same device buffers
    forward_sweep          the forward kernels and torch.relu from small arrays to large
"""

import numpy as np

from workbook import bench, cuda, memtrace, tables

from . import batchnorm as bn
from . import kernels as k


def traced_forward_table(chapter, forwards, rng, n=2048):
    """Print, for each (name, kernel) of `forwards` on n traced elements: sectors a load and a store
    request moves, sectors moved an element, and the reference GPU's stored time at 2^28."""
    from rich.table import Table

    x = cuda.to_device(rng.standard_normal(n, dtype=np.float32))
    table = Table(title=f"relu + mask, n={n} as traced here; time as stored", title_justify="left")
    for column in ("kernel", "loads: sectors / request", "stores: sectors / request", "sectors moved / element",
                   "stored ms"):
        table.add_column(column, justify="left" if column == "kernel" else "right")
    for name, forward in forwards:
        with memtrace.trace() as trace:
            forward(x, cuda.device_array(n, np.float32), cuda.device_array(k.mask_words(n), np.uint32))
        (spaces,) = trace.kernels().values()
        loads, stores = spaces["global ld"], spaces["global st"]
        table.add_row(name, f"{loads.sectors_per_request:.1f}", f"{stores.sectors_per_request:.1f}",
                      f"{(loads.sectors + stores.sectors) / n:.2f}", f"{chapter.figure('relu forward + mask', name):.3f}")
    tables.console().print(table)


def bn_case(rng, shape, with_identity):
    """Host inputs, device buffers and the float64 references of one BatchNorm + (Add) + ReLU step."""
    x, identity, gamma, beta, running_mean, running_var = bn.batchnorm_inputs(rng, shape, with_identity=with_identity)
    dy = rng.standard_normal(shape, dtype=np.float32)
    y_ref, mask_ref, saved_ref, mean_ref, var_ref = bn.batchnorm_forward_reference(
        x, gamma, beta, running_mean, running_var, identity=identity)
    grads_ref = bn.batchnorm_backward_reference(dy, y_ref > 0, x, gamma, saved_ref, with_identity=with_identity)
    host = dict(x=x, identity=identity, gamma=gamma, beta=beta, running_mean=running_mean, running_var=running_var,
                dy=dy)
    dev = {name: (cuda.to_device(a) if a is not None else None) for name, a in host.items()}
    dev.update(y=cuda.device_array(shape, np.float32), mask=cuda.device_array(mask_ref.shape, np.uint32),
               saved=cuda.device_array((2, shape[1]), np.float64), dx=cuda.device_array(shape, np.float32),
               d_identity=cuda.device_array(shape, np.float32) if with_identity else None,
               dgamma=cuda.device_array(shape[1], np.float32), dbeta=cuda.device_array(shape[1], np.float32))
    refs = dict(y=y_ref, mask=mask_ref, saved=saved_ref, running_mean=mean_ref, running_var=var_ref,
                grads=tuple(g for g in grads_ref if g is not None))
    return host, dev, refs


def fused_step(d):
    """The fused forward, then the fused backward, on bn_case's device buffers: the gradients."""
    bn.batchnorm_relu_forward(d["x"], d["gamma"], d["beta"], d["running_mean"], d["running_var"], d["y"],
                              d["mask"], d["saved"], identity=d["identity"])
    grads = bn.batchnorm_relu_backward(d["dy"], d["mask"], d["x"], d["gamma"], d["saved"], d["dx"], d["dgamma"],
                                       d["dbeta"], d_identity=d["d_identity"])
    return tuple(g for g in grads if g is not None)


def torch_bn_step(torch, host, dev):
    """relu(batch_norm(x) + identity) forward and backward in torch's autograd, on bn_case's
    buffers (with an identity): a function returning (dx, d_identity, dgamma, dbeta)."""
    channels = host["gamma"].shape[0]
    t_x, t_identity = bench.torch_view(dev["x"]).requires_grad_(), bench.torch_view(dev["identity"]).requires_grad_()
    t_gamma = torch.tensor(host["gamma"], device="cuda", requires_grad=True)
    t_beta = torch.tensor(host["beta"], device="cuda", requires_grad=True)
    t_mean, t_var = torch.zeros(channels, device="cuda"), torch.ones(channels, device="cuda")
    t_dy = bench.torch_view(dev["dy"])

    def step():
        for leaf in (t_x, t_identity, t_gamma, t_beta):
            leaf.grad = None
        z = torch.nn.functional.batch_norm(t_x, t_mean, t_var, t_gamma, t_beta, training=True, momentum=0.1, eps=1e-5)
        torch.relu(z + t_identity).backward(t_dy)
        return t_x.grad, t_identity.grad, t_gamma.grad, t_beta.grad

    return step


def forward_sweep(chapter, torch, x, y, mask, sizes):
    """The naive, ballot and 8-byte-word forwards and torch.relu on the first `size` elements of
    x, y and mask, for each size, checked: {variant: [GB/s at 8.125 bytes an element]}."""
    kernels = {"sequential (naive)": k.relu_mask_sequential, "warp ballot": k.relu_mask_ballot,
               "warp ballot, 8-byte words": k.relu_mask_wide}
    series = {name: [] for name in [*kernels, "torch.relu (no mask)"]}
    for size in sizes:
        s_x, s_y, s_mask = x[:size], y[:size], mask[:k.mask_words(size)]
        t_x = bench.torch_view(s_x)
        result = chapter.compare(
            "relu forward sweep", {name: (lambda f=f: f(s_x, s_y, s_mask)) for name, f in kernels.items()},
            reference=lambda: k.relu_mask_reference(s_x.copy_to_host()),
            baselines={"torch.relu (no mask)": lambda: torch.relu(t_x)}, check_baselines=False,
            bytes=8.125 * size, size=f"n={size:,}", repeats=20, show=False)
        for name in series:
            series[name].append(result.gbps(name))
    return series
