"""Dashboards without a browser: discovery, the CLI, parameters kept in step with notebook 02, the results
browser on a small store, the local server's start/stop by pid. (In a browser: tests/test_browser.py.)"""

import io
import json
import os
import sys

import matplotlib
import pandas as pd
import pytest

matplotlib.use("Agg")

from fda_core.workbook.cli import main  # noqa: E402
from fda_core.common.ports import free_port  # noqa: E402
from fda_core.workbook.dashboards import LocalServer, list_dashboards, resolve_dashboard  # noqa: E402
from fda_core.workbook.discovery import NotebookError, resolve_notebook  # noqa: E402
from fda_core.workbook.parameters import default_values  # noqa: E402


def test_the_four_dashboards_exist_and_declare_parameters():
    assert set(list_dashboards()) == {"theory", "phase_diagram", "estimators", "results"}
    with pytest.raises(NotebookError, match="available: estimators, phase_diagram, results, theory"):
        resolve_dashboard("nope")


def test_phase_diagram_dashboard_uses_notebook_02_defaults():
    """Same names, same defaults: the dashboard finds the trials notebook 02 stored (no retraining)."""
    dash = default_values(resolve_dashboard("phase_diagram"))
    nb02 = default_values(resolve_notebook("02"))
    shared = set(dash) & set(nb02)
    assert len(shared) >= 15
    assert {k: dash[k] for k in shared} == {k: nb02[k] for k in shared}


def test_cli_lists_and_refuses_bad_input():
    out, err = io.StringIO(), io.StringIO()
    sys_out, sys_err = sys.stdout, sys.stderr
    try:
        sys.stdout, sys.stderr = out, err
        assert main(["dashboard"]) == 0
        assert main(["dashboard", "nope"]) == 2
        assert main(["dashboard", "theory", "-p", "beta", "1.5"]) == 2
    finally:
        sys.stdout, sys.stderr = sys_out, sys_err
    assert "theory" in out.getvalue() and "phase_diagram" in out.getvalue()
    assert "no dashboard 'nope'" in err.getvalue()
    assert "beta" in err.getvalue() and "[0, 1]" in err.getvalue()


def _store(tmp_path, experiment, rows, revision):
    folder = tmp_path / experiment
    folder.mkdir(parents=True, exist_ok=True)
    for i, (config, method, accs) in enumerate(rows):
        history = [{"round": r + 1, "target_acc": a} for r, a in enumerate(accs)]
        (folder / f"{revision}{i}.json").write_text(json.dumps(
            {"config": config, "revision": revision, "result": {"method": method, "history": history}}))
        os.utime(folder / f"{revision}{i}.json", ns=(10**18 if revision == "new" else 10**17,) * 2)


def test_results_browser_reads_the_newest_code_runs(tmp_path):
    from fda_core.viz.results_browser import load_federated_runs, results_explorer

    _store(tmp_path / "results", "04_X", [({"target": "a", "seed": 0, "rule": "fedda"}, "FedDA", [0.5, 0.6]),
                                          ({"target": "a", "seed": 1, "rule": "fedda"}, "FedDA", [0.5, 0.8]),
                                          ({"target": "b", "seed": 0, "rule": "fedda"}, "FedDA", [0.1, 0.2])], "new")
    _store(tmp_path / "results", "04_X", [({"target": "c", "seed": 0, "rule": "fedda"}, "FedDA", [0.9])], "old")
    runs = load_federated_runs(tmp_path / "results")
    assert sorted(runs.setting.unique()) == ["target=a", "target=b"]  # the older revision's run is hidden
    assert runs.target_acc.max() == pytest.approx(80.0)
    figures = tmp_path / "figures" / "05_y"
    figures.mkdir(parents=True)
    pd.DataFrame({"method": ["FedDA"], "acc": [1.0]}).to_csv(figures / "t.csv", index=False)
    (figures / "t.csv").write_text("# a note\n" + (figures / "t.csv").read_text())
    panel = results_explorer(tmp_path / "results", tmp_path / "figures")
    assert "70" in panel.readout.value and "a note" in panel.readout.value  # final mean of (60, 80)
    before = panel.images["accuracy per round"].value
    panel.controls["setting"].value = "target=b"
    assert panel.images["accuracy per round"].value != before and "target=b" in panel.readout.value
    empty = results_explorer(tmp_path / "none", tmp_path / "none")
    assert "make figures" in empty.readout.value


@pytest.mark.timeout(60)
def test_local_server_starts_answers_and_stops_by_pid(tmp_path):
    port = free_port()
    server = LocalServer([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                         f"http://127.0.0.1:{port}/", tmp_path / "log", cwd=tmp_path, probe=f"http://127.0.0.1:{port}/")
    with server:
        assert server.process.poll() is None
    assert server.process.poll() is not None
    bad = LocalServer([sys.executable, "-c", "raise SystemExit(3)"], f"http://127.0.0.1:{free_port()}/", tmp_path / "bad")
    with pytest.raises(RuntimeError, match="exited with 3"):
        bad.start(timeout=20)


def test_dashboard_benchmark_in_process_smoke(capsys):
    """benchmarks/dashboards.py --no-browser times in-place redraws against re-created figures (no timing asserted)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "benchmarks" / "dashboards.py"
    spec = importlib.util.spec_from_file_location("bench_dashboards", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main(["--no-browser", "--moves", "2"]) == 0
    assert "ratio" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        mod.main(["--moves", "0"])
