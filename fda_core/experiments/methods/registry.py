"""One registry of methods, found by name (``get_method("fedgp_auto")``), with the former names, the
``variant`` switch between the papers' code and the library's forms, and display labels."""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Mapping
from typing import Any

from ...common.checks import check_choice
from ...core import aggregation
from .fda import FDAMethod, FedAvg, FedDA, FedDAAuto, FedGP, FedGPAuto, FinetuneOffline, Oracle, TargetOnly, _rule_method
from .interface import Method


_REGISTRY: dict[str, type[Method]] = {}

#: Former names of what are now options of a method (``run_experiment(rule=...)`` keeps accepting them).
METHOD_ALIASES: dict[str, tuple[str, dict[str, Any]]] = {
    "fedgp_cosine": ("fedgp", {"projection": "cosine"}),
    "fedgp_nofilter": ("fedgp", {"filter": False}),
    "fedavg": ("source_only", {}),
}


def register_method(obj: Any = None, /, *, name: str | None = None, label: str | None = None,
                    overwrite: bool = False) -> Any:
    """Register a method class, or build one from a server function; usable as a decorator.

    * ``@register_method`` on a :class:`Method` subclass (its ``name`` and ``label`` class attributes);
    * ``@register_method("name", label="Label")`` on a function ``fn(rnd, res) -> Tensor (m,)``: an
      :class:`FDAMethod` whose server combines the round with ``fn`` (the returned update is used as is;
      :meth:`RoundResults.aligned_source_updates` gives magnitude-aligned source updates).

    A name must be a lower-case identifier not used by another method (re-registering a method defined
    outside ``fda_core``, e.g. a notebook cell run twice, replaces it; replacing a built-in needs
    ``overwrite=True``). Returns the class (or decorated function's class).
    """
    if isinstance(obj, str) or obj is None:
        the_name = obj if isinstance(obj, str) else name

        def deco(target: Any) -> Any:
            return register_method(target, name=the_name, label=label, overwrite=overwrite)

        return deco
    if inspect.isclass(obj) and issubclass(obj, Method):
        cls = obj
        if name is not None:
            cls.name = name
        if label is not None:
            cls.label = label
    elif callable(obj):
        fn = obj
        if name is None:
            name = getattr(fn, "__name__", "")

        def combine(self, rnd, res, out, _fn=fn):
            out.copy_(_fn(rnd, res))
            return None

        cls = type(f"Function_{name}", (FDAMethod,), {
            "name": name, "label": label or name, "combine": combine, "__doc__": fn.__doc__,
            "__module__": getattr(fn, "__module__", __name__), "server_function": staticmethod(fn)})
    else:
        raise ValueError(f"register_method takes a Method subclass or a function, got {type(obj).__name__}")
    if not isinstance(cls.name, str) or not cls.name.isidentifier() or cls.name != cls.name.lower():
        raise ValueError(f"method name must be a lower-case identifier, got {cls.name!r}")
    if not cls.label:
        cls.label = cls.name
    if cls.name in METHOD_ALIASES:
        raise ValueError(f"{cls.name!r} is a former method name, now {METHOD_ALIASES[cls.name]}; choose another name")
    old = _REGISTRY.get(cls.name)
    if old is not None and old is not cls and not overwrite and old.__module__.startswith("fda_core"):
        raise ValueError(f"method name {cls.name!r} is taken by the built-in {old.__qualname__}; "
                         "choose another name or pass overwrite=True")
    _REGISTRY[cls.name] = cls
    return obj if not inspect.isclass(obj) or obj is cls else cls


for _cls in (FedAvg, TargetOnly, FedDA, FedGP, FedDAAuto, FedGPAuto, FinetuneOffline, Oracle):
    register_method(_cls)


def _load_extensions() -> None:
    """Register the methods defined in their own modules (imported here, so that they are part of the code
    revision of every run): the weakly-supervised FDA paper's FedAvg Finetune and AuxInfo; the personalisation
    baselines (Ditto, FedRep, APFL, KNN-per) and the unsupervised FDA baselines (FADA, KD3A), docs/baselines.md."""
    from .. import auxiliary  # noqa: F401  (registers its methods on import)
    from .. import personalisation  # noqa: F401  (Ditto, FedRep, APFL, KNN-per)
    from .. import fda_baselines  # noqa: F401  (FADA, KD3A)


def list_methods() -> list[str]:
    """Canonical names of the registered methods (built-ins first, in the papers' table order)."""
    _load_extensions()
    return list(_REGISTRY)


def method_class(name: str) -> type[Method]:
    """The class registered under ``name`` (a former name resolves to its method; an aggregation rule
    registered in :mod:`fda_core.core.aggregation` without a method of its own gets a :class:`RuleMethod`)."""
    if isinstance(name, str) and name in METHOD_ALIASES:
        name = METHOD_ALIASES[name][0]
    if isinstance(name, str) and name not in _REGISTRY:
        _load_extensions()
    if isinstance(name, str) and name in _REGISTRY:
        return _REGISTRY[name]
    if isinstance(name, str) and name in aggregation.RULES:
        return _rule_method(name)
    allowed = list_methods() + sorted(METHOD_ALIASES)
    raise ValueError(f"unknown method {name!r}; rule must be one of {allowed}")


