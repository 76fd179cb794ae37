"""Personalised-FL baselines of the auto-weighted FDA paper's Table 1 on the method interface: Ditto, FedRep,
APFL and KNN-per (``docs/baselines.md`` § Personalisation baselines).

Each is one class in the one registry (:mod:`fda_core.experiments.methods`), run by name through
``run_experiment(rule="ditto")`` / ``run_many`` / the notebooks' ``methods`` parameter. They share the FDA
methods' round (warm-up rounds of FedAvg, then the round's learning rates), the target's labelled samples,
its learning rate, batch size and epochs, so a table row compares like with like. What differs is the model
reported on the target: a personal model kept across rounds (:meth:`Method.setup`), scored instead of the
global one (:meth:`Method.target_scores`), trained with :meth:`fda_core.experiments.federated.Run.train_local`.

The global model of every one of them is the FedAvg of the SOURCE clients (sample weights n_i / Σ n_i): in the
papers the target is one more client of the average, but with its few labelled samples its weight
n_T / Σ n is about 0.0005 on ColoredMNIST, and leaving it out keeps the global model exactly the
``source_only`` run (which the tests use: Ditto with λ = ∞ and APFL with α = 0 and KNN-per with weight 0 are
that run on the target).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.checks import check_choice, check_int, check_number
from ..common.seeding import generator
from .flat import classifier_positions, cross_entropy
from .methods import ClientInfo, Method, Option, RoundInfo, RoundPlan, ServerResult, register_method

__all__ = ["Ditto", "FedRep", "APFL", "KNNPer", "head_indices", "KNN_WEIGHT_GRID", "KNN_CAPACITY_GRID",
           "SOURCE_SWEEP_GRID", "source_sweep", "sweep_run_configs", "compute_sweep_runs"]

#: Roles of the methods' own mini-batch streams (``Run.train_local`` keys; the engine's roles are 0-2).
_ROLE_HEAD_SOURCE, _ROLE_HEAD_TARGET = 10, 11
#: Seed stream of KNN-per's capacity subsample of the datastore.
_STREAM_KNN = 21


def _check_optional_epochs(value: Any, name: str) -> int | None:
    return None if value is None else check_int(value, name, 1)


def _target_client(run: Any, r: int) -> ClientInfo:
    return ClientInfo("target", 0, run.target_name, r)


class _PersonalTarget(Method):
    """A FedAvg global model of the sources plus a personal target model ``v`` (with its BatchNorm statistics)
    kept across rounds and reported on the target. During the warm-up rounds the personal model is the global
    one; afterwards :meth:`personalise` trains it every round once the new global model is known."""

    def setup(self, run: Any) -> None:
        self.v = run.theta.clone()
        self.v_buffers = {k: b.clone() for k, b in run.buffers.items()}

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        return RoundPlan("warmup" if rnd.warmup else self.name, sources=True)

    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        if rnd.warmup:  # the personal model follows the global one until the FDA rounds start
            self.v.copy_(run.theta)
            self.v_buffers = {k: b.clone() for k, b in run.buffers.items()}
            return
        self.personalise(rnd, run)

    def personalise(self, rnd: RoundInfo, run: Any) -> None:
        raise NotImplementedError

    def personal_model(self, run: Any) -> tuple[Tensor, dict[str, Tensor]]:
        """The personal model's parameters (m,) and BatchNorm statistics."""
        return self.v, self.v_buffers

    def target_scores(self, run: Any) -> dict[str, float]:
        params, buffers = self.personal_model(run)
        return run.score(params=params, buffers=buffers)

    def _epochs(self, rnd: RoundInfo) -> int:
        return self.epochs or rnd.config["target_local_epochs"]


def _check_lam(value: Any, name: str) -> float:
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value == math.inf:
        return math.inf
    return check_number(value, name, 0.0)


#: Ditto's ways of taking the proximal term λ/2 ‖v − w‖² (``docs/baselines.md`` § Ditto).
DITTO_PROX = ("gradient", "exact")


