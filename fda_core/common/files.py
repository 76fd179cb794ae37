"""Result files: atomic writes (temp file + rename), CSV tables with setting notes, run metadata and the
workbook's folders.

Nothing already written is lost when a run is interrupted (``docs/architecture.md`` § Conventions).
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["atomic_write", "atomic_write_text", "atomic_write_json", "write_table", "read_note", "run_metadata", "project_root",
           "resolve_output", "output_destination", "output_dir", "STAGING_ENV", "timings_path", "write_timings"]

#: Environment variable through which ``fda run`` / ``fda sweep`` hand :func:`output_dir` a staging folder:
#: a JSON mapping ``{destination folder: staging folder}``, set only in the kernel's environment.
STAGING_ENV = "FDA_STAGED_OUTPUTS"


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


def read_note(path: str | os.PathLike) -> list[str]:
    """The note of a table written by :func:`write_table`: one string per leading ``#`` line (the table itself:
    ``pd.read_csv(path, comment="#")``)."""
    note = []
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            if not line.startswith("#"):
                break
            note.append(line[1:].strip())
    return note


def run_metadata(**config: Any) -> dict[str, Any]:
    """The config plus versions of the packages behind a result (recorded next to every result)."""
    import numpy
    import torch

    from . import VERSION as __version__

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
    pkg_parent = Path(__file__).resolve().parents[2]  # fda_core/common/files.py -> the folder holding fda_core/
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


def output_destination(path: str | os.PathLike, quick: bool = False, *, root: str | os.PathLike | None = None) -> Path:
    """Where a notebook's outputs belong: :func:`resolve_output` (relative paths under ``root``, default
    :func:`project_root`), except that a ``quick`` run whose folder lies under ``<root>/figures/`` goes to
    ``<root>/executed/quick/<the same relative path>`` (``executed/`` is git-ignored), so quick runs never
    overwrite the committed figures. Pure: prints nothing, creates nothing."""
    base = Path(root).resolve() if root is not None else project_root()
    p = Path(path)
    p = p if p.is_absolute() else base / p
    if not quick:
        return p
    try:
        rel = p.resolve().relative_to((base / "figures").resolve())
    except ValueError:
        return p
    return base / "executed" / "quick" / rel


def output_dir(path: str | os.PathLike, quick: bool = False) -> Path:
    """The folder a notebook writes its figures to; use it in the derived-values cell::

        out_dir = output_dir(figures_dir, quick)

    As :func:`output_destination`: relative paths under the repository root; a quick run aimed at the
    committed ``figures/...`` is redirected to ``executed/quick/...`` (and says so). Under ``fda run`` /
    ``fda sweep`` the files go to a staging folder first (named in :data:`STAGING_ENV`; the run prints
    it) and are moved into the destination only when the whole notebook has succeeded.
    """
    dest = output_destination(path, quick)
    staged = _staging_folder(dest)
    if staged is not None:
        print(f"writing outputs to the staging folder {staged}; fda moves them to {dest} when the whole notebook succeeds")
        return staged
    if quick and dest != output_destination(path, False):
        print(f"quick run: writing outputs to {dest} (not to the committed {output_destination(path, False)})")
    return dest


def _staging_folder(dest: Path) -> Path | None:
    raw = os.environ.get(STAGING_ENV)
    if not raw:
        return None
    try:
        mapping = json.loads(raw)
    except ValueError:
        return None
    staged = mapping.get(str(dest.resolve())) if isinstance(mapping, dict) else None
    return Path(staged) if isinstance(staged, str) and staged else None


def timings_path(stem: str, name: str, quick: bool = False) -> Path:
    """Where wall-clock timings of a notebook's runs go: ``<repo>/executed/timings/<stem>/<name>.csv``, or
    ``<repo>/executed/quick/timings/<stem>/<name>.csv`` for a quick run (tests, a user trying the notebook), so
    that a quick run never replaces the timings of a default run (as its figures go under ``executed/quick/``).

    Timings differ on every run, so they are kept out of the result CSVs under ``figures/`` (which are
    byte-identical when regenerated on the same platform) and out of the repository (``executed/`` is
    git-ignored)."""
    if not stem or "/" in stem or not name or "/" in name:
        raise ValueError(f"stem and name must be plain names, got {stem!r}, {name!r}")
    return project_root() / "executed" / ("quick/timings" if quick else "timings") / stem / f"{name}.csv"


def write_timings(stem: str, name: str, table: Any, note: str | None = None, *, quick: bool = False) -> Path:
    """Write a table of wall-clock timings to :func:`timings_path` (atomically, with an optional note)."""
    return write_table(timings_path(stem, name, quick), table, note)
