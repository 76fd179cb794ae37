"""DomainBed's MNIST environments: ColoredMNIST and RotatedMNIST (leave-one-domain-out)."""

from __future__ import annotations

import math
import os
from typing import Sequence

import torch
from torch import Tensor

from .base import FDADataset, _check_seed, register_dataset
from .loaders import _MNIST5K_NOTE, _mnist_source_text, load_mnist
from .transforms import rotate_images


def _bernoulli(p: float, size: int, g: torch.Generator) -> Tensor:
    # DomainBed ColoredMNIST.torch_bernoulli_: (rand(size) < p).float(), here with a seeded generator
    return (torch.rand(size, generator=g) < p).float()


def _xor(a: Tensor, b: Tensor) -> Tensor:
    # DomainBed ColoredMNIST.torch_xor_: |a - b| on {0, 1} floats
    return (a - b).abs()


class ColoredMNIST(FDADataset):
    """DomainBed's ColoredMNIST (Arjovsky et al. 2019, IRM; DomainBed ``datasets.py``), 3 environments.

    Construction (DomainBed ``MultipleEnvironmentMNIST`` + ``ColoredMNIST.color_dataset``): MNIST train
    and test images concatenated, shuffled with a permutation seeded by ``seed``; environment i gets
    ``images[i::3]``. Per environment: with ``image_size=14`` (default) images subsampled 2x by
    ``[:, ::2, ::2]`` to 14×14 (the IRM code and early DomainBed; about 4× cheaper for a CNN), with
    ``image_size=28`` kept at 28×28 (current DomainBed and the papers' reference code, whose ColoredMNIST
    has the subsampling commented out); binary label ``digit < 5``; the label is flipped
    with probability 0.25; colour = label XOR Bernoulli(e), e = 0.1, 0.2, 0.9 for ``'+90%'``, ``'+80%'``,
    ``'-90%'``; two channels, channel ``1 - colour`` zeroed. ``x (n_i, 2, S, S)`` (S = ``image_size``) float32 in [0, 1]
    (= uint8/255), ``y (n_i,)`` int64 in {0, 1}. All randomness comes from one ``torch.Generator``
    seeded with ``seed`` (permutation, then label flips and colours env by env, as DomainBed's order).
    Extra attributes: ``digits[i]`` (the original digit of each example), ``colors[i]`` (0/1).
    ``data_root=None`` uses MNIST-5k (env sizes 1,667 / 1,667 / 1,666); otherwise full MNIST (IDX files).
    """

    ENVIRONMENTS = ["+90%", "+80%", "-90%"]
    COLOR_FLIP = (0.1, 0.2, 0.9)  # DomainBed: super().__init__(root, [0.1, 0.2, 0.9], ...)
    LABEL_FLIP = 0.25
    input_shape = (2, 14, 14)
    num_classes = 2
    default_target = None
    name = "ColoredMNIST"

    IMAGE_SIZES = (14, 28)

    def __init__(self, data_root: str | os.PathLike | None = None, seed: int = 0, image_size: int = 14) -> None:
        super().__init__()
        self.seed = _check_seed(seed)
        if isinstance(image_size, bool) or image_size not in self.IMAGE_SIZES:
            raise ValueError(f"image_size must be 14 (IRM's 2x subsampling) or 28 (the reference code, current "
                             f"DomainBed), got {image_size!r}")
        self.image_size = int(image_size)
        self.input_shape = (2, self.image_size, self.image_size)
        self.data_root = data_root
        step = 28 // self.image_size
        images, digits = load_mnist(data_root)
        g = torch.Generator().manual_seed(self.seed)
        shuffle = torch.randperm(len(images), generator=g)
        images, digits = images[shuffle], digits[shuffle]
        self.digits: list[Tensor] = []
        self.colors: list[Tensor] = []
        k = len(self.ENVIRONMENTS)
        for i, e in enumerate(self.COLOR_FLIP):
            imgs = images[i::k, 0, ::step, ::step]  # (n_i, S, S); S = 14: the IRM code's 2x subsampling
            dig = digits[i::k]
            labels = (dig < 5).float()
            labels = _xor(labels, _bernoulli(self.LABEL_FLIP, len(labels), g))
            colors = _xor(labels, _bernoulli(e, len(labels), g))
            x = torch.stack([imgs, imgs], dim=1).contiguous()
            x[torch.arange(len(x)), (1 - colors).long(), :, :] = 0.0  # zero the other colour channel
            self.datasets.append((x, labels.long()))
            self.digits.append(dig)
            self.colors.append(colors.long())

    def describe(self) -> str:
        src = _mnist_source_text(self.data_root)
        diff = (
            _MNIST5K_NOTE + "; the paper's 0.1% labelled target (≈18 images) must be given as a count"
            if self.data_root is None
            else "same data as the paper (full MNIST)"
        )
        if self.image_size == 14:
            pixels = "digits subsampled to 14×14 (every other pixel)"
            diff += "; images are 14×14 (the IRM code; the reference code, like current DomainBed, uses 28×28)"
        else:
            pixels = "28×28 digits (as the reference code)"
        return (
            f"ColoredMNIST as DomainBed builds it: {src}, shuffled (seed {self.seed}), environment i = "
            f"images[i::3]; {pixels}, binary label digit<5 flipped with "
            f"probability 0.25, colour = label flipped with probability 0.1/0.2/0.9, the other of two channels "
            f"zeroed. Sizes: {self._sizes_text()}. Leave-one-domain-out (the FedGP paper's Table 1). "
            f"Differences from the paper: {diff}."
        )


