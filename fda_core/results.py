"""Result files: atomic writes (temp file + rename) and run metadata (seed, config, versions).

Spec ``architecture.md`` § Conventions: nothing already written is lost when a run is interrupted.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "atomic_write_text", "atomic_write_json", "write_table", "run_metadata", "project_root",
           "resolve_output", "config_hash", "ResultStore"]


def atomic_write(path: str | os.PathLike, write: Callable[[str], Any]) -> Path:
    """Call ``write(tmp_path)`` then atomically rename the temp file to ``path``.

    The temp file lives in the destination folder (same file system, so ``os.replace`` is atomic);
    on any error it is removed and ``path`` keeps its previous content.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.stem}.", suffix=path.suffix + ".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp creates 0600; give the file the usual permissions
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write(path, lambda tmp: Path(tmp).write_text(text, encoding="utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    return atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_table(path: str | os.PathLike, table: Any, note: str | None = None) -> Path:
    """Write a pandas DataFrame as CSV atomically; ``note`` (the setting, how it differs from the
    paper's) becomes leading ``# `` comment lines (read back with ``pd.read_csv(path, comment="#")``)."""
    header = "".join(f"# {line}\n" for line in (note or "").splitlines())
    return atomic_write_text(path, header + table.to_csv(index=False))


def run_metadata(**config: Any) -> dict[str, Any]:
    """The config plus versions of the packages behind a result (recorded next to every result)."""
    import numpy
    import torch

    from . import __version__

    return {
        "config": config,
        "versions": {
            "fda_core": __version__,
            "torch": torch.__version__,
            "numpy": numpy.__version__,
            "python": platform.python_version(),
        },
    }


def project_root(start: str | os.PathLike | None = None) -> Path:
    """The workbook's root: the first folder, from ``start`` (default cwd) upwards, holding both
    ``fda_core/`` and ``notebooks/``; else the folder above the installed package; else cwd."""
    here = Path(start or os.getcwd()).resolve()
    for p in (here, *here.parents):
        if (p / "fda_core").is_dir() and (p / "notebooks").is_dir():
            return p
    pkg_parent = Path(__file__).resolve().parent.parent
    if (pkg_parent / "notebooks").is_dir():
        return pkg_parent
    return here


def resolve_output(path: str | os.PathLike) -> Path:
    """An output folder: absolute paths as given, relative ones under :func:`project_root`.

    So a notebook's ``figures_dir="figures/01_delta_errors"`` lands in the repo's ``figures/`` whether
    it runs from ``notebooks/`` (Jupyter, nbmake) or from the root (``fda run``).
    """
    p = Path(path)
    return p if p.is_absolute() else project_root() / p


def config_hash(config: Any) -> str:
    """A short stable hash (12 hex digits of SHA-256) of a JSON-serialisable config (keys sorted)."""
    import hashlib

    text = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:12]


class ResultStore:
    """Finished runs on disk, keyed by a hash of their config: ``<root>/<experiment>/<hash>.json``.

    Spec ``architecture.md`` § Conventions: notebooks read the store and only compute what is missing, so
    re-running a notebook skips finished runs and an interrupted run resumes where it stopped. Each file
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
