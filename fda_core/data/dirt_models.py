"""DIRT's Rotated-MNIST network (Nguyen et al. 2021, the encoder and classifier of its ``domain_gen_rotatedmnist``
models), as the Fed INB paper uses it for FedDIRT and FedAvg (paper App. E.2; ``docs/translation.md`` § FedDIRT).

Encoder g: Conv(1→32, 5×5, no bias) + norm + ReLU + MaxPool(2), Conv(32→64, 5×5, no bias) + norm + ReLU +
MaxPool(2) (28×28 → 64×4×4 = 1024), Linear(1024 → 64): the 64-d representation z = g(x) that DIRT's
regulariser compares. Classifier h: ReLU then Linear(64 → 10). Xavier-uniform weights and zero biases, as
DIRT initialises them. The Fed INB paper replaces DIRT's BatchNorm by InstanceNorm (``norm="instance"``,
affine, no running statistics, so a federated average has no statistics to merge).

``width`` scales the two convolutions' channels (32·width, 64·width; width 1 is DIRT's network): the
workbook's default runs are narrower to fit a CPU budget (notebook 08 says so beside its numbers).
"""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import check_choice, check_int, check_number

__all__ = ["DIRTNet", "NORMS"]

#: normalisation layers of :class:`DIRTNet`: the Fed INB paper's InstanceNorm or DIRT's BatchNorm
NORMS = ("instance", "batch")


class DIRTNet(nn.Module):
    """DIRT's encoder g and classifier h (module docstring). Input (n, 784) or (n, 1, 28, 28) in [0, 1].

    ``features(x)`` = z = g(x) (n, 64); ``forward(x)`` = h(z) logits (n, num_classes); ``classifier`` is the
    final Linear. ``width`` in (0, 1]·k: channel multiplier (≥ 1 channel each); ``norm``: "instance" (Fed INB
    paper) or "batch" (DIRT); ``feature_dim``: size of z (DIRT: 64).
    """

    def __init__(self, num_classes: int = 10, *, width: float = 1.0, norm: str = "instance", feature_dim: int = 64):
        super().__init__()
        check_int(num_classes, "num_classes", 1)
        width = check_number(width, "width", 0.0, 4.0, lo_open=True)
        check_choice(norm, "norm", NORMS)
        feature_dim = check_int(feature_dim, "feature_dim", 1)
        c1, c2 = max(1, round(32 * width)), max(1, round(64 * width))
        layer = (lambda c: nn.InstanceNorm2d(c, affine=True)) if norm == "instance" else nn.BatchNorm2d
        self.encoder = nn.Sequential(
            nn.Conv2d(1, c1, 5, bias=False), layer(c1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 5, bias=False), layer(c2), nn.ReLU(), nn.MaxPool2d(2))
        self.fc = nn.Linear(c2 * 16, feature_dim)
        self.cls = nn.Linear(feature_dim, num_classes)
        for mod in (self.encoder[0], self.encoder[4], self.fc, self.cls):
            nn.init.xavier_uniform_(mod.weight)
            if mod.bias is not None:
                nn.init.zeros_(mod.bias)
        self.width, self.norm, self.channels = width, norm, (c1, c2)
        self.n_outputs = feature_dim

    @property
    def classifier(self) -> nn.Linear:
        return self.cls

    def features(self, x: Tensor) -> Tensor:
        """z = g(x): (n, 784) or (n, 1, 28, 28) → (n, feature_dim)."""
        if x.ndim == 2:
            if x.shape[1] != 784:
                raise ValueError(f"x must have shape (n, 784) or (n, 1, 28, 28), got {tuple(x.shape)}")
            x = x.view(-1, 1, 28, 28)
        return self.fc(self.encoder(x).flatten(1))

    def head(self, z: Tensor) -> Tensor:
        """h(z) = Linear(ReLU(z)): logits from representations (n, feature_dim)."""
        return self.cls(F.relu(z))

    def forward(self, x: Tensor) -> Tensor:
        return self.head(self.features(x))
