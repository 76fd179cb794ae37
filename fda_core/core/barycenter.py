"""One-dimensional Wasserstein barycenters: VW histograms and strictly monotone barycenter maps.

Two pieces (``docs/translation.md`` § One INB layer and § VW histograms; paper Sec. 2.3–2.4, Def. 1, eq. 3, Alg. 2):

* **VW histograms** (variable bin width, paper Def. 1): V bins of mass 1/V whose V+1 edges are the
  quantiles F̂⁻¹(j/V) of a client's projected data. The barycenter of VW histograms is the average of
  the edges (the quantile functions average, paper Sec. 2.4); pseudo-samples of the barycenter are its
  inverse CDF at n uniform levels (paper eq. 3). With V = n the edges are the sorted samples themselves
  and everything reduces to plain Fed-multi-max-K-SW (paper App. C.2) — bit for bit here.
* **Barycenter maps** (paper Alg. 2; ``docs/translation.md`` § One INB layer, step 2): each client m models the CDF of its
  projections as F_m(z) = H_m(Φ((z − μ_m)/σ_m)), a Gaussian fitted to its mean and std (tails) followed
  by a histogram H_m on (0, 1) with B bins and a tiny pseudo-count added to every bin (strictly
  increasing), as the reference code of INB does (ddl ``IndependentDestructor`` + ``HistogramUnivariateDensity``,
  bins = round(√n)). The server forms the barycenter inverse CDF F_bary⁻¹ = Σ_m w_m F_m⁻¹ on a fixed
  quantile grid and sends it back; the client map t_m = F_bary⁻¹ ∘ F_m is strictly increasing with an
  exact inverse.

Numerics: the maps work on the normal scale s = Φ⁻¹(F(z)) with float64 and compute the lower and upper
tail probabilities separately (p and 1 − p), so points far in either tail keep full precision; beyond
|z − μ|/σ > 30 the map continues linearly (slope 1 on the s scale), so it is finite and invertible on
all of R. Shapes: every parameter tensor has leading dimensions ``...`` (e.g. (classes, clients,
directions)) and values have shape (..., N).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import torch
from torch import Tensor
from torch.special import erfc, ndtri

__all__ = ["vw_edges", "vw_pseudo_samples", "ClientCDF", "fit_client_cdf", "barycenter_grid", "BarycenterQuantile",
           "barycenter_quantile", "default_bins"]

#: |z − μ|/σ beyond which the client CDF continues linearly on the normal scale.
TAIL_R = 30.0
_SQRT1_2 = 1.0 / math.sqrt(2.0)


def ndtr(x: Tensor) -> Tensor:
    """Φ(x) = erfc(−x/√2)/2, accurate far into the lower tail (``torch.special.ndtr`` underflows to 0
    below x ≈ −9 in float64)."""
    return 0.5 * erfc(-x * _SQRT1_2)


def _interp_positions(values: Tensor, pos: Tensor) -> Tensor:
    """Linear interpolation of ``values`` (..., n) at fractional 0-based positions ``pos`` (P,) in [0, n−1].

    Integer positions return the stored value exactly (weight 0 on the neighbour), which is what makes
    VW histograms with V = n reproduce the plain algorithm bit for bit.
    """
    lo, hi, frac = _interp_index(values.shape[-1], pos)
    return _interp_at(values, lo, hi, frac)


def _interp_index(n: int, pos: Tensor) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Neighbours and weights of positions ``pos`` in a row of n values: (lo, hi, frac), with hi and frac None
    when every position is an integer (then the interpolation is an exact gather)."""
    lo = pos.floor().clamp(0, n - 1)
    frac = (pos - lo).clamp(0, 1)
    lo = lo.long()
    if not bool((frac != 0).any()):
        return lo, None, None
    return lo, (lo + 1).clamp(max=n - 1), frac


def _interp_at(values: Tensor, lo: Tensor, hi: Tensor | None, frac: Tensor | None) -> Tensor:
    """a + frac·(b − a) with a, b the values at lo, hi (exactly a where frac = 0: a + 0·(b − a) = a).

    On the CPU without autograd the gathers go through numpy (``np.take`` along the last axis is about 3×
    faster than ``index_select`` there for these short rows; same values)."""
    if values.device.type == "cpu" and not values.requires_grad:
        v = values.detach().numpy()
        if hi is None:
            return torch.from_numpy(np.take(v, lo.numpy(), axis=-1))
        a = np.take(v, lo.numpy(), axis=-1)
        out = np.take(v, hi.numpy(), axis=-1)
        out -= a
        out *= frac.numpy().astype(v.dtype, copy=False)
        out += a
        return torch.from_numpy(out)
    if hi is None:
        return values.index_select(-1, lo)
    a = values.index_select(-1, lo)
    b = values.index_select(-1, hi)
    return a + frac.to(values.dtype) * (b - a)


