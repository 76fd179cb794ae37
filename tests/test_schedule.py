"""``fda run --jobs K``: notebooks side by side, each after those its metadata ``fda.after`` names
(fda_core.workbook.schedule). Concurrency is shown with events, not timings."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import nbformat
import pytest

from fda_core.workbook.cli import main
from fda_core.workbook.schedule import (declared_after, declared_minutes, kernel_threads_env, run_scheduled,
                                        start_order)


def _nb(path: Path, after: list[str] | None = None, body: str = "pass", minutes: float | None = None) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    if after is not None:
        nb.metadata["fda"] = {"after": after}
    if minutes is not None:
        nb.metadata.setdefault("fda", {})["minutes"] = minutes
    cell = nbformat.v4.new_code_cell("out_file: str = ''  # where to write")
    cell.metadata["tags"] = ["parameters"]
    nb.cells = [cell, nbformat.v4.new_code_cell(body)]
    nbformat.write(nb, path)
    return path


def test_declared_after_reads_the_metadata(tmp_path):
    assert declared_after(_nb(tmp_path / "01_a.ipynb")) == []
    assert declared_after(_nb(tmp_path / "02_b.ipynb", ["01"])) == ["01"]
    with pytest.raises(ValueError, match="fda.after"):
        declared_after(_nb(tmp_path / "03_c.ipynb", "01"))  # a string, not a list
    repo = Path(__file__).resolve().parents[1] / "notebooks"
    assert declared_after(repo / "08_domain_generalisation.ipynb") == ["06"]  # 08 reads 06's translators


def test_two_jobs_run_side_by_side_and_respect_after(tmp_path):
    paths = [_nb(tmp_path / "01_a.ipynb"), _nb(tmp_path / "02_b.ipynb"), _nb(tmp_path / "03_c.ipynb", ["01_a"]),
             _nb(tmp_path / "04_d.ipynb")]
    started = {i: threading.Event() for i in range(4)}
    finished: list[int] = []
    seen_running_with: dict[int, bool] = {}

    def run_one(i: int) -> int:
        started[i].set()
        if i == 0:  # 01 finishes only once 02 has started: impossible one at a time
            seen_running_with[0] = started[1].wait(timeout=30)
        if i == 2:
            assert 0 in finished  # 03 starts after 01 finished
        if i == 1:  # 02 stays running until 03 has started: 03 must have taken 01's place, not 04 first
            seen_running_with[1] = started[2].wait(timeout=30)
        return i

    results = run_scheduled(paths, run_one, jobs=2, on_result=lambda i, r: finished.append(i))
    assert results == {0: 0, 1: 1, 2: 2, 3: 3}
    assert seen_running_with == {0: True, 1: True}
    assert finished.index(0) < finished.index(2)


def test_the_longest_chain_of_work_starts_first(tmp_path):
    """01 (1 min) feeds 04 (5 min): chain 6 > 03's 5 > 02's 2; 05 has no hint (1 min)."""
    paths = [_nb(tmp_path / "01_a.ipynb", minutes=1), _nb(tmp_path / "02_b.ipynb", minutes=2),
             _nb(tmp_path / "03_c.ipynb", minutes=5), _nb(tmp_path / "04_d.ipynb", ["01"], minutes=5),
             _nb(tmp_path / "05_e.ipynb")]
    assert declared_minutes(paths[4]) == 1.0
    assert start_order(paths) == [0, 2, 3, 1, 4]
    started: list[int] = []
    run_scheduled(paths, started.append, jobs=2)
    assert set(started[:2]) == {0, 2} and started.index(0) < started.index(3)
    started.clear()
    run_scheduled(paths, started.append, jobs=1)
    assert started == [0, 1, 2, 3, 4]  # one at a time: the given order
    with pytest.raises(ValueError, match="fda.minutes"):
        declared_minutes(_nb(tmp_path / "06_f.ipynb", minutes=0))
    repo = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert all(declared_minutes(p) > 0 for p in repo)
    # the chain 06 then 08 (9.6 + 2.9 min) first, then 02 (5.1) and 05 (4.7), since five checks left the main job and
    # runs share their FedAvg rounds (docs/performance.md § Main job)
    assert [repo[i].stem[:2] for i in start_order(repo)[:3]] == ["06", "02", "05"]


def test_a_failure_stops_new_starts_unless_keep_going(tmp_path):
    paths = [_nb(tmp_path / f"0{i}_x.ipynb") for i in range(1, 5)]
    ran: list[int] = []

    def run_one(i: int) -> bool:
        ran.append(i)
        return i != 0

    assert sorted(run_scheduled(paths, run_one, jobs=1, ok=bool)) == [0]
    ran.clear()
    assert sorted(run_scheduled(paths, run_one, jobs=1, ok=bool, keep_going=True)) == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="jobs must be >= 1"):
        run_scheduled(paths, run_one, jobs=0)


def test_threads_per_kernel():
    assert kernel_threads_env(1, {}) == {}
    env = kernel_threads_env(2, {})
    assert int(env["OMP_NUM_THREADS"]) >= 1 and env["MKL_NUM_THREADS"] == env["OMP_NUM_THREADS"]
    assert kernel_threads_env(2, {"OMP_NUM_THREADS": "4"}) == {}  # the caller's setting wins
    with pytest.raises(ValueError, match="jobs"):
        kernel_threads_env(0, {})


@pytest.mark.timeout(300)
def test_fda_run_jobs_2(tmp_path, monkeypatch, capsys):
    d = tmp_path / "notebooks"
    d.mkdir()
    body = "import json, os\nif out_file:\n    json.dump(os.environ.get('OMP_NUM_THREADS'), open(out_file, 'w'))"
    _nb(d / "01_a.ipynb", body=body)
    _nb(d / "02_b.ipynb", ["01"], body=body)
    monkeypatch.setenv("FDA_NOTEBOOKS", str(d))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert main(["run", "all", "--jobs", "0", "--no-progress"]) == 2
    assert "--jobs must be at least 1" in capsys.readouterr().err
    out = tmp_path / "executed"
    code = main(["run", "all", "--jobs", "2", "--out", str(out), "--no-progress", "--cwd", str(tmp_path),
                 "-p", "out_file", str(tmp_path / "threads.json")])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "ok 01_a" in captured.out and "ok 02_b" in captured.out
    assert "2 notebooks at a time" in captured.err
    assert json.loads((tmp_path / "threads.json").read_text()) == kernel_threads_env(2, {})["OMP_NUM_THREADS"]
    assert (out / "01_a.ipynb").exists() and (out / "02_b.ipynb").exists()


@pytest.mark.timeout(300)
def test_main_job_benchmark_smoke(tmp_path, monkeypatch, capsys):
    import importlib.util

    d = tmp_path / "notebooks"
    d.mkdir()
    for name in ("01_a", "02_b"):
        nb = nbformat.v4.new_notebook()
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
        cell = nbformat.v4.new_code_cell("figures_dir: str = 'figures/x'  # output folder")
        cell.metadata["tags"] = ["parameters"]
        nb.cells = [cell, nbformat.v4.new_code_cell("sum(i * i for i in range(10**5))")]
        nbformat.write(nb, d / f"{name}.ipynb")
    monkeypatch.setenv("FDA_NOTEBOOKS", str(d))
    path = Path(__file__).resolve().parents[1] / "benchmarks" / "main_job.py"
    spec = importlib.util.spec_from_file_location("main_job_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.main(["--notebooks", "01", "02"]) == 0
    out = capsys.readouterr().out
    assert "one at a time" in out and "01_a" in out and "02_b" in out and "ratio (i)/(ii):" in out
