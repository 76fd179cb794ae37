"""Benchmark of the federated loop: rounds per second of the 10-client semi-synthetic setting.

What is measured (same data, same model, same process, per device)
---------------------------------------------------------------------
Setting: FedGP paper § 5.2 noisy features (``NoisyFeatures``, noise 0.4) on MNIST-5k: 9 source clients
and 1 target client (500 images each), the 2-conv + 3-FC CNN (``small_cnn``), Adam, source batch 64,
target batch 16, 100 labelled target images, one local epoch, FedGP (β = 0.5, layer-wise exact
projection), no warm-up (every timed round is an FDA round), no evaluation inside the timed rounds.
``--model mnist_cnn`` times the papers' ColoredMNIST network instead (four convolutions), by default with
BatchNorm (``--norm batch``), whose batched path carries per-client BatchNorm statistics; ``--norm group`` times
the reference code's GroupNorm form (the model of notebook 04 at paper scale).
``--compiled`` times instead (a'') ``client_batching="compile"`` against (a'): the batched objective through
``torch.compile`` (CUDA graphs on a GPU), both per round inside one run after 2 untimed rounds, where the
compilation happens; (b) runs beside them, so that the ratio plain/compiled comes from one process.

(a) ``library``: the engine's rounds (:class:`fda_core.experiments.federated.Run`, what ``run_experiment`` steps) with ``client_batching="loop"`` — one module whose parameters are views into
    a flat vector, Adam as fused vector operations, updates written into a preallocated (N, m) buffer,
    no model copies.
(a') ``library batched``: the same with ``client_batching="vmap"``: the 9 sources of a round trained as one
    ``vmap``-ed computation over their stacked parameters (:mod:`fda_core.experiments.batched_clients`; the default on
    CUDA).
(b) ``plain loop``: the straightforward way to write Algorithm 1: ``copy.deepcopy`` of the global model
    for every client, a fresh ``torch.optim.Adam`` per client, updates as ``state_dict`` differences,
    the library's per-tensor ``fedgp`` on dicts, ``load_state_dict`` of the new global model.
Time per round: (a) and (a') round by round inside one run, k = ``--extra`` rounds timed after R = ``--rounds``
untimed ones (set-up and first allocations excluded; until 2026-11-26 they too were timed as below, whose
difference of two runs spread 30–74 ms over three repeats on an H100); (b), which has no round API, as (time of
R + k rounds − time of R rounds) / k, so set-up (data, model) cancels; medians over ``--repeats`` interleaved
repeats (drifts of a shared machine hit all alike); CUDA is synchronised.
Printed: seconds per round, rounds per second, and the ratio plain/library. No timing is asserted anywhere.

Usage::

    python benchmarks/federated.py [--device auto|cpu|cuda|all] [--model small_cnn|mnist_cnn] [--rounds 3]
                                   [--repeats 3] [--quick] [--compiled] [--json OUT]
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fda_core.core import aggregation  # noqa: E402
from fda_core.data.datasets import get_dataset, labeled_split  # noqa: E402
from fda_core.experiments.federated import resolve_device  # noqa: E402
from fda_core.data.models import get_model  # noqa: E402

SETTING = dict(dataset="NoisyFeatures", dataset_options={"noise_std": 0.4}, rule="fedgp", beta=0.5,
               projection="exact_layerwise", warmup_rounds=0, source_lr=0.01, target_lr=0.05, source_batch_size=64,
               target_batch_size=16, n_target_labeled=100, train_fraction=0.5, model="small_cnn", seed=0)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def steady_round_time(device: torch.device, ds, batching: str, warm: int, timed: int, warm_seconds: list | None = None
                      ) -> float:
    """Seconds per round of one run after ``warm`` untimed rounds (for ``client_batching="compile"``: the
    compilation of the full and the short last mini-batch happens there, once per run). ``warm_seconds``, when
    given, receives the seconds of the ``warm`` rounds together (set-up of the run not included)."""
    from fda_core.experiments.federated import Run, make_config
    from fda_core.experiments.methods import get_method

    c = make_config(rounds=warm + timed, eval_every=10 ** 6, device=str(device), client_batching=batching, **SETTING)
    run = Run(c, get_method(c["rule"], **c["method_options"]), ds)
    _sync(device)
    t_warm = time.perf_counter()
    for r in range(1, warm + 1):
        run.round(r)
    _sync(device)
    if warm_seconds is not None:
        warm_seconds.append(time.perf_counter() - t_warm)
    t0 = time.perf_counter()
    for r in range(warm + 1, warm + timed + 1):
        run.round(r)
    _sync(device)
    return (time.perf_counter() - t0) / timed


def plain_time(rounds: int, device: torch.device, ds) -> float:
    """Algorithm 1 written plainly (deepcopy + torch.optim.Adam per client, dict aggregation)."""
    _sync(device)
    t0 = time.perf_counter()
    c = SETTING
    t = ds.default_target
    xt, yt = ds[t]
    lab, _, test = labeled_split(xt.shape[0], n_labeled=c["n_target_labeled"], train_fraction=c["train_fraction"],
                                 seed=c["seed"])
    x_lab, y_lab = xt[lab].to(device), yt[lab].to(device)
    sources = [(ds[i][0].to(device), ds[i][1].to(device)) for i in range(len(ds)) if i != t]
    model = get_model(c["model"], tuple(ds.input_shape), ds.num_classes, seed=c["seed"],
                      **c.get("model_options", {})).to(device)
    names = [n for n, _ in model.named_parameters()]
    sizes = [x.shape[0] for x, _ in sources]
    weights = [n / sum(sizes) for n in sizes]
    gen = torch.Generator().manual_seed(0)

    def local(x, y, lr, bs):
        net = copy.deepcopy(model)
        opt = torch.optim.Adam(net.parameters(), lr=lr)
        net.train()
        perm = torch.randperm(x.shape[0], generator=gen).to(device)
        steps = 0
        for s in range(0, x.shape[0], bs):
            idx = perm[s:s + bs]
            opt.zero_grad()
            F.cross_entropy(net(x[idx]), y[idx]).backward()
            opt.step()
            steps += 1
        start = model.state_dict()
        end = net.state_dict()
        return {n: end[n] - start[n] for n in names}, steps, end

    for _ in range(rounds):
        ups = [local(x, y, c["source_lr"], c["source_batch_size"]) for x, y in sources]
        g_t, steps_t, end_t = local(x_lab, y_lab, c["target_lr"], c["target_batch_size"])
        aligned = [{n: u[n] * (c["target_lr"] / c["source_lr"]) * steps_t / k for n in names} for u, k, _ in ups]
        agg = aggregation.fedgp(aligned, g_t, c["beta"], weights)
        state = model.state_dict()
        new = {k: (state[k] + agg[k] if k in agg else end_t[k]) for k in state}
        model.load_state_dict(new)
    _sync(device)
    return time.perf_counter() - t0


def plain_round_time(device: torch.device, ds, warm: int, timed: int) -> float:
    """Seconds per round of the plain loop: (time of warm + timed rounds − time of warm rounds) / timed, so set-up
    cancels; NaN when set-up noise swamped the rounds (a loaded machine gives a difference <= 0)."""
    t_short, t_long = plain_time(warm, device, ds), plain_time(warm + timed, device, ds)
    return (t_long - t_short) / timed if t_long > t_short else float("nan")


def _medians(per: dict[str, list[float]]) -> dict[str, float]:
    """Median of each list of timings, leaving out the NaNs (NaN when all are)."""
    return {k: statistics.median([x for x in v if math.isfinite(x)] or [float("nan")]) for k, v in per.items()}


def measure(device: torch.device, rounds: int, extra: int, repeats: int) -> dict:
    ds = get_dataset(SETTING["dataset"], **SETTING["dataset_options"], seed=SETTING["seed"])
    for mode in ("loop", "vmap"):  # warm-up (allocator, kernels)
        steady_round_time(device, ds, mode, 1, 1)
    plain_time(1, device, ds)
    per = {"library": [], "library batched": [], "plain loop": []}
    for _ in range(repeats):
        per["library"].append(steady_round_time(device, ds, "loop", rounds, extra))
        per["library batched"].append(steady_round_time(device, ds, "vmap", rounds, extra))
        per["plain loop"].append(plain_round_time(device, ds, rounds, extra))
    med = _medians(per)
    return {"device": str(device), "model": SETTING["model"], "seconds_per_round": med, "rounds_per_second": {k: 1 / v for k, v in med.items()},
            "ratio_plain_over_library": med["plain loop"] / med["library"],
            "ratio_plain_over_batched": med["plain loop"] / med["library batched"],
            "ratio_library_over_batched": med["library"] / med["library batched"], "repeats": per}


def measure_compiled(device: torch.device, warm: int, timed: int, repeats: int) -> dict:
    """``client_batching="vmap"`` against ``"compile"``, both timed per round inside one run after ``warm`` rounds
    (each repeat a fresh run, so each compiles once), interleaved; and (b), the plain loop, in the same process
    (:func:`plain_round_time`), so that plain/compiled is a same-run ratio."""
    ds = get_dataset(SETTING["dataset"], **SETTING["dataset_options"], seed=SETTING["seed"])
    plain_time(1, device, ds)  # warm-up (allocator, kernels)
    per = {"batched (eager)": [], "batched (compiled)": [], "plain loop": []}
    warm_s = {"batched (eager)": [], "batched (compiled)": []}
    for _ in range(repeats):
        per["batched (eager)"].append(steady_round_time(device, ds, "vmap", warm, timed, warm_s["batched (eager)"]))
        per["batched (compiled)"].append(steady_round_time(device, ds, "compile", warm, timed,
                                                           warm_s["batched (compiled)"]))
        per["plain loop"].append(plain_round_time(device, ds, warm, timed))
    med, warm_med = _medians(per), _medians(warm_s)
    # what compiling costs (its first rounds compile), and after how many rounds its faster rounds repay it. Only the
    # first repeat compiles: later runs in the same process reuse the compiled graphs (Dynamo caches them on the
    # objective's code), so the medians' warm rounds hold no compilation (an H200 gave -0.1 s from them on
    # 2026-11-27). A process compiles once: the first run of each worker process pays it
    overhead = warm_s["batched (compiled)"][0] - warm_med["batched (eager)"]
    saved = med["batched (eager)"] - med["batched (compiled)"]
    return {"device": str(device), "model": SETTING["model"], "seconds_per_round": med,
            "ratio_eager_over_compiled": med["batched (eager)"] / med["batched (compiled)"],
            "ratio_plain_over_compiled": med["plain loop"] / med["batched (compiled)"], "repeats": per,
            "warm_rounds": warm, "warm_seconds": warm_med, "compiled_warm_seconds_first": warm_s["batched (compiled)"][0],
            "compile_overhead_s": overhead,
            "break_even_rounds": overhead / saved if saved > 0 else None}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda | all")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of the short run (the long run adds --extra)")
    ap.add_argument("--extra", type=int, default=3, help="extra rounds timed")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="smoke test: 1 + 1 rounds, 1 repeat")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    ap.add_argument("--compiled", action="store_true",
                    help="instead: batched clients eager vs torch.compile (CUDA graphs on a GPU), per round in one run "
                         "after 2 untimed rounds (where the compilation happens)")
    ap.add_argument("--model", default="small_cnn", choices=("small_cnn", "mnist_cnn"),
                    help="small_cnn (default) or mnist_cnn (the papers' ColoredMNIST network)")
    ap.add_argument("--norm", default="batch", choices=("batch", "group"),
                    help="mnist_cnn's norm layers: batch (default: per-client BatchNorm statistics in the batched "
                         "path) or group (the reference code's, notebook 04's paper-scale model)")
    args = ap.parse_args(argv)
    SETTING["model"] = args.model
    if args.model == "mnist_cnn":
        SETTING["model_options"] = {"norm": args.norm}
    if args.quick:
        args.rounds, args.extra, args.repeats = 1, 1, 1
    if args.device == "all":
        devices = [torch.device("cpu")] + ([torch.device("cuda")] if torch.cuda.is_available() else [])
    else:
        devices = [resolve_device(args.device)]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}; setting: 10 clients (9 sources + target), "
          f"NoisyFeatures(0.4) on MNIST-5k, {SETTING['model']} {SETTING.get('model_options', '')}, FedGP β=0.5 layer-wise")
    results = []
    if args.compiled:
        for dev in devices:
            r = measure_compiled(dev, 2, args.extra, args.repeats)
            results.append(r)
            s = r["seconds_per_round"]
            print(f"[{r['device']}] batched clients, eager {s['batched (eager)'] * 1e3:8.1f} ms/round | compiled "
                  f"{s['batched (compiled)'] * 1e3:8.1f} ms/round | plain loop {s['plain loop'] * 1e3:8.1f} ms/round | "
                  f"eager/compiled = {r['ratio_eager_over_compiled']:.2f}x, plain/compiled = "
                  f"{r['ratio_plain_over_compiled']:.2f}x")
            even = r["break_even_rounds"]
            print(f"  compiling costs {r['compile_overhead_s']:.1f} s per process (the first run's first "
                  f"{r['warm_rounds']} rounds against eager's); " + (f"repaid after {even:.0f} rounds" if even is not None and even >= 0 else
                                           "never repaid" if even is None else "no cost measured"))
    for dev in devices if not args.compiled else []:
        r = measure(dev, args.rounds, args.extra, args.repeats)
        results.append(r)
        s = r["seconds_per_round"]
        print(f"[{r['device']}] library (client loop) {s['library'] * 1e3:8.1f} ms/round ({1 / s['library']:.2f} rounds/s) | "
              f"library (batched clients) {s['library batched'] * 1e3:8.1f} ms/round | "
              f"plain loop {s['plain loop'] * 1e3:8.1f} ms/round ({1 / s['plain loop']:.2f} rounds/s)\n"
              f"  plain/library = {r['ratio_plain_over_library']:.2f}x, plain/batched = {r['ratio_plain_over_batched']:.2f}x, "
              f"client loop/batched = {r['ratio_library_over_batched']:.2f}x")
        if not math.isfinite(r["ratio_plain_over_library"]):
            print("  (timing swamped by set-up noise: raise --extra or run on an idle machine)")
    if args.json:
        from fda_core.common.files import atomic_write_json

        atomic_write_json(args.json, results)
    return {"results": results}


if __name__ == "__main__":
    main()
