"""fda_core — the library behind the FDA workbook.

Layers (imports point downward only; ``tests/test_layers.py`` checks it):

``common``       atomic files, the result store, seeds, devices, argument checks
``core``         maths on tensors: aggregation rules, estimators, Delta-error theory, symbolic derivations,
                 Stiefel/barycenter/Wasserstein maths of the translators
``data``         datasets (registry) and models (registry)
``experiments``  federated methods (registry) and the engines that run them; the synthetic phase diagram,
                 estimator and Delta-error checks, Fed INB translation; the papers' published numbers
``viz``          figures and slider widgets
``workbook``     the papermill runner, notebook parameters, sweeps, reports and the ``fda`` command

β weights the SOURCE part throughout (``docs/theory.md`` § Conventions).
"""

from importlib import import_module as _import_module
from typing import Any as _Any

from .common import VERSION as __version__

#: public name -> module that defines it (imported on first use, so ``import fda_core.common`` stays light)
_PUBLIC = {
    **{name: "fda_core.core.aggregation" for name in (
        "source_only", "target_only", "fedda", "fedgp", "fedgp_cosine", "fedda_auto", "fedgp_auto", "get_rule",
        "list_rules")},
    **{name: "fda_core.core.estimators" for name in ("estimate_deltas", "auto_beta", "part_gradients")},
    **{name: "fda_core.experiments.methods" for name in (
        "Method", "FDAMethod", "get_method", "list_methods", "register_method", "method_label")},
    **{name: "fda_core.experiments.federated" for name in ("run_experiment", "run_many")},
    "get_dataset": "fda_core.data.datasets",
    "get_model": "fda_core.data.models",
}

__all__ = ["__version__", *_PUBLIC]


def __getattr__(name: str) -> _Any:
    if name in _PUBLIC:
        value = getattr(_import_module(_PUBLIC[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fda_core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_PUBLIC))