class Ditto(_PersonalTarget):
    """Ditto (Li, Hu, Beirami & Smith, ICML 2021; ``docs/baselines.md`` § Ditto): the global model w is FedAvg;
    the target keeps a personal model v minimising h_T(v; w) = F_T(v) + λ/2 ‖v − w‖² (paper Eq. 2) on its
    labelled samples, ``epochs`` epochs per round (None: ``target_local_epochs``) at the round's target learning
    rate, starting from its own v of the previous round; v is reported on the target.

    Algorithm 1's personal step is v ← v − η(∇F_T(v) + λ(v − w)), one step on the gradient of h_T (Ditto's
    code, ``flearn/trainers_MTL/ditto.py``: ``eff_grad = grads[1][layer] + self.lam * (self.local_models[idx][layer]
    - self.global_model[layer])``, then an SGD step on it). ``prox="gradient"`` (default) gives the run's
    optimiser that gradient, ∇F_T(v) + λ(v − w), so with Adam (every row of the table) λ weighs the pull
    against the data term as in h_T. ``prox="exact"`` takes the optimiser's step on the data term only and then
    the proximal term's exact step v ← (v + ηλ w)/(1 + ηλ): Algorithm 1 to first order in ηλ under SGD and
    stable for every λ, but under Adam, whose data step has size ≈ η whatever the gradient, the pull is weaker
    by about the gradient's size, so λ ≲ 10 then barely acts. Both reach λ = 0 (target-only training of v)
    exactly; λ = ∞ (allowed) pins v to the global model. w is the global model of the round just aggregated
    (the target receives w^(r) and personalises it; it does not send an update to the average).

    Options: ``lam`` (λ ≥ 0 or ``math.inf``; default 1, Ditto's and FedRep's scripts), ``prox``, ``epochs``."""

    name, label = "ditto", "Ditto"
    options = {"lam": Option(1.0, _check_lam, lambda v: f"λ={v:g}", "proximal weight λ of Eq. 2 (≥ 0, or math.inf)"),
               "prox": Option("gradient", lambda v, n: check_choice(v, n, DITTO_PROX), lambda v: f"{v} prox",
                              "how the optimiser takes λ/2 ‖v − w‖²: 'gradient' (in the gradient it sees, Alg. 1) "
                              "or 'exact' (its exact proximal step after the optimiser's step)"),
               "epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs/round",
                                "personal epochs per round (None: target_local_epochs)")}

    def personalise(self, rnd: RoundInfo, run: Any) -> None:
        if self.lam == math.inf:
            self.v.copy_(run.theta)
            self.v_buffers = {k: b.clone() for k, b in run.buffers.items()}
            return
        lam, c = self.lam, rnd.lr_target * self.lam  # λ, ηλ
        fm, w = run.model, run.theta

        def prox() -> None:  # v ← argmin_u ‖u − v‖²/(2η) + λ/2 ‖u − w‖² = (v + ηλ w)/(1 + ηλ)
            fm.flat.mul_(1.0 / (1.0 + c)).add_(w, alpha=c / (1.0 + c))

        def pull() -> None:  # the gradient of λ/2 ‖v − w‖², added to ∇F_T(v) (Alg. 1)
            fm.grad.add_(fm.flat - w, alpha=lam)

        exact, on = self.prox == "exact", lam > 0
        v, bufs, _ = run.train_local(run.target["x_lab"], run.target["y_lab"], start=self.v, start_buffers=self.v_buffers,
                                     epochs=self._epochs(rnd), lr=rnd.lr_target, batch_size=rnd.config["target_batch_size"],
                                     key=(rnd.round, run.ROLE_TARGET, 0), client=_target_client(run, rnd.round),
                                     who=f"Ditto personal model, round {rnd.round}",
                                     after_step=prox if exact and on else None,
                                     before_step=pull if on and not exact else None)
        self.v, self.v_buffers = v, bufs


