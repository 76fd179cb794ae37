"""Theory against practice on the phase diagram: which method is best per cell by Delta error and by
target test loss and how often the two agree (panels (a)-(c)), the closed-form best rule over the measured
range (the theory panel), and the per-training table joining results and metrics."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ...core.theory import phase_diagram_theory
from ...data.sigmoid_net import N_PARAMS
from .metrics import cell_metrics
from .result import GridResult
from .selection import method_labels

__all__ = ["compare_best", "agreement_summary", "win_counts", "middle_cell", "TheoryGrid", "theory_grid",
           "runs_table"]


def compare_best(
    result: GridResult | Any,
    metrics: Any,
    methods: Sequence[Any] = ("source_only", "fedda", "fedgp", "target_only"),
    loss_column: str = "final_test_loss",
):
    """Per (shift level, subset size): the method with the smallest Delta error and the one with the best
    target test loss, each averaged over trials (ties: the earlier method in ``methods``). ``methods`` are
    given by registry name, spec (``"fedgp(beta=0.2)"``) or display label; the result names them by
    display label (``"FedGP"``, ``"FedGP (β=0.2)"``).

    Columns: ``shift_index``, ``shift``, ``size_index``, ``subset_size``, ``d2``, ``sigma2`` (means over
    trials), ``d`` and ``sigma`` (their square roots), ``d2_over_sigma2``, ``best_by_delta_mc``,
    ``best_by_formula``, ``best_by_loss``, ``agree`` (best_by_delta_mc == best_by_loss), and one
    ``loss[<method>]`` / ``delta_mc[<method>]`` column per method.
    """
    import pandas as pd

    table = result.table if isinstance(result, GridResult) else result
    methods = method_labels(methods, set(table["method"]) | set(metrics["method"]))
    missing = [mm for mm in methods if mm not in set(table["method"])]
    if missing:
        raise ValueError(f"methods {missing} are not in the training results (methods: {sorted(set(table['method']))})")
    missing = [mm for mm in methods if mm not in set(metrics["method"])]
    if missing:
        raise ValueError(f"methods {missing} are not in the metrics (methods: {sorted(set(metrics['method']))})")
    keys = ["shift_index", "size_index"]
    loss = table[table["method"].isin(methods)].groupby(keys + ["method"])[loss_column].mean().unstack("method")[methods]
    met = metrics[metrics["method"].isin(methods)]
    dmc = met.groupby(keys + ["method"])["delta_mc"].mean().unstack("method")[methods]
    dfo = met.groupby(keys + ["method"])["delta_formula"].mean().unstack("method")[methods]
    cells = cell_metrics(metrics, average_trials=True).set_index(keys)
    idx = loss.index.intersection(dmc.index)
    out = cells.loc[idx, ["shift", "subset_size", "d2", "sigma2"]].copy()
    out["d"] = np.sqrt(out["d2"])
    out["sigma"] = np.sqrt(out["sigma2"])
    out["d2_over_sigma2"] = out["d2"] / out["sigma2"]
    names = np.asarray(methods)

    def argbest(frame) -> np.ndarray:  # NaN (a diverged training) never wins
        v = frame.loc[idx].to_numpy(dtype=float)
        return names[np.argmin(np.where(np.isnan(v), np.inf, v), axis=1)]

    out["best_by_delta_mc"] = argbest(dmc)
    out["best_by_formula"] = argbest(dfo)
    out["best_by_loss"] = argbest(loss)
    out["agree"] = out["best_by_delta_mc"] == out["best_by_loss"]
    for mm in methods:
        out[f"loss[{mm}]"] = loss.loc[idx, mm]
        out[f"delta_mc[{mm}]"] = dmc.loc[idx, mm]
    return pd.DataFrame(out).reset_index()


def agreement_summary(result: GridResult, metrics: Any, methods: Sequence[Any], label: str = "") -> dict[str, Any]:
    """How often the rule with the smallest Delta error is also the one that trains best (panels a vs b).

    * ``share_same_rule``: share of cells where :func:`compare_best` names the same rule by Monte-Carlo
      Δ² and by final target test loss (mean over trials);
    * ``share_same_or_within_noise``: cells that agree, plus disagreeing cells where the Δ²-best rule's
      test loss is within noise of the loss-best rule's: the per-trial difference of their final losses
      has a mean within 2 standard errors of 0 (needs ≥ 2 trials; with one trial this is NaN);
    * ``share_same_rule_formula``: the same as the first with the closed-form Δ² instead of Monte Carlo.
    """
    methods = method_labels(methods, set(result.table["method"]) | set(metrics["method"]))
    cmp = compare_best(result, metrics, methods=methods)
    table = result.table
    n_trials = int(table["trial"].nunique())
    within = []
    for _, cell in cmp.iterrows():
        if cell["agree"]:
            within.append(True)
            continue
        if n_trials < 2:
            within.append(np.nan)
            continue
        sel = (table["shift_index"] == cell["shift_index"]) & (table["size_index"] == cell["size_index"])
        per = table[sel].pivot_table(index="trial", columns="method", values="final_test_loss")
        diff = (per[cell["best_by_delta_mc"]] - per[cell["best_by_loss"]]).to_numpy(dtype=float)
        se = diff.std(ddof=1) / math.sqrt(len(diff))
        within.append(bool(abs(diff.mean()) <= 2 * se))
    within_arr = np.asarray(within, dtype=float)
    return {
        "panel": label,
        "methods": ", ".join(methods),
        "n_cells": len(cmp),
        "n_trials": n_trials,
        "share_same_rule": float(cmp["agree"].mean()),
        "share_same_rule_formula": float((cmp["best_by_formula"] == cmp["best_by_loss"]).mean()),
        "share_same_or_within_noise": float(np.nanmean(within_arr)) if n_trials >= 2 else float("nan"),
    }


def win_counts(columns: Mapping[str, Any]) -> Any:
    """How many cells each method wins, one column per entry of ``columns`` (name → a column of method
    labels, e.g. ``compare_best(...).best_by_loss``); methods that never win count 0."""
    import pandas as pd

    return pd.DataFrame({k: pd.Series(v).value_counts() for k, v in columns.items()}).fillna(0).astype(int)


def middle_cell(cells: Any) -> tuple[int, int]:
    """(shift_index, size_index) of the middle cell of a grid of cells (the medians of the two indices)."""
    shifts, sizes = sorted(cells["shift_index"]), sorted(cells["size_index"])
    return int(shifts[len(cells) // 2]), int(sizes[len(cells) // 2])


@dataclass
class TheoryGrid:
    """The closed-form best rule on a (d, σ) grid spanning the measured cells (the theory panel).

    ``d`` (D,), ``sigma`` (S,): log-spaced grid axes; ``best`` (S, D): the rule name with the smallest
    closed-form Δ²; ``beta``, ``delta_bar``, ``tau2`` (the mean measured τ² of the cells, clipped to
    [0, 1]) and ``m`` the theory's parameters; ``cells_d``, ``cells_sigma``: the measured cells with d > 0
    (the unshifted level, d = 0, is off a log axis); ``grid_max``: the largest measured d or σ.
    """

    d: np.ndarray
    sigma: np.ndarray
    best: np.ndarray
    beta: float
    delta_bar: float
    tau2: float
    m: int
    cells_d: np.ndarray
    cells_sigma: np.ndarray
    grid_max: float


def theory_grid(compared: Any, metrics: Any, beta: float, *, delta_bar: float = 1.0, m: int = N_PARAMS,
                n_grid: int = 160) -> TheoryGrid:
    """The best rule by the closed-form Δ² (:func:`fda_core.core.theory.phase_diagram_theory`) on a log grid
    from half the smallest to twice the largest measured d and σ of ``compared`` (a :func:`compare_best`
    table), with τ̄² the mean measured τ² of the cells of ``metrics``, δ̄ = ``delta_bar`` and m = ``m``
    (the network's parameters)."""
    tau2 = float(np.clip(cell_metrics(metrics, average_trials=True)["tau2"].mean(), 0, 1))
    d, sigma = compared["d"].to_numpy(float), compared["sigma"].to_numpy(float)
    positive = d > 0
    d_grid = np.geomspace(d[positive].min() / 2, d.max() * 2, n_grid)
    s_grid = np.geomspace(sigma.min() / 2, sigma.max() * 2, n_grid)
    best = phase_diagram_theory(d_grid[None, :], s_grid[:, None], beta, delta_bar, tau2, m)
    return TheoryGrid(d_grid, s_grid, best, float(beta), float(delta_bar), tau2, int(m), d[positive],
                      sigma[positive], float(max(d.max(), sigma.max())))


#: the metrics joined to each training row by :func:`runs_table`
_RUN_METRICS = ["d2", "sigma2", "tau2d2", "sigma2_hat", "d2_hat", "tau2d2_hat", "delta_mc", "delta_mc_stderr",
                "delta_formula", "formula_kind"]


def runs_table(result: GridResult, metrics: Any) -> Any:
    """One row per training (trial, shift level, subset size, method) with its results and the metrics of
    its cell and method at the initialisation (the training ids left out)."""
    keys = ["trial", "shift_index", "size_index", "method"]
    return result.table.drop(columns=["trajectory"], errors="ignore").merge(
        metrics[keys + _RUN_METRICS], on=keys, how="left")