@lru_cache(maxsize=64)
def _vw_index(kind: str, n: int, n_bins: int, device: torch.device
              ) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Cached interpolation indices of :func:`vw_edges` (kind "edges": positions j·n/V − 1, j = 0..V, in a row
    of n sorted values) and :func:`vw_pseudo_samples` (kind "pseudo": positions i·V/n, i = 1..n, in a row of
    V + 1 edges). The same (n, V) recurs at every evaluation of a direction search."""
    if kind == "edges":
        j = torch.arange(n_bins + 1, dtype=torch.float64, device=device)
        return _interp_index(n, j * n / n_bins - 1)
    i = torch.arange(1, n + 1, dtype=torch.float64, device=device)
    return _interp_index(n_bins + 1, i * n_bins / n)


def vw_edges(sorted_values: Tensor, n_bins: int) -> Tensor:
    """VW-histogram edges (paper Def. 1): b_j = F̂⁻¹(j/V), j = 0..V, shape (..., V+1).

    ``sorted_values`` (..., n) sorted along the last dimension. F̂⁻¹ interpolates linearly between order
    statistics at 0-based position j·n/V − 1 (clamped to [0, n−1]), so b_j = x_(j) (1-based order
    statistic) whenever j·n/V is an integer and b_0 = x_(1): with V = n the edges are [x_(1), x_(1), …, x_(n)].
    """
    if not isinstance(n_bins, int) or n_bins < 2:
        raise ValueError(f"n_bins must be an integer >= 2, got {n_bins!r}")
    return _interp_at(sorted_values, *_vw_index("edges", sorted_values.shape[-1], n_bins, sorted_values.device))


def vw_pseudo_samples(edges: Tensor, n: int) -> Tensor:
    """Pseudo-samples of a VW histogram (paper eq. 3): its inverse CDF at levels i/n, i = 1..n, (..., n).

    ``edges`` (..., V+1): bin j spans [b_j, b_{j+1}] with mass 1/V and uniform density, so the inverse CDF
    at level u is the linear interpolation of the edges at position u·V. With V = n this returns
    b_1..b_n, i.e. the averaged order statistics of the plain algorithm.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return _interp_at(edges, *_vw_index("pseudo", n, edges.shape[-1] - 1, edges.device))


def default_bins(n: int) -> int:
    """Histogram bins of the client CDFs: round(√n) as in the reference code (at least 2)."""
    return max(2, int(round(math.sqrt(n))))


