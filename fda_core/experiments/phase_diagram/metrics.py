"""Metrics of the phase diagram at the initialisation (π = point mass at θ0 of each trial): σ², d², τ²d²,
their unbiased estimates and the Delta error of every rule, by exact Monte Carlo over random subsets and
by the closed forms of :mod:`fda_core.core.theory` (``docs/experiments.md`` § Synthetic phase diagram).

The target population is the whole target set D_1 (all n points, as the reference code does), so
σ² = E‖g_{D̂} − g_{D_1}‖² over subsets D̂ of size k drawn without replacement includes the
finite-population factor (n − k)/(n − 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ...common.checks import check_int as _check_int
from ...common.devices import resolve_device
from ...common.seeding import generator as _generator
from ...core.aggregation import fedda, fedgp
from ...core.estimators import auto_beta, estimate_deltas, per_sample_gradients, unit_directions
from ...data.sigmoid_net import N_PARAMS, full_gradients, init_params, make_network
from ...data.synthetic import SEED_TAGS, SyntheticData
from .selection import GridMethod, grid_indices as _indices, resolve_methods

__all__ = ["init_metrics", "cell_metrics", "describe_metrics"]


def _formula_kind(method: GridMethod) -> str:
    """What ``delta_formula`` is for a method: the exact closed form, the mean-field one (FedGP), or the
    oracle optimum over β (methods that estimate β)."""
    mean_field = method.gradient_rule == "fedgp"
    if method.estimates_beta:
        return "oracle optimum (mean-field)" if mean_field else "oracle optimum"
    return "mean-field" if mean_field else "exact"


def _subset_weights(idx: Tensor, n: int, n_parts: int, dtype: torch.dtype) -> Tensor:
    """Weights (R, 1 + B, n): row 0 the mean over each subset idx[r] (R, k), rows 1..B the means over
    its B parts (consecutive blocks of ⌊k/B⌋ positions; k mod B positions belong to no part)."""
    R, k = idx.shape
    q = k // n_parts
    w = torch.zeros(R, 1 + n_parts, n, dtype=dtype, device=idx.device)
    w[:, 0].scatter_(1, idx, 1.0 / k)
    for p in range(n_parts):
        w[:, 1 + p].scatter_(1, idx[:, p * q:(p + 1) * q], 1.0 / q)
    return w


def init_metrics(
    data: SyntheticData,
    *,
    rules: Sequence[Any] | None = None,
    betas: Sequence[float] = (0.5,),
    n_subsets: int = 200,
    n_parts: int = 2,
    trials: Sequence[int] | None = None,
    shift_indices: Sequence[int] | None = None,
    size_indices: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "auto",
    progress: bool = True,
):
    """σ², d², τ²d², their unbiased estimates and the Delta error of every rule at θ0, per cell.

    For each trial t (θ0 of that trial), shift level s and subset size k:

    * g_T = gradient on the WHOLE target set D_1 (the population; all n points, as the reference code),
      g_S = gradient on the whole source set of level s;
    * ``d2`` = ‖g_T − g_S‖², ``tau2d2`` = ‖P⊥ g_T‖² (P⊥ projects out g_S), ``tau2`` = tau2d2/d2,
      ``g_norm2`` = ‖g_T‖²;
    * ``sigma2`` = mean over ``n_subsets`` random subsets D̂ of size k (uniform WITHOUT replacement from
      the n target points, test points included) of ‖g_D̂ − g_T‖², with ``sigma2_stderr``;
      ``sigma2_exact`` = (n − k)/(k(n − 1)) · mean_i ‖g_i − g_T‖², the exact value of that expectation
      (finite-population factor included: it is 0 at k = n, unlike the i.i.d. σ² of the theory);
    * ``delta_bar`` = share of those subsets with ⟨g_D̂, g_S⟩ > 0, ``projected_noise`` = mean
      ⟨g_D̂ − g_T, u⟩² (u = g_S/‖g_S‖; the mean-field formula assumes σ²/m);
    * ``sigma2_hat``, ``d2_hat``, ``tau2d2_hat``: the raw unbiased estimates of
      :func:`fda_core.core.estimators.estimate_deltas` from B = ``n_parts`` parts of the ACTUAL training
      subset of the cell (the same parts the trainer uses), ``beta_hat``: the auto β from them;
    * per method: ``delta_mc`` = Monte-Carlo E‖g_T − ĝ‖² over the same random subsets, the rule applied
      to each subset's gradient with ``fda_core.core.aggregation`` (batched; auto rules estimate β from the
      B parts of each random subset), ``delta_mc_stderr``; ``delta_formula`` the closed form of
      :mod:`fda_core.core.theory` with σ² = ``sigma2``, δ̄ = ``delta_bar``, τ̄² = ``tau2``, m = 6110 and
      ‖g_T‖² (``formula_kind``: exact for source/target only and FedDA, mean-field for FedGP, the
      oracle optimum for the auto rules); ``delta_projected`` (FedGP) the same with the measured
      projected noise in place of δ̄σ²/m; ``z_formula`` = (mc − formula)/stderr.

    ``rules`` and ``betas`` select the methods as in :func:`~fda_core.experiments.phase_diagram.train_grid`
    (registry names or specs; the ``method`` column holds their display labels, ``rule`` the canonical
    names).

    Per-sample gradients (n, m) of the target set (:func:`fda_core.core.estimators.per_sample_gradients`
    of the network as an ``nn.Module``) are formed once per trial (n·m numbers in ``dtype``),
    the subset and part gradients are weight-matrix products with them.

    Returns:
        A tidy DataFrame, one row per (trial, shift level, subset size, method); the cell columns repeat
        on the rows of one cell (:func:`cell_metrics` keeps one row per cell).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ...core.theory import delta_fedda, delta_fedgp, optimal_beta_fedda, optimal_beta_fedgp

    if not isinstance(data, SyntheticData):
        raise ValueError(f"data must be a SyntheticData from make_phase_diagram_data, got {type(data).__name__}")
    methods = resolve_methods(rules, betas)
    n_subsets = _check_int(n_subsets, "n_subsets", 2)
    n_parts = _check_int(n_parts, "n_parts", 2)
    trials_ = _indices(trials, data.n_trials, "trials")
    shifts = _indices(shift_indices, data.n_shifts, "shift_indices")
    sizes = _indices(size_indices, data.n_sizes, "size_indices")
    small = [data.subset_sizes[j] for j in sizes if data.subset_sizes[j] < n_parts]
    if small:
        raise ValueError(f"n_parts = {n_parts} is larger than the subset sizes {small}")
    dev = resolve_device(device)
    src_data = data
    data = data.to(dev, dtype)
    n, S = data.n_points, len(shifts)
    m = N_PARAMS
    rows = []
    bar = tqdm(total=len(trials_) * len(sizes), desc="init_metrics", unit="size", disable=not progress, mininterval=0.5)
    try:
        for t in trials_:
            theta0 = init_params(data, t)
            # per-point loss (1/10)‖f(x_i) − y_i‖² (nn.MSELoss over one point's 10 outputs), so the mean of
            # any set of rows is the MSE gradient on that set
            G = per_sample_gradients(make_network(theta0), nn.MSELoss(), data.x, data.y_target)  # (n, m)
            g_t = G.mean(0)
            pop_var = float((G - g_t).square().sum(1).mean())
            ys = data.y_sources[shifts]
            g_s = full_gradients(theta0.expand(S, m).contiguous(), data.x, ys)  # (S, m)
            same = [bool(torch.equal(src_data.y_sources[s], src_data.y_target)) for s in shifts]
            for i, eq in enumerate(same):
                if eq:  # the unshifted level IS the target set: d = 0 exactly, not rounding noise
                    g_s[i] = g_t
            u = unit_directions(g_s)  # (S, m)
            d2 = (g_t - g_s).square().sum(1)
            tau2d2 = (g_t - (u @ g_t).unsqueeze(1) * u).square().sum(1)
            tau2d2 = torch.where(d2 > 0, torch.minimum(tau2d2, d2), torch.zeros_like(d2))
            g_norm2 = float(g_t.square().sum())
            for j in sizes:
                k = data.subset_sizes[j]
                gen = _generator(data.seed, SEED_TAGS["metrics"], t, j)
                idx = torch.rand(n_subsets, n, generator=gen).argsort(dim=1)[:, :k].to(dev)
                W = _subset_weights(idx, n, n_parts, dtype)  # (R, 1 + B, n)
                grads = (W.view(-1, n) @ G).view(n_subsets, 1 + n_parts, m)
                g_sub, parts = grads[:, 0], grads[:, 1:]
                err_sub = (g_sub - g_t).square().sum(1)  # (R,)
                sigma2 = float(err_sub.mean())
                sigma2_se = float(err_sub.std() / math.sqrt(n_subsets))
                sigma2_exact = (n - k) / (k * (n - 1)) * pop_var
                dots = g_sub @ g_s.T  # (R, S)
                delta_bar = (dots > 0).to(dtype).mean(0)
                proj_noise = ((g_sub - g_t) @ u.T).square().mean(0)  # (S,)
                # estimates from the actual training subset (its first B·⌊k/B⌋ positions, as train_grid)
                act = data.subset_idx[j, t, :k].unsqueeze(0)
                act_parts = (_subset_weights(act, n, n_parts, dtype)[0, 1:] @ G)  # (B, m)
                est = estimate_deltas(act_parts, g_s)
                beta_hat = {r: auto_beta(act_parts, g_s, rule=r) for r in {gm.gradient_rule for gm in methods
                                                                            if gm.estimates_beta}}
                src_b = g_s.unsqueeze(1).unsqueeze(2).expand(S, n_subsets, 1, m)  # (S, R, 1, m)
                tgt_b = g_sub.unsqueeze(0).expand(S, n_subsets, m)
                mc: dict[str, tuple[Tensor, Tensor]] = {}
                for gm in methods:
                    kind = gm.gradient_rule
                    if kind == "source_only":
                        err = d2.unsqueeze(1).expand(S, n_subsets)
                        bmc = torch.ones(S, dtype=dtype, device=dev)
                    elif kind == "target_only":
                        err = err_sub.unsqueeze(0).expand(S, n_subsets)
                        bmc = torch.zeros(S, dtype=dtype, device=dev)
                    else:
                        if gm.estimates_beta:
                            beta_r = auto_beta(parts, g_s.unsqueeze(0).expand(n_subsets, S, m), rule=kind).T  # (S, R)
                        else:
                            beta_r = torch.full((S, n_subsets), gm.beta, dtype=dtype, device=dev)
                        fn = fedda if kind == "fedda" else fedgp
                        ghat = fn(src_b, tgt_b, beta_r.unsqueeze(-1))  # (S, R, m)
                        err = (ghat - g_t).square().sum(-1)
                        bmc = beta_r.mean(1)
                        del ghat
                    mc[gm.label] = (err.mean(1), err.std(1) / math.sqrt(n_subsets), bmc)
                for i, s in enumerate(shifts):
                    d2_i, t2d2_i = float(d2[i]), float(tau2d2[i])
                    tau2 = min(1.0, t2d2_i / d2_i) if d2_i > 0 else 0.0
                    db, pn = float(delta_bar[i]), float(proj_noise[i])
                    cell = {
                        "trial": t, "shift_index": s, "shift": float(data.shift_levels[s]), "size_index": j,
                        "subset_size": k, "d2": d2_i, "sigma2": sigma2, "sigma2_stderr": sigma2_se,
                        "sigma2_exact": sigma2_exact, "tau2d2": t2d2_i, "tau2": tau2, "g_norm2": g_norm2,
                        "delta_bar": db, "projected_noise": pn,
                        "d2_over_sigma2": d2_i / sigma2 if sigma2 > 0 else math.inf,
                        "sigma2_hat": float(est["sigma2"]), "d2_hat": float(est["d2"][i]),
                        "tau2d2_hat": float(est["tau2d2"][i]),
                    }
                    for gm in methods:
                        mean, se, bmc = mc[gm.label]
                        kind, b, auto = gm.gradient_rule, gm.beta, gm.estimates_beta
                        proj = math.nan
                        if kind == "source_only":
                            formula, bh = d2_i, 1.0
                        elif kind == "target_only":
                            formula, bh = sigma2, 0.0
                        elif kind == "fedda":
                            bb = float(optimal_beta_fedda(sigma2, d2_i)) if auto else b
                            formula = float(delta_fedda(sigma2, d2_i, bb))
                            bh = float(beta_hat["fedda"][i]) if auto else b
                        else:
                            bb = float(optimal_beta_fedgp(sigma2, t2d2_i, m, db)) if auto else b
                            formula = float(delta_fedgp(sigma2, d2_i, bb, db, tau2, m, g_norm2=g_norm2))
                            proj = ((1 - bb) ** 2 * sigma2 + bb**2 * db * t2d2_i + (2 * bb - bb**2) * pn
                                    + bb**2 * (1 - db) * g_norm2)
                            bh = float(beta_hat["fedgp"][i]) if auto else b
                        mean_i, se_i = float(mean[i]), float(se[i])
                        z = (mean_i - formula) / se_i if se_i > 1e-12 * max(1.0, abs(formula)) else (
                            0.0 if abs(mean_i - formula) <= 1e-9 * max(1.0, abs(formula)) else math.copysign(math.inf, mean_i - formula))
                        rows.append({
                            **cell, "method": gm.label, "rule": gm.name, "beta": b, "beta_mc": float(bmc[i]),
                            "beta_hat": bh, "delta_mc": mean_i, "delta_mc_stderr": se_i, "delta_formula": formula,
                            "formula_kind": _formula_kind(gm), "delta_projected": proj, "z_formula": z,
                        })
                bar.update(1)
            del G
    finally:
        bar.close()
    return pd.DataFrame(rows)


