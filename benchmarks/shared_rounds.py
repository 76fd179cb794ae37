"""Benchmark of shared FedAvg rounds: one sweep through ``run_many`` with ``share_rounds`` off and on, in one process.

What is measured
----------------
Setting: notebook 04's ColoredMNIST table for one target (its defaults: MNIST-5k, 14×14 images, ``small_cnn``, Adam at
1e-3, 2 FedAvg warm-up rounds of 8, 18 labelled target images, 5 target epochs per round, sources on 80 % of their
domains) with the notebook's eight methods (Source only, Finetune_Offline, FedDA, FedGP and the auto-weighted forms
in the reference variant, Target only, Oracle), ``--seeds`` seeds, no result store. The sweep runs with
``share_rounds=False`` (every round of every run computed: the baseline) and with ``share_rounds=True`` (Source only's
rounds, Finetune_Offline's and every FDA method's warm-up computed once per seed, ``docs/architecture.md`` § Shared
FedAvg rounds), alternately ``--repeats`` times; the data set is built before the first sweep. Printed: the median
seconds of each, their ratio, the rounds each run took from another, and whether the two sweeps' results are the
same (they must be, bit for bit: everything but the wall-clock seconds and ``shared_rounds``). No timing is asserted.

What to expect: of the 8 × 8 = 64 rounds per seed, Finetune_Offline's 8 and the 4 FDA methods' 2 warm-up rounds each
are shared, 16 rounds whose cost is the sources' training (Target only and Oracle have no sources); the ratio is
about the share of the sweep's time those rounds take.

Usage::

    python benchmarks/shared_rounds.py [--target=-90%] [--seeds 1] [--repeats 3] [--rounds 8] [--quick] [--json OUT]
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

from fda_core.experiments.federated import computed_content, run_many, sweep_configs  # noqa: E402
from fda_core.experiments.methods import with_variant  # noqa: E402

#: notebook 04's methods (its parameters cell), each in the reference variant as the notebook runs them
METHODS = ["source_only", "finetune_offline", "fedda", "fedgp", "fedda_auto", "fedgp_auto", "target_only", "oracle"]
#: notebook 04's ColoredMNIST settings (its parameters cell and derived values)
SETTING = dict(dataset="ColoredMNIST", dataset_options={"image_size": 14}, model="small_cnn", rounds=8, warmup_rounds=2,
               lr_decay=1.0, source_lr=1e-3, target_lr=1e-3, target_local_epochs=5, target_batch_size=4,
               n_target_labeled=18, source_fraction=0.8, device="cpu")


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="-90%", help="ColoredMNIST target environment (default -90%%)")
    parser.add_argument("--seeds", type=int, default=1, help="seeds of the sweep (default 1)")
    parser.add_argument("--rounds", type=int, default=8, help="rounds per run (notebook 04: 8)")
    parser.add_argument("--repeats", type=int, default=3, help="sweeps of each kind, alternated (default 3)")
    parser.add_argument("--quick", action="store_true", help="3 rounds, 1 warm-up round, 1 repeat (smoke test)")
    parser.add_argument("--json", default="", help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    for name in ("seeds", "rounds", "repeats"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    setting = dict(SETTING, rounds=args.rounds)
    if args.quick:
        setting.update(rounds=3, warmup_rounds=1)
        args.repeats = 1
    torch.set_num_threads(1)  # as each notebook's kernel runs in the main job
    configs, labels = sweep_configs(setting, [with_variant(m, "reference") for m in METHODS], targets=[args.target],
                                    seeds=list(range(args.seeds)))
    run_many(configs[:1], progress=False, share_rounds=False)  # data set built and cached, code warmed up
    seconds: dict[str, list[float]] = {"every round": [], "shared": []}
    results: dict[str, list[dict]] = {}
    for _ in range(args.repeats):
        for kind, share in (("every round", False), ("shared", True)):
            start = time.perf_counter()
            results[kind] = run_many(configs, progress=False, labels=labels, share_rounds=share)
            seconds[kind].append(time.perf_counter() - start)
    median = {k: statistics.median(v) for k, v in seconds.items()}
    same = computed_content(results["every round"]) == computed_content(results["shared"])
    shared = {f"{r['labels']['method']} (seed {r['config']['seed']})": r["shared_rounds"] for r in results["shared"]}
    out = {"setting": setting, "methods": METHODS, "target": args.target, "seeds": args.seeds, "repeats": args.repeats,
           "seconds": seconds, "median_seconds": median, "ratio": median["every round"] / median["shared"],
           "shared_rounds": shared, "same_results": same, "torch": torch.__version__}
    print(f"ColoredMNIST target {args.target}, {len(configs)} runs of {setting['rounds']} rounds "
          f"({setting['warmup_rounds']} warm-up), 1 torch thread, median of {args.repeats}:")
    print(f"  every round computed: {median['every round']:.1f} s; shared FedAvg rounds: {median['shared']:.1f} s; "
          f"ratio {out['ratio']:.2f}x")
    print("  rounds taken from another run: " + ", ".join(f"{k} {v}" for k, v in shared.items() if v))
    print(f"  results the same bit for bit: {same}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    main()
