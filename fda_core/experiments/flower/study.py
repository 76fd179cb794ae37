"""Notebook 09's study: the same experiments in process, in Flower's simulation engine and (optionally) on a
loopback deployment, as tidy tables (``docs/flower.md`` § Three ways to run, § Same numbers, § Communication).
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from ..federated import make_config, run_experiment
from ..flat import count_steps
from ..methods import get_method
from .server_app import DEFAULT_ROUND_TIMEOUT

__all__ = ["RuntimeStudy", "run_runtime_study", "curves_table", "agreement_table", "traffic_table",
           "bytes_per_round", "timings_table", "RUNTIMES"]

#: The runtimes, in the order the tables list them.
RUNTIMES = ("in process", "Flower simulation", "Flower deployment")


@dataclass
class RuntimeStudy:
    """Results per runtime (:data:`RUNTIMES`), one per config, in the configs' order."""

    configs: list[dict[str, Any]]
    results: dict[str, list[dict[str, Any]]]


def run_runtime_study(configs: Sequence[Mapping[str, Any]], *, simulation: bool = True,
                      deployment_home: str | Path | None = None, round_timeout: float = DEFAULT_ROUND_TIMEOUT,
                      workers: int = 1) -> RuntimeStudy:
    """Run every config in process, then all of them in one start of Flower's simulation engine (when
    ``simulation``), then on one loopback deployment (when ``deployment_home`` is a folder: a SuperLink and
    one SuperNode per environment, the runs submitted one after the other). Each in-process result gets
    ``"wall_seconds"``; the Flower ones have it from their runtime (the simulation's covers the engine's
    start and all its runs: see :func:`timings_table`)."""
    configs = [make_config(**c) for c in configs]
    results: dict[str, list[dict[str, Any]]] = {"in process": []}
    for c in configs:
        start = time.perf_counter()
        res = run_experiment(**c)
        results["in process"].append({**res, "wall_seconds": time.perf_counter() - start})
    if simulation:
        from .simulation import simulate_many

        results["Flower simulation"] = simulate_many(configs, round_timeout=round_timeout, workers=workers)
    if deployment_home is not None:
        from .deployment import LocalFederation
        from .simulation import num_environments

        start = time.perf_counter()
        with LocalFederation(deployment_home, num_environments(configs[0])) as fed:
            up = time.perf_counter() - start
            runs = [fed.run(c, round_timeout=round_timeout) for c in configs]
        results["Flower deployment"] = [{**r, "run_seconds": r["wall_seconds"], "startup_seconds": up} for r in runs]
    return RuntimeStudy(configs, results)


def curves_table(study: RuntimeStudy) -> pd.DataFrame:
    """One row per (runtime, method, round, source): target accuracy and β of that source (NaN for rules
    without β, or a round without that source)."""
    rows = []
    for runtime in RUNTIMES:
        for res in study.results.get(runtime, []):
            names = [s["name"] for s in res["sources"]]
            for h in res["history"]:
                betas = h["beta"] or []
                for k, name in enumerate(names):
                    rows.append({"runtime": runtime, "method": res["method"], "round": h["round"], "phase": h["phase"],
                                 "target_acc": h["target_acc"], "source": name,
                                 "beta": betas[k] if k < len(betas) else math.nan})
    return pd.DataFrame(rows)


def agreement_table(study: RuntimeStudy) -> pd.DataFrame:
    """Per method and Flower runtime: its final target accuracy beside the in-process one, the largest
    difference of accuracy and of β over all rounds, and whether the histories are bit-identical."""
    rows = []
    for k, ref in enumerate(study.results["in process"]):
        for runtime in RUNTIMES[1:]:
            if runtime not in study.results:
                continue
            got = study.results[runtime][k]
            acc = max(abs(a["target_acc"] - b["target_acc"]) for a, b in zip(ref["history"], got["history"]))
            betas = [abs(x - y) for a, b in zip(ref["history"], got["history"])
                     for x, y in zip(a["beta"] or [], b["beta"] or [])]
            same = [(h["round"], h["target_acc"], h["beta"]) for h in ref["history"]] == \
                   [(h["round"], h["target_acc"], h["beta"]) for h in got["history"]]
            rows.append({"method": ref["method"], "runtime": runtime, "final_acc_in_process": ref["final_target_acc"],
                         "final_acc": got["final_target_acc"], "max_abs_acc_diff": acc,
                         "max_abs_beta_diff": max(betas) if betas else 0.0, "bit_identical": same,
                         "dropped_updates": len(got["flower"]["events"])})
    return pd.DataFrame(rows)


