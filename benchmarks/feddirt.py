"""Benchmark of notebook 08's training: the FedDIRT clients as a loop of modules against one batched computation.

What is measured
----------------
Setting: one run of :func:`fda_core.experiments.translation.dirt.train_federated` as notebook 08 trains it at the
paper's scale (Fed INB paper App. E.2; ``docs/translation.md`` § FedDIRT): 5 clients of ``--n`` digits each
(random images here: the time does not depend on the values), FedDIRT with a target domain drawn per sample, DIRT's
network at ``--width`` (paper 1; notebook 08's default 0.25) with InstanceNorm, Adam lr 1e-3, batch 64, FedAvg every
``--period`` mini-batches, evaluation only at the end. The same run with ``client_batching`` = "loop" (one module
and one optimiser per client, stepped one after the other: the CPU's form) and "vmap" (the clients as one
``vmap``-ed step, :mod:`fda_core.experiments.translation.dg_clients`: the form "auto" takes on CUDA).

Time: wall seconds per iteration (one mini-batch step of every client), the median of ``--repeats`` runs of
``--iterations`` iterations after one warm-up run; the run ends with an evaluation, which reads the device, so a GPU
has finished its work when the clock stops. Printed: ms per iteration for each form and the ratio loop / vmap, and
the two forms' final losses (equal to rounding: float32 here, 1e-10 in float64 in ``tests/test_dirt.py``). On CUDA
also the host synchronisations per iteration of each form, counted with ``torch.cuda.set_sync_debug_mode`` (the loop
of earlier versions synchronised four times per client step; both forms should now show 0). No timing is asserted
anywhere.

Notebook 08 at the paper's scale trains 28 runs of 2,000–3,000 iterations (4 runs × FedAvg and FedDIRT at periods
1, 10, 100, and the shared-space variant at period 10), so ms per iteration × 70,000 ≈ its training time.

Usage::

    python benchmarks/feddirt.py [--device auto|cpu|cuda] [--width 1] [--iterations 50] [--repeats 3] [--n 1000]
                                 [--period 10] [--threads 1] [--quick] [--json OUT]
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

from fda_core.common.devices import host_synchronisations_per_step, resolve_device  # noqa: E402
from fda_core.experiments.translation import dirt  # noqa: E402

FORMS = ("loop", "vmap")
N_CLIENTS = 5  # the paper's training rotations 0°, 15°, 30°, 45°, 60°


def data(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """x (5, n, 784), y (n,), the translation bank (5, 5, n, 784): random images of 10 classes."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(N_CLIENTS, n, 784, generator=g)
    y = torch.arange(10).repeat_interleave(-(-n // 10))[:n]
    bank = torch.rand(N_CLIENTS, N_CLIENTS, n, 784, generator=g)
    return x, y, bank


def time_form(form: str, x, y, bank, *, device: torch.device, width: float, iterations: int, period: int,
              repeats: int) -> tuple[float, dict]:
    """Median wall seconds of one run of ``iterations`` iterations in ``form`` (after a warm-up run), and the last
    run's record."""
    kw = dict(views=bank, period=period, iterations=iterations, batch_size=64, lr=1e-3, width=width, seed=0,
              tests={"t": (x[0], y)}, device=str(device), client_batching=form)
    method = dirt.get_dg_method("feddirt")
    dirt.train_federated(method, x, y, **{**kw, "iterations": min(iterations, 5)})  # warm-up: kernels, allocator
    times, rec = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        rec = dirt.train_federated(method, x, y, **kw)
        times.append(time.perf_counter() - start)
    return statistics.median(times), rec


def syncs_per_iteration(form: str, x, y, bank, *, device: torch.device, width: float, period: int) -> float | None:
    """On CUDA: the host synchronisations per iteration of ``form``, from runs of 20 and 40 iterations (so the
    evaluation at the end and the set-up cancel out; :func:`host_synchronisations_per_step`). None on the CPU, where
    nothing synchronises."""
    method = dirt.get_dg_method("feddirt")

    def run(iterations: int) -> None:
        dirt.train_federated(method, x, y, views=bank, period=period, iterations=iterations, batch_size=64,
                             width=width, seed=0, tests={"t": (x[0], y)}, device=str(device), client_batching=form)

    return host_synchronisations_per_step(run, device, 20, 40)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--width", type=float, default=1.0, help="DIRT network width (paper 1, notebook 08's default 0.25)")
    ap.add_argument("--iterations", type=int, default=50, help="iterations per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per form (the median is printed)")
    ap.add_argument("--n", type=int, default=1000, help="digits per client (paper: 1,000)")
    ap.add_argument("--period", type=int, default=10, help="FedAvg every PERIOD mini-batches (paper: 1, 10, 100)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--quick", action="store_true", help="smoke test: width 0.125, 100 digits, 3 iterations, 1 repeat")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args(argv)
    if args.quick:
        args.width, args.n, args.iterations, args.repeats = 0.125, 100, 3, 1
    for name in ("iterations", "repeats", "n", "period", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be ≥ 1, got {getattr(args, name)}")
    if not 0 < args.width <= 4:
        raise SystemExit(f"--width must be in (0, 4], got {args.width}")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    x, y, bank = data(args.n)
    seconds, final, syncs = {}, {}, {}
    for form in FORMS:
        t, rec = time_form(form, x, y, bank, device=device, width=args.width, iterations=args.iterations,
                           period=args.period, repeats=args.repeats)
        seconds[form] = t
        final[form] = rec["loss"][-1]["loss"]
        try:  # a count that fails must not cost the lease its timings
            syncs[form] = syncs_per_iteration(form, x, y, bank, device=device, width=args.width, period=args.period)
        except Exception as exc:  # noqa: BLE001 - reported, and the timings still print
            print(f"  (counting {form}'s synchronisations failed: {exc!r})")
            syncs[form] = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {args.threads} thread(s)"
    out = {"device": str(device), "device_name": name, "width": args.width, "n": args.n, "iterations": args.iterations,
           "period": args.period, "repeats": args.repeats,
           "ms_per_iteration": {f: 1e3 * t / args.iterations for f, t in seconds.items()},
           "ratio_loop_over_vmap": seconds["loop"] / seconds["vmap"], "final_loss": final,
           "syncs_per_iteration": syncs}
    print(f"FedDIRT, {N_CLIENTS} clients x {args.n} digits, width {args.width:g}, batch 64, period {args.period}, "
          f"{args.iterations} iterations, median of {args.repeats}, on {name}")
    for f in FORMS:
        sync = "" if syncs[f] is None else f"   host synchronisations per iteration {syncs[f]:.2f}"
        print(f"  {f:5s}: {out['ms_per_iteration'][f]:8.2f} ms per iteration   final loss {final[f]:.6f}{sync}")
    print(f"  loop / vmap = {out['ratio_loop_over_vmap']:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    main()