@dataclass
class ClientCDF:
    """Client CDFs F(z) = H(Φ((z − μ)/σ)) for a batch of 1-D distributions (paper Alg. 2, first step).

    mu, sigma: (...); mass: (..., B) histogram masses on (0, 1) (all > 0, summing to 1);
    s_lo, s_hi: (...) the normal-scale values at r = ∓TAIL_R where the linear tails start.
    What a client sends to the server is (μ, σ, mass): B + 2 numbers per direction.
    """

    mu: Tensor
    sigma: Tensor
    mass: Tensor
    s_lo: Tensor | None = None
    s_hi: Tensor | None = None

    def __post_init__(self) -> None:
        w = self.mass
        self._below = torch.cumsum(w, -1) - w  # Σ_{i<j} w_i
        self._above = torch.flip(torch.cumsum(torch.flip(w, [-1]), -1), [-1]) - w  # Σ_{i>j} w_i
        if self.s_lo is None or self.s_hi is None:
            r = torch.tensor([-TAIL_R, TAIL_R], dtype=w.dtype, device=w.device)
            s = self._s_of_r(r.expand(*w.shape[:-1], 2), tails=False)
            self.s_lo, self.s_hi = s[..., 0], s[..., 1]

    @property
    def n_bins(self) -> int:
        return self.mass.shape[-1]

    def select(self, index: tuple) -> ClientCDF:
        """The CDFs at ``index`` of the leading dimensions (e.g. ``(slice(None), m)`` for client m)."""
        return ClientCDF(self.mu[index], self.sigma[index], self.mass[index], self.s_lo[index], self.s_hi[index])

    def _s_of_r(self, r: Tensor, tails: bool = True) -> Tensor:
        """Normal-scale value s = Φ⁻¹(H(Φ(r))) of standardised points r (..., N)."""
        b = self.n_bins
        rc = r.clamp(-TAIL_R, TAIL_R)
        u, ub = ndtr(rc), ndtr(-rc)  # Φ(r) and 1 − Φ(r), each exact in its own tail
        j = torch.where(u < 0.5, torch.floor(u * b), b - 1 - torch.floor(ub * b)).clamp(0, b - 1).long()
        w = torch.gather(self.mass, -1, j)
        below = torch.gather(self._below, -1, j)
        above = torch.gather(self._above, -1, j)
        jf = j.to(r.dtype)
        p = below + (u - jf / b) * b * w
        q = above + (ub - (b - 1 - jf) / b) * b * w
        s = torch.where(p < 0.5, ndtri(p.clamp_min(0)), -ndtri(q.clamp_min(0)))
        if tails:
            s = torch.where(r > TAIL_R, self.s_hi[..., None] + (r - TAIL_R), s)
            s = torch.where(r < -TAIL_R, self.s_lo[..., None] + (r + TAIL_R), s)
        return s

    def forward(self, z: Tensor) -> Tensor:
        """s = Φ⁻¹(F(z)) for z (..., N) (float64), strictly increasing in z."""
        return self._s_of_r((z - self.mu[..., None]) / self.sigma[..., None])

    def inverse(self, s: Tensor) -> Tensor:
        """z = F⁻¹(Φ(s)) for s (..., N): the exact inverse of :meth:`forward`."""
        b = self.n_bins
        p, q = ndtr(s), ndtr(-s)
        lead = s.shape[:-1]
        edges_p = torch.cat([self._below, torch.ones_like(self.mass[..., :1])], -1)  # P_0..P_B ascending
        # Q_j = Σ_{i≥j} w_i, j = 0..B; reversed it is ascending: [Q_B = 0, Q_{B−1}, …, Q_0 = 1]
        edges_q = torch.flip(torch.cat([self._above + self.mass, torch.zeros_like(self.mass[..., :1])], -1), [-1])
        j_lo = torch.searchsorted(edges_p.expand(*lead, b + 1).contiguous(), p.contiguous(), right=True) - 1
        i_hi = torch.searchsorted(edges_q.expand(*lead, b + 1).contiguous(), q.contiguous(), right=True) - 1
        j = torch.where(p < 0.5, j_lo, b - 1 - i_hi).clamp(0, b - 1)
        w = torch.gather(self.mass.expand(*lead, b), -1, j)
        below = torch.gather(self._below.expand(*lead, b), -1, j)
        above = torch.gather(self._above.expand(*lead, b), -1, j)
        jf = j.to(s.dtype)
        u = jf / b + (p - below).clamp_min(0) / (b * w)
        ub = (b - 1 - jf) / b + (q - above).clamp_min(0) / (b * w)
        r = torch.where(u < 0.5, ndtri(u), -ndtri(ub)).clamp(-TAIL_R, TAIL_R)
        r = torch.where(s > self.s_hi[..., None], TAIL_R + (s - self.s_hi[..., None]), r)
        r = torch.where(s < self.s_lo[..., None], -TAIL_R + (s - self.s_lo[..., None]), r)
        return self.mu[..., None] + self.sigma[..., None] * r


def fit_client_cdf(z: Tensor, n_bins: int | None = None, alpha: float = 1e-6) -> ClientCDF:
    """Fit client CDFs to samples z (..., n) (float64): Gaussian (mean, std) then a B-bin histogram of
    Φ((z − μ)/σ) on (0, 1) with ``alpha`` pseudo-counts per bin (reference code: ddl histogram, alpha
    pseudo-counts; ``docs/translation.md`` § One INB layer, step 2). ``n_bins`` defaults to round(√n)."""
    n = z.shape[-1]
    b = default_bins(n) if n_bins is None else n_bins
    if not isinstance(b, int) or b < 2:
        raise ValueError(f"bary_bins must be an integer >= 2, got {n_bins!r}")
    if alpha <= 0:
        raise ValueError(f"alpha must be > 0 (keeps the CDF strictly increasing), got {alpha}")
    z = z.to(torch.float64)
    mu = z.mean(-1)
    scale = z.abs().amax(-1).clamp_min(1e-12)
    sigma = z.std(-1, correction=0).clamp_min(1e-9 * scale)  # a constant projection still gets σ > 0
    u = ndtr((z - mu[..., None]) / sigma[..., None])
    j = torch.floor(u * b).clamp(0, b - 1).long()
    counts = torch.zeros(*z.shape[:-1], b, dtype=torch.float64, device=z.device).scatter_add_(-1, j, torch.ones_like(u))
    mass = (counts + alpha) / (n + b * alpha)
    return ClientCDF(mu, sigma, mass)


