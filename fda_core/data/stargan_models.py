"""A compact StarGAN (Choi et al. 2018) for 28×28 rotated digits: the generator and discriminator of the
StarGAN that DIRT trains on Rotated MNIST (its ``models/stargan.py``), with fewer channels and residual blocks
so that the federated baseline of the Fed INB paper (FedStarGAN, Sec. 4.2, App. E.1) trains on a CPU
(``docs/translation.md`` § FedStarGAN).

Generator: the image concatenated with the one-hot source and target domain labels, each spread over the
image (1 + 2·c_dim channels) → Conv(7×7) + InstanceNorm + ReLU → two down-sampling Conv(4×4, stride 2)
+ IN + ReLU (28 → 14 → 7) → ``repeat_num`` residual blocks (Conv 3×3 + IN + ReLU + Conv 3×3 + IN) →
two up-sampling ConvTranspose(4×4, stride 2) + IN + ReLU (7 → 14 → 28) → Conv(7×7) + Tanh. Images are in
[−1, 1] (``to_gan`` / ``from_gan``). InstanceNorm is affine without running statistics, so a federated
average has no statistics to merge (DIRT's keeps running statistics).

Discriminator (PatchGAN with a domain classifier): Conv(4×4, stride 2) + LeakyReLU(0.01), ``repeat_num`` − 1
more of them doubling the channels (28 → 14 → 7 → 3 for 3 of them), then ``out_src`` Conv(3×3) → a 3×3 map
of real/fake scores and ``out_cls`` Conv(k×k) over the whole remaining map → c_dim domain logits.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..common.checks import check_int

__all__ = ["StarGenerator", "StarDiscriminator", "to_gan", "from_gan", "one_hot"]


def to_gan(x: Tensor) -> Tensor:
    """Pixels in [0, 1], (n, 784) → the GAN's images in [−1, 1], (n, 1, 28, 28)."""
    return (x.reshape(-1, 1, 28, 28) * 2 - 1).contiguous()


def from_gan(x: Tensor) -> Tensor:
    """The GAN's images in [−1, 1] → pixels in [0, 1], (n, 784) (clamped, as StarGAN's ``denorm``)."""
    return ((x + 1) / 2).clamp(0, 1).reshape(x.shape[0], -1)


def one_hot(labels: Tensor, c_dim: int) -> Tensor:
    """(n,) int domain labels in [0, c_dim) → (n, c_dim) one-hot in the default float dtype.

    Formed by a comparison with ``arange(c_dim)``, which never makes the host wait for the device. The former form
    was an indexed assignment of the Python number 1, which torch makes a host tensor and copies to a CUDA device.
    The host synchronisations that ``benchmarks/fedstargan.py`` counted on an H200 (10 per iteration of the loop, 2
    of the batched step; docs/performance.md § GPU) match its calls, two per client step and two per batched step
    (not yet recounted with this form). Labels are range-checked on the CPU only, where the check costs no
    synchronisation."""
    if labels.device.type == "cpu" and labels.numel():  # numpy's view: no read through torch's dispatcher either
        values = labels.numpy()
        if values.min() < 0 or values.max() >= c_dim:
            raise ValueError(f"labels must lie in [0, {c_dim}) (c_dim={c_dim}), got values from {values.min()} "
                             f"to {values.max()}")
    return (labels.unsqueeze(1) == torch.arange(c_dim, device=labels.device)).to(torch.get_default_dtype())


def _norm(c: int) -> nn.InstanceNorm2d:
    return nn.InstanceNorm2d(c, affine=True, track_running_stats=False)


class _Residual(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.main = nn.Sequential(nn.Conv2d(dim, dim, 3, 1, 1, bias=False), _norm(dim), nn.ReLU(inplace=True),
                                  nn.Conv2d(dim, dim, 3, 1, 1, bias=False), _norm(dim))

    def forward(self, x: Tensor) -> Tensor:
        return x + self.main(x)


class StarGenerator(nn.Module):
    """G(x, c_org, c_trg): the image translated from domain c_org to domain c_trg (module docstring).
    ``conv_dim``: channels of the first layer (DIRT: 64); ``c_dim``: number of domains; ``repeat_num``: residual
    blocks (DIRT: 6)."""

    def __init__(self, conv_dim: int = 8, c_dim: int = 5, repeat_num: int = 1):
        super().__init__()
        conv_dim, self.c_dim = check_int(conv_dim, "conv_dim", 1), check_int(c_dim, "c_dim", 2)
        repeat_num = check_int(repeat_num, "repeat_num", 0)
        layers: list[nn.Module] = [nn.Conv2d(1 + 2 * c_dim, conv_dim, 7, 1, 3, bias=False), _norm(conv_dim),
                                   nn.ReLU(inplace=True)]
        cur = conv_dim
        for _ in range(2):
            layers += [nn.Conv2d(cur, cur * 2, 4, 2, 1, bias=False), _norm(cur * 2), nn.ReLU(inplace=True)]
            cur *= 2
        layers += [_Residual(cur) for _ in range(repeat_num)]
        for _ in range(2):
            layers += [nn.ConvTranspose2d(cur, cur // 2, 4, 2, 1, bias=False), _norm(cur // 2), nn.ReLU(inplace=True)]
            cur //= 2
        layers += [nn.Conv2d(cur, 1, 7, 1, 3, bias=False), nn.Tanh()]
        self.main = nn.Sequential(*layers)

    def forward(self, x: Tensor, c_org: Tensor, c_trg: Tensor) -> Tensor:
        """x (n, 1, 28, 28) in [−1, 1]; c_org, c_trg (n, c_dim) one-hot → (n, 1, 28, 28) in [−1, 1]."""
        h, w = x.shape[-2:]
        cond = torch.cat([c_org, c_trg], 1)[:, :, None, None].expand(-1, -1, h, w)
        return self.main(torch.cat([x, cond], 1))


class StarDiscriminator(nn.Module):
    """D(x) = (real/fake score map (n, 1, k, k), domain logits (n, c_dim)) (module docstring). ``image_size``: 28;
    ``conv_dim``: first channels (DIRT: 64); ``repeat_num``: stride-2 convolutions (28 → 3 needs 3)."""

    def __init__(self, image_size: int = 28, conv_dim: int = 8, c_dim: int = 5, repeat_num: int = 3):
        super().__init__()
        check_int(image_size, "image_size", 2)
        conv_dim, c_dim = check_int(conv_dim, "conv_dim", 1), check_int(c_dim, "c_dim", 2)
        repeat_num = check_int(repeat_num, "repeat_num", 1)
        layers: list[nn.Module] = [nn.Conv2d(1, conv_dim, 4, 2, 1), nn.LeakyReLU(0.01)]
        cur, size = conv_dim, image_size // 2
        for _ in range(1, repeat_num):
            layers += [nn.Conv2d(cur, cur * 2, 4, 2, 1), nn.LeakyReLU(0.01)]
            cur, size = cur * 2, (size + 2 - 4) // 2 + 1
        if size < 1:
            raise ValueError(f"repeat_num={repeat_num} reduces a {image_size}-pixel image below one pixel")
        self.main = nn.Sequential(*layers)
        self.out_src = nn.Conv2d(cur, 1, 3, 1, 1, bias=False)
        self.out_cls = nn.Conv2d(cur, c_dim, size, bias=False)

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor]:
        h = self.main(x)
        return self.out_src(h), self.out_cls(h).flatten(1)
