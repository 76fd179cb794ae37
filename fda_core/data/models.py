"""Networks of the FDA experiments, by name: ``get_model(name, input_shape, num_classes, ...)``.

* ``"mnist_cnn"`` — DomainBed's ``MNIST_CNN`` (``domainbed/networks.py``) + a linear classifier; the
  papers' ColoredMNIST model, with DomainBed's GroupNorm layers as their reference code builds it
  (``norm="batch"``: BatchNorm, as the papers' text reads; ``docs/reproduction.md`` row 10).
* ``"small_cnn"`` — NIID-Bench's ``SimpleCNN`` (Li et al. 2022, ``model.py``): 2 conv + 3 FC layers, the
  semi-synthetic runs' CNN (FedGP App. B.6).
* ``"resnet18"`` — ResNet-18 (He et al. 2016) in torchvision's layout and state-dict key names, so a
  torchvision ImageNet checkpoint loads from a local file (VLCS / TerraIncognita runs). Nothing is
  downloaded: ``weights`` is a path or ``"random"``.
* ``"mlp"`` — a tiny Linear–ReLU–Linear network for fast tests.

Every model has ``n_outputs`` (feature size), ``features(x) -> (n, n_outputs)`` and ``classifier`` (the
final ``nn.Linear``), so personalisation baselines (FedRep, APFL, …) can split body and head.
"""

from __future__ import annotations

import inspect
import math
import os
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..common.checks import register_factory

__all__ = [
    "get_model",
    "list_models",
    "model_factory",
    "register_model",
    "count_parameters",
    "MnistCNN",
    "SmallCNN",
    "ResNet18",
    "BasicBlock",
    "MLP",
]


def _check_image_shape(input_shape: tuple[int, ...], model: str) -> tuple[int, int, int]:
    if len(input_shape) != 3:
        raise ValueError(f"input_shape for {model} must be (C, H, W), got {tuple(input_shape)}")
    return tuple(int(s) for s in input_shape)  # type: ignore[return-value]


# ----------------------------------------------------------------------------------------------
# DomainBed MNIST_CNN
# ----------------------------------------------------------------------------------------------


