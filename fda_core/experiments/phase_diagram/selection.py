"""What a phase-diagram run covers: the methods, taken from the one method registry
(:mod:`fda_core.experiments.methods`), and the cells of the grid (trials, shift levels, subset sizes),
validated with errors that name the parameter.

A method runs in the synthetic trainer when it declares the single-step gradient rule it applies
(``Method.gradient_rule``: "source_only", "target_only", "fedda" or "fedgp") and, for FedDA/FedGP, whether
it estimates β from target parts (``Method.estimates_beta``). Methods are given by canonical name
(``"fedgp"``), spec (``"fedgp(beta=0.2)"``) or instance; tables show each method's display label
(``"FedGP"``, ``"FedGP (β=0.2)"``, ``"FedGP_Auto"``) in their ``method`` column, its canonical name in
``rule`` and its fixed β in ``beta``.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..methods import Method, get_method, list_methods, method_class, parse_method_spec

__all__ = ["GridMethod", "synthetic_methods", "resolve_methods", "method_labels", "grid_indices"]

#: The values of ``Method.gradient_rule`` the synthetic trainer implements (its aggregation kinds).
_KINDS = ("source_only", "target_only", "fedda", "fedgp")


@dataclass(frozen=True)
class GridMethod:
    """One method of a run, resolved from the registry.

    ``name``: canonical registry name (the tables' ``rule`` column); ``label``: display label (the
    ``method`` column); ``spec``: canonical spec string; ``beta``: the fixed β of FedDA/FedGP (NaN for
    methods without β or that estimate it); ``gradient_rule``: "source_only", "target_only", "fedda" or
    "fedgp"; ``estimates_beta``: β estimated from target parts (the auto rules).
    """

    name: str
    label: str
    spec: str
    beta: float
    gradient_rule: str
    estimates_beta: bool

    @property
    def fixed_beta(self) -> bool:
        """True for FedDA/FedGP with a given β (not estimated)."""
        return self.gradient_rule in ("fedda", "fedgp") and not self.estimates_beta


def synthetic_methods() -> list[str]:
    """Canonical names of the registered methods the synthetic trainer can run (the default methods of
    :func:`~fda_core.experiments.phase_diagram.train_grid` and
    :func:`~fda_core.experiments.phase_diagram.init_metrics`), in registry order."""
    return [n for n in list_methods() if _supported(method_class(n))]


def _supported(cls: type[Method]) -> bool:
    rule = getattr(cls, "gradient_rule", None)
    if rule not in _KINDS:
        return False
    return not (getattr(cls, "estimates_beta", False) and rule not in ("fedda", "fedgp"))


def _instance(key: Any) -> tuple[Method, bool]:
    """(method instance, whether β was given by the key itself: a spec with ``beta=`` or an instance)."""
    if isinstance(key, Method):
        return key, "beta" in key.options
    if not isinstance(key, str):
        raise ValueError(f"rules must hold method names or specs such as 'fedgp' or 'fedgp(beta=0.2)', got {key!r}")
    method = get_method(key)
    given = "(" in key and "beta" in parse_method_spec(key)[1]
    return method, given


def _check_betas(betas: Any) -> list[float]:
    if isinstance(betas, (int, float)) or isinstance(betas, str) or not isinstance(betas, Iterable):
        raise ValueError(f"betas must be a sequence of numbers in [0, 1], got {betas!r}")
    out = []
    for b in betas:
        if isinstance(b, bool) or not isinstance(b, (int, float, np.integer, np.floating)) or not (0.0 <= b <= 1.0):
            raise ValueError(f"betas must lie in [0, 1] (β weights the source part), got {b!r}")
        out.append(float(b))
    if not out:
        raise ValueError("betas must hold at least one β for FedDA/FedGP; the grid is empty")
    return list(dict.fromkeys(out))


def resolve_methods(rules: Sequence[Any] | None = None, betas: Sequence[float] | None = (0.5,)) -> list[GridMethod]:
    """The methods of a run, validated against the registry.

    Args:
        rules: method names, specs or instances, or one of them (default :func:`synthetic_methods`). A method without a
            ``gradient_rule``, or with non-default options other than β (e.g. ``projection``, ``filter``),
            raises ValueError naming it and the supported methods.
        betas: β values for the methods with a β option whose key does not fix β (a spec
            ``"fedgp(beta=0.2)"`` or an instance runs its own β only): one row per β. None: each such
            method's own default β.
    Returns:
        One :class:`GridMethod` per (method, β), in the order given.
    """
    if rules is None:
        rules = synthetic_methods()
    if isinstance(rules, (str, Method)):
        rules = [rules]
    if not isinstance(rules, Iterable):
        raise ValueError(f"rules must be a sequence of method names (e.g. {synthetic_methods()}), got {rules!r}")
    rules = list(rules)
    if not rules:
        raise ValueError(f"rules must name at least one method from {synthetic_methods()}; the grid is empty")
    checked_betas: list[float] | None = None
    out: list[GridMethod] = []
    for key in rules:
        try:
            method, beta_given = _instance(key)
        except ValueError as err:
            why = "" if str(err).startswith("unknown method") else f" ({err})"
            raise ValueError(f"unknown rule {key!r}{why}; the synthetic trainer runs {synthetic_methods()}") from None
        if not _supported(type(method)):
            raise ValueError(f"rule {key!r} ({method.display_label}) is not a single-step gradient rule the synthetic "
                             f"trainer can run; supported methods: {synthetic_methods()}")
        other = {k: v for k, v in method.changed_options.items() if k != "beta"}
        if other:
            raise ValueError(f"rule {key!r}: the synthetic trainer runs the plain gradient rule, without the options "
                             f"{other}; supported methods: {synthetic_methods()} (with β as their only option)")
        has_beta = "beta" in method.options and not method.estimates_beta
        if has_beta and not beta_given and betas is not None:
            if checked_betas is None:
                checked_betas = _check_betas(betas)
            variants = [get_method(method.name, beta=b) for b in checked_betas]
        else:
            variants = [method]
        for m in variants:
            beta = float(m.beta) if has_beta else math.nan
            out.append(GridMethod(m.name, m.display_label, m.spec, beta, m.gradient_rule, bool(m.estimates_beta)))
    labels = [g.label for g in out]
    if len(set(labels)) != len(labels):
        raise ValueError(f"rules contains duplicates: {labels}")
    return out


def method_labels(keys: Sequence[Any], available: Iterable[str] = ()) -> list[str]:
    """Display labels of methods given by display label (one of ``available``, the labels of a result
    table), canonical name, spec or instance: ``["fedgp", "FedDA", "fedgp(beta=0.2)"]`` →
    ``["FedGP", "FedDA", "FedGP (β=0.2)"]``."""
    if isinstance(keys, (str, Method)):
        keys = [keys]
    available = set(available)
    out = []
    for key in keys:
        if isinstance(key, str) and key in available:
            out.append(key)
            continue
        try:
            out.append(key.display_label if isinstance(key, Method) else get_method(key).display_label)
        except ValueError:
            raise ValueError(f"method {key!r} is neither a method name or spec nor one of the methods "
                             f"{sorted(available)}") from None
    return out


def grid_indices(values: Sequence[int] | None, n: int, name: str) -> list[int]:
    """The indices ``values`` (default all of range(n)) without duplicates; ValueError naming ``name``."""
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
