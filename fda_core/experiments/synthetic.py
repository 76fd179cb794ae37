"""The synthetic 9×9 phase-diagram experiment: RBF data, the 50–100–10 network, a batched trainer and
the metrics at the initialisation (``docs/experiments.md`` § Synthetic phase diagram; FedGP paper § 5 and App. B;
auto-weighted FDA paper § 5 and App. B).

Data (:func:`make_phase_diagram_data`)
    x ∈ R^50 from a mixture of 10 Gaussians (n points in 10 equal blocks, centres U(−0.5, 0.5)^50,
    identity covariance). Labels y ∈ R^10 = A φ(x) + b with 100 RBF features
    φ_i(x) = exp(−‖x − μ_i‖² / s_i), μ_i ~ U(−0.5, 0.5)^50, s_i = 100·U(0, 1), A (10×100) and
    b (10) ~ U(−0.5, 0.5). A shift level s perturbs the basis, μ ← μ + s·U(0, 1) (every entry) and
    s_i ← s_i + 100·s·U(0, 1), with fresh noise per level while x, A and b are shared: the shift is in
    P(y | x). The unshifted set D_1 is the TARGET and every level (including 0, i.e. D_1 itself) is a
    SOURCE, as in the papers' prose (the prose and the reference code disagree on which set is the source;
    the workbook follows the prose, see ``SyntheticData.describe``).
    Target training subsets of 9 sizes (paper: 14 … 1810 of 5000 points, scaled with n) are uniform
    draws without replacement; the remaining target points are that subset's test set.

Network
    50 → 100 (sigmoid) → 10, every weight and bias ~ U(−0.5, 0.5) (one initialisation θ0 per trial),
    loss = MSE averaged over points AND outputs (``nn.MSELoss()`` default ``reduction='mean'``, as in
    the reference code). Parameters are handled as one flat vector of m = 6110 entries in the order of
    ``nn.Sequential(nn.Linear(50, 100), nn.Sigmoid(), nn.Linear(100, 10)).parameters()``:
    W1 (100×50, row-major), b1 (100), W2 (10×100), b2 (10).

Training (:func:`train_grid`, reference :func:`train_single`)
    Full-batch SGD with momentum (reference: lr 0.2, momentum 0.9, 300 steps). Every step each training
    takes its target gradient g_T on its target subset and its source gradient g_S on the whole source
    set of its shift level, both at its own current parameters, and steps along ĝ of its rule:
    source only ĝ = g_S, target only ĝ = g_T, FedDA ĝ = (1−β)g_T + βg_S and FedGP
    ĝ = (1−β)g_T + β max(⟨g_T, g_S⟩, 0) g_S/‖g_S‖² (:func:`fda_core.core.aggregation.fedda` /
    :func:`~fda_core.core.aggregation.fedgp`, batched, N = 1), with β weighting the SOURCE part. Auto rules
    estimate β once at θ0 (or every ``reestimate_every`` steps) from B target parts
    (:func:`fda_core.core.estimators.auto_beta`). All trainings run together: parameters are stacked
    (trainings × m) and the forward/backward is written by hand with batched matrix products; the first
    layer of every training is one large product with the shared x. Per network-gradient on the full set
    (n = 2000, 2-core CPU, ``benchmarks/phase_diagram.py``) the hand-written batched pass takes 0.51 ms,
    ``torch.func.vmap(grad(...))`` 1.0 ms and a loop of ``nn.Module`` autograd passes 0.83 ms.

Metrics at the initialisation (:func:`init_metrics`)
    π = point mass at θ0 of each trial. The target population is the whole target set D_1 (all n
    points, as the reference code does), so σ² = E‖g_{D̂} − g_{D_1}‖² over subsets D̂ of size k drawn
    without replacement includes the finite-population factor (n − k)/(n − 1). Delta errors of every
    rule by exact Monte Carlo over random subsets and by the closed forms of :mod:`fda_core.core.theory`.

Typical use (the notebook's defaults; ≈ 1 min of training and 10 s of metrics on the 2-core CPU)::

    from fda_core import synthetic as S
    data = S.make_phase_diagram_data(n_points=2000, n_trials=1, seed=0)
    res = S.train_grid(data)            # 9 × 9 cells × 6 rules (β = 0.5): res.table, res.curves
    met = S.init_metrics(data)          # d², σ², τ²d², estimates, Δ² (Monte Carlo and closed form)
    best = S.compare_best(res, met)     # per cell: best rule by Δ² and by final test loss (panels a, b)
    steps, losses = res.curve(shift_index=4, size_index=2, method="fedgp_0.5")   # one cell's curves
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..common.checks import check_int as _check_int
from ..common.devices import resolve_device
from ..common.seeding import generator as _generator
from ..core.aggregation import fedda, fedgp
from ..core.estimators import auto_beta, estimate_deltas

__all__ = [
    "N_INPUTS",
    "N_HIDDEN",
    "N_OUTPUTS",
    "N_PARAMS",
    "N_CLUSTERS",
    "N_BASIS",
    "PAPER_N_POINTS",
    "PAPER_SUBSET_SIZES",
    "DEFAULT_S_MAX",
    "DEFAULT_SHIFT_LEVELS",
    "RULES",
    "SyntheticData",
    "make_phase_diagram_data",
    "scaled_subset_sizes",
    "init_params",
    "make_network",
    "predict",
    "mse_loss",
    "full_gradients",
    "per_sample_gradients",
    "train_single",
    "train_grid",
    "GridResult",
    "init_metrics",
    "cell_metrics",
    "method_label",
    "compare_best",
    "auto_chunk_size",
    "agreement_summary",
    "run_phase_diagram",
]

N_INPUTS, N_HIDDEN, N_OUTPUTS = 50, 100, 10
N_PARAMS = N_HIDDEN * N_INPUTS + N_HIDDEN + N_OUTPUTS * N_HIDDEN + N_OUTPUTS  # 6110
N_CLUSTERS = 10
N_BASIS = 100
PAPER_N_POINTS = 5000
PAPER_SUBSET_SIZES = (14, 27, 49, 90, 164, 299, 546, 994, 1810)
#: Largest shift level of the default grid; see :data:`DEFAULT_SHIFT_LEVELS`.
DEFAULT_S_MAX = 0.5
#: Default shift levels np.linspace(0, DEFAULT_S_MAX, 9) = 0, 0.0625, …, 0.5. The papers do not give
#: their values; s_max was calibrated on d²/σ² at θ0 (seeds 0–2, n = 2000 and 5000). d² grows like
#: ≈ s² up to s ≈ 0.3 and saturates (at 2–6) beyond s ≈ 0.75; σ² spans ≈ 180× over the 9 subset sizes.
#: Seed 0, n = 2000: d² = 0.037 (level 1) … 1.7 (level 8), σ² = 6.7 (k = 6) … 0.037 (k = 724), so
#: d²/σ² over the 72 shifted cells spans 0.005 … 45 and crosses every wedge of the closed-form
#: argmin (β = 0.5, m = 6110, measured τ̄² ≈ 0.7–0.95: source only below d²/σ² ≈ 0.3, FedGP up to
#: τ̄²d²/σ² ≈ 3, target only above). Counting the closed-form winners on 3 seeds × 81 cells, s_max = 0.5
#: splits the grid most evenly (n = 2000: 88 source only / 99 FedGP / 56 target only; n = 5000:
#: 69 / 88 / 83, 3 FedDA); s_max = 0.3 leaves half the grid to source only, s_max ≥ 0.8 mostly adds
#: target-only cells (d² saturates).
DEFAULT_SHIFT_LEVELS = tuple(float(v) for v in np.linspace(0.0, DEFAULT_S_MAX, 9))
#: Rules of the synthetic experiment (β-rules take every β of ``betas``).
RULES = ("source_only", "target_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto")
_BETA_RULES = ("fedda", "fedgp")
_AUTO_RULES = ("fedda_auto", "fedgp_auto")

# slices of the flat parameter vector
_W1 = slice(0, N_HIDDEN * N_INPUTS)
_B1 = slice(_W1.stop, _W1.stop + N_HIDDEN)
_W2 = slice(_B1.stop, _B1.stop + N_OUTPUTS * N_HIDDEN)
_B2 = slice(_W2.stop, _W2.stop + N_OUTPUTS)

# seed streams (tags of numpy SeedSequence entropy)
_TAG_DATA, _TAG_SUBSETS, _TAG_INIT, _TAG_METRICS = 0, 1, 2, 3




# =============================================================================================
# Data
# =============================================================================================
def scaled_subset_sizes(n_points: int, sizes: Sequence[int] = PAPER_SUBSET_SIZES,
                        reference_n: int = PAPER_N_POINTS, minimum: int = 4) -> tuple[int, ...]:
    """The paper's subset sizes (of 5000 points) scaled to ``n_points``: round(k·n/5000), at least
    ``minimum`` and strictly increasing (a size equal to the previous one is raised by 1).

    >>> scaled_subset_sizes(2000)
    (6, 11, 20, 36, 66, 120, 218, 398, 724)
    """
    out: list[int] = []
    for k in sizes:
        v = max(minimum, int(round(k * n_points / reference_n)))
        if out and v <= out[-1]:
            v = out[-1] + 1
        out.append(v)
    if out and out[-1] >= n_points:
        raise ValueError(
            f"n_points = {n_points} is too small for {len(out)} distinct subset sizes >= {minimum} that leave "
            f"a test set (largest scaled size {out[-1]})"
        )
    return tuple(out)


@dataclass
class SyntheticData:
    """The data of the phase-diagram experiment (all tensors on one device, labels in ``dtype``).

    Attributes:
        x: (n, 50) inputs, shared by the target and every source.
        y_target: (n, 10) labels of the unshifted target set D_1.
        y_sources: (S, n, 10) labels of the source set of each shift level (``y_sources[i]`` is level
            ``shift_levels[i]``; a level of 0 reproduces ``y_target`` exactly).
        shift_levels: (S,) numpy array of the shift levels s.
        subset_sizes: the K target training-subset sizes.
        n_trials: number of trials T (each with its own subsets and its own network initialisation).
        subset_idx: (K, T, k_max) int64 indices of the training subset of size index j and trial t in
            its first ``subset_sizes[j]`` positions (random order; padded with 0 after that).
        subset_mask: (K, T, k_max) bool, True on the valid positions of ``subset_idx``.
        test_mask: (K, T, n) bool, True on the target test points (every point not in the subset).
        cluster: (n,) int64 mixture component of each point.
        centres: (10, 50) mixture centres.
        rbf_centres: (S + 1, 100, 50) μ of the unshifted basis (index 0) and of each shift level.
        rbf_widths: (S + 1, 100) s_i likewise.
        A: (10, 100), b: (10,) the linear read-out of the features.
        seed: the seed everything was drawn from.
    """

    x: Tensor
    y_target: Tensor
    y_sources: Tensor
    shift_levels: np.ndarray
    subset_sizes: tuple[int, ...]
    n_trials: int
    subset_idx: Tensor
    subset_mask: Tensor
    test_mask: Tensor
    cluster: Tensor
    centres: Tensor
    rbf_centres: Tensor
    rbf_widths: Tensor
    A: Tensor
    b: Tensor
    seed: int

    @property
    def n_points(self) -> int:
        return int(self.x.shape[0])

    @property
    def n_shifts(self) -> int:
        return int(self.y_sources.shape[0])

    @property
    def n_sizes(self) -> int:
        return len(self.subset_sizes)

    @property
    def device(self) -> torch.device:
        return self.x.device

    @property
    def dtype(self) -> torch.dtype:
        return self.x.dtype

    def train_indices(self, size_index: int, trial: int = 0) -> Tensor:
        """Indices (k,) of the target training subset of size index ``size_index`` in ``trial``."""
        self._check_cell(size_index=size_index, trial=trial)
        return self.subset_idx[size_index, trial, : self.subset_sizes[size_index]]

    def test_indices(self, size_index: int, trial: int = 0) -> Tensor:
        """Indices of the target test set (the complement of the training subset)."""
        self._check_cell(size_index=size_index, trial=trial)
        return torch.nonzero(self.test_mask[size_index, trial]).flatten()

    def _check_cell(self, *, size_index: int | None = None, trial: int | None = None,
                    shift_index: int | None = None) -> None:
        for name, v, hi in (("size_index", size_index, self.n_sizes), ("trial", trial, self.n_trials),
                            ("shift_index", shift_index, self.n_shifts)):
            if v is not None and not (isinstance(v, (int, np.integer)) and 0 <= v < hi):
                raise ValueError(f"{name} must be an integer in [0, {hi - 1}], got {v!r}")

    def to(self, device: str | torch.device | None = None, dtype: torch.dtype | None = None) -> SyntheticData:
        """A copy with the float tensors in ``dtype`` and everything on ``device``."""
        dev = resolve_device(device) if device is not None else self.device
        out = {}
        for f in self.__dataclass_fields__:
            v = getattr(self, f)
            if isinstance(v, Tensor):
                v = v.to(dev, dtype=dtype) if (dtype is not None and v.is_floating_point()) else v.to(dev)
            out[f] = v
        return SyntheticData(**out)

    def describe(self) -> str:
        """The setting in words, and how it differs from the papers'."""
        n, k = self.n_points, self.subset_sizes
        levels = ", ".join(f"{v:g}" for v in self.shift_levels)
        scaled = "" if n == PAPER_N_POINTS else (
            f" Subset sizes are the paper's scaled by n/5000 = {n / PAPER_N_POINTS:g} (at least 4, distinct)."
        )
        return (
            f"Synthetic phase diagram (FedGP paper § 5 / App. B): n = {n} points x ∈ R^50 from a mixture of "
            f"{N_CLUSTERS} Gaussians (centres U(-0.5,0.5)^50, identity covariance); y ∈ R^10 = A·φ(x) + b with "
            f"{N_BASIS} RBF features exp(-‖x-μ_i‖²/s_i), μ ~ U(-0.5,0.5)^50, s_i = 100·U(0,1), A, b ~ U(-0.5,0.5). "
            f"Shift level s: μ += s·U(0,1), s_i += 100·s·U(0,1), fresh noise per level, x/A/b shared (shift in "
            f"P(y|x)). Shift levels: [{levels}] (the papers do not give them; chosen so that d²/σ² at the "
            f"initialisation crosses every wedge of the theory). Target = the UNSHIFTED set D_1 and the sources "
            f"are all levels (level 0 is D_1 itself), following the papers' prose (the papers' prose and "
            f"their reference code disagree on which set is the source; this workbook follows the prose). Target training subsets of sizes {list(k)} (paper: "
            f"{list(PAPER_SUBSET_SIZES)} of 5000), uniform without replacement, the rest of D_1 is the test "
            f"set; {self.n_trials} trial(s) (paper: 3), each with fresh subsets and its own initialisation."
            f"{scaled} Network 50-100-10, sigmoid, U(-0.5,0.5) init of weights and biases, MSE averaged over "
            f"points and outputs. Metrics at the initialisation take the whole target set (test points "
            f"included) as the population, as the reference code does. Seed {self.seed}."
        )




