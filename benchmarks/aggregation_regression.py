"""The aggregation rules of this checkout against those of an earlier git revision, in one process.

Why
---
The GPU work of issue 17 must not make the CPU path slower. Timing two checkouts in two processes on a
shared VM compares two states of the machine (its memory bandwidth moves by ±30 % between runs, see the README's
Performance section); here both versions of ``fda_core/core/aggregation.py`` are loaded side by side (the older
one from ``git show REV:fda_core/core/aggregation.py``, as a module of its own) and called in turns on the same
ResNet-18-shaped updates, so the ratio new/old is taken under the same conditions.

What is measured
----------------
For N in ``--sources`` (default 4 and 10), FedGP (exact, β = 0.5) and its cosine variant, each in the forms the
library is used on a CPU: dicts of views into one (N, m) buffer with a dict ``out`` of views (the engine before the
``segments`` form), separate tensors with a dict ``out`` (a state dict), and the flat (N, m) form with ``out``.
The current checkout also runs the engine's present form, ``segments=``, timed against the old version's views
form (the same numbers, bit for bit: the script checks). Medians of ``--repeats`` interleaved calls
(:func:`aggregation.time_round_robin`); printed: milliseconds and the ratio new/old per form. Nothing is asserted
about the times.

Usage::

    python benchmarks/aggregation_regression.py [--against 71707a4] [--sources 4 10] [--repeats 10] [--quick]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import aggregation as bench  # noqa: E402  (benchmarks/aggregation.py: shapes, updates, round-robin timing)

from fda_core.core import aggregation as current  # noqa: E402

#: the revision before issue 17's GPU paths (the per-tensor loop as the CPU default had it)
DEFAULT_AGAINST = "71707a4"


def load_revision(rev: str) -> ModuleType:
    """``fda_core/core/aggregation.py`` at git revision ``rev`` as a module inside the ``fda_core.core`` package (so
    its relative imports resolve to this checkout's modules). ValueError names ``rev`` when git cannot show it."""
    try:
        source = subprocess.run(["git", "show", f"{rev}:fda_core/core/aggregation.py"], cwd=ROOT, check=True,
                                capture_output=True, text=True).stdout
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        raise ValueError(f"--against {rev!r}: git cannot show fda_core/core/aggregation.py there ({exc})") from None
    with tempfile.TemporaryDirectory(prefix="fda_agg_") as folder:
        path = Path(folder) / "aggregation_at_revision.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location("fda_core.core._aggregation_at_revision", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
    return module


def measure(old: ModuleType, n: int, repeats: int, seed: int = 0, shapes=None) -> dict[str, float]:
    """Median seconds per call of every (version, form) on CPU for N = ``n`` (``shapes``: ResNet-18's by default,
    or a list of shapes for a smoke test)."""
    dev = torch.device("cpu")
    named = bench._as_named(shapes)
    lengths = [int(torch.Size(s).numel()) for _, s in named]
    S, t, src_dicts, tgt_dict = bench.make_updates(named, n, dev, seed)
    views, view_t = bench._views(named, S), bench._views(named, t.unsqueeze(0))[0]
    out_flat = torch.empty_like(t)
    out_views = bench._views(named, out_flat.unsqueeze(0))[0]
    out_dict = {k: torch.empty_like(v) for k, v in tgt_dict.items()}
    beta = bench.BETA
    # the same numbers first: the engine's segments form equals the old views form bit for bit
    old.fedgp(views, view_t, beta, out=out_views)
    expected = out_flat.clone()
    current.fedgp(S, t, beta, out=out_flat, segments=lengths)
    if not torch.equal(out_flat, expected):
        raise AssertionError("fedgp(segments=...) differs from the old version's dict form on the same memory")
    fns = {}
    for tag, mod in (("old", old), ("new", current)):
        fns[f"{tag} views+out"] = lambda mod=mod: mod.fedgp(views, view_t, beta, out=out_views)
        fns[f"{tag} cosine views+out"] = lambda mod=mod: mod.fedgp_cosine(views, view_t, beta, out=out_views)
        fns[f"{tag} per-tensor+out"] = lambda mod=mod: mod.fedgp(src_dicts, tgt_dict, beta, out=out_dict)
        fns[f"{tag} flat+out"] = lambda mod=mod: mod.fedgp(S, t, beta, out=out_flat)
    fns["new segments+out"] = lambda: current.fedgp(S, t, beta, out=out_flat, segments=lengths)
    fns["new cosine segments+out"] = lambda: current.fedgp_cosine(S, t, beta, out=out_flat, segments=lengths)
    dst = torch.empty_like(S)
    fns["copy floor"] = lambda: dst.copy_(S)
    times = bench.time_round_robin(fns, dev, repeats, 2 if repeats >= 5 else 1)
    return {k: statistics.median(v) for k, v in times.items()}


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--against", default=DEFAULT_AGAINST, help=f"git revision to compare with (default {DEFAULT_AGAINST})")
    p.add_argument("--sources", type=int, nargs="+", default=[4, 10], metavar="N")
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--quick", action="store_true", help="smoke test: N = 4, 3 repeats")
    args = p.parse_args(argv)
    if args.quick:
        args.sources, args.repeats = [4], 3
    if any(n < 1 for n in args.sources) or args.repeats < 1:
        raise SystemExit("--sources must be >= 1 and --repeats >= 1")
    old = load_revision(args.against)
    print(f"aggregation at {args.against} (old) vs this checkout (new), CPU, torch {torch.__version__}, "
          f"threads {torch.get_num_threads()}, ResNet-18 shapes, median of {args.repeats} interleaved calls")
    results = {}
    for n in args.sources:
        med = measure(old, n, args.repeats)
        results[n] = med
        print(f"N = {n} (copy floor {med['copy floor'] * 1e3:.2f} ms)")
        for form in ("views+out", "cosine views+out", "per-tensor+out", "flat+out"):
            o, w = med[f"old {form}"], med[f"new {form}"]
            print(f"  {form:<18} old {o * 1e3:8.2f} ms  new {w * 1e3:8.2f} ms  new/old {w / o:5.2f}")
        for form, base in (("segments+out", "views+out"), ("cosine segments+out", "cosine views+out")):
            w, o = med[f"new {form}"], med[f"old {base}"]
            print(f"  {form:<18} new {w * 1e3:8.2f} ms  vs old {base} {o * 1e3:8.2f} ms  ratio {w / o:5.2f}"
                  "  (the engine's form now and then)")
    return results


if __name__ == "__main__":
    main()
