"""The synthetic 9×9 phase-diagram experiment (notebook 02; ``docs/experiments.md`` § Synthetic phase
diagram; FedGP paper § 5 and App. B; auto-weighted FDA paper § 5 and App. B).

The data and the network live in the data layer (:mod:`fda_core.data.synthetic`,
:mod:`fda_core.data.sigmoid_net`); this package runs the experiment:

* :mod:`.selection` — which methods (from the one registry, :mod:`fda_core.experiments.methods`) and
  cells a run covers;
* :mod:`.trainer` — :func:`train_grid`, every training of the grid as one batched computation;
  :mod:`.reference` — :func:`train_single`, one training the plain way (what the trainer is tested against);
  :mod:`.result` — :class:`GridResult`;
* :mod:`.metrics` — :func:`init_metrics`, d², σ², τ²d², estimates and Delta errors at the initialisation;
* :mod:`.compare` — :func:`compare_best`, :func:`agreement_summary` (panels (a)-(c));
* :mod:`.runs` — :func:`run_phase_diagram`, trials through the result store.

Typical use (the notebook's defaults; ≈ 1 min of training and 10 s of metrics on the 2-core CPU)::

    from fda_core.experiments import phase_diagram as P
    data = P.make_phase_diagram_data(n_points=2000, n_trials=1, seed=0)
    res = P.train_grid(data)            # 9 × 9 cells × 6 methods (β = 0.5): res.table, res.curves
    met = P.init_metrics(data)          # d², σ², τ²d², estimates, Δ² (Monte Carlo and closed form)
    best = P.compare_best(res, met)     # per cell: best method by Δ² and by final test loss (panels a, b)
    steps, losses = res.curve(shift_index=4, size_index=2, method="fedgp")   # one cell's curves
"""

from ...data.sigmoid_net import N_PARAMS, init_params, make_network
from ...data.synthetic import (DEFAULT_S_MAX, DEFAULT_SHIFT_LEVELS, PAPER_N_POINTS, PAPER_SUBSET_SIZES, SyntheticData,
                               make_phase_diagram_data, scaled_subset_sizes)
from .compare import agreement_summary, compare_best
from .metrics import cell_metrics, init_metrics
from .reference import train_single
from .result import GridResult
from .runs import run_phase_diagram
from .selection import GridMethod, method_labels, resolve_methods, synthetic_methods
from .trainer import auto_chunk_size, train_grid

__all__ = [
    "N_PARAMS", "init_params", "make_network",
    "DEFAULT_S_MAX", "DEFAULT_SHIFT_LEVELS", "PAPER_N_POINTS", "PAPER_SUBSET_SIZES", "SyntheticData",
    "make_phase_diagram_data", "scaled_subset_sizes",
    "GridMethod", "synthetic_methods", "resolve_methods", "method_labels",
    "train_grid", "auto_chunk_size", "train_single", "GridResult",
    "init_metrics", "cell_metrics", "compare_best", "agreement_summary", "run_phase_diagram",
]
