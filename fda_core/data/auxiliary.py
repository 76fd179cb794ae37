"""Auxiliary tasks: datasets that carry auxiliary labels, heads on any ``fda_core`` model, the α-weighted loss.

The weakly-supervised FDA paper (``docs/auxiliary.md`` § Auxiliary tasks; paper § 3, Eq. 1–3, App. A.1
Fig. 5) trains the source clients on the main task plus K cheap auxiliary tasks (sex, age, race; here also
image attributes such as stroke thickness) with one extra output layer ("branch") per task on the shared
trunk h^{l−1}. This module holds the three pieces the federated loop needs:

* :class:`AuxTask` — the description of one auxiliary task (name, ``"classification"`` with its number of
  classes, or ``"regression"``);
* :class:`AuxDataset` — an :class:`~fda_core.data.datasets.FDADataset` whose environments also carry
  auxiliary labels. **Form:** ``ds[i]`` returns the triple ``(x, y, aux)`` — ``x (n_i, *input_shape)``
  float32, ``y (n_i,)`` int64 (the main task), ``aux (n_i, K)`` float32 whose column k is the label of task
  ``ds.aux_tasks[k]``: the class index (0 … C_k − 1, stored as a float) for a classification task, the value
  for a regression task, NaN where the label is missing (such entries are left out of that task's loss).
  ``ds.datasets`` keeps the ``(x, y)`` pairs of every other dataset, so generic code (sizes, splits) is
  unchanged; ``ds.aux_labels[i]`` is the aux tensor of environment i.
* :class:`AuxHeads` — any model of :mod:`fda_core.data.models` (each has ``features(x)``, ``classifier`` and
  ``n_outputs``) with one ``nn.Linear(n_outputs, out_k)`` head per auxiliary task on the shared features.
  ``forward(x)`` is the base model's main-task logits (so accuracy, the target's fine-tuning and every
  method that knows nothing of auxiliary tasks see the plain model); :meth:`AuxHeads.forward_all` gives the
  main logits and every head's output from one pass through the trunk.

The loss (:func:`aux_info_loss`): L = ℓ_main + α · Σ_k ℓ_aux,k (paper Eq. 3), each term the *mean* over the
mini-batch (the paper writes sums over the n samples; with Adam, which is invariant to a constant factor
of the loss, and a fixed batch size the two differ only in how α trades the terms, see
``docs/auxiliary.md`` § Auxiliary tasks). Cross-entropy for classification tasks, mean squared error for
regression tasks.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number
from .datasets import FDADataset

__all__ = ["AuxTask", "AuxDataset", "AuxHeads", "task_losses", "aux_info_loss", "check_task_names", "TASK_KINDS"]

#: The kinds of auxiliary task a head can learn.
TASK_KINDS = ("classification", "regression")


@dataclass(frozen=True)
class AuxTask:
    """One auxiliary task: ``name``; ``kind`` ``"classification"`` (``num_classes`` ≥ 2 classes, labels
    0 … num_classes − 1) or ``"regression"`` (``num_classes`` 0, a real value per sample)."""

    name: str
    kind: str = "classification"
    num_classes: int = 2

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"an auxiliary task's name must be a non-empty string, got {self.name!r}")
        check_choice(self.kind, "kind", TASK_KINDS)
        if self.kind == "classification":
            check_int(self.num_classes, f"num_classes of auxiliary task {self.name!r}", 2)
        elif self.num_classes != 0:
            raise ValueError(f"num_classes of the regression task {self.name!r} must be 0, got {self.num_classes!r}")

    @property
    def out_features(self) -> int:
        """Width of the task's head: the number of classes, or 1 for regression."""
        return self.num_classes if self.kind == "classification" else 1


def check_task_names(names: Sequence[str] | None, tasks: Sequence[AuxTask], what: str = "tasks") -> tuple[int, ...]:
    """Indices (into ``tasks``) of the task ``names`` (None: all), in the order of ``tasks``. ValueError names
    ``what`` and lists the dataset's tasks when a name is unknown, repeated or the list is empty."""
    known = [t.name for t in tasks]
    if names is None:
        return tuple(range(len(tasks)))
    if isinstance(names, str) or not isinstance(names, Sequence) or not names:
        raise ValueError(f"{what} must be None (all) or a non-empty list of auxiliary task names among {known}, "
                         f"got {names!r}")
    bad = [n for n in names if n not in known]
    if bad or len(set(names)) != len(names):
        raise ValueError(f"{what} must name distinct auxiliary tasks of the dataset, among {known}; got {list(names)!r}")
    return tuple(i for i, n in enumerate(known) if n in names)


