"""Staged outputs: a run writes its figures to a staging folder, and they replace the real ones only when
the whole notebook succeeded (``fda run`` / ``fda sweep``, :func:`.runner.execute`).

A notebook that declares a ``figures_dir`` parameter gets a fresh staging folder next to its executed copy
(``.NAME.XXXX.staging/``). How the notebook is pointed at it:

* the notebook derives its folder with :func:`fda_core.common.files.output_dir` (``out_dir =
  output_dir(figures_dir, quick)``): the kernel's environment maps the destination to the staging folder
  (:data:`~fda_core.common.files.STAGING_ENV`), and ``figures_dir`` keeps the user's value — so the
  executed copy shows exactly the parameters the user gave, and the notebook prints where it stages;
* any other notebook: ``figures_dir`` itself is set to the staging folder (the executed copy then shows
  that folder).

On success every staged file is moved into the destination one by one with ``os.replace`` (atomic per
file; across file systems a copy into a temp file beside the target, then ``os.replace``); files of the
destination that the run did not produce are left alone. On failure nothing in the destination changes:
the partial outputs are kept as ``NAME.failed_outputs/`` next to ``NAME.failed.ipynb``.

The destination is resolved as the notebook resolves it: relative paths under the repository root seen
from the kernel's working directory, and a ``quick`` run aimed at ``figures/...`` goes to
``executed/quick/...`` (:func:`fda_core.common.files.output_destination`).
"""

from __future__ import annotations

import ast
import errno
import json
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.files import STAGING_ENV, output_destination, project_root
from .parameters import notebook_parameters

__all__ = ["STAGED_PARAMETER", "StagingPlan", "Staging", "plan_staging", "failed_outputs_path"]

#: The parameter whose folder is staged.
STAGED_PARAMETER = "figures_dir"
_USES_OUTPUT_DIR = re.compile(rf"\boutput_dir\(\s*{STAGED_PARAMETER}\b")


def failed_outputs_path(output: str | os.PathLike) -> Path:
    """Where the partial outputs of a failed run are kept: ``NAME.ipynb`` → ``NAME.failed_outputs``."""
    out = Path(output)
    return out.with_name(f"{out.stem}.failed_outputs")


def _literal(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None


def _uses_output_dir(notebook: Path) -> bool:
    try:
        nb = json.loads(notebook.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    for cell in nb.get("cells", []):
        if cell.get("cell_type") == "code":
            source = cell.get("source", "")
            if _USES_OUTPUT_DIR.search("".join(source) if isinstance(source, list) else source):
                return True
    return False


@dataclass(frozen=True)
class StagingPlan:
    """Where a run's figures belong (``destination``), the user-facing ``value`` of ``figures_dir`` and
    whether the notebook is redirected through :func:`~fda_core.common.files.output_dir` (``via_env``)."""

    value: str
    destination: Path
    via_env: bool


def plan_staging(notebook: str | os.PathLike, parameters: Mapping[str, Any], cwd: str | os.PathLike) -> StagingPlan | None:
    """The staging plan of one run, or None when the notebook declares no ``figures_dir`` or its value is
    not a non-empty string known before the run (e.g. a default that is not a literal)."""
    path = Path(notebook)
    declared = notebook_parameters(path)
    if STAGED_PARAMETER not in declared:
        return None
    value = parameters[STAGED_PARAMETER] if STAGED_PARAMETER in parameters else _literal(declared[STAGED_PARAMETER]["default"])
    if not isinstance(value, str) or not value.strip():
        return None
    quick = parameters["quick"] if "quick" in parameters else _literal(declared["quick"]["default"]) if "quick" in declared else False
    root = project_root(cwd)
    destination = output_destination(value, quick is True, root=root)
    return StagingPlan(value=value, destination=destination, via_env=_uses_output_dir(path))


class Staging:
    """A staging folder for one run (see the module docstring); create with :meth:`create`."""

    def __init__(self, plan: StagingPlan, folder: Path):
        self.plan = plan
        self.folder = folder
        self.installed: list[Path] = []

    @classmethod
    def create(cls, plan: StagingPlan, next_to: str | os.PathLike, stem: str) -> Staging:
        """A fresh hidden staging folder ``.STEM.XXXX.staging`` in ``next_to``."""
        Path(next_to).mkdir(parents=True, exist_ok=True)
        return cls(plan, Path(tempfile.mkdtemp(prefix=f".{stem}.", suffix=".staging", dir=next_to)))

    @property
    def destination(self) -> Path:
        return self.plan.destination

    def parameters(self, params: Mapping[str, Any]) -> dict[str, Any]:
        """The parameters to inject: unchanged when the notebook is redirected through ``output_dir``,
        else with ``figures_dir`` set to the staging folder."""
        if self.plan.via_env:
            return dict(params)
        return {**params, STAGED_PARAMETER: str(self.folder)}

    def kernel_env(self) -> dict[str, str]:
        """The variables added to the kernel's environment (empty unless redirected through ``output_dir``)."""
        if not self.plan.via_env:
            return {}
        return {STAGING_ENV: json.dumps({str(self.destination.resolve()): str(self.folder)})}

    def files(self) -> list[Path]:
        """The staged files, relative to the staging folder, sorted."""
        if not self.folder.is_dir():
            return []
        return sorted(p.relative_to(self.folder) for p in self.folder.rglob("*") if p.is_file() or p.is_symlink())

    def reset(self) -> None:
        """Empty the staging folder (before a retry)."""
        shutil.rmtree(self.folder, ignore_errors=True)
        self.folder.mkdir(parents=True, exist_ok=True)

    def install(self) -> list[Path]:
        """Move every staged file into the destination (``os.replace``, one file at a time); returns the
        destination paths. The staging folder is removed once empty. An ``OSError`` leaves the files not
        yet moved in the staging folder (:attr:`installed` lists those already moved)."""
        self.installed = []
        for rel in self.files():
            target = self.destination / rel
            _replace_file(self.folder / rel, target)
            self.installed.append(target)
        shutil.rmtree(self.folder, ignore_errors=True)
        return list(self.installed)

    def keep(self, where: str | os.PathLike) -> Path | None:
        """Keep the staged (partial) outputs as ``where`` (replacing an older copy); None, and the folder
        removed, when the run staged nothing."""
        if not self.files():
            self.discard()
            return None
        where = Path(where)
        if where.is_dir() and not where.is_symlink():
            shutil.rmtree(where)
        elif where.exists() or where.is_symlink():
            where.unlink()
        try:
            os.replace(self.folder, where)
        except OSError:
            shutil.move(str(self.folder), str(where))
        return where

    def discard(self) -> None:
        """Remove the staging folder and whatever it holds."""
        shutil.rmtree(self.folder, ignore_errors=True)


def _replace_file(src: Path, dst: Path) -> None:
    """Move ``src`` to ``dst`` atomically (``os.replace``); across file systems, copy to a temp file next to
    ``dst`` and ``os.replace`` that."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.replace(src, dst)
        return
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
    fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
    os.close(fd)
    try:
        shutil.copy2(src, tmp)
        os.replace(tmp, dst)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    src.unlink()
