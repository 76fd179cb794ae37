"""Monte-Carlo checks of the closed-form Delta errors (notebook 01): Δ² of each rule measured in a model
with known gradients next to its closed form (``docs/theory.md`` § Delta errors), as tables.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..core.known_gradients import GaussianGradientModel, KnownGradientModel, monte_carlo_delta
from ..core.theory import (delta_fedda, delta_fedgp, delta_source_only, delta_target_only, optimal_beta_fedda,
                           optimal_beta_fedgp)
from ..core.aggregation import get_rule

__all__ = ["delta_check", "verify_delta_formulas"]


def _z_score(mean: float, expected: float, stderr: float) -> float:
    """(mean − expected)/stderr; a deterministic quantity (stderr at rounding level) gives 0 when it
    equals the expectation to 1e-9 relative, else ±inf."""
    scale = max(1.0, abs(expected))
    if stderr > 1e-12 * scale:
        return (mean - expected) / stderr
    if math.isnan(expected):
        return float("nan")
    return 0.0 if abs(mean - expected) <= 1e-9 * scale else math.copysign(math.inf, mean - expected)


def delta_check(
    model: KnownGradientModel,
    betas: Sequence[float] = (0.25, 0.5, 0.75),
    rules: Sequence[str] = ("target_only", "source_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto"),
    n_draws: int = 4000,
    n_parts: int = 4,
    seed: int = 0,
):
    """Monte-Carlo Δ² of each rule vs its closed form, in one model with known gradients.

    Closed forms (docs/theory.md § Delta errors), with the true σ² (``model.sigma2``), d² to the
    weighted-average source and τ² of that source:

    * target only σ², source only d², FedDA (1−β)²σ² + β²d²: **exact** for any gradient distribution;
    * FedGP: the **mean-field** form with the measured δ̄ (share of draws where ⟨ĝ_T, g_S⟩ > 0), τ̄² = τ²,
      m = model.m and ‖g_T‖² (single source only). It is exact only when the noise is isotropic and
      δ̂ ≡ 1. Column ``projected`` replaces the isotropic σ²/m by the model's true projected noise
      E⟨ĝ_T − g_T, u⟩² (:meth:`KnownGradientModel.projected_variance`): exact whenever δ̂ ≡ 1;
    * auto rules: the **oracle optimum** (β from the true quantities); the Monte-Carlo value uses β
      estimated from ``n_parts`` target parts, so it can only be larger in expectation.

    Returns a DataFrame: rule, beta, n_target, m, sigma2, d2, tau2, delta_bar, formula, formula_kind,
    projected, z_projected, mc_mean, mc_stderr, z = (mc − formula)/stderr, seed.
    """
    import pandas as pd

    n_src = model.source_grads.shape[0]
    g_s = model.source_grads.mean(0)
    g_t = model.target_grad
    sigma2 = float(model.sigma2)
    d2 = float((g_t - g_s).square().sum())
    u = g_s / torch.linalg.vector_norm(g_s).clamp_min(1e-300)
    tau2d2 = float(g_t.square().sum() - (u @ g_t) ** 2)
    tau2 = tau2d2 / d2 if d2 > 0 else 0.0
    rows = []
    for k, rule in enumerate(rules):
        r = get_rule(rule)
        for j, beta in enumerate(betas if r.uses_beta else [float("nan")]):
            cell_seed = seed * 1_000_003 + 100 * k + j
            mc = monte_carlo_delta(r, model, beta=None if math.isnan(beta) else beta, n_draws=n_draws,
                                   n_parts=n_parts, seed=cell_seed)
            theorem, delta_bar, kind = float("nan"), float("nan"), "exact"
            if rule == "target_only":
                formula = delta_target_only(sigma2)
            elif rule == "source_only":
                formula = delta_source_only(d2)
            elif rule == "fedda":
                formula = delta_fedda(sigma2, d2, beta)
            elif rule == "fedda_auto":
                formula, kind = delta_fedda(sigma2, d2, optimal_beta_fedda(sigma2, d2)), "oracle optimum"
            elif rule in ("fedgp", "fedgp_auto") and n_src == 1:
                # δ̄ measured on the same draws as monte_carlo_delta (same seed, same generator sequence)
                v_hat = model.draw_parts(n_draws, n_parts, torch.Generator().manual_seed(cell_seed)).mean(1)
                delta_bar = float((v_hat @ g_s > 0).double().mean())
                b = beta if rule == "fedgp" else optimal_beta_fedgp(sigma2, tau2d2, model.m)
                formula = delta_fedgp(sigma2, d2, b, delta_bar, min(tau2, 1.0), model.m,
                                      g_norm2=float(g_t.square().sum()))
                kind = "mean-field" if rule == "fedgp" else "oracle optimum (mean-field)"
                # the same expression with the true projected noise E⟨v̂ − v, u⟩² in place of δ̄σ²/m:
                # exact when δ̂ ≡ 1 (Theorem 4.3 with the cross term's mean 0), whatever the noise's shape
                proj = model.projected_variance(g_s)
                theorem = ((1 - b) ** 2 * sigma2 + b**2 * delta_bar * tau2d2
                           + (2 * b - b**2) * delta_bar * proj + b**2 * (1 - delta_bar) * float(g_t.square().sum()))
            else:
                formula, kind = float("nan"), "n/a (several sources)"
            se = mc["stderr"]
            rows.append({
                "rule": rule, "beta": beta, "n_target": model.n_target, "m": model.m, "sigma2": sigma2,
                "d2": d2, "tau2": tau2, "delta_bar": delta_bar, "formula": float(formula), "formula_kind": kind,
                "projected": theorem, "z_projected": _z_score(mc["mean"], theorem, se),
                "mc_mean": mc["mean"], "mc_stderr": se,
                "z": _z_score(mc["mean"], float(formula), se), "seed": cell_seed,
            })
    return pd.DataFrame(rows)


def verify_delta_formulas(
    m: int,
    sigma2: float,
    d2_values: Sequence[float],
    betas: Sequence[float],
    tau2: float = 0.5,
    n_target: int = 60,
    n_draws: int = 4000,
    n_parts: int = 4,
    seed: int = 0,
    rules: Sequence[str] = ("target_only", "source_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto"),
):
    """:func:`delta_check` over a sweep of d² in the Gaussian model (:meth:`GaussianGradientModel.from_geometry`).

    The target lies far from the filter boundary (δ̂ ≡ 1) and the noise is isotropic, so here the
    mean-field FedGP formula is exact too. Returns the concatenated DataFrame (one ``delta_check`` per d²).
    """
    import pandas as pd

    tables = []
    for i, d2 in enumerate(d2_values):
        model = GaussianGradientModel.from_geometry(m=m, sigma2=sigma2, d2=d2, tau2=tau2, n_target=n_target)
        tables.append(delta_check(model, betas, rules, n_draws, n_parts, seed=seed * 7919 + i))
    return pd.concat(tables, ignore_index=True)
