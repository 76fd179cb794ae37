"""Benchmark of the papers' other baselines: seconds per run against Source only (FedAvg) in the same process.

What is measured (``docs/baselines.md`` § Cost)
-------------------------------------------------
Two settings, each a notebook's default setting of the runs that hold these baselines:

* ``04``: notebook 04's ColoredMNIST with −90% as the target (``small_cnn``, 8 rounds, 2 warm-up rounds,
  Adam 1e-3 for sources and target, 5 target epochs per round over 18 labelled images in batches of 4):
  Source only, Ditto, FedRep, APFL, KNN-per (the personalisation baselines of the auto-weighted paper's
  Table 1), each at its default options.
* ``07``: notebook 07's stand-ins DigitConditions and SUPPORT2 (the MLP, 15 rounds,
  ``fda_core.experiments.auxiliary_study.stand_in_config``): Source only, FADA and KD3A (the healthcare
  paper's unsupervised FDA rows of Table 2).

Each run is :func:`fda_core.experiments.federated.run_experiment` end to end (data split, model, every round,
the evaluation of every round), seed 0, on the CPU unless ``--device`` says otherwise. The runs of one setting
are interleaved over ``--repeats`` repeats (drifts of a shared machine hit every method alike); printed: the
median seconds per run and its ratio to Source only's median in the same setting. ``--threads`` sets torch's
CPU threads (default 1, as ``make figures`` runs each notebook). No timing is asserted anywhere.

Usage::

    python benchmarks/baselines.py [--settings 04 07] [--repeats 3] [--threads 1] [--device cpu] [--quick]
                                   [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fda_core.data.datasets import get_dataset  # noqa: E402
from fda_core.experiments.auxiliary_study import stand_in_config  # noqa: E402
from fda_core.experiments.federated import run_experiment  # noqa: E402

#: notebook 04's defaults for ColoredMNIST (its parameters cell)
NB04 = dict(dataset="ColoredMNIST", target="-90%", rounds=8, warmup_rounds=2, lr_decay=1.0, model="small_cnn",
            source_lr=1e-3, target_lr=1e-3, target_local_epochs=5, target_batch_size=4, n_target_labeled=18)
#: notebook 07's common settings (its parameters cell); the stand-ins add their own
NB07 = dict(rounds=15, model="mlp", source_lr=1e-3, target_lr=2e-4, n_target_labeled=100, target_batch_size=4,
            warmup_rounds=0)

SETTINGS = {
    "04": {"ColoredMNIST −90%": (NB04, ["source_only", "ditto", "fedrep", "apfl", "knn_per"])},
    "07": {name: (stand_in_config(name, **NB07), ["source_only", "fada", "kd3a"])
           for name in ("DigitConditions", "SUPPORT2")},
}


def time_run(config: dict, rule: str, dataset, device: str) -> float:
    """Wall-clock seconds of one run (CUDA synchronised)."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    run_experiment(_dataset=dataset, **{**config, "rule": rule, "device": device, "seed": 0})
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - t0


def measure(config: dict, rules: list[str], *, repeats: int, device: str, quick: bool) -> dict[str, float]:
    """Median seconds per run of each rule (interleaved repeats, one untimed warm-up run first)."""
    config = {**config, **({"rounds": 2, "warmup_rounds": min(config.get("warmup_rounds", 0), 1)} if quick else {})}
    dataset = get_dataset(config["dataset"], **config.get("dataset_options", {}))
    time_run(config, rules[0], dataset, device)  # warm-up: allocator, first kernels, lazy imports
    times: dict[str, list[float]] = {r: [] for r in rules}
    for _ in range(repeats):
        for rule in rules:
            times[rule].append(time_run(config, rule, dataset, device))
    return {rule: statistics.median(t) for rule, t in times.items()}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--settings", nargs="+", choices=sorted(SETTINGS), default=sorted(SETTINGS))
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="2 rounds, 1 repeat (a smoke test)")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error(f"--repeats must be ≥ 1, got {args.repeats}")
    if args.threads < 1:
        parser.error(f"--threads must be ≥ 1, got {args.threads}")
    threads_before = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        return _report(args)
    finally:
        torch.set_num_threads(threads_before)


def _report(args: argparse.Namespace) -> dict:
    repeats = 1 if args.quick else args.repeats
    print(f"device {args.device}, {args.threads} thread(s), {repeats} repeat(s), seconds per run (median)")
    out: dict = {}
    for key in args.settings:
        for name, (config, rules) in SETTINGS[key].items():
            medians = measure(config, rules, repeats=repeats, device=args.device, quick=args.quick)
            base = medians["source_only"]
            print(f"notebook {key} setting, {name}:")
            for rule, seconds in medians.items():
                print(f"  {rule:12s} {seconds:7.2f} s   {seconds / base:5.2f}× Source only")
            out[f"{key} {name}"] = {rule: {"seconds": s, "ratio_to_source_only": s / base} for rule, s in medians.items()}
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return out


if __name__ == "__main__":
    main()
