"""Benchmark of runs side by side: a sweep through ``run_many`` with ``workers`` = 1 and more, in one process.

What is measured
----------------
Setting: notebook 05's paper-settings runs (FedGP paper § 5.2 noisy features, ``NoisyFeatures`` noise 0.4 on
MNIST-5k, 9 sources and a target, ``small_cnn``, Adam, source batch 64, target batch 16, 100 labelled target
images) with FedGP (cosine, the reference variant), one run per seed, ``--rounds`` rounds each (paper: 50), no result
store. The same sweep runs with ``workers`` = 1 (in this process) and with each count of ``--workers``
(:mod:`fda_core.experiments.worker_pool`: spawned processes, each with ``threads // workers`` torch threads);
every count computes the same runs. On a CPU their results are checked equal (every run, here and in the workers,
uses one torch thread, so that they are equal bit for bit: the ratio is then the scaling over processes). On a GPU,
whose convolution kernels are not bit-reproducible, the sweep one at a time runs twice (the faster counts) and every
count's largest difference from it is printed beside that of the second sweep, the scale of run-to-run noise there.
Time: wall seconds of the whole ``run_many`` call, process start, imports and data loading in the workers
included (what a user waits for); CUDA is synchronised by the runs' own evaluations. Printed: seconds per
sweep, the ratio (workers = 1) / (workers = k), and the runs in flight on average (the runs' own seconds summed over
the wall: how far they overlapped once started; :func:`runs_in_flight`). No timing is asserted anywhere.

On the 2-core CPU, 2 workers can at best halve the time of runs that use one core each. On a GPU, runs of a
small model are launch-bound, so several processes can share the device; the ratio there says how much.

Usage::

    python benchmarks/parallel_runs.py [--device auto|cpu|cuda] [--runs 8] [--rounds 8] [--workers 2 4]
                                       [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fda_core.common.devices import resolve_device  # noqa: E402
from fda_core.experiments.federated import EXECUTION_FIELDS, computed_content, run_many  # noqa: E402

SETTING = dict(dataset="NoisyFeatures", dataset_options={"noise_std": 0.4, "noise_draw": "per_round"}, rule="fedgp",
               method_options={"projection": "cosine"}, warmup_rounds=0, source_lr=0.01, target_lr=0.01,
               source_batch_size=64, target_batch_size=16, n_target_labeled=100, train_fraction=0.5,
               model="small_cnn")


def largest_difference(a: object, b: object) -> float:
    """The largest absolute difference between the numbers at the same places of two results (JSON-like
    structures of the same shape), their wall-clock seconds and shared rounds aside; inf where their shapes or
    non-numbers differ."""
    if isinstance(a, bool) or isinstance(b, bool) or isinstance(a, str) or a is None:
        return 0.0 if a == b else float("inf")
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return abs(float(a) - float(b)) if a != b else 0.0
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return float("inf")
        return max((largest_difference(a[k], b[k]) for k in a if k not in EXECUTION_FIELDS), default=0.0)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return float("inf")
        return max((largest_difference(x, y) for x, y in zip(a, b)), default=0.0)
    return 0.0 if a == b else float("inf")


def runs_in_flight(results: list[dict], wall_seconds: float) -> float:
    """The runs' own seconds (each run's ``seconds``: its rounds, without the worker's start-up) summed and divided
    by the sweep's wall seconds: how many runs were computing at once on average. Below ``workers`` by the share of
    the wall spent starting processes and loading data; on a notebook's many long runs that share shrinks, so this
    says how a sweep of short runs under-states the notebooks' gain (2026-11-27, H200: this sweep 1.06x at 8
    workers, notebook 05's paper-scale runs 6.2 in flight)."""
    return sum(float(r["seconds"]) for r in results) / wall_seconds


def sweep(device: str, runs: int, rounds: int, workers: int) -> tuple[float, list[dict]]:
    """Wall seconds of ``run_many`` over ``runs`` seeds with ``workers``, and its results."""
    configs = [dict(SETTING, rounds=rounds, seed=s, device=device) for s in range(runs)]
    start = time.perf_counter()
    results = run_many(configs, progress=False, workers=workers)
    return time.perf_counter() - start, results


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--runs", type=int, default=8, help="runs of the sweep (seeds 0, 1, ...)")
    ap.add_argument("--rounds", type=int, default=8, help="rounds per run (notebook 05's default; paper: 50)")
    ap.add_argument("--workers", type=int, nargs="+", default=[2], help="worker counts compared with 1")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 runs of 1 round, workers 2")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args(argv)
    if args.quick:
        args.runs, args.rounds, args.workers = 2, 1, [2]
    for name in ("runs", "rounds"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be ≥ 1, got {getattr(args, name)}")
    if min(args.workers) < 2:
        raise SystemExit(f"--workers must list counts ≥ 2 (1 is the baseline), got {args.workers}")
    device = resolve_device(args.device)
    if device.type == "cpu":  # one thread per run, here and in every worker, so that all compute the same bits
        torch.set_num_threads(1)
    threads = torch.get_num_threads()
    seconds, differences, in_flight = {}, {}, {}
    base_time, base = sweep(str(device), args.runs, args.rounds, 1)
    seconds[1], in_flight[1] = base_time, runs_in_flight(base, base_time)
    if device.type == "cuda":
        # cuDNN's and cuBLAS's kernels are not bit-reproducible (atomic adds, algorithms chosen per process): on a GPU
        # the same sweep one at a time, run again here, says how far runs differ with nothing else changed, the
        # scale against which the workers' differences are read (on 2026-11-27 an H200's workers=2 differed)
        again_time, again = sweep(str(device), args.runs, args.rounds, 1)
        seconds[1] = min(base_time, again_time)
        differences[1] = largest_difference(json.loads(computed_content(again)), json.loads(computed_content(base)))
    for k in args.workers:
        t, res = sweep(str(device), args.runs, args.rounds, k)
        if device.type == "cpu" and computed_content(res) != computed_content(base):
            raise SystemExit(f"workers={k} gave other results than workers=1 (thread counts differ?)")
        differences[k] = largest_difference(json.loads(computed_content(res)), json.loads(computed_content(base)))
        seconds[k], in_flight[k] = t, runs_in_flight(res, t)
    out = {"device": str(device), "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "runs": args.runs, "rounds": args.rounds, "threads_here": threads, "seconds": seconds,
           "ratio_over_1": {k: seconds[1] / t for k, t in seconds.items() if k != 1},
           "largest_difference_from_1": differences, "runs_in_flight": in_flight}
    print(f"{args.runs} runs of {args.rounds} rounds (noisy features, small_cnn, FedGP cosine) on {out['device_name']}; "
          f"this process on {threads} thread(s)")
    for k, t in seconds.items():
        extra = "" if k == 1 else f"   1/{k} = {seconds[1] / t:.2f}x"
        if k in differences:
            what = "the same sweep again" if k == 1 else "its results"
            extra += f"   largest difference of {what} from workers=1: {differences[k]:.3g}"
        print(f"  workers={k}: {t:7.1f} s for the sweep, {t / args.runs:6.2f} s per run, "
              f"{in_flight[k]:.2f} runs in flight on average{extra}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":  # the guard spawned workers need (docs/architecture.md § Runs side by side)
    main()
