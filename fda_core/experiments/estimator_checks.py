"""Monte-Carlo checks of the unbiased estimators σ̂², d̂², (τ²d²)^ and of the auto-β built on them.

The estimators (``docs/theory.md`` § Unbiased estimators; auto-weighted FDA paper § 4.2) are
implemented in :mod:`fda_core.core.estimators`; this module measures them in models whose population
gradients are known (:class:`fda_core.core.known_gradients.KnownGradientModel`: Gaussian per-sample gradients, or a
pool of real per-sample gradients). Everything returns a tidy :class:`pandas.DataFrame`; notebook
``03_unbiased_estimators`` only calls these functions and plots their tables.

* :func:`estimator_check` — mean, spread and confidence interval of each raw estimate over many draws
  of the target set, for a grid of part counts B and target-set sizes n, against the exact truth; plus
  the mean of the estimate clamped at 0 (what the β formulas use).
* :func:`estimator_check_over_pi` — the same at several parameter points θ ∼ π and for the average
  over π (``docs/theory.md`` § Averaging over θ ∼ π: the average stays unbiased).
* :func:`auto_beta_check` — the estimated auto β (FedDA or FedGP) against the optimal β from the true
  quantities (``docs/theory.md`` § Optimal weights).
* :func:`simultaneous_intervals` — (re)compute Bonferroni-corrected confidence intervals over all rows
  of a table (e.g. after concatenating several checks).
* :class:`AnisotropicGaussianModel` / :func:`anisotropic_gaussian_model` — a Gaussian model with a
  different noise variance per coordinate and several sources, and :func:`gaussian_estimator_std` — the
  exact standard deviation of each estimator in any Gaussian model.
* :func:`estimator_draws` — the raw estimates of every draw at one (B, n) (the histograms of the notebook).

The figures of these tables are drawn by :mod:`fda_core.viz.estimator_plots`.

Confidence intervals: mean ± z·stderr with stderr = sample std / √n_draws (normal approximation of the
Monte-Carlo mean, n_draws ≥ a few hundred). By default z is Bonferroni-corrected so that all K rows of
a table hold *simultaneously* at 95 %: z = Φ⁻¹(1 − 0.05 / (2K)) (K = 60 gives z ≈ 3.34; K = 200,
z ≈ 3.66). The z used is stored in every row (column ``z_crit``), with the ``level`` and ``k_rows``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..common.checks import check_int
from ..common.seeding import derive_seed
from ..core import theory
from ..core.estimators import auto_beta, estimate_deltas, unit_directions
from ..core.known_gradients import GaussianGradientModel, KnownGradientModel

__all__ = [
    "QUANTITIES",
    "QUANTITY_LABELS",
    "AnisotropicGaussianModel",
    "anisotropic_gaussian_model",
    "bonferroni_z",
    "simultaneous_intervals",
    "true_quantities",
    "gaussian_estimator_std",
    "estimator_draws",
    "estimator_check",
    "estimator_check_over_pi",
    "auto_beta_check",
]

#: The three estimated quantities, in table order.
QUANTITIES = ("sigma2", "d2", "tau2d2")
#: Plot labels of the quantities.
QUANTITY_LABELS = {"sigma2": "σ̂² (target variance)", "d2": "d̂² (distance²)", "tau2d2": "(τ²d²)^ (orthogonal shift²)"}

# salts of the derived seeds, one per kind of check (so two checks never share a random stream)
_SALT = {"estimator_check": 1, "over_pi": 2, "auto_beta": 3, "draws": 4}
# bound on the elements of one (draws, B, m) chunk of part gradients (8 MiB in float64): every draw's estimates are
# the same whatever the chunk; 8 MiB ran notebook 03's real-digit check about 15 % faster than 32 MiB (2-core CPU)
_CHUNK_ELEMENTS = 1 << 20


# ---------------------------------------------------------------------------------------------
# An anisotropic Gaussian model
# ---------------------------------------------------------------------------------------------
#: A Gaussian model with per-coordinate noise: :class:`fda_core.core.known_gradients.GaussianGradientModel` with an
#: (m,) ``sample_std`` (kept under this name for readability of the checks).
AnisotropicGaussianModel = GaussianGradientModel


def anisotropic_gaussian_model(
    m: int = 50,
    sigma2: float = 1.0,
    d2: Sequence[float] = (2.0, 0.25),
    tau2: Sequence[float] = (0.5, 0.8),
    condition: float = 100.0,
    target_norm: float = 5.0,
    n_target: int = 64,
    seed: int = 0,
) -> AnisotropicGaussianModel:
    """An :class:`AnisotropicGaussianModel` with prescribed σ², d_i² and τ_i².

    Noise: the per-coordinate variances fall geometrically from 1 to 1/``condition`` (a few directions
    carry most of the noise), scaled so that σ² = ``sigma2`` at n = ``n_target``. The target gradient
    has norm ``target_norm`` and a random direction; source i lies along a unit vector u_i tilted away
    from g_T inside a random plane so that ‖P⊥_i g_T‖² = τ_i² d_i² and ‖g_T − g_i‖² = d_i²
    (g_i = (⟨g_T, u_i⟩ − d_i√(1 − τ_i²)) u_i). Requires τ_i² d_i² ≤ ``target_norm``².
    """
    if not (isinstance(m, int) and m >= 3):
        raise ValueError(f"m must be an integer >= 3, got {m!r}")
    if not (sigma2 > 0 and math.isfinite(sigma2)):
        raise ValueError(f"sigma2 must be a finite number > 0, got {sigma2!r}")
    if not condition >= 1:
        raise ValueError(f"condition must be >= 1, got {condition!r}")
    d2, tau2 = list(d2), list(tau2)
    if len(d2) == 0 or len(d2) != len(tau2):
        raise ValueError(f"d2 and tau2 must be non-empty and of equal length, got {len(d2)} and {len(tau2)}")
    for a, b in zip(d2, tau2):
        if not (a >= 0 and 0 <= b <= 1):
            raise ValueError(f"each d2 must be >= 0 and each tau2 in [0, 1], got d2={a!r}, tau2={b!r}")
        if b * a > target_norm**2:
            raise ValueError(f"tau2*d2 = {a * b:g} exceeds target_norm**2 = {target_norm**2:g}")
    gen = torch.Generator().manual_seed(seed)
    var = torch.logspace(0.0, -math.log10(condition), m, dtype=torch.float64)
    var = var * (sigma2 * n_target / float(var.sum()))
    g_t = torch.randn(m, generator=gen, dtype=torch.float64)
    g_t = g_t * (target_norm / torch.linalg.vector_norm(g_t))
    t_hat = g_t / target_norm
    sources = []
    for a, b in zip(d2, tau2):
        w = torch.randn(m, generator=gen, dtype=torch.float64)
        w = w - (w @ t_hat) * t_hat
        w = w / torch.linalg.vector_norm(w)
        sin = math.sqrt(b * a) / target_norm
        u = math.sqrt(max(0.0, 1.0 - sin**2)) * t_hat + sin * w  # ‖P⊥_u g_T‖ = target_norm · sin
        sources.append((float(g_t @ u) - math.sqrt(a * (1.0 - b))) * u)
    return AnisotropicGaussianModel(g_t, torch.stack(sources), var.sqrt(), n_target)


# ---------------------------------------------------------------------------------------------
# Helpers: seeds, intervals, truths, exact spreads
# ---------------------------------------------------------------------------------------------
def bonferroni_z(k: int, level: float = 0.95) -> float:
    """z of two-sided confidence intervals that hold simultaneously at ``level`` over ``k`` rows:
    Φ⁻¹(1 − (1 − level) / (2k)) (Bonferroni). k = 1 gives the usual per-row interval (1.96 at 95 %)."""
    if not (isinstance(k, (int, np.integer)) and k >= 1):
        raise ValueError(f"k (number of intervals) must be an integer >= 1, got {k!r}")
    if not (0.0 < level < 1.0):
        raise ValueError(f"level must lie in (0, 1), got {level!r}")
    return NormalDist().inv_cdf(1.0 - (1.0 - level) / (2 * int(k)))


def simultaneous_intervals(table: pd.DataFrame, level: float = 0.95, simultaneous: bool = True) -> pd.DataFrame:
    """Recompute ``ci_low``, ``ci_high``, ``covered``, ``z_crit``, ``level`` and ``k_rows`` of a check
    table (columns ``mean``, ``stderr``, ``truth``) so that the intervals hold simultaneously over all
    its rows (Bonferroni, :func:`bonferroni_z`), or per row with ``simultaneous=False``.

    Use it after concatenating several checks: each check's own correction only covers its own rows.
    Returns a new DataFrame.
    """
    for col in ("mean", "stderr", "truth"):
        if col not in table:
            raise ValueError(f"table must have a {col!r} column (got {list(table.columns)})")
    if len(table) == 0:
        raise ValueError("table is empty")
    out = table.copy()
    k = len(out)
    z = bonferroni_z(k if simultaneous else 1, level)
    out["ci_low"] = out["mean"] - z * out["stderr"]
    out["ci_high"] = out["mean"] + z * out["stderr"]
    out["covered"] = (out["ci_low"] <= out["truth"]) & (out["truth"] <= out["ci_high"])
    out["level"] = level
    out["z_crit"] = z
    out["k_rows"] = k if simultaneous else 1
    return out


def true_quantities(model: KnownGradientModel, n: int | None = None) -> dict[str, np.ndarray]:
    """The exact σ², d_i², τ_i²d_i² of ``model`` for target sets of ``n`` points (default: the
    model's n): ``{"sigma2": (1,), "d2": (N,), "tau2d2": (N,)}`` as float arrays."""
    mm = model if n is None else model.with_n_target(n)
    return {
        "sigma2": np.array([float(mm.sigma2)]),
        "d2": mm.d2.detach().double().cpu().numpy().reshape(-1),
        "tau2d2": mm.tau2d2.detach().double().cpu().numpy().reshape(-1),
    }


def _sample_variances(model: KnownGradientModel) -> Tensor | None:
    """(m,) per-coordinate variance of one per-sample gradient for the Gaussian models, else None."""
    return model.sample_variances if isinstance(model, GaussianGradientModel) else None


def gaussian_estimator_std(model: KnownGradientModel, B: int, n: int | None = None) -> dict[str, np.ndarray]:
    """Exact standard deviation of each raw estimator in a Gaussian model (isotropic
    :class:`~fda_core.core.known_gradients.GaussianGradientModel` or :class:`AnisotropicGaussianModel`).

    With Σ = Cov(ḡ) = diag(sample_std²)/n, Σ⊥ = P⊥ Σ P⊥ and a = P⊥ g_T, δ = g_T − g_S (Gaussian ḡ is
    independent of the deviations g_j − ḡ, whose scatter matrix is Wishart(BΣ, B − 1)):

    * Var σ̂² = 2 tr(Σ²) / (B − 1)
    * Var d̂² = 4 δᵀΣδ + 2 tr(Σ²) · B / (B − 1)
    * Var (τ²d²)^ = 4 aᵀΣ⊥a + 2 tr(Σ⊥²) · B / (B − 1)

    Only σ̂² gets more precise with more parts; the distances are dominated by the noise of ḡ, which
    does not depend on B. Returns ``{"sigma2": (1,), "d2": (N,), "tau2d2": (N,)}``; raises
    ValueError for a non-Gaussian model.
    """
    var = _sample_variances(model)
    if var is None:
        raise ValueError(f"model must be a Gaussian model (isotropic or anisotropic), got {type(model).__name__}")
    _check_B(B)
    n = model.n_target if n is None else n
    s = var / n  # diagonal of Σ
    g_t, src = model.target_grad, model.source_grads
    tr2 = float(s.square().sum())
    out_s = np.array([math.sqrt(2 * tr2 / (B - 1))])
    d2_var, t_var = [], []
    for g_s in src:
        delta = g_t - g_s
        d2_var.append(4 * float((delta.square() * s).sum()) + 2 * tr2 * B / (B - 1))
        u = unit_directions(g_s)
        sig = torch.diag(s)
        proj = torch.eye(len(s), dtype=torch.float64) - torch.outer(u, u)
        sig_p = proj @ sig @ proj
        a = proj @ g_t
        t_var.append(4 * float(a @ sig_p @ a) + 2 * float((sig_p * sig_p).sum()) * B / (B - 1))
    return {"sigma2": out_s, "d2": np.sqrt(d2_var), "tau2d2": np.sqrt(t_var)}


# ---------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------
def _check_B(B: Any, name: str = "B") -> int:
    return check_int(B, f"{name} (number of target parts)", 2)


def _check_n(n: Any, name: str = "n") -> int:
    return check_int(n, f"{name} (target-set size)", 2)


def _check_draws(n_draws: Any) -> int:
    return check_int(n_draws, "n_draws", 2)


def _check_model(model: Any, name: str = "model") -> KnownGradientModel:
    if not isinstance(model, KnownGradientModel):
        raise ValueError(f"{name} must be a KnownGradientModel (e.g. GaussianGradientModel), got {type(model).__name__}")
    return model


def _as_list(values: Any, name: str, check) -> list[int]:
    vals = [values] if isinstance(values, (int, np.integer)) else list(values)
    if not vals:
        raise ValueError(f"{name} must not be empty")
    return [check(v, name) for v in vals]


def _grid(B_values: Any, n_values: Any, skip_invalid: bool) -> list[tuple[int, int]]:
    """(B, n) cells in order; n not divisible by B is an error, or skipped with ``skip_invalid``."""
    bs, ns = _as_list(B_values, "B_values", _check_B), _as_list(n_values, "n_values", _check_n)
    cells, bad = [], []
    for b in bs:
        for n in ns:
            (cells if n % b == 0 else bad).append((b, n))
    if bad and not skip_invalid:
        raise ValueError(
            "n_values must be divisible by every B (equal parts): " + ", ".join(f"n={n} with B={b}" for b, n in bad)
            + "; pass skip_invalid=True to leave those cells out"
        )
    if not cells:
        raise ValueError(f"no (B, n) cell has n divisible by B (B_values={bs}, n_values={ns})")
    return cells


# ---------------------------------------------------------------------------------------------
# Drawing the estimates
# ---------------------------------------------------------------------------------------------
def _draw_estimates(model: KnownGradientModel, B: int, n: int, n_draws: int, cell_seed: int,
                    rules: Sequence[str] = (), m_beta: float = math.inf) -> dict[str, Tensor]:
    """Raw estimates over ``n_draws`` fresh target sets of n points split into B parts.

    Returns ``{"sigma2": (n_draws,), "d2": (n_draws, N), "tau2d2": (n_draws, N)}`` plus ``beta_<rule>``
    (n_draws, N) for each rule in ``rules`` (auto β from the same draws).
    """
    if n % B:
        raise ValueError(f"n = {n} must be divisible by B = {B} (the parts must have equal size)")
    mm = model.with_n_target(n)
    gen = torch.Generator().manual_seed(cell_seed)
    src = mm.source_grads
    n_src, m = src.shape
    chunk = max(1, min(n_draws, _CHUNK_ELEMENTS // (B * m)))
    out: dict[str, list[Tensor]] = {k: [] for k in (*QUANTITIES, *(f"beta_{r}" for r in rules))}
    for start in range(0, n_draws, chunk):
        t = min(chunk, n_draws - start)
        parts = mm.draw_parts(t, B, gen)  # (t, B, m)
        sources = src.expand(t, n_src, m)  # (t, N, m): one source set per draw
        est = estimate_deltas(parts, sources)
        for q in QUANTITIES:
            out[q].append(est[q].detach().double().cpu())
        for r in rules:
            out[f"beta_{r}"].append(auto_beta(parts, sources, rule=r, m=m_beta).detach().double().cpu())
    return {k: torch.cat(v) for k, v in out.items()}


def _summary(x: np.ndarray, truth: float) -> dict[str, float]:
    k = x.shape[0]
    mean = float(x.mean())
    std = float(x.std(ddof=1))
    clamped = float(np.clip(x, 0.0, None).mean())
    return {
        "mean": mean, "std": std, "stderr": std / math.sqrt(k), "truth": truth, "bias": mean - truth,
        "rel_bias": (mean - truth) / truth if truth != 0 else float("nan"),
        "rel_std": std / abs(truth) if truth != 0 else float("nan"),
        "clamped_mean": clamped, "clamped_bias": clamped - truth, "frac_negative": float((x < 0).mean()),
    }


def _rows(est: dict[str, Tensor], truth: dict[str, np.ndarray], std_theory: dict[str, np.ndarray] | None,
          common: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for q in QUANTITIES:
        vals = est[q].numpy()
        vals = vals.reshape(vals.shape[0], -1)
        for i in range(vals.shape[1]):
            row = {"quantity": q, "source": pd.NA if q == "sigma2" else i}
            row.update(_summary(vals[:, i], float(truth[q][i])))
            row["std_theory"] = float(std_theory[q][i]) if std_theory is not None else float("nan")
            row.update(common)
            rows.append(row)
    return rows


_COLUMNS = ["quantity", "source", "B", "n", "mean", "std", "stderr", "ci_low", "ci_high", "truth", "covered",
            "bias", "rel_bias", "z", "rel_std", "std_theory", "clamped_mean", "clamped_bias", "frac_negative",
            "level", "z_crit", "k_rows", "n_draws", "seed", "cell_seed"]


def _finish(rows: list[dict[str, Any]], level: float, simultaneous: bool, front: Sequence[str] = ()) -> pd.DataFrame:
    df = pd.DataFrame(rows)
    df["source"] = df["source"].astype("Int64")
    df["z"] = df["bias"] / df["stderr"].where(df["stderr"] > 0)
    df = simultaneous_intervals(df, level, simultaneous)
    return df[[*front, *_COLUMNS]].reset_index(drop=True)


def estimator_draws(model: KnownGradientModel, B: int, n: int, n_draws: int = 2000, seed: int = 0) -> pd.DataFrame:
    """The raw estimates of every draw at one (B, n), long format: quantity, source (NA for σ²), draw,
    estimate, clamped (= max(estimate, 0)), truth, B, n, seed, cell_seed (``derive_seed(seed, 4, B, n)``).

    Shapes: ``n_draws`` rows per quantity and source (1 + 2N blocks for N sources).
    """
    _check_model(model)
    B, n, n_draws = _check_B(B), _check_n(n), _check_draws(n_draws)
    if n % B:
        raise ValueError(f"n = {n} must be divisible by B = {B} (the parts must have equal size)")
    cell_seed = derive_seed(seed, _SALT["draws"], B, n)
    est = _draw_estimates(model, B, n, n_draws, cell_seed)
    truth = true_quantities(model, n)
    blocks = []
    for q in QUANTITIES:
        vals = est[q].numpy().reshape(n_draws, -1)
        for i in range(vals.shape[1]):
            blocks.append(pd.DataFrame({
                "quantity": q, "source": pd.NA if q == "sigma2" else i, "draw": np.arange(n_draws),
                "estimate": vals[:, i], "clamped": np.clip(vals[:, i], 0.0, None), "truth": float(truth[q][i]),
            }))
    df = pd.concat(blocks, ignore_index=True)
    df["source"] = df["source"].astype("Int64")
    return df.assign(B=B, n=n, seed=seed, cell_seed=cell_seed)


# ---------------------------------------------------------------------------------------------
# The checks
# ---------------------------------------------------------------------------------------------
def estimator_check(
    model: KnownGradientModel,
    B_values: Sequence[int] | int = (2, 4, 8, 16),
    n_values: Sequence[int] | int = (32, 64, 128),
    n_draws: int = 2000,
    seed: int = 0,
    *,
    level: float = 0.95,
    simultaneous: bool = True,
    skip_invalid: bool = False,
) -> pd.DataFrame:
    """Monte-Carlo mean of each raw estimator against its exact truth, over a grid of B and n.

    For every cell (B, n) (n divisible by B; otherwise ValueError, or the cell is skipped with
    ``skip_invalid=True``), ``n_draws`` fresh target sets of n points are drawn from ``model`` with the
    cell's own seed ``cell_seed = derive_seed(seed, 1, B, n)``, split into B parts
    (``model.with_n_target(n).draw_parts``), and σ̂², d̂², (τ²d²)^ computed by
    :func:`fda_core.core.estimators.estimate_deltas` (formulas: ``docs/theory.md`` § Unbiased estimators).
    Truths: ``model.with_n_target(n).sigma2`` (σ² of an n-point set), ``model.d2``, ``model.tau2d2``.

    Returns a long DataFrame, one row per (quantity, source, B, n) — quantity ∈ {sigma2, d2, tau2d2};
    source = index of the source (NA for sigma2, which does not depend on it) — with columns:
    mean, std (ddof 1), stderr = std/√n_draws, ci_low/ci_high = mean ∓ z_crit·stderr, truth, covered
    (truth inside the CI), bias = mean − truth, rel_bias, z = bias/stderr, rel_std = std/truth,
    std_theory (exact std for Gaussian models, :func:`gaussian_estimator_std`; NaN otherwise),
    clamped_mean / clamped_bias (mean and bias of max(estimate, 0), what the β formulas use; since
    max(x, 0) ≥ x, clamped_mean ≥ mean always), frac_negative (share of draws < 0), level, z_crit
    (Bonferroni: Φ⁻¹(1 − (1 − level)/(2K)) over the K rows of this table, or the per-row z with
    ``simultaneous=False``), k_rows, n_draws, seed, cell_seed.
    """
    _check_model(model)
    n_draws = _check_draws(n_draws)
    cells = _grid(B_values, n_values, skip_invalid)
    gaussian = _sample_variances(model) is not None
    rows: list[dict[str, Any]] = []
    for B, n in cells:
        cell_seed = derive_seed(seed, _SALT["estimator_check"], B, n)
        est = _draw_estimates(model, B, n, n_draws, cell_seed)
        std_t = gaussian_estimator_std(model, B, n) if gaussian else None
        rows += _rows(est, true_quantities(model, n), std_t,
                      {"B": B, "n": n, "n_draws": n_draws, "seed": seed, "cell_seed": cell_seed})
    return _finish(rows, level, simultaneous)


def estimator_check_over_pi(
    models: Sequence[KnownGradientModel],
    B: int | Sequence[int] = 4,
    n: int | Sequence[int] = 64,
    n_draws: int = 2000,
    seed: int = 0,
    *,
    level: float = 0.95,
    simultaneous: bool = True,
    skip_invalid: bool = False,
) -> pd.DataFrame:
    """The estimators at several parameter points θ_k ∼ π and their average over π.

    ``models[k]`` is the known-gradient model at θ_k (e.g. :func:`fda_core.data.gradient_pools.mnist_gradient_models`),
    all with the same number of sources. At each θ_k, ``n_draws`` target sets are drawn with seed
    ``derive_seed(seed, 2, B, n, k)``. The "average over π" row averages the per-θ estimates draw by
    draw (draw i of the average = mean over k of draw i at θ_k: the estimate of ‖·‖²_π for π uniform
    on the points, from one target set per point), so it has ``n_draws`` draws too; its truth is the
    mean of the per-θ truths. By linearity of expectation it stays unbiased (docs/theory.md
    § Averaging over θ ∼ π).

    ``B`` and ``n`` may be single values or lists (a grid, as in :func:`estimator_check`). Returns the
    columns of :func:`estimator_check` preceded by ``theta`` (k, NA for the average) and ``point``
    ("θ0", "θ1", ..., "average over π"); the Bonferroni z covers all rows of this table.
    """
    models = list(models)
    if not models:
        raise ValueError("models must contain at least one KnownGradientModel")
    for k, mo in enumerate(models):
        _check_model(mo, f"models[{k}]")
    n_src = {mo.source_grads.shape[0] for mo in models}
    if len(n_src) != 1:
        raise ValueError(f"models must all have the same number of sources, got {sorted(n_src)}")
    n_draws = _check_draws(n_draws)
    cells = _grid(B, n, skip_invalid)
    rows: list[dict[str, Any]] = []
    for b, nn in cells:
        per_theta, truths = [], []
        for k, mo in enumerate(models):
            cell_seed = derive_seed(seed, _SALT["over_pi"], b, nn, k)
            est = _draw_estimates(mo, b, nn, n_draws, cell_seed)
            truth = true_quantities(mo, nn)
            per_theta.append(est)
            truths.append(truth)
            rows += _rows(est, truth, None, {"theta": k, "point": f"θ{k}", "B": b, "n": nn, "n_draws": n_draws,
                                             "seed": seed, "cell_seed": cell_seed})
        avg = {q: torch.stack([e[q] for e in per_theta]).mean(0) for q in QUANTITIES}
        avg_truth = {q: np.mean([t[q] for t in truths], axis=0) for q in QUANTITIES}
        rows += _rows(avg, avg_truth, None, {"theta": pd.NA, "point": "average over π", "B": b, "n": nn,
                                             "n_draws": n_draws, "seed": seed, "cell_seed": pd.NA})
    df = _finish(rows, level, simultaneous, front=("theta", "point"))
    df["theta"] = df["theta"].astype("Int64")
    df["cell_seed"] = df["cell_seed"].astype("Int64")
    return df


def auto_beta_check(
    model: KnownGradientModel,
    B_values: Sequence[int] | int = (2, 4, 8, 16),
    n: int = 64,
    n_draws: int = 2000,
    seed: int = 0,
    rule: Literal["fedgp", "fedda"] | Sequence[str] = "fedgp",
    *,
    m: float = math.inf,
    quantiles: Sequence[float] = (0.05, 0.25, 0.5, 0.75, 0.95),
) -> pd.DataFrame:
    """The auto-weighted β estimated from B target parts against the optimal β from the true quantities.

    Estimated: :func:`fda_core.core.estimators.auto_beta` on each of ``n_draws`` target sets of n points
    (raw estimates clamped at 0, then FedDA β̂ = σ̂²/(σ̂² + d̂²), FedGP β̂ = σ̂²(1−1/m)/(σ̂²(1−1/m) + (τ²d²)^);
    0/0 → 0.5). Optimal: :func:`fda_core.core.theory.optimal_beta_fedda` (σ²/(σ² + d²)) or
    :func:`fda_core.core.theory.optimal_beta_fedgp` (σ²(1−1/m)/(σ²(1−1/m) + τ²d²)) with the exact σ² of an
    n-point set, d_i² and τ_i²d_i² (docs/theory.md § Optimal weights). ``m`` (default inf, the papers'
    choice) is used for both. Each (rule, B) cell draws with seed ``derive_seed(seed, 3, B, n)`` (both
    rules see the same draws). ``rule`` may be one rule or a list.

    Returns one row per (rule, source, B): rule, source, B, n, beta_optimal, beta_mean, beta_std,
    beta_q05 … beta_q95 (the ``quantiles``), beta_bias = beta_mean − beta_optimal, beta_rmse,
    frac_beta_one (share of draws with β̂ = 1, i.e. estimated distance ≤ 0), sigma2, dist (the true
    d² or τ²d² the rule uses), m, n_draws, seed, cell_seed. β̂ is a ratio of estimates, so even with
    unbiased inputs it is not unbiased for β* (Jensen): the table shows by how much.
    """
    _check_model(model)
    n_draws = _check_draws(n_draws)
    n = _check_n(n)
    rules = [rule] if isinstance(rule, str) else list(rule)
    if not rules or any(r not in ("fedgp", "fedda") for r in rules):
        raise ValueError(f"rule must be 'fedgp' or 'fedda' (or a list of them), got {rule!r}")
    if not m >= 1:
        raise ValueError(f"m (number of parameters) must be >= 1, got {m!r}")
    qs = [float(q) for q in quantiles]
    if any(not 0 <= q <= 1 for q in qs):
        raise ValueError(f"quantiles must lie in [0, 1], got {quantiles!r}")
    cells = _grid(B_values, [n], skip_invalid=False)
    truth = true_quantities(model, n)
    sigma2 = float(truth["sigma2"][0])
    rows = []
    for B, _ in cells:
        cell_seed = derive_seed(seed, _SALT["auto_beta"], B, n)
        est = _draw_estimates(model, B, n, n_draws, cell_seed, rules=rules, m_beta=m)
        for r in rules:
            betas = est[f"beta_{r}"].numpy().reshape(n_draws, -1)
            dist = truth["d2"] if r == "fedda" else truth["tau2d2"]
            for i in range(betas.shape[1]):
                if r == "fedda":
                    opt = float(theory.optimal_beta_fedda(sigma2, float(dist[i])))
                else:
                    opt = float(theory.optimal_beta_fedgp(sigma2, float(dist[i]), m))
                b = betas[:, i]
                row = {"rule": r, "source": i, "B": B, "n": n, "beta_optimal": opt, "beta_mean": float(b.mean()),
                       "beta_std": float(b.std(ddof=1))}
                for q in qs:
                    row[f"beta_q{round(q * 100):02d}"] = float(np.quantile(b, q))
                row.update({
                    "beta_bias": float(b.mean()) - opt, "beta_rmse": float(np.sqrt(np.mean((b - opt) ** 2))),
                    "frac_beta_one": float((b >= 1.0).mean()), "sigma2": sigma2, "dist": float(dist[i]), "m": m,
                    "n_draws": n_draws, "seed": seed, "cell_seed": cell_seed,
                })
                rows.append(row)
    return pd.DataFrame(rows)
