"""Runs of one sweep that begin with the same FedAvg rounds compute those rounds once
(``docs/architecture.md`` § Shared FedAvg rounds).

Source only is FedAvg of the sources in every round, Finetune_Offline the same before its fine-tuning, and every
FDA method (FedDA, FedGP, their auto-weighted forms, Target only after the warm-up) starts with ``warmup_rounds``
FedAvg rounds. In the engine (:mod:`fda_core.experiments.federated`) such a round depends on the config and the
global model only, never on the method: each client starts from the global model with a fresh optimiser, its
mini-batch stream is named by (seed, round, role, client), the target's input noise by (seed, round), and the
server takes the sample-weighted average. So runs of one sweep whose configs differ only in the method share
these rounds exactly. Within :func:`sharing` (which :func:`~fda_core.experiments.federated.run_many` enters), the
first such run leaves a :class:`Snapshot` after them — the global parameters, the BatchNorm statistics, the
evaluations so far and torch's global random states (CPU, and CUDA's once in use) — and the others start from it. Their results are the same
bits as when every round is computed (``tests/test_federated.py``); only their ``seconds`` are shorter, and the
result's ``shared_rounds`` says how many rounds came from another run.

A method shares what :meth:`~fda_core.experiments.methods.Method.fedavg_rounds` declares (0 by default for any
method that changes the round or the server step), and nothing when it changes the clients' objective, trains
on auxiliary labels, keeps state across rounds (``setup``, ``after_round``) or reports other scores than the
global model's (``target_scores``): :func:`shareable_rounds`.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from .methods import Method

__all__ = ["Snapshot", "sharing", "shareable_rounds", "resume", "offer", "MAX_SNAPSHOTS"]

#: snapshots kept at once (least recently used dropped first): enough for a sweep's targets × seeds, each with a
#: warm-up snapshot and an end-of-rounds one, in the order :func:`~fda_core.experiments.federated.sweep_configs`
#: lists its runs (per target: every method's seeds in turn)
MAX_SNAPSHOTS = 64

#: the hooks whose default a method must keep for its FedAvg rounds to be shared
_HOOKS = ("setup", "after_round", "target_scores", "local_loss")


@dataclass
class Snapshot:
    """The state of a run after its first ``rounds`` rounds, all of them FedAvg rounds: ``theta`` (m,) the global
    parameters, ``buffers`` the global BatchNorm statistics, ``history`` the evaluations so far (their ``phase`` is
    relabelled for each run that starts from it), ``rng_state`` torch's global CPU random state, ``cuda_rng_states``
    those of the CUDA devices (None when CUDA was not in use), and ``dataset`` the data set object the run was given
    (None: built from the config)."""

    rounds: int
    theta: Tensor
    buffers: dict[str, Tensor]
    history: list[dict[str, Any]]
    rng_state: Tensor
    cuda_rng_states: list[Tensor] | None
    dataset: Any


class _Snapshots:
    def __init__(self, max_snapshots: int = MAX_SNAPSHOTS) -> None:
        self.max_snapshots = max_snapshots
        self.items: OrderedDict[str, Snapshot] = OrderedDict()

    def get(self, key: str) -> Snapshot | None:
        snap = self.items.get(key)
        if snap is not None:
            self.items.move_to_end(key)
        return snap

    def put(self, key: str, snap: Snapshot) -> None:
        self.items[key] = snap
        self.items.move_to_end(key)
        while len(self.items) > self.max_snapshots:
            self.items.popitem(last=False)


_ACTIVE: list[_Snapshots | None] = []  # one entry per open sharing() block (None: turned off)


@contextlib.contextmanager
def sharing(enabled: bool = True) -> Iterator[None]:
    """Within this block, runs of :func:`~fda_core.experiments.federated.run_experiment` in this process share their
    common FedAvg rounds (the module's docstring); ``enabled=False`` turns sharing off inside the block (to compare).
    A nested block uses the snapshots of the outermost one that shares; they are dropped when the block that made them
    ends."""
    if not isinstance(enabled, bool):
        raise ValueError(f"enabled must be True or False, got {enabled!r}")
    outer = next((s for s in _ACTIVE if s is not None), None)
    _ACTIVE.append((outer or _Snapshots()) if enabled else None)
    try:
        yield
    finally:
        _ACTIVE.pop()


def _store() -> _Snapshots | None:
    return _ACTIVE[-1] if _ACTIVE else None


def shareable_rounds(method: Method, config: Mapping[str, Any]) -> int:
    """How many leading rounds of a run of ``method`` under the resolved ``config`` are plain FedAvg rounds that any
    other run of the same config computes alike: :meth:`~fda_core.experiments.methods.Method.fedavg_rounds`, or 0
    when the method overrides any of ``setup``, ``after_round``, ``target_scores`` or ``local_loss``, or trains on
    auxiliary labels."""
    cls = type(method)
    if getattr(cls, "uses_aux_labels", False) or any(getattr(cls, h) is not getattr(Method, h) for h in _HOOKS):
        return 0
    return max(0, min(int(method.fedavg_rounds(config)), int(config["rounds"])))


def _key(config: Mapping[str, Any], rounds: int, dataset: Any) -> str:
    """Everything a FedAvg round depends on: the config without the method, the rounds done, the data set object a
    run was given (None: the config's), torch's threads (they move the last bits of CPU kernels)."""
    rest = {k: v for k, v in config.items() if k not in ("rule", "method_options")}
    return json.dumps({"config": rest, "rounds": rounds, "threads": torch.get_num_threads(),
                       "dataset": None if dataset is None else id(dataset)}, sort_keys=True, default=repr)


def resume(run: Any, dataset: Any = None) -> int:
    """Start ``run`` (a fresh :class:`~fda_core.experiments.federated.Run`) from the latest snapshot of its config
    that its method's shareable rounds cover, when :func:`sharing` is on and one exists: its global parameters,
    BatchNorm statistics, evaluations (labelled with this method's phases) and torch's global random states become
    the snapshot's. Returns the number of rounds taken from it (0: none; the run computes every round).
    ``dataset``: the data set object the run was given (a snapshot is used only with the same object)."""
    store = _store()
    if store is None:
        return 0
    prefix = shareable_rounds(run.method, run.config)
    for k in sorted(_offered_rounds(run.config, prefix), reverse=True):
        snap = store.get(_key(run.config, k, dataset))
        if snap is None or snap.dataset is not dataset:  # (an id can be reused once an object is gone)
            continue
        run.theta.copy_(snap.theta)
        run.buffers = {name: v.clone() for name, v in snap.buffers.items()}
        run.history = [{**copy.deepcopy(h), "phase": run.method.configure_round(run.round_info(h["round"])).phase}
                       for h in snap.history]
        torch.set_rng_state(snap.rng_state)
        if snap.cuda_rng_states is not None:
            torch.cuda.set_rng_state_all(snap.cuda_rng_states)
        return k
    return 0


def _offered_rounds(config: Mapping[str, Any], prefix: int) -> set[int]:
    """The rounds after which a run with ``prefix`` shareable rounds leaves a snapshot: the end of the warm-up (what
    every FDA method shares) and the end of its own FedAvg rounds (all of them for Source only and Finetune_Offline)."""
    return {k for k in (int(config["warmup_rounds"]), prefix) if 0 < k <= prefix}


def offer(run: Any, rounds_done: int, dataset: Any = None) -> None:
    """After round ``rounds_done`` of ``run``: keep a snapshot when :func:`sharing` is on and the round ends a
    shareable stretch other runs can use (:func:`_offered_rounds`)."""
    store = _store()
    if store is None or rounds_done not in _offered_rounds(run.config, shareable_rounds(run.method, run.config)):
        return
    store.put(_key(run.config, rounds_done, dataset),
              Snapshot(rounds=rounds_done, theta=run.theta.detach().clone(),
                       buffers={name: v.detach().clone() for name, v in run.buffers.items()},
                       history=copy.deepcopy(run.history), rng_state=torch.get_rng_state(),
                       cuda_rng_states=torch.cuda.get_rng_state_all() if torch.cuda.is_initialized() else None,
                       dataset=dataset))
