"""Runs of the phase diagram through the result store: one stored result per trial, so an interrupted run
resumes at the first unfinished trial and a re-run reuses the finished ones."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...data.synthetic import SyntheticData
from . import metrics as _metrics
from . import trainer as _trainer
from .result import GridResult, grid_from_json, grid_to_json

__all__ = ["run_phase_diagram"]


def run_phase_diagram(
    data: SyntheticData,
    *,
    store: Any = None,
    betas: Sequence[float] = (0.5,),
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    n_parts: int = 2,
    reestimate_every: int | None = None,
    n_subsets: int = 200,
    device: str | torch.device = "auto",
    progress: bool = True,
):
    """Train every (shift, size, rule) of every trial and measure the cells at θ0, one trial at a time,
    reusing the trials already in ``store`` (a :class:`fda_core.common.store.ResultStore`), so a long run
    (``paper_scale``) that was interrupted resumes at the first unfinished trial.

    Returns ``(GridResult, metrics DataFrame)`` for all trials, as :func:`train_grid` and
    :func:`init_metrics` would (curves' ``row`` indices renumbered across trials).
    """
    import pandas as pd

    from ...common import VERSION as __version__

    base = {
        "n_points": data.n_points, "shift_levels": [float(v) for v in data.shift_levels],
        "subset_sizes": list(data.subset_sizes), "n_trials": data.n_trials, "seed": data.seed,
        "betas": [float(b) for b in betas], "steps": steps, "lr": lr, "momentum": momentum, "n_parts": n_parts,
        "reestimate_every": reestimate_every, "n_subsets": n_subsets, "fda_core": __version__,
    }
    grids, metrics = [], []
    for t in range(data.n_trials):
        def compute(t: int = t) -> dict[str, Any]:
            res = _trainer.train_grid(data, betas=betas, steps=steps, lr=lr, momentum=momentum, n_parts=n_parts,
                             reestimate_every=reestimate_every, trials=[t], device=device, progress=progress)
            met = _metrics.init_metrics(data, betas=betas, n_subsets=n_subsets, n_parts=n_parts, trials=[t],
                               device=device, progress=progress)
            return {"grid": grid_to_json(res), "metrics": met.to_dict(orient="split")}

        config = {**base, "trial": t}
        out = store.cached("synthetic_phase_diagram", config, compute) if store is not None else compute()
        grids.append(grid_from_json(out["grid"]))
        metrics.append(pd.DataFrame(**{k: out["metrics"][k] for k in ("data", "columns")}))
    offset, tables = 0, []
    for g in grids:
        tab = g.table.copy()
        tab["row"] = tab["row"] + offset
        if "trajectory" in tab:
            tab["trajectory"] = tab["trajectory"] + offset
        offset += g.curves.shape[0]
        tables.append(tab)
    timing = {"wall_s": float(sum(g.timing.get("wall_s", 0.0) for g in grids)), "trials": len(grids),
              "device": grids[0].timing.get("device"),
              "n_trainings_run": int(sum(g.timing.get("n_trainings_run", 0) for g in grids))}
    combined = GridResult(pd.concat(tables, ignore_index=True), np.concatenate([g.curves for g in grids]),
                          grids[0].eval_steps, {**grids[0].config, "trials": list(range(data.n_trials))}, timing)
    return combined, pd.concat(metrics, ignore_index=True)
