"""Figures of notebook 06 (paper Fig. 2, Fig. 3a, Fig. 15, Tables 5–6), drawn from
:func:`fda_core.experiments.translation.experiments.run_translation` records. Each function returns the figure (or
axes) and the table of exactly the numbers plotted, for :func:`fda_core.viz.plotting.save_figure`.

The ``figure_*`` functions draw one figure of the notebook each, titled from the resolved plan
(:func:`fda_core.experiments.translation.study.resolve_plan`); the ``plot_*`` functions draw into given axes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd

from ..experiments.paper_numbers import paper_value

__all__ = ["curve_table", "plot_wd_curves", "plot_translation_grid", "plot_objective_traces", "plot_iterations",
           "plot_iterations_by_option", "figure_variants", "figure_j", "figure_vw", "figure_grid", "figure_iterations",
           "figure_stargan"]


def curve_table(results: dict[str, dict]) -> pd.DataFrame:
    """Long table (run, depth, params, params_up, params_down, wd, wd_sem) of several records."""
    return pd.concat([pd.DataFrame(r["curve"]).assign(run=name) for name, r in results.items()], ignore_index=True)[
        ["run", "depth", "params", "params_up", "params_down", "wd", "wd_sem"]]


def plot_wd_curves(results: dict[str, dict], ax: plt.Axes | None = None, identity: float | None = None,
                   title: str | None = None) -> tuple[plt.Axes, pd.DataFrame]:
    """WD (held-out, mean over client pairs and digits) against parameters sent + received per client,
    one line per run, markers at each evaluated depth (paper Fig. 2). The x axis is symlog so that the
    starting point (0 parameters) shows."""
    ax = ax or plt.gca()
    table = curve_table(results)
    for name, t in table.groupby("run", sort=False):
        ax.errorbar(t.params, t.wd, yerr=t.wd_sem, marker="o", ms=3.5, capsize=2, lw=1.4, label=name)
    if identity is not None:
        ax.axhline(identity, color="grey", ls="--", lw=1, label="identity (no translation)")
    positive = table.params[table.params > 0]
    ax.set_xscale("symlog", linthresh=float(positive.min()) if len(positive) else 1.0)
    ax.set_xlim(left=0)  # parameters are never negative; the linear part of the scale holds the start at 0
    ax.set_xlabel("parameters transmitted per client (up + down, cumulative)")
    ax.set_ylabel("WD (held-out, squared-Euclidean OT cost)")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return ax, table


def plot_translation_grid(grid: dict, title: str | None = None) -> tuple[plt.Figure, pd.DataFrame]:
    """Originals from the source client, their translations to the target client, and the real target
    digits (the same digits rotated), as rows of 28×28 images (paper Fig. 3a). Table: one row per image
    with its label, row kind and mean intensity."""
    rows = [("original", np.asarray(grid["original"])), ("translated", np.asarray(grid["translated"])),
            ("real target", np.asarray(grid["target_real"]))]
    labels = np.asarray(grid["labels"])
    n = len(labels)
    per_row = min(n, 10)
    n_sub = int(np.ceil(n / per_row))
    fig, axes = plt.subplots(3 * n_sub, per_row, figsize=(per_row * 0.9, 3 * n_sub * 0.95))
    axes = np.atleast_2d(axes)
    recs = []
    for r, (kind, imgs) in enumerate(rows):
        for i in range(n):
            ax = axes[r * n_sub + i // per_row, i % per_row]
            ax.imshow(np.clip(imgs[i].reshape(28, 28), 0, 1), cmap="gray_r", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if i % per_row == 0:
                ax.set_ylabel(kind, fontsize=7)
            recs.append(dict(kind=kind, index=i, label=int(labels[i]), mean_intensity=float(imgs[i].mean())))
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    return fig, pd.DataFrame(recs)


def plot_objective_traces(results: dict[str, dict], digits=(0, 1, 2)) -> tuple[plt.Figure, pd.DataFrame]:
    """The max-K-SW objective through the Armijo iterations of every layer, concatenated over layers, one
    panel per digit (paper Fig. 15). The jumps down are where the 1-D barycenter maps aligned the data
    and a new Θ₀ was drawn."""
    fig, axes = plt.subplots(1, len(digits), figsize=(4.2 * len(digits), 3.4), squeeze=False)
    recs = []
    for ax, digit in zip(axes[0], digits):
        for name, r in results.items():
            tr = [t for t in r["traces"] if t["label"] == digit]
            tr.sort(key=lambda t: t["layer"])
            xs, ys, starts = [], [], []
            step = 0
            for t in tr:
                starts.append(step)
                for j, v in enumerate(t["trace"]):
                    xs.append(step)
                    ys.append(v)
                    recs.append(dict(run=name, digit=digit, layer=t["layer"], iteration=j, step=step, objective=v))
                    step += 1
            ax.plot(xs, ys, lw=1.2, label=name)
        ax.set_yscale("log")
        ax.set_xlabel("iteration (layers concatenated)")
        ax.set_title(f"digit {digit}", fontsize=10)
    axes[0, 0].set_ylabel("max-K-SW objective F(Θ)")
    axes[0, 0].legend(fontsize=7)
    fig.tight_layout()
    return fig, pd.DataFrame(recs)


def plot_iterations(table: pd.DataFrame, ax: plt.Axes | None = None, title: str | None = None) -> plt.Axes:
    """Armijo iterations (objective evaluations) per digit, one bar group per digit and run (Tables 5–6);
    ``table`` has columns digit, run, iterations."""
    ax = ax or plt.gca()
    runs = list(dict.fromkeys(table.run))
    digits = sorted(table.digit.unique())
    w = 0.8 / max(1, len(runs))
    for i, run in enumerate(runs):
        t = table[table.run == run].set_index("digit").reindex(digits)
        ax.bar(np.arange(len(digits)) + i * w, t.iterations, width=w, label=run)
    ax.set_xticks(np.arange(len(digits)) + 0.4 - w / 2, [str(d) for d in digits])
    ax.set_xlabel("digit")
    ax.set_ylabel("iterations incl. backtracking (L·J + extra)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=min(3, len(runs)), frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_iterations_by_option(table: pd.DataFrame, ax: plt.Axes | None = None, title: str | None = None) -> plt.Axes:
    """Mean Armijo iterations per digit for each Table-5 variant under each option set, with the paper's Table 5
    value as a black tick; ``table`` from :func:`fda_core.experiments.translation.tables.iterations_by_option`
    (columns variant, option, ours_mean, ours_min, ours_max, paper)."""
    ax = ax or plt.gca()
    variants = list(dict.fromkeys(table.variant))
    options = list(dict.fromkeys(table.option))
    w = 0.8 / max(1, len(options))
    for i, opt in enumerate(options):
        t = table[table.option == opt].set_index("variant").reindex(variants)
        x = np.arange(len(variants)) + i * w
        ax.bar(x, t.ours_mean, width=w, label=f"ours, {opt} option")
        ax.errorbar(x, t.ours_mean, yerr=[t.ours_mean - t.ours_min, t.ours_max - t.ours_mean], fmt="none",
                    ecolor="0.3", capsize=2, lw=1)
    paper = table.drop_duplicates("variant").set_index("variant").reindex(variants).paper
    centre = np.arange(len(variants)) + 0.4 - w / 2
    ax.scatter(centre, paper, marker="_", s=900, color="black", zorder=3, label="paper Table 5")
    ax.set_xticks(centre, variants)
    ax.set_ylabel("iterations per digit (mean; bars: min–max)")
    lo = float(np.nanmin([table.ours_min.min(), paper.min()]))
    ax.set_ylim(bottom=0.9 * lo)
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=3, frameon=False, markerscale=0.4)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


# ------------------------------------------------------------------------------------ notebook 06's figures
def _lkj(plan: Mapping[str, Any]) -> str:
    return f"L{plan['L']}-K{plan['K']}-J{plan['J']}"


def figure_variants(records: Mapping[str, dict], identity: float, plan: Mapping[str, Any]
                    ) -> tuple[plt.Figure, pd.DataFrame]:
    """Panel (a): WD against parameters for each variant (paper Fig. 2a)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    _, table = plot_wd_curves(records, ax, identity, f"(a) {' vs '.join(plan['variants'])}, {_lkj(plan)}")
    return fig, table


