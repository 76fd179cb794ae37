"""Figures of the estimator checks (notebook 03): the tables of :mod:`fda_core.experiments.estimator_checks`
drawn as panels per quantity and source. Each function returns the figure (or axes) it drew."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from ..core.known_gradients import KnownGradientModel
from ..experiments.estimator_checks import QUANTITIES, QUANTITY_LABELS, bonferroni_z, estimator_draws

__all__ = ["plot_relative_means", "plot_z_scores", "plot_spread", "plot_clamping", "plot_auto_beta",
           "plot_estimator_spread", "draw_estimator_spread", "spread_layout"]


def _panels(table: pd.DataFrame) -> list[tuple[str, Any]]:
    keys = table[["quantity", "source"]].drop_duplicates()
    order = {q: i for i, q in enumerate(QUANTITIES)}
    keys = sorted(((q, s) for q, s in keys.itertuples(index=False)),
                  key=lambda t: (order[t[0]], -1 if pd.isna(t[1]) else int(t[1])))
    return keys


def _sel(table: pd.DataFrame, q: str, s: Any) -> pd.DataFrame:
    t = table[table.quantity == q]
    return t[t.source.isna()] if pd.isna(s) else t[t.source == s]


def _title(q: str, s: Any, n_sources: int) -> str:
    base = QUANTITY_LABELS[q]
    return base if (pd.isna(s) or n_sources <= 1) else f"{base}, source {int(s)}"


def _n_sources(table: pd.DataFrame) -> int:
    return int(table.source.dropna().nunique()) if "source" in table else 1


def plot_relative_means(table: pd.DataFrame, title: str | None = None, group: str = "n", row: str | None = None):
    """Monte-Carlo mean / truth with its confidence interval (error bars) against B (log₂ axis), one
    panel per quantity and source (columns) and per value of ``row`` (rows, optional), one line per
    value of ``group``; the dashed line at 1 is unbiased. ``table`` is an :func:`estimator_check` or
    :func:`estimator_check_over_pi` table. Returns the figure."""
    import matplotlib.pyplot as plt

    panels = _panels(table)
    n_sources = _n_sources(table)
    row_vals = [None] if row is None else sorted(table[row].dropna().unique())
    fig, axes = plt.subplots(len(row_vals), len(panels), figsize=(3.3 * len(panels), 2.9 * len(row_vals) + 0.4),
                             squeeze=False)
    groups = list(dict.fromkeys(table[group].dropna()))
    offsets = np.linspace(-0.15, 0.15, len(groups)) if len(groups) > 1 else [0.0]
    for r, rv in enumerate(row_vals):
        tr = table if rv is None else table[table[row] == rv]
        for ax, (q, s) in zip(axes[r], panels):
            t = _sel(tr, q, s)
            for off, g in zip(offsets, groups):
                tg = t[t[group] == g].sort_values("B")
                if tg.empty:
                    continue
                rel = tg["mean"] / tg["truth"]
                err = [rel - tg["ci_low"] / tg["truth"], tg["ci_high"] / tg["truth"] - rel]
                avg = isinstance(g, str) and g.startswith("average")
                ax.errorbar(np.log2(tg.B.astype(float)) + off, rel, yerr=err, fmt="s-" if avg else "o-",
                            ms=5 if avg else 3.5, capsize=2, lw=2 if avg else 0.8, color="k" if avg else None,
                            label=f"{group}={g}" if group != "point" else str(g))
            ax.axhline(1.0, color="0.3", lw=1, ls="--")
            bs = sorted(t.B.unique())
            ax.set_xticks(np.log2(bs), [str(b) for b in bs])
            ax.set_title(_title(q, s, n_sources) + ("" if rv is None else f" (n={rv})"), fontsize=9)
            if r == len(row_vals) - 1:
                ax.set_xlabel("B (target parts)")
        axes[r][0].set_ylabel("mean / truth (± CI)")
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_z_scores(table: pd.DataFrame, label: str = "model", title: str | None = None, ax=None):
    """z = (mean − truth)/stderr of every row of a check table, grouped by ``label`` and quantity,
    with the band ±z_crit of its simultaneous confidence intervals (a row outside = truth not
    covered). Unbiased estimators give z ≈ N(0, 1). Returns the axes."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    colors = {"sigma2": "#4c72b0", "d2": "#55a868", "tau2d2": "#c44e52"}
    labels = list(dict.fromkeys(table[label])) if label in table else [None]
    x0, ticks = 0, []
    for lab in labels:
        t = table if lab is None else table[table[label] == lab]
        start = x0
        for q in QUANTITIES:
            tq = t[t.quantity == q]
            xs = np.arange(x0, x0 + len(tq))
            ax.plot(xs, tq["z"], "o", ms=3, color=colors[q],
                    label=QUANTITY_LABELS[q] if lab == labels[0] else None)
            x0 += len(tq)
        ticks.append(((start + x0 - 1) / 2, str(lab) if lab is not None else ""))
        ax.axvline(x0 - 0.5, color="0.6", lw=0.8)
    z = float(table["z_crit"].iloc[0])
    ax.axhspan(-z, z, color="0.9", zorder=0, label=f"±{z:.2f}: simultaneous {float(table['level'].iloc[0]):.0%} CI")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=8)
    ax.set_ylabel("z = (mean − truth) / stderr")
    ax.set_xlim(-1, x0)
    ax.set_ylim(-z - 0.8, z + 1.6)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    n_cov = int(table["covered"].sum())
    ax.set_title(title or f"every estimate vs its truth: {n_cov} of {len(table)} intervals cover the truth", fontsize=10)
    return ax


