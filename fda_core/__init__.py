"""fda_core — the library behind the FDA workbook.

Modules (one idea each): ``aggregation`` (rules and registry), ``theory`` (closed-form Delta errors,
phase diagram, Monte-Carlo checks), ``estimators`` (unbiased σ², d², τ²d², auto-β, part gradients),
``results`` (atomic writes, metadata), ``plotting`` (one style, PNG+PDF+CSV), ``cli`` (``fda`` command).
β weights the SOURCE part throughout.
"""

__version__ = "0.1.0"

from .aggregation import (  # noqa: E402
    fedda,
    fedda_auto,
    fedgp,
    fedgp_auto,
    fedgp_cosine,
    get_rule,
    list_rules,
    source_only,
    target_only,
)
from .estimators import auto_beta, estimate_deltas, part_gradients  # noqa: E402

__all__ = [
    "__version__",
    "source_only",
    "target_only",
    "fedda",
    "fedgp",
    "fedgp_cosine",
    "fedda_auto",
    "fedgp_auto",
    "get_rule",
    "list_rules",
    "estimate_deltas",
    "auto_beta",
    "part_gradients",
]
