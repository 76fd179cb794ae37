"""Federated methods: one interface, one registry (the engine's extension point).

A method says, like a Flower strategy, what happens in a round of federated training:

* **client side** — :meth:`Method.configure_round` says which clients train this round and how (the
  sources from the global model; the target on its labelled samples, or on its whole labelled train
  split; whether the target also records its per-batch updates, the "parts" of the auto rules), and
  :meth:`Method.local_loss` is the objective every client minimises locally (default: cross-entropy);
* **server side** — :meth:`Method.aggregate` turns what the clients sent (:class:`RoundResults`: the
  source updates g_i = h_i − h, their step counts and sample weights, the target update g_T, its
  parameters and parts, the BatchNorm statistics) into the new global model (it updates the global
  parameter vector in place, as a Flower strategy returns new parameters) and says which BatchNorm
  statistics the global model keeps; state kept between rounds lives on the method object (one
  instance per run);
* **after each round** — :meth:`Method.after_round` (optional), e.g. fine-tuning the aggregated model on
  the target within the round (the weakly-supervised FDA paper's Algorithm 1);
* **after training** — :meth:`Method.after_training` (optional), e.g. fine-tuning on the target.

The round loop (:func:`fda_core.experiments.federated.run_experiment`) knows no method by name: it asks
the method for the round's plan, trains the clients the plan names and hands the results to the method,
which updates the global model.

Every method has one canonical ``name`` (lower-case, found by name: ``get_method("fedgp_auto")``) and one
display ``label`` used by every table and figure. Variants are **options** of a method, never new names:
``get_method("fedgp", beta=1.0, projection="cosine")``; an instance's :attr:`Method.display_label`
spells its non-default options (``"FedGP (β=1, cosine)"``) and :attr:`Method.spec` its canonical
string (``"fedgp(beta=1.0, projection='cosine')"``, parsed back by :func:`parse_method_spec`).

β weights the SOURCE part everywhere (``docs/theory.md`` § Conventions): β = 0 is the target's own
update, β = 1 relies on the sources only.

Adding a method (e.g. in a notebook cell)::

    from fda_core.experiments.methods import FDAMethod, register_method
    from fda_core.core.aggregation import fedda

    @register_method
    class HalfWay(FDAMethod):
        name, label = "halfway", "Half-way FedDA"
        def combine(self, rnd, res, out):
            fedda(res.source_updates, res.target_update, 0.5, res.weights, out=out)

    run_experiment(rule="halfway", rounds=5)

or, for a server rule only, a function ``fn(rnd, res) -> update tensor (m,)`` decorated with
``@register_method("name", label="Label")``.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number
from ..core import aggregation
from ..core.estimators import auto_beta
from .flat import cross_entropy

__all__ = [
    "Option", "RoundInfo", "TargetTraining", "RoundPlan", "ClientInfo", "RoundResults", "ServerResult",
    "Method", "FedAvg", "FDAMethod", "TargetOnly", "FedDA", "FedGP", "FedDAAuto", "FedGPAuto",
    "FinetuneOffline", "Oracle", "RuleMethod",
    "register_method", "get_method", "list_methods", "method_class", "method_label", "parse_method_spec",
    "METHOD_ALIASES", "VARIANTS", "with_variant", "paper_label",
]


# ---------------------------------------------------------------------------------------------
# Options of a method
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Option:
    """A declared option of a method.

    ``default`` its value when not given; ``check(value, name)`` returns the normalised value or raises
    ValueError naming the option and its allowed values; ``show(value)`` how a non-default value appears
    in the display label (None: never shown); ``doc`` one line of help.
    """

    default: Any
    check: Callable[[Any, str], Any]
    show: Callable[[Any], str] | None = None
    doc: str = ""


def _beta_option(default: float = 0.5) -> Option:
    return Option(default, lambda v, n: check_number(v, n, 0.0, 1.0), lambda v: f"β={v:g}",
                  "β, the weight of the source part, in [0, 1]")


_PROJECTIONS = ("exact", "exact_layerwise", "cosine")
_PROJECTION_LABEL = {"exact": "exact", "exact_layerwise": "layer-wise", "cosine": "cosine"}


def _projection_option() -> Option:
    return Option("exact", lambda v, n: check_choice(v, n, _PROJECTIONS), lambda v: _PROJECTION_LABEL[v],
                  "'exact' (Proj₊ on the whole update vector), 'exact_layerwise' (per parameter tensor) or "
                  "'cosine' (the papers' per-layer cosine filter with magnitude alignment)")


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return value


def _check_optional_epochs(value: Any, name: str) -> int | None:
    return None if value is None else check_int(value, name, 0)


# ---------------------------------------------------------------------------------------------
# What the engine and a method exchange
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundInfo:
    """The round being run: ``round`` (1-based) of ``rounds``; ``warmup`` is True in the first
    ``warmup_rounds`` rounds; ``lr_source``/``lr_target`` the learning rates of this round (decayed after
    the warm-up); ``config`` the resolved run config (read-only)."""

    round: int
    rounds: int
    warmup: bool
    lr_source: float
    lr_target: float
    config: Mapping[str, Any]


@dataclass(frozen=True)
class TargetTraining:
    """How the target client trains this round. ``data``: ``"labeled"`` (its few labelled samples) or
    ``"train"`` (its whole train split, all labelled: the Oracle). ``lr``, ``batch_size``, ``epochs``:
    None takes the round's target learning rate, ``target_batch_size`` and ``target_local_epochs``.
    ``parts``: also record the update of every mini-batch (the parts of the auto rules, shape (B, m))."""

    data: str = "labeled"
    lr: float | None = None
    batch_size: int | None = None
    epochs: int | None = None
    parts: bool = False


@dataclass(frozen=True)
class RoundPlan:
    """What happens in one round (client side). ``phase`` labels the round in the history ("warmup",
    "fedavg", "fda", "oracle", ...); ``sources``: every source client trains from the global model and
    sends its update; ``target``: how the target trains (None: it does not); ``lr_source``: the learning
    rate recorded for the sources (None: the round's)."""

    phase: str
    sources: bool = True
    target: TargetTraining | None = None
    lr_source: float | None = None


@dataclass(frozen=True)
class ClientInfo:
    """Who trains: ``kind`` ("source" or "target"), ``index`` (source index; 0 for the target), ``name``
    (its environment), ``round`` (0 for after-training steps)."""

    kind: str
    index: int
    name: str
    round: int


@dataclass
class RoundResults:
    """What the clients sent in one round (server side), as flat parameter vectors of length m.

    Attributes:
        source_updates: (N, m) g_i = h_i − h (None when the sources did not train). A method may scale it
            in place (:meth:`aligned_source_updates` does, once).
        source_steps: optimiser steps of each source this round.
        weights: (N,) FedAvg sample weights n_i / Σ n_i.
        source_buffers: BatchNorm statistics of each source after training (empty dicts for models without).
        target_update: (m,) g_T = h_T − h (None when the target did not train).
        target_params: (m,) h_T, the target's parameters after training (None when it did not train).
        target_parts: (B, m) the target's per-batch updates when the plan asked for them, else None.
        target_steps: optimiser steps of the target this round (0 when it did not train).
        target_buffers: its BatchNorm statistics.
        lr_source, lr_target: learning rates of the round.
        scratch: (m,) a buffer the method may use (e.g. for the combined update before adding it).
        as_dict, as_dicts: per-tensor views {name: tensor} of a flat vector / of each row of an (N, m) tensor;
            the views tile the vector back to back in order (:meth:`segment_lengths`).
        source_alignment_steps, target_alignment_steps: the step counts the magnitude-alignment factor
            uses (``docs/reproduction.md`` § Reference-exact options): the engine's ``alignment_steps="fractional"``
            gives n/bs·epochs (FedGP paper App. B.2 Eq. B.2 and the reference code), ``"taken"`` the steps
            actually taken, ⌈n/bs⌉·epochs. None: ``source_steps`` / ``target_steps``.
    """

    source_updates: Tensor | None
    source_steps: list[int]
    weights: Tensor
    source_buffers: list[dict[str, Tensor]]
    target_update: Tensor | None
    target_params: Tensor | None
    target_parts: Tensor | None
    target_steps: int
    target_buffers: dict[str, Tensor]
    lr_source: float
    lr_target: float
    scratch: Tensor
    as_dict: Callable[[Tensor], dict[str, Tensor]]
    as_dicts: Callable[[Tensor], list[dict[str, Tensor]]]
    source_alignment_steps: Sequence[float] | None = None
    target_alignment_steps: float | None = None
    _factors: Tensor | None = field(default=None, repr=False)
    _segments: tuple[int, ...] | None = field(default=None, repr=False)

    def segment_lengths(self) -> tuple[int, ...]:
        """(L,) lengths of the parameter tensors in the flat vector's order, read once from :attr:`as_dict`: the
        ``segments`` of the layer-wise rules (:func:`fda_core.core.aggregation.fedgp`), which then work on the
        (N, m) buffers without a dict per source (same numbers as the dict form)."""
        if self._segments is None:
            views = list(self.as_dict(self.scratch).values())
            base, item, offset = self.scratch.data_ptr(), self.scratch.element_size(), 0
            for v in views:
                if v.data_ptr() != base + offset * item or not v.is_contiguous():
                    raise ValueError("as_dict's views must tile the flat vector back to back, in order")
                offset += v.numel()
            if offset != self.scratch.numel():
                raise ValueError(f"as_dict's views cover {offset} of the flat vector's {self.scratch.numel()} entries")
            self._segments = tuple(v.numel() for v in views)
        return self._segments

    def alignment_factors(self) -> Tensor:
        """(N,) magnitude-alignment factors a_i = (lr_T / lr_S) · s_T / s_i (FedGP paper App. B.2 Eq. B.2;
        ``docs/reproduction.md`` § Reference-exact options), s the step counts of ``source_alignment_steps`` /
        ``target_alignment_steps`` (default: the steps taken)."""
        if self.source_updates is None:
            raise ValueError("the sources did not train this round: there are no source updates to align")
        s_src = self.source_steps if self.source_alignment_steps is None else self.source_alignment_steps
        s_t = self.target_steps if self.target_alignment_steps is None else self.target_alignment_steps
        return (self.lr_target / self.lr_source * s_t
                / torch.tensor(list(s_src), dtype=self.source_updates.dtype, device=self.source_updates.device))

    def aligned_source_updates(self) -> Tensor:
        """The source updates rescaled to the target's round, in place, once (magnitude alignment, FedGP
        paper App. B.2 Eq. B.2; ``docs/theory.md`` § Rules): row i × a_i (:meth:`alignment_factors`).
        Returns ``source_updates`` (N, m)."""
        if self._factors is None:
            self._factors = self.alignment_factors()
            self.source_updates.mul_(self._factors[:, None])
        return self.source_updates

    def raw_source_updates(self) -> Tensor:
        """The sources' updates g_i as they were sent (N, m), without magnitude alignment: ``source_updates``
        itself, or a new tensor undoing the alignment when a method has already aligned them."""
        if self.source_updates is None:
            raise ValueError("the sources did not train this round: there are no source updates")
        return self.source_updates if self._factors is None else self.source_updates / self._factors[:, None]

    def source_per_batch_updates(self, lr_scaled: bool = True) -> Tensor:
        """(N, m) each source's average update per mini-batch, g_i / steps_i (steps actually taken), at the
        target's learning rate (× lr_T / lr_S) when ``lr_scaled`` — the source input of the auto-β estimators
        (auto-weighted FDA paper App. C.3: "the average model update divided by the number of batches", with
        the magnitudes aligned by the learning-rate ratio). A new tensor."""
        raw = self.raw_source_updates()
        scale = (self.lr_target / self.lr_source if lr_scaled else 1.0) / torch.tensor(
            self.source_steps, dtype=raw.dtype, device=raw.device)
        return raw * scale[:, None]

    def fedavg_buffers(self) -> dict[str, Tensor]:
        """Sample-weighted average of the sources' BatchNorm statistics (what FedAvg keeps)."""
        if not self.source_buffers or not self.source_buffers[0]:
            return {}
        w = self.weights.tolist()
        return {k: sum(wi * b[k] for wi, b in zip(w, self.source_buffers)) for k in self.source_buffers[0]}


@dataclass
class ServerResult:
    """What :meth:`Method.aggregate` returns besides the update it wrote: the global model's new BatchNorm
    statistics (``buffers``; None keeps the current ones) and ``beta`` (β per source used this round, for
    the history; None for rules without β)."""

    buffers: dict[str, Tensor] | None = None
    beta: list[float] | None = None


# ---------------------------------------------------------------------------------------------
# The interface
# ---------------------------------------------------------------------------------------------
class Method:
    """A federated method: what a client does in a round, what the server does with it, and an optional
    after-training step. Subclasses set ``name`` (canonical, lower-case), ``label`` (display) and
    ``options`` (declared :class:`Option` s) and override the hooks they need. The base class is FedAvg
    of the source clients (McMahan et al. 2017) every round.

    Class attributes read by generic code: ``needs_sources`` (the run needs at least one source client),
    ``gradient_rule`` and ``estimates_beta`` (the single-step gradient rule this method applies, for the
    synthetic phase-diagram trainer: "source_only", "target_only", "fedda" or "fedgp", and whether β is
    estimated from target parts; None where the method is not a gradient rule), ``uses_aux_labels`` (the
    sources' objective reads auxiliary labels: the engine then passes each source's labels as an (n, 1 + K)
    float tensor, column 0 the main label, ``docs/auxiliary.md`` § Methods).
    """

    name: ClassVar[str] = ""
    label: ClassVar[str] = ""
    options: ClassVar[dict[str, Option]] = {}
    needs_sources: ClassVar[bool] = True
    gradient_rule: ClassVar[str | None] = None
    estimates_beta: ClassVar[bool] = False
    uses_aux_labels: ClassVar[bool] = False

    def __init__(self, **options: Any) -> None:
        unknown = sorted(set(options) - set(self.options))
        if unknown:
            allowed = ", ".join(self.options) or "none"
            raise ValueError(f"method {self.name!r} has no option(s) {unknown}; its options: {allowed}")
        self.config: dict[str, Any] = {}
        for key, opt in self.options.items():
            value = options.get(key, opt.default)
            setattr(self, key, value if value is None and opt.default is None else opt.check(value, key))
        self.validate()

    # -- identity -------------------------------------------------------------------------------
    def validate(self) -> None:
        """Check combinations of options (ValueError naming them); called by ``__init__``."""

    @property
    def option_values(self) -> dict[str, Any]:
        """Every option's value, in declaration order."""
        return {k: getattr(self, k) for k in self.options}

    @property
    def changed_options(self) -> dict[str, Any]:
        """The options that differ from their defaults."""
        return {k: v for k, v in self.option_values.items() if v != self.options[k].default}

    @property
    def display_label(self) -> str:
        """The label of the method with its non-default options, e.g. ``"FedGP (β=1, cosine)"``."""
        shown = [self.options[k].show(v) for k, v in self.changed_options.items() if self.options[k].show]
        return f"{self.label} ({', '.join(shown)})" if shown else self.label

    @property
    def spec(self) -> str:
        """Canonical spec string: the name and the non-default options, ``"fedgp(beta=1.0)"``."""
        changed = self.changed_options
        return self.name if not changed else f"{self.name}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"

    def __repr__(self) -> str:
        return f"<method {self.spec}>"

    # -- client side (Flower: the client's fit) ---------------------------------------------------
    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        """Which clients train in round ``rnd`` and how. Default: every source, FedAvg."""
        return RoundPlan("fedavg", sources=True)

    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor, client: ClientInfo) -> Tensor:
        """The local objective of ``client`` on one mini-batch (a scalar). Default: mean cross-entropy."""
        return cross_entropy(model, x, y)

    # -- server side (Flower: the strategy's aggregate_fit) ----------------------------------------
    def aggregate(self, rnd: RoundInfo, res: RoundResults, theta: Tensor) -> ServerResult:
        """Update the global parameters ``theta`` (m,) in place from what the clients sent. Default:
        FedAvg, h ← h + Σ_i w_i g_i, and the sample-weighted average of the sources' BatchNorm statistics."""
        return _fedavg(res, theta)

    # -- state kept across rounds, and the model reported on the target ------------------------------
    def setup(self, run: Any) -> None:
        """Optional step once the engine's :class:`fda_core.experiments.federated.Run` is built, before the
        first round: allocate per-client state kept across rounds (e.g. a personal target model, one head per
        client) from ``run.theta`` / ``run.buffers`` / ``run.model``."""

    def target_scores(self, run: Any) -> Mapping[str, float] | None:
        """The scores recorded at an evaluation (``{"target_acc": …}``, plus ``target_auc`` where the dataset
        lists it, and any extra numbers), or None for the global model's (the default). A personalised method
        returns ``run.score(module)`` of its personal model (``docs/baselines.md`` § Engine hooks)."""
        return None

    # -- after the server step of a round ------------------------------------------------------------
    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        """Optional step after the server's update of round ``rnd`` and before its evaluation; ``run`` is the
        engine's :class:`fda_core.experiments.federated.Run` (e.g. ``run.train_target`` fine-tunes the new
        global model on the target's labelled samples)."""

    # -- after the rounds ------------------------------------------------------------------------
    def after_training(self, run: Any) -> None:
        """Optional step after the last round (e.g. fine-tuning); ``run`` is the engine's
        :class:`fda_core.experiments.federated.Run` (train the target, evaluate, set the global model)."""


