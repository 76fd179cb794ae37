"""Closed-form Delta errors of the aggregation rules, optimal β and the theory phase diagram.

Models with known gradients and the Monte-Carlo Δ² of any rule are in :mod:`fda_core.core.known_gradients`.

Reference: ``docs/theory.md`` § Delta errors, § Phase diagram, § Optimal weights; FedGP paper
Theorems 4.5 (Δ²_FedDA) and 4.6 (Δ²_FedGP, one source); the auto-weighted FDA paper's Theorems 4.2
(FedDA) and 4.4 (FedGP's mean-field approximation, its App. A.1.3) and § 4.2. β weights the SOURCE part
throughout (the papers put β on the target side: β_here = 1 − β_paper).

Notation: ``sigma2`` = σ²_π(D̂_T) (target variance), ``d2`` = d²_π(D_S, D_T) (squared source–target
distance), ``tau2`` = τ̄² ∈ [0, 1] (share of d² orthogonal to the source direction), ``delta_bar`` =
δ̄ ∈ [0, 1] (probability that the positive-projection filter keeps the source), ``m`` = number of
model parameters. All closed forms accept numpy arrays and broadcast.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


__all__ = [
    "delta_target_only",
    "delta_source_only",
    "delta_fedda",
    "delta_fedgp",
    "optimal_beta_fedda",
    "optimal_beta_fedgp",
    "delta_errors_theory",
    "phase_diagram_theory",
    "THEORY_RULES",
]

ArrayLike = float | np.ndarray | Sequence[float]

#: Rules the theory panel compares, in tie-break order (the "axis-aligned" order of the spec).
THEORY_RULES = ("source_only", "fedda", "fedgp", "target_only")


def _arr(x: ArrayLike, name: str, lo: float = 0.0, hi: float = math.inf) -> np.ndarray | float:
    a = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {x!r}")
    if np.any(a < lo) or np.any(a > hi):
        rng = f"[{lo:g}, {hi:g}]" if hi != math.inf else f">= {lo:g}"
        raise ValueError(f"{name} must be {rng}, got {x!r}")
    return a if a.ndim else float(a)


def delta_target_only(sigma2: ArrayLike) -> np.ndarray | float:
    """Δ²_target only = σ² (docs/theory.md § Delta errors; FedGP paper § 4.1)."""
    return _arr(sigma2, "sigma2")


def delta_source_only(d2: ArrayLike) -> np.ndarray | float:
    """Δ²_source only = d² (with the weighted-average source; docs/theory.md § Delta errors)."""
    return _arr(d2, "d2")


def delta_fedda(sigma2: ArrayLike, d2: ArrayLike, beta: ArrayLike) -> np.ndarray | float:
    """Δ²_FedDA = (1 − β)² σ² + β² d² (exact; FedGP paper Theorem 4.5, auto-weighted paper Theorem 4.2,
    docs/theory.md § Delta errors)."""
    s, d, b = _arr(sigma2, "sigma2"), _arr(d2, "d2"), _arr(beta, "beta", 0.0, 1.0)
    return (1 - b) ** 2 * s + b**2 * d


def delta_fedgp(
    sigma2: ArrayLike,
    d2: ArrayLike,
    beta: ArrayLike,
    delta_bar: ArrayLike = 1.0,
    tau2: ArrayLike = 1.0,
    m: float = math.inf,
    g_norm2: ArrayLike = 0.0,
) -> np.ndarray | float:
    """Mean-field Δ²_FedGP (auto-weighted paper Theorem 4.4, the approximation of FedGP paper Theorem 4.6;
    docs/theory.md § Delta errors):

        Δ²_GP ≈ ((1 − β)² + (2β − β²) δ̄ / m) σ² + β² δ̄ τ̄² d² + β² (1 − δ̄) ‖g_{D_T}‖²_π

    The projected noise is ≈ σ²/m for an m-dimensional model. ``g_norm2`` = ‖g_{D_T}‖²_π enters only
    when the filter drops the source (δ̄ < 1); its default 0 gives the spec's form. The formula is exact
    when δ̂ ≡ 1 and the per-sample noise is isotropic (see :class:`GaussianGradientModel`).
    """
    s, d, b = _arr(sigma2, "sigma2"), _arr(d2, "d2"), _arr(beta, "beta", 0.0, 1.0)
    db, t2 = _arr(delta_bar, "delta_bar", 0.0, 1.0), _arr(tau2, "tau2", 0.0, 1.0)
    g2 = _arr(g_norm2, "g_norm2")
    if not m >= 1:
        raise ValueError(f"m (number of parameters) must be >= 1, got {m!r}")
    return ((1 - b) ** 2 + (2 * b - b**2) * db / m) * s + b**2 * db * t2 * d + b**2 * (1 - db) * g2


def _safe_ratio(num: np.ndarray, den: np.ndarray, fallback: float) -> np.ndarray | float:
    num, den = np.broadcast_arrays(np.asarray(num, float), np.asarray(den, float))
    out = np.full(num.shape, float(fallback))
    np.divide(num, den, out=out, where=den > 0)
    return out if out.ndim else float(out)


def optimal_beta_fedda(sigma2: ArrayLike, d2: ArrayLike, fallback: float = 0.5) -> np.ndarray | float:
    """β* = σ² / (σ² + d²), the minimiser of Δ²_FedDA (docs/theory.md § Optimal weights).

    0/0 (σ² = d² = 0, every β is optimal) returns ``fallback`` (default 0.5).
    """
    s, d = _arr(sigma2, "sigma2"), _arr(d2, "d2")
    return _safe_ratio(s, np.add(s, d), fallback)


def optimal_beta_fedgp(
    sigma2: ArrayLike, tau2d2: ArrayLike, m: float = math.inf, delta_bar: ArrayLike = 1.0, fallback: float = 0.5,
    g_norm2: ArrayLike = 0.0,
) -> np.ndarray | float:
    """β* minimising the mean-field Δ²_FedGP of :func:`delta_fedgp` (docs/theory.md § Optimal weights):

        β* = a / (a + δ̄ τ̄²d² + (1 − δ̄) ‖g_{D_T}‖²_π),   a = σ²(1 − δ̄/m)

    (set the derivative of :func:`delta_fedgp` in β to zero). ``g_norm2`` = ‖g_{D_T}‖²_π enters only when the
    filter drops the source (δ̄ < 1); its default 0 gives the spec's and the auto-weighted paper's form
    a / (a + δ̄ τ̄²d²), which is the exact minimiser only for δ̄ = 1 or ``g_norm2`` = 0. With δ̄ = 1 and m = inf
    this is the papers' σ² / (σ² + τ̄²d²). 0/0 returns ``fallback``.
    """
    s, td = _arr(sigma2, "sigma2"), _arr(tau2d2, "tau2d2")
    db, g2 = _arr(delta_bar, "delta_bar", 0.0, 1.0), _arr(g_norm2, "g_norm2")
    if not m >= 1:
        raise ValueError(f"m (number of parameters) must be >= 1, got {m!r}")
    a = np.multiply(s, 1 - np.divide(db, m))
    return _safe_ratio(a, a + np.multiply(db, td) + np.multiply(np.subtract(1, db), g2), fallback)


def delta_errors_theory(
    d: ArrayLike,
    sigma: ArrayLike,
    beta: float = 0.5,
    delta_bar: float = 1.0,
    tau2: float = 0.5,
    m: float = 10,
    rules: Sequence[str] = THEORY_RULES,
) -> dict[str, np.ndarray]:
    """Closed-form Δ² of each rule on a (d, σ) grid (``d``, ``sigma`` are distances, NOT squared).

    Rules: ``source_only``, ``target_only``, ``fedda``, ``fedgp`` (with ``beta``), and ``fedda_auto``,
    ``fedgp_auto`` (with their optimal β from :func:`optimal_beta_fedda` / :func:`optimal_beta_fedgp`).
    Returns name → array of the broadcast shape of d and σ.
    """
    d_arr, s_arr = np.broadcast_arrays(_arr(d, "d"), _arr(sigma, "sigma"))
    d2, s2 = d_arr**2, s_arr**2
    out: dict[str, np.ndarray] = {}
    for r in rules:
        if r == "source_only":
            v = delta_source_only(d2)
        elif r == "target_only":
            v = delta_target_only(s2)
        elif r == "fedda":
            v = delta_fedda(s2, d2, beta)
        elif r == "fedgp":
            v = delta_fedgp(s2, d2, beta, delta_bar, tau2, m)
        elif r == "fedda_auto":
            v = delta_fedda(s2, d2, optimal_beta_fedda(s2, d2))
        elif r == "fedgp_auto":
            v = delta_fedgp(s2, d2, optimal_beta_fedgp(s2, tau2 * d2, m, delta_bar), delta_bar, tau2, m)
        else:
            raise ValueError(
                f"unknown rule {r!r} for the theory; rules must be among "
                "['source_only', 'target_only', 'fedda', 'fedgp', 'fedda_auto', 'fedgp_auto']"
            )
        out[r] = np.broadcast_to(np.asarray(v, float), d2.shape).copy()
    return out


def phase_diagram_theory(
    d: ArrayLike,
    sigma: ArrayLike,
    beta: float = 0.5,
    delta_bar: float = 1.0,
    tau2: float = 0.5,
    m: float = 10,
    rules: Sequence[str] = THEORY_RULES,
) -> np.ndarray:
    """Name of the rule with the smallest closed-form Δ² at every (d, σ) point (FedGP paper Fig. 2 left).

    ``d`` and ``sigma`` broadcast (e.g. ``d[None, :]`` and ``sigma[:, None]`` for a grid). Ties go to
    the earlier rule in ``rules``. With the paper's parameters (β = 0.5, δ̄ = 1, τ̄² = 0.5, m = 10) the
    regions are wedges in d²/σ²: source only < 1/3 < FedDA < 0.6 < FedGP < 5.4 < target only.
    Returns an array of rule names (dtype ``<U…``) of the broadcast shape.
    """
    errs = delta_errors_theory(d, sigma, beta, delta_bar, tau2, m, rules)
    names = list(errs)
    stack = np.stack([errs[r] for r in names])
    return np.asarray(names)[np.argmin(stack, axis=0)]
