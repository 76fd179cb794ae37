"""Models whose true target gradient is known, and the Monte-Carlo Delta error of any registered rule in them.

A known-gradient model holds the population target gradient g_T, the source gradients g_i and a way to
draw the gradients of B disjoint parts of a fresh target sample D̂_T (Gaussian noise around g_T, or
subsets of a pool of per-sample gradients). Δ² = E‖g_T − ĝ‖² of a rule is then measured by Monte Carlo
and compared with the closed forms of :mod:`fda_core.core.theory` (``docs/theory.md`` § Delta errors).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .aggregation import Rule, get_rule
from .theory import _arr

__all__ = ["KnownGradientModel", "GaussianGradientModel", "PooledGradientModel", "monte_carlo_delta",
           "fedgp_theorem_terms"]


# ---------------------------------------------------------------------------------------------
# Monte-Carlo check of the formulas
# ---------------------------------------------------------------------------------------------
class KnownGradientModel:
    """Base of the models where the population gradients are known (for Monte-Carlo checks).

    Subclasses set ``target_grad`` (m,), ``source_grads`` (N, m), ``n_target`` and implement
    ``draw_parts(n_draws, n_parts, generator) -> (n_draws, B, m)`` (part gradients of fresh target
    sets of ``n_target`` i.i.d. points) and the exact ``sigma2``.
    """

    target_grad: Tensor
    source_grads: Tensor
    n_target: int

    @property
    def m(self) -> int:
        return int(self.target_grad.shape[0])

    @property
    def d2(self) -> Tensor:
        """(N,) squared distances ‖g_T − g_i‖²."""
        return (self.target_grad - self.source_grads).square().sum(-1)

    @property
    def tau2d2(self) -> Tensor:
        """(N,) ‖P⊥_i g_T‖², the squared distance of g_T from its projection on each source direction."""
        u = self.source_grads / torch.linalg.vector_norm(self.source_grads, dim=-1, keepdim=True).clamp_min(1e-300)
        return self.target_grad.square().sum() - (u @ self.target_grad).square()

    @property
    def tau2(self) -> Tensor:
        """(N,) τ² = ‖P⊥ g_T‖² / d² (0 where d = 0)."""
        d2 = self.d2
        return torch.where(d2 > 0, self.tau2d2 / torch.where(d2 > 0, d2, torch.ones_like(d2)), torch.zeros_like(d2))

    def projected_variance(self, direction: Tensor) -> float:
        """E⟨g_{D̂_T} − g_{D_T}, u⟩² for the unit vector u along ``direction`` (the noise FedGP keeps)."""
        raise NotImplementedError

    def with_n_target(self, n_target: int):
        """The same model with another target-set size n."""
        return dataclasses.replace(self, n_target=n_target)

    def _validate(self, first: Tensor, first_name: str, first_shape: str) -> None:
        """Common checks of __post_init__: float64 sources (N, m) matching ``first``'s last dim, n >= 1."""
        self.source_grads = torch.as_tensor(self.source_grads, dtype=torch.float64)
        if self.source_grads.ndim == 1:
            self.source_grads = self.source_grads.unsqueeze(0)
        expected_ndim = 1 if first_shape == "(m,)" else 2
        if first.ndim != expected_ndim or self.source_grads.shape[-1] != first.shape[-1]:
            raise ValueError(
                f"{first_name} must be {first_shape} and source_grads (N, m); got {tuple(first.shape)} and "
                f"{tuple(self.source_grads.shape)}"
            )
        if not (isinstance(self.n_target, int) and self.n_target >= 1):
            raise ValueError(f"n_target must be an integer >= 1, got {self.n_target!r}")

    def _check_parts(self, n_parts: int) -> None:
        if n_parts < 1 or self.n_target % n_parts:
            raise ValueError(f"n_parts must divide n_target = {self.n_target}, got {n_parts}")


