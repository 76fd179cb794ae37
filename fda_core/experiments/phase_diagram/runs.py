"""Runs of the phase diagram through the result store: one stored result per trial, tied to the code that
produced it, so an interrupted run resumes at the first unfinished trial, a re-run reuses the finished
ones and a run of other code is recomputed (``docs/architecture.md`` § Conventions).

Also what a run's tables carry besides its numbers: the setting note generated from the configuration
that actually ran (:func:`setting_note`), and the wall-clock timings kept apart from the result tables
(:func:`timing_table`, written with :func:`fda_core.common.files.write_timings`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from ...common.provenance import code_revision
from ...data.sigmoid_net import describe_network
from ...data.synthetic import SyntheticData
from . import metrics as _metrics
from . import trainer as _trainer
from .result import GridResult, grid_from_json, grid_to_json
from .selection import resolve_methods

__all__ = ["EXPERIMENT", "RUN_MODULES", "run_phase_diagram", "run_revision", "setting_note", "timing_table"]

#: The result store's folder for the trials of the phase diagram.
EXPERIMENT = "synthetic_phase_diagram"
#: The modules a stored trial runs; their code revision (import closure included) is stored with it.
RUN_MODULES = ("fda_core.experiments.phase_diagram.trainer", "fda_core.experiments.phase_diagram.metrics")
#: The metrics are measured in float64 (:func:`~fda_core.experiments.phase_diagram.init_metrics`'s default).
_METRICS_DTYPE = torch.float64


def run_revision() -> str:
    """The code revision of :data:`RUN_MODULES` (:func:`fda_core.common.provenance.code_revision`)."""
    return code_revision(*RUN_MODULES)


def run_phase_diagram(
    data: SyntheticData,
    *,
    store: Any = None,
    rules: Sequence[Any] | None = None,
    betas: Sequence[float] = (0.5,),
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    training_step: str = "reference",
    granularity: str = "per_tensor",
    n_parts: int = 2,
    reestimate_every: int | None = None,
    n_subsets: int = 200,
    device: str | torch.device = "auto",
    progress: bool = True,
) -> tuple[GridResult, Any]:
    """Train every (shift, size, method) of every trial and measure the cells at θ0, one trial at a time,
    through ``store`` (a :class:`fda_core.common.store.ResultStore`; None: compute everything): each trial
    is stored with its config and the code revision of :data:`RUN_MODULES`, so a finished trial of the
    same code is reused, a long run (``paper_scale``) that was interrupted resumes at the first unfinished
    trial, and trials stored by other code (or with ``ResultStore(..., recompute=True)``) are recomputed.

    ``rules`` and ``betas`` select the methods and ``training_step``/``granularity`` the reference code's
    training (the defaults) or the library's, as in :func:`~fda_core.experiments.phase_diagram.train_grid`.

    Returns ``(GridResult, metrics DataFrame)`` for all trials, as ``train_grid`` and ``init_metrics``
    would (curves' ``row`` indices renumbered across trials). The result's ``config`` is the resolved
    configuration that ran (the training's, plus ``metrics``: the arguments of the metrics); its
    ``timing`` has the totals and one record per trial (:func:`timing_table`).
    """
    import pandas as pd

    from ...common import VERSION as __version__

    specs = [gm.spec for gm in resolve_methods(rules, betas)]  # validates early, before any trial runs
    _trainer.check_training_options(training_step, granularity)
    metrics_config = {"n_subsets": int(n_subsets), "n_parts": int(n_parts),
                      "dtype": str(_METRICS_DTYPE).replace("torch.", "")}
    base = {
        "n_points": data.n_points, "shift_levels": [float(v) for v in data.shift_levels],
        "subset_sizes": list(data.subset_sizes), "n_trials": data.n_trials, "seed": data.seed,
        "dtype": str(data.dtype).replace("torch.", ""), "rules": specs,
        "betas": [float(b) for b in betas], "steps": steps, "lr": lr, "momentum": momentum,
        "training_step": training_step, "granularity": granularity, "n_parts": n_parts,
        "reestimate_every": reestimate_every, "n_subsets": n_subsets, "fda_core": __version__,
    }
    revision = run_revision()
    grids, metrics, records = [], [], []
    for t in range(data.n_trials):
        computed = []

        def compute(t: int = t) -> dict[str, Any]:
            computed.append(t)
            res = _trainer.train_grid(data, rules=rules, betas=betas, steps=steps, lr=lr, momentum=momentum,
                                      training_step=training_step, granularity=granularity, n_parts=n_parts,
                                      reestimate_every=reestimate_every, trials=[t], device=device, progress=progress)
            start = time.perf_counter()
            met = _metrics.init_metrics(data, rules=rules, betas=betas, n_subsets=n_subsets, n_parts=n_parts,
                                        trials=[t], dtype=_METRICS_DTYPE, device=device, progress=progress)
            res.timing["metrics_wall_s"] = time.perf_counter() - start
            return {"grid": grid_to_json(res), "metrics": met.to_dict(orient="split")}

        config = {**base, "trial": t}
        out = store.cached(EXPERIMENT, config, compute, revision=revision) if store is not None else compute()
        grid = grid_from_json(out["grid"])
        grids.append(grid)
        metrics.append(pd.DataFrame(**{k: out["metrics"][k] for k in ("data", "columns")}))
        records.append({"trial": t, "computed": bool(computed), **grid.timing})
    offset, tables = 0, []
    for g in grids:
        tab = g.table.copy()
        tab["row"] = tab["row"] + offset
        if "trajectory" in tab:
            tab["trajectory"] = tab["trajectory"] + offset
        offset += g.curves.shape[0]
        tables.append(tab)
    timing = {"wall_s": float(sum(g.timing.get("wall_s", 0.0) for g in grids)),
              "metrics_wall_s": float(sum(g.timing.get("metrics_wall_s", 0.0) for g in grids)),
              "trials": len(grids), "trials_computed": sum(r["computed"] for r in records),
              "device": grids[0].timing.get("device"),
              "n_trainings_run": int(sum(g.timing.get("n_trainings_run", 0) for g in grids)), "per_trial": records}
    config = {**grids[0].config, "trials": list(range(data.n_trials)), "metrics": metrics_config,
              "code_revision": revision}
    combined = GridResult(pd.concat(tables, ignore_index=True), np.concatenate([g.curves for g in grids]),
                          grids[0].eval_steps, config, timing)
    return combined, pd.concat(metrics, ignore_index=True)


def setting_note(data: SyntheticData, config: dict) -> str:
    """The setting of a run in words, for the notes of its tables and figures, generated from the data and
    the resolved ``config`` that ran (:attr:`GridResult.config`; its ``metrics`` entry when present): the
    data (:meth:`SyntheticData.describe`), the network, the training and the metrics, each with how it
    differs from the papers'."""
    parts = [data.describe(), describe_network(), _trainer.describe_training(config)]
    if config.get("metrics"):
        parts.append(_metrics.describe_metrics(config["metrics"]))
    return "\n".join(parts)


def timing_table(result: GridResult) -> Any:
    """The wall-clock timings of a run, one row per trial (``computed``: False for a trial reused from the
    result store, whose times are those of the run that stored it), for
    :func:`fda_core.common.files.write_timings` — never for the result tables, which are identical on every
    re-run."""
    import pandas as pd

    records = result.timing.get("per_trial") or [{"trial": None, "computed": True, **result.timing}]
    return pd.DataFrame([{k: v for k, v in r.items() if k != "per_trial"} for r in records])
