"""Benchmark: time to fit Hist IndAEINB-L10-K10-J100 (V = 500) on Rotated MNIST, fast vs straightforward.

What is measured
----------------
Rotated MNIST from MNIST-5k (5 clients: 0°, 15°, 30°, 45°, 60°; 10 digit classes; ``--n-per-class``
training digits per class and client, 400 by default, the paper has 1,000), encoded by one convolutional
autoencoder per client (trained first, timed separately and not part of the fit). Then, in the same
process, on the same latents and the same Haar draws:

(a) ``fast``: :class:`fda_core.experiments.translation.FedINB` — the 10 per-class problems batched into one
    computation, projections and gradients in float32 (Θ and the Stiefel step in float64), trial
    projections rebuilt from X·G (one pass over the data per iteration instead of one per Armijo trial),
    sorting through numpy on the CPU, the communication log on;
(b) ``reference``: a straightforward implementation of the same algorithm (``docs/translation.md``): a Python
    loop over classes and clients, float64 everywhere, each trial projected directly (X_m Θ(τ)), the
    gradient by autograd through ``torch.sort`` with the barycenter detached (paper Remark 1), VW edges
    and the 1-D maps per class.

Both fit all L layers. Reported: wall-clock seconds of each fit (``time.perf_counter``, CUDA synchronised),
their ratio, and the max-K-SW objective of both at Θ₀ of the first layer (must agree to float32
precision) and after the first layer's search (agrees closely; the two can take slightly different
Armijo paths). The paper reports ≈ 5 minutes for INB on one RTX A5000 (Sec. 4.2); the project's target is
under one minute on an H100.

Usage::

    python benchmarks/inb.py [--device auto|cpu|cuda] [--threads 1] [--quick] [--n-per-class 400]
                             [--layers 10] [--directions 10] [--iters 100] [--bins 500] [--no-reference]
                             [--data-root DIR] [--json OUT]

``--quick`` (smoke test, seconds): 3 classes, 40 digits per class, L = 2, J = 10, V = 20. ``--threads``
defaults to 1: on a shared 2-core machine OpenMP's spinning barriers make 2 threads many times slower.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path

import torch

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(_ROOT))

from fda_core.common.devices import resolve_device  # noqa: E402
from fda_core.common.files import atomic_write_json  # noqa: E402
from fda_core.core.barycenter import (ClientCDF, barycenter_grid, barycenter_quantile,  # noqa: E402
                                      fit_client_cdf, vw_edges, vw_pseudo_samples)
from fda_core.core.stiefel import descent_slope, haar_stiefel  # noqa: E402
from fda_core.data.autoencoder import train_autoencoder  # noqa: E402
from fda_core.data.rotated_domains import rotated_mnist  # noqa: E402
from fda_core.experiments.paper_numbers import paper_value  # noqa: E402
from fda_core.experiments.translation.inb import FedINB  # noqa: E402

PAPER_SECONDS_A5000 = 60.0 * paper_value("train_minutes_a5000")  # Fed INB paper, Sec. 4.2
TARGET_H100_SECONDS = 60.0


# ------------------------------------------------------------------------------- reference version
def _ref_objective(xs: list[torch.Tensor], theta: torch.Tensor, n_bins: int | None) -> torch.Tensor:
    """Client loop, float64: sorted projections (or VW edges) averaged by the server, y detached."""
    m, n, k = len(xs), xs[0].shape[0], theta.shape[1]
    sorted_proj = [torch.sort(x @ theta, dim=0).values for x in xs]  # (n, K) each
    with torch.no_grad():
        if n_bins is None:
            y = sum(sorted_proj) / m
        else:
            edges = sum(vw_edges(s.T, n_bins) for s in sorted_proj) / m  # (K, V+1)
            y = vw_pseudo_samples(edges, n).T
    return sum(((s - y) ** 2).sum() for s in sorted_proj) / (m * k * n)


def _ref_max_k_sw(xs, theta, max_iter, n_bins, tol=1e-6, init_step=0.1, shrink=0.5, grow=1.5, c=0.5,
                  max_backtracks=40):
    """Multi-max-K-SW for one class (docs/translation.md § One INB layer): autograd gradient, Cayley step, Armijo, float64."""
    k = theta.shape[1]
    theta = theta.clone().requires_grad_(True)
    f = _ref_objective(xs, theta, n_bins)
    lr = init_step / shrink
    trace, trials = [float(f.detach())], 0
    for _ in range(max_iter):
        grad = -torch.autograd.grad(f, theta)[0]  # G = ∂(−F)/∂Θ
        th = theta.detach()
        slope = descent_slope(th, grad)
        u = torch.cat([grad, th], 1)
        v = torch.cat([th, -grad], 1)
        accepted = False
        for _bt in range(max_backtracks):
            lr *= shrink
            new = th - lr * u @ torch.linalg.solve(torch.eye(2 * k, dtype=th.dtype) + lr / 2 * v.T @ u, v.T @ th)
            new.requires_grad_(True)
            f_new = _ref_objective(xs, new, n_bins)
            trials += 1
            if -f_new <= -f + c * lr * slope:
                accepted = True
                break
        if not accepted:
            break
        step = (new.detach() - th).abs().max()
        theta, f = new, f_new
        trace.append(float(f.detach()))
        lr = lr * grow / shrink
        if step < tol:
            break
    return theta.detach(), trace, trials


def reference_fit(latents: list[torch.Tensor], labels: list[torch.Tensor], n_layers: int, k: int, max_iter: int,
                  n_bins: int | None, seed: int = 0) -> list[list[dict]]:
    """The straightforward Fed INB fit: per layer, per class, per client loops in float64."""
    classes = sorted(labels[0].unique().tolist())
    gen = torch.Generator().manual_seed(seed)
    grid = barycenter_grid(100)
    z = {c: [x[y == c].double() for x, y in zip(latents, labels)] for c in classes}
    d = latents[0].shape[1]
    history = []
    for _layer in range(n_layers):
        theta0 = haar_stiefel(d, k, len(classes), gen)  # same draws as the fast version
        row = []
        for ci, c in enumerate(classes):
            theta, trace, trials = _ref_max_k_sw(z[c], theta0[ci], max_iter, n_bins)
            cdfs = [fit_client_cdf((x @ theta).T) for x in z[c]]  # per client, (K, n)
            stacked = ClientCDF(torch.stack([q.mu for q in cdfs]), torch.stack([q.sigma for q in cdfs]),
                                torch.stack([q.mass for q in cdfs]))
            bary = barycenter_quantile(stacked, grid, client_dim=0)
            for m, x in enumerate(z[c]):
                p = (x @ theta).T
                t = bary.forward(cdfs[m].forward(p))
                z[c][m] = x + (t - p).T @ theta.T
            row.append(dict(label=c, trace=trace, trials=trials))
        history.append(row)
    return history


# ------------------------------------------------------------------------------------------ runner
def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def run(quick: bool = False, device: str = "auto", threads: int | None = 1, n_per_class: int = 400,
        n_layers: int = 10, n_directions: int = 10, max_iter: int = 100, n_bins: int = 500, ae_epochs: int = 8,
        reference: bool = True, seed: int = 0, data_root: str = "") -> dict:
    """Time the fast and the reference fit in one process; returns a record (see module docstring).

    ``data_root``: a folder with the full MNIST IDX files (``fda data fetch mnist``, or ``benchmarks/gpu_data.sh``'s
    gzip copies), so that the paper's 1,000 digits per class can be drawn; default MNIST-5k (at most 499)."""
    if threads is not None:
        torch.set_num_threads(threads)
    dev = resolve_device(device)
    n_classes = 10
    if quick:
        n_per_class, n_layers, max_iter, n_bins, ae_epochs, n_classes = 40, 2, 10, 20, 1, 3
    data = rotated_mnist((0, 15, 30, 45, 60), n_train_per_class=n_per_class, n_test_per_class=1, data_root=data_root,
                         seed=seed)
    keep = [y < n_classes for y in data.train_y]
    xs = [x[k] for x, k in zip(data.train_x, keep)]
    ys = [y[k] for y, k in zip(data.train_y, keep)]
    t0 = time.perf_counter()
    aes = [train_autoencoder(x, epochs=ae_epochs, seed=seed + i, device=dev)[0] for i, x in enumerate(xs)]
    _sync(dev)
    ae_seconds = time.perf_counter() - t0
    model = FedINB(n_layers, n_directions, max_iter, n_bins, variant="IndAEINB", autoencoders=aes, seed=seed,
                   device=dev)
    t0 = time.perf_counter()
    model.fit(xs, ys)
    _sync(dev)
    fast_seconds = time.perf_counter() - t0
    rec = dict(
        name=model.name, device=str(dev), device_name=torch.cuda.get_device_name(dev) if dev.type == "cuda" else
        platform.processor() or platform.machine(), threads=torch.get_num_threads(), torch=torch.__version__,
        cpu_count=os.cpu_count(), n_clients=5, n_classes=n_classes, n_per_class=n_per_class, dim=model.dim,
        data=data.source,
        quick=quick, ae_seconds=ae_seconds, fast_seconds=fast_seconds,
        params_per_client=model.communication.total(),
        trials_per_class=sum(model.iteration_counts().values()) / n_classes,
    )
    if reference:
        with torch.inference_mode():
            latents = [model._encode(x, i).cpu() for i, x in enumerate(xs)]
        t0 = time.perf_counter()
        ref = reference_fit(latents, ys, n_layers, n_directions, max_iter, n_bins, seed)
        rec["reference_seconds"] = time.perf_counter() - t0
        rec["reference_device"] = "cpu"
        rec["ratio"] = rec["reference_seconds"] / fast_seconds
        fast0 = [h for h in model.history if h["layer"] == 0]
        rel0 = max(abs(f["trace"][0] - r["trace"][0]) / abs(r["trace"][0]) for f, r in zip(fast0, ref[0]))
        rel_end = max(abs(f["trace"][-1] - r["trace"][-1]) / abs(r["trace"][-1]) for f, r in zip(fast0, ref[0]))
        rec["max_objective_rel_diff"] = rel0
        rec["layer0_final_objective_rel_diff"] = rel_end
        rec["reference_trials_per_class"] = sum(r["trials"] for row in ref for r in row) / n_classes
    return rec