def _plain_log_axis(ax) -> None:
    """Log y axis labelled 0.2, 0.3, ... instead of 2×10⁻¹ (minor labels small)."""
    import matplotlib.ticker as mticker

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(mticker.FormatStrFormatter("%g"))
    ax.tick_params(axis="y", which="minor", labelsize=7)


def plot_spread(table: pd.DataFrame, title: str | None = None):
    """Relative standard deviation std/truth of each raw estimator against B (log₂), one line per n,
    log y; dashed: the exact Gaussian std (``std_theory``) where available. Returns the figure."""
    import matplotlib.pyplot as plt

    panels = _panels(table)
    ns = _n_sources(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.3), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (q, s) in zip(axes[0], panels):
        t = _sel(table, q, s)
        for c, nn in zip(colors * 4, sorted(t.n.unique())):
            tn = t[t.n == nn].sort_values("B")
            ax.plot(np.log2(tn.B), tn["rel_std"], "o-", color=c, ms=4, lw=1, label=f"n={nn}")
            if tn["std_theory"].notna().any():
                ax.plot(np.log2(tn.B), tn["std_theory"] / tn["truth"].abs(), "--", color=c, lw=1)
        bs = sorted(t.B.unique())
        ax.set_xticks(np.log2(bs), [str(b) for b in bs])
        _plain_log_axis(ax)
        ax.set_xlabel("B (target parts)")
        ax.set_title(_title(q, s, ns), fontsize=9)
    exact = "std_theory" in table and table["std_theory"].notna().any()
    axes[0][0].set_ylabel("std / truth" + (" (dashed: exact)" if exact else ""))
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_clamping(table: pd.DataFrame, title: str | None = None):
    """Bias / truth of the raw estimate (circles, ± CI) and of the estimate clamped at 0 (crosses)
    against B, one colour per n, and the share of negative draws (bars, right axis). Returns the figure."""
    import matplotlib.pyplot as plt

    panels = _panels(table)
    ns = _n_sources(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    n_vals = sorted(table.n.unique())
    width = 0.8 / max(1, len(n_vals))
    for ax, (q, s) in zip(axes[0], panels):
        t = _sel(table, q, s)
        ax2 = ax.twinx()
        for j, (c, nn) in enumerate(zip(colors * 4, n_vals)):
            tn = t[t.n == nn].sort_values("B")
            xs = np.log2(tn.B) + (j - (len(n_vals) - 1) / 2) * width
            ax2.bar(xs, tn["frac_negative"], width=width, color=c, alpha=0.25)
            ax.errorbar(xs, tn["bias"] / tn["truth"], yerr=(tn["mean"] - tn["ci_low"]) / tn["truth"], fmt="o",
                        ms=4, color=c, capsize=2, label=f"n={nn}: raw")
            ax.plot(xs, tn["clamped_bias"] / tn["truth"], "x", ms=7, mew=2, color=c, label=f"n={nn}: clamped at 0")
        ax.axhline(0.0, color="k", lw=1, ls="--")
        ax2.set_ylim(0, 1)
        ax2.grid(False)
        ax2.tick_params(labelsize=7)
        bs = sorted(t.B.unique())
        ax.set_xticks(np.log2(bs), [str(b) for b in bs])
        ax.set_xlabel("B (target parts)")
        ax.set_title(_title(q, s, ns), fontsize=9)
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
    axes[0][0].set_ylabel("bias / truth")
    ax2.set_ylabel("share of negative draws (bars)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2 * len(n_vals), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_auto_beta(table: pd.DataFrame, title: str | None = None, ax=None):
    """Boxes of the estimated auto β per B (box q25–q75, whiskers q05–q95, white line median, dot
    mean) against the optimal β (horizontal line), one colour per (rule, source). ``table`` is an
    :func:`auto_beta_check` table. Returns the axes."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(table[["rule", "source"]].drop_duplicates().itertuples(index=False))
    bs = sorted(table.B.unique())
    width = 0.7 / max(1, len(keys))
    for j, (c, (r, s)) in enumerate(zip(colors * 4, keys)):
        t = table[(table.rule == r) & (table.source == s)].sort_values("B")
        xs = np.log2(t.B.astype(float)).to_numpy() + (j - (len(keys) - 1) / 2) * width
        lab = f"{'FedGP' if r == 'fedgp' else 'FedDA'}" + (f", source {s}" if table.source.nunique() > 1 else "")
        for x0, (_, row) in zip(xs, t.iterrows()):
            ax.add_patch(plt.Rectangle((x0 - width * 0.4, row.beta_q25), width * 0.8, row.beta_q75 - row.beta_q25,
                                       color=c, alpha=0.5))
            ax.plot([x0, x0], [row.beta_q05, row.beta_q95], color=c, lw=1)
            ax.plot([x0 - width * 0.4, x0 + width * 0.4], [row.beta_q50] * 2, color="w", lw=1.5)
        ax.plot(xs, t.beta_mean, "o", color=c, ms=4, label=f"{lab}: estimated β (mean)")
        opt = float(t.beta_optimal.iloc[0])
        ax.axhline(opt, color=c, ls="--", lw=1.2, label=f"{lab}: optimal β* = {opt:.2f}")
    ax.set_xticks(np.log2(bs), [str(b) for b in bs])
    ax.set_xlim(np.log2(min(bs)) - 0.6, np.log2(max(bs)) + 0.6)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("B (target parts)")
    ax.set_ylabel("β (weight of the source part)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def spread_layout(model: KnownGradientModel) -> tuple[int, int, int]:
    """(panels, rows, columns) of the estimator histograms of ``model``: one panel for σ² and two per source
    (d², τ²d²), at most three per row so that titles stay readable at a notebook's width."""
    n_panels = 1 + 2 * int(model.source_grads.shape[0])
    ncols = min(3, n_panels)
    return n_panels, math.ceil(n_panels / ncols), ncols


def draw_estimator_spread(fig, axes, model: KnownGradientModel, B: int, n: int, n_draws: int = 2000, seed: int = 0,
                          level: float = 0.95, title: str | None = None) -> pd.DataFrame:
    """Draw the histograms of :func:`plot_estimator_spread` into existing ``axes`` (one per panel, cleared
    first) of ``fig``; returns the draws. The slider panel redraws its persistent figure with this."""
    draws = estimator_draws(model, B, n, n_draws, seed)
    panels = _panels(draws)
    ns = _n_sources(draws)
    z = bonferroni_z(len(panels), level)
    for ax, (q, s) in zip(axes, panels):
        ax.cla()
        t = _sel(draws, q, s)
        x = t.estimate.to_numpy()
        truth = float(t.truth.iloc[0])
        mean, se = x.mean(), x.std(ddof=1) / math.sqrt(len(x))
        ax.hist(x, bins=50, color="#4c72b0", alpha=0.6)
        lo = min(x.min(), 0.0)
        if lo < 0:
            ax.axvspan(lo, 0.0, color="0.85", zorder=0)
        ax.axvspan(mean - z * se, mean + z * se, color="#c44e52", alpha=0.35, label=f"mean ± {z:.2f} s.e.")
        ax.axvline(mean, color="#c44e52", lw=1.5)
        ax.axvline(truth, color="k", lw=1.5, ls="--", label="truth")
        ax.axvline(float(t.clamped.mean()), color="#dd8452", lw=1.5, ls=":", label="mean clamped at 0")
        ax.set_title(_title(q, s, ns), fontsize=10)
        ax.set_xlabel("estimate")
        ax.set_yticks([])
    axes[0].legend(fontsize=8)
    fig.suptitle(title or f"raw estimates over {n_draws} target sets: B = {B} parts of n = {n} points", fontsize=11)
    return draws


def plot_estimator_spread(model: KnownGradientModel, B: int, n: int, n_draws: int = 2000, seed: int = 0,
                          level: float = 0.95, title: str | None = None):
    """Histograms of the raw estimates at one (B, n) (:func:`estimator_draws`): the truth (black), the
    Monte-Carlo mean with its ``level`` confidence interval (red band, per-panel z), the mean of the
    estimate clamped at 0 (orange) and the negative region (grey); at most three panels per row
    (:func:`spread_layout`). Returns ``(fig, draws)``, the figure and the DataFrame of the draws plotted. The
    slider panel :func:`fda_core.viz.widgets.estimator_explorer` draws the same histograms
    (:func:`draw_estimator_spread`) into its own figure."""
    import matplotlib.pyplot as plt

    n_panels, nrows, ncols = spread_layout(model)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.6 * ncols, 2.9 * nrows), squeeze=False)
    axes = axes.ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)
    draws = draw_estimator_spread(fig, axes[:n_panels], model, B, n, n_draws, seed, level, title)
    fig.tight_layout()
    return fig, draws
