"""The federated domain adaptation (FDA) training loop of the papers, and its baselines.

FedGP paper Algorithm 1 (App. B.1): every round r, each source client starts from the global model
h^(r-1), trains locally and sends its update g_i = h_i^(r) − h^(r-1); the target client starts from
h^(r-1), trains on its few labelled samples (update g_T) and sets h^(r) = h^(r-1) + Aggr({g_i}, g_T, β).
β weights the SOURCE part (library convention; the papers' App. B.2 writes β on the target side).

Implementation (one idea: no model copies). A single ``nn.Module`` serves every client: its trainable
parameters are views into one flat vector ``w`` (m,), and their ``.grad`` views into one flat gradient.
Loading the global model into a client is one ``w.copy_(θ)``; a client's update is written straight into
row i of a preallocated (N, m) buffer; Adam runs as a handful of fused vector operations on ``w``.
BatchNorm running statistics are buffers, never parameters: they are not in ``w``, so they never enter
the projection or the estimators (the global model takes the target client's buffers after an FDA round,
the sample-weighted source average after a FedAvg round).

Magnitude alignment (FedGP paper App. B.2 Eq. B.2; auto-weighted paper App. C.3): a source update made
with lr_S over its own number of steps is rescaled to the target's round, a_i = (lr_T/lr_S) ·
steps_T / steps_i (:func:`fda_core.core.aggregation.magnitude_alignment`), before any rule combines it with g_T.
Auto-β (auto-weighted paper § 4.2 and App. C.3): every round, from the target's B per-batch updates
(the parts) and each source's average per-batch update (g_i / steps_i, aligned by lr_T/lr_S).

Baselines: Source only (FedAvg), Target only (β = 0 after the shared warm-up), Finetune_Offline (FedAvg,
then fine-tuning on the labelled target), Oracle (supervised training on the whole labelled target train
split), FedGP_1 (FedGP with β = 1). Warm-up: the first ``warmup_rounds`` rounds are FedAvg for every
federated method, then both learning rates are multiplied by ``lr_decay`` (reference code of the
auto-weighted paper, ``docs/experiments.md`` § Warm-up and learning rates: 2 warm-up rounds, × 0.1).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import is_int as _is_int
from ..common.checks import is_number as _is_num
from ..common.devices import resolve_device
from ..core import aggregation
from ..core.estimators import auto_beta

__all__ = ["FlatModel", "FlatAdam", "DEFAULT_CONFIG", "METHODS", "BASELINES", "make_config",
           "method_config", "sweep_configs", "run_experiment", "run_many", "results_table", "summary_table", "beta_table"]

#: Default configuration of :func:`run_experiment` (keys are the allowed config keys).
DEFAULT_CONFIG: dict[str, Any] = {
    "dataset": "ColoredMNIST",      # registered name (fda_core.data.datasets.list_datasets())
    "dataset_options": {},          # passed to get_dataset, e.g. {"noise_std": 0.4}
    "target": None,                 # env name or index; None -> the dataset's default_target (else 0)
    "rule": "fedgp",                # registered rule, or 'finetune_offline' / 'oracle'
    "beta": 0.5,                    # β on the SOURCE part (fixed-β rules)
    "projection": "exact",          # FedGP: 'exact' (whole vector), 'exact_layerwise', 'cosine' (papers)
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
    "finetune_epochs": None,        # Finetune_Offline: epochs of fine-tuning (None -> rounds)
    "model": "small_cnn",
    "model_options": {},
    "seed": 0,
    "device": "auto",
    "eval_every": 1,
}

#: Methods of the papers' tables -> the config that runs them (β on the source part).
METHODS: dict[str, dict[str, Any]] = {
    "Source only": {"rule": "source_only"},
    "Finetune_Offline": {"rule": "finetune_offline"},
    "FedDA": {"rule": "fedda", "beta": 0.5},
    "FedGP": {"rule": "fedgp", "beta": 0.5},
    "FedGP_1": {"rule": "fedgp", "beta": 1.0},
    "FedDA_Auto": {"rule": "fedda_auto"},
    "FedGP_Auto": {"rule": "fedgp_auto"},
    "Target only": {"rule": "target_only"},
    "Oracle": {"rule": "oracle"},
}

#: Rules that are training procedures rather than aggregation rules.
BASELINES = ("finetune_offline", "oracle")
_PROJECTIONS = ("exact", "exact_layerwise", "cosine")


# ---------------------------------------------------------------------------------------------
# One module, flat parameters, fused Adam
# ---------------------------------------------------------------------------------------------
class FlatModel:
    """Wrap ``module`` so that its trainable parameters are views into one flat vector.

    Attributes:
        module: the wrapped module (its parameters now alias ``flat``).
        flat: (m,) the parameters; ``grad``: (m,) their gradients (autograd accumulates into the views).
        layout: list of (name, offset, numel, shape) of each trainable parameter, in order.
    """

    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        device = torch.device(device)
        self.module = module.to(device)
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("module has no trainable parameters")
        m = sum(p.numel() for _, p in params)
        dtype = params[0][1].dtype
        self.flat = torch.empty(m, device=device, dtype=dtype)
        self.grad = torch.zeros(m, device=device, dtype=dtype)
        self.layout: list[tuple[str, int, int, torch.Size]] = []
        off = 0
        for name, p in params:
            k = p.numel()
            self.flat[off:off + k].copy_(p.detach().reshape(-1))
            p.data = self.flat[off:off + k].view_as(p)
            p.grad = self.grad[off:off + k].view_as(p)
            self.layout.append((name, off, k, p.shape))
            off += k
        self.buffer_names = [n for n, b in module.named_buffers() if b.is_floating_point()]

    @property
    def m(self) -> int:
        return self.flat.numel()

    def buffers(self) -> dict[str, Tensor]:
        """A copy of the floating-point buffers (BatchNorm running statistics)."""
        return {n: b.detach().clone() for n, b in self.module.named_buffers() if n in self.buffer_names}

    def load_buffers(self, state: Mapping[str, Tensor]) -> None:
        if not state:
            return
        for n, b in self.module.named_buffers():
            if n in state:
                b.copy_(state[n])

    def as_dicts(self, rows: Tensor) -> list[dict[str, Tensor]]:
        """Per-tensor views {name: tensor of the parameter's shape} of each row of ``rows`` (N, m)."""
        return [self.as_dict(r) for r in rows]

    def as_dict(self, vec: Tensor) -> dict[str, Tensor]:
        """Per-tensor views of one flat vector (m,) (no copy)."""
        return {n: vec[o:o + k].view(s) for n, o, k, s in self.layout}


class FlatAdam:
    """Adam on a flat parameter vector: the update of ``torch.optim.Adam`` (no weight decay, no amsgrad;
    Kingma & Ba 2015, Alg. 1 with torch's ε placement), as fused vector operations. ``optimizer='sgd'``
    gives plain SGD (with optional momentum) through the same interface."""

    def __init__(self, m: int, device: torch.device, dtype: torch.dtype = torch.float32, kind: str = "adam",
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, momentum: float = 0.0):
        if kind not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {kind!r}")
        self.kind, self.betas, self.eps, self.momentum = kind, betas, eps, momentum
        self.m1 = torch.zeros(m, device=device, dtype=dtype)
        self.m2 = torch.zeros(m, device=device, dtype=dtype) if kind == "adam" else None
        self._tmp = torch.empty(m, device=device, dtype=dtype)
        self.t = 0

    def reset(self) -> None:
        """Fresh optimiser state (NIID-Bench's ``train_net`` creates its optimiser at every local training)."""
        self.m1.zero_()
        if self.m2 is not None:
            self.m2.zero_()
        self.t = 0

    def step(self, w: Tensor, g: Tensor, lr: float) -> None:
        self.t += 1
        if self.kind == "sgd":
            if self.momentum:
                self.m1.mul_(self.momentum).add_(g) if self.t > 1 else self.m1.copy_(g)
                w.add_(self.m1, alpha=-lr)
            else:
                w.add_(g, alpha=-lr)
            return
        b1, b2 = self.betas
        self.m1.lerp_(g, 1 - b1)
        self.m2.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        torch.sqrt(self.m2, out=self._tmp).div_(math.sqrt(bc2)).add_(self.eps)
        w.addcdiv_(self.m1, self._tmp, value=-lr / bc1)


# ---------------------------------------------------------------------------------------------
# Configuration
# ---------------------------------------------------------------------------------------------
def _check(cond: bool, name: str, allowed: str, value: Any) -> None:
    if not cond:
        raise ValueError(f"{name} must be {allowed}, got {value!r}")


def make_config(**config: Any) -> dict[str, Any]:
    """The full, validated config: defaults filled in, derived values (target_lr, finetune_epochs,
    target_local_epochs) resolved. Raises ValueError naming the key and its allowed range."""
    unknown = sorted(set(config) - set(DEFAULT_CONFIG))
    if unknown:
        raise ValueError(f"unknown config key(s) {unknown}; allowed keys: {sorted(DEFAULT_CONFIG)}")
    c = {**DEFAULT_CONFIG, **config}
    c["dataset_options"] = dict(c["dataset_options"] or {})
    c["model_options"] = dict(c["model_options"] or {})
    rule = c["rule"]
    _check(isinstance(rule, str) and (rule in aggregation.RULES or rule in BASELINES), "rule",
           f"one of {sorted(aggregation.RULES) + list(BASELINES)}", rule)
    _check(_is_num(c["beta"]) and 0.0 <= c["beta"] <= 1.0, "beta", "a number in [0, 1]", c["beta"])
    _check(c["projection"] in _PROJECTIONS, "projection", f"one of {list(_PROJECTIONS)}", c["projection"])
    for key in ("rounds", "local_epochs", "source_batch_size", "target_batch_size", "eval_every"):
        _check(_is_int(c[key]) and c[key] >= 1, key, "an integer >= 1", c[key])
    for key in ("warmup_rounds", "seed"):
        _check(_is_int(c[key]) and c[key] >= 0, key, "an integer >= 0", c[key])
    for key in ("source_lr", "lr_decay"):
        _check(_is_num(c[key]) and c[key] > 0, key, "a positive finite number", c[key])
    _check(c["optimizer"] in ("adam", "sgd"), "optimizer", "'adam' or 'sgd'", c["optimizer"])
    if c["target_lr"] is None:
        c["target_lr"] = c["source_lr"] / 5  # auto-weighted paper App. C.2: target lr = 1/5 of source lr
    _check(_is_num(c["target_lr"]) and c["target_lr"] > 0, "target_lr", "a positive finite number or None", c["target_lr"])
    if c["target_local_epochs"] is None:
        c["target_local_epochs"] = c["local_epochs"]
    _check(_is_int(c["target_local_epochs"]) and c["target_local_epochs"] >= 1, "target_local_epochs",
           "an integer >= 1 or None", c["target_local_epochs"])
    if c["finetune_epochs"] is None:
        c["finetune_epochs"] = c["rounds"]
    _check(_is_int(c["finetune_epochs"]) and c["finetune_epochs"] >= 0, "finetune_epochs", "an integer >= 0 or None",
           c["finetune_epochs"])
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


def method_config(method: str, **overrides: Any) -> dict[str, Any]:
    """The config of a table method (see :data:`METHODS`), e.g. ``method_config("FedGP_Auto", rounds=5)``."""
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r}; method must be one of {list(METHODS)}")
    return {**overrides, **METHODS[method]}