def figure_j(records: Mapping[str, dict], identity: float, plan: Mapping[str, Any]) -> tuple[plt.Figure, pd.DataFrame]:
    """Panel (b): the J sweep of the plan's variant (paper Fig. 2b)."""
    fig, ax = plt.subplots(figsize=(7, 4.2))
    _, table = plot_wd_curves(records, ax, identity, f"(b) {plan['variant']}-L{plan['L']}-K{plan['K']}, J sweep")
    return fig, table


def figure_vw(plain_vs_hist: Mapping[str, dict], v_runs: Mapping[str, Mapping[str, dict]], identity: float,
              plan: Mapping[str, Any]) -> tuple[plt.Figure, pd.DataFrame]:
    """Panels (c)-(e): with and without VW histograms, then one V sweep per histogram variant (paper Fig. 2c-e).
    Table: the curves with their ``panel`` (and, for the sweeps, ``variant``)."""
    fig, axes = plt.subplots(1, 1 + len(v_runs), figsize=(17 * (1 + len(v_runs)) / 3, 4.4))
    axes = np.atleast_1d(axes)
    _, t_c = plot_wd_curves(plain_vs_hist, axes[0], identity, f"(c) with and without VW histograms (V={plan['V']})")
    tables = [t_c.assign(panel="c")]
    for ax, (v, runs), p in zip(axes[1:], v_runs.items(), "defghij"):
        _, t = plot_wd_curves(runs, ax, identity, f"({p}) Hist {v}-{_lkj(plan)}: V sweep")
        tables.append(t.assign(panel=p, variant=v))
    fig.tight_layout()
    return fig, pd.concat(tables, ignore_index=True)


