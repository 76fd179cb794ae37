"""``fda timings`` (fda_core.workbook.timings): papermill's cell durations summed by section, the report and its
wall-clock bound, the CSV, the errors, and one real execution through ``fda run`` (the metadata it reads)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

import nbformat
import pytest

from fda_core.workbook.cli import main
from fda_core.workbook.schedule import declared_minutes
from fda_core.workbook.timings import (OVERHEAD, SETUP, NotebookTimings, Section, format_report, read_timings,
                                      section_timings)

ROOT = Path(__file__).resolve().parent.parent


def _executed(total: float | None, *cells: tuple[str, object]) -> dict:
    """An executed notebook as papermill writes it: ("md", text) cells and ("code", duration) cells."""
    nb = nbformat.v4.new_notebook()
    if total is not None:
        nb.metadata["papermill"] = {"duration": total}
    for kind, value in cells:
        if kind == "md":
            nb.cells.append(nbformat.v4.new_markdown_cell(value))
        else:
            cell = nbformat.v4.new_code_cell("pass")
            cell.metadata["papermill"] = {} if value is None else {"duration": value}
            nb.cells.append(cell)
    return json.loads(nbformat.writes(nb))


NOTEBOOK = _executed(
    12.0,
    ("md", "# Title\nintro"), ("code", 1.0),
    ("md", "text\n## A first section\nmore"), ("code", 2.0), ("code", 3.0),
    ("md", "### A part of it"), ("code", 4.0),
    ("md", "no heading here, # not one either\n```bash\n## a shell comment, not a heading\n```"), ("code", 0.25),
    ("md", "## A first section"), ("code", 0.5),  # the same heading again: its own section
)


def test_sections_at_level_two_and_three() -> None:
    t = section_timings(NOTEBOOK, "05_x")
    assert [(s.title, s.seconds, s.cells) for s in t.sections] == [
        (SETUP, 1.0, 1), ("A first section", 9.25, 4), ("A first section (2)", 0.5, 1), (OVERHEAD, 1.25, 0)]
    assert t.seconds == 12.0 and t.complete and t.hint_minutes is None
    assert sum(s.seconds for s in t.sections) == pytest.approx(t.seconds)
    finer = section_timings(NOTEBOOK, "05_x", level=3)
    assert [(s.title, s.seconds) for s in finer.sections] == [
        (SETUP, 1.0), ("A first section", 5.0), ("A part of it", 4.25), ("A first section (2)", 0.5), (OVERHEAD, 1.25)]


def test_incomplete_run_missing_metadata_and_bad_level() -> None:
    stopped = section_timings(_executed(5.0, ("code", 1.0), ("md", "## B"), ("code", None)), "02_y")
    assert not stopped.complete and [s.seconds for s in stopped.sections] == [1.0, 0.0, 4.0]
    with pytest.raises(ValueError, match="03_z: no papermill duration"):
        section_timings(_executed(None, ("code", 1.0)), "03_z")
    for level in (1, 7, True, 2.0):
        with pytest.raises(ValueError, match="level must be an integer in \\[2, 6\\]"):
            section_timings(NOTEBOOK, "05_x", level=level)


def _nb(name: str, seconds: float, hint: float | None = None) -> NotebookTimings:
    return NotebookTimings(name, seconds, (Section(SETUP, seconds, 1),), hint, True)


def test_report_bound_budget_and_hints() -> None:
    timings = [_nb("01_a", 100.0, 2.0), _nb("02_b", 40.0), _nb("03_c", 30.0)]
    text = format_report(timings, jobs=2, budget_minutes=1.0)
    assert "All 3 notebooks: 170 s (2.8 min) of kernel time." in text
    # the longest notebook (100 s) bounds two side by side, not 170 / 2
    assert "With 2 side by side the wall clock is at least 100 s (1.7 min)" in text
    assert "Budget 1 min: over the budget by at least 40 s (0.7 min)." in text
    assert "01_a: 100 s (1.7 min); hint 2 min, measured / hint 0.83" in text
    assert text.index("01_a") < text.index("02_b") < text.index("03_c")  # largest first
    balanced = format_report([_nb("01_a", 60.0), _nb("02_b", 60.0), _nb("03_c", 60.0)], jobs=2, budget_minutes=2.0)
    assert "at least 90 s (1.5 min)" in balanced and "within the budget, 30 s (0.5 min) to spare" in balanced
    assert "side by side" not in format_report(timings, jobs=1)
    with pytest.raises(ValueError, match="jobs must be an integer >= 1"):
        format_report(timings, jobs=0)
    with pytest.raises(ValueError, match="budget must be a number of minutes > 0"):
        format_report(timings, budget_minutes=0.0)


def test_cli_reads_a_folder_writes_csv_and_takes_hints_from_the_notebooks(tmp_path: Path) -> None:
    executed = tmp_path / "executed"
    executed.mkdir()
    (executed / "01_delta_errors.ipynb").write_text(json.dumps(NOTEBOOK), encoding="utf-8")
    (executed / "07_other.failed.ipynb").write_text("not read", encoding="utf-8")  # failed copies are left out
    out, target = io.StringIO(), tmp_path / "t" / "timings.csv"
    with contextlib.redirect_stdout(out):
        assert main(["timings", "--executed", str(executed), "--csv", str(target), "--budget", "30"]) == 0
    hint = declared_minutes(ROOT / "notebooks" / "01_delta_errors.ipynb")
    assert f"hint {hint:g} min, measured / hint {12.0 / 60 / hint:.2f}" in out.getvalue()
    assert "within the budget" in out.getvalue()
    rows = list(csv.DictReader(target.open(encoding="utf-8")))
    assert [r["section"] for r in rows] == [SETUP, "A first section", "A first section (2)", OVERHEAD]
    assert {r["notebook"] for r in rows} == {"01_delta_errors"} and rows[1]["seconds"] == "9.250"
    assert rows[0]["hint_minutes"] == f"{hint:g}" and rows[0]["notebook_seconds"] == "12.000"


def test_cli_errors_exit_two(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["timings", "--executed", str(tmp_path)]) == 2
    assert "no executed notebooks (NN_topic.ipynb) in" in capsys.readouterr().err
    (tmp_path / "01_a.ipynb").write_text(json.dumps(NOTEBOOK), encoding="utf-8")
    assert main(["timings", "--executed", str(tmp_path), "--level", "9"]) == 2
    assert "level must be an integer in [2, 6], got 9" in capsys.readouterr().err
    assert main(["timings", "--executed", str(tmp_path), "--jobs", "0"]) == 2
    assert "jobs must be an integer >= 1" in capsys.readouterr().err


@pytest.mark.timeout(180)
def test_timings_of_a_real_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """papermill writes the durations this module reads: a notebook whose second section sleeps 1 s."""
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["fda"] = {"minutes": 0.5}
    params = nbformat.v4.new_code_cell("x: int = 1  # a knob")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# Tiny"), params, nbformat.v4.new_markdown_cell("## Quick"),
                nbformat.v4.new_code_cell("y = x + 1"), nbformat.v4.new_markdown_cell("## Slow"),
                nbformat.v4.new_code_cell("import time\ntime.sleep(1.0)")]
    nbformat.write(nb, notebooks / "01_tiny.ipynb")
    monkeypatch.setenv("FDA_NOTEBOOKS", str(notebooks))
    executed = tmp_path / "executed"
    assert main(["run", "01", "--out", str(executed), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["timings", "--executed", str(executed)]) == 0
    report = capsys.readouterr().out
    (t,) = read_timings(executed)
    sections = {s.title: s for s in t.sections}
    assert set(sections) == {SETUP, "Quick", "Slow", OVERHEAD} and t.complete and t.hint_minutes == 0.5
    assert 1.0 <= sections["Slow"].seconds < t.seconds and sections["Quick"].seconds < 1.0
    assert sections[SETUP].cells == 1  # the parameters cell (no -p: papermill injects none)
    assert report.index("Slow") < report.index("Quick")
