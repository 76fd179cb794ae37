"""Whole datasets as one environment ``"all"``: MNIST, Fashion-MNIST, CIFAR-10 (train+test concatenated)."""

from __future__ import annotations

import os

from torch import Tensor

from .base import FDADataset, register_dataset
from .loaders import _mnist_source_text, load_cifar10, load_fashion_mnist, load_mnist


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


register_dataset("MNIST", _mnist_factory)
register_dataset("FashionMNIST", _fashion_factory)
register_dataset("CIFAR10", _cifar_factory)
