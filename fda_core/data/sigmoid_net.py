"""The 50–100–10 sigmoid network of the phase-diagram experiment on a flat parameter vector θ, with a
hand-written batched forward/backward (``docs/experiments.md`` § Synthetic phase diagram).

50 → 100 (sigmoid) → 10, every weight and bias ~ U(−0.5, 0.5) (one initialisation θ0 per trial). Two
reductions of the squared error over the 10 outputs (``output_reduction``): ``"mean"`` — MSE averaged over
points AND outputs (``nn.MSELoss()`` default ``reduction='mean'``; the library's loss and the recorded test
loss) — and ``"sum"`` — summed over the outputs, averaged over the points (the training loss of the
papers' reference code, ``((Y − Ŷ)²).sum() / N``; its gradient is N_OUTPUTS = 10 times the mean's).
Parameters are one flat vector of m = 6110 entries in the order of
``nn.Sequential(nn.Linear(50, 100), nn.Sigmoid(), nn.Linear(100, 10)).parameters()`` (:func:`make_network`):
W1 (100×50, row-major), b1 (100), W2 (10×100), b2 (10) — the four parameter tensors
(:data:`PARAM_TENSORS`, :func:`param_dict`) that a per-tensor (layer-wise) rule treats separately.

Many networks run together: parameters are stacked (C, m) and the forward/backward passes
(:func:`batched_forward`, :func:`batched_backward`) are batched matrix products; the first layer of every
network is one large product with a shared x. Per network-gradient on the full set (n = 2000, 2-core CPU,
``benchmarks/phase_diagram.py``) the hand-written batched pass takes 0.51 ms,
``torch.func.vmap(grad(...))`` 1.0 ms and a loop of ``nn.Module`` autograd passes 0.83 ms.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from ..common.checks import check_int as _check_int
from ..common.seeding import generator as _generator
from .synthetic import N_INPUTS, N_OUTPUTS, SEED_TAGS, SyntheticData

__all__ = [
    "N_INPUTS",
    "N_HIDDEN",
    "N_OUTPUTS",
    "N_PARAMS",
    "PARAM_TENSORS",
    "OUTPUT_REDUCTIONS",
    "outputs_averaged",
    "describe_network",
    "init_params",
    "param_views",
    "param_dict",
    "make_network",
    "predict",
    "mse_loss",
    "full_gradients",
    "Workspace",
    "batched_forward",
    "batched_backward",
    "batched_set_gradient",
]

N_HIDDEN = 100
N_PARAMS = N_HIDDEN * N_INPUTS + N_HIDDEN + N_OUTPUTS * N_HIDDEN + N_OUTPUTS  # 6110

# slices of the flat parameter vector
_W1 = slice(0, N_HIDDEN * N_INPUTS)
_B1 = slice(_W1.stop, _W1.stop + N_HIDDEN)
_W2 = slice(_B1.stop, _B1.stop + N_OUTPUTS * N_HIDDEN)
_B2 = slice(_W2.stop, _W2.stop + N_OUTPUTS)

#: The four parameter tensors of the flat vector: (name in :func:`make_network`, slice of θ, shape).
PARAM_TENSORS: tuple[tuple[str, slice, tuple[int, ...]], ...] = (
    ("0.weight", _W1, (N_HIDDEN, N_INPUTS)),
    ("0.bias", _B1, (N_HIDDEN,)),
    ("2.weight", _W2, (N_OUTPUTS, N_HIDDEN)),
    ("2.bias", _B2, (N_OUTPUTS,)),
)
#: Reductions of the squared error over the outputs: ``"mean"`` (``nn.MSELoss()``), ``"sum"`` (reference code).
OUTPUT_REDUCTIONS = ("mean", "sum")


def outputs_averaged(output_reduction: str) -> int:
    """The number of outputs the squared error is divided by: N_OUTPUTS = 10 for ``"mean"``, 1 for ``"sum"``
    (module docstring), so the gradient per point and output is 2·(ŷ − y) / (this · points). Raises
    ValueError naming ``output_reduction``."""
    if output_reduction not in OUTPUT_REDUCTIONS:
        raise ValueError(f"output_reduction must be one of {list(OUTPUT_REDUCTIONS)}, got {output_reduction!r}")
    return N_OUTPUTS if output_reduction == "mean" else 1


def describe_network() -> str:
    """The network in words, from this module's constants."""
    return (f"Network {N_INPUTS}-{N_HIDDEN}-{N_OUTPUTS}, sigmoid hidden layer, every weight and bias ~ U(-0.5,0.5) "
            f"(one initialisation θ0 per trial), test loss MSE averaged over points and outputs; m = {N_PARAMS} "
            f"parameters in {len(PARAM_TENSORS)} tensors (W1, b1, W2, b2).")


