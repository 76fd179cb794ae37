"""Federated domain translation with Fed INB (paper: Efficient Federated Domain Translation, ICLR 2023;
``docs/translation.md``).

Modules: ``inb`` (the federated max-K-SW objective, INB layers, :class:`FedINB`), ``comms`` (the message log
and the closed-form count), ``experiments`` (one configuration fitted and evaluated on Rotated MNIST, the
cached autoencoders), ``study`` (notebook 06's runs through the result store, tied to the code revision of
``experiments``, and the CSV notes written from their configs), ``tables`` (notebook 06's tables and the
sentences that report their numbers). The maths lives in :mod:`fda_core.core` (``stiefel``, ``barycenter``,
``wasserstein``), the data and the autoencoder in :mod:`fda_core.data` (``rotated_domains``,
``autoencoder``), the figures in :mod:`fda_core.viz.translation_plots`. ``study`` and ``tables`` are not
imported here, so that editing them leaves the code revision of stored runs unchanged.
"""

from .comms import CommunicationLog, expected_parameters
from .inb import CONVENTIONS, INPUT_TRANSFORMS, VARIANTS, FedINB, INBLayer, ProbitTransform, federated_gradient, \
    max_k_sw_objective
from ...core.wasserstein import wasserstein_distance, wasserstein_distances

__all__ = ["FedINB", "INBLayer", "ProbitTransform", "VARIANTS", "CONVENTIONS", "INPUT_TRANSFORMS", "CommunicationLog",
           "expected_parameters", "federated_gradient", "max_k_sw_objective", "wasserstein_distance",
           "wasserstein_distances"]
