"""Figures of notebook 07 (weakly-supervised FDA; ``docs/auxiliary.md``): accuracy and AUC against rounds with
95% confidence bands, the ablations, and the d²/σ² theory tie-in. Each function returns the figure and the
tidy table of exactly the numbers drawn (for :func:`fda_core.viz.plotting.save_figure`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

__all__ = ["ROW_COLORS", "row_color", "curves_figure", "ablation_figure", "beta_figure", "gain_figure",
           "theory_figure"]

#: One colour per paper row (the paper's method names), shared by every figure of the notebook.
ROW_COLORS = {
    "FedAvg": "#4c72b0", "FedAvg Finetune": "#64b5cd", "FedAvg Finetune AuxInfo": "#55a868",
    "FedAvg Finetune GP": "#c44e52", "FedAvg Finetune AuxInfo GP": "#dd8452", "Oracle": "#222222",
    "FedDA": "#8fd19e", "Target only": "#8172b2",
}
_METRIC = {"acc": "accuracy (%)", "auc": "AUC (%)"}


def _clip_percent(ax: plt.Axes) -> None:
    """Keep a percentage axis within [0, 100] (a 95% t-interval of 2-3 trials can reach past both ends)."""
    lo, hi = ax.get_ylim()
    ax.set_ylim(max(lo, 0.0), min(hi, 100.0))


def row_color(row: str) -> str | None:
    """The colour of a paper row (None for others: matplotlib picks)."""
    return ROW_COLORS.get(row)


def _band(ax: plt.Axes, x: Sequence[float], mean: Sequence[float], ci: Sequence[float], label: str, color: Any) -> None:
    x, mean, ci = np.asarray(x, float), np.asarray(mean, float), np.nan_to_num(np.asarray(ci, float))
    line, = ax.plot(x, mean, marker="o", ms=3, label=label, color=color)
    ax.fill_between(x, mean - ci, mean + ci, alpha=0.15, color=line.get_color(), linewidth=0)


def curves_figure(curves: Mapping[str, pd.DataFrame], metrics: Sequence[str] = ("acc", "auc"), by: str = "row",
                  titles: Mapping[str, str] | None = None) -> tuple[plt.Figure, pd.DataFrame]:
    """Target metric against rounds (mean ± 95% CI band over trials), one column per data set of ``curves``
    (``{name: curves_table(...)}``) and one row per metric. Returns (figure, the long table drawn)."""
    names = list(curves)
    fig, axes = plt.subplots(len(metrics), len(names), figsize=(4.2 * len(names), 3.0 * len(metrics)), squeeze=False)
    drawn = []
    for j, name in enumerate(names):
        df = curves[name]
        for i, m in enumerate(metrics):
            ax = axes[i, j]
            for key, g in df.groupby(by, sort=False):
                if g[m].isna().all():
                    continue
                _band(ax, g["round"], g[m], g[f"{m}_ci"], str(key), row_color(str(key)))
            ax.set_xlabel("round")
            ax.set_ylabel(_METRIC[m])
            _clip_percent(ax)
            if i == 0:
                ax.set_title((titles or {}).get(name, name))
        drawn.append(df.assign(**{"data set": name}))
    handles, labels = axes[0, 0].get_legend_handles_labels()
    for ax in axes.flat[1:]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 4), bbox_to_anchor=(0.5, -0.02 - 0.03 * math.ceil(len(labels) / 4)))
    fig.tight_layout()
    table = pd.concat(drawn, ignore_index=True)
    return fig, table[["data set", *[c for c in table.columns if c != "data set"]]]


def ablation_figure(summary: pd.DataFrame, x: str, metrics: Sequence[str] = ("acc", "auc"), by: str = "row",
                    log_x: bool = False, title: str = "", paper: pd.DataFrame | None = None,
                    paper_metric: str = "auc") -> tuple[plt.Figure, pd.DataFrame]:
    """Final metric (mean ± 95% CI) against ``x`` per group ``by``, one panel per metric; ``paper`` (index =
    rows, columns = x values) adds the paper's curve of ``paper_metric`` dashed, on its own x values."""
    fig, axes = plt.subplots(1, len(metrics), figsize=(4.6 * len(metrics), 3.3), squeeze=False)
    for ax, m in zip(axes[0], metrics):
        for key, g in summary.groupby(by, sort=False):
            g = g.sort_values(x)
            ax.errorbar(g[x], g[m], yerr=np.nan_to_num(g[f"{m}_ci"].to_numpy(float)), marker="o", ms=4, capsize=3,
                        label=str(key), color=row_color(str(key)))
        if paper is not None and m == paper_metric:
            for row in paper.index:
                ax.plot([float(c) for c in paper.columns], paper.loc[row].to_numpy(float), ls="--", lw=1,
                        color=row_color(row), alpha=0.7, label=f"{row} (paper)")
        if log_x:
            from matplotlib.ticker import NullFormatter, ScalarFormatter

            ax.set_xscale("log")
            ax.set_xticks(sorted(set(summary[x].tolist())))
            ax.xaxis.set_major_formatter(ScalarFormatter())
            ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set_xlabel(x)
        ax.set_ylabel(_METRIC[m])
        _clip_percent(ax)
    axes[0, -1].legend(fontsize=7, loc="best")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig, summary.copy()


