"""One plotting style and one way to save a figure: PNG + PDF + the CSV of exactly the numbers plotted.

``docs/architecture.md`` § Conventions: ``figures/<notebook stem>/<name>.{png,pdf,csv}``.
"""

from __future__ import annotations

import os
from pathlib import Path

from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap

from ..common.files import atomic_write, write_table
from ..experiments.methods import get_method, list_methods

__all__ = ["method_color", "method_display", "set_style", "use_bundled_fonts", "save_figure", "plot_phase_diagram",
           "plot_delta_curves", "theory_panels", "plot_mc_vs_formula", "plot_cell_grid",
           "plot_training_curves", "plot_method_bars", "plot_beta_curves", "plot_beta_grid", "plot_accuracy_vs_shift"]

#: One colour per method (canonical name), shared by every figure; variants of a method that tables show
#: side by side get their own (keyed by spec). Labels always come from the method registry.
_COLORS = {
    "source_only": "#4c72b0",
    "fedda": "#55a868",
    "fedgp": "#c44e52",
    "target_only": "#8172b2",
    "fedda_auto": "#8fd19e",
    "fedgp_auto": "#f28e8e",
    "finetune_offline": "#64b5cd",
    "oracle": "#222222",
    "fedgp(beta=1.0)": "#937860",
    "fedgp(projection='cosine')": "#dd8452",
    "fedgp(filter=False)": "#da8bc3",
}


def _method(key: str) -> Any:
    """The method a figure key names: a registered name, a spec (``"fedgp(beta=1.0)"``) or a display label
    (``"FedGP (β=1)"``); None when it names no method."""
    try:
        return get_method(key)
    except ValueError:
        pass
    for spec in [*list_methods(), *_COLORS]:
        try:
            m = get_method(spec)
        except ValueError:
            continue
        if m.display_label == key:
            return m
    if isinstance(key, str) and " (" in key:  # a variant's label, "FedDA (β=0.2)": its method's colour
        base = key.split(" (", 1)[0]
        for name in list_methods():
            if get_method(name).label == base:
                return get_method(name)
    return None


def method_color(key: str) -> str | None:
    """The colour of a method given by name, spec or display label (its base method's colour for other
    variants; None for unknown keys, which lets matplotlib pick)."""
    m = _method(key)
    if m is None:
        return None
    return _COLORS.get(m.spec, _COLORS.get(m.name))


def method_display(key: str) -> str:
    """The display label of a method given by name, spec or label (the key itself when it names none)."""
    try:
        return get_method(key).display_label  # a name or a spec
    except ValueError:
        return key  # already a label (or no method)


def set_style() -> None:
    """The workbook's seaborn style (white grid, paper context), drawn with matplotlib's own fonts
    (:func:`use_bundled_fonts`)."""
    import seaborn as sns

    use_bundled_fonts()
    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)


_BUNDLED_FIRST: list[Any] | None = None  # the font list as use_bundled_fonts left it


def use_bundled_fonts() -> None:
    """Make every font lookup prefer the files matplotlib ships (``mpl-data/fonts/ttf``: DejaVu, STIX, Computer
    Modern) over system copies of the same families, so figures do not depend on the machine's fonts.

    Why (``docs/architecture.md`` § Conventions, byte-identical figures): matplotlib's font list is cached per user
    and shared by every environment with the same matplotlib version. A system copy of a bundled family (Debian's
    fonts-dejavu-core, a newer DejaVu) ties with the bundled one, and the first one listed wins, so the font drawn
    depended on which environment had built the cache and whether it still existed. The two DejaVu versions number
    some glyphs differently, and a PDF's font-subset tag is a hash of those numbers: notebook 05's ``beta_sweep.pdf``
    came out with a different tag from one day to the next. Listing the bundled files first makes every tie go to
    them. Idempotent; only public matplotlib API (``addfont``, ``ttflist``)."""
    global _BUNDLED_FIRST
    from matplotlib import font_manager

    manager = font_manager.fontManager
    if _BUNDLED_FIRST is not None and manager.ttflist is _BUNDLED_FIRST:
        return
    folder = Path(matplotlib.get_data_path(), "fonts", "ttf").resolve()
    others = [f for f in manager.ttflist if Path(f.fname).resolve().parent != folder]
    manager.ttflist = list(others)
    for path in sorted(folder.glob("*.ttf")):  # appended, and addfont empties findfont's cache
        manager.addfont(str(path))
    manager.ttflist = manager.ttflist[len(others):] + others
    _BUNDLED_FIRST = manager.ttflist


