"""Notebook 06's runs: the resolved plan of one notebook run, every translator configuration fitted through
the result store, and the CSV notes written from the configurations that actually ran.

:func:`resolve_plan` turns the notebook's parameters into one dict (quick sizes applied, sweeps completed);
:class:`TranslationStudy` loads the client domains and autoencoders and runs each configuration through
:meth:`fda_core.common.store.ResultStore.cached` with the code revision of
:mod:`fda_core.experiments.translation.experiments` (a stored run of other code is recomputed). Each
record it returns is the stored result plus the ``config`` it ran with; :meth:`TranslationStudy.note`
writes a CSV note from those configs, so no note is typed by hand.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...common.checks import check_int
from ...common.devices import resolve_device
from ...common.provenance import code_revision
from ...common.store import ResultStore, config_hash
from ..paper_numbers import INB_PAPER, paper_value
from ..worker_pool import StoredRun, WorkerTask, check_workers, store_side_by_side
from . import experiments as ex
from .inb import VARIANTS
from .translators import load_translator, save_translator, translator_path

__all__ = ["EXPERIMENT", "QUICK", "PAPER_SCALE", "OPTIONS", "translation_revision", "resolve_plan", "TranslationStudy",
           "run_label", "option_of"]

#: the result store's folder of notebook 06's runs (and the stem of its timings)
EXPERIMENT = "06_inb_translation"

#: the Fed INB paper's sizes (Sec. 4 Datasets, Metrics): 1,000 training digits per class and client from full MNIST
#: (``data_root``), the whole test file held out (0: every held-out digit; the paper's 10,000 test digits) and WD
#: after every layer, each class's digits in one OT problem (no class of MNIST's test file has more than 1,135)
PAPER_SCALE = dict(n_train_per_class=1000, n_test_per_class=0, eval_depths="every layer", wd_chunk=2000)

#: sizes of a quick run (tests, about a minute)
QUICK = dict(n_train_per_class=50, n_test_per_class=20, L=2, K=5, J=10, V=20, J_values=[5, 10], V_values=[10, 40],
             eval_depths=[0, 1, 2], ae_epochs=4, ae_shared_epochs=1)


#: the two option sets a run can follow (``docs/translation.md`` § Reference-code conventions), as
#: :class:`~fda_core.experiments.translation.inb.FedINB` options: "reference" — the official Fed INB code
#: (pixel-space INB wrapped in Φ⁻¹/Φ, objective M× paper eq. 2, client-histogram bins round(√(M·n)));
#: "library" — the paper's formulas as the library had them (no input transform, 1/(MKn), round(√n))
OPTIONS: dict[str, dict[str, str]] = {
    "reference": {"convention": "reference", "input_transform": "auto"},
    "library": {"convention": "library", "input_transform": "none"},
}


def option_of(config: Mapping[str, Any]) -> str:
    """The option set ("reference" or "library") a run's config follows."""
    for name, opts in OPTIONS.items():
        if all(config.get(k) == v for k, v in opts.items()):
            return name
    raise ValueError(f"config follows no option set of {sorted(OPTIONS)}: "
                     f"{ {k: config.get(k) for k in ('convention', 'input_transform')} }")


def translation_revision() -> str:
    """The code revision of a stored translation run: :mod:`fda_core.experiments.translation.experiments`
    and everything it imports (Fed INB, the autoencoder, the domains, the metric)."""
    return code_revision(ex.__name__)


