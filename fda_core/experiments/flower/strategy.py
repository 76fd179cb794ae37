"""Flower strategies for the workbook's methods (message API, ``flwr.serverapp.strategy.Strategy``;
``docs/flower.md`` § Flower apps, § Robustness).

:class:`FDAStrategy` runs any registered method of :mod:`fda_core.experiments.methods` whose server step
is :meth:`~fda_core.experiments.methods.Method.aggregate` (every method of the papers' tables except the
fine-tuning ones, whose ``after_round`` / ``after_training`` steps train on the target inside the
engine): each round it asks the method for its plan (``configure_round``), sends the global model and the
plan's instructions to the nodes (``configure_train``), turns the replies into the engine's
:class:`~fda_core.experiments.methods.RoundResults` (the source updates g_i = h_i − h, the target's update,
parameters and per-batch parts, step counts, sample weights, BatchNorm statistics) and lets the method
update the global model (``aggregate_train``); the target node evaluates (``configure_evaluate``). The
strategy keeps the global model θ between ``configure_train`` and ``aggregate_train``; one node, the one
holding the target environment, is the target client; magnitude alignment (FedGP paper App. B.2 Eq. B.2)
and the auto-β estimates (auto-weighted FDA paper § 4.2) are the method's own, the very code the
in-process engine runs; β per source per round is returned as metrics (``beta/<environment>``).

A reply that is an error, arrives after the round's timeout, or holds a model or parts of the wrong
names, shapes or dtype, or NaN/inf, is dropped and logged (:attr:`FDAStrategy.events`) before anything of
it enters a rule or an estimator; the round completes with the others (FedAvg weights renormalised over
the sources that answered). Without the target's reply an FDA round leaves the global model unchanged.

Named strategies (one per method of the papers): :class:`FedAvgStrategy` (source only),
:class:`FedDAStrategy`, :class:`FedGPStrategy` (``projection="exact"`` or ``"cosine"``),
:class:`FedDAAutoStrategy`, :class:`FedGPAutoStrategy`.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from ...common.devices import resolve_device
from ..federated import make_config
from ..methods import Method, RoundInfo, RoundPlan, RoundResults, get_method
from .protocol import ARRAYS, CONFIG, EXPERIMENT, METRICS, PARTS, SOURCE, TARGET, TrainInstruction, \
    experiment_to_json
from .records import BadUpdate, Layout, message_bytes, model_from_record, model_to_record, parts_from_record, \
    payload_bytes

__all__ = ["FDAStrategy", "FedAvgStrategy", "FedDAStrategy", "FedGPStrategy", "FedDAAutoStrategy",
           "FedGPAutoStrategy", "STRATEGIES", "strategy_for", "Node", "check_flower_method"]

log = logging.getLogger("fda_core.flower")


def check_flower_method(method: Method) -> None:
    """ValueError unless ``method``'s server step is ``aggregate`` alone: no ``setup``, ``after_round``,
    ``after_training`` or ``target_scores`` hook, which work on the in-process engine's ``Run`` (fine-tuning
    on the target, personal models)."""
    cls = type(method)
    hooks = ("setup", "after_round", "after_training", "target_scores")
    extra = [h for h in hooks if hasattr(Method, h) and getattr(cls, h) is not getattr(Method, h)]
    if extra:
        raise ValueError(f"rule {method.name!r} has a {' and '.join(extra)} step that needs the in-process engine's "
                         "Run; on Flower, rule must be a method whose server step is aggregate alone, e.g. "
                         "'source_only', 'fedda', 'fedgp', 'fedda_auto', 'fedgp_auto', 'target_only' or 'oracle'")


@dataclass(frozen=True)
class Node:
    """A node of the federation: its Flower ``node_id``, ``partition`` (environment index), environment
    name ``env``, ``role`` (source / target), ``index`` (source index; 0 for the target) and ``n`` (its
    examples: a source's train set, the target's labelled samples)."""

    node_id: int
    partition: int
    env: str
    role: str
    index: int
    n: int


class FDAStrategy(Strategy):
    """A Flower strategy around a workbook method (see the module docstring).

    Args:
        config: the experiment config, keys of :data:`fda_core.experiments.federated.DEFAULT_CONFIG`
            (resolved with :func:`~fda_core.experiments.federated.make_config`: ValueError names a bad key).
        discovery_timeout: seconds to wait for every environment's node to answer the first query.
        **method_options: options of the method (e.g. ``beta=1.0``, ``projection="cosine"``), over
            ``config["method_options"]``.

    After a run: :attr:`history` (the engine's per-round records), :attr:`events` (dropped replies and
    skipped rounds), :attr:`traffic` (bytes of every message, per round and node), :meth:`result`.
    """

    method_name: ClassVar[str | None] = None

    def __init__(self, config: Mapping[str, Any] | None = None, *, discovery_timeout: float = 120.0,
                 **method_options: Any) -> None:
        cfg = dict(config or {})
        if self.method_name is not None:
            if cfg.get("rule", self.method_name) != self.method_name:
                raise ValueError(f"{type(self).__name__} runs rule {self.method_name!r}, got rule={cfg['rule']!r}")
            cfg["rule"] = self.method_name
        cfg["method_options"] = {**dict(cfg.get("method_options") or {}), **method_options}
        self.config = make_config(**cfg)
        self.method = get_method(self.config["rule"], **self.config["method_options"])
        check_flower_method(self.method)
        if not (isinstance(discovery_timeout, (int, float)) and discovery_timeout > 0):
            raise ValueError(f"discovery_timeout must be a positive number of seconds, got {discovery_timeout!r}")
        self.discovery_timeout = float(discovery_timeout)
        self._experiment = experiment_to_json(self.config)
        self.nodes: dict[int, Node] = {}
        self.num_partitions: int | None = None
        self.target_partition: int | None = None
        self.layout: Layout | None = None
        self._initial: ArrayRecord | None = None
        self._ignored: set[int] = set()
        self.theta: torch.Tensor | None = None
        self.buffers: dict[str, torch.Tensor] = {}
        self.history: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.traffic: list[dict[str, Any]] = []
        self._round: dict[str, Any] = {}
        self._eval: dict[str, Any] = {}
        self._n_test: int | None = None
        self._start = time.perf_counter()

    # -- bookkeeping -------------------------------------------------------------------------------
    def _event(self, rnd: int, what: str, node: Node | int | None = None, reason: str = "") -> None:
        n = node if isinstance(node, Node) else self.nodes.get(node) if node is not None else None
        entry = {"round": rnd, "event": what, "partition": n.partition if n else None, "env": n.env if n else None,
                 "node_id": n.node_id if n else node, "reason": reason}
        self.events.append(entry)
        log.warning("round %s: %s%s%s", rnd, what, f" ({n.env!r}, node {n.node_id})" if n else
                    (f" (node {node})" if node is not None else ""), f": {reason}" if reason else "")

    def _count(self, rnd: int, kind: str, direction: str, msg: Message, node_id: int) -> None:
        n = self.nodes.get(node_id)
        self.traffic.append({"round": rnd, "kind": kind, "direction": direction, "node_id": node_id,
                             "partition": n.partition if n else None, "env": n.env if n else None,
                             "role": n.role if n else None, "bytes": message_bytes(msg),
                             "content_bytes": message_bytes(msg, envelope=False),
                             "payload_bytes": payload_bytes(msg), "time": time.perf_counter() - self._start})

    def _message(self, content: dict[str, Any], node_id: int, kind: str, rnd: int) -> Message:
        msg = Message(RecordDict(content), dst_node_id=node_id, message_type=kind)
        self._count(rnd, kind, "down", msg, node_id)
        return msg

    # -- discovery: which node holds which environment --------------------------------------------
    def discover(self, grid: Grid, timeout: float | None = None, *, rnd: int = 0) -> None:
        """Ask every node not yet known which environment it holds (``query`` messages), until every
        environment has its node or ``timeout`` (default ``discovery_timeout``) runs out. RuntimeError
        when, by then, no node holds the target or a method that needs sources has none."""
        deadline = time.monotonic() + (self.discovery_timeout if timeout is None else timeout)
        while True:
            new = [i for i in grid.get_node_ids() if i not in self.nodes and i not in self._ignored]
            if new:
                msgs = [self._message({CONFIG: ConfigRecord({EXPERIMENT: self._experiment})}, i, MessageType.QUERY, rnd)
                        for i in new]
                for reply in grid.send_and_receive(msgs, timeout=max(1.0, deadline - time.monotonic())):
                    self._register(reply, rnd)
            if self.num_partitions is not None and len(self._by_partition()) == self.num_partitions:
                break
            if time.monotonic() >= deadline:
                break
            time.sleep(0.5)
        have = self._by_partition()
        if self.target_partition is None or self.target_partition not in have:
            raise RuntimeError(f"no node holding the target environment answered within the discovery timeout; "
                               f"nodes known: {sorted(n.env for n in self.nodes.values())}")
        if self.method.needs_sources and not any(n.role == SOURCE for n in self.nodes.values()):
            raise RuntimeError(f"rule {self.method.name!r} needs source nodes, but none answered")
        if len(have) < (self.num_partitions or 0):
            self._event(rnd, "environments without a node", reason=f"{self.num_partitions - len(have)} of "
                        f"{self.num_partitions} environments have no node; running with the others")

    def _by_partition(self) -> dict[int, Node]:
        return {n.partition: n for n in self.nodes.values()}

    def _register(self, reply: Message, rnd: int) -> None:
        nid = reply.metadata.src_node_id
        try:
            self._register_reply(reply, rnd, nid)
        finally:
            self._count(rnd, MessageType.QUERY, "up", reply, nid)  # after: the node is known

    def _register_reply(self, reply: Message, rnd: int, nid: int) -> None:
        if reply.has_error():
            self._ignored.add(nid)
            self._event(rnd, "node ignored", nid, f"query failed: {reply.error.reason}")
            return
        try:
            m, cfg = reply.content[METRICS], reply.content[CONFIG]
            p, k, t, n = (int(m[key]) for key in ("partition-id", "num-partitions", "target-index", "num-examples"))
            if self.num_partitions is None:
                self.num_partitions, self.target_partition = k, t
            elif (k, t) != (self.num_partitions, self.target_partition):
                raise BadUpdate(f"it reports {k} environments and target {t}, the others {self.num_partitions} and "
                                f"{self.target_partition} (a different experiment config?)")
            if p in self._by_partition():
                old = self._by_partition()[p]
                del self.nodes[old.node_id]  # a node re-joined under a new id: the new one holds the environment
                self._event(rnd, "node replaced", old, f"node {nid} now holds {old.env!r}")
            role = TARGET if p == t else SOURCE
            node = Node(nid, p, str(cfg["env-name"]), role, 0 if role == TARGET else p - (p > t), n)
            if role == TARGET and self.layout is None:
                record = reply.content[ARRAYS]
                names = [json.loads(str(cfg[k])) for k in ("param-names", "buffer-names")]
                if not all(isinstance(x, list) and all(isinstance(v, str) for v in x) for x in names):
                    raise BadUpdate("param-names and buffer-names must be JSON lists of strings")
                self.layout = Layout.from_names(record, *names)
                model_from_record(self.layout, record)  # checks the initial model
                self._initial = record
        except (BadUpdate, KeyError, TypeError, ValueError) as exc:
            self._ignored.add(nid)
            self._event(rnd, "node ignored", nid, f"bad query reply: {exc}")
            return
        self.nodes[nid] = node

    def initial_arrays(self) -> ArrayRecord:
        """The initial global model θ⁰, as the target node built it (after :meth:`discover`)."""
        if self._initial is None:
            raise RuntimeError("call discover(grid) first: the initial model comes from the target node")
        return self._initial

    def summary(self) -> None:
        log.info("FDA strategy: %s on %s, target %s; %d nodes", self.method.display_label, self.config["dataset"],
                 self.config["target"], len(self.nodes))

    # -- training ----------------------------------------------------------------------------------
    def _round_info(self, r: int) -> RoundInfo:
        """Round r's learning rates and warm-up flag, as the engine's ``Run.round`` sets them
        (``docs/experiments.md`` § Warm-up and learning rates)."""
        c = self.config
        decayed = c["warmup_rounds"] > 0 and r > c["warmup_rounds"]
        factor = c["lr_decay"] if decayed else 1.0
        return RoundInfo(r, c["rounds"], r <= c["warmup_rounds"], c["source_lr"] * factor, c["target_lr"] * factor, c)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                        ) -> Iterable[Message]:
        """The method's plan for the round, as one ``train`` message per node that trains."""
        r, c = server_round, self.config
        if self.layout is None:
            self.discover(grid, rnd=r)
        else:
            online = set(grid.get_node_ids())
            if any(i not in self.nodes and i not in self._ignored for i in online):
                self.discover(grid, timeout=min(30.0, self.discovery_timeout), rnd=r)  # nodes that (re)joined
        self.theta, self.buffers = model_from_record(self.layout, arrays)
        info = self._round_info(r)
        plan = self.method.configure_round(info)
        online = set(grid.get_node_ids())
        expected: dict[int, TrainInstruction] = {}
        by_part = self._by_partition()
        if plan.sources:
            for node in sorted((n for n in by_part.values() if n.role == SOURCE), key=lambda n: n.index):
                expected[node.node_id] = TrainInstruction(SOURCE, node.index, r, info.lr_source, c["local_epochs"],
                                                          c["source_batch_size"])
        tt = plan.target
        if tt is not None:
            node = by_part[self.target_partition]
            expected[node.node_id] = TrainInstruction(
                TARGET, 0, r, info.lr_target if tt.lr is None else tt.lr, tt.epochs or c["target_local_epochs"],
                tt.batch_size or c["target_batch_size"], tt.data, tt.parts)
        self._round = {"info": info, "plan": plan, "expected": expected}
        msgs = []
        for nid, ins in expected.items():
            if nid not in online:
                self._event(r, "update dropped", nid, "the node is offline")
                continue
            cfg = ConfigRecord({EXPERIMENT: self._experiment, **ins.to_config()})
            msgs.append(self._message({ARRAYS: arrays, CONFIG: cfg}, nid, MessageType.TRAIN, r))
        self._round["sent"] = msgs  # the Grid gives them their ids when it pushes them
        return msgs

    def _sender(self, reply: Message) -> int:
        """The node a reply answers for: the destination of the message it replies to (an error reply made by
        the SuperLink for a node that went offline may come from another id), else its source."""
        for msg in self._round.get("sent", []):
            if msg.metadata.message_id and msg.metadata.message_id == reply.metadata.reply_to_message_id:
                return msg.metadata.dst_node_id
        return reply.metadata.src_node_id

    def _parse(self, reply: Message, ins: TrainInstruction, node: Node) -> dict[str, Any]:
        """A train reply's model h, steps, examples and parts, checked (BadUpdate) before any use."""
        if reply.has_error():
            raise BadUpdate(f"the node failed: {reply.error.reason}")
        content = reply.content
        if ARRAYS not in content.array_records or METRICS not in content.metric_records:
            raise BadUpdate(f"the reply lacks {ARRAYS!r} or {METRICS!r}")
        h, bufs = model_from_record(self.layout, content[ARRAYS])
        m = content[METRICS]
        steps, n = m.get("steps"), m.get("num-examples")
        if not isinstance(steps, int) or steps < 1 or not isinstance(n, int) or n < 1:
            raise BadUpdate(f"steps and num-examples must be positive integers, got {steps!r} and {n!r}")
        if ins.role == SOURCE and n != node.n:
            raise BadUpdate(f"the source reports {n} examples, it had {node.n} at discovery")
        expected_steps = math.ceil(n / ins.batch_size) * ins.epochs  # optimiser steps ⌈n/bs⌉·epochs (flat.count_steps)
        if steps != expected_steps:
            raise BadUpdate(f"{steps} optimiser steps reported, {expected_steps} expected")
        parts = None
        if ins.parts:
            if PARTS not in content.array_records:
                raise BadUpdate("the target sent no per-batch updates ('parts')")
            parts = parts_from_record(content[PARTS], steps, self.layout.m)
        return {"h": h, "buffers": bufs, "steps": steps, "n": n, "parts": parts}

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Check every reply, build the round's :class:`RoundResults` from the good ones and let the method
        update θ (``docs/flower.md`` § Robustness)."""
        r = server_round
        info: RoundInfo = self._round["info"]
        plan: RoundPlan = self._round["plan"]
        expected: dict[int, TrainInstruction] = self._round["expected"]
        got: dict[int, dict[str, Any]] = {}
        for reply in replies:
            nid = self._sender(reply)
            self._count(r, MessageType.TRAIN, "up", reply, nid)
            if nid not in expected or nid in got:
                self._event(r, "reply ignored", nid, "not asked to train this round")
                continue
            try:
                got[nid] = self._parse(reply, expected[nid], self.nodes[nid])
            except (BadUpdate, KeyError, TypeError, ValueError) as exc:
                self._event(r, "update dropped", nid, str(exc))
        for nid in expected:
            if nid not in got and not any(e["round"] == r and e["node_id"] == nid for e in self.events):
                self._event(r, "update dropped", nid, "no reply within the round timeout")
        sources = sorted((self.nodes[i] for i in got if expected[i].role == SOURCE), key=lambda n: n.index)
        target = next((self.nodes[i] for i in got if expected[i].role == TARGET), None)
        metrics = {"sources": len(sources), "dropped": len(expected) - len(got)}
        skip = ("the target's update is missing" if plan.target is not None and target is None else
                "no source update arrived" if plan.sources and not sources else "")
        if skip:
            self._event(r, "round skipped", reason=f"{skip}: the global model is kept")
            self._round["beta"] = None
            return model_to_record(self.layout, self.theta, self.buffers), MetricRecord(metrics)
        res = self._results(info, plan, got, sources, target)
        theta_before, buffers_before = self.theta.clone(), self.buffers
        out = self.method.aggregate(info, res, self.theta)
        if out.buffers is not None:
            self.buffers = {k: v.detach().clone() for k, v in out.buffers.items()}
        if not bool(torch.isfinite(self.theta).all()):  # never hand on a corrupted global model
            self.theta, self.buffers = theta_before, buffers_before
            self._event(r, "round skipped", reason="the aggregated model is not finite: the global model is kept")
            self._round["beta"] = None
            return model_to_record(self.layout, self.theta, self.buffers), MetricRecord(metrics)
        self._round["beta"] = out.beta
        self._round["sources"] = [n.env for n in sources]
        if out.beta is not None:
            metrics.update({f"beta/{n.env}": float(b) for n, b in zip(sources, out.beta)})
        return model_to_record(self.layout, self.theta, self.buffers), MetricRecord(metrics)

    def _results(self, info: RoundInfo, plan: RoundPlan, got: dict[int, dict[str, Any]], sources: list[Node],
                 target: Node | None) -> RoundResults:
        """The engine's RoundResults from the checked replies (``Run.round``'s arithmetic, so that the method
        sees the same tensors as in process)."""
        c, theta, m = self.config, self.theta, self.layout.m
        src = [got[n.node_id] for n in sources]
        all_sources = sorted((n for n in self.nodes.values() if n.role == SOURCE), key=lambda n: n.index)
        counted = sources if plan.sources else all_sources
        sizes = torch.tensor([n.n for n in counted], dtype=theta.dtype)
        weights = sizes / sizes.sum() if counted else sizes  # FedAvg sample weights n_i / Σ n_i
        updates = None
        if plan.sources:
            updates = torch.empty(len(src), m, dtype=theta.dtype)
            for k, s in enumerate(src):
                torch.sub(s["h"], theta, out=updates[k])  # g_i = h_i^(r) − h^(r-1)
        t = got[target.node_id] if target is not None else None
        ins_t = self._round["expected"][target.node_id] if target is not None else None
        align_src = align_t = None
        if c["alignment_steps"] == "fractional":
            # FedGP paper App. B.2 Eq. B.2 (and its code): n/bs per epoch, not the ⌈n/bs⌉ steps taken
            align_src = [n.n / c["source_batch_size"] * c["local_epochs"] for n in sources]
            if t is not None:
                align_t = t["n"] / ins_t.batch_size * ins_t.epochs
        self._round["lr_target_used"] = ins_t.lr if ins_t is not None else info.lr_target
        return RoundResults(
            source_updates=updates, source_steps=[s["steps"] for s in src], weights=weights,
            source_buffers=[s["buffers"] for s in src],
            target_update=torch.sub(t["h"], theta) if t is not None else None,
            target_params=t["h"] if t is not None else None, target_parts=t["parts"] if t is not None else None,
            target_steps=t["steps"] if t is not None else 0, target_buffers=t["buffers"] if t is not None else {},
            lr_source=info.lr_source, lr_target=info.lr_target, scratch=torch.empty(m, dtype=theta.dtype),
            as_dict=self.layout.as_dict, as_dicts=self.layout.as_dicts,
            source_alignment_steps=align_src if plan.sources else None, target_alignment_steps=align_t)

    # -- evaluation at the target ------------------------------------------------------------------
    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
                           ) -> Iterable[Message]:
        """The global model to the target node, on the rounds the engine evaluates (every ``eval_every``
        rounds and the last)."""
        r, c = server_round, self.config
        info: RoundInfo = self._round["info"]
        plan: RoundPlan = self._round["plan"]
        self._eval = {"round": r, "phase": plan.phase, "beta": self._round.get("beta"),
                      "lr_source": info.lr_source if plan.lr_source is None else plan.lr_source,
                      "lr_target": self._round.get("lr_target_used", info.lr_target) if plan.target else info.lr_target}
        if r % c["eval_every"] and r != c["rounds"]:
            self._eval = {}
            return []
        target = self._by_partition().get(self.target_partition)
        if target is None or target.node_id not in set(grid.get_node_ids()):
            self._event(r, "evaluation failed", target, "the target node is offline")
            return []
        cfg = ConfigRecord({EXPERIMENT: self._experiment, "server-round": r})
        return [self._message({ARRAYS: arrays, CONFIG: cfg}, target.node_id, MessageType.EVALUATE, r)]

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """The target's metrics, recorded in :attr:`history` as the engine records them (NaN when the target
        did not answer)."""
        if not self._eval:
            return None
        r = server_round
        scores: dict[str, float] = {}
        for reply in replies:
            self._count(r, MessageType.EVALUATE, "up", reply, reply.metadata.src_node_id)
            if reply.has_error():
                self._event(r, "evaluation failed", reply.metadata.src_node_id, reply.error.reason)
                continue
            scores = {k: float(v) for k, v in reply.content[METRICS].items() if k.startswith("target_")}
            self._n_test = int(reply.content[METRICS].get("num-examples", 0))
        if not scores:
            if not any(e["round"] == r and e["event"] == "evaluation failed" for e in self.events):
                self._event(r, "evaluation failed", reason="no reply from the target within the round timeout")
            scores = {"target_acc": float("nan")}
        e = self._eval
        self.history.append({"round": e["round"], "phase": e["phase"], **scores, "beta": e["beta"],
                             "lr_source": e["lr_source"], "lr_target": e["lr_target"]})
        return MetricRecord(scores)

    # -- the run's result --------------------------------------------------------------------------
    def result(self, seconds: float | None = None) -> dict[str, Any]:
        """The run's result in the format of :func:`fda_core.experiments.federated.run_experiment` (final and
        last-5 target accuracy, history, method, target, sources, config, ...) plus ``"flower"``: the nodes,
        the events (dropped replies, skipped rounds) and the traffic (bytes of every message)."""
        accs = [h["target_acc"] for h in self.history]
        by_part = self._by_partition()
        target = by_part.get(self.target_partition)
        extra = {}
        if self.history and "target_auc" in self.history[-1]:
            aucs = [h["target_auc"] for h in self.history]
            extra = {"final_target_auc": aucs[-1], "last5_target_auc": sum(aucs[-5:]) / len(aucs[-5:])}
        return {
            "final_target_acc": accs[-1] if accs else float("nan"),
            "last5_target_acc": sum(accs[-5:]) / len(accs[-5:]) if accs else float("nan"),
            **extra,
            "history": self.history,
            "method": self.method.display_label,
            "target": target.env if target else None,
            "sources": [{"name": n.env, "n": n.n} for n in sorted(
                (n for n in self.nodes.values() if n.role == SOURCE), key=lambda n: n.index)],
            "n_target_labeled": target.n if target else None,
            "n_target_test": self._n_test,
            "n_parameters": self.layout.m if self.layout else None,
            "seconds": time.perf_counter() - self._start if seconds is None else seconds,
            "device": str(resolve_device(self.config["device"])),
            "config": self.config,
            "flower": {"nodes": [vars(n) for n in sorted(self.nodes.values(), key=lambda n: n.partition)],
                       "events": self.events, "traffic": self.traffic},
        }


class FedAvgStrategy(FDAStrategy):
    """Source only: FedAvg of the source nodes (McMahan et al. 2017); the target node only evaluates."""

    method_name = "source_only"


class FedDAStrategy(FDAStrategy):
    """FedDA: ĝ = Σ_i w_i [(1 − β) g_T + β g_i] (FedGP paper § 4; ``docs/theory.md`` § Rules). Options
    ``beta``, ``align``."""

    method_name = "fedda"


class FedGPStrategy(FDAStrategy):
    """FedGP: ĝ = Σ_i w_i [(1 − β) g_T + β Proj₊(g_T | a_i g_i)] (FedGP paper § 4; ``docs/theory.md`` §
    Rules), with magnitude alignment a_i (App. B.2 Eq. B.2). Options ``beta``, ``projection`` ("exact" on
    the whole update, "exact_layerwise", or the papers' per-layer "cosine" filter), ``filter``."""

    method_name = "fedgp"


class FedDAAutoStrategy(FDAStrategy):
    """FedDA_Auto: FedDA with β_i = σ̂² / (σ̂² + d̂_i²) estimated each round from the target's per-batch
    updates (auto-weighted FDA paper § 4.2; ``docs/theory.md`` § Optimal weights)."""

    method_name = "fedda_auto"


class FedGPAutoStrategy(FDAStrategy):
    """FedGP_Auto: FedGP with β_i = σ̂² / (σ̂² + (τ²d²)^_i) estimated each round (auto-weighted FDA paper
    § 4.2; ``docs/theory.md`` § Optimal weights). Option ``projection``."""

    method_name = "fedgp_auto"


#: The named strategy of each method (others run through :class:`FDAStrategy`).
STRATEGIES: dict[str, type[FDAStrategy]] = {
    cls.method_name: cls for cls in (FedAvgStrategy, FedDAStrategy, FedGPStrategy, FedDAAutoStrategy, FedGPAutoStrategy)
}


def strategy_for(config: Mapping[str, Any], **kwargs: Any) -> FDAStrategy:
    """The strategy of ``config["rule"]`` (its named class, else :class:`FDAStrategy`) for the experiment
    ``config``; ``kwargs`` go to the constructor."""
    cfg = make_config(**config)
    return STRATEGIES.get(cfg["rule"], FDAStrategy)(cfg, **kwargs)
