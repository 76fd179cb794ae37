"""Device selection: one rule for every entry point that takes ``device=``; counting host synchronisations."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["resolve_device", "host_synchronisations", "host_synchronisations_per_step"]


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` → CUDA when available, else the CPU; ``"cpu"``, ``"cuda"``, ``"cuda:<i>"`` or a
    :class:`torch.device` as given.

    Raises ValueError naming ``device`` for anything else, and for CUDA when
    ``torch.cuda.is_available()`` is False (instead of failing later inside a kernel launch).
    """
    if isinstance(device, str) and device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:<i>' or a torch.device, got {device!r}")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda', 'cuda:<i>' or a torch.device, got {device!r}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asks for CUDA but torch.cuda.is_available() is False; "
                         "use device='auto' or 'cpu'")
    return dev


def host_synchronisations(fn: Callable[[], Any], device: str | torch.device) -> int | None:
    """How many times one call of ``fn`` makes the host wait for ``device``, as torch's CUDA sync debug mode reports
    them (blocking copies, ``.item()``, ``bool()`` of a device tensor; the mode is a prototype and may miss some);
    None on a device that is not CUDA (``fn`` is not called then)."""
    dev = torch.device(device)
    if dev.type != "cuda":
        return None
    torch.cuda.synchronize(dev)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            fn()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    # only the warnings of synchronising calls count, not the mode's own "prototype feature" notice
    return sum("called a synchronizing" in str(w.message) for w in caught)


def host_synchronisations_per_step(run: Callable[[int], Any], device: str | torch.device, short: int,
                                   long: int) -> float | None:
    """The host synchronisations per step of a loop: ``run(steps)`` runs it for ``steps`` steps, counted by
    :func:`host_synchronisations` for ``short`` and ``long`` steps, their difference over ``long − short`` (so the
    set-up and the end of a run cancel out). None on a device that is not CUDA (``run`` is not called then)."""
    if long <= short:
        raise ValueError(f"long must exceed short, got short={short}, long={long}")
    counts = [host_synchronisations(lambda n=n: run(n), device) for n in (short, long)]
    if counts[0] is None:
        return None
    return (counts[1] - counts[0]) / (long - short)