def _fedavg(res: RoundResults, theta: Tensor) -> ServerResult:
    """FedAvg (McMahan et al. 2017): h ← h + Σ_i w_i g_i with w_i = n_i / Σ n_i; BatchNorm statistics averaged."""
    if res.source_updates is None:
        raise ValueError("FedAvg needs the source updates, but the sources did not train this round")
    theta.addmv_(res.source_updates.T, res.weights)
    return ServerResult(buffers=res.fedavg_buffers())


class FedAvg(Method):
    """Source only: FedAvg of the source clients in every round; the target never trains."""

    name, label = "source_only", "Source only"
    gradient_rule = "source_only"


class FDAMethod(Method):
    """Federated domain adaptation (FedGP paper Algorithm 1, App. B.1): FedAvg warm-up rounds, then every
    round the sources and the target train from the global model h and the server combines them,
    h ← h + ĝ with ĝ from :meth:`combine` (the global model keeps the target's BatchNorm statistics)."""

    uses_sources: ClassVar[bool] = True

    def _warming(self, rnd: RoundInfo) -> bool:
        """Whether this round is one of the FedAvg warm-up rounds for this method."""
        return rnd.warmup

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        if self._warming(rnd):
            return RoundPlan("warmup", sources=True)
        return RoundPlan("fda", sources=self.uses_sources, target=TargetTraining(parts=self.estimates_beta))

    def aggregate(self, rnd: RoundInfo, res: RoundResults, theta: Tensor) -> ServerResult:
        if self._warming(rnd):
            return _fedavg(res, theta)
        beta = self.combine(rnd, res, res.scratch)
        theta.add_(res.scratch)
        return ServerResult(buffers=res.target_buffers, beta=None if beta is None else [float(b) for b in beta])

    def combine(self, rnd: RoundInfo, res: RoundResults, out: Tensor) -> Tensor | Sequence[float] | None:
        """Write the combined update ĝ (m,) into ``out``; return β per source (or None). Subclasses override."""
        raise NotImplementedError


