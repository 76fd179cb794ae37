"""Which rule is best per cell, by Delta error and by target test loss, and how often the two agree
(panels (a)-(c) of the phase diagram)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .metrics import cell_metrics
from .result import GridResult
from .selection import method_labels

__all__ = ["compare_best", "agreement_summary"]


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