def save_figure(fig: plt.Figure, out_dir: str | os.PathLike, name: str, data: pd.DataFrame | None = None,
                note: str | None = None) -> list[Path]:
    """Save ``fig`` as ``out_dir/name.png`` and ``.pdf`` (and ``data`` as ``name.csv``), atomically.

    ``note`` (the setting and how it differs from the paper's) goes in the CSV's first comment lines.
    PDFs carry no creation date so the same seed gives byte-identical files, and text is drawn with matplotlib's own
    font files (:func:`use_bundled_fonts`; :func:`set_style` has already done so in every notebook).
    """
    use_bundled_fonts()
    out = Path(out_dir)
    written = [
        atomic_write(out / f"{name}.png", lambda tmp: fig.savefig(tmp, format="png", dpi=150, bbox_inches="tight")),
        atomic_write(out / f"{name}.pdf", lambda tmp: fig.savefig(tmp, format="pdf", bbox_inches="tight",
                                                                  metadata={"CreationDate": None, "ModDate": None})),
    ]
    if data is not None:
        written.append(write_table(out / f"{name}.csv", data, note))
    return written


def plot_phase_diagram(names: np.ndarray, d: np.ndarray, sigma: np.ndarray, ax: plt.Axes | None = None,
                       title: str | None = None, squared: bool = False) -> plt.Axes:
    """Draw a best-rule map: ``names`` (len(sigma), len(d)) rule names on a d (x) × σ (y) grid."""
    ax = ax or plt.gca()
    present = set(np.asarray(names).flatten())
    rules = [r for r in _COLORS if r in present] + sorted(present - set(_COLORS))
    index = {r: i for i, r in enumerate(rules)}
    codes = np.vectorize(index.get)(names) if len(rules) else np.zeros(np.shape(names))
    x = np.asarray(d) ** 2 if squared else np.asarray(d)
    y = np.asarray(sigma) ** 2 if squared else np.asarray(sigma)
    ax.pcolormesh(x, y, codes, cmap=ListedColormap([method_color(r) or "#999999" for r in rules]), vmin=-0.5,
                  vmax=len(rules) - 0.5, shading="nearest")
    handles = [plt.Rectangle((0, 0), 1, 1, color=method_color(r) or "#999999") for r in rules]
    ax.legend(handles, [method_display(r) for r in rules], loc="upper left", fontsize=8, framealpha=0.9)
    ax.set_xlabel("source–target distance d²" if squared else "source–target distance d")
    ax.set_ylabel("target variance σ²" if squared else "target standard deviation σ")
    if title:
        ax.set_title(title)
    return ax


def plot_delta_curves(betas: np.ndarray, curves: dict[str, np.ndarray], optimal: dict[str, float] | None = None,
                      ax: plt.Axes | None = None, title: str | None = None) -> plt.Axes:
    """Δ²(β) curves, one per rule, with the optimal β of each marked."""
    ax = ax or plt.gca()
    for rule, values in curves.items():
        ax.plot(betas, values, color=method_color(rule), label=method_display(rule))
        if optimal and rule in optimal:
            b = optimal[rule]
            ax.plot([b], [np.interp(b, betas, values)], "o", color=method_color(rule))
            ax.axvline(b, color=method_color(rule), ls=":", lw=1)
    ax.set_xlabel("β (weight of the source part)")
    ax.set_ylabel("Delta error Δ²")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax


def theory_panels(
    beta: float = 0.5,
    delta_bar: float = 1.0,
    tau2: float = 0.5,
    m: float = 10,
    grid_max: float = 3.0,
    include_auto: bool = False,
    sigma2_point: float = 1.0,
    d2_point: float = 2.0,
    grid_points: int = 121,
):
    """The two theory panels side by side: best rule by closed-form Δ² on a (d, σ) grid (FedGP paper
    Fig. 2 left) and Δ²(β) of FedDA/FedGP at one point (σ², d²) with the optimal β marked.

    Returns ``(fig, tables)`` with ``tables = {"phase_diagram_theory": DataFrame(d, sigma, best_rule),
    "delta_vs_beta": DataFrame(beta, fedda, fedgp, ...)}``, the numbers plotted. The slider panel of
    :func:`fda_core.viz.widgets.theory_explorer` redraws exactly this figure.
    """
    from ..core import theory

    rules = list(theory.THEORY_RULES) + (["fedda_auto", "fedgp_auto"] if include_auto else [])
    d = np.linspace(0, grid_max, grid_points)[1:]
    sigma = np.linspace(0, grid_max, grid_points)[1:]
    best = theory.phase_diagram_theory(d[None, :], sigma[:, None], beta, delta_bar, tau2, m, rules=rules)
    betas = np.linspace(0, 1, 201)
    curves = {
        "fedda": theory.delta_fedda(sigma2_point, d2_point, betas),
        "fedgp": theory.delta_fedgp(sigma2_point, d2_point, betas, delta_bar, tau2, m),
    }
    optimal = {
        "fedda": theory.optimal_beta_fedda(sigma2_point, d2_point),
        "fedgp": theory.optimal_beta_fedgp(sigma2_point, tau2 * d2_point, m, delta_bar),
    }
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.4))
    plot_phase_diagram(best, d, sigma, ax=ax1, title=f"Best rule by Δ² (β={beta:g}, δ̄={delta_bar:g}, τ̄²={tau2:g}, m={m:g})")
    plot_delta_curves(betas, curves, optimal, ax=ax2, title=f"Δ²(β) at σ²={sigma2_point:g}, d²={d2_point:g}")
    ax2.axhline(sigma2_point, color=method_color("target_only"), ls="--", lw=1, label="target only")
    ax2.axhline(d2_point, color=method_color("source_only"), ls="--", lw=1, label="source only")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    dd, ss = np.meshgrid(d, sigma)
    tables = {
        "phase_diagram_theory": pd.DataFrame({"d": dd.ravel(), "sigma": ss.ravel(), "best_rule": best.ravel()}),
        "delta_vs_beta": pd.DataFrame({"beta": betas, **curves,
                                       "fedda_optimal_beta": optimal["fedda"], "fedgp_optimal_beta": optimal["fedgp"]}),
    }
    return fig, tables


