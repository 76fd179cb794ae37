"""Slider panels of the notebooks and dashboards, redrawn in place (:mod:`.panels`).

Every panel shows the values its sliders were given exactly (a slider widens its range or refines its step
instead of rounding, and refuses values outside the quantity's range), reads out the values in their units
(β, shift, target points), labels methods with the registry's display labels, and marks the current β on
the Δ²(β) curves. A panel is a :class:`fda_core.viz.panels.FigurePanel`; display it (or make it a cell's last
expression). In a batch run (papermill, no browser) building it draws every plot once and the notebook's
cell output carries the PNG as a static fallback; the notebooks save their static figures separately.

Maths: ``fda_core.core.theory`` (``docs/theory.md`` § Delta errors, § Optimal weights, § Phase diagram);
estimator draws: ``fda_core.viz.estimator_plots``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .panels import FigurePanel, exact_float_slider, exact_int_slider, labelled_selection_slider

__all__ = ["theory_explorer", "estimator_explorer", "curves_explorer", "ALL_THEORY_RULES"]

#: Every rule a theory map can name, in a fixed order (fixed colours and codes for in-place updates).
ALL_THEORY_RULES = ("source_only", "fedda", "fedgp", "target_only", "fedda_auto", "fedgp_auto")


def _figure(width: float, height: float) -> Any:
    """A figure not registered with pyplot (so the inline backend never shows it by itself)."""
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _num(x: float) -> str:
    return f"{x:.4g}"


# --------------------------------------------------------------------------------------------------
# theory (notebooks 01, 02; dashboard "theory")


def theory_explorer(beta: float = 0.5, delta_bar: float = 1.0, tau2: float = 0.5, m: int = 10,
                    grid_max: float = 3.0, include_auto: bool = False, sigma2_point: float = 1.0,
                    d2_point: float = 2.0, grid_points: int = 81) -> FigurePanel:
    """Sliders for β, δ̄, τ̄², m, the grid range and the point (σ², d²) of the curves, a toggle for the
    auto-weighted rules, and two plots redrawn in place: the best rule by closed-form Δ² on a (d, σ) grid
    (FedGP paper Fig. 2 left; the point of the curves marked) and Δ²(β) of FedDA and FedGP at (σ², d²) with
    the slider's β and each rule's optimal β marked (FedGP paper Thm 4.2/4.3, ``docs/theory.md``).

    β weights the source part (β = 0: target only). The values given are shown exactly: m and the grid range
    widen their sliders, τ̄² = 0.57 gets a step of 0.01; β, δ̄, τ̄² outside [0, 1], m < 1, a grid range or a
    point ≤ 0 raise ``ValueError`` naming the parameter.
    """
    import matplotlib.patches as mpatches
    from matplotlib.colors import ListedColormap
    from matplotlib.lines import Line2D

    from ..core import theory
    from .plotting import method_color, method_display

    unit = (0.0, 1.0)
    controls = {
        "beta": exact_float_slider("beta", "β (source weight)", beta, unit, 0.05, allowed=unit),
        "delta_bar": exact_float_slider("delta_bar", "δ̄ (filter keeps source)", delta_bar, unit, 0.05, allowed=unit),
        "tau2": exact_float_slider("tau2", "τ̄² (orthogonal share)", tau2, unit, 0.05, allowed=unit),
        "m": exact_int_slider("m", "m (parameters)", m, (2, 1000), allowed=(1, math.inf)),
        "grid_max": exact_float_slider("grid_max", "grid range (max d, σ)", grid_max, (0.5, 10.0), 0.5,
                                       allowed=(1e-6, math.inf)),
        "sigma2_point": exact_float_slider("sigma2_point", "σ² of the curves", sigma2_point, (0.05, 5.0), 0.05,
                                           allowed=(1e-6, math.inf)),
        "d2_point": exact_float_slider("d2_point", "d² of the curves", d2_point, (0.05, 10.0), 0.05,
                                       allowed=(0.0, math.inf)),
    }
    import ipywidgets as w

    controls["include_auto"] = w.Checkbox(value=bool(include_auto), description="auto-weighted rules (optimal β)")
    codes = {r: i for i, r in enumerate(ALL_THEORY_RULES)}

    # -- the map
    map_fig = _figure(5.4, 4.3)
    ax_map = map_fig.add_subplot()
    image = ax_map.imshow(np.zeros((2, 2)), origin="lower", aspect="auto", interpolation="nearest",
                          cmap=ListedColormap([method_color(r) or "#999999" for r in ALL_THEORY_RULES]),
                          vmin=-0.5, vmax=len(ALL_THEORY_RULES) - 0.5)
    (point,) = ax_map.plot([], [], "x", color="k", ms=9, mew=2, label="point of the curves")
    ax_map.set_xlabel("source–target distance d")
    ax_map.set_ylabel("target standard deviation σ")

    def rules_of(v: dict) -> list[str]:
        return list(theory.THEORY_RULES) + (["fedda_auto", "fedgp_auto"] if v["include_auto"] else [])

    def update_map(v: dict) -> None:
        g = v["grid_max"]
        axis = np.linspace(0, g, grid_points)[1:]
        best = theory.phase_diagram_theory(axis[None, :], axis[:, None], v["beta"], v["delta_bar"], v["tau2"], v["m"],
                                           rules=rules_of(v))
        image.set_data(np.vectorize(codes.get)(best).astype(float))
        half = (axis[1] - axis[0]) / 2
        image.set_extent((axis[0] - half, axis[-1] + half, axis[0] - half, axis[-1] + half))
        ax_map.set_xlim(0, g)
        ax_map.set_ylim(0, g)
        point.set_data([math.sqrt(v["d2_point"])], [math.sqrt(v["sigma2_point"])])
        present = [r for r in ALL_THEORY_RULES if r in set(best.ravel())]
        handles = [mpatches.Patch(color=method_color(r)) for r in present] + [point]
        ax_map.legend(handles, [method_display(r) for r in present] + ["(σ², d²) of the curves"], loc="upper left",
                      fontsize=7, framealpha=0.9)
        ax_map.set_title(f"Best rule by Δ²: β={_num(v['beta'])}, δ̄={_num(v['delta_bar'])}, "
                         f"τ̄²={_num(v['tau2'])}, m={v['m']}", fontsize=9)

    # -- the curves
    curve_fig = _figure(5.4, 4.3)
    ax_c = curve_fig.add_subplot()
    betas = np.linspace(0, 1, 201)
    lines = {r: ax_c.plot([], [], color=method_color(r), label=method_display(r))[0] for r in ("fedda", "fedgp")}
    opt_lines = {r: ax_c.axvline(0, color=method_color(r), ls=":", lw=1.2) for r in lines}
    opt_dots = {r: ax_c.plot([], [], "o", color=method_color(r), ms=5)[0] for r in lines}
    now_dots = {r: ax_c.plot([], [], "s", color=method_color(r), mec="k", ms=7)[0] for r in lines}
    beta_line = ax_c.axvline(0, color="k", lw=1.5)
    target_line = ax_c.axhline(0, color=method_color("target_only"), ls="--", lw=1, label=method_display("target_only"))
    source_line = ax_c.axhline(0, color=method_color("source_only"), ls="--", lw=1, label=method_display("source_only"))
    ax_c.set_xlim(0, 1)
    ax_c.set_xlabel("β (weight of the source part)")
    ax_c.set_ylabel("Delta error Δ²")

    def point_values(v: dict) -> dict[str, Any]:
        s2, d2 = v["sigma2_point"], v["d2_point"]
        curves = {"fedda": theory.delta_fedda(s2, d2, betas),
                  "fedgp": theory.delta_fedgp(s2, d2, betas, v["delta_bar"], v["tau2"], v["m"])}
        optimal = {"fedda": float(theory.optimal_beta_fedda(s2, d2)),
                   "fedgp": float(theory.optimal_beta_fedgp(s2, v["tau2"] * d2, v["m"], v["delta_bar"]))}
        now = {"fedda": float(theory.delta_fedda(s2, d2, v["beta"])),
               "fedgp": float(theory.delta_fedgp(s2, d2, v["beta"], v["delta_bar"], v["tau2"], v["m"]))}
        return {"curves": curves, "optimal": optimal, "now": now}

    def update_curves(v: dict) -> None:
        p = point_values(v)
        for r, line in lines.items():
            line.set_data(betas, p["curves"][r])
            b = p["optimal"][r]
            opt_lines[r].set_xdata([b, b])
            opt_dots[r].set_data([b], [np.interp(b, betas, p["curves"][r])])
            now_dots[r].set_data([v["beta"]], [p["now"][r]])
        beta_line.set_xdata([v["beta"], v["beta"]])
        target_line.set_ydata([v["sigma2_point"]] * 2)
        source_line.set_ydata([v["d2_point"]] * 2)
        ax_c.relim()
        ax_c.autoscale_view(scalex=False)
        ax_c.set_ylim(bottom=0)
        handles = [*lines.values(), target_line, source_line,
                   Line2D([], [], color="k", lw=1.5, label=f"β = {_num(v['beta'])} (slider)"),
                   Line2D([], [], color="0.3", ls=":", marker="o", label="optimal β")]
        ax_c.legend(handles=handles, fontsize=7, loc="upper center")
        ax_c.set_title(f"Δ²(β) at σ²={_num(v['sigma2_point'])}, d²={_num(v['d2_point'])}; at β={_num(v['beta'])}: "
                       f"FedDA {p['now']['fedda']:.3g}, FedGP {p['now']['fedgp']:.3g}", fontsize=9)

    def readout(v: dict) -> str:
        p = point_values(v)
        return (f"β = {_num(v['beta'])} (source weight) · δ̄ = {_num(v['delta_bar'])} · τ̄² = {_num(v['tau2'])} · "
                f"m = {v['m']} · grid up to d, σ = {_num(v['grid_max'])} · auto-weighted rules "
                f"{'shown' if v['include_auto'] else 'hidden'}<br>"
                f"at σ² = {_num(v['sigma2_point'])}, d² = {_num(v['d2_point'])}: optimal β FedDA "
                f"{p['optimal']['fedda']:.3f}, FedGP {p['optimal']['fedgp']:.3f}; Δ² at the slider's β: FedDA "
                f"{p['now']['fedda']:.3g}, FedGP {p['now']['fedgp']:.3g}")

    everything = set(controls)
    return FigurePanel(controls, {
        "phase map": (map_fig, update_map, everything),
        "Δ²(β)": (curve_fig, update_curves, everything - {"grid_max"}),
    }, readout, columns=4, title="Theory explorer: which rule has the smallest Delta error")


# --------------------------------------------------------------------------------------------------
# estimators (notebook 03; dashboard "estimators")


def estimator_explorer(model: Any, B_values: Sequence[int], n_values: Sequence[int], B: int | None = None,
                       n: int | None = None, n_draws: int = 2000, seed: int = 0, level: float = 0.95) -> FigurePanel:
    """Sliders for B (parts) and n (target points) redrawing the histograms of
    :func:`fda_core.viz.estimator_plots.plot_estimator_spread` in one persistent figure (fresh draws for each
    choice, ``seed``). Pairs where B does not divide n show a message and keep the last histograms."""
    from ..experiments.estimator_checks import _check_B, _check_n
    from .estimator_plots import draw_estimator_spread, spread_layout

    bs = sorted({_check_B(b, "B_values") for b in B_values})
    ns = sorted({_check_n(v, "n_values") for v in n_values})
    B = bs[0] if B is None else B
    n = ns[0] if n is None else n
    if B not in bs or n not in ns:
        raise ValueError(f"initial B={B}, n={n} must be among B_values={bs} and n_values={ns}")
    controls = {
        "B": labelled_selection_slider("B (parts of the target set)", [(f"{b} parts", b) for b in bs], B),
        "n": labelled_selection_slider("n (target points)", [(f"{v} points", v) for v in ns], n),
    }
    n_panels, nrows, ncols = spread_layout(model)
    fig = _figure(3.6 * ncols, 2.9 * nrows)
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[n_panels:]:
        ax.set_visible(False)

    def update(v: dict) -> None:
        if v["n"] % v["B"]:
            raise ValueError(f"n = {v['n']} points do not split into B = {v['B']} equal parts; pick another pair")
        draw_estimator_spread(fig, axes[:n_panels], model, v["B"], v["n"], n_draws, seed, level)

    def readout(v: dict) -> str:
        return (f"B = {v['B']} parts of n = {v['n']} target points ({v['n'] // v['B'] if v['n'] % v['B'] == 0 else '—'} "
                f"per part), {n_draws} draws, seed {seed}")

    return FigurePanel(controls, {"estimates": (fig, update, {"B", "n"})}, readout, dpi=72,
                       title="Estimator explorer: the raw estimates over many target sets")


# --------------------------------------------------------------------------------------------------
# training curves of the phase diagram (notebook 02; dashboard "phase_diagram")


def curves_explorer(result: Any, methods: Sequence[str] | None = None, cells: Any = None,
                    column: str = "best_by_loss") -> FigurePanel:
    """Sliders for the shift level (read out as the shift and the measured d), the target subset (read out as
    its number of points) and the trial of a :class:`fda_core.experiments.phase_diagram.GridResult`, drawing
    the target test-loss curves of ``methods`` (display labels, names or specs; default every method of the
    result) in one cell. With ``cells`` (a :func:`fda_core.experiments.phase_diagram.compare_best` table) a
    second plot shows which rule wins where (``column``) with the chosen cell outlined."""
    import matplotlib.patches as mpatches

    from ..experiments.phase_diagram import method_labels
    from .plotting import _method, method_color, method_display, plot_cell_grid

    table = result.table
    methods = method_labels(list(methods or table["method"].unique()), set(table["method"]))
    shifts = table.drop_duplicates("shift_index").sort_values("shift_index")
    sizes = table.drop_duplicates("size_index").sort_values("size_index")
    trials = sorted(int(t) for t in table.trial.unique())
    d_of = cells.groupby("shift_index").d.mean() if cells is not None else None
    shift_opts = [(f"shift {r['shift']:.3g}" + (f" (d = {d_of[r.shift_index]:.2g})" if d_of is not None else ""),
                   int(r.shift_index)) for _, r in shifts.iterrows()]
    size_opts = [(f"{int(r.subset_size)} points", int(r.size_index)) for _, r in sizes.iterrows()]
    controls = {
        "shift_index": labelled_selection_slider("shift level", shift_opts, shift_opts[len(shift_opts) // 2][1]),
        "size_index": labelled_selection_slider("target subset", size_opts, size_opts[len(size_opts) // 2][1]),
        "trial": labelled_selection_slider("trial", [(f"trial {t}", t) for t in trials], trials[0]),
    }
    fig = _figure(6.0, 4.0)
    ax = fig.add_subplot()
    steps = result.eval_steps
    lines = {}
    for mth in methods:
        m = _method(mth)
        lines[mth] = ax.plot(steps, np.ones_like(steps, dtype=float), label=method_display(mth), color=method_color(mth),
                             ls="--" if m is not None and m.estimates_beta else "-")[0]
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("target test MSE")
    ax.legend(fontsize=7)

    def cell_label(v: dict) -> str:
        shift = dict((k, lab) for lab, k in shift_opts)[v["shift_index"]]
        size = dict((k, lab) for lab, k in size_opts)[v["size_index"]]
        return f"{shift}, {size}, trial {v['trial']}"

    def update(v: dict) -> None:
        for mth, line in lines.items():
            _, loss = result.curve(v["shift_index"], v["size_index"], mth, trial=v["trial"])
            line.set_ydata(loss)
        ax.relim()
        ax.autoscale_view()
        ax.set_title("target test loss: " + cell_label(v), fontsize=9)

    plots = {"training curves": (fig, update, {"shift_index", "size_index", "trial"})}
    if cells is not None:
        grid_fig = _figure(5.0, 4.0)
        gax = grid_fig.add_subplot()
        plot_cell_grid(cells, column, ax=gax, title=f"which rule wins where ({column.replace('_', ' ')})")
        shift_pos = sorted(cells.shift_index.unique())
        size_pos = sorted(cells.size_index.unique())
        box = mpatches.Rectangle((0, 0), 1, 1, fill=False, ec="k", lw=2.5)
        gax.add_patch(box)

        def update_grid(v: dict) -> None:
            box.set_xy((shift_pos.index(v["shift_index"]) - 0.5, size_pos.index(v["size_index"]) - 0.5))
            winner = cells[(cells.shift_index == v["shift_index"]) & (cells.size_index == v["size_index"])][column]
            gax.set_xlabel(f"d (by shift level); outlined cell: {winner.iloc[0] if len(winner) else '—'} wins", fontsize=8)

        plots["which rule wins"] = (grid_fig, update_grid, {"shift_index", "size_index"})

    def readout(v: dict) -> str:
        finals = {mth: float(line.get_ydata()[-1]) for mth, line in lines.items()}
        best = min(finals, key=finals.get)
        return f"{cell_label(v)} · lowest final target test loss: {method_display(best)} ({finals[best]:.3g})"

    return FigurePanel(controls, plots, readout, columns=3, title="Training curves of one cell")
