"""Benchmark of notebook 06's FedStarGAN training: the clients one after another or as one batched step, and the
losses read from the device at the end or after every step.

What is measured
----------------
Setting: one run of :func:`fda_core.experiments.translation.stargan.train_fedstargan` as notebook 06 trains it at the
paper's scale (``stargan_study.PAPER_SCALE``; ``docs/translation.md`` § FedStarGAN): 5 clients of ``--n`` digits
each (random images here: the time does not depend on the values), StarGAN's G and D with ``--conv-dim`` first-layer
channels (paper scale 64; notebook 06's default 8) and ``--g-repeat`` residual blocks (6; default 1), batch 16,
n_critic 5, FedAvg every ``--sync-every`` mini-batches, no evaluation. Three forms of the same run:

* ``per-step``: the clients one after another, the losses read after every client step (``stargan.LOSS_FLUSH_EVERY``
  = 1: one read per D step and one per G step; earlier versions read 2 and 3, each a host synchronisation on a GPU)
  and the draws sent one iteration at a time (``dirt.INDEX_CHUNK`` = 1; earlier versions made three blocking copies
  per client step). It approximates the loop of earlier versions, which is no longer in the library;
* ``loop`` (``client_batching="loop"``, the CPU's form): the clients one after another, nothing read back until
  the run ends, the draws a chunk of iterations ahead;
* ``vmap`` (``client_batching="vmap"``, the form "auto" takes on CUDA): every client's D step (and G step) as one
  ``vmap``-ed computation (:mod:`fda_core.experiments.translation.stargan_clients`).

On the CPU ``per-step`` and ``loop`` are the same numbers bit for bit, ``vmap`` the same to rounding
(``tests/test_stargan.py``).

Time: wall seconds per iteration (one D step of every client, and a G step every 5th iteration), the median of
``--repeats`` runs of ``--iterations`` iterations after one warm-up run; the run ends by reading the losses, so a GPU
has finished its work when the clock stops. Printed: ms per iteration of each form, the ratios per-step / loop and
loop / vmap (per-step / vmap: the earlier code against the GPU's default now), the forms' mean D losses, and on
CUDA the host synchronisations per iteration of each form (``torch.cuda.set_sync_debug_mode``). No timing is
asserted anywhere.

Notebook 06 at the paper's scale trains FedStarGAN-16 and FedStarGAN-128 for 2,048 iterations each, so ms per
iteration × 4,096 ≈ its FedStarGAN training time (its WD evaluations come on top).

Usage::

    python benchmarks/fedstargan.py [--device auto|cpu|cuda] [--conv-dim 64] [--g-repeat 6] [--iterations 20]
                                    [--repeats 3] [--n 1000] [--sync-every 16] [--threads 1] [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from fda_core.common.devices import host_synchronisations_per_step, resolve_device  # noqa: E402
from fda_core.experiments.translation import dirt  # noqa: E402
from fda_core.experiments.translation import stargan as sg  # noqa: E402
from fda_core.experiments.translation.stargan_study import PAPER_SCALE  # noqa: E402

FORMS = ("per-step", "loop", "vmap")
N_CLIENTS = 5  # notebook 06's rotations 0°, 15°, 30°, 45°, 60°


def data(n: int, seed: int = 0) -> list[torch.Tensor]:
    """The clients' images: N_CLIENTS tensors (n, 784) of random pixels in [0, 1]."""
    g = torch.Generator().manual_seed(seed)
    return list(torch.rand(N_CLIENTS, n, 784, generator=g))


@contextlib.contextmanager
def form_settings(form: str):
    """The module settings of ``form`` while the block runs (``per-step``: read after every step, draw per
    iteration)."""
    saved = sg.LOSS_FLUSH_EVERY, dirt.INDEX_CHUNK
    if form == "per-step":
        sg.LOSS_FLUSH_EVERY, dirt.INDEX_CHUNK = 1, 1
    try:
        yield
    finally:
        sg.LOSS_FLUSH_EVERY, dirt.INDEX_CHUNK = saved


def train(x: list[torch.Tensor], form: str, iterations: int, args: argparse.Namespace, device: torch.device) -> dict:
    with form_settings(form):
        return sg.train_fedstargan(x, sync_every=args.sync_every, iterations=iterations, batch_size=16,
                                   conv_dim=args.conv_dim, g_repeat=args.g_repeat, seed=0, device=str(device),
                                   client_batching="vmap" if form == "vmap" else "loop")


