"""Closed-form Delta errors of the aggregation rules, optimal β, the theory phase diagram, and a
Monte-Carlo helper that measures Δ² of any registered rule where the true target gradient is known.

Reference: spec ``theory.md`` (§ Delta errors, § Phase diagram, § Optimal weights); FedGP paper
(fedgp-gradient-projection.txt) Theorem 4.3 / Eq. for Δ²_FedDA, Δ²_FedGP and its mean-field
approximation; auto-weighted FDA paper § 4.2. β weights the SOURCE part throughout.

Notation: ``sigma2`` = σ²_π(D̂_T) (target variance), ``d2`` = d²_π(D_S, D_T) (squared source–target
distance), ``tau2`` = τ̄² ∈ [0, 1] (share of d² orthogonal to the source direction), ``delta_bar`` =
δ̄ ∈ [0, 1] (probability that the positive-projection filter keeps the source), ``m`` = number of
model parameters. All closed forms accept numpy arrays and broadcast.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from .aggregation import Rule, get_rule

__all__ = [
    "delta_target_only",
    "delta_source_only",
    "delta_fedda",
    "delta_fedgp",
    "optimal_beta_fedda",
    "optimal_beta_fedgp",
    "delta_errors_theory",
    "phase_diagram_theory",
    "THEORY_RULES",
    "KnownGradientModel",
    "GaussianGradientModel",
    "PooledGradientModel",
    "monte_carlo_delta",
    "fedgp_theorem_terms",
    "verify_delta_formulas",
    "delta_check",
]

ArrayLike = float | np.ndarray | Sequence[float]

#: Rules the theory panel compares, in tie-break order (the "axis-aligned" order of the spec).
THEORY_RULES = ("source_only", "fedda", "fedgp", "target_only")


def _arr(x: ArrayLike, name: str, lo: float = 0.0, hi: float = math.inf) -> np.ndarray | float:
    a = np.asarray(x, dtype=float)
    if not np.all(np.isfinite(a)):
        raise ValueError(f"{name} must be finite, got {x!r}")
    if np.any(a < lo) or np.any(a > hi):
        rng = f"[{lo:g}, {hi:g}]" if hi != math.inf else f">= {lo:g}"
        raise ValueError(f"{name} must be {rng}, got {x!r}")
    return a if a.ndim else float(a)


def delta_target_only(sigma2: ArrayLike) -> np.ndarray | float:
    """Δ²_target only = σ² (spec § Rules; FedGP paper § 4.1)."""
    return _arr(sigma2, "sigma2")


def delta_source_only(d2: ArrayLike) -> np.ndarray | float:
    """Δ²_source only = d² (with the weighted-average source; spec § Rules)."""
    return _arr(d2, "d2")


def delta_fedda(sigma2: ArrayLike, d2: ArrayLike, beta: ArrayLike) -> np.ndarray | float:
    """Δ²_FedDA = (1 − β)² σ² + β² d² (exact; FedGP paper Theorem 4.2, spec § Delta errors)."""
    s, d, b = _arr(sigma2, "sigma2"), _arr(d2, "d2"), _arr(beta, "beta", 0.0, 1.0)
    return (1 - b) ** 2 * s + b**2 * d


def delta_fedgp(
    sigma2: ArrayLike,
    d2: ArrayLike,
    beta: ArrayLike,
    delta_bar: ArrayLike = 1.0,
    tau2: ArrayLike = 1.0,
    m: float = math.inf,
    g_norm2: ArrayLike = 0.0,
) -> np.ndarray | float:
    """Mean-field Δ²_FedGP (FedGP paper Theorem 4.3 approximation, spec § Delta errors):

        Δ²_GP ≈ ((1 − β)² + (2β − β²) δ̄ / m) σ² + β² δ̄ τ̄² d² + β² (1 − δ̄) ‖g_T‖²

    The projected noise is ≈ σ²/m for an m-dimensional model. ``g_norm2`` = ‖g_{D_T}‖²_π enters only
    when the filter drops the source (δ̄ < 1); its default 0 gives the spec's form. The formula is exact
    when δ̂ ≡ 1 and the per-sample noise is isotropic (see :class:`GaussianGradientModel`).
    """
    s, d, b = _arr(sigma2, "sigma2"), _arr(d2, "d2"), _arr(beta, "beta", 0.0, 1.0)
    db, t2 = _arr(delta_bar, "delta_bar", 0.0, 1.0), _arr(tau2, "tau2", 0.0, 1.0)
    g2 = _arr(g_norm2, "g_norm2")
    if not m >= 1:
        raise ValueError(f"m (number of parameters) must be >= 1, got {m!r}")
    return ((1 - b) ** 2 + (2 * b - b**2) * db / m) * s + b**2 * db * t2 * d + b**2 * (1 - db) * g2


def _safe_ratio(num: np.ndarray, den: np.ndarray, fallback: float) -> np.ndarray | float:
    num, den = np.broadcast_arrays(np.asarray(num, float), np.asarray(den, float))
    out = np.full(num.shape, float(fallback))
    np.divide(num, den, out=out, where=den > 0)
    return out if out.ndim else float(out)


def optimal_beta_fedda(sigma2: ArrayLike, d2: ArrayLike, fallback: float = 0.5) -> np.ndarray | float:
    """β* = σ² / (σ² + d²), the minimiser of Δ²_FedDA (spec § Optimal weights).

    0/0 (σ² = d² = 0, every β is optimal) returns ``fallback`` (default 0.5).
    """
    s, d = _arr(sigma2, "sigma2"), _arr(d2, "d2")
    return _safe_ratio(s, np.add(s, d), fallback)


def optimal_beta_fedgp(
    sigma2: ArrayLike, tau2d2: ArrayLike, m: float = math.inf, delta_bar: ArrayLike = 1.0, fallback: float = 0.5
) -> np.ndarray | float:
    """β* minimising the mean-field Δ²_FedGP (spec § Optimal weights):

        β* = σ²(1 − δ̄/m) / (σ²(1 − δ̄/m) + δ̄ τ̄²d²)

    With δ̄ = 1 and m = inf this is the papers' σ² / (σ² + τ̄²d²). 0/0 returns ``fallback``.
    """
    s, td = _arr(sigma2, "sigma2"), _arr(tau2d2, "tau2d2")
    db = _arr(delta_bar, "delta_bar", 0.0, 1.0)
    if not m >= 1:
        raise ValueError(f"m (number of parameters) must be >= 1, got {m!r}")
    a = np.multiply(s, 1 - np.divide(db, m))
    return _safe_ratio(a, a + np.multiply(db, td), fallback)


def delta_errors_theory(
    d: ArrayLike,
    sigma: ArrayLike,
    beta: float = 0.5,
    delta_bar: float = 1.0,
    tau2: float = 0.5,
    m: float = 10,
    rules: Sequence[str] = THEORY_RULES,
) -> dict[str, np.ndarray]:
    """Closed-form Δ² of each rule on a (d, σ) grid (``d``, ``sigma`` are distances, NOT squared).

    Rules: ``source_only``, ``target_only``, ``fedda``, ``fedgp`` (with ``beta``), and ``fedda_auto``,
    ``fedgp_auto`` (with their optimal β from :func:`optimal_beta_fedda` / :func:`optimal_beta_fedgp`).
    Returns name → array of the broadcast shape of d and σ.
    """
    d_arr, s_arr = np.broadcast_arrays(_arr(d, "d"), _arr(sigma, "sigma"))
    d2, s2 = d_arr**2, s_arr**2
    out: dict[str, np.ndarray] = {}
    for r in rules:
        if r == "source_only":
            v = delta_source_only(d2)
        elif r == "target_only":
            v = delta_target_only(s2)
        elif r == "fedda":
            v = delta_fedda(s2, d2, beta)
        elif r == "fedgp":
            v = delta_fedgp(s2, d2, beta, delta_bar, tau2, m)
        elif r == "fedda_auto":
            v = delta_fedda(s2, d2, optimal_beta_fedda(s2, d2))
        elif r == "fedgp_auto":
            v = delta_fedgp(s2, d2, optimal_beta_fedgp(s2, tau2 * d2, m, delta_bar), delta_bar, tau2, m)
        else:
            raise ValueError(
                f"unknown rule {r!r} for the theory; rules must be among "
                "['source_only', 'target_only', 'fedda', 'fedgp', 'fedda_auto', 'fedgp_auto']"
            )
        out[r] = np.broadcast_to(np.asarray(v, float), d2.shape).copy()
    return out


def phase_diagram_theory(
    d: ArrayLike,
    sigma: ArrayLike,
    beta: float = 0.5,
    delta_bar: float = 1.0,
    tau2: float = 0.5,
    m: float = 10,
    rules: Sequence[str] = THEORY_RULES,
) -> np.ndarray:
    """Name of the rule with the smallest closed-form Δ² at every (d, σ) point (FedGP paper Fig. 2 left).

    ``d`` and ``sigma`` broadcast (e.g. ``d[None, :]`` and ``sigma[:, None]`` for a grid). Ties go to
    the earlier rule in ``rules``. With the paper's parameters (β = 0.5, δ̄ = 1, τ̄² = 0.5, m = 10) the
    regions are wedges in d²/σ²: source only < 1/3 < FedDA < 0.6 < FedGP < 5.4 < target only.
    Returns an array of rule names (dtype ``<U…``) of the broadcast shape.
    """
    errs = delta_errors_theory(d, sigma, beta, delta_bar, tau2, m, rules)
    names = list(errs)
    stack = np.stack([errs[r] for r in names])
    return np.asarray(names)[np.argmin(stack, axis=0)]


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
        step = max(1, (1 << 24) // max(n * m, 1))  # bound the (draws, n, m) gather to ~128 MB
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


def _z_score(mean: float, expected: float, stderr: float) -> float:
    """(mean − expected)/stderr; a deterministic quantity (stderr at rounding level) gives 0 when it
    equals the expectation to 1e-9 relative, else ±inf."""
    scale = max(1.0, abs(expected))
    if stderr > 1e-12 * scale:
        return (mean - expected) / stderr
    if math.isnan(expected):
        return float("nan")
    return 0.0 if abs(mean - expected) <= 1e-9 * scale else math.copysign(math.inf, mean - expected)


def delta_check(
    model: KnownGradientModel,
    betas: Sequence[float] = (0.25, 0.5, 0.75),
    rules: Sequence[str] = ("target_only", "source_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto"),
    n_draws: int = 4000,
    n_parts: int = 4,
    seed: int = 0,
):
    """Monte-Carlo Δ² of each rule vs its closed form, in one model with known gradients.

    Closed forms (spec theory.md § Delta errors), with the true σ² (``model.sigma2``), d² to the
    weighted-average source and τ² of that source:

    * target only σ², source only d², FedDA (1−β)²σ² + β²d²: **exact** for any gradient distribution;
    * FedGP: the **mean-field** form with the measured δ̄ (share of draws where ⟨ĝ_T, g_S⟩ > 0), τ̄² = τ²,
      m = model.m and ‖g_T‖² (single source only). It is exact only when the noise is isotropic and
      δ̂ ≡ 1. Column ``projected`` replaces the isotropic σ²/m by the model's true projected noise
      E⟨ĝ_T − g_T, u⟩² (:meth:`KnownGradientModel.projected_variance`): exact whenever δ̂ ≡ 1;
    * auto rules: the **oracle optimum** (β from the true quantities); the Monte-Carlo value uses β
      estimated from ``n_parts`` target parts, so it can only be larger in expectation.

    Returns a DataFrame: rule, beta, n_target, m, sigma2, d2, tau2, delta_bar, formula, formula_kind,
    projected, z_projected, mc_mean, mc_stderr, z = (mc − formula)/stderr, seed.
    """
    import pandas as pd

    n_src = model.source_grads.shape[0]
    g_s = model.source_grads.mean(0)
    g_t = model.target_grad
    sigma2 = float(model.sigma2)
    d2 = float((g_t - g_s).square().sum())
    u = g_s / torch.linalg.vector_norm(g_s).clamp_min(1e-300)
    tau2d2 = float(g_t.square().sum() - (u @ g_t) ** 2)
    tau2 = tau2d2 / d2 if d2 > 0 else 0.0
    rows = []
    for k, rule in enumerate(rules):
        r = get_rule(rule)
        for j, beta in enumerate(betas if r.uses_beta else [float("nan")]):
            cell_seed = seed * 1_000_003 + 100 * k + j
            mc = monte_carlo_delta(r, model, beta=None if math.isnan(beta) else beta, n_draws=n_draws,
                                   n_parts=n_parts, seed=cell_seed)
            theorem, delta_bar, kind = float("nan"), float("nan"), "exact"
            if rule == "target_only":
                formula = delta_target_only(sigma2)
            elif rule == "source_only":
                formula = delta_source_only(d2)
            elif rule == "fedda":
                formula = delta_fedda(sigma2, d2, beta)
            elif rule == "fedda_auto":
                formula, kind = delta_fedda(sigma2, d2, optimal_beta_fedda(sigma2, d2)), "oracle optimum"
            elif rule in ("fedgp", "fedgp_auto") and n_src == 1:
                # δ̄ measured on the same draws as monte_carlo_delta (same seed, same generator sequence)
                v_hat = model.draw_parts(n_draws, n_parts, torch.Generator().manual_seed(cell_seed)).mean(1)
                delta_bar = float((v_hat @ g_s > 0).double().mean())
                b = beta if rule == "fedgp" else optimal_beta_fedgp(sigma2, tau2d2, model.m)
                formula = delta_fedgp(sigma2, d2, b, delta_bar, min(tau2, 1.0), model.m,
                                      g_norm2=float(g_t.square().sum()))
                kind = "mean-field" if rule == "fedgp" else "oracle optimum (mean-field)"
                # the same expression with the true projected noise E⟨v̂ − v, u⟩² in place of δ̄σ²/m:
                # exact when δ̂ ≡ 1 (Theorem 4.3 with the cross term's mean 0), whatever the noise's shape
                proj = model.projected_variance(g_s)
                theorem = ((1 - b) ** 2 * sigma2 + b**2 * delta_bar * tau2d2
                           + (2 * b - b**2) * delta_bar * proj + b**2 * (1 - delta_bar) * float(g_t.square().sum()))
            else:
                formula, kind = float("nan"), "n/a (several sources)"
            se = mc["stderr"]
            rows.append({
                "rule": rule, "beta": beta, "n_target": model.n_target, "m": model.m, "sigma2": sigma2,
                "d2": d2, "tau2": tau2, "delta_bar": delta_bar, "formula": float(formula), "formula_kind": kind,
                "projected": theorem, "z_projected": _z_score(mc["mean"], theorem, se),
                "mc_mean": mc["mean"], "mc_stderr": se,
                "z": _z_score(mc["mean"], float(formula), se), "seed": cell_seed,
            })
    return pd.DataFrame(rows)


def verify_delta_formulas(
    m: int,
    sigma2: float,
    d2_values: Sequence[float],
    betas: Sequence[float],
    tau2: float = 0.5,
    n_target: int = 60,
    n_draws: int = 4000,
    n_parts: int = 4,
    seed: int = 0,
    rules: Sequence[str] = ("target_only", "source_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto"),
):
    """:func:`delta_check` over a sweep of d² in the Gaussian model (:meth:`GaussianGradientModel.from_geometry`).

    The target lies far from the filter boundary (δ̂ ≡ 1) and the noise is isotropic, so here the
    mean-field FedGP formula is exact too. Returns the concatenated DataFrame (one ``delta_check`` per d²).
    """
    import pandas as pd

    tables = []
    for i, d2 in enumerate(d2_values):
        model = GaussianGradientModel.from_geometry(m=m, sigma2=sigma2, d2=d2, tau2=tau2, n_target=n_target)
        tables.append(delta_check(model, betas, rules, n_draws, n_parts, seed=seed * 7919 + i))
    return pd.concat(tables, ignore_index=True)
