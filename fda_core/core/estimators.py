"""Unbiased estimators of the target variance and the source–target distances, and auto-β.

All from the target client's data alone (``docs/theory.md`` § Unbiased estimators; auto-weighted FDA
paper § 4.2). Split the n target points into B ≥ 2 disjoint equal parts, let g_j be the gradient on part
j and ḡ = (1/B) Σ_j g_j (= the gradient on the whole target set). For a source gradient g_S with
u = g_S/‖g_S‖ and P⊥ = I − u uᵀ:

* s² = 1/(B−1) Σ_j ‖g_j − ḡ‖²
* σ̂² = s² / B                                   unbiased for σ² = E‖g_{D_T} − g_{D̂_T}‖²
* d̂² = ‖ḡ − g_S‖² − σ̂²                          unbiased for d² = ‖g_{D_T} − g_S‖²
* (τ²d²)^ = ‖P⊥ḡ‖² − 1/(B(B−1)) Σ_j ‖P⊥(g_j − ḡ)‖²   unbiased for ‖P⊥ g_{D_T}‖² = τ²d²

A zero source vector has no direction; its projection is defined as 0 (as in FedGP), so P⊥ = I and
(τ²d²)^ estimates ‖g_{D_T}‖².
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Literal

import torch
from torch import Tensor, nn

__all__ = ["unit_directions", "estimate_deltas", "auto_beta", "split_parts", "part_gradients", "per_sample_gradients"]


def unit_directions(x: Tensor, dim: int = -1) -> Tensor:
    """The unit directions u = x/‖x‖ along ``dim`` (e.g. of each row of an (N, m) tensor of source
    gradients), with u = 0 where ‖x‖ = 0: a zero vector has no direction, so its projection is 0 (as in
    FedGP) and P⊥ = I − u uᵀ leaves everything unchanged."""
    norms = torch.linalg.vector_norm(x, dim=dim, keepdim=True)
    return torch.where(norms > 0, x / torch.where(norms > 0, norms, torch.ones_like(norms)), torch.zeros_like(x))


def _check_inputs(part_grads: Tensor, source_grads: Tensor) -> tuple[Tensor, Tensor, bool]:
    if not isinstance(part_grads, Tensor):
        raise ValueError(f"part_grads must be a tensor of shape (B, m), got {type(part_grads).__name__}")
    if not isinstance(source_grads, Tensor):
        raise ValueError(f"source_grads must be a tensor of shape (m,) or (N, m), got {type(source_grads).__name__}")
    if part_grads.ndim < 2:
        raise ValueError(f"part_grads must have shape (B, m) (or (*batch, B, m)), got {tuple(part_grads.shape)}")
    b = part_grads.shape[-2]
    if b < 2:
        raise ValueError(f"part_grads needs B >= 2 parts of the target data to estimate a variance, got B = {b}")
    if not part_grads.is_floating_point():
        part_grads = part_grads.to(torch.get_default_dtype())
    if not source_grads.is_floating_point():
        source_grads = source_grads.to(part_grads.dtype)
    single = source_grads.ndim == part_grads.ndim - 1
    if not single and source_grads.ndim != part_grads.ndim:
        raise ValueError(
            f"source_grads must have shape (m,) or (N, m) matching part_grads {tuple(part_grads.shape)}, "
            f"got {tuple(source_grads.shape)}"
        )
    src = source_grads.unsqueeze(-2) if single else source_grads
    if src.shape[-1] != part_grads.shape[-1]:
        raise ValueError(
            f"source_grads has {src.shape[-1]} parameters but part_grads has {part_grads.shape[-1]} (last dims must agree)"
        )
    if src.shape[-2] == 0:
        raise ValueError("source_grads must contain at least one source")
    try:
        torch.broadcast_shapes(src.shape[:-2], part_grads.shape[:-2])
    except RuntimeError:
        raise ValueError(
            f"batch dimensions of part_grads {tuple(part_grads.shape[:-2])} and source_grads {tuple(src.shape[:-2])} "
            "differ; with batched part_grads (*batch, B, m), pass N sources as (*batch, N, m) (e.g. expand them)"
        ) from None
    if not bool(torch.isfinite(part_grads).all()):
        raise ValueError("part_grads contains NaN or inf")
    if not bool(torch.isfinite(src).all()):
        raise ValueError("source_grads contains NaN or inf")
    return part_grads, src, single


def estimate_deltas(part_grads: Tensor, source_grads: Tensor) -> dict[str, Tensor]:
    """Raw unbiased estimates of σ², d² and τ²d² (docs/theory.md § Unbiased estimators).

    Args:
        part_grads: (B, m) gradients on B ≥ 2 disjoint equal parts of the target data; leading batch
            dims (*batch, B, m) give one estimate per batch entry (e.g. several parameter points θ ∼ π,
            whose mean stays unbiased).
        source_grads: (m,) one source or (N, m) N sources (with the same leading batch dims). The rule:
            ``source_grads.ndim == part_grads.ndim - 1`` means one source, ``==`` means N sources; so with
            batched parts (T, B, m), N sources must be given as (T, N, m) (``.expand`` costs nothing).
    Returns:
        ``{"sigma2": (*batch,), "d2": (*batch, N), "tau2d2": (*batch, N), "n_parts": B}``; for a single
        (m,) source, ``d2`` and ``tau2d2`` have shape (*batch,). The estimates are NOT clamped: they are
        unbiased and may be negative.
    """
    parts, src, single = _check_inputs(part_grads, source_grads)
    b = parts.shape[-2]
    gbar = parts.mean(dim=-2)  # ḡ (*batch, m)
    dev = parts - gbar.unsqueeze(-2)  # g_j − ḡ (*batch, B, m)
    dev_sq = dev.square().sum(dim=-1)  # ‖g_j − ḡ‖² (*batch, B)
    s2 = dev_sq.sum(dim=-1) / (b - 1)
    sigma2 = s2 / b  # σ̂² = s²/B
    d2 = (gbar.unsqueeze(-2) - src).square().sum(dim=-1) - sigma2.unsqueeze(-1)  # d̂² = ‖ḡ − g_S‖² − σ̂²

    u = unit_directions(src)
    gbar_u = torch.matmul(u, gbar.unsqueeze(-1)).squeeze(-1)  # ⟨ḡ, u⟩ (*batch, N)
    perp_gbar = gbar.square().sum(dim=-1, keepdim=True) - gbar_u.square()  # ‖P⊥ ḡ‖²
    dev_u = torch.matmul(dev, u.transpose(-1, -2))  # ⟨g_j − ḡ, u⟩ (*batch, B, N)
    perp_dev = dev_sq.sum(dim=-1, keepdim=True) - dev_u.square().sum(dim=-2)  # Σ_j ‖P⊥(g_j − ḡ)‖²
    tau2d2 = perp_gbar - perp_dev / (b * (b - 1))
    if single:
        d2, tau2d2 = d2.squeeze(-1), tau2d2.squeeze(-1)
    return {"sigma2": sigma2, "d2": d2, "tau2d2": tau2d2, "n_parts": b}


def auto_beta(
    part_grads: Tensor,
    source_grads: Tensor,
    rule: Literal["fedgp", "fedda"] = "fedgp",
    *,
    m: float = float("inf"),
    fallback: float = 0.5,
) -> Tensor:
    """β per source from the estimates (auto-weighted FDA paper § 4.2; docs/theory.md § Optimal weights).

    * FedDA: β_i = σ̂² / (σ̂² + d̂_i²)
    * FedGP: β_i = σ̂²(1 − 1/m) / (σ̂²(1 − 1/m) + (τ²d²)^_i); the default m = inf drops the 1/m term
      as the papers do.

    The raw estimates are clamped at 0 first (an estimated distance ≤ 0 gives β = 1, a zero variance
    gives β = 0). Fallback: when both numerator and denominator are 0 (σ̂² = 0 and the distance ≤ 0, a
    0/0) β = ``fallback`` (default 0.5, the midpoint, which neither trusts nor ignores the source).

    Returns:
        β of shape (*batch, N) (or (*batch,) for a single (m,) source), in [0, 1].
    """
    if rule not in ("fedgp", "fedda"):
        raise ValueError(f"rule must be 'fedgp' or 'fedda', got {rule!r}")
    if not (0.0 <= fallback <= 1.0):
        raise ValueError(f"fallback must lie in [0, 1], got {fallback!r}")
    if not (m >= 1):
        raise ValueError(f"m (number of parameters) must be >= 1, got {m!r}")
    est = estimate_deltas(part_grads, source_grads)
    sigma2 = est["sigma2"].clamp_min(0)
    dist = (est["d2"] if rule == "fedda" else est["tau2d2"]).clamp_min(0)
    sigma2 = sigma2 if dist.ndim == sigma2.ndim else sigma2.unsqueeze(-1)
    if rule == "fedgp" and m != float("inf"):
        sigma2 = sigma2 * (1.0 - 1.0 / m)
    denom = sigma2 + dist
    ok = denom > 0
    beta = torch.where(ok, sigma2 / torch.where(ok, denom, torch.ones_like(denom)), torch.full_like(denom, fallback))
    return beta.clamp(0.0, 1.0)


def split_parts(n: int, n_parts: int, *, seed: int | None = None, generator: torch.Generator | None = None) -> Tensor:
    """Indices of B disjoint equal parts of ``range(n)``, shape (B, n // B).

    The points are shuffled (with ``seed`` or ``generator``; ``seed=None`` and no generator keep the
    order) and the remainder of n mod B points is left out, so every part has the same size, as the
    estimators assume.
    """
    if not isinstance(n_parts, int) or n_parts < 2:
        raise ValueError(f"n_parts (B) must be an integer >= 2, got {n_parts!r}")
    if n < n_parts:
        raise ValueError(f"need at least one point per part: n = {n} < n_parts = {n_parts}")
    if generator is None and seed is not None:
        generator = torch.Generator().manual_seed(seed)
    order = torch.randperm(n, generator=generator) if generator is not None else torch.arange(n)
    size = n // n_parts
    return order[: size * n_parts].reshape(n_parts, size)


def _named_trainable(model: nn.Module) -> Iterator[tuple[str, nn.Parameter]]:
    return ((k, p) for k, p in model.named_parameters() if p.requires_grad)


def _functional_grad(model: nn.Module, loss_fn: Callable[[Tensor, Tensor], Tensor]):
    """(names, params, grad_fn): grad_fn(params, xb, yb) is the gradient dict of loss_fn on one batch."""
    names, params = zip(*_named_trainable(model))
    params = {k: p.detach() for k, p in zip(names, params)}
    buffers = {k: b.detach() for k, b in model.named_buffers()}

    def batch_loss(p: dict[str, Tensor], xb: Tensor, yb: Tensor) -> Tensor:
        out = torch.func.functional_call(model, (p, buffers), (xb,))
        return loss_fn(out, yb)

    return list(names), params, torch.func.grad(batch_loss)


def part_gradients(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    n_parts: int,
    *,
    seed: int | None = None,
    generator: torch.Generator | None = None,
    chunk_size: int | None = None,
) -> Tensor:
    """Gradients of the mean loss on B disjoint equal parts of (x, y), as a (B, m) tensor.

    Batched over the parts with ``torch.func.vmap(torch.func.grad(...))`` (one vectorised backward, no
    Python loop over parts). The parameters are the model's trainable ones in ``named_parameters()``
    order, flattened and concatenated (m = their total size); buffers (e.g. BatchNorm statistics) are
    used as they are and never differentiated. ``loss_fn(outputs, targets)`` must return the mean loss
    of a batch. Parts come from :func:`split_parts` (shuffled with ``seed``/``generator``).
    ``chunk_size`` limits how many parts are vectorised at once (memory).
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} points but y has {y.shape[0]}")
    idx = split_parts(x.shape[0], n_parts, seed=seed, generator=generator).to(x.device)
    names, params, grad_fn = _functional_grad(model, loss_fn)
    grads = torch.func.vmap(grad_fn, in_dims=(None, 0, 0), chunk_size=chunk_size)(params, x[idx], y[idx])
    return torch.cat([grads[k].reshape(n_parts, -1) for k in names], dim=1)


def per_sample_gradients(
    model: nn.Module,
    loss_fn: Callable[[Tensor, Tensor], Tensor],
    x: Tensor,
    y: Tensor,
    *,
    chunk_size: int | None = 256,
) -> Tensor:
    """Gradient of the loss of every single point, as an (n, m) tensor (same parameter order as
    :func:`part_gradients`). The mean of any subset of rows is the gradient on that subset (for a
    mean-reduced loss), so a pool of per-sample gradients gives exact population and subset gradients.
    """
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x has {x.shape[0]} points but y has {y.shape[0]}")
    names, params, grad_fn = _functional_grad(model, loss_fn)
    grads = torch.func.vmap(grad_fn, in_dims=(None, 0, 0), chunk_size=chunk_size)(
        params, x.unsqueeze(1), y.unsqueeze(1)
    )
    return torch.cat([grads[k].reshape(x.shape[0], -1) for k in names], dim=1)
