"""Notebook 06's tables and the sentences that report their numbers, from the records of
:class:`fda_core.experiments.translation.study.TranslationStudy` (each a stored
:func:`~fda_core.experiments.translation.experiments.run_translation` result plus its ``config``).

Every table has a fixed column order (a record loaded from the result store has its keys sorted, a fresh
one does not, so nothing here follows a record's key order), and no table holds wall-clock times: those
go to :func:`timings_table`, written apart from the result CSVs. The ``describe_*`` functions and
:func:`summary_paragraph` print the numbers the notebook's text discusses, so the text never quotes a
number by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from ..paper_numbers import paper_table, paper_value
from .comms import expected_parameters
from .study import option_of

__all__ = ["final_table", "j_table", "vw_table", "summary_table", "communication_table", "communication_by_message",
           "iterations_table", "iterations_vs_paper", "iterations_by_option", "with_committed_options", "table6_comparison", "cross_check_table",
           "timings_table", "describe_variants", "describe_j", "describe_vw", "describe_iterations",
           "describe_options", "describe_communication", "summary_paragraph", "SUMMARY_COLUMNS", "OPTION_COLUMNS",
           "OPTION_KEY_COLUMNS"]

Records = Mapping[str, Mapping[str, Any]]

BY_MESSAGE_COLUMNS = ["run", "stage", "tag", "direction", "params"]


def _paper_row(config: Mapping[str, Any]) -> str | None:
    """The row of the paper's Tables 5-6 that matches a run's variant and histogram use."""
    name = _variant_label(config)
    return name if name in paper_table("INBIterations").index else None


def _variant_label(config: Mapping[str, Any]) -> str:
    """The variant as the paper's tables name it: INB, AEINB, IndAEINB, with "Hist " for VW histograms."""
    return ("Hist " if config["n_bins"] is not None else "") + config["variant"]


def _objective_scale(r: Mapping[str, Any]) -> str:
    """The objective's normalisation of a run (:func:`~fda_core.experiments.translation.inb.objective_norm`):
    "1/(MKn)" (paper eq. 2, library convention) or "1/(Kn)" (the official code, reference convention)."""
    return "1/(MKn)" if r["config"]["convention"] == "library" else "1/(Kn)"


def _paper_table5(config: Mapping[str, Any]) -> float:
    """The paper's Table 5 mean (J = 100) for the run's variant, NaN when the paper has no such row."""
    row = _paper_row(config)
    return float(paper_table("INBIterations").loc[row, 100]) if row is not None else np.nan


def _mean_iterations(r: Mapping[str, Any]) -> float:
    return round(float(np.mean(list(r["iterations_per_class"].values()))), 1)


# ------------------------------------------------------------------------------------------------ tables
def final_table(records: Records) -> pd.DataFrame:
    """Per run: WD at depth 0 and after the last layer, parameters per client (total, up, down)."""
    return pd.DataFrame([dict(run=k, wd_start=r["wd_start"], wd_final=r["wd_final"], params_per_client=r["params_total"],
                              up=r["params_up"], down=r["params_down"]) for k, r in records.items()],
                        columns=["run", "wd_start", "wd_final", "params_per_client", "up", "down"])


def j_table(records: Records) -> pd.DataFrame:
    """The J sweep: per run, J, final WD and parameters per client."""
    return pd.DataFrame([dict(J=r["config"]["max_iter"], wd_final=r["wd_final"], params_per_client=r["params_total"])
                         for r in records.values()], columns=["J", "wd_final", "params_per_client"])


def vw_table(v_runs: Mapping[str, Records]) -> pd.DataFrame:
    """The V sweeps: per variant and V, final WD and parameters per client."""
    return pd.DataFrame([dict(run=f"Hist {v}", V=r["config"]["n_bins"], wd_final=r["wd_final"],
                              params_per_client=r["params_total"]) for v, runs in v_runs.items() for r in runs.values()],
                        columns=["run", "V", "wd_final", "params_per_client"])


