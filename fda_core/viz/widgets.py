"""Slider panels for the notebooks, built on the same plotting functions that save the static figures.

They degrade gracefully in batch runs (papermill, nbmake, no browser): building a panel runs its
drawing function once with the default values, and the notebooks save their static figures separately
from the parameter values, so nothing depends on a front end being present.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["theory_explorer", "estimator_explorer", "curves_explorer"]


def theory_explorer(
    beta: float = 0.5,
    delta_bar: float = 1.0,
    tau2: float = 0.5,
    m: int = 10,
    grid_max: float = 3.0,
    include_auto: bool = False,
    sigma2_point: float = 1.0,
    d2_point: float = 2.0,
) -> Any:
    """Sliders for β, δ̄, τ̄², m, the grid range and the (σ², d²) point, and a toggle for the auto rules,
    redrawing :func:`fda_core.viz.plotting.theory_panels` (phase diagram + Δ²(β) curves).

    Returns an ``ipywidgets.interactive`` (display it, or let it be the cell's last expression).
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .plotting import theory_panels

    def draw(beta, delta_bar, tau2, m, grid_max, include_auto, sigma2_point, d2_point):
        fig, _ = theory_panels(beta, delta_bar, tau2, m, grid_max, include_auto, sigma2_point, d2_point, grid_points=81)
        plt.show()
        plt.close(fig)

    style = {"description_width": "initial"}
    return w.interactive(
        draw,
        beta=w.FloatSlider(value=beta, min=0.0, max=1.0, step=0.05, description="β", style=style),
        delta_bar=w.FloatSlider(value=delta_bar, min=0.0, max=1.0, step=0.05, description="δ̄", style=style),
        tau2=w.FloatSlider(value=tau2, min=0.0, max=1.0, step=0.05, description="τ̄²", style=style),
        m=w.IntSlider(value=m, min=1, max=1000, step=1, description="m", style=style),
        grid_max=w.FloatSlider(value=grid_max, min=0.5, max=10.0, step=0.5, description="grid range", style=style),
        include_auto=w.Checkbox(value=include_auto, description="auto-weighted rules"),
        sigma2_point=w.FloatSlider(value=sigma2_point, min=0.05, max=5.0, step=0.05, description="σ² (curves)", style=style),
        d2_point=w.FloatSlider(value=d2_point, min=0.05, max=10.0, step=0.05, description="d² (curves)", style=style),
    )


def estimator_explorer(model: Any, B_values: Sequence[int], n_values: Sequence[int],
                       B: int | None = None, n: int | None = None, n_draws: int = 2000, seed: int = 0) -> Any:
    """Sliders for B and n redrawing :func:`plot_estimator_spread` (fresh draws for each choice).

    Returns an ``ipywidgets.interactive`` (display it). Building it draws the figure once at the
    initial values (so a batch run without a browser just executes it once); pairs where n is not
    divisible by B print a message instead of failing. Notebooks save their static figure separately.
    """
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from ..experiments.estimator_checks import _check_B, _check_n
    from .estimator_plots import plot_estimator_spread

    bs = sorted({_check_B(b, "B_values") for b in B_values})
    ns = sorted({_check_n(v, "n_values") for v in n_values})
    B = bs[0] if B is None else B
    n = ns[0] if n is None else n
    if B not in bs or n not in ns:
        raise ValueError(f"initial B={B}, n={n} must be among B_values={bs} and n_values={ns}")

    def draw(B: int, n: int) -> None:
        if n % B:
            print(f"n = {n} is not divisible by B = {B}: the parts would not have equal sizes; pick another pair.")
            return
        fig, _ = plot_estimator_spread(model, B, n, n_draws, seed)
        plt.show()
        plt.close(fig)

    style = {"description_width": "initial"}
    return w.interactive(
        draw,
        B=w.SelectionSlider(options=bs, value=B, description="B (parts)", style=style),
        n=w.SelectionSlider(options=ns, value=n, description="n (target points)", style=style),
    )


def curves_explorer(result: Any, methods: Sequence[str] | None = None) -> Any:
    """Sliders for the shift level, the subset size and the trial of a
    :class:`fda_core.experiments.phase_diagram.GridResult`, drawing the target test-loss curves of every method
    there (``methods`` by display label, registry name or spec; default every method of the result)."""
    import ipywidgets as w
    import matplotlib.pyplot as plt

    from .plotting import plot_training_curves

    table = result.table
    methods = list(methods or table["method"].unique())
    shifts = sorted(table.shift_index.unique())
    sizes = sorted(table.size_index.unique())
    trials = sorted(table.trial.unique())

    def draw(shift_index: int, size_index: int, trial: int) -> None:
        fig, ax = plt.subplots(figsize=(6, 3.8))
        plot_training_curves(result, shift_index, size_index, trial, methods, ax=ax)
        plt.show()
        plt.close(fig)

    return w.interactive(
        draw,
        shift_index=w.SelectionSlider(options=shifts, value=shifts[len(shifts) // 2], description="shift level"),
        size_index=w.SelectionSlider(options=sizes, value=sizes[len(sizes) // 2], description="subset size"),
        trial=w.SelectionSlider(options=trials, value=trials[0], description="trial"),
    )
