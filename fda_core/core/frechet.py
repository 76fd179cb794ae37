"""The Fréchet distance between Gaussians fitted to two feature sets — FID when the features are InceptionV3's
pool features (Heusel et al. 2017; the Fed INB paper's second metric, App. F.1; ``docs/translation.md``
§ FedStarGAN).

    d²(N(μ₁, Σ₁), N(μ₂, Σ₂)) = ‖μ₁ − μ₂‖² + Tr(Σ₁) + Tr(Σ₂) − 2·Tr((Σ₁^{1/2} Σ₂ Σ₁^{1/2})^{1/2})

(the last trace equals Tr((Σ₁Σ₂)^{1/2}): Σ₁Σ₂ is similar to the symmetric PSD matrix Σ₁^{1/2}Σ₂Σ₁^{1/2}). Computed in
float64 with symmetric eigendecompositions, negative rounding eigenvalues clamped to 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["frechet_distance", "feature_statistics", "frechet_distance_of_features"]


def _sqrt_psd(a: Tensor) -> Tensor:
    w, v = torch.linalg.eigh((a + a.T) / 2)
    return (v * w.clamp_min(0).sqrt()) @ v.T


def frechet_distance(mu1: Tensor, sigma1: Tensor, mu2: Tensor, sigma2: Tensor) -> float:
    """d² between N(mu1, sigma1) and N(mu2, sigma2) (module docstring). mu: (k,), sigma: (k, k) symmetric PSD."""
    mu1, mu2, s1, s2 = (t.to(torch.float64) for t in (mu1, mu2, sigma1, sigma2))
    if mu1.ndim != 1 or mu1.shape != mu2.shape or s1.shape != (mu1.numel(),) * 2 or s2.shape != s1.shape:
        raise ValueError(f"need mu1, mu2 of shape (k,) and sigma1, sigma2 of shape (k, k); got {tuple(mu1.shape)}, "
                         f"{tuple(mu2.shape)}, {tuple(s1.shape)}, {tuple(s2.shape)}")
    r1 = _sqrt_psd(s1)
    cross = torch.linalg.eigvalsh(r1 @ s2 @ r1).clamp_min(0).sqrt().sum()
    return float((mu1 - mu2).square().sum() + torch.trace(s1) + torch.trace(s2) - 2 * cross)


def feature_statistics(features: Tensor) -> tuple[Tensor, Tensor]:
    """Mean (k,) and unbiased covariance (k, k) of features (n, k), n ≥ 2, in float64."""
    if features.ndim != 2 or features.shape[0] < 2:
        raise ValueError(f"features must have shape (n, k) with n >= 2, got {tuple(features.shape)}")
    f = features.to(torch.float64)
    return f.mean(0), torch.cov(f.T).reshape(f.shape[1], f.shape[1])


def frechet_distance_of_features(a: Tensor, b: Tensor) -> float:
    """d² between Gaussians fitted to the feature sets a (n, k) and b (n', k) (FID for Inception features)."""
    return frechet_distance(*feature_statistics(a), *feature_statistics(b))
