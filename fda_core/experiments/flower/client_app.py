"""The ClientApp: a Flower node that trains one environment of any registered dataset
(``docs/flower.md`` § Flower apps).

The node's ``partition-id`` (its node config: ``flower-supernode --node-config 'partition-id=1'``; the
simulation engine sets it) is the index of its environment in the dataset's ``ENVIRONMENTS``; whether it
is a source or the target follows from the experiment's ``target``. The node builds the dataset and the
model from the experiment config the server sends, as the in-process engine does
(:class:`fda_core.experiments.federated.Run`: the same data split, model initialisation and per-client
mini-batch streams), and trains with the engine's own local-training call, so that a client's update is
the one the in-process engine computes for it (``docs/flower.md`` § Same numbers). It uses only its own
environment; the other environments of the dataset are loaded (a registered dataset is built whole, as
Flower's partitioners load a dataset and keep one partition) and never read.

Handlers (Flower's message API): ``query`` (who am I, and, for the target, the initial model), ``train``
and ``evaluate`` (the target's test metrics). Node config keys: ``partition-id`` (required),
``num-threads`` (torch intra-op threads, default 1: the same arithmetic in every process), ``fault``
(:mod:`.faults`).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from ..federated import Run, make_config
from ..flat import count_steps
from ..methods import ClientInfo, get_method
from .faults import fault_mod
from .protocol import ARRAYS, CONFIG, EXPERIMENT, METRICS, PARTS, SOURCE, TARGET, TrainInstruction, \
    experiment_from_json, experiment_to_json
from .records import Layout, model_from_record, model_to_record, parts_to_record

__all__ = ["app", "make_client_app", "NodeData", "node_data"]


class NodeData:
    """What a node holds for one experiment: the engine's :class:`~fda_core.experiments.federated.Run`
    (dataset, split, model, optimiser), the model's :class:`Layout`, and the target's index."""

    def __init__(self, config: dict[str, Any]) -> None:
        c = make_config(**config)
        method = get_method(c["rule"], **c["method_options"])
        torch.manual_seed(c["seed"])  # as run_experiment does before building the run
        self.run = Run(c, method)
        if self.run.target.get("noise_std"):
            raise ValueError(f"dataset {c['dataset']!r} with {c['dataset_options']} draws the target's input noise "
                             "anew every round (noise_draw='per_round'), which only the in-process loop does; use "
                             "noise_draw='once' with Flower")
        self.layout = Layout.of(self.run.model)
        # θ⁰ as the engine builds it, kept apart: training overwrites run.theta (the cache serves several runs)
        self.initial = (self.run.theta.clone(), {k: v.clone() for k, v in self.run.buffers.items()})
        self.envs = list(self.run.dataset.ENVIRONMENTS)
        self.target = self.envs.index(self.run.target_name)

    def role(self, partition: int) -> tuple[str, int]:
        """(role, index) of the node holding environment ``partition``: the target (index 0), or source i,
        i the position among the environments other than the target (the engine's source order)."""
        if partition == self.target:
            return TARGET, 0
        return SOURCE, partition - (partition > self.target)

    def check_partition(self, partition: Any) -> int:
        if isinstance(partition, bool) or not isinstance(partition, int) or not 0 <= partition < len(self.envs):
            raise ValueError(f"node config partition-id must be an integer in [0, {len(self.envs) - 1}] (an environment "
                             f"of {self.envs}), got {partition!r}")
        return partition


#: per-process cache: the data of the last few experiments (the simulation runs many virtual nodes per process)
_NODES: OrderedDict[str, NodeData] = OrderedDict()
_CACHE_SIZE = 2


def node_data(config: dict[str, Any]) -> NodeData:
    """The :class:`NodeData` of an experiment config, built once per process."""
    key = experiment_to_json(config)
    if key not in _NODES:
        _NODES[key] = NodeData(config)
        while len(_NODES) > _CACHE_SIZE:
            _NODES.popitem(last=False)
    _NODES.move_to_end(key)
    return _NODES[key]


def _setup(msg: Message, context: Context) -> tuple[NodeData, int]:
    torch.set_num_threads(int(context.node_config.get("num-threads", 1)))
    node = node_data(experiment_from_json(msg.content[CONFIG][EXPERIMENT]))
    if "partition-id" not in context.node_config:
        raise ValueError("the node config has no partition-id: start the SuperNode with "
                         "--node-config 'partition-id=<environment index>'")
    return node, node.check_partition(context.node_config["partition-id"])


def query(msg: Message, context: Context) -> Message:
    """Who this node is: its partition, environment and size; the target also sends the initial model."""
    node, p = _setup(msg, context)
    run = node.run
    role, index = node.role(p)
    n = run.target["x_lab"].shape[0] if role == TARGET else run.sources[index]["x"].shape[0]
    content = RecordDict({
        METRICS: MetricRecord({"partition-id": p, "num-partitions": len(node.envs), "target-index": node.target,
                               "num-examples": int(n), "num-parameters": node.layout.m}),
        # names as JSON strings: Flower 1.39's ConfigRecord.count_bytes fails on an empty list (no buffers)
        CONFIG: ConfigRecord({"env-name": node.envs[p], "param-names": json.dumps(node.layout.param_names),
                              "buffer-names": json.dumps(node.layout.buffer_names)}),
    })
    if role == TARGET:  # the initial global model θ⁰, built as the in-process engine builds it
        content[ARRAYS] = model_to_record(node.layout, *node.initial)
    return Message(content, reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    """Local training from the global model, with the engine's own call as ``Run.round`` trains this client
    (``docs/flower.md`` § Same numbers); replies with the trained model, the target also with its per-batch
    updates."""
    node, p = _setup(msg, context)
    ins = TrainInstruction.from_config(msg.content[CONFIG])
    role, index = node.role(p)
    if (role, index) != (ins.role, ins.index):
        raise ValueError(f"the server asked partition {p} to train as {ins.role} {ins.index}, but with target "
                         f"{node.envs[node.target]!r} it is {role} {index}")
    run, fm, r = node.run, node.run.model, ins.round
    theta, buffers = model_from_record(node.layout, msg.content[ARRAYS])
    start = time.perf_counter()
    parts = None
    if role == SOURCE:
        s = run.sources[index]
        n = s["x"].shape[0]
        steps = run._train(s["x"], s.get("y_aux", s["y"]), epochs=ins.epochs, batch_size=ins.batch_size, lr=ins.lr,
                           key=(r, Run.ROLE_SOURCE, index), who=f"source client {s['name']!r}, round {r}",
                           client=ClientInfo("source", index, s["name"], r), start=theta, start_buffers=buffers)
    else:
        x, y = (run.target["x_lab"], run.target["y_lab"]) if ins.data == "labeled" else \
            (run.target["x_train"], run.target["y_train"])
        n = x.shape[0]
        if ins.parts:
            parts = torch.empty(count_steps(n, ins.batch_size, ins.epochs), fm.m, dtype=fm.flat.dtype)
        steps = run._train(x, y, epochs=ins.epochs, batch_size=ins.batch_size, lr=ins.lr,
                           key=(r, Run.ROLE_TARGET, 0) if ins.data == "labeled" else (r, Run.ROLE_TARGET_TRAIN, 0),
                           who=f"target client, round {r}" if ins.data == "labeled" else "oracle",
                           client=ClientInfo("target", 0, run.target_name, r), parts=parts, start=theta,
                           start_buffers=buffers)
    content = RecordDict({
        ARRAYS: model_to_record(node.layout, fm.flat, fm.buffers()),
        METRICS: MetricRecord({"num-examples": int(n), "steps": int(steps), "partition-id": p,
                               "train-seconds": time.perf_counter() - start}),
    })
    if parts is not None:
        content[PARTS] = parts_to_record(parts)
    return Message(content, reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    """The target's test metrics of the global model (as ``Run.evaluate`` computes them)."""
    node, p = _setup(msg, context)
    if p != node.target:
        raise ValueError(f"only the target ({node.envs[node.target]!r}) evaluates; this node holds {node.envs[p]!r}")
    theta, buffers = model_from_record(node.layout, msg.content[ARRAYS])
    scores = node.run.score(params=theta, buffers=buffers)  # the engine's evaluation of a global model
    x = node.run.target["x_test"]
    return Message(RecordDict({METRICS: MetricRecord({**scores, "num-examples": int(x.shape[0]),
                                                      "partition-id": p})}), reply_to=msg)


def make_client_app(faults: Mapping[int, str] | None = None) -> ClientApp:
    """A ClientApp with the handlers above and the :mod:`.faults` mod. ``faults`` ({partition-id: fault
    spec}) sets the faults of the simulation's virtual nodes, whose node config holds only their
    partition (a SuperNode takes ``fault`` in its ``--node-config``)."""
    mods = [fault_mod]
    if faults:
        from .faults import parse_faults

        table = {int(k): str(v) for k, v in faults.items()}
        for spec in table.values():
            parse_faults(spec)  # ValueError now, not inside a node

        def set_faults(msg: Message, context: Context, call_next) -> Message:
            pid = context.node_config.get("partition-id")
            if pid in table:
                context.node_config["fault"] = table[pid]
            return call_next(msg, context)

        mods = [set_faults, fault_mod]
    client = ClientApp(mods=mods)
    client.query()(query)
    client.train()(train)
    client.evaluate()(evaluate)
    return client


#: The ClientApp of the Flower app (``fda_core/experiments/flower/app/pyproject.toml``).
app = make_client_app()
