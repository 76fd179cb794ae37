"""Wasserstein distance between sample sets through POT (paper Sec. 4 Metrics and App. E.1; ``docs/translation.md``
§ Variants).

WD(x, y) is the optimal transport cost with the squared Euclidean ground cost between the empirical
measures of x and y (uniform weights), i.e. W₂², which is what the reference code reports
(``SinkhornDistance``: Σ π_ij ‖x_i − y_j‖², no square root). Two solvers:

* ``"emd"``: exact network simplex (``ot.emd2``);
* ``"sinkhorn"``: entropic OT, batched Sinkhorn (``ot.batch.solve_batch``), reporting the linear cost
  ⟨π_ε, C⟩; ε = ``reg`` × mean(C), so the bias is scale free (≈ +1–2 % of the exact value at reg = 0.02 on
  MNIST digits). The iterations are Sinkhorn's, started from the same point, in one of two equivalent forms
  (``docs/translation.md`` § Sinkhorn in the kernel or the log domain): on the Gibbs kernel exp(−C/ε) in
  float64 (POT's ``"sinkhorn"``) when every row and every column of C/ε has an entry ≤
  :data:`KERNEL_DOMAIN_LIMIT`, so no row or column of the kernel comes near float64 underflow; otherwise on
  −C/ε with log-sum-exp (POT's ``"log_sinkhorn"``), which never underflows. On MNIST digits both give the
  same values to ~1e-15 relative; the kernel form is about 3× faster on the CPU.

Large sets are split at random into chunks of at most ``chunk`` points per side and the chunk costs
averaged (an upper-biased estimate of the full-sample cost, standard when n² memory is too much).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

__all__ = ["wasserstein_distance", "wasserstein_distances", "squared_distances", "sinkhorn_form", "KERNEL_DOMAIN_LIMIT",
           "SINKHORN_DOMAINS"]

METHODS = ("emd", "sinkhorn")
#: largest row- and column-minimum of C/ε at which Sinkhorn runs on the kernel exp(−C/ε) (module docstring):
#: the kernel then keeps an entry ≥ e^−300 ≈ 1e−130 in every row and column, and the scalings stay below
#: ≈ e^300 · n, both far inside float64's range (≈ 1e±308)
KERNEL_DOMAIN_LIMIT = 300.0


#: values of ``sinkhorn_domain`` (:func:`wasserstein_distances`)
SINKHORN_DOMAINS = ("auto", "kernel", "log")


def sinkhorn_form(scaled_cost: Tensor, domain: str = "auto") -> str:
    """The POT method Sinkhorn runs with on a batch of C/ε (B, n, m). ``domain="auto"``: ``"sinkhorn"`` (the
    kernel domain) when every row and every column of every problem has an entry ≤ :data:`KERNEL_DOMAIN_LIMIT`,
    else ``"log_sinkhorn"``; ``"kernel"`` / ``"log"`` force one form (``"kernel"`` is refused where the kernel
    could underflow)."""
    if domain not in SINKHORN_DOMAINS:
        raise ValueError(f"sinkhorn_domain must be one of {SINKHORN_DOMAINS}, got {domain!r}")
    if domain == "log":
        return "log_sinkhorn"
    if scaled_cost.numel() == 0:
        return "sinkhorn"
    worst = max(float(scaled_cost.amin(dim=2).amax()), float(scaled_cost.amin(dim=1).amax()))
    if worst <= KERNEL_DOMAIN_LIMIT:
        return "sinkhorn"
    if domain == "kernel":
        raise ValueError(f"sinkhorn_domain='kernel' needs every row and column of C/eps to have an entry <= "
                         f"{KERNEL_DOMAIN_LIMIT:g} (got {worst:.4g}): use 'auto' or 'log'")
    return "log_sinkhorn"


def _check_pair(x: Tensor, y: Tensor, i: int) -> None:
    if x.ndim != 2 or y.ndim != 2 or x.shape[1] != y.shape[1]:
        raise ValueError(f"x and y must be (n, d) and (m, d) with the same d (pair {i}), got {tuple(x.shape)}, "
                         f"{tuple(y.shape)}")
    if x.shape[0] < 1 or y.shape[0] < 1:
        raise ValueError(f"x and y need at least one point (pair {i})")


def _chunks(n: int, k: int, gen: torch.Generator) -> list[Tensor]:
    return list(torch.randperm(n, generator=gen).tensor_split(k)) if k > 1 else [torch.arange(n)]


def squared_distances(a: Tensor, b: Tensor) -> Tensor:
    """Squared Euclidean cost matrices C_ij = ‖a_i − b_j‖², a (B, n, d), b (B, m, d) → (B, n, m) float64.

    One batched float32 GEMM (‖a‖² + ‖b‖² − 2abᵀ via ``torch.cdist``); relative error ~1e-6."""
    return torch.cdist(a.to(torch.float32), b.to(torch.float32)).to(torch.float64).square()


def wasserstein_distances(pairs: list[tuple[Tensor, Tensor]], method: str = "emd", reg: float = 0.02,
                          max_iter: int = 1000, tol: float = 1e-6, chunk: int = 1000, seed: int = 0,
                          device: str | torch.device | None = None, sinkhorn_domain: str = "auto") -> np.ndarray:
    """WD (squared-Euclidean OT cost) of each pair (x (n, d), y (m, d)); returns (len(pairs),) float64.

    Problems of equal size share one batched cost computation (and one batched Sinkhorn). ``chunk`` ≥ 2
    caps the points per side of one OT problem (random split, costs averaged weighted by chunk size);
    ``seed`` fixes the split. ``device``: where the cost matrices and the batched Sinkhorn are computed (default
    the CPU; e.g. ``"cuda"``); the exact solver always runs on the host, on costs computed there.
    ``sinkhorn_domain``: "auto" (the kernel domain where safe, else the log domain; module docstring), "kernel"
    or "log": an execution choice, the same Sinkhorn iterations and values to ~1e-15 relative.
    """
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not isinstance(chunk, int) or chunk < 2:
        raise ValueError(f"chunk must be an integer >= 2, got {chunk!r}")
    if method == "sinkhorn" and not reg > 0:
        raise ValueError(f"reg must be > 0 for Sinkhorn, got {reg}")
    if sinkhorn_domain not in SINKHORN_DOMAINS:
        raise ValueError(f"sinkhorn_domain must be one of {SINKHORN_DOMAINS}, got {sinkhorn_domain!r}")
    import ot  # imported here: POT pulls in scikit-learn and SciPy (~2.5 s), which most notebooks never need

    device = torch.device("cpu") if device is None else torch.device(device)
    gen = torch.Generator().manual_seed(seed)
    problems: list[tuple[int, float, Tensor, Tensor]] = []  # (pair index, weight, xs, ys)
    for i, (x, y) in enumerate(pairs):
        _check_pair(x, y, i)
        x, y = x.detach().cpu(), y.detach().cpu()
        k = max(math.ceil(x.shape[0] / chunk), math.ceil(y.shape[0] / chunk))
        if k > min(x.shape[0], y.shape[0]):
            raise ValueError(f"pair {i}: too few points for {k} chunks")
        if k == 1:  # one problem: the sets themselves (indexing would copy them)
            problems.append((i, 1.0, x, y))
            continue
        for a, b in zip(_chunks(x.shape[0], k, gen), _chunks(y.shape[0], k, gen)):
            problems.append((i, a.numel() / x.shape[0], x[a], y[b]))
    out = np.zeros(len(pairs))
    groups: dict[tuple[int, int], list[int]] = {}
    for j, (_, _, a, b) in enumerate(problems):
        groups.setdefault((a.shape[0], b.shape[0]), []).append(j)
    for (n, m), members in groups.items():
        a = torch.stack([problems[j][2] for j in members])
        b = torch.stack([problems[j][3] for j in members])
        cost = squared_distances(a.to(device), b.to(device))
        # NaN or ±inf in x or y make costs NaN or inf; checked on the (B, n, m) costs, a fraction of the inputs' size
        if not bool(torch.isfinite(cost.sum())):
            raise ValueError("x or y contains NaN or infinite values (or values so large that their squared "
                             "distances overflow float32)")
        if method == "emd":
            wa, wb = np.full(n, 1.0 / n), np.full(m, 1.0 / m)
            vals = [float(ot.emd2(wa, wb, c, numItermax=10_000_000)) for c in cost.cpu().numpy()]
        else:
            eps = reg * cost.mean(dim=(1, 2))  # relative ε, one per problem
            scaled = cost / eps[:, None, None]
            form = sinkhorn_form(scaled, sinkhorn_domain)
            res = ot.batch.solve_batch(scaled, reg=1.0, method=form, max_iter=max_iter, tol=tol, grad="detach")
            vals = (res.plan * cost).sum(dim=(1, 2)).tolist()
        for j, v in zip(members, vals):
            out[problems[j][0]] += problems[j][1] * v
    return out


def wasserstein_distance(x: Tensor, y: Tensor, method: str = "emd", reg: float = 0.02, max_iter: int = 1000,
                         tol: float = 1e-6, chunk: int = 1000, seed: int = 0,
                         device: str | torch.device | None = None) -> float:
    """WD between x (n, d) and y (m, d): the squared-Euclidean OT cost (W₂²), see the module docstring."""
    return float(wasserstein_distances([(x, y)], method, reg, max_iter, tol, chunk, seed, device)[0])
