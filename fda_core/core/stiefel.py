"""Optimisation on the Stiefel manifold {Θ ∈ R^{d×K}: ΘᵀΘ = I_K}: Haar initialisation, the Cayley
(Wen–Yin) step and the Armijo backtracking rule of multi-max-K-SW.

``docs/translation.md`` § One INB layer, step 1 (and the reference code of INB / SINF that it summarises):

* init: Haar-random orthonormal Θ = QR of a Gaussian matrix, columns sign-fixed by diag(R);
* step, with G = ∂(−F)/∂Θ:  Θ(τ) = Θ − τ U (I_2K + (τ/2) VᵀU)⁻¹ VᵀΘ,  U = [G, Θ], V = [Θ, −G]
  (float64; Θ(τ) stays on the manifold for every τ because it is the Cayley transform of the
  skew-symmetric A = GΘᵀ − ΘGᵀ = UVᵀ);
* Armijo: accept τ when loss(Θ(τ)) ≤ loss(Θ) + c·τ·m with m = ⟨G, −AΘ⟩ = d loss/dτ at τ = 0 (c = 0.5);
  first trial 0.1, shrink ×0.5 until accepted, grow ×1.5 after an accepted step; stop after J
  iterations or when max|ΔΘ| < 1e-6. The step is on the objective's own scale: Θ(τ) depends on τ·G only, so
  an objective c× larger (the official Fed INB code's is M× paper eq. 2) searches like ``init_step`` c× larger
  (``docs/translation.md`` § Reference-code conventions).

Everything here is batched over a leading dimension (one independent problem per class), so the ten
per-class problems of a class-conditional translator run as one computation.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch import Tensor

__all__ = ["haar_stiefel", "cayley_factors", "cayley_step", "descent_slope", "cayley_coefficients", "ArmijoResult",
           "StiefelObjective", "armijo_cayley_maximize"]


def haar_stiefel(d: int, k: int, batch: int = 1, generator: torch.Generator | None = None,
                 dtype: torch.dtype = torch.float64, device: torch.device | str | None = None) -> Tensor:
    """Haar-distributed orthonormal frames, shape (batch, d, k), ΘᵀΘ = I_k.

    ``docs/translation.md`` § One INB layer (init; Mezzadri 2007): Q of the QR decomposition of a standard
    Gaussian matrix, each column multiplied by sign(R_jj) so that the distribution is exactly Haar.
    The Gaussian draw is made on the CPU with ``generator`` (same seed → same Θ on every device).
    """
    if not (isinstance(d, int) and isinstance(k, int)) or d < 1 or not 1 <= k <= d:
        raise ValueError(f"n_directions must be in [1, d={d}], got {k}")
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    g = torch.randn(batch, d, k, generator=generator, dtype=torch.float64)
    q, r = torch.linalg.qr(g)
    sign = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    sign = torch.where(sign == 0, torch.ones_like(sign), sign)
    return (q * sign.unsqueeze(-2)).to(dtype=dtype, device=device)


def cayley_factors(theta: Tensor, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """U = [G, Θ] (…, d, 2K), VᵀU (…, 2K, 2K) and VᵀΘ (…, 2K, K) with V = [Θ, −G]
    (``docs/translation.md`` § One INB layer)."""
    u = torch.cat([grad, theta], dim=-1)
    v = torch.cat([theta, -grad], dim=-1)
    vt = v.transpose(-1, -2)
    return u, vt @ u, vt @ theta


def cayley_coefficients(vtu: Tensor, vttheta: Tensor, tau: Tensor) -> Tensor:
    """W(τ) = (I_2K + (τ/2) VᵀU)⁻¹ VᵀΘ, shape (…, 2K, K), so that Θ(τ) = Θ − τ U W(τ).

    ``tau`` has the batch shape of ``vtu`` without its last two dimensions (one step per problem).
    """
    eye = torch.eye(vtu.shape[-1], dtype=vtu.dtype, device=vtu.device)
    return torch.linalg.solve(eye + (tau / 2)[..., None, None] * vtu, vttheta)


def cayley_step(theta: Tensor, grad: Tensor, tau: Tensor | float) -> Tensor:
    """One Cayley step Θ(τ) = Θ − τ U (I + (τ/2) VᵀU)⁻¹ VᵀΘ (``docs/translation.md`` § One INB layer;
    Wen & Yin 2013, eq. 7).

    theta, grad: (…, d, K), tau: scalar or (…,). Keeps ΘᵀΘ = I_K up to rounding (compute in float64).
    """
    if theta.shape != grad.shape:
        raise ValueError(f"grad must have the shape of theta {tuple(theta.shape)}, got {tuple(grad.shape)}")
    tau = torch.as_tensor(tau, dtype=theta.dtype, device=theta.device).expand(theta.shape[:-2])
    u, vtu, vtt = cayley_factors(theta, grad)
    return theta - tau[..., None, None] * (u @ cayley_coefficients(vtu, vtt, tau))


def descent_slope(theta: Tensor, grad: Tensor) -> Tensor:
    """m = d loss(Θ(τ))/dτ at τ = 0 = ⟨G, −AΘ⟩ = ⟨G, −G + Θ GᵀΘ⟩ ≤ 0 (A = GΘᵀ − ΘGᵀ), shape (…,)."""
    return (grad * (-grad + theta @ (grad.transpose(-1, -2) @ theta))).sum(dim=(-2, -1))


@dataclass
class ArmijoResult:
    """Outcome of :func:`armijo_cayley_maximize` for B batched problems.

    theta (B, d, K) float64; objective (B,) final objective; n_iter (B,) accepted-or-final iterations
    (gradients computed); n_trials (B,) objective evaluations after the initial one (Armijo trials,
    the paper's Tables 5–6 count); trace[b] the objective after each iteration (trace[b][0] at Θ₀);
    converged (B,) stopped by max|ΔΘ| < tol (or no admissible step) before J iterations.
    """

    theta: Tensor
    objective: Tensor
    n_iter: Tensor
    n_trials: Tensor
    converged: Tensor
    trace: list[list[float]] = field(default_factory=list)


class StiefelObjective(Protocol):
    """What :func:`armijo_cayley_maximize` needs from an objective of B batched problems.

    The objective keeps the state of its accepted points itself (e.g. the sorted projections that the
    next gradient needs), so a caller can update projections cheaply from the step (Θ(τ) = Θ − τ U W).
    """

    def evaluate(self, theta: Tensor, step: tuple[Tensor, Tensor, Tensor] | None,
                 idx: Tensor) -> tuple[Tensor, Any]:
        """F (len(idx),) of the problems ``idx`` at ``theta`` (len(idx), d, K) and a pending state.

        ``step`` is None for the initial evaluation, else ``(tau, W, G)`` with Θ = Θ_acc − τ [G, Θ_acc] W.
        """

    def accept(self, pending: Any, ok: Tensor, idx: Tensor) -> None:
        """Commit the evaluated rows ``ok`` (a mask over the last evaluation) as problems ``idx``."""

    def gradient(self, idx: Tensor) -> Tensor:
        """∂F/∂Θ (len(idx), d, K) at the accepted points of problems ``idx``."""


def armijo_cayley_maximize(
    theta0: Tensor,
    objective: StiefelObjective,
    max_iter: int,
    tol: float = 1e-6,
    init_step: float = 0.1,
    shrink: float = 0.5,
    grow: float = 1.5,
    c: float = 0.5,
    max_backtracks: int = 40,
) -> ArmijoResult:
    """Maximise B objectives F_b over the Stiefel manifold by Cayley steps with Armijo backtracking.

    ``docs/translation.md`` § One INB layer (reference code: ``multimaxSWDdirection`` of INB/SINF). theta0 (B, d, K).
    The loss minimised is −F with G = −∂F/∂Θ. Each iteration: one gradient, then trials
    τ ← τ·shrink (the first one at the previous accepted τ, 0.1 at the start) until
    −F(Θ(τ)) ≤ −F(Θ) + c·τ·m; after acceptance τ ← τ·grow. A problem stops after ``max_iter``
    iterations, when max|ΔΘ| < ``tol`` after an accepted step, or when ``max_backtracks`` trials
    found no admissible step (Θ kept). Problems stop independently; stopped ones are not evaluated.
    """
    if max_iter < 0:
        raise ValueError(f"max_iter must be >= 0, got {max_iter}")
    if not 0 < shrink < 1 or grow < 1 or not 0 < c < 1 or init_step <= 0:
        raise ValueError("need 0 < shrink < 1, grow >= 1, 0 < c < 1 and init_step > 0")
    theta = theta0.to(torch.float64).clone()
    b = theta.shape[0]
    dev = theta.device
    all_idx = torch.arange(b, device=dev)
    f, pend = objective.evaluate(theta, None, all_idx)
    objective.accept(pend, torch.ones(b, dtype=torch.bool, device=dev), all_idx)
    f = f.to(torch.float64).clone()
    tau = torch.full((b,), init_step / shrink, dtype=torch.float64, device=dev)
    n_iter = torch.zeros(b, dtype=torch.long)
    n_trials = torch.zeros(b, dtype=torch.long)
    active = torch.ones(b, dtype=torch.bool)
    converged = torch.zeros(b, dtype=torch.bool)
    trace = [[v] for v in f.tolist()]
    for _ in range(max_iter):
        idx_cpu = active.nonzero().flatten()
        if idx_cpu.numel() == 0:
            break
        idx = idx_cpu.to(dev)
        th = theta[idx]
        grad = -objective.gradient(idx).to(torch.float64)  # G = ∂(−F)/∂Θ
        slope = descent_slope(th, grad)
        u, vtu, vtt = cayley_factors(th, grad)
        f0 = f[idx]
        t = tau[idx].clone()
        new_theta = th.clone()
        new_f = f0.clone()
        pending = torch.ones(idx.numel(), dtype=torch.bool, device=dev)
        for _bt in range(max_backtracks):
            p = pending.nonzero().flatten()
            t = torch.where(pending, t * shrink, t)
            coef = cayley_coefficients(vtu[p], vtt[p], t[p])
            trial = th[p] - t[p][:, None, None] * (u[p] @ coef)
            ft, pend = objective.evaluate(trial, (t[p], coef, grad[p]), idx[p])
            ft = ft.to(torch.float64)
            n_trials[idx_cpu[p.cpu()]] += 1
            ok = -ft <= -f0[p] + c * t[p] * slope[p]  # Armijo on the loss −F
            if ok.any():
                acc = p[ok]
                objective.accept(pend, ok, idx[acc])
                new_theta[acc] = trial[ok]
                new_f[acc] = ft[ok]
                pending[acc] = False
            if not pending.any():
                break
        accepted = ~pending
        step = (new_theta - th).abs().amax(dim=(-2, -1))
        theta[idx] = new_theta
        f[idx] = new_f
        # next iteration's first trial = grow × the accepted step (reference: lr *= 1.5, then lr /= 0.5, lr *= 0.5)
        tau[idx] = torch.where(accepted, t * grow / shrink, t)
        n_iter[idx_cpu] += 1
        for j, v in zip(idx_cpu.tolist(), new_f.tolist()):
            trace[j].append(v)
        stop = (pending | (step < tol)).cpu()
        converged[idx_cpu[stop]] = True
        active[idx_cpu[stop]] = False
    return ArmijoResult(theta=theta, objective=f, n_iter=n_iter, n_trials=n_trials, converged=converged,
                        trace=trace)