class APFL(_PersonalTarget):
    """APFL (Deng, Kamani & Mahdavi, 2020, "Adaptive Personalized Federated Learning"; ``docs/baselines.md`` §
    APFL): the target's personal model is the mixture v̄ = α v + (1 − α) w (paper Eq. 3) of a local model v and
    the global FedAvg model w; every round the target takes ``epochs`` epochs of steps on v of the loss of the
    mixture, ∇_v f(v̄) = α ∇f(v̄) (Algorithm 1), with w fixed at the round's global model; v̄ is reported.

    The steps on v are run on v̄ itself, exactly: the loss α·f at learning rate α·η gives v̄ the change α·Δv of
    the optimiser's step Δv on v (the gradients seen are α∇f(v̄) in both cases, so Adam's moments agree); then
    v = (v̄ − (1 − α) w) / α. α = 0 is the FedAvg model, α = 1 local training of v. The paper's adaptive α
    (its Eq. 5) is not used: the auto-weighted paper reports a fixed α, so α is an option (default 0.5, the
    APFL authors' FedTorch ``--fed_personal_alpha``; notebook 04 chooses it on source data, ``docs/baselines.md`` §
    Hyper-parameters)."""

    name, label = "apfl", "APFL"
    options = {"alpha": Option(0.5, lambda v, n: check_number(v, n, 0.0, 1.0), lambda v: f"α={v:g}",
                               "mixing weight α of the local model in [0, 1] (Eq. 3)"),
               "epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs/round",
                                "local epochs per round (None: target_local_epochs)")}

    def personalise(self, rnd: RoundInfo, run: Any) -> None:
        a = self.alpha
        if a == 0:
            return  # v̄ = w: nothing of v is ever used
        w = run.theta
        start = self.v * a + w * (1 - a) if a < 1 else self.v

        def loss(module, x, y):
            return cross_entropy(module, x, y) * a if a < 1 else cross_entropy(module, x, y)

        vbar, bufs, _ = run.train_local(run.target["x_lab"], run.target["y_lab"], start=start,
                                        start_buffers=self.v_buffers, epochs=self._epochs(rnd), lr=rnd.lr_target * a,
                                        batch_size=rnd.config["target_batch_size"], key=(rnd.round, run.ROLE_TARGET, 0),
                                        client=_target_client(run, rnd.round), who=f"APFL local model, round {rnd.round}",
                                        loss_fn=loss)
        self.v = vbar if a == 1 else (vbar - w * (1 - a)) / a
        self.v_buffers = bufs

    def personal_model(self, run: Any) -> tuple[Tensor, dict[str, Tensor]]:
        a = self.alpha
        if a == 0:
            return run.theta, run.buffers
        return (self.v if a == 1 else self.v * a + run.theta * (1 - a)), self.v_buffers


def head_indices(run: Any) -> Tensor:
    """Positions (in the flat parameter vector) of the model's classifier, the "head" of FedRep (the last
    linear layer: ``module.classifier`` of every model of :mod:`fda_core.data.models`)."""
    return classifier_positions(run.model, "FedRep")


