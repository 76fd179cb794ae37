"""Benchmark: notebooks one at a time vs two side by side (``fda run --jobs``), the main job's schedule.

What is measured
----------------
The same notebooks (default: 01 and 03, the two shortest with no result store) executed with their default
parameters, in one process, twice:

(i)  baseline, one at a time: ``fda run NB... --jobs 1`` (each kernel with torch's default threads, all cores);
(ii) side by side: ``fda run NB... --jobs K`` (K kernels at once, ``cpu_count // K`` threads each).

Reported: the wall time of each, the per-notebook times, the ratio (i) / (ii) of the wall times (for a small set
it is bounded by its longest notebook, which runs slower on fewer threads), and the throughput gain over a long
run of many notebooks: K divided by the mean slowdown of a notebook run beside others. The executed copies and outputs go to a temporary folder (quick
outputs are not written into figures/: ``figures_dir`` is redirected). Nothing is asserted; times depend on the
machine and its load, read the ratio.

Usage::

    python benchmarks/main_job.py [--notebooks 01 03] [--jobs 2]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import sys
import tempfile
import time
from pathlib import Path


def _run(notebooks: list[str], jobs: int, work: Path) -> tuple[float, dict[str, float]]:
    from fda_core.workbook.cli import main

    out = io.StringIO()
    args = ["run", *notebooks, "--jobs", str(jobs), "--out", str(work / f"executed-{jobs}"), "--no-progress",
            "-p", "figures_dir", str(work / f"figures-{jobs}")]
    started = time.perf_counter()
    with contextlib.redirect_stdout(out):
        code = main(args)
    wall = time.perf_counter() - started
    if code != 0:
        raise SystemExit(f"fda {' '.join(args)} failed (exit {code})")
    each = {m.group(1): float(m.group(2)) for m in re.finditer(r"^ok (\S+) \(([\d.]+) s\)", out.getvalue(), re.M)}
    return wall, each


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--notebooks", nargs="+", default=["01", "03"], help="notebooks to run (default: 01 03)")
    parser.add_argument("--jobs", type=int, default=2, help="notebooks side by side in (ii) (default 2)")
    args = parser.parse_args(argv)
    if args.jobs < 2:
        parser.error(f"--jobs must be >= 2 (the comparison is against one at a time), got {args.jobs}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        one_wall, one_each = _run(args.notebooks, 1, work)
        side_wall, side_each = _run(args.notebooks, args.jobs, work)
    print(f"(i)  one at a time:        {one_wall:7.1f} s  " + ", ".join(f"{k} {v:.1f} s" for k, v in one_each.items()))
    print(f"(ii) {args.jobs} side by side:       {side_wall:7.1f} s  "
          + ", ".join(f"{k} {v:.1f} s" for k, v in side_each.items()))
    print(f"ratio (i)/(ii): {one_wall / side_wall:.2f}x (wall clock; bounded by the longest notebook of the set)")
    slow = {k: side_each[k] / one_each[k] for k in one_each if k in side_each and one_each[k] > 0}
    if slow:
        mean = sum(slow.values()) / len(slow)
        print("per notebook, side by side vs alone: " + ", ".join(f"{k} {v:.2f}x slower" for k, v in slow.items())
              + f"; throughput of {args.jobs} side by side over a long run of many notebooks ≈ {args.jobs} / "
              f"{mean:.2f} = {args.jobs / mean:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