def figure_grid(record: dict, plan: Mapping[str, Any], pixel: bool = False) -> tuple[plt.Figure, pd.DataFrame]:
    """Translated digits of one run from the first to the last client (paper Fig. 3a)."""
    a = plan["angles"]
    title = (f"{record['name']} (pixel space)" if pixel else
             f"{record['name']}: client {a[0]:g}° → {a[-1]:g}° (rows: originals, translations, the real rotated digits)")
    return plot_translation_grid(record["grid"], title=title)


def figure_iterations(table: pd.DataFrame, plan: Mapping[str, Any], by_option: pd.DataFrame | None = None
                      ) -> plt.Figure:
    """Armijo iterations per digit and run, beside the paper's setting of Table 5; with ``by_option`` (from
    :func:`~fda_core.experiments.translation.tables.iterations_by_option`) a second panel: the mean per variant
    under each option set beside the paper's Table 5."""
    s = paper_value("setting")
    if by_option is None:
        fig, ax = plt.subplots(figsize=(8, 4.0))
    else:
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(14, 4.2), gridspec_kw=dict(width_ratios=[1.6, 1]))
        plot_iterations_by_option(by_option, ax2, "Table 5: reference vs library option (mean over digits)")
    plot_iterations(table, ax, f"Armijo iterations per digit (L={plan['L']}, J={plan['J']}); paper Table 5: "
                               f"L={s['L']}, J={s['J']}")
    fig.tight_layout()
    return fig


def figure_stargan(inb_runs: dict[str, dict], stargan_runs: dict[str, dict], identity: float | None, plan: dict,
                   metric: str = "wd", inb_fid: dict[str, tuple[int, float]] | None = None
                   ) -> tuple[plt.Figure, pd.DataFrame]:
    """FedStarGAN beside Fed INB (paper Fig. 2d and 4d). ``metric="wd"``: the INB runs' WD curves and the
    FedStarGAN runs' (records whose ``curve`` has depth = synchronisations, params, wd) on the same axes — held-out
    WD against parameters transmitted per client. ``metric="fid"``: FedStarGAN's FID against parameters, with
    ``inb_fid`` = {run: (parameters, FID)} points of the INB translators. Table: every point drawn."""
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    n = plan["n_train_per_class"]
    if metric == "wd":
        _, table = plot_wd_curves({**inb_runs, **stargan_runs}, ax, identity,
                                  title=f"Fed INB vs FedStarGAN (Rotated MNIST, n={n} per class and client)")
        table = table.assign(kind=["FedStarGAN" if r in stargan_runs else "Fed INB" for r in table.run])
    else:
        rows = []
        for name, r in stargan_runs.items():
            t = pd.DataFrame(r["curve"])
            ax.plot(t.params, t.wd, marker="o", ms=3.5, lw=1.4, label=name)
            rows += [dict(run=name, kind="FedStarGAN", params=p, fid=v) for p, v in zip(t.params, t.wd)]
        for name, (params, fid) in (inb_fid or {}).items():
            ax.plot([params], [fid], marker="D", ms=6, ls="none", label=name)
            rows.append(dict(run=name, kind="Fed INB", params=params, fid=fid))
        table = pd.DataFrame(rows)
        ax.set_xscale("log")
        ax.set_xlabel("parameters transmitted per client (up + down, cumulative)")
        ax.set_ylabel("FID (held-out, translated vs real target digits)")
        ax.legend(fontsize=7)
        ax.set_title("Fed INB vs FedStarGAN (FID)", fontsize=10)
    fig.tight_layout()
    return fig, table
