"""What the ServerApp and the ClientApps say to each other (``docs/flower.md`` § Message protocol).

Three message types, all of Flower's message API (``flwr.app.Message`` holding a ``RecordDict``):

* ``query`` (once, and for nodes that join later): the server sends the experiment config; each node
  answers with its ``partition-id``, the environment it holds, its number of examples and, if it is the
  target, the initial global model (Flower's legacy server also asked one client for the initial
  parameters);
* ``train``: the global model (``"arrays"``) and a :class:`TrainInstruction` (``"config"``); the node
  answers with its trained model (``"arrays"``), the target also with its per-batch updates (``"parts"``)
  when the method estimates β, and its counts (``"metrics"``);
* ``evaluate``: the global model, sent to the target node only; it answers with its test metrics.

Every message carries the experiment config as JSON (``fda.experiment``): the server is the one place
where the run is configured, and a node builds its data and model from it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ...common.checks import check_choice, check_int, check_number

__all__ = [
    "ARRAYS", "PARTS", "CONFIG", "METRICS", "SOURCE", "TARGET", "TrainInstruction",
    "experiment_to_json", "experiment_from_json", "experiment_from_run_config", "EXPERIMENT_PREFIX",
    "EXPERIMENT_JSON",
]

# record names inside a message's RecordDict
ARRAYS, PARTS, CONFIG, METRICS = "arrays", "parts", "config", "metrics"
#: key of the experiment config (JSON) in every ConfigRecord the server sends
EXPERIMENT = "fda.experiment"
#: the two roles of a node in federated domain adaptation
SOURCE, TARGET = "source", "target"
#: run-config keys (``[tool.flwr.app.config]``, ``flwr run --run-config``) that hold the experiment config
EXPERIMENT_PREFIX = "experiment."
#: run-config key of a JSON object merged over the ``experiment.*`` keys (any experiment setting)
EXPERIMENT_JSON = "experiment-json"


@dataclass(frozen=True)
class TrainInstruction:
    """What one node does in a training round (the in-process engine's arguments to the client's local
    training, ``fda_core.experiments.federated.Run.round``): ``role`` (source or target), ``index`` (the
    source's index among the sources; 0 for the target), ``round`` (1-based; names the client's mini-batch
    stream), ``lr``, ``epochs``, ``batch_size``, ``data`` ("labeled": the target's labelled samples; "train":
    its whole train split, the Oracle; sources: "own") and ``parts`` (also send the per-batch updates)."""

    role: str
    index: int
    round: int
    lr: float
    epochs: int
    batch_size: int
    data: str = "own"
    parts: bool = False

    def __post_init__(self) -> None:
        check_choice(self.role, "role", (SOURCE, TARGET))
        check_int(self.index, "index", 0)
        check_int(self.round, "round", 1)
        check_number(self.lr, "lr", 0.0, None, lo_open=True)
        check_int(self.epochs, "epochs", 1)
        check_int(self.batch_size, "batch_size", 1)
        check_choice(self.data, "data", ("own", "labeled", "train"))
        if not isinstance(self.parts, bool):
            raise ValueError(f"parts must be True or False, got {self.parts!r}")
        if self.role == SOURCE and (self.data != "own" or self.parts):
            raise ValueError(f"a source trains on its own data without parts, got data={self.data!r}, parts={self.parts}")
        if self.role == TARGET and self.data == "own":
            raise ValueError("the target trains on 'labeled' or 'train' data, got data='own'")

    def to_config(self) -> dict[str, Any]:
        """The ConfigRecord entries (``server-round`` is the key Flower's own strategies use)."""
        return {"fda.role": self.role, "fda.index": self.index, "server-round": self.round, "fda.lr": float(self.lr),
                "fda.epochs": self.epochs, "fda.batch-size": self.batch_size, "fda.data": self.data,
                "fda.parts": self.parts}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> "TrainInstruction":
        """Parse a ConfigRecord (ValueError naming a missing or bad key)."""
        keys = {"role": "fda.role", "index": "fda.index", "round": "server-round", "lr": "fda.lr",
                "epochs": "fda.epochs", "batch_size": "fda.batch-size", "data": "fda.data", "parts": "fda.parts"}
        missing = [k for k in keys.values() if k not in config]
        if missing:
            raise ValueError(f"train instruction lacks {missing}; it must hold {sorted(keys.values())}")
        return cls(**{name: config[key] for name, key in keys.items()})


def experiment_to_json(config: Mapping[str, Any]) -> str:
    """The resolved experiment config as canonical JSON (sorted keys), the form messages carry."""
    return json.dumps(dict(config), sort_keys=True)


def experiment_from_json(text: Any) -> dict[str, Any]:
    """Parse :func:`experiment_to_json`'s output (ValueError naming ``fda.experiment`` when malformed)."""
    if not isinstance(text, str):
        raise ValueError(f"{EXPERIMENT} must be a JSON string, got {type(text).__name__}")
    try:
        out = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{EXPERIMENT} is not valid JSON: {exc}") from None
    if not isinstance(out, dict):
        raise ValueError(f"{EXPERIMENT} must be a JSON object, got {type(out).__name__}")
    return out


def experiment_from_run_config(run_config: Mapping[str, Any]) -> dict[str, Any]:
    """The experiment config held by a Flower run config: the keys ``experiment.<key>`` (TOML dotted keys,
    flattened by Flower), nested back (``experiment.method_options.beta = 1.0`` →
    ``{"method_options": {"beta": 1.0}}``), then the JSON object of :data:`EXPERIMENT_JSON` merged over them
    (nested mappings merged key by key). Flower accepts ``flwr run --run-config`` overrides only for keys the
    app's ``pyproject.toml`` declares, so settings the app does not declare (``method_options``,
    ``dataset_options``, ...) go in the JSON. Keys given nowhere take
    :data:`fda_core.experiments.federated.DEFAULT_CONFIG` (TOML has no None)."""
    out: dict[str, Any] = {}
    for key, value in run_config.items():
        if not key.startswith(EXPERIMENT_PREFIX):
            continue
        *path, last = key[len(EXPERIMENT_PREFIX):].split(".")
        node = out
        for part in path:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ValueError(f"run config key {key!r} nests under a key that has a value")
        node[last] = value
    text = run_config.get(EXPERIMENT_JSON, "")
    if text:
        try:
            extra = json.loads(text)
        except (TypeError, json.JSONDecodeError) as exc:
            raise ValueError(f"run config key {EXPERIMENT_JSON!r} must hold a JSON object: {exc}") from None
        if not isinstance(extra, dict):
            raise ValueError(f"run config key {EXPERIMENT_JSON!r} must hold a JSON object, got {type(extra).__name__}")
        _merge(out, extra)
    return out


def _merge(into: dict[str, Any], extra: Mapping[str, Any]) -> None:
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = v