class AuxDataset(FDADataset):
    """An FDA dataset whose environments carry auxiliary labels (module docstring: the form of ``ds[i]``).

    Subclasses fill ``datasets`` (pairs ``(x, y)``), ``aux_labels`` (one ``(n_i, K)`` float32 tensor per
    environment) and ``aux_tasks``. ``metrics``: the target metrics the federated loop records each round
    (accuracy and, for these datasets, AUC, as the paper reports)."""

    aux_tasks: tuple[AuxTask, ...] = ()
    metrics: tuple[str, ...] = ("acc", "auc")

    def __init__(self) -> None:
        super().__init__()
        self.aux_labels: list[Tensor] = []

    def __getitem__(self, i: int | str) -> tuple[Tensor, Tensor, Tensor]:
        j = self.env_index(i)
        x, y = self.datasets[j]
        return x, y, self.aux_labels[j]

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor, Tensor]]:
        return iter([(x, y, a) for (x, y), a in zip(self.datasets, self.aux_labels)])

    @property
    def aux_names(self) -> list[str]:
        return [t.name for t in self.aux_tasks]

    def check(self) -> None:
        """Check the layout (one aux tensor per environment, K columns, valid class indices); ValueError."""
        if len(self.aux_labels) != len(self.datasets):
            raise ValueError(f"{self.name}: {len(self.aux_labels)} aux label tensors for {len(self.datasets)} environments")
        for env, (x, y), aux in zip(self.ENVIRONMENTS, self.datasets, self.aux_labels):
            if aux.shape != (y.shape[0], len(self.aux_tasks)) or aux.dtype != torch.float32:
                raise ValueError(f"{self.name}: aux labels of {env!r} must be float32 of shape ({y.shape[0]}, "
                                 f"{len(self.aux_tasks)}), got {aux.dtype} {tuple(aux.shape)}")
            for k, t in enumerate(self.aux_tasks):
                col = aux[:, k][~torch.isnan(aux[:, k])]
                if t.kind == "classification" and len(col) and (
                        bool((col != col.round()).any()) or col.min() < 0 or col.max() >= t.num_classes):
                    raise ValueError(f"{self.name}: aux task {t.name!r} of {env!r} has labels outside 0..{t.num_classes - 1}")

    def aux_summary(self) -> str:
        """One line per task: kind, classes and the share of each class (or mean ± sd) per environment."""
        lines = []
        for k, t in enumerate(self.aux_tasks):
            per_env = []
            for env, aux in zip(self.ENVIRONMENTS, self.aux_labels):
                col = aux[:, k][~torch.isnan(aux[:, k])]
                if t.kind == "classification":
                    share = torch.bincount(col.long(), minlength=t.num_classes).float() / max(len(col), 1)
                    per_env.append(f"{env}: " + "/".join(f"{100 * s:.0f}" for s in share.tolist()) + "%")
                else:
                    per_env.append(f"{env}: {col.mean():.2f} ± {col.std():.2f}")
            kind = f"{t.num_classes} classes" if t.kind == "classification" else "regression"
            lines.append(f"{t.name} ({kind}): " + "; ".join(per_env))
        return "\n".join(lines)


