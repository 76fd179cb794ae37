"""Runs you can trust: a failed run never touches the real outputs (staging), quick runs never overwrite
the committed figures (fda_core.common.files.output_dir)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import nbformat
import pytest

from fda_core.common import files
from fda_core.workbook import staging
from fda_core.workbook.cli import main

KERNELSPEC = {"name": "python3", "display_name": "Python 3", "language": "python"}

PARAMS = """\
fail: bool = False  # raise in the last cell
quick: bool = False  # small sizes
figures_dir: str = "figures/zz_staging_test"  # output folder"""

WRITE_VIA_OUTPUT_DIR = """\
from fda_core.common.files import output_dir
out_dir = output_dir(figures_dir, quick)
out_dir.mkdir(parents=True, exist_ok=True)
(out_dir / "a.csv").write_text("new a")
(out_dir / "sub").mkdir(exist_ok=True)
(out_dir / "sub" / "b.csv").write_text("new b")"""

WRITE_DIRECTLY = """\
import os
os.makedirs(figures_dir, exist_ok=True)
with open(os.path.join(figures_dir, "a.csv"), "w") as fh:
    fh.write("new a")"""

LAST = """\
if fail:
    raise ValueError("late failure")"""


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = KERNELSPEC
    params = nbformat.v4.new_code_cell(PARAMS)
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, *(nbformat.v4.new_code_cell(c) for c in cells)]
    nbformat.write(nb, path)
    return path


@pytest.fixture
def dest(tmp_path: Path) -> Path:
    """A figures folder holding good results: a.csv (to be replaced) and keep.csv (not produced by the run)."""
    d = tmp_path / "figures" / "good"
    d.mkdir(parents=True)
    (d / "a.csv").write_text("good a")
    (d / "keep.csv").write_text("good keep")
    return d


