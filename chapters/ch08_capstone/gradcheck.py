"""How the capstone checks a whole training step, which needs no torch: the float64 NumPy network
(network.reference_loss_and_grads) checked by central finite differences, then a step's every
gradient, of the workbook's float32 or mixed network, against that reference.

    finite_differences(params, x, targets, p_drop, seed, step)   the reference's worst relative error
    step_errors(net, params, x, targets, p_drop, seed, step)   the loss's and each gradient's
"""

import numpy as np

from chapters.ch02_dropout import kernels as drop

from .network import reference_loss_and_grads


def keep_mask(params, batch, p_drop, seed, step):
    """The dropout's keep mask (batch, width) of a step: chapter 02's Philox mapping on the host."""
    width = params["conv1"].shape[0]
    return drop.keep_reference(batch * width, p_drop, seed, step).reshape(batch, width)


def finite_differences(params, x, targets, p_drop, seed, step, *, points=3, h=1e-6):
    """The worst relative error of the reference's gradient against (f(v + h) - f(v - h)) / 2h, at
    `points` coordinates spread over every parameter; the dropout as the step's (seed, step)."""
    keep = keep_mask(params, len(x), p_drop, seed, step)
    _, grads = reference_loss_and_grads(params, x, targets, keep, p_drop)
    worst = 0.0
    for name, value in params.items():
        for index in list(np.ndindex(value.shape))[:: max(1, value.size // points)][:points]:
            plus, minus = dict(params), dict(params)
            plus[name], minus[name] = value.astype(np.float64).copy(), value.astype(np.float64).copy()
            plus[name][index] += h
            minus[name][index] -= h
            numeric = (reference_loss_and_grads(plus, x, targets, keep, p_drop)[0]
                       - reference_loss_and_grads(minus, x, targets, keep, p_drop)[0]) / (2 * h)
            worst = max(worst, abs(numeric - grads[name][index]) / (abs(numeric) + h))
    return worst


def step_errors(net, params, x, targets, p_drop, seed, step, *, half_scale=None):
    """(loss, reference loss, {parameter: relative error in norm}) of the step `net` just took
    backward on (x, targets), from `params`, its dropout seeded `seed` at offset `step`: the
    reference is fed the same keep mask (chapter 02's Philox mapping on the host) and, for a mixed
    network, rounds where it rounds (half_scale: its loss scale)."""
    keep = keep_mask(params, len(x), p_drop, seed, step)
    loss_ref, grads_ref = reference_loss_and_grads(params, x, targets, keep, p_drop, half_scale=half_scale)
    got = net.grads.to_host()
    errors = {name: float(np.linalg.norm(got[name] - grads_ref[name]) / np.linalg.norm(grads_ref[name]))
              for name in grads_ref}
    return float(net.loss.copy_to_host()[0]), loss_ref, errors