def sweep_configs(base: Mapping[str, Any], methods: Sequence[str], *, targets: Sequence[Any] = (None,),
                  seeds: Sequence[int] = (0,), variants: Sequence[Mapping[str, Any]] = ({},)
                  ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Configs and labels of a grid: every variant (config overrides, e.g. {"dataset_options":
    {"noise_std": 0.4}}) × target × method (:data:`METHODS`) × seed (trial). Labels hold the method, the
    seed and the variant's scalar settings (dataset options flattened) for the tables."""
    configs, labels = [], []
    for var in variants:
        flat = {k: v for k, v in var.items() if not isinstance(v, Mapping)}
        for k, v in var.items():
            if isinstance(v, Mapping):
                flat.update(v)
        for target in targets:
            for method in methods:
                for seed in seeds:
                    configs.append({**base, **var, "target": target, "seed": seed, **method_config(method)})
                    labels.append({"method": method, "trial": list(seeds).index(seed), **flat})
    return configs, labels


# ---------------------------------------------------------------------------------------------
# Clients
# ---------------------------------------------------------------------------------------------
def _local_train(fm: FlatModel, opt: FlatAdam, x: Tensor, y: Tensor, *, epochs: int, batch_size: int, lr: float,
                 gen: torch.Generator, parts: Tensor | None = None, who: str = "client") -> int:
    """Train ``fm`` in place on (x, y) for ``epochs`` epochs of shuffled mini-batches (cross-entropy).

    ``parts`` (steps, m), when given, receives the per-batch update w_after − w_before of every step
    (the target's parts for auto-β). Returns the number of steps. Raises FloatingPointError when a loss
    is NaN/inf (names the client)."""
    fm.module.train()
    n = x.shape[0]
    steps = 0
    loss_sum = torch.zeros((), device=x.device)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).to(x.device)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            fm.grad.zero_()
            loss = F.cross_entropy(fm.module(x[idx]), y[idx])
            loss.backward()
            loss_sum += loss.detach()
            if parts is not None:
                parts[steps].copy_(fm.flat)
            opt.step(fm.flat, fm.grad, lr)
            if parts is not None:
                parts[steps].sub_(fm.flat).neg_()  # w_after − w_before
            steps += 1
    if not bool(torch.isfinite(loss_sum)):
        raise FloatingPointError(f"{who}: the training loss became NaN/inf (lower the learning rate)")
    return steps


