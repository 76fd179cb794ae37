"""Where the time of one FedGP aggregation goes, piece by piece, and candidate ways to do it in fewer kernels.

Issue 17's exploration record for ``benchmarks/aggregation.py``: on ResNet-18-shaped float32 updates (62 tensors,
11.7 M parameters) and N sources, each row times one piece or one whole variant, median of ``--repeats`` calls
after warm-up (CUDA events on a GPU, ``perf_counter`` on a CPU), and prints it as a ratio to the copy floor
measured in the same run (``dst.copy_(S)``: N·m·4 bytes read and written). Variants:

* ``flat pieces``: the library's flat FedGP split into its kernels (the (N, m)·(m,) product, the row norms, the
  ``addmv`` combination, the finiteness sum, one host synchronisation);
* ``segmented``: :mod:`fda_core.core.segmented` (layer-wise dots, squared norms and the combination on the flat
  buffer in a fixed handful of kernels) for several chunk lengths, piece by piece and as one whole layer-wise
  FedGP without host synchronisation;
* ``graph``: the whole segmented FedGP captured once in a CUDA graph and replayed (GPU only);
* ``compiled``: the same function through ``torch.compile`` (GPU only, ``--compile``).

Usage::

    python benchmarks/aggregation_variants.py [--device cuda] [--sources 4 10] [--repeats 20] [--compile]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from aggregation import make_updates, resnet18_shapes  # noqa: E402

from fda_core.core.aggregation import fedgp  # noqa: E402
from fda_core.core.segmented import segment_combine, segment_dots, segment_plan, segment_sqnorms  # noqa: E402


def timer(fn, device: torch.device, repeats: int, warmup: int = 3) -> float:
    """Median milliseconds of ``fn()``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def segmented_fedgp(S, t, plan, wb, out):
    """Layer-wise exact FedGP on the flat buffer, no host synchronisation (docs/theory.md § Rules)."""
    dots = segment_dots(S, t, plan)
    norms2 = segment_sqnorms(S, plan)
    safe = torch.where(norms2 > 0, norms2, torch.ones_like(norms2))
    coefs = torch.where(norms2 > 0, dots.clamp_min(0) / safe, torch.zeros_like(dots)) * wb.unsqueeze(1)
    return segment_combine(S, t, 1.0 - wb.sum(), coefs, plan, out=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--sources", type=int, nargs="+", default=[4, 10])
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--chunks", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    p.add_argument("--compile", action="store_true")
    a = p.parse_args(argv)
    dev = torch.device(a.device)
    named = resnet18_shapes(named=True)
    lengths = [math.prod(s) for _, s in named]
    print(f"device {dev} ({torch.cuda.get_device_name(dev) if dev.type == 'cuda' else 'cpu'}), torch {torch.__version__}")
    for n in a.sources:
        S, t, dicts, tdict = make_updates(named, n, dev)
        wb = torch.full((n,), 0.5 / n, device=dev)
        dst = torch.empty_like(S)
        out = torch.empty_like(t)
        rows: list[tuple[str, float]] = []

        def add(name, fn):
            rows.append((name, timer(fn, dev, a.repeats)))

        add("copy floor", lambda: dst.copy_(S))
        add("library flat fedgp(out=)", lambda: fedgp(S, t, 0.5, out=out))
        add("library per-tensor fedgp", lambda: fedgp(dicts, tdict, 0.5))
        add("flat: S @ t", lambda: torch.matmul(S, t))
        add("flat: vector_norm(S, dim=-1)", lambda: torch.linalg.vector_norm(S, dim=-1))
        add("flat: addmv(t, S^T, c)", lambda: torch.addmv(t, S.mT, wb, beta=0.5, out=out))
        add("flat: out.sum()", lambda: out.sum())
        add("flat: one host sync (bool)", lambda: bool(torch.isfinite(wb).all()))
        for c in a.chunks:
            plan = segment_plan(lengths, dev, S.dtype, c)
            coefs = torch.rand(n, len(lengths), device=dev)
            add(f"seg c={c}: dots", lambda: segment_dots(S, t, plan))
            add(f"seg c={c}: sqnorms", lambda: segment_sqnorms(S, plan))
            add(f"seg c={c}: combine", lambda: segment_combine(S, t, 0.5, coefs, plan, out=out))
            add(f"seg c={c}: whole fedgp", lambda: segmented_fedgp(S, t, plan, wb, out))
            ref = fedgp(dicts, tdict, 0.5)
            got = segmented_fedgp(S, t, plan, wb, out)
            flat_ref = torch.cat([ref[k].reshape(-1) for k, _ in named])
            print(f"  N={n} c={c}: segmented vs library per-tensor, rel. error "
                  f"{float((got - flat_ref).norm() / flat_ref.norm()):.2e}; gathered {plan.gathered.numel()} of {plan.m}")
        plan = segment_plan(lengths, dev, S.dtype, 1024)
        if dev.type == "cuda":
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                for _ in range(3):
                    segmented_fedgp(S, t, plan, wb, out)
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                segmented_fedgp(S, t, plan, wb, out)
            add("seg c=1024: CUDA graph replay", graph.replay)
            if a.compile:
                compiled = torch.compile(segmented_fedgp)
                t0 = time.perf_counter()
                compiled(S, t, plan, wb, out)
                torch.cuda.synchronize()
                print(f"  compile: {time.perf_counter() - t0:.1f} s")
                add("seg c=1024: torch.compile", lambda: compiled(S, t, plan, wb, out))
        floor = rows[0][1]
        print(f"\nN = {n} (m = {S.shape[1]:,}):")
        for name, ms in rows:
            print(f"  {name:36s} {ms:9.3f} ms  {ms / floor:7.2f}x floor")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
