"""The synthetic data of the phase-diagram experiment (notebook 02): RBF labels with shift levels, target
subsets (``docs/experiments.md`` § Synthetic phase diagram; FedGP paper § 5 and App. B; auto-weighted FDA
paper § 5 and App. B).

x ∈ R^50 from a mixture of 10 Gaussians (n points in 10 equal blocks, centres U(−0.5, 0.5)^50, identity
covariance). Labels y ∈ R^10 = A φ(x) + b with 100 RBF features φ_i(x) = exp(−‖x − μ_i‖² / s_i),
μ_i ~ U(−0.5, 0.5)^50, s_i = 100·U(0, 1), A (10×100) and b (10) ~ U(−0.5, 0.5). A shift level s perturbs
the basis, μ ← μ + s·U(0, 1) (every entry) and s_i ← s_i + 100·s·U(0, 1), with fresh noise per level while
x, A and b are shared: the shift is in P(y | x). The unshifted set D_1 is the TARGET and every level
(including 0, i.e. D_1 itself) is a SOURCE, as in the papers' prose (the prose and the reference code
disagree on which set is the source; the workbook follows the prose, see :meth:`SyntheticData.describe`).
Target training subsets of 9 sizes (paper: 14 … 1810 of 5000 points, scaled with n) are uniform draws
without replacement; the remaining target points are that subset's test set.

The network trained on these data is :mod:`fda_core.data.sigmoid_net`; the experiment is
:mod:`fda_core.experiments.phase_diagram`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from ..common.checks import check_int as _check_int
from ..common.devices import resolve_device
from ..common.seeding import generator as _generator

__all__ = [
    "N_INPUTS",
    "N_OUTPUTS",
    "N_CLUSTERS",
    "N_BASIS",
    "PAPER_N_POINTS",
    "PAPER_SUBSET_SIZES",
    "PAPER_TRIALS",
    "DEFAULT_S_MAX",
    "DEFAULT_SHIFT_LEVELS",
    "SEED_TAGS",
    "SyntheticData",
    "make_phase_diagram_data",
    "scaled_subset_sizes",
    "spread_subset_sizes",
]

#: input and output dimensions of the data (the network's first and last layer)
N_INPUTS, N_OUTPUTS = 50, 10
N_CLUSTERS = 10
N_BASIS = 100
PAPER_N_POINTS = 5000
PAPER_SUBSET_SIZES = (14, 27, 49, 90, 164, 299, 546, 994, 1810)
PAPER_TRIALS = 3
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

#: Seed streams of the experiment (first key of :func:`fda_core.common.seeding.generator` after the seed):
#: the data, each trial's subsets, each trial's network initialisation, the Monte-Carlo subsets of the metrics.
SEED_TAGS = {"data": 0, "subsets": 1, "init": 2, "metrics": 3}


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


def spread_subset_sizes(n_points: int, n_sizes: int = len(PAPER_SUBSET_SIZES)) -> tuple[int, ...]:
    """``n_sizes`` of the :func:`scaled_subset_sizes` of ``n_points``, evenly spread from the smallest to the
    largest (all of them by default).

    >>> spread_subset_sizes(2000, 4)
    (6, 36, 120, 724)
    """
    sizes = scaled_subset_sizes(n_points)
    n_sizes = _check_int(n_sizes, "n_sizes", 1, len(sizes))
    return tuple(sizes[i] for i in np.linspace(0, len(sizes) - 1, n_sizes).round().astype(int))


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
        """The data in words, generated from the data themselves, and how they differ from the papers'."""
        n, k = self.n_points, list(self.subset_sizes)
        levels = ", ".join(f"{v:g}" for v in self.shift_levels)
        default_levels = len(self.shift_levels) == len(DEFAULT_SHIFT_LEVELS) and np.allclose(
            self.shift_levels, DEFAULT_SHIFT_LEVELS, rtol=0, atol=1e-12)
        why_levels = ("the papers do not give them; these defaults were chosen so that d²/σ² at the initialisation "
                      "crosses every region of the theory" if default_levels else "the papers do not give them")
        try:
            scaled = list(scaled_subset_sizes(n))
        except ValueError:
            scaled = []
        ratio = f"scaled by n/{PAPER_N_POINTS} = {n / PAPER_N_POINTS:g}, at least 4 and distinct"
        if k == list(PAPER_SUBSET_SIZES) and n == PAPER_N_POINTS:
            sizes = "the paper's"
        elif scaled and k == scaled:
            sizes = f"the paper's sizes {ratio}"
        elif scaled and set(k) <= set(scaled):
            sizes = f"{len(k)} of the paper's sizes {ratio}"
        else:
            sizes = "chosen by the run"
        return (
            f"Synthetic phase diagram (FedGP paper § 5 / App. B): n = {n} points (paper: {PAPER_N_POINTS}) "
            f"x ∈ R^{N_INPUTS} from a mixture of {N_CLUSTERS} Gaussians (centres U(-0.5,0.5)^{N_INPUTS}, identity "
            f"covariance); y ∈ R^{N_OUTPUTS} = A·φ(x) + b with {N_BASIS} RBF features exp(-‖x-μ_i‖²/s_i), "
            f"μ ~ U(-0.5,0.5)^{N_INPUTS}, s_i = 100·U(0,1), A, b ~ U(-0.5,0.5). Shift level s: μ += s·U(0,1), "
            f"s_i += 100·s·U(0,1), fresh noise per level, x/A/b shared (shift in P(y|x)). Shift levels: [{levels}] "
            f"({why_levels}). Target = the UNSHIFTED set D_1 and the sources are all levels (level 0 is D_1 "
            f"itself), following the papers' prose (the papers' prose and their reference code disagree on which "
            f"set is the source; this workbook follows the prose). Target training subsets of sizes {k}: {sizes} "
            f"(paper: {list(PAPER_SUBSET_SIZES)} of {PAPER_N_POINTS}), uniform without replacement, the rest of "
            f"D_1 is the test set; {self.n_trials} trial(s) (paper: {PAPER_TRIALS}), each with fresh subsets and "
            f"its own initialisation. Seed {self.seed}."
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
    g = _generator(seed, SEED_TAGS["data"])
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
        gi = _generator(seed, SEED_TAGS["data"], 1 + i)  # fresh noise per level, independent of the other levels
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
            idx = torch.randperm(n, generator=_generator(seed, SEED_TAGS["subsets"], t, j))[:k]
            subset_idx[j, t, :k] = idx
            subset_mask[j, t, :k] = True
            test_mask[j, t, idx] = False

    data = SyntheticData(
        x=x, y_target=y_target, y_sources=torch.stack(ys), shift_levels=levels, subset_sizes=sizes,
        n_trials=trials, subset_idx=subset_idx, subset_mask=subset_mask, test_mask=test_mask, cluster=cluster,
        centres=centres, rbf_centres=torch.stack(mus), rbf_widths=torch.stack(widths), A=A, b=b, seed=seed,
    )
    return data.to(device, dtype)
