"""Monte-Carlo checks of the unbiased estimators σ̂², d̂², (τ²d²)^ and of the auto-β built on them.

The estimators (spec ``theory.md`` § Unbiased estimators; auto-weighted FDA paper § 4.2) are
implemented in :mod:`fda_core.estimators`; this module measures them in models whose population
gradients are known (:class:`fda_core.theory.KnownGradientModel`: Gaussian per-sample gradients, or a
pool of real per-sample gradients). Everything returns a tidy :class:`pandas.DataFrame`; notebook
``03_unbiased_estimators`` only calls these functions and plots their tables.

* :func:`estimator_check` — mean, spread and confidence interval of each raw estimate over many draws
  of the target set, for a grid of part counts B and target-set sizes n, against the exact truth; plus
  the mean of the estimate clamped at 0 (what the β formulas use).
* :func:`estimator_check_over_pi` — the same at several parameter points θ ∼ π and for the average
  over π (spec: "averaging these over θ ∼ π keeps them unbiased").
* :func:`auto_beta_check` — the estimated auto β (FedDA or FedGP) against the optimal β from the true
  quantities (spec § Optimal weights).
* :func:`simultaneous_intervals` — (re)compute Bonferroni-corrected confidence intervals over all rows
  of a table (e.g. after concatenating several checks).
* :class:`AnisotropicGaussianModel` / :func:`anisotropic_gaussian_model` — a Gaussian model with a
  different noise variance per coordinate and several sources, and :func:`gaussian_estimator_std` — the
  exact standard deviation of each estimator in any Gaussian model.
* :func:`estimator_draws`, :func:`plot_estimator_spread`, :func:`plot_relative_means`,
  :func:`plot_z_scores`, :func:`plot_spread`, :func:`plot_clamping`, :func:`plot_auto_beta` (sliders: :func:`fda_core.widgets.estimator_explorer`) — the
  notebook's figures and its slider panel.

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

from . import theory
from .estimators import auto_beta, estimate_deltas
from .theory import GaussianGradientModel, KnownGradientModel

__all__ = [
    "QUANTITIES",
    "QUANTITY_LABELS",
    "AnisotropicGaussianModel",
    "anisotropic_gaussian_model",
    "derive_seed",
    "bonferroni_z",
    "simultaneous_intervals",
    "true_quantities",
    "gaussian_estimator_std",
    "estimator_draws",
    "estimator_check",
    "estimator_check_over_pi",
    "auto_beta_check",
    "plot_relative_means",
    "plot_z_scores",
    "plot_spread",
    "plot_clamping",
    "plot_auto_beta",
    "plot_estimator_spread",
    
]

#: The three estimated quantities, in table order.
QUANTITIES = ("sigma2", "d2", "tau2d2")
#: Plot labels of the quantities.
QUANTITY_LABELS = {"sigma2": "σ̂² (target variance)", "d2": "d̂² (distance²)", "tau2d2": "(τ²d²)^ (orthogonal shift²)"}

# salts of the derived seeds, one per kind of check (so two checks never share a random stream)
_SALT = {"estimator_check": 1, "over_pi": 2, "auto_beta": 3, "draws": 4}
# bound on the elements of one (draws, B, m) chunk of part gradients (~32 MB in float64)
_CHUNK_ELEMENTS = 1 << 22


# ---------------------------------------------------------------------------------------------
# An anisotropic Gaussian model
# ---------------------------------------------------------------------------------------------
#: A Gaussian model with per-coordinate noise: :class:`fda_core.theory.GaussianGradientModel` with an
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
def derive_seed(seed: int, *keys: int) -> int:
    """A 63-bit seed for one cell of a check, from the run's ``seed`` and the cell's integer keys
    (``numpy.random.SeedSequence([seed, *keys])``): cells get independent streams, and a cell's stream
    does not change when other cells are added to or removed from the grid."""
    if not (isinstance(seed, (int, np.integer)) and seed >= 0):
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    state = np.random.SeedSequence([int(seed), *(int(k) for k in keys)]).generate_state(2, dtype=np.uint32)
    return int((int(state[0]) << 31) ^ int(state[1]))


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
    :class:`~fda_core.theory.GaussianGradientModel` or :class:`AnisotropicGaussianModel`).

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
        nrm = torch.linalg.vector_norm(g_s)
        u = g_s / nrm if nrm > 0 else torch.zeros_like(g_s)
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
    if not (isinstance(B, (int, np.integer)) and not isinstance(B, bool) and B >= 2):
        raise ValueError(f"{name} (number of target parts) must be an integer >= 2, got {B!r}")
    return int(B)


def _check_n(n: Any, name: str = "n") -> int:
    if not (isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= 2):
        raise ValueError(f"{name} (target-set size) must be an integer >= 2, got {n!r}")
    return int(n)


def _check_draws(n_draws: Any) -> int:
    if not (isinstance(n_draws, (int, np.integer)) and not isinstance(n_draws, bool) and n_draws >= 2):
        raise ValueError(f"n_draws must be an integer >= 2, got {n_draws!r}")
    return int(n_draws)


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
    :func:`fda_core.estimators.estimate_deltas` (formulas: spec ``theory.md`` § Unbiased estimators).
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

    ``models[k]`` is the known-gradient model at θ_k (e.g. :func:`fda_core.gradient_pools.mnist_gradient_models`),
    all with the same number of sources. At each θ_k, ``n_draws`` target sets are drawn with seed
    ``derive_seed(seed, 2, B, n, k)``. The "average over π" row averages the per-θ estimates draw by
    draw (draw i of the average = mean over k of draw i at θ_k: the estimate of ‖·‖²_π for π uniform
    on the points, from one target set per point), so it has ``n_draws`` draws too; its truth is the
    mean of the per-θ truths. By linearity of expectation it stays unbiased (spec theory.md
    § Unbiased estimators: "Averaging these over θ ∼ π keeps them unbiased").

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

    Estimated: :func:`fda_core.estimators.auto_beta` on each of ``n_draws`` target sets of n points
    (raw estimates clamped at 0, then FedDA β̂ = σ̂²/(σ̂² + d̂²), FedGP β̂ = σ̂²(1−1/m)/(σ̂²(1−1/m) + (τ²d²)^);
    0/0 → 0.5). Optimal: :func:`fda_core.theory.optimal_beta_fedda` (σ²/(σ² + d²)) or
    :func:`fda_core.theory.optimal_beta_fedgp` (σ²(1−1/m)/(σ²(1−1/m) + τ²d²)) with the exact σ² of an
    n-point set, d_i² and τ_i²d_i² (spec theory.md § Optimal weights). ``m`` (default inf, the papers'
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


# ---------------------------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------------------------
def _panels(table: pd.DataFrame) -> list[tuple[str, Any]]:
    keys = table[["quantity", "source"]].drop_duplicates()
    order = {q: i for i, q in enumerate(QUANTITIES)}
    keys = sorted(((q, s) for q, s in keys.itertuples(index=False)),
                  key=lambda t: (order[t[0]], -1 if pd.isna(t[1]) else int(t[1])))
    return keys


def _sel(table: pd.DataFrame, q: str, s: Any) -> pd.DataFrame:
    t = table[table.quantity == q]
    return t[t.source.isna()] if pd.isna(s) else t[t.source == s]


def _title(q: str, s: Any, n_sources: int) -> str:
    base = QUANTITY_LABELS[q]
    return base if (pd.isna(s) or n_sources <= 1) else f"{base}, source {int(s)}"


def _n_sources(table: pd.DataFrame) -> int:
    return int(table.source.dropna().nunique()) if "source" in table else 1


def plot_relative_means(table: pd.DataFrame, title: str | None = None, group: str = "n", row: str | None = None):
    """Monte-Carlo mean / truth with its confidence interval (error bars) against B (log₂ axis), one
    panel per quantity and source (columns) and per value of ``row`` (rows, optional), one line per
    value of ``group``; the dashed line at 1 is unbiased. ``table`` is an :func:`estimator_check` or
    :func:`estimator_check_over_pi` table. Returns the figure."""
    import matplotlib.pyplot as plt

    panels = _panels(table)
    n_sources = _n_sources(table)
    row_vals = [None] if row is None else sorted(table[row].dropna().unique())
    fig, axes = plt.subplots(len(row_vals), len(panels), figsize=(3.3 * len(panels), 2.9 * len(row_vals) + 0.4),
                             squeeze=False)
    groups = list(dict.fromkeys(table[group].dropna()))
    offsets = np.linspace(-0.15, 0.15, len(groups)) if len(groups) > 1 else [0.0]
    for r, rv in enumerate(row_vals):
        tr = table if rv is None else table[table[row] == rv]
        for ax, (q, s) in zip(axes[r], panels):
            t = _sel(tr, q, s)
            for off, g in zip(offsets, groups):
                tg = t[t[group] == g].sort_values("B")
                if tg.empty:
                    continue
                rel = tg["mean"] / tg["truth"]
                err = [rel - tg["ci_low"] / tg["truth"], tg["ci_high"] / tg["truth"] - rel]
                avg = isinstance(g, str) and g.startswith("average")
                ax.errorbar(np.log2(tg.B.astype(float)) + off, rel, yerr=err, fmt="s-" if avg else "o-",
                            ms=5 if avg else 3.5, capsize=2, lw=2 if avg else 0.8, color="k" if avg else None,
                            label=f"{group}={g}" if group != "point" else str(g))
            ax.axhline(1.0, color="0.3", lw=1, ls="--")
            bs = sorted(t.B.unique())
            ax.set_xticks(np.log2(bs), [str(b) for b in bs])
            ax.set_title(_title(q, s, n_sources) + ("" if rv is None else f" (n={rv})"), fontsize=9)
            if r == len(row_vals) - 1:
                ax.set_xlabel("B (target parts)")
        axes[r][0].set_ylabel("mean / truth (± CI)")
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_z_scores(table: pd.DataFrame, label: str = "model", title: str | None = None, ax=None):
    """z = (mean − truth)/stderr of every row of a check table, grouped by ``label`` and quantity,
    with the band ±z_crit of its simultaneous confidence intervals (a row outside = truth not
    covered). Unbiased estimators give z ≈ N(0, 1). Returns the axes."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    colors = {"sigma2": "#4c72b0", "d2": "#55a868", "tau2d2": "#c44e52"}
    labels = list(dict.fromkeys(table[label])) if label in table else [None]
    x0, ticks = 0, []
    for lab in labels:
        t = table if lab is None else table[table[label] == lab]
        start = x0
        for q in QUANTITIES:
            tq = t[t.quantity == q]
            xs = np.arange(x0, x0 + len(tq))
            ax.plot(xs, tq["z"], "o", ms=3, color=colors[q],
                    label=QUANTITY_LABELS[q] if lab == labels[0] else None)
            x0 += len(tq)
        ticks.append(((start + x0 - 1) / 2, str(lab) if lab is not None else ""))
        ax.axvline(x0 - 0.5, color="0.6", lw=0.8)
    z = float(table["z_crit"].iloc[0])
    ax.axhspan(-z, z, color="0.9", zorder=0, label=f"±{z:.2f}: simultaneous {float(table['level'].iloc[0]):.0%} CI")
    ax.axhline(0.0, color="k", lw=0.8)
    ax.set_xticks([t[0] for t in ticks], [t[1] for t in ticks], fontsize=8)
    ax.set_ylabel("z = (mean − truth) / stderr")
    ax.set_xlim(-1, x0)
    ax.set_ylim(-z - 0.8, z + 1.6)
    ax.legend(fontsize=7, ncol=4, loc="upper right")
    n_cov = int(table["covered"].sum())
    ax.set_title(title or f"every estimate vs its truth: {n_cov} of {len(table)} intervals cover the truth", fontsize=10)
    return ax


