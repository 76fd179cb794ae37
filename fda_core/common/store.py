"""The result store: finished runs on disk, keyed by their config, tied to the code that produced them.

``docs/architecture.md`` § Conventions: notebooks read the store and only compute what is missing, so
re-running a notebook skips finished runs and an interrupted sweep resumes where it stopped.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .files import atomic_write_json, run_metadata

__all__ = ["config_hash", "ResultStore"]


def config_hash(config: Any) -> str:
    """A short stable hash (12 hex digits of SHA-256) of a JSON-serialisable config (keys sorted)."""
    import hashlib

    text = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


class ResultStore:
    """Finished runs on disk, keyed by a hash of their config: ``<root>/<experiment>/<hash>.json``.

    Each file
    holds ``{"config", "versions", "result"}`` and is written atomically (temp file + rename), so a run
    killed mid-write leaves either the old file or none, never a truncated one.
    """

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, experiment: str, config: dict[str, Any]) -> Path:
        if not experiment or "/" in experiment or experiment.startswith("."):
            raise ValueError(f"experiment must be a plain folder name, got {experiment!r}")
        return self.root / experiment / f"{config_hash(config)}.json"

    def load(self, experiment: str, config: dict[str, Any]) -> Any | None:
        """The stored result of this config, or None when it has not finished yet."""
        p = self.path(experiment, config)
        if not p.exists():
            return None
        return json.loads(p.read_text(encoding="utf-8"))["result"]

    def save(self, experiment: str, config: dict[str, Any], result: Any) -> Path:
        """Store ``result`` (JSON-serialisable) with the config and package versions, atomically."""
        meta = run_metadata(**config)
        return atomic_write_json(self.path(experiment, config), {**meta, "result": result})

    def cached(self, experiment: str, config: dict[str, Any], compute: Callable[[], Any]) -> Any:
        """``load`` if finished, else ``compute()``, ``save`` and return it."""
        found = self.load(experiment, config)
        if found is not None:
            return found
        result = compute()
        self.save(experiment, config, result)
        return result
