"""The dataset base class (DomainBed's ``MultipleDomainDataset`` without the loaders), the registry of
datasets by name, and the labelled / unlabelled / test split of a target environment."""

from __future__ import annotations

import inspect
import operator
from typing import Callable

import numpy as np
import torch
from torch import Tensor

from ...common.checks import check_int, register_factory


class UnknownEnvironmentError(ValueError, IndexError):
    """An environment that a dataset does not have (a ValueError; also an IndexError so that
    sequence-style iteration over a dataset stops cleanly)."""


class FDADataset:
    """A list of environments (domains), DomainBed's ``MultipleDomainDataset`` without the loaders.

    Attributes: ``ENVIRONMENTS`` (names, in order), ``input_shape`` (e.g. ``(2, 14, 14)``),
    ``num_classes``, ``default_target`` (the target environment's index in settings with a fixed
    target, ``None`` for leave-one-domain-out sets), ``datasets`` (list of ``(x, y)``), ``metrics`` (what
    the federated loop records on the target each round, as WILDS datasets name their metrics: ``"acc"``,
    and ``"auc"`` for the weakly-supervised paper's data sets), ``input_noise`` (environment index → std of
    Gaussian pixel noise the federated loop draws anew every round on that environment's inputs; empty for
    almost every data set, see :class:`NoisyFeatures` ``noise_draw="per_round"``), ``held_out_test`` (environment
    index → ``(x, y)``, a test set of that environment held apart from its clients: the federated loop tests that
    target on it and draws the target's labelled examples from its whole environment, see :func:`train_pool_of`;
    empty for almost every data set, see :class:`NoisyFeatures` ``test_per_class``).
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
        self.input_noise: dict[int, float] = {}
        self.held_out_test: dict[int, tuple[Tensor, Tensor]] = {}

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
    register_factory(_REGISTRY, "dataset", name, factory, overwrite=overwrite)


def _load_extensions() -> None:
    """Register the datasets defined in their own modules (imported here, so that they are part of the code
    revision of every run): the weakly-supervised FDA paper's stand-ins and the CSV loader."""
    from .. import aux_csv, aux_images, clinical  # noqa: F401  (each registers its datasets on import)


def dataset_factory(name: str) -> DatasetFactory | None:
    """The factory registered under ``name``, or None when none is (yet: the extensions register on first use)."""
    return _REGISTRY.get(name)


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


def train_pool_size(n: int, train_fraction: float = 0.8) -> int:
    """How many of a target environment's ``n`` examples form its train pool (FedGP paper App. B.6:
    ``round(train_fraction * n)``; :func:`labeled_split` draws the labelled examples from it), so the most
    labelled target examples a run can ask for. ValueError for ``n`` < 1, ``train_fraction`` outside (0, 1], or an
    empty pool."""
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if not (isinstance(train_fraction, (int, float)) and 0 < train_fraction <= 1):
        raise ValueError(f"train_fraction must be in (0, 1], got {train_fraction!r}")
    n_train = int(round(train_fraction * n))
    if n_train < 1:
        raise ValueError(f"train_fraction={train_fraction} of n={n} leaves an empty train pool; increase either")
    return n_train


def train_pool_of(dataset: "FDADataset", target: int, train_fraction: float = 0.8) -> tuple[int, float]:
    """(train pool size, train fraction in effect) of environment ``target`` (an index) of ``dataset``: with a
    held-out test set (``dataset.held_out_test``, e.g. NoisyFeatures ``test_per_class``) the whole environment is
    the train pool and ``train_fraction`` does not apply (fraction 1.0), as in the FedGP paper's scripts, which
    label examples of the target's client and test on the separate test images; otherwise
    :func:`train_pool_size` of ``train_fraction``."""
    n = int(dataset[target][0].shape[0])
    fraction = 1.0 if target in (getattr(dataset, "held_out_test", None) or {}) else train_fraction
    return train_pool_size(n, fraction), fraction


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
    n_train = train_pool_size(n, train_fraction)
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


def _check_seed(seed) -> int:
    return check_int(seed, "seed")