#: columns of summary.csv (:func:`summary_table`)
SUMMARY_COLUMNS = ["run", "variant", "V", "option", "input_transform", "objective_scale", "bary_bins", "wd_identity",
                   "wd_start", "wd_final", "ratio_to_identity", "wd_rank", "fig2a_rank", "paper_fig2a_rank",
                   "params_per_client", "iterations_mean", "paper_table5_mean"]


def summary_table(records: Records, wd_identity: float) -> pd.DataFrame:
    """summary.csv: per run, its variant (as the paper names it: INB, AEINB, IndAEINB, Hist …), V, the option set
    and what it sets (input transform, objective scale, client-histogram bins), the identity's WD, WD at
    depth 0 and at the end, final / identity, ``wd_rank`` (1 = lowest final WD of the table), ``fig2a_rank``
    (the same among the runs without VW histograms, paper Fig. 2a) beside the paper's order
    (``paper_fig2a_rank``, :mod:`~fda_core.experiments.paper_numbers` ``fig2a_wd_order``), parameters per
    client, and the Armijo iterations per digit (mean over digits; the count of Table 5) beside the paper's."""
    order = paper_value("fig2a_wd_order")
    rows = [dict(run=k, variant=_variant_label(r["config"]), V=r["config"]["n_bins"], option=option_of(r["config"]),
                 input_transform=r["input_transform"], objective_scale=_objective_scale(r), bary_bins=r["bary_bins"],
                 wd_identity=wd_identity, wd_start=r["wd_start"], wd_final=r["wd_final"],
                 ratio_to_identity=r["wd_final"] / wd_identity, params_per_client=r["params_total"],
                 iterations_mean=_mean_iterations(r), paper_table5_mean=_paper_table5(r["config"]),
                 paper_fig2a_rank=(order.index(r["config"]["variant"]) + 1
                                   if r["config"]["n_bins"] is None and r["config"]["variant"] in order else np.nan))
            for k, r in records.items()]
    t = pd.DataFrame(rows, columns=[c for c in SUMMARY_COLUMNS if c not in ("wd_rank", "fig2a_rank")])
    t["V"] = t["V"].astype("Int64")
    t["wd_rank"] = t.wd_final.rank(method="min").astype(int)
    plain = t.V.isna()
    t["fig2a_rank"] = t.wd_final.where(plain).rank(method="min").astype("Int64")
    t["paper_fig2a_rank"] = t["paper_fig2a_rank"].astype("Int64")
    return t[SUMMARY_COLUMNS]


def _formula_total(r: Mapping[str, Any]) -> int:
    c = r["config"]
    n = c["data"]["n_train"]
    return sum(expected_parameters(r["dim"], c["n_directions"], n, h["n_iter"], h["n_trials"], c["n_bins"],
                                   r["bary_bins"], r["bary_grid"]).total for h in r["history"])


def communication_table(records: Records) -> pd.DataFrame:
    """communication.csv: per run, the parameters per client counted by the message log (up, down, total),
    the closed-form total (:func:`~fda_core.experiments.translation.comms.expected_parameters`, per layer and
    class from the run's iterations and Armijo trials) and the mean per layer. Raises AssertionError when
    a counted total differs from the formula."""
    rows = [dict(run=k, d=r["dim"], counted_up=r["params_up"], counted_down=r["params_down"],
                 counted_total=r["params_total"], formula_total=_formula_total(r),
                 per_layer=r["params_total"] / r["config"]["n_layers"]) for k, r in records.items()]
    table = pd.DataFrame(rows, columns=["run", "d", "counted_up", "counted_down", "counted_total", "formula_total",
                                        "per_layer"])
    bad = table[table.counted_total != table.formula_total]
    if len(bad):
        raise AssertionError(f"counted communication differs from the closed form:\n{bad.to_string()}")
    return table


