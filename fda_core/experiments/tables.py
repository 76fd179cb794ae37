"""Tables of federated runs: one row per run, mean ± std over trials, β per source per round.

Inputs are the result dicts of :func:`fda_core.experiments.federated.run_experiment` /
:func:`~fda_core.experiments.federated.run_many` (each carries its resolved ``config`` and, from
``run_many``, its ``labels``). Rows are labelled with the methods' display labels from the registry.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

__all__ = ["results_table", "summary_table", "beta_table", "timings_table", "setting_note", "format_value"]


#: the columns :func:`results_table` gives every run besides its labels
RUN_COLUMNS = ("target", "method", "rule", "beta", "seed", "rounds", "model", "final_acc", "last5_acc", "n_target_labeled")


def results_table(results: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run: labels, then :data:`RUN_COLUMNS`: target, method (display label), rule (canonical name),
    beta (the method's β option, NaN without one), seed, rounds, model, final and last-5 accuracy (in %),
    n_target_labeled. Wall-clock seconds are not in this table (they differ between re-runs; see ``timings_table``)."""
    rows = []
    for res in results:
        c = res["config"]
        labels = dict(res.get("labels", {}))
        rows.append({**labels, **dict(zip(RUN_COLUMNS, (
            res["target"], labels.get("method", res.get("method", c["rule"])), c["rule"],
            c["method_options"].get("beta", float("nan")), c["seed"], c["rounds"], c["model"],
            100 * res["final_target_acc"], 100 * res["last5_target_acc"], res["n_target_labeled"])))})
    return pd.DataFrame(rows)


def summary_table(table: Any, *, by: Sequence[str] = ("method",), across: str = "target", value: str = "final_acc",
                  order: Sequence[str] | None = None) -> Any:
    """Mean ± std over trials: a DataFrame indexed by ``by`` with one column per value of ``across``
    (plus 'Avg', the mean over those columns), cells formatted 'mean (std)'; also returns the numeric
    means. Returns (formatted, means, stds)."""


    g = table.groupby(list(by) + [across])[value]
    mean = g.mean().unstack(across)
    std = g.std(ddof=1).unstack(across).fillna(0.0)
    cols = list(dict.fromkeys(table[across]))
    mean, std = mean[cols], std[cols]
    mean["Avg"] = mean.mean(axis=1)
    std["Avg"] = float("nan")
    if order is not None:
        idx = [o for o in order if o in mean.index]
        mean, std = mean.loc[idx], std.loc[idx]
    fmt = pd.DataFrame(index=mean.index, columns=mean.columns, dtype=object)
    for col in mean.columns:
        for i in mean.index:
            s = std.loc[i, col]
            fmt.loc[i, col] = f"{mean.loc[i, col]:.2f}" + ("" if pd.isna(s) else f" ({s:.2f})")
    return fmt, mean, std


def beta_table(results: Sequence[Mapping[str, Any]]) -> Any:
    """Long table of the β used per source per round (auto-weighted paper App. C.4): labels, target,
    rule, seed, round, source, beta."""


    rows = []
    for res in results:
        names = [s["name"] for s in res["sources"]]
        for h in res["history"]:
            if h["beta"] is None:
                continue
            for name, b in zip(names, h["beta"]):
                rows.append({**res.get("labels", {}), "target": res["target"], "rule": res["config"]["rule"],
                             "seed": res["config"]["seed"], "round": h["round"], "source": name, "beta": b})
    return pd.DataFrame(rows)


def timings_table(results: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Wall-clock seconds and device of each run (kept apart from the result tables, which must be
    byte-identical when regenerated): labels, target, method, seed, seconds, device, shared_rounds (the first rounds
    taken from another run of the sweep, which the seconds do not include)."""
    return pd.DataFrame([{**res.get("labels", {}), "target": res["target"],
                          "method": res.get("labels", {}).get("method", res.get("method")),
                          "seed": res["config"]["seed"], "seconds": res["seconds"], "device": res.get("device"),
                          "shared_rounds": res.get("shared_rounds", 0)}
                         for res in results])


def format_value(value: Any) -> str:
    """A config value as the CSV notes print it: floats with ``:g``, mappings sorted by key, the rest ``str``."""
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, Mapping):  # sorted: a run read back from the store (JSON, sorted keys) reads the same
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in sorted(value.items(), key=lambda kv: str(kv[0]))) + "}"
    return str(value)


def setting_note(results: Sequence[Mapping[str, Any]], *, paper: str = "") -> str:
    """The setting of a set of runs, generated from the resolved configs that actually ran (so a CSV's note
    can never describe other settings than its numbers'): the number of runs; the config keys that are
    the same for every run; the keys that vary, with their values; each method's spec; and ``paper`` (how
    the papers' setting differs) on a last line. Keys are sorted (the order configs were written in does not
    matter). Wall-clock times are not included."""
    if not results:
        return "no runs" + (f"\n{paper}" if paper else "")
    configs = [dict(r["config"]) for r in results]
    # sorted, so that the note is the same whether the runs were computed now or read back from the store
    from .federated import EXECUTION_KEYS  # how a run executed (device, client batching) is not a setting

    keys = sorted({k for c in configs for k in c if k not in (*EXECUTION_KEYS, "rule", "method_options")})
    same, varying = [], []
    for k in keys:
        values = [format_value(c.get(k)) for c in configs]
        distinct = list(dict.fromkeys(values))
        (same if len(distinct) == 1 else varying).append((k, distinct))
    methods = list(dict.fromkeys(f"{r.get('method', r['config']['rule'])} = {r['config']['rule']}"
                                 f"{format_value(r['config']['method_options']) if r['config']['method_options'] else ''}"
                                 for r in results))
    lines = [f"{len(results)} runs of the federated loop (fda_core.experiments.federated), config as resolved:",
             "same for every run: " + ", ".join(f"{k}={v[0]}" for k, v in same)]
    if varying:
        lines.append("varies: " + "; ".join(f"{k} in [{', '.join(v)}]" for k, v in varying))
    lines.append("methods: " + "; ".join(methods))
    if paper:
        lines.append(paper)
    return "\n".join(lines)
