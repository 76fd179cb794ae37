"""The workbook's notebooks: discovery, parameters, validation and execution (papermill).

Everything the ``fda`` command (:mod:`fda_core.cli`) does, as plain functions:

* :func:`notebooks_dir` / :func:`find_notebooks` — where the numbered notebooks ``NN_topic.ipynb`` live
  (env var ``FDA_NOTEBOOKS``, else ``<repo root>/notebooks``);
* :func:`resolve_notebook` / :func:`resolve_notebooks` — turn ``1``, ``01``, ``01_delta_errors``,
  ``delta_errors``, a file name, a path or ``all`` into notebook paths;
* :func:`notebook_parameters` — the parameters declared in the cell tagged ``parameters``
  (``name: type = default  # help``), via :func:`papermill.inspect_notebook`;
* :func:`validate_parameters` — check and coerce values against the declared annotations *before*
  anything runs (papermill's own ``-p`` coercion would turn ``"007"`` into ``7`` and lists into strings);
* :func:`execute` — run one notebook with papermill, writing the executed copy atomically;
* :func:`load_parameter_sets`, :func:`sweep_output_name`, :func:`plan_sweep`, :func:`run_sweep` —
  batch re-execution of one notebook over parameter sets.

Execution runs the kernel in the repository root by default, so relative paths such as
``figures/...`` written by a notebook land in the repository's ``figures/`` folder.
"""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import functools
import hashlib
import io
import itertools
import json
import os
import re
import tempfile
import time
import tokenize
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "NotebookError",
    "NotebookNotFoundError",
    "ParameterError",
    "TypeSpec",
    "ExecutionResult",
    "SweepItem",
    "repo_root",
    "notebooks_dir",
    "default_output_dir",
    "find_notebooks",
    "notebook_number",
    "resolve_notebook",
    "resolve_notebooks",
    "notebook_parameters",
    "parse_type",
    "coerce_raw",
    "conform_value",
    "validate_parameters",
    "failed_path",
    "execute",
    "load_parameter_sets",
    "sweep_output_name",
    "plan_sweep",
    "run_sweep",
]

#: Default kernel: ``python3`` resolves to the running interpreter's ipykernel.
DEFAULT_KERNEL = "python3"

_NUMBERED = re.compile(r"^(?P<number>\d+)_(?P<topic>.+)$")
_NONE_WORDS = frozenset({"none", "null", "~"})
_TRUE_WORDS = frozenset({"true", "1", "yes"})
_FALSE_WORDS = frozenset({"false", "0", "no"})
_MAX_NAME = 150
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


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
    """The workbook root (see :func:`fda_core.results.project_root`): the first folder from the current
    directory upwards holding ``fda_core/`` and ``notebooks/``, else the parent of the package."""
    from .results import project_root

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
# parameters


def notebook_parameters(path: str | os.PathLike) -> dict[str, dict[str, str]]:
    """The parameters declared in the notebook's cell tagged ``parameters``.

    Returns ``{name: {"name", "inferred_type_name", "default", "help"}}`` in declaration order, as
    :func:`papermill.inspect_notebook` does. Declarations papermill's pattern misses (``x: int | None``,
    ``Literal[...]``, quoted annotations) are recovered from the cell's syntax tree, and a notebook
    without kernelspec metadata is inspected as Python. ``inferred_type_name`` is ``"None"`` when the
    type is unknown (no annotation). Results are cached per file modification time. Raises
    :class:`NotebookError` when the notebook cannot be read.
    """
    p = Path(path).resolve()
    try:
        stat = p.stat()
        params = _notebook_parameters_cached(str(p), stat.st_mtime_ns, stat.st_size)
    except Exception as exc:  # missing file, invalid JSON, unsupported nbformat...
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise NotebookError(f"cannot read the parameters of notebook {p}: {type(exc).__name__}: {detail}") from exc
    return {k: dict(v) for k, v in params.items()}


@functools.lru_cache(maxsize=128)
def _notebook_parameters_cached(path: str, mtime_ns: int, size: int) -> dict[str, dict[str, str]]:
    import nbformat
    import papermill

    try:
        params = papermill.inspect_notebook(path)
    except ValueError:  # no kernelspec in the notebook metadata: inspect the cell as Python
        from papermill.translators import PythonTranslator

        cell = _parameters_cell(nbformat.read(path, as_version=4))
        params = {p.name: p._asdict() for p in PythonTranslator.inspect(cell)} if cell is not None else {}
    cell = _parameters_cell(nbformat.read(path, as_version=4))
    if cell is None:
        return dict(params)
    return _complete_with_ast(cell.source, dict(params))


