"""Code revisions: a fingerprint of the source code an experiment depends on.

The result store keys a finished run by its config; a change to the training code must not let it serve
runs of the old code. :func:`code_revision` hashes the package modules an experiment's module imports,
directly or indirectly (its import closure inside ``fda_core``, found by parsing the import statements,
including those inside functions), so any change to code the experiment can run changes the revision,
while unrelated modules (a figure, the CLI) do not. Docstrings, comments, formatting and the wording of
messages are not part of the hash (each module's syntax tree is hashed with its docstrings removed and the
literal text of its error, assertion and warning messages blanked), so editing documentation or rewording an
error does not invalidate stored runs.

Code defined outside the package (a method written in a notebook cell) has no module file in the
closure: :func:`object_revision` hashes its source text instead.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import inspect
from pathlib import Path
from typing import Any

__all__ = ["code_revision", "import_closure", "imports_of", "object_revision"]

_PACKAGE = "fda_core"
_ROOT = Path(__file__).resolve().parents[1]  # the fda_core/ folder


def _path_of(module: str) -> Path | None:
    """The file of a dotted ``fda_core`` module (package → its __init__.py), or None."""
    parts = module.split(".")
    if parts[0] != _PACKAGE:
        return None
    base = _ROOT.joinpath(*parts[1:])
    for p in (base.with_suffix(".py"), base / "__init__.py"):
        if p.is_file():
            return p
    return None


def imports_of(path: str | Path, module: str) -> list[tuple[int, str]]:
    """(line, absolute dotted name) of every import statement in the file ``path`` of module ``module``
    (e.g. ``"fda_core.core.theory"``), including those inside functions; relative imports are resolved,
    and ``from package import name`` also yields ``package.name`` (it may be a module)."""
    path = Path(path)
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            if mod:
                found.append((node.lineno, mod))
            found += [(node.lineno, f"{mod}.{a.name}") for a in node.names]
    return found


def _imports(path: Path, module: str) -> set[str]:
    """Dotted names of the fda_core modules ``path`` imports."""
    return {m for _, m in imports_of(path, module) if m.split(".")[0] == _PACKAGE and _path_of(m) is not None}


def import_closure(*modules: str) -> list[str]:
    """Every ``fda_core`` module reachable by imports from ``modules`` (themselves included), sorted;
    each module's parent packages are included too (importing a module runs their ``__init__``)."""
    todo = list(modules)
    seen: set[str] = set()
    while todo:
        mod = todo.pop()
        if mod in seen:
            continue
        path = _path_of(mod)
        if path is None:
            raise ValueError(f"{mod!r} is not a module of {_PACKAGE}")
        seen.add(mod)
        parts = mod.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        todo.extend(_imports(path, mod) - seen)
    return sorted(seen)


def _blank_text(node: ast.AST) -> None:
    """Blank every literal string inside ``node`` (the text of a message; the expressions an f-string
    formats stay)."""
    for child in ast.walk(node):
        if isinstance(child, ast.Constant) and isinstance(child.value, str):
            child.value = ""


def _is_warn(call: ast.AST) -> bool:
    """Whether ``call`` is ``warn(...)`` or ``<anything>.warn(...)`` (``warnings.warn``)."""
    if not isinstance(call, ast.Call):
        return False
    f = call.func
    return (isinstance(f, ast.Name) and f.id == "warn") or (isinstance(f, ast.Attribute) and f.attr == "warn")


class _StripText(ast.NodeTransformer):
    """Removes docstrings and blanks the text of messages: the exception a ``raise`` builds, an ``assert``'s
    message, a ``warn(...)`` call's arguments. None of these can change the numbers of a run that finished: a
    raise or a failed assert ends it, a warning only prints. Which exception is raised, and when, stays."""

    def _strip(self, node: Any) -> Any:
        self.generic_visit(node)
        body = getattr(node, "body", None)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
        return node

    visit_Module = visit_FunctionDef = visit_AsyncFunctionDef = visit_ClassDef = _strip

    def visit_Raise(self, node: ast.Raise) -> ast.Raise:
        if node.exc is not None:
            _blank_text(node.exc)
        return node

    def visit_Assert(self, node: ast.Assert) -> ast.Assert:
        if node.msg is not None:
            _blank_text(node.msg)
        return node

    def visit_Expr(self, node: ast.Expr) -> ast.Expr:
        if _is_warn(node.value):
            _blank_text(node.value)
        else:
            self.generic_visit(node)
        return node


def _normalised(source: str) -> str:
    """The syntax tree of ``source`` without docstrings and with the literal text of its messages blanked
    (:class:`_StripText`; comments and layout are not in the tree)."""
    return ast.dump(_StripText().visit(ast.parse(source)), annotate_fields=False)


@functools.lru_cache(maxsize=64)
def _revision(modules: tuple[str, ...], stamps: tuple[tuple[str, int, int], ...]) -> str:
    """The hash of ``modules``' normalised sources; ``stamps`` (file, modification time, size) only key the cache,
    so an edited file is read again."""
    h = hashlib.sha256()
    for mod in modules:
        h.update(mod.encode())
        h.update(_normalised(_path_of(mod).read_text(encoding="utf-8")).encode())  # type: ignore[union-attr]
    return h.hexdigest()[:12]


def code_revision(*modules: str) -> str:
    """12 hex digits identifying the code of ``modules`` and everything in ``fda_core`` they import.

    Example: ``code_revision("fda_core.experiments.federated")`` changes when the round loop, a method, an
    aggregation rule, a dataset or a model changes, not when a plotting function or a docstring does.
    """
    closure = tuple(import_closure(*modules))
    stamps = tuple((str(p), p.stat().st_mtime_ns, p.stat().st_size) for m in closure if (p := _path_of(m)) is not None)
    return _revision(closure, stamps)


def _code_text(code: Any) -> str:
    """Bytecode and constants of a code object, nested code objects included (no memory addresses)."""
    consts = [_code_text(c) if inspect.iscode(c) else repr(c) for c in code.co_consts]
    return code.co_code.hex() + "|" + "|".join(consts)


def object_revision(obj: Any) -> str:
    """12 hex digits of the source text of a class or function defined outside ``fda_core`` (e.g. in a
    notebook cell); for a class, of each function it defines (class source is not retrievable for
    classes defined in a Jupyter kernel). Objects of ``fda_core`` return ``""`` (covered by
    :func:`code_revision`); objects without retrievable source hash their bytecode and constants."""
    module = getattr(obj, "__module__", "") or ""
    if module.split(".")[0] == _PACKAGE:
        return ""
    pieces: list[str] = []
    members = [obj] if not inspect.isclass(obj) else [
        v for c in inspect.getmro(obj) if (getattr(c, "__module__", "") or "").split(".")[0] != _PACKAGE
        and c is not object for v in vars(c).values()]
    for member in members:
        fn = getattr(member, "__func__", member)
        if inspect.isclass(fn) or not callable(fn):
            pieces.append(repr(fn) if isinstance(fn, (str, int, float, bool, tuple)) else "")
            continue
        try:
            pieces.append(inspect.getsource(fn))
        except (OSError, TypeError):
            code = getattr(fn, "__code__", None)
            pieces.append("" if code is None else _code_text(code))
    return hashlib.sha256("\n".join(pieces).encode()).hexdigest()[:12]
