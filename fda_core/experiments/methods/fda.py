"""The papers' methods: FedAvg / source only, Target only, FedDA, FedGP, their auto-weighted forms, Finetune_Offline,
the oracle, and any aggregation rule of :mod:`fda_core.core.aggregation` as a method. β weights the SOURCE part."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from torch import Tensor

from ...common.checks import check_choice, check_number
from ...core import aggregation
from ...core.estimators import auto_beta
from ..flat import classifier_positions
from .interface import (Method, Option, RoundInfo, RoundPlan, RoundResults, ServerResult, TargetTraining, _beta_option,
                        _check_bool, _check_optional_epochs, _check_optional_lr, _fedavg, _projection_option)


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

    def fedavg_rounds(self, config) -> int:
        """The FedAvg warm-up rounds (shared with the other runs of the config, ``shared_rounds``), when the class keeps
        this class's warm-up (``_warming``, ``configure_round``, ``aggregate``); else 0."""
        cls = type(self)
        plain = (cls._warming is FDAMethod._warming and cls.configure_round is FDAMethod.configure_round
                 and cls.aggregate is FDAMethod.aggregate)
        return int(config["warmup_rounds"]) if plain else 0

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

    def fedavg_rounds(self, config) -> int:
        """With ``warmup=True`` the run's FedAvg warm-up rounds (shared, ``shared_rounds``); without, none."""
        cls = type(self)
        plain = (cls._warming is TargetOnly._warming and cls.configure_round is TargetOnly.configure_round
                 and cls.aggregate is FDAMethod.aggregate)
        return int(config["warmup_rounds"]) if plain and self.warmup else 0

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        if self._warming(rnd):
            return super().configure_round(rnd)
        # without the warm-up there is no decay either (the engine decays only after warm-up rounds)
        lr = None if self.warmup else rnd.config["target_lr"]
        return RoundPlan("fda", sources=False, target=TargetTraining(epochs=self.epochs or None, lr=lr))

    def combine(self, rnd, res, out):
        out.copy_(res.target_update)
        return None


def _apply_rule(rule: str, projection: str, filter_negative: bool, res: RoundResults, beta: Tensor | float,
                out: Tensor, align: bool = True) -> None:
    """out ← Aggr(aligned source updates, g_T, β) (``docs/theory.md`` § Rules), with the projection variant; with
    ``align=False`` (FedDA only) the source updates as sent. β (a number or (N,)) and the weights go to the rule as
    Python numbers where they are known on the host: the rule then checks them there, with no device read (on a
    GPU, each check of a device tensor is a host synchronisation)."""
    if not align and rule != "fedda":
        raise ValueError(f"only FedDA combines unaligned source updates, not {rule!r}")
    sources = res.aligned_source_updates() if align else res.raw_source_updates()
    g_t, w = res.target_update, res.weight_values()
    if rule == "fedda":
        aggregation.fedda(sources, g_t, beta, w, out=out)
    elif not filter_negative and projection == "cosine":  # the filter's ablation in the papers' rule (Table 4)
        aggregation.fedgp_cosine(sources, g_t, beta, w, out=out, segments=res.segment_lengths(), filter_negative=False)
    elif not filter_negative:  # the "FedGP w/o filter" ablation (FedGP paper Table 4) on the exact projections
        if projection == "exact":
            out.copy_(aggregation.fedgp_nofilter(sources, g_t, beta, w))
        else:
            aggregation.fedgp_nofilter(sources, g_t, beta, w, out=out, segments=res.segment_lengths())
    elif projection == "exact":
        aggregation.fedgp(sources, g_t, beta, w, out=out)  # Proj₊ on the whole update vector
    elif projection == "exact_layerwise":  # per parameter tensor: the segments of the flat buffers
        aggregation.fedgp(sources, g_t, beta, w, out=out, segments=res.segment_lengths())
    else:  # 'cosine': the papers' per-layer cosine filter (App. B.2 Eq. B.2); the updates are already
        # aligned (a_i G_i) and cos(G_T, a_i G_i) = cos(G_T, G_i), so the alignment factor here is 1
        aggregation.fedgp_cosine(sources, g_t, beta, w, out=out, segments=res.segment_lengths())


def _align_option() -> Option:
    """FedDA's and FedDA_Auto's ``align``: False (the reference code) combines the source updates as sent."""
    return Option(False, _check_bool, lambda v: "aligned" if v else "raw",
                  "scale the source updates by the magnitude-alignment factor before combining them (False: as sent, "
                  "the reference code)")


class FedDA(FDAMethod):
    """FedDA: ĝ = Σ_i w_i [(1 − β) g_T + β g_i] (FedGP paper § 4; ``docs/theory.md`` § Rules).

    Options: ``beta``; ``align`` (default False: the source updates enter as sent, as in the papers' reference
    code, which aligns magnitudes for FedGP only; True multiplies each g_i by the alignment factor a_i first,
    ``docs/reproduction.md`` § Reference-exact options).
    """

    name, label = "fedda", "FedDA"
    options = {"beta": _beta_option(), "align": _align_option()}
    gradient_rule = "fedda"

    def combine(self, rnd, res, out):
        _apply_rule("fedda", "exact", True, res, float(self.beta), out, align=self.align)
        return torch.full((res.weights.numel(),), float(self.beta), dtype=out.dtype, device=out.device)


