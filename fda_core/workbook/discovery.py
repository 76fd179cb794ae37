"""Where the workbook's notebooks are, and how a user names them (``1``, ``01``, ``01_delta_errors``,
``delta_errors``, a file name, a path or ``all``); the errors of the ``fda`` command.

Notebooks are the numbered ``NN_topic.ipynb`` files in ``$FDA_NOTEBOOKS`` (if set), else ``<repo>/notebooks``.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

__all__ = ["NotebookError", "NotebookNotFoundError", "ParameterError", "repo_root", "notebooks_dir",
           "default_output_dir", "notebook_number", "find_notebooks", "resolve_notebook", "resolve_notebooks",
           "read_yaml"]

_NUMBERED = re.compile(r"^(?P<number>\d+)_(?P<topic>.+)$")

# --------------------------------------------------------------------------------------------------
# errors


class NotebookError(Exception):
    """Base class of the errors raised before anything executes (the CLI exits with code 2)."""


class NotebookNotFoundError(NotebookError, LookupError):
    """A notebook specification matches no notebook (or more than one)."""


class ParameterError(NotebookError, ValueError):
    """One or more parameter values are unknown or do not match the declared type.

    ``errors`` holds one message per problem; ``str(err)`` joins them with newlines.
    """

    def __init__(self, errors: Sequence[str]):
        self.errors = list(errors)
        super().__init__("\n".join(self.errors))


# --------------------------------------------------------------------------------------------------
# where things are


def repo_root() -> Path:
    """The workbook root (see :func:`fda_core.common.files.project_root`): the first folder from the current
    directory upwards holding ``fda_core/`` and ``notebooks/``, else the parent of the package."""
    from ..common.files import project_root

    return project_root()


def notebooks_dir() -> Path:
    """The notebooks folder: ``$FDA_NOTEBOOKS`` if set (and non-empty), else ``<repo root>/notebooks``."""
    env = os.environ.get("FDA_NOTEBOOKS")
    if env:
        return Path(env).expanduser().resolve()
    return repo_root() / "notebooks"


def default_output_dir() -> Path:
    """Where ``fda run`` writes executed copies unless ``--out`` is given: ``<repo root>/executed``."""
    return repo_root() / "executed"


def notebook_number(path: str | os.PathLike) -> int | None:
    """The leading number of a ``NN_topic.ipynb`` notebook, or None when it is not numbered."""
    m = _NUMBERED.match(Path(path).stem)
    return int(m["number"]) if m else None


def find_notebooks(directory: str | os.PathLike | None = None) -> list[Path]:
    """Every numbered notebook (``NN_topic.ipynb``) in ``directory`` (default :func:`notebooks_dir`),
    ordered by number, then name. Hidden files and ``*.failed.ipynb`` copies are ignored."""
    folder = Path(directory) if directory is not None else notebooks_dir()
    if not folder.is_dir():
        return []
    found = [
        p
        for p in folder.glob("*.ipynb")
        if p.is_file() and not p.name.startswith(".") and not p.name.endswith(".failed.ipynb")
        and notebook_number(p) is not None
    ]
    return sorted(found, key=lambda p: (notebook_number(p), p.name))


def _available(directory: Path) -> str:
    names = [p.stem for p in find_notebooks(directory)]
    if not names:
        return f"no numbered notebooks (NN_topic.ipynb) in {directory}"
    return f"available in {directory}: " + ", ".join(names)


def resolve_notebook(spec: str | os.PathLike, directory: str | os.PathLike | None = None) -> Path:
    """Turn one notebook specification into the path of an existing notebook.

    Accepted, in this order: a number (``1`` or ``01``), an existing file path, a file name or stem in
    the notebooks folder (``01_delta_errors.ipynb``, ``01_delta_errors``), or the topic without its
    number (``delta_errors``). ``all`` is handled by :func:`resolve_notebooks`.

    Raises :class:`NotebookNotFoundError` (listing the available notebooks) when nothing matches or a
    number/topic is ambiguous.
    """
    folder = Path(directory) if directory is not None else notebooks_dir()
    text = os.fspath(spec).strip()
    if not text:
        raise NotebookNotFoundError(f"empty notebook name; {_available(folder)}")
    numbered = find_notebooks(folder)

    if text.isdigit():
        hits = [p for p in numbered if notebook_number(p) == int(text)]
        if len(hits) == 1:
            return hits[0]
        if len(hits) > 1:
            raise NotebookNotFoundError(
                f"notebook number {text} is ambiguous: " + ", ".join(p.stem for p in hits) + "; use the full name"
            )
        raise NotebookNotFoundError(f"no notebook numbered {text}; {_available(folder)}")

    as_path = Path(text).expanduser()
    if as_path.is_file():
        return as_path.resolve()
    if as_path.suffix != ".ipynb" and as_path.with_suffix(".ipynb").is_file() and len(as_path.parts) > 1:
        return as_path.with_suffix(".ipynb").resolve()

    name = as_path.name
    stem = name[: -len(".ipynb")] if name.endswith(".ipynb") else name
    candidate = folder / f"{stem}.ipynb"
    if len(as_path.parts) == 1 and candidate.is_file():
        return candidate.resolve()
    hits = [p for p in numbered if _NUMBERED.match(p.stem)["topic"] == stem]  # type: ignore[index]
    if len(hits) == 1:
        return hits[0]
    if len(hits) > 1:
        raise NotebookNotFoundError(
            f"notebook {text!r} is ambiguous: " + ", ".join(p.stem for p in hits) + "; use the full name"
        )
    raise NotebookNotFoundError(f"unknown notebook {text!r}; {_available(folder)}")


def resolve_notebooks(specs: Iterable[str | os.PathLike], directory: str | os.PathLike | None = None) -> list[Path]:
    """Resolve several specifications (see :func:`resolve_notebook`); ``all`` expands to every numbered
    notebook in order. Duplicates are dropped, first occurrence kept."""
    folder = Path(directory) if directory is not None else notebooks_dir()
    out: list[Path] = []
    for spec in specs:
        if os.fspath(spec).strip().lower() == "all":
            paths = find_notebooks(folder)
            if not paths:
                raise NotebookNotFoundError(f"'all' matches nothing: {_available(folder)}")
        else:
            paths = [resolve_notebook(spec, folder)]
        for p in paths:
            if p not in out:
                out.append(p)
    return out



# --------------------------------------------------------------------------------------------------
# files


def read_yaml(path: str | os.PathLike, what: str = "file") -> Any:
    """Load a YAML file; a :class:`NotebookError` names the file (``what`` says which kind) on failure."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NotebookError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise NotebookError(f"{what} {path} is not valid YAML: {exc}") from exc
