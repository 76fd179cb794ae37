"""Seeds: one derivation for every independent random stream of the workbook.

A run has one integer ``seed``; each purpose (a data split, a client in a round, a trial's
initialisation, a Monte-Carlo cell) draws from its own stream, derived from the seed and integer keys
by :class:`numpy.random.SeedSequence` (``derive_seed(seed, *keys)``). Streams of different key tuples
are independent, and a stream does not change when other streams are added or removed. Keys must be
integers >= 0: give each purpose its own tag (a small constant) as the first key instead of using
negative numbers (Python's ``hash`` maps -1 and -2 to the same value, which is why tuple hashing is
not used here).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["derive_seed", "generator"]


def _key(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"{name} must be an integer >= 0, got {value!r}")
    return int(value)


def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for the stream ``(seed, *keys)`` (``numpy.random.SeedSequence([seed, *keys])``).

    Raises ValueError naming the argument when ``seed`` or a key is not an integer >= 0.
    """
    entropy = [_key(seed, "seed")] + [_key(k, f"seed key #{i + 1}") for i, k in enumerate(keys)]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


def generator(seed: int, *keys: int) -> torch.Generator:
    """A CPU :class:`torch.Generator` seeded with :func:`derive_seed` ``(seed, *keys)``."""
    return torch.Generator().manual_seed(derive_seed(seed, *keys))
