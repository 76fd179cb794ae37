"""Digit stand-ins of the weakly-supervised FDA paper's image experiments, from the offline MNIST-5k.

* ``"NonIIDMNIST"`` (paper App. A.6, Table 6): 8 source clients holding 3 digit classes each (NIID-Bench's
  quantity-based label imbalance "#C=3"), a target client holding all 10 classes with Gaussian feature
  noise. It is :class:`~fda_core.data.datasets.NoisyFeatures` with those options (one partition code), plus
  AUC among its metrics.
* ``"DigitConditions"`` — the CheXpert-style split (paper § 5.1: domains by labelled condition, the task
  "is this condition present?", auxiliary labels per image). Each environment is one "condition", a digit
  c: positives are images of c, negatives images of other digits, half and half; the target is a condition
  no source was trained on. Every image carries three auxiliary labels computed from the image itself or
  from what we did to it (``docs/auxiliary.md`` § Data sets):

  - ``view`` — 0 upright, 1 rotated by 90° (``torch.rot90``, exact; a seeded half of each environment), the
    analogue of CheXpert's frontal/lateral view;
  - ``thickness`` — stroke thickness 2A/P of the binarised digit (A ink pixels, P boundary pixels: the
    ink pixels with a 4-neighbour off; for a stroke of width w and length L, A ≈ wL and P ≈ 2L), above (1)
    or below (0) its median over MNIST-5k;
  - ``slant`` — the shear −μ₁₁/μ₀₂ of the intensity moments (x the column, y the row; positive when the
    top leans right, as Morpho-MNIST's slant), above (1) or below (0) its median over MNIST-5k.

  Thickness and slant are measured on the upright digit, before any rotation.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.checks import check_int, check_number
from .auxiliary import AuxDataset, AuxTask
from .datasets import NoisyFeatures, load_mnist, register_dataset

__all__ = ["NonIIDMNIST", "DigitConditions", "stroke_thickness", "slant", "DIGIT_TASKS"]

#: The auxiliary tasks of :class:`DigitConditions`, in column order.
DIGIT_TASKS = (AuxTask("view", "classification", 2), AuxTask("thickness", "classification", 2),
               AuxTask("slant", "classification", 2))


class NonIIDMNIST(NoisyFeatures):
    """Non-IID MNIST of the weakly-supervised FDA paper (App. A.6.1): ``n_sources`` = 8 sources with
    ``source_labels`` = 3 classes each (NIID-Bench "#C=3"), a 10-class target with N(0, ``noise_std``²)
    pixel noise. The partition is :class:`~fda_core.data.datasets.NoisyFeatures` ``(n_sources=8,
    source_labels=3)``: MNIST-5k is cut into 9 IID chunks of 555 images, the last is the target, the
    sources split the rest by classes."""

    name = "NonIIDMNIST"
    metrics = ("acc", "auc")

    def __init__(self, noise_std: float = 0.8, n_sources: int = 8, source_labels: int = 3,
                 data_root: str | os.PathLike | None = None, seed: int = 0) -> None:
        super().__init__(base="mnist", data_root=data_root, n_sources=n_sources, noise_std=noise_std,
                         source_labels=source_labels, seed=seed)

    def describe(self) -> str:
        return (
            f"Non-IID MNIST (weakly-supervised FDA paper App. A.6): {self._base_text}; {len(self) - 1} sources "
            f"with {self.source_labels} classes each (NIID-Bench #C={self.source_labels}; classes "
            f"{self.source_classes}; sizes {self.env_sizes()[:-1]}; {self.dropped} images of classes no source "
            f"holds left out); a target of {self.env_sizes()[-1]:,} images of all 10 classes with Gaussian noise "
            f"of std {self.noise_std:g}; seed {self.seed}. Differences: the paper uses full MNIST (60,000 "
            "images) and tests on 10,000 target images; here every client holds about 555 images."
        )


def _binary(x: Tensor, threshold: float = 0.5) -> Tensor:
    return (x > threshold).to(x.dtype)


def stroke_thickness(x: Tensor, threshold: float = 0.5) -> Tensor:
    """Stroke thickness 2A/P of each image (n, 1, H, W) → (n,): A the pixels above ``threshold``, P those of
    them with a 4-neighbour below it (``docs/auxiliary.md`` § Data sets). 0 for an empty image."""
    if x.ndim != 4 or x.shape[1] != 1:
        raise ValueError(f"x must have shape (n, 1, H, W), got {tuple(x.shape)}")
    b = _binary(x, threshold)
    pad = F.pad(b, (1, 1, 1, 1))
    neighbours = torch.stack([pad[..., :-2, 1:-1], pad[..., 2:, 1:-1], pad[..., 1:-1, :-2], pad[..., 1:-1, 2:]])
    interior = neighbours.amin(0)  # all four neighbours on
    area = b.sum((1, 2, 3))
    boundary = (b * (1 - interior)).sum((1, 2, 3))
    return torch.where(boundary > 0, 2 * area / boundary.clamp_min(1), torch.zeros_like(area))


def slant(x: Tensor) -> Tensor:
    """Shear −μ₁₁/μ₀₂ of each image's intensity (n, 1, H, W) → (n,), x the column and y the row (downwards),
    so a digit whose top leans right has a positive slant (``docs/auxiliary.md`` § Data sets). 0 for an
    empty image."""
    if x.ndim != 4 or x.shape[1] != 1:
        raise ValueError(f"x must have shape (n, 1, H, W), got {tuple(x.shape)}")
    w = x[:, 0].clamp_min(0)
    h, wd = w.shape[-2:]
    rows = torch.arange(h, dtype=w.dtype).view(1, h, 1)
    cols = torch.arange(wd, dtype=w.dtype).view(1, 1, wd)
    mass = w.sum((1, 2))
    safe = mass.clamp_min(1e-12)
    cy, cx = (w * rows).sum((1, 2)) / safe, (w * cols).sum((1, 2)) / safe
    dy, dx = rows - cy.view(-1, 1, 1), cols - cx.view(-1, 1, 1)
    mu11 = (w * dx * dy).sum((1, 2)) / safe
    mu02 = (w * dy * dy).sum((1, 2)) / safe
    return torch.where((mass > 0) & (mu02 > 0), -mu11 / mu02.clamp_min(1e-12), torch.zeros_like(mass))


@functools.lru_cache(maxsize=2)
def _digits_with_attributes(data_root: str | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The digits of ``data_root`` (None: MNIST-5k) with each image's thickness and slant, computed once."""
    x, y = load_mnist(data_root)
    if x.shape[1:] != (1, 28, 28):
        raise ValueError(f"DigitConditions needs 28x28 grey digits, got images of shape {tuple(x.shape[1:])}")
    return x, y, stroke_thickness(x), slant(x)


