"""Fault injection for robustness drills: a Flower client *mod* that makes a node misbehave on purpose
(``docs/flower.md`` § Robustness).

A node's faults come from its node config, key ``fault`` (``flower-supernode --node-config
'partition-id=1 fault="nan@3"'``; in the simulation, :func:`fda_core.experiments.flower.simulation.run_flower_simulation`'s
``faults``): a comma-separated list of ``kind@rounds[:seconds]``, ``rounds`` a round number, ``a-b`` or
``*`` (every round). Kinds, applied to ``train`` messages only:

* ``nan`` — the reply's model holds NaN (a diverged or tampered update);
* ``shape`` — the reply's first parameter array has one row too many (a wrong model);
* ``crash`` — the ClientApp raises: Flower sends the server an error reply (a client that fails mid-round);
* ``sleep`` — the node answers ``seconds`` late (a slow client; past the round timeout it is dropped);
* ``exit`` — the ClientApp process ends without answering (a client that vanishes mid-round; deployment
  only: in the simulation it would take a Ray worker down).

Without a ``fault`` key the mod does nothing.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message

from .protocol import ARRAYS

__all__ = ["Fault", "parse_faults", "fault_mod", "FAULT_KINDS"]

FAULT_KINDS = ("nan", "shape", "crash", "sleep", "exit")


@dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` in :data:`FAULT_KINDS`, the rounds ``first``..``last`` (None: every round) and
    ``seconds`` (the delay of ``sleep``)."""

    kind: str
    first: int | None = None
    last: int | None = None
    seconds: float = 0.0

    def applies(self, server_round: int) -> bool:
        return self.first is None or self.first <= server_round <= self.last


def parse_faults(spec: str) -> list[Fault]:
    """Parse a node's ``fault`` setting (see the module docstring); ValueError naming the bad entry."""
    if not isinstance(spec, str):
        raise ValueError(f"fault must be a string such as 'nan@3' or 'sleep@2:30', got {spec!r}")
    out = []
    for entry in filter(None, (e.strip() for e in spec.split(","))):
        kind, _, when = entry.partition("@")
        when, _, secs = when.partition(":")
        if kind not in FAULT_KINDS or not when:
            raise ValueError(f"fault entry {entry!r}: write kind@rounds[:seconds], kind one of {list(FAULT_KINDS)}, "
                             "rounds a number, 'a-b' or '*'")
        try:
            if when == "*":
                first = last = None
            elif "-" in when:
                first, last = (int(v) for v in when.split("-", 1))
            else:
                first = last = int(when)
            seconds = float(secs) if secs else 0.0
        except ValueError:
            raise ValueError(f"fault entry {entry!r}: rounds must be a number, 'a-b' or '*', seconds a number") from None
        if kind == "sleep" and not seconds > 0:
            raise ValueError(f"fault entry {entry!r}: sleep needs seconds > 0, e.g. 'sleep@2:30'")
        out.append(Fault(kind, first, last, seconds))
    return out


def _corrupt(reply: Message, kind: str) -> Message:
    arrays: ArrayRecord = reply.content[ARRAYS]
    name = next(iter(arrays.keys()))
    a = arrays[name].numpy()
    if kind == "nan":
        a = a.copy()
        a.reshape(-1)[0] = np.nan
    else:  # shape: one row (along the first axis) too many
        a = np.concatenate([a, a[:1]]) if a.ndim else np.array([a, a])
    arrays[name] = Array(np.ascontiguousarray(a, dtype=np.float32))
    return reply


def fault_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower client mod applying the node's configured faults to its ``train`` replies."""
    spec = context.node_config.get("fault", "")
    if not spec or msg.metadata.message_type.split(".")[0] != "train":
        return call_next(msg, context)
    server_round = int(msg.content["config"].get("server-round", 0))
    faults = [f for f in parse_faults(str(spec)) if f.applies(server_round)]
    for f in faults:
        if f.kind == "crash":
            raise RuntimeError(f"injected fault 'crash' in round {server_round}")
        if f.kind == "exit":
            os._exit(17)  # no reply, no clean-up: the process is gone
        if f.kind == "sleep":
            time.sleep(f.seconds)
    reply = call_next(msg, context)
    for f in faults:
        if f.kind in ("nan", "shape") and reply.has_content():
            reply = _corrupt(reply, f.kind)
    return reply