class TargetOnly(FDAMethod):
    """Target only (β = 0): the target trains alone on its labelled samples and the sources never train.

    By default it trains from the run's initial weights in every round, the warm-up rounds included, at the
    undecayed target learning rate: the reference code's Target only (the auto-weighted FDA paper's scripts
    run it with ``proj_w=0``, which skips the FedAvg warm-up, and without a learning-rate decay;
    ``docs/reproduction.md`` § Reference-exact options, row 8). ``warmup=True``: first the run's shared FedAvg
    warm-up rounds, then the target alone at the decayed learning rate, as every FDA row (the workbook's
    former Target only). Option ``epochs``: target epochs per round (None: ``target_local_epochs``)."""

    name, label = "target_only", "Target only"
    uses_sources = False
    needs_sources = False
    gradient_rule = "target_only"
    options = {"epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs/round",
                                "target epochs per round (None: target_local_epochs)"),
               "warmup": Option(False, _check_bool, lambda v: "after warm-up",
                                "False: from the initial weights, no warm-up, no lr decay (the reference code); "
                                "True: after the run's FedAvg warm-up rounds, lr decayed after them")}

    def _warming(self, rnd: RoundInfo) -> bool:
        return self.warmup and rnd.warmup

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        if self._warming(rnd):
            return super().configure_round(rnd)
        # without the warm-up there is no decay either (the engine decays only after warm-up rounds)
        lr = None if self.warmup else rnd.config["target_lr"]
        return RoundPlan("fda", sources=False, target=TargetTraining(epochs=self.epochs or None, lr=lr))

    def combine(self, rnd, res, out):
        out.copy_(res.target_update)
        return None


