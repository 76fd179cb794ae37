"""Image transforms of the shifts: rotation (RotatedMNIST), Gaussian feature noise (the semi-synthetic
"noisy features" shift) and average-pool downsampling. Shapes: batches ``(n, C, H, W)``."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ...common.checks import check_choice

#: interpolations :func:`rotate_images` offers (modes of :func:`torch.nn.functional.grid_sample`)
ROTATION_INTERPOLATIONS = ("bilinear", "nearest")


def rotate_images(x: Tensor, degrees: float, interpolation: str = "bilinear") -> Tensor:
    """Rotate a batch (n, C, H, W) counter-clockwise on screen by ``degrees`` about the centre, zero fill,
    as torchvision's ``rotate`` / PIL's ``Image.rotate`` turn an image (no torchvision needed). At 90° it
    equals ``torch.rot90(x, 1, dims=(2, 3))``: the top row becomes the left column.

    ``interpolation``: ``"bilinear"`` (DomainBed's RotatedMNIST; equal to PIL's bilinear rotation within
    its 8-bit rounding) or ``"nearest"`` (PIL's and torchvision's default, which the Fed INB official code
    and DIRT's loader use; bit-identical to PIL's rotation of 8-bit images). ``tests/test_datasets.py``
    compares both with PIL.

    The grid of :func:`torch.nn.functional.affine_grid` maps each *output* pixel (u, v) (u to the right,
    v downwards, both in [-1, 1]) to the *input* pixel it samples, so it holds the inverse rotation:
    input = R(a)·(u, v) with R(a) = [[cos a, −sin a], [sin a, cos a]]. With v pointing down, the output
    pixel above the centre (0, −1) samples the input's right (sin a, −cos a) → (1, 0) at a = 90°: what
    was on the right moves to the top, a counter-clockwise turn. (Until 2026-11-24 this function turned
    clockwise, contrary to its docstring; RotatedMNIST negated the angle and was unaffected,
    ``docs/translation.md § Rotated domains``.)
    """
    if x.ndim != 4:
        raise ValueError(f"x must have shape (n, C, H, W), got {tuple(x.shape)}")
    check_choice(interpolation, "interpolation", ROTATION_INTERPOLATIONS)
    a = math.radians(degrees)
    theta = torch.tensor([[math.cos(a), -math.sin(a), 0.0], [math.sin(a), math.cos(a), 0.0]], dtype=x.dtype)
    grid = F.affine_grid(theta.expand(x.shape[0], 2, 3), list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode=interpolation, padding_mode="zeros", align_corners=False)


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


