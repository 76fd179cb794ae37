"""Flat parameter vectors ↔ Flower's ``ArrayRecord``, the checks a received model must pass, and the size
of a message (``docs/flower.md`` § Message protocol, § Robustness, § Communication).

The in-process engine keeps a model as one flat vector θ (m,) plus its BatchNorm statistics
(:mod:`fda_core.experiments.flat`). On the wire a model is an ``ArrayRecord`` with one float32 array per
parameter tensor and per floating-point buffer, by name, as ``torch``'s ``state_dict`` would give; a
:class:`Layout` (names and shapes, in the module's parameter order) converts both ways without loss, so a
model sent and received is bit-identical.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, Message
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from torch import Tensor

__all__ = ["Layout", "BadUpdate", "model_to_record", "model_from_record", "parts_to_record", "parts_from_record",
           "message_bytes", "payload_bytes"]


class BadUpdate(ValueError):
    """A reply whose model or parts cannot enter the aggregation (wrong keys, shapes, dtype, or NaN/inf)."""


@dataclass(frozen=True)
class Layout:
    """Names and shapes of a model's trainable parameters (in the flat vector's order) and of its
    floating-point buffers (BatchNorm running statistics)."""

    params: tuple[tuple[str, tuple[int, ...]], ...]
    buffers: tuple[tuple[str, tuple[int, ...]], ...] = ()

    @classmethod
    def of(cls, fm) -> "Layout":
        """The layout of a :class:`fda_core.experiments.flat.FlatModel`."""
        bufs = dict(fm.module.named_buffers())
        return cls(tuple((n, tuple(s)) for n, _, _, s in fm.layout),
                   tuple((n, tuple(bufs[n].shape)) for n in fm.buffer_names))

    @classmethod
    def from_names(cls, record: ArrayRecord, param_names: Sequence[str], buffer_names: Sequence[str]) -> "Layout":
        """The layout of a received model: the order from the names (a record does not keep one), the shapes
        from the arrays. BadUpdate when a name has no array or an array has no name."""
        names = list(param_names) + list(buffer_names)
        if set(names) != set(record.keys()) or len(set(names)) != len(names):
            raise BadUpdate(f"model arrays {sorted(record.keys())} do not match the names sent {sorted(names)}")
        return cls(tuple((n, tuple(record[n].shape)) for n in param_names),
                   tuple((n, tuple(record[n].shape)) for n in buffer_names))

    @property
    def m(self) -> int:
        """Number of trainable parameters (length of the flat vector)."""
        return sum(math.prod(s) for _, s in self.params)

    @property
    def param_names(self) -> list[str]:
        return [n for n, _ in self.params]

    @property
    def buffer_names(self) -> list[str]:
        return [n for n, _ in self.buffers]

    def as_dict(self, vec: Tensor) -> dict[str, Tensor]:
        """Per-tensor views {name: tensor of the parameter's shape} of a flat vector (m,) (no copy), as
        :meth:`fda_core.experiments.flat.FlatModel.as_dict`."""
        out, off = {}, 0
        for n, s in self.params:
            k = math.prod(s)
            out[n] = vec[off:off + k].view(s)
            off += k
        return out

    def as_dicts(self, rows: Tensor) -> list[dict[str, Tensor]]:
        """Per-tensor views of each row of ``rows`` (N, m)."""
        return [self.as_dict(r) for r in rows]


def _check_array(arr: Array, name: str, shape: tuple[int, ...]) -> np.ndarray:
    if arr.dtype != "float32":
        raise BadUpdate(f"array {name!r} has dtype {arr.dtype}, expected float32")
    if tuple(arr.shape) != tuple(shape):
        raise BadUpdate(f"array {name!r} has shape {tuple(arr.shape)}, expected {tuple(shape)}")
    a = arr.numpy()
    if a.shape != tuple(shape):  # the header and the data disagree
        raise BadUpdate(f"array {name!r} holds shape {a.shape}, its header says {tuple(shape)}")
    if not np.isfinite(a).all():
        raise BadUpdate(f"array {name!r} holds NaN or inf ({int((~np.isfinite(a)).sum())} of {a.size} entries)")
    return a


def model_to_record(layout: Layout, flat: Tensor, buffers: Mapping[str, Tensor]) -> ArrayRecord:
    """An ArrayRecord of the model θ (flat (m,)) and its buffers: one float32 array per tensor, by name."""
    arrays = {n: Array(t.detach().cpu().numpy().copy()) for n, t in layout.as_dict(flat).items()}
    for n, _ in layout.buffers:
        arrays[n] = Array(buffers[n].detach().cpu().numpy().copy())
    return ArrayRecord(arrays)


def model_from_record(layout: Layout, record: ArrayRecord, *, out: Tensor | None = None,
                      dtype: torch.dtype = torch.float32) -> tuple[Tensor, dict[str, Tensor]]:
    """The flat vector (m,) (written into ``out`` when given) and the buffers of a received model. Raises
    :class:`BadUpdate` when the record's names, shapes or dtype differ from ``layout`` or a value is NaN/inf:
    nothing of a bad model is written."""
    if not isinstance(record, ArrayRecord):
        raise BadUpdate(f"expected an ArrayRecord, got {type(record).__name__}")
    expected = set(layout.param_names) | set(layout.buffer_names)
    if set(record.keys()) != expected:
        missing, extra = sorted(expected - set(record.keys())), sorted(set(record.keys()) - expected)
        raise BadUpdate(f"model arrays differ from the global model's: missing {missing}, unexpected {extra}")
    pieces = [_check_array(record[n], n, s).reshape(-1) for n, s in layout.params]  # check all, then write
    bufs = {n: torch.from_numpy(_check_array(record[n], n, s).copy()) for n, s in layout.buffers}
    flat = torch.from_numpy(np.concatenate(pieces)).to(dtype)
    if out is not None:
        out.copy_(flat)
        flat = out
    return flat, bufs


def parts_to_record(parts: Tensor) -> ArrayRecord:
    """The target's per-batch updates (B, m) as an ArrayRecord with one array ``"parts"``."""
    return ArrayRecord({"parts": Array(parts.detach().cpu().numpy().copy())})


def parts_from_record(record: ArrayRecord, n_parts: int, m: int) -> Tensor:
    """The (B, m) per-batch updates of a reply; :class:`BadUpdate` unless exactly (n_parts, m), float32, finite."""
    if not isinstance(record, ArrayRecord) or set(record.keys()) != {"parts"}:
        raise BadUpdate("the target's parts must be an ArrayRecord with the one array 'parts'")
    return torch.from_numpy(_check_array(record["parts"], "parts", (n_parts, m)).copy())


def message_bytes(message: Message, *, envelope: bool = True) -> int:
    """Bytes of a message as Flower sends it: the sum of its serialized objects (the message, its records,
    arrays and array chunks, each counted once: Flower transfers an object once per message, by its
    content hash). ``envelope=False`` leaves out the message object itself (its metadata: node and message
    ids, timestamps — a few hundred bytes whose length varies by a few bytes from run to run, the node ids
    being random), keeping the content, which is the same in every run. ``docs/flower.md`` § Communication."""
    objects = get_all_nested_objects(message)
    if not envelope:
        objects.pop(message.object_id, None)
    return sum(len(obj.deflate()) for obj in objects.values())


def payload_bytes(message: Message) -> int:
    """Bytes of the records' payload alone (Flower's ``record.count_bytes()``, what its ``message_size_mod``
    logs): the array data plus config and metric values, without the serialization headers."""
    if message.has_error():
        return 0
    return sum(record.count_bytes() for record in message.content.values())