def _apply_rule(rule: str, projection: str, filter_negative: bool, res: RoundResults, beta: Tensor, out: Tensor) -> None:
    """out ← Aggr(aligned source updates, g_T, β) (``docs/theory.md`` § Rules), with the projection variant."""
    aligned = res.aligned_source_updates()
    g_t, w = res.target_update, res.weights
    if rule == "fedda":
        aggregation.fedda(aligned, g_t, beta, w, out=out)
    elif not filter_negative:  # the "FedGP w/o filter" ablation (FedGP paper Table 4)
        if projection == "exact":
            out.copy_(aggregation.fedgp_nofilter(aligned, g_t, beta, w))
        else:
            aggregation.fedgp_nofilter(aligned, g_t, beta, w, out=out, segments=res.segment_lengths())
    elif projection == "exact":
        aggregation.fedgp(aligned, g_t, beta, w, out=out)  # Proj₊ on the whole update vector
    elif projection == "exact_layerwise":  # per parameter tensor: the segments of the flat buffers
        aggregation.fedgp(aligned, g_t, beta, w, out=out, segments=res.segment_lengths())
    else:  # 'cosine': the papers' per-layer cosine filter (App. B.2 Eq. B.2); the updates are already
        # aligned (a_i G_i) and cos(G_T, a_i G_i) = cos(G_T, G_i), so the alignment factor here is 1
        aggregation.fedgp_cosine(aligned, g_t, beta, w, out=out, segments=res.segment_lengths())


