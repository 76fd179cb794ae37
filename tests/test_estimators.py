"""Estimators: hand-computed values, unbiasedness over many seeded draws, auto-β, part gradients."""

import math

import pytest
import torch
from torch import nn

from fda_core.core.estimators import auto_beta, estimate_deltas, part_gradients, split_parts
from fda_core.core.known_gradients import GaussianGradientModel


def test_hand_computed():
    # parts (1,0), (3,0): ḡ = (2,0); s² = (1+1)/1 = 2; σ̂² = 1
    parts = torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    src = torch.tensor([[0.0, 1.0], [4.0, 0.0]], dtype=torch.float64)
    est = estimate_deltas(parts, src)
    assert float(est["sigma2"]) == pytest.approx(1.0)
    # d̂² = ‖ḡ − g_S‖² − σ̂²: (4+1) − 1 = 4 ; (4) − 1 = 3
    assert est["d2"].tolist() == pytest.approx([4.0, 3.0])
    # source 1 along e2: P⊥ḡ = (2,0) → 4; Σ‖P⊥(g_j−ḡ)‖² = 2 → 4 − 2/2 = 3
    # source 2 along e1: P⊥ḡ = 0; P⊥ dev = 0 → 0
    assert est["tau2d2"].tolist() == pytest.approx([3.0, 0.0])
    assert est["n_parts"] == 2


def test_single_source_shapes_and_batch():
    parts = torch.randn(5, 4, 7)
    src = torch.randn(5, 7)
    est = estimate_deltas(parts, src)
    assert est["sigma2"].shape == (5,) and est["d2"].shape == (5,) and est["tau2d2"].shape == (5,)
    for k in range(5):
        e = estimate_deltas(parts[k], src[k])
        assert torch.allclose(e["d2"], est["d2"][k], atol=1e-5)
        assert torch.allclose(e["tau2d2"], est["tau2d2"][k], atol=1e-5)


def test_zero_source_tau_estimates_target_norm():
    parts = torch.tensor([[1.0, 2.0], [3.0, 2.0]], dtype=torch.float64)
    est = estimate_deltas(parts, torch.zeros(2, dtype=torch.float64))
    # ‖ḡ‖² − Σ‖dev‖²/(B(B−1)) = (4+4) − 2/2 = 7
    assert float(est["tau2d2"]) == pytest.approx(7.0)


def _check_unbiased(samples: torch.Tensor, truth: float, name: str):
    mean = float(samples.mean())
    se = float(samples.std()) / math.sqrt(samples.numel())
    assert abs(mean - truth) < 4 * se + 1e-12, f"{name}: MC mean {mean} vs truth {truth} (se {se})"


@pytest.mark.parametrize("n_parts", [2, 4, 8])
def test_unbiased_gaussian_model_anisotropic(n_parts):
    """Monte-Carlo mean of each estimator matches the truth within 4 standard errors (seeded)."""
    g = torch.Generator().manual_seed(10 + n_parts)
    m, n, draws = 6, 32, 20000
    g_t = torch.tensor([1.0, -0.5, 0.3, 0.0, 0.2, 0.1], dtype=torch.float64)
    src = torch.tensor([[0.5, 0.5, 0.0, 0.0, 0.0, 0.0], [1.0, -0.4, 0.3, 0.0, 0.2, 0.0]], dtype=torch.float64)
    scale = torch.linspace(0.2, 2.0, m, dtype=torch.float64)  # anisotropic per-sample noise std
    part_std = scale * math.sqrt(n_parts / n)
    parts = g_t + part_std * torch.randn(draws, n_parts, m, generator=g, dtype=torch.float64)
    est = estimate_deltas(parts, src.expand(draws, 2, m))
    sigma2 = float((scale**2).sum() / n)
    d2 = (g_t - src).square().sum(-1)
    u = src / src.norm(dim=-1, keepdim=True)
    tau2d2 = g_t.square().sum() - (u @ g_t).square()
    _check_unbiased(est["sigma2"], sigma2, "sigma2")
    for i in range(2):
        _check_unbiased(est["d2"][:, i], float(d2[i]), f"d2[{i}]")
        _check_unbiased(est["tau2d2"][:, i], float(tau2d2[i]), f"tau2d2[{i}]")