def _parameters_cell(nb: Any) -> Any:
    for cell in nb.cells:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            return cell
    return None


def _complete_with_ast(source: str, params: dict[str, dict[str, str]]) -> dict[str, dict[str, str]]:
    """Add declarations papermill's regex missed and order everything as declared."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return params
    comments: dict[int, str] = {}
    with contextlib.suppress(tokenize.TokenError, IndentationError, SyntaxError):
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                comments[tok.start[0]] = tok.string.lstrip("#").strip()
    ordered: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names, annotation = [node.target.id], ast.unparse(node.annotation)
            if isinstance(node.annotation, ast.Constant) and isinstance(node.annotation.value, str):
                annotation = node.annotation.value
        elif isinstance(node, ast.Assign):
            names = [t.id for t in node.targets if isinstance(t, ast.Name)]
            annotation = "None"
        else:
            continue
        value = getattr(node, "value", None)
        for name in names:
            if name in params:
                ordered[name] = params[name]
                continue
            help_text = comments.get(node.end_lineno or node.lineno, "")
            if help_text.startswith("type:"):
                help_text = ""
            ordered[name] = {
                "name": name,
                "inferred_type_name": annotation,
                "default": ast.unparse(value) if value is not None else "",
                "help": help_text,
            }
    for name, info in params.items():  # anything papermill saw that the tree walk did not
        ordered.setdefault(name, info)
    return ordered


@dataclass(frozen=True)
class TypeSpec:
    """A parsed parameter annotation.

    ``kind`` is one of ``any, none, int, float, bool, str, list, tuple, dict, union, literal``;
    ``args`` holds element specs (``list``: one; ``tuple``: fixed items, or one plus ``...``;
    ``dict``: key and value; ``union``: the options) or the allowed values (``literal``).
    """

    kind: str
    args: tuple = ()

    def __str__(self) -> str:
        if self.kind == "none":
            return "None"
        if self.kind == "union":
            return " | ".join(str(a) for a in self.args)
        if self.kind == "literal":
            return "one of " + ", ".join(repr(v) for v in self.args)
        if self.kind in ("list", "tuple", "dict") and self.args:
            return f"{self.kind}[" + ", ".join("..." if a is Ellipsis else str(a) for a in self.args) + "]"
        return self.kind

    @property
    def nullable(self) -> bool:
        """Whether None is an accepted value."""
        return self.kind in ("any", "none") or (self.kind == "union" and any(a.nullable for a in self.args))


_ANY = TypeSpec("any")
_NAMES = {
    "int": "int", "float": "float", "bool": "bool", "str": "str",
    "list": "list", "List": "list", "Sequence": "list", "MutableSequence": "list", "Iterable": "list",
    "set": "list", "Set": "list", "frozenset": "list", "FrozenSet": "list",
    "tuple": "tuple", "Tuple": "tuple",
    "dict": "dict", "Dict": "dict", "Mapping": "dict", "MutableMapping": "dict",
    "NoneType": "none", "None": "none",
    "Path": "str", "PathLike": "str",
    "Any": "any", "object": "any",
}


def parse_type(annotation: str | None) -> TypeSpec:
    """Parse an annotation string (``int``, ``list[int]``, ``Optional[float]``, ``str | None``,
    ``Literal["a", "b"]`` ...) into a :class:`TypeSpec`. Unknown or missing annotations (papermill's
    ``"None"``) give ``TypeSpec("any")``. Sets become lists (papermill injects lists, not sets)."""
    if annotation is None:
        return _ANY
    text = annotation.strip()
    if text in ("", "None"):  # papermill writes "None" for "no annotation"
        return _ANY
    try:
        node = ast.parse(text, mode="eval").body
    except SyntaxError:
        return _ANY
    return _spec_from_node(node)


def _node_name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _union(options: Iterable[TypeSpec]) -> TypeSpec:
    flat: list[TypeSpec] = []
    for o in options:
        for x in o.args if o.kind == "union" else (o,):
            if x not in flat:
                flat.append(x)
    if any(x.kind == "any" for x in flat):
        return _ANY
    return flat[0] if len(flat) == 1 else TypeSpec("union", tuple(flat))


def _spec_from_node(node: ast.AST) -> TypeSpec:
    if isinstance(node, ast.Constant):
        if node.value is None:
            return TypeSpec("none")
        if isinstance(node.value, str):
            return parse_type(node.value)
        return _ANY
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _union([_spec_from_node(node.left), _spec_from_node(node.right)])
    name = _node_name(node)
    if name is not None:
        return TypeSpec(_NAMES[name]) if name in _NAMES else _ANY
    if isinstance(node, ast.Subscript):
        base = _node_name(node.value)
        items = list(node.slice.elts) if isinstance(node.slice, ast.Tuple) else [node.slice]
        if base == "Optional":
            return _union([_spec_from_node(items[0]), TypeSpec("none")])
        if base == "Union":
            return _union(_spec_from_node(i) for i in items)
        if base == "Annotated":
            return _spec_from_node(items[0])
        if base == "Literal":
            values = tuple(i.value for i in items if isinstance(i, ast.Constant))
            return TypeSpec("literal", values) if len(values) == len(items) else _ANY
        kind = _NAMES.get(base or "")
        if kind == "list":
            return TypeSpec("list", (_spec_from_node(items[0]),))
        if kind == "tuple":
            if len(items) == 2 and isinstance(items[1], ast.Constant) and items[1].value is Ellipsis:
                return TypeSpec("tuple", (_spec_from_node(items[0]), Ellipsis))
            return TypeSpec("tuple", tuple(_spec_from_node(i) for i in items))
        if kind == "dict" and len(items) == 2:
            return TypeSpec("dict", (_spec_from_node(items[0]), _spec_from_node(items[1])))
        if kind is not None:
            return TypeSpec(kind)
    return _ANY


class _Mismatch(ValueError):
    """A value does not conform to a TypeSpec (message: the reason, possibly empty)."""


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def conform_value(spec: TypeSpec, value: Any) -> Any:
    """Check an already-typed value (from YAML) against ``spec`` and return it in injectable form
    (ints accepted for float become floats, tuples become lists). Raises ``ValueError``.

    ``bool`` is not accepted for ``int``/``float``; numbers are not accepted for ``str``.
    """
    k = spec.kind
    if k == "any":
        return value
    if k == "none":
        if value is None:
            return None
        raise _Mismatch()
    if k == "bool":
        if isinstance(value, bool):
            return value
        raise _Mismatch()
    if k == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch()
    if k == "float":
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise _Mismatch()
    if k == "str":
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float, bool)) or value is None:
            raise _Mismatch("quote it in YAML to pass a string")
        raise _Mismatch()
    if k == "literal":
        for allowed in spec.args:
            if type(allowed) is type(value) and allowed == value:
                return value
        raise _Mismatch()
    if k in ("list", "tuple"):
        if not isinstance(value, (list, tuple)):
            raise _Mismatch()
        items = list(value)
        if k == "tuple" and spec.args and spec.args[-1] is not Ellipsis:
            if len(items) != len(spec.args):
                raise _Mismatch(f"expected {len(spec.args)} items, got {len(items)}")
            return [_conform_item(s, v, i) for i, (s, v) in enumerate(zip(spec.args, items))]
        if spec.args:
            return [_conform_item(spec.args[0], v, i) for i, v in enumerate(items)]
        return items
    if k == "dict":
        if not isinstance(value, dict):
            raise _Mismatch()
        if not spec.args:
            return dict(value)
        ks, vs = spec.args
        out = {}
        for key, val in value.items():
            out[_conform_item(ks, key, key, what="key")] = _conform_item(vs, val, key)
        return out
    if k == "union":
        for option in spec.args:
            try:
                return conform_value(option, value)
            except _Mismatch:
                continue
        raise _Mismatch()
    raise _Mismatch(f"unsupported type {spec}")  # pragma: no cover - every kind is handled above


def _conform_item(spec: TypeSpec, value: Any, where: Any, what: str = "item") -> Any:
    try:
        return conform_value(spec, value)
    except _Mismatch as exc:
        raise _Mismatch(f"{what} {where!r} should be {spec}, got {type(value).__name__} {_short(value)}") from exc


def _yaml_load(raw: str) -> Any:
    try:
        value = yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise _Mismatch(f"not valid YAML: {str(exc).splitlines()[0]}") from exc
    return value


def coerce_raw(spec: TypeSpec, raw: str) -> Any:
    """Coerce a command-line string by the declared type. Raises ``ValueError`` with a reason.

    ``int`` needs an integer literal (``"007"`` → 7; ``"1.5"``, ``"abc"`` fail); ``float`` anything
    ``float()`` accepts; ``bool`` true/false/1/0/yes/no (any case); ``str`` keeps the text verbatim;
    ``list``/``dict``/``tuple`` and unknown types parse as YAML (``[1, 2]``, ``{a: 1}``);
    ``None`` is accepted as none/null/~ where the annotation allows it (``Optional[...]``, ``X | None``).
    """
    k = spec.kind
    text = raw.strip()
    if k == "any":
        value = _yaml_load(raw) if text else raw
        return value if isinstance(value, (type(None), bool, int, float, str, list, dict)) else raw
    if k == "none":
        if text.lower() in _NONE_WORDS:
            return None
        raise _Mismatch("write none or null")
    if k == "str":
        return raw
    if k == "int":
        try:
            return int(text)
        except ValueError:
            raise _Mismatch("not an integer") from None
    if k == "float":
        try:
            return float(text)
        except ValueError:
            raise _Mismatch("not a number") from None
    if k == "bool":
        if text.lower() in _TRUE_WORDS:
            return True
        if text.lower() in _FALSE_WORDS:
            return False
        raise _Mismatch("use true/false, yes/no or 1/0")
    if k == "literal":
        for allowed in spec.args:
            if isinstance(allowed, str) and allowed == raw:
                return allowed
        loaded = _yaml_load(raw)
        try:
            return conform_value(spec, loaded)
        except _Mismatch:
            raise _Mismatch() from None
    if k in ("list", "tuple", "dict"):
        loaded = _yaml_load(raw)
        try:
            return conform_value(spec, loaded)
        except _Mismatch as exc:
            hint = "a YAML mapping such as {a: 1}" if k == "dict" else "a YAML list such as [1, 2]"
            reason = str(exc) or f"write {hint}"
            raise _Mismatch(reason) from None
    if k == "union":
        if spec.nullable and text.lower() in _NONE_WORDS:
            return None
        options = [o for o in spec.args if o.kind != "none"]
        options.sort(key=lambda o: o.kind == "str")  # str last: it accepts anything
        for option in options:
            try:
                return coerce_raw(option, raw)
            except _Mismatch:
                continue
        raise _Mismatch()
    raise _Mismatch(f"unsupported type {spec}")  # pragma: no cover


def validate_parameters(notebook_path: str | os.PathLike, params: Mapping[str, Any], *, raw: bool) -> dict[str, Any]:
    """Check ``params`` against the notebook's declared parameters and return the coerced values.

    ``raw=True``: values are command-line strings, coerced by the declared annotation (see
    :func:`coerce_raw`). ``raw=False``: values are already typed (YAML) and are checked against it
    (see :func:`conform_value`). Every problem is collected; raises :class:`ParameterError` with one
    line per problem, e.g. ``parameter 'n_draws' of 01_delta_errors expects int, got str '12x'`` or
    ``unknown parameter 'foo' for 01_delta_errors; allowed: n_draws, seed``.
    """
    path = Path(notebook_path)
    declared = notebook_parameters(path)
    stem = path.stem
    errors: list[str] = []
    out: dict[str, Any] = {}
    for name, value in params.items():
        if name not in declared:
            allowed = ", ".join(declared) if declared else "(none: the notebook declares no parameters)"
            errors.append(f"unknown parameter {name!r} for {stem}; allowed: {allowed}")
            continue
        spec = parse_type(declared[name]["inferred_type_name"])
        try:
            if raw and isinstance(value, str):
                out[name] = coerce_raw(spec, value)
            else:
                out[name] = conform_value(spec, value)
        except _Mismatch as exc:
            got = repr(value) if raw and isinstance(value, str) else f"{type(value).__name__} {_short(value)}"
            reason = f" ({exc})" if str(exc) else ""
            errors.append(f"parameter {name!r} of {stem} expects {spec}, got {got}{reason}")
    if errors:
        raise ParameterError(errors)
    return out


# --------------------------------------------------------------------------------------------------
# execution


@dataclass
class ExecutionResult:
    """The outcome of one notebook execution.

    ``status`` is ``"done"``, ``"failed"`` or ``"skipped"``; ``output`` is the executed copy (the
    ``*.failed.ipynb`` copy on failure, when one was written). For failures, ``ename``/``evalue`` are
    the exception name and value, ``cell_index`` the index of the failing cell in the executed copy
    (which has an extra ``injected-parameters`` cell when parameters were given), ``exec_count`` its
    ``In [n]`` number, ``source`` its code and ``traceback`` the kernel's traceback lines.
    """

    notebook: Path
    output: Path | None
    parameters: dict[str, Any] = field(default_factory=dict)
    status: str = "done"
    ename: str | None = None
    evalue: str | None = None
    cell_index: int | None = None
    exec_count: int | None = None
    source: str | None = None
    traceback: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """True unless the execution failed."""
        return self.status != "failed"

    def failing_line(self) -> tuple[int, str] | None:
        """``(line number, code)`` of the line of the failing cell that raised, from the traceback."""
        if self.source is None:
            return None
        for entry in self.traceback:
            text = _ANSI.sub("", entry)
            m = re.match(r"\s*Cell\s+In\s*\[\d*\],\s*line\s+(\d+)", text)
            if m:
                lines = self.source.splitlines()
                n = int(m[1])
                return (n, lines[n - 1].strip()) if 0 < n <= len(lines) else None
        return None

    def error_summary(self) -> str:
        """``"cell 3 (In [2]): ValueError: boom"``, or ``""`` when nothing failed."""
        if self.status != "failed":
            return ""
        where = ""
        if self.cell_index is not None:
            where = f"cell {self.cell_index}"
            if self.exec_count is not None:
                where += f" (In [{self.exec_count}])"
            where += ": "
        return f"{where}{self.ename}: {self.evalue}"


def failed_path(output: str | os.PathLike) -> Path:
    """Where the executed copy of a failed run is kept: ``NAME.ipynb`` → ``NAME.failed.ipynb``."""
    out = Path(output)
    return out.with_name(f"{out.stem}.failed.ipynb")


def _escape_braces(path: Path) -> str:
    # papermill formats input/output paths with the parameters (str.format): keep braces literal.
    return str(path).replace("{", "{{").replace("}", "}}")


def execute(
    notebook: str | os.PathLike,
    output: str | os.PathLike,
    parameters: Mapping[str, Any] | None = None,
    *,
    kernel_name: str | None = DEFAULT_KERNEL,
    cwd: str | os.PathLike | None = None,
    progress_bar: bool = True,
    start_timeout: int = 60,
    execution_timeout: int | None = None,
) -> ExecutionResult:
    """Execute ``notebook`` with papermill and write the executed copy to ``output`` atomically.

    The notebook runs into a hidden temp file in ``output``'s folder; on success it is renamed
    (``os.replace``) to ``output`` — so an existing ``output`` always is a complete, successful run —
    and a stale ``*.failed.ipynb`` copy is removed. On failure the partial copy (papermill saves it
    cell by cell, with the traceback) is renamed to :func:`failed_path` and the result carries the
    error; execution errors never raise. ``parameters`` should already be validated
    (:func:`validate_parameters`). ``cwd`` is the kernel's working directory (default: the repository
    root). Unlike papermill's own ``cwd=`` (a process-wide ``os.chdir``), the directory is handed to
    the kernel launch, so several executions may run in threads at once.
    """
    import papermill
    from papermill.exceptions import PapermillExecutionError

    src = Path(notebook).resolve()
    dst = Path(output).resolve()
    dst.parent.mkdir(parents=True, exist_ok=True)
    work_dir = Path(cwd).resolve() if cwd is not None else repo_root()
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dst.stem}.", suffix=".tmp.ipynb", dir=dst.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    params = dict(parameters or {})
    result = ExecutionResult(notebook=src, output=None, parameters=params)
    start = time.perf_counter()
    try:
        papermill.execute_notebook(
            _escape_braces(src),
            _escape_braces(tmp),
            parameters=params or None,
            kernel_name=kernel_name,
            progress_bar=progress_bar,
            start_timeout=start_timeout,
            execution_timeout=execution_timeout,
            resources={"metadata": {"path": str(work_dir)}},
        )
    except PapermillExecutionError as exc:
        result.status = "failed"
        result.ename, result.evalue = exc.ename, exc.evalue
        result.cell_index, result.exec_count, result.source = exc.cell_index, exc.exec_count, exc.source
        result.traceback = list(exc.traceback or [])
    except Exception as exc:  # kernel died, timed out, missing kernel, unreadable notebook...
        result.status = "failed"
        result.ename, result.evalue = type(exc).__name__, str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    except BaseException:  # KeyboardInterrupt: leave nothing half-written behind
        tmp.unlink(missing_ok=True)
        raise
    result.seconds = time.perf_counter() - start
    if result.status == "done":
        os.replace(tmp, dst)
        failed_path(dst).unlink(missing_ok=True)
        result.output = dst
    elif tmp.exists() and tmp.stat().st_size > 0:
        os.replace(tmp, failed_path(dst))
        result.output = failed_path(dst)
    else:
        tmp.unlink(missing_ok=True)
    return result


# --------------------------------------------------------------------------------------------------
# sweeps


def read_yaml(path: str | os.PathLike, what: str = "file") -> Any:
    """Load a YAML file; a :class:`NotebookError` names the file (``what`` says which kind) on failure."""
    path = Path(path)
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise NotebookError(f"cannot read {what} {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise NotebookError(f"{what} {path} is not valid YAML: {exc}") from exc


def load_parameter_sets(spec: Any) -> list[dict[str, Any]]:
    """Parameter sets from a sweep specification (a YAML file path, or the loaded object).

    Accepted shapes:

    * a list of mappings — each one parameter set;
    * a mapping ``name -> value``: list values are grid axes, scalar values are fixed for every set;
      the sets are the cartesian product in the given key order (to fix a list-valued parameter,
      wrap it: ``xs: [[1, 2]]``);
    * ``{grid: {...}}`` (the mapping above) or ``{sets: [...]}`` (the list above).

    Raises :class:`NotebookError` for any other shape, an empty axis or a non-string name.
    """
    if isinstance(spec, (str, os.PathLike)):
        spec = read_yaml(spec, "sweep file")
    if isinstance(spec, dict) and len(spec) == 1:
        (key, inner), = spec.items()
        if key == "grid" and isinstance(inner, dict):
            spec = inner
        elif key == "sets" and isinstance(inner, list):
            spec = inner
    if isinstance(spec, list):
        sets = []
        for i, item in enumerate(spec):
            if not isinstance(item, dict):
                raise NotebookError(f"sweep set #{i + 1} is {type(item).__name__} {_short(item)}, not a mapping name: value")
            sets.append(dict(item))
    elif isinstance(spec, dict):
        axes: list[list[Any]] = []
        for name, values in spec.items():
            if isinstance(values, list):
                if not values:
                    raise NotebookError(f"sweep axis {name!r} has no values")
                axes.append(values)
            else:
                axes.append([values])
        sets = [dict(zip(spec.keys(), combo)) for combo in itertools.product(*axes)]
    else:
        raise NotebookError(
            "a sweep file holds a list of parameter sets, a mapping name -> list of values (grid), "
            f"{{grid: {{...}}}} or {{sets: [...]}}; got {type(spec).__name__}"
        )
    for s in sets:
        bad = [k for k in s if not isinstance(k, str)]
        if bad:
            raise NotebookError(f"parameter names must be strings, got {bad[0]!r}")
    if not sets:
        raise NotebookError("the sweep holds no parameter sets")
    return sets


def _safe_value(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        text = ",".join(_safe_value(v) for v in value)
    elif isinstance(value, dict):
        text = ",".join(f"{_safe_value(k)}-{_safe_value(v)}" for k, v in value.items())
    else:
        text = str(value)
    text = re.sub(r"[^A-Za-z0-9._,+\-]+", "_", text)
    return text or "_"


def sweep_output_name(stem: str, params: Mapping[str, Any], order: Sequence[str] | None = None) -> str:
    """File name of one sweep execution: ``<stem>__<name>=<value>__...ipynb``.

    Names follow ``order`` (the notebook's declaration order), then the remaining keys sorted; values
    are made filename-safe (lists joined by commas, other characters replaced by ``_``). A name longer
    than ~150 characters is cut and ends with an 8-character hash of the full parameter set. An empty
    set gives ``<stem>__defaults.ipynb``.
    """
    known = [k for k in (order or []) if k in params]
    keys = known + sorted(k for k in params if k not in known)
    if not keys:
        return f"{stem}__defaults.ipynb"
    base = stem + "".join(f"__{_safe_value(k)}={_safe_value(params[k])}" for k in keys)
    if len(base) + len(".ipynb") > _MAX_NAME:
        digest = hashlib.sha1(json.dumps({k: params[k] for k in keys}, sort_keys=True, default=str).encode()).hexdigest()[:8]
        base = base[: _MAX_NAME - len(".ipynb") - 10] + "__" + digest
    return base + ".ipynb"


@dataclass
class SweepItem:
    """One planned execution of a sweep: its (validated) parameters and executed-copy path."""

    parameters: dict[str, Any]
    output: Path

    @property
    def done(self) -> bool:
        """True when the executed copy exists (it is only renamed into place on success)."""
        return self.output.exists()


def plan_sweep(
    notebook: str | os.PathLike,
    sets: Sequence[Mapping[str, Any]],
    out_dir: str | os.PathLike,
    *,
    fixed: Mapping[str, Any] | None = None,
) -> list[SweepItem]:
    """Validate every set (typed values, plus ``fixed`` values already validated, e.g. from ``-p``)
    and name its executed copy. Raises :class:`ParameterError` listing every problem, including a
    parameter both swept and fixed and two different sets that map to the same file name; identical
    sets are merged."""
    path = Path(notebook)
    order = list(notebook_parameters(path))
    fixed = dict(fixed or {})
    errors: list[str] = []
    items: list[SweepItem] = []
    by_name: dict[str, dict[str, Any]] = {}
    for i, raw_set in enumerate(sets, start=1):
        clash = sorted(set(raw_set) & set(fixed))
        if clash:
            errors.append(f"set #{i}: parameter {clash[0]!r} is both swept and fixed with -p; drop one")
            continue
        try:
            values = validate_parameters(path, raw_set, raw=False)
        except ParameterError as exc:
            errors.extend(f"set #{i}: {e}" for e in exc.errors)
            continue
        merged = {**values, **fixed}
        values = {k: merged[k] for k in order if k in merged}  # declaration order, as in the file name
        name = sweep_output_name(path.stem, values, order)
        if name in by_name:
            if by_name[name] != values:
                errors.append(f"set #{i} {_short(values)} and set {_short(by_name[name])} give the same file name {name}")
            continue
        by_name[name] = values
        items.append(SweepItem(parameters=values, output=Path(out_dir).resolve() / name))
    if errors:
        raise ParameterError(errors)
    return items


def run_sweep(
    notebook: str | os.PathLike,
    items: Sequence[SweepItem],
    *,
    jobs: int = 1,
    force: bool = False,
    kernel_name: str | None = DEFAULT_KERNEL,
    cwd: str | os.PathLike | None = None,
    progress: Callable[[ExecutionResult], None] | None = None,
    progress_bar: bool = False,
) -> list[ExecutionResult]:
    """Execute the planned sweep (see :func:`plan_sweep`), ``jobs`` at a time (threads: each execution
    starts its own kernel). Items whose executed copy exists are skipped unless ``force``. ``progress``
    is called with each result as it completes (skipped ones first). Returns results in plan order."""
    if jobs < 1:
        raise ValueError(f"jobs must be >= 1, got {jobs}")
    results: dict[int, ExecutionResult] = {}
    todo: list[int] = []
    for i, item in enumerate(items):
        if item.done and not force:
            results[i] = ExecutionResult(notebook=Path(notebook), output=item.output, parameters=item.parameters, status="skipped")
            if progress:
                progress(results[i])
        else:
            todo.append(i)

    def one(i: int) -> ExecutionResult:
        item = items[i]
        return execute(notebook, item.output, item.parameters, kernel_name=kernel_name, cwd=cwd, progress_bar=progress_bar)

    if jobs == 1:
        for i in todo:
            results[i] = one(i)
            if progress:
                progress(results[i])
    else:
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="fda-sweep")
        try:
            futures = {pool.submit(one, i): i for i in todo}
            for fut in concurrent.futures.as_completed(futures):
                results[futures[fut]] = fut.result()
                if progress:
                    progress(results[futures[fut]])
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    return [results[i] for i in range(len(items))]
