"""The result of a phase-diagram training run: one row per (trial, shift level, subset size, method) and
the target test-loss curves, with helpers to select and average them, and its JSON form (result store)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .selection import method_labels

__all__ = ["GridResult", "grid_to_json", "grid_from_json"]


@dataclass
class GridResult:
    """Result of :func:`~fda_core.experiments.phase_diagram.train_grid`.

    Attributes:
        table: one row per (trial, shift level, subset size, method) — columns ``row`` (index into
            ``curves``), ``trial``, ``shift_index``, ``shift``, ``size_index``, ``subset_size``,
            ``rule`` (the method's canonical name in the registry), ``beta`` (the fixed β of FedDA/FedGP, NaN
            otherwise), ``method`` (the method's display label, ``"FedGP"``, ``"FedGP (β=0.2)"``),
            ``beta_used`` (β of the training: the fixed β; for auto rules the estimate at θ0, or the mean
            of the estimates with ``reestimate_every``; 1 for source only, 0 for target only),
            ``beta_init`` (auto: the estimate at θ0), ``initial_test_loss``, ``final_test_loss``,
            ``min_test_loss``, ``diverged`` (non-finite final loss: the training blew up, lr too large;
            it is frozen at NaN, the other trainings go on), ``trajectory`` (id of the training run; rows that provably coincide —
            target only at every shift level, source only at every subset size — share one).
        curves: (rows, E) target test MSE at ``eval_steps`` (after that many updates).
        eval_steps: (E,) the steps of the curve (0, eval_every, …, steps).
        config: the resolved arguments of the run (``rules``: the methods' specs, ``methods``: their labels).
        timing: wall time, number of trainings run, chunk size, device (kept out of result tables:
            :func:`fda_core.experiments.phase_diagram.runs.timing_table`).
    """

    table: Any
    curves: np.ndarray
    eval_steps: np.ndarray
    config: dict
    timing: dict

    def curves_long(self):
        """The curves as a long table: the key columns of ``table`` plus ``step`` and ``test_loss``."""
        import pandas as pd

        keys = ["row", "trial", "shift_index", "shift", "size_index", "subset_size", "rule", "beta", "method"]
        n_e = len(self.eval_steps)
        base = self.table[keys].loc[self.table.index.repeat(n_e)].reset_index(drop=True)
        base["step"] = np.tile(self.eval_steps, len(self.table))
        base["test_loss"] = self.curves.reshape(-1)
        return pd.DataFrame(base)

    def curve(self, shift_index: int, size_index: int, method: Any, trial: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(eval_steps, losses) of one cell and method (display label, name or spec); losses (trials, E), or
        (E,) for one ``trial``."""
        t = self.table
        method = method_labels([method], t["method"].unique())[0]
        sel = (t["shift_index"] == shift_index) & (t["size_index"] == size_index) & (t["method"] == method)
        if trial is not None:
            sel &= t["trial"] == trial
        rows = t.loc[sel, "row"].to_numpy()
        if rows.size == 0:
            raise ValueError(
                f"no training for shift_index={shift_index}, size_index={size_index}, method={method!r}"
                + (f", trial={trial}" if trial is not None else "") + f"; methods: {sorted(t['method'].unique())}"
            )
        c = self.curves[rows]
        return self.eval_steps, (c[0] if trial is not None else c)

    def mean_table(self):
        """``table`` averaged over trials: one row per (shift level, subset size, method)."""
        keys = ["shift_index", "shift", "size_index", "subset_size", "rule", "beta", "method"]
        vals = ["beta_used", "initial_test_loss", "final_test_loss", "min_test_loss"]
        g = self.table.groupby(keys, dropna=False, sort=False)
        out = g[vals].mean().reset_index()
        out["n_trials"] = g.size().to_numpy()
        out["final_test_loss_std"] = g["final_test_loss"].std(ddof=1).to_numpy()
        return out


def grid_to_json(result: GridResult) -> dict[str, Any]:
    return {"table": result.table.to_dict(orient="split"), "curves": result.curves.tolist(),
            "eval_steps": result.eval_steps.tolist(), "config": result.config, "timing": result.timing}


def grid_from_json(obj: dict[str, Any]) -> GridResult:
    import pandas as pd

    table = pd.DataFrame(**{k: obj["table"][k] for k in ("data", "columns")})
    return GridResult(table, np.asarray(obj["curves"], dtype=float), np.asarray(obj["eval_steps"]),
                      obj["config"], obj["timing"])
