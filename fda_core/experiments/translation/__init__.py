"""Federated domain translation with Fed INB (paper: Efficient Federated Domain Translation, ICLR 2023;
``docs/translation.md``).

Modules: ``stiefel`` (Haar init, Cayley step, Armijo backtracking), ``barycenter`` (VW histograms, client
CDFs, barycenter quantile maps), ``inb`` (the federated max-K-SW objective, INB layers, :class:`FedINB`),
``autoencoder`` (the paper's MNIST conv autoencoder), ``comms`` (the message log), ``metrics``
(Wasserstein distance through POT), ``data`` (Rotated MNIST clients), ``experiments`` (one configuration
fitted and evaluated, for notebook 06), ``plots`` (its figures).
"""

from .comms import CommunicationLog, expected_parameters
from .inb import VARIANTS, FedINB, INBLayer, federated_gradient, max_k_sw_objective
from ...core.wasserstein import wasserstein_distance, wasserstein_distances

__all__ = ["FedINB", "INBLayer", "VARIANTS", "CommunicationLog", "expected_parameters", "federated_gradient",
           "max_k_sw_objective", "wasserstein_distance", "wasserstein_distances"]