class AuxHeads(nn.Module):
    """A model with auxiliary heads: ``base`` (any model with ``features``, ``classifier``, ``n_outputs``)
    and one ``nn.Linear(base.n_outputs, task.out_features)`` per task on the shared features (paper App.
    A.1, Fig. 5: "we add extra branches to the model").

    ``forward(x)`` → the base's main-task logits ``(n, C)``; :meth:`forward_all` → ``(main (n, C), [out_k
    (n, out_k)])``. The heads are initialised as ``nn.Linear`` does, from ``seed`` when given (under
    ``torch.random.fork_rng``: the global stream and the base model's parameters are untouched). Parameters
    are the base's (names prefixed ``base.``) followed by the heads' (``heads.k.weight``, ``heads.k.bias``).
    """

    def __init__(self, base: nn.Module, tasks: Sequence[AuxTask], seed: int | None = None) -> None:
        super().__init__()
        for attr in ("features", "classifier", "n_outputs"):
            if not hasattr(base, attr):
                raise ValueError(f"base must be a model with features(x), classifier and n_outputs (every model of "
                                 f"fda_core.data.models); {type(base).__name__} has no {attr!r}")
        tasks = tuple(tasks)
        if not tasks or not all(isinstance(t, AuxTask) for t in tasks):
            raise ValueError(f"tasks must be a non-empty sequence of AuxTask, got {tasks!r}")
        if len({t.name for t in tasks}) != len(tasks):
            raise ValueError(f"auxiliary task names must be distinct, got {[t.name for t in tasks]}")
        self.base = base
        self.tasks = tasks
        self.n_outputs = int(base.n_outputs)

        def build() -> nn.ModuleList:
            return nn.ModuleList(nn.Linear(self.n_outputs, t.out_features) for t in tasks)

        if seed is None:
            self.heads = build()
        else:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(seed)
                self.heads = build()

    @property
    def classifier(self) -> nn.Module:
        return self.base.classifier

    def features(self, x: Tensor) -> Tensor:
        """The shared trunk h^{l−1}: ``(n, *input_shape)`` → ``(n, n_outputs)``."""
        return self.base.features(x)

    def forward(self, x: Tensor) -> Tensor:
        """Main-task logits (n, C), exactly the base model's output."""
        return self.base(x)

    def forward_all(self, x: Tensor) -> tuple[Tensor, list[Tensor]]:
        """Main logits (n, C) and each head's output (n, out_k), from one pass through the trunk."""
        f = self.base.features(x)
        return self.base.classifier(f), [h(f) for h in self.heads]


def task_losses(outputs: Sequence[Tensor], aux: Tensor, tasks: Sequence[AuxTask],
                select: Sequence[int] | None = None) -> list[Tensor]:
    """The loss of each selected auxiliary task on one mini-batch (``docs/auxiliary.md`` § Auxiliary tasks):
    mean cross-entropy (classification) or mean squared error (regression) over the samples whose label is
    not NaN; 0 when a task has no labelled sample in the batch. ``outputs[k]`` (n, out_k), ``aux`` (n, K)."""
    if aux.ndim != 2 or aux.shape[1] != len(tasks) or len(outputs) != len(tasks):
        raise ValueError(f"aux must have shape (n, {len(tasks)}) with one output per task; got aux "
                         f"{tuple(aux.shape)} and {len(outputs)} outputs")
    idx = range(len(tasks)) if select is None else select
    losses = []
    for k in idx:
        t, out, lab = tasks[k], outputs[k], aux[:, k]
        keep = ~torch.isnan(lab)
        if not bool(keep.any()):
            losses.append(out.sum() * 0.0)
            continue
        if t.kind == "classification":
            losses.append(F.cross_entropy(out[keep], lab[keep].long()))
        else:
            losses.append(F.mse_loss(out[keep, 0], lab[keep]))
    return losses


def aux_info_loss(model: AuxHeads, x: Tensor, y: Tensor, aux: Tensor, alpha: float,
                  select: Sequence[int] | None = None) -> Tensor:
    """L_aux-info = ℓ_main + α · Σ_k ℓ_aux,k on one mini-batch (paper Eq. 3, with means over the batch;
    ``docs/auxiliary.md`` § Auxiliary tasks). ``y`` (n,) main labels, ``aux`` (n, K), ``select`` the indices
    of the tasks that enter (None: all). With α = 0 the gradient is exactly that of ℓ_main (the auxiliary
    terms are multiplied by 0, never dropped, so the same operations run)."""
    if not isinstance(model, AuxHeads):
        raise ValueError(f"model must be an AuxHeads model (the dataset's auxiliary heads), got {type(model).__name__}")
    alpha = check_number(alpha, "alpha", 0.0)
    main, outs = model.forward_all(x)
    loss = F.cross_entropy(main, y)
    aux_terms = task_losses(outs, aux, model.tasks, select)
    if aux_terms:
        loss = loss + alpha * torch.stack(aux_terms).sum()
    return loss
