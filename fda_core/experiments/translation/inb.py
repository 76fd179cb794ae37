"""Fed INB: federated Iterative Naive Barycenter translators (paper Alg. 1–3; ``docs/translation.md``).

* :class:`FedMaxKSW` — the multi-max-K-SW objective in its federated form (paper Alg. 1, eq. 2–3,
  Remark 1): clients send sorted projections (or VW-histogram quantiles), the server averages them into
  the barycenter y and sends it back, each client returns the gradient of its own term with y held
  constant, the server sums them. Batched over class problems; drives
  :func:`~fda_core.core.stiefel.armijo_cayley_maximize`.
* :class:`INBLayer` — T_m(x) = x + Θ(t_m(Θᵀx) − Θᵀx) with t_m = F_bary⁻¹ ∘ F_m per direction
  (``docs/translation.md`` § One INB layer, step 3) and its exact inverse (t_m replaced by t_m⁻¹; the
  orthogonal complement of Θ is untouched).
* :class:`FedINB` — L layers, class-conditional, any client domain to any other
  (x′ = T_{m′}⁻¹(T_m(x))), variants INB / AEINB / IndAEINB, with or without VW histograms, and the
  :class:`~fda_core.experiments.translation.comms.CommunicationLog` of everything transmitted.

Precision policy: the direction search (the expensive part: J·(1 + backtracking) evaluations per layer)
runs its projections and gradients in ``search_dtype`` (float32 by default) with Θ and the Stiefel step in
float64 (``docs/translation.md`` § One INB layer); the layer maps and the data they move are float64,
so T⁻¹(T(x)) = x to ~1e-10 even where a histogram bin is nearly empty.

Reference-code options (``docs/translation.md`` § Reference-code conventions): ``input_transform`` wraps
pixel-space INB in the probit map x ↦ Φ⁻¹(clamp(x, ε, 1 − ε)) on the way in and Φ on the way out (the
official Fed INB code's ``GaussianInverseCDF`` / ``GaussianCDF`` layers, ε = 1e-6), so translated pixels stay
in [0, 1]; ``convention="reference"`` uses the official code's objective scale (Σ_m of per-client means,
M× paper eq. 2) and its client-histogram bin rule round(√(M·n)).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor
from torch.special import ndtri

from ...common.devices import resolve_device
from ...core.barycenter import (BarycenterQuantile, ClientCDF, barycenter_grid, barycenter_quantile, default_bins,
                                fit_client_cdf, ndtr, vw_edges, vw_pseudo_samples)
from .comms import CommunicationLog
from ...core.stiefel import armijo_cayley_maximize, haar_stiefel

__all__ = ["FedMaxKSW", "INBLayer", "FedINB", "ProbitTransform", "max_k_sw_objective", "federated_gradient",
           "objective_norm", "VARIANTS", "CONVENTIONS", "INPUT_TRANSFORMS", "PROBIT_EPS"]

VARIANTS = ("INB", "AEINB", "IndAEINB")
#: whose conventions the objective scale and the client-histogram bins follow (``docs/translation.md``
#: § Reference-code conventions): the paper's formulas ("library") or the official Fed INB code ("reference")
CONVENTIONS = ("library", "reference")
#: input transforms of :class:`FedINB`: "auto" (probit for pixel-space INB on data in [0, 1], else none),
#: "probit" (x ↦ Φ⁻¹(clamp(x, ε, 1 − ε)), Φ on the way out) or "none"
INPUT_TRANSFORMS = ("auto", "probit", "none")
#: clamp of the probit transform: pixels are clamped to [ε, 1 − ε] before Φ⁻¹, as the official Fed INB code
#: does (``GaussianInverseCDF``: clamp to [1e-6, 1 − 1e-6]); Φ⁻¹(ε) = −4.753…, so the transform stays finite
PROBIT_EPS = 1e-6


def check_convention(convention: str) -> str:
    """``convention`` if it is one of :data:`CONVENTIONS`, else ValueError naming the allowed values."""
    if convention not in CONVENTIONS:
        raise ValueError(f"convention must be one of {CONVENTIONS}, got {convention!r}")
    return convention


def objective_norm(m: int, k: int, n: int, convention: str = "library") -> int:
    """The divisor of the squared residuals in the max-K-SW objective.

    "library": M·K·n, the paper's eq. 2 (F = 1/(MKn) Σ_m Σ_k Σ_i …). "reference": K·n, the official Fed INB
    code (``SlicedWassersteinDistance``: Σ_m mean over directions and samples), i.e. M× eq. 2 — the same
    maximiser, but a gradient M× larger, so the same Armijo first trial (0.1) is an M× longer step
    (``docs/translation.md`` § Reference-code conventions).
    """
    check_convention(convention)
    return m * k * n if convention == "library" else k * n


def sort_values(t: Tensor) -> Tensor:
    """``t`` sorted along its last dimension. On the CPU numpy's introsort is used (several times faster than
    ``torch.sort`` for the short rows here; the same values)."""
    if t.device.type != "cpu" or t.requires_grad:
        return t.sort(dim=-1).values
    return torch.from_numpy(np.sort(t.numpy(), axis=-1))


def argsort_last(t: Tensor) -> Tensor:
    """The permutation that sorts ``t`` along its last dimension (numpy's on the CPU: deterministic, so the same
    projections always give the same permutation)."""
    if t.device.type != "cpu" or t.requires_grad:
        return t.argsort(dim=-1)
    return torch.from_numpy(np.argsort(t.numpy(), axis=-1))


def max_k_sw_objective(x: Tensor, theta: Tensor, n_bins: int | None = None, convention: str = "library") -> Tensor:
    """The centralised multi-max-K-SW objective (paper eq. 2; with VW histograms eq. 3), differentiable.

    x: (M, n, d) or (B, M, n, d); theta: (d, K) or (B, d, K). F(Θ) = 1/(MKn) Σ_m Σ_k Σ_i
    ((θ_kᵀx_m)_[i] − y_[i],k)², y the barycenter as a *function* of Θ (the mean of the sorted projections,
    or the VW pseudo-samples of the averaged quantile edges); ``convention="reference"`` divides by K·n
    instead (:func:`objective_norm`). Returns F, shape () or (B,).
    """
    single = x.ndim == 3
    if single:
        x, theta = x[None], theta[None]
    _, m, n, _ = x.shape
    k = theta.shape[-1]
    s = torch.matmul(x, theta[:, None]).transpose(-1, -2).sort(dim=-1).values  # (B, M, K, n)
    if n_bins is None:
        y = s.mean(1, keepdim=True)
    else:
        y = vw_pseudo_samples(vw_edges(s, n_bins).mean(1, keepdim=True), n)
    f = (s - y).square().sum(dim=(1, 2, 3)) / objective_norm(m, k, n, convention)
    return f[0] if single else f


class FedMaxKSW:
    """Fed-multi-max-K-SW objective (paper Alg. 1) for B class problems, as a
    :class:`~fda_core.core.stiefel.StiefelObjective`.

    x: (B, M, n, d) client data in the search dtype (client m holds x[:, m]). Client work and server
    work are separated: the tensors passed between them go through ``log`` (see ``comms``), and the
    server only uses what it received. Clients rebuild trial projections from the broadcast gradient
    sum and the step size (paper App. C.3): X_mΘ(τ) = X_mΘ − τ X_m[G, Θ]W(τ), so one pass over the data
    per iteration (X_mG) replaces a projection per trial. ``convention`` sets the objective's scale
    (:func:`objective_norm`: 1/(MKn) as paper eq. 2, or 1/(Kn) as the official code).
    """

    stage = "max_k_sw"

    def __init__(self, x: Tensor, n_directions: int, n_bins: int | None = None, log: CommunicationLog | None = None,
                 layer: int = 0, convention: str = "library"):
        if x.ndim != 4:
            raise ValueError(f"x must have shape (B, M, n, d), got {tuple(x.shape)}")
        self.x = x
        self.b, self.m, self.n, self.d = x.shape
        self.k = n_directions
        self.n_bins = n_bins
        self.log = log
        self.layer = layer
        self.xt = x.reshape(self.b, self.m * self.n, self.d).transpose(1, 2)  # (B, d, M·n) view
        self.norm = objective_norm(self.m, self.k, self.n, convention)
        self.scale = 2.0 / self.norm
        shape = (self.b, self.k, self.m, self.n)
        self.proj = torch.zeros(shape, dtype=torch.float64, device=x.device)  # Θᵀx at the accepted Θ
        self.resid = torch.zeros(shape, dtype=x.dtype, device=x.device)  # sorted s − y
        self.xg = torch.zeros(self.b, self.k, self.m * self.n, dtype=torch.float64, device=x.device)
        self._last_rows: tuple[Tensor, Tensor, Tensor] | None = None  # (idx, x rows, xt rows), :meth:`_data_rows`

    # -- helpers ---------------------------------------------------------------------------------------
    def _up(self, tag: str, t: Tensor, client_dim: int) -> Tensor:
        return t if self.log is None else self.log.up(self.layer, self.stage, tag, t, client_dim, t.shape[0])

    def _down(self, tag: str, t: Tensor) -> Tensor:
        return t if self.log is None else self.log.down(self.layer, self.stage, tag, t, t.shape[0])

    def _rows(self, t: Tensor, idx: Tensor) -> Tensor:
        return t if idx.numel() == self.b else t.index_select(0, idx)

    def _data_rows(self, idx: Tensor) -> tuple[Tensor, Tensor]:
        """The clients' data of problems ``idx``: ``x`` and its transposed view ``xt`` (:meth:`_rows`). On the CPU the
        copies of the last set of problems are kept: the active problems change only when one converges, so one copy
        serves many iterations (the same numbers; the copies took about a quarter of a Hist INB fit). On a GPU, where
        comparing ``idx`` would wait for the device, every iteration copies."""
        if idx.numel() == self.b:
            return self.x, self.xt
        if self.x.device.type != "cpu":
            return self._rows(self.x, idx), self._rows(self.xt, idx)
        last = self._last_rows
        if last is None or last[0].shape != idx.shape or not torch.equal(last[0], idx):
            last = self._last_rows = (idx.clone(), self._rows(self.x, idx), self._rows(self.xt, idx))
        return last[1], last[2]

    # -- StiefelObjective ----------------------------------------------------------------------------
    def evaluate(self, theta: Tensor, step: tuple[Tensor, Tensor, Tensor] | None, idx: Tensor
                 ) -> tuple[Tensor, tuple[Tensor, Tensor]]:
        """One round trip at Θ for problems ``idx``: F (len(idx),) float64 and the pending state."""
        bi = idx.numel()
        if step is None:  # clients project with Θ₀ (received as theta_init)
            proj = torch.matmul(theta.transpose(1, 2).to(self.x.dtype), self._rows(self.xt, idx)).to(torch.float64)
        else:  # clients rebuild Θ(τ) from the step size (paper App. C.3)
            tau, coef, _ = step
            tau = self._down("step_size", tau)
            stacked = torch.cat([self._rows(self.xg, idx), self._rows(self.proj, idx).reshape(bi, self.k, -1)], 1)
            proj = self._rows(self.proj, idx).reshape(bi, self.k, -1) - tau[:, None, None] * torch.matmul(
                coef.transpose(1, 2), stacked)
        proj = proj.reshape(bi, self.k, self.m, self.n)
        # clients: sort each projected sample; send sorted values (Alg. 1) or VW quantiles (Def. 1)
        s = sort_values(proj)
        if self.n_bins is None:
            msg = self._up("projections", s, client_dim=2)
        else:
            msg = self._up("vw_quantiles", vw_edges(s, self.n_bins), client_dim=2)
        # server: barycenter = average quantile function; clients: y (constant from here on)
        bary = self._down("barycenter", msg.mean(2))
        y = bary if self.n_bins is None else vw_pseudo_samples(bary, self.n)
        resid = s - y[:, :, None]
        local = resid.square().sum(dim=(1, 3)) / self.norm  # d_m, (bi, M)
        f = self._up("objective", local, client_dim=1).sum(1)  # server: F = Σ_m d_m
        return f, (proj, resid.to(self.x.dtype))

    def accept(self, pending: tuple[Tensor, Tensor], ok: Tensor, idx: Tensor) -> None:
        proj, resid = pending
        self.proj[idx] = proj[ok]
        self.resid[idx] = resid[ok]

    def gradient(self, idx: Tensor) -> Tensor:
        """Σ_m ∂d_m/∂Θ with the barycenter held constant (paper Remark 1), (len(idx), d, K) float64.

        Client m: ∂d_m/∂Θ = 2/N X_mᵀR_m (N = MKn, or Kn by the reference convention), R_m the residuals
        put back in sample order (the sort permutation of the accepted projections; only accepted points need
        it, so trials sort values only).
        """
        perm = argsort_last(self._rows(self.proj, idx))
        r = torch.zeros_like(self._rows(self.resid, idx)).scatter_(-1, perm, self._rows(self.resid, idx))
        xs, xts = self._data_rows(idx)
        g_clients = self.scale * torch.matmul(r.transpose(1, 2), xs)  # (bi, M, K, d)
        g = self._up("gradient", g_clients, client_dim=1).sum(1)  # server sums, (bi, K, d)
        g = self._down("gradient_sum", g)
        # clients: X_m G for the trial projections of this iteration (G = −∂F/∂Θ is the Cayley direction)
        self.xg[idx] = -torch.matmul(g, xts).to(torch.float64)
        return g.transpose(1, 2).to(torch.float64)


def federated_gradient(x: Tensor, theta: Tensor, n_bins: int | None = None, convention: str = "library") -> Tensor:
    """Σ_m ∂d_m/∂Θ as the federated clients compute it (barycenter constant), x (B, M, n, d),
    theta (B, d, K) → (B, d, K). Paper Remark 1: equals ∂F/∂Θ of :func:`max_k_sw_objective` (plain)."""
    obj = FedMaxKSW(x, theta.shape[-1], n_bins, convention=convention)
    idx = torch.arange(x.shape[0], device=x.device)
    f, pend = obj.evaluate(theta, None, idx)
    obj.accept(pend, torch.ones_like(f, dtype=torch.bool), idx)
    return obj.gradient(idx)


@dataclass(frozen=True)
class ProbitTransform:
    """The input transform of pixel-space INB (official Fed INB code: ``IterAlignFlow.initialize`` /
    ``end``; ``docs/translation.md`` § Reference-code conventions).

    forward: z = Φ⁻¹(clamp(x, ε, 1 − ε)) — pixels in [0, 1] to R (Φ⁻¹(ε) = −4.753… for ε = 1e-6);
    inverse: x = Φ(z) — any real z back to [0, 1], so translated images are valid pixels. The pair is exactly
    invertible on [ε, 1 − ε] (Φ(Φ⁻¹(x)) = x to float64 rounding); pixels outside it (the exact 0s and 1s
    of MNIST) come back as ε or 1 − ε. Both computed in float64 (Φ by erfc, exact far into the lower tail).
    shared: a point of the shared space clamped to [Φ⁻¹(ε), Φ⁻¹(1 − ε)] before the inverse layers, as the
    official code's ``end`` layer does when it translates (Φ out of the shared space, then clamp to [ε, 1 − ε]
    and Φ⁻¹ back in; ``docs/translation.md`` § Reference-code conventions).
    """

    eps: float = PROBIT_EPS

    def __post_init__(self) -> None:
        if not 0 < self.eps < 0.5:
            raise ValueError(f"eps must be in (0, 0.5), got {self.eps}")

    def forward(self, x: Tensor) -> Tensor:
        """Φ⁻¹(clamp(x, ε, 1 − ε)), float64."""
        return ndtri(x.to(torch.float64).clamp(self.eps, 1 - self.eps))

    def inverse(self, z: Tensor) -> Tensor:
        """Φ(z) in [0, 1], float64."""
        return ndtr(z.to(torch.float64))

    def shared(self, z: Tensor) -> Tensor:
        """z clamped to [Φ⁻¹(ε), Φ⁻¹(1 − ε)] = [−4.753…, 4.753…] for ε = 1e-6, float64."""
        bound = float(-ndtri(torch.tensor(self.eps, dtype=torch.float64)))
        return z.to(torch.float64).clamp(-bound, bound)


@dataclass
class INBLayer:
    """One INB layer for G class problems and M clients (``docs/translation.md`` § One INB layer, step 3).

    theta: (G, d, K) float64; cdf: client CDFs with leading dims (G, M, K); bary: barycenter quantile
    functions with leading dims (G, K). Client m's map along direction k is t = bary ∘ cdf_m.
    """

    theta: Tensor
    cdf: ClientCDF
    bary: BarycenterQuantile

    def map_projections(self, p: Tensor, domain: int | None, inverse: bool = False, rows: Tensor | None = None) -> Tensor:
        """t_m (or t_m⁻¹) of projections p: (G', K, N) for one ``domain`` (rows = class rows, default all),
        or (G, M, K, N) for all domains at once (domain None)."""
        if domain is None:
            cdf, bary = self.cdf, self.bary.select((slice(None), None))
        else:
            sel = (slice(None) if rows is None else rows, domain)
            cdf = self.cdf.select(sel)
            bary = self.bary if rows is None else self.bary.select((rows,))
        return cdf.inverse(bary.inverse(p)) if inverse else bary.forward(cdf.forward(p))

    def apply(self, z: Tensor, domain: int, inverse: bool = False, rows: Tensor | None = None) -> Tensor:
        """T_m(z) (or T_m⁻¹) = z + Θ(t(Θᵀz) − Θᵀz) for z (G', N, d) float64 (G' = len(rows) or G)."""
        theta = self.theta if rows is None else self.theta[rows]
        p = torch.matmul(z, theta).transpose(1, 2)  # (G', K, N)
        y = self.map_projections(p, domain, inverse, rows)
        return z + torch.matmul((y - p).transpose(1, 2), theta.transpose(1, 2))

    def apply_all(self, z: Tensor) -> Tensor:
        """T_m for every client at once, z (G, M, n, d) float64 (client m's data at [:, m])."""
        p = torch.matmul(z, self.theta[:, None]).transpose(-1, -2)  # (G, M, K, n)
        y = self.map_projections(p, None)
        return z + torch.matmul((y - p).transpose(-1, -2), self.theta[:, None].transpose(-1, -2))


@dataclass
class _Block:
    """Classes with the same number of samples per client, fitted as one batch."""

    classes: list[int]
    n: int
    layers: list[INBLayer]


def _check_finite(t: Tensor, name: str) -> None:
    if not torch.isfinite(t).all():
        raise ValueError(f"{name} contains NaN or infinite values")


class FedINB:
    """Federated Iterative Naive Barycenter translator (paper Alg. 3; ``docs/translation.md``).

    Parameters
    ----------
    n_layers: L ≥ 0 INB layers. n_directions: K in [1, d]. max_iter: J ≥ 1 Stiefel iterations per layer.
    n_bins: V ≥ 2 VW-histogram bins for the direction search (None: send sorted projections).
    variant: "INB" (pixel space), "AEINB" (one shared autoencoder) or "IndAEINB" (one per client).
    autoencoders: for AE variants, a trained :class:`~fda_core.data.autoencoder.ConvAutoencoder`
    (AEINB) or a list of M of them (IndAEINB); None trains them in :meth:`fit` (``ae_epochs``).
    bary_bins: client-histogram bins B (default round(√n)); bary_grid: barycenter grid points B₂ (100);
    alpha: pseudo-count per histogram bin; tol, init_step, shrink, grow, armijo_c, max_backtracks:
    the Stiefel/Armijo settings of ``docs/translation.md`` § One INB layer; seed: Haar draws (and AE training); device: "auto" → CUDA
    when available; search_dtype: float32 (float64 possible).
    input_transform: "auto" (default: "probit" for variant INB when every training value lies in [0, 1],
    i.e. pixel data, else "none"), "probit" (layers act on Φ⁻¹(clamp(x, ε, 1 − ε)) and outputs go through Φ,
    as the official Fed INB code does for pixels; ε = :data:`PROBIT_EPS`) or "none" (layers act on x).
    convention: "library" (default; objective 1/(MKn) of paper eq. 2, client-histogram bins round(√n)) or
    "reference" (the official Fed INB code: objective M× larger, bins round(√(M·n)) as its histograms of the
    pooled M·n projections); ``docs/translation.md`` § Reference-code conventions.

    After :meth:`fit`: ``communication`` (a :class:`CommunicationLog`), ``history`` (one dict per layer
    and class: objective trace, iterations, Armijo trials), ``n_domains``, ``classes``, ``dim``,
    ``input_transform_`` (the transform used: "probit" or "none").
    """

    def __init__(self, n_layers: int = 10, n_directions: int = 10, max_iter: int = 100, n_bins: int | None = None,
                 *, variant: str = "INB", autoencoders=None, bary_bins: int | None = None, bary_grid: int = 100,
                 alpha: float = 1e-6, tol: float = 1e-6, init_step: float = 0.1, shrink: float = 0.5,
                 grow: float = 1.5, armijo_c: float = 0.5, max_backtracks: int = 40, seed: int = 0,
                 device: str | torch.device = "auto", search_dtype: torch.dtype = torch.float32,
                 ae_epochs: int = 8, ae_batch_size: int = 64, ae_lr: float = 3e-3, input_transform: str = "auto",
                 convention: str = "library"):
        if not isinstance(n_layers, int) or n_layers < 0:
            raise ValueError(f"n_layers must be an integer >= 0, got {n_layers!r}")
        if not isinstance(n_directions, int) or n_directions < 1:
            raise ValueError(f"n_directions must be an integer >= 1 (and <= d), got {n_directions!r}")
        if not isinstance(max_iter, int) or max_iter < 1:
            raise ValueError(f"max_iter must be an integer >= 1, got {max_iter!r}")
        if n_bins is not None and (not isinstance(n_bins, int) or n_bins < 2):
            raise ValueError(f"n_bins must be None or an integer >= 2, got {n_bins!r}")
        if variant not in VARIANTS:
            raise ValueError(f"variant must be one of {VARIANTS}, got {variant!r}")
        if bary_bins is not None and (not isinstance(bary_bins, int) or bary_bins < 2):
            raise ValueError(f"bary_bins must be None or an integer >= 2, got {bary_bins!r}")
        if not isinstance(bary_grid, int) or bary_grid < 2:
            raise ValueError(f"bary_grid must be an integer >= 2, got {bary_grid!r}")
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0, got {alpha}")
        if not tol >= 0:
            raise ValueError(f"tol must be >= 0, got {tol}")
        if search_dtype not in (torch.float32, torch.float64):
            raise ValueError(f"search_dtype must be torch.float32 or torch.float64, got {search_dtype}")
        if input_transform not in INPUT_TRANSFORMS:
            raise ValueError(f"input_transform must be one of {INPUT_TRANSFORMS}, got {input_transform!r}")
        if input_transform == "probit" and variant != "INB":
            raise ValueError(f"input_transform='probit' acts on pixels in [0, 1]: it needs variant 'INB', got "
                             f"{variant!r} (the AE variants work in the latent space; use 'auto' or 'none')")
        check_convention(convention)
        self.input_transform, self.convention = input_transform, convention
        self.input_transform_: str | None = None
        self._probit = ProbitTransform()
        self.n_layers, self.n_directions, self.max_iter, self.n_bins = n_layers, n_directions, max_iter, n_bins
        self.variant = variant
        self.autoencoders = autoencoders
        self.bary_bins, self.bary_grid, self.alpha = bary_bins, bary_grid, alpha
        self.armijo = dict(tol=tol, init_step=init_step, shrink=shrink, grow=grow, c=armijo_c,
                           max_backtracks=max_backtracks)
        self.seed = seed
        self.device = resolve_device(device)
        self.search_dtype = search_dtype
        self.ae = dict(epochs=ae_epochs, batch_size=ae_batch_size, lr=ae_lr)
        self.communication: CommunicationLog | None = None
        self.history: list[dict] = []
        self._blocks: list[_Block] = []

    # -- naming ----------------------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The paper's run name, e.g. ``Hist IndAEINB-L10-K10-J100-V500`` (paper Sec. 4)."""
        base = f"{'Hist ' if self.n_bins else ''}{self.variant}-L{self.n_layers}-K{self.n_directions}-J{self.max_iter}"
        return base + (f"-V{self.n_bins}" if self.n_bins else "")

    def client_bins(self, n: int, n_domains: int | None = None) -> int:
        """Client-histogram bins B of the 1-D maps for n samples per client and class: ``bary_bins`` when
        given, else round(√n) ("library") or round(√(M·n)) ("reference": the official code's ``NaiveBary``
        fits its histograms with round(√N) bins, N = M·n the pooled projections of a class). M is
        ``n_domains``, by default the number of clients of the fit."""
        if self.bary_bins is not None:
            return self.bary_bins
        if self.convention == "library":
            return default_bins(n)
        m = n_domains if n_domains is not None else getattr(self, "n_domains", None)
        if m is None:
            raise ValueError("n_domains is needed before fit() for convention='reference' (bins round(sqrt(M n)))")
        return default_bins(m * n)

    def _resolve_input_transform(self, domains: Sequence[Tensor]) -> str:
        if self.input_transform == "none" or self.variant != "INB":
            return "none"
        in_unit = all(bool(((x >= 0) & (x <= 1)).all()) for x in domains)
        if self.input_transform == "probit" and not in_unit:
            raise ValueError("input_transform='probit' needs data in [0, 1] (pixel intensities); some training "
                             "values lie outside: use input_transform='none'")
        return "probit" if in_unit else "none"

    # -- encoders --------------------------------------------------------------------------------------
    def _ae(self, domain: int):
        if self.variant == "INB":
            return None
        return self.autoencoders if self.variant == "AEINB" else self.autoencoders[domain]

    @torch.inference_mode()
    def _encode(self, x: Tensor, domain: int) -> Tensor:
        ae = self._ae(domain)
        x = x.to(self.device)
        if ae is None:
            return self._probit.forward(x) if self.input_transform_ == "probit" else x.to(torch.float64)
        out = [ae.encode(x[i:i + 4096].to(torch.float32)) for i in range(0, x.shape[0], 4096)]
        return torch.cat(out).to(torch.float64) if out else x.new_zeros(0, self.dim, dtype=torch.float64)

    @torch.inference_mode()
    def _decode(self, z: Tensor, domain: int) -> Tensor:
        ae = self._ae(domain)
        if ae is None:
            return self._probit.inverse(z) if self.input_transform_ == "probit" else z
        out = [ae.decode(z[i:i + 4096].to(torch.float32)) for i in range(0, z.shape[0], 4096)]
        return torch.cat(out) if out else z.new_zeros(0, self.input_dim, dtype=torch.float32)

    def _prepare_autoencoders(self, domains: Sequence[Tensor]) -> None:
        from ...data.autoencoder import train_autoencoder

        m = len(domains)
        if self.variant == "INB":
            return
        if any(x.shape[1] != 784 for x in domains):
            raise ValueError(f"variant {self.variant} uses the 28×28 MNIST autoencoder: domains must be (n_m, 784)")
        if self.autoencoders is None:
            if self.variant == "AEINB":
                self.autoencoders = train_autoencoder(torch.cat(list(domains)), seed=self.seed, device=self.device,
                                                      **self.ae)[0]
            else:
                self.autoencoders = [train_autoencoder(x, seed=self.seed + i, device=self.device, **self.ae)[0]
                                     for i, x in enumerate(domains)]
        if self.variant == "IndAEINB" and (not isinstance(self.autoencoders, (list, tuple)) or len(self.autoencoders) != m):
            raise ValueError(f"IndAEINB needs a list of {m} autoencoders (one per client)")
        if self.variant == "AEINB" and isinstance(self.autoencoders, (list, tuple)):
            raise ValueError("AEINB needs one shared autoencoder, not a list")
        aes = self.autoencoders if isinstance(self.autoencoders, (list, tuple)) else [self.autoencoders]
        for ae in aes:
            ae.to(self.device).eval()

    # -- fitting ---------------------------------------------------------------------------------------
    def fit(self, domains: Sequence[Tensor], labels: Sequence[Tensor] | None = None) -> FedINB:
        """Fit the translators. domains: M ≥ 2 tensors (n_m, D) (client m's data, D = 784 for the AE
        variants); labels: None (one class) or M int tensors (n_m,). Within a class every client must
        hold the same number of samples (the barycenter of paper eq. 2 pairs order statistics)."""
        domains, labels = self._check_fit_input(domains, labels)
        m = len(domains)
        self.n_domains = m
        self.input_dim = domains[0].shape[1]
        self.input_transform_ = self._resolve_input_transform(domains)
        self._prepare_autoencoders(domains)
        z_dom = [self._encode(x, i) for i, x in enumerate(domains)]
        self.dim = z_dom[0].shape[1]
        if not 1 <= self.n_directions <= self.dim:
            raise ValueError(f"n_directions must be in [1, d={self.dim}], got {self.n_directions}")
        # group per class; classes with equal per-client counts form one batched block
        classes = sorted(set(torch.cat([y.cpu() for y in labels]).tolist()))
        self.classes = classes
        by_n: dict[int, list[int]] = {}
        for c in classes:
            counts = [int((y == c).sum()) for y in labels]
            if len(set(counts)) != 1:
                raise ValueError(f"class {c} has {counts} samples on the {m} clients: every client must hold the "
                                 "same number of samples of a class (subsample to the smallest count)")
            if counts[0] < 2:
                raise ValueError(f"class {c} has {counts[0]} sample(s) per client, need >= 2")
            by_n.setdefault(counts[0], []).append(c)
        self.communication = CommunicationLog(m)
        self.history = []
        self._blocks = []
        self._class_pos: dict[int, tuple[int, int]] = {}
        gen = torch.Generator().manual_seed(self.seed)
        grid = barycenter_grid(self.bary_grid, device=self.device)
        data = []
        for n, cls in sorted(by_n.items()):
            z = torch.stack([torch.stack([zd[(y == c).to(zd.device)] for zd, y in zip(z_dom, labels)]) for c in cls])
            data.append(z)  # (G, M, n, d) float64
            for g, c in enumerate(cls):
                self._class_pos[c] = (len(self._blocks), g)
            self._blocks.append(_Block(cls, n, []))
        for layer in range(self.n_layers):
            for bi, block in enumerate(self._blocks):
                data[bi] = self._fit_layer(data[bi], block, layer, gen, grid)
        return self

    def _fit_layer(self, z: Tensor, block: _Block, layer: int, gen: torch.Generator, grid: Tensor) -> Tensor:
        g, m, n, d = z.shape
        k = self.n_directions
        log = self.communication
        # Alg. 1: server draws Θ₀ and sends it
        theta0 = log.down(layer, "max_k_sw", "theta_init", haar_stiefel(d, k, g, gen, device=self.device), g)
        obj = FedMaxKSW(z.to(self.search_dtype), k, self.n_bins, log, layer, self.convention)
        res = armijo_cayley_maximize(theta0, obj, self.max_iter, **self.armijo)
        theta = res.theta
        del obj
        # Alg. 2: per direction, client CDFs up, barycenter inverse CDF down, t_m = F_bary⁻¹ ∘ F_m
        p = torch.matmul(z, theta[:, None]).transpose(-1, -2)  # (G, M, K, n)
        cdf = fit_client_cdf(p, self.client_bins(n), self.alpha)
        log.up(layer, "barycenter", "client_cdf", torch.cat([cdf.mu[..., None], cdf.sigma[..., None], cdf.mass], -1),
               client_dim=1, n_problems=g)
        bary = barycenter_quantile(cdf, grid, client_dim=1)
        log.down(layer, "barycenter", "barycenter_quantiles", torch.cat([bary.values, bary.slope[..., None]], -1), g)
        inb = INBLayer(theta, cdf, bary)
        block.layers.append(inb)
        z = inb.apply_all(z)
        after = max_k_sw_objective(z, theta, self.n_bins, self.convention)  # F at the same Θ after the maps (Fig. 15 drops)
        for j, c in enumerate(block.classes):
            self.history.append(dict(layer=layer, label=c, n_iter=int(res.n_iter[j]), n_trials=int(res.n_trials[j]),
                                     converged=bool(res.converged[j]), objective=float(res.objective[j]),
                                     objective_after_map=float(after[j]), trace=res.trace[j]))
        return z

    def _check_fit_input(self, domains, labels) -> tuple[list[Tensor], list[Tensor]]:
        if not isinstance(domains, (list, tuple)) or len(domains) < 2:
            raise ValueError("domains must be a list of at least 2 tensors (n_m, d), one per client")
        domains = list(domains)
        for i, x in enumerate(domains):
            if not isinstance(x, Tensor) or x.ndim != 2:
                raise ValueError(f"domains[{i}] must be a 2-D tensor (n_m, d), got {getattr(x, 'shape', type(x))}")
            if x.shape[1] != domains[0].shape[1]:
                raise ValueError(f"domains[{i}] has d={x.shape[1]}, domains[0] has d={domains[0].shape[1]}")
            _check_finite(x, f"domains[{i}]")
        if labels is None:
            labels = [torch.zeros(x.shape[0], dtype=torch.long) for x in domains]
        if len(labels) != len(domains):
            raise ValueError(f"labels must have one tensor per domain ({len(domains)}), got {len(labels)}")
        labels = [torch.as_tensor(y).cpu() for y in labels]
        for i, (x, y) in enumerate(zip(domains, labels)):
            if y.ndim != 1 or y.shape[0] != x.shape[0]:
                raise ValueError(f"labels[{i}] must have shape ({x.shape[0]},), got {tuple(y.shape)}")
        return domains, labels

    # -- transforms ------------------------------------------------------------------------------------
    def _check_apply(self, x: Tensor, domain: int, labels: Tensor | None, layers: int | None, dim: int, name: str
                     ) -> tuple[Tensor, int]:
        if not self._blocks:
            raise ValueError("the translator is not fitted: call fit() first")
        if not isinstance(domain, int) or not 0 <= domain < self.n_domains:
            raise ValueError(f"domain must be an integer in [0, {self.n_domains - 1}], got {domain!r}")
        if x.ndim != 2 or x.shape[1] != dim:
            raise ValueError(f"{name} must have shape (N, {dim}), got {tuple(x.shape)}")
        _check_finite(x, name)
        layers = self.n_layers if layers is None else layers
        if not isinstance(layers, int) or not 0 <= layers <= self.n_layers:
            raise ValueError(f"layers must be an integer in [0, {self.n_layers}], got {layers!r}")
        if labels is None:
            if len(self.classes) > 1:
                raise ValueError("labels are required: the translator is class-conditional")
            labels = torch.full((x.shape[0],), self.classes[0], dtype=torch.long)
        labels = torch.as_tensor(labels).cpu()
        if labels.shape != (x.shape[0],):
            raise ValueError(f"labels must have shape ({x.shape[0]},), got {tuple(labels.shape)}")
        unknown = set(labels.unique().tolist()) - set(self.classes)
        if unknown:
            raise ValueError(f"labels contain classes not seen in fit: {sorted(unknown)}")
        return labels, layers

    def _latent(self, z: Tensor, domain: int, labels: Tensor, layers: int, inverse: bool) -> Tensor:
        out = torch.empty_like(z)
        order = range(layers - 1, -1, -1) if inverse else range(layers)
        for bi, block in enumerate(self._blocks):
            cls = [c for c in block.classes if bool((labels == c).any())]
            if not cls:
                continue
            for c in cls:  # classes of a block are applied one at a time (any number of samples each)
                g = self._class_pos[c][1]
                rows = torch.tensor([g], device=self.device)
                mask = (labels == c).to(z.device)
                zc = z[mask][None]
                for layer in order:
                    zc = block.layers[layer].apply(zc, domain, inverse, rows)
                out[mask] = zc[0]
        return out

    def _enter_shared(self, z: Tensor) -> Tensor:
        """A shared-space point on its way into the inverse layers: clamped as the official code's ``end`` layer
        does with the probit input transform (:meth:`ProbitTransform.shared`), unchanged otherwise."""
        return self._probit.shared(z) if self.input_transform_ == "probit" else z

    def transform(self, x: Tensor, domain: int, labels: Tensor | None = None, layers: int | None = None) -> Tensor:
        """T_m(x): client ``domain``'s data (N, D) → the shared (barycentric) space (N, d) float64.

        For the AE variants x is encoded with client m's (or the shared) encoder first; with the probit input
        transform (``input_transform_ == "probit"``) the layers act on Φ⁻¹(clamp(x, ε, 1 − ε)). ``layers``
        applies only the first ℓ layers."""
        labels, layers = self._check_apply(x, domain, labels, layers, self.input_dim, "x")
        return self._latent(self._encode(x, domain), domain, labels, layers, inverse=False)

    def inverse_transform(self, z: Tensor, domain: int, labels: Tensor | None = None, layers: int | None = None
                          ) -> Tensor:
        """T_m⁻¹(z): shared space (N, d) → client ``domain``'s space (N, D) (decoded for AE variants; with the
        probit input transform z is first clamped to [Φ⁻¹(ε), Φ⁻¹(1 − ε)] as the official code does, and the
        result goes through Φ, hence lies in [0, 1])."""
        labels, layers = self._check_apply(z, domain, labels, layers, self.dim, "z")
        out = self._latent(self._enter_shared(z.to(self.device, torch.float64)), domain, labels, layers, inverse=True)
        return self._decode(out, domain)

    def translate(self, x: Tensor, source: int, target: int, labels: Tensor | None = None,
                  layers: int | None = None) -> Tensor:
        """x′ = T_target⁻¹(T_source(x)) (``docs/translation.md`` § One INB layer, step 3), class-conditional, (N, D)."""
        return self.inverse_transform(self.transform(x, source, labels, layers), target, labels, layers)

    # -- batched evaluation ----------------------------------------------------------------------------
    def translate_all(self, domains: Sequence[Tensor], labels: Sequence[Tensor], depths: Sequence[int],
                      pairs: Sequence[tuple[int, int]] | None = None):
        """Translations of every client's (held-out) data to every other client after ℓ layers, for ℓ in
        ``depths``. domains/labels as in :meth:`fit`: every client holds the same number of samples of a class,
        and classes may differ in their counts (e.g. MNIST's test file). Yields (depth, source, target,
        translated (N, D) in class-sorted order, labels (N,)).

        Batched over the classes of one fitted block that hold equally many samples; the forward passes are
        shared between depths and targets.
        """
        domains, labels = self._check_fit_input(domains, labels)
        if len(domains) != self.n_domains:
            raise ValueError(f"need {self.n_domains} domains, got {len(domains)}")
        depths = sorted(set(depths))
        if any(not 0 <= dp <= self.n_layers for dp in depths):
            raise ValueError(f"depths must lie in [0, {self.n_layers}]")
        m = self.n_domains
        pairs = [(s, t) for s in range(m) for t in range(m) if s != t] if pairs is None else list(pairs)
        z_dom = [self._encode(x, i) for i, x in enumerate(domains)]
        blocks = []  # per group of one block's classes of equal count: (block, class rows, z (G', M, n, d), labels)
        for block in self._blocks:
            by_count: dict[int, list[int]] = {}
            for c in block.classes:
                counts = {int((y == c).sum()) for y in labels}
                if len(counts) != 1:
                    raise ValueError(f"translate_all needs the same number of samples of a class on every client: "
                                     f"class {c} has {sorted(counts)}")
                if (n := counts.pop()) > 0:
                    by_count.setdefault(n, []).append(c)
            for n, cls in sorted(by_count.items()):
                rows = torch.tensor([self._class_pos[c][1] for c in cls], device=self.device)
                z = torch.stack([torch.stack([zd[(y == c).to(zd.device)] for zd, y in zip(z_dom, labels)])
                                 for c in cls])
                blocks.append((block, rows, z, torch.tensor(cls).repeat_interleave(n)))
        all_labels = torch.cat([b[3] for b in blocks]) if blocks else torch.zeros(0, dtype=torch.long)
        # class-sorted output order; None where the groups already come in that order (one group per block)
        order = None if bool((all_labels[1:] >= all_labels[:-1]).all()) else torch.argsort(all_labels, stable=True)
        cur = [b[2] for b in blocks]  # forward state, depth 0
        done = 0
        for depth in depths:
            for bi, (block, rows, _, _) in enumerate(blocks):
                for layer in range(done, depth):
                    cur[bi] = self._apply_rows_all(block.layers[layer], cur[bi], rows)
            done = depth
            for s, t in pairs:
                parts, labs = [], []
                for bi, (block, rows, _, lab) in enumerate(blocks):
                    zc = self._enter_shared(cur[bi][:, s])
                    for layer in range(depth - 1, -1, -1):
                        zc = block.layers[layer].apply(zc, t, inverse=True, rows=rows)
                    parts.append(zc.reshape(-1, zc.shape[-1]))
                    labs.append(lab)
                out, lab_out = self._decode(torch.cat(parts), t), torch.cat(labs)
                if order is not None:
                    out, lab_out = out[order.to(out.device)], lab_out[order]
                yield depth, s, t, out, lab_out

    @staticmethod
    def _apply_rows_all(layer: INBLayer, z: Tensor, rows: Tensor) -> Tensor:
        if rows.numel() == layer.theta.shape[0] and bool((rows == torch.arange(rows.numel(), device=rows.device)).all()):
            return layer.apply_all(z)
        sub = INBLayer(layer.theta[rows], layer.cdf.select((rows,)), layer.bary.select((rows,)))
        return sub.apply_all(z)

    # -- summaries -------------------------------------------------------------------------------------
    def iteration_counts(self) -> dict[int, int]:
        """Per class: Armijo trials summed over layers (= objective evaluations after the first; the
        count of paper Tables 5–6, which exceeds L·J by the backtracking steps)."""
        out: dict[int, int] = {}
        for h in self.history:
            out[h["label"]] = out.get(h["label"], 0) + h["n_trials"]
        return out
