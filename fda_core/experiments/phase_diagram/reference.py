"""One phase-diagram training the plain way (``nn.Sequential`` + autograd + ``torch.optim.SGD`` + the
library rule per step): the reference the batched trainer is tested against."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ...common.checks import check_int as _check_int
from ...core.aggregation import fedda, fedgp
from ...core.estimators import auto_beta
from ...data.sigmoid_net import init_params, make_network
from ...data.synthetic import SyntheticData
from .selection import resolve_methods

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
    n_parts: int = 2,
    reestimate_every: int | None = None,
    eval_every: int = 10,
) -> dict[str, Any]:
    """One training the plain way: ``nn.Sequential`` + autograd + ``torch.optim.SGD`` + the library rule.

    The reference :func:`~fda_core.experiments.phase_diagram.train_grid` is tested against (same data, θ0,
    subsets, parts and schedule). ``rule``: a method of the registry the synthetic trainer can run, by name,
    spec or instance; ``beta``: the β of FedDA/FedGP (None: the method's own, from its spec or its default).
    Returns ``{"eval_steps", "test_loss" (E,), "beta_init", "beta_used", "theta" (final flat θ)}``.
    """
    from ...core.aggregation import source_only, target_only

    (method,) = resolve_methods([rule], None if beta is None else [beta])
    kind, auto = method.gradient_rule, method.estimates_beta
    data._check_cell(size_index=size_index, trial=trial, shift_index=shift_index)
    steps = _check_int(steps, "steps", 1)
    eval_every = _check_int(eval_every, "eval_every", 1)
    n_parts = _check_int(n_parts, "n_parts", 2)
    net = make_network(init_params(data, trial))
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    loss_fn = nn.MSELoss()
    idx, test = data.train_indices(size_index, trial), data.test_indices(size_index, trial)
    xt, yt = data.x[idx], data.y_target[idx]
    xs, ys = data.x, data.y_sources[shift_index]
    xte, yte = data.x[test], data.y_target[test]
    k = len(idx)
    q = k // n_parts
    if auto and q < 1:
        raise ValueError(f"auto rules need subsets of at least n_parts = {n_parts} points, got {k}")

    def grad_on(xb: Tensor, yb: Tensor) -> Tensor:
        loss = loss_fn(net(xb), yb)
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
        else:
            g = fedgp(g_s.unsqueeze(0), g_t, b)
        offset = 0
        for p in params:
            p.grad = g[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
    return {
        "eval_steps": np.array(sorted(eval_at), dtype=np.int64),
        "test_loss": np.array(curve),
        "beta_init": betas_est[0] if betas_est else b,
        "beta_used": float(np.mean(betas_est)) if betas_est else b,
        "theta": torch.nn.utils.parameters_to_vector(params).detach(),
    }
