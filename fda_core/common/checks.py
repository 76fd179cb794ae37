"""Argument checks shared by every layer: each raises ValueError naming the parameter and its allowed range."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

__all__ = ["is_int", "is_number", "check_int", "check_number", "check_fraction", "check_choice", "register_factory"]


def is_int(value: Any) -> bool:
    """True for Python and numpy integers, False for bools."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """True for finite real numbers (ints and floats, not bools)."""
    return (isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
            and math.isfinite(value))


def _range_text(lo: float | None, hi: float | None, lo_open: bool = False, hi_open: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"in {'(' if lo_open else '['}{lo:g}, {hi:g}{')' if hi_open else ']'}"
    if lo is not None:
        return f"{'>' if lo_open else '>='} {lo:g}"
    if hi is not None:
        return f"{'<' if hi_open else '<='} {hi:g}"
    return ""


def check_int(value: Any, name: str, lo: int | None = None, hi: int | None = None) -> int:
    """``value`` as an int when it is an integer in [lo, hi] (bounds optional), else ValueError naming ``name``."""
    if not is_int(value) or (lo is not None and value < lo) or (hi is not None and value > hi):
        rng = _range_text(lo, hi)
        raise ValueError(f"{name} must be an integer{' ' + rng if rng else ''}, got {value!r}")
    return int(value)


def check_number(value: Any, name: str, lo: float | None = None, hi: float | None = None, *,
                 lo_open: bool = False, hi_open: bool = False) -> float:
    """``value`` as a float when it is a finite number in the given range, else ValueError naming ``name``."""
    ok = is_number(value)
    if ok and lo is not None:
        ok = value > lo if lo_open else value >= lo
    if ok and hi is not None:
        ok = value < hi if hi_open else value <= hi
    if not ok:
        rng = _range_text(lo, hi, lo_open, hi_open)
        raise ValueError(f"{name} must be a finite number{' ' + rng if rng else ''}, got {value!r}")
    return float(value)


def check_fraction(value: Any, name: str) -> float:
    """A number in (0, 1]."""
    return check_number(value, name, 0.0, 1.0, lo_open=True)


def check_choice(value: Any, name: str, choices: Any) -> Any:
    """``value`` when it is one of ``choices``, else ValueError listing them."""
    if value not in tuple(choices):
        raise ValueError(f"{name} must be one of {list(choices)}, got {value!r}")
    return value


def register_factory(registry: dict[str, Any], kind: str, name: Any, factory: Any, *, overwrite: bool = False) -> None:
    """Put ``factory`` into ``registry`` under ``name`` (one registry per kind of thing: datasets, models), after
    checking the name is a non-empty string, the factory callable and the name free (``overwrite=True`` replaces)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory must be callable, got {factory!r}")
    if name in registry and not overwrite:
        raise ValueError(f"{kind} {name!r} is already registered; pass overwrite=True to replace it")
    registry[name] = factory