def get_method(name: str | Mapping[str, Mapping[str, Any]], **options: Any) -> Method:
    """A fresh instance of method ``name`` with ``options`` (validated: ValueError names the option).

    ``name`` may also be a spec string, ``"fedgp(beta=1.0)"``, or ``{"fedgp": {"beta": 1.0}}`` (see
    :func:`parse_method_spec`), or a
    former name (``"fedgp_cosine"`` → ``fedgp`` with ``projection="cosine"``)."""
    if isinstance(name, Mapping) or (isinstance(name, str) and "(" in name):
        name, parsed = parse_method_spec(name)
        options = {**parsed, **options}
    if isinstance(name, str) and name in METHOD_ALIASES:
        canonical, implied = METHOD_ALIASES[name]
        clash = {k for k in implied if k in options and options[k] != implied[k]}
        if clash:
            raise ValueError(f"{name!r} means {canonical!r} with {implied}; it cannot take {sorted(clash)} = "
                             f"{[options[k] for k in sorted(clash)]}")
        name, options = canonical, {**options, **implied}
    return method_class(name)(**options)


def parse_method_spec(spec: str | Mapping[str, Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """``"fedgp"`` → ("fedgp", {}); ``"fedgp(beta=1, projection='cosine')"`` → ("fedgp", {"beta": 1,
    "projection": "cosine"}); the mapping form ``{"fedgp": {"beta": 1}}`` (what a notebook parameter or a
    YAML file can hold without '=' signs) → ("fedgp", {"beta": 1}). Values are Python literals.
    ValueError names the malformed spec."""
    if isinstance(spec, Mapping):
        if len(spec) == 1:
            (name, opts), = spec.items()
            if isinstance(name, str) and isinstance(opts, Mapping):
                return name, dict(opts)
        raise ValueError(f"malformed method spec {spec!r}: a mapping spec has one key, the method's name, "
                         "and a mapping of options, e.g. {'fedgp': {'beta': 1.0}}")
    if not isinstance(spec, str):
        raise ValueError(f"a method spec must be a string such as 'fedgp' or 'fedgp(beta=1)', got {spec!r}")
    try:
        node = ast.parse(spec.strip(), mode="eval").body
        if isinstance(node, ast.Name):
            return node.id, {}
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args:
            return node.func.id, {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except (SyntaxError, ValueError):
        pass
    raise ValueError(f"malformed method spec {spec!r}: write a method name, optionally with keyword options, "
                     "e.g. 'fedgp' or \"fedgp(beta=1.0, projection='cosine')\"")


#: Options that make a method the papers' reference implementation ("reference") or the library's earlier
#: defaults ("library"); ``docs/reproduction.md`` § Reference-exact options. A method not listed is the same in both.
VARIANTS: dict[str, dict[str, dict[str, Any]]] = {
    # the papers' code: FedGP and FedGP_Auto project per layer with the cosine filter and magnitude alignment
    # (FedGP paper App. B.2 Eq. B.2); FedDA and FedDA_Auto combine the source updates as sent
    "reference": {"fedgp": {"projection": "cosine"}, "fedgp_auto": {"projection": "cosine"}, "fedda": {"align": False},
                  "fedda_auto": {"align": False}},
    # exact projection on the whole update vector (the theory's Proj₊), FedDA and FedDA_Auto on aligned updates
    "library": {"fedgp": {"projection": "exact"}, "fedgp_auto": {"projection": "exact"}, "fedda": {"align": True},
                "fedda_auto": {"align": True}},
}


def with_variant(spec: str | Mapping[str, Mapping[str, Any]], variant: str) -> dict[str, dict[str, Any]]:
    """The method spec ``spec`` with the options of ``variant`` ("reference" or "library", :data:`VARIANTS`)
    filled in where ``spec`` does not set them, as a mapping spec ``{name: {option: value}}``. FedGP without
    the filter keeps its projection, the exact one unless ``spec`` names another (``projection="cosine"`` drops the
    filter alone from the papers' rule: ``docs/reproduction.md`` row 20, not yet the reference variant's default).
    ValueError names an unknown variant."""
    check_choice(variant, "variant", tuple(VARIANTS))
    method = get_method(spec)
    given = parse_method_spec(spec)[1] if (isinstance(spec, Mapping) or "(" in str(spec)) else {}
    fill = dict(VARIANTS[variant].get(method.name, {}))
    if method.name == "fedgp" and not method.filter:
        fill.pop("projection", None)
    return {method.name: {**method.changed_options, **{k: v for k, v in fill.items() if k not in given}}}


# option tags of the workbook's labels that name the papers' own implementation, not a different method
_IMPLEMENTATION_TAGS = (r"cosine", r"\d+ epochs/round", r"lr [0-9.e-]+")


def paper_label(label: str) -> str:
    """The papers' name of a workbook display label: drops the option tags that only say how the paper
    implemented the method (``"FedGP (β=1, cosine)"`` → ``"FedGP (β=1)"``, ``"Oracle (20 epochs/round)"``
    → ``"Oracle"``)."""
    m = re.fullmatch(r"(.*?) \((.*)\)", label)
    if not m:
        return label
    kept = [t.strip() for t in m.group(2).split(",")
            if not any(re.fullmatch(p, t.strip()) for p in _IMPLEMENTATION_TAGS)]
    return f"{m.group(1)} ({', '.join(kept)})" if kept else m.group(1)


def method_label(spec: str | Method, **options: Any) -> str:
    """Display label of a method spec or instance, e.g. ``method_label("fedgp(beta=1)")`` → ``"FedGP (β=1)"``."""
    method = spec if isinstance(spec, Method) else get_method(spec, **options)
    return method.display_label