def communication_by_message(record: Mapping[str, Any], run: str | None = None) -> pd.DataFrame:
    """communication_by_message.csv: one run's parameters per client by (stage, message tag, direction),
    columns run, stage, tag, direction, params, rows sorted by stage, tag, direction."""
    t = pd.DataFrame(record["comm_by_tag"], columns=BY_MESSAGE_COLUMNS[1:])
    t.insert(0, "run", run or record["name"])
    return t.sort_values(["stage", "tag", "direction"], ignore_index=True)[BY_MESSAGE_COLUMNS]


def iterations_table(records: Records) -> pd.DataFrame:
    """iterations.csv: per run and digit, Armijo iterations (objective evaluations after the first, summed
    over the layers; the count of the paper's Tables 5-6), with the run's variant as the paper names it and its
    option set."""
    return pd.DataFrame([dict(run=k, variant=_variant_label(r["config"]), option=option_of(r["config"]),
                              digit=int(digit), iterations=int(its)) for k, r in records.items()
                         for digit, its in sorted(r["iterations_per_class"].items(), key=lambda kv: int(kv[0]))],
                        columns=["run", "variant", "option", "digit", "iterations"])


def iterations_vs_paper(records: Records) -> pd.DataFrame:
    """Per run: mean, min, max iterations per digit and per Stiefel iteration (÷ L·J), beside the paper's
    Table 5 (J = 100) for the matching variant (the same divided by the paper's L·J)."""
    paper = paper_table("INBIterations")
    setting = paper_value("setting")
    rows = []
    for k, r in records.items():
        its = np.array(list(r["iterations_per_class"].values()), dtype=float)
        c = r["config"]
        row = _paper_row(c)
        mean = paper.loc[row, 100] if row is not None else np.nan
        rows.append(dict(run=k, mean=round(its.mean(), 1), min=its.min(), max=its.max(),
                         per_iteration=round(its.mean() / (c["n_layers"] * c["max_iter"]), 3),
                         paper_table5_mean=mean, paper_per_iteration=round(mean / (setting["L"] * 100), 3)))
    return pd.DataFrame(rows, columns=["run", "mean", "min", "max", "per_iteration", "paper_table5_mean",
                                       "paper_per_iteration"]).set_index("run")


#: columns of iterations_vs_paper.csv (:func:`iterations_by_option`)
OPTION_COLUMNS = ["variant", "option", "run", "input_transform", "objective_scale", "bary_bins", "wd_start", "wd_final",
                  "digits", "ours_mean", "ours_sd", "ours_min", "ours_max", "ours_per_iteration", "paper",
                  "paper_per_iteration", "ratio_to_paper"]