class DigitConditions(AuxDataset):
    """The CheXpert-style image stand-in (module docstring): one environment per condition digit in
    ``conditions``; ``n_per_class`` positives (images of the digit) and as many negatives (images of other
    digits, drawn at random from those no environment holds as a positive) per environment,
    every image used once; main task binary (1 = the condition's digit);
    auxiliary labels ``view``, ``thickness``, ``slant``. ``rotate_fraction`` of each environment (seeded)
    is shown rotated by 90°. Default target: the last condition. Inputs (1, 28, 28) in [0, 1]."""

    name = "DigitConditions"
    aux_tasks = DIGIT_TASKS
    num_classes = 2
    input_shape = (1, 28, 28)

    def __init__(self, conditions: Sequence[int] = (0, 1, 2, 3, 4), n_per_class: int = 400,
                 rotate_fraction: float = 0.5, data_root: str | os.PathLike | None = None, seed: int = 0) -> None:
        super().__init__()
        self.seed = check_int(seed, "seed", 0)
        try:
            conds = [int(c) for c in conditions]
        except (TypeError, ValueError):
            raise ValueError(f"conditions must be a list of distinct digits 0-9, got {conditions!r}") from None
        if len(conds) < 2 or len(set(conds)) != len(conds) or not all(0 <= c <= 9 for c in conds) or \
                any(isinstance(c, bool) for c in conditions):
            raise ValueError(f"conditions must be a list of at least 2 distinct digits 0-9, got {conditions!r}")
        n = check_int(n_per_class, "n_per_class", 1)
        self.rotate_fraction = check_number(rotate_fraction, "rotate_fraction", 0.0, 1.0)
        self.conditions, self.n_per_class, self.data_root = conds, n, data_root
        x, y, thick, sl = _digits_with_attributes(None if data_root is None else str(data_root))
        self.ENVIRONMENTS = [f"digit {c}" for c in conds]
        self.default_target = len(conds) - 1
        self.thickness_median, self.slant_median = float(thick.median()), float(sl.median())
        g = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(len(y), generator=g)
        used = torch.zeros(len(y), dtype=torch.bool)
        positives = []
        for c in conds:
            idx = order[y[order] == c][:n]
            if len(idx) < n:
                raise ValueError(f"n_per_class={n} is more than the {len(idx)} images of digit {c} available")
            used[idx] = True
            positives.append(idx)
        self.client_indices: list[Tensor] = []
        for c, pos in zip(conds, positives):
            pool = order[(~used[order]) & (y[order] != c)]
            if len(pool) < n:
                raise ValueError(f"n_per_class={n} leaves only {len(pool)} unused negatives for condition {c}; "
                                 "lower n_per_class")
            # negatives at random from the unused images of other digits, as the paper's CheXpert split draws
            # them from the images labelled 0 for the condition (docs/auxiliary.md § Data sets): the pool runs in
            # `order`, where the condition digits left after the positives all come late, so a prefix of it
            # would be almost only digits outside `conditions`
            neg = pool[torch.randperm(len(pool), generator=g)[:n]]
            used[neg] = True
            idx = torch.cat([pos, neg])
            idx = idx[torch.randperm(len(idx), generator=g)]
            label = (y[idx] == c).long()
            rotated = torch.zeros(len(idx), dtype=torch.bool)
            k = int(round(self.rotate_fraction * len(idx)))
            rotated[torch.randperm(len(idx), generator=g)[:k]] = True
            xi = x[idx].clone()
            xi[rotated] = torch.rot90(xi[rotated], 1, dims=(-2, -1))
            aux = torch.stack([rotated.float(), (thick[idx] > self.thickness_median).float(),
                               (sl[idx] > self.slant_median).float()], 1)
            self.client_indices.append(idx)
            self.datasets.append((xi, label))
            self.aux_labels.append(aux)
        self.check()

    def describe(self) -> str:
        return (
            f"DigitConditions (CheXpert-style stand-in, docs/auxiliary.md § Data sets): MNIST-5k digits; one "
            f"environment per condition digit {self.conditions}, each {self.n_per_class} images of the digit "
            f"(positive) and {self.n_per_class} of other digits (negative, drawn at random from the images no "
            f"client holds as a positive), every image used once; "
            f"{100 * self.rotate_fraction:g}% shown rotated by 90 degrees; auxiliary labels view, thickness "
            f"(2A/P > {self.thickness_median:.2f}), slant (> {self.slant_median:.3f}); seed {self.seed}. "
            "Differences: the paper's CheXpert split has 4,000 chest radiographs per condition and the patients' "
            "sex, age and view as auxiliary labels; here the conditions are digits and the attributes are "
            "computed from the images."
        )


register_dataset("NonIIDMNIST", NonIIDMNIST)
register_dataset("DigitConditions", DigitConditions)
