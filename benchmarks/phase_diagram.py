"""Benchmark of the synthetic phase-diagram trainer: many trainings at once vs a loop of single trainings.

What is measured (same data, same settings, same process, per device)
---------------------------------------------------------------------
(a) ``gradient kernel``: the gradient of the MSE of C stacked 50–100–10 networks on the full set of
    n points, three ways: the hand-written batched forward/backward of ``fda_core.data.sigmoid_net``
    (what the trainer uses), ``torch.func.vmap(torch.func.grad(...))`` over the same C networks, and a
    Python loop of C ``nn.Module`` autograd backward passes. Time per network-gradient; this is the choice
    the trainer's design rests on.
(b) ``batched``: :func:`fda_core.experiments.phase_diagram.train_grid` on a representative sub-grid
    (default shift levels 0, 4, 8 × subset sizes 0, 4, 8 × the six methods of the registry with a
    gradient rule = 54 trainings), with its default chunking and deduplication (target only / source
    only trainings that provably coincide run once), and ``batched, no dedupe`` (every training run,
    like the loop).
(c) ``loop``: the same 54 trainings one after the other with
    :func:`fda_core.experiments.phase_diagram.train_single` (``nn.Sequential`` + autograd + the library
    rule per step + the momentum step) — the straightforward way to write the experiment.
(d) ``chunk scan``: ``train_grid`` (no dedupe) with several chunk sizes: where the memory-bound
    activations (trainings × 100 × n) stop fitting the caches on a CPU, or fill a GPU.
(e) ``paper scale``: a few steps of the FULL grid (9 × 9 cells × 6 methods, β = 0.5) at n = 5000 with
    the batched trainer and a few steps of the loop on the sub-grid, extrapolated to the paper's run:
    3 trials × 81 cells × 6 methods × 300 steps (absolute seconds, the extrapolation is linear in steps
    and trials).
(f) ``FedGP granularity``: ``train_grid`` (no dedupe) on the FedGP methods of the sub-grid (FedGP and
    FedGP_Auto, 18 trainings) with FedGP projected per parameter tensor (the default, as the papers'
    reference code) and on the flat vector, and the aggregation step alone on C stacked gradients
    (``batched_rule``, 100 calls): the cost of the per-tensor projection.

Times are medians over ``--repeats`` rounds in which every form runs once (interleaved, so drifts of a
shared machine hit all forms alike), with ``torch.cuda.synchronize()`` on CUDA. Reported per
training-step (one step of one row of the table: its target and source gradients, aggregation and
update) and as ratios loop/batched. No timing is asserted anywhere.

Usage::

    python benchmarks/phase_diagram.py [--device auto|cpu|cuda|all] [--n-points 2000] [--steps 40]
        [--repeats 3] [--chunk-sizes 1 4 8 16 32 64] [--probe-steps 4] [--quick] [--seed 0] [--json OUT]

``--device all`` runs on the CPU and, when present, on CUDA. ``--quick`` is a smoke test (tiny sizes).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(_ROOT))

from fda_core.common.devices import resolve_device  # noqa: E402
from fda_core.data import sigmoid_net as N  # noqa: E402
from fda_core.experiments import phase_diagram as S  # noqa: E402
from fda_core.common.files import atomic_write_json  # noqa: E402

PAPER_TRIALS, PAPER_STEPS = 3, 300


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    _sync(device)
    t = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t


def _interleaved(forms: dict[str, Callable[[], Any]], repeats: int, device: torch.device) -> dict[str, float]:
    """Median seconds of each form over ``repeats`` rounds (one call of every form per round)."""
    times: dict[str, list[float]] = {k: [] for k in forms}
    for _ in range(repeats):
        for k, fn in forms.items():
            times[k].append(_timed(fn, device))
    return {k: statistics.median(v) for k, v in times.items()}


def environment(device: torch.device) -> dict[str, Any]:
    env = {"torch": torch.__version__, "python": platform.python_version(), "device": str(device),
           "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(), "machine": platform.machine(),
           "processor": platform.processor()}
    if device.type == "cuda":
        env["gpu"] = torch.cuda.get_device_name(device)
    return env


# ------------------------------------------------------------------------------------------ (a) kernel
def kernel_forms(data: S.SyntheticData, n_nets: int) -> dict[str, Callable[[], Any]]:
    """Three ways to get the full-set gradient of ``n_nets`` networks (see module docstring (a))."""
    theta = torch.stack([S.init_params(data, 0)] * n_nets) + 0.01 * torch.randn(
        n_nets, N.N_PARAMS, generator=torch.Generator().manual_seed(1)).to(data.x)
    x, y = data.x, data.y_sources[-1]
    net = S.make_network(theta[0])
    names = [k for k, _ in net.named_parameters()]
    shapes = [p.shape for p in net.parameters()]
    sizes = [p.numel() for p in net.parameters()]
    batched = {k: t.reshape(n_nets, *s).contiguous() for k, t, s in zip(names, theta.split(sizes, dim=1), shapes)}
    loss_fn = nn.MSELoss()

    def loss(params, xb, yb):
        return loss_fn(torch.func.functional_call(net, params, (xb,)), yb)

    vgrad = torch.func.vmap(torch.func.grad(loss), in_dims=(0, None, None))
    nets = [S.make_network(theta[i]) for i in range(n_nets)]

    def loop():
        for m in nets:
            m.zero_grad(set_to_none=True)
            loss_fn(m(x), y).backward()

    ws, y_t = N.Workspace(), y.T.contiguous()
    return {
        "hand-written batched": lambda: N.batched_set_gradient(theta, x, y_t, ws),  # the trainer's source pass
        "vmap(grad)": lambda: vgrad(batched, x, y),
        "autograd loop": loop,
    }


# ------------------------------------------------------------------------------------------ (b)-(d)
def _rows(shifts: Sequence[int], sizes: Sequence[int], rules: Sequence[str]) -> list[tuple[int, int, str]]:
    return [(s, j, r) for s in shifts for j in sizes for r in rules]


def _loop(data: S.SyntheticData, rows: list[tuple[int, int, str]], steps: int) -> None:
    for s, j, r in rows:
        S.train_single(data, shift_index=s, size_index=j, rule=r, beta=0.5, steps=steps, eval_every=10)


def run(
    device: str = "cpu",
    n_points: int = 2000,
    steps: int = 40,
    repeats: int = 3,
    shifts: Sequence[int] = (0, 4, 8),
    sizes: Sequence[int] = (0, 4, 8),
    chunk_sizes: Sequence[int] = (1, 4, 8, 16, 32, 64),
    kernel_nets: int = 8,
    probe_steps: int = 4,
    paper_n: int = S.PAPER_N_POINTS,
    seed: int = 0,
) -> dict[str, Any]:
    """All measurements on one device; returns a dict of records (times in seconds)."""
    dev = resolve_device(device)
    rules = S.synthetic_methods()  # the registry's methods with a gradient rule
    data = S.make_phase_diagram_data(n_points, seed=seed, device=dev)
    rows = _rows(shifts, sizes, rules)
    n_rows = len(rows)
    out: dict[str, Any] = {"device": str(dev), "n_points": n_points, "steps": steps, "n_rows": n_rows,
                           "shifts": list(shifts), "sizes": list(sizes), "rules": list(rules),
                           "environment": environment(dev)}

    # (a) gradient kernel
    forms = kernel_forms(data, kernel_nets)
    for fn in forms.values():  # warm-up
        fn()
    kt = _interleaved(forms, max(3, repeats), dev)
    out["kernel"] = {k: {"seconds": v, "ms_per_network_gradient": 1e3 * v / kernel_nets} for k, v in kt.items()}

    # (b), (c): batched vs loop on the same rows
    grid_kw = dict(rules=rules, betas=(0.5,), steps=steps, shift_indices=list(shifts), size_indices=list(sizes),
                   device=dev, progress=False)
    info: dict[str, Any] = {}

    def batched():
        info["batched"] = S.train_grid(data, **grid_kw).timing

    def batched_nodedupe():
        info["nodedupe"] = S.train_grid(data, dedupe=False, **grid_kw).timing

    S.train_grid(data, **{**grid_kw, "steps": 2})  # warm-up
    _loop(data, rows[:2], 2)
    t = _interleaved({"batched": batched, "batched, no dedupe": batched_nodedupe,
                      "loop": lambda: _loop(data, rows, steps)}, repeats, dev)
    row_steps = n_rows * steps
    out["training"] = {k: {"seconds": v, "ms_per_training_step": 1e3 * v / row_steps} for k, v in t.items()}
    out["training"]["batched"]["chunk_size"] = info["batched"]["chunk_size"]
    out["training"]["batched"]["n_trainings_run"] = info["batched"]["n_trainings_run"]
    out["ratio_loop_over_batched"] = t["loop"] / t["batched"]
    out["ratio_loop_over_batched_nodedupe"] = t["loop"] / t["batched, no dedupe"]

    # (d) chunk scan (no dedupe: every chunk the same kind of work)
    scan = {}
    scan_forms = {c: (lambda c=c: S.train_grid(data, dedupe=False, chunk_size=c, **grid_kw)) for c in chunk_sizes}
    ts = _interleaved(scan_forms, max(1, repeats - 1), dev)
    for c, v in ts.items():
        scan[int(c)] = {"seconds": v, "ms_per_training_step": 1e3 * v / row_steps}
    out["chunk_scan"] = scan
    out["auto_chunk_size"] = S.auto_chunk_size(n_points, dev)

    # (f) FedGP granularity: per tensor (default) vs flat, whole trainings and the aggregation alone
    gp_kw = {**grid_kw, "rules": [r for r in rules if S.resolve_methods([r], (0.5,))[0].gradient_rule == "fedgp"],
             "dedupe": False}
    gran_forms = {g: (lambda g=g: S.train_grid(data, granularity=g, **gp_kw)) for g in S.GRANULARITIES}
    tg = _interleaved(gran_forms, repeats, dev)
    gp_rows = len(gp_kw["rules"]) * len(shifts) * len(sizes)
    c = S.auto_chunk_size(n_points, dev)
    gen = torch.Generator().manual_seed(seed + 1)
    gs, gt = (torch.randn(c, N.N_PARAMS, generator=gen).to(device=dev, dtype=data.dtype) for _ in range(2))
    beta = torch.full((c,), 0.5, device=dev, dtype=data.dtype)
    agg_forms = {g: (lambda g=g: [S.batched_rule("fedgp", gs, gt, beta, g) for _ in range(100)]) for g in S.GRANULARITIES}
    ta = _interleaved(agg_forms, max(3, repeats), dev)
    out["granularity"] = {
        "rows": gp_rows, "rules": gp_kw["rules"], "chunk": c,
        "training_ms_per_training_step": {g: 1e3 * v / (gp_rows * steps) for g, v in tg.items()},
        "aggregation_us_per_call": {g: 1e6 * v / 100 for g, v in ta.items()},
        "ratio_per_tensor_over_flat_training": tg["per_tensor"] / tg["flat"],
        "ratio_per_tensor_over_flat_aggregation": ta["per_tensor"] / ta["flat"],
    }

    # (e) paper scale: full grid at n = paper_n for a few steps, loop on the sub-grid
    pdata = S.make_phase_diagram_data(paper_n, seed=seed, device=dev)
    full = S.train_grid(pdata, rules=rules, betas=(0.5,), steps=probe_steps, device=dev, progress=False)
    tb = full.timing["wall_s"]
    loop_rows = rows[: max(6, len(rows) // 3)]
    tl = _timed(lambda: _loop(pdata, loop_rows, probe_steps), dev)
    full_rows = len(full.table)
    per_row_step_batched = tb / (full_rows * probe_steps)
    per_row_step_loop = tl / (len(loop_rows) * probe_steps)
    paper_row_steps = PAPER_TRIALS * full_rows * PAPER_STEPS
    out["paper_scale"] = {
        "n_points": paper_n, "rows_per_trial": full_rows, "trials": PAPER_TRIALS, "steps": PAPER_STEPS,
        "probe_steps": probe_steps, "batched_probe_seconds": tb, "loop_probe_seconds": tl,
        "batched_ms_per_training_step": 1e3 * per_row_step_batched,
        "loop_ms_per_training_step": 1e3 * per_row_step_loop,
        "batched_extrapolated_seconds": per_row_step_batched * paper_row_steps,
        "loop_extrapolated_seconds": per_row_step_loop * paper_row_steps,
    }
    return out


def _fmt_s(sec: float) -> str:
    return f"{sec:.1f} s" if sec < 120 else f"{sec / 60:.1f} min"


def format_report(result: dict[str, Any]) -> str:
    env = result["environment"]
    lines = [f"== device {result['device']} ({env.get('gpu', env['processor'] or env['machine'])}, torch "
             f"{env['torch']}, {env['threads']} threads) ==",
             f"(a) gradient kernel, full set n = {result['n_points']}, per network-gradient:"]
    k = result["kernel"]
    ref = k["hand-written batched"]["ms_per_network_gradient"]
    for name, v in k.items():
        lines.append(f"    {name:<22} {v['ms_per_network_gradient']:8.3f} ms   ratio to hand-written {v['ms_per_network_gradient'] / ref:5.2f}")
    tr = result["training"]
    lines.append(f"(b,c) {result['n_rows']} trainings (shifts {result['shifts']} × sizes {result['sizes']} × "
                 f"{len(result['rules'])} methods), "
                 f"{result['steps']} steps, n = {result['n_points']}, per training-step:")
    b = tr["batched"]
    for name, v in ((f"batched (chunk {b['chunk_size']}, {b['n_trainings_run']} run)", b),
                    ("batched, no dedupe", tr["batched, no dedupe"]), ("loop of train_single", tr["loop"])):
        lines.append(f"    {name:<34} {v['ms_per_training_step']:8.3f} ms   ({_fmt_s(v['seconds'])})")
    lines.append(f"    ratio loop/batched = {result['ratio_loop_over_batched']:.2f}, loop/batched without dedupe = "
                 f"{result['ratio_loop_over_batched_nodedupe']:.2f}")
    lines.append(f"(d) chunk scan (no dedupe), per training-step (auto chunk size here: {result['auto_chunk_size']}):")
    lines.append("    " + "  ".join(f"{c}: {v['ms_per_training_step']:.3f} ms" for c, v in result["chunk_scan"].items()))
    p = result["paper_scale"]
    lines.append(f"(e) paper scale ({p['trials']} trials × {p['rows_per_trial']} trainings × {p['steps']} steps, "
                 f"n = {p['n_points']}), extrapolated from {p['probe_steps']} steps:")
    lines.append(f"    batched {p['batched_ms_per_training_step']:.3f} ms/training-step → {_fmt_s(p['batched_extrapolated_seconds'])}; "
                 f"loop {p['loop_ms_per_training_step']:.3f} ms/training-step → {_fmt_s(p['loop_extrapolated_seconds'])}; "
                 f"ratio {p['loop_extrapolated_seconds'] / p['batched_extrapolated_seconds']:.2f}")
    gr = result["granularity"]
    tr_ms, ag_us = gr["training_ms_per_training_step"], gr["aggregation_us_per_call"]
    lines.append(f"(f) FedGP projection per tensor (default) vs flat, {gr['rows']} trainings ({', '.join(gr['rules'])}):")
    lines.append(f"    training {tr_ms['per_tensor']:.3f} vs {tr_ms['flat']:.3f} ms/training-step, ratio per-tensor/flat = "
                 f"{gr['ratio_per_tensor_over_flat_training']:.2f}; aggregation of {gr['chunk']} stacked gradients "
                 f"{ag_us['per_tensor']:.0f} vs {ag_us['flat']:.0f} µs per call, ratio "
                 f"{gr['ratio_per_tensor_over_flat_aggregation']:.2f}")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | all (CPU, and CUDA when present)")
    p.add_argument("--n-points", type=int, default=2000)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--chunk-sizes", type=int, nargs="+", default=[1, 4, 8, 16, 32, 64])
    p.add_argument("--probe-steps", type=int, default=4, help="steps of the paper-scale probe")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="smoke test: tiny sizes, one repeat")
    p.add_argument("--json", default=None, help="also write the records to this JSON file (atomically)")
    return p


def main(argv: Sequence[str] | None = None) -> str:
    args = build_parser().parse_args(argv)
    if args.device == "all":
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    else:
        devices = [str(resolve_device(args.device))]
    kw: dict[str, Any] = dict(n_points=args.n_points, steps=args.steps, repeats=args.repeats,
                              chunk_sizes=args.chunk_sizes, probe_steps=args.probe_steps, seed=args.seed)
    if args.quick:
        kw.update(n_points=200, steps=3, repeats=1, chunk_sizes=[1, 8], probe_steps=1, paper_n=300,
                  shifts=(0, 8), sizes=(0, 8), kernel_nets=2)
    results = [run(device=d, **kw) for d in devices]
    report = "\n".join(format_report(r) for r in results)
    print(report)
    if args.json:
        atomic_write_json(args.json, {"results": results, "argv": list(argv) if argv is not None else sys.argv[1:]})
    return report


if __name__ == "__main__":
    main()
