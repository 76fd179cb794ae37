"""Device selection: one rule for every entry point that takes ``device=``."""

from __future__ import annotations

import torch

__all__ = ["resolve_device"]


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
