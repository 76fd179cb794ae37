"""A results browser for notebooks 04–08: stored runs and saved tables, no retraining.

Two sources, both read-only:

* the result store (``results/<experiment>/<hash>.json``, :mod:`fda_core.common.store`): every run of the
  federated loop (notebooks 04, 05, 07) keeps its per-round target accuracy (``history``), so the browser
  draws accuracy-vs-round curves (mean over seeds, band = ± one standard deviation) for any data set, setting
  (target domain, number of labels, ...) and methods, with the final accuracies as a table;
* the committed tables ``figures/0[4-8]_*/*.csv`` (with their setting notes), which a fresh clone has even
  before the notebooks ran.
"""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd

from ..common.files import read_note
from .panels import FigurePanel

__all__ = ["load_federated_runs", "list_saved_tables", "read_saved_table", "results_explorer"]

_IGNORED_KEYS = {"rule", "method_options", "seed"}  # what differs between methods and trials, not settings


def _flat(config: dict[str, Any]) -> dict[str, Any]:
    """Nested options one level up: ``{"dataset_options": {"noise_std": 0.4}}`` → ``{"noise_std": 0.4}``."""
    flat: dict[str, Any] = {}
    for k, v in config.items():
        if isinstance(v, dict) and k != "method_options":
            flat.update({sub: val for sub, val in v.items() if sub not in config})
        else:
            flat[k] = v
    return flat


def _setting(config: dict[str, Any], keys: list[str]) -> str:
    return ", ".join(f"{k}={config.get(k)}" for k in keys) or "(one setting)"


def load_federated_runs(results_dir: str | os.PathLike) -> pd.DataFrame:
    """Every stored run of the federated loop under ``results_dir`` as one row per (run, round): experiment,
    setting (the config keys that vary within the experiment, besides method and seed), method (display
    label), seed, round, target_acc (percent). Runs without a per-round history are skipped, and so are runs
    of older code: per experiment only the code revision of the newest file is kept."""
    rows: list[pd.DataFrame] = []
    root = Path(results_dir)
    for folder in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        runs = []
        for path in sorted(folder.glob("*.json")):
            try:
                stored = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError):
                continue  # a file being written or damaged: not a finished run
            result = stored.get("result")
            if not isinstance(result, dict) or not isinstance(result.get("history"), list) or "method" not in result:
                continue
            if not all(isinstance(h, dict) and "target_acc" in h for h in result["history"]):
                continue
            runs.append((_flat(stored.get("config", {})), result, stored.get("revision"), path.stat().st_mtime_ns))
        if not runs:
            continue
        # runs of older code (another revision) stay in the store until recomputed: show the newest code's
        newest = max(runs, key=lambda r: r[3])[2]
        runs = [(c, r) for c, r, rev, _ in runs if rev == newest]
        keys = sorted(k for k in set().union(*(c for c, _ in runs)) - _IGNORED_KEYS if not k.endswith("seed")
                      if len({json.dumps(c.get(k), sort_keys=True, default=str) for c, _ in runs}) > 1)
        for config, result in runs:
            hist = pd.DataFrame(result["history"])
            rows.append(pd.DataFrame({"experiment": folder.name, "setting": _setting(config, keys),
                                      "method": result["method"], "seed": config.get("seed", 0),
                                      "round": hist["round"], "target_acc": 100 * hist["target_acc"].astype(float)}))
    if not rows:
        return pd.DataFrame(columns=["experiment", "setting", "method", "seed", "round", "target_acc"])
    return pd.concat(rows, ignore_index=True)


def list_saved_tables(figures_dir: str | os.PathLike, notebooks: tuple[str, ...] = ("04", "05", "06", "07", "08")) -> list[str]:
    """The committed result tables of the given notebooks, as paths relative to ``figures_dir``."""
    root = Path(figures_dir)
    return sorted(str(p.relative_to(root)) for nb in notebooks for p in root.glob(f"{nb}_*/*.csv"))


def read_saved_table(figures_dir: str | os.PathLike, name: str) -> tuple[pd.DataFrame, str]:
    """A committed table and its note (the leading ``#`` lines)."""
    path = Path(figures_dir) / name
    return pd.read_csv(path, comment="#"), " ".join(read_note(path))


def _summary(runs: pd.DataFrame) -> pd.DataFrame:
    last = runs.sort_values("round").groupby(["method", "seed"]).tail(1)
    return last.groupby("method", sort=False).target_acc.agg(final_acc_mean="mean", final_acc_std="std", seeds="count")