def plot_mc_vs_formula(table: pd.DataFrame, ax: plt.Axes | None = None, rules: tuple[str, ...] = ("fedda", "fedgp"),
                       x: str = "beta", title: str | None = None, extra: str | None = "projected") -> plt.Axes:
    """Monte-Carlo Δ² (points, ±2 standard errors) against the closed form (lines) for each rule,
    from a :func:`fda_core.experiments.delta_checks.delta_check` table; ``extra`` draws another formula column dashed."""
    ax = ax or plt.gca()
    for rule in rules:
        t = table[table.rule == rule].sort_values(x)
        if t.empty:
            continue
        c = method_color(rule)
        ax.plot(t[x], t.formula, "-", color=c, label=f"{method_display(rule)}: formula")
        if extra and extra in t and t[extra].notna().any():
            ax.plot(t[x], t[extra], "--", color=c, lw=1, label=f"{method_display(rule)}: with true projected noise")
        ax.errorbar(t[x], t.mc_mean, yerr=2 * t.mc_stderr, fmt="o", ms=4, color=c, capsize=3,
                    label=f"{method_display(rule)}: Monte Carlo ±2 s.e.")
    ax.set_xlabel("β (weight of the source part)" if x == "beta" else x)
    ax.set_ylabel("Delta error Δ²")
    ax.legend(fontsize=7)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_cell_grid(cells: pd.DataFrame, column: str, ax: plt.Axes | None = None, title: str | None = None) -> plt.Axes:
    """Best rule per measured cell of a (shift level × subset size) grid, one colour per rule.

    ``cells`` has one row per cell with ``shift_index``, ``size_index``, ``d`` and ``sigma`` (measured at
    the initialisation) and the rule names in ``column``. The x axis orders shift levels (labelled with
    their measured d), the y axis subset sizes (labelled with their measured σ, growing upwards), as in the papers' figure.
    Methods may be given by name, spec or display label; each gets its method's colour.
    """
    ax = ax or plt.gca()
    shifts = sorted(cells.shift_index.unique())
    sizes = sorted(cells.size_index.unique())
    rules = list(dict.fromkeys(cells[column]))
    order = {method_color(r): i for i, r in enumerate(_COLORS)}
    rules.sort(key=lambda r: order.get(method_color(r), len(order)))
    index = {r: i for i, r in enumerate(rules)}
    grid = np.full((len(sizes), len(shifts)), np.nan)
    for _, c in cells.iterrows():
        grid[sizes.index(c.size_index), shifts.index(c.shift_index)] = index[c[column]]
    ax.pcolormesh(np.arange(len(shifts)), np.arange(len(sizes)), grid, shading="nearest",
                  cmap=ListedColormap([method_color(r) or "#999999" for r in rules]), vmin=-0.5, vmax=len(rules) - 0.5)
    d_lab = cells.groupby("shift_index").d.mean().reindex(shifts)
    s_lab = cells.groupby("size_index").sigma.mean().reindex(sizes)
    ax.set_xticks(range(len(shifts)), [f"{v:.2g}" for v in d_lab], rotation=45, fontsize=7)
    ax.set_yticks(range(len(sizes)), [f"{v:.2g}" for v in s_lab], fontsize=7)
    ax.invert_yaxis()  # the smallest subset (largest σ) on top, as σ grows upwards in the theory panel
    ax.set_xlabel("source–target distance d (by shift level)")
    ax.set_ylabel("target std σ (by subset size)")
    handles = [plt.Rectangle((0, 0), 1, 1, color=method_color(r) or "#999999") for r in rules]
    ax.legend(handles, [method_display(r) for r in rules], loc="upper left", fontsize=7, framealpha=0.9)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_training_curves(result, shift_index: int, size_index: int, trial: int = 0,
                         methods: list[str] | None = None, ax: plt.Axes | None = None) -> tuple[plt.Axes, pd.DataFrame]:
    """Target test-loss curves of every method in one cell of a :class:`fda_core.experiments.phase_diagram.GridResult`
    (log scale; auto-weighted methods dashed). Returns the axes and the long table plotted
    (method, step, test_loss)."""
    ax = ax or plt.gca()
    table = result.table
    methods = list(methods or table["method"].unique())
    rows = []
    for mth in methods:
        steps, loss = result.curve(shift_index, size_index, mth, trial=trial)
        m = _method(mth)
        ax.plot(steps, loss, label=method_display(mth), color=method_color(mth),
                ls="--" if m is not None and m.estimates_beta else "-")
        rows.append(pd.DataFrame({"method": mth, "step": steps, "test_loss": loss}))
    row = table[(table.shift_index == shift_index) & (table.size_index == size_index)].iloc[0]
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("target test MSE")
    ax.set_title(f"shift {row['shift']:.3g}, target subset {row['subset_size']}, trial {trial}", fontsize=10)
    ax.legend(fontsize=7)
    return ax, pd.concat(rows, ignore_index=True)