class FedRep(Method):
    """FedRep (Collins, Hassani, Mokhtari & Shakkottai, ICML 2021; ``docs/baselines.md`` § FedRep): the body
    (representation φ) is shared and averaged, each client keeps its own head h_i (the last linear layer).
    Every round each source, from the global body and its own head, trains the head for ``head_epochs`` epochs
    with the body frozen, then the body for ``local_epochs`` epochs with its new head frozen (Algorithm 1); the
    server averages the bodies (sample weights). The target trains its own head on the new global body for
    ``head_epochs`` epochs on its labelled samples (its body update would enter the average with weight
    n_T / Σ n ≈ 0, so it is not sent), and the global body with the target's head is reported.

    Frozen coordinates are restored after every optimiser step, which is exact for Adam and SGD (both act
    coordinate-wise). For a model without BatchNorm or dropout the body's features do not depend on the
    mini-batch, so the head epochs run on features computed once per round (the same mini-batches, the same
    optimiser; equal up to float rounding, about 10× cheaper with the paper's 10 head epochs). During the warm-up rounds every client's head is the global head (FedAvg of the whole
    model). ``head_epochs`` = 0 is FedAvg of the body with every head left at its warm-up value (tested).
    Options: ``head_epochs`` (default 10, the paper's § 5 choice of local head epochs), ``target_lr``
    (None: the round's target learning rate for the target's head)."""

    name, label = "fedrep", "FedRep"
    options = {"head_epochs": Option(10, lambda v, n: check_int(v, n, 0), lambda v: f"{v} head epochs",
                                     "epochs of head training per round, body frozen (≥ 0; paper: 10)")}

    def setup(self, run: Any) -> None:
        self.head = head_indices(run)
        n = len(run.sources)
        self.heads = run.theta[self.head].repeat(max(n, 1), 1)  # (N, h) each source's head
        self.target_head = run.theta[self.head].clone()
        mask = torch.ones(run.model.m, dtype=torch.bool, device=run.model.flat.device)
        mask[self.head] = False
        self.body = mask.nonzero().squeeze(1)
        module = run.model.module
        self._fixed_features = not run.model.buffer_names and not any(
            isinstance(mod, (torch.nn.Dropout, torch.nn.modules.batchnorm._BatchNorm)) for mod in module.modules())

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        return RoundPlan("warmup", sources=True) if rnd.warmup else RoundPlan("fedrep", sources=False)

    def aggregate(self, rnd, res, theta):
        if rnd.warmup:
            return super().aggregate(rnd, res, theta)
        return ServerResult()  # the clients train in after_round (each from its own head)

    def _train_head(self, run: Any, x: Tensor, y: Tensor, start: Tensor, **kw: Any) -> tuple[Tensor, dict, int]:
        """``head_epochs`` epochs of the head with the body frozen (see the class docstring)."""
        flat, module = run.model.flat, run.model.module
        freeze = self._freeze(flat, self.body, start)
        if not self._fixed_features:
            return run.train_local(x, y, start=start, epochs=self.head_epochs, after_step=freeze, **kw)
        flat.copy_(start)
        with torch.no_grad():
            module.train()
            feats = torch.cat([module.features(x[s:s + 4096]) for s in range(0, x.shape[0], 4096)])
        index = torch.arange(x.shape[0], device=x.device)

        def loss(m, idx, yb):  # the classifier on the precomputed features of the mini-batch's samples
            return F.cross_entropy(m.classifier(feats[idx]), yb)

        return run.train_local(index, y, start=start, epochs=self.head_epochs, after_step=freeze, loss_fn=loss, **kw)

    def _freeze(self, flat: Tensor, idx: Tensor, start: Tensor):
        """After each step, restore the coordinates ``idx`` of ``flat`` to their values in ``start``."""
        saved = start[idx].clone()
        return lambda: flat.index_copy_(0, idx, saved)

    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        c, flat, theta = rnd.config, run.model.flat, run.theta
        if rnd.warmup:
            self.heads.copy_(theta[self.head].expand_as(self.heads))
            self.target_head.copy_(theta[self.head])
            return
        body_sum = torch.zeros(self.body.numel(), dtype=theta.dtype, device=theta.device)
        bufs = []
        for i, s in enumerate(run.sources):
            client = ClientInfo("source", i, s["name"], rnd.round)
            start = theta.clone()
            start[self.head] = self.heads[i]
            if self.head_epochs:
                start, b, _ = self._train_head(run, s["x"], s["y"], start, lr=rnd.lr_source,
                                               batch_size=c["source_batch_size"], key=(rnd.round, _ROLE_HEAD_SOURCE, i),
                                               client=client, who=f"FedRep head of {s['name']!r}, round {rnd.round}")
            else:
                b = run.buffers
            # the labels as the engine's source clients get them (with AuxInfo, the auxiliary ones too)
            new, b, _ = run.train_local(s["x"], s.get("y_aux", s["y"]), start=start, start_buffers=b,
                                        epochs=c["local_epochs"],
                                        lr=rnd.lr_source, batch_size=c["source_batch_size"],
                                        key=(rnd.round, run.ROLE_SOURCE, i), client=client,
                                        who=f"FedRep body of {s['name']!r}, round {rnd.round}",
                                        after_step=self._freeze(flat, self.head, start))
            self.heads[i] = new[self.head]
            body_sum.add_(new[self.body] - theta[self.body], alpha=float(run.weights[i]))
            bufs.append(b)
        theta[self.body] += body_sum  # FedAvg of the bodies: φ ← φ + Σ_i w_i (φ_i − φ)
        if bufs and bufs[0]:
            w = run.weights.tolist()
            run.buffers = {k: sum(wi * b[k] for wi, b in zip(w, bufs)) for k in bufs[0]}
        if self.head_epochs:
            start = theta.clone()
            start[self.head] = self.target_head
            new, self.target_buffers, _ = self._train_head(
                run, run.target["x_lab"], run.target["y_lab"], start, lr=rnd.lr_target,
                batch_size=c["target_batch_size"], key=(rnd.round, _ROLE_HEAD_TARGET, 0),
                client=_target_client(run, rnd.round), who=f"FedRep target head, round {rnd.round}")
            self.target_head = new[self.head]

    def target_scores(self, run: Any) -> dict[str, float]:
        params = run.theta.clone()
        params[self.head] = self.target_head
        return run.score(params=params, buffers=getattr(self, "target_buffers", None))


