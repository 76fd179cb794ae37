"""Symbolic derivations with sympy: Delta errors, optimal β, and the phase-diagram boundaries.

``docs/theory.md`` § Delta errors, § Optimal weights, § Phase diagram (FedGP paper § 4, Theorem 4.3 and
the mean-field approximation). Used by notebook 01 to derive, not just state, the closed forms that
:mod:`fda_core.core.theory` evaluates numerically.
"""

from __future__ import annotations

from collections.abc import Sequence

import sympy as sp

__all__ = ["SYMBOLS", "delta_expressions", "optimal_beta_expressions", "optimal_delta_expressions",
           "phase_boundaries"]

beta, sigma2, d2, delta_bar, tau2, m, ratio = sp.symbols("beta sigma2 d2 delta_bar tau2 m r", positive=True)
#: The symbols: β, σ², d², δ̄, τ̄², m and r = d²/σ².
SYMBOLS = {"beta": beta, "sigma2": sigma2, "d2": d2, "delta_bar": delta_bar, "tau2": tau2, "m": m, "r": ratio}


def delta_expressions() -> dict[str, sp.Expr]:
    """Δ² of each rule as a sympy expression (FedGP: the mean-field form with δ̄, τ̄², m)."""
    return {
        "source_only": d2,
        "fedda": (1 - beta) ** 2 * sigma2 + beta**2 * d2,
        "fedgp": ((1 - beta) ** 2 + (2 * beta - beta**2) * delta_bar / m) * sigma2 + beta**2 * delta_bar * tau2 * d2,
        "target_only": sigma2,
    }


def optimal_beta_expressions() -> dict[str, sp.Expr]:
    """β* solving dΔ²/dβ = 0 for FedDA and FedGP (each Δ² is a convex quadratic in β)."""
    exprs = delta_expressions()
    out = {}
    for rule in ("fedda", "fedgp"):
        (sol,) = sp.solve(sp.diff(exprs[rule], beta), beta)
        out[rule] = sp.simplify(sol)
    return out


def optimal_delta_expressions() -> dict[str, sp.Expr]:
    """Δ² at β* (the auto-weighted rules with oracle β)."""
    exprs, betas = delta_expressions(), optimal_beta_expressions()
    return {f"{r}_auto": sp.factor(sp.simplify(exprs[r].subs(beta, betas[r]))) for r in ("fedda", "fedgp")}


def phase_boundaries(
    beta_value: float | sp.Expr = sp.Rational(1, 2),
    delta_bar_value: float | sp.Expr = 1,
    tau2_value: float | sp.Expr = sp.Rational(1, 2),
    m_value: float | sp.Expr = 10,
    rules: Sequence[str] = ("source_only", "fedda", "fedgp", "target_only"),
) -> dict[tuple[str, str], sp.Expr]:
    """The ratios r = d²/σ² where the best rule (smallest Δ²) changes, in increasing r, as
    ``{(best below, best above): r}`` (exact rationals for rational inputs).

    Every Δ² is σ² times a function of r, so the regions of the phase diagram are wedges. The
    transitions are found exactly: all pairwise crossings r > 0 are solved with sympy and the lower
    envelope is walked between them. With the paper's β = 1/2, δ̄ = 1, τ̄² = 1/2, m = 10 this gives
    source only →(1/3) FedDA →(3/5) FedGP →(27/5) target only; other values can drop a rule entirely
    (e.g. a small β makes FedDA never best).
    """
    values = {beta: sp.nsimplify(beta_value), delta_bar: sp.nsimplify(delta_bar_value),
              tau2: sp.nsimplify(tau2_value), m: sp.nsimplify(m_value)}
    all_exprs = delta_expressions()
    unknown = [r for r in rules if r not in all_exprs]
    if unknown:
        raise ValueError(f"unknown rule(s) {unknown}; rules must be among {list(all_exprs)}")
    exprs = {r: sp.simplify((all_exprs[r].subs(values) / sigma2).subs(d2, ratio * sigma2)) for r in rules}
    crossings: set[sp.Expr] = set()
    for i, a in enumerate(rules):
        for b in rules[i + 1:]:
            crossings.update(x for x in sp.solve(sp.Eq(exprs[a], exprs[b]), ratio) if x.is_real and x.is_positive)
    points = sorted(crossings, key=float)

    def best(r: float) -> str:
        return min(rules, key=lambda k: float(exprs[k].subs(ratio, r)))  # ties: earlier rule

    edges = [0.0] + [float(p) for p in points]
    probes = [(lo + hi) / 2 for lo, hi in zip(edges, edges[1:])] + [edges[-1] + 1.0 + edges[-1]]
    winners = [best(x) for x in probes]
    out: dict[tuple[str, str], sp.Expr] = {}
    for k, p in enumerate(points):
        if winners[k] != winners[k + 1]:
            out[(winners[k], winners[k + 1])] = p
    return out
