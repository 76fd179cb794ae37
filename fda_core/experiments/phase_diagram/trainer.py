"""The batched trainer of the phase diagram: every (trial, shift level, subset size, rule, β) of the grid
trained together, with stacked parameters and the hand-written batched passes of
:mod:`fda_core.data.sigmoid_net` (``docs/experiments.md`` § Synthetic phase diagram).

Full-batch SGD with momentum (reference: lr 0.2, momentum 0.9, 300 steps). Every step each training
takes its target gradient g_T on its target subset and its source gradient g_S on the whole source
set of its shift level, both at its own current parameters, and steps along ĝ of its rule:
source only ĝ = g_S, target only ĝ = g_T, FedDA ĝ = (1−β)g_T + βg_S and FedGP
ĝ = (1−β)g_T + β max(⟨g_T, g_S⟩, 0) g_S/‖g_S‖² (:func:`fda_core.core.aggregation.fedda` /
:func:`~fda_core.core.aggregation.fedgp`, batched, N = 1), with β weighting the SOURCE part. Auto rules
estimate β once at θ0 (or every ``reestimate_every`` steps) from B target parts
(:func:`fda_core.core.estimators.auto_beta`). :func:`fda_core.experiments.phase_diagram.reference.train_single`
is the plain one-training-at-a-time version it is tested against.
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
from ...data.sigmoid_net import N_HIDDEN, N_OUTPUTS, Workspace, batched_backward, batched_forward, batched_set_gradient, init_params
from ...data.synthetic import SyntheticData
from .result import GridResult
from .selection import _KINDS, grid_indices as _indices, resolve_methods

__all__ = ["train_grid", "auto_chunk_size", "describe_training", "REFERENCE_TRAINING"]

#: The optimiser of the papers' reference code (the defaults of :func:`train_grid`).
REFERENCE_TRAINING = {"steps": 300, "lr": 0.2, "momentum": 0.9}

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
    two_over_o = 2.0 / N_OUTPUTS

    def record(out: Tensor, step: int) -> None:
        sq = (out - y_t).square_().sum(1) / N_OUTPUTS  # (C, n)
        losses[:, :, eval_pos[step]] = torch.bmm(test_w, sq.unsqueeze(-1)).squeeze(-1)

    g_s = g_t = None
    ws = Workspace()
    for step in range(steps + 1):
        is_eval = step in eval_pos
        if needs_s and step < steps:
            g_s = batched_set_gradient(theta, x, ys, ws, "s", (lambda o: record(o, step)) if is_eval else None)
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
    rules: Sequence[Any] | None = None,
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
        rules: methods of the registry by name, spec or instance (default: every registered method with a
            ``gradient_rule``, :func:`~fda_core.experiments.phase_diagram.selection.synthetic_methods`);
            FedDA/FedGP given by name run once per β of ``betas`` (a spec such as ``"fedgp(beta=0.2)"`` runs
            its own β). The table's ``method`` column holds each method's display label, ``rule`` its
            canonical name and ``beta`` its fixed β (NaN for methods without one).
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
        "rules": [gm.spec for gm in methods], "methods": [gm.label for gm in methods],
        "betas": [float(b) for b in betas] if betas is not None else None, "steps": steps,
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


def describe_training(config: dict) -> str:
    """The training of a :class:`GridResult` in words, generated from its ``config`` (what actually ran)."""
    methods = resolve_methods(config["rules"], None)
    fixed = [f"{gm.label} {gm.beta:g}" for gm in methods if gm.fixed_beta]
    auto = any(gm.estimates_beta for gm in methods)
    ref = REFERENCE_TRAINING
    text = (f"Training: full-batch SGD with momentum, {config['steps']} steps, lr {config['lr']:g}, momentum "
            f"{config['momentum']:g} (reference code: {ref['steps']}, {ref['lr']:g}, {ref['momentum']:g}), "
            f"{config['dtype']}; every step the target gradient on the subset and the source gradient on the whole "
            f"source set; methods {', '.join(gm.label for gm in methods)}")
    if fixed:
        text += f"; β (weight of the source part): {', '.join(fixed)}"
    if auto:
        every = config.get("reestimate_every")
        when = f"every {every} steps" if every else "once at the initialisation"
        text += f"; auto β from B = {config['n_parts']} target parts, {when}"
    return text + (f"; target test MSE every {config['eval_every']} steps; trials "
                   f"{', '.join(str(t) for t in config['trials'])}.")
