"""The batched trainer of the phase diagram: every (trial, shift level, subset size, rule, β) of the grid
trained together, with stacked parameters and the hand-written batched passes of
:mod:`fda_core.data.sigmoid_net` (``docs/experiments.md`` § Synthetic phase diagram).

Full-batch gradient descent with momentum, 300 steps, lr 0.2, momentum 0.9 (the papers' reference code).
Every step each training takes its target gradient g_T on its target subset and its source gradient g_S
on the whole source set of its shift level, both at its own current parameters, and steps along ĝ of
its rule: source only ĝ = g_S, target only ĝ = g_T, FedDA ĝ = (1−β)g_T + βg_S and FedGP
ĝ = (1−β)g_T + β max(⟨g_T, g_S⟩, 0) g_S/‖g_S‖² (:func:`fda_core.core.aggregation.fedda` /
:func:`~fda_core.core.aggregation.fedgp`, batched, N = 1), with β weighting the SOURCE part. Auto rules
estimate β once at θ0 (or every ``reestimate_every`` steps) from B target parts
(:func:`fda_core.core.estimators.auto_beta`, on the flat vector as the reference's estimators).

Two options reproduce the reference code exactly (the defaults) or keep the library's earlier behaviour
(``docs/experiments.md`` § Synthetic phase diagram, where the algebra is written out):

* ``training_step``: ``"reference"`` — the loss sums the squared error over the 10 outputs (mean over the
  points) and the momentum step applies lr twice, v ← μ·v + lr·ĝ, θ ← θ − lr·v; ``"library"`` — the
  mean-over-outputs MSE and ``torch.optim.SGD`` (b ← μ·b + ĝ, θ ← θ − lr·b). The reference step equals
  the library step at lr' = 10·lr² (0.4 for lr 0.2) in exact arithmetic.
* ``granularity`` of FedGP's projection: ``"per_tensor"`` — each of W1, b1, W2, b2 projected separately,
  as the reference code trains (:func:`fedgp_per_tensor`); ``"flat"`` — the whole 6,110-vector (what the
  theory analyses). FedDA, source only and target only are linear, the same either way.

:func:`fda_core.experiments.phase_diagram.reference.train_single` is the plain one-training-at-a-time
version it is tested against.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ...common.checks import check_int as _check_int
from ...common.devices import resolve_device
from ...core.aggregation import fedda, fedgp
from ...core.estimators import auto_beta
from ...data.sigmoid_net import (N_HIDDEN, N_OUTPUTS, PARAM_TENSORS, Workspace, batched_backward, batched_forward,
                                  batched_set_gradient, init_params, outputs_averaged)
from ...data.synthetic import SyntheticData
from .result import GridResult
from .selection import _KINDS, grid_indices as _indices, resolve_methods

__all__ = ["train_grid", "auto_chunk_size", "describe_training", "batched_rule", "fedgp_per_tensor", "check_training_options",
           "REFERENCE_TRAINING", "TRAINING_STEPS", "GRANULARITIES"]

#: The optimiser of the papers' reference code (the defaults of :func:`train_grid`): its step (loss summed
#: over the outputs, lr applied twice) and FedGP projected per parameter tensor.
REFERENCE_TRAINING = {"steps": 300, "lr": 0.2, "momentum": 0.9, "training_step": "reference",
                      "granularity": "per_tensor"}
#: Values of ``training_step``: the reference code's step (default) and the library's (torch.optim.SGD, mean MSE).
TRAINING_STEPS = ("reference", "library")
#: Values of ``granularity`` (of FedGP's projection): per parameter tensor (default, reference code) or flat.
GRANULARITIES = ("per_tensor", "flat")

_CPU_BUDGET = 8 << 20  # bytes of one (chunk × 100 × n) activation tensor on the CPU (cache-sized)
_CUDA_BUDGET = 1 << 30


def auto_chunk_size(n_points: int, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                    budget_bytes: int | None = None) -> int:
    """Trainings per chunk so that one (chunk, 100, n) activation tensor takes ``budget_bytes``.

    Default budgets: 8 MiB on the CPU (10 trainings per chunk at n = 2000, 4 at n = 5000) and 1 GiB on
    CUDA (as many trainings at once as possible; the peak use is ≈ 4 such tensors). Measured on the first
    2-core VM (ms per training-step, ``benchmarks/phase_diagram.py``, 2 threads): n = 2000 — chunk 1: 1.00,
    4: 0.63, 8: 0.60, 16: 0.59, 32: 0.65, 64: 0.65; n = 5000 — chunk 2: 1.47, 4: 1.38, 8: 1.37, 16: 1.50,
    32: 1.67. Again on the AMD EPYC kind that CI runs on (2026-11-30, the same way): n = 2000 — chunk 1:
    0.82, 4: 0.53, 8: 0.50, 16: 0.51, 32: 0.57, 64: 0.58; n = 5000 — chunk 2: 1.24, 4: 1.23, 8: 1.29,
    16: 1.39, 32: 1.51: the same budget still lands at or next to the fastest chunk. One at a time pays
    the per-step Python and aggregation overhead; large chunks stream their (chunk, 100, n) activations
    through memory several times per step instead of through the caches.
    The CUDA budget is not measured yet (no GPU was available).
    """
    dev = resolve_device(device)
    budget = budget_bytes if budget_bytes is not None else (_CUDA_BUDGET if dev.type == "cuda" else _CPU_BUDGET)
    per = N_HIDDEN * max(int(n_points), 1) * torch.tensor([], dtype=dtype).element_size()
    return int(max(1, min(4096, budget // per)))


def _check_choice(value: Any, name: str, allowed: Sequence[str]) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ValueError(f"{name} must be one of {list(allowed)}, got {value!r}")


def check_training_options(training_step: str, granularity: str) -> None:
    """Raise ValueError naming the parameter and its allowed values for a bad ``training_step`` (one of
    :data:`TRAINING_STEPS`) or ``granularity`` (one of :data:`GRANULARITIES`)."""
    _check_choice(training_step, "training_step", TRAINING_STEPS)
    _check_choice(granularity, "granularity", GRANULARITIES)


def _block_sizes() -> list[int]:
    return [sl.stop - sl.start for _, sl, _ in PARAM_TENSORS]


def fedgp_per_tensor(source_grad: Tensor, target_grad: Tensor, beta: Tensor) -> Tensor:
    """FedGP with one source applied to each parameter tensor of the network separately, for C trainings
    at once: for every tensor ℓ of :data:`fda_core.data.sigmoid_net.PARAM_TENSORS` (W1, b1, W2, b2)

        ĝ^ℓ = (1 − β) g_T^ℓ + β max(⟨g_T^ℓ, g_S^ℓ⟩, 0) g_S^ℓ / ‖g_S^ℓ‖²

    (FedGP paper § 4, Proj₊; per tensor as the papers' reference code trains, ``docs/theory.md`` § Layer-wise
    application, ``docs/experiments.md`` § Synthetic phase diagram). A zero source tensor contributes 0.
    The same numbers as :func:`fda_core.core.aggregation.fedgp` on the dict form
    (:func:`fda_core.data.sigmoid_net.param_dict`) of each training, in a few (C, m) passes instead of one
    call per training and tensor; no slower than the flat batched call (``benchmarks/phase_diagram.py`` (f),
    2-core CPU: 217 vs 374 µs for 10 trainings).

    Args:
        source_grad: (C, m) source gradients g_S (flat, :mod:`fda_core.data.sigmoid_net` order).
        target_grad: (C, m) target gradients g_T.
        beta: (C,) β per training in [0, 1] (weight of the source part).
    Returns:
        (C, m) aggregated gradients ĝ.
    """
    if source_grad.shape != target_grad.shape or source_grad.ndim != 2:
        raise ValueError(f"source_grad and target_grad must both have shape (C, m), got {tuple(source_grad.shape)} "
                         f"and {tuple(target_grad.shape)}")
    if beta.shape != source_grad.shape[:1]:
        raise ValueError(f"beta must have shape (C,) = {tuple(source_grad.shape[:1])}, got {tuple(beta.shape)}")
    slices = [sl for _, sl, _ in PARAM_TENSORS]
    dots = torch.stack([torch.linalg.vecdot(target_grad[:, sl], source_grad[:, sl]) for sl in slices], dim=1)
    norms2 = torch.stack([torch.linalg.vecdot(source_grad[:, sl], source_grad[:, sl]) for sl in slices], dim=1)
    safe = torch.where(norms2 > 0, norms2, torch.ones_like(norms2))
    b = beta.to(target_grad.dtype).unsqueeze(1)
    coef = torch.where(norms2 > 0, dots.clamp_min(0) / safe, torch.zeros_like(dots)) * b  # (C, tensors)
    sizes = torch.tensor(_block_sizes(), device=coef.device)
    return torch.addcmul(target_grad * (1.0 - b), torch.repeat_interleave(coef, sizes, dim=1), source_grad)


def batched_rule(kind: str, source_grad: Tensor, target_grad: Tensor, beta: Tensor,
                 granularity: str = "per_tensor") -> Tensor:
    """ĝ of C trainings at once: ``kind`` "source_only" (g_S), "target_only" (g_T), "fedda" or "fedgp"
    (:func:`fda_core.core.aggregation.fedda` / :func:`~fda_core.core.aggregation.fedgp` batched with N = 1
    on the flat vectors; FedGP with ``granularity="per_tensor"`` per parameter tensor,
    :func:`fedgp_per_tensor`). ``source_grad``, ``target_grad``: (C, m); ``beta``: (C,). What the trainer
    applies every step."""
    _check_choice(granularity, "granularity", GRANULARITIES)
    if kind == "source_only":
        return source_grad
    if kind == "target_only":
        return target_grad
    if kind == "fedgp" and granularity == "per_tensor":
        return fedgp_per_tensor(source_grad, target_grad, beta)
    if kind not in ("fedda", "fedgp"):
        raise ValueError(f"kind must be one of {list(_KINDS)}, got {kind!r}")
    fn = fedda if kind == "fedda" else fedgp
    return fn(source_grad.unsqueeze(1), target_grad, beta.unsqueeze(1))


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


def _family_indices(kinds: list[str], device: torch.device) -> list[tuple[str, Tensor | None]]:
    """[(kind, index tensor or None when the kind covers the whole chunk)]."""
    out = []
    for kind in _KINDS:
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
    reference_step = cfg["training_step"] == "reference"
    # the training loss: squared error summed over the outputs (reference) or averaged (library), mean over points
    reduction = "sum" if reference_step else "mean"
    x = data.x
    theta = torch.stack([theta0[t.trial] for t in trajs]).clone()
    buf = torch.zeros_like(theta)
    needs_s = trajs[0].needs_source
    needs_t = trajs[0].needs_target
    kinds = [t.kind for t in trajs]
    families = _family_indices(kinds, dev)
    beta = torch.tensor([t.beta for t in trajs], dtype=dt, device=dev)
    auto_idx = {rule: [i for i, t in enumerate(trajs) if t.auto and t.kind == rule] for rule in ("fedda", "fedgp")}
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
    two_over_o = 2.0 / outputs_averaged(reduction)  # d(loss)/d(output) per point, before the 1/k of the mean

    def record(out: Tensor, step: int) -> None:
        sq = (out - y_t).square_().sum(1) / N_OUTPUTS  # (C, n)
        losses[:, :, eval_pos[step]] = torch.bmm(test_w, sq.unsqueeze(-1)).squeeze(-1)

    g_s = g_t = None
    ws = Workspace()
    for step in range(steps + 1):
        is_eval = step in eval_pos
        if needs_s and step < steps:
            g_s = batched_set_gradient(theta, x, ys, ws, "s", (lambda o: record(o, step)) if is_eval else None,
                                       output_reduction=reduction)
        elif is_eval:
            _, out = batched_forward(theta, x, ws, "s")
            record(out, step)
            del out
        if step == steps:
            break
        estimate = bool(auto_idx) and (step == 0 or (reest is not None and step % reest == 0))
        if needs_t:
            Ht, outt = batched_forward(theta, xt, ws, "t")
            rt = outt.sub_(yt).mul_(two_over_o)
            w = w_est if estimate else w_t
            g = batched_backward(theta, xt, Ht, rt.unsqueeze(1) * w.unsqueeze(2), ws, "t")
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
                gs_, gt_, b_ = (g_s, g_t, beta) if ix is None else (g_s[ix], g_t[ix], beta[ix])
                val = batched_rule(kind, gs_, gt_, b_, cfg["granularity"])
            if ix is None:
                ghat = val
            else:
                ghat[ix] = val
        if reference_step:  # the reference code: v ← μ·v + lr·ĝ, θ ← θ − lr·v (docs/experiments.md § Synthetic phase diagram)
            buf.mul_(mom).add_(ghat, alpha=lr)
        else:  # torch.optim.SGD: b ← μ·b + ĝ, θ ← θ − lr·b
            buf.mul_(mom).add_(ghat)
        theta.add_(buf, alpha=-lr)
        if bad is not None:
            theta[bad] = float("nan")
        if bar is not None:
            bar.update(C)
    beta_mean = beta_sum / n_est if n_est else beta_init
    return losses, beta_init, beta_mean


_LOSS_WORDS = {
    "reference": "training: squared error summed over the outputs, mean over points (reference code); "
                 "test: MSE, mean over points and outputs",
    "library": "MSE, mean over points and outputs",
}


def train_grid(
    data: SyntheticData,
    *,
    rules: Sequence[Any] | None = None,
    betas: Sequence[float] = (0.5,),
    steps: int = 300,
    lr: float = 0.2,
    momentum: float = 0.9,
    training_step: str = "reference",
    granularity: str = "per_tensor",
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
    batched with N = 1, FedGP per parameter tensor or flat by ``granularity``; source only g_S; target
    only g_T), then a momentum step by ``training_step``: ``"reference"`` (default, the papers' reference
    code) differentiates the squared error summed over the 10 outputs and steps v ← momentum·v + lr·ĝ,
    θ ← θ − lr·v; ``"library"`` differentiates the mean-over-outputs MSE and steps as ``torch.optim.SGD``,
    buf ← momentum·buf + ĝ, θ ← θ − lr·buf. (The reference step is the library step at lr' = 10·lr², 0.4 for
    lr = 0.2: ``docs/experiments.md`` § Synthetic phase diagram.) Auto rules take β from
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
        rules: methods of the registry by name, spec or instance (default: every registered method with a
            ``gradient_rule``, :func:`~fda_core.experiments.phase_diagram.selection.synthetic_methods`);
            FedDA/FedGP given by name run once per β of ``betas`` (a spec such as ``"fedgp(beta=0.2)"`` runs
            its own β). The table's ``method`` column holds each method's display label, ``rule`` its
            canonical name and ``beta`` its fixed β (NaN for methods without one).
        steps, lr, momentum: optimiser (reference: 300, 0.2, 0.9).
        training_step: ``"reference"`` (default: loss summed over the outputs, lr applied twice, as the
            reference code) or ``"library"`` (mean MSE, ``torch.optim.SGD``).
        granularity: FedGP's projection ``"per_tensor"`` (default: W1, b1, W2, b2 separately, as the reference
            code) or ``"flat"`` (the whole parameter vector, as the theory). Auto β is estimated on the flat
            vector either way (as the reference's estimators).
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
    methods = resolve_methods(rules, betas)
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
    check_training_options(training_step, granularity)
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
    if any(gm.estimates_beta for gm in methods):
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
                for gm in methods:
                    auto, kind, b = gm.estimates_beta, gm.gradient_rule, gm.beta
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
                        "size_index": j, "subset_size": data.subset_sizes[j], "rule": gm.name, "beta": b,
                        "method": gm.label, "trajectory": ti,
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
           "reestimate_every": reestimate_every, "training_step": training_step, "granularity": granularity}
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
        "rules": [gm.spec for gm in methods], "methods": [gm.label for gm in methods],
        "betas": [float(b) for b in betas] if betas is not None else None, "steps": steps,
        "lr": float(lr), "momentum": float(momentum), "training_step": training_step, "granularity": granularity,
        "n_parts": n_parts, "reestimate_every": reestimate_every,
        "eval_every": eval_every, "trials": trials_, "shift_indices": shifts, "size_indices": sizes,
        "n_points": data.n_points, "shift_levels": [float(v) for v in data.shift_levels],
        "subset_sizes": list(data.subset_sizes), "seed": data.seed, "dtype": str(dt).replace("torch.", ""),
        "dedupe": dedupe, "loss": _LOSS_WORDS[training_step],
    }
    timing = {
        "wall_s": wall, "device": str(dev), "chunk_size": chunk, "n_chunks": len(chunks), "n_rows": len(rows),
        "n_trainings_run": len(trajs), "steps": steps,
        "ms_per_training_step": 1e3 * wall / max(1, len(trajs) * steps),
        "torch_threads": torch.get_num_threads(),
    }
    return GridResult(table, curves, eval_steps, config, timing)


def describe_training(config: dict) -> str:
    """The training of a :class:`GridResult` in words, generated from its ``config`` (what actually ran).

    A config without ``training_step``/``granularity`` (stored before these options existed) ran the
    library step with the flat projection."""
    methods = resolve_methods(config["rules"], None)
    fixed = [f"{gm.label} {gm.beta:g}" for gm in methods if gm.fixed_beta]
    auto = any(gm.estimates_beta for gm in methods)
    ref = REFERENCE_TRAINING
    step = config.get("training_step", "library")
    granularity = config.get("granularity", "flat")
    lr, mom = config["lr"], config["momentum"]
    if step == "reference":
        how = (f"the reference code's step: squared error summed over the {N_OUTPUTS} outputs (mean over points), "
               f"v ← {mom:g}·v + {lr:g}·ĝ, θ ← θ − {lr:g}·v (= SGD with momentum {mom:g} at lr "
               f"{N_OUTPUTS * lr * lr:g} on the mean MSE)")
    else:
        how = (f"the library's step: MSE averaged over points and outputs, torch.optim.SGD (b ← {mom:g}·b + ĝ, "
               f"θ ← θ − {lr:g}·b; the reference code's step at this lr is this step at lr {N_OUTPUTS * lr * lr:g})")
    has_gp = any(gm.gradient_rule == "fedgp" for gm in methods)
    where = ("per parameter tensor (W1, b1, W2, b2), as the reference code" if granularity == "per_tensor"
             else "on the whole flat parameter vector (the reference code projects per tensor)")
    text = (f"Training: full-batch gradient descent with momentum, {config['steps']} steps, lr {lr:g}, momentum "
            f"{mom:g} (reference code: {ref['steps']}, {ref['lr']:g}, {ref['momentum']:g}), {how}; "
            f"{config['dtype']}; every step the target gradient on the subset and the source gradient on the whole "
            f"source set; methods {', '.join(gm.label for gm in methods)}")
    if has_gp:
        text += f"; FedGP projects {where}"
    if fixed:
        text += f"; β (weight of the source part): {', '.join(fixed)}"
    if auto:
        every = config.get("reestimate_every")
        when = f"every {every} steps" if every else "once at the initialisation"
        text += f"; auto β from B = {config['n_parts']} target parts, {when}"
    return text + (f"; target test MSE every {config['eval_every']} steps; trials "
                   f"{', '.join(str(t) for t in config['trials'])}.")