def resolve_plan(*, quick: bool = False, paper_scale: bool = False, seed: int = 0, device: str = "auto",
                 data_root: str = "", angles: Sequence[float] = (0, 15, 30, 45, 60), n_train_per_class: int = 400,
                 n_test_per_class: int = 100, L: int = 10, K: int = 10, J: int = 100, V: int = 500,
                 variant: str = "IndAEINB", variants: Sequence[str] = ("INB", "AEINB", "IndAEINB"),
                 J_values: Sequence[int] = (10, 30, 50, 100, 200), V_values: Sequence[int] = (50, 200, 500, 2000),
                 eval_depths: Sequence[int] = (0, 1, 2, 3, 5, 7, 10), ae_epochs: int = 8, ae_shared_epochs: int = 2,
                 wd_method: str = "emd", wd_reg: float = 0.02, wd_chunk: int = 1000, option: str = "reference",
                 compare_options: bool = True) -> dict[str, Any]:
    """Notebook 06's parameters resolved into one plan: ``quick`` replaces the sizes by :data:`QUICK`; the J
    and V sweeps always contain J and V; WD is measured at depth 0 and after the last layer besides
    ``eval_depths``. ``wd_chunk``: the most digits per side of one OT problem (a larger class is split at random
    and the chunks' costs averaged, :func:`~fda_core.core.wasserstein.wasserstein_distances`).
    ``paper_scale`` replaces the digit counts, ``eval_depths`` and ``wd_chunk`` by :data:`PAPER_SCALE`
    (the paper's sizes; needs ``data_root`` with full MNIST). ``n_test_per_class`` 0 holds out every digit
    left (:func:`~fda_core.data.rotated_domains.rotated_mnist`). ``option``: the option set of every reproduction
    run (:data:`OPTIONS`); ``compare_options``: also fit the runs of the paper's Table 5 (INB, Hist INB with V,
    the plan's variant) with the other option set (WD at depth 0 and after the last layer only). Raises
    ValueError for an unknown variant, WD method or option, for ``quick`` with ``paper_scale``, and for
    ``paper_scale`` without ``data_root``."""
    if quick and paper_scale:
        raise ValueError("quick and paper_scale exclude each other: set at most one of them")
    if paper_scale:
        if not data_root:
            raise ValueError("paper_scale=True needs data_root: a folder with the MNIST IDX files (full MNIST; "
                             "MNIST-5k has 500 digits per class, the paper's clients 1,000 training digits per class)")
        n_train_per_class, n_test_per_class = PAPER_SCALE["n_train_per_class"], PAPER_SCALE["n_test_per_class"]
        eval_depths, wd_chunk = range(L + 1), PAPER_SCALE["wd_chunk"]
    check_int(n_train_per_class, "n_train_per_class", 2)
    check_int(n_test_per_class, "n_test_per_class", 0)
    if quick:
        n_train_per_class, n_test_per_class, L, K, J, V = (QUICK[k] for k in (
            "n_train_per_class", "n_test_per_class", "L", "K", "J", "V"))
        J_values, V_values, eval_depths = QUICK["J_values"], QUICK["V_values"], QUICK["eval_depths"]
        ae_epochs, ae_shared_epochs = QUICK["ae_epochs"], QUICK["ae_shared_epochs"]
    bad = [v for v in [variant, *variants] if v not in VARIANTS]
    if bad or not variants:
        raise ValueError(f"variant and variants must be among {VARIANTS} (variants not empty), got {variant!r}, "
                         f"{list(variants)!r}")
    if wd_method not in ("emd", "sinkhorn"):
        raise ValueError(f"wd_method must be 'emd' or 'sinkhorn', got {wd_method!r}")
    if option not in OPTIONS:
        raise ValueError(f"option must be one of {tuple(OPTIONS)}, got {option!r}")
    return dict(
        quick=bool(quick), paper_scale=bool(paper_scale), seed=int(seed), device=device, data_root=data_root,
        angles=[float(a) for a in angles],
        n_train_per_class=int(n_train_per_class), n_test_per_class=int(n_test_per_class), L=int(L), K=int(K),
        J=int(J), V=int(V), variant=variant, variants=list(dict.fromkeys(variants)),
        J_values=sorted({int(j) for j in J_values} | {int(J)}), V_values=sorted({int(v) for v in V_values} | {int(V)}),
        eval_depths=sorted({int(d) for d in eval_depths if 0 <= int(d) <= L} | {0, int(L)}),
        ae_epochs=int(ae_epochs), ae_shared_epochs=int(ae_shared_epochs), wd_method=wd_method, wd_reg=float(wd_reg),
        wd_chunk=check_int(wd_chunk, "wd_chunk", 2),
        option=option, compare_options=bool(compare_options))