def beta_figure(summaries: Mapping[str, pd.DataFrame], metrics: Sequence[str] = ("acc", "auc")
                ) -> tuple[plt.Figure, pd.DataFrame]:
    """GP's final metric against β, one column per data set (``{name: summary with beta_paper and
    beta_library columns}``): the bottom axis in the paper's convention (Eq. 7, β on the target update), the
    top axis in the library's (β on the source part, β_library = 1 − β_paper)."""
    names = list(summaries)
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 3.4), squeeze=False)
    drawn = []
    for ax, name in zip(axes[0], names):
        g = summaries[name].sort_values("beta_paper")
        for m in metrics:
            ax.errorbar(g["beta_paper"], g[m], yerr=np.nan_to_num(g[f"{m}_ci"].to_numpy(float)), marker="o", ms=4,
                        capsize=3, label=_METRIC[m])
        ax.set_xlabel("β (paper, Eq. 7: weight of the target update)")
        ax.set_ylabel("%")
        _clip_percent(ax)
        ax.set_title(name)
        top = ax.secondary_xaxis("top", functions=(lambda b: 1 - b, lambda b: 1 - b))
        top.set_xlabel("β (library: weight of the source part) = 1 − β_paper")
        ax.legend(fontsize=7)
        drawn.append(g.assign(**{"data set": name}))
    fig.tight_layout()
    return fig, pd.concat(drawn, ignore_index=True)


def gain_figure(gains: pd.DataFrame, metric: str = "auc") -> tuple[plt.Figure, pd.DataFrame]:
    """Gain of AuxInfo over FedAvg Finetune (percentage points, mean ± 95% CI of the paired differences) per
    auxiliary task, one panel per data set (``gains``: columns data set, task, <metric>, <metric>_ci), as
    the paper's Fig. 4b."""
    names = list(dict.fromkeys(gains["data set"]))
    fig, axes = plt.subplots(1, len(names), figsize=(4.2 * len(names), 3.2), squeeze=False)
    for ax, name in zip(axes[0], names):
        g = gains[gains["data set"] == name]
        pos = np.arange(len(g))
        ax.bar(pos, g[metric], yerr=np.nan_to_num(g[f"{metric}_ci"].to_numpy(float)), capsize=3,
               color=[ROW_COLORS["FedAvg Finetune AuxInfo"]] * len(g))
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(pos, g["task"], rotation=20)
        ax.set_ylabel(f"{_METRIC[metric]} gain over FedAvg Finetune")
        ax.set_title(name)
    fig.tight_layout()
    return fig, gains.copy()


def theory_figure(table: pd.DataFrame) -> tuple[plt.Figure, pd.DataFrame]:
    """Δ²/σ² of the four rules at the measured d²/σ², one group per data set; the theory's best
    rule is the lowest bar, the rule that won the training runs is marked with a star."""
    rules = ["source_only", "fedda", "fedgp", "target_only"]
    names = {"source_only": "Source only", "fedda": "FedDA", "fedgp": "FedGP (GP)", "target_only": "Target only"}
    colors = {"source_only": "#4c72b0", "fedda": "#55a868", "fedgp": "#c44e52", "target_only": "#8172b2"}
    fig, ax = plt.subplots(figsize=(2.4 + 2.2 * len(table), 3.4))
    width = 0.2
    top = float(np.nanmax(table[[f"delta2/sigma2 {r}" for r in rules]].to_numpy(float)))
    for k, rule in enumerate(rules):
        vals = table[f"delta2/sigma2 {rule}"].to_numpy(float)
        pos = np.arange(len(table)) + (k - 1.5) * width
        ax.bar(pos, vals, width, label=names[rule], color=colors[rule])
        for p, v, won in zip(pos, vals, table["trained best"] == rule):
            if won:
                ax.plot(p, v + 0.06 * top, marker="*", ms=11, color="black")
    ax.set_xticks(np.arange(len(table)),
                  [f"{n}\nd²/σ² = {r:.3g}, τ̄² = {t:.2f}" for n, r, t in zip(table["data set"], table["ratio"], table["tau2"])])
    ax.set_ylabel("Δ² / σ² (theory, mean field)")
    ax.plot([], [], marker="*", ls="", color="black", label="won the training runs")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    return fig, table.copy()