def _steps(n: int, batch_size: int, epochs: int) -> int:
    return math.ceil(n / batch_size) * epochs


@torch.no_grad()
def _accuracy(fm: FlatModel, x: Tensor, y: Tensor, chunk: int = 2048) -> float:
    fm.module.eval()
    correct = 0
    for s in range(0, x.shape[0], chunk):
        correct += int((fm.module(x[s:s + chunk]).argmax(1) == y[s:s + chunk]).sum())
    return correct / max(x.shape[0], 1)


def _generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU generator seeded from (seed, keys): independent streams per (round, client)."""
    return torch.Generator().manual_seed(hash((seed,) + keys) % (2 ** 63))


def _prepare(c: dict[str, Any], dataset: Any = None):
    from ..data.datasets import get_dataset, labeled_split
    from ..data.models import get_model

    ds = dataset if dataset is not None else get_dataset(c["dataset"], **c["dataset_options"])
    if c["target"] is None:
        t = ds.default_target if getattr(ds, "default_target", None) is not None else 0
    else:
        t = ds.env_index(c["target"])
    device = resolve_device(c["device"])
    xt, yt = ds[t]
    lab, unlab, test = labeled_split(xt.shape[0], n_labeled=c["n_target_labeled"], fraction=c["target_fraction"],
                                     train_fraction=c["train_fraction"], seed=c["seed"])
    target = {
        "x_lab": xt[lab].to(device), "y_lab": yt[lab].to(device),
        "x_train": xt[torch.cat([lab, unlab])].to(device), "y_train": yt[torch.cat([lab, unlab])].to(device),
        "x_test": xt[test].to(device), "y_test": yt[test].to(device),
    }
    sources = []
    g = torch.Generator().manual_seed(c["seed"] + 7919)
    for i in range(len(ds)):
        if i == t:
            continue
        xs, ys = ds[i]
        if c["source_fraction"] < 1:
            keep = torch.randperm(xs.shape[0], generator=g)[: max(1, round(c["source_fraction"] * xs.shape[0]))]
            xs, ys = xs[keep], ys[keep]
        sources.append({"name": ds.ENVIRONMENTS[i], "x": xs.to(device), "y": ys.to(device)})
    module = get_model(c["model"], tuple(ds.input_shape), ds.num_classes, seed=c["seed"], **c["model_options"])
    fm = FlatModel(module, device)
    return ds, t, target, sources, fm, device


# ---------------------------------------------------------------------------------------------
# The experiment
# ---------------------------------------------------------------------------------------------
def run_experiment(*, _dataset: Any = None, progress: bool = False, **config: Any) -> dict[str, Any]:
    """Run one FDA experiment (FedGP paper Algorithm 1) and return its metrics.

    Config keys and defaults: :data:`DEFAULT_CONFIG` (ValueError for unknown keys or bad values). The
    table methods are in :data:`METHODS` (see :func:`method_config`). Deterministic for a seed on CPU.

    Returns a JSON-serialisable dict: ``final_target_acc`` (0–1, after the last round),
    ``last5_target_acc`` (mean over the last 5 evaluated rounds, as the auto-weighted paper reports),
    ``history`` (one entry per evaluated round: round, phase ('warmup'/'fda'/'finetune'), target_acc,
    beta (β per source used that round, None for rules without β), lr_source, lr_target), ``sources``
    (env names, sizes), ``target`` (env name), ``n_target_labeled``, ``n_target_test``,
    ``n_parameters``, ``seconds``, and ``config`` (the resolved config).
    """
    c = make_config(**config)
    start = time.perf_counter()
    torch.manual_seed(c["seed"])  # anything inside torch that uses the global stream (e.g. dropout)
    ds, t, target, sources, fm, device = _prepare(c, _dataset)
    rule, n_src, m = c["rule"], len(sources), fm.m
    if n_src == 0 and rule not in ("target_only", "oracle"):
        raise ValueError(f"rule {rule!r} needs at least one source environment besides the target")
    opt = FlatAdam(m, device, fm.flat.dtype, kind=c["optimizer"])
    n_lab = target["x_lab"].shape[0]
    steps_t = _steps(n_lab, c["target_batch_size"], c["target_local_epochs"])
    is_auto = rule in aggregation.RULES and aggregation.RULES[rule].uses_target_parts
    if is_auto and steps_t < 2:
        raise ValueError(
            f"rule {rule!r} estimates the target variance from per-batch updates and needs >= 2 target batches per "
            f"round, but n_target_labeled={n_lab} with target_batch_size={c['target_batch_size']} gives {steps_t}; "
            f"lower target_batch_size or raise target_local_epochs")
    sizes = torch.tensor([s["x"].shape[0] for s in sources], dtype=fm.flat.dtype, device=device)
    weights = sizes / sizes.sum() if n_src else sizes  # FedAvg sample weights n_i / Σ n_i
    theta = fm.flat.detach().clone()  # global model h^(r)
    gbuf = fm.buffers()
    S = torch.empty(n_src, m, device=device, dtype=fm.flat.dtype) if n_src else None
    gT = torch.empty(m, device=device, dtype=fm.flat.dtype)
    agg = torch.empty(m, device=device, dtype=fm.flat.dtype)
    parts = torch.empty(steps_t, m, device=device, dtype=fm.flat.dtype) if is_auto else None
    history: list[dict[str, Any]] = []

    def evaluate(r: int, phase: str, beta: Any, lr_s: float, lr_t: float) -> None:
        if r % c["eval_every"] and r != c["rounds"] and phase != "finetune":
            return
        fm.flat.copy_(theta)
        fm.load_buffers(gbuf)
        history.append({"round": r, "phase": phase, "target_acc": _accuracy(fm, target["x_test"], target["y_test"]),
                        "beta": beta, "lr_source": lr_s, "lr_target": lr_t})

    def train_client(x, y, *, epochs, batch_size, lr, key, who, parts_buf=None) -> int:
        fm.flat.copy_(theta)
        fm.load_buffers(gbuf)
        opt.reset()
        return _local_train(fm, opt, x, y, epochs=epochs, batch_size=batch_size, lr=lr,
                            gen=_generator(c["seed"], *key), parts=parts_buf, who=who)

    rounds = range(1, c["rounds"] + 1)
    if progress:
        from tqdm.auto import tqdm

        rounds = tqdm(rounds, desc=f"{rule} on {ds.ENVIRONMENTS[t]}", leave=False)
    for r in rounds:
        decayed = c["warmup_rounds"] > 0 and r > c["warmup_rounds"]
        lr_s = c["source_lr"] * (c["lr_decay"] if decayed else 1.0)
        lr_t = c["target_lr"] * (c["lr_decay"] if decayed else 1.0)
        if rule == "oracle":  # supervised training on the whole labelled target train split, no sources
            train_client(target["x_train"], target["y_train"], epochs=c["target_local_epochs"],
                         batch_size=c["source_batch_size"], lr=c["source_lr"], key=(r, -2), who="oracle")
            theta.copy_(fm.flat)
            gbuf = fm.buffers()
            evaluate(r, "oracle", None, c["source_lr"], c["source_lr"])
            continue
        warm = r <= c["warmup_rounds"]
        fedavg = warm or rule in ("source_only", "finetune_offline")
        src_steps: list[int] = []
        src_bufs: list[dict[str, Tensor]] = []
        if fedavg or rule != "target_only":
            for i, s in enumerate(sources):
                src_steps.append(train_client(s["x"], s["y"], epochs=c["local_epochs"], batch_size=c["source_batch_size"],
                                              lr=lr_s, key=(r, i), who=f"source client {s['name']!r}, round {r}"))
                torch.sub(fm.flat, theta, out=S[i])  # g_i = h_i^(r) − h^(r-1)
                src_bufs.append(fm.buffers())
        if fedavg:  # FedAvg (McMahan et al. 2017): sample-weighted mean of the source updates
            theta.addmv_(S.T, weights)
            gbuf = {k: sum(w * b[k] for w, b in zip(weights.tolist(), src_bufs)) for k in gbuf} if gbuf else gbuf
            evaluate(r, "warmup" if warm and rule not in ("source_only", "finetune_offline") else "fedavg", None, lr_s, lr_t)
            continue
        train_client(target["x_lab"], target["y_lab"], epochs=c["target_local_epochs"], batch_size=c["target_batch_size"],
                     lr=lr_t, key=(r, -1), who=f"target client, round {r}", parts_buf=parts)
        torch.sub(fm.flat, theta, out=gT)  # g_T = h_T^(r) − h^(r-1)
        tbuf = fm.buffers()
        beta_used: Any = None
        if rule == "target_only":
            agg.copy_(gT)
        else:
            # FedGP paper App. B.2 Eq. B.2: align each source update to the target's round (lr and steps)
            projection = c["projection"]
            aligned = _align(S, lr_t / lr_s * steps_t / torch.tensor(src_steps, dtype=S.dtype, device=device))
            if is_auto and rule not in ("fedda_auto", "fedgp_auto"):  # a user-registered rule on target parts
                agg.copy_(aggregation.get_rule(rule).apply(aligned, target_part_grads=parts * steps_t, weights=weights))
            else:
                if is_auto:
                    # auto-weighted paper App. C.3: parts = target per-batch updates; sources = average per-batch
                    # update g_i / steps_i aligned by lr_T / lr_S (= aligned / steps_T)
                    base = "fedda" if rule == "fedda_auto" else "fedgp"
                    beta_t = auto_beta(parts, aligned / steps_t, rule=base)
                else:
                    beta_t = torch.full((n_src,), float(c["beta"]), dtype=S.dtype, device=device)
                    base = rule
                    if rule == "fedgp_cosine":
                        base, projection = "fedgp", "cosine"
                beta_used = [float(b) for b in beta_t]
                _aggregate(base, projection, aligned, gT, beta_t, weights, agg, fm)
        theta.add_(agg)
        gbuf = tbuf  # the global model takes the target client's BatchNorm statistics
        evaluate(r, "warmup" if warm else "fda", beta_used, lr_s, lr_t)
    if rule == "finetune_offline" and c["finetune_epochs"] > 0:
        lr_t = c["target_lr"] * (c["lr_decay"] if c["warmup_rounds"] > 0 else 1.0)
        for e in range(1, c["finetune_epochs"] + 1):
            # one optimiser run over all fine-tuning epochs (state kept between epochs)
            fm.flat.copy_(theta)
            fm.load_buffers(gbuf)
            if e == 1:
                opt.reset()
            _local_train(fm, opt, target["x_lab"], target["y_lab"], epochs=1, batch_size=c["target_batch_size"],
                         lr=lr_t, gen=_generator(c["seed"], c["rounds"] + e, -1), who="target fine-tuning")
            theta.copy_(fm.flat)
            gbuf = fm.buffers()
            evaluate(c["rounds"] + e, "finetune", None, 0.0, lr_t)
    accs = [h["target_acc"] for h in history]
    return {
        "final_target_acc": accs[-1],
        "last5_target_acc": sum(accs[-5:]) / len(accs[-5:]),
        "history": history,
        "target": ds.ENVIRONMENTS[t],
        "sources": [{"name": s["name"], "n": int(s["x"].shape[0])} for s in sources],
        "n_target_labeled": int(n_lab),
        "n_target_test": int(target["x_test"].shape[0]),
        "n_parameters": int(m),
        "seconds": time.perf_counter() - start,
        "device": str(device),
        "config": c,
    }


def _align(updates: Tensor, factors: Tensor) -> Tensor:
    """Magnitude alignment in place (FedGP paper App. B.2 Eq. B.2): row i of ``updates`` (N, m) times
    a_i = (lr_T/lr_S)·steps_T/steps_i (``factors``, (N,)); steps_i = ⌈n_i/bs_S⌉·r_S, steps_T = ⌈n_T/bs_T⌉·r_T,
    as :func:`fda_core.core.aggregation.magnitude_alignment` (which counts steps as n/bs)."""
    return updates.mul_(factors[:, None])


def _aggregate(base: str, projection: str, aligned: Tensor, gT: Tensor, beta: Tensor, weights: Tensor, out: Tensor,
               fm: FlatModel) -> None:
    """out ← Aggr(aligned source updates, g_T, β) with the library's rules (β on the source part)."""
    if base == "fedda":
        aggregation.fedda(aligned, gT, beta, weights, out=out)
    elif base == "fedgp" and projection == "exact":
        aggregation.fedgp(aligned, gT, beta, weights, out=out)  # Proj₊ on the whole update vector
    elif base == "fedgp" and projection == "exact_layerwise":
        res = aggregation.fedgp(fm.as_dicts(aligned), fm.as_dict(gT), beta, weights, out=fm.as_dict(out))
        del res
    elif base == "fedgp":  # projection == 'cosine': the papers' per-layer cosine filter (App. B.2 Eq. B.2);
        # the updates are already aligned (a_i G_i), and cos(G_T, a_i G_i) = cos(G_T, G_i), so alignment = 1
        aggregation.fedgp_cosine(fm.as_dicts(aligned), fm.as_dict(gT), beta, weights, out=fm.as_dict(out))
    else:
        rule = aggregation.get_rule(base)
        res = rule.apply(aligned, gT, beta=beta, weights=weights)
        out.copy_(res if isinstance(res, Tensor) else torch.as_tensor(res))


