"""The federated domain adaptation (FDA) round loop of the papers, for any registered method.

FedGP paper Algorithm 1 (App. B.1): every round r, each source client starts from the global model
h^(r-1), trains locally and sends its update g_i = h_i^(r) − h^(r-1); the target client starts from
h^(r-1), trains on its few labelled samples (update g_T) and h^(r) = h^(r-1) + Aggr({g_i}, g_T, β).
β weights the SOURCE part (library convention; the papers' App. B.2 writes β on the target side).

The loop knows no method by name: each round it asks the method (:mod:`fda_core.experiments.methods`)
which clients train and how (:meth:`~fda_core.experiments.methods.Method.configure_round`), trains them
with the method's local objective, and lets the method's server step
(:meth:`~fda_core.experiments.methods.Method.aggregate`) set the new global model; after the last round
the method's optional :meth:`~fda_core.experiments.methods.Method.after_training` runs (e.g. fine-tuning).

Implementation (no model copies, :mod:`fda_core.experiments.flat`): one ``nn.Module`` whose parameters
are views into one flat vector serves every client; a client's update is written straight into row i of
a preallocated (N, m) buffer; Adam runs as fused vector operations. BatchNorm statistics are buffers and
never enter a rule or an estimator; the method says which ones the global model keeps.

Warm-up and learning rates (``docs/experiments.md`` § Warm-up and learning rates): the first
``warmup_rounds`` rounds are FedAvg for every FDA method, then both learning rates are multiplied by
``lr_decay`` (reference code of the auto-weighted paper: 2 warm-up rounds, × 0.1). The target's learning
rate defaults to 1/5 of the sources' (auto-weighted paper App. C.2).
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from ..common.checks import check_choice
from ..common.checks import is_int as _is_int
from ..common.checks import is_number as _is_num
from ..common.devices import resolve_device
from ..common.seeding import derive_seed, generator
from .batched_clients import (CLIENT_BATCHING, batched_losses, batching_blockers, stack_clients,
                              train_sources_batched)
from .flat import FlatAdam, FlatModel, accuracy, count_steps, local_train
from . import shared_rounds
from .methods import ClientInfo, Method, RoundInfo, RoundResults, get_method

__all__ = ["DEFAULT_CONFIG", "CONFIG_ALIASES", "ALIGNMENT_STEPS", "make_config", "run_experiment", "target_index", "Run", "run_many",
           "EXECUTION_FIELDS", "computed_content", "sweep_configs", "store_key", "code_revision_of", "check_configs_fit_data",
           "dataset_key"]

#: Default configuration of :func:`run_experiment` (the allowed keys, besides :data:`CONFIG_ALIASES`).
DEFAULT_CONFIG: dict[str, Any] = {
    "dataset": "ColoredMNIST",      # registered name (fda_core.data.datasets.list_datasets())
    "dataset_options": {},          # passed to get_dataset, e.g. {"noise_std": 0.4}
    "target": None,                 # env name or index; None -> the dataset's default_target (else 0)
    "rule": "fedgp",                # a registered method (fda_core.experiments.methods.list_methods()), or a spec
    "method_options": {},           # options of the method, e.g. {"beta": 1.0, "projection": "cosine"}
    "rounds": 10,
    "local_epochs": 1,              # source local epochs per round
    "target_local_epochs": None,    # None -> local_epochs
    "warmup_rounds": 2,
    "lr_decay": 0.1,
    "optimizer": "adam",            # 'adam' or 'sgd'
    "source_lr": 1e-3,
    "target_lr": None,              # None -> source_lr / 5 (auto-weighted paper App. C.2)
    "source_batch_size": 64,
    "target_batch_size": 4,
    "n_target_labeled": 18,         # count of labelled target samples (0.1% of full MNIST's env ≈ 18) ...
    "target_fraction": None,        # ... or a fraction of the target train split (then n_target_labeled=None)
    "train_fraction": 0.8,          # target env: train split (labelled samples drawn from it), rest = test
    "source_fraction": 1.0,         # fraction of each source env used for training
    "model": "small_cnn",
    "model_options": {},
    "seed": 0,
    "device": "auto",
    "eval_every": 1,
    "client_batching": "auto",      # source clients of a round trained as one vmap-ed computation: 'auto' (on CUDA
                                    # when the run qualifies), 'vmap', 'compile' (vmap + torch.compile; the target
                                    # client through it too, as a batch of one) or 'loop'
                                    # (experiments/batched_clients.py);
                                    # like 'device', an execution choice (float rounding only), not part of a run's key
    "alignment_steps": "fractional",  # step counts of the magnitude-alignment factor: 'fractional' (n/bs·epochs,
                                      # FedGP paper Eq. B.2 and its code) or 'taken' (⌈n/bs⌉·epochs)
}

#: the ``client_batching`` modes in which the target client of an FDA round trains through the batched objective too,
#: as a batch of one client (when the run's sources are batched and the target's per-step parts are not needed): with
#: "compile" its steps replay CUDA graphs on a GPU, which is what it is for (issue 17: the target, trained alone, was
#: what was left of a compiled round); with "vmap" it would only change the order of float operations.
BATCHED_TARGET_MODES = ("compile",)

#: Config keys that choose how a run executes, not what it computes (float rounding aside): left out of store keys
#: and of the settings notes of result tables.
EXECUTION_KEYS = ("device", "client_batching")

#: Allowed values of ``alignment_steps`` (``docs/reproduction.md`` § Reference-exact options).
ALIGNMENT_STEPS = ("fractional", "taken")

#: Top-level keys that set a method option (the names ``run_experiment`` has always accepted):
#: ``beta`` (FedDA/FedGP), ``projection`` (FedGP and FedGP_Auto), ``finetune_epochs`` (Finetune_Offline).
CONFIG_ALIASES: dict[str, str] = {"beta": "beta", "projection": "projection", "finetune_epochs": "epochs"}


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
def _check(cond: bool, name: str, allowed: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def make_config(**config: Any) -> dict[str, Any]:
    """The full, validated config: defaults filled in, the method resolved to its canonical name and full
    options (``rule``, ``method_options``), derived values (target_lr, target_local_epochs) set. Raises
    ValueError naming the key and its allowed range."""
    allowed = set(DEFAULT_CONFIG) | set(CONFIG_ALIASES)
    unknown = sorted(set(config) - allowed)
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; allowed keys: {sorted(allowed)}")
    c = {**DEFAULT_CONFIG, **{k: v for k, v in config.items() if k not in CONFIG_ALIASES}}
    c["dataset_options"] = dict(c["dataset_options"] or {})
    c["model_options"] = dict(c["model_options"] or {})
    _check(isinstance(c["method_options"], Mapping), "method_options", "a mapping option -> value", c["method_options"])
    _check(isinstance(c["rule"], (str, Mapping)), "rule", "a registered method name (see list_methods()) or a spec",
           c["rule"])
    options = {CONFIG_ALIASES[k]: v for k, v in config.items() if k in CONFIG_ALIASES and v is not None}
    options.update(c["method_options"])
    method = get_method(c["rule"], **options)
    c["rule"], c["method_options"] = method.name, method.option_values
    for key in ("rounds", "local_epochs", "source_batch_size", "target_batch_size", "eval_every"):
        _check(_is_int(c[key]) and c[key] >= 1, key, "an integer >= 1", c[key])
    for key in ("warmup_rounds", "seed"):
        _check(_is_int(c[key]) and c[key] >= 0, key, "an integer >= 0", c[key])
    for key in ("source_lr", "lr_decay"):
        _check(_is_num(c[key]) and c[key] > 0, key, "a positive finite number", c[key])
    _check(c["optimizer"] in ("adam", "sgd"), "optimizer", "'adam' or 'sgd'", c["optimizer"])
    _check(c["client_batching"] in CLIENT_BATCHING, "client_batching", "'auto', 'loop', 'vmap' or 'compile'",
           c["client_batching"])
    _check(c["alignment_steps"] in ALIGNMENT_STEPS, "alignment_steps", "'fractional' or 'taken'", c["alignment_steps"])
    if c["target_lr"] is None:
        c["target_lr"] = c["source_lr"] / 5  # auto-weighted paper App. C.2: target lr = 1/5 of source lr
    _check(_is_num(c["target_lr"]) and c["target_lr"] > 0, "target_lr", "a positive finite number or None", c["target_lr"])
    if c["target_local_epochs"] is None:
        c["target_local_epochs"] = c["local_epochs"]
    _check(_is_int(c["target_local_epochs"]) and c["target_local_epochs"] >= 1, "target_local_epochs",
           "an integer >= 1 or None", c["target_local_epochs"])
    if c["target_fraction"] is not None:
        _check(_is_num(c["target_fraction"]) and 0 < c["target_fraction"] <= 1, "target_fraction",
               "a number in (0, 1] or None", c["target_fraction"])
        c["n_target_labeled"] = None
    else:
        _check(_is_int(c["n_target_labeled"]) and c["n_target_labeled"] >= 1, "n_target_labeled",
               "an integer >= 1 (or give target_fraction)", c["n_target_labeled"])
    for key in ("train_fraction", "source_fraction"):
        _check(_is_num(c[key]) and 0 < c[key] <= 1, key, "a number in (0, 1]", c[key])
    _check(isinstance(c["dataset"], str), "dataset", "a registered dataset name", c["dataset"])
    _check(isinstance(c["model"], str), "model", "a registered model name", c["model"])
    _check(c["target"] is None or isinstance(c["target"], (int, str)) and not isinstance(c["target"], bool),
           "target", "an environment name or index (or None)", c["target"])
    resolve_device(c["device"])
    return c


#: How the trials of a sweep draw their data set (:func:`sweep_configs`' ``data_seed``).
DATA_SEEDS = ("fixed", "per_trial")


def _check_per_trial_data_seed(base: Mapping[str, Any], variants: Sequence[Mapping[str, Any]]) -> None:
    """``data_seed="per_trial"`` sets the data set's ``seed`` option: the data set of every variant must take one,
    and none may set it already (ValueError naming ``data_seed`` otherwise, before anything runs)."""
    import inspect

    from ..data.datasets import dataset_factory, list_datasets

    list_datasets()  # registers the data sets defined in their own modules
    for v in variants:
        name = v.get("dataset", base.get("dataset", DEFAULT_CONFIG["dataset"]))
        options = v.get("dataset_options", base.get("dataset_options", {}))  # a variant's replace the base's
        factory = dataset_factory(name)
        if factory is None:
            continue  # an unknown name: make_config names it
        try:  # Python's own rule for whether the factory takes seed= (a parameter, or keyword options passed on)
            inspect.signature(factory).bind_partial(seed=0)
        except TypeError:
            raise ValueError(f"data_seed='per_trial' redraws the data set per trial through its seed option, but "
                             f"dataset {name!r} takes none; use data_seed='fixed'") from None
        if "seed" in options:
            raise ValueError(f"data_seed='per_trial' sets dataset_options['seed'] to each trial's seed; "
                             f"dataset_options already sets it ({options['seed']!r}): drop it or use data_seed='fixed'")


def sweep_configs(base: Mapping[str, Any], methods: Sequence[str], *, targets: Sequence[Any] = (None,),
                  seeds: Sequence[int] = (0,), variants: Sequence[Mapping[str, Any]] = ({},),
                  tuned: Mapping[Any, Mapping[str, Mapping[str, Any]]] | None = None,
                  per_method: Mapping[str, Mapping[str, Any]] | None = None, data_seed: str = "fixed"
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Configs and labels of a grid: every variant (config overrides, e.g. {"dataset_options":
    {"noise_std": 0.4}}) × target × method × seed (trial). ``methods`` are method specs (``"fedgp"``,
    ``"fedgp(beta=1.0)"``; see :func:`fda_core.experiments.methods.parse_method_spec`). Labels hold the
    method's display label, the seed's trial index and the variant's scalar settings (dataset options
    flattened) for the tables; a variant's ``"labels"`` mapping (e.g. ``{"setting": "paper"}``) only labels
    its runs and does not enter the config.

    ``tuned`` (per target: canonical method name → options, e.g. the choices of a source-data sweep,
    ``docs/baselines.md`` § Source-data sweep) overrides those options in that target's runs of that method; the
    row label stays the spec's, and the label ``"tuned"`` says what was set ("" where nothing was).

    ``per_method`` (canonical method name → config keys, e.g. the reference scripts' per-row budgets,
    :func:`fda_core.experiments.paper_numbers.reference_budgets`) sets config keys in every run of that method,
    over ``base`` and under a variant's; a display label (``"Target only (after warm-up)"``) keys that variant of
    a method alone and wins over its canonical name; keys naming no method of the grid are ignored.

    A variant may carry its own ``"per_method"`` (same form, for that variant's runs only, over the call's) and
    ``"options"`` (canonical method name → method options set in that variant's runs, e.g. the noniid reference
    scripts' Target only after the warm-up, ``{"target_only": {"warmup": True}}``); a method run with other
    options is labelled by its own display label ("Target only (after warm-up)"), so the tables never hide them.

    ``data_seed`` (:data:`DATA_SEEDS`): ``"fixed"`` builds every trial's data set with the ``dataset_options`` as
    given (one draw of the data for all trials: the trials differ in their splits, initialisation and mini-batches
    only); ``"per_trial"`` also draws the data set anew per trial, its ``seed`` option set to the trial's seed, as the
    FedGP papers' DomainBed scripts do (``--seed $seed --trial_seed $seed``, which reshuffle, relabel and recolour
    ColoredMNIST per trial; ``docs/reproduction.md`` row 16). ``"per_trial"`` needs a data set that takes a ``seed``
    option and ``dataset_options`` without one."""
    resolved = [get_method(m) for m in methods]  # validates every spec before anything runs
    check_choice(data_seed, "data_seed", DATA_SEEDS)
    if data_seed == "per_trial":
        _check_per_trial_data_seed(base, variants)
    allowed = set(DEFAULT_CONFIG) - {"rule", "method_options", "target", "seed"}

    def checked(pm: Mapping[str, Mapping[str, Any]] | None, where: str) -> dict[str, dict[str, Any]]:
        pm = {rule: dict(keys) for rule, keys in (pm or {}).items()}
        for rule, keys in pm.items():
            if not set(keys) <= allowed:
                raise ValueError(f"{where}[{rule!r}] may set the config keys {sorted(allowed)}; "
                                 f"got {sorted(set(keys) - allowed)}")
        return pm

    per_method = checked(per_method, "per_method")
    variant_per_method = [checked(v.get("per_method"), f"variants[{i}]['per_method']") for i, v in enumerate(variants)]
    variant_methods = [[get_method(m.name, **{**m.option_values, **v.get("options", {}).get(m.name, {})})
                        if m.name in v.get("options", {}) else None for m in resolved] for v in variants]
    tuned = {t: {rule: dict(opts) for rule, opts in by_rule.items()} for t, by_rule in (tuned or {}).items()}
    unknown = [t for t in tuned if t not in targets]
    if unknown:
        raise ValueError(f"tuned must be keyed by targets of the sweep {list(targets)}, got {unknown}")
    options = {(t, i): get_method(m.name, **{**m.option_values, **tuned.get(t, {}).get(m.name, {})})
               for t in targets for i, m in enumerate(resolved)}  # validates the tuned options too
    configs, labels = [], []
    for v_index, variant in enumerate(variants):
        var = {k: v for k, v in variant.items() if k not in ("labels", "per_method", "options")}
        flat = {k: v for k, v in var.items() if not isinstance(v, Mapping)}
        for k, v in var.items():
            if isinstance(v, Mapping):
                flat.update(v)
        flat.update(variant.get("labels", {}))
        for target in targets:
            for i, spec_method in enumerate(resolved):
                method = variant_methods[v_index][i] or spec_method  # its label names the variant's options
                extra = variant.get("options", {}).get(spec_method.name)
                ran = options[(target, i)] if extra is None else get_method(
                    spec_method.name, **{**options[(target, i)].option_values, **extra})
                own = {**per_method.get(method.display_label, per_method.get(method.name, {})),
                       **variant_per_method[v_index].get(method.display_label,
                                                         variant_per_method[v_index].get(method.name, {}))}
                tuned_label = {"tuned": ", ".join(f"{k}={v:g}" if isinstance(v, (int, float)) and not isinstance(v, bool)
                                                 else f"{k}={v}" for k, v in tuned[target][method.name].items())
                               if method.name in tuned.get(target, {}) else ""} if tuned else {}
                for trial, seed in enumerate(seeds):
                    config = {**base, **own, **var, "target": target, "seed": seed, "rule": ran.name,
                              "method_options": ran.option_values}
                    if data_seed == "per_trial":
                        config["dataset_options"] = {**config.get("dataset_options", {}), "seed": seed}
                    configs.append(config)
                    labels.append({"method": method.display_label, "trial": trial, **tuned_label, **flat})
    return configs, labels