class FedGP(FDAMethod):
    """FedGP: ĝ = Σ_i w_i [(1 − β) g_T + β Proj₊(g_T | a_i g_i)] (FedGP paper § 4; ``docs/theory.md`` § Rules).

    Options: ``beta``; ``projection`` 'exact' (default: the whole update vector), 'exact_layerwise' (per
    parameter tensor) or 'cosine' (the papers' per-layer cosine filter with magnitude alignment,
    ``docs/theory.md`` § Layer-wise application); ``filter`` (default True; False keeps negative
    projections, the "w/o filter" ablation of FedGP paper Table 4: the signed projection for the exact forms, the
    signed cosine for 'cosine').
    """

    name, label = "fedgp", "FedGP"
    options = {
        "beta": _beta_option(),
        "projection": _projection_option(),
        "filter": Option(True, _check_bool, lambda v: "filter" if v else "no filter",
                         "keep only positive projections (False: the 'w/o filter' ablation; with 'cosine' the signed "
                         "cosine)"),
    }
    gradient_rule = "fedgp"

    def combine(self, rnd, res, out):
        _apply_rule("fedgp", self.projection, self.filter, res, float(self.beta), out)
        return torch.full((res.weights.numel(),), float(self.beta), dtype=out.dtype, device=out.device)


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
    aligned by lr_T / lr_S (:meth:`RoundResults.source_per_batch_updates`); FedGP_Auto's combination then uses
    the magnitude-aligned source updates, FedDA_Auto's those as sent (its ``align`` option).

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
        _apply_rule(self.base, getattr(self, "projection", "exact"), True, res, beta, out,
                    align=getattr(self, "align", True))
        return beta


class FedDAAuto(_AutoMethod):
    """FedDA_Auto: FedDA with β_i = σ̂² / (σ̂² + d̂_i²) re-estimated every round.

    Option ``align`` as FedDA's (default False: the combination takes the source updates as sent, as the
    reference scripts' ``update_global_convex`` does; True: magnitude-aligned first). β is estimated from the
    aligned per-batch updates either way (``lr_scaling``)."""

    name, label, base = "fedda_auto", "FedDA_Auto", "fedda"
    options = {"lr_scaling": _lr_scaling_option(), "align": _align_option()}  # FedDA has no projection
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
    ``docs/reproduction.md`` row 12); 'once' runs one optimiser over all the epochs (the former default).

    A target with input noise drawn anew every round (``noise_draw="per_round"``) gets a new draw for every
    fine-tuning epoch too, numbered on from the rounds (epoch e is draw ``rounds + e``), as the scripts' data
    loading draws new noise at every load.

    Option ``freeze``: True fine-tunes the model's last layer only (its ``classifier``; the other parameters get no
    gradient, so Adam leaves them as they are), as the reference's ``main_noniid_finetune_offline.py --freeze`` trains
    only ``fc3``; its scripts run both forms (``docs/reproduction.md`` § On the paper's data). False (the default):
    every parameter.

    Option ``lr``: the fine-tuning's learning rate; None (the default) takes the target's, ``target_lr`` × ``lr_decay``
    when there were warm-up rounds, as the reference scripts fine-tune at their target lr (0.005 on Fashion-MNIST,
    where the FedGP paper's text gives 0.05; ``docs/reproduction.md`` § On the paper's data)."""

    name, label = "finetune_offline", "Finetune_Offline"
    options = {"epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs",
                                "fine-tuning epochs (None: as many as rounds)"),
               "optimizer_reset": Option("epoch", lambda v, n: check_choice(v, n, ("epoch", "once")),
                                         lambda v: "one optimiser run" if v == "once" else "fresh Adam per epoch",
                                         "'epoch': a fresh optimiser every fine-tuning epoch (the reference "
                                         "scripts); 'once': one optimiser run over all the epochs"),
               # added after results were stored: keyed=False keeps their keys (Option)
               "freeze": Option(False, _check_bool, lambda v: "last layer only", "True: fine-tune the last layer "
                                "only (the reference's --freeze)", keyed=False),
               "lr": Option(None, _check_optional_lr, lambda v: f"lr {v:g}", "the fine-tuning's learning rate (None: "
                            "the target's, × lr_decay after warm-up rounds)", keyed=False)}

    def after_training(self, run: Any) -> None:
        c = run.config
        epochs = c["rounds"] if self.epochs is None else self.epochs
        lr = c["target_lr"] * (c["lr_decay"] if c["warmup_rounds"] > 0 else 1.0) if self.lr is None else self.lr
        frozen = _all_but_classifier(run.model) if self.freeze else None
        before_step = None if frozen is None else (lambda: run.model.grad.masked_fill_(frozen, 0.0))
        for e in range(1, epochs + 1):
            reset = self.optimizer_reset == "epoch" or e == 1
            run.refresh_input_noise(c["rounds"] + e)  # a no-op without per-round input noise
            run.train_target(epochs=1, lr=lr, step=c["rounds"] + e, reset_optimizer=reset, who="target fine-tuning",
                             before_step=before_step)
            run.evaluate(c["rounds"] + e, "finetune", lr_source=0.0, lr_target=lr)


def _all_but_classifier(fm: Any) -> Tensor:
    """(m,) bool: True at the flat positions of every parameter but those of the module's ``classifier`` (its last
    layer). ValueError when the model has none."""
    mask = torch.ones(fm.m, dtype=torch.bool, device=fm.flat.device)
    mask[classifier_positions(fm, "Finetune_Offline's freeze=True")] = False
    return mask


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