#: KNN-per's grid when ``weight`` is None: interpolation weights λ and datastore capacities (fractions).
KNN_WEIGHT_GRID = tuple(round(0.1 * k, 1) for k in range(11))
KNN_CAPACITY_GRID = (0.25, 0.5, 1.0)


def _check_optional_fraction(value: Any, name: str) -> float | None:
    return None if value is None else check_number(value, name, 0.0, 1.0)


class KNNPer(Method):
    """KNN-per (Marfoq, Neglia, Vidal & Kameni, ICML 2022, "Personalized Federated Learning through Local
    Memorization"; ``docs/baselines.md`` § KNN-per): the global model is FedAvg (``source_only``); on the target,
    its prediction is interpolated with a k-nearest-neighbour model over a datastore of the target's labelled
    samples in the global model's feature space (the input of its last linear layer):
    p(y|x) = λ p_kNN(y|x) + (1 − λ) p_global(y|x) (paper Eq. 7), p_kNN(y|x) ∝ Σ_{j ∈ kNN(x)} exp(−d(x, x_j)/T)
    1[y_j = y] with d the squared Euclidean distance of the features (the paper's FAISS distance).

    ``capacity`` keeps that fraction of the datastore (a seeded subsample, at least one sample). With
    ``weight=None`` (default) every evaluation reports the best accuracy over the grid
    :data:`KNN_WEIGHT_GRID` × :data:`KNN_CAPACITY_GRID` on the target's TEST split, as the auto-weighted paper
    reports it ("the highest accuracy across grids of weights and capacities") — an optimistic, test-selected
    number, said so in the tables; the chosen λ and capacity are recorded (``knn_weight``, ``knn_capacity``).
    Options: ``weight`` (λ in [0, 1] or None), ``capacity`` (used when ``weight`` is given), ``k`` (default 5),
    ``temperature`` T (default None: the features' dimension D, as KNN-per's code,
    ``exp(-distances / (features_dimension * scale))`` with scale 1; or a number > 0)."""

    name, label = "knn_per", "KNN-per"
    options = {
        "weight": Option(None, _check_optional_fraction, lambda v: f"λ={v:g}",
                         "interpolation weight λ of the kNN model in [0, 1] (None: best over the grid, on the test split)"),
        "capacity": Option(1.0, lambda v, n: check_number(v, n, 0.0, 1.0, lo_open=True), lambda v: f"capacity {v:g}",
                           "fraction of the datastore kept, in (0, 1]"),
        "k": Option(5, lambda v, n: check_int(v, n, 1), lambda v: f"k={v}", "number of neighbours ≥ 1"),
        "temperature": Option(None, lambda v, n: None if v is None else check_number(v, n, 0.0, lo_open=True),
                              lambda v: "T=D" if v is None else f"T={v:g}",
                              "temperature T of the distance kernel > 0 (None: the features' dimension, KNN-per's code)"),
    }
    # Not a gradient rule: its training is FedAvg, but its prediction mixes in a kNN memory, which the synthetic
    # phase-diagram trainer (it compares rules by their one-step gradient) cannot represent; None keeps it out.
    gradient_rule = None

    def setup(self, run: Any) -> None:
        n = run.target["x_lab"].shape[0]
        self._order = torch.randperm(n, generator=generator(run.config["seed"], _STREAM_KNN)).to(run.target["x_lab"].device)

    @torch.no_grad()
    def target_scores(self, run: Any) -> dict[str, float]:
        from .metrics import auc_score

        fm = run.model
        fm.flat.copy_(run.theta)
        fm.load_buffers(run.buffers)
        module = fm.module
        module.eval()
        x_test, y_test = run.target["x_test"], run.target["y_test"]
        feats, probs = [], []
        for s in range(0, x_test.shape[0], 2048):
            f = module.features(x_test[s:s + 2048])
            feats.append(f)
            probs.append(module.classifier(f).softmax(1))
        f_test, p_global = torch.cat(feats), torch.cat(probs)
        f_mem = module.features(run.target["x_lab"])[self._order]
        y_mem = run.target["y_lab"][self._order]
        n_classes = p_global.shape[1]
        d = torch.cdist(f_test, f_mem).square()  # (n_test, n_mem)
        temperature = float(f_test.shape[1]) if self.temperature is None else self.temperature
        caps = KNN_CAPACITY_GRID if self.weight is None else (self.capacity,)
        weights = KNN_WEIGHT_GRID if self.weight is None else (self.weight,)
        best: dict[str, float] | None = None
        for cap in caps:
            n_keep = max(1, math.ceil(cap * f_mem.shape[0] - 1e-9))
            k = min(self.k, n_keep)
            dist, nn_idx = d[:, :n_keep].topk(k, dim=1, largest=False)
            kern = (-dist / temperature).softmax(1)  # exp(−d/T) normalised over the k neighbours
            p_knn = torch.zeros_like(p_global).scatter_add_(1, y_mem[nn_idx], kern)
            for lam in weights:
                p = p_knn * lam + p_global * (1 - lam)
                acc = int((p.argmax(1) == y_test).sum()) / max(y_test.numel(), 1)
                scores = {"target_acc": acc}
                if "auc" in run.metrics:
                    scores["target_auc"] = auc_score(p, y_test)
                if best is None or acc > best["target_acc"]:
                    best = {**scores, "knn_weight": float(lam), "knn_capacity": float(cap)}
        assert best is not None and n_classes > 0
        return best


