"""The weakly-supervised FDA paper's methods on the method interface: FedAvg Finetune and AuxInfo.

``docs/auxiliary.md`` § Methods. The paper's five rows (Table 2) are compositions of one client-side
objective and one server-side rule, all in the one registry (:mod:`fda_core.experiments.methods`):

=============================  ==========================================================================
paper                          registry
=============================  ==========================================================================
FedAvg                         ``source_only`` (FedAvg of the sources, no target training)
FedAvg Finetune                ``fedavg_finetune`` (Algorithm 1: FedAvg, then the target fine-tunes the
                               aggregate on its labelled samples, every round)
FedAvg Finetune AuxInfo        ``auxinfo`` (``base="fedavg_finetune"``): the same rounds, the sources
                               minimising ℓ_main + α Σ_k ℓ_aux,k (Algorithm 2, Eq. 3)
FedAvg Finetune GP             ``fedgp(projection='cosine')``: Algorithm 3, the per-layer cosine filter
                               with magnitude alignment and sample-count weights (Eq. 4–8)
FedAvg Finetune AuxInfo GP     ``auxinfo(base="fedgp(projection='cosine')")``
Oracle                         ``oracle``
=============================  ==========================================================================

**AuxInfo is a client-side objective, GP a server-side rule, so they compose:** ``auxinfo`` wraps any
registered method (option ``base``), changes only what its source clients minimise and leaves the round
plan, the server step and the target's objective (main task only, as the paper's fine-tuning) to the base
method. Options: ``alpha`` (α of Eq. 3, default 1), ``tasks`` (which auxiliary tasks, default all of the
dataset's: the paper's Fig. 4b ablation).

**β.** GP is FedGP, whose β weights the SOURCE part (``docs/theory.md`` § Conventions). The paper's Eq. 7
puts β on the target update, h ← h + (1 − β)·P_GP + β·G_T, so β_library = 1 − β_paper; at the paper's
β = 0.5 the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from torch import Tensor, nn

from ..common.checks import check_number
from ..data.auxiliary import AuxHeads, aux_info_loss, check_task_names
from .methods import (ClientInfo, Method, Option, RoundInfo, RoundPlan, RoundResults, ServerResult, get_method,
                      register_method)

__all__ = ["FedAvgFinetune", "AuxInfo", "PAPER_METHODS", "paper_method", "gp_beta"]


def _check_optional_epochs(value: Any, name: str) -> int | None:
    from ..common.checks import check_int

    return None if value is None else check_int(value, name, 1)


class FedAvgFinetune(Method):
    """FedAvg Finetune (weakly-supervised FDA paper Algorithm 1; ``docs/auxiliary.md`` § Methods): every round
    the sources train from the global model, the server averages them (FedAvg, sample-count weights), and the
    target fine-tunes the average on its labelled samples (``epochs`` per round, None: ``target_local_epochs``,
    at the round's target learning rate); the fine-tuned model is the new global model, sent to the sources.
    Warm-up rounds (``warmup_rounds``) are FedAvg only, as for every FDA method."""

    name, label = "fedavg_finetune", "FedAvg Finetune"
    options = {"epochs": Option(None, _check_optional_epochs, lambda v: f"{v} epochs/round",
                                "target fine-tuning epochs per round (None: target_local_epochs)")}

    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        return RoundPlan("warmup" if rnd.warmup else "fedavg_finetune", sources=True)

    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        if rnd.warmup:
            return
        epochs = self.epochs or rnd.config["target_local_epochs"]
        run.train_target(epochs=epochs, lr=rnd.lr_target, step=rnd.round, who=f"target fine-tuning, round {rnd.round}")


def _check_base(value: Any, name: str) -> str:
    """A method spec (name, spec string or ``{name: {options}}``) → its canonical spec string."""
    try:
        method = get_method(value)
    except ValueError as exc:
        raise ValueError(f"{name} must be a registered method spec, e.g. 'fedavg_finetune' or "
                         f"{{'fedgp': {{'projection': 'cosine'}}}}: {exc}") from None
    if isinstance(method, AuxInfo):
        raise ValueError(f"{name} must be a method without AuxInfo (AuxInfo of AuxInfo is AuxInfo), got {value!r}")
    if not method.needs_sources:
        raise ValueError(f"{name} must be a method whose source clients train (AuxInfo changes their objective); "
                         f"{method.display_label!r} trains no source")
    if type(method).local_loss is not Method.local_loss:
        raise ValueError(f"{name}: {method.display_label!r} has its own client objective; AuxInfo composes with "
                         "methods whose clients minimise the cross-entropy")
    return method.spec


def _check_tasks(value: Any, name: str) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Sequence) or not value or \
            not all(isinstance(v, str) and v for v in value) or len(set(value)) != len(value):
        raise ValueError(f"{name} must be None (every auxiliary task of the dataset) or a non-empty list of "
                         f"distinct task names, got {value!r}")
    return list(value)


class AuxInfo(Method):
    """AuxInfo around a base method (``docs/auxiliary.md`` § Methods; paper § 3, Algorithm 2): the source
    clients minimise L = ℓ_main + α · Σ_k ℓ_aux,k (Eq. 3) with one head per auxiliary task on the shared
    trunk; the target and the server do what the base method does (the target's objective stays the main
    task's cross-entropy): every hook but the sources' objective is the base's (set-up, round plan, server
    step, personal scores, after the rounds), so a personalisation or unsupervised base composes too.
    Needs a dataset with auxiliary labels (:class:`fda_core.data.auxiliary.AuxDataset`).
    With ``alpha=0`` the run equals the base method's exactly (tested)."""

    name, label = "auxinfo", "AuxInfo"
    options = {
        "base": Option("fedavg_finetune", _check_base, None,
                       "the method whose source clients get the auxiliary tasks (a registered spec)"),
        "alpha": Option(1.0, lambda v, n: check_number(v, n, 0.0), lambda v: f"α={v:g}",
                        "weight α of the auxiliary losses (paper Eq. 3) ≥ 0"),
        "tasks": Option(None, _check_tasks, lambda v: "aux: " + "+".join(v),
                        "the auxiliary tasks used (None: all of the dataset's)"),
    }
    uses_aux_labels = True

    def validate(self) -> None:
        self.inner = get_method(self.base)
        self.needs_sources = self.inner.needs_sources
        self.estimates_beta = self.inner.estimates_beta
        self._select: tuple[Any, tuple[int, ...]] | None = None

    @property
    def display_label(self) -> str:
        shown = [self.options[k].show(v) for k, v in self.changed_options.items()
                 if k != "base" and self.options[k].show]
        return f"{self.inner.display_label} + AuxInfo" + (f" ({', '.join(shown)})" if shown else "")

    # -- client side ------------------------------------------------------------------------------
    def configure_round(self, rnd: RoundInfo) -> RoundPlan:
        return self.inner.configure_round(rnd)

    def local_loss(self, model: nn.Module, x: Tensor, y: Tensor, client: ClientInfo) -> Tensor:
        if client.kind != "source":
            return self.inner.local_loss(model, x, y, client)
        if not isinstance(model, AuxHeads):
            raise ValueError("AuxInfo needs the model's auxiliary heads: run it on a dataset with auxiliary labels")
        if self._select is None or self._select[0] is not model:
            self._select = (model, check_task_names(self.tasks, model.tasks, "tasks"))
        return aux_info_loss(model, x, y[:, 0].long(), y[:, 1:], self.alpha, self._select[1])

    # -- set-up, server side, personal scores and after the rounds: the base method's -------------
    def setup(self, run: Any) -> None:
        self.inner.setup(run)

    def target_scores(self, run: Any) -> Mapping[str, float] | None:
        return self.inner.target_scores(run)

    def aggregate(self, rnd: RoundInfo, res: RoundResults, theta: Tensor) -> ServerResult:
        return self.inner.aggregate(rnd, res, theta)

    def after_round(self, rnd: RoundInfo, run: Any) -> None:
        self.inner.after_round(rnd, run)

    def after_training(self, run: Any) -> None:
        self.inner.after_training(run)


register_method(FedAvgFinetune)
register_method(AuxInfo)


def gp_beta(beta_paper: float) -> float:
    """The library's β (weight of the source part) of the paper's β of Eq. 7 (weight of the target update):
    β_library = 1 − β_paper (``docs/auxiliary.md`` § Methods)."""
    return 1.0 - check_number(beta_paper, "beta_paper", 0.0, 1.0)


#: The paper's Table-2 rows (its names) and the registry specs that run them, with the GP rule at the
#: library's β = 0.5 (= the paper's β = 0.5).
PAPER_METHODS: dict[str, dict[str, dict[str, Any]]] = {
    "FedAvg": {"source_only": {}},
    "FedAvg Finetune": {"fedavg_finetune": {}},
    "FedAvg Finetune AuxInfo": {"auxinfo": {"base": "fedavg_finetune"}},
    "FedAvg Finetune GP": {"fedgp": {"projection": "cosine"}},
    "FedAvg Finetune AuxInfo GP": {"auxinfo": {"base": "fedgp(projection='cosine')"}},
    "Oracle": {"oracle": {}},
}


def paper_method(row: str, *, beta_paper: float | None = None, alpha: float | None = None,
                 tasks: Sequence[str] | None = None) -> dict[str, dict[str, Any]]:
    """The registry spec ``{name: {options}}`` of the paper's row ``row`` (:data:`PAPER_METHODS`), with the
    GP rule's β given in the paper's convention (``beta_paper``, converted by :func:`gp_beta`) and AuxInfo's
    ``alpha`` / ``tasks`` where the row has them. ValueError names a row or an option the row lacks."""
    if row not in PAPER_METHODS:
        raise ValueError(f"row must be one of {list(PAPER_METHODS)}, got {row!r}")
    (name, opts), = PAPER_METHODS[row].items()
    opts = dict(opts)
    if beta_paper is not None:
        if "GP" not in row.split():
            raise ValueError(f"beta_paper applies to the GP rows, not {row!r}")
        gp = {"projection": "cosine", "beta": gp_beta(beta_paper)}
        if name == "auxinfo":
            opts["base"] = get_method({"fedgp": gp}).spec
        else:
            opts.update(gp)
    for key, value in (("alpha", alpha), ("tasks", tasks)):
        if value is not None:
            if name != "auxinfo":
                raise ValueError(f"{key} applies to the AuxInfo rows, not {row!r}")
            opts[key] = list(value) if key == "tasks" else value
    return {name: opts}