def _plain_log_axis(ax) -> None:
    """Log y axis labelled 0.2, 0.3, ... instead of 2×10⁻¹ (minor labels small)."""
    import matplotlib.ticker as mticker

    ax.set_yscale("log")
    ax.yaxis.set_major_formatter(mticker.FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(mticker.FormatStrFormatter("%g"))
    ax.tick_params(axis="y", which="minor", labelsize=7)


def plot_spread(table: pd.DataFrame, title: str | None = None):
    """Relative standard deviation std/truth of each raw estimator against B (log₂), one line per n,
    log y; dashed: the exact Gaussian std (``std_theory``) where available. Returns the figure."""
    import matplotlib.pyplot as plt

    panels = _panels(table)
    ns = _n_sources(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.3), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for ax, (q, s) in zip(axes[0], panels):
        t = _sel(table, q, s)
        for c, nn in zip(colors * 4, sorted(t.n.unique())):
            tn = t[t.n == nn].sort_values("B")
            ax.plot(np.log2(tn.B), tn["rel_std"], "o-", color=c, ms=4, lw=1, label=f"n={nn}")
            if tn["std_theory"].notna().any():
                ax.plot(np.log2(tn.B), tn["std_theory"] / tn["truth"].abs(), "--", color=c, lw=1)
        bs = sorted(t.B.unique())
        ax.set_xticks(np.log2(bs), [str(b) for b in bs])
        _plain_log_axis(ax)
        ax.set_xlabel("B (target parts)")
        ax.set_title(_title(q, s, ns), fontsize=9)
    exact = "std_theory" in table and table["std_theory"].notna().any()
    axes[0][0].set_ylabel("std / truth" + (" (dashed: exact)" if exact else ""))
    axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def plot_clamping(table: pd.DataFrame, title: str | None = None):
    """Bias / truth of the raw estimate (circles, ± CI) and of the estimate clamped at 0 (crosses)
    against B, one colour per n, and the share of negative draws (bars, right axis). Returns the figure."""
    import matplotlib.pyplot as plt

    panels = _panels(table)
    ns = _n_sources(table)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.4), squeeze=False)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    n_vals = sorted(table.n.unique())
    width = 0.8 / max(1, len(n_vals))
    for ax, (q, s) in zip(axes[0], panels):
        t = _sel(table, q, s)
        ax2 = ax.twinx()
        for j, (c, nn) in enumerate(zip(colors * 4, n_vals)):
            tn = t[t.n == nn].sort_values("B")
            xs = np.log2(tn.B) + (j - (len(n_vals) - 1) / 2) * width
            ax2.bar(xs, tn["frac_negative"], width=width, color=c, alpha=0.25)
            ax.errorbar(xs, tn["bias"] / tn["truth"], yerr=(tn["mean"] - tn["ci_low"]) / tn["truth"], fmt="o",
                        ms=4, color=c, capsize=2, label=f"n={nn}: raw")
            ax.plot(xs, tn["clamped_bias"] / tn["truth"], "x", ms=7, mew=2, color=c, label=f"n={nn}: clamped at 0")
        ax.axhline(0.0, color="k", lw=1, ls="--")
        ax2.set_ylim(0, 1)
        ax2.grid(False)
        ax2.tick_params(labelsize=7)
        bs = sorted(t.B.unique())
        ax.set_xticks(np.log2(bs), [str(b) for b in bs])
        ax.set_xlabel("B (target parts)")
        ax.set_title(_title(q, s, ns), fontsize=9)
        ax.set_zorder(ax2.get_zorder() + 1)
        ax.patch.set_visible(False)
    axes[0][0].set_ylabel("bias / truth")
    ax2.set_ylabel("share of negative draws (bars)", fontsize=8)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=2 * len(n_vals), fontsize=8, frameon=False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.08, 1, 1))
    return fig