class FedDA(FDAMethod):
    """FedDA: ĝ = Σ_i w_i [(1 − β) g_T + β g_i] (FedGP paper § 4; ``docs/theory.md`` § Rules).

    Options: ``beta``; ``align`` (default False: the source updates enter as sent, as in the papers' reference
    code, which aligns magnitudes for FedGP only; True multiplies each g_i by the alignment factor a_i first,
    ``docs/reproduction.md`` § Reference-exact options).
    """

    name, label = "fedda", "FedDA"
    options = {"beta": _beta_option(),
               "align": Option(False, _check_bool, lambda v: "aligned" if v else "raw",
                               "scale the source updates by the magnitude-alignment factor (False: as sent, "
                               "the reference code)")}
    gradient_rule = "fedda"

    def combine(self, rnd, res, out):
        beta = torch.full((res.weights.numel(),), float(self.beta), dtype=out.dtype, device=out.device)
        if self.align:
            _apply_rule("fedda", "exact", True, res, beta, out)
        else:
            aggregation.fedda(res.raw_source_updates(), res.target_update, beta, res.weights, out=out)
        return beta


class FedGP(FDAMethod):
    """FedGP: ĝ = Σ_i w_i [(1 − β) g_T + β Proj₊(g_T | a_i g_i)] (FedGP paper § 4; ``docs/theory.md`` § Rules).

    Options: ``beta``; ``projection`` 'exact' (default: the whole update vector), 'exact_layerwise' (per
    parameter tensor) or 'cosine' (the papers' per-layer cosine filter with magnitude alignment,
    ``docs/theory.md`` § Layer-wise application); ``filter`` (default True; False keeps negative
    projections, the "w/o filter" ablation of FedGP paper Table 4).
    """

    name, label = "fedgp", "FedGP"
    options = {
        "beta": _beta_option(),
        "projection": _projection_option(),
        "filter": Option(True, _check_bool, lambda v: "filter" if v else "no filter",
                         "keep only positive projections (False: the 'w/o filter' ablation)"),
    }
    gradient_rule = "fedgp"

    def validate(self) -> None:
        if not self.filter and self.projection == "cosine":
            raise ValueError("filter=False is defined for projection='exact' or 'exact_layerwise', not 'cosine'")

    def combine(self, rnd, res, out):
        beta = torch.full((res.weights.numel(),), float(self.beta), dtype=out.dtype, device=out.device)
        _apply_rule("fedgp", self.projection, self.filter, res, beta, out)
        return beta


_LR_SCALINGS = ("paper", "reference")


def _lr_scaling_option() -> Option:
    return Option("paper", lambda v, n: check_choice(v, n, _LR_SCALINGS),
                  lambda v: "reference lr scaling" if v == "reference" else "paper lr scaling",
                  "'paper' (source per-batch updates × lr_T/lr_S, auto-weighted paper App. C.3) or 'reference' "
                  "(the reference scripts: the target's parts × lr_T/lr_S, sources unscaled)")


