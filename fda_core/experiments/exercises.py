"""Exercises of the theory notebooks (01–03), checked by library code, not by hidden cells.

A reader writes a prediction in a notebook cell and calls one of the ``check_*`` functions; it returns a
:class:`Check` that says whether the prediction is right, what the answer is and where it comes from. With
``answer=None`` (the default of the cells, and what a batch run executes) it states the question only and
gives nothing away. Answers come from the same code as the figures: the closed forms of
``fda_core.core.theory`` and ``fda_core.core.symbolic`` (``docs/theory.md`` § Optimal weights, § Phase
diagram), a phase-diagram comparison table, or an estimator-check table (``docs/theory.md`` § Unbiased
estimators).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["Check", "check_optimal_beta_fedda", "check_optimal_beta_fedgp", "check_boundary", "check_best_rule",
           "check_cell_winner", "check_spread_ratio"]


@dataclass(frozen=True)
class Check:
    """The outcome of one exercise: ``correct`` is None while no answer is given."""

    question: str
    answer: Any
    expected: Any
    correct: bool | None
    explanation: str

    def __str__(self) -> str:
        if self.correct is None:
            return f"Exercise: {self.question}\nWrite your prediction in `answer` and run the cell again."
        verdict = "Correct." if self.correct else "Not quite."
        return f"{verdict} Your answer: {self.answer}; the answer: {self.expected}. {self.explanation}"

    def _repr_markdown_(self) -> str:
        return str(self).replace("\n", "  \n")


def _number(answer: Any, name: str = "answer") -> float | None:
    if answer is None:
        return None
    try:
        value = float(answer)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number, got {answer!r}") from None
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {answer!r}")
    return value


def _close(answer: float | None, expected: float, tol: float) -> bool | None:
    return None if answer is None else abs(answer - expected) <= tol


def check_optimal_beta_fedda(answer: float | None, sigma2: float = 1.0, d2: float = 2.0, tol: float = 0.01) -> Check:
    """The β (source weight) minimising Δ²_FedDA = (1 − β)²σ² + β²d²: β* = σ²/(σ² + d²)
    (``docs/theory.md`` § Optimal weights). Right within ``tol``."""
    from ..core import theory

    expected = float(theory.optimal_beta_fedda(sigma2, d2))
    a = _number(answer)
    return Check(f"the optimal β of FedDA at σ² = {sigma2:g}, d² = {d2:g}", a, round(expected, 4),
                 _close(a, expected, tol),
                 f"Δ²_FedDA = (1−β)²σ² + β²d² is smallest where its derivative −2(1−β)σ² + 2βd² vanishes: "
                 f"β* = σ²/(σ²+d²) = {sigma2:g}/({sigma2:g}+{d2:g}). On the slider: set σ², d² of the curves and "
                 "read the FedDA optimal β.")


def check_optimal_beta_fedgp(answer: float | None, sigma2: float = 1.0, d2: float = 2.0, tau2: float = 0.5,
                             m: float = math.inf, delta_bar: float = 1.0, tol: float = 0.01) -> Check:
    """The β minimising the mean-field Δ²_FedGP (``docs/theory.md`` § Optimal weights; m = ∞ gives
    σ²/(σ² + τ̄²d²) for δ̄ = 1). Right within ``tol``."""
    from ..core import theory

    expected = float(theory.optimal_beta_fedgp(sigma2, tau2 * d2, m, delta_bar))
    a = _number(answer)
    return Check(f"the optimal β of FedGP at σ² = {sigma2:g}, d² = {d2:g}, τ̄² = {tau2:g}, m = {m:g}, δ̄ = {delta_bar:g}",
                 a, round(expected, 4), _close(a, expected, tol),
                 "The projection keeps only the share τ̄² of the distance, so FedGP trusts the source more than "
                 "FedDA: for m → ∞ and δ̄ = 1, β* = σ²/(σ² + τ̄²d²); a finite m adds the projected noise σ²/m.")


def check_boundary(answer: float | None, left: str = "fedgp", right: str = "target_only", beta: float = 0.5,
                   delta_bar: float = 1.0, tau2: float = 0.5, m: float = 10, rel_tol: float = 0.02) -> Check:
    """The ratio r = d²/σ² where the best rule changes from ``left`` to ``right`` (exact, from
    :func:`fda_core.core.symbolic.phase_boundaries`; ``docs/theory.md`` § Phase diagram). Right within
    ``rel_tol`` (relative)."""
    import sympy as sp

    from ..core import symbolic

    b = symbolic.phase_boundaries(sp.nsimplify(beta), sp.nsimplify(delta_bar), sp.nsimplify(tau2), sp.nsimplify(m))
    if (left, right) not in b:
        raise ValueError(f"({left!r}, {right!r}) are not neighbouring regions here; the boundaries are {list(b)}")
    r = b[(left, right)]
    expected = float(r)
    a = _number(answer)
    return Check(f"the ratio r = d²/σ² where {left} gives way to {right} (β = {beta:g}, δ̄ = {delta_bar:g}, "
                 f"τ̄² = {tau2:g}, m = {m:g})", a, f"{r} ≈ {expected:.4g}",
                 None if a is None else abs(a - expected) <= rel_tol * abs(expected),
                 "Every Δ² is σ² times a function of r, so regions are wedges through the origin; equate the two "
                 "rules' Δ²/σ² and solve for r.")


def _rule_key(answer: str) -> str:
    from .methods import get_method, list_methods

    text = str(answer).strip()
    for name in list_methods():
        m = get_method(name)
        if text.lower() in {name.lower(), m.label.lower(), m.display_label.lower()}:
            return name
    return text


def check_best_rule(answer: str | None, d: float, sigma: float, beta: float = 0.5, delta_bar: float = 1.0,
                    tau2: float = 0.5, m: float = 10, include_auto: bool = False) -> Check:
    """The rule with the smallest closed-form Δ² at (d, σ) (``docs/theory.md`` § Phase diagram). The answer is a
    method name or display label (``"fedgp"`` or ``"FedGP"``)."""
    from ..core import theory

    rules = list(theory.THEORY_RULES) + (["fedda_auto", "fedgp_auto"] if include_auto else [])
    from .methods import get_method

    expected = get_method(str(theory.phase_diagram_theory(d, sigma, beta, delta_bar, tau2, m, rules=rules))).display_label
    deltas = theory.delta_errors_theory(d, sigma, beta=beta, delta_bar=delta_bar, tau2=tau2, m=m, rules=rules)
    table = ", ".join(f"{get_method(k).display_label} {float(v):.3g}" for k, v in deltas.items())
    return Check(f"the rule with the smallest Delta error at d = {d:g}, σ = {sigma:g} (r = d²/σ² = {d**2 / sigma**2:.3g})",
                 answer, expected, None if answer is None else _rule_key(answer) == _rule_key(expected),
                 f"Δ² there: {table}. On the theory map: move the point of the curves to d² = {d**2:.3g}, "
                 f"σ² = {sigma**2:.3g}.")


def check_cell_winner(answer: str | None, cells: Any, shift_index: int, size_index: int,
                      column: str = "best_by_loss") -> Check:
    """The method named in ``column`` of a :func:`fda_core.experiments.phase_diagram.compare_best` table at one
    cell (by default the best final target test loss, averaged over trials)."""
    row = cells[(cells.shift_index == shift_index) & (cells.size_index == size_index)]
    if row.empty:
        raise ValueError(f"no cell shift_index={shift_index}, size_index={size_index} in the table")
    expected = str(row[column].iloc[0])
    r = row.iloc[0]
    return Check(f"which method wins ({column}) in the cell of shift {r['shift']:.3g} and {int(r.subset_size)} "
                 "target points", answer, expected,
                 None if answer is None else _rule_key(answer) == _rule_key(expected),
                 f"Measured there: d² = {r.d2:.3g}, σ² = {r.sigma2:.3g} (r = {r.d2_over_sigma2:.3g}); the Delta error "
                 f"named {r.best_by_delta_mc}. Check it in the cell viewer.")


def check_spread_ratio(answer: float | None, table: Any, B_from: int, B_to: int, n: int, quantity: str = "sigma2",
                       rel_tol: float = 0.15) -> Check:
    """The ratio std(B_to)/std(B_from) of the estimate ``quantity`` at ``n`` target points, measured in an
    :func:`fda_core.experiments.estimator_checks.estimator_check` table (Gaussian models: ≈ √((B_from − 1)/(B_to − 1))
    for σ̂², ``docs/theory.md`` § Unbiased estimators). Right within ``rel_tol`` (relative) of the measured ratio."""
    t = table[(table.quantity == quantity) & (table.n == n)]
    if "source" in t and quantity != "sigma2":
        t = t[t.source == t.source.dropna().min()]
    std = t.groupby("B")["std"].mean()
    if B_from not in std.index or B_to not in std.index:
        raise ValueError(f"B_from={B_from} and B_to={B_to} must be among the table's B values {list(std.index)} at n={n}")
    expected = float(std[B_to] / std[B_from])
    a = _number(answer)
    return Check(f"by what factor the spread (std) of {quantity} changes from B = {B_from} to B = {B_to} parts at n = {n}",
                 a, round(expected, 3), None if a is None else abs(a - expected) <= rel_tol * expected,
                 f"σ̂² averages B − 1 degrees of freedom, so its std falls like 1/√(B − 1): "
                 f"√({B_from - 1}/{B_to - 1}) = {math.sqrt((B_from - 1) / (B_to - 1)):.3f} in the Gaussian model.")
