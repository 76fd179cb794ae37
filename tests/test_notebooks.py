"""Every numbered notebook executes with papermill (small parameters) and writes its figures."""

from pathlib import Path

import papermill as pm
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# Per-notebook overrides that keep the test quick; everything else runs with its defaults.
QUICK = {
    "01_delta_errors": {"grid_points": 41, "mc_draws": 500},
}


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(nb, tmp_path):
    params = {"figures_dir": str(tmp_path / "figures"), **QUICK.get(nb.stem, {})}
    pm.execute_notebook(str(nb), str(tmp_path / nb.name), parameters=params, cwd=str(ROOT),
                        kernel_name="python3", progress_bar=False)
    written = list((tmp_path / "figures").glob("*.png"))
    assert written, "the notebook saved no figure"
    for png in written:
        assert png.with_suffix(".pdf").exists() and png.with_suffix(".csv").exists()
