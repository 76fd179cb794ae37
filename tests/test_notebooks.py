"""Every numbered notebook executes with papermill (quick parameters) and writes its figures; the saved
numbers are checked against the theory (not merely that the notebook ran)."""

from functools import lru_cache
from pathlib import Path
from statistics import NormalDist

import pandas as pd
import papermill as pm
import pytest

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# Per-notebook overrides that keep the test quick; everything else runs with its defaults.
QUICK = {
    "01_delta_errors": {"quick": True},
    "03_unbiased_estimators": {"quick": True},
}


@lru_cache(maxsize=None)
def executed(stem: str, out_root: str) -> Path:
    """Execute notebook ``stem`` once per test session; returns its figures folder."""
    nb = ROOT / "notebooks" / f"{stem}.ipynb"
    out = Path(out_root) / stem
    out.mkdir(parents=True, exist_ok=True)
    params = {"figures_dir": str(out / "figures"), **QUICK.get(stem, {})}
    pm.execute_notebook(str(nb), str(out / nb.name), parameters=params, cwd=str(ROOT), kernel_name="python3",
                        progress_bar=False)
    return out / "figures"


@pytest.fixture(scope="session")
def out_root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("notebooks"))


def _read(path: Path) -> pd.DataFrame:
    return pd.read_csv(path, comment="#")


def _bonferroni_z(k: int, level: float = 0.95) -> float:
    """z of two-sided simultaneous confidence intervals at ``level`` over k checks."""
    return NormalDist().inv_cdf(1 - (1 - level) / (2 * k))


@pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes_and_saves_figures(nb, out_root):
    figures = executed(nb.stem, out_root)
    written = list(figures.glob("*.png"))
    assert written, "the notebook saved no figure"
    for png in written:
        assert png.with_suffix(".pdf").exists() and png.with_suffix(".csv").exists()


def test_01_numbers(out_root):
    figures = executed("01_delta_errors", out_root)
    b = _read(figures / "phase_boundaries.csv")
    paper = b[b.setting == "paper"]
    assert paper.r.tolist() == ["1/3", "3/5", "27/5"]
    assert list(zip(paper["from"], paper["to"])) == [("source_only", "fedda"), ("fedda", "fedgp"), ("fedgp", "target_only")]
    # every exact Δ² formula agrees with Monte Carlo (simultaneous 95% over all checks of both models)
    gauss = _read(figures / "monte_carlo_gaussian.csv")
    real = _read(figures / "monte_carlo_real_mnist.csv")
    exact = pd.concat([gauss[gauss.formula_kind.isin(["exact", "mean-field"])],  # mean-field is exact there
                       real[real.formula_kind == "exact"]])
    z = _bonferroni_z(len(exact))
    assert (exact.z.abs() <= z).all(), exact[exact.z.abs() > z]
    # real digits: the projected-noise form holds where the filter keeps the source (δ̄ ≈ 1)
    gp = real[(real.rule == "fedgp") & (real.delta_bar > 0.99)]
    assert len(gp) >= 3 and (gp.z_projected.abs() <= _bonferroni_z(len(gp))).all()
    # auto rules cannot beat their oracle optimum (up to noise)
    auto = gauss[gauss.rule.str.endswith("auto")]
    assert (auto.mc_mean >= auto.formula - 4 * auto.mc_stderr).all()
    theory = _read(figures / "theory_panels.csv")
    assert set(theory.best_rule) == {"source_only", "fedda", "fedgp", "target_only"}