class MnistCNN(nn.Module):
    """DomainBed's ``MNIST_CNN`` featurizer (``domainbed/networks.py``) + ``Linear(128, num_classes)``.

    conv(C→64, 3×3, pad 1) → conv(64→128, 3×3, stride 2, pad 1) → conv(128→128, 3×3, pad 1) →
    conv(128→128, 3×3, pad 1), each followed by ReLU and a norm layer (DomainBed's order), then adaptive
    average pooling to 128 features. ``norm="group"`` (default) uses DomainBed's ``GroupNorm(8, C)``: the
    papers' reference code builds its ColoredMNIST model from DomainBed's ``Featurizer``, i.e. this network
    with GroupNorm layers that DomainBed names ``bn0``…``bn3``. ``norm="batch"`` uses ``BatchNorm2d``, as
    both papers' text reads ("four convolutional and batch-norm layers", FedGP App. B.6; auto-weighted
    App. C.2); at the auto-weighted script's budget it leaves FedGP_Auto at the FedAvg model on −90%,
    because a training batch of one image gives BatchNorm + average pooling constant features
    (``docs/reproduction.md`` row 10). Input ``(n, C, H, W)`` → logits ``(n, num_classes)``; any H, W ≥ 1.
    """

    n_outputs = 128

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, norm: str = "group") -> None:
        super().__init__()
        c, _, _ = _check_image_shape(input_shape, "mnist_cnn")
        if norm not in ("batch", "group"):
            raise ValueError(f"norm must be 'batch' or 'group', got {norm!r}")
        self.norm = norm

        def norm_layer(ch: int) -> nn.Module:
            return nn.BatchNorm2d(ch) if norm == "batch" else nn.GroupNorm(8, ch)  # DomainBed: GroupNorm(8, ch)

        self.conv1 = nn.Conv2d(c, 64, 3, 1, padding=1)
        self.conv2 = nn.Conv2d(64, 128, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(128, 128, 3, 1, padding=1)
        self.conv4 = nn.Conv2d(128, 128, 3, 1, padding=1)
        self.bn0, self.bn1, self.bn2, self.bn3 = norm_layer(64), norm_layer(128), norm_layer(128), norm_layer(128)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.classifier = nn.Linear(self.n_outputs, num_classes)

    def features(self, x: Tensor) -> Tensor:
        """(n, C, H, W) → (n, 128)."""
        x = self.bn0(F.relu(self.conv1(x)))
        x = self.bn1(F.relu(self.conv2(x)))
        x = self.bn2(F.relu(self.conv3(x)))
        x = self.bn3(F.relu(self.conv4(x)))
        return self.avgpool(x).flatten(1)

    def forward(self, x: Tensor) -> Tensor:
        """(n, C, H, W) → logits (n, num_classes)."""
        return self.classifier(self.features(x))


# ----------------------------------------------------------------------------------------------
# NIID-Bench SimpleCNN
# ----------------------------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """NIID-Bench's ``SimpleCNN`` / ``SimpleCNNMNIST`` (Li et al. 2022, ``model.py``; FedGP App. B.6:
    "two convolutional layers and three fully-connected layers").

    conv(C→6, 5×5) → ReLU → maxpool 2 → conv(6→16, 5×5) → ReLU → maxpool 2 → FC 120 → ReLU → FC 84 →
    ReLU → FC num_classes. The flattened size is computed from ``input_shape``: 16·4·4 = 256 for
    (1, 28, 28) and 16·5·5 = 400 for (3, 32, 32), as NIID-Bench. ``padding=None`` uses no padding when
    the image is large enough (H, W ≥ 16) and otherwise pads both convolutions by 2 ("same"), e.g.
    (2, 14, 14) → 14 → 7 → 7 → 3: 16·3·3 = 144; pass ``padding`` to force a value.
    Input ``(n, C, H, W)`` → logits ``(n, num_classes)``; ``n_outputs = 84``.
    """

    n_outputs = 84

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, padding: int | None = None) -> None:
        super().__init__()
        c, h, w = _check_image_shape(input_shape, "small_cnn")

        def out_size(s: int, p: int) -> int:
            s = (s + 2 * p - 4) // 2  # conv 5×5 then maxpool 2
            return (s + 2 * p - 4) // 2 if s >= 1 else 0

        if padding is None:
            padding = 0 if min(out_size(h, 0), out_size(w, 0)) >= 1 else 2
        if isinstance(padding, bool) or not isinstance(padding, int) or padding < 0:
            raise ValueError(f"padding must be None or an integer >= 0, got {padding!r}")
        oh, ow = out_size(h, padding), out_size(w, padding)
        if min(oh, ow) < 1:
            raise ValueError(f"input_shape {tuple(input_shape)} is too small for small_cnn with padding={padding} (needs H, W >= 4)")
        self.padding, self.flat_features = padding, 16 * oh * ow
        self.conv1 = nn.Conv2d(c, 6, 5, padding=padding)
        self.pool = nn.MaxPool2d(2, 2)
        self.conv2 = nn.Conv2d(6, 16, 5, padding=padding)
        self.fc1 = nn.Linear(self.flat_features, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    @property
    def classifier(self) -> nn.Linear:
        return self.fc3

    def features(self, x: Tensor) -> Tensor:
        """(n, C, H, W) → (n, 84)."""
        x = self.pool(F.relu(self.conv1(x)))
        x = self.pool(F.relu(self.conv2(x)))
        x = x.flatten(1)
        return F.relu(self.fc2(F.relu(self.fc1(x))))

    def forward(self, x: Tensor) -> Tensor:
        """(n, C, H, W) → logits (n, num_classes)."""
        return self.fc3(self.features(x))


# ----------------------------------------------------------------------------------------------
# ResNet-18 in torchvision's layout
# ----------------------------------------------------------------------------------------------


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class BasicBlock(nn.Module):
    """torchvision ``resnet.BasicBlock`` (He et al. 2016): two 3×3 convs with BatchNorm, identity or
    1×1-conv+BN shortcut (``downsample``). (n, cin, H, W) → (n, planes, H/stride, W/stride)."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = _conv3x3(inplanes, planes, stride)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = _conv3x3(planes, planes)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: Tensor) -> Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + identity)


