"""Notebook 06's FedStarGAN baseline (Fed INB paper Sec. 4.2, Fig. 2d–f, Fig. 4d; ``docs/translation.md``
§ FedStarGAN): runs through the result store on the translation study's clients, the tables beside the INB
runs, and FID when the user gives InceptionV3 weights.

:func:`resolve_stargan` turns notebook 06's StarGAN parameters into a plan; :class:`FedStarGANStudy` runs one
:func:`~fda_core.experiments.translation.stargan.train_fedstargan` per synchronisation period through the
:class:`~fda_core.common.store.ResultStore` (experiment :data:`EXPERIMENT`, code revision of
:mod:`fda_core.experiments.translation.stargan`), evaluating the server's generator with the INB runs' metric
on the same held-out digits. Not imported by ``stargan``, so editing it leaves stored runs valid.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...common.checks import check_choice, check_int
from ...common.provenance import code_revision
from ...common.store import ResultStore
from ..paper_numbers import paper_value
from ..worker_pool import StoredRun, WorkerTask, check_workers, shared_object, store_side_by_side
from . import stargan as sg
from .dg_clients import CLIENT_BATCHING

__all__ = ["EXPERIMENT", "QUICK", "PAPER_SCALE", "METRICS", "resolve_stargan", "stargan_revision",
           "FedStarGANStudy", "stargan_table", "describe_stargan", "fid_of_translations", "timings_table"]

#: the result store's folder of the FedStarGAN runs
EXPERIMENT = "06_fedstargan"
#: metrics of the FedStarGAN curves: the INB runs' WD (default) or FID (needs local InceptionV3 weights)
METRICS = ("wd", "fid")
#: sizes of a quick run
QUICK = dict(iterations=8, sync_steps=[4], eval_points=2, n_fid=20)
#: notebook 06's ``paper_scale``: DIRT's StarGAN (64 first-layer channels, 6 residual blocks) and the paper's
#: FedStarGAN-16 and -128 (Fed INB paper Sec. 4.2, Fig. 2d). The paper states no iteration count, only about
#: 2.5 GPU hours; 2,048 mini-batches per client (16 synchronisations of FedStarGAN-128) is the workbook's choice
PAPER_SCALE = dict(iterations=2048, sync_steps=[16, 128], conv_dim=64, g_repeat=6, eval_points=8)


def stargan_revision() -> str:
    """Code revision of a stored FedStarGAN run (the training module and what it imports)."""
    return code_revision(sg.__name__)


def resolve_stargan(*, quick: bool = False, paper_scale: bool = False, run: bool = True,
                    sync_steps: Sequence[int] = (16,), iterations: int = 64, conv_dim: int = 8, g_repeat: int = 1,
                    batch_size: int = 16, eval_points: int = 2, metric: str = "wd", inception_weights: str = "",
                    n_fid: int = 500, client_batching: str = "auto") -> dict[str, Any]:
    """Notebook 06's FedStarGAN parameters as a plan (``quick``: :data:`QUICK` sizes). ``run``: whether the section
    runs at all; ``sync_steps``: FedAvg every k mini-batches, one run per k (paper: 16 and 128); ``iterations``:
    mini-batches per client; ``eval_points``: about how many synchronisation counts the metric is measured at;
    ``metric``: "wd" (default, the INB runs' metric) or "fid" (``inception_weights`` must be a local TorchScript
    InceptionV3 file, else FileNotFoundError before anything trains); ``n_fid``: real and translated digits per
    target domain for FID. ``paper_scale`` replaces iterations, periods, network and evaluation points by
    :data:`PAPER_SCALE`. ``client_batching``: how the clients are computed (``stargan.train_fedstargan``; an
    execution choice, not part of a run's store key). ValueError names a bad parameter."""
    check_choice(metric, "metric", METRICS)
    check_choice(client_batching, "client_batching", CLIENT_BATCHING)
    if quick and paper_scale:
        raise ValueError("quick and paper_scale exclude each other: set at most one of them")
    if paper_scale:
        iterations, sync_steps, conv_dim, g_repeat, eval_points = (PAPER_SCALE[k] for k in (
            "iterations", "sync_steps", "conv_dim", "g_repeat", "eval_points"))
    if quick:
        iterations, sync_steps, eval_points, n_fid = (QUICK[k] for k in ("iterations", "sync_steps", "eval_points",
                                                                          "n_fid"))
    steps = sorted({check_int(k, "sync_steps", 1) for k in sync_steps})
    if run and not steps:
        raise ValueError("sync_steps must hold at least one synchronisation period")
    if metric == "fid" and run:
        from ...data.inception import load_inception

        load_inception(inception_weights)  # a clear FileNotFoundError now, not after training
    return dict(run=bool(run), quick=bool(quick), paper_scale=bool(paper_scale), sync_steps=steps,
                iterations=check_int(iterations, "iterations", 1),
                conv_dim=check_int(conv_dim, "conv_dim", 1), g_repeat=check_int(g_repeat, "g_repeat", 0),
                batch_size=check_int(batch_size, "batch_size", 1), eval_points=check_int(eval_points, "eval_points", 1),
                metric=metric, inception_weights=inception_weights, n_fid=check_int(n_fid, "n_fid", 2),
                client_batching=client_batching)


def fid_of_translations(translate, test_x: Sequence[torch.Tensor], test_y: Sequence[torch.Tensor], extract,
                        n: int = 500) -> float:
    """FID per target domain t between n real held-out digits of t and n digits translated into t (an equal share
    of each other client's held-out digits), averaged over the targets (paper App. F.1's FID, pooled over
    classes). ``translate(x, y, s, t)`` → (N, 784) in [0, 1] (y: the digits' labels, for class-conditional
    translators); ``extract``: from :func:`fda_core.data.inception.load_inception`."""
    from ...core.frechet import frechet_distance_of_features
    from ...data.inception import inception_features

    m = len(test_x)
    values = []
    for t in range(m):
        sources = [s for s in range(m) if s != t]
        per = -(-n // len(sources))
        idx = [torch.randperm(test_x[s].shape[0], generator=torch.Generator().manual_seed(s))[:per] for s in sources]
        fake = torch.cat([translate(test_x[s][i], test_y[s][i], s, t).float().cpu() for s, i in zip(sources, idx)])[:n]
        real = test_x[t][torch.randperm(test_x[t].shape[0], generator=torch.Generator().manual_seed(100 + t))[:n]]
        values.append(frechet_distance_of_features(inception_features(extract, real),
                                                   inception_features(extract, fake)))
    return float(np.mean(values))


class FedStarGANStudy:
    """FedStarGAN runs beside a :class:`~fda_core.experiments.translation.study.TranslationStudy` (its clients,
    held-out digits, WD settings, store root and ``workers``). ``plan``: from :func:`resolve_stargan`. With
    ``workers`` > 1 the runs the store lacks are trained side by side first (:meth:`run_all`)."""

    def __init__(self, translation: Any, plan: Mapping[str, Any], store: ResultStore | None = None,
                 workers: int | None = None):
        self.translation = translation
        self.plan = dict(plan)
        self.store = store if store is not None else translation.store
        self.workers = check_workers(getattr(translation, "workers", 1) if workers is None else workers)
        self.revision = stargan_revision()
        self._runs: dict[int, dict] = {}

    def config(self, sync_every: int) -> dict[str, Any]:
        """The store key of the run synchronising every ``sync_every`` mini-batches."""
        p, b = self.plan, self.translation.base
        return dict(data=b["data"], seed=b["seed"], device=b["device"], wd_method=b["wd_method"], wd_reg=b["wd_reg"],
                    wd_chunk=b["wd_chunk"],
                    sync_every=int(sync_every), iterations=p["iterations"], conv_dim=p["conv_dim"],
                    g_repeat=p["g_repeat"], batch_size=p["batch_size"], eval_points=p["eval_points"],
                    metric=p["metric"], n_fid=p["n_fid"] if p["metric"] == "fid" else None)

    def _metric(self) -> dict[str, Any]:
        """What the evaluation needs besides the held-out digits (:func:`_evaluator`)."""
        p, b = self.plan, self.translation.base
        return dict(metric=p["metric"], wd_method=b["wd_method"], wd_reg=b["wd_reg"], wd_chunk=b["wd_chunk"],
                    inception_weights=p["inception_weights"], n_fid=p["n_fid"])

    def _train_kwargs(self, sync_every: int) -> dict[str, Any]:
        """The arguments of :func:`stargan.train_fedstargan` for the run synchronising every ``sync_every``."""
        p, cfg = self.plan, self.config(sync_every)
        return dict(sync_every=int(sync_every), iterations=p["iterations"], batch_size=p["batch_size"],
                    conv_dim=p["conv_dim"], g_repeat=p["g_repeat"], seed=cfg["seed"], device=cfg["device"],
                    eval_syncs=sg.eval_points(-(-p["iterations"] // sync_every), p["eval_points"]),
                    client_batching=p["client_batching"])

    def _record(self, sync_every: int, rec: Mapping[str, Any]) -> dict[str, Any]:
        self._runs[sync_every] = {**rec, "config": self.config(sync_every), "name": f"FedStarGAN-{sync_every}"}
        return self._runs[sync_every]

    def run(self, sync_every: int) -> dict[str, Any]:
        """One FedStarGAN run, from the store when the same code finished it before (record plus ``config``)."""
        if sync_every not in self._runs:
            d = self.translation.domains
            rec = self.store.cached(EXPERIMENT, self.config(sync_every), lambda: sg.train_fedstargan(
                d.train_x, evaluate=_evaluator(d.test_x, d.test_y, **self._metric()), **self._train_kwargs(sync_every)),
                revision=self.revision)
            self._record(sync_every, rec)
        return self._runs[sync_every]

    def run_all(self) -> int:
        """With ``workers`` > 1: train the plan's runs that the store does not hold side by side, in worker processes
        (each loads the clients' images and held-out digits once from a file written here), saving each record as it
        finishes; :meth:`run` then reads them. Returns the number of runs trained here (0 with one worker, or with
        fewer than two runs to train: :meth:`run` trains them when asked)."""
        if self.workers == 1:
            return 0
        steps = [k for k in self.plan["sync_steps"] if k not in self._runs]
        runs = [StoredRun(self.config(k), self._train_kwargs(k), self.revision, f"{EXPERIMENT} run FedStarGAN-{k}")
                for k in steps]
        d = self.translation.domains
        return store_side_by_side(
            runs, self.workers, store=self.store, experiment=EXPERIMENT, task=WorkerTask(_train_in_worker),
            on_result=lambda i, rec, _: self._record(steps[i], rec),
            shared=lambda: dict(train_x=list(d.train_x), test_x=list(d.test_x), test_y=list(d.test_y),
                                metric=self._metric()))

    def runs(self) -> dict[str, dict[str, Any]]:
        """Every run of the plan, by name (FedStarGAN-k, as the paper names them); with ``workers`` > 1 those the
        store lacks trained side by side first (:meth:`run_all`)."""
        self.run_all()
        return {f"FedStarGAN-{k}": self.run(k) for k in self.plan["sync_steps"]}

    def curves(self) -> dict[str, dict[str, Any]]:
        """The runs as records with a ``curve`` of (depth, params, …, wd) points, the format of the INB runs'
        (``depth`` = synchronisations so far, ``wd`` = the metric), for the WD-vs-parameters figure."""
        out = {}
        for name, r in self.runs().items():
            curve = [dict(depth=c["syncs"], params=c["params"], params_up=c["params_up"],
                          params_down=c["params_down"], wd=c["value"], wd_sem=0.0) for c in r["curve"]]
            out[name] = {**r, "curve": curve}
        return out

    def note(self) -> str:
        """The setting of the FedStarGAN runs, for the CSV note."""
        p, b = self.plan, self.translation.base
        return (f"FedStarGAN (compact StarGAN: generator conv_dim {p['conv_dim']}, {p['g_repeat']} residual "
                f"block(s); discriminator conv_dim {p['conv_dim']}, 3 stride-2 convolutions; DIRT's StarGAN has 64 "
                f"and 6): {p['iterations']} mini-batches of {p['batch_size']} per client, FedAvg of G and D every "
                f"{', '.join(str(k) for k in p['sync_steps'])} mini-batches; metric "
                + ("WD as the INB runs (" + b["wd_method"] + ", held-out digits, mean over ordered client pairs and "
                   "classes)" if p["metric"] == "wd" else f"FID (InceptionV3 from {p['inception_weights']}, "
                   f"{p['n_fid']} digits per target domain)") + ".")


def _evaluator(test_x: Sequence[torch.Tensor], test_y: Sequence[torch.Tensor], *, metric: str, wd_method: str,
               wd_reg: float, wd_chunk: int, inception_weights: str, n_fid: int):
    """``evaluate(G)`` of a run: the INB runs' WD on the held-out digits, or FID with the local InceptionV3."""
    if metric == "wd":
        return lambda gen: sg.gan_wd(gen, test_x, test_y, wd_method, wd_reg, wd_chunk)
    from ...data.inception import load_inception

    extract = load_inception(inception_weights)
    return lambda gen: fid_of_translations(lambda x, y, s, t: sg.translate_gan(gen, x, s, t), test_x, test_y,
                                           extract, n_fid)


# -- runs in worker processes (FedStarGANStudy.run_all with workers > 1) ---------------------------------------
def _train_in_worker(kwargs: dict[str, Any]) -> dict[str, Any]:
    """One run in a worker: :func:`stargan.train_fedstargan` with ``kwargs`` and the study's evaluation, on the
    clients' images and held-out digits :meth:`FedStarGANStudy.run_all` shared out."""
    d = shared_object()
    evaluate = _evaluator(d["test_x"], d["test_y"], **d["metric"])
    return sg.train_fedstargan(d["train_x"], evaluate=evaluate, **kwargs)


def stargan_table(sg_runs: Mapping[str, Mapping[str, Any]], inb_runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """One row per run (FedStarGAN and the INB runs beside it): metric at the start and end, parameters per client
    transmitted, synchronisations or layers, and model size (no wall-clock times: they go to the timings)."""
    rows = []
    for name, r in sg_runs.items():
        rows.append(dict(run=name, kind="FedStarGAN", metric_first=r["curve"][0]["value"],
                         metric_final=r["curve"][-1]["value"], params_per_client=r["params_total"],
                         steps=r["syncs"], model_params=r["n_params_g"] + r["n_params_d"]))
    for name, r in inb_runs.items():
        rows.append(dict(run=name, kind="Fed INB", metric_first=r["wd_start"], metric_final=r["wd_final"],
                         params_per_client=r["params_total"], steps=r["config"]["n_layers"], model_params=np.nan))
    return pd.DataFrame(rows)


def describe_stargan(table: pd.DataFrame, sg_runs: Mapping[str, Mapping[str, Any]],
                     inb_runs: Mapping[str, Mapping[str, Any]], identity: float, metric: str = "wd") -> str:
    """Sentences: each FedStarGAN run's metric and communication beside the INB runs', and the wall-clock times
    (training of FedStarGAN, fitting of INB; the paper: about 2.5 h vs 5 min on one GPU)."""
    lines = []
    for _, r in table.iterrows():
        lines.append(f"{r.run}: {metric.upper()} {r.metric_first:.2f} -> {r.metric_final:.2f} after "
                     f"{int(r.params_per_client):,} parameters per client"
                     + (f" ({int(r.steps)} synchronisations, G + D = {int(r.model_params):,} parameters)"
                        if r.kind == "FedStarGAN" else f" ({int(r.steps)} layers)"))
    if metric == "wd":
        lines.append(f"Identity translator (no translation): WD {identity:.2f}.")
    sg_time = sum(r["seconds"] for r in sg_runs.values())
    inb_time = {name: r["fit_seconds"] for name, r in inb_runs.items() if r.get("fit_seconds")}
    lines.append(f"Wall clock (this machine): FedStarGAN training {sg_time:.0f} s in all; Fed INB fits "
                 + ", ".join(f"{n} {s:.0f} s" for n, s in inb_time.items())
                 + f". Paper: FedStarGAN about {paper_value('stargan_hours_p100'):g} h on a Tesla P100 to generate "
                 f"good samples, INB about {paper_value('train_minutes_a5000'):g} min on an RTX A5000.")
    return "\n".join(lines)


def timings_table(sg_runs: Mapping[str, Mapping[str, Any]], inb_runs: Mapping[str, Mapping[str, Any]]) -> pd.DataFrame:
    """Wall-clock seconds: FedStarGAN training (evaluation excluded) and the INB fits, for ``executed/timings``."""
    rows = [dict(run=n, kind="FedStarGAN", seconds=round(r["seconds"], 2)) for n, r in sg_runs.items()]
    rows += [dict(run=n, kind="Fed INB", seconds=round(r.get("fit_seconds", float("nan")), 2))
             for n, r in inb_runs.items()]
    return pd.DataFrame(rows)
