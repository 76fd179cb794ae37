"""Benchmark: how fast the slider panels redraw, in process and in a real browser; screenshots for the README.

What is measured
----------------
(a) In process, the theory panel (notebooks 01/02, dashboard ``theory``): ``moves`` slider moves of β, each
    (i) redrawn in place (:func:`fda_core.viz.widgets.theory_explorer`: the figures are kept, artists updated,
    PNGs re-rendered) and (ii) the way the panels worked before (``ipywidgets.interactive`` re-creating the whole
    figure with :func:`fda_core.viz.plotting.theory_panels` and rendering it). Same values, same process;
    reported: seconds per move of each and their ratio (baseline / in place).
(b) In Chromium (Playwright, Debian's ``/usr/bin/chromium``), every Voila dashboard: every control moved once
    (:func:`fda_core.workbook.browser_checks.exercise_panels`); reported per control: seconds from the key press
    (or click) to the panel's new readout, which is written after the plots are re-rendered, i.e. the redraw
    as the user sees it, server round trip included. The phase-diagram dashboard reads notebook 02's runs
    from the result store when they are there (``--quick``: a small grid trained in seconds instead).
(c) With ``--screenshots DIR`` (default ``figures/dashboards``), one full-page screenshot per dashboard.

Times depend on the machine and its load (2 cores here): read the ratio in (a), and (b) as an order of
magnitude. Nothing is asserted.

Usage::

    python benchmarks/dashboards.py [--moves 20] [--quick] [--no-browser] [--screenshots DIR] [--only NAME ...]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")


def in_process(moves: int) -> None:
    import io

    import ipywidgets as w
    import matplotlib.pyplot as plt

    from fda_core.viz.plotting import theory_panels
    from fda_core.viz.widgets import theory_explorer

    betas = [round(0.05 * (i % 20), 2) for i in range(1, moves + 1)]
    panel = theory_explorer()
    started = time.perf_counter()
    for b in betas:
        panel.set(beta=b)
    in_place = (time.perf_counter() - started) / moves

    def redraw(beta: float) -> None:  # the panel before: a new figure per move, rendered (as the inline backend does)
        fig, _ = theory_panels(beta=beta, grid_points=81)
        fig.savefig(io.BytesIO(), format="png", dpi=72)
        plt.close(fig)

    interactive = w.interactive(redraw, beta=w.FloatSlider(value=0.5, min=0, max=1, step=0.05))
    started = time.perf_counter()
    for b in betas:
        interactive.children[0].value = b
    baseline = (time.perf_counter() - started) / moves
    print(f"(a) theory panel, {moves} moves of β: in place {in_place:.3f} s/move, re-created figure "
          f"{baseline:.3f} s/move, ratio {baseline / in_place:.2f}x")


def in_browser(names: list[str], quick: bool, screenshots: Path | None) -> None:
    from playwright.sync_api import sync_playwright

    from fda_core.common.files import resolve_output
    from fda_core.viz.results_browser import load_federated_runs
    from fda_core.workbook.browser_checks import ConsoleWatch, exercise_panels, fill_demo_store, launch_chromium
    from fda_core.workbook.dashboards import start_dashboard

    parameters = {"estimators": {"quick": True} if quick else {},
                  "phase_diagram": {"quick": True, "results_dir": ""} if quick else {}}
    with sync_playwright() as p:
        browser = launch_chromium(p)
        for name in names:
            with tempfile.TemporaryDirectory() as work:
                if name == "results" and (quick or load_federated_runs(resolve_output("results")).empty):
                    # a fresh clone has no stored runs (the notebooks make them): browse a small real store
                    print("(b) results: a small demo store (fill_demo_store), the repository's results/ is "
                          + ("not used in --quick" if quick else "empty"))
                    parameters["results"] = {"results_dir": str(fill_demo_store(Path(work) / "results"))}
                server = start_dashboard(name, parameters.get(name, {}), workdir=work, timeout=120)
                try:
                    page = browser.new_page(viewport={"width": 1500, "height": 1100})
                    watch = ConsoleWatch().attach(page)
                    started = time.perf_counter()
                    page.goto(server.url, timeout=900_000)
                    page.wait_for_selector(".fda-panel img", timeout=900_000)
                    page.wait_for_load_state("networkidle")
                    print(f"(b) dashboard {name}: first render after {time.perf_counter() - started:.1f} s")
                    if screenshots is not None:
                        screenshots.mkdir(parents=True, exist_ok=True)
                        page.screenshot(path=str(screenshots / f"{name}.png"), full_page=True)
                    moves = exercise_panels(page)
                    for m in moves:
                        print(f"    {m.control[:30]:30s} {m.before} -> {m.after}: {m.seconds:.2f} s"
                              + ("" if m.readout_changed else "  (readout unchanged!)"))
                    times = [m.seconds for m in moves if m.seconds == m.seconds]
                    if times:
                        print(f"    median {statistics.median(times):.2f} s, max {max(times):.2f} s over {len(times)} moves; "
                              f"JavaScript errors: {len(watch.errors)}")
                    page.close()
                finally:
                    server.stop()
        browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--moves", type=int, default=20, help="slider moves in process (default 20)")
    parser.add_argument("--quick", action="store_true", help="small dashboards (estimators: 300 draws; phase diagram: 4×4 grid)")
    parser.add_argument("--no-browser", action="store_true", help="only the in-process measurement")
    parser.add_argument("--screenshots", type=Path, default=Path(__file__).resolve().parents[1] / "figures" / "dashboards",
                        help="folder of the screenshots (default figures/dashboards)")
    parser.add_argument("--only", nargs="*", default=None, help="dashboards to open (default: all)")
    args = parser.parse_args(argv)
    if args.moves < 1:
        parser.error(f"--moves must be >= 1, got {args.moves}")
    in_process(args.moves)
    if not args.no_browser:
        from fda_core.workbook.dashboards import list_dashboards

        names = args.only or list(list_dashboards())
        in_browser(names, args.quick, args.screenshots)
    return 0


if __name__ == "__main__":
    sys.exit(main())