# ---------------------------------------------------------------------------------------------
# One run
# ---------------------------------------------------------------------------------------------
#: Seed streams of a run (:func:`fda_core.common.seeding.generator`): one per purpose, then per round and client.
_STREAM_CLIENT, _STREAM_SOURCE_SUBSET, _STREAM_AUX_HEADS, _STREAM_INPUT_NOISE = 1, 2, 3, 4
#: Who trains in a client stream: a source (with its index), the target on its labelled samples, the target on
#: its whole train split (Oracle).
_SOURCE, _TARGET, _TARGET_TRAIN = 0, 1, 2


def _warn_batchnorm_batches_of_one(c: Mapping[str, Any], module: torch.nn.Module, target: Mapping[str, Any],
                                   sources: Sequence[Mapping[str, Any]]) -> None:
    """Warn before training when a model with BatchNorm layers would train a client on a batch of ONE image (a batch
    size of 1, or the last batch of an epoch): BatchNorm then normalises the image by its own statistics, and with
    average pooling after the last norm layer (``mnist_cnn``) the features are the same for every image, so that
    client learns only a constant shift of the logits (``docs/reproduction.md`` row 10)."""
    if not any(isinstance(m, torch.nn.modules.batchnorm._BatchNorm) for m in module.modules()):
        return
    clients = [("the target client", "target_batch_size", int(target["x_lab"].shape[0]))]
    clients += [(f"source {i}", "source_batch_size", int(s["x"].shape[0])) for i, s in enumerate(sources)]
    for who, key, n in clients:
        bs = c[key]
        if n > 0 and (bs == 1 or n % bs == 1):
            which = "every batch" if bs == 1 else f"the last batch of each epoch ({n} samples)"
            warnings.warn(
                f"model {c['model']!r} has BatchNorm layers and {who} trains on batches of one image ({key}={bs}: "
                f"{which}); BatchNorm then normalises each image by its own statistics, and with average pooling "
                "after it (mnist_cnn) the features are the same for every image, so those steps learn only a constant "
                "shift of the logits (docs/reproduction.md row 10). Use a GroupNorm model (mnist_cnn's default, "
                "model_options={'norm': 'group'}) or batches of 2 or more.", RuntimeWarning, stacklevel=3)
            return