def format_report(rec: dict) -> str:
    lines = [
        f"Fed INB fit benchmark: {rec['name']} on Rotated MNIST ({rec.get('data', 'MNIST-5k')}), {rec['n_clients']} clients x "
        f"{rec['n_classes']} classes x {rec['n_per_class']} digits per class, latent d = {rec['dim']}"
        + (" [quick]" if rec["quick"] else ""),
        f"device: {rec['device']} ({rec['device_name']}), torch {rec['torch']}, threads {rec['threads']}, "
        f"cpu_count {rec['cpu_count']}",
        f"autoencoders (5, not part of the fit): {rec['ae_seconds']:.1f} s",
        f"fast fit (batched classes, float32 search):      {rec['fast_seconds']:8.2f} s   "
        f"({rec['trials_per_class']:.0f} Armijo trials per class, {rec['params_per_client']:,} parameters per client)",
    ]
    if "reference_seconds" in rec:
        lines += [
            f"reference fit (per-class loops, float64, cpu):   {rec['reference_seconds']:8.2f} s   "
            f"({rec['reference_trials_per_class']:.0f} trials per class)",
            f"ratio reference / fast: {rec['ratio']:.2f}x",
            f"objective at the first layer's initial directions: max relative difference {rec['max_objective_rel_diff']:.1e}; "
            f"after its search: {rec['layer0_final_objective_rel_diff']:.1e}",
        ]
    n_paper = paper_value("setting")["n_train_per_class"]
    lines.append(f"paper: about {PAPER_SECONDS_A5000 / 60:.0f} min on one RTX A5000 (n = {n_paper:,} per class); "
                 f"target: < {TARGET_H100_SECONDS:.0f} s on an H100")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: leave torch's default)")
    p.add_argument("--quick", action="store_true", help="tiny sizes for a smoke test")
    p.add_argument("--n-per-class", type=int, default=400, help="training digits per class and client (MNIST-5k: at "
                   "most 499; the paper: 1,000 of full MNIST, with --data-root)")
    p.add_argument("--data-root", default="", help="folder with the full MNIST IDX files (default: MNIST-5k)")
    p.add_argument("--layers", type=int, default=10)
    p.add_argument("--directions", type=int, default=10)
    p.add_argument("--iters", type=int, default=100)
    p.add_argument("--bins", type=int, default=500)
    p.add_argument("--ae-epochs", type=int, default=8)
    p.add_argument("--no-reference", action="store_true", help="skip the straightforward implementation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None, help="also write the record as JSON (atomically)")
    a = p.parse_args(argv)
    rec = run(a.quick, a.device, a.threads or None, a.n_per_class, a.layers, a.directions, a.iters, a.bins,
              a.ae_epochs, not a.no_reference, a.seed, a.data_root)
    print(format_report(rec))
    if a.json:
        atomic_write_json(a.json, rec)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
