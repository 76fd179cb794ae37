"""The result store: finished runs on disk, keyed by their config, tied to the code that produced them
(its code revision, :mod:`fda_core.common.provenance`).

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
    """Finished runs on disk, keyed by a hash of their config: ``<root>/<experiment>/<hash>.json``, each
    tied to the code that produced it.

    Each file holds ``{"config", "versions", "revision", "result"}`` and is written atomically (temp file +
    rename), so a run killed mid-write leaves either the old file or none, never a truncated one.

    **Code revisions.** A stored run is only reused when it was produced by the same code: callers pass
    ``revision=`` (from :func:`fda_core.common.provenance.code_revision` of the experiment's module) to
    :meth:`load`, :meth:`save` and :meth:`cached`; a stored run with another revision (or none, from before
    revisions were recorded) is *stale*: it is not returned, and the new result replaces it.
    ``recompute=True`` ignores every stored run (each is recomputed and overwritten). The store counts,
    per experiment, the runs reused, computed and found stale; :meth:`summary` says so in one line.
    """

    def __init__(self, root: str | os.PathLike, *, recompute: bool = False):
        self.root = Path(root)
        self.recompute = bool(recompute)
        self.counts: dict[str, dict[str, int]] = {}
        self.revisions: dict[str, set[str]] = {}

    def path(self, experiment: str, config: dict[str, Any]) -> Path:
        if not experiment or "/" in experiment or experiment.startswith("."):
            raise ValueError(f"experiment must be a plain folder name, got {experiment!r}")
        return self.root / experiment / f"{config_hash(config)}.json"

    def _count(self, experiment: str, what: str, revision: str | None = None) -> None:
        c = self.counts.setdefault(experiment, {"reused": 0, "computed": 0, "stale": 0})
        c[what] = c.get(what, 0) + 1  # "elsewhere" (reused from another experiment) only once it happens
        if revision:
            self.revisions.setdefault(experiment, set()).add(revision)

    def load(self, experiment: str, config: dict[str, Any], revision: str | None = None, *,
             any_experiment: bool = False) -> Any | None:
        """The stored result of this config, or None when it has not finished yet, was produced by another
        code revision than ``revision`` (stale), or the store was opened with ``recompute=True``.
        ``revision=None`` accepts any stored revision.

        ``any_experiment=True``: where ``experiment`` does not hold the config yet, a run of the same config and
        revision stored under another experiment is reused, and copied into ``experiment`` (so that folder lists
        every run of its sweep). Only for results that the config and the revision determine whatever experiment
        asked for them, such as the federated loop's runs (two ablations of one notebook often repeat a run: the
        default FedDA of one is a point of another's sweep); the stored config must equal ``config``, not only its
        hash."""
        p = self.path(experiment, config)
        if self.recompute:
            return None
        if not p.exists():
            return self._load_elsewhere(experiment, config, revision, p) if any_experiment else None
        stored = json.loads(p.read_text(encoding="utf-8"))
        if revision is not None and stored.get("revision") != revision:
            self._count(experiment, "stale")
            return None
        self._count(experiment, "reused", stored.get("revision"))
        return stored["result"]

    def _load_elsewhere(self, experiment: str, config: dict[str, Any], revision: str | None, own: Path) -> Any | None:
        """:meth:`load`'s ``any_experiment``: the first other experiment's run of this very config and revision
        (experiments in name order), copied to ``own``; None where no other experiment holds it."""
        wanted = json.dumps(config, sort_keys=True, default=str)
        for other in sorted(self.root.glob(f"*/{own.name}")):
            if other.parent.name == experiment:
                continue
            try:
                stored = json.loads(other.read_text(encoding="utf-8"))
            except (OSError, ValueError):  # unreadable: not a run to reuse
                continue
            if revision is not None and stored.get("revision") != revision:
                continue
            if json.dumps(stored.get("config"), sort_keys=True, default=str) != wanted or "result" not in stored:
                continue
            atomic_write_json(own, stored)
            self._count(experiment, "reused", stored.get("revision"))
            self._count(experiment, "elsewhere")
            return stored["result"]
        return None

    def save(self, experiment: str, config: dict[str, Any], result: Any, revision: str | None = None) -> Path:
        """Store ``result`` (JSON-serialisable) with the config, package versions and code revision, atomically."""
        meta = run_metadata(**config)
        self._count(experiment, "computed", revision)
        return atomic_write_json(self.path(experiment, config), {**meta, "revision": revision, "result": result})

    def cached(self, experiment: str, config: dict[str, Any], compute: Callable[[], Any],
               revision: str | None = None) -> Any:
        """``load`` if finished (by the same code revision), else ``compute()``, ``save`` and return it as a later
        ``load`` will (JSON types, keys sorted): tables built from it are then the same, byte for byte, whether the
        runs were computed now or read back."""
        found = self.load(experiment, config, revision)
        if found is not None:
            return found
        return self.put(experiment, config, compute(), revision)

    def put(self, experiment: str, config: dict[str, Any], result: Any, revision: str | None = None) -> Any:
        """``save`` a result computed elsewhere (e.g. in a worker process) and return it as a later ``load`` will
        (JSON types, keys sorted), as :meth:`cached` does."""
        self.save(experiment, config, result, revision)
        return json.loads(json.dumps(result, sort_keys=True, default=str))

    def summary(self, experiment: str | None = None) -> str:
        """One line per experiment: runs reused (and the code revisions they came from), computed, stale."""
        names = [experiment] if experiment is not None else sorted(self.counts)
        lines = []
        for name in names:
            c = self.counts.get(name, {"reused": 0, "computed": 0, "stale": 0})
            revs = ", ".join(sorted(self.revisions.get(name, set()))) or "-"
            elsewhere = f" ({c['elsewhere']} of them stored by another experiment)" if c.get("elsewhere") else ""
            line = (f"{name}: {c['reused']} run(s) reused from the result store{elsewhere}, {c['computed']} computed "
                    f"(code revision {revs})")
            if c["stale"]:
                line += f"; {c['stale']} stored run(s) of other code revisions recomputed"
            if self.recompute:
                line += "; recompute=True: stored runs ignored"
            lines.append(line)
        return "\n".join(lines) if lines else "result store: nothing loaded or saved yet"