class RotatedMNIST(FDADataset):
    """DomainBed's RotatedMNIST (``datasets.py``): shuffled MNIST, environment i = ``images[i::len(angles)]``
    rotated counter-clockwise by ``angles[i]`` degrees as torchvision's ``rotate`` (bilinear, zero fill;
    :func:`rotate_images`).

    Names are the angles as strings (``"0"``, ``"15"``, …). ``x (n_i, 1, 28, 28)`` float32,
    ``y (n_i,)`` int64 digits, 10 classes. ``data_root=None`` uses MNIST-5k (sizes 834, 834, 833, 833,
    833, 833 for the six default angles); the permutation is seeded with ``seed``.
    """

    input_shape = (1, 28, 28)
    num_classes = 10
    default_target = None
    name = "RotatedMNIST"

    def __init__(
        self,
        data_root: str | os.PathLike | None = None,
        seed: int = 0,
        angles: Sequence[float] = (0, 15, 30, 45, 60, 75),
    ) -> None:
        super().__init__()
        self.seed = _check_seed(seed)
        self.data_root = data_root
        try:
            angles = [float(a) for a in angles]
        except (TypeError, ValueError):
            raise ValueError(f"angles must be a sequence of numbers (degrees), got {angles!r}") from None
        names = [f"{a:g}" for a in angles]
        if not angles or not all(math.isfinite(a) for a in angles) or len(set(names)) != len(names):
            raise ValueError(f"angles must be a non-empty sequence of distinct finite numbers, got {angles!r}")
        self.angles = angles
        self.ENVIRONMENTS = names
        images, labels = load_mnist(data_root)
        g = torch.Generator().manual_seed(self.seed)
        shuffle = torch.randperm(len(images), generator=g)
        images, labels = images[shuffle], labels[shuffle]
        k = len(angles)
        for i, a in enumerate(angles):
            x = images[i::k]
            x = x.clone() if a % 360 == 0 else rotate_images(x, a)
            self.datasets.append((x, labels[i::k]))

    def describe(self) -> str:
        src = _mnist_source_text(self.data_root)
        diff = _MNIST5K_NOTE if self.data_root is None else "full MNIST as in DomainBed"
        return (
            f"RotatedMNIST as DomainBed builds it: {src}, shuffled (seed {self.seed}), environment i = "
            f"images[i::{len(self.angles)}] rotated by {self.ENVIRONMENTS} degrees (bilinear, zero fill; "
            f"torch grid_sample instead of torchvision's rotate). Sizes: {self._sizes_text()}. "
            f"Differences: {diff}."
        )


register_dataset("ColoredMNIST", ColoredMNIST)
register_dataset("RotatedMNIST", RotatedMNIST)