def target_index(ds: Any, target: int | str | None = None) -> int:
    """The target environment's index, as every run resolves it: ``target`` resolved by the data set (name or
    index, :meth:`FDADataset.env_index`), else its ``default_target``, else 0 (leave-one-domain-out sets)."""
    if target is None:
        return ds.default_target if getattr(ds, "default_target", None) is not None else 0
    return ds.env_index(target)


def dataset_key(config: Mapping[str, Any]) -> str:
    """One string per distinct data set of a run config: its registered ``dataset`` name and its
    ``dataset_options``, as sorted JSON (values JSON cannot hold by their ``repr``). Runs with equal keys build the
    same data set, so a sweep builds (or describes) each one once."""
    return json.dumps([config["dataset"], config["dataset_options"]], sort_keys=True, default=repr)


def check_configs_fit_data(configs: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> None:
    """Before the first run of a sweep: each resolved config (:func:`make_config`) names a target its data set
    has, and asks for no more labelled target examples than the target's train pool holds
    (:func:`fda_core.data.datasets.train_pool_of`), else ValueError naming the run (``names``, one per
    config), ``n_target_labeled`` and its allowed range. These are the checks a run would otherwise make only
    when it starts, after the sweep's earlier runs. Each distinct data set (name and options) is built once,
    here, and dropped again (a second or so for MNIST-5k's; the runs build their own)."""
    from ..data.datasets import get_dataset, train_pool_of

    names = list(names) if names is not None else [f"config {i + 1}" for i in range(len(configs))]
    groups: dict[str, list[int]] = {}
    for i, c in enumerate(configs):
        groups.setdefault(dataset_key(c), []).append(i)
    for members in groups.values():
        first = configs[members[0]]
        try:
            ds = get_dataset(first["dataset"], **first["dataset_options"])
        except Exception as exc:
            exc.add_note(f"building the data set of {names[members[0]]}, before any run of the sweep")
            raise
        for i in members:
            c = configs[i]
            try:
                t = target_index(ds, c["target"])
            except ValueError as exc:
                raise ValueError(f"{names[i]}: target: {exc}") from None
            size = int(ds[t][0].shape[0])  # the target's examples, as _prepare reads them
            try:
                pool, fraction = train_pool_of(ds, t, c["train_fraction"])
            except ValueError as exc:
                raise ValueError(f"{names[i]}: {exc}") from None
            n = c["n_target_labeled"]
            if n is not None and not 1 <= n <= pool:
                share = ("all (the data set holds its test set apart)" if fraction != c["train_fraction"]
                         else f"train_fraction {c['train_fraction']:g}")
                raise ValueError(
                    f"{names[i]}: n_target_labeled must be an integer in [1, {pool}] (the train pool of target "
                    f"{ds.ENVIRONMENTS[t]!r} of {c['dataset']!r}: {share} of its "
                    f"{size:,} examples), got {n!r}; nothing has run yet")
        del ds


def _prepare(c: dict[str, Any], dataset: Any = None):
    from ..data.datasets import get_dataset, labeled_split, train_pool_of
    from ..data.models import get_model

    ds = dataset if dataset is not None else get_dataset(c["dataset"], **c["dataset_options"])
    t = target_index(ds, c["target"])
    device = resolve_device(c["device"])
    xt, yt = ds[t][:2]  # datasets with auxiliary labels return (x, y, aux); the target trains on y only
    held = (getattr(ds, "held_out_test", None) or {}).get(t)  # a test set apart from the client: all of it trains
    _, fraction = train_pool_of(ds, t, c["train_fraction"])
    lab, unlab, test = labeled_split(xt.shape[0], n_labeled=c["n_target_labeled"], fraction=c["target_fraction"],
                                     train_fraction=fraction, seed=c["seed"])
    x_test, y_test = (xt[test], yt[test]) if held is None else held[:2]
    target = {
        "x_lab": xt[lab].to(device), "y_lab": yt[lab].to(device),
        "x_train": xt[torch.cat([lab, unlab])].to(device), "y_train": yt[torch.cat([lab, unlab])].to(device),
        "x_test": x_test.to(device), "y_test": y_test.to(device),
    }
    noise = dict(getattr(ds, "input_noise", None) or {})
    if any(i != t for i in noise):
        raise ValueError(f"dataset {c['dataset']!r} asks for input noise on environments {sorted(noise)}; the "
                         f"federated loop draws it on the target only (environment {t})")
    if noise.get(t, 0.0) > 0:  # drawn anew every round by Run.refresh_input_noise, from these clean images
        target["noise_std"] = float(noise[t])
        target["clean"] = {k: target[k].clone() for k in ("x_lab", "x_train", "x_test")}
    # the unlabelled part of the train split (a view: the labels stay unread), for methods that adapt on it
    target["x_unlab"] = target["x_train"][lab.numel():]
    sources = []
    g = generator(c["seed"], _STREAM_SOURCE_SUBSET)
    for i in range(len(ds)):
        if i == t:
            continue
        item = ds[i]
        xs, ys = item[:2]
        aux = item[2] if len(item) > 2 else None
        if c["source_fraction"] < 1:
            keep = torch.randperm(xs.shape[0], generator=g)[: max(1, round(c["source_fraction"] * xs.shape[0]))]
            xs, ys = xs[keep], ys[keep]
            aux = aux[keep] if aux is not None else None
        sources.append({"name": ds.ENVIRONMENTS[i], "x": xs.to(device), "y": ys.to(device),
                        "aux": aux.to(device) if aux is not None else None})
    module = get_model(c["model"], tuple(ds.input_shape), ds.num_classes, seed=c["seed"], **c["model_options"])
    tasks = tuple(getattr(ds, "aux_tasks", ()) or ())
    if tasks:  # one head per auxiliary task on the shared trunk (docs/auxiliary.md § Auxiliary tasks)
        from ..data.auxiliary import AuxHeads

        module = AuxHeads(module, tasks, seed=derive_seed(c["seed"], _STREAM_AUX_HEADS))
    fm = FlatModel(module, device)
    return ds, t, target, sources, fm, device


class Run:
    """The state of one run, and what a method's hooks may do with it.

    Attributes: ``config`` (resolved), ``method``, ``model`` (the :class:`FlatModel` every client uses),
    ``theta`` (m,) the global parameters, ``buffers`` the global BatchNorm statistics, ``history`` (one
    entry per evaluation), ``target`` (the target's tensors: x_lab/y_lab, x_train/y_train, x_test/y_test),
    ``sources`` (name, x, y per source client), ``weights`` (N,) sample weights n_i / Σ n_i.
    ``target["x_unlab"]`` is the train split without its labelled samples (the unlabelled data of the
    unsupervised FDA methods; ``docs/baselines.md`` § Engine hooks).

    Generic tools for methods (``docs/baselines.md`` § Engine hooks): :meth:`train_local` trains any client
    from any starting model without touching the global one; :meth:`score` scores a module on the target's
    test split; a method's ``setup(run)`` runs once here, and its ``target_scores(run)`` replaces the global
    model's scores at every evaluation (a personal model).
    """

    def __init__(self, config: dict[str, Any], method: Method, dataset: Any = None) -> None:
        self.config = c = config
        self.method = method
        self.dataset, t, self.target, self.sources, self.model, self.device = _prepare(c, dataset)
        self.target_name = self.dataset.ENVIRONMENTS[t]
        fm, n_src = self.model, len(self.sources)
        if n_src == 0 and method.needs_sources:
            raise ValueError(f"rule {method.name!r} needs at least one source environment besides the target")
        if method.estimates_beta:
            steps = count_steps(self.target["x_lab"].shape[0], c["target_batch_size"], c["target_local_epochs"])
            if steps < 2:
                raise ValueError(
                    f"rule {method.name!r} estimates the target variance from per-batch updates and needs >= 2 target "
                    f"batches per round, but n_target_labeled={self.target['x_lab'].shape[0]} with "
                    f"target_batch_size={c['target_batch_size']} gives {steps}; lower target_batch_size or raise "
                    "target_local_epochs")
        _warn_batchnorm_batches_of_one(c, fm.module, self.target, self.sources)
        dtype = fm.flat.dtype
        self.optimizer = FlatAdam(fm.m, self.device, dtype, kind=c["optimizer"])
        sizes = torch.tensor([s["x"].shape[0] for s in self.sources], dtype=dtype, device=self.device)
        self.weights = sizes / sizes.sum() if n_src else sizes  # FedAvg sample weights n_i / Σ n_i
        self.weight_list = self.weights.tolist()  # the same as Python floats, read once (RoundResults.weight_values)
        self.theta = fm.flat.detach().clone()  # global model h^(r)
        self.buffers = fm.buffers()
        self._source_updates = torch.empty(n_src, fm.m, device=self.device, dtype=dtype) if n_src else None
        self._target_update = torch.empty(fm.m, device=self.device, dtype=dtype)
        self._scratch = torch.empty(fm.m, device=self.device, dtype=dtype)
        self._parts: Tensor | None = None
        self.history: list[dict[str, Any]] = []
        self.metrics = tuple(getattr(self.dataset, "metrics", ("acc",)))
        if getattr(method, "uses_aux_labels", False):
            # the method's source objective reads the auxiliary labels: they travel as extra columns of y,
            # (n, 1 + K) float, column 0 the main label (docs/auxiliary.md § Methods)
            if not self.sources or self.sources[0]["aux"] is None:
                raise ValueError(f"method {method.display_label!r} trains on auxiliary labels, but dataset "
                                 f"{c['dataset']!r} has none (use a dataset with auxiliary tasks, e.g. SUPPORT2 or "
                                 "DigitConditions)")
            for s in self.sources:
                s["y_aux"] = torch.cat([s["y"].unsqueeze(1).to(s["aux"].dtype), s["aux"]], 1)
        custom = type(method).local_loss is not Method.local_loss
        self._loss = (lambda client: (lambda module, x, y: method.local_loss(module, x, y, client))) if custom else None
        self._batched_sources = self._plan_batching(custom)
        self.refresh_input_noise(0)
        method.setup(self)

    def refresh_input_noise(self, r: int) -> None:
        """Draw the target's input noise for round ``r`` (a dataset's ``input_noise``, e.g. NoisyFeatures with
        ``noise_draw="per_round"``): the target's images x_lab, x_train (and its view x_unlab) and x_test become
        clean + N(0, std²) noise drawn anew from the stream (seed, noise, r), in place, so every consumer (the
        training, the evaluation, a method's own use) sees this round's draw, as the FedGP paper's scripts draw new
        noise at every load of an image (``docs/reproduction.md`` row 14; with one target epoch per round the two
        are the same in distribution). No-op without input noise."""
        std = self.target.get("noise_std", 0.0)
        if not std:
            return
        for k, (name, clean) in enumerate(self.target["clean"].items()):
            g = generator(self.config["seed"], _STREAM_INPUT_NOISE, r, k)
            noise = torch.randn(clean.shape, generator=g, dtype=clean.dtype).to(clean.device)
            torch.add(clean, noise, alpha=std, out=self.target[name])

    def _plan_batching(self, custom_loss: bool) -> dict[str, Any] | None:
        """The stacked source data and optimiser when the round's sources train as one batched computation
        (``client_batching``; experiments/batched_clients.py), else None."""
        mode = self.config["client_batching"]
        if mode == "loop" or (mode == "auto" and self.device.type != "cuda"):
            return None
        blockers = batching_blockers(self.model, self.sources, custom_loss=custom_loss,
                                     aux_labels=getattr(self.method, "uses_aux_labels", False),
                                     batch_size=self.config["source_batch_size"])
        if blockers:
            if mode != "auto":
                raise ValueError(f"client_batching={mode!r} cannot batch this run's source clients: " + "; ".join(blockers)
                                 + " (use 'auto' or 'loop')")
            return None
        fm = self.model
        kind, dtype = self.config["optimizer"], fm.flat.dtype
        plan = {"x": stack_clients([s["x"] for s in self.sources]), "y": stack_clients([s["y"] for s in self.sources]),
                "sizes": [s["x"].shape[0] for s in self.sources], "losses": batched_losses(fm, compile=mode == "compile"),
                "optimizer": FlatAdam(len(self.sources) * fm.m, self.device, dtype, kind=kind)}
        if mode in BATCHED_TARGET_MODES:  # the target client's steps through the same (compiled) objective, N = 1
            plan["target_optimizer"] = FlatAdam(fm.m, self.device, dtype, kind=kind)
            plan["target_out"] = torch.empty(1, fm.m, device=self.device, dtype=dtype)
        return plan

    def _train_target_batched(self, x: Tensor, y: Tensor, *, epochs: int, batch_size: int, lr: float,
                              key: tuple[int, ...], who: str) -> int:
        """The round's target client trained as a batch of one client through the sources' batched objective
        (``client_batching`` in :data:`BATCHED_TARGET_MODES`: on a GPU its steps replay CUDA graphs instead of
        launching every kernel): from the global model and its BatchNorm statistics, on the same mini-batch stream
        as :meth:`_train` (``key``), the same objective and optimiser; the result is left in the shared model as
        :meth:`_train` leaves it (parameters and buffers). Returns the number of optimiser steps."""
        fm, b = self.model, self._batched_sources
        buffers = {k: v.unsqueeze(0).clone() for k, v in self.buffers.items()}
        steps = train_sources_batched(
            fm, b["target_optimizer"], self.theta, x.unsqueeze(0), y.unsqueeze(0), epochs=epochs, batch_size=batch_size,
            lr=lr, generators=[generator(self.config["seed"], _STREAM_CLIENT, *key)], names=[who], out=b["target_out"],
            buffers=buffers, losses=b["losses"])
        fm.flat.copy_(b["target_out"][0])
        fm.load_buffers({k: v[0] for k, v in buffers.items()})
        return steps

    # -- what clients do -------------------------------------------------------------------------
    def _train(self, x: Tensor, y: Tensor, *, epochs: int, batch_size: int, lr: float, key: tuple[int, ...],
               who: str, client: ClientInfo, parts: Tensor | None = None, reset_optimizer: bool = True,
               start: Tensor | None = None, start_buffers: Mapping[str, Tensor] | None = None,
               loss_fn: Callable[..., Tensor] | None = None, after_step: Callable[[], None] | None = None,
               before_step: Callable[[], None] | None = None) -> int:
        """Train from the global model (or from ``start`` / ``start_buffers``); ``key`` = (round, role,
        index) names the client's mini-batch stream."""
        fm = self.model
        fm.flat.copy_(self.theta if start is None else start)
        fm.load_buffers(self.buffers if start_buffers is None else start_buffers)
        if reset_optimizer:
            self.optimizer.reset()
        if loss_fn is None and self._loss:
            loss_fn = self._loss(client)
        return local_train(fm, self.optimizer, x, y, epochs=epochs, batch_size=batch_size, lr=lr,
                           gen=generator(self.config["seed"], _STREAM_CLIENT, *key), parts=parts, who=who,
                           loss_fn=loss_fn, after_step=after_step, before_step=before_step)

    #: roles of :meth:`train_local`'s mini-batch streams: a source, the target on its labelled samples (the
    #: same stream as the engine's target client of that round), the target on its train split
    ROLE_SOURCE, ROLE_TARGET, ROLE_TARGET_TRAIN = _SOURCE, _TARGET, _TARGET_TRAIN

    def train_local(self, x: Tensor, y: Tensor, *, start: Tensor, start_buffers: Mapping[str, Tensor] | None = None,
                    epochs: int, lr: float, batch_size: int, key: tuple[int, ...], client: ClientInfo,
                    who: str = "client", loss_fn: Callable[..., Tensor] | None = None,
                    after_step: Callable[[], None] | None = None,
                    before_step: Callable[[], None] | None = None) -> tuple[Tensor, dict[str, Tensor], int]:
        """Train a client on (x, y) from the parameters ``start`` (m,) and BatchNorm statistics ``start_buffers``
        (None: the global ones) with a fresh optimiser, without touching the global model: returns (its
        parameters (m,) — a new tensor —, its BatchNorm statistics, its optimiser steps). ``key`` = (round,
        role, index, ...) names the mini-batch stream (:data:`ROLE_SOURCE`, :data:`ROLE_TARGET`, ... for the
        role; a method's own streams use roles >= 10); ``loss_fn(module, x, y)`` defaults to the method's
        :meth:`~fda_core.experiments.methods.Method.local_loss` for ``client``; ``after_step()`` runs after
        every optimiser step and ``before_step()`` between the backward pass and the step
        (:func:`fda_core.experiments.flat.local_train`)."""
        steps = self._train(x, y, epochs=epochs, batch_size=batch_size, lr=lr, key=key, who=who, client=client,
                            start=start, start_buffers=start_buffers, loss_fn=loss_fn, after_step=after_step,
                            before_step=before_step)
        return self.model.flat.detach().clone(), self.model.buffers(), steps

    def score(self, module: Any = None, *, params: Tensor | None = None,
              buffers: Mapping[str, Tensor] | None = None) -> dict[str, float]:
        """``{"target_acc": …}`` (and ``target_auc`` where the dataset lists it) on the target's test split of
        ``module`` (logits (n, C)), or of the shared model with ``params`` (m,) and ``buffers`` (None: the
        global model's θ and BatchNorm statistics)."""
        if module is None:
            fm = self.model
            fm.flat.copy_(self.theta if params is None else params)
            fm.load_buffers(self.buffers if buffers is None else buffers)
            if self.metrics == ("acc",):
                return {"target_acc": accuracy(fm, self.target["x_test"], self.target["y_test"])}
            module = fm.module
        from .metrics import evaluate_metrics

        with torch.no_grad():
            return evaluate_metrics(module, self.target["x_test"], self.target["y_test"], self.metrics)

    def train_target(self, *, epochs: int, lr: float, step: int, reset_optimizer: bool = True,
                     who: str = "target client", before_step: Callable[[], None] | None = None) -> int:
        """Train the target from the global model on its labelled samples and make the result the global
        model (parameters and BatchNorm statistics); ``step`` names the random stream (the after-training
        steps continue the round numbers); ``before_step()`` runs between every backward pass and optimiser step
        (:func:`fda_core.experiments.flat.local_train`). Returns the number of optimiser steps."""
        c = self.config
        client = ClientInfo("target", 0, self.target_name, 0)
        steps = self._train(self.target["x_lab"], self.target["y_lab"], epochs=epochs, batch_size=c["target_batch_size"],
                            lr=lr, key=(step, _TARGET, 0), who=who, client=client, reset_optimizer=reset_optimizer,
                            before_step=before_step)
        self.theta.copy_(self.model.flat)
        self.buffers = self.model.buffers()
        return steps

    def evaluate(self, r: int, phase: str, beta: Any = None, *, lr_source: float, lr_target: float) -> None:
        """Record the global model's target test accuracy for round ``r`` (every ``eval_every`` rounds, the
        last round, and every after-training step)."""
        c = self.config
        if r % c["eval_every"] and r != c["rounds"] and phase != "finetune":
            return
        scores = self.method.target_scores(self)
        scores = self.score() if scores is None else dict(scores)
        self.history.append({"round": r, "phase": phase, **scores,
                             "beta": beta, "lr_source": lr_source, "lr_target": lr_target})

    # -- one round -------------------------------------------------------------------------------
    def round_info(self, r: int) -> RoundInfo:
        """What a method is told about round ``r``: whether it is a warm-up round, and the learning rates (decayed by
        ``lr_decay`` after the warm-up rounds, when there are any)."""
        c = self.config
        decayed = c["warmup_rounds"] > 0 and r > c["warmup_rounds"]
        return RoundInfo(r, c["rounds"], r <= c["warmup_rounds"], c["source_lr"] * (c["lr_decay"] if decayed else 1.0),
                         c["target_lr"] * (c["lr_decay"] if decayed else 1.0), c)

    def round(self, r: int) -> None:
        """Round ``r``: the method's plan, the clients' training, the method's server step, an evaluation."""
        c, fm, method = self.config, self.model, self.method
        self.refresh_input_noise(r)
        info = self.round_info(r)
        lr_s, lr_t = info.lr_source, info.lr_target
        plan = method.configure_round(info)
        src_steps: list[int] = []
        src_bufs: list[dict[str, Tensor]] = []
        if plan.sources and self._batched_sources is not None:
            b, n_src = self._batched_sources, len(self.sources)
            # every client starts from the global buffers (BatchNorm statistics), as _train loads them
            bufs = {k: v.expand(n_src, *v.shape).clone() for k, v in self.buffers.items()}
            steps = train_sources_batched(
                fm, b["optimizer"], self.theta, b["x"], b["y"], epochs=c["local_epochs"], batch_size=c["source_batch_size"],
                lr=lr_s, generators=[generator(c["seed"], _STREAM_CLIENT, r, _SOURCE, i) for i in range(n_src)],
                names=[f"source client {s['name']!r}, round {r}" for s in self.sources], out=self._source_updates,
                buffers=bufs, sizes=b["sizes"], losses=b["losses"])
            self._source_updates.sub_(self.theta)  # g_i = h_i^(r) − h^(r-1)
            src_steps, src_bufs = [steps] * n_src, [{k: v[i] for k, v in bufs.items()} for i in range(n_src)]
        elif plan.sources:
            for i, s in enumerate(self.sources):
                src_steps.append(self._train(s["x"], s.get("y_aux", s["y"]), epochs=c["local_epochs"],
                                             batch_size=c["source_batch_size"],
                                             lr=lr_s, key=(r, _SOURCE, i), who=f"source client {s['name']!r}, round {r}",
                                             client=ClientInfo("source", i, s["name"], r)))
                torch.sub(fm.flat, self.theta, out=self._source_updates[i])  # g_i = h_i^(r) − h^(r-1)
                src_bufs.append(fm.buffers())
        tt = plan.target
        steps_t, parts, t_bufs, lr_t_used = 0, None, {}, lr_t
        if tt is not None:
            x, y = (self.target["x_lab"], self.target["y_lab"]) if tt.data == "labeled" else \
                (self.target["x_train"], self.target["y_train"])
            batch = tt.batch_size or c["target_batch_size"]
            epochs = tt.epochs or c["target_local_epochs"]
            lr_t_used = lr_t if tt.lr is None else tt.lr
            if tt.parts:
                n_parts = count_steps(x.shape[0], batch, epochs)
                if self._parts is None or self._parts.shape[0] != n_parts:
                    self._parts = torch.empty(n_parts, fm.m, device=self.device, dtype=fm.flat.dtype)
                parts = self._parts
            key_t = (r, _TARGET, 0) if tt.data == "labeled" else (r, _TARGET_TRAIN, 0)
            who = f"target client, round {r}" if tt.data == "labeled" else "oracle"
            if parts is None and self._batched_sources is not None and "target_out" in self._batched_sources:
                steps_t = self._train_target_batched(x, y, epochs=epochs, batch_size=batch, lr=lr_t_used, key=key_t,
                                                     who=who)
            else:
                steps_t = self._train(x, y, epochs=epochs, batch_size=batch, lr=lr_t_used, key=key_t, who=who,
                                      client=ClientInfo("target", 0, self.target_name, r), parts=parts)
            torch.sub(fm.flat, self.theta, out=self._target_update)  # g_T = h_T^(r) − h^(r-1)
            t_bufs = fm.buffers()
        align_src: list[float] | None = None
        align_t: float | None = None
        if c["alignment_steps"] == "fractional":
            # FedGP paper App. B.2 Eq. B.2 (and its code): n/bs per epoch, not the ⌈n/bs⌉ steps taken
            align_src = [s["x"].shape[0] / c["source_batch_size"] * c["local_epochs"] for s in self.sources]
            if tt is not None:
                align_t = x.shape[0] / batch * epochs
        res = RoundResults(
            source_updates=self._source_updates if plan.sources else None, source_steps=src_steps,
            weights=self.weights, weight_list=self.weight_list, source_buffers=src_bufs,
            target_update=self._target_update if tt is not None else None,
            target_params=fm.flat if tt is not None else None, target_parts=parts, target_steps=steps_t,
            target_buffers=t_bufs, lr_source=lr_s, lr_target=lr_t, scratch=self._scratch,
            as_dict=fm.as_dict, as_dicts=fm.as_dicts,
            source_alignment_steps=align_src if plan.sources else None, target_alignment_steps=align_t)
        out = method.aggregate(info, res, self.theta)
        if out.buffers is not None:
            self.buffers = out.buffers
        method.after_round(info, self)
        self.evaluate(r, plan.phase, out.beta, lr_source=lr_s if plan.lr_source is None else plan.lr_source,
                      lr_target=lr_t_used)

    def result(self, seconds: float) -> dict[str, Any]:
        accs = [h["target_acc"] for h in self.history]
        extra = {}
        if "target_auc" in self.history[-1]:
            aucs = [h["target_auc"] for h in self.history]
            extra = {"final_target_auc": aucs[-1], "last5_target_auc": sum(aucs[-5:]) / len(aucs[-5:])}
        return {
            "final_target_acc": accs[-1],
            "last5_target_acc": sum(accs[-5:]) / len(accs[-5:]),
            **extra,
            "history": self.history,
            "method": self.method.display_label,
            "target": self.target_name,
            "sources": [{"name": s["name"], "n": int(s["x"].shape[0])} for s in self.sources],
            "n_target_labeled": int(self.target["x_lab"].shape[0]),
            "n_target_test": int(self.target["x_test"].shape[0]),
            "n_parameters": int(self.model.m),
            "seconds": seconds,
            "device": str(self.device),
            "config": self.config,
        }


def run_experiment(*, _dataset: Any = None, progress: bool = False, **config: Any) -> dict[str, Any]:
    """Run one FDA experiment (FedGP paper Algorithm 1) with any registered method and return its metrics.

    Config keys and defaults: :data:`DEFAULT_CONFIG` (ValueError for unknown keys or bad values); the
    method is ``rule`` (a registered name or spec, see :func:`fda_core.experiments.methods.list_methods`)
    with ``method_options`` (or the top-level :data:`CONFIG_ALIASES` ``beta``, ``projection``,
    ``finetune_epochs``). Deterministic for a seed on CPU.

    Returns a JSON-serialisable dict: ``final_target_acc`` (0–1, after the last round),
    ``last5_target_acc`` (mean over the last 5 evaluated rounds, as the auto-weighted paper reports),
    ``history`` (one entry per evaluated round: round, phase ('warmup'/'fedavg'/'fda'/'oracle'/'finetune'),
    target_acc, beta (β per source used that round, None for rules without β), lr_source, lr_target; and
    target_auc when the dataset's ``metrics`` list ``"auc"``, with ``final_target_auc`` and ``last5_target_auc``
    beside the accuracies),
    ``method`` (display label), ``sources`` (env names, sizes), ``target`` (env name),
    ``n_target_labeled``, ``n_target_test``, ``n_parameters``, ``seconds``, ``device``, ``config`` (the
    resolved config) and ``shared_rounds`` (how many of the first rounds were taken from another run of the sweep,
    the same bits: :mod:`fda_core.experiments.shared_rounds`; 0 outside :func:`run_many`).
    """
    c = make_config(**config)
    method = get_method(c["rule"], **c["method_options"])
    start = time.perf_counter()
    torch.manual_seed(c["seed"])  # anything inside torch that uses the global stream (e.g. dropout)
    run = Run(c, method, _dataset)
    shared = shared_rounds.resume(run, _dataset)  # rounds another run of this sweep computed alike (0: none)
    rounds: Iterable[int] = range(shared + 1, c["rounds"] + 1)
    if progress:
        from tqdm.auto import tqdm

        rounds = tqdm(rounds, desc=f"{method.display_label} on {run.target_name}", leave=False)
    for r in rounds:
        run.round(r)
        shared_rounds.offer(run, r, _dataset)
    method.after_training(run)
    return {**run.result(time.perf_counter() - start), "shared_rounds": shared}


# ---------------------------------------------------------------------------------------------
# Many runs through the result store
# ---------------------------------------------------------------------------------------------
#: fields of a result that say how it was computed, not what it computed: equal runs differ in them (the wall-clock
#: seconds; the first rounds taken from another run of the sweep, :mod:`fda_core.experiments.shared_rounds`)
EXECUTION_FIELDS = ("seconds", "shared_rounds")


def computed_content(results: Sequence[Mapping[str, Any]]) -> str:
    """The results as canonical JSON text without their :data:`EXECUTION_FIELDS`: equal for runs that computed the
    same numbers however they were computed (side by side, with shared rounds, another time)."""
    return json.dumps([{k: v for k, v in r.items() if k not in EXECUTION_FIELDS} for r in results], sort_keys=True,
                      default=str)


def store_key(c: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that identifies a run in the store (everything but the execution choices
    'device' and 'client_batching', which change float rounding only)."""
    return {k: v for k, v in c.items() if k not in EXECUTION_KEYS}


def code_revision_of(rule: str) -> str:
    """The code revision of a run of method ``rule``: the round loop's import closure (methods, rules,
    estimators, datasets, models; :func:`fda_core.common.provenance.code_revision`), plus the source of
    the method's class when it is defined outside the package (a notebook cell)."""
    from ..common.provenance import code_revision, object_revision
    from .methods import method_class

    base = code_revision(__name__)
    own = object_revision(method_class(rule))
    return f"{base}+{own}" if own else base


def run_many(configs: Iterable[Mapping[str, Any]], *, store: Any = None, experiment: str = "federated",
             progress: bool = True, labels: Sequence[Mapping[str, Any]] | None = None,
             on_result: Callable[[dict[str, Any]], None] | None = None, workers: int = 1,
             share_rounds: bool = True) -> list[dict[str, Any]]:
    """Run every config (skipping those already in ``store``, a :class:`fda_core.common.store.ResultStore`
    or a folder), saving each finished run atomically, so an interrupted sweep resumes where it stopped.
    A stored run is reused only when the code it ran is unchanged (:func:`code_revision_of`), whichever experiment
    stored it (a run is its config and its code: it is copied into ``experiment``'s folder); ``store``'s
    ``summary()`` says how many runs were reused, from which revision, and how many were computed.

    ``labels`` (one mapping per config, e.g. {"method": "FedGP"}) are attached to each returned result
    under ``"labels"``. ``on_result(result)`` is called for each, in the configs' order. Returns the results in
    order.

    ``workers`` (≥ 1): the runs to compute are computed that many at a time, each in its own spawned process
    (:mod:`fda_core.experiments.worker_pool`: on a GPU launch-bound runs share the device; on a CPU each worker
    gets ``threads // workers`` torch threads); results are saved as they finish and returned in order. On a CPU they
    are the same bits whatever ``workers`` at equal thread counts; on a GPU, whose convolution kernels are not
    deterministic by default, they agree to the device's run-to-run noise (``benchmarks/parallel_runs.py`` prints
    both; docs/architecture.md § Runs side by side). Configs that repeat a run of the list
    (same store key) are computed once when there is a store, and read back from it, as one after another.

    ``share_rounds`` (default True): runs computed in this process whose configs differ only in the method compute
    their common FedAvg rounds once (Source only's rounds, Finetune_Offline's, every FDA method's warm-up;
    :mod:`fda_core.experiments.shared_rounds`) — the same bits, in less time; False computes every round of every run.
    """
    from ..common.store import ResultStore
    from .worker_pool import StoredRun, check_workers, compute_and_store, look_up

    workers = check_workers(workers)
    if not isinstance(share_rounds, bool):
        raise ValueError(f"share_rounds must be True or False, got {share_rounds!r}")
    configs = [dict(cfg) for cfg in configs]
    labels = list(labels) if labels is not None else [{} for _ in configs]
    if len(labels) != len(configs):
        raise ValueError(f"labels must have one entry per config ({len(configs)}), got {len(labels)}")
    resolved = [make_config(**cfg) for cfg in configs]  # validate everything before the first run
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    revisions = ({rule: code_revision_of(rule) for rule in dict.fromkeys(c["rule"] for c in resolved)}
                 if store is not None else {})
    runs = [StoredRun(key=store_key(c), item=c, revision=revisions.get(c["rule"]),
                      label=f"run {i + 1} of {len(resolved)} of {experiment!r} (rule {c['rule']!r}, dataset "
                            f"{c['dataset']!r}, target {c['target']!r}, seed {c['seed']})")
            for i, c in enumerate(resolved)]
    # stored runs are reused, those another experiment stored too (a run is its config and its code, whichever
    # sweep asked for it); a config repeating one to compute is computed once and read back from the store
    found, to_compute, repeats = look_up(store, experiment, runs, any_experiment=True)
    check_configs_fit_data([resolved[i] for i in to_compute], [runs[i].label for i in to_compute])
    results: list[dict[str, Any] | None] = [found.get(i) for i in range(len(runs))]
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(resolved), desc=experiment, initial=len(found))
    out: list[dict[str, Any]] = []

    def emit_ready() -> None:  # the finished prefix, in order
        while len(out) < len(results) and results[len(out)] is not None:
            res = {**results[len(out)], "labels": dict(labels[len(out)])}
            out.append(res)
            if on_result:
                on_result(res)

    def finished(i: int, res: dict[str, Any]) -> None:  # saved, and as a later load returns it
        results[i] = res
        if bar is not None:
            bar.update(1)
        emit_ready()

    emit_ready()
    with shared_rounds.sharing(share_rounds):
        compute_and_store(runs, to_compute, workers, store=store, experiment=experiment, on_result=finished,
                          repeats=repeats)
    if bar is not None:
        bar.close()
    return out
