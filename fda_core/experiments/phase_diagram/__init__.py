"""The synthetic 9×9 phase-diagram experiment (notebook 02; ``docs/experiments.md`` § Synthetic phase
diagram; FedGP paper § 5 and App. B; auto-weighted FDA paper § 5 and App. B).

The data and the network live in the data layer (:mod:`fda_core.data.synthetic`,
:mod:`fda_core.data.sigmoid_net`); this package runs the experiment:

* :mod:`.selection` — which methods (from the one registry, :mod:`fda_core.experiments.methods`) and
  cells a run covers;
* :mod:`.trainer` — :func:`train_grid`, every training of the grid as one batched computation, with the
  reference code's training step and per-tensor FedGP by default (``training_step``, ``granularity``);
  :mod:`.reference` — :func:`train_single`, one training the plain way (what the trainer is tested against);
  :mod:`.result` — :class:`GridResult`;
* :mod:`.metrics` — :func:`init_metrics`, d², σ², τ²d², estimates and Delta errors at the initialisation;
* :mod:`.compare` — :func:`compare_best`, :func:`agreement_summary` (panels (a)-(c)), :func:`theory_grid`
  (the theory panel), :func:`runs_table`;
* :mod:`.runs` — :func:`run_phase_diagram`, trials through the result store tied to code revisions;
  :func:`setting_note` (the tables' notes, from what ran) and :func:`timing_table` (kept apart).

Figures: :func:`fda_core.viz.phase_diagram_plots.plot_phase_diagram_panels`.

Typical use (the notebook's defaults; about a minute each of training and of metrics per trial on a 2-core CPU)::

    from fda_core.experiments import phase_diagram as P
    data = P.make_phase_diagram_data(n_points=2000, n_trials=1, seed=0)
    res = P.train_grid(data)            # 9 × 9 cells × 6 methods (β = 0.5): res.table, res.curves
    met = P.init_metrics(data)          # d², σ², τ²d², estimates, Δ² (Monte Carlo and closed form)
    best = P.compare_best(res, met)     # per cell: best method by Δ² and by final test loss (panels a, b)
    steps, losses = res.curve(shift_index=4, size_index=2, method="fedgp")   # one cell's curves
"""

from ...data.sigmoid_net import N_PARAMS, describe_network, init_params, make_network
from ...data.synthetic import (DEFAULT_S_MAX, DEFAULT_SHIFT_LEVELS, PAPER_N_POINTS, PAPER_SUBSET_SIZES, PAPER_TRIALS,
                               SyntheticData, make_phase_diagram_data, scaled_subset_sizes, spread_subset_sizes)
from .compare import TheoryGrid, agreement_summary, compare_best, middle_cell, runs_table, theory_grid, win_counts
from .metrics import cell_metrics, describe_metrics, init_metrics
from .reference import train_single
from .result import GridResult
from .runs import EXPERIMENT, run_phase_diagram, run_revision, setting_note, timing_table
from .selection import GridMethod, method_labels, resolve_methods, synthetic_methods
from .trainer import (GRANULARITIES, REFERENCE_TRAINING, TRAINING_STEPS, auto_chunk_size, batched_rule, describe_training,
                      fedgp_per_tensor, train_grid)

__all__ = [
    "N_PARAMS", "describe_network", "init_params", "make_network",
    "DEFAULT_S_MAX", "DEFAULT_SHIFT_LEVELS", "PAPER_N_POINTS", "PAPER_SUBSET_SIZES", "PAPER_TRIALS", "SyntheticData",
    "make_phase_diagram_data", "scaled_subset_sizes", "spread_subset_sizes",
    "GridMethod", "synthetic_methods", "resolve_methods", "method_labels",
    "train_grid", "auto_chunk_size", "describe_training", "REFERENCE_TRAINING", "TRAINING_STEPS", "GRANULARITIES",
    "batched_rule", "fedgp_per_tensor", "train_single", "GridResult",
    "init_metrics", "cell_metrics", "describe_metrics",
    "compare_best", "agreement_summary", "win_counts", "middle_cell", "TheoryGrid", "theory_grid", "runs_table",
    "EXPERIMENT", "run_phase_diagram", "run_revision", "setting_note", "timing_table",
]
