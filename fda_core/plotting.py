"""One plotting style and one way to save a figure: PNG + PDF + the CSV of exactly the numbers plotted.

Spec ``architecture.md`` § Conventions: ``figures/<notebook stem>/<name>.{png,pdf,csv}``.
"""

from __future__ import annotations

import os
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import ListedColormap

from .results import atomic_write, write_table

__all__ = ["RULE_COLORS", "RULE_LABELS", "set_style", "save_figure", "plot_phase_diagram", "plot_delta_curves"]

#: One colour and label per rule, shared by every figure.
RULE_COLORS = {
    "source_only": "#4c72b0",
    "fedda": "#55a868",
    "fedgp": "#c44e52",
    "target_only": "#8172b2",
    "fedda_auto": "#8fd19e",
    "fedgp_auto": "#f28e8e",
    "fedgp_cosine": "#dd8452",
}
RULE_LABELS = {
    "source_only": "Source only",
    "fedda": "FedDA",
    "fedgp": "FedGP",
    "target_only": "Target only",
    "fedda_auto": "FedDA auto",
    "fedgp_auto": "FedGP auto",
    "fedgp_cosine": "FedGP (cosine, papers' impl.)",
}


def set_style() -> None:
    """The workbook's seaborn style (white grid, paper context)."""
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", font_scale=0.95)


def save_figure(fig: plt.Figure, out_dir: str | os.PathLike, name: str, data: pd.DataFrame | None = None,
                note: str | None = None) -> list[Path]:
    """Save ``fig`` as ``out_dir/name.png`` and ``.pdf`` (and ``data`` as ``name.csv``), atomically.

    ``note`` (the setting and how it differs from the paper's) goes in the CSV's first comment lines.
    PDFs carry no creation date so the same seed gives byte-identical files.
    """
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
    rules = [r for r in RULE_COLORS if r in set(np.asarray(names).flatten())]
    index = {r: i for i, r in enumerate(rules)}
    codes = np.vectorize(index.get)(names) if len(rules) else np.zeros(np.shape(names))
    x = np.asarray(d) ** 2 if squared else np.asarray(d)
    y = np.asarray(sigma) ** 2 if squared else np.asarray(sigma)
    ax.pcolormesh(x, y, codes, cmap=ListedColormap([RULE_COLORS[r] for r in rules]), vmin=-0.5,
                  vmax=len(rules) - 0.5, shading="nearest")
    handles = [plt.Rectangle((0, 0), 1, 1, color=RULE_COLORS[r]) for r in rules]
    ax.legend(handles, [RULE_LABELS[r] for r in rules], loc="upper left", fontsize=8, framealpha=0.9)
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
        ax.plot(betas, values, color=RULE_COLORS.get(rule), label=RULE_LABELS.get(rule, rule))
        if optimal and rule in optimal:
            b = optimal[rule]
            ax.plot([b], [np.interp(b, betas, values)], "o", color=RULE_COLORS.get(rule))
            ax.axvline(b, color=RULE_COLORS.get(rule), ls=":", lw=1)
    ax.set_xlabel("β (weight of the source part)")
    ax.set_ylabel("Delta error Δ²")
    ax.legend(fontsize=8)
    if title:
        ax.set_title(title)
    return ax