def _rbf_labels(x: Tensor, mu: Tensor, width: Tensor, A: Tensor, b: Tensor) -> Tensor:
    """y = A φ(x) + b with φ_i(x) = exp(−‖x − μ_i‖²/s_i); x (n, 50), mu (100, 50), width (100,)."""
    dist2 = (x.square().sum(1, keepdim=True) + mu.square().sum(1) - 2.0 * (x @ mu.T)).clamp_min(0.0)
    phi = torch.exp(-dist2 / width)
    return phi @ A.T + b


def make_phase_diagram_data(
    n_points: int = PAPER_N_POINTS,
    shift_levels: Sequence[float] | np.ndarray | None = None,
    subset_sizes: Sequence[int] | None = None,
    n_trials: int = 1,
    seed: int = 0,
    *,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> SyntheticData:
    """Generate the target set, one source set per shift level, and the target training subsets.

    Deterministic: everything is drawn on the CPU in float64 from ``torch.Generator`` streams derived
    from ``seed`` (data; subsets of each trial), then cast to ``dtype`` and moved to ``device``. The same
    seed gives identical tensors; adding trials or levels leaves the earlier ones unchanged.

    Args:
        n_points: size n of every set (split into 10 mixture blocks of n // 10 or n // 10 + 1 points).
        shift_levels: shift levels s ≥ 0 (default :data:`DEFAULT_SHIFT_LEVELS`, 9 levels from 0 to
            :data:`DEFAULT_S_MAX`).
        subset_sizes: target training-subset sizes, each in [2, n − 1] (default: the paper's 14 … 1810
            scaled to n by :func:`scaled_subset_sizes`).
        n_trials: trials; each draws its own subsets (and, in training, its own initialisation).
        seed: the seed.
    Raises:
        ValueError naming the parameter on bad input.
    """
    n = _check_int(n_points, "n_points", N_CLUSTERS)
    levels = np.asarray(DEFAULT_SHIFT_LEVELS if shift_levels is None else shift_levels, dtype=float)
    if levels.ndim != 1 or levels.size == 0:
        raise ValueError(f"shift_levels must be a non-empty 1-D sequence of numbers, got {shift_levels!r}")
    if not np.all(np.isfinite(levels)) or np.any(levels < 0):
        raise ValueError(f"shift_levels must be finite and >= 0, got {shift_levels!r}")
    if subset_sizes is None:
        sizes = scaled_subset_sizes(n)
    else:
        if isinstance(subset_sizes, (int, np.integer)) or len(subset_sizes) == 0:
            raise ValueError(f"subset_sizes must be a non-empty sequence of integers, got {subset_sizes!r}")
        sizes = tuple(_check_int(k, "subset_sizes", 2) for k in subset_sizes)
        too_big = [k for k in sizes if k >= n]
        if too_big:
            raise ValueError(
                f"subset_sizes {too_big} are larger than the target set allows: each must be <= n_points - 1 = "
                f"{n - 1} (the rest of the target set is the test set)"
            )
    trials = _check_int(n_trials, "n_trials", 1)
    seed = _check_int(seed, "seed", 0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")

    f64 = torch.float64
    g = _generator(seed, _TAG_DATA)
    centres = torch.rand(N_CLUSTERS, N_INPUTS, generator=g, dtype=f64) - 0.5
    cluster = torch.arange(n) * N_CLUSTERS // n  # 10 (nearly) equal consecutive blocks
    x = centres[cluster] + torch.randn(n, N_INPUTS, generator=g, dtype=f64)
    mu = torch.rand(N_BASIS, N_INPUTS, generator=g, dtype=f64) - 0.5
    width = 100.0 * torch.rand(N_BASIS, generator=g, dtype=f64)
    A = torch.rand(N_OUTPUTS, N_BASIS, generator=g, dtype=f64) - 0.5
    b = torch.rand(N_OUTPUTS, generator=g, dtype=f64) - 0.5
    y_target = _rbf_labels(x, mu, width, A, b)
    mus, widths, ys = [mu], [width], []
    for i, s in enumerate(levels):
        gi = _generator(seed, _TAG_DATA, 1 + i)  # fresh noise per level, independent of the other levels
        mu_s = mu + float(s) * torch.rand(N_BASIS, N_INPUTS, generator=gi, dtype=f64)
        width_s = width + 100.0 * float(s) * torch.rand(N_BASIS, generator=gi, dtype=f64)
        mus.append(mu_s)
        widths.append(width_s)
        ys.append(y_target.clone() if s == 0 else _rbf_labels(x, mu_s, width_s, A, b))

    k_max = max(sizes)
    subset_idx = torch.zeros(len(sizes), trials, k_max, dtype=torch.int64)
    subset_mask = torch.zeros(len(sizes), trials, k_max, dtype=torch.bool)
    test_mask = torch.ones(len(sizes), trials, n, dtype=torch.bool)
    for t in range(trials):
        for j, k in enumerate(sizes):
            idx = torch.randperm(n, generator=_generator(seed, _TAG_SUBSETS, t, j))[:k]
            subset_idx[j, t, :k] = idx
            subset_mask[j, t, :k] = True
            test_mask[j, t, idx] = False

    data = SyntheticData(
        x=x, y_target=y_target, y_sources=torch.stack(ys), shift_levels=levels, subset_sizes=sizes,
        n_trials=trials, subset_idx=subset_idx, subset_mask=subset_mask, test_mask=test_mask, cluster=cluster,
        centres=centres, rbf_centres=torch.stack(mus), rbf_widths=torch.stack(widths), A=A, b=b, seed=seed,
    )
    return data.to(device, dtype)


# =============================================================================================
# Network: flat parameters, hand-written batched forward/backward
# =============================================================================================
def init_params(data_or_seed: SyntheticData | int, trial: int = 0, *, dtype: torch.dtype | None = None,
                device: str | torch.device | None = None) -> Tensor:
    """The initialisation θ0 (m,) of a trial: every weight and bias ~ U(−0.5, 0.5).

    Drawn on the CPU in float64 from a stream derived from (seed, trial), then cast; the same for every
    shift level, subset size and rule of the trial (π = point mass at θ0).
    """
    seed = data_or_seed.seed if isinstance(data_or_seed, SyntheticData) else _check_int(data_or_seed, "seed", 0)
    trial = _check_int(trial, "trial", 0)
    if dtype is None:
        dtype = data_or_seed.dtype if isinstance(data_or_seed, SyntheticData) else torch.float32
    if device is None:
        device = data_or_seed.device if isinstance(data_or_seed, SyntheticData) else "cpu"
    theta = torch.rand(N_PARAMS, generator=_generator(seed, _TAG_INIT, trial), dtype=torch.float64) - 0.5
    return theta.to(device=device, dtype=dtype)


def _views(theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """W1 (..., 100, 50), b1 (..., 100), W2 (..., 10, 100), b2 (..., 10) views of flat θ (..., m)."""
    lead = theta.shape[:-1]
    return (theta[..., _W1].reshape(*lead, N_HIDDEN, N_INPUTS), theta[..., _B1],
            theta[..., _W2].reshape(*lead, N_OUTPUTS, N_HIDDEN), theta[..., _B2])


def make_network(theta: Tensor | None = None) -> nn.Sequential:
    """``nn.Sequential(Linear(50, 100), Sigmoid(), Linear(100, 10))`` holding the flat parameters θ."""
    net = nn.Sequential(nn.Linear(N_INPUTS, N_HIDDEN), nn.Sigmoid(), nn.Linear(N_HIDDEN, N_OUTPUTS))
    if theta is not None:
        if theta.shape != (N_PARAMS,):
            raise ValueError(f"theta must have shape ({N_PARAMS},), got {tuple(theta.shape)}")
        net = net.to(device=theta.device, dtype=theta.dtype)
        torch.nn.utils.vector_to_parameters(theta.detach().clone(), net.parameters())
    return net


class _Workspace:
    """Reused scratch tensors of a chunk: the large (C, 100, n) activations are allocated once instead
    of every step (on the CPU each fresh allocation of several MB costs first-touch page faults)."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        buf = self._bufs.get(name)
        if buf is None or buf.shape != torch.Size(shape) or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(shape, dtype=like.dtype, device=like.device)
            self._bufs[name] = buf
        return buf


def _forward(theta: Tensor, x: Tensor, ws: _Workspace | None = None, tag: str = "") -> tuple[Tensor, Tensor]:
    """Hidden activations H (C, 100, k) and outputs (C, 10, k) of C stacked networks θ (C, m).

    ``x`` (k, 50) is shared by all networks (one large matrix product for the first layer) or
    (C, k, 50) per network (batched products). Layout: points last, so every product is a plain (b)mm.
    With a workspace ``ws`` the results live in its buffers ``tag + "H"``/``tag + "out"`` (valid until
    the next call with the same tag).
    """
    W1, b1, W2, b2 = _views(theta)
    C, k = theta.shape[0], x.shape[-2]
    if x.ndim == 2:
        z_out = ws.get(tag + "H", (C * N_HIDDEN, k), theta) if ws is not None else None
        Z = torch.matmul(W1.reshape(C * N_HIDDEN, N_INPUTS), x.T, out=z_out).view(C, N_HIDDEN, k)
    else:
        z_out = ws.get(tag + "H", (C, N_HIDDEN, k), theta) if ws is not None else None
        Z = torch.bmm(W1, x.transpose(1, 2), out=z_out)
    H = Z.add_(b1.unsqueeze(-1)).sigmoid_()
    o_out = ws.get(tag + "out", (C, N_OUTPUTS, k), theta) if ws is not None else None
    out = torch.baddbmm(b2.unsqueeze(-1), W2, H, out=o_out)
    return H, out


def _backward(theta: Tensor, x: Tensor, H: Tensor, dout: Tensor, ws: _Workspace | None = None,
              tag: str = "") -> Tensor:
    """Gradients (C, G, m) for G output-gradient channels dout (C, G, 10, k) (dL/d outputs).

    Hand-written backward of :func:`_forward`; ``x`` as there. dout already holds the per-point loss
    weights, so each channel is the gradient of its own weighted loss.
    """
    _, _, W2, _ = _views(theta)
    C, G, _, k = dout.shape
    W2t = W2.transpose(1, 2)
    if G == 1:
        d = dout[:, 0]
        dW2 = torch.bmm(d, H.transpose(1, 2)).unsqueeze(1)
        dh_out = ws.get(tag + "dH", (C, N_HIDDEN, k), theta) if ws is not None else None
        dH = torch.bmm(W2t, d, out=dh_out).unsqueeze(1)
    else:
        dW2 = torch.matmul(dout, H.transpose(1, 2).unsqueeze(1))
        dH = torch.matmul(W2t.unsqueeze(1), dout)
    Hg = H.unsqueeze(1)
    dZ = dH.mul_(Hg)
    dZ.addcmul_(dZ, Hg, value=-1.0)  # dH·σ'(z) with σ'(z) = H(1 − H), in place
    if x.ndim == 2:
        dW1 = torch.matmul(dZ.reshape(C * G * N_HIDDEN, k), x).view(C, G, N_HIDDEN * N_INPUTS)
    else:
        dW1 = torch.matmul(dZ, x.unsqueeze(1)).reshape(C, G, N_HIDDEN * N_INPUTS)
    return torch.cat([dW1, dZ.sum(-1), dW2.reshape(C, G, -1), dout.sum(-1)], dim=-1)


def _set_gradient(theta: Tensor, x: Tensor, y_t: Tensor, ws: _Workspace | None = None, tag: str = "s",
                  on_output: Any = None) -> Tensor:
    """MSE gradients (C, m) of C networks θ (C, m) on a whole set shared by all: x (n, 50), labels
    y_t (C, 10, n) or (10, n) (points last). ``on_output(out)`` sees the outputs (C, 10, n) first (the
    trainer records its test loss there). The trainer's source pass."""
    H, out = _forward(theta, x, ws, tag)
    if on_output is not None:
        on_output(out)
    r = out.sub_(y_t).mul_(2.0 / (N_OUTPUTS * x.shape[0]))
    return _backward(theta, x, H, r.unsqueeze(1), ws, tag)[:, 0]


def predict(theta: Tensor, x: Tensor) -> Tensor:
    """Network outputs: θ (m,) → (n, 10); stacked θ (C, m) → (C, n, 10)."""
    single = theta.ndim == 1
    th = theta.unsqueeze(0) if single else theta
    _, out = _forward(th, x)
    out = out.transpose(1, 2)
    return out[0] if single else out


def mse_loss(theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """MSE averaged over points and outputs (``nn.MSELoss()``): scalar for θ (m,), (C,) for θ (C, m)."""
    return (predict(theta, x) - y).square().mean(dim=(-1, -2))


def full_gradients(theta: Tensor, x: Tensor, y: Tensor, weights: Tensor | None = None) -> Tensor:
    """Gradient of the MSE of θ on (x, y), batched.

    Args:
        theta: (m,) or (C, m).
        x: (n, 50) shared inputs.
        y: (n, 10) labels, or (C, n, 10) one label set per network.
        weights: optional per-point weights (n,) or (C, n) or (C, G, n) (a weighted mean: each channel's
            weights should sum to 1); default uniform 1/n.
    Returns:
        (m,), (C, m) or (C, G, m).
    """
    single = theta.ndim == 1
    th = theta.unsqueeze(0) if single else theta
    C, n = th.shape[0], x.shape[0]
    y_t = y.transpose(-1, -2) if y.ndim == 3 else y.T
    if weights is None:
        g = _set_gradient(th, x, y_t)
        return g[0] if single else g
    H, out = _forward(th, x)
    r = out - y_t
    w = weights.to(x.dtype)
    w = w.expand(C, 1, n) if w.ndim == 1 else (w.unsqueeze(1) if w.ndim == 2 else w)
    dout = (2.0 / N_OUTPUTS) * r.unsqueeze(1) * w.unsqueeze(2)
    g = _backward(th, x, H, dout)
    if weights.ndim < 3:
        g = g[:, 0]
        return g[0] if single else g
    return g


def per_sample_gradients(theta: Tensor, x: Tensor, y: Tensor, *, chunk: int = 4096) -> Tensor:
    """Gradient (n, m) of the loss of every single point, (1/10)‖f(x_i) − y_i‖² (so the mean of any
    set of rows is the MSE gradient on that set). θ (m,), x (n, 50), y (n, 10)."""
    W1, b1, W2, b2 = _views(theta)
    out_rows = []
    for a in range(0, x.shape[0], chunk):
        xb, yb = x[a:a + chunk], y[a:a + chunk]
        h = torch.sigmoid(xb @ W1.T + b1)  # (c, 100)
        dout = (2.0 / N_OUTPUTS) * (h @ W2.T + b2 - yb)  # (c, 10)
        dz = (dout @ W2) * h * (1.0 - h)  # (c, 100)
        rows = torch.cat([
            (dz.unsqueeze(2) * xb.unsqueeze(1)).reshape(xb.shape[0], -1), dz,
            (dout.unsqueeze(2) * h.unsqueeze(1)).reshape(xb.shape[0], -1), dout,
        ], dim=1)
        out_rows.append(rows)
    return torch.cat(out_rows)


# =============================================================================================
# Rules and methods
# =============================================================================================
def method_label(rule: str, beta: float | None = None) -> str:
    """The name of a (rule, β) pair in result tables: ``"fedda_0.5"``, ``"fedgp_auto"``, ``"source_only"``."""
    return f"{rule}_{beta:g}" if rule in _BETA_RULES else rule


def _methods(rules: Sequence[str], betas: Sequence[float]) -> list[tuple[str, float]]:
    """[(rule, β)] with β = NaN for rules without a fixed β; validates names and values."""
    if isinstance(rules, str) or not isinstance(rules, Iterable):
        raise ValueError(f"rules must be a sequence of rule names from {list(RULES)}, got {rules!r}")
    rules = list(rules)
    if not rules:
        raise ValueError(f"rules must name at least one rule from {list(RULES)}; the grid is empty")
    for r in rules:
        if r not in RULES:
            raise ValueError(f"unknown rule {r!r}; rules must be among {list(RULES)}")
    if len(set(rules)) != len(rules):
        raise ValueError(f"rules contains duplicates: {rules}")
    if any(r in _BETA_RULES for r in rules):
        if isinstance(betas, (int, float)) or betas is None:
            raise ValueError(f"betas must be a sequence of numbers in [0, 1], got {betas!r}")
        betas = [float(b) for b in betas]
        if not betas:
            raise ValueError("betas must hold at least one β for the rules fedda/fedgp; the grid is empty")
        for b in betas:
            if not (0.0 <= b <= 1.0):
                raise ValueError(f"betas must lie in [0, 1] (β weights the source part), got {b!r}")
    out: list[tuple[str, float]] = []
    for r in rules:
        if r in _BETA_RULES:
            out.extend((r, b) for b in dict.fromkeys(betas))
        else:
            out.append((r, math.nan))
    return out


def _indices(values: Sequence[int] | None, n: int, name: str) -> list[int]:
    if values is None:
        return list(range(n))
    if isinstance(values, (int, np.integer)):
        values = [values]
    vals = list(values)
    if not vals:
        raise ValueError(f"{name} is empty; the grid is empty")
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < n:
            raise ValueError(f"{name} must hold integers in [0, {n - 1}], got {v!r}")
    return [int(v) for v in dict.fromkeys(vals)]


# =============================================================================================
# Batched trainer
# =============================================================================================
_CPU_BUDGET = 8 << 20  # bytes of one (chunk × 100 × n) activation tensor on the CPU (cache-sized)
_CUDA_BUDGET = 1 << 30


def auto_chunk_size(n_points: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    budget_bytes: int | None = None) -> int:
    """Trainings per chunk so that one (chunk, 100, n) activation tensor takes ``budget_bytes``.

    Default budgets: 8 MiB on the CPU (10 trainings per chunk at n = 2000, 4 at n = 5000) and 1 GiB on
    CUDA (as many trainings at once as possible; the peak use is ≈ 4 such tensors). Measured on the
    2-core CI machine (ms per training-step, ``benchmarks/phase_diagram.py``): n = 2000 — chunk 1: 1.00,
    4: 0.63, 8: 0.60, 16: 0.59, 32: 0.65, 64: 0.65; n = 5000 — chunk 2: 1.47, 4: 1.38, 8: 1.37, 16: 1.50,
    32: 1.67. One at a time pays the per-step Python and aggregation overhead; large chunks stream their
    (chunk, 100, n) activations through memory several times per step instead of through the caches.
    The CUDA budget is not measured yet (no GPU was available).
    """
    dev = resolve_device(device)
    budget = budget_bytes if budget_bytes is not None else (_CUDA_BUDGET if dev.type == "cuda" else _CPU_BUDGET)
    per = N_HIDDEN * max(int(n_points), 1) * torch.tensor([], dtype=dtype).element_size()
    return int(max(1, min(4096, budget // per)))


@dataclass
class _Trajectory:
    """One training actually run. Rows of the result table that provably coincide share it."""

    trial: int
    kind: str  # "source_only" | "target_only" | "fedda" | "fedgp"
    shift: int  # -1: no source
    size: int  # -1: no target subset
    beta: float  # fixed β (NaN for auto), 1 for source only, 0 for target only
    auto: bool
    eval_sizes: list[int] = field(default_factory=list)  # test masks evaluated (size indices)

    @property
    def needs_source(self) -> bool:
        return self.kind != "target_only"

    @property
    def needs_target(self) -> bool:
        return self.kind != "source_only"


@dataclass
class GridResult:
    """Result of :func:`train_grid`.

    Attributes:
        table: one row per (trial, shift level, subset size, method) — columns ``row`` (index into
            ``curves``), ``trial``, ``shift_index``, ``shift``, ``size_index``, ``subset_size``, ``rule``,
            ``beta`` (the fixed β of fedda/fedgp, NaN otherwise), ``method`` (``method_label``),
            ``beta_used`` (β of the training: the fixed β; for auto rules the estimate at θ0, or the mean
            of the estimates with ``reestimate_every``; 1 for source only, 0 for target only),
            ``beta_init`` (auto: the estimate at θ0), ``initial_test_loss``, ``final_test_loss``,
            ``min_test_loss``, ``diverged`` (non-finite final loss: the training blew up, lr too large;
            it is frozen at NaN, the other trainings go on), ``trajectory`` (id of the training run; rows that provably coincide —
            target only at every shift level, source only at every subset size — share one).
        curves: (rows, E) target test MSE at ``eval_steps`` (after that many updates).
        eval_steps: (E,) the steps of the curve (0, eval_every, …, steps).
        config: the arguments of the run.
        timing: wall time, number of trainings run, chunk size, device.
    """

    table: Any
    curves: np.ndarray
    eval_steps: np.ndarray
    config: dict
    timing: dict

    def curves_long(self):
        """The curves as a long table: the key columns of ``table`` plus ``step`` and ``test_loss``."""
        import pandas as pd

        keys = ["row", "trial", "shift_index", "shift", "size_index", "subset_size", "rule", "beta", "method"]
        n_e = len(self.eval_steps)
        base = self.table[keys].loc[self.table.index.repeat(n_e)].reset_index(drop=True)
        base["step"] = np.tile(self.eval_steps, len(self.table))
        base["test_loss"] = self.curves.reshape(-1)
        return pd.DataFrame(base)

    def curve(self, shift_index: int, size_index: int, method: str, trial: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """(eval_steps, losses) of one cell and method; losses (trials, E), or (E,) for one ``trial``."""
        t = self.table
        sel = (t["shift_index"] == shift_index) & (t["size_index"] == size_index) & (t["method"] == method)
        if trial is not None:
            sel &= t["trial"] == trial
        rows = t.loc[sel, "row"].to_numpy()
        if rows.size == 0:
            raise ValueError(
                f"no training for shift_index={shift_index}, size_index={size_index}, method={method!r}"
                + (f", trial={trial}" if trial is not None else "") + f"; methods: {sorted(t['method'].unique())}"
            )
        c = self.curves[rows]
        return self.eval_steps, (c[0] if trial is not None else c)

    def mean_table(self):
        """``table`` averaged over trials: one row per (shift level, subset size, method)."""
        keys = ["shift_index", "shift", "size_index", "subset_size", "rule", "beta", "method"]
        vals = ["beta_used", "initial_test_loss", "final_test_loss", "min_test_loss"]
        g = self.table.groupby(keys, dropna=False, sort=False)
        out = g[vals].mean().reset_index()
        out["n_trials"] = g.size().to_numpy()
        out["final_test_loss_std"] = g["final_test_loss"].std(ddof=1).to_numpy()
        return out


def _family_indices(kinds: list[str], device: torch.device) -> list[tuple[str, Tensor | None]]:
    """[(kind, index tensor or None when the kind covers the whole chunk)]."""
    out = []
    for kind in ("source_only", "target_only", "fedda", "fedgp"):
        idx = [i for i, k in enumerate(kinds) if k == kind]
        if idx:
            out.append((kind, None if len(idx) == len(kinds) else torch.tensor(idx, device=device)))
    return out


def _run_chunk(trajs: list[_Trajectory], data: SyntheticData, theta0: dict[int, Tensor], cfg: dict,
               eval_steps: np.ndarray, bar: Any) -> tuple[Tensor, Tensor, Tensor]:
    """Train the C trajectories of one chunk together; returns losses (C, E_max, n_evals) and β at θ0
    and mean β (C,)."""
    dev, dt = data.device, data.dtype
    C, n, steps = len(trajs), data.n_points, cfg["steps"]
    lr, mom, B, reest = cfg["lr"], cfg["momentum"], cfg["n_parts"], cfg["reestimate_every"]
    x = data.x
    theta = torch.stack([theta0[t.trial] for t in trajs]).clone()
    buf = torch.zeros_like(theta)
    needs_s = trajs[0].needs_source
    needs_t = trajs[0].needs_target
    kinds = [t.kind for t in trajs]
    families = _family_indices(kinds, dev)
    beta = torch.tensor([t.beta for t in trajs], dtype=dt, device=dev)
    auto_idx = {rule: [i for i, t in enumerate(trajs) if t.auto and t.kind == rule] for rule in _BETA_RULES}
    auto_idx = {r: torch.tensor(v, device=dev) for r, v in auto_idx.items() if v}
    beta_init = beta.clone()
    beta_sum = torch.zeros_like(beta)
    n_est = 0
    y_t = data.y_target.T  # (10, n)

    if needs_s:
        ys = data.y_sources.transpose(1, 2)[torch.tensor([t.shift for t in trajs], device=dev)]  # (C, 10, n)
    if needs_t:
        ks = [data.subset_sizes[t.size] for t in trajs]
        k_max = max(ks)
        idx = torch.stack([data.subset_idx[t.size, t.trial, :k_max] for t in trajs])  # (C, k_max)
        mask = torch.arange(k_max, device=dev).unsqueeze(0) < torch.tensor(ks, device=dev).unsqueeze(1)
        xt = x[idx]  # (C, k_max, 50)
        yt = data.y_target[idx].transpose(1, 2)  # (C, 10, k_max)
        w_t = (mask.to(dt) / torch.tensor(ks, dtype=dt, device=dev).unsqueeze(1)).unsqueeze(1)  # (C, 1, k_max)
        if auto_idx:
            q = torch.tensor([k // B for k in ks], device=dev)
            if bool((q < 1).any()):
                raise ValueError(f"auto rules need subsets of at least n_parts = {B} points, got sizes {sorted(set(ks))}")
            pos = torch.arange(k_max, device=dev)
            part_of = pos.unsqueeze(0) // q.unsqueeze(1)  # (C, k_max): the part of each position
            parts_w = (part_of.unsqueeze(1) == torch.arange(B, device=dev).view(1, B, 1)).to(dt)
            parts_w = parts_w / q.to(dt).view(C, 1, 1)  # positions ≥ q·B belong to no part (weight 0)
            w_est = torch.cat([w_t, parts_w], dim=1)  # (C, 1 + B, k_max)
    e_max = max(len(t.eval_sizes) for t in trajs)
    test_w = torch.zeros(C, e_max, n, dtype=dt, device=dev)
    for i, t in enumerate(trajs):
        for e, j in enumerate(t.eval_sizes):
            m_ = data.test_mask[j, t.trial].to(dt)
            test_w[i, e] = m_ / m_.sum()
    losses = torch.full((C, e_max, len(eval_steps)), float("nan"), dtype=dt, device=dev)
    eval_pos = {int(s): e for e, s in enumerate(eval_steps)}
    two_over_o = 2.0 / N_OUTPUTS

    def record(out: Tensor, step: int) -> None:
        sq = (out - y_t).square_().sum(1) / N_OUTPUTS  # (C, n)
        losses[:, :, eval_pos[step]] = torch.bmm(test_w, sq.unsqueeze(-1)).squeeze(-1)

    g_s = g_t = None
    ws = _Workspace()
    for step in range(steps + 1):
        is_eval = step in eval_pos
        if needs_s and step < steps:
            g_s = _set_gradient(theta, x, ys, ws, "s", (lambda o: record(o, step)) if is_eval else None)
        elif is_eval:
            _, out = _forward(theta, x, ws, "s")
            record(out, step)
            del out
        if step == steps:
            break
        estimate = bool(auto_idx) and (step == 0 or (reest is not None and step % reest == 0))
        if needs_t:
            Ht, outt = _forward(theta, xt, ws, "t")
            rt = outt.sub_(yt).mul_(two_over_o)
            w = w_est if estimate else w_t
            g = _backward(theta, xt, Ht, rt.unsqueeze(1) * w.unsqueeze(2), ws, "t")
            g_t = g[:, 0]
            if estimate:
                for rule, ix in auto_idx.items():
                    # (non-finite inputs only come from diverged trainings, which are frozen below)
                    b_ = auto_beta(torch.nan_to_num(g[ix, 1:], 0.0, 0.0, 0.0), torch.nan_to_num(g_s[ix], 0.0, 0.0, 0.0),
                                   rule=rule).to(dt)
                    beta[ix] = torch.where(torch.isfinite(b_), b_, torch.full_like(b_, 0.5))
                if step == 0:
                    beta_init = beta.clone()
                beta_sum += beta
                n_est += 1
            del Ht, outt, rt, g
        # a diverged training (non-finite gradient or ‖g‖²; lr too large) is frozen at NaN instead of stopping
        # the run: its losses read NaN and its row is flagged ``diverged``
        bad = None
        for g_ in (g_s if needs_s else None, g_t if needs_t else None):
            if g_ is not None:
                ok = torch.isfinite(g_.square().sum(1))  # also catches norms² that overflow
                bad = ~ok if bad is None else bad | ~ok
        if bool(bad.any()):
            if needs_s:
                g_s = torch.where(bad.unsqueeze(1), torch.zeros_like(g_s), g_s)
            if needs_t:
                g_t = torch.where(bad.unsqueeze(1), torch.zeros_like(g_t), g_t)
        else:
            bad = None
        ghat = torch.empty_like(theta) if len(families) > 1 else None
        for kind, ix in families:
            if kind == "source_only":
                val = g_s if ix is None else g_s[ix]
            elif kind == "target_only":
                val = g_t if ix is None else g_t[ix]
            else:
                fn = fedda if kind == "fedda" else fedgp
                gs_, gt_, b_ = (g_s, g_t, beta) if ix is None else (g_s[ix], g_t[ix], beta[ix])
                val = fn(gs_.unsqueeze(1), gt_, b_.unsqueeze(1))
            if ix is None:
                ghat = val
            else:
                ghat[ix] = val
        buf.mul_(mom).add_(ghat)
        theta.add_(buf, alpha=-lr)
        if bad is not None:
            theta[bad] = float("nan")
        if bar is not None:
            bar.update(C)
    beta_mean = beta_sum / n_est if n_est else beta_init
    return losses, beta_init, beta_mean


def train_grid(
    data: SyntheticData,
    *,
    rules: Sequence[str] = RULES,
    betas: Sequence[float] = (0.5,),
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    n_parts: int = 2,
    reestimate_every: int | None = None,
    eval_every: int = 10,
    trials: Sequence[int] | None = None,
    shift_indices: Sequence[int] | None = None,
    size_indices: Sequence[int] | None = None,
    device: str | torch.device = "auto",
    dtype: torch.dtype | None = None,
    chunk_size: int | None = None,
    dedupe: bool = True,
    progress: bool = True,
) -> GridResult:
    """Train every (trial, shift level, subset size, rule, β) of the grid, many trainings at once.

    Each training: θ ← θ0 of its trial; every step g_T on its target subset, g_S on the whole source set
    of its shift level (both at its own θ), ĝ by its rule (``fda_core.core.aggregation.fedda``/``fedgp``,
    batched with N = 1; source only g_S; target only g_T), then SGD with momentum (``torch.optim.SGD``
    semantics: buf ← momentum·buf + ĝ, θ ← θ − lr·buf). Auto rules take β from
    :func:`fda_core.core.estimators.auto_beta` on the gradients of ``n_parts`` disjoint equal parts of the
    subset (consecutive blocks of its random order; k mod B points left out of the parts, not of g_T)
    at θ0, and again every ``reestimate_every`` steps when given. The target test MSE (the target
    points outside the subset) is recorded every ``eval_every`` steps and after the last one.

    Trainings run in chunks of ``chunk_size`` (default :func:`auto_chunk_size`: cache-sized on the CPU,
    large on CUDA) with stacked parameters and hand-written batched forward/backward passes; chunks hold
    trainings of one kind (with a source, target only, source only) sorted by subset size. With
    ``dedupe`` (default) trainings that are provably identical run once: target only does not depend on
    the shift level and source only not on the subset (only its test set does).

    Cost (2-core CI machine, float32): the default grid (9 × 9 cells × 6 rules = 486 trainings, 342 run,
    n = 2000, 300 steps) ≈ 55 s, ≈ 0.54 ms per training-step; 3 trials ≈ 165 s; n = 5000 ≈ 1.3 ms per
    training-step (the paper's 3 trials × 486 trainings × 300 steps ≈ 10 min by extrapolation).

    Args:
        data: from :func:`make_phase_diagram_data`.
        rules: among :data:`RULES`; ``fedda``/``fedgp`` run once per β of ``betas``.
        steps, lr, momentum: optimiser (reference: 300, 0.2, 0.9).
        n_parts: B ≥ 2 target parts for the auto rules.
        reestimate_every: re-estimate auto β every this many steps (None: only at θ0).
        eval_every: steps between test-loss evaluations.
        trials, shift_indices, size_indices: sub-grids (default: all).
        device: ``"auto"`` (CUDA when present), ``"cpu"`` or ``"cuda"``.
        dtype: float dtype of the run (default: the data's).
        chunk_size: trainings per chunk (default automatic per device).
        dedupe: run provably identical trainings once.
        progress: show a tqdm bar over training steps.
    Returns:
        :class:`GridResult` (table, curves, eval_steps, config, timing).
    Raises:
        ValueError naming the parameter (unknown rule, steps < 1, empty grid, …).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    if not isinstance(data, SyntheticData):
        raise ValueError(f"data must be a SyntheticData from make_phase_diagram_data, got {type(data).__name__}")
    methods = _methods(rules, betas)
    steps = _check_int(steps, "steps", 1)
    eval_every = _check_int(eval_every, "eval_every", 1)
    n_parts = _check_int(n_parts, "n_parts", 2)
    if reestimate_every is not None:
        reestimate_every = _check_int(reestimate_every, "reestimate_every", 1)
    for name, v in (("lr", lr), ("momentum", momentum)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {v!r}")
    if lr == 0:
        raise ValueError("lr must be > 0")
    trials_ = _indices(trials, data.n_trials, "trials")
    shifts = _indices(shift_indices, data.n_shifts, "shift_indices")
    sizes = _indices(size_indices, data.n_sizes, "size_indices")
    dev = resolve_device(device)
    dt = data.dtype if dtype is None else dtype
    if not isinstance(dt, torch.dtype) or not dt.is_floating_point:
        raise ValueError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if chunk_size is None:
        chunk = auto_chunk_size(data.n_points, dev, dt)
    else:
        chunk = _check_int(chunk_size, "chunk_size", 1)
    if any(r in _AUTO_RULES for r, _ in methods):
        small = [data.subset_sizes[j] for j in sizes if data.subset_sizes[j] < n_parts]
        if small:
            raise ValueError(f"n_parts = {n_parts} is larger than the subset sizes {small} (auto rules need k >= n_parts)")
    data = data.to(dev, dt)
    t_start = time.perf_counter()

    # rows of the table and the trajectories behind them
    rows, trajs, row_slot = [], [], []
    key_to_traj: dict[tuple, int] = {}
    for t in trials_:
        for s in shifts:
            for j in sizes:
                for rule, b in methods:
                    auto = rule in _AUTO_RULES
                    kind = rule[: -len("_auto")] if auto else rule
                    if kind == "source_only":
                        key = ("S", t, s) if dedupe else ("row", len(rows))
                        traj = _Trajectory(t, kind, s, -1, 1.0, False)
                    elif kind == "target_only":
                        key = ("T", t, j) if dedupe else ("row", len(rows))
                        traj = _Trajectory(t, kind, -1, j, 0.0, False)
                    else:
                        key = ("row", len(rows))
                        traj = _Trajectory(t, kind, s, j, 0.5 if auto else b, auto)
                    if key not in key_to_traj:
                        key_to_traj[key] = len(trajs)
                        trajs.append(traj)
                    ti = key_to_traj[key]
                    tr = trajs[ti]
                    if j not in tr.eval_sizes:
                        tr.eval_sizes.append(j)
                    row_slot.append((ti, tr.eval_sizes.index(j)))
                    rows.append({
                        "row": len(rows), "trial": t, "shift_index": s, "shift": float(data.shift_levels[s]),
                        "size_index": j, "subset_size": data.subset_sizes[j], "rule": rule, "beta": b,
                        "method": method_label(rule, b), "trajectory": ti,
                    })

    # chunks: one kind of training each, sorted by subset size (little padding), then trial and shift
    order = sorted(range(len(trajs)), key=lambda i: (
        (trajs[i].needs_source, trajs[i].needs_target), trajs[i].size, trajs[i].trial, trajs[i].shift,
        trajs[i].kind, trajs[i].auto, trajs[i].beta))
    chunks: list[list[int]] = []
    for i in order:
        sig = (trajs[i].needs_source, trajs[i].needs_target)
        if chunks and len(chunks[-1]) < chunk and (trajs[chunks[-1][0]].needs_source, trajs[chunks[-1][0]].needs_target) == sig:
            chunks[-1].append(i)
        else:
            chunks.append([i])

    eval_steps = np.array(sorted(set(range(0, steps + 1, eval_every)) | {steps}), dtype=np.int64)
    theta0 = {t: init_params(data, t) for t in trials_}
    cfg = {"steps": steps, "lr": float(lr), "momentum": float(momentum), "n_parts": n_parts,
           "reestimate_every": reestimate_every}
    traj_losses: list[np.ndarray | None] = [None] * len(trajs)
    traj_beta = np.zeros((len(trajs), 2))
    bar = tqdm(total=len(trajs) * steps, unit="step", unit_scale=True, desc="train_grid", disable=not progress,
               leave=True, mininterval=0.5)
    try:
        for ch in chunks:
            losses, b0, bm = _run_chunk([trajs[i] for i in ch], data, theta0, cfg, eval_steps, bar)
            losses = losses.cpu().double().numpy()
            for c, i in enumerate(ch):
                traj_losses[i] = losses[c]
            traj_beta[ch, 0] = b0.cpu().double().numpy()
            traj_beta[ch, 1] = bm.cpu().double().numpy()
    finally:
        bar.close()
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    wall = time.perf_counter() - t_start

    curves = np.stack([traj_losses[ti][slot] for ti, slot in row_slot])  # (rows, E)
    table = pd.DataFrame(rows)
    table["beta_used"] = [traj_beta[ti, 1] for ti, _ in row_slot]
    table["beta_init"] = [traj_beta[ti, 0] for ti, _ in row_slot]
    table["initial_test_loss"] = curves[:, 0]
    table["final_test_loss"] = curves[:, -1]
    finite = np.where(np.isfinite(curves), curves, np.inf)
    table["min_test_loss"] = finite.min(axis=1)
    table["diverged"] = ~np.isfinite(curves[:, -1])
    cols = ["row", "trial", "shift_index", "shift", "size_index", "subset_size", "rule", "beta", "method",
            "beta_used", "beta_init", "initial_test_loss", "final_test_loss", "min_test_loss", "diverged", "trajectory"]
    table = table[cols]
    config = {
        "rules": list(rules), "betas": [float(b) for b in betas] if betas is not None else None, "steps": steps,
        "lr": float(lr), "momentum": float(momentum), "n_parts": n_parts, "reestimate_every": reestimate_every,
        "eval_every": eval_every, "trials": trials_, "shift_indices": shifts, "size_indices": sizes,
        "n_points": data.n_points, "shift_levels": [float(v) for v in data.shift_levels],
        "subset_sizes": list(data.subset_sizes), "seed": data.seed, "dtype": str(dt).replace("torch.", ""),
        "dedupe": dedupe, "loss": "MSE, mean over points and outputs",
    }
    timing = {
        "wall_s": wall, "device": str(dev), "chunk_size": chunk, "n_chunks": len(chunks), "n_rows": len(rows),
        "n_trainings_run": len(trajs), "steps": steps,
        "ms_per_training_step": 1e3 * wall / max(1, len(trajs) * steps),
        "torch_threads": torch.get_num_threads(),
    }
    return GridResult(table, curves, eval_steps, config, timing)


# =============================================================================================
# Reference: one training with plain per-step torch code
# =============================================================================================
def train_single(
    data: SyntheticData,
    *,
    shift_index: int,
    size_index: int,
    rule: str,
    beta: float = 0.5,
    trial: int = 0,
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    n_parts: int = 2,
    reestimate_every: int | None = None,
    eval_every: int = 10,
) -> dict[str, Any]:
    """One training the plain way: ``nn.Sequential`` + autograd + ``torch.optim.SGD`` + the library rule.

    The reference :func:`train_grid` is tested against (same data, θ0, subsets, parts and schedule).
    Returns ``{"eval_steps", "test_loss" (E,), "beta_init", "beta_used", "theta" (final flat θ)}``.
    """
    from ..core.aggregation import source_only, target_only

    if rule not in RULES:
        raise ValueError(f"unknown rule {rule!r}; rule must be one of {list(RULES)}")
    data._check_cell(size_index=size_index, trial=trial, shift_index=shift_index)
    steps = _check_int(steps, "steps", 1)
    eval_every = _check_int(eval_every, "eval_every", 1)
    n_parts = _check_int(n_parts, "n_parts", 2)
    if rule in _BETA_RULES and not (0.0 <= beta <= 1.0):
        raise ValueError(f"beta must lie in [0, 1], got {beta!r}")
    net = make_network(init_params(data, trial))
    params = list(net.parameters())
    opt = torch.optim.SGD(params, lr=lr, momentum=momentum)
    loss_fn = nn.MSELoss()
    idx, test = data.train_indices(size_index, trial), data.test_indices(size_index, trial)
    xt, yt = data.x[idx], data.y_target[idx]
    xs, ys = data.x, data.y_sources[shift_index]
    xte, yte = data.x[test], data.y_target[test]
    k, auto = len(idx), rule in _AUTO_RULES
    q = k // n_parts
    if auto and q < 1:
        raise ValueError(f"auto rules need subsets of at least n_parts = {n_parts} points, got {k}")

    def grad_on(xb: Tensor, yb: Tensor) -> Tensor:
        loss = loss_fn(net(xb), yb)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])

    eval_at = set(range(0, steps + 1, eval_every)) | {steps}
    curve, betas_est = [], []
    b = {"source_only": 1.0, "target_only": 0.0}.get(rule, beta)
    for step in range(steps + 1):
        if step in eval_at:
            with torch.no_grad():
                curve.append(float(loss_fn(net(xte), yte)))
        if step == steps:
            break
        g_t = grad_on(xt, yt) if rule != "source_only" else None
        g_s = grad_on(xs, ys) if rule != "target_only" else None
        if auto and (step == 0 or (reestimate_every is not None and step % reestimate_every == 0)):
            parts = torch.stack([grad_on(xt[p * q:(p + 1) * q], yt[p * q:(p + 1) * q]) for p in range(n_parts)])
            b = float(auto_beta(parts, g_s, rule=rule[: -len("_auto")]))
            betas_est.append(b)
        if rule == "source_only":
            g = source_only(g_s.unsqueeze(0))
        elif rule == "target_only":
            g = target_only(g_t)
        elif rule.startswith("fedda"):
            g = fedda(g_s.unsqueeze(0), g_t, b)
        else:
            g = fedgp(g_s.unsqueeze(0), g_t, b)
        offset = 0
        for p in params:
            p.grad = g[offset:offset + p.numel()].view_as(p).clone()
            offset += p.numel()
        opt.step()
    return {
        "eval_steps": np.array(sorted(eval_at), dtype=np.int64),
        "test_loss": np.array(curve),
        "beta_init": betas_est[0] if betas_est else b,
        "beta_used": float(np.mean(betas_est)) if betas_est else b,
        "theta": torch.nn.utils.parameters_to_vector(params).detach(),
    }


# =============================================================================================
# Metrics at the initialisation (π = point mass at θ0)
# =============================================================================================
_FORMULA_KIND = {
    "source_only": "exact", "target_only": "exact", "fedda": "exact", "fedgp": "mean-field",
    "fedda_auto": "oracle optimum", "fedgp_auto": "oracle optimum (mean-field)",
}


def _subset_weights(idx: Tensor, n: int, n_parts: int, dtype: torch.dtype) -> Tensor:
    """Weights (R, 1 + B, n): row 0 the mean over each subset idx[r] (R, k), rows 1..B the means over
    its B parts (consecutive blocks of ⌊k/B⌋ positions; k mod B positions belong to no part)."""
    R, k = idx.shape
    q = k // n_parts
    w = torch.zeros(R, 1 + n_parts, n, dtype=dtype, device=idx.device)
    w[:, 0].scatter_(1, idx, 1.0 / k)
    for p in range(n_parts):
        w[:, 1 + p].scatter_(1, idx[:, p * q:(p + 1) * q], 1.0 / q)
    return w


def init_metrics(
    data: SyntheticData,
    *,
    rules: Sequence[str] = RULES,
    betas: Sequence[float] = (0.5,),
    n_subsets: int = 200,
    n_parts: int = 2,
    trials: Sequence[int] | None = None,
    shift_indices: Sequence[int] | None = None,
    size_indices: Sequence[int] | None = None,
    dtype: torch.dtype = torch.float64,
    device: str | torch.device = "auto",
    progress: bool = True,
):
    """σ², d², τ²d², their unbiased estimates and the Delta error of every rule at θ0, per cell.

    For each trial t (θ0 of that trial), shift level s and subset size k:

    * g_T = gradient on the WHOLE target set D_1 (the population; all n points, as the reference code),
      g_S = gradient on the whole source set of level s;
    * ``d2`` = ‖g_T − g_S‖², ``tau2d2`` = ‖P⊥ g_T‖² (P⊥ projects out g_S), ``tau2`` = tau2d2/d2,
      ``g_norm2`` = ‖g_T‖²;
    * ``sigma2`` = mean over ``n_subsets`` random subsets D̂ of size k (uniform WITHOUT replacement from
      the n target points, test points included) of ‖g_D̂ − g_T‖², with ``sigma2_stderr``;
      ``sigma2_exact`` = (n − k)/(k(n − 1)) · mean_i ‖g_i − g_T‖², the exact value of that expectation
      (finite-population factor included: it is 0 at k = n, unlike the i.i.d. σ² of the theory);
    * ``delta_bar`` = share of those subsets with ⟨g_D̂, g_S⟩ > 0, ``projected_noise`` = mean
      ⟨g_D̂ − g_T, u⟩² (u = g_S/‖g_S‖; the mean-field formula assumes σ²/m);
    * ``sigma2_hat``, ``d2_hat``, ``tau2d2_hat``: the raw unbiased estimates of
      :func:`fda_core.core.estimators.estimate_deltas` from B = ``n_parts`` parts of the ACTUAL training
      subset of the cell (the same parts :func:`train_grid` uses), ``beta_hat``: the auto β from them;
    * per method: ``delta_mc`` = Monte-Carlo E‖g_T − ĝ‖² over the same random subsets, the rule applied
      to each subset's gradient with ``fda_core.core.aggregation`` (batched; auto rules estimate β from the
      B parts of each random subset), ``delta_mc_stderr``; ``delta_formula`` the closed form of
      :mod:`fda_core.core.theory` with σ² = ``sigma2``, δ̄ = ``delta_bar``, τ̄² = ``tau2``, m = 6110 and
      ‖g_T‖² (``formula_kind``: exact for source/target only and FedDA, mean-field for FedGP, the
      oracle optimum for the auto rules); ``delta_projected`` (FedGP) the same with the measured
      projected noise in place of δ̄σ²/m; ``z_formula`` = (mc − formula)/stderr.

    Per-sample gradients (n, m) of the target set are formed once per trial (n·m numbers in ``dtype``),
    the subset and part gradients are weight-matrix products with them.

    Returns:
        A tidy DataFrame, one row per (trial, shift level, subset size, method); the cell columns repeat
        on the rows of one cell (:func:`cell_metrics` keeps one row per cell).
    """
    import pandas as pd
    from tqdm.auto import tqdm

    from ..core.theory import delta_fedda, delta_fedgp, optimal_beta_fedda, optimal_beta_fedgp

    if not isinstance(data, SyntheticData):
        raise ValueError(f"data must be a SyntheticData from make_phase_diagram_data, got {type(data).__name__}")
    methods = _methods(rules, betas)
    n_subsets = _check_int(n_subsets, "n_subsets", 2)
    n_parts = _check_int(n_parts, "n_parts", 2)
    trials_ = _indices(trials, data.n_trials, "trials")
    shifts = _indices(shift_indices, data.n_shifts, "shift_indices")
    sizes = _indices(size_indices, data.n_sizes, "size_indices")
    small = [data.subset_sizes[j] for j in sizes if data.subset_sizes[j] < n_parts]
    if small:
        raise ValueError(f"n_parts = {n_parts} is larger than the subset sizes {small}")
    dev = resolve_device(device)
    src_data = data
    data = data.to(dev, dtype)
    n, S = data.n_points, len(shifts)
    m = N_PARAMS
    rows = []
    bar = tqdm(total=len(trials_) * len(sizes), desc="init_metrics", unit="size", disable=not progress, mininterval=0.5)
    try:
        for t in trials_:
            theta0 = init_params(data, t)
            G = per_sample_gradients(theta0, data.x, data.y_target)  # (n, m)
            g_t = G.mean(0)
            pop_var = float((G - g_t).square().sum(1).mean())
            ys = data.y_sources[shifts]
            g_s = full_gradients(theta0.expand(S, m).contiguous(), data.x, ys)  # (S, m)
            same = [bool(torch.equal(src_data.y_sources[s], src_data.y_target)) for s in shifts]
            for i, eq in enumerate(same):
                if eq:  # the unshifted level IS the target set: d = 0 exactly, not rounding noise
                    g_s[i] = g_t
            s_norm = torch.linalg.vector_norm(g_s, dim=1, keepdim=True)
            u = torch.where(s_norm > 0, g_s / torch.where(s_norm > 0, s_norm, torch.ones_like(s_norm)), torch.zeros_like(g_s))
            d2 = (g_t - g_s).square().sum(1)
            tau2d2 = (g_t - (u @ g_t).unsqueeze(1) * u).square().sum(1)
            tau2d2 = torch.where(d2 > 0, torch.minimum(tau2d2, d2), torch.zeros_like(d2))
            g_norm2 = float(g_t.square().sum())
            for j in sizes:
                k = data.subset_sizes[j]
                gen = _generator(data.seed, _TAG_METRICS, t, j)
                idx = torch.rand(n_subsets, n, generator=gen).argsort(dim=1)[:, :k].to(dev)
                W = _subset_weights(idx, n, n_parts, dtype)  # (R, 1 + B, n)
                grads = (W.view(-1, n) @ G).view(n_subsets, 1 + n_parts, m)
                g_sub, parts = grads[:, 0], grads[:, 1:]
                err_sub = (g_sub - g_t).square().sum(1)  # (R,)
                sigma2 = float(err_sub.mean())
                sigma2_se = float(err_sub.std() / math.sqrt(n_subsets))
                sigma2_exact = (n - k) / (k * (n - 1)) * pop_var
                dots = g_sub @ g_s.T  # (R, S)
                delta_bar = (dots > 0).to(dtype).mean(0)
                proj_noise = ((g_sub - g_t) @ u.T).square().mean(0)  # (S,)
                # estimates from the actual training subset (its first B·⌊k/B⌋ positions, as train_grid)
                act = data.subset_idx[j, t, :k].unsqueeze(0)
                act_parts = (_subset_weights(act, n, n_parts, dtype)[0, 1:] @ G)  # (B, m)
                est = estimate_deltas(act_parts, g_s)
                beta_hat = {r: auto_beta(act_parts, g_s, rule=r) for r in _BETA_RULES}
                src_b = g_s.unsqueeze(1).unsqueeze(2).expand(S, n_subsets, 1, m)  # (S, R, 1, m)
                tgt_b = g_sub.unsqueeze(0).expand(S, n_subsets, m)
                mc: dict[str, tuple[Tensor, Tensor]] = {}
                for rule, b in methods:
                    lab = method_label(rule, b)
                    if rule == "source_only":
                        err = d2.unsqueeze(1).expand(S, n_subsets)
                        bmc = torch.ones(S, dtype=dtype, device=dev)
                    elif rule == "target_only":
                        err = err_sub.unsqueeze(0).expand(S, n_subsets)
                        bmc = torch.zeros(S, dtype=dtype, device=dev)
                    else:
                        base = rule[: -len("_auto")] if rule in _AUTO_RULES else rule
                        if rule in _AUTO_RULES:
                            beta_r = auto_beta(parts, g_s.unsqueeze(0).expand(n_subsets, S, m), rule=base).T  # (S, R)
                        else:
                            beta_r = torch.full((S, n_subsets), b, dtype=dtype, device=dev)
                        fn = fedda if base == "fedda" else fedgp
                        ghat = fn(src_b, tgt_b, beta_r.unsqueeze(-1))  # (S, R, m)
                        err = (ghat - g_t).square().sum(-1)
                        bmc = beta_r.mean(1)
                        del ghat
                    mc[lab] = (err.mean(1), err.std(1) / math.sqrt(n_subsets), bmc)
                for i, s in enumerate(shifts):
                    d2_i, t2d2_i = float(d2[i]), float(tau2d2[i])
                    tau2 = min(1.0, t2d2_i / d2_i) if d2_i > 0 else 0.0
                    db, pn = float(delta_bar[i]), float(proj_noise[i])
                    cell = {
                        "trial": t, "shift_index": s, "shift": float(data.shift_levels[s]), "size_index": j,
                        "subset_size": k, "d2": d2_i, "sigma2": sigma2, "sigma2_stderr": sigma2_se,
                        "sigma2_exact": sigma2_exact, "tau2d2": t2d2_i, "tau2": tau2, "g_norm2": g_norm2,
                        "delta_bar": db, "projected_noise": pn,
                        "d2_over_sigma2": d2_i / sigma2 if sigma2 > 0 else math.inf,
                        "sigma2_hat": float(est["sigma2"]), "d2_hat": float(est["d2"][i]),
                        "tau2d2_hat": float(est["tau2d2"][i]),
                    }
                    for rule, b in methods:
                        lab = method_label(rule, b)
                        mean, se, bmc = mc[lab]
                        kind = _FORMULA_KIND[rule]
                        proj = math.nan
                        if rule == "source_only":
                            formula, bh = d2_i, 1.0
                        elif rule == "target_only":
                            formula, bh = sigma2, 0.0
                        elif rule == "fedda":
                            formula, bh = float(delta_fedda(sigma2, d2_i, b)), b
                        elif rule == "fedda_auto":
                            formula = float(delta_fedda(sigma2, d2_i, optimal_beta_fedda(sigma2, d2_i)))
                            bh = float(beta_hat["fedda"][i])
                        else:
                            bb = b if rule == "fedgp" else float(optimal_beta_fedgp(sigma2, t2d2_i, m, db))
                            formula = float(delta_fedgp(sigma2, d2_i, bb, db, tau2, m, g_norm2=g_norm2))
                            proj = ((1 - bb) ** 2 * sigma2 + bb**2 * db * t2d2_i + (2 * bb - bb**2) * pn
                                    + bb**2 * (1 - db) * g_norm2)
                            bh = b if rule == "fedgp" else float(beta_hat["fedgp"][i])
                        mean_i, se_i = float(mean[i]), float(se[i])
                        z = (mean_i - formula) / se_i if se_i > 1e-12 * max(1.0, abs(formula)) else (
                            0.0 if abs(mean_i - formula) <= 1e-9 * max(1.0, abs(formula)) else math.copysign(math.inf, mean_i - formula))
                        rows.append({
                            **cell, "method": lab, "rule": rule, "beta": b, "beta_mc": float(bmc[i]),
                            "beta_hat": bh, "delta_mc": mean_i, "delta_mc_stderr": se_i, "delta_formula": formula,
                            "formula_kind": kind, "delta_projected": proj, "z_formula": z,
                        })
                bar.update(1)
            del G
    finally:
        bar.close()
    return pd.DataFrame(rows)


_CELL_COLUMNS = ["trial", "shift_index", "shift", "size_index", "subset_size", "d2", "sigma2", "sigma2_stderr",
                 "sigma2_exact", "tau2d2", "tau2", "g_norm2", "delta_bar", "projected_noise", "d2_over_sigma2",
                 "sigma2_hat", "d2_hat", "tau2d2_hat"]


def cell_metrics(metrics, average_trials: bool = False):
    """One row per (trial, shift level, subset size) with the cell columns of :func:`init_metrics`;
    with ``average_trials`` the mean over trials per (shift level, subset size) (``n_trials`` added,
    ``d2_over_sigma2`` recomputed from the means)."""
    cells = metrics[_CELL_COLUMNS].drop_duplicates(["trial", "shift_index", "size_index"]).reset_index(drop=True)
    if not average_trials:
        return cells
    keys = ["shift_index", "shift", "size_index", "subset_size"]
    g = cells.drop(columns="trial").groupby(keys, sort=True)
    out = g.mean().reset_index()
    out["n_trials"] = g.size().to_numpy()
    out["d2_over_sigma2"] = out["d2"] / out["sigma2"]
    return out


def compare_best(
    result: GridResult | Any,
    metrics: Any,
    methods: Sequence[str] = ("source_only", "fedda_0.5", "fedgp_0.5", "target_only"),
    loss_column: str = "final_test_loss",
):
    """Per (shift level, subset size): the method with the smallest Delta error and the one with the best
    target test loss, each averaged over trials (ties: the earlier method in ``methods``).

    Columns: ``shift_index``, ``shift``, ``size_index``, ``subset_size``, ``d2``, ``sigma2`` (means over
    trials), ``d`` and ``sigma`` (their square roots), ``d2_over_sigma2``, ``best_by_delta_mc``,
    ``best_by_formula``, ``best_by_loss``, ``agree`` (best_by_delta_mc == best_by_loss), and one
    ``loss[<method>]`` / ``delta_mc[<method>]`` column per method.
    """
    import pandas as pd

    table = result.table if isinstance(result, GridResult) else result
    methods = list(methods)
    missing = [mm for mm in methods if mm not in set(table["method"])]
    if missing:
        raise ValueError(f"methods {missing} are not in the training results (methods: {sorted(set(table['method']))})")
    missing = [mm for mm in methods if mm not in set(metrics["method"])]
    if missing:
        raise ValueError(f"methods {missing} are not in the metrics (methods: {sorted(set(metrics['method']))})")
    keys = ["shift_index", "size_index"]
    loss = table[table["method"].isin(methods)].groupby(keys + ["method"])[loss_column].mean().unstack("method")[methods]
    met = metrics[metrics["method"].isin(methods)]
    dmc = met.groupby(keys + ["method"])["delta_mc"].mean().unstack("method")[methods]
    dfo = met.groupby(keys + ["method"])["delta_formula"].mean().unstack("method")[methods]
    cells = cell_metrics(metrics, average_trials=True).set_index(keys)
    idx = loss.index.intersection(dmc.index)
    out = cells.loc[idx, ["shift", "subset_size", "d2", "sigma2"]].copy()
    out["d"] = np.sqrt(out["d2"])
    out["sigma"] = np.sqrt(out["sigma2"])
    out["d2_over_sigma2"] = out["d2"] / out["sigma2"]
    names = np.asarray(methods)

    def argbest(frame) -> np.ndarray:  # NaN (a diverged training) never wins
        v = frame.loc[idx].to_numpy(dtype=float)
        return names[np.argmin(np.where(np.isnan(v), np.inf, v), axis=1)]

    out["best_by_delta_mc"] = argbest(dmc)
    out["best_by_formula"] = argbest(dfo)
    out["best_by_loss"] = argbest(loss)
    out["agree"] = out["best_by_delta_mc"] == out["best_by_loss"]
    for mm in methods:
        out[f"loss[{mm}]"] = loss.loc[idx, mm]
        out[f"delta_mc[{mm}]"] = dmc.loc[idx, mm]
    return pd.DataFrame(out).reset_index()


def agreement_summary(result: GridResult, metrics: Any, methods: Sequence[str], label: str = "") -> dict[str, Any]:
    """How often the rule with the smallest Delta error is also the one that trains best (panels a vs b).

    * ``share_same_rule``: share of cells where :func:`compare_best` names the same rule by Monte-Carlo
      Δ² and by final target test loss (mean over trials);
    * ``share_same_or_within_noise``: cells that agree, plus disagreeing cells where the Δ²-best rule's
      test loss is within noise of the loss-best rule's: the per-trial difference of their final losses
      has a mean within 2 standard errors of 0 (needs ≥ 2 trials; with one trial this is NaN);
    * ``share_same_rule_formula``: the same as the first with the closed-form Δ² instead of Monte Carlo.
    """
    cmp = compare_best(result, metrics, methods=methods)
    table = result.table
    n_trials = int(table["trial"].nunique())
    within = []
    for _, cell in cmp.iterrows():
        if cell["agree"]:
            within.append(True)
            continue
        if n_trials < 2:
            within.append(np.nan)
            continue
        sel = (table["shift_index"] == cell["shift_index"]) & (table["size_index"] == cell["size_index"])
        per = table[sel].pivot_table(index="trial", columns="method", values="final_test_loss")
        diff = (per[cell["best_by_delta_mc"]] - per[cell["best_by_loss"]]).to_numpy(dtype=float)
        se = diff.std(ddof=1) / math.sqrt(len(diff))
        within.append(bool(abs(diff.mean()) <= 2 * se))
    within_arr = np.asarray(within, dtype=float)
    return {
        "panel": label,
        "methods": ", ".join(methods),
        "n_cells": len(cmp),
        "n_trials": n_trials,
        "share_same_rule": float(cmp["agree"].mean()),
        "share_same_rule_formula": float((cmp["best_by_formula"] == cmp["best_by_loss"]).mean()),
        "share_same_or_within_noise": float(np.nanmean(within_arr)) if n_trials >= 2 else float("nan"),
    }


def _grid_to_json(result: GridResult) -> dict[str, Any]:
    return {"table": result.table.to_dict(orient="split"), "curves": result.curves.tolist(),
            "eval_steps": result.eval_steps.tolist(), "config": result.config, "timing": result.timing}


def _grid_from_json(obj: dict[str, Any]) -> GridResult:
    import pandas as pd

    table = pd.DataFrame(**{k: obj["table"][k] for k in ("data", "columns")})
    return GridResult(table, np.asarray(obj["curves"], dtype=float), np.asarray(obj["eval_steps"]),
                      obj["config"], obj["timing"])


def run_phase_diagram(
    data: SyntheticData,
    *,
    store: Any = None,
    betas: Sequence[float] = (0.5,),
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    n_parts: int = 2,
    reestimate_every: int | None = None,
    n_subsets: int = 200,
    device: str | torch.device = "auto",
    progress: bool = True,
):
    """Train every (shift, size, rule) of every trial and measure the cells at θ0, one trial at a time,
    reusing the trials already in ``store`` (a :class:`fda_core.common.store.ResultStore`), so a long run
    (``paper_scale``) that was interrupted resumes at the first unfinished trial.

    Returns ``(GridResult, metrics DataFrame)`` for all trials, as :func:`train_grid` and
    :func:`init_metrics` would (curves' ``row`` indices renumbered across trials).
    """
    import pandas as pd

    from ..common import VERSION as __version__

    base = {
        "n_points": data.n_points, "shift_levels": [float(v) for v in data.shift_levels],
        "subset_sizes": list(data.subset_sizes), "n_trials": data.n_trials, "seed": data.seed,
        "betas": [float(b) for b in betas], "steps": steps, "lr": lr, "momentum": momentum, "n_parts": n_parts,
        "reestimate_every": reestimate_every, "n_subsets": n_subsets, "fda_core": __version__,
    }
    grids, metrics = [], []
    for t in range(data.n_trials):
        def compute(t: int = t) -> dict[str, Any]:
            res = train_grid(data, betas=betas, steps=steps, lr=lr, momentum=momentum, n_parts=n_parts,
                             reestimate_every=reestimate_every, trials=[t], device=device, progress=progress)
            met = init_metrics(data, betas=betas, n_subsets=n_subsets, n_parts=n_parts, trials=[t],
                               device=device, progress=progress)
            return {"grid": _grid_to_json(res), "metrics": met.to_dict(orient="split")}

        config = {**base, "trial": t}
        out = store.cached("synthetic_phase_diagram", config, compute) if store is not None else compute()
        grids.append(_grid_from_json(out["grid"]))
        metrics.append(pd.DataFrame(**{k: out["metrics"][k] for k in ("data", "columns")}))
    offset, tables = 0, []
    for g in grids:
        tab = g.table.copy()
        tab["row"] = tab["row"] + offset
        if "trajectory" in tab:
            tab["trajectory"] = tab["trajectory"] + offset
        offset += g.curves.shape[0]
        tables.append(tab)
    timing = {"wall_s": float(sum(g.timing.get("wall_s", 0.0) for g in grids)), "trials": len(grids),
              "device": grids[0].timing.get("device"),
              "n_trainings_run": int(sum(g.timing.get("n_trainings_run", 0) for g in grids))}
    combined = GridResult(pd.concat(tables, ignore_index=True), np.concatenate([g.curves for g in grids]),
                          grids[0].eval_steps, {**grids[0].config, "trials": list(range(data.n_trials))}, timing)
    return combined, pd.concat(metrics, ignore_index=True)
