"""One phase-diagram training the plain way (``nn.Sequential`` + autograd + the library rule per step, on
the dict of parameter tensors for per-tensor FedGP; the reference code's momentum step written out, or
``torch.optim.SGD`` for the library step): what the batched trainer is tested against."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...common.checks import check_int as _check_int
from ...core.aggregation import fedda, fedgp
from ...core.estimators import auto_beta
from ...data.sigmoid_net import init_params, make_network, param_dict
from ...data.synthetic import SyntheticData
from .selection import resolve_methods
from .trainer import check_training_options

__all__ = ["train_single"]


def train_single(
    data: SyntheticData,
    *,
    shift_index: int,
    size_index: int,
    rule: Any,
    beta: float | None = None,
    trial: int = 0,
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    training_step: str = "reference",
    granularity: str = "per_tensor",
    n_parts: int = 2,
    reestimate_every: int | None = None,
    eval_every: int = 10,
) -> dict[str, Any]:
    """One training the plain way: ``nn.Sequential`` + autograd + the library rule + a momentum step.

    The reference :func:`~fda_core.experiments.phase_diagram.train_grid` is tested against (same data, θ0,
    subsets, parts, schedule and options). ``rule``: a method of the registry the synthetic trainer can run,
    by name, spec or instance; ``beta``: the β of FedDA/FedGP (None: the method's own, from its spec or its
    default). ``training_step``: ``"reference"`` — loss ``((out − y)²).sum() / n`` (summed over the outputs)
    and v ← momentum·v + lr·ĝ, θ ← θ − lr·v per tensor, as the reference code; ``"library"`` —
    ``nn.MSELoss()`` and ``torch.optim.SGD``. ``granularity``: FedGP on the dict of parameter tensors
    (``"per_tensor"``, :func:`fda_core.core.aggregation.fedgp` layer-wise) or on the flat vector (``"flat"``).
    Returns ``{"eval_steps", "test_loss" (E,), "beta_init", "beta_used", "theta" (final flat θ)}``.
    """
    from ...core.aggregation import source_only, target_only

    (method,) = resolve_methods([rule], None if beta is None else [beta])
    kind, auto = method.gradient_rule, method.estimates_beta
    data._check_cell(size_index=size_index, trial=trial, shift_index=shift_index)
    steps = _check_int(steps, "steps", 1)
    eval_every = _check_int(eval_every, "eval_every", 1)
    n_parts = _check_int(n_parts, "n_parts", 2)
    check_training_options(training_step, granularity)
    reference_step = training_step == "reference"
    net = make_network(init_params(data, trial))
    params = list(net.parameters())
    opt = None if reference_step else torch.optim.SGD(params, lr=lr, momentum=momentum)
    velocity = [torch.zeros_like(p) for p in params]
    loss_fn = nn.MSELoss()

    def train_loss(out: Tensor, y: Tensor) -> Tensor:
        # the reference code's MSE(Y, Ŷ) = ((Y − Ŷ)²).sum() / N: summed over the outputs, mean over the points
        return (out - y).square().sum() / y.shape[0] if reference_step else loss_fn(out, y)
    idx, test = data.train_indices(size_index, trial), data.test_indices(size_index, trial)
    xt, yt = data.x[idx], data.y_target[idx]
    xs, ys = data.x, data.y_sources[shift_index]
    xte, yte = data.x[test], data.y_target[test]
    k = len(idx)
    q = k // n_parts
    if auto and q < 1:
        raise ValueError(f"auto rules need subsets of at least n_parts = {n_parts} points, got {k}")

    def grad_on(xb: Tensor, yb: Tensor) -> Tensor:
        loss = train_loss(net(xb), yb)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])

    eval_at = set(range(0, steps + 1, eval_every)) | {steps}
    curve, betas_est = [], []
    b = {"source_only": 1.0, "target_only": 0.0}.get(kind, 0.5 if auto else method.beta)
    for step in range(steps + 1):
        if step in eval_at:
            with torch.no_grad():
                curve.append(float(loss_fn(net(xte), yte)))
        if step == steps:
            break
        g_t = grad_on(xt, yt) if kind != "source_only" else None
        g_s = grad_on(xs, ys) if kind != "target_only" else None
        if auto and (step == 0 or (reestimate_every is not None and step % reestimate_every == 0)):
            parts = torch.stack([grad_on(xt[p * q:(p + 1) * q], yt[p * q:(p + 1) * q]) for p in range(n_parts)])
            b = float(auto_beta(parts, g_s, rule=kind))
            betas_est.append(b)
        if kind == "source_only":
            g = source_only(g_s.unsqueeze(0))
        elif kind == "target_only":
            g = target_only(g_t)
        elif kind == "fedda":
            g = fedda(g_s.unsqueeze(0), g_t, b)
        elif granularity == "per_tensor":
            g_dict = fedgp([param_dict(g_s)], param_dict(g_t), b)
            g = torch.cat([v.reshape(-1) for v in g_dict.values()])
        else:
            g = fedgp(g_s.unsqueeze(0), g_t, b)
        offset = 0
        for p, v in zip(params, velocity):
            g_p = g[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
            if reference_step:  # the reference code: v ← μ·v + lr·ĝ, θ ← θ − lr·v
                with torch.no_grad():
                    v.mul_(momentum).add_(g_p, alpha=lr)
                    p.add_(v, alpha=-lr)
            else:
                p.grad = g_p
        if opt is not None:
            opt.step()
    return {
        "eval_steps": np.array(sorted(eval_at), dtype=np.int64),
        "test_loss": np.array(curve),
        "beta_init": betas_est[0] if betas_est else b,
        "beta_used": float(np.mean(betas_est)) if betas_est else b,
        "theta": torch.nn.utils.parameters_to_vector(params).detach(),
    }