def init_params(data_or_seed: SyntheticData | int, trial: int = 0, *, dtype: torch.dtype | None = None,
                device: str | torch.device | None = None) -> Tensor:
    """The initialisation θ0 (m,) of a trial: every weight and bias ~ U(−0.5, 0.5).

    Drawn on the CPU in float64 from a stream derived from (seed, trial), then cast; the same for every
    shift level, subset size and rule of the trial (π = point mass at θ0).
    """
    seed = data_or_seed.seed if isinstance(data_or_seed, SyntheticData) else _check_int(data_or_seed, "seed", 0)
    trial = _check_int(trial, "trial", 0)
    if dtype is None:
        dtype = data_or_seed.dtype if isinstance(data_or_seed, SyntheticData) else torch.float32
    if device is None:
        device = data_or_seed.device if isinstance(data_or_seed, SyntheticData) else "cpu"
    theta = torch.rand(N_PARAMS, generator=_generator(seed, SEED_TAGS["init"], trial), dtype=torch.float64) - 0.5
    return theta.to(device=device, dtype=dtype)


def param_views(theta: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """W1 (..., 100, 50), b1 (..., 100), W2 (..., 10, 100), b2 (..., 10) views of flat θ (..., m)."""
    lead = theta.shape[:-1]
    return (theta[..., _W1].reshape(*lead, N_HIDDEN, N_INPUTS), theta[..., _B1],
            theta[..., _W2].reshape(*lead, N_OUTPUTS, N_HIDDEN), theta[..., _B2])


def param_dict(theta: Tensor) -> dict[str, Tensor]:
    """The four parameter tensors of flat θ (m,) as views keyed by their :func:`make_network` names
    (``0.weight``, ``0.bias``, ``2.weight``, ``2.bias``) — the dict form that per-tensor rules take
    (:func:`fda_core.core.aggregation.fedgp`)."""
    if theta.shape[-1:] != (N_PARAMS,):
        raise ValueError(f"theta must have shape (..., {N_PARAMS}), got {tuple(theta.shape)}")
    lead = theta.shape[:-1]
    return {name: theta[..., sl].reshape(*lead, *shape) for name, sl, shape in PARAM_TENSORS}


def make_network(theta: Tensor | None = None) -> nn.Sequential:
    """``nn.Sequential(Linear(50, 100), Sigmoid(), Linear(100, 10))`` holding the flat parameters θ."""
    net = nn.Sequential(nn.Linear(N_INPUTS, N_HIDDEN), nn.Sigmoid(), nn.Linear(N_HIDDEN, N_OUTPUTS))
    if theta is not None:
        if theta.shape != (N_PARAMS,):
            raise ValueError(f"theta must have shape ({N_PARAMS},), got {tuple(theta.shape)}")
        net = net.to(device=theta.device, dtype=theta.dtype)
        torch.nn.utils.vector_to_parameters(theta.detach().clone(), net.parameters())
    return net


class Workspace:
    """Reused scratch tensors of a chunk: the large (C, 100, n) activations are allocated once instead
    of every step (on the CPU each fresh allocation of several MB costs first-touch page faults)."""

    def __init__(self) -> None:
        self._bufs: dict[str, Tensor] = {}

    def get(self, name: str, shape: tuple[int, ...], like: Tensor) -> Tensor:
        buf = self._bufs.get(name)
        if buf is None or buf.shape != torch.Size(shape) or buf.dtype != like.dtype or buf.device != like.device:
            buf = torch.empty(shape, dtype=like.dtype, device=like.device)
            self._bufs[name] = buf
        return buf


def batched_forward(theta: Tensor, x: Tensor, ws: Workspace | None = None, tag: str = "") -> tuple[Tensor, Tensor]:
    """Hidden activations H (C, 100, k) and outputs (C, 10, k) of C stacked networks θ (C, m).

    ``x`` (k, 50) is shared by all networks (one large matrix product for the first layer) or
    (C, k, 50) per network (batched products). Layout: points last, so every product is a plain (b)mm.
    With a workspace ``ws`` the results live in its buffers ``tag + "H"``/``tag + "out"`` (valid until
    the next call with the same tag).
    """
    W1, b1, W2, b2 = param_views(theta)
    C, k = theta.shape[0], x.shape[-2]
    if x.ndim == 2:
        z_out = ws.get(tag + "H", (C * N_HIDDEN, k), theta) if ws is not None else None
        Z = torch.matmul(W1.reshape(C * N_HIDDEN, N_INPUTS), x.T, out=z_out).view(C, N_HIDDEN, k)
    else:
        z_out = ws.get(tag + "H", (C, N_HIDDEN, k), theta) if ws is not None else None
        Z = torch.bmm(W1, x.transpose(1, 2), out=z_out)
    H = Z.add_(b1.unsqueeze(-1)).sigmoid_()
    o_out = ws.get(tag + "out", (C, N_OUTPUTS, k), theta) if ws is not None else None
    out = torch.baddbmm(b2.unsqueeze(-1), W2, H, out=o_out)
    return H, out


def batched_backward(theta: Tensor, x: Tensor, H: Tensor, dout: Tensor, ws: Workspace | None = None,
                     tag: str = "") -> Tensor:
    """Gradients (C, G, m) for G output-gradient channels dout (C, G, 10, k) (dL/d outputs).

    Hand-written backward of :func:`batched_forward`; ``x`` as there. dout already holds the per-point loss
    weights, so each channel is the gradient of its own weighted loss.
    """
    _, _, W2, _ = param_views(theta)
    C, G, _, k = dout.shape
    W2t = W2.transpose(1, 2)
    if G == 1:
        d = dout[:, 0]
        dW2 = torch.bmm(d, H.transpose(1, 2)).unsqueeze(1)
        dh_out = ws.get(tag + "dH", (C, N_HIDDEN, k), theta) if ws is not None else None
        dH = torch.bmm(W2t, d, out=dh_out).unsqueeze(1)
    else:
        dW2 = torch.matmul(dout, H.transpose(1, 2).unsqueeze(1))
        dH = torch.matmul(W2t.unsqueeze(1), dout)
    Hg = H.unsqueeze(1)
    dZ = dH.mul_(Hg)
    dZ.addcmul_(dZ, Hg, value=-1.0)  # dH·σ'(z) with σ'(z) = H(1 − H), in place
    if x.ndim == 2:
        dW1 = torch.matmul(dZ.reshape(C * G * N_HIDDEN, k), x).view(C, G, N_HIDDEN * N_INPUTS)
    else:
        dW1 = torch.matmul(dZ, x.unsqueeze(1)).reshape(C, G, N_HIDDEN * N_INPUTS)
    return torch.cat([dW1, dZ.sum(-1), dW2.reshape(C, G, -1), dout.sum(-1)], dim=-1)


def batched_set_gradient(theta: Tensor, x: Tensor, y_t: Tensor, ws: Workspace | None = None, tag: str = "s",
                         on_output: Any = None, output_reduction: str = "mean") -> Tensor:
    """Squared-error gradients (C, m) of C networks θ (C, m) on a whole set shared by all: x (n, 50),
    labels y_t (C, 10, n) or (10, n) (points last), mean over the points and ``output_reduction``
    (``"mean"`` or ``"sum"``) over the outputs (:func:`outputs_averaged`). ``on_output(out)`` sees the outputs
    (C, 10, n) first (the trainer records its test loss there). The trainer's source pass."""
    per = outputs_averaged(output_reduction)
    H, out = batched_forward(theta, x, ws, tag)
    if on_output is not None:
        on_output(out)
    r = out.sub_(y_t).mul_(2.0 / (per * x.shape[0]))
    return batched_backward(theta, x, H, r.unsqueeze(1), ws, tag)[:, 0]


def predict(theta: Tensor, x: Tensor) -> Tensor:
    """Network outputs: θ (m,) → (n, 10); stacked θ (C, m) → (C, n, 10)."""
    single = theta.ndim == 1
    th = theta.unsqueeze(0) if single else theta
    _, out = batched_forward(th, x)
    out = out.transpose(1, 2)
    return out[0] if single else out


def mse_loss(theta: Tensor, x: Tensor, y: Tensor) -> Tensor:
    """MSE averaged over points and outputs (``nn.MSELoss()``): scalar for θ (m,), (C,) for θ (C, m)."""
    return (predict(theta, x) - y).square().mean(dim=(-1, -2))


def full_gradients(theta: Tensor, x: Tensor, y: Tensor, weights: Tensor | None = None) -> Tensor:
    """Gradient of the MSE of θ on (x, y), batched.

    Args:
        theta: (m,) or (C, m).
        x: (n, 50) shared inputs.
        y: (n, 10) labels, or (C, n, 10) one label set per network.
        weights: optional per-point weights (n,) or (C, n) or (C, G, n) (a weighted mean: each channel's
            weights should sum to 1); default uniform 1/n.
    Returns:
        (m,), (C, m) or (C, G, m).
    """
    single = theta.ndim == 1
    th = theta.unsqueeze(0) if single else theta
    C, n = th.shape[0], x.shape[0]
    y_t = y.transpose(-1, -2) if y.ndim == 3 else y.T
    if weights is None:
        g = batched_set_gradient(th, x, y_t)
        return g[0] if single else g
    H, out = batched_forward(th, x)
    r = out - y_t
    w = weights.to(x.dtype)
    w = w.expand(C, 1, n) if w.ndim == 1 else (w.unsqueeze(1) if w.ndim == 2 else w)
    dout = (2.0 / N_OUTPUTS) * r.unsqueeze(1) * w.unsqueeze(2)
    g = batched_backward(th, x, H, dout)
    if weights.ndim < 3:
        g = g[:, 0]
        return g[0] if single else g
    return g

