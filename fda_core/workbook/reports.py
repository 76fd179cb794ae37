"""Reports: one call per comparison of federated methods, from the runs to the saved table and figure.

Notebooks 04 and 05 compare methods over a grid of settings again and again; each comparison is the same
sequence — configs for every (variant × target × method × seed), the runs through the result store,
the per-run table, mean ± std over trials, the papers' numbers beside ours, the CSV with a setting note
generated from the configs that ran, a figure, and the wall-clock timings kept apart — so it is one
call here, :func:`compare_methods`, returning a :class:`Comparison` for the notebook to display.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import matplotlib.pyplot as plt
import pandas as pd

from ..common.checks import check_int
from ..common.files import read_note, resolve_output, write_table, write_timings
from ..common.store import ResultStore
from ..data.datasets import FDADataset, get_dataset, train_pool_of
from ..experiments.federated import dataset_key, make_config, run_many, sweep_configs, target_index
from ..experiments.methods import get_method, paper_label
from ..experiments.paper_numbers import beside_paper, paper_setting, paper_table
from ..experiments.personalisation import SOURCE_SWEEP_GRID, compute_sweep_runs, source_sweep, sweep_run_configs
from ..experiments.tables import (RUN_COLUMNS, beta_table, format_value, results_table, setting_note, summary_table,
                                  timings_table)
from ..experiments.worker_pool import check_workers
from ..viz.plotting import plot_accuracy_vs_shift, plot_beta_grid, plot_method_bars, save_figure

__all__ = ["Comparison", "compare_methods", "data_description", "CommittedTable", "committed_table", "target_train_pool", "counts_within_pool", "auto_beta_report", "SourceSweep", "planned_sweep_note", "read_committed_sweep", "source_sweep_report",
           "STATISTICS"]

#: The per-run statistics a comparison can tabulate (columns of
#: :func:`fda_core.experiments.tables.results_table`), as the CSV notes describe them.
STATISTICS = {
    "final_acc": "target test accuracy (%) after the last round (final_acc)",
    "last5_acc": "target test accuracy (%) averaged over the last 5 rounds (last5_acc; the auto-weighted paper's "
                 "statistic, docs/experiments.md)",
}


@dataclass
class Comparison:
    """The outcome of :func:`compare_methods`.

    Attributes:
        results: the run results (``run_experiment`` dicts with their ``labels``).
        runs: one row per run (:func:`fda_core.experiments.tables.results_table`).
        formatted: mean (std) over trials per method and value of ``across`` (strings, for display).
        means, stds: the same as numbers.
        table: what the CSV holds: the means beside the paper's numbers (``paper <column>`` columns), or
            the rounded means when there is no paper table.
        note: the setting note written into the CSVs (generated from the resolved configs).
        figure: the matplotlib figure (None without ``plot``); ``files``: the files written.
        store_summary: how many runs were reused from the result store, from which code revision.
    """

    results: list[dict[str, Any]]
    runs: pd.DataFrame
    formatted: pd.DataFrame
    means: pd.DataFrame
    stds: pd.DataFrame
    table: pd.DataFrame
    note: str
    figure: Any = None
    files: list[Path] = field(default_factory=list)
    store_summary: str = ""

    def __repr__(self) -> str:
        return f"<Comparison of {len(self.results)} runs: {list(self.means.index)} × {list(self.means.columns)}>"


def _beside_paper(means: pd.DataFrame, paper: str, aliases: Mapping[str, str] | None = None) -> pd.DataFrame:
    """:func:`beside_paper` matching our rows to the paper's by the papers' names of our labels
    (:func:`fda_core.experiments.methods.paper_label`: "FedGP (cosine)" is the paper's "FedGP"), or by ``aliases``
    (our label → the paper's row, e.g. :data:`fda_core.experiments.paper_numbers.SCRIPTS_TARGET_ONLY`); our labels
    stay."""
    aliases = dict(aliases or {})
    keyed = means.rename(index=lambda label: aliases.get(label, paper_label(label)))
    if not keyed.index.is_unique:
        return beside_paper(means, paper)
    joined = beside_paper(keyed, paper)
    joined.index = means.index
    return joined


def data_description(configs: Sequence[Mapping[str, Any]]) -> str:
    """The description (``describe()``) of the data set of ``configs[0]`` (run configs, as
    :func:`fda_core.experiments.federated.sweep_configs` makes them), built from its resolved ``dataset`` and
    ``dataset_options``; where the configs use more than one data set, a sentence after it says that it is the first
    of how many, and that a CSV note's "varies:" line gives every run's options. For the CSV notes: a description
    written once for a notebook (its headline noise, say) would describe other runs than a section's (2026-12-02:
    notebook 05's notes gave noise 0.4 and the IID partition for the runs at 0.6 and with label-quantity sources)."""
    if not configs:
        raise ValueError("configs must hold at least one run's config, got none")
    resolved = [make_config(**c) for c in configs]  # the defaults filled in, as the runs get them
    keys = list(dict.fromkeys(dataset_key(c) for c in resolved))
    first = resolved[0]
    text = get_dataset(first["dataset"], **first["dataset_options"]).describe()
    if len(keys) > 1:
        text += (f"\nThe description is of the first run's data set, one of the {len(keys)} these runs use (the "
                 f"\"varies:\" line gives each run's options).")
    return text


def _row_order(methods: Sequence[Any], configs: Sequence[Mapping[str, Any]], labels: Sequence[Mapping[str, Any]]) -> list[str]:
    """The table's rows: the labels the runs carry, grouped by method in the order of ``methods`` (the first spec of
    each canonical method), in order of appearance within a method; so a label that only some variants run (a
    variant's method ``options``, e.g. "Target only (after warm-up)") follows the rows of its method."""
    names = [get_method(m).name for m in methods]
    first: dict[str, int] = {}
    for cfg, lab in zip(configs, labels):
        first.setdefault(lab["method"], names.index(cfg["rule"]) if cfg["rule"] in names else len(names))
    return sorted(first, key=first.__getitem__)  # sorted() is stable: ties keep their order of appearance


def compare_methods(
    methods: Sequence[str],
    base: Mapping[str, Any],
    *,
    across: str,
    experiment: str,
    store: ResultStore | str | None = None,
    targets: Sequence[Any] = (None,),
    seeds: Sequence[int] = (0,),
    variants: Sequence[Mapping[str, Any]] = ({},),
    by: str = "method",
    panel: str | None = None,
    value: str = "final_acc",
    average: bool = True,
    paper: str | None = None,
    paper_aliases: Mapping[str, str] | None = None,
    note: str = "",
    out_dir: str | Path | None = None,
    table_name: str | None = None,
    figure_name: str | None = None,
    runs_name: str | None = None,
    plot: str | None = None,
    title: str | None = None,
    log_x: bool = False,
    invert_x: bool = False,
    timings_stem: str | None = None,
    quick: bool = False,
    progress: bool = True,
    tuned: Mapping[Any, Mapping[str, Mapping[str, Any]]] | None = None,
    per_method: Mapping[str, Mapping[str, Any]] | None = None,
    workers: int = 1,
    data_seed: str = "fixed",
    describe_data: bool = False,
) -> Comparison:
    """Run every (variant × target × method × seed) through the result store and report it.

    Args:
        methods: method specs from the registry (``"fedgp"``, ``"fedgp(beta=1.0)"``); rows in this order.
        base: config shared by every run (:data:`fda_core.experiments.federated.DEFAULT_CONFIG` keys).
        across: the table's columns: a config or label column that varies (``"target"``, ``"noise_std"``,
            ``"eta"``, ``"beta"``, ...).
        experiment: the result store's folder for these runs.
        store: a :class:`ResultStore`, a folder, or None (no store).
        targets, seeds, variants: the grid (:func:`fda_core.experiments.federated.sweep_configs`).
        tuned: per target, canonical method name → options set in that target's runs (e.g.
            :attr:`SourceSweep.chosen`); rows keep the methods' labels.
        per_method: canonical method name → config keys set in that method's runs (e.g. the reference
            scripts' per-row budgets, :func:`fda_core.experiments.paper_numbers.reference_budgets`).
        by: the table's rows: ``"method"`` (display labels) or another label column (e.g. ``"rule"``).
        panel: a second config or label column that varies besides ``across`` (e.g. ``"noise_std"`` for FedGP
            paper Table 3, labelled samples at three noise levels): the table's rows become (``by``, ``panel``)
            and a ``"lines"`` figure draws one panel per value of it, side by side with a shared y axis (not with
            ``paper`` or ``plot="bars"``; refused before any run). None: runs of one ``by`` and ``across`` value that differ in anything
            else are pooled into one cell.
        value: the statistic of each run tabulated and plotted: ``"final_acc"`` (target accuracy after the
            last round) or ``"last5_acc"`` (mean over the last 5 rounds, the auto-weighted paper's statistic);
            the CSV notes say which (:data:`STATISTICS`).
        average: keep the ``Avg`` column (mean over the columns).
        paper: the name of a published table (:mod:`fda_core.experiments.paper_numbers`) put beside ours.
        paper_aliases: our display label → the paper's row name, where the paper's code ran that row as one of our
            named variants (:data:`fda_core.experiments.paper_numbers.SCRIPTS_TARGET_ONLY`: the FedGP paper's
            semi-synthetic scripts train Target only after their warm-up); other labels match by
            :func:`fda_core.experiments.methods.paper_label`.
        note: more lines for the CSV notes, after the setting generated from the resolved configs; with ``paper``
            the published table's source and setting follow.
        describe_data: begin those lines with the description of the first run's data set (:func:`data_description`,
            built from that run's resolved config, so it gives the noise, partition and seed the runs used).
        out_dir, table_name, figure_name: write ``<table_name>.csv`` (the table) and ``<figure_name>.png/
            .pdf/.csv`` (the figure and the per-run table) into ``out_dir``; ``runs_name``: also write the
            per-run table as ``<runs_name>.csv`` (for a comparison without a figure).
        plot: ``"bars"`` (grouped bars per value of ``across``, the paper's numbers as ticks), ``"lines"``
            (accuracy against ``across``, one line per row), or None.
        timings_stem: write the runs' wall-clock seconds to ``executed/timings/<timings_stem>/<name>.csv``
            (never into the result CSVs); with ``quick`` (a quick run) under ``executed/quick/timings/``.
        workers: runs computed side by side, each in its own process (:func:`fda_core.experiments.federated.run_many`).
        data_seed: ``"fixed"`` (one draw of the data set for every trial) or ``"per_trial"`` (the data set drawn
            anew per trial from the trial's seed, as the FedGP papers' scripts;
            :func:`fda_core.experiments.federated.sweep_configs`).
    """
    if value not in STATISTICS:
        raise ValueError(f"value must be one of {sorted(STATISTICS)}, got {value!r}")
    if plot not in ("bars", "lines", None) or (plot == "bars" and panel is not None):
        raise ValueError(f"plot must be 'bars' (without panel), 'lines' or None, got {plot!r}")
    if panel is not None and paper:
        raise ValueError(f"panel={panel!r} cannot be combined with paper={paper!r}: the paper's rows are matched by "
                         "one row label")
    configs, labels = sweep_configs(base, methods, targets=targets, seeds=seeds, variants=variants, tuned=tuned,
                                    per_method=per_method, data_seed=data_seed)
    columns = set(RUN_COLUMNS).union(*labels)  # the per-run table's columns (results_table), known before any run
    if describe_data:
        note = "\n".join(x for x in (data_description(configs), note) if x)
    if panel is not None and (panel in (by, across) or panel not in columns):
        raise ValueError(f"panel must be a column of the runs other than by={by!r} and across={across!r}, got {panel!r}")
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    results = run_many(configs, store=store, experiment=experiment, labels=labels, progress=progress, workers=workers)
    runs = results_table(results)
    order = _row_order(methods, configs, labels) if by == "method" else None
    rows = (by,) if panel is None else (by, panel)
    formatted, means, stds = summary_table(runs, by=rows, across=across, value=value, order=order)
    if not average:
        formatted, means, stds = formatted.drop(columns="Avg"), means.drop(columns="Avg"), stds.drop(columns="Avg")
    table = _beside_paper(means, paper, paper_aliases) if paper else means.round(2)
    extra = "\n".join(x for x in (note, f"Ours: {STATISTICS[value]}, mean over the seeds.",
                                   paper_setting(paper) if paper else "") if x)
    note = setting_note(results, paper=extra)
    comparison = Comparison(results, runs, formatted, means, stds, table, note,
                            store_summary=store.summary(experiment) if store is not None else "no result store")
    if plot is not None:
        if panel is None:
            fig, ax = plt.subplots(figsize=(9, 3.8) if plot == "bars" else (6.5, 4))
            if plot == "bars":
                plot_method_bars(runs, across=across, value=value, methods=order, ax=ax,
                                 paper=paper_table(paper) if paper else None)
            else:
                plot_accuracy_vs_shift(runs, across, value=value, methods=order, hue=by, ax=ax, invert=invert_x, log_x=log_x)
            if title:
                ax.set_title(title, fontsize=10)
        else:
            values = sorted(set(runs[panel]))
            fig, axes = plt.subplots(1, len(values), figsize=(4.2 * len(values) + 1, 4), sharey=True, squeeze=False)
            for ax, v in zip(axes[0], values):
                plot_accuracy_vs_shift(runs[runs[panel] == v], across, value=value, methods=order, hue=by, ax=ax,
                                       invert=invert_x, log_x=log_x)
                ax.set_title(f"{panel} {format_value(v)}", fontsize=10)
            if title:
                fig.suptitle(title, fontsize=10)
            fig.tight_layout()
        comparison.figure = fig
    if out_dir is not None:
        out = Path(out_dir)
        if table_name:
            comparison.files.append(write_table(out / f"{table_name}.csv", table.reset_index(names=list(rows)), note))
        if figure_name and comparison.figure is not None:
            comparison.files += save_figure(comparison.figure, out, figure_name, runs, note)
        if runs_name:
            comparison.files.append(write_table(out / f"{runs_name}.csv", runs, note))
    if timings_stem:
        write_timings(timings_stem, table_name or figure_name or experiment, timings_table(results), quick=quick)
    return comparison


@dataclass(frozen=True)
class CommittedTable:
    """A table a notebook shows instead of recomputing it (a check kept out of the main job, README
    § Running notebooks): the ``table``, the CSV's ``note`` lines, its ``path``."""

    table: pd.DataFrame
    note: list[str]
    path: Path


def committed_table(figures_dir: str | Path, name: str, command: str, *, index: bool = True) -> CommittedTable | None:
    """The committed ``<figures_dir>/<name>.csv`` (relative ``figures_dir`` under the repository root, as the
    notebooks resolve theirs; never the staging or quick folder), for a section that did not run: prints
    where it comes from and ``command``, the run that regenerates it. ``index``: the first column is the
    index (a table of means), else none is (a file of runs). None, saying so, when there is none (e.g.
    another ``figures_dir``)."""
    path = resolve_output(figures_dir) / f"{name}.csv"
    if not path.is_file():
        print(f"Not run here, and no committed {name}.csv under {path.parent}: `{command}` makes it.")
        return None
    table = pd.read_csv(path, comment="#", index_col=0 if index else None)
    print(f"Not run here: the committed results of `{command}` ({path}).")
    return CommittedTable(table=table, note=read_note(path), path=path)


def target_train_pool(dataset: FDADataset, train_fraction: float, target: int | str | None = None) -> int:
    """How many of the target environment's examples form its train pool, the most labelled target examples a run
    can ask for (``n_target_labeled``; :func:`fda_core.data.datasets.train_pool_of`, FedGP paper App. B.6: all of them
    when the data set holds the target's test set apart, e.g. NoisyFeatures ``test_per_class``).
    ``target`` is resolved as a run resolves it (:func:`fda_core.experiments.federated.target_index`: None means
    the data set's ``default_target``, else environment 0). Notebooks check their counts against it before any
    run starts."""
    return train_pool_of(dataset, target_index(dataset, target), train_fraction)[0]


def counts_within_pool(counts: Sequence[int], pool: int, name: str, *, leave_out: bool = False) -> list[int]:
    """``counts`` of labelled target examples checked against the target's train pool (:func:`target_train_pool`):
    each must be an integer in [1, ``pool``], else ValueError naming ``name`` and the range, before any run starts.
    ``leave_out=True`` (a paper-scale setting whose counts some data sets cannot hold, e.g. the FedGP paper's 500 and
    1,000 against MNIST-5k's pool of 250) drops the counts above the pool instead and prints which; the rest is
    checked as before. Returns the counts kept, in order."""
    larger = [n for n in counts if not isinstance(n, bool) and isinstance(n, int) and n > pool]
    if leave_out and larger:
        print(f"{name}: the counts {larger} exceed the target's train pool of {pool} images here and are left out")
        counts = [n for n in counts if n not in larger]
    return [check_int(n, name, 1, pool) for n in counts]


def ordering_lines(means: pd.DataFrame, focus: str = "FedGP") -> list[str]:
    """What a comparison's means (rows = method labels, columns = settings) say, per setting: the methods
    from best to worst, and whether the first method whose label starts with ``focus`` (not an auto rule)
    beats every method that is neither a ``focus`` variant nor the Oracle. ValueError when no row matches."""
    label = next((m for m in means.index if m.startswith(focus) and "Auto" not in m), None)
    if label is None:
        raise ValueError(f"focus={focus!r} matches no method of the comparison: {list(means.index)}")
    lines = []
    for setting in means.columns:
        col = means[setting].dropna()
        ranked = col.sort_values(ascending=False)
        lines.append(f"{setting}: " + " > ".join(f"{m} {v:.1f}" for m, v in ranked.items()))
        rivals = col.drop([m for m in col.index if m.startswith((focus, "Oracle"))])
        verdict = "beats" if col[label] > rivals.max() else "does not beat"
        lines.append(f"  {label} {verdict} every non-oracle rival (best rival {rivals.idxmax()} {rivals.max():.1f})")
    return lines


def auto_beta_report(comparison: Comparison, *, out_dir: str | Path | None = None, figure_name: str | None = None,
                     cols: str = "target") -> pd.DataFrame:
    """The β per source and round of the runs of a comparison whose method estimates β (auto-weighted paper
    App. C.4, Fig. 5–6): the long table (:func:`fda_core.experiments.tables.beta_table`), and a grid of
    curves (auto rule × ``cols``) saved as ``<figure_name>`` with a note generated from those runs."""
    auto = [r for r in comparison.results if get_method(r["config"]["rule"]).estimates_beta]
    betas = beta_table(auto)
    if out_dir is not None and figure_name and len(betas):
        fig = plot_beta_grid(betas, rows="rule", cols=cols)
        save_figure(fig, Path(out_dir), figure_name, betas, "Auto beta per source per round.\n" + setting_note(auto))
    return betas


@dataclass
class SourceSweep:
    """The outcome of :func:`source_sweep_report`.

    Attributes:
        runs: one row per (held-out target, pseudo-target, method, value): ``acc`` (mean over seeds, %),
            ``std`` (over seeds; 0 for one seed), ``seeds``.
        choice: one row per (held-out target, method, value): ``score`` (the mean of ``acc`` over the
            pseudo-targets), ``default``, ``chosen``.
        chosen: held-out target → canonical method name → {option: chosen value}, for
            ``compare_methods(tuned=...)``.
        note: the setting note of the CSVs (generated from the runs' configs).
        results: the runs (``run_experiment`` dicts with their ``labels``).
    """

    runs: pd.DataFrame
    choice: pd.DataFrame
    chosen: dict[Any, dict[str, dict[str, Any]]]
    note: str
    results: list[dict[str, Any]] = field(default_factory=list)


def source_sweep_report(base: Mapping[str, Any], *, held_out: Sequence[Any], seeds: Sequence[int] = (0,),
                        grid: Mapping[str, tuple[str, Sequence[Any]]] = SOURCE_SWEEP_GRID,
                        methods: Sequence[str] | None = None, value: str = "final_acc",
                        store: ResultStore | str | None = None, experiment: str = "source_sweep",
                        dataset: Any = None, out_dir: str | Path | None = None, table_name: str | None = None,
                        timings_stem: str | None = None, quick: bool = False, workers: int = 1,
                        committed: str | Path | None = None, rerun_command: str = "") -> SourceSweep:
    """Choose the baselines' hidden options on source data only, per held-out target (``docs/baselines.md``
    § Source-data sweep).

    For every target ``T`` of ``held_out``, ``T`` is removed from the data; every other domain in turn plays the
    target, the rest its sources, and every ``method: (option, values)`` of ``grid`` runs at each value and seed
    (:func:`fda_core.experiments.personalisation.source_sweep`, under ``base``). A value's score for ``T`` is its
    accuracy (``value``, in %, mean over ``seeds``) averaged over the pseudo-targets; the chosen value is the best
    score, the method's default where it ties for best (else the first best in grid order). ``methods``
    (specs, e.g. a notebook's ``baselines``) keeps only the grid's methods among them.

    With ``out_dir`` and ``table_name`` writes ``<table_name>.csv`` (:attr:`SourceSweep.runs`) and
    ``<table_name>_choice.csv`` (:attr:`SourceSweep.choice`), each with a note generated from the runs.

    ``workers`` (≥ 1): with more than 1, every run of the sweep the store lacks is computed first, that many at a
    time in spawned processes (:func:`fda_core.experiments.personalisation.compute_sweep_runs`; the workers load
    the data set once from a file written here), the same runs as one after another.

    ``committed``: the folder of a committed sweep (``<table_name>_choice.csv`` and ``<table_name>.csv``, e.g. the
    notebook's ``figures/04_real_data``): when its note is the note these runs would get (the same configs: data set,
    budget, seeds, targets, methods and grid, :func:`planned_sweep_note`), nothing runs and the committed sweep is
    returned (``results`` empty; no file is written), printing where it comes from and ``rerun_command``; otherwise
    the sweep runs as without it. A sweep is a choice of hidden options, not a result: reading it back gives the
    baselines the options the sweep would choose, and the sweep is kept out of the main job (README § Running
    notebooks)."""
    from ..data.datasets import get_dataset

    if value not in STATISTICS:
        raise ValueError(f"value must be one of {sorted(STATISTICS)}, got {value!r}")
    workers = check_workers(workers)
    held_out = list(held_out)
    if not held_out:
        raise ValueError("held_out must name at least one target, got none")
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    if methods is not None:
        wanted = {get_method(m).name for m in methods}
        grid = {rule: entry for rule, entry in grid.items() if rule in wanted}
    ds = dataset if dataset is not None else get_dataset(base["dataset"], **base.get("dataset_options", {}))
    if len(ds.ENVIRONMENTS) < 3:
        raise ValueError(f"the source-data sweep needs 3 or more domains (a held-out target, a pseudo-target and a "
                         f"source), got {list(ds.ENVIRONMENTS)}")
    if committed is not None and table_name:
        planned = planned_sweep_note(base, held_out=held_out, seeds=seeds, grid=grid, value=value, dataset=ds)
        if (reused := read_committed_sweep(committed, table_name, planned, grid)) is not None:
            print(f"The committed source-data sweep ({Path(committed) / table_name}.csv) was made with these settings: "
                  f"its choice is used, nothing is rerun" + (f" (`{rerun_command}` reruns it)." if rerun_command else "."))
            return reused
    computed = None
    if workers > 1:  # every run first, side by side; the loop below then reads them from ``computed``
        calls = [dict(method=rule, option=option, values=values, held_out=target, pseudo_target=pseudo, seeds=seeds)
                 for target in held_out for rule, (option, values) in grid.items()
                 for pseudo in _pseudo_targets(ds, target)]
        computed = compute_sweep_runs(calls, dict(base), store=store, experiment=experiment, workers=workers,
                                      dataset=ds)
    rows, choice, chosen, results = [], [], {}, []
    for target in held_out:
        pseudo_targets = _pseudo_targets(ds, target)
        chosen[target] = {}
        for rule, (option, values) in grid.items():
            method = get_method(rule)
            default = method.options[option].default
            scores = {v: [] for v in values}
            for pseudo in pseudo_targets:
                runs = source_sweep(rule, option, values, dict(base), held_out=target, pseudo_target=pseudo,
                                    seeds=seeds, dataset=ds, store=store, experiment=experiment, computed=computed)
                results += runs
                per_run = results_table(runs)
                for v in values:
                    accs = per_run.loc[[r["labels"]["value"] == v for r in runs], value]
                    scores[v].append(float(accs.mean()))
                    rows.append({"held_out": str(target), "pseudo_target": str(pseudo), "method": method.label,
                                 "rule": rule, "option": option, "value": format_value(v), "default": v == default,
                                 "acc": round(float(accs.mean()), 2),
                                 "std": round(float(accs.std(ddof=1)) if len(accs) > 1 else 0.0, 2),
                                 "seeds": len(accs)})
            mean = {v: sum(sc) / len(sc) for v, sc in scores.items()}
            best = max(mean.values())
            pick = default if default in mean and mean[default] == best else next(v for v in values if mean[v] == best)
            chosen[target][rule] = {option: pick}
            choice += [{"held_out": str(target), "method": method.label, "rule": rule, "option": option,
                        "value": format_value(v), "default": v == default, "score": round(mean[v], 2), "chosen": v == pick}
                       for v in values]
    runs_table = pd.DataFrame(rows, columns=["held_out", "pseudo_target", "method", "rule", "option", "value",
                                             "default", "acc", "std", "seeds"])
    choice_table = pd.DataFrame(choice, columns=["held_out", "method", "rule", "option", "value", "default", "score",
                                                 "chosen"])
    note = setting_note(results, paper=_sweep_paper_line(value))
    sweep = SourceSweep(runs_table, choice_table, chosen, note, results)
    if out_dir is not None and table_name:
        write_table(Path(out_dir) / f"{table_name}.csv", runs_table, note)
        write_table(Path(out_dir) / f"{table_name}_choice.csv", choice_table, note)
    if timings_stem:
        write_timings(timings_stem, table_name or experiment, timings_table(results), quick=quick)
    return sweep


def _pseudo_targets(dataset: Any, held_out: Any) -> list[Any]:
    """The domains that play the target in turn once ``held_out`` is removed (docs/baselines.md § Source-data sweep)."""
    return [e for i, e in enumerate(dataset.ENVIRONMENTS) if i != dataset.env_index(held_out)]


def _sweep_paper_line(value: str) -> str:
    return ("Source-data sweep (docs/baselines.md): for each held-out target, that target is removed from the data and "
            "every other domain in turn plays the target (the config's target is that pseudo-target). acc: "
            f"{STATISTICS[value]}, mean over the seeds; score: acc averaged over the pseudo-targets; chosen: the best "
            "score, the method's default where it ties for best.")


def planned_sweep_note(base: Mapping[str, Any], *, held_out: Sequence[Any], seeds: Sequence[int],
                       grid: Mapping[str, tuple[str, Sequence[Any]]], value: str, dataset: Any) -> str:
    """The note :func:`source_sweep_report` writes for the sweep of these arguments (``grid`` already narrowed
    to the methods asked for), from the configs its runs would resolve to, without running any."""
    planned = []
    for target in held_out:
        for rule, (option, values) in grid.items():
            for pseudo in _pseudo_targets(dataset, target):
                for _, _, config in sweep_run_configs(rule, option, values, dict(base), held_out=target,
                                                      pseudo_target=pseudo, seeds=seeds, dataset=dataset):
                    planned.append({"config": config,
                                    "method": get_method(rule, **config["method_options"]).display_label})
    return setting_note(planned, paper=_sweep_paper_line(value))


def read_committed_sweep(folder: str | Path, table_name: str, note: str,
                         grid: Mapping[str, tuple[str, Sequence[Any]]]) -> SourceSweep | None:
    """The sweep committed as ``<folder>/<table_name>.csv`` and ``<table_name>_choice.csv`` (relative ``folder``
    under the repository root) when the choice's note is ``note`` line for line, else None (also when a file is
    missing, or a chosen value is not one of ``grid``'s). ``chosen`` holds ``grid``'s own values (the CSV's
    strings are matched by :func:`~fda_core.experiments.tables.format_value`)."""
    folder = resolve_output(folder)
    runs_path, choice_path = folder / f"{table_name}.csv", folder / f"{table_name}_choice.csv"
    if not (runs_path.is_file() and choice_path.is_file()) or read_note(choice_path) != note.splitlines():
        return None
    as_text = {"held_out": str, "pseudo_target": str, "value": str}
    choice = pd.read_csv(choice_path, comment="#", dtype=as_text)
    chosen: dict[Any, dict[str, dict[str, Any]]] = {}
    for row in choice[choice.chosen].itertuples():
        option, values = grid.get(row.rule, (None, ()))
        match = [v for v in values if format_value(v) == row.value and option == row.option]
        if not match:
            return None
        chosen.setdefault(row.held_out, {})[row.rule] = {option: match[0]}
    runs = pd.read_csv(runs_path, comment="#", dtype=as_text)
    return SourceSweep(runs, choice, chosen, note)
