"""What a phase-diagram run covers: the rules (methods) and their β, and the cells of the grid (trials,
shift levels, subset sizes), validated with errors that name the parameter."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import numpy as np

__all__ = ["RULES", "method_label", "resolve_methods", "grid_indices"]

#: Rules of the synthetic experiment (β-rules take every β of ``betas``).
RULES = ("source_only", "target_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto")
_BETA_RULES = ("fedda", "fedgp")
_AUTO_RULES = ("fedda_auto", "fedgp_auto")


def method_label(rule: str, beta: float | None = None) -> str:
    """The name of a (rule, β) pair in result tables: ``"fedda_0.5"``, ``"fedgp_auto"``, ``"source_only"``."""
    return f"{rule}_{beta:g}" if rule in _BETA_RULES else rule


def resolve_methods(rules: Sequence[str], betas: Sequence[float]) -> list[tuple[str, float]]:
    """[(rule, β)] with β = NaN for rules without a fixed β; validates names and values."""
    if isinstance(rules, str) or not isinstance(rules, Iterable):
        raise ValueError(f"rules must be a sequence of rule names from {list(RULES)}, got {rules!r}")
    rules = list(rules)
    if not rules:
        raise ValueError(f"rules must name at least one rule from {list(RULES)}; the grid is empty")
    for r in rules:
        if r not in RULES:
            raise ValueError(f"unknown rule {r!r}; rules must be among {list(RULES)}")
    if len(set(rules)) != len(rules):
        raise ValueError(f"rules contains duplicates: {rules}")
    if any(r in _BETA_RULES for r in rules):
        if isinstance(betas, (int, float)) or betas is None:
            raise ValueError(f"betas must be a sequence of numbers in [0, 1], got {betas!r}")
        betas = [float(b) for b in betas]
        if not betas:
            raise ValueError("betas must hold at least one β for the rules fedda/fedgp; the grid is empty")
        for b in betas:
            if not (0.0 <= b <= 1.0):
                raise ValueError(f"betas must lie in [0, 1] (β weights the source part), got {b!r}")
    out: list[tuple[str, float]] = []
    for r in rules:
        if r in _BETA_RULES:
            out.extend((r, b) for b in dict.fromkeys(betas))
        else:
            out.append((r, math.nan))
    return out


def grid_indices(values: Sequence[int] | None, n: int, name: str) -> list[int]:
    if values is None:
        return list(range(n))
    if isinstance(values, (int, np.integer)):
        values = [values]
    vals = list(values)
    if not vals:
        raise ValueError(f"{name} is empty; the grid is empty")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
            raise ValueError(f"{name} must hold integers in [0, {n - 1}], got {v!r}")
    return [int(v) for v in dict.fromkeys(vals)]