def barycenter_grid(n_grid: int = 100, dtype: torch.dtype = torch.float64,
                    device: torch.device | str | None = None) -> Tensor:
    """Normal-scale knots s_j = Φ⁻¹(p_j) of the barycenter quantile grid, (n_grid,).

    p_j are the reference code's levels linspace(−0.5, 0.5, n_grid)·(1 − 1/n_grid) + 0.5 (from
    0.5/n_grid to 1 − 0.5/n_grid); the grid is fixed and known to every party, so only values travel.
    """
    if n_grid < 2:
        raise ValueError(f"bary_grid must be >= 2, got {n_grid}")
    p = torch.linspace(-0.5, 0.5, n_grid, dtype=torch.float64) * (1 - 1 / n_grid) + 0.5
    return ndtri(p).to(dtype=dtype, device=device)


@dataclass
class BarycenterQuantile:
    """Barycenter inverse CDF as a function of the normal-scale level s: piecewise linear through
    (s_j, v_j) and linear with slope σ̄ = Σ_m w_m σ_m beyond the grid (each F_m⁻¹ grows like σ_m·s).

    grid: (n_grid,); values: (..., n_grid) strictly increasing; slope: (...). The server sends
    ``values`` and ``slope``: n_grid + 1 numbers per direction.
    """

    grid: Tensor
    values: Tensor
    slope: Tensor

    def select(self, index: tuple) -> BarycenterQuantile:
        return BarycenterQuantile(self.grid, self.values[index], self.slope[index])

    def forward(self, s: Tensor) -> Tensor:
        """y = F_bary⁻¹(Φ(s)) for s (..., N)."""
        g, v = self.grid, self.values
        n = g.shape[0]
        hi = torch.searchsorted(g, s.contiguous()).clamp(1, n - 1)
        lo = hi - 1
        v_lo = torch.gather(v.expand(*s.shape[:-1], n), -1, lo)
        v_hi = torch.gather(v.expand(*s.shape[:-1], n), -1, hi)
        y = v_lo + (s - g[lo]) * (v_hi - v_lo) / (g[hi] - g[lo])
        y = torch.where(s < g[0], v[..., :1] + (s - g[0]) * self.slope[..., None], y)
        return torch.where(s > g[-1], v[..., -1:] + (s - g[-1]) * self.slope[..., None], y)

    def inverse(self, y: Tensor) -> Tensor:
        """s with forward(s) = y, for y (..., N)."""
        g, v = self.grid, self.values
        n = g.shape[0]
        ve = v.expand(*y.shape[:-1], n).contiguous()
        hi = torch.searchsorted(ve, y.contiguous()).clamp(1, n - 1)
        lo = hi - 1
        v_lo, v_hi = torch.gather(ve, -1, lo), torch.gather(ve, -1, hi)
        s = g[lo] + (y - v_lo) * (g[hi] - g[lo]) / (v_hi - v_lo)
        s = torch.where(y < ve[..., :1], g[0] + (y - ve[..., :1]) / self.slope[..., None], s)
        return torch.where(y > ve[..., -1:], g[-1] + (y - ve[..., -1:]) / self.slope[..., None], s)


def barycenter_quantile(cdfs: ClientCDF, grid: Tensor, weights: Tensor | None = None, client_dim: int = 1
                        ) -> BarycenterQuantile:
    """Server step of paper Alg. 2: F_bary⁻¹ = Σ_m w_m F_m⁻¹ on the grid (uniform weights by default).

    ``cdfs`` has a client dimension at ``client_dim`` of its leading dimensions (e.g. (G, M, K) with
    client_dim = 1); the result drops it: values (G, K, n_grid), slope (G, K).
    """
    lead = cdfs.mu.shape
    m = lead[client_dim]
    if weights is None:
        weights = torch.full((m,), 1.0 / m, dtype=torch.float64, device=cdfs.mu.device)
    weights = weights.to(torch.float64)
    if weights.shape != (m,) or (weights < 0).any() or not math.isclose(float(weights.sum()), 1.0, rel_tol=1e-9):
        raise ValueError(f"weights must be {m} non-negative numbers summing to 1")
    shape = [1] * len(lead)
    shape[client_dim] = m
    wq = cdfs.inverse(grid.expand(*lead, grid.shape[0]))  # F_m⁻¹(p_j), (..., n_grid)
    values = (wq * weights.view(*shape, 1)).sum(client_dim)
    slope = (cdfs.sigma * weights.view(*shape)).sum(client_dim)
    return BarycenterQuantile(grid, values, slope)
