"""Per-step scalars (losses) kept on the device and summed on the host when read (``docs/architecture.md``
§ Reads from the device).

A training loop that adds ``loss.item()`` to a Python float after every step reads one number back from the
device per step; on a GPU each read waits for every kernel queued before it, so the host cannot run ahead of the
device. :class:`DeferredSums` keeps the steps' values on the device and reads them in one copy when asked (or
every ``flush_every`` steps), then adds them as Python floats in the order they were added: the sums the
per-step reads formed, bit for bit, with one read instead of one per value.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["DeferredSums"]


class DeferredSums:
    """Running sums of named per-step scalars, kept on the device until read.

    ``add(values)``: one step's values, a tensor of ``len(names)`` numbers in the order of ``names`` (or several
    steps' values flattened one step after another). ``read()`` returns {name: Σ value / divisor} over the steps
    since the last read, summed in Python floats in the order the values were added (as ``total += v.item() /
    divisor`` after every step would), and starts the sums afresh. ``divisor`` None adds the values themselves.
    At most ``flush_every`` additions are kept on the device between reads."""

    def __init__(self, names: Sequence[str], divisor: float | None = None, flush_every: int = 512):
        self.names = tuple(names)
        if not self.names or len(set(self.names)) != len(self.names):
            raise ValueError(f"names must be distinct and at least one, got {names!r}")
        if flush_every < 1:
            raise ValueError(f"flush_every must be ≥ 1, got {flush_every!r}")
        self.divisor, self.flush_every = divisor, flush_every
        self._pending: list[Tensor] = []
        self._sums = dict.fromkeys(self.names, 0.0)

    def add(self, values: Tensor) -> None:
        values = values.detach().reshape(-1)
        if values.numel() % len(self.names):
            raise ValueError(f"values must hold a multiple of {len(self.names)} numbers ({', '.join(self.names)}), "
                             f"got {values.numel()}")
        self._pending.append(values)
        if len(self._pending) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        values = torch.cat(self._pending).tolist()  # one read from the device
        self._pending.clear()
        k, sums, divisor = len(self.names), self._sums, self.divisor
        for i in range(0, len(values), k):
            for name, v in zip(self.names, values[i:i + k]):
                sums[name] += v if divisor is None else v / divisor

    def read(self) -> dict[str, float]:
        """{name: Σ value (/ divisor)} of the steps since the last read."""
        self._flush()
        out, self._sums = self._sums, dict.fromkeys(self.names, 0.0)
        return out