def plot_auto_beta(table: pd.DataFrame, title: str | None = None, ax=None):
    """Boxes of the estimated auto β per B (box q25–q75, whiskers q05–q95, white line median, dot
    mean) against the optimal β (horizontal line), one colour per (rule, source). ``table`` is an
    :func:`auto_beta_check` table. Returns the axes."""
    import matplotlib.pyplot as plt

    ax = ax or plt.gca()
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    keys = list(table[["rule", "source"]].drop_duplicates().itertuples(index=False))
    bs = sorted(table.B.unique())
    width = 0.7 / max(1, len(keys))
    for j, (c, (r, s)) in enumerate(zip(colors * 4, keys)):
        t = table[(table.rule == r) & (table.source == s)].sort_values("B")
        xs = np.log2(t.B.astype(float)).to_numpy() + (j - (len(keys) - 1) / 2) * width
        lab = f"{'FedGP' if r == 'fedgp' else 'FedDA'}" + (f", source {s}" if table.source.nunique() > 1 else "")
        for x0, (_, row) in zip(xs, t.iterrows()):
            ax.add_patch(plt.Rectangle((x0 - width * 0.4, row.beta_q25), width * 0.8, row.beta_q75 - row.beta_q25,
                                       color=c, alpha=0.5))
            ax.plot([x0, x0], [row.beta_q05, row.beta_q95], color=c, lw=1)
            ax.plot([x0 - width * 0.4, x0 + width * 0.4], [row.beta_q50] * 2, color="w", lw=1.5)
        ax.plot(xs, t.beta_mean, "o", color=c, ms=4, label=f"{lab}: estimated β (mean)")
        opt = float(t.beta_optimal.iloc[0])
        ax.axhline(opt, color=c, ls="--", lw=1.2, label=f"{lab}: optimal β* = {opt:.2f}")
    ax.set_xticks(np.log2(bs), [str(b) for b in bs])
    ax.set_xlim(np.log2(min(bs)) - 0.6, np.log2(max(bs)) + 0.6)
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("B (target parts)")
    ax.set_ylabel("β (weight of the source part)")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    if title:
        ax.set_title(title, fontsize=10)
    return ax


