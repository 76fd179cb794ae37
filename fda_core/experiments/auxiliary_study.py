"""Notebook 07's study: the weakly-supervised FDA paper's methods on the stand-in data sets, tables with 95%
confidence intervals beside the paper's numbers, the ablations, and the d²/σ² theory tie-in.

``docs/auxiliary.md`` holds the setting, the methods and the data sets. Every run goes through
:func:`fda_core.experiments.federated.run_many` (the result store: finished runs are reused, an interrupted
study resumes). Methods are given as ``{row name: registry spec}`` (the paper's Table-2 rows are
:data:`fda_core.experiments.auxiliary.PAPER_METHODS`); tables are one row per run (:func:`runs_table`), then
mean ± the half-width of a 95% t-interval over the trials (:func:`summary_table`,
``docs/auxiliary.md`` § Metrics and confidence intervals).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.seeding import derive_seed
from ..core import theory
from ..core.estimators import estimate_deltas, part_gradients
from .auxiliary import PAPER_METHODS, paper_method
from .federated import Run, make_config, run_many
from .methods import get_method
from .paper_numbers import paper_table

__all__ = ["STAND_INS", "PAPER_CONFIG", "stand_in_config", "paper_methods", "run_methods", "runs_table", "ci95", "summary_table", "format_ci",
           "beside_paper", "formatted", "paired_gains", "curves_table", "full_gradient", "measure_shift", "theory_prediction", "THEORY_RULES",
           "theory_table"]

#: The offline stand-ins (``docs/auxiliary.md`` § Data sets): registry dataset, its options, config settings
#: of the data set, and the paper's data set (Table-2 column prefix, or None for Table 6) it stands for.
STAND_INS: dict[str, dict[str, Any]] = {
    "DigitConditions": {"dataset": "DigitConditions", "dataset_options": {}, "config": {},
                        "paper": "CheXpert", "paper_table": "Healthcare_Table2"},
    "SUPPORT2": {"dataset": "SUPPORT2", "dataset_options": {"max_per_domain": 2000}, "config": {},
                 "paper": "MIMIC", "paper_table": "Healthcare_Table2"},
    "NonIIDMNIST": {"dataset": "NonIIDMNIST", "dataset_options": {}, "config": {"train_fraction": 0.3},
                    "paper": None, "paper_table": "Healthcare_Table6"},
}

#: The paper's setting (App. A.3) as config keys: Adam, source lr 1e-3, target lr 2e-4, one local epoch,
#: no warm-up; 100 labelled target samples; target batch 4 (not given in the paper).
PAPER_CONFIG: dict[str, Any] = {"optimizer": "adam", "source_lr": 1e-3, "target_lr": 2e-4, "local_epochs": 1,
                                "warmup_rounds": 0, "lr_decay": 1.0, "n_target_labeled": 100, "source_batch_size": 64,
                                "target_batch_size": 4, "model": "mlp"}


def stand_in_config(name: str, **overrides: Any) -> dict[str, Any]:
    """The base config of stand-in ``name`` (:data:`STAND_INS`): :data:`PAPER_CONFIG`, the data set's
    settings, then ``overrides`` (``dataset_options`` merged). ValueError names an unknown stand-in."""
    if name not in STAND_INS:
        raise ValueError(f"name must be one of {list(STAND_INS)}, got {name!r}")
    s = STAND_INS[name]
    opts = {**s["dataset_options"], **dict(overrides.pop("dataset_options", {}) or {})}
    return {**PAPER_CONFIG, "dataset": s["dataset"], **s["config"], **overrides, "dataset_options": opts}


def paper_methods(rows: Sequence[str] | None = None, *, beta_paper: float = 0.5, alpha: float = 1.0,
                  oracle_epochs: int | None = None) -> dict[str, dict[str, dict[str, Any]]]:
    """``{row: spec}`` of the paper's Table-2 rows (all of :data:`PAPER_METHODS`, or ``rows``), with GP's β
    in the paper's convention (``beta_paper``, β_library = 1 − β_paper), AuxInfo's ``alpha`` and the Oracle's
    epochs per round (None: ``target_local_epochs``)."""
    out = {}
    for row in (list(PAPER_METHODS) if rows is None else rows):
        words = row.split()
        spec = paper_method(row, beta_paper=beta_paper if "GP" in words else None,
                            alpha=alpha if "AuxInfo" in words else None)
        if row == "Oracle" and oracle_epochs is not None:
            spec = {"oracle": {"epochs": int(oracle_epochs)}}
        out[row] = spec
    return out


def run_methods(methods: Mapping[str, Any], base: Mapping[str, Any], *, seeds: Sequence[int],
                variants: Sequence[Mapping[str, Any]] = ({},), store: Any = None, experiment: str = "07",
                progress: bool = False, workers: int = 1) -> list[dict[str, Any]]:
    """Run every method (``{row: spec}``) × variant (config overrides; a ``"labels"`` mapping only labels) ×
    seed through the result store. Each trial's seed is also the data set's seed (its partition and
    subsets), so trials differ in data and initialisation. ``workers``: runs computed side by side, each in its own
    process (:func:`fda_core.experiments.federated.run_many`). Returns the results with ``labels``: ``row``,
    ``method`` (display label), ``trial`` and the variant's labels."""
    if not methods:
        raise ValueError("methods must name at least one method")
    if not seeds:
        raise ValueError("seeds must hold at least one seed")
    resolved = {row: get_method(spec) for row, spec in methods.items()}  # validate every spec first
    configs, labels = [], []
    for variant in variants:
        var = {k: v for k, v in variant.items() if k != "labels"}
        opts = {**dict(base.get("dataset_options", {})), **dict(var.pop("dataset_options", {}) or {})}
        for row, m in resolved.items():
            for trial, seed in enumerate(seeds):
                configs.append({**base, **var, "dataset_options": {**opts, "seed": int(seed)}, "seed": int(seed),
                                "rule": m.name, "method_options": m.option_values})
                labels.append({"row": row, "method": m.display_label, "trial": trial, **dict(variant.get("labels", {}))})
    return run_many(configs, store=store, experiment=experiment, labels=labels, progress=progress, workers=workers)


