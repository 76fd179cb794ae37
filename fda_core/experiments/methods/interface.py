"""The interface between the round loop and a method: what the engine asks (:class:`RoundInfo`,
:class:`RoundPlan`, :class:`ClientInfo`), what the clients send (:class:`RoundResults`), what the server returns
(:class:`ServerResult`), the :class:`Method` base class and its declared :class:`Option` s."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
from torch import Tensor, nn

from ...common.checks import check_choice, check_int, check_number
from ..flat import cross_entropy


@dataclass(frozen=True)
class Option:
    """A declared option of a method.

    ``default`` its value when not given; ``check(value, name)`` returns the normalised value or raises
    ValueError naming the option and its allowed values; ``show(value)`` how a non-default value appears
    in the display label (None: never shown); ``doc`` one line of help. ``keyed=False`` marks an option added after
    results were stored: at its default it stays out of :attr:`Method.option_values` (a run's ``method_options``,
    so its result-store key and the CSV notes), so the runs stored before it keep their keys and regenerate the same
    files; set, it is recorded like any option.
    """

    default: Any
    check: Callable[[Any, str], Any]
    show: Callable[[Any], str] | None = None
    doc: str = ""
    keyed: bool = True


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


def _check_optional_lr(value: Any, name: str) -> float | None:
    return None if value is None else check_number(value, name, 0.0, lo_open=True)


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
        weight_list: :attr:`weights` as Python floats when the engine has them (it reads them once per run);
            None: read from :attr:`weights` once, on the first :meth:`weight_values`.
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
    weight_list: list[float] | None = None
    _factors: Tensor | None = field(default=None, repr=False)
    _segments: tuple[int, ...] | None = field(default=None, repr=False)

    def weight_values(self) -> list[float]:
        """(N,) :attr:`weights` as Python floats, the same values: what the rules take without reading a device
        tensor. The rules check per-source values given as tensors where they are — on a GPU each check is a host
        synchronisation — and Python numbers on the host (:mod:`fda_core.core.aggregation`)."""
        if self.weight_list is None:
            self.weight_list = self.weights.tolist()
        return self.weight_list

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
        w = self.weight_values()
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
        """Every option's value, in declaration order; an option declared ``keyed=False`` only when it differs from
        its default (:class:`Option`)."""
        return {k: getattr(self, k) for k, opt in self.options.items() if opt.keyed or getattr(self, k) != opt.default}

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

    # -- rounds that runs of other methods compute alike ---------------------------------------------
    def fedavg_rounds(self, config: Mapping[str, Any]) -> int:
        """How many leading rounds of a run under the resolved ``config`` are the engine's plain FedAvg round (every
        source trains from the global model, the target does not train, the server's step is :func:`_fedavg`), which
        runs of the same config with other methods may share (:mod:`fda_core.experiments.shared_rounds`). Default:
        every round when the class keeps this base class's ``configure_round`` and ``aggregate``, else 0. A subclass
        that changes a round declares its own count; 0 is always safe."""
        cls = type(self)
        plain = cls.configure_round is Method.configure_round and cls.aggregate is Method.aggregate
        return int(config["rounds"]) if plain else 0

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