def plot_estimator_spread(model: KnownGradientModel, B: int, n: int, n_draws: int = 2000, seed: int = 0,
                          level: float = 0.95, title: str | None = None):
    """Histograms of the raw estimates at one (B, n) (:func:`estimator_draws`): the truth (black), the
    Monte-Carlo mean with its ``level`` confidence interval (red band, per-panel z), the mean of the
    estimate clamped at 0 (orange) and the negative region (grey). Returns ``(fig, draws)``, the
    figure and the DataFrame of the draws plotted. The slider panel :func:`fda_core.widgets.estimator_explorer`
    redraws exactly this figure."""
    import matplotlib.pyplot as plt

    draws = estimator_draws(model, B, n, n_draws, seed)
    panels = _panels(draws)
    ns = _n_sources(draws)
    z = bonferroni_z(len(panels), level)
    fig, axes = plt.subplots(1, len(panels), figsize=(3.3 * len(panels), 3.2), squeeze=False)
    for ax, (q, s) in zip(axes[0], panels):
        t = _sel(draws, q, s)
        x = t.estimate.to_numpy()
        truth = float(t.truth.iloc[0])
        mean, se = x.mean(), x.std(ddof=1) / math.sqrt(len(x))
        ax.hist(x, bins=50, color="#4c72b0", alpha=0.6)
        lo = min(x.min(), 0.0)
        if lo < 0:
            ax.axvspan(lo, 0.0, color="0.85", zorder=0)
        ax.axvspan(mean - z * se, mean + z * se, color="#c44e52", alpha=0.35, label=f"mean ± {z:.2f} s.e.")
        ax.axvline(mean, color="#c44e52", lw=1.5)
        ax.axvline(truth, color="k", lw=1.5, ls="--", label="truth")
        ax.axvline(float(t.clamped.mean()), color="#dd8452", lw=1.5, ls=":", label="mean clamped at 0")
        ax.set_title(_title(q, s, ns), fontsize=9)
        ax.set_xlabel("estimate")
        ax.set_yticks([])
    axes[0][0].legend(fontsize=7)
    fig.suptitle(title or f"raw estimates over {n_draws} target sets: B = {B} parts of n = {n} points", fontsize=10)
    fig.tight_layout()
    return fig, draws
