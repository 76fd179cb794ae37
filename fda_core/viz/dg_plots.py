"""Figures of notebook 08 (Fed INB paper Sec. 4.3, Tables 1–4, Fig. 14): the Table-3 analogue beside the paper,
accuracy-vs-iteration curves, the images the regularisers compare, and accuracy against communication. Each
function returns the figure and the table of exactly the numbers drawn, for
:func:`fda_core.viz.plotting.save_figure`; the tables come from
:mod:`fda_core.experiments.translation.dg_study`."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

__all__ = ["METHOD_COLORS", "figure_table3", "figure_curves", "figure_views", "figure_accuracy_vs_communication"]

#: one colour per method label (FedAvg grey, FedDIRT blue, the shared-space variant orange)
METHOD_COLORS = {"FedAvg": "#7f7f7f", "FedDIRT": "#1f77b4", "FedDIRT (shared space)": "#ff7f0e"}


def _color(label: str, i: int) -> str:
    base = label.split(" (λ")[0]
    return METHOD_COLORS.get(label, METHOD_COLORS.get(base, f"C{i + 2}"))


def figure_table3(long: pd.DataFrame, title: str | None = None) -> tuple[plt.Figure, pd.DataFrame]:
    """Accuracy on each unseen domain (one panel each, the paper's test on the training digits) per
    synchronisation period: bars = our mean ± std over runs per method, hollow diamonds = the paper's mean ± std
    for the matching row (paper Tables 1–4)."""
    t = long[~long.domain.str.endswith("held-out")].reset_index(drop=True)
    domains = list(dict.fromkeys(t.domain))
    methods = list(dict.fromkeys(t.method))
    periods = sorted(t.period.unique())
    fig, axes = plt.subplots(1, len(domains), figsize=(4.6 * len(domains), 3.6), squeeze=False)
    width = 0.8 / max(len(methods), 1)
    for ax, dom in zip(axes[0], domains):
        d = t[t.domain == dom]
        for i, m in enumerate(methods):
            g = d[d.method == m].set_index("period").reindex(periods)
            x = np.arange(len(periods)) + (i - (len(methods) - 1) / 2) * width
            ax.bar(x, g["mean"], width * 0.9, yerr=g["std"].fillna(0), capsize=2, color=_color(m, i), label=m)
            if g.paper_mean.notna().any():
                ax.errorbar(x, g.paper_mean, yerr=g.paper_std, fmt="D", mfc="white", mec="black", ecolor="black",
                            ms=5, capsize=2, lw=0.8, label=f"paper ({m})" if dom == domains[0] else None)
        ax.set_xticks(np.arange(len(periods)), [f"every {p}" for p in periods])
        ax.set_xlabel("synchronisation period (mini-batches)")
        ax.set_ylabel(f"accuracy at {dom}° (%)")
        ax.set_ylim(0, 100)
        ax.set_title(f"unseen domain {dom}°", fontsize=10)
    axes[0][0].legend(fontsize=7, loc="lower left")
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig, t


def figure_curves(curves: pd.DataFrame, title: str | None = None) -> tuple[plt.Figure, pd.DataFrame]:
    """Accuracy of the server's model on each unseen domain (rows) against the iteration, one panel per
    synchronisation period (columns), one line per method: mean over runs with a ±1 std band (paper Fig. 14).
    Table: the means and stds drawn."""
    t = curves[~curves.domain.str.endswith("held-out")]
    agg = (t.groupby(["method", "period", "domain", "iteration"], sort=False).accuracy
           .agg(["mean", "std", "count"]).reset_index())
    domains = list(dict.fromkeys(agg.domain))
    periods = sorted(agg.period.unique())
    methods = list(dict.fromkeys(agg.method))
    fig, axes = plt.subplots(len(domains), len(periods), figsize=(3.6 * len(periods), 2.9 * len(domains)),
                             squeeze=False, sharey="row")
    for r, dom in enumerate(domains):
        for c, period in enumerate(periods):
            ax = axes[r][c]
            for i, m in enumerate(methods):
                g = agg[(agg.domain == dom) & (agg.period == period) & (agg.method == m)]
                if g.empty:
                    continue
                ax.plot(g.iteration, g["mean"], color=_color(m, i), lw=1.4, label=m)
                sd = g["std"].fillna(0)
                ax.fill_between(g.iteration, g["mean"] - sd, g["mean"] + sd, color=_color(m, i), alpha=0.15, lw=0)
            ax.set_title(f"{dom}°, FedAvg every {period}", fontsize=9)
            ax.set_xlabel("iteration (mini-batches per client)")
            if c == 0:
                ax.set_ylabel("accuracy (%)")
    handles = {}
    for ax in axes.flat:  # one legend for every method, whichever panels it appears in
        for h, lab in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(lab, h)
    axes[0][0].legend(list(handles.values()), list(handles), fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig, agg


def figure_views(x: np.ndarray, translated: np.ndarray, shared: np.ndarray | None, real: np.ndarray,
                 labels: np.ndarray, angles: list[float], client: int = 0) -> tuple[plt.Figure, pd.DataFrame]:
    """What the regularisers compare for a few digits of one client: the digit, its translations
    f_{m→m'}(x) to every other client's domain (FedDIRT), its shared-space image S_m(x) (the shared-space
    variant), and the same digit really rotated to each other domain. x, shared: (n, 784); translated, real:
    (M, n, 784) (row m' = to domain m'). Table: per image its row, column, label and mean intensity."""
    n = x.shape[0]
    others = [m for m in range(len(angles)) if m != client]
    rows = [(f"client {angles[client]:g}°", x)]
    rows += [(f"f to {angles[m]:g}°", translated[m]) for m in others]
    if shared is not None:
        rows.append(("shared space S(x)", shared))
    rows += [(f"real {angles[m]:g}°", real[m]) for m in others[-1:]]
    fig, axes = plt.subplots(len(rows), n, figsize=(n * 0.8, len(rows) * 0.85), squeeze=False)
    recs = []
    for r, (name, imgs) in enumerate(rows):
        for i in range(n):
            ax = axes[r][i]
            ax.imshow(np.clip(np.asarray(imgs[i]).reshape(28, 28), 0, 1), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if i == 0:
                ax.set_ylabel(name, fontsize=6, rotation=0, ha="right", va="center")
            recs.append(dict(row=name, index=i, label=int(labels[i]), mean_intensity=float(np.mean(imgs[i]))))
    fig.tight_layout()
    return fig, pd.DataFrame(recs)


def figure_accuracy_vs_communication(long: pd.DataFrame, comm: pd.DataFrame) -> tuple[plt.Figure, pd.DataFrame]:
    """Accuracy on each unseen domain against the parameters each client transmitted (training exchanges plus,
    for the translator-based methods, the translator's fit and distribution), one point per method and period
    (annotated with the period). Table: the points drawn."""
    t = long[~long.domain.str.endswith("held-out")].merge(comm[["method", "period", "total_params"]],
                                                          on=["method", "period"])
    domains = list(dict.fromkeys(t.domain))
    fig, axes = plt.subplots(1, len(domains), figsize=(4.4 * len(domains), 3.3), squeeze=False)
    for ax, dom in zip(axes[0], domains):
        d = t[t.domain == dom]
        for i, (m, g) in enumerate(d.groupby("method", sort=False)):
            g = g.sort_values("total_params")
            ax.errorbar(g.total_params, g["mean"], yerr=g["std"].fillna(0), marker="o", ms=4, capsize=2,
                        color=_color(m, i), label=m)
            for _, r in g.iterrows():
                ax.annotate(f"{r.period}", (r.total_params, r["mean"]), fontsize=6, xytext=(3, 3),
                            textcoords="offset points")
        ax.set_xscale("log")
        ax.set_xlabel("parameters transmitted per client")
        ax.set_ylabel(f"accuracy at {dom}° (%)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    return fig, t[["method", "period", "domain", "total_params", "mean", "std"]]