_CELL_COLUMNS = ["trial", "shift_index", "shift", "size_index", "subset_size", "d2", "sigma2", "sigma2_stderr",
                 "sigma2_exact", "tau2d2", "tau2", "g_norm2", "delta_bar", "projected_noise", "d2_over_sigma2",
                 "sigma2_hat", "d2_hat", "tau2d2_hat"]


def cell_metrics(metrics, average_trials: bool = False):
    """One row per (trial, shift level, subset size) with the cell columns of :func:`init_metrics`;
    with ``average_trials`` the mean over trials per (shift level, subset size) (``n_trials`` added,
    ``d2_over_sigma2`` recomputed from the means)."""
    cells = metrics[_CELL_COLUMNS].drop_duplicates(["trial", "shift_index", "size_index"]).reset_index(drop=True)
    if not average_trials:
        return cells
    keys = ["shift_index", "shift", "size_index", "subset_size"]
    g = cells.drop(columns="trial").groupby(keys, sort=True)
    out = g.mean().reset_index()
    out["n_trials"] = g.size().to_numpy()
    out["d2_over_sigma2"] = out["d2"] / out["sigma2"]
    return out


def describe_metrics(config: dict) -> str:
    """The metrics at the initialisation in words, from the arguments :func:`init_metrics` ran with
    (``n_subsets``, ``n_parts``, ``dtype``)."""
    return (f"Metrics at the initialisation (π = point mass at θ0), in {config['dtype']}: the whole target set "
            f"(test points included) is the population, as the reference code does; σ² and the Monte-Carlo Delta "
            f"errors over {config['n_subsets']} random target subsets per cell (without replacement); estimates "
            f"and auto β from B = {config['n_parts']} parts of the cell's training subset; closed forms of the "
            f"theory with the measured σ², δ̄ and τ̄².")