def time_form(form: str, x, args: argparse.Namespace, device: torch.device) -> tuple[float, dict]:
    """Median wall seconds of one run of ``args.iterations`` iterations in ``form`` (after a warm-up run), and the
    last run's record."""
    train(x, form, min(args.iterations, 5), args, device)  # warm-up: kernels, allocator
    times, rec = [], None
    for _ in range(args.repeats):
        start = time.perf_counter()
        rec = train(x, form, args.iterations, args, device)
        times.append(time.perf_counter() - start)
    return statistics.median(times), rec


def syncs_per_iteration(form: str, x, args: argparse.Namespace, device: torch.device) -> float | None:
    """On CUDA: the host synchronisations per iteration of ``form``, from runs of 10 and 20 iterations
    (:func:`host_synchronisations_per_step`). None on the CPU, where nothing synchronises."""
    return host_synchronisations_per_step(lambda n: train(x, form, n, args, device), device, 10, 20)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda")
    ap.add_argument("--conv-dim", type=int, default=PAPER_SCALE["conv_dim"], help="first-layer channels of G and D")
    ap.add_argument("--g-repeat", type=int, default=PAPER_SCALE["g_repeat"], help="residual blocks of G")
    ap.add_argument("--iterations", type=int, default=20, help="iterations per timed run")
    ap.add_argument("--repeats", type=int, default=3, help="timed runs per form (the median is printed)")
    ap.add_argument("--n", type=int, default=1000, help="digits per client")
    ap.add_argument("--sync-every", type=int, default=16, help="FedAvg every SYNC_EVERY mini-batches (paper: 16, 128)")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--quick", action="store_true", help="smoke test: conv_dim 2, no residual block, 100 digits, "
                                                         "5 iterations, 1 repeat")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args(argv)
    if args.quick:
        args.conv_dim, args.g_repeat, args.n, args.iterations, args.repeats = 2, 0, 100, 5, 1
    for name in ("conv_dim", "iterations", "repeats", "n", "sync_every", "threads"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name.replace('_', '-')} must be ≥ 1, got {getattr(args, name)}")
    if args.g_repeat < 0:
        raise SystemExit(f"--g-repeat must be ≥ 0, got {args.g_repeat}")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    x = data(args.n)
    seconds, losses, syncs = {}, {}, {}
    for form in FORMS:
        seconds[form], rec = time_form(form, x, args, device)
        losses[form] = rec["losses"]
        try:  # a count that fails must not cost the lease its timings
            syncs[form] = syncs_per_iteration(form, x, args, device)
        except Exception as exc:  # noqa: BLE001 - reported, and the timings still print
            print(f"  (counting {form}'s synchronisations failed: {exc!r})")
            syncs[form] = None
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {args.threads} thread(s)"
    ms = {f: 1e3 * t / args.iterations for f, t in seconds.items()}
    runs = len(PAPER_SCALE["sync_steps"]) * PAPER_SCALE["iterations"]
    out = {"device": str(device), "device_name": name, "conv_dim": args.conv_dim, "g_repeat": args.g_repeat,
           "n": args.n, "iterations": args.iterations, "sync_every": args.sync_every, "repeats": args.repeats,
           "ms_per_iteration": ms, "ratio_per_step_over_loop": seconds["per-step"] / seconds["loop"],
           "ratio_loop_over_vmap": seconds["loop"] / seconds["vmap"],
           "ratio_per_step_over_vmap": seconds["per-step"] / seconds["vmap"],
           "losses": losses, "syncs_per_iteration": syncs,
           "paper_scale_training_s": {f: ms[f] * runs / 1e3 for f in FORMS}}
    print(f"FedStarGAN, {N_CLIENTS} clients x {args.n} digits, conv_dim {args.conv_dim}, {args.g_repeat} residual "
          f"blocks, batch 16, FedAvg every {args.sync_every}, {args.iterations} iterations, median of {args.repeats}, "
          f"on {name}")
    for f in FORMS:
        sync = "" if syncs[f] is None else f"   host synchronisations per iteration {syncs[f]:.2f}"
        print(f"  {f:8s}: {ms[f]:8.2f} ms per iteration   mean D loss {losses[f]['d']:.6f}{sync}")
    print(f"  per-step / loop = {out['ratio_per_step_over_loop']:.2f}x, "
          f"loop / vmap = {out['ratio_loop_over_vmap']:.2f}x, "
          f"per-step / vmap = {out['ratio_per_step_over_vmap']:.2f}x")
    fastest = min(FORMS, key=ms.get)
    print(f"  {runs} iterations (notebook 06's paper-scale FedStarGAN runs) at these sizes: about "
          f"{out['paper_scale_training_s'][fastest]:.0f} s of training ({fastest})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    return out


if __name__ == "__main__":
    main()
