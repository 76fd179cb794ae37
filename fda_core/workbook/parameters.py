"""Notebook parameters: the declarations of the cell tagged ``parameters`` (``name: type = default  # help``),
a small type system for them, declared ranges, and validation of user values *before* anything runs
(papermill's own ``-p`` coercion would turn ``"007"`` into ``7`` and lists into strings).

Ranges
------
The help comment may end with the range of allowed values, separated from the text by a space::

    beta: float = 0.5  # β of FedDA/FedGP (weight of the source part) [0, 1]
    lr: float = 0.2  # learning rate > 0
    momentum: float = 0.9  # SGD momentum [0, 1)
    n_parts: int = 2  # B: target parts ≥ 2
    B_values: list = [2, 4]  # numbers of target parts B ≥ 2

An interval ``[a, b]``, ``(a, b]``, ``[a, b)`` or ``(a, b)`` (square bracket: bound included, round:
excluded; ``inf`` / ``-inf`` for no bound) or one bound ``≥ a``, ``> a``, ``≤ b``, ``< b``, where a
and b are numbers (``1``, ``0.5``, ``1e-3``), as the very last thing in the comment. Write ``≥``/``≤``
(or ``[a, inf)``), not ``>=``/``<=``: papermill skips any declaration line holding two ``=`` signs, so
those are rejected with a message. A range applies to
numbers (ints and floats, not bools); for a list or tuple parameter it applies to every element (nested
lists: every number in them). ``None`` (for ``Optional`` parameters) and strings are not checked. A value
outside its range is rejected by :func:`validate_parameters` (``fda`` exits 2, nothing runs); ``fda list``
shows the ranges. A bracket elsewhere in the comment is just text.

Choices
-------
A string parameter with a fixed set of values, or a list of such strings, ends its help comment with the
set instead, as a Python set of double-quoted strings::

    variant: str = "reference"  # method variants: the papers' code or the library's {"reference", "library"}
    sections: list = ["label_shift"]  # parts to run {"faithful", "label_shift", "ablations"}

A string outside the set (for a list: any element that is not one of them) is rejected as a value outside
its range is, before anything runs, and ``fda list`` shows the choices. ``None`` (for ``Optional``
parameters) is not checked. The notebook keeps its own check for runs started from Jupyter; the tests
compare the two sets.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import io
import math
import os
import re
import tokenize
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from .discovery import NotebookError, ParameterError

__all__ = ["TypeSpec", "Range", "notebook_parameters", "parse_type", "parse_range", "parameter_range", "check_range",
           "parse_choices", "parameter_choices", "check_choices", "choices_words",
           "coerce_raw", "conform_value", "validate_parameters", "default_values"]

_NONE_WORDS = frozenset({"none", "null", "~"})
_TRUE_WORDS = frozenset({"true", "1", "yes"})
_FALSE_WORDS = frozenset({"false", "0", "no"})

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


# --------------------------------------------------------------------------------------------------
# ranges

_NUM = r"[-+]?(?:inf|(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)"
_INTERVAL = re.compile(rf"(?:^|\s)(?P<lb>[\[(])\s*(?P<lo>{_NUM})\s*,\s*(?P<hi>{_NUM})\s*(?P<rb>[\])])\s*$")
_BOUND = re.compile(rf"(?:^|\s)(?P<op>≥|≤|>|<)\s*(?P<num>{_NUM})\s*$")
_ASCII_BOUND = re.compile(rf"(?:^|\s)(?P<op>>=|<=|=>|=<)\s*(?P<num>{_NUM})\s*$")


@dataclass(frozen=True)
class Range:
    """Allowed values of a numeric parameter: ``low``/``high`` (None: unbounded), each included unless
    ``low_open``/``high_open``. ``x in rng`` tests a number."""

    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False

    def __post_init__(self) -> None:
        lo = -math.inf if self.low is None else self.low
        hi = math.inf if self.high is None else self.high
        if math.isnan(lo) or math.isnan(hi) or lo > hi or (lo == hi and (self.low_open or self.high_open)):
            raise ValueError(f"empty range {self}")

    def __contains__(self, value: Any) -> bool:
        x = float(value)
        if math.isnan(x):
            return False
        if self.low is not None and (x <= self.low if self.low_open else x < self.low):
            return False
        return not (self.high is not None and (x >= self.high if self.high_open else x > self.high))

    def __str__(self) -> str:
        def num(v: float) -> str:
            return str(int(v)) if float(v).is_integer() else repr(float(v))

        if self.low is not None and self.high is not None:
            return f"{'(' if self.low_open else '['}{num(self.low)}, {num(self.high)}{')' if self.high_open else ']'}"
        if self.low is not None:
            return f"{'>' if self.low_open else '≥'} {num(self.low)}"
        if self.high is not None:
            return f"{'<' if self.high_open else '≤'} {num(self.high)}"
        return "any number"


def parse_range(help_text: str) -> tuple[Range | None, str]:
    """Split a parameter's help comment into its trailing range (see the module docstring) and the rest.

    ``"β of FedDA [0, 1]"`` → ``(Range(0, 1), "β of FedDA")``; ``"a knob"`` → ``(None, "a knob")``.
    Raises ``ValueError`` for an empty range such as ``[1, 0]`` and for a trailing ``>= a`` / ``<= b``
    (papermill skips a declaration line holding two ``=``: write ``≥ a`` or ``[a, inf)``).
    """
    text = (help_text or "").rstrip()
    m = _ASCII_BOUND.search(text)
    if m:
        low = ">" in m["op"]
        interval = f"[{m['num']}, inf)" if low else f"(-inf, {m['num']}]"
        raise ValueError(f"unusable range {m['op']} {m['num']} (papermill cannot parse a declaration line with two "
                         f"'=': write {'≥' if low else '≤'} {m['num']} or {interval})")
    m = _INTERVAL.search(text)
    if m:
        lo, hi = float(m["lo"]), float(m["hi"])
        rng = Range(None if lo == -math.inf else lo, None if hi == math.inf else hi,
                    low_open=m["lb"] == "(" and lo != -math.inf, high_open=m["rb"] == ")" and hi != math.inf)
        return rng, text[: m.start()].rstrip()
    m = _BOUND.search(text)
    if m:
        v, op = float(m["num"]), m["op"]
        if op in (">", "≥"):
            rng = Range(None if v == -math.inf else v, None, low_open=op == ">" and v != -math.inf)
        else:
            rng = Range(None, None if v == math.inf else v, high_open=op == "<" and v != math.inf)
        return rng, text[: m.start()].rstrip()
    return None, text


def parameter_range(info: Mapping[str, str]) -> Range | None:
    """The declared range of one parameter (an entry of :func:`notebook_parameters`), or None.
    Raises ``ValueError`` for an empty range."""
    return parse_range(info.get("help", "") or "")[0]


def _numbers(value: Any) -> list[Any]:
    """The numbers a range applies to: the value itself, or every number inside a list/tuple."""
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, (int, float)):
        return [value]
    if isinstance(value, (list, tuple)):
        return [x for item in value for x in _numbers(item)]
    return []


def _range_words(rng: Range) -> str:
    text = str(rng)
    return f"in {text}" if text[0] in "[(" else text


def check_range(name: str, info: Mapping[str, str], value: Any, stem: str) -> str | None:
    """The error message when ``value`` lies outside the declared range of parameter ``name`` of
    notebook ``stem`` (``info``: its entry of :func:`notebook_parameters`), else None."""
    try:
        rng = parameter_range(info)
    except ValueError as exc:
        return f"parameter {name!r} of {stem}: {exc} in its help comment"
    if rng is None:
        return None
    bad = [x for x in _numbers(value) if x not in rng]
    if not bad:
        return None
    if isinstance(value, (list, tuple)):
        return (f"parameter {name!r} of {stem}: every element must be {_range_words(rng)}, got {_short(bad[0])} "
                f"in {_short(value)}")
    return f"parameter {name!r} of {stem} must be {_range_words(rng)}, got {_short(value)}"


# --------------------------------------------------------------------------------------------------
# choices

_CHOICES = re.compile(r'(?:^|\s)\{(?P<items>\s*"[^"{}]*"\s*(?:,\s*"[^"{}]*"\s*)*),?\s*\}\s*$')


def parse_choices(help_text: str) -> tuple[tuple[str, ...] | None, str]:
    """Split a parameter's help comment into its trailing set of choices (see the module docstring) and the rest.

    ``'where runs compute {"auto", "cpu"}'`` → ``(("auto", "cpu"), "where runs compute")``; ``"a knob"`` →
    ``(None, "a knob")``. Raises ``ValueError`` for a set naming a value twice."""
    text = (help_text or "").rstrip()
    m = _CHOICES.search(text)
    if not m:
        return None, text
    choices = tuple(re.findall(r'"([^"]*)"', m["items"]))
    if len(set(choices)) != len(choices):
        raise ValueError(f"choices {set(choices)} name a value twice: {list(choices)}")
    return choices, text[: m.start()].rstrip()


def parameter_choices(info: Mapping[str, str]) -> tuple[str, ...] | None:
    """The declared choices of one parameter (an entry of :func:`notebook_parameters`), or None."""
    return parse_choices(info.get("help", "") or "")[0]


def choices_words(choices: Iterable[str]) -> str:
    """The choices as messages and ``fda list`` write them: ``"cpu", "cuda"``."""
    return ", ".join(f'"{c}"' for c in choices)


def check_choices(name: str, info: Mapping[str, str], value: Any, stem: str) -> str | None:
    """The error message when ``value`` (a string, or a list/tuple of them) is not among the declared choices of
    parameter ``name`` of notebook ``stem`` (``info``: its entry of :func:`notebook_parameters`), else None."""
    try:
        choices = parameter_choices(info)
    except ValueError as exc:
        return f"parameter {name!r} of {stem}: {exc} in its help comment"
    if choices is None or value is None:
        return None
    allowed = choices_words(choices)
    if isinstance(value, (list, tuple)):
        bad = [x for x in value if not isinstance(x, str) or x not in choices]
        return (f"parameter {name!r} of {stem}: every element must be one of {allowed}, got {_short(bad[0])} in "
                f"{_short(value)}") if bad else None
    return None if isinstance(value, str) and value in choices else \
        f"parameter {name!r} of {stem} must be one of {allowed}, got {_short(value)}"


def default_values(notebook_path: str | os.PathLike) -> dict[str, Any]:
    """The notebook's declared defaults that are Python literals (the others are left out)."""
    out: dict[str, Any] = {}
    for name, info in notebook_parameters(notebook_path).items():
        try:
            out[name] = ast.literal_eval(info["default"])
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
    return out


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
    (see :func:`conform_value`). Values are then checked against the declared ranges
    (:func:`parse_range`) and choices (:func:`parse_choices`). Every problem is collected; raises
    :class:`ParameterError` with one line per problem, e.g. ``parameter 'n_draws' of 01_delta_errors expects int, got str '12x'``,
    ``parameter 'beta' of 01_delta_errors must be in [0, 1], got 2.0`` or
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
            continue
        errors += [p for p in (check_range(name, declared[name], out[name], stem),
                               check_choices(name, declared[name], out[name], stem)) if p is not None]
    if errors:
        raise ParameterError(errors)
    return out
