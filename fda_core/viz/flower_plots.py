"""Figures of notebook 09: the same experiments in process and on Flower (``docs/flower.md``)."""

from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.ticker import MaxNLocator

__all__ = ["plot_runtime_curves", "plot_bytes_per_round"]

_STYLE = {"in process": dict(ls="-", marker="", lw=2.5, alpha=0.45),
          "Flower simulation": dict(ls="none", marker="o", ms=6, mfc="none"),
          "Flower deployment": dict(ls="none", marker="x", ms=7)}


def plot_runtime_curves(curves: pd.DataFrame) -> plt.Figure:
    """Target accuracy per round for every method and runtime (left) and β per source per round for the
    methods with β (right): the runtimes are drawn on top of each other (wide line: in process; circles:
    Flower simulation; crosses: deployment), so identical curves look like markers on the line."""
    fig, (ax_acc, ax_beta) = plt.subplots(1, 2, figsize=(11, 4))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    methods = list(dict.fromkeys(curves["method"]))
    for k, method in enumerate(methods):
        color = colors[k % len(colors)]
        for runtime, style in _STYLE.items():
            d = curves[(curves["method"] == method) & (curves["runtime"] == runtime)]
            if d.empty:
                continue
            acc = d.drop_duplicates("round")
            ax_acc.plot(acc["round"], acc["target_acc"], color=color, label=f"{method} · {runtime}", **style)
            for j, (source, b) in enumerate(d.dropna(subset=["beta"]).groupby("source", sort=False)):
                ax_beta.plot(b["round"], b["beta"], color=color, label=f"{method} · {source} · {runtime}",
                             **{**style, "ls": style["ls"] if style["ls"] == "none" else ("-", "--", ":")[j % 3]})
    ax_acc.set(xlabel="round", ylabel="target test accuracy", title="Target accuracy per round")
    for ax in (ax_acc, ax_beta):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax_beta.set(xlabel="round", ylabel="β (weight of the source part)", title="β per source per round")
    ax_acc.legend(fontsize=7)
    if ax_beta.lines:
        ax_beta.legend(fontsize=6)
    fig.tight_layout()
    return fig


def plot_bytes_per_round(table: pd.DataFrame) -> plt.Figure:
    """Bytes of the training messages per round per client, sent by the server (down) and by the client (up),
    one panel per method (log scale), with the count from the model size (4m per model, plus 4·B·m for the
    target's per-batch updates) as black ticks."""
    methods = list(dict.fromkeys(table["method"]))
    fig, axes = plt.subplots(1, len(methods), figsize=(5.5 * len(methods), 3.8), squeeze=False, sharey=True)
    for ax, method in zip(axes[0], methods):
        d = table[table["method"] == method]
        clients = list(dict.fromkeys(d["client"]))
        rounds = sorted(d["round"].unique())
        width = 0.8 / (2 * len(clients))
        for i, client in enumerate(clients):
            c = d[d["client"] == client].set_index("round").reindex(rounds)
            x = np.arange(len(rounds)) + (2 * i - len(clients)) * width + width / 2
            ax.bar(x, c["down"].fillna(0) / 1e3, width, label=f"{client} down", alpha=0.6)
            ax.bar(x + width, c["up"].fillna(0) / 1e3, width, label=f"{client} up")
            expected = (c["model_bytes"] + c["parts_bytes"]).where(c["up"] > 0)  # rounds the client trained
            ax.scatter(x + width, expected / 1e3, marker="_", s=120, color="black", zorder=3)
        ax.set_xticks(np.arange(len(rounds)), rounds)
        ax.set(xlabel="round", title=method, yscale="log")
    axes[0][0].set_ylabel("kB per training message")
    axes[0][-1].legend(fontsize=7, ncol=2)
    fig.tight_layout()
    return fig
