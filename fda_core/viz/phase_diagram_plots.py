"""The four panels of the synthetic phase diagram (notebook 02; FedGP paper Fig. 2): the closed-form theory
with the measured cells, and the best method per measured cell by Delta error and by target test loss."""

from __future__ import annotations

from typing import Any

import matplotlib.pyplot as plt

from .plotting import plot_cell_grid, plot_phase_diagram

__all__ = ["plot_phase_diagram_panels"]


def plot_phase_diagram_panels(theory: Any, fixed: Any, auto: Any, figsize: tuple[float, float] = (21, 5)) -> plt.Figure:
    """One row of four panels:

    * theory — the best rule by the closed-form Δ² on ``theory``'s (d, σ) grid (a
      :class:`fda_core.experiments.phase_diagram.TheoryGrid`, log axes) with the measured cells as dots;
    * (a) the best method by Monte-Carlo Δ² per measured cell and (b) by final target test loss, from
      ``fixed`` (:func:`~fda_core.experiments.phase_diagram.compare_best` of the fixed-β methods);
    * (c) the best by test loss among ``auto`` (the compare_best table with FedDA/FedGP estimating β).

    Returns the figure.
    """
    fig, axes = plt.subplots(1, 4, figsize=figsize)
    beta = f"{theory.beta:g}"
    plot_phase_diagram(theory.best, theory.d, theory.sigma, ax=axes[0],
                       title=f"theory: closed-form Δ², β={beta}, τ̄²={theory.tau2:.2f}, m={theory.m}")
    axes[0].scatter(theory.cells_d, theory.cells_sigma, s=8, c="k", label="measured cells")
    axes[0].set_xscale("log")
    axes[0].set_yscale("log")
    plot_cell_grid(fixed, "best_by_delta_mc", ax=axes[1], title=f"(a) smallest Delta error (Monte Carlo), β={beta}")
    plot_cell_grid(fixed, "best_by_loss", ax=axes[2], title=f"(b) best target test loss, β={beta}")
    plot_cell_grid(auto, "best_by_loss", ax=axes[3], title="(c) best target test loss, auto β")
    fig.tight_layout()
    return fig