@dataclass
class GaussianGradientModel(KnownGradientModel):
    """A model where the population target gradient is known.

    Per-sample target gradients are g_T + ξ with ξ ~ N(0, diag(``sample_std``²)) (a number: isotropic
    noise; an (m,) tensor: per-coordinate), so the gradient of n target samples is
    g_{D̂_T} = g_T + N(0, diag(sample_std²)/n) and σ² = Σ_c sample_std_c² / n exactly.
    Source gradients are fixed population gradients (rows of ``source_grads``), so d_i² = ‖g_T − g_i‖².

    Attributes:
        target_grad: (m,) population target gradient g_{D_T}.
        source_grads: (N, m) population source gradients g_{S_i}.
        sample_std: standard deviation of one per-sample gradient: a number, or (m,) per coordinate.
        n_target: number of labelled target samples n.
    """

    target_grad: Tensor
    source_grads: Tensor
    sample_std: float
    n_target: int

    def __post_init__(self) -> None:
        self.target_grad = torch.as_tensor(self.target_grad, dtype=torch.float64)
        self._validate(self.target_grad, "target_grad", "(m,)")
        std = torch.as_tensor(self.sample_std, dtype=torch.float64)
        if std.ndim == 0:
            if not (float(std) >= 0 and math.isfinite(float(std))):
                raise ValueError(f"sample_std must be a finite number >= 0, got {self.sample_std!r}")
            self.sample_std = float(std)
        else:
            if std.shape != (self.m,):
                raise ValueError(f"sample_std must be a number or of shape (m,) = ({self.m},), got {tuple(std.shape)}")
            if not bool(torch.isfinite(std).all()) or bool((std < 0).any()):
                raise ValueError("sample_std must be finite and >= 0")
            self.sample_std = std

    @property
    def sample_variances(self) -> Tensor:
        """(m,) per-coordinate variance of one per-sample gradient."""
        return torch.as_tensor(self.sample_std, dtype=torch.float64).square().expand(self.m)

    @classmethod
    def from_geometry(
        cls,
        m: int,
        sigma2: float,
        d2: float,
        tau2: float = 0.5,
        target_along: float | None = None,
        n_target: int = 64,
    ) -> GaussianGradientModel:
        """One source at squared distance ``d2`` with τ² = ``tau2`` and target variance ``sigma2``.

        g_S lies along e₁; g_T = p e₁ + q e₂ with q² = τ² d² (so ‖P⊥ g_T‖² = τ²d²) and
        g_S = (p − d√(1 − τ²)) e₁. ``target_along`` = p (default: 10·(d + σ) + 1, far from the filter's
        boundary so δ̂ ≈ 1 and the mean-field FedGP formula is exact).
        """
        if not (isinstance(m, int) and m >= 2):
            raise ValueError(f"m must be an integer >= 2, got {m!r}")
        _arr(sigma2, "sigma2"), _arr(d2, "d2"), _arr(tau2, "tau2", 0.0, 1.0)
        d, s = math.sqrt(d2), math.sqrt(sigma2)
        p = 10.0 * (d + s) + 1.0 if target_along is None else float(target_along)
        g_t = torch.zeros(m, dtype=torch.float64)
        g_t[0], g_t[1] = p, math.sqrt(tau2 * d2)
        g_s = torch.zeros(m, dtype=torch.float64)
        g_s[0] = p - d * math.sqrt(1.0 - tau2)
        return cls(g_t, g_s.unsqueeze(0), math.sqrt(sigma2 * n_target / m), n_target)

    @property
    def sigma2(self) -> float:
        """σ² = Σ_c sample_std_c² / n (= m · sample_std² / n for isotropic noise; exact)."""
        return float(self.sample_variances.sum()) / self.n_target

    def projected_variance(self, direction: Tensor) -> float:
        """E⟨ĝ_T − g_T, u⟩² = Σ_c u_c² sample_std_c² / n (= σ²/m in every direction when isotropic)."""
        d = direction.to(torch.float64)
        u = d / torch.linalg.vector_norm(d).clamp_min(1e-300)
        return float((u.square() * self.sample_variances).sum()) / self.n_target

    def draw_parts(self, n_draws: int, n_parts: int, generator: torch.Generator) -> Tensor:
        """(n_draws, B, m) gradients on B disjoint equal parts of a fresh D̂_T (n_target % B == 0).

        Part j holds n/B samples: g_j = g_T + N(0, sample_std² B / n · I); their mean is g_{D̂_T}.
        """
        self._check_parts(n_parts)
        std = self.sample_std * math.sqrt(n_parts / self.n_target)
        noise = torch.randn((n_draws, n_parts, self.m), generator=generator, dtype=torch.float64)
        return self.target_grad + std * noise


#: elements of one chunk of PooledGradientModel.draw_parts' gather (float64: 2 MiB)
_GATHER_CHUNK_ELEMENTS = 1 << 18


