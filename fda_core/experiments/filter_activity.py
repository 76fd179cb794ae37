"""How often FedGP's filter acts in a run: the per-layer cosines of the papers' rule, round by round.

The papers' FedGP (the per-layer cosine rule with magnitude alignment, FedGP paper App. B.2 Eq. B.2;
``docs/theory.md`` § Rules) keeps layer ℓ of source i only where cos(G_T^ℓ, G_i^ℓ) > 0; without the filter the
signed cosine enters everywhere. So the filter changes a round only through the (source, layer) pairs whose cosine is
negative, and the two rows of Table 4 can differ only as much as those pairs weigh. This module records them:
:func:`filter_activity` runs one federated run (:func:`fda_core.experiments.federated.run_experiment`) with a
recorder around :func:`fda_core.core.aggregation.fedgp_cosine` that reads its inputs before the rule runs (the rule
may write its result into the target's buffer) and changes nothing, so the run's numbers are those of the same run
without it (a test checks the bits). Besides how many pairs the filter drops it records how far dropping them moves
the round's update: the part D = Σ_{i,ℓ: cos < 0} w_i β_i a_i cos G_i^ℓ that the rule without the filter adds, against
FedGP's update U = (1 − Σ_i w_i β_i) G_T + Σ_{i,ℓ: cos > 0} w_i β_i a_i cos G_i^ℓ (``docs/theory.md`` § Rules).
``docs/reproduction.md`` § The filter alone reads its output.

Command line (the committed file of § The filter alone)::

    python -m fda_core.experiments.filter_activity --noise 0.6 --seed 0 --data-root data --out FILE.csv
"""

from __future__ import annotations

import argparse
import contextlib
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import pandas as pd
import torch
from torch import Tensor

from ..common.checks import check_int, check_number
from ..common.files import write_table
from ..core import aggregation
from .federated import make_config, run_experiment
from .paper_numbers import noniid_reference_setting

__all__ = ["layer_cosines", "filter_terms", "recording_cosines", "filter_activity", "table_4_config", "summary", "main"]


def layer_cosines(sources: Tensor, target: Tensor, segments: Sequence[int]) -> Tensor:
    """(N, L) cosines cos(t^ℓ, s_i^ℓ) of the (N, m) source updates ``sources`` and the (m,) target update ``target``
    on the L consecutive segments of lengths ``segments`` (the parameter tensors; they sum to m), in float64; 0 where
    either norm is 0 (where the rule's factor is 0, ``docs/theory.md`` § Rules). ValueError names a bad shape."""
    if sources.dim() != 2 or target.shape != sources.shape[1:]:
        raise ValueError(f"sources must be (N, m) and target (m,), got {tuple(sources.shape)} and {tuple(target.shape)}")
    lengths = [int(k) for k in segments]
    if sum(lengths) != sources.shape[1] or any(k <= 0 for k in lengths):
        raise ValueError(f"segments must be positive lengths summing to m = {sources.shape[1]}, got {lengths}")
    s, t = sources.detach().double(), target.detach().double()
    cos = []
    for s_l, t_l in zip(torch.split(s, lengths, dim=1), torch.split(t, lengths)):
        denom = torch.linalg.vector_norm(s_l, dim=1) * torch.linalg.vector_norm(t_l)
        cos.append(torch.where(denom > 0, s_l @ t_l / torch.where(denom > 0, denom, 1.0), 0.0))
    return torch.stack(cos, dim=1)


#: the cosine rule itself, as imported (the recorder below puts a wrapper in its place while it records)
_COSINE_RULE = aggregation.fedgp_cosine