def traffic_table(study: RuntimeStudy, runtime: str = "Flower simulation") -> pd.DataFrame:
    """Every message of ``runtime``'s runs: method, round, kind, direction, client (environment), role,
    bytes on the wire and payload bytes (``docs/flower.md`` § Communication)."""
    rows = []
    for res in study.results.get(runtime, []):
        for t in res["flower"]["traffic"]:
            rows.append({"method": res["method"], "round": t["round"], "kind": t["kind"], "direction": t["direction"],
                         "client": t["env"], "role": t["role"], "bytes": t["bytes"], "content_bytes": t["content_bytes"],
                         "payload_bytes": t["payload_bytes"]})
    return pd.DataFrame(rows)


def bytes_per_round(traffic: pd.DataFrame, study: RuntimeStudy) -> pd.DataFrame:
    """Bytes sent per round per client (rounds ≥ 1): ``down`` / ``up`` of the train messages (server → client
    / client → server; 0 when the client did not train), ``eval_down`` / ``eval_up`` of the evaluation (the
    target only), beside the count from the model size: ``model_bytes`` = 4m per model and ``parts_bytes`` =
    4·B·m for the target's B per-batch updates when it sends them (``docs/flower.md`` § Communication).
    The sizes are the messages' content (records, arrays, chunks), the same in every run; each message also
    carries an envelope of about 130-170 bytes (ids, timestamps; the ``bytes`` of :func:`traffic_table`)."""
    t = traffic[traffic["round"] >= 1].assign(
        column=lambda d: d["direction"].where(d["kind"] == "train", "eval_" + d["direction"]))
    table = (t.pivot_table(index=["method", "round", "client", "role"], columns="column", values="content_bytes",
                           aggfunc="sum", fill_value=0).reset_index())
    table.columns.name = None
    for col in ("down", "up", "eval_down", "eval_up"):
        if col not in table:
            table[col] = 0
    m, parts = {}, {}
    for res in study.results["in process"]:
        c = res["config"]
        m[res["method"]] = res["n_parameters"]
        if get_method(c["rule"], **c["method_options"]).estimates_beta:  # the target sends B per-batch updates
            b = count_steps(res["n_target_labeled"], c["target_batch_size"], c["target_local_epochs"])
            parts.update({(res["method"], h["round"]): b for h in res["history"] if h["phase"] == "fda"})
    table["model_bytes"] = [4 * m[x] for x in table["method"]]
    table["parts_bytes"] = [4 * m[r.method] * parts.get((r.method, r.round), 0) if r.role == "target" else 0
                            for r in table.itertuples()]
    return table[["method", "round", "client", "role", "down", "up", "eval_down", "eval_up", "model_bytes",
                  "parts_bytes"]]


def timings_table(study: RuntimeStudy) -> pd.DataFrame:
    """Wall-clock seconds per runtime: per run in process; the simulation's whole call (engine start and
    every run) shared by its runs; the deployment's per run (submission to result) and its start-up."""
    rows = []
    for runtime, results in study.results.items():
        for res in results:
            rows.append({"runtime": runtime, "method": res["method"], "seconds": res["wall_seconds"],
                         "what": {"in process": "run", "Flower simulation": "engine start + all runs of the call",
                                  "Flower deployment": "submission to result (processes already up)"}[runtime],
                         "startup_seconds": res.get("startup_seconds", math.nan)})
    return pd.DataFrame(rows)