class ResNet18(nn.Module):
    """ResNet-18 with torchvision's module names (``conv1``, ``bn1``, ``layer1.0.conv1``, …,
    ``layer2.0.downsample.0``, ``fc``), so torchvision's ``resnet18`` state dict loads; ``fc`` is
    ``Linear(512, num_classes)``. Init as torchvision (Kaiming-normal fan-out convs, BN weight 1 bias 0).
    Input ``(n, C, H, W)`` (C = 3 for ImageNet weights; other C as DomainBed: conv1 channels copied
    cyclically from the RGB filters) → logits ``(n, num_classes)``; ``n_outputs = 512``.

    ``hidden``: None (torchvision's head) or the width of a hidden layer before the output, the
    weakly-supervised FDA paper's "last layer hidden size of 128" (App. A.3, Fig. 5): ``fc`` is then
    ``Sequential(Linear(512, hidden), ReLU, Linear(hidden, num_classes))``, ``features`` ends with the hidden
    layer and ``n_outputs = hidden`` (auxiliary heads branch off there, ``fda_core.data.auxiliary``).
    """

    n_outputs = 512

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int | None = None) -> None:
        super().__init__()
        c, _, _ = _check_image_shape(input_shape, "resnet18")
        if hidden is not None and (isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1):
            raise ValueError(f"hidden must be None or an integer >= 1, got {hidden!r}")
        self.hidden = hidden
        self.inplanes = 64
        self.conv1 = nn.Conv2d(c, 64, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, 2)
        self.layer2 = self._make_layer(128, 2, stride=2)
        self.layer3 = self._make_layer(256, 2, stride=2)
        self.layer4 = self._make_layer(512, 2, stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes) if hidden is None else nn.Sequential(
            nn.Linear(512, hidden), nn.ReLU(), nn.Linear(hidden, num_classes))
        if hidden is not None:
            self.n_outputs = hidden
        for m in self.modules():  # torchvision ResNet.__init__
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.constant_(m.weight, 1)
                nn.init.constant_(m.bias, 0)

    def _make_layer(self, planes: int, blocks: int, stride: int = 1) -> nn.Sequential:
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes, kernel_size=1, stride=stride, bias=False), nn.BatchNorm2d(planes)
            )
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    @property
    def classifier(self) -> nn.Linear:
        return self.fc if self.hidden is None else self.fc[2]

    def features(self, x: Tensor) -> Tensor:
        """(n, C, H, W) → (n, 512), or (n, hidden) after the hidden layer."""
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = self.avgpool(x).flatten(1)
        return x if self.hidden is None else self.fc[1](self.fc[0](x))

    def forward(self, x: Tensor) -> Tensor:
        """(n, C, H, W) → logits (n, num_classes)."""
        return self.classifier(self.features(x))

    def load_pretrained(self, state_dict: dict[str, Tensor]) -> None:
        """Load a torchvision-layout ResNet-18 state dict, skipping ``fc.*`` (the head, and the hidden layer
        when there is one, are task-specific).
        Missing or unexpected keys (other than ``fc``) or shape mismatches raise ValueError."""
        sd = {k: v for k, v in state_dict.items() if not k.startswith("fc.")}
        w = sd.get("conv1.weight")
        cin = self.conv1.weight.shape[1]
        if w is not None and w.ndim == 4 and w.shape[1] != cin:
            # DomainBed networks.ResNet: for nc != 3 input channels, conv1 channel i copies RGB channel i % 3
            sd["conv1.weight"] = w[:, [i % w.shape[1] for i in range(cin)]].clone()
        own = {k: v for k, v in self.state_dict().items() if not k.startswith("fc.")}
        missing, unexpected = sorted(set(own) - set(sd)), sorted(set(sd) - set(own))
        bad = [k for k in set(own) & set(sd) if tuple(own[k].shape) != tuple(sd[k].shape)]
        if missing or unexpected or bad:
            raise ValueError(
                "weights is not a torchvision ResNet-18 state dict: "
                f"missing {missing[:5]}{'…' if len(missing) > 5 else ''}, unexpected {unexpected[:5]}"
                f"{'…' if len(unexpected) > 5 else ''}, shape mismatches {sorted(bad)[:5]}"
            )
        self.load_state_dict(sd, strict=False)


# ----------------------------------------------------------------------------------------------
# Tiny MLP
# ----------------------------------------------------------------------------------------------