for _cls in (Ditto, FedRep, APFL, KNNPer):
    register_method(_cls)


class _WithoutEnv:
    """A data set with one environment left out (the source-data sweep holds the real target out)."""

    def __init__(self, ds: Any, drop: int) -> None:
        self._ds, self._keep = ds, [i for i in range(len(ds)) if i != drop]
        self.ENVIRONMENTS = [ds.ENVIRONMENTS[i] for i in self._keep]
        self.input_shape, self.num_classes = ds.input_shape, ds.num_classes
        self.default_target = None
        self.metrics = tuple(getattr(ds, "metrics", ("acc",)))

    def __len__(self) -> int:
        return len(self._keep)

    def __getitem__(self, i: int) -> Any:
        return self._ds[self._keep[i]]

    def env_index(self, env: Any) -> int:
        if isinstance(env, int) and 0 <= env < len(self):
            return env
        if env in self.ENVIRONMENTS:
            return self.ENVIRONMENTS.index(env)
        raise ValueError(f"target must be one of {self.ENVIRONMENTS}, got {env!r}")


#: The source-data sweep of the hyper-parameters the auto-weighted paper hides (``docs/baselines.md``
#: § Source-data sweep): method → (option, values tried). Each default sits inside its grid.
SOURCE_SWEEP_GRID: dict[str, tuple[str, tuple[Any, ...]]] = {
    "ditto": ("lam", (0.01, 0.1, 1.0, 10.0)),
    "apfl": ("alpha", (0.25, 0.5, 0.75)),
    "knn_per": ("k", (1, 3, 5, 10)),
}