@dataclass
class PooledGradientModel(KnownGradientModel):
    """A real-data model: D_T is the uniform distribution over a pool of per-sample target gradients.

    Target sets are n i.i.d. draws from the pool (with replacement), so g_{D_T} is the pool mean exactly
    and σ² = (1/n) · mean_i ‖g_i − ḡ‖² exactly (no finite-population correction). Source gradients are
    population gradients of the source pools (e.g. the mean per-sample gradient on rotated digits).

    Attributes:
        target_pool: (P, m) per-sample gradients of the target pool (stored in float64).
        source_grads: (N, m) population source gradients.
        n_target: target-set size n.
    """

    target_pool: Tensor
    source_grads: Tensor
    n_target: int
    target_grad: Tensor = dataclasses.field(init=False)

    def __post_init__(self) -> None:
        self.target_pool = torch.as_tensor(self.target_pool, dtype=torch.float64)
        self._validate(self.target_pool, "target_pool", "(P, m)")
        self.target_grad = self.target_pool.mean(0)

    @property
    def sigma2(self) -> float:
        """σ² = E‖g_{D̂_T} − g_{D_T}‖² = (1/n) · mean_i ‖g_i − ḡ‖² for n i.i.d. draws (exact)."""
        return float((self.target_pool - self.target_grad).square().sum(-1).mean()) / self.n_target

    def projected_variance(self, direction: Tensor) -> float:
        """uᵀ Cov u / n with Cov the pool covariance of per-sample gradients (exact)."""
        u = direction.to(torch.float64) / torch.linalg.vector_norm(direction.to(torch.float64)).clamp_min(1e-300)
        return float(((self.target_pool - self.target_grad) @ u).square().mean()) / self.n_target

    def draw_parts(self, n_draws: int, n_parts: int, generator: torch.Generator) -> Tensor:
        """(n_draws, B, m): for each draw, n pool indices with replacement, split into B equal parts."""
        self._check_parts(n_parts)
        n, m = self.n_target, self.m
        idx = torch.randint(self.target_pool.shape[0], (n_draws, n), generator=generator)
        out = torch.empty(n_draws, n_parts, m, dtype=torch.float64)
        # the (draws, n, m) gather in cache-sized chunks (~2 MB): each draw's numbers are the same whatever the chunk,
        # and written and read back from the caches instead of memory the gather is about 4x faster (2-core CPU,
        # m = 3,322, n = 32-128; chunks of ~128 MB before)
        step = max(1, _GATHER_CHUNK_ELEMENTS // max(n * m, 1))
        for a in range(0, n_draws, step):
            g = self.target_pool[idx[a:a + step]]  # (t, n, m)
            out[a:a + step] = g.view(g.shape[0], n_parts, n // n_parts, m).mean(2)
        return out


def monte_carlo_delta(
    rule: str | Rule,
    model: KnownGradientModel,
    *,
    beta: float | Sequence[float] | None = None,
    weights: Sequence[float] | None = None,
    n_draws: int = 4000,
    n_parts: int = 2,
    seed: int = 0,
    chunk: int = 2048,
) -> dict[str, float]:
    """Monte-Carlo Δ² = E‖g_{D_T} − ĝ_rule‖² of a registered rule over fresh draws of D̂_T.

    Each draw samples B = ``n_parts`` part gradients (auto rules use them to pick β; every other rule
    sees their mean, the gradient on all n target samples). Computed in float64 with the rule's batched
    tensor path. Returns ``{"mean", "stderr", "n_draws"}`` (stderr = sample std / √n_draws).
    """
    r = get_rule(rule) if isinstance(rule, str) else rule
    if not (isinstance(n_draws, int) and n_draws >= 2):
        raise ValueError(f"n_draws must be an integer >= 2, got {n_draws!r}")
    if r.uses_target_parts and n_parts < 2:
        raise ValueError(f"rule {r.name!r} needs n_parts >= 2, got {n_parts}")
    gen = torch.Generator().manual_seed(seed)
    errs = []
    for start in range(0, n_draws, chunk):
        t = min(chunk, n_draws - start)
        parts = model.draw_parts(t, n_parts, gen)
        target = parts.mean(dim=1)
        sources = model.source_grads.expand(t, *model.source_grads.shape)
        g_hat = r.apply(sources, target, beta=beta, weights=weights, target_part_grads=parts)
        errs.append((g_hat - model.target_grad).square().sum(-1))
    e = torch.cat(errs)
    return {"mean": float(e.mean()), "stderr": float(e.std() / math.sqrt(n_draws)), "n_draws": n_draws}


def fedgp_theorem_terms(v_hat: Tensor, v: Tensor, g_s: Tensor, beta: float) -> dict[str, float]:
    """Sample means of the terms of the exact single-source Δ²_FedGP (FedGP paper Theorem 4.3):

        Δ² = (1−β)² E‖v̂−v‖² + β² E[δ̂ τ²‖v−g_S‖²] + (2β−β²) E[δ̂⟨v̂−v,u⟩²]
             + 2β(1−β) E[δ̂⟨v,u⟩⟨v̂−v,u⟩] + β² E[(1−δ̂)‖v‖²]

    with v̂ = g_{D̂_T} (draws, shape (T, m)), v = g_{D_T} (m,), u = g_S/‖g_S‖, δ̂ = 1[⟨v̂, g_S⟩ > 0] and
    τ²‖v − g_S‖² = ‖v − ⟨v,u⟩u‖². Returns each term and their ``total``; also ``delta_bar`` = mean δ̂.
    Used to check the theorem's algebra against a direct Monte-Carlo of Δ² on the same draws.
    """
    b = float(_arr(beta, "beta", 0.0, 1.0))
    u = g_s / torch.linalg.vector_norm(g_s)
    delta = (v_hat @ g_s > 0).to(v_hat.dtype)
    noise = v_hat - v
    proj_noise = noise @ u
    perp2 = v.square().sum() - (v @ u).square()
    terms = {
        "variance": (1 - b) ** 2 * float(noise.square().sum(-1).mean()),
        "bias": b**2 * float((delta * perp2).mean()),
        "projected_noise": (2 * b - b**2) * float((delta * proj_noise.square()).mean()),
        "cross": 2 * b * (1 - b) * float((delta * (v @ u) * proj_noise).mean()),
        "filtered": b**2 * float(((1 - delta) * v.square().sum()).mean()),
    }
    terms["total"] = sum(terms.values())
    terms["delta_bar"] = float(delta.mean())
    return terms