def iterations_by_option(option_runs: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> pd.DataFrame:
    """iterations_vs_paper.csv: the paper's Table 5 (Armijo iterations per digit: objective evaluations after the
    first, backtracking included, summed over the layers; mean over the digits) per variant and option set,
    beside the paper's value (``ours_sd``: standard deviation over the ``digits``); with what the option set
    sets and the run's WD at depth 0 and after the last layer. ``option_runs``: {Table-5 row: {option: record}}
    (:meth:`~fda_core.experiments.translation.study.TranslationStudy.option_runs`)."""
    setting = paper_value("setting")
    rows = []
    for variant, by_option in option_runs.items():
        for option, r in by_option.items():
            c = r["config"]
            its = np.array(list(r["iterations_per_class"].values()), dtype=float)
            paper = _paper_table5(c)
            rows.append(dict(variant=variant, option=option, run=r["name"], input_transform=r["input_transform"],
                             objective_scale=_objective_scale(r), bary_bins=r["bary_bins"], wd_start=r["wd_start"],
                             wd_final=r["wd_final"], digits=its.size, ours_mean=round(its.mean(), 1),
                             ours_sd=round(float(its.std(ddof=1)), 2) if its.size > 1 else np.nan,
                             ours_min=int(its.min()), ours_max=int(its.max()),
                             ours_per_iteration=round(its.mean() / (c["n_layers"] * c["max_iter"]), 3), paper=paper,
                             paper_per_iteration=round(paper / (setting["L"] * 100), 3),
                             ratio_to_paper=round(its.mean() / paper, 4)))
    return pd.DataFrame(rows, columns=OPTION_COLUMNS)


# the columns that name a Table-5 run and its option set (its numbers move between CPU kinds: the WD in its last
# digits, the iteration counts by a few trials, README § Runs you can trust)
OPTION_KEY_COLUMNS = ["variant", "option", "run", "input_transform", "objective_scale", "bary_bins", "digits"]


def with_committed_options(table: pd.DataFrame, committed: pd.DataFrame | None, committed_note: Sequence[str],
                           setting: str) -> tuple[pd.DataFrame, bool]:
    """``table`` (:func:`iterations_by_option` of the runs fitted here, without ``compare_options``: the plan's
    option set only) or the committed ``iterations_vs_paper.csv`` (``committed``, both option sets, read back, with
    its note lines ``committed_note``; None when there is none): (the committed table, True) when it was made
    with this run's settings (its first note line is ``setting``, the study's
    :meth:`~fda_core.experiments.translation.study.TranslationStudy.setting_note` of this run's option runs) and
    names the same runs (:data:`OPTION_KEY_COLUMNS` of each row of ``table``), else (``table``, False), so a run
    with other settings never shows another setting's comparison as its own."""
    if committed is None or list(committed.columns) != OPTION_COLUMNS or list(committed_note[:1]) != [setting]:
        return table, False
    keys = set(committed[OPTION_KEY_COLUMNS].astype(str).apply(tuple, axis=1))
    ours = set(table[OPTION_KEY_COLUMNS].astype(str).apply(tuple, axis=1))
    return (committed, True) if ours and ours <= keys else (table, False)


def table6_comparison(records: Records) -> str:
    """A sentence comparing the run with the largest J (when it is at least 200) with the paper's Table 6
    (J = 300), per Stiefel iteration; "" when no run has J ≥ 200."""
    if not records:
        return ""
    label, r = max(records.items(), key=lambda kv: kv[1]["config"]["max_iter"])
    c = r["config"]
    if c["max_iter"] < 200:
        return ""
    per = float(np.mean(list(r["iterations_per_class"].values())))
    row = _paper_row(c) or "IndAEINB"
    paper = float(paper_table("INBIterations").loc[row, 300])
    layers = paper_value("setting")["L"]
    return (f"{c['variant']} with J={c['max_iter']}: {per:.0f} iterations per digit = "
            f"{per / (c['n_layers'] * c['max_iter']):.3f} per iteration; paper Table 6 (J=300, {row}): {paper:.0f} = "
            f"{paper / (layers * 300):.3f} per iteration (J=300 not rerun here).")


def cross_check_table(records: Records) -> pd.DataFrame:
    """wd_cross_check.csv: per run with a cross-check, the final WD by the primary solver and by the other
    one, and their relative difference (rounded to 4 digits)."""
    rows = [dict(run=k, primary=r["config"]["wd_method"], wd_primary=r["cross_check"]["wd_primary"],
                 other=r["cross_check"]["method"], wd_other=r["cross_check"]["wd"])
            for k, r in records.items() if "cross_check" in r]
    t = pd.DataFrame(rows, columns=["run", "primary", "wd_primary", "other", "wd_other"])
    t["relative_difference"] = ((t.wd_other - t.wd_primary) / t.wd_primary).round(4)
    return t


def timings_table(records: Records) -> pd.DataFrame:
    """Wall-clock seconds of each run as measured when it was computed (a run loaded from the result store
    keeps the times of its original fit): fitting, WD evaluation and the solver cross-check; a run built from
    another without refitting names it in ``derived_from`` (and spent no time). For
    :func:`fda_core.common.files.write_timings`, never for the result CSVs."""
    return pd.DataFrame([dict(run=k, device=r.get("device"), fit_seconds=round(r["fit_seconds"], 2),
                              eval_seconds=round(r.get("eval_seconds", np.nan), 2),
                              cross_check_seconds=(round(r["cross_check"]["seconds"], 2) if "cross_check" in r
                                                   else np.nan),
                              derived_from=r.get("derived_from", ""))
                         for k, r in records.items()],
                        columns=["run", "device", "fit_seconds", "eval_seconds", "cross_check_seconds", "derived_from"])


# --------------------------------------------------------------------------------------------- sentences
def _best_depth(r: Mapping[str, Any]) -> tuple[int, float]:
    best = min(r["curve"], key=lambda p: p["wd"])
    return int(best["depth"]), float(best["wd"])


def describe_variants(records: Records, wd_identity: float) -> str:
    """Panel (a) in numbers: per run the WD at depth 0, its lowest WD (and after which layer) and the final
    WD after L layers, with the parameters per client; which run ends lowest."""
    parts = []
    for k, r in records.items():
        depth, wd = _best_depth(r)
        last = r["curve"][-1]["depth"]
        low = "" if depth == last else f", lowest {wd:.1f} after layer {depth}"
        parts.append(f"{k} {r['wd_start']:.1f} → {r['wd_final']:.1f}{low} ({r['params_total']:.3g} parameters per client)")
    lowest = min(records, key=lambda k: records[k]["wd_final"])
    order = sorted(records.values(), key=lambda r: r["wd_final"])
    paper = [v for v in paper_value("fig2a_wd_order") if v in {r["config"]["variant"] for r in order}]
    ours = [r["config"]["variant"] for r in order]
    return (f"Held-out WD of the identity translator: {wd_identity:.1f}. From depth 0 to the last layer: "
            + "; ".join(parts) + f". Lowest final WD: {lowest}. Order by final WD: {' < '.join(ours)} (paper Fig. 2a: "
            f"{' < '.join(paper)}; {'the same' if ours == paper else 'a different'} order).")


def describe_j(records: Records) -> str:
    """Panel (b) in numbers: the final WD and the parameters per client for each J."""
    rows = sorted(records.values(), key=lambda r: r["config"]["max_iter"])
    wd = ", ".join(f"J={r['config']['max_iter']} {r['wd_final']:.1f}" for r in rows)
    params = ", ".join(f"J={r['config']['max_iter']} {r['params_total']:.3g}" for r in rows)
    text = f"Final WD: {wd}. Parameters per client: {params}."
    if len(rows) > 2:
        rest = [r["wd_final"] for r in rows[1:]]
        text += (f" For J ≥ {rows[1]['config']['max_iter']} the final WD spans {min(rest):.1f}–{max(rest):.1f}; "
                 f"J={rows[0]['config']['max_iter']} ends at {rows[0]['wd_final']:.1f}.")
    return text


def describe_vw(v_runs: Mapping[str, Records], plain: Records) -> str:
    """Panels (c)-(e) in numbers: per histogram variant and V, the final WD and the parameters relative to
    the same variant with sorted projections (``plain``: variant → record); V whose translator equals the
    plain one exactly (same final WD) are named."""
    out = []
    for v, runs in v_runs.items():
        base = plain[v]
        n = base["config"]["data"]["n_train"]
        items, same = [], []
        for r in sorted(runs.values(), key=lambda r: r["config"]["n_bins"]):
            b = r["config"]["n_bins"]
            items.append(f"V={b} {r['wd_final']:.1f} at {r['params_total'] / base['params_total']:.2f}×")
            if r["wd_final"] == base["wd_final"] and r["wd_final_per_class"] == base["wd_final_per_class"]:
                same.append(f"V={b}" + (f" = {b / n:g}n" if b >= n else "")
                            + (" (not refitted: V a multiple of n reproduces the plain search bit for bit)"
                               if r.get("derived_from") else ""))
        line = (f"Hist {v} (sorted samples: final WD {base['wd_final']:.1f}, {base['params_total']:.3g} parameters; "
                f"n = {n}): " + ", ".join(items) + " of the plain parameters")
        if same:
            line += f"; identical to the plain translator: {', '.join(same)}"
        out.append(line + ".")
    return " ".join(out)


def describe_iterations(table: pd.DataFrame, j_runs: Records | None = None) -> str:
    """The iteration counts in numbers: evaluations per Stiefel iteration here and in the paper's Table 5;
    with ``j_runs`` also :func:`table6_comparison`."""
    here = table.per_iteration
    paper = table.paper_per_iteration.dropna()
    text = (f"Objective evaluations per Stiefel iteration: {here.min():.2f}–{here.max():.2f} here "
            f"({table['mean'].min():,.0f}–{table['mean'].max():,.0f} per digit)")
    if len(paper):
        t5 = paper_table("INBIterations")[100]
        text += (f", against {t5.min() / (paper_value('setting')['L'] * 100):.2f}–"
                 f"{t5.max() / (paper_value('setting')['L'] * 100):.2f} in the paper's Table 5 "
                 f"({t5.min():,.0f}–{t5.max():,.0f} per digit)")
    t6 = table6_comparison(j_runs) if j_runs else ""
    return text + "." + (f" {t6}" if t6 else "")


def describe_options(table: pd.DataFrame) -> str:
    """The option sets in numbers (:func:`iterations_by_option`): per Table-5 variant, the Armijo iterations per
    digit under each option set beside the paper's, and the final WD under each."""
    parts = []
    for variant, t in table.groupby("variant", sort=False):
        its = ", ".join(f"{o} {m:,.1f}" for o, m in zip(t.option, t.ours_mean))
        wd = ", ".join(f"{o} {w:.2f}" for o, w in zip(t.option, t.wd_final))
        parts.append(f"{variant}: iterations {its} (paper {t.paper.iloc[0]:,.2f}); final WD {wd}")
    return "Table 5 under both option sets — " + "; ".join(parts) + "."


def describe_communication(table: pd.DataFrame, records: Records) -> str:
    """Communication in numbers: whether every counted total equals the formula, and the Hist run of the
    paper's Fig. 3 (Hist IndAEINB-L10-K10-J100, V = 500) beside the paper's figure when it ran."""
    ok = bool((table.counted_total == table.formula_total).all())
    text = (f"Counted totals {'equal' if ok else 'DIFFER FROM'} the closed form for all {len(table)} runs. "
            + "; ".join(f"{row.run}: {row.counted_total:.3g}" for row in table.itertuples())
            + " parameters per client (up + down, all digits).")
    fig3 = [k for k, r in records.items() if r["config"]["variant"] == "IndAEINB" and r["config"]["n_bins"] == 500
            and r["config"]["max_iter"] == 100 and r["config"]["n_layers"] == 10 and r["config"]["n_directions"] == 10]
    if fig3:
        text += (f" {fig3[0]} is the paper's Fig. 3 configuration: {records[fig3[0]]['params_total']:.3g} here, "
                 f"about {paper_value('fig3_params_per_client'):.0e} in the paper.")
    return text


def summary_paragraph(study: Any) -> str:
    """The notebook's closing summary in numbers, one line per result, from a
    :class:`~fda_core.experiments.translation.study.TranslationStudy` whose runs have finished (they are
    read from its memory, nothing is refitted)."""
    headline = study.headline_runs()
    cc = cross_check_table(study.cross_check_runs()).relative_difference
    cc_text = (f" The other WD solver reads {100 * cc.min():+.1f}% to {100 * cc.max():+.1f}% relative to the primary "
               "one." if len(cc) else "")
    return "\n".join([
        "(a) " + describe_variants(study.variant_runs(), study.wd_identity),
        "(b) " + describe_j(study.j_runs()),
        "(c)-(e) " + describe_vw(study.v_runs(), study.plain_runs()),
        "Iterations: " + describe_iterations(iterations_vs_paper(study.trace_runs()), study.j_runs()),
        "Options: " + describe_options(iterations_by_option(study.option_runs())),
        "Communication: " + describe_communication(communication_table(headline), headline) + cc_text,
    ])