def _sweep_configs(method: str, option: str, values: Any, base: dict[str, Any], held_out: Any, pseudo_target: Any,
                   seeds: Any, dataset: Any) -> tuple[_WithoutEnv, int, str, list[tuple[Any, int, dict[str, Any]]]]:
    """The runs of one :func:`source_sweep` call: the data set without ``held_out``, the index dropped, the
    held-out domain's name, and (value, seed, resolved config) per run, every config validated."""
    from ..data.datasets import get_dataset
    from .federated import make_config
    from .methods import get_method

    spec = get_method(method)
    if option not in spec.options:
        raise ValueError(f"option must be one of {method}'s options {sorted(spec.options)}, got {option!r}")
    values, seeds = list(values), list(seeds)
    if not values:
        raise ValueError("values must hold at least one value of the option, got none")
    if not seeds:
        raise ValueError("seeds must hold at least one seed, got none")
    ds = dataset if dataset is not None else get_dataset(base["dataset"], **base.get("dataset_options", {}))
    drop = ds.env_index(held_out)
    sub = _WithoutEnv(ds, drop)
    if pseudo_target not in sub.ENVIRONMENTS:
        raise ValueError(f"pseudo_target must be one of the domains left after holding out {held_out!r}: "
                         f"{sub.ENVIRONMENTS}, got {pseudo_target!r}")
    configs = [(v, s, make_config(**{**base, "target": pseudo_target, "seed": s, "rule": method,
                                     "method_options": {**base.get("method_options", {}), option: v}}))
               for v in values for s in seeds]
    return sub, drop, str(ds.ENVIRONMENTS[drop]), configs


def sweep_run_configs(method: str, option: str, values: Any, base: dict[str, Any], *, held_out: Any,
                      pseudo_target: Any, seeds: Any = (0,), dataset: Any = None) -> list[tuple[Any, int, dict[str, Any]]]:
    """(value, seed, resolved config) of every run :func:`source_sweep` with these arguments would compute, in its
    order, every config validated; nothing runs."""
    return _sweep_configs(method, option, values, base, held_out, pseudo_target, seeds, dataset)[3]


def _sweep_key(config: dict[str, Any], held_name: str) -> dict[str, Any]:
    """A sweep run's store key: the run's key plus the held-out domain."""
    from .federated import store_key

    return {**store_key(config), "held_out": held_name}


def source_sweep(method: str, option: str, values: Any, base: dict[str, Any], *, held_out: Any,
                 pseudo_target: Any, seeds: Any = (0,), dataset: Any = None, store: Any = None,
                 experiment: str = "source_sweep", computed: Mapping[str, dict[str, Any]] | None = None
                 ) -> list[dict[str, Any]]:
    """Choose a hidden hyper-parameter on SOURCE data only (``docs/baselines.md`` § Source-data sweep): the real
    target ``held_out`` is removed from the data set, ``pseudo_target`` (one of the remaining domains) plays the
    target, and ``method`` runs with ``option`` at each of ``values`` and each seed under the config ``base``
    (:data:`fda_core.experiments.federated.DEFAULT_CONFIG` keys).

    Every run goes through ``store`` (a :class:`fda_core.common.store.ResultStore` or None) under
    ``experiment``, keyed by its config plus the held-out domain and tied to the code that ran it, so a re-run
    only computes what is missing. Every config is validated before the first run. ``computed``: results already
    at hand, by the hash of that key (:func:`compute_sweep_runs`), used instead of the store.

    Returns the runs' results in the order (value, seed), each with ``"labels"``: {option, value, seed,
    held_out}; ``result["config"]`` is the resolved config (its ``target`` is the pseudo-target)."""
    from ..common.store import config_hash
    from .federated import code_revision_of, run_experiment

    sub, _, held_name, configs = _sweep_configs(method, option, values, base, held_out, pseudo_target, seeds, dataset)
    revision = code_revision_of(configs[0][2]["rule"]) if store is not None else None
    out = []
    for v, s, c in configs:
        def compute(c: dict[str, Any] = c) -> dict[str, Any]:
            return run_experiment(_dataset=sub, **c)

        key = _sweep_key(c, held_name)
        if computed is not None and config_hash(key) in computed:
            res = computed[config_hash(key)]
        else:
            res = store.cached(experiment, key, compute, revision) if store is not None else compute()
        out.append({**res, "labels": {"option": option, "value": v, "seed": s, "held_out": held_name}})
    return out