def test_unbiased_linear_regression_model_via_part_gradients():
    """A torch model with a closed-form population gradient: y = xᵀw* + ε, x ~ N(0, I), MSE loss.

    The population gradient of mean((xᵀθ − y)²) is 2(θ − w*); per-sample gradients are not Gaussian.
    """
    torch.manual_seed(0)
    p, n, draws, b = 4, 24, 1500, 4
    w_star = torch.tensor([[1.0, -2.0, 0.5, 0.0]], dtype=torch.float64)
    model = nn.Linear(p, 1, bias=False).double()
    with torch.no_grad():
        model.weight.copy_(torch.tensor([[0.3, 0.1, -0.2, 0.4]]))
    theta = model.weight.detach().reshape(-1)
    g_true = 2 * (theta - w_star.reshape(-1))
    g_src = torch.tensor([1.0, 1.0, 0.0, 0.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(1)
    sig, d2s, taus, full_err = [], [], [], []
    for k in range(draws):
        x = torch.randn(n, p, generator=gen, dtype=torch.float64)
        y = x @ w_star.T + 0.5 * torch.randn(n, 1, generator=gen, dtype=torch.float64)
        parts = part_gradients(model, nn.functional.mse_loss, x, y, b, seed=k)
        est = estimate_deltas(parts, g_src)
        sig.append(est["sigma2"]), d2s.append(est["d2"]), taus.append(est["tau2d2"])
        full_err.append((parts.mean(0) - g_true).square().sum())
    sigma2_mc = torch.stack(full_err).mean()  # σ² by brute force (same draws)
    u = g_src / g_src.norm()
    _check_unbiased(torch.stack(sig) - torch.stack(full_err), 0.0, "sigma2 - squared error")
    _check_unbiased(torch.stack(d2s), float((g_true - g_src).square().sum()), "d2")
    _check_unbiased(torch.stack(taus), float(g_true.square().sum() - (g_true @ u) ** 2), "tau2d2")
    assert float(sigma2_mc) > 0


def test_gaussian_model_estimates_match_its_properties():
    model = GaussianGradientModel.from_geometry(m=8, sigma2=0.7, d2=1.3, tau2=0.4, n_target=16)
    gen = torch.Generator().manual_seed(5)
    parts = model.draw_parts(20000, 4, gen)
    est = estimate_deltas(parts, model.source_grads[0].expand(20000, 8))
    _check_unbiased(est["sigma2"], model.sigma2, "sigma2")
    _check_unbiased(est["d2"], 1.3, "d2")
    _check_unbiased(est["tau2d2"], 0.4 * 1.3, "tau2d2")


def test_part_gradients_matches_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 5), nn.Tanh(), nn.Linear(5, 2))
    x, y = torch.randn(13, 3), torch.randint(0, 2, (13,))
    pg = part_gradients(model, nn.functional.cross_entropy, x, y, 3, seed=7)
    idx = split_parts(13, 3, seed=7)
    assert pg.shape == (3, sum(p.numel() for p in model.parameters()))
    for j in range(3):
        model.zero_grad()
        nn.functional.cross_entropy(model(x[idx[j]]), y[idx[j]]).backward()
        ref = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        assert torch.allclose(pg[j], ref, atol=1e-6)


def test_split_parts():
    idx = split_parts(10, 3, seed=0)
    assert idx.shape == (3, 3)
    assert len(set(idx.flatten().tolist())) == 9
    assert torch.equal(split_parts(10, 3, seed=0), idx)
    with pytest.raises(ValueError, match="n_parts"):
        split_parts(10, 1)
    with pytest.raises(ValueError, match="n = 2 < n_parts = 3"):
        split_parts(2, 3)


def test_auto_beta_formulas_and_fallback():
    parts = torch.tensor([[1.0, 0.0], [3.0, 0.0]], dtype=torch.float64)
    src = torch.tensor([[0.0, 1.0], [4.0, 0.0]], dtype=torch.float64)
    # σ̂² = 1, d̂² = (4, 3), τ²d² = (3, 0)
    assert auto_beta(parts, src, "fedda").tolist() == pytest.approx([1 / 5, 1 / 4])
    assert auto_beta(parts, src, "fedgp").tolist() == pytest.approx([1 / 4, 1.0])
    assert auto_beta(parts, src, "fedgp", m=2).tolist() == pytest.approx([0.5 / 3.5, 1.0])
    # identical parts: σ̂² = 0 → β = 0 unless the distance is also 0 → fallback
    same = torch.tensor([[1.0, 1.0], [1.0, 1.0]])
    assert auto_beta(same, torch.tensor([[0.0, 1.0], [1.0, 1.0]]), "fedda").tolist() == [0.0, 0.5]
    assert auto_beta(same, torch.tensor([[1.0, 1.0]]), "fedda", fallback=0.3).tolist() == pytest.approx([0.3])
    # negative distance estimate → clamped to 0 → β = 1
    noisy = torch.tensor([[0.0, 0.0], [2.0, 0.0]])
    assert auto_beta(noisy, torch.tensor([[1.0, 0.0]]), "fedda").tolist() == [1.0]


def test_bad_inputs():
    with pytest.raises(ValueError, match="B >= 2"):
        estimate_deltas(torch.randn(1, 3), torch.randn(3))
    with pytest.raises(ValueError, match="part_grads must have shape"):
        estimate_deltas(torch.randn(3), torch.randn(3))
    with pytest.raises(ValueError, match="last dims must agree"):
        estimate_deltas(torch.randn(2, 3), torch.randn(4))
    with pytest.raises(ValueError, match="part_grads contains NaN"):
        estimate_deltas(torch.tensor([[1.0, float("nan")], [0.0, 0.0]]), torch.randn(2))
    with pytest.raises(ValueError, match="source_grads contains NaN"):
        estimate_deltas(torch.randn(2, 2), torch.tensor([float("inf"), 0.0]))
    with pytest.raises(ValueError, match="rule must be"):
        auto_beta(torch.randn(2, 2), torch.randn(2), rule="fedxx")
    with pytest.raises(ValueError, match="fallback"):
        auto_beta(torch.randn(2, 2), torch.randn(2), fallback=2.0)
    with pytest.raises(ValueError, match="x has 4 points but y has 3"):
        part_gradients(nn.Linear(2, 1), nn.functional.mse_loss, torch.randn(4, 2), torch.randn(3, 1), 2)