class _AutoMethod(FDAMethod):
    """Auto-weighted rules (auto-weighted FDA paper § 4.2, App. C.3; ``docs/theory.md`` § Optimal weights):
    every round β_i = σ̂² / (σ̂² + d̂_i²) (FedDA) or σ̂² / (σ̂² + (τ²d²)^_i) (FedGP), estimated from the
    target's per-batch updates (the parts) and each source's average per-batch update g_i / steps_i,
    aligned by lr_T / lr_S (:meth:`RoundResults.source_per_batch_updates`); the combination then uses the
    magnitude-aligned source updates.

    Option ``lr_scaling``: 'paper' (default, the definition above) or 'reference' — the paper's reference
    scripts multiply the target's parts by lr_T / lr_S and leave the sources unscaled, which puts the
    target's variance (lr_T/lr_S)² too low against FedDA's distances (β collapses towards 0 when lr_T < lr_S;
    ``docs/reproduction.md`` § Reference-exact options). FedGP_Auto's β sees a source only through its
    direction, so the option does not change it. Kept only to show the effect on FedDA_Auto."""

    estimates_beta = True
    base: ClassVar[str] = ""
    options = {"projection": _projection_option(), "lr_scaling": _lr_scaling_option()}

    def combine(self, rnd, res, out):
        if self.lr_scaling == "paper":
            beta = auto_beta(res.target_parts, res.source_per_batch_updates(), rule=self.base)
        else:  # the reference scripts: target parts × lr_T/lr_S, sources' per-batch updates as sent
            beta = auto_beta(res.target_parts * (res.lr_target / res.lr_source),
                             res.source_per_batch_updates(lr_scaled=False), rule=self.base)
        _apply_rule(self.base, getattr(self, "projection", "exact"), True, res, beta, out)
        return beta


class FedDAAuto(_AutoMethod):
    """FedDA_Auto: FedDA with β_i = σ̂² / (σ̂² + d̂_i²) re-estimated every round."""

    name, label, base = "fedda_auto", "FedDA_Auto", "fedda"
    options = {"lr_scaling": _lr_scaling_option()}  # FedDA has no projection
    gradient_rule = "fedda"


class FedGPAuto(_AutoMethod):
    """FedGP_Auto: FedGP with β_i = σ̂² / (σ̂² + (τ²d²)^_i) re-estimated every round."""

    name, label, base = "fedgp_auto", "FedGP_Auto", "fedgp"
    gradient_rule = "fedgp"


class FinetuneOffline(Method):
    """Finetune_Offline: FedAvg of the sources for every round, then ``epochs`` epochs of fine-tuning on
    the labelled target samples (None → as many epochs as rounds) at the target's learning rate (× lr_decay
    when there were warm-up rounds).

    Option ``optimizer_reset``: 'epoch' (default) starts a fresh Adam for every fine-tuning epoch, as the
    papers' reference scripts do (their ``train`` builds a new optimiser per call, one call per epoch;
    ``docs/reproduction.md`` row 12); 'once' runs one optimiser over all the epochs (the former default)."""

    name, label = "finetune_offline", "Finetune_Offline"
    options = {"epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs",
                                "fine-tuning epochs (None: as many as rounds)"),
               "optimizer_reset": Option("epoch", lambda v, n: check_choice(v, n, ("epoch", "once")),
                                         lambda v: "one optimiser run" if v == "once" else "fresh Adam per epoch",
                                         "'epoch': a fresh optimiser every fine-tuning epoch (the reference "
                                         "scripts); 'once': one optimiser run over all the epochs")}

    def after_training(self, run: Any) -> None:
        c = run.config
        epochs = c["rounds"] if self.epochs is None else self.epochs
        lr = c["target_lr"] * (c["lr_decay"] if c["warmup_rounds"] > 0 else 1.0)
        for e in range(1, epochs + 1):
            reset = self.optimizer_reset == "epoch" or e == 1
            run.train_target(epochs=1, lr=lr, step=c["rounds"] + e, reset_optimizer=reset, who="target fine-tuning")
            run.evaluate(c["rounds"] + e, "finetune", lr_source=0.0, lr_target=lr)


class Oracle(Method):
    """Oracle: supervised training on the target's whole train split, all labelled (source lr and batch
    size, no decay); no source client. Option ``epochs``: epochs per round (None: ``target_local_epochs``);
    give it the budget that makes it the upper bound its name promises (``docs/experiments.md`` §
    Semi-synthetic shifts)."""

    name, label = "oracle", "Oracle"
    needs_sources = False
    options = {"epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs/round",
                                "epochs per round on the target's train split (None: target_local_epochs)"),
               "lr": Option(None, lambda v, n: None if v is None else check_number(v, n, 0.0, None, lo_open=True),
                            lambda v: f"lr {v:g}", "learning rate (None: the sources' source_lr)")}

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        c = rnd.config
        lr = c["source_lr"] if self.lr is None else self.lr
        return RoundPlan("oracle", sources=False, lr_source=lr,
                         target=TargetTraining(data="train", lr=lr, batch_size=c["source_batch_size"],
                                               epochs=self.epochs or None))

    def aggregate(self, rnd, res, theta):
        theta.copy_(res.target_params)  # the global model is the target's trained model
        return ServerResult(buffers=res.target_buffers)


class RuleMethod(FDAMethod):
    """An FDA method around an aggregation rule registered in :mod:`fda_core.core.aggregation` that has no
    method of its own (e.g. a user's rule): the rule sees the aligned source updates, the target update
    (and for rules on target parts, the parts scaled to whole-round updates, parts × steps_T), β and the
    sample weights."""

    rule: ClassVar[str] = ""
    options = {"beta": _beta_option()}

    def combine(self, rnd, res, out):
        rule = aggregation.get_rule(self.rule)
        aligned = res.aligned_source_updates()
        if rule.uses_target_parts:
            out.copy_(rule.apply(aligned, target_part_grads=res.target_parts * res.target_steps, weights=res.weights))
            return None
        beta = torch.full((res.weights.numel(),), float(self.beta), dtype=out.dtype, device=out.device)
        result = rule.apply(aligned, res.target_update, beta=beta, weights=res.weights)
        out.copy_(result if isinstance(result, Tensor) else torch.as_tensor(result))
        return beta if rule.uses_beta else None