def plot_method_bars(table: pd.DataFrame, *, across: str = "target", value: str = "final_acc",
                     methods: list[str] | None = None, ax: plt.Axes | None = None,
                     paper: pd.DataFrame | None = None) -> plt.Axes:
    """Grouped bars: mean ``value`` per method (hue) for each value of ``across`` (x), error bars = std over
    trials (seeds). ``paper`` (index method, columns like ``across``) adds the published numbers as black
    ticks for comparison."""
    ax = ax or plt.gca()
    methods = methods or list(dict.fromkeys(table["method"]))
    groups = list(dict.fromkeys(table[across]))
    width = 0.8 / max(len(methods), 1)
    for j, mth in enumerate(methods):
        sub = table[table["method"] == mth].groupby(across)[value]
        mean, std = sub.mean().reindex(groups), sub.std(ddof=1).reindex(groups).fillna(0.0)
        xs = np.arange(len(groups)) + (j - (len(methods) - 1) / 2) * width
        ax.bar(xs, mean.values, width, yerr=std.values, label=mth, color=method_color(mth), capsize=2)
        if paper is not None and mth in paper.index:
            vals = [paper.loc[mth].get(g, np.nan) for g in groups]
            ax.scatter(xs, vals, marker="_", s=120, color="black", zorder=3,
                       label="paper" if j == 0 else None)
    ax.set_xticks(np.arange(len(groups)), [str(g) for g in groups])
    ax.set_xlabel(across)
    ax.set_ylabel("target accuracy (%)")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    return ax


def plot_beta_curves(betas: pd.DataFrame, ax: plt.Axes | None = None, title: str | None = None) -> plt.Axes:
    """Auto-β per source per round (auto-weighted paper App. C.4, Fig. 5–6): mean over seeds, one line
    per source (β weights the source part)."""
    ax = ax or plt.gca()
    for src, sub in betas.groupby("source", sort=False):
        g = sub.groupby("round")["beta"]
        mean, std = g.mean(), g.std(ddof=1).fillna(0.0)
        ax.plot(mean.index, mean.values, marker="o", ms=3, label=f"source {src}")
        ax.fill_between(mean.index, (mean - std).values, (mean + std).values, alpha=0.2)
    ax.set_xlabel("round")
    ax.set_ylabel("β (source weight)")
    ax.set_ylim(-0.02, 1.02)
    if title:
        ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    return ax


def plot_beta_grid(betas: pd.DataFrame, *, rows: str = "rule", cols: str = "target") -> plt.Figure:
    """Auto-β per source per round (:func:`plot_beta_curves`) in a grid: one panel per value of ``rows``
    (e.g. the auto rule) × ``cols`` (e.g. the target domain). ``betas`` is a
    :func:`fda_core.experiments.tables.beta_table`. Returns the figure."""
    row_vals, col_vals = list(dict.fromkeys(betas[rows])), list(dict.fromkeys(betas[cols]))
    fig, axes = plt.subplots(len(row_vals), len(col_vals), figsize=(3.4 * len(col_vals), 2.6 * len(row_vals)),
                             squeeze=False, sharey=True)
    for i, rv in enumerate(row_vals):
        for j, cv in enumerate(col_vals):
            sub = betas[(betas[rows] == rv) & (betas[cols] == cv)]
            plot_beta_curves(sub, ax=axes[i, j], title=f"{method_display(rv)}, {cols} {cv}")
    fig.tight_layout()
    return fig


def plot_accuracy_vs_shift(table: pd.DataFrame, x: str, *, value: str = "final_acc", methods: list[str] | None = None,
                           ax: plt.Axes | None = None, invert: bool = False, hue: str = "method",
                           log_x: bool = False) -> plt.Axes:
    """Mean ± std target accuracy against a shift parameter ``x`` (FedGP paper Fig. 3), one line per value
    of ``hue`` (default the method's display label; e.g. ``"rule"`` for a β sweep), in ``methods`` order."""
    ax = ax or plt.gca()
    methods = methods or list(dict.fromkeys(table[hue]))
    for mth in methods:
        g = table[table[hue] == mth].groupby(x)[value]
        mean, std = g.mean(), g.std(ddof=1).fillna(0.0)
        m = _method(mth)
        ax.errorbar(mean.index, mean.values, yerr=std.values, marker="o", ms=4, capsize=2, label=method_display(mth),
                    color=method_color(mth), ls="--" if m is not None and m.estimates_beta else "-")
    ax.set_xlabel(x)
    ax.set_ylabel("target accuracy (%)")
    if log_x:
        ax.set_xscale("log")
    if invert:
        ax.invert_xaxis()
    ax.legend(fontsize=7, ncol=2)
    return ax