class MLP(nn.Module):
    """Flatten → Linear(prod(input_shape), hidden) → ReLU → Linear(hidden, num_classes), for fast tests.
    Input ``(n, *input_shape)`` → logits ``(n, num_classes)``; ``n_outputs = hidden``."""

    def __init__(self, input_shape: tuple[int, ...], num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        if isinstance(hidden, bool) or not isinstance(hidden, int) or hidden < 1:
            raise ValueError(f"hidden must be an integer >= 1, got {hidden!r}")
        self.n_outputs = hidden
        self.fc1 = nn.Linear(math.prod(input_shape), hidden)
        self.fc2 = nn.Linear(hidden, num_classes)

    @property
    def classifier(self) -> nn.Linear:
        return self.fc2

    def features(self, x: Tensor) -> Tensor:
        """(n, *input_shape) → (n, hidden)."""
        return F.relu(self.fc1(x.flatten(1)))

    def forward(self, x: Tensor) -> Tensor:
        """(n, *input_shape) → logits (n, num_classes)."""
        return self.fc2(self.features(x))


# ----------------------------------------------------------------------------------------------
# Registry
# ----------------------------------------------------------------------------------------------

ModelFactory = Callable[..., nn.Module]
_MODELS: dict[str, ModelFactory] = {}
# models whose weights=None is an error (pretrained weights are the default in the papers' runs)
_NEEDS_WEIGHTS = {"resnet18"}
_RESNET18_URL = "https://download.pytorch.org/models/resnet18-f37072fd.pth"


def register_model(name: str, factory: ModelFactory, *, overwrite: bool = False) -> None:
    """Register ``factory(input_shape, num_classes, **options) -> nn.Module`` under ``name``."""
    register_factory(_MODELS, "model", name, factory, overwrite=overwrite)


def model_factory(name: str) -> ModelFactory | None:
    """The factory registered under ``name``, or None when none is."""
    return _MODELS.get(name)


def list_models() -> list[str]:
    """Registered model names, sorted."""
    return sorted(_MODELS)


def count_parameters(model: nn.Module) -> int:
    """Number of trainable parameter entries (``requires_grad``) of ``model``; buffers not counted."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _read_state_dict(path: Path) -> dict[str, Tensor]:
    obj = torch.load(path, map_location="cpu", weights_only=True)
    for key in ("state_dict", "model_state_dict", "model"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
            break
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise ValueError(f"weights file {path} does not hold a state dict (a dict of tensors)")
    for prefix in ("module.", "network."):  # DataParallel / DomainBed Featurizer wrappers
        if obj and all(k.startswith(prefix) for k in obj):
            obj = {k[len(prefix) :]: v for k, v in obj.items()}
    return obj


def get_model(
    name: str,
    input_shape: tuple[int, ...],
    num_classes: int,
    *,
    weights: str | os.PathLike | None = None,
    seed: int | None = None,
    **options,
) -> nn.Module:
    """Build the registered model ``name`` for inputs ``(n, *input_shape)`` and ``num_classes`` logits.

    ``weights``: ``None`` or ``"random"`` — random init (``None`` is refused for ``resnet18``, whose runs
    use ImageNet weights that cannot be downloaded here); otherwise a local ``.pth``/``.pt`` state dict —
    for ``resnet18`` a torchvision ImageNet checkpoint whose ``fc`` is skipped, for the others a full
    state dict of the same model (strict). ``seed``: with a seed, the initial parameters depend only on
    it (built under ``torch.random.fork_rng``, so the global RNG state is left untouched). Other
    ``options`` go to the model (``norm`` for mnist_cnn, ``padding`` for small_cnn, ``hidden`` for mlp).
    """
    if name not in _MODELS:
        raise ValueError(f"unknown model {name!r}; name must be one of {list_models()}")
    try:
        input_shape = tuple(int(s) for s in input_shape)
    except (TypeError, ValueError):
        raise ValueError(f"input_shape must be a tuple of positive integers, got {input_shape!r}") from None
    if not input_shape or min(input_shape) < 1:
        raise ValueError(f"input_shape must be a tuple of positive integers, got {input_shape!r}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be an integer >= 1, got {num_classes!r}")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"seed must be None or an integer, got {seed!r}")
    if weights is None and name in _NEEDS_WEIGHTS:
        raise ValueError(
            f"{name} needs weights: pretrained ImageNet weights cannot be downloaded here. Pass "
            f"weights=<path to a torchvision resnet18 state dict (e.g. resnet18-f37072fd.pth from {_RESNET18_URL}, "
            f"fetched on a machine with internet)> or weights='random' for random initialisation"
        )
    path: Path | None = None
    if weights is not None and not (isinstance(weights, str) and weights == "random"):
        if not isinstance(weights, (str, os.PathLike)):
            raise ValueError(f"weights must be None, 'random', or a path to a .pth/.pt file, got {weights!r}")
        path = Path(weights).expanduser()
        if not path.is_file():
            raise FileNotFoundError(
                f"weights file {path} does not exist. Pass a local state dict"
                + (f" (for resnet18, torchvision's {_RESNET18_URL}, downloaded elsewhere)" if name == "resnet18" else "")
                + " or weights='random'"
            )
    factory = _MODELS[name]
    try:
        inspect.signature(factory).bind(input_shape, num_classes, **options)
    except TypeError as exc:
        raise ValueError(f"bad options {sorted(options)} for model {name!r}: {exc}") from None
    if seed is None:
        model = factory(input_shape, num_classes, **options)
    else:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = factory(input_shape, num_classes, **options)
    if path is not None:
        sd = _read_state_dict(path)
        if isinstance(model, ResNet18):
            model.load_pretrained(sd)
        else:
            try:
                model.load_state_dict(sd, strict=True)
            except RuntimeError as exc:
                raise ValueError(f"weights file {path} does not match model {name!r}: {exc}") from None
    return model


register_model("mnist_cnn", MnistCNN)
register_model("small_cnn", SmallCNN)
register_model("resnet18", ResNet18)
register_model("mlp", MLP)