def filter_terms(sources: Tensor, target: Tensor, segments: Sequence[int], beta: Any, weights: Any = None,
                 alignment: Any = None) -> dict[str, float]:
    """The lengths that say how far the filter moves a round of the cosine rule (module docstring; ``docs/theory.md``
    § Rules), from its inputs — the (N, m) source updates, the (m,) target update, the segment lengths, β, the weights
    and the alignment, as :func:`fda_core.core.aggregation.fedgp_cosine` takes them — by the rule itself, in float64:
    FedGP's update U (with the filter), the update without it, and the target's term T = (1 − Σ_i w_i β_i) G_T (the
    rule with zero sources). Returns ``filter_change`` = ‖U_no filter − U‖ / ‖U‖ (how far dropping the filter moves
    the update, relative to its length) and ``source_to_target`` = ‖U − T‖ / ‖T‖ (the kept source terms against the
    target's term); NaN where the denominator is 0."""
    s, t = sources.detach().double(), target.detach().double()
    rule = lambda src, keep: _COSINE_RULE(src, t, beta, weights, alignment, segments=segments,  # noqa: E731
                                          filter_negative=not keep)
    update, target_term = rule(s, False), rule(torch.zeros_like(s), False)
    norm = lambda v: float(torch.linalg.vector_norm(v))  # noqa: E731
    return {"filter_change": norm(rule(s, True) - update) / norm(update) if norm(update) > 0 else math.nan,
            "source_to_target": norm(update - target_term) / norm(target_term) if norm(target_term) > 0 else math.nan}


@contextlib.contextmanager
def recording_cosines() -> Iterator[list[tuple[Tensor, tuple[int, ...], dict[str, float]]]]:
    """Within the block every call of :func:`fda_core.core.aggregation.fedgp_cosine` on flat (N, m) updates with
    ``segments`` appends ((N, L) cosines by :func:`layer_cosines`, the segment lengths, :func:`filter_terms`) to the
    yielded list, read before the rule runs; the rule itself runs as called. Restores the rule on exit."""
    record: list[tuple[Tensor, tuple[int, ...], dict[str, float]]] = []
    rule = aggregation.fedgp_cosine

    def recorded(source_updates, target_update, beta, weights=None, alignment=None, **kwargs):
        segments = kwargs.get("segments")
        if isinstance(source_updates, Tensor) and segments is not None:
            cos = layer_cosines(source_updates, target_update, segments)
            terms = filter_terms(source_updates, target_update, segments, beta, weights, alignment)
            record.append((cos, tuple(int(k) for k in segments), terms))
        return rule(source_updates, target_update, beta, weights, alignment, **kwargs)

    aggregation.fedgp_cosine = recorded
    try:
        yield record
    finally:
        aggregation.fedgp_cosine = rule


