"""InceptionV3 features for FID, from a local TorchScript file only (nothing is downloaded; torchvision is not
a dependency). ``docs/translation.md`` § FedStarGAN.

Accepted file: a ``torch.export`` program (``.pt2``, loaded with ``torch.export.load``) or a TorchScript
InceptionV3 feature extractor saved with ``torch.jit.save`` — for example the
``inception-2015-12-05.pt`` file used by clean-fid and StyleGAN's metrics (called as ``model(x,
return_features=True)`` on images in [0, 255], returning 2,048 pool features), or any TorchScript module that
maps a float batch (n, 3, 299, 299) in [0, 255] to features (n, k). Digits (n, 784) in [0, 1] are resized to
299×299 (bilinear), repeated to three channels and scaled to [0, 255].
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["load_inception", "inception_features"]


def load_inception(path: str | os.PathLike, device: str | torch.device = "cpu") -> Callable[[Tensor], Tensor]:
    """The feature extractor in the TorchScript file ``path`` (module docstring), as a function images (n, 3,
    299, 299) in [0, 255] → features (n, k). Raises FileNotFoundError (with what to provide) when there is no
    such file, ValueError when it is not a TorchScript module."""
    if not str(path):
        raise FileNotFoundError("FID needs InceptionV3 weights, which cannot be downloaded here: pass the path of a "
                                "TorchScript InceptionV3 feature extractor (e.g. clean-fid's / StyleGAN's "
                                "inception-2015-12-05.pt, fetched on a machine with internet), or use the WD metric")
    p = Path(path).expanduser()
    if not p.is_file():
        raise FileNotFoundError(f"InceptionV3 weights file {p} does not exist: FID needs a local TorchScript InceptionV3 "
                                "feature extractor (e.g. inception-2015-12-05.pt from clean-fid / StyleGAN, fetched "
                                "elsewhere); nothing is downloaded. Use the WD metric otherwise")
    try:
        if p.suffix == ".pt2":
            model = torch.export.load(str(p)).module()
        else:
            import warnings

            with warnings.catch_warnings():  # torch.jit is deprecated, but the FID weights files are TorchScript
                warnings.simplefilter("ignore", DeprecationWarning)
                model = torch.jit.load(str(p), map_location=device).eval()
    except RuntimeError as exc:
        raise ValueError(f"{p} is not a TorchScript module or an exported program (loading failed: {exc})") from None

    def features(x: Tensor) -> Tensor:
        try:
            out = model(x, return_features=True)
        except (RuntimeError, TypeError):
            out = model(x)
        return out.reshape(out.shape[0], -1)

    return features


@torch.inference_mode()
def inception_features(extract: Callable[[Tensor], Tensor], digits: Tensor, batch: int = 100,
                       size: int = 299) -> Tensor:
    """Features of digits (n, 784) in [0, 1]: resized to size×size, three channels, [0, 255]. (n, k) float64."""
    if digits.ndim != 2 or digits.shape[1] != 784:
        raise ValueError(f"digits must have shape (n, 784), got {tuple(digits.shape)}")
    out = []
    for i in range(0, digits.shape[0], batch):
        x = digits[i:i + batch].reshape(-1, 1, 28, 28).float()
        x = F.interpolate(x, size=(size, size), mode="bilinear", align_corners=False).repeat(1, 3, 1, 1) * 255
        out.append(extract(x).to(torch.float64).cpu())
    return torch.cat(out) if out else torch.zeros(0, 0, dtype=torch.float64)