# -- the sweep's runs side by side (source_sweep_report(workers=N)) ---------------------------------------------
def _run_held_out(item: tuple[int, dict[str, Any]]) -> dict[str, Any]:
    """One sweep run in a worker: (index of the held-out domain, resolved config)."""
    from .federated import run_experiment
    from .worker_pool import shared_object

    drop, config = item  # the data set: the caller's own object, shared out by compute_sweep_runs
    return run_experiment(_dataset=_WithoutEnv(shared_object(), drop), **config)


def compute_sweep_runs(calls: Sequence[dict[str, Any]], base: dict[str, Any], *, store: Any, experiment: str,
                       workers: int, dataset: Any = None) -> dict[str, dict[str, Any]]:
    """Every run of several :func:`source_sweep` calls (``calls``: their keyword arguments method, option, values,
    held_out, pseudo_target, seeds), the store's or computed ``workers`` at a time in spawned processes
    (:mod:`fda_core.experiments.worker_pool`; each worker loads the data set, ``dataset`` or the one ``base``
    names, once from a file written here), each saved to ``store`` as it finishes. Returns {hash of the run's store
    key: result}, to pass to :func:`source_sweep` as ``computed``; with a single run to compute (or a data set whose
    class a worker cannot import) it is left out, and ``source_sweep`` computes it as it would without ``computed``.
    On a CPU the results are those of one run after another bit for bit at equal thread counts."""
    from ..common.store import ResultStore, config_hash
    from .federated import code_revision_of
    from .worker_pool import StoredRun, WorkerTask, check_workers, store_side_by_side

    workers = check_workers(workers)
    if store is not None and not isinstance(store, ResultStore):
        store = ResultStore(store)
    runs: dict[str, StoredRun] = {}  # by the hash of the run's store key: a run several calls share, once
    for call in calls:
        _, drop, held_name, configs = _sweep_configs(call["method"], call["option"], call["values"], base,
                                                     call["held_out"], call["pseudo_target"], call.get("seeds", (0,)),
                                                     dataset)
        for _, _, c in configs:
            key = _sweep_key(c, held_name)
            runs.setdefault(config_hash(key), StoredRun(
                key, (drop, c), code_revision_of(c["rule"]) if store is not None else None,
                f"sweep run of {experiment!r} (rule {c['rule']!r}, options {c['method_options']}, held out "
                f"{held_name!r}, target {c['target']!r}, seed {c['seed']})"))
    hashes = list(runs)
    out: dict[str, dict[str, Any]] = {}
    # the workers load the caller's own data set object once (one given as an object rather than by name is the one
    # they use); a data set whose class they cannot import leaves its runs to source_sweep, with a warning
    store_side_by_side(list(runs.values()), workers, store=store, experiment=experiment, task=WorkerTask(_run_held_out),
                       on_result=lambda i, result, _: out.__setitem__(hashes[i], result),
                       shared=lambda: dataset if dataset is not None else _dataset_of(base))
    return out


def _dataset_of(base: dict[str, Any]) -> Any:
    from ..data.datasets import get_dataset

    return get_dataset(base["dataset"], **base.get("dataset_options", {}))
