"""Benchmark: notebook 06's held-out WD at one depth, exact EMD on the host against Sinkhorn on the host and on a device.

What is measured
----------------
The identity translator's WD of Rotated MNIST's held-out digits (``fda_core.experiments.translation.experiments
.identity_wd``, the measurement every INB curve repeats after each of its depths): per ordered pair of the 5
clients (0°, 15°, 30°, 45°, 60°) and digit class, the squared-Euclidean OT cost between the real target digits
and the untranslated source digits, 200 OT problems in all (``docs/translation.md`` § Variants, Metric). In one
process, on the same pairs:

(a) ``emd``: the exact solver (POT's network simplex, one problem at a time on the host);
(b) ``sinkhorn host``: the batched Sinkhorn on the CPU, as every call ran before ``wasserstein_distances`` took
    a ``device`` (also on a GPU machine), in the form it picks (``sinkhorn_domain="auto"``: on the kernel
    exp(−C/ε) where that is safe, as on these digits);
(c) ``sinkhorn device``: the same Sinkhorn with the costs and the iterations on ``--device``;
(d) ``sinkhorn host log``: (b) forced into the log domain (log-sum-exp on −C/ε, every call's form before
    2026-11-29; ``docs/translation.md`` § Sinkhorn in the kernel or the log domain).

Reported: seconds of each (median of ``--repeats``; CUDA synchronised by the results' transfer), the ratios
(b)/(c), (a)/(c) and (d)/(b), the mean WD of each, Sinkhorn's bias against EMD, the largest relative difference of
(c) from (b) (float32 cost rounding on a GPU; 0 on the CPU) and that of (b) from (d) (the kernel form's rounding).

Notebook 06 at the paper's sizes holds out MNIST's whole test file (892 to 1,135 digits per class; ``--data-root``
with the IDX files, ``--n-per-class 0``) and measures WD after each of its 11 depths per run, about 20 runs.

Usage::

    python benchmarks/wasserstein.py [--device auto|cpu|cuda] [--threads 1] [--n-per-class 100]
                                     [--data-root DIR] [--repeats 1] [--forms emd host device log] [--quick]
                                     [--json OUT]

``--forms`` picks among (a) ``emd``, (b) ``host``, (c) ``device`` and (d) ``log`` (at the paper's sizes the host
Sinkhorn takes about 7 s per problem on one CPU thread, so ``--forms emd device`` there); ratios need both of their
forms.

``--quick`` (smoke test, seconds): 2 clients, 12 held-out digits per class.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # run from a checkout without installing the package
    sys.path.insert(0, str(_ROOT))

from fda_core.common.devices import resolve_device  # noqa: E402
from fda_core.common.files import atomic_write_json  # noqa: E402
from fda_core.data.rotated_domains import rotated_mnist  # noqa: E402
from fda_core.experiments.translation.experiments import identity_wd  # noqa: E402

ANGLES = (0, 15, 30, 45, 60)
REG = 0.02  # notebook 06's wd_reg (ε = 0.02 × mean cost)


def timed(repeats: int, fn) -> tuple[float, np.ndarray]:
    """Median wall seconds of ``repeats`` calls of ``fn`` (returning WD values, which are on the host by then)."""
    times, values = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        values = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), values


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help="auto | cpu | cuda: where (c) runs")
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (the host Sinkhorn)")
    ap.add_argument("--n-per-class", type=int, default=100,
                    help="held-out digits per class and client (notebook 06's default 100); 0: every test digit")
    ap.add_argument("--data-root", default="", help="folder with the MNIST IDX files ('' uses MNIST-5k)")
    ap.add_argument("--repeats", type=int, default=1, help="timed calls per solver (the median is printed)")
    ap.add_argument("--forms", nargs="+", default=["emd", "host", "device", "log"],
                    choices=["emd", "host", "device", "log"],
                    help="which of (a) emd, (b) host Sinkhorn, (c) device Sinkhorn, (d) host log-domain Sinkhorn "
                         "to time")
    ap.add_argument("--quick", action="store_true", help="smoke test: 2 clients, 12 digits per class")
    ap.add_argument("--json", default=None, help="also write the numbers to this JSON file")
    args = ap.parse_args(argv)
    angles = ANGLES[:2] if args.quick else ANGLES
    if args.quick:
        args.n_per_class, args.data_root = 12, ""
    for name in ("threads", "repeats"):
        if getattr(args, name) < 1:
            raise SystemExit(f"--{name} must be ≥ 1, got {getattr(args, name)}")
    if args.n_per_class < 0 or (args.n_per_class == 0 and not args.data_root):
        raise SystemExit(f"--n-per-class must be ≥ 1, or 0 with --data-root, got {args.n_per_class}")
    torch.set_num_threads(args.threads)
    device = resolve_device(args.device)
    domains = rotated_mnist(angles, 2, args.n_per_class, args.data_root, 0)
    forms = {name: form for key, (name, form) in {"emd": ("emd", ("emd", None, "auto")),
                                                      "host": ("sinkhorn host", ("sinkhorn", None, "auto")),
                                                      "device": ("sinkhorn device", ("sinkhorn", device, "auto")),
                                                      "log": ("sinkhorn host log", ("sinkhorn", None, "log"))}.items()
             if key in args.forms}
    if device.type == "cuda":  # warm-up: kernels and the allocator, outside the timings
        identity_wd(rotated_mnist(angles[:2], 2, 3, "", 0), "sinkhorn", REG, device=device)
    seconds, mean_wd, values = {}, {}, {}
    for form, (method, where, domain) in forms.items():
        seconds[form], wd = timed(args.repeats, lambda m=method, w=where, k=domain: identity_wd(
            domains, m, REG, chunk=2000, device=w, sinkhorn_domain=k).wd.to_numpy())
        values[form], mean_wd[form] = wd, float(wd.mean())
    counts = torch.bincount(domains.test_y[0], minlength=10).tolist()
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"cpu, {args.threads} thread(s)"
    out = {"device": str(device), "device_name": name, "clients": len(angles),
           "problems": len(next(iter(values.values()))), "held_out_per_class": counts, "repeats": args.repeats,
           "seconds": seconds, "mean_wd": mean_wd}
    print(f"Held-out WD of the identity translator: {out['problems']} OT problems ({len(angles)} clients, "
          f"{min(counts)}-{max(counts)} digits per class), median of {args.repeats}, (c) on {name}")
    for form, t in seconds.items():
        print(f"  {form:<16} {t:9.3f} s   mean WD {mean_wd[form]:.4f}")
    # (slower form, faster form, key of the time ratio, key of the largest relative difference of the second from
    # the first)
    for slow, fast, ratio_key, diff_key in (
            ("sinkhorn host", "sinkhorn device", "ratio_host_over_device_sinkhorn", "max_rel_diff_device_vs_host"),
            ("sinkhorn host log", "sinkhorn host", "ratio_log_over_auto_host_sinkhorn", "max_rel_diff_auto_vs_log")):
        if {slow, fast} <= set(values):
            reference, other = values[slow], values[fast]
            out[ratio_key] = seconds[slow] / seconds[fast]
            out[diff_key] = float(np.max(np.abs(other - reference) / np.abs(reference)))
            print(f"  {slow} / {fast.removeprefix('sinkhorn ')}: {out[ratio_key]:.2f}x; largest relative "
                  f"difference {out[diff_key]:.1e}")
    sinkhorn = next((f for f in ("sinkhorn device", "sinkhorn host") if f in values), None)
    if "emd" in values and sinkhorn:
        out["ratio_emd_over_sinkhorn"] = {sinkhorn: seconds["emd"] / seconds[sinkhorn]}
        out["sinkhorn_bias_vs_emd"] = mean_wd[sinkhorn] / mean_wd["emd"] - 1
        print(f"  emd / {sinkhorn}: {seconds['emd'] / seconds[sinkhorn]:.2f}x; Sinkhorn's bias against EMD "
              f"{100 * out['sinkhorn_bias_vs_emd']:+.2f} %")
    if args.json:
        atomic_write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