def filter_activity(config: Mapping[str, Any], _dataset: Any = None) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Run ``config`` (a run of FedGP with ``projection="cosine"``, filter or not) recording its cosines
    (:func:`recording_cosines`). Returns one row per aggregated round — ``round`` (the FDA rounds after the warm-up,
    from 1), ``pairs`` (N·L), ``negative_pairs`` (the share of pairs with a negative cosine: those the filter drops),
    ``negative_parameters`` (the share of the N·m source entries in them), ``mean_negative_cos`` and
    ``mean_positive_cos`` (NaN where there are none), ``filter_change`` and ``source_to_target``
    (:func:`filter_terms`) — and the run's result. ValueError when the run never calls the
    cosine rule (another method or projection)."""
    with recording_cosines() as record:
        result = run_experiment(_dataset=_dataset, **config)
    if not record:
        raise ValueError(f"config must run FedGP with projection='cosine' (rule {config.get('rule')!r}, method_options "
                         f"{config.get('method_options')!r}): the cosine rule never ran")
    rows = []
    for k, (cos, lengths, terms) in enumerate(record, start=1):
        negative = cos < 0
        sizes = torch.tensor(lengths, dtype=torch.float64)
        rows.append({
            "round": k, "pairs": int(cos.numel()), "negative_pairs": float(negative.double().mean()),
            "negative_parameters": float((negative.double() * sizes).sum() / (sizes.sum() * cos.shape[0])),
            "mean_negative_cos": float(cos[negative].mean()) if negative.any() else math.nan,
            "mean_positive_cos": float(cos[cos > 0].mean()) if (cos > 0).any() else math.nan, **terms,
        })
    return pd.DataFrame(rows), result


def table_4_config(noise_std: float, seed: int, *, filter_negative: bool = True, data_root: str = "data",
                   rounds: int = 50) -> dict[str, Any]:
    """The config of notebook 05's FedGP run of Table 4 on full Fashion-MNIST (the commands of
    ``figures/05_semi_synthetic/fashion_mnist_projection*``): the reference variant's FedGP (the cosine rule, β = 0.5;
    without the filter with ``filter_negative=False``), 100 labelled target images, the target's noise of std
    ``noise_std`` drawn anew every round, the data drawn from ``seed``, the reference scripts' setting
    (:func:`fda_core.experiments.paper_numbers.noniid_reference_setting`: 2 FedAvg warm-up rounds, then ``rounds``)."""
    check_number(noise_std, "noise_std", 0)
    check_int(seed, "seed", 0)
    check_int(rounds, "rounds", 1)
    setting = noniid_reference_setting(rounds, oracle_options=False)
    return make_config(
        **setting["per_method"]["fedgp"], source_lr=setting["source_lr"], target_lr=setting["target_lr"],
        model="small_cnn", source_batch_size=64, train_fraction=0.5, n_target_labeled=100, seed=seed, rule="fedgp",
        method_options={"beta": 0.5, "projection": "cosine", "filter": bool(filter_negative)},
        dataset="NoisyFeatures", dataset_options={"base": "fashion_mnist", "data_root": data_root,
                                                  "noise_std": float(noise_std), "noise_draw": "per_round", "seed": seed})


def summary(activity: pd.DataFrame) -> dict[str, float]:
    """Means over the rounds of :func:`filter_activity`'s shares and lengths, and the largest share of negative
    pairs."""
    return {**{c: float(activity[c].mean()) for c in ("negative_pairs", "negative_parameters", "filter_change",
                                                        "source_to_target")},
            "max_negative_pairs": float(activity["negative_pairs"].max())}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fda_core.experiments.filter_activity", description=__doc__.split("\n")[0])
    parser.add_argument("--noise", type=float, required=True, help="the target's noise std (Table 4: 0.2-0.8)")
    parser.add_argument("--seed", type=int, default=0, help="the run's seed (≥ 0)")
    parser.add_argument("--no-filter", action="store_true", help="FedGP (cosine, no filter) instead of FedGP")
    parser.add_argument("--data-root", default="data", help="folder holding FashionMNIST/ (fda data fetch fashion_mnist)")
    parser.add_argument("--rounds", type=int, default=50, help="rounds after the 2 warm-up rounds (≥ 1)")
    parser.add_argument("--out", required=True, help="CSV to write (atomically)")
    args = parser.parse_args(argv)
    config = table_4_config(args.noise, args.seed, filter_negative=not args.no_filter, data_root=args.data_root,
                            rounds=args.rounds)
    activity, result = filter_activity(config)
    label = result["method"]
    note = (f"{label} on Fashion-MNIST, Table 4's run at noise {args.noise:g}, seed {args.seed} "
            f"(fda_core.experiments.filter_activity.table_4_config); final accuracy {100 * result['final_target_acc']!r} %\n"
            "per aggregated round: the shares of (source, layer) pairs, and of source entries, whose cosine with the "
            "target's update is negative (those the filter drops), the mean cosine of each sign, how far dropping the "
            "filter moves FedGP's update relative to its length (filter_change), and the kept source terms' length "
            "against the target's term (source_to_target)")
    write_table(args.out, activity, note=note)
    print(label, f"final accuracy {100 * result['final_target_acc']:.2f} %", summary(activity))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