# ---------------------------------------------------------------------------------------------
# Many runs, the result store, tables
# ---------------------------------------------------------------------------------------------
def _store_key(c: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a resolved config that identifies a run in the store (everything but 'device')."""
    return {k: v for k, v in c.items() if k != "device"}


def run_many(configs: Iterable[Mapping[str, Any]], *, store: Any = None, experiment: str = "federated",
             progress: bool = True, labels: Sequence[Mapping[str, Any]] | None = None,
             on_result: Callable[[dict[str, Any]], None] | None = None) -> list[dict[str, Any]]:
    """Run every config (skipping those already in ``store``, a :class:`fda_core.common.store.ResultStore`
    or a folder), saving each finished run atomically, so an interrupted sweep resumes where it stopped.

    ``labels`` (one mapping per config, e.g. {"method": "FedGP"}) are attached to each returned result
    under ``"labels"``. Returns the results in order.
    """
    from ..common.store import ResultStore

    configs = [dict(cfg) for cfg in configs]
    labels = list(labels) if labels is not None else [{} for _ in configs]
    if len(labels) != len(configs):
        raise ValueError(f"labels must have one entry per config ({len(configs)}), got {len(labels)}")
    resolved = [make_config(**cfg) for cfg in configs]  # validate everything before the first run
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    it = list(zip(resolved, labels))
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(it), desc=experiment)
    out = []
    for c, lab in it:
        key = _store_key(c)
        res = store.load(experiment, key) if store is not None else None
        if res is None:
            res = run_experiment(**c)
            if store is not None:
                store.save(experiment, key, res)
        res = {**res, "labels": dict(lab)}
        out.append(res)
        if on_result:
            on_result(res)
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return out


def results_table(results: Sequence[Mapping[str, Any]]) -> Any:
    """One row per run: labels, target, rule, beta, seed, final and last-5 accuracy (in %), seconds."""
    import pandas as pd

    rows = []
    for res in results:
        c = res["config"]
        rows.append({**res.get("labels", {}), "target": res["target"], "rule": c["rule"], "beta": c["beta"],
                     "seed": c["seed"], "rounds": c["rounds"], "model": c["model"],
                     "final_acc": 100 * res["final_target_acc"], "last5_acc": 100 * res["last5_target_acc"],
                     "n_target_labeled": res["n_target_labeled"], "seconds": res["seconds"]})
    return pd.DataFrame(rows)


def summary_table(table: Any, *, by: Sequence[str] = ("method",), across: str = "target", value: str = "final_acc",
                  order: Sequence[str] | None = None) -> Any:
    """Mean ± std over trials: a DataFrame indexed by ``by`` with one column per value of ``across``
    (plus 'Avg', the mean over those columns), cells formatted 'mean (std)'; also returns the numeric
    means. Returns (formatted, means, stds)."""
    import pandas as pd

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
    import pandas as pd

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