def _rule_method(rule_name: str) -> type[Method]:
    rule = aggregation.get_rule(rule_name)
    attrs = {"name": rule_name, "label": rule_name, "rule": rule_name, "estimates_beta": rule.uses_target_parts,
             "__doc__": f"FDA method around the registered aggregation rule {rule_name!r}: {rule.description}",
             # the rule's own module and function, so a rule written in a notebook is part of the code revision
             "__module__": getattr(rule.fn, "__module__", __name__), "server_function": staticmethod(rule.fn)}
    if not rule.uses_beta:
        attrs["options"] = {}
    return type(f"RuleMethod_{rule_name}", (RuleMethod,), attrs)


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------
_REGISTRY: dict[str, type[Method]] = {}

#: Former names of what are now options of a method (``run_experiment(rule=...)`` keeps accepting them).
METHOD_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "fedgp_cosine": ("fedgp", {"projection": "cosine"}),
    "fedgp_nofilter": ("fedgp", {"filter": False}),
    "fedavg": ("source_only", {}),
}


def register_method(obj: Any = None, /, *, name: str | None = None, label: str | None = None,
                    overwrite: bool = False) -> Any:
    """Register a method class, or build one from a server function; usable as a decorator.

    * ``@register_method`` on a :class:`Method` subclass (its ``name`` and ``label`` class attributes);
    * ``@register_method("name", label="Label")`` on a function ``fn(rnd, res) -> Tensor (m,)``: an
      :class:`FDAMethod` whose server combines the round with ``fn`` (the returned update is used as is;
      :meth:`RoundResults.aligned_source_updates` gives magnitude-aligned source updates).

    A name must be a lower-case identifier not used by another method (re-registering a method defined
    outside ``fda_core``, e.g. a notebook cell run twice, replaces it; replacing a built-in needs
    ``overwrite=True``). Returns the class (or decorated function's class).
    """
    if isinstance(obj, str) or obj is None:
        the_name = obj if isinstance(obj, str) else name

        def deco(target: Any) -> Any:
            return register_method(target, name=the_name, label=label, overwrite=overwrite)

        return deco
    if inspect.isclass(obj) and issubclass(obj, Method):
        cls = obj
        if name is not None:
            cls.name = name
        if label is not None:
            cls.label = label
    elif callable(obj):
        fn = obj
        if name is None:
            name = getattr(fn, "__name__", "")

        def combine(self, rnd, res, out, _fn=fn):
            out.copy_(_fn(rnd, res))
            return None

        cls = type(f"Function_{name}", (FDAMethod,), {
            "name": name, "label": label or name, "combine": combine, "__doc__": fn.__doc__,
            "__module__": getattr(fn, "__module__", __name__), "server_function": staticmethod(fn)})
    else:
        raise ValueError(f"register_method takes a Method subclass or a function, got {type(obj).__name__}")
    if not isinstance(cls.name, str) or not cls.name.isidentifier() or cls.name != cls.name.lower():
        raise ValueError(f"method name must be a lower-case identifier, got {cls.name!r}")
    if not cls.label:
        cls.label = cls.name
    if cls.name in METHOD_ALIASES:
        raise ValueError(f"{cls.name!r} is a former method name, now {METHOD_ALIASES[cls.name]}; choose another name")
    old = _REGISTRY.get(cls.name)
    if old is not None and old is not cls and not overwrite and old.__module__.startswith("fda_core"):
        raise ValueError(f"method name {cls.name!r} is taken by the built-in {old.__qualname__}; "
                         "choose another name or pass overwrite=True")
    _REGISTRY[cls.name] = cls
    return obj if not inspect.isclass(obj) or obj is cls else cls


for _cls in (FedAvg, TargetOnly, FedDA, FedGP, FedDAAuto, FedGPAuto, FinetuneOffline, Oracle):
    register_method(_cls)


def _load_extensions() -> None:
    """Register the methods defined in their own modules (imported here, so that they are part of the code
    revision of every run): the weakly-supervised FDA paper's FedAvg Finetune and AuxInfo; the personalisation
    baselines (Ditto, FedRep, APFL, KNN-per) and the unsupervised FDA baselines (FADA, KD3A), docs/baselines.md."""
    from . import auxiliary  # noqa: F401  (registers its methods on import)
    from . import personalisation  # noqa: F401  (Ditto, FedRep, APFL, KNN-per)
    from . import fda_baselines  # noqa: F401  (FADA, KD3A)


def list_methods() -> list[str]:
    """Canonical names of the registered methods (built-ins first, in the papers' table order)."""
    _load_extensions()
    return list(_REGISTRY)


def method_class(name: str) -> type[Method]:
    """The class registered under ``name`` (a former name resolves to its method; an aggregation rule
    registered in :mod:`fda_core.core.aggregation` without a method of its own gets a :class:`RuleMethod`)."""
    if isinstance(name, str) and name in METHOD_ALIASES:
        name = METHOD_ALIASES[name][0]
    if isinstance(name, str) and name not in _REGISTRY:
        _load_extensions()
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    if isinstance(name, str) and name in aggregation.RULES:
        return _rule_method(name)
    allowed = list_methods() + sorted(METHOD_ALIASES)
    raise ValueError(f"unknown method {name!r}; rule must be one of {allowed}")


