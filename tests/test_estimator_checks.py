"""fda_core.experiments.estimator_checks: shapes and columns, argument errors, determinism, coverage of the truth in
Gaussian models, exact spreads (notebook 03's saved numbers are checked in tests/test_notebooks.py)."""

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from fda_core.experiments import estimator_checks as ec
from fda_core.viz import estimator_plots as ep
from fda_core.viz.widgets import estimator_explorer
from fda_core.core.known_gradients import GaussianGradientModel, PooledGradientModel
from fda_core.core.theory import optimal_beta_fedda, optimal_beta_fedgp

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def gauss():
    return ec.anisotropic_gaussian_model(m=12, sigma2=1.0, d2=(2.0, 0.25), tau2=(0.5, 0.8), n_target=16, seed=3)


@pytest.fixture(scope="module")
def pooled():
    g = torch.Generator().manual_seed(5)
    pool = torch.randn(200, 6, generator=g, dtype=torch.float64).pow(3) + 0.3  # heavy-tailed per-sample gradients
    src = torch.tensor([[1.0, 0.0, 0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    return PooledGradientModel(pool, src, n_target=8)


# ------------------------------------------------------------------ the anisotropic model
def test_anisotropic_model_geometry(gauss):
    assert gauss.m == 12 and gauss.source_grads.shape == (2, 12)
    assert gauss.sigma2 == pytest.approx(1.0)
    assert gauss.with_n_target(32).sigma2 == pytest.approx(0.5)
    assert gauss.d2.tolist() == pytest.approx([2.0, 0.25])
    assert gauss.tau2.tolist() == pytest.approx([0.5, 0.8])
    var = gauss.sample_std.square()
    assert float(var.max() / var.min()) == pytest.approx(100.0)
    parts = gauss.draw_parts(5, 4, torch.Generator().manual_seed(0))
    assert parts.shape == (5, 4, 12) and parts.dtype == torch.float64


def test_anisotropic_model_errors():
    with pytest.raises(ValueError, match="tau2"):
        ec.anisotropic_gaussian_model(d2=(1.0,), tau2=(1.5,))
    with pytest.raises(ValueError, match="equal length"):
        ec.anisotropic_gaussian_model(d2=(1.0, 2.0), tau2=(0.5,))
    with pytest.raises(ValueError, match="sample_std"):
        ec.AnisotropicGaussianModel(torch.zeros(3), torch.zeros(1, 3), torch.ones(2), 4)


# ------------------------------------------------------------------ helpers
def test_bonferroni_z():
    assert ec.bonferroni_z(1) == pytest.approx(1.959964, abs=1e-5)
    assert ec.bonferroni_z(60) == pytest.approx(3.3415, abs=1e-3)
    assert ec.bonferroni_z(10, 0.9) < ec.bonferroni_z(10, 0.95) < ec.bonferroni_z(20, 0.95)
    with pytest.raises(ValueError, match="k"):
        ec.bonferroni_z(0)
    with pytest.raises(ValueError, match="level"):
        ec.bonferroni_z(3, 1.0)


def test_derive_seed():
    assert ec.derive_seed(0, 1, 2, 3) == ec.derive_seed(0, 1, 2, 3)
    assert len({ec.derive_seed(0, 1, b, n) for b in (2, 4) for n in (8, 16)} | {ec.derive_seed(1, 1, 2, 8)}) == 5
    assert 0 <= ec.derive_seed(7, 1) < 2**63
    with pytest.raises(ValueError, match="seed"):
        ec.derive_seed(-1, 2)


def test_simultaneous_intervals_hand_checked():
    t = pd.DataFrame({"mean": [1.0, 2.0], "stderr": [0.1, 0.5], "truth": [1.3, 2.0]})
    out = ec.simultaneous_intervals(t, 0.95)
    z = ec.bonferroni_z(2)
    assert out.z_crit.tolist() == pytest.approx([z, z]) and out.k_rows.tolist() == [2, 2]
    assert out.ci_low.tolist() == pytest.approx([1.0 - 0.1 * z, 2.0 - 0.5 * z])
    assert out.covered.tolist() == [False, True]  # 1.3 is 3 s.e. away, z ≈ 2.24
    per_row = ec.simultaneous_intervals(t, 0.95, simultaneous=False)
    assert per_row.z_crit.iloc[0] == pytest.approx(1.959964, abs=1e-5)
    with pytest.raises(ValueError, match="stderr"):
        ec.simultaneous_intervals(t.drop(columns="stderr"))


def test_gaussian_estimator_std_isotropic_closed_form():
    # isotropic: Σ = (σ²/m) I, tr Σ² = σ⁴/m → std σ̂² = σ² √(2/(m(B−1)))
    model = GaussianGradientModel.from_geometry(m=10, sigma2=2.0, d2=1.0, tau2=0.5, n_target=8)
    s = ec.gaussian_estimator_std(model, 4)
    assert s["sigma2"][0] == pytest.approx(2.0 * math.sqrt(2 / (10 * 3)))
    # d̂²: 4 δᵀΣδ + 2 tr Σ² B/(B−1) = 4·1·0.2 + 2·0.4·4/3
    assert s["d2"][0] == pytest.approx(math.sqrt(4 * 0.2 + 2 * 0.4 * 4 / 3))
    # τ²d²: Σ⊥ has 9 eigenvalues 0.2 → tr Σ⊥² = 0.36; a = P⊥ v with ‖a‖² = 0.5
    assert s["tau2d2"][0] == pytest.approx(math.sqrt(4 * 0.2 * 0.5 + 2 * 0.36 * 4 / 3))
    with pytest.raises(ValueError, match="Gaussian"):
        ec.gaussian_estimator_std(PooledGradientModel(torch.randn(20, 3), torch.randn(1, 3), 4), 2)


# ------------------------------------------------------------------ estimator_check
COLUMNS = {"quantity", "source", "B", "n", "mean", "std", "stderr", "ci_low", "ci_high", "truth", "covered",
           "clamped_mean", "clamped_bias", "frac_negative", "z_crit", "level", "n_draws", "seed", "cell_seed"}


def test_estimator_check_shape_columns_and_truths(gauss):
    t = ec.estimator_check(gauss, [2, 4], [8, 16], n_draws=50, seed=1)
    assert COLUMNS <= set(t.columns)
    # 4 cells × (σ² + 2 sources × (d², τ²d²)) = 4 × 5 rows
    assert len(t) == 20
    assert t.quantity.value_counts().to_dict() == {"d2": 8, "tau2d2": 8, "sigma2": 4}
    assert t[t.quantity == "sigma2"].source.isna().all()
    assert set(t[t.quantity == "d2"].source) == {0, 1}
    s2 = t[t.quantity == "sigma2"].set_index("n").truth
    assert s2.loc[8].tolist() == pytest.approx([2.0, 2.0]) and s2.loc[16].tolist() == pytest.approx([1.0, 1.0])
    assert t[(t.quantity == "d2") & (t.source == 1)].truth.tolist() == pytest.approx([0.25] * 4)
    assert (t.n_draws == 50).all() and (t.seed == 1).all()
    assert t.cell_seed.nunique() == 4  # one derived seed per (B, n) cell
    assert np.allclose(t.z_crit, ec.bonferroni_z(20))
    assert np.allclose(t.stderr, t["std"] / math.sqrt(50))
    assert ((t.ci_low <= t["mean"]) & (t["mean"] <= t.ci_high)).all()
    assert (t.clamped_mean >= t["mean"] - 1e-12).all()  # max(x, 0) >= x draw by draw
    assert (t[t.quantity == "sigma2"].frac_negative == 0).all()  # a sum of squares
    assert t.std_theory.notna().all()


def test_estimator_check_deterministic_and_cells_independent_of_grid(gauss):
    a = ec.estimator_check(gauss, [2, 4], [8, 16], n_draws=40, seed=7)
    b = ec.estimator_check(gauss, [2, 4], [8, 16], n_draws=40, seed=7)
    pd.testing.assert_frame_equal(a, b)
    c = ec.estimator_check(gauss, [4], [16], n_draws=40, seed=7)
    same = a[(a.B == 4) & (a.n == 16)].reset_index(drop=True)
    assert np.allclose(same["mean"], c["mean"]) and (same.cell_seed.values == c.cell_seed.values).all()
    d = ec.estimator_check(gauss, [2, 4], [8, 16], n_draws=40, seed=8)
    assert not np.allclose(a["mean"], d["mean"])


def test_estimator_check_errors(gauss):
    with pytest.raises(ValueError, match="B_values"):
        ec.estimator_check(gauss, [1, 2], [8], n_draws=10)
    with pytest.raises(ValueError, match="n_values must be divisible"):
        ec.estimator_check(gauss, [3], [8], n_draws=10)
    with pytest.raises(ValueError, match="n_draws"):
        ec.estimator_check(gauss, [2], [8], n_draws=1)
    with pytest.raises(ValueError, match="n_values"):
        ec.estimator_check(gauss, [2], [], n_draws=10)
    with pytest.raises(ValueError, match="model"):
        ec.estimator_check("not a model", [2], [8], n_draws=10)
    with pytest.raises(ValueError, match="seed"):
        ec.estimator_check(gauss, [2], [8], n_draws=10, seed=-3)
    t = ec.estimator_check(gauss, [2, 3], [6, 8], n_draws=10, skip_invalid=True)
    assert sorted(set(zip(t.B, t.n))) == [(2, 6), (2, 8), (3, 6)]


def test_estimator_check_gaussian_covers_truth_and_matches_exact_std(gauss):
    """On the Gaussian model every simultaneous 95 % interval covers the truth (seeded)."""
    t = ec.estimator_check(gauss, [2, 4, 8], [16, 32], n_draws=3000, seed=0)
    assert t.covered.all(), t[~t.covered]
    # Monte-Carlo std vs exact std: the std of a std estimate is ≈ std·√((κ−1)/(4N)); 15 % is ample here
    assert np.allclose(t["std"], t.std_theory, rtol=0.15)
    # σ̂²'s spread falls with B; the distances' barely move (noise of ḡ does not depend on B)
    s = t[(t.quantity == "sigma2") & (t.n == 32)].sort_values("B").std_theory.to_numpy()
    assert s[0] / s[2] == pytest.approx(math.sqrt(7), rel=1e-9)
    d = t[(t.quantity == "d2") & (t.source == 0) & (t.n == 32)].sort_values("B").std_theory.to_numpy()
    assert d[0] / d[2] < 1.1


def test_estimator_check_isotropic_and_pooled(pooled):
    iso = GaussianGradientModel.from_geometry(m=8, sigma2=1.0, d2=0.5, tau2=0.3, n_target=16)
    t = ec.estimator_check(iso, [2, 4], [16], n_draws=2000, seed=2)
    assert t.covered.all() and len(t) == 6
    p = ec.estimator_check(pooled, [2, 4], [8, 16], n_draws=2000, seed=2)
    assert p.covered.all(), p[~p.covered]
    assert p.std_theory.isna().all()


# ------------------------------------------------------------------ over π
def test_estimator_check_over_pi(pooled):
    other = PooledGradientModel(pooled.target_pool * 0.5 + 0.1, pooled.source_grads * 2, n_target=8)
    t = ec.estimator_check_over_pi([pooled, other], B=2, n=8, n_draws=1500, seed=0)
    assert list(t.columns[:2]) == ["theta", "point"]
    assert len(t) == 3 * 3  # (θ0, θ1, average) × (σ², d², τ²d²)
    avg = t[t.point == "average over π"].set_index("quantity")
    per = t[t.point != "average over π"]
    for q in ec.QUANTITIES:
        rows = per[per.quantity == q]
        assert avg.loc[q, "truth"] == pytest.approx(rows.truth.mean())
        assert avg.loc[q, "mean"] == pytest.approx(rows["mean"].mean())  # same draws, averaged draw by draw
        assert avg.loc[q, "n_draws"] == 1500
    assert t.theta.isna().sum() == 3 and pd.isna(avg.cell_seed).all()
    assert t.covered.all(), t[~t.covered]
    grid = ec.estimator_check_over_pi([pooled, other], B=[2, 4], n=[8, 16], n_draws=20, seed=0)
    assert len(grid) == 4 * 9
    with pytest.raises(ValueError, match="models"):
        ec.estimator_check_over_pi([], 2, 8, 10)
    two_src = PooledGradientModel(pooled.target_pool, torch.randn(2, 6, dtype=torch.float64), 8)
    with pytest.raises(ValueError, match="same number of sources"):
        ec.estimator_check_over_pi([pooled, two_src], 2, 8, 10)
    with pytest.raises(ValueError, match="divisible"):
        ec.estimator_check_over_pi([pooled], 3, 8, 10)


# ------------------------------------------------------------------ auto β
def test_auto_beta_check(gauss):
    t = ec.auto_beta_check(gauss, [2, 4], n=16, n_draws=400, seed=0, rule=["fedda", "fedgp"])
    assert len(t) == 2 * 2 * 2  # B × rule × source
    for col in ("beta_mean", "beta_std", "beta_q05", "beta_q50", "beta_q95", "beta_optimal", "beta_bias"):
        assert col in t
    q = t[["beta_q05", "beta_q25", "beta_q50", "beta_q75", "beta_q95"]].to_numpy()
    assert (np.diff(q, axis=1) >= 0).all() and (q >= 0).all() and (q <= 1).all()
    da = t[(t.rule == "fedda")].set_index(["source", "B"]).beta_optimal
    assert da.loc[(0, 2)] == pytest.approx(optimal_beta_fedda(1.0, 2.0)) == pytest.approx(1 / 3)
    gp = t[(t.rule == "fedgp")].set_index(["source", "B"]).beta_optimal
    assert gp.loc[(1, 4)] == pytest.approx(optimal_beta_fedgp(1.0, 0.2)) == pytest.approx(1 / 1.2)
    # far source: the estimated β is centred near the optimum
    far = t[(t.source == 0) & (t.B == 4)]
    assert (far.beta_bias.abs() < 0.1).all()
    single = ec.auto_beta_check(gauss, [2], n=16, n_draws=50, seed=0)
    assert set(single.rule) == {"fedgp"}
    pd.testing.assert_frame_equal(single, ec.auto_beta_check(gauss, [2], n=16, n_draws=50, seed=0))
    with pytest.raises(ValueError, match="rule"):
        ec.auto_beta_check(gauss, [2], n=16, n_draws=50, rule="fedavg")
    with pytest.raises(ValueError, match="divisible"):
        ec.auto_beta_check(gauss, [3], n=16, n_draws=50)
    with pytest.raises(ValueError, match="n"):
        ec.auto_beta_check(gauss, [2], n=1, n_draws=50)


# ------------------------------------------------------------------ draws, figures, widget
def test_estimator_draws_and_figures(gauss):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    d = ec.estimator_draws(gauss, 2, 8, n_draws=30, seed=0)
    assert len(d) == 30 * 5 and (d.clamped >= d.estimate).all() and (d.clamped >= 0).all()
    t = ec.estimator_check(gauss, [2, 4], [8, 16], n_draws=30, seed=0)
    for fig in (ep.plot_relative_means(t), ep.plot_spread(t), ep.plot_clamping(t)):
        assert len(fig.axes) >= 5
        plt.close(fig)
    fig, draws = ep.plot_estimator_spread(gauss, 2, 8, n_draws=30)
    assert len(draws) == 150
    plt.close(fig)
    ax = ep.plot_z_scores(t.assign(model="g"))
    plt.close(ax.figure)
    ax = ep.plot_auto_beta(ec.auto_beta_check(gauss, [2, 4], 16, 30, rule=["fedda", "fedgp"]))
    plt.close(ax.figure)


def test_estimator_explorer_builds_without_a_browser(gauss):
    import matplotlib

    matplotlib.use("Agg")
    panel = estimator_explorer(gauss, [2, 4], [8, 10], B=4, n=8, n_draws=20)
    assert [c.description for c in panel.controls.values()] == ["B (parts of the target set)", "n (target points)"]
    before = panel.images["estimates"].value
    panel.controls["n"].value = 10  # 10 is not divisible by 4: a message, no exception, the last plot kept
    assert "do not split" in panel.error.value and panel.images["estimates"].value == before
    panel.set(B=2)
    assert panel.error.value == "" and panel.images["estimates"].value != before
    assert "B = 2 parts of n = 10 target points" in panel.readout.value
    with pytest.raises(ValueError, match="initial"):
        estimator_explorer(gauss, [2, 4], [8], B=8, n=8)