def _snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): p.read_text() for p in sorted(folder.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------------------------------------
# the quick-output helper


def test_output_destination_quick_redirect(tmp_path: Path) -> None:
    root = tmp_path
    assert files.output_destination("figures/01_x", root=root) == root / "figures" / "01_x"
    assert files.output_destination("figures/01_x", True, root=root) == root / "executed" / "quick" / "01_x"
    assert files.output_destination(root / "figures" / "a" / "b", True, root=root) == root / "executed" / "quick" / "a" / "b"
    assert files.output_destination("elsewhere/x", True, root=root) == root / "elsewhere" / "x"
    assert files.output_destination(tmp_path / "abs", True, root=root) == tmp_path / "abs"
    assert files.output_destination("figures-old/x", True, root=root) == root / "figures-old" / "x"


def test_output_dir_prints_where_it_writes(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(files.STAGING_ENV, raising=False)
    root = files.project_root()
    assert files.output_dir("figures/01_delta_errors") == root / "figures" / "01_delta_errors"
    assert capsys.readouterr().out == ""
    assert files.output_dir("figures/01_delta_errors", True) == root / "executed" / "quick" / "01_delta_errors"
    out = capsys.readouterr().out
    assert "quick run" in out and str(root / "executed" / "quick" / "01_delta_errors") in out
    # under fda run: the staging folder named in the kernel's environment
    monkeypatch.setenv(files.STAGING_ENV, json.dumps({str((root / "figures" / "x").resolve()): "/tmp/stage"}))
    assert files.output_dir("figures/x") == Path("/tmp/stage")
    assert "staging folder /tmp/stage" in capsys.readouterr().out
    assert files.output_dir("figures/y") == root / "figures" / "y"


def test_plan_staging(tmp_path: Path) -> None:
    nb = _notebook(tmp_path / "01_a.ipynb", WRITE_VIA_OUTPUT_DIR)
    root = files.project_root()
    plan = staging.plan_staging(nb, {}, root)
    assert plan == staging.StagingPlan("figures/zz_staging_test", root / "figures" / "zz_staging_test", via_env=True)
    plan = staging.plan_staging(nb, {"quick": True}, root)
    assert plan.destination == root / "executed" / "quick" / "zz_staging_test"
    plan = staging.plan_staging(nb, {"figures_dir": str(tmp_path / "f"), "quick": True}, root)
    assert plan.destination == tmp_path / "f"
    assert staging.plan_staging(_notebook(tmp_path / "02_b.ipynb", WRITE_DIRECTLY), {}, root).via_env is False
    assert staging.plan_staging(nb, {"figures_dir": ""}, root) is None
    plain = nbformat.v4.new_notebook()
    plain.cells = [nbformat.v4.new_code_cell("n: int = 1  # n")]
    plain.cells[0].metadata["tags"] = ["parameters"]
    nbformat.write(plain, tmp_path / "03_c.ipynb")
    assert staging.plan_staging(tmp_path / "03_c.ipynb", {}, root) is None


# ------------------------------------------------------------------------------------------------
# staged runs


@pytest.mark.timeout(180)
def test_failed_run_leaves_outputs_untouched(tmp_path: Path, dest: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nb = _notebook(tmp_path / "01_stage.ipynb", WRITE_VIA_OUTPUT_DIR, LAST)
    out_dir = tmp_path / "executed"
    before = _snapshot(dest)
    code = main(["run", str(nb), "-p", "fail", "true", "-p", "figures_dir", str(dest), "--out", str(out_dir),
                 "--no-progress"])
    assert code == 1
    err = capsys.readouterr().err
    assert "ValueError: late failure" in err
    kept = out_dir / "01_stage.failed_outputs"
    assert f"partial outputs kept in {kept}; {dest} was not changed" in err
    assert _snapshot(dest) == before  # nothing under the destination changed
    assert _snapshot(kept) == {"a.csv": "new a", "sub/b.csv": "new b"}
    assert (out_dir / "01_stage.failed.ipynb").exists()
    assert sorted(p.name for p in out_dir.iterdir()) == ["01_stage.failed.ipynb", "01_stage.failed_outputs"]

    # the same run, succeeding: staged files replace theirs, other files stay, the failure leftovers go
    code = main(["run", str(nb), "-p", "figures_dir", str(dest), "--out", str(out_dir), "--no-progress"])
    assert code == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert f"2 output file(s) -> {dest}" in out
    assert _snapshot(dest) == {"a.csv": "new a", "keep.csv": "good keep", "sub/b.csv": "new b"}
    assert sorted(p.name for p in out_dir.iterdir()) == ["01_stage.ipynb"]  # no staging folder left
    executed = nbformat.read(out_dir / "01_stage.ipynb", as_version=4)
    assert executed.metadata["papermill"]["parameters"] == {"figures_dir": str(dest)}  # the user-facing value
    printed = "".join(o.get("text", "") for o in executed.cells[2].outputs)
    assert "staging folder" in printed and str(dest) in printed


@pytest.mark.timeout(180)
def test_notebook_without_output_dir_is_staged_through_its_parameter(tmp_path: Path, dest: Path) -> None:
    from fda_core.workbook.runner import execute

    nb = _notebook(tmp_path / "02_direct.ipynb", WRITE_DIRECTLY, LAST)
    before = _snapshot(dest)
    res = execute(nb, tmp_path / "x" / "02_direct.ipynb", {"figures_dir": str(dest), "fail": True}, progress_bar=False)
    assert not res.ok and res.figures_dir == dest
    assert _snapshot(dest) == before
    assert res.failed_outputs == tmp_path / "x" / "02_direct.failed_outputs"
    assert (res.failed_outputs / "a.csv").read_text() == "new a"

    res = execute(nb, tmp_path / "x" / "02_direct.ipynb", {"figures_dir": str(dest)}, progress_bar=False)
    assert res.ok and res.installed == [dest / "a.csv"]
    assert _snapshot(dest) == {"a.csv": "new a", "keep.csv": "good keep"}
    assert not res.failed_outputs and not (tmp_path / "x" / "02_direct.failed_outputs").exists()
    assert sorted(os.listdir(tmp_path / "x")) == ["02_direct.ipynb"]


def test_install_replaces_file_by_file(tmp_path: Path) -> None:
    plan = staging.StagingPlan("d", tmp_path / "d", via_env=True)
    st = staging.Staging.create(plan, tmp_path / "out", "nb")
    (st.folder / "x" / "y").mkdir(parents=True)
    (st.folder / "x" / "y" / "f.txt").write_text("1")
    (st.folder / "g.txt").write_text("2")
    env = json.loads(st.kernel_env()[files.STAGING_ENV])
    assert env == {str((tmp_path / "d").resolve()): str(st.folder)}
    assert st.parameters({"a": 1}) == {"a": 1}
    assert st.install() == [tmp_path / "d" / "g.txt", tmp_path / "d" / "x" / "y" / "f.txt"]
    assert not st.folder.exists() and (tmp_path / "d" / "x" / "y" / "f.txt").read_text() == "1"
    empty = staging.Staging.create(staging.StagingPlan("d", tmp_path / "d", via_env=False), tmp_path / "out", "nb")
    assert empty.parameters({"a": 1}) == {"a": 1, "figures_dir": str(empty.folder)} and empty.kernel_env() == {}
    assert empty.keep(tmp_path / "out" / "nb.failed_outputs") is None and not empty.folder.exists()


def test_project_root_is_found_from_outside_the_repository(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel started elsewhere (Voila's working folder, a user's notebook under /tmp) still resolves
    ``figures``/``results`` under the workbook: the fallback is the folder holding the installed fda_core/."""
    repo = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(tmp_path)
    assert files.project_root() == repo
    assert files.resolve_output("figures") == repo / "figures"
    (tmp_path / "fda_core").mkdir()
    (tmp_path / "notebooks").mkdir()
    assert files.project_root() == tmp_path  # a workbook found upwards from cwd comes first


@pytest.mark.timeout(180)
def test_committed_figures_record_the_float_kernels_that_made_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                   ) -> None:
    """A run whose outputs go to the workbook's figures/ folder stages the float-kernel fingerprint with them
    (float_kernels.txt, installed only with a successful run); a run writing elsewhere does not; a probe that
    fails records a value no machine gives, so the guard of the committed figures skips them."""
    from fda_core.workbook import float_kernels
    from fda_core.workbook.runner import execute

    project = tmp_path / "project"
    for sub in ("fda_core", "notebooks"):
        (project / sub).mkdir(parents=True)
    nb = _notebook(project / "notebooks" / "03_direct.ipynb", WRITE_DIRECTLY, LAST)
    monkeypatch.setattr(float_kernels, "fingerprint", lambda: "0.125")
    figures = project / "figures" / "03"
    res = execute(nb, tmp_path / "x" / "03.ipynb", {"figures_dir": str(figures), "fail": True}, cwd=project,
                  progress_bar=False)
    assert not res.ok and not figures.exists()  # nothing installed, the fingerprint neither
    res = execute(nb, tmp_path / "x" / "03.ipynb", {"figures_dir": str(figures)}, cwd=project, progress_bar=False)
    assert res.ok and _snapshot(figures) == {"a.csv": "new a", "float_kernels.txt": "0.125\n"}
    assert float_kernels.recorded(figures) == "0.125"
    assert float_kernels.recorded(tmp_path) == float_kernels.LEGACY_FINGERPRINT  # nothing recorded there
    elsewhere = tmp_path / "elsewhere"
    assert execute(nb, tmp_path / "x" / "03.ipynb", {"figures_dir": str(elsewhere)}, cwd=project,
                   progress_bar=False).ok
    assert _snapshot(elsewhere) == {"a.csv": "new a"}

    def failing() -> str:
        raise RuntimeError("no digits")

    monkeypatch.setattr(float_kernels, "fingerprint", failing)
    assert execute(nb, tmp_path / "x" / "03.ipynb", {"figures_dir": str(figures)}, cwd=project, progress_bar=False).ok
    assert float_kernels.recorded(figures).startswith("unknown (the probe failed: RuntimeError)")


def test_the_float_kernel_probe_is_notebook_01s_real_digit_variance() -> None:
    """The fingerprint is notebook 01's σ² of the real digits at the settings it fixes: those settings are notebook
    01's defaults (were they to move apart, the legacy fingerprint would no longer name the committed figures'
    kernels), and where the committed figures of notebook 01 are this machine's, the probe gives their σ²."""
    import pandas as pd
    import papermill as pm

    from fda_core.workbook import float_kernels

    root = Path(__file__).resolve().parent.parent
    declared = pm.inspect_notebook(str(root / "notebooks" / "01_delta_errors.ipynb"))
    assert {k: type(v)(declared[k]["default"]) for k, v in float_kernels.PROBE_SETTINGS.items()} == \
        float_kernels.PROBE_SETTINGS
    committed = pd.read_csv(root / "figures" / "01_delta_errors" / "monte_carlo_real_mnist.csv", comment="#")
    sigma2 = repr(float(committed.loc[committed["rule"] == "target_only", "sigma2"].iloc[0]))
    assert float_kernels.recorded(root / "figures" / "01_delta_errors") == sigma2
