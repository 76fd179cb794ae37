"""Notebook 08's runs: federated domain generalisation with the Fed INB translators of notebook 06
(Fed INB paper Sec. 4.3, App. E.2, Tables 1–4, Fig. 14; ``docs/translation.md`` § FedDIRT).

:func:`resolve_plan` turns the notebook's parameters into one dict (quick sizes or the paper's scale applied);
:class:`DGStudy` takes the translator from notebook 06 (:meth:`TranslationStudy.translator
<fda_core.experiments.translation.study.TranslationStudy.translator>`: reused from beside its store record, or
fitted once and kept there), builds the clients, the translation bank and the shared-space images, and runs
every (method, synchronisation period, run) through the result store with the code revision of
:mod:`fda_core.experiments.translation.dirt`. The tables (``table3``, ``curves``, ``communication``) and the
CSV notes are written from the records' configs. This module is not imported by ``dirt``, so editing it leaves
the code revision of stored runs unchanged.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd
import torch

from ...common.checks import check_choice, check_int, check_number
from ...common.devices import resolve_device
from ...common.provenance import code_revision
from ...common.store import ResultStore, config_hash
from ...data.autoencoder import ConvAutoencoder
from ...data.rotated_domains import fashion_idx_folder
from ..paper_numbers import paper_table, paper_value
from ..worker_pool import StoredRun, WorkerTask, check_workers, shared_object, store_side_by_side
from . import dirt
from . import study as st
from .dg_clients import CLIENT_BATCHING

__all__ = ["EXPERIMENT", "QUICK", "PAPER_SCALE", "DATASETS", "resolve_plan", "DGStudy", "dg_revision",
           "method_key", "table3", "table3_long", "curves_table", "communication_table", "describe_table3",
           "describe_convergence", "describe_communication", "timings_table", "summary_paragraph"]

#: the result store's folder of notebook 08's runs (and the stem of its timings)
EXPERIMENT = "08_domain_generalisation"

#: sizes of a quick run (tests, well under a minute): notebook 06's quick translator sizes, few digits
QUICK = dict(n_train_per_class=50, n_test_per_class=20, L=2, K=5, J=10, V=20, ae_epochs=4, ae_shared_epochs=1,
             n_dg_per_class=20, iterations_scale=0.005, runs=2, eval_every=5, width=0.125)

#: the paper's scale (App. E.2): DIRT's full network, 4 runs, 2,000 / 2,500 / 3,000 iterations
PAPER_SCALE = dict(width=1.0, runs=4, iterations_scale=1.0)

#: the datasets notebook 08 can run: Rotated MNIST (MNIST-5k offline, or the IDX files under data_root) and
#: Rotated Fashion-MNIST (its IDX files under data_root), with the paper's hyper-parameters for each
DATASETS = ("mnist", "fashion")


def dg_revision() -> str:
    """The code revision of a stored FedDIRT run: :mod:`fda_core.experiments.translation.dirt` and everything it
    imports (the DIRT network, the domains, Fed INB)."""
    return code_revision(dirt.__name__)


def _paper_iterations(period: int, scale: float) -> int:
    """The paper's iterations for a period (2,000 / 2,500 / 3,000 for 1 / 10 / 100, App. E.2; another period takes
    the nearest listed one on a log scale) times ``scale``, at least 1."""
    table = paper_value("feddirt_iterations")
    nearest = min(table, key=lambda p: (abs(np.log(p) - np.log(period)), p))
    return max(1, round(table[nearest] * scale))


def _plan_iterations(dataset: str, periods: Sequence[int], test_angles: Sequence[float],
                     scale: float) -> tuple[dict[int, int], dict[str, int]]:
    """The iterations per period and the per-domain budgets ({test angle name: iterations}, the domains read
    before the run's end) of the paper's protocol (App. E.2) × ``scale``. Rotated MNIST: 2,000 / 2,500 / 3,000
    iterations for periods 1 / 10 / 100, every domain read at the end. Rotated Fashion-MNIST: 1,500 iterations for
    the unseen domain 75 and 3,000 for 90 at every period (an angle the paper does not list gets the longest);
    one run of the longest budget, each domain read at its own (:func:`dirt.train_federated` ``budgets``)."""
    if dataset != "fashion":
        return {p: _paper_iterations(p, scale) for p in periods}, {}
    table = paper_value("feddirt_iterations_fashion")
    per_angle = {f"{a:g}": max(1, round(table.get(f"{a:g}", max(table.values())) * scale)) for a in test_angles}
    longest = max(per_angle.values())
    return {p: longest for p in periods}, {a: b for a, b in per_angle.items() if b < longest}


def resolve_plan(*, quick: bool = False, paper_scale: bool = False, seed: int = 0, device: str = "auto",
                 dataset: str = "mnist", data_root: str = "", angles: Sequence[float] = (0, 15, 30, 45, 60),
                 test_angles: Sequence[float] = (75, 90), n_train_per_class: int = 400, n_test_per_class: int = 100,
                 n_dg_per_class: int = 100, L: int = 10, K: int = 10, J: int = 100, V: int = 500,
                 variant: str = "IndAEINB", ae_epochs: int = 8, ae_shared_epochs: int = 2, option: str = "reference",
                 methods: Sequence[Any] = ("fedavg", "feddirt", "feddirt_shared"),
                 periods: Sequence[int] = (1, 10, 100), shared_periods: Sequence[int] | None = (10,),
                 iterations_scale: float = 0.08, runs: int = 2,
                 width: float = 0.25, lam: float | None = None, lr: float | None = None,
                 batch_size: int | None = None, eval_every: int = 40, refit_translator: bool = False,
                 client_batching: str = "auto") -> dict[str, Any]:
    """Notebook 08's parameters resolved into one plan. ``quick`` replaces the sizes by :data:`QUICK`;
    ``paper_scale`` sets :data:`PAPER_SCALE` (DIRT's full network, 4 runs, the paper's iterations). Iterations
    per period: the paper's (2,000 / 2,500 / 3,000 for periods 1 / 10 / 100) × ``iterations_scale``. λ, lr and
    the batch size default to the paper's for the dataset (App. E.2). ``shared_periods``: the periods of the
    shared-space variant (None: ``periods``; a subset keeps the default run short). The translator settings (sizes, L, K, J,
    V, variant, autoencoder epochs, option) must equal notebook 06's for its translator to be reused.
    ``client_batching``: how each run's clients are computed (:data:`dg_clients.CLIENT_BATCHING`; an execution
    choice, not part of a run's store key). Raises ValueError naming a bad parameter."""
    check_choice(dataset, "dataset", DATASETS)
    check_choice(client_batching, "client_batching", CLIENT_BATCHING)
    if dataset == "fashion":
        if not data_root:
            raise ValueError("dataset 'fashion' needs data_root: a folder with the four Fashion-MNIST IDX files "
                             "(train-images-idx3-ubyte, ...; nothing is downloaded)")
        data_root = fashion_idx_folder(data_root)  # Fashion-MNIST's own folder: MNIST's files have the same names
    if quick and paper_scale:
        raise ValueError("quick and paper_scale exclude each other: set at most one of them")
    if quick:
        width = QUICK["width"]
        n_train_per_class, n_test_per_class, L, K, J, V = (QUICK[k] for k in (
            "n_train_per_class", "n_test_per_class", "L", "K", "J", "V"))
        ae_epochs, ae_shared_epochs, n_dg_per_class = QUICK["ae_epochs"], QUICK["ae_shared_epochs"], QUICK["n_dg_per_class"]
        iterations_scale, runs, eval_every = QUICK["iterations_scale"], QUICK["runs"], QUICK["eval_every"]
    if paper_scale:
        width, runs, iterations_scale = PAPER_SCALE["width"], PAPER_SCALE["runs"], PAPER_SCALE["iterations_scale"]
    hyper = paper_value("feddirt_hyper")[dataset]
    specs = [dirt.parse_dg_spec(m) for m in methods]
    if not specs:
        raise ValueError("methods must name at least one method")
    periods = sorted({check_int(p, "periods", 1) for p in periods})
    if not periods:
        raise ValueError("periods must hold at least one synchronisation period")
    shared_periods = periods if shared_periods is None else sorted({check_int(p, "shared_periods", 1)
                                                                     for p in shared_periods})
    if not shared_periods:
        raise ValueError("shared_periods must hold at least one synchronisation period (or be None)")
    all_periods = sorted(set(periods) | set(shared_periods))
    iterations_scale = check_number(iterations_scale, "iterations_scale", 0.0, lo_open=True)
    iterations, budgets = _plan_iterations(dataset, all_periods, [float(a) for a in test_angles], iterations_scale)
    lam = hyper["lam"] if lam is None else check_number(lam, "lam", 0.0)
    return dict(
        quick=bool(quick), paper_scale=bool(paper_scale), seed=check_int(seed, "seed", 0), device=device,
        dataset=dataset, data_root=data_root, angles=[float(a) for a in angles],
        test_angles=[float(a) for a in test_angles], n_train_per_class=check_int(n_train_per_class, "n_train_per_class", 2),
        n_test_per_class=check_int(n_test_per_class, "n_test_per_class", 1),
        n_dg_per_class=check_int(n_dg_per_class, "n_dg_per_class", 1, n_train_per_class),
        L=check_int(L, "L", 1), K=check_int(K, "K", 1), J=check_int(J, "J", 1), V=check_int(V, "V", 2), variant=variant,
        ae_epochs=check_int(ae_epochs, "ae_epochs", 0), ae_shared_epochs=check_int(ae_shared_epochs, "ae_shared_epochs", 0),
        option=option,
        methods=[m.spec for m in specs], method_objects=specs, lam=lam, periods=periods, shared_periods=shared_periods,
        iterations_scale=iterations_scale, iterations=iterations, budgets=budgets,
        runs=check_int(runs, "runs", 1),
        width=check_number(width, "width", 0.0, 4.0, lo_open=True),
        lr=hyper["lr"] if lr is None else check_number(lr, "lr", 0.0, lo_open=True),
        batch_size=hyper["batch_size"] if batch_size is None else check_int(batch_size, "batch_size", 1),
        eval_every=check_int(eval_every, "eval_every", 0), refit_translator=bool(refit_translator),
        client_batching=client_batching)


def method_key(method: dirt.DGMethod, lam: float) -> dirt.DGMethod:
    """The method with the plan's λ where it has a λ option and the spec did not set one."""
    if "lam" in method.options and "lam" not in method.changed_options:
        return type(method)(**{**method.option_values, "lam": lam})
    return method


class DGStudy:
    """The runs of one notebook-08 execution. ``plan``: from :func:`resolve_plan`; ``store``: notebook 08's
    :class:`~fda_core.common.store.ResultStore`; ``translation_root``: the store folder of notebook 06 (its
    translator and autoencoders; default the same root); ``threads``: torch CPU threads.

    After :meth:`prepare`: ``translator`` (the fitted Fed INB), ``translator_reused`` (taken from notebook 06's
    store rather than fitted here), ``translator_config`` (its store key), ``translator_record`` (notebook 06's
    record of it when stored), ``data`` (:class:`~fda_core.experiments.translation.dirt.DGData`), ``bank`` and
    ``shared`` (the precomputed images), ``exchange`` (the translator parts every client receives once)."""

    def __init__(self, plan: Mapping[str, Any], store: ResultStore, translation_root: str | None = None,
                 threads: int | None = None, workers: int = 1):
        from .experiments import set_threads

        self.workers = check_workers(workers)
        self.plan = dict(plan)
        self.store = store
        self.threads = set_threads(threads)
        p = self.plan
        tplan = st.resolve_plan(seed=p["seed"], device=p["device"], data_root=p["data_root"], angles=p["angles"],
                                n_train_per_class=p["n_train_per_class"], n_test_per_class=p["n_test_per_class"],
                                L=p["L"], K=p["K"], J=p["J"], V=p["V"], variant=p["variant"], ae_epochs=p["ae_epochs"],
                                ae_shared_epochs=p["ae_shared_epochs"], option=p["option"])
        root = store.root if translation_root is None else translation_root
        #: notebook 06's study of the translator (its store, never recomputing: the translator is an input here)
        self.translation = st.TranslationStudy(tplan, ResultStore(root, recompute=p["refit_translator"]),
                                               threads=threads)
        self.revision = dg_revision()
        self.translator = None
        self.translator_reused = False
        self.translator_config: dict | None = None
        self.translator_record: dict | None = None
        self.data = None
        self.bank = None
        self.shared = None
        self.exchange: dict[str, int] | None = None
        self._runs: dict[str, dict] = {}

    # -- preparation ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """The translator (reused or fitted, :meth:`TranslationStudy.translator`), the clients' data and the
        images the methods need."""
        p = self.plan
        ts = self.translation
        self.translator_config = ts.config(p["variant"], n_bins=p["V"])
        if p["refit_translator"]:
            path = ts.translator_path(self.translator_config)
            if path.exists():
                path.unlink()
        self.translator, self.translator_reused = ts.translator(p["variant"], n_bins=p["V"])
        self.translator_record = ts.store.load(st.EXPERIMENT, self.translator_config, ts.revision)
        self.data = dirt.dg_data(p["angles"], p["test_angles"], p["n_train_per_class"], p["n_test_per_class"],
                                 p["n_dg_per_class"], p["data_root"], p["seed"])
        views = {type(m).view for m in p["method_objects"]}
        if "translated" in views:
            self.bank = dirt.translation_bank(self.translator, self.data.x, self.data.y)
        if "shared" in views:
            self.shared = dirt.shared_space_images(self.translator, self.data.x, self.data.y)
        decoder = sum(q.numel() for q in ConvAutoencoder().decoder.parameters()) if p["variant"] == "IndAEINB" else 0
        self.exchange = dirt.translator_exchange(self.translator, decoder)

    @property
    def translator_name(self) -> str:
        return self.translator.name

    def translator_summary(self) -> str:
        """Where the translator came from and what it cost (parameters per client)."""
        how = ("reused from notebook 06's result store" if self.translator_reused else
               "fitted here (notebook 06 had not stored it; kept beside its store record for the next run)")
        return (f"translator {self.translator_name} ({self.translation.plan['option']} option): {how}; fitting it "
                f"transmitted {self.translator.communication.total():,} parameters per client; handing every client "
                f"the other clients' maps and decoders costs {self.exchange['total']:,} more per client "
                f"(up {self.exchange['up']:,}, down {self.exchange['down']:,}).")

    # -- runs ----------------------------------------------------------------------------------------------
    def config(self, method: dirt.DGMethod, period: int, run: int) -> dict[str, Any]:
        """The store key of one training run."""
        p, d = self.plan, self.data
        method = method_key(method, p["lam"])
        return dict(
            data=dict(dataset=p["dataset"], angles=p["angles"], test_angles=p["test_angles"], source=d.source,
                      data_root=p["data_root"], n_train=p["n_train_per_class"], n_test=p["n_test_per_class"],
                      n_dg=p["n_dg_per_class"]),
            translator=(dict(name=self.translator_name, key=config_hash(self.translator_config))
                        if type(method).uses_translator else None),
            method=method.spec, period=int(period), iterations=int(p["iterations"][period]), run=int(run),
            seed=p["seed"], width=p["width"], norm="instance", lr=p["lr"], batch_size=p["batch_size"],
            eval_every=p["eval_every"], device=resolve_device(p["device"]).type,
            **({"budgets": p["budgets"]} if p["budgets"] else {}))

    def tests(self) -> dict[str, tuple]:
        """The evaluation sets: each unseen angle on the training digits (paper protocol) and on held-out digits."""
        d = self.data
        out = {f"{a:g}": (d.test_x[a], d.y) for a in d.test_angles}
        out.update({f"{a:g} held-out": (d.heldout_x[a], d.heldout_y) for a in d.test_angles})
        return out

    def _train_kwargs(self) -> dict[str, Any]:
        """The arguments of :func:`dirt.train_federated` every run of the plan shares."""
        p = self.plan
        budgets = {name: b for a, b in p["budgets"].items() for name in (a, f"{a} held-out")}  # both test sets
        return dict(batch_size=p["batch_size"], lr=p["lr"], width=p["width"], norm="instance", seed=p["seed"],
                    eval_every=p["eval_every"], device=p["device"], client_batching=p["client_batching"],
                    **({"budgets": budgets} if budgets else {}))

    def _views(self, method: dirt.DGMethod) -> torch.Tensor | None:
        return {"translated": self.bank, "shared": self.shared, None: None}[type(method).view]

    def run(self, method: dirt.DGMethod, period: int, run: int) -> dict[str, Any]:
        """One (method, period, run), from the result store when the same code finished it before."""
        if self.data is None:
            self.prepare()
        method = method_key(method, self.plan["lam"])
        cfg = self.config(method, period, run)
        key = config_hash(cfg)
        if key not in self._runs:
            result = self.store.cached(EXPERIMENT, cfg, lambda: dirt.train_federated(
                method, self.data.x, self.data.y, views=self._views(method), period=period, iterations=cfg["iterations"],
                run=run, tests=self.tests(), **self._train_kwargs()), revision=self.revision)
            self._runs[key] = {**result, "config": cfg}
        return self._runs[key]

    def periods_of(self, method: dirt.DGMethod) -> list[int]:
        """The synchronisation periods a method runs with: ``shared_periods`` for the shared-space variant,
        ``periods`` otherwise."""
        return self.plan["shared_periods"] if type(method).view == "shared" else self.plan["periods"]

    def run_all(self, progress: bool = False, workers: int | None = None) -> list[dict[str, Any]]:
        """Every (method, period, run) of the plan, in that order.

        ``workers`` (default: the study's): with more than 1, the runs the result store does not hold are trained
        that many at a time, each in a spawned process (:mod:`fda_core.experiments.worker_pool`), and saved as each
        finishes. The workers load the clients' data, the precomputed images and the test sets once, from a file
        written here, and train exactly what this process would: on a CPU bit for bit at equal thread counts (each
        worker gets ``threads // workers``, at least 1), on a GPU the same computation."""
        workers = self.workers if workers is None else check_workers(workers)
        if self.data is None:
            self.prepare()
        plan = [(method_key(m, self.plan["lam"]), period, r) for m in self.plan["method_objects"]
                for period in self.periods_of(m) for r in range(self.plan["runs"])]
        shown: set[str] = set()
        if workers > 1:
            shown = self._train_side_by_side(plan, workers, progress)
        out = []
        for method, period, r in plan:
            rec = self.run(method, period, r)
            if progress and config_hash(rec["config"]) not in shown:
                print(self._progress_line(rec, period, r), flush=True)
            out.append(rec)
        return out

    @staticmethod
    def _progress_line(rec: Mapping[str, Any], period: int, run: int) -> str:
        return f"  {rec['label']}, period {period}, run {run}: " + ", ".join(
            f"{k} {v:.1f}" for k, v in rec["final"].items() if k not in ("iteration", "syncs", "params"))

    def _train_side_by_side(self, plan: Sequence[tuple], workers: int, progress: bool) -> set[str]:
        """Train the runs of ``plan`` the store does not hold in ``workers`` processes, saving each as it finishes;
        returns the store keys of the runs it printed a progress line for."""
        unique: dict[str, tuple] = {}  # store key's hash -> (method, period, run, config), each run once
        for method, period, r in plan:
            cfg = self.config(method, period, r)
            unique.setdefault(config_hash(cfg), (method, period, r, cfg))
        todo = [run for key, run in unique.items() if key not in self._runs]
        shown: set[str] = set()

        def record(i: int, result: dict[str, Any], computed: bool) -> None:
            method, period, r, cfg = todo[i]
            key = config_hash(cfg)
            self._runs[key] = {**result, "config": cfg}
            if computed and progress:
                print(self._progress_line(self._runs[key], period, r), flush=True)
                shown.add(key)

        runs = [StoredRun(cfg, (method, period, r, cfg["iterations"]), self.revision,
                          f"run {r} of {method.display_label} at period {period} ({EXPERIMENT!r})")
                for method, period, r, cfg in todo]
        store_side_by_side(runs, workers, store=self.store, experiment=EXPERIMENT, task=WorkerTask(_train_in_worker),
                           on_result=record, shared=lambda: dict(
                               x=self.data.x, y=self.data.y, views={"translated": self.bank, "shared": self.shared},
                               tests=self.tests(), kwargs=self._train_kwargs()))
        return shown

    # -- notes ---------------------------------------------------------------------------------------------
    def setting_note(self) -> str:
        """The setting, written from the plan and the data that ran."""
        p, d = self.plan, self.data
        its = ", ".join(f"{it} for period {per}" for per, it in p["iterations"].items())
        if p["budgets"]:  # Rotated Fashion-MNIST: some domains read before the run's end
            its += " (" + ", ".join(f"{a} degrees read at iteration {b}" for a, b in p["budgets"].items()) + ")"
        net = ("DIRT's network" if p["width"] == 1 else
               f"DIRT's network at width {p['width']:g} (channels {round(32 * p['width'])} and {round(64 * p['width'])} "
               "instead of 32 and 64)")
        return (f"Setting: Rotated {'Fashion-MNIST' if p['dataset'] == 'fashion' else 'MNIST'} from {d.source}; "
                f"clients at {', '.join(f'{a:g}' for a in p['angles'])} degrees holding the same "
                f"{p['n_dg_per_class']} digits per class (a subset of the translator's {p['n_train_per_class']}); "
                f"unseen {', '.join(f'{a:g}' for a in p['test_angles'])} degrees on the same digits (and on "
                f"{p['n_test_per_class']} held-out digits per class); {net} with InstanceNorm; Adam lr {p['lr']:g}, "
                f"batch {p['batch_size']}, lambda {p['lam']:g}; iterations {its} (the paper's x {p['iterations_scale']:g}); "
                f"{p['runs']} runs; seed {p['seed']}; translator {self.translator_name} "
                f"({self.translation.plan['option']} option, from notebook 06).")

    def paper_note(self) -> str:
        """The paper's setting and the table our numbers stand beside."""
        name = "FedDIRT_RotatedFashionMNIST" if self.plan["dataset"] == "fashion" else "FedDIRT_RotatedMNIST"
        t = paper_table(name)
        return f"Paper: {t.attrs['source']}; {t.attrs['setting']}."


# -- runs in worker processes (DGStudy.run_all with workers > 1) -------------------------------------------
def _train_in_worker(item: tuple) -> dict[str, Any]:
    """One run, (method, period, run, iterations), as :meth:`DGStudy.run` trains it."""
    method, period, run, iterations = item
    c = shared_object()  # the clients' data, images, test sets and arguments DGStudy._train_side_by_side shared
    return dirt.train_federated(method, c["x"], c["y"], views=c["views"].get(type(method).view),
                                period=period, iterations=iterations, run=run, tests=c["tests"], **c["kwargs"])


# -- tables -------------------------------------------------------------------------------------------------
def _paper_row(label: str, translator: str) -> str | None:
    """The paper's row for one of our methods: FedAvg, or FedDIRT with the translator's L and K."""
    if label == "FedAvg":
        return "FedAvg"
    if label.startswith("FedDIRT") and "shared" not in label:
        lk = "-".join(translator.split("-")[1:3])  # e.g. "L10-K10" of "Hist IndAEINB-L10-K10-J100-V500"
        return f"FedDIRT ({lk})"
    return None


def _domain_order(name: str) -> tuple:
    """Unseen angles in increasing order, the training digits' before the held-out digits' ("75", "90",
    "75 held-out", "90 held-out"), whatever order a record's keys came in (a record read back from the store is
    JSON with sorted keys)."""
    first = name.split()[0]
    try:
        angle = float(first)
    except ValueError:
        angle = float("inf")
    return (name.endswith("held-out"), angle, name)


def _domains(records: Sequence[Mapping[str, Any]]) -> list[str]:
    return sorted((k for k in records[0]["final"] if k not in ("iteration", "syncs", "params")), key=_domain_order)


def table3_long(records: Sequence[Mapping[str, Any]], translator: str, dataset: str = "mnist") -> pd.DataFrame:
    """One row per (method, test domain, period): our mean and std over runs of the final accuracy, the runs,
    the iterations, and the paper's mean and std (NaN where the paper has no such row or column)."""
    name = "FedDIRT_RotatedFashionMNIST" if dataset == "fashion" else "FedDIRT_RotatedMNIST"
    mean, std = paper_table(name), paper_table(name + "_std")
    rows = []
    for (label, period), grp in pd.DataFrame([dict(label=r["label"], period=r["period"], rec=r) for r in records]
                                             ).groupby(["label", "period"], sort=False):
        recs = list(grp.rec)
        for dom in _domains(recs):
            acc = np.array([r["final"][dom] for r in recs])
            col = f"{dom} ({period}-batch)"
            prow = _paper_row(label, translator)
            has = prow is not None and prow in mean.index and col in mean.columns
            its = recs[0].get("budgets", {}).get(dom, recs[0]["iterations"])  # a domain read at its own budget
            rows.append(dict(method=label, domain=dom, period=int(period), iterations=int(its),
                             runs=len(recs), mean=float(acc.mean()), std=float(acc.std(ddof=1)) if len(acc) > 1 else
                             float("nan"), paper_row=prow if has else "", paper_mean=mean.loc[prow, col] if has else
                             float("nan"), paper_std=std.loc[prow, col] if has else float("nan")))
    return pd.DataFrame(rows)


def table3(long: pd.DataFrame, held_out: bool = False) -> pd.DataFrame:
    """The paper's layout: rows = methods (ours, then the paper's matching rows), columns "75 (1-batch)" …;
    cells "mean ± std" (strings)."""
    t = long[long.domain.str.endswith("held-out") == held_out]
    cell = lambda m, s: f"{m:.1f} ± {s:.1f}" if np.isfinite(s) else f"{m:.1f}"  # noqa: E731
    ours = t.assign(col=lambda d: d.domain + " (" + d.period.astype(str) + "-batch)",
                    cell=[cell(m, s) for m, s in zip(t["mean"], t["std"])])
    wide = ours.pivot_table(index="method", columns="col", values="cell", aggfunc="first", sort=False)
    paper = t[t.paper_row != ""].assign(col=lambda d: d.domain + " (" + d.period.astype(str) + "-batch)",
                                        cell=lambda d: [cell(m, s) for m, s in zip(d.paper_mean, d.paper_std)],
                                        method=lambda d: "paper " + d.paper_row)
    if len(paper):
        wide = pd.concat([wide, paper.pivot_table(index="method", columns="col", values="cell", aggfunc="first",
                                                  sort=False)])
    cols = sorted(wide.columns, key=lambda c: (float(c.split()[0]), int(c.split("(")[-1].split("-")[0])))
    return wide[cols]


def curves_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Long table (method, period, run, iteration, syncs, params, domain, accuracy) of the evaluation curves."""
    rows = []
    for r in records:
        for point in r["curve"]:
            for dom in _domains([r]):
                rows.append(dict(method=r["label"], period=r["period"], run=r["config"]["run"],
                                 iteration=point["iteration"], syncs=point["syncs"], params=point["params"],
                                 domain=dom, accuracy=point[dom]))
    return pd.DataFrame(rows)


def communication_table(records: Sequence[Mapping[str, Any]], study: DGStudy) -> pd.DataFrame:
    """Per method and period: synchronisations, the model's parameters P, the parameters per client of training
    (initial model + 2P per synchronisation, counted by the log), of fitting the translator (its log) and of
    handing every client the other clients' translator parts (FedDIRT only), and the total."""
    rows = []
    fit = int(study.translator.communication.total())
    for (label, period), grp in pd.DataFrame([dict(label=r["label"], period=r["period"], rec=r) for r in records]
                                             ).groupby(["label", "period"], sort=False):
        r = grp.rec.iloc[0]
        uses = r["config"]["translator"] is not None
        exchange = study.exchange["total"] if uses and "shared" not in label else 0
        rows.append(dict(method=label, period=int(period), iterations=r["iterations"], syncs=r["syncs"],
                         model_params=r["n_params"], training_params=r["params_total"],
                         translator_fit_params=fit if uses else 0, translator_exchange_params=exchange,
                         total_params=r["params_total"] + (fit if uses else 0) + exchange))
    return pd.DataFrame(rows)


# -- sentences ----------------------------------------------------------------------------------------------
def describe_table3(long: pd.DataFrame) -> str:
    """Per test domain and period: FedDIRT and the shared-space variant minus FedAvg (ours, and the paper's gap)."""
    t = long[~long.domain.str.endswith("held-out")]
    lines = []
    for (dom, period), g in t.groupby(["domain", "period"], sort=False):
        g = g.set_index("method")
        if "FedAvg" not in g.index:
            continue
        base = g.loc["FedAvg"]
        parts = []
        for m in g.index:
            if m == "FedAvg":
                continue
            gap = g.loc[m, "mean"] - base["mean"]
            paper_gap = g.loc[m, "paper_mean"] - base["paper_mean"]
            parts.append(f"{m} {g.loc[m, 'mean']:.1f} ({gap:+.1f} vs FedAvg {base['mean']:.1f}"
                         + (f"; paper {paper_gap:+.1f}" if np.isfinite(paper_gap) else "") + ")")
        lines.append(f"{dom} degrees, period {period}: " + "; ".join(parts))
    return "\n".join(lines)


def describe_convergence(curves: pd.DataFrame, window: float = 0.25) -> str:
    """Per method, period and domain (runs averaged): the accuracy gained over the last ``window`` of the
    iterations — small gains mean the curve has flattened before the reported point (paper Fig. 14)."""
    t = curves[~curves.domain.str.endswith("held-out")]
    lines = []
    for (m, period, dom), g in t.groupby(["method", "period", "domain"], sort=False):
        mean = g.groupby("iteration").accuracy.mean()
        last = mean.index.max()
        start = mean[mean.index >= (1 - window) * last]
        lines.append(f"{m}, period {period}, {dom} degrees: {start.iloc[0]:.1f} -> {mean.iloc[-1]:.1f} over the last "
                     f"{window:.0%} of the {last} iterations ({mean.iloc[-1] - start.iloc[0]:+.1f})")
    return "\n".join(lines)


def describe_communication(comm: pd.DataFrame, study: DGStudy) -> str:
    """The training exchanges beside the translator's one-off cost."""
    fit = int(study.translator.communication.total())
    rec = study.translator_record
    lines = [f"Translator {study.translator_name}: {fit:,} parameters per client to fit (notebook 06's log"
             + (f"; its stored record says {rec['params_total']:,}" if rec is not None else "") + f"), "
             f"{study.exchange['total']:,} to distribute the other clients' parts for FedDIRT (once)."]
    for _, r in comm.iterrows():
        share = r.translator_fit_params / r.total_params if r.total_params else 0.0
        lines.append(f"{r.method}, period {r.period}: {r.syncs} synchronisation(s) x 2 x {r.model_params:,} + the initial "
                     f"model = {r.training_params:,} per client for training; total {r.total_params:,}"
                     + (f" (the translator's fit {share:.0%} of it)" if r.translator_fit_params else ""))
    return "\n".join(lines)


def timings_table(records: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """Training seconds per run (kept out of the result CSVs: ``executed/timings/``)."""
    return pd.DataFrame([dict(method=r["label"], period=r["period"], run=r["config"]["run"],
                              iterations=r["iterations"], seconds=round(r["seconds"], 2)) for r in records])


def summary_paragraph(study: DGStudy, long: pd.DataFrame, comm: pd.DataFrame) -> str:
    """The closing note: our accuracies beside the paper's per unseen domain and period, which method leads,
    where the translator came from and what the communication was."""
    t = long[~long.domain.str.endswith("held-out")]
    lines = [f"Rotated {'Fashion-MNIST' if study.plan['dataset'] == 'fashion' else 'MNIST'} "
             f"({study.data.source}), {study.plan['runs']} runs per cell, translator {study.translator_name} "
             f"({'reused from notebook 06' if study.translator_reused else 'fitted here'}):"]
    for (dom, period), g in t.groupby(["domain", "period"], sort=False):
        parts = []
        for _, r in g.iterrows():
            paper = (f" (paper {r.paper_mean:.1f} ± {r.paper_std:.1f})" if np.isfinite(r.paper_mean) else "")
            std = f" ± {r['std']:.1f}" if np.isfinite(r["std"]) else ""
            parts.append(f"{r.method} {r['mean']:.1f}{std}{paper}")
        best = g.loc[g["mean"].idxmax(), "method"]
        lines.append(f"  {dom} degrees, FedAvg every {period} ({g.iterations.iloc[0]} iterations): " + "; ".join(parts)
                     + f" -> highest: {best}.")
    avg = comm[comm.method == "FedAvg"].set_index("period")
    if len(avg):
        lines.append("  Parameters per client for training: " + ", ".join(
            f"{int(r.training_params):,} at period {p}" for p, r in avg.iterrows())
            + f"; the translator's fit {int(study.translator.communication.total()):,} once, and "
            f"{study.exchange['total']:,} to hand every client the others' parts for FedDIRT.")
    return "\n".join(lines)