def runs_table(results: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run: its labels, rule, seed, rounds, n_target_labeled, final ``acc`` and ``auc`` and their
    last-5-round means (``last5_acc``, ``last5_auc``), in % (AUC NaN where the data set records none)."""
    rows = []
    for res in results:
        c = res["config"]
        rows.append({**dict(res.get("labels", {})), "rule": c["rule"], "seed": c["seed"], "rounds": c["rounds"],
                     "n_target_labeled": res["n_target_labeled"],
                     "acc": 100 * res["final_target_acc"], "auc": 100 * res.get("final_target_auc", math.nan),
                     "last5_acc": 100 * res["last5_target_acc"], "last5_auc": 100 * res.get("last5_target_auc", math.nan)})
    return pd.DataFrame(rows)


def ci95(values: Sequence[float]) -> tuple[float, float]:
    """(mean, half-width of the 95% t-interval) of ``values``: t_{0.975, T−1} · s / √T with s the sample
    standard deviation (``docs/auxiliary.md`` § Metrics and confidence intervals); NaN half-width for one
    value; NaNs ignored."""
    from scipy.stats import t as student

    v = np.asarray([x for x in values if not (isinstance(x, float) and math.isnan(x))], dtype=float)
    if len(v) == 0:
        return math.nan, math.nan
    if len(v) == 1:
        return float(v[0]), math.nan
    return float(v.mean()), float(student.ppf(0.975, len(v) - 1) * v.std(ddof=1) / math.sqrt(len(v)))


def summary_table(table: pd.DataFrame, by: Sequence[str] = ("row",), metrics: Sequence[str] = ("acc", "auc")
                  ) -> pd.DataFrame:
    """Mean and 95% CI half-width over trials of each metric, per group ``by`` (groups in order of first
    appearance): columns ``*by``, ``trials``, then ``<metric>`` and ``<metric>_ci`` for each metric."""
    by = list(by)
    rows = []
    for key, g in table.groupby(by, sort=False):
        key = key if isinstance(key, tuple) else (key,)
        row = dict(zip(by, key))
        row["trials"] = len(g)
        for m in metrics:
            row[m], row[f"{m}_ci"] = ci95(g[m].tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def format_ci(mean: float, ci: float, digits: int = 2) -> str:
    """``"53.28 ± 2.44"`` (``"53.28"`` without an interval, ``"—"`` for NaN)."""
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "—"
    return f"{mean:.{digits}f}" + ("" if ci is None or math.isnan(ci) else f" ± {ci:.{digits}f}")


def beside_paper(summary: pd.DataFrame, stand_in: str) -> pd.DataFrame:
    """Our mean ± CI per paper row beside the paper's numbers for the data set ``stand_in`` stands for
    (:data:`STAND_INS`): columns row, acc, acc_ci, auc, auc_ci, paper_acc, paper_acc_ci, paper_auc,
    paper_auc_ci (NaN where the paper has no number; Table 6 has accuracy only). Rows: ours, then the paper's
    rows this run left out (FADA and KD3A when notebook 07's ``fda_baselines`` is empty)."""
    s = STAND_INS[stand_in]
    paper = paper_table(s["paper_table"])
    ci = paper_table(s["paper_table"] + "_ci") if s["paper_table"] + "_ci" in _paper_names() else None
    cols = {"acc": f"{s['paper']} ACC" if s["paper"] else "ACC", "auc": f"{s['paper']} AUC" if s["paper"] else None}
    rows = list(summary["row"]) + [r for r in paper.index if r not in set(summary["row"])]
    out = []
    for r in rows:
        ours = summary[summary["row"] == r]
        rec: dict[str, Any] = {"row": r}
        for m in ("acc", "auc"):
            rec[m] = float(ours[m].iloc[0]) if len(ours) and m in ours else math.nan
            rec[f"{m}_ci"] = float(ours[f"{m}_ci"].iloc[0]) if len(ours) and f"{m}_ci" in ours else math.nan
        for m in ("acc", "auc"):
            col = cols[m]
            have = col is not None and col in paper.columns and r in paper.index
            rec[f"paper_{m}"] = float(paper.loc[r, col]) if have else math.nan
            rec[f"paper_{m}_ci"] = float(ci.loc[r, col]) if have and ci is not None and r in ci.index else math.nan
        out.append(rec)
    return pd.DataFrame(out)


def formatted(table: pd.DataFrame, stand_in: str | None = None) -> pd.DataFrame:
    """A :func:`beside_paper` (or :func:`summary_table`) table as strings ``mean ± CI``, indexed by row."""
    paper = STAND_INS[stand_in]["paper"] if stand_in else None
    out = pd.DataFrame(index=table["row"])
    for m, name in (("acc", "ACC"), ("auc", "AUC")):
        if m in table and not table[m].isna().all():
            out[f"{name} (ours)"] = [format_ci(a, b) for a, b in zip(table[m], table[f"{m}_ci"])]
        if f"paper_{m}" in table and not table[f"paper_{m}"].isna().all():
            out[f"{name} ({paper or 'paper'})"] = [format_ci(a, b) for a, b in zip(table[f"paper_{m}"], table[f"paper_{m}_ci"])]
    return out


def paired_gains(table: pd.DataFrame, baseline: str, by: str = "row", metrics: Sequence[str] = ("acc", "auc")
                 ) -> pd.DataFrame:
    """The gain of every group over the ``baseline`` group, paired by seed (the same data and initial model):
    mean and 95% CI of the per-seed differences, columns ``by``, trials, <metric>, <metric>_ci."""
    base = table[table[by] == baseline].set_index("seed")
    rows = []
    for key, g in table[table[by] != baseline].groupby(by, sort=False):
        g = g.set_index("seed")
        common = [s for s in g.index if s in base.index]
        row = {by: key, "trials": len(common)}
        for m in metrics:
            row[m], row[f"{m}_ci"] = ci95((g.loc[common, m] - base.loc[common, m]).tolist())
        rows.append(row)
    return pd.DataFrame(rows)


def _paper_names() -> set[str]:
    from .paper_numbers import PAPER

    return set(PAPER)


def curves_table(results: Sequence[Mapping[str, Any]], by: Sequence[str] = ("row",)) -> pd.DataFrame:
    """Accuracy and AUC (%) per evaluated round, mean and 95% CI over the trials of each group ``by``:
    columns ``*by``, round, trials, acc, acc_ci, auc, auc_ci."""
    rows = []
    for res in results:
        lab = dict(res.get("labels", {}))
        for h in res["history"]:
            rows.append({**{k: lab.get(k) for k in by}, "round": h["round"], "acc": 100 * h["target_acc"],
                         "auc": 100 * h.get("target_auc", math.nan)})
    return summary_table(pd.DataFrame(rows), by=[*by, "round"])


# ---------------------------------------------------------------------------------------------
# Theory tie-in (docs/auxiliary.md § Theory tie-in)
# ---------------------------------------------------------------------------------------------
#: The rules of the phase diagram, in its order, with the registry spec that trains each (GP: the paper's
#: cosine rule; β = 0.5 for FedDA and GP).
THEORY_RULES: dict[str, dict[str, dict[str, Any]]] = {
    "source_only": {"source_only": {}}, "fedda": {"fedda": {"beta": 0.5}},
    "fedgp": {"fedgp": {"beta": 0.5, "projection": "cosine"}}, "target_only": {"target_only": {}},
}


def full_gradient(fm: Any, x: Tensor, y: Tensor, chunk: int = 2048) -> Tensor:
    """The gradient (m,) of the mean main-task cross-entropy over all of (x, y) at the flat model ``fm``'s
    parameters (:class:`fda_core.experiments.flat.FlatModel`, whose ``grad`` collects it), in eval mode."""
    fm.module.eval()
    fm.grad.zero_()
    n = x.shape[0]
    for s in range(0, n, chunk):
        loss = F.cross_entropy(fm.module(x[s:s + chunk]), y[s:s + chunk], reduction="sum") / n
        loss.backward()
    return fm.grad.detach().clone()


def measure_shift(config: Mapping[str, Any], *, n_parts: int = 5, path: Any = "source_only",
                  dataset: Any = None) -> dict[str, Any]:
    """Unbiased estimates of σ², d² and τ²d² (``docs/theory.md`` § Unbiased estimators) on one run's data,
    averaged over the parameter points of a training path (θ ∼ π; ``docs/auxiliary.md`` § Theory tie-in).

    The run of method ``path`` (default FedAvg) with ``config`` is stepped round by round; after each round,
    at the global model: the main-task gradients on ``n_parts`` equal parts of the target's labelled samples
    (:func:`fda_core.core.estimators.part_gradients`) and the full gradient of every source; d² and τ²d² are
    measured to the mixture Σ_i w_i g_i of the sources (FedAvg's sample weights) and to each source.
    ``dataset``: a built dataset to use instead of ``config["dataset"]`` (as ``run_experiment(_dataset=...)``).
    Returns sigma2, d2, tau2d2 (path means, unclamped), d2_sources (N,), m, n_parts, and per_round records.
    """
    c = make_config(**{**config, "rule": path, "method_options": {}})
    run = Run(c, get_method(c["rule"], **c["method_options"]), dataset)
    fm, x_t, y_t = run.model, run.target["x_lab"], run.target["y_lab"]
    records = []
    for r in range(1, c["rounds"] + 1):
        run.round(r)
        fm.flat.copy_(run.theta)
        fm.load_buffers(run.buffers)
        fm.module.eval()
        parts = part_gradients(fm.module, F.cross_entropy, x_t, y_t, n_parts, seed=derive_seed(c["seed"], 7, r))
        src = torch.stack([full_gradient(fm, s["x"], s["y"]) for s in run.sources])
        mix = (run.weights[:, None] * src).sum(0, keepdim=True)
        est = estimate_deltas(parts, torch.cat([src, mix]))
        records.append({"round": r, "sigma2": float(est["sigma2"]), "d2": float(est["d2"][-1]),
                        "tau2d2": float(est["tau2d2"][-1]), "d2_sources": est["d2"][:-1].tolist()})
    per = pd.DataFrame(records)
    return {"sigma2": float(per["sigma2"].mean()), "d2": float(per["d2"].mean()), "tau2d2": float(per["tau2d2"].mean()),
            "d2_sources": np.mean(np.array(per["d2_sources"].tolist()), 0).tolist(), "m": int(fm.m),
            "n_parts": n_parts, "per_round": records}


def theory_prediction(sigma2: float, d2: float, tau2d2: float, m: float, beta: float = 0.5) -> dict[str, Any]:
    """Δ²/σ² of the four rules of the phase diagram at the measured quantities (``docs/theory.md`` § Phase
    diagram; mean-field FedGP with δ̄ = 1) and the rule with the smallest. The estimates are clamped at 0;
    τ̄² = τ²d²/d² clamped to [0, 1] (1 when d² = 0). Returns ratio (d²/σ², inf when σ² = 0), tau2, the
    four ``delta/sigma2`` values and ``best``."""
    s2, dd, td = max(sigma2, 0.0), max(d2, 0.0), max(tau2d2, 0.0)
    tau2 = min(td / dd, 1.0) if dd > 0 else 1.0
    scale = s2 if s2 > 0 else 1.0
    deltas = {"source_only": theory.delta_source_only(dd), "fedda": theory.delta_fedda(s2, dd, beta),
              "fedgp": theory.delta_fedgp(s2, dd, beta, 1.0, tau2, m), "target_only": theory.delta_target_only(s2)}
    rel = {k: float(v) / scale for k, v in deltas.items()}
    return {"ratio": dd / s2 if s2 > 0 else math.inf, "tau2": tau2, **{f"delta2/sigma2 {k}": v for k, v in rel.items()},
            "best": min(rel, key=rel.get)}


def theory_table(measured: Mapping[str, Mapping[str, Any]], winners: Mapping[str, str], beta: float = 0.5
                 ) -> pd.DataFrame:
    """One row per data set: the path-mean estimates, d²/σ², τ̄², the four Δ²/σ², the theory's best rule, the
    rule that won the training runs (``winners[name]``) and whether they agree."""
    rows = []
    for name, est in measured.items():
        pred = theory_prediction(est["sigma2"], est["d2"], est["tau2d2"], est["m"], beta)
        rows.append({"data set": name, "sigma2": est["sigma2"], "d2": est["d2"], "tau2d2": est["tau2d2"],
                     "m": est["m"], **pred, "trained best": winners.get(name, ""),
                     "agree": pred["best"] == winners.get(name)})
    return pd.DataFrame(rows)