def results_explorer(results_dir: str | os.PathLike = "results", figures_dir: str | os.PathLike = "figures",
                     max_rows: int = 40) -> FigurePanel:
    """Dropdowns for the experiment (a store folder such as ``04_ColoredMNIST``), its setting and the methods,
    drawing the target accuracy per round (mean over seeds ± one std) with the final accuracies as a table,
    and a dropdown over the committed tables of notebooks 04–08 (first ``max_rows`` rows shown)."""
    import ipywidgets as w
    from matplotlib.figure import Figure

    from .plotting import method_color

    runs = load_federated_runs(results_dir)
    tables = list_saved_tables(figures_dir)
    experiments = list(dict.fromkeys(runs.experiment)) or ["(no stored runs)"]
    style = {"description_width": "initial"}

    def settings_of(exp: str) -> list[str]:
        return sorted(set(runs[runs.experiment == exp].setting)) or ["—"]

    def methods_of(exp: str, setting: str) -> list[str]:
        sel = runs[(runs.experiment == exp) & (runs.setting == setting)]
        return list(dict.fromkeys(sel.method))

    exp0 = experiments[0]
    set0 = settings_of(exp0)[0]
    controls = {
        "experiment": w.Dropdown(options=experiments, value=exp0, description="experiment", style=style),
        "setting": w.Dropdown(options=settings_of(exp0), value=set0, description="setting", style=style,
                              layout={"width": "520px"}),
        "methods": w.SelectMultiple(options=methods_of(exp0, set0), value=tuple(methods_of(exp0, set0)),
                                    description="methods", rows=6, style=style),
        "table": w.Dropdown(options=tables or ["(no saved tables)"], description="saved table", style=style,
                            layout={"width": "520px"}),
    }

    # options and value change in one message (hold_sync): sent apart, the front end would select an index of
    # the old options and log "Error setting state"
    def on_experiment(change: dict) -> None:
        with controls["setting"].hold_sync():
            controls["setting"].options = settings_of(change["new"])

    def on_setting(change: dict) -> None:
        options = methods_of(controls["experiment"].value, change["new"] or "")
        with controls["methods"].hold_sync():
            controls["methods"].options = options
            controls["methods"].value = tuple(options)

    controls["experiment"].observe(on_experiment, names="value")
    controls["setting"].observe(on_setting, names="value")

    fig = Figure(figsize=(7.0, 4.2), layout="constrained")
    ax = fig.add_subplot()

    def selected(v: dict) -> pd.DataFrame:
        sel = runs[(runs.experiment == v["experiment"]) & (runs.setting == v["setting"])]
        return sel[sel.method.isin(v["methods"])]

    def update(v: dict) -> None:
        ax.cla()
        sel = selected(v)
        for method, part in sel.groupby("method", sort=False):
            stats = part.groupby("round").target_acc.agg(["mean", "std"]).fillna({"std": 0.0})
            colour = method_color(method)
            ax.plot(stats.index, stats["mean"], label=method, color=colour)
            ax.fill_between(stats.index, stats["mean"] - stats["std"], stats["mean"] + stats["std"], color=colour,
                            alpha=0.15)
        ax.set_xlabel("round")
        ax.set_ylabel("target accuracy (%)")
        ax.set_title(f"{v['experiment']}: {v['setting']}" if len(sel) else
                     f"no stored runs in {results_dir}: run the notebooks (make figures) first", fontsize=9)
        if len(sel):
            ax.legend(fontsize=7)

    def readout(v: dict) -> str:
        sel = selected(v)
        parts = []
        if runs.empty:
            parts.append(f"<b>No stored runs in {html.escape(str(results_dir))}</b>: run the notebooks (make figures) "
                         "first; the saved tables below are the committed ones.<br>")
        elif not len(sel):
            parts.append("<b>No method selected.</b><br>")
        if len(sel):
            parts.append(f"<b>Final target accuracy (%), {v['experiment']}, {html.escape(v['setting'])}</b>"
                         + _summary(sel).round(2).to_html())
        if tables and v["table"] in tables:
            table, note = read_saved_table(figures_dir, v["table"])
            parts.append(f"<b>{html.escape(v['table'])}</b> ({len(table)} rows"
                         + (f", first {max_rows}" if len(table) > max_rows else "") + ")<br><small>"
                         + html.escape(note[:600]) + "</small>" + table.head(max_rows).round(3).to_html(index=False))
        return "".join(parts) or "nothing stored yet: run the notebooks (make figures) first"

    return FigurePanel(controls, {"accuracy per round": (fig, update, {"experiment", "setting", "methods"})}, readout,
                       columns=2, title="Results browser: stored runs of notebooks 04–08 and their saved tables")