def run_label(record: Mapping[str, Any]) -> str:
    """A run's name as the paper writes it, e.g. ``Hist IndAEINB-L10-K10-J100-V500``; a run with the library
    option set gets `` (library)`` appended (the reference option set is the reproduction's)."""
    return record["name"] + ("" if option_of(record["config"]) == "reference" else f" ({option_of(record['config'])})")


def _flatten(records: Mapping[str, Any]) -> dict[str, dict]:
    """Records by their paper name, in order, each config once; a value without a ``config`` is a group of
    records."""
    out: dict[str, dict] = {}
    seen: set[str] = set()
    for r in records.values():
        for rec in ([r] if "config" in r else list(r.values())):
            key = config_hash(rec["config"])
            if key not in seen:
                seen.add(key)
                name = run_label(rec)
                out[name if name not in out else f"{name} ({len(out) + 1})"] = rec
    return out


#: the keys of a run's config that differ between the runs of one study
_RUN_KEYS = ("variant", "n_bins", "max_iter", "grid", "convention", "input_transform", "eval_depths")


def _shared_config(records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The config every record ran with, less the per-run keys; ValueError if the records disagree on it."""
    shared = [{k: v for k, v in r["config"].items() if k not in _RUN_KEYS} for r in records.values()]
    if any(c != shared[0] for c in shared[1:]):
        raise ValueError("the records ran with different settings: one note cannot describe them")
    return shared[0]


#: what each option set does, for the CSV notes (ASCII: the notes go into CSV headers)
_OPTION_TEXT = {
    "reference": "as the official Fed INB code: pixel-space INB on Phi^-1 of the pixels clamped to [1e-6, 1 - 1e-6] "
                 "and Phi on the way out, objective 1/(Kn) = M x paper eq. 2 (Armijo first trial 0.1 on that scale), "
                 "client-histogram bins round(sqrt(M n))",
    "library": "the paper's formulas as the library had them: no input transform, objective 1/(MKn) of paper eq. 2 "
               "(Armijo first trial 0.1), client-histogram bins round(sqrt(n))",
}


def _describe_run(config: Mapping[str, Any], eval_depths: Sequence[int] | None = None) -> str:
    v = config["n_bins"]
    depths = ("" if eval_depths is None or config["eval_depths"] == eval_depths
              else f", WD after layers {config['eval_depths']} only")
    return (f"{config['variant']}, J={config['max_iter']}, "
            + (f"VW histograms with V={v}" if v is not None else "sorted projections")
            + f", {option_of(config)} option{depths}")


#: a worker's clients and autoencoders (:func:`_load_translation_data`), read by :func:`_fit_in_worker`
_WORKER: dict[str, Any] = {}


def _load_translation_data(angles, n_train, n_test, data_root, seed, ae, device, ae_cache, store_root,
                           revision) -> None:
    """A worker's set-up: the plan's clients (rebuilt from their seed) and the autoencoders that
    :meth:`TranslationStudy.prepare` cached, as the caller holds them."""
    domains = ex.load_domains(angles, n_train, n_test, data_root, seed)
    shared, _ = ex.get_autoencoders("shared", domains, ae["shared_epochs"], seed, device, ae_cache)
    individual, _ = ex.get_autoencoders("individual", domains, ae["epochs"], seed, device, ae_cache)
    _WORKER.clear()
    _WORKER.update(domains=domains, autoencoders={"INB": None, "AEINB": shared, "IndAEINB": individual},
                   store_root=store_root, revision=revision, depth0={})


def _fit(cfg: dict[str, Any], domains: Any, autoencoders: Any, depth0_cache: dict, store_root: str | Path,
         revision: str) -> dict[str, Any]:
    """One configuration fitted and evaluated (:func:`~fda_core.experiments.translation.experiments.run_translation`);
    a drawn run (``grid``) also keeps translated digits and the Sinkhorn/EMD cross-check, and its translator is
    saved beside where its record goes (reused by notebook 08, :meth:`TranslationStudy.translator`)."""
    keep: dict = {}
    grid = cfg["grid"]
    result = ex.run_translation(cfg, domains, autoencoders, grid_per_class=2 if grid else 0, sinkhorn_check=grid,
                                depth0_cache=depth0_cache, keep=keep)
    if grid and "model" in keep:
        save_translator(translator_path(store_root, EXPERIMENT, cfg), keep["model"], cfg, revision)
    return result


def _fit_in_worker(cfg: dict[str, Any]) -> dict[str, Any]:
    """One configuration, fitted in a worker as :meth:`TranslationStudy.run` fits it here."""
    w = _WORKER
    return _fit(cfg, w["domains"], w["autoencoders"][cfg["variant"]], w["depth0"], w["store_root"], w["revision"])


def _digit_counts(data: Mapping[str, Any], domains: Any) -> str:
    """The setting note's digit counts: n_train and n_test per class and client, or with ``n_test`` 0 (every
    held-out digit) the held-out digits per client that ``domains`` holds."""
    if data["n_test"]:
        return f"{data['n_train']} training and {data['n_test']} held-out digits per class and client"
    return (f"{data['n_train']} training digits per class and client, and every other digit held out "
            f"({domains.test_x[0].shape[0]:,} per client)")


class TranslationStudy:
    """The translator configurations of one notebook-06 run, fitted through the result store.

    ``plan``: from :func:`resolve_plan`. ``store``: a :class:`~fda_core.common.store.ResultStore` (its
    ``recompute`` flag also retrains the cached autoencoders). ``ae_cache``: the folder of the trained
    autoencoders (default ``<store root>/06_inb_autoencoders``). ``threads``: torch CPU threads.

    After :meth:`prepare`: ``autoencoders`` (per variant), ``ae_info`` and ``identity`` (the identity
    translator's WD per client pair and class) with its mean ``wd_identity``.

    ``workers`` > 1: :meth:`fit_all` fits every configuration of the notebook that the store does not hold in that
    many processes, side by side (``docs/architecture.md`` § Runs side by side); 1 (default): each section fits its
    runs when it asks for them.
    """

    def __init__(self, plan: Mapping[str, Any], store: ResultStore, ae_cache: str | Path | None = None,
                 threads: int | None = None, workers: int = 1):
        self.plan = dict(plan)
        self.store = store
        self.workers = check_workers(workers)
        self.ae_cache = Path(ae_cache) if ae_cache is not None else Path(store.root) / "06_inb_autoencoders"
        self.threads = ex.set_threads(threads)
        p = self.plan
        self.domains = ex.load_domains(p["angles"], p["n_train_per_class"], p["n_test_per_class"], p["data_root"],
                                       p["seed"])
        #: the part of every run's config shared by all runs (the store key adds variant, n_bins, max_iter, grid)
        self.base = dict(
            data=dict(angles=p["angles"], n_train=p["n_train_per_class"], n_test=p["n_test_per_class"],
                      data_root=p["data_root"], source=self.domains.source),
            seed=p["seed"], device=resolve_device(p["device"]).type, n_layers=p["L"], n_directions=p["K"],
            eval_depths=p["eval_depths"], wd_method=p["wd_method"], wd_reg=p["wd_reg"], wd_chunk=p["wd_chunk"],
            ae=dict(epochs=p["ae_epochs"], shared_epochs=p["ae_shared_epochs"]))
        self.revision = translation_revision()
        self.autoencoders: dict[str, Any] | None = None
        self.ae_info: dict[str, dict] = {}
        self.identity = None
        self.wd_identity: float | None = None
        self._runs: dict[str, dict] = {}
        self._depth0: dict = {}  # depth-0 WD rows per (variant, input transform, WD method), shared by the runs
        self._asked: list[dict] | None = None  # while fit_all lists the configurations: those the sections ask for

    # -- preparation ---------------------------------------------------------------------------------------
    def prepare(self) -> dict[str, dict]:
        """Train (or load) the shared and the per-client autoencoders and measure the identity translator.
        Returns the autoencoders' info (see :func:`~fda_core.experiments.translation.experiments.get_autoencoders`)."""
        b = self.base
        shared, self.ae_info["shared"] = ex.get_autoencoders(
            "shared", self.domains, b["ae"]["shared_epochs"], b["seed"], b["device"], self.ae_cache, self.store.recompute)
        ind, self.ae_info["individual"] = ex.get_autoencoders(
            "individual", self.domains, b["ae"]["epochs"], b["seed"], b["device"], self.ae_cache, self.store.recompute)
        self.autoencoders = {"INB": None, "AEINB": shared, "IndAEINB": ind}
        self.identity = ex.identity_wd(self.domains, b["wd_method"], b["wd_reg"], b["wd_chunk"], device=b["device"])
        self.wd_identity = float(self.identity.wd.mean())
        return self.ae_info

    def autoencoder_summary(self) -> str:
        """One line per autoencoder kind: cached or trained (replacing a stale file), code revision, and the
        held-out reconstruction error per client."""
        lines = []
        for kind, info in self.ae_info.items():
            how = ("loaded from the cache" if info["cached"] else
                   "retrained (the cached file came from other autoencoder code)" if info["stale"] else "trained")
            errors = ", ".join(f"{e:.1f}" for e in info["test_recon_sq_error"])
            lines.append(f"{kind} autoencoder(s) ({info['n_models']}, {info['epochs']} epochs): {how}, code revision "
                         f"{info['revision']}; held-out reconstruction error per image (sum of squares): {errors}")
        return "\n".join(lines)

    # -- runs ----------------------------------------------------------------------------------------------
    def run(self, variant: str, n_bins: int | None = None, max_iter: int | None = None,
            option: str | None = None) -> dict[str, Any]:
        """One configuration, from the result store when the same code has finished it before. ``option``: the
        option set (:data:`OPTIONS`; default the plan's). The runs whose digits are drawn (:meth:`grid_runs`:
        the Hist run of the plan's variant and pixel INB) also keep translated digits and the Sinkhorn/EMD
        cross-check (one run per space: pixels and the autoencoders' latent space); a run with the other option set is
        evaluated at depth 0 and after the last layer only. VW histograms with V a multiple of n are not
        refitted: their search is the plain one bit for bit, so the record is the plain run's with the VW
        messages counted (:func:`~fda_core.experiments.translation.experiments.vw_record_from_plain`; the plain
        run is fitted or loaded instead). Returns the stored record plus ``config``."""
        p = self.plan
        cfg = self.config(variant, n_bins, max_iter, option)
        if self._asked is not None:  # fit_all is listing what the sections ask for: a stand-in record
            if not cfg["grid"] and ex.vw_equals_plain(n_bins, p["n_train_per_class"]):
                return self.run(variant, None, max_iter, option)  # its record will be the plain run's
            self._asked.append(cfg)
            return {"name": f"{variant}-{n_bins}-{cfg['max_iter']}-{option_of(cfg)}", "config": cfg}
        if self.autoencoders is None:
            self.prepare()
        grid, option, max_iter = cfg["grid"], option_of(cfg), cfg["max_iter"]
        key = config_hash(cfg)
        if key not in self._runs and not grid and ex.vw_equals_plain(n_bins, p["n_train_per_class"]):
            # V a multiple of n: the plain search bit for bit; its record with the VW messages, not refitted
            plain = self.run(variant, None, max_iter, option)
            self._runs[key] = {**ex.vw_record_from_plain(plain, n_bins), "config": cfg}
        if key not in self._runs:
            aes = self.autoencoders[variant]
            result = self.store.cached(
                EXPERIMENT, cfg, lambda: _fit(cfg, self.domains, aes, self._depth0, self.store.root, self.revision),
                revision=self.revision)
            self._runs[key] = {**result, "config": cfg}
        return self._runs[key]

    def config(self, variant: str, n_bins: int | None = None, max_iter: int | None = None,
               option: str | None = None) -> dict[str, Any]:
        """The store key (resolved config) of one configuration, as :meth:`run` fits it: the study's
        :attr:`base` plus variant, V, J, the option set's options and ``grid`` (whether its digits are drawn,
        which also keeps its fitted translator, :meth:`translator`). ValueError for an unknown option set."""
        p = self.plan
        option = p["option"] if option is None else option
        if option not in OPTIONS:
            raise ValueError(f"option must be one of {tuple(OPTIONS)}, got {option!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        max_iter = p["J"] if max_iter is None else int(max_iter)
        main = option == p["option"]
        grid = main and max_iter == p["J"] and ((n_bins is None and variant == "INB" and "INB" in p["variants"])
                                                or (n_bins == p["V"] and variant == p["variant"]))
        cfg = {**self.base, "variant": variant, "n_bins": n_bins, "max_iter": max_iter, "grid": grid,
               **OPTIONS[option]}
        if not main:
            cfg["eval_depths"] = [0, p["L"]]
        return cfg

    def translator_path(self, config: Mapping[str, Any]) -> Path:
        """Where the fitted translator of the run ``config`` is kept: beside its store record
        (:func:`~fda_core.experiments.translation.translators.translator_path`)."""
        return translator_path(self.store.root, EXPERIMENT, config)

    def translator(self, variant: str, n_bins: int | None = None, max_iter: int | None = None,
                   option: str | None = None, *, fit_missing: bool = True):
        """The fitted :class:`~fda_core.experiments.translation.inb.FedINB` of one configuration and whether it
        was reused: ``(model, reused)``. Reused from the sidecar that :meth:`run` writes beside the store record
        (the runs whose digits are drawn keep theirs) when the same code fitted it; otherwise fitted here (no
        evaluation: the record is left to :meth:`run`) and saved for the next caller. ``fit_missing=False``
        returns ``(None, False)`` instead of fitting. ``docs/translation.md`` § Fitted translators reused."""
        if self.autoencoders is None:
            self.prepare()
        cfg = self.config(variant, n_bins, max_iter, option)
        path = self.translator_path(cfg)
        aes = self.autoencoders[variant]
        model = load_translator(path, cfg, self.revision, aes)
        if model is not None:
            return model, True
        if not fit_missing:
            return None, False
        model = ex.build_translator(cfg, aes).fit(self.domains.train_x, self.domains.train_y)
        save_translator(path, model, cfg, self.revision)
        return model, False

    def variant_runs(self) -> dict[str, dict]:
        """Panel (a): every variant with sorted projections, L-K-J of the plan."""
        return {run_label(r): r for r in (self.run(v) for v in self.plan["variants"])}

    def j_runs(self) -> dict[str, dict]:
        """Panel (b): the plan's variant for each J of the sweep."""
        return {f"J={j}": self.run(self.plan["variant"], max_iter=j) for j in self.plan["J_values"]}

    def hist_variants(self) -> list[str]:
        """The variants of the VW-histogram panels: INB and the plan's variant."""
        return list(dict.fromkeys(["INB", self.plan["variant"]]))

    def v_runs(self) -> dict[str, dict[str, dict]]:
        """Panels (d)-(e): per histogram variant, one run per V of the sweep."""
        return {v: {f"V={b}": self.run(v, n_bins=b) for b in self.plan["V_values"]} for v in self.hist_variants()}

    def plain_vs_hist(self) -> dict[str, dict]:
        """Panel (c): each histogram variant with sorted projections and with V bins."""
        v = self.plan["V"]
        out = {f"{var} (sorted samples)": self.run(var) for var in self.hist_variants()}
        out.update({f"Hist {var}, V={v}": self.run(var, n_bins=v) for var in self.hist_variants()})
        return out

    def headline_runs(self) -> dict[str, dict]:
        """The runs of the summary and communication tables: panel (a) and each Hist variant with V bins."""
        v = self.plan["V"]
        return {**self.variant_runs(), **{f"Hist {var} V={v}": self.run(var, n_bins=v) for var in self.hist_variants()}}

    def grid_runs(self) -> dict[str, dict]:
        """The runs whose translated digits are drawn: Hist <variant> with V bins, and pixel INB when it runs."""
        p = self.plan
        out = {"translation_grid": self.run(p["variant"], n_bins=p["V"])}
        if "INB" in p["variants"]:
            out["translation_grid_inb"] = self.run("INB")
        return out

    def trace_runs(self) -> dict[str, dict]:
        """The runs of the objective traces and iteration counts: INB, Hist INB (V) and the plan's variant."""
        p = self.plan
        return {run_label(r): r for r in (self.run("INB"), self.run("INB", n_bins=p["V"]), self.run(p["variant"]))}

    def other_option(self) -> str:
        """The option set that is not the plan's."""
        return next(o for o in OPTIONS if o != self.plan["option"])

    def option_runs(self) -> dict[str, dict[str, dict]]:
        """The runs of the paper's Table 5 (INB, Hist INB with V, the plan's variant; J of the plan) under both
        option sets: {variant row of Table 5: {option: record}}; the other option set only with
        ``compare_options``."""
        p = self.plan
        specs = {"INB": ("INB", None), "Hist INB": ("INB", p["V"]), p["variant"]: (p["variant"], None)}
        options = [p["option"]] + ([self.other_option()] if p["compare_options"] else [])
        return {row: {o: self.run(v, n_bins=b, option=o) for o in options} for row, (v, b) in specs.items()}

    def plain_runs(self) -> dict[str, dict]:
        """Each histogram variant with sorted projections (the reference of the V sweeps), by variant."""
        return {var: self.run(var) for var in self.hist_variants()}

    def cross_check_runs(self) -> dict[str, dict]:
        """The runs with the Sinkhorn/EMD cross-check: those of :meth:`grid_runs` (pixel INB and the Hist run of
        the plan's variant), one per space the WD is measured in."""
        grid = self.grid_runs()
        runs = ([grid["translation_grid_inb"]] if "translation_grid_inb" in grid else []) + [grid["translation_grid"]]
        return {run_label(r): r for r in runs}

    def all_runs(self) -> dict[str, dict]:
        """Every run fitted or loaded so far, by its paper name."""
        return {run_label(r): r for r in self._runs.values()}

    def notebook_configs(self) -> list[dict[str, Any]]:
        """The store keys of every configuration notebook 06's sections ask for, each once, in the order they ask:
        the sections' own requests, listed by calling them with :meth:`run` answering stand-ins."""
        self._asked = []
        try:
            for section in (self.variant_runs, self.j_runs, self.v_runs, self.plain_vs_hist, self.grid_runs,
                            self.trace_runs, self.option_runs, self.headline_runs, self.cross_check_runs):
                section()
            asked = self._asked
        finally:
            self._asked = None
        unique = {config_hash(c): c for c in asked}
        return list(unique.values())

    def fit_all(self, progress: bool = False) -> int:
        """With ``workers`` > 1: fit every configuration of :meth:`notebook_configs` that the store does not hold,
        in ``workers`` processes side by side, saving each record (and the drawn runs' translators) as it
        finishes; the sections then read them from the store. Each worker rebuilds the clients' digits from the
        plan and loads the autoencoders :meth:`prepare` cached. A V that is a multiple of n is not fitted (its
        record is the plain run's, :meth:`run`), nor is a run the store holds. Returns the number of runs fitted
        here; with one worker nothing is looked up or fitted, and the sections fit their runs when they ask."""
        if self.workers == 1:
            return 0
        if self.autoencoders is None:
            self.prepare()
        p = self.plan
        configs = [cfg for cfg in self.notebook_configs() if config_hash(cfg) not in self._runs]

        def record(i: int, result: dict[str, Any], computed: bool) -> None:
            cfg = configs[i]
            self._runs[config_hash(cfg)] = {**result, "config": cfg}
            if computed and progress:
                print(f"  fitted {run_label({'name': result['name'], 'config': cfg})}", flush=True)

        setup = (p["angles"], p["n_train_per_class"], p["n_test_per_class"], p["data_root"], p["seed"],
                 self.base["ae"], self.base["device"], str(self.ae_cache), self.store.root, self.revision)
        runs = [StoredRun(cfg, cfg, self.revision, f"{EXPERIMENT} run {_describe_run(cfg)}") for cfg in configs]
        return store_side_by_side(runs, self.workers, store=self.store, experiment=EXPERIMENT, on_result=record,
                                  task=WorkerTask(_fit_in_worker, _load_translation_data, setup), at_least=1)

    # -- notes -----------------------------------------------------------------------------------------------
    def setting_note(self, records: Mapping[str, Mapping[str, Any]] | None = None) -> str:
        """The setting, written from the resolved config the runs ran with: given ``records``, the part of
        their configs that they all share (and the classes they fitted); else the study's :attr:`base`."""
        b = _shared_config(records) if records else self.base
        d = b["data"]
        m = len(d["angles"])
        classes = {len(r["classes"]) for r in (records or {}).values() if "classes" in r}
        n_classes = f"{classes.pop()} digit classes" if len(classes) == 1 else "the digit classes"
        angles = ", ".join(f"{a:g}" for a in d["angles"])
        return (f"Setting: Rotated MNIST from {d['source']}"
                + (f" ({d['data_root']})" if d["data_root"] and d["data_root"] not in d["source"] else "")
                + f"; clients at {angles} degrees; {_digit_counts(d, self.domains)}; L={b['n_layers']} layers, "
                f"K={b['n_directions']} directions; seed={b['seed']}; device={b['device']}; autoencoders trained "
                f"{b['ae']['epochs']} epochs (one per client, IndAEINB) "
                f"and {b['ae']['shared_epochs']} epochs (shared, AEINB); WD = {b['wd_method']} (squared-Euclidean OT "
                f"cost) on held-out digits after layers {self.base['eval_depths']}, mean over {m * (m - 1)} ordered "
                f"client pairs and {n_classes}.")

    def paper_note(self) -> str:
        """How the paper's setting differs (its numbers from :mod:`fda_core.experiments.paper_numbers`)."""
        s = paper_value("setting")
        return (f"Paper ({INB_PAPER['setting']['source']}): {s['n_train_per_class']} training and "
                f"{s['n_test_per_class']} test digits per class and client from {s['data']}, L={s['L']}, K={s['K']}, "
                f"J={s['J']}, V from {s['V_range'][0]} to {s['V_range'][1]}, WD by {s['wd']} after {s['wd_depths']}, "
                f"autoencoder training {s['autoencoder_training']}.")

    def note(self, records: Mapping[str, Any] | None = None, extra: str = "", paper: bool = True) -> str:
        """A CSV note: the setting, the runs of the table (each by its paper name, with variant, J and V read
        from its config; ``records`` may nest one level, as the V sweeps do), the paper's setting and ``extra``."""
        runs = _flatten(records or {})
        lines = [self.setting_note(runs)]
        if runs:
            lines.append("Runs: " + "; ".join(f"{name} ({_describe_run(r['config'], self.base['eval_depths'])})"
                                              for name, r in runs.items()) + ".")
            options = list(dict.fromkeys(option_of(r["config"]) for r in runs.values()))
            lines.append("Options: " + "; ".join(f"{o} = {_OPTION_TEXT[o]}" for o in options) + ".")
        if paper:
            lines.append(self.paper_note())
        if extra:
            lines.append(extra)
        return "\n".join(lines)

    def vw_note(self) -> str:
        """The VW panels' extra note: when V ≥ n a client sends more numbers than its sorted samples."""
        n = self.base["data"]["n_train"]
        above = [v for v in self.plan["V_values"] if v >= n]
        return (f"Here n = {n} digits per class and client (the paper's n = "
                f"{paper_value('setting')['n_train_per_class']}); "
                + (f"V in {above} >= n sends more numbers than the sorted samples themselves." if above else
                   "every V < n."))

    def traces_note(self, records: Mapping[str, Mapping[str, Any]]) -> str:
        """The traces' extra note: objectives of latent-space runs are not comparable in value with pixel ones."""
        latent = [(label, r["dim"]) for label, r in records.items() if r["config"]["variant"] != "INB"]
        return " ".join(f"The {label} objective lives in the {dim}-dimensional latent space and is not comparable "
                        "in value." for label, dim in latent)

    def cross_check_note(self) -> str:
        """The cross-check's extra note: which solver checks which, with the Sinkhorn epsilon."""
        b = self.base
        other = "sinkhorn" if b["wd_method"] == "emd" else "emd"
        return (f"Final WD by {b['wd_method']} (primary) and by {other}; Sinkhorn epsilon = {b['wd_reg']:g} x mean "
                "cost.")