def get_method(name: str | Mapping[str, Mapping[str, Any]], **options: Any) -> Method:
    """A fresh instance of method ``name`` with ``options`` (validated: ValueError names the option).

    ``name`` may also be a spec string, ``"fedgp(beta=1.0)"``, or ``{"fedgp": {"beta": 1.0}}`` (see
    :func:`parse_method_spec`), or a
    former name (``"fedgp_cosine"`` → ``fedgp`` with ``projection="cosine"``)."""
    if isinstance(name, Mapping) or (isinstance(name, str) and "(" in name):
        name, parsed = parse_method_spec(name)
        options = {**parsed, **options}
    if isinstance(name, str) and name in METHOD_ALIASES:
        canonical, implied = METHOD_ALIASES[name]
        clash = {k for k in implied if k in options and options[k] != implied[k]}
        if clash:
            raise ValueError(f"{name!r} means {canonical!r} with {implied}; it cannot take {sorted(clash)} = "
                             f"{[options[k] for k in sorted(clash)]}")
        name, options = canonical, {**options, **implied}
    return method_class(name)(**options)


def parse_method_spec(spec: str | Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """``"fedgp"`` → ("fedgp", {}); ``"fedgp(beta=1, projection='cosine')"`` → ("fedgp", {"beta": 1,
    "projection": "cosine"}); the mapping form ``{"fedgp": {"beta": 1}}`` (what a notebook parameter or a
    YAML file can hold without '=' signs) → ("fedgp", {"beta": 1}). Values are Python literals.
    ValueError names the malformed spec."""
    if isinstance(spec, Mapping):
        if len(spec) == 1:
            (name, opts), = spec.items()
            if isinstance(name, str) and isinstance(opts, Mapping):
                return name, dict(opts)
        raise ValueError(f"malformed method spec {spec!r}: a mapping spec has one key, the method's name, "
                         "and a mapping of options, e.g. {'fedgp': {'beta': 1.0}}")
    if not isinstance(spec, str):
        raise ValueError(f"a method spec must be a string such as 'fedgp' or 'fedgp(beta=1)', got {spec!r}")
    try:
        node = ast.parse(spec.strip(), mode="eval").body
        if isinstance(node, ast.Name):
            return node.id, {}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
            return node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except (SyntaxError, ValueError):
        pass
    raise ValueError(f"malformed method spec {spec!r}: write a method name, optionally with keyword options, "
                     "e.g. 'fedgp' or \"fedgp(beta=1.0, projection='cosine')\"")


#: Options that make a method the papers' reference implementation ("reference") or the library's earlier
#: defaults ("library"); ``docs/reproduction.md`` § Reference-exact options. A method not listed is the same in both.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    # the papers' code: FedGP and FedGP_Auto project per layer with the cosine filter and magnitude alignment
    # (FedGP paper App. B.2 Eq. B.2); FedDA combines the source updates as sent
    "reference": {"fedgp": {"projection": "cosine"}, "fedgp_auto": {"projection": "cosine"}, "fedda": {"align": False}},
    # exact projection on the whole update vector (the theory's Proj₊), FedDA on aligned updates
    "library": {"fedgp": {"projection": "exact"}, "fedgp_auto": {"projection": "exact"}, "fedda": {"align": True}},
}


def with_variant(spec: str | Mapping[str, Mapping[str, Any]], variant: str) -> dict[str, dict[str, Any]]:
    """The method spec ``spec`` with the options of ``variant`` ("reference" or "library", :data:`VARIANTS`)
    filled in where ``spec`` does not set them, as a mapping spec ``{name: {option: value}}``. FedGP without
    the filter (an ablation defined for the exact projections) keeps its projection. ValueError names an
    unknown variant."""
    check_choice(variant, "variant", tuple(VARIANTS))
    method = get_method(spec)
    given = parse_method_spec(spec)[1] if (isinstance(spec, Mapping) or "(" in str(spec)) else {}
    fill = dict(VARIANTS[variant].get(method.name, {}))
    if method.name == "fedgp" and not method.filter:
        fill.pop("projection", None)
    return {method.name: {**method.changed_options, **{k: v for k, v in fill.items() if k not in given}}}


# option tags of the workbook's labels that name the papers' own implementation, not a different method
_IMPLEMENTATION_TAGS = (r"cosine", r"\d+ epochs/round", r"lr [0-9.e-]+")


def paper_label(label: str) -> str:
    """The papers' name of a workbook display label: drops the option tags that only say how the paper
    implemented the method (``"FedGP (β=1, cosine)"`` → ``"FedGP (β=1)"``, ``"Oracle (20 epochs/round)"``
    → ``"Oracle"``)."""
    m = re.fullmatch(r"(.*?) \((.*)\)", label)
    if not m:
        return label
    kept = [t.strip() for t in m.group(2).split(",")
            if not any(re.fullmatch(p, t.strip()) for p in _IMPLEMENTATION_TAGS)]
    return f"{m.group(1)} ({', '.join(kept)})" if kept else m.group(1)


def method_label(spec: str | Method, **options: Any) -> str:
    """Display label of a method spec or instance, e.g. ``method_label("fedgp(beta=1)")`` → ``"FedGP (β=1)"``."""
    method = spec if isinstance(spec, Method) else get_method(spec, **options)
    return method.display_label
