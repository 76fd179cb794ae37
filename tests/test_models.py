"""Model registry: output shapes, ResNet-18 state-dict round trip (torchvision layout, fc skipped),
weights errors, seeded init without touching the global RNG, BatchNorm buffers, bad input."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fda_core.data import models as M

SHAPES = {
    "mlp": [(1, 28, 28), (2, 14, 14), (3, 32, 32), (50,)],
    "mnist_cnn": [(1, 28, 28), (2, 14, 14), (3, 32, 32)],
    "small_cnn": [(1, 28, 28), (2, 14, 14), (3, 32, 32)],
    "resnet18": [(3, 32, 32), (2, 14, 14), (1, 28, 28)],
}


@pytest.mark.parametrize("name,shape", [(n, s) for n, shapes in SHAPES.items() for s in shapes])
def test_output_shapes(name, shape):
    model = M.get_model(name, shape, 7, weights="random", seed=0).eval()
    x = torch.randn(3, *shape)
    with torch.no_grad():
        out = model(x)
        feats = model.features(x)
    assert out.shape == (3, 7) and feats.shape == (3, model.n_outputs)
    assert isinstance(model.classifier, nn.Linear) and model.classifier.out_features == 7


def test_small_cnn_flat_sizes():
    # NIID-Bench: 16*4*4 for 28x28 (SimpleCNNMNIST), 16*5*5 for 32x32 (SimpleCNN); 14x14 padded by 2
    sizes = {s: M.get_model("small_cnn", s, 10).flat_features for s in SHAPES["small_cnn"]}
    assert sizes == {(1, 28, 28): 256, (2, 14, 14): 144, (3, 32, 32): 400}
    assert M.get_model("small_cnn", (2, 14, 14), 10).padding == 2
    assert M.get_model("small_cnn", (3, 32, 32), 10, padding=2).flat_features == 16 * 8 * 8
    with pytest.raises(ValueError, match="too small"):
        M.get_model("small_cnn", (1, 3, 3), 10)
    with pytest.raises(ValueError, match=r"\(C, H, W\)"):
        M.get_model("small_cnn", (784,), 10)


def test_resnet18_layout_and_roundtrip(tmp_path):
    src = M.get_model("resnet18", (3, 32, 32), 1000, weights="random", seed=1)
    sd = src.state_dict()
    # torchvision key names and the ImageNet-size parameter count (11,689,512 with a 1000-way fc)
    for key in ("conv1.weight", "bn1.running_mean", "layer1.0.conv1.weight", "layer2.0.downsample.0.weight",
                "layer4.1.bn2.weight", "fc.weight"):
        assert key in sd
    assert M.count_parameters(src) == 11_689_512
    path = tmp_path / "resnet18.pth"
    torch.save(sd, path)
    dst = M.get_model("resnet18", (3, 32, 32), 5, weights=path, seed=2)
    fresh = M.get_model("resnet18", (3, 32, 32), 5, weights="random", seed=2)
    for k, v in dst.state_dict().items():
        if k.startswith("fc."):
            assert torch.equal(v, fresh.state_dict()[k])  # the head is not loaded
        else:
            assert torch.equal(v, sd[k]), k
    # wrapped checkpoints ('state_dict' / 'module.' prefix) and other input channels (DomainBed copy)
    torch.save({"state_dict": {f"module.{k}": v for k, v in sd.items()}}, tmp_path / "wrapped.pt")
    one = M.get_model("resnet18", (1, 28, 28), 2, weights=tmp_path / "wrapped.pt")
    assert torch.equal(one.conv1.weight[:, 0], sd["conv1.weight"][:, 0])
    assert torch.equal(one.layer3[1].conv2.weight, sd["layer3.1.conv2.weight"])


def test_weights_errors(tmp_path):
    with pytest.raises(ValueError, match=r"weights=.*random"):
        M.get_model("resnet18", (3, 32, 32), 10)
    with pytest.raises(FileNotFoundError, match="missing.pth"):
        M.get_model("resnet18", (3, 32, 32), 10, weights=tmp_path / "missing.pth")
    torch.save({"conv1.weight": torch.zeros(64, 3, 7, 7)}, tmp_path / "partial.pth")
    with pytest.raises(ValueError, match="missing"):
        M.get_model("resnet18", (3, 32, 32), 10, weights=tmp_path / "partial.pth")
    mlp = M.get_model("mlp", (4,), 3, seed=0)
    torch.save(mlp.state_dict(), tmp_path / "mlp.pt")
    back = M.get_model("mlp", (4,), 3, weights=tmp_path / "mlp.pt", seed=9)
    assert all(torch.equal(a, b) for a, b in zip(mlp.state_dict().values(), back.state_dict().values()))
    with pytest.raises(ValueError, match="does not match"):
        M.get_model("mlp", (5,), 3, weights=tmp_path / "mlp.pt")


def test_seeded_init_and_global_rng():
    for name, shapes in SHAPES.items():
        shape = shapes[0]
        torch.manual_seed(123)
        before = torch.get_rng_state()
        a = M.get_model(name, shape, 4, weights="random", seed=5)
        assert torch.equal(torch.get_rng_state(), before), name  # global RNG untouched
        b = M.get_model(name, shape, 4, weights="random", seed=5)
        c = M.get_model(name, shape, 4, weights="random", seed=6)
        pa, pb, pc = (torch.cat([p.flatten() for p in m.parameters()]) for m in (a, b, c))
        assert torch.equal(pa, pb) and not torch.equal(pa, pc), name


def test_mnist_cnn_norms_and_count():
    """Default GroupNorm(8, C) (DomainBed's MNIST_CNN, the reference code's model), norm="batch" BatchNorm."""
    bn = M.get_model("mnist_cnn", (2, 14, 14), 2, seed=0, norm="batch")
    buffers = dict(bn.named_buffers())
    params = dict(bn.named_parameters())
    assert "bn0.running_mean" in buffers and "bn3.running_var" in buffers
    assert not any("running" in k for k in params) and isinstance(bn.bn0, nn.BatchNorm2d)
    assert M.count_parameters(bn) == sum(p.numel() for p in params.values())
    gn = M.get_model("mnist_cnn", (2, 14, 14), 2, seed=0)
    assert all(isinstance(getattr(gn, f"bn{i}"), nn.GroupNorm) for i in range(4))
    assert [getattr(gn, f"bn{i}").num_channels for i in range(4)] == [64, 128, 128, 128]
    assert isinstance(gn.bn2, nn.GroupNorm) and gn.bn2.num_groups == 8 and not list(gn.buffers())
    bn.classifier.weight.requires_grad_(False)
    assert M.count_parameters(bn) == M.count_parameters(gn) - bn.classifier.weight.numel()
    with pytest.raises(ValueError, match="norm"):
        M.get_model("mnist_cnn", (2, 14, 14), 2, norm="layer")


def test_mnist_cnn_with_batchnorm_learns_nothing_from_batches_of_one():
    """docs/reproduction.md, row 10 (why FedGP_Auto stalls with BatchNorm at the auto script's target batches of 1):
    in training mode BatchNorm normalises each channel of a batch of ONE image over its spatial positions, so the
    channel's spatial mean after the last norm layer is exactly its shift β_c, and the global average pooling that
    follows returns β for every input: the features are constant and no gradient reaches the convolutions or the
    scales. GroupNorm(8, C) normalises 16 channels together, so its features still depend on the input."""
    torch.manual_seed(0)
    x = torch.rand(3, 2, 14, 14)
    bn = M.get_model("mnist_cnn", (2, 14, 14), 2, seed=0, norm="batch").train()
    with torch.no_grad():
        bn.bn3.bias.copy_(torch.randn(128))  # a shift that is not zero, so "constant" is not "zero"
    feats = torch.cat([bn.features(x[i:i + 1]) for i in range(3)])
    assert torch.allclose(feats, bn.bn3.bias.expand(3, -1), atol=1e-5)
    loss = lambda model, xb: F.cross_entropy(model(xb), torch.arange(len(xb)) % 2)  # noqa: E731
    loss(bn, x[:1]).backward()
    for name in ("conv1.weight", "conv4.weight", "bn0.weight", "bn3.weight"):
        assert dict(bn.named_parameters())[name].grad.abs().max() < 1e-6, name
    assert bn.bn3.bias.grad.abs().max() > 1e-3 and bn.classifier.weight.grad.abs().max() > 1e-3
    bn.zero_grad()
    loss(bn, x[:2]).backward()  # a batch of two: the convolutions learn again
    assert bn.conv1.weight.grad.abs().max() > 1e-4
    gn = M.get_model("mnist_cnn", (2, 14, 14), 2, seed=0).train()
    g = torch.cat([gn.features(x[i:i + 1]) for i in range(3)])
    assert (g[0] - g[1]).abs().max() > 1e-3 and (g[1] - g[2]).abs().max() > 1e-3
    loss(gn, x[:1]).backward()
    assert gn.conv1.weight.grad.abs().max() > 1e-4


def test_registry_and_bad_input():
    assert M.list_models() == ["mlp", "mnist_cnn", "resnet18", "small_cnn"]
    with pytest.raises(ValueError, match=r"unknown model 'vgg'; name must be one of \['mlp'"):
        M.get_model("vgg", (3, 32, 32), 10)
    with pytest.raises(ValueError, match="depth"):
        M.get_model("mlp", (4,), 2, depth=3)
    with pytest.raises(ValueError, match="num_classes"):
        M.get_model("mlp", (4,), 0)
    with pytest.raises(ValueError, match="input_shape"):
        M.get_model("mlp", (0, 4), 2)
    with pytest.raises(ValueError, match="hidden"):
        M.get_model("mlp", (4,), 2, hidden=0)
    with pytest.raises(ValueError, match="already registered"):
        M.register_model("mlp", M.MLP)
