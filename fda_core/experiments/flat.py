"""One module, flat parameters, fused Adam: the machinery every federated client shares (no model copies).

A single ``nn.Module`` serves every client: its trainable parameters are views into one flat vector ``w``
(m,), and their ``.grad`` views into one flat gradient. Loading the global model into a client is one
``w.copy_(θ)``; a client's update is written straight into a preallocated buffer; Adam runs as a handful
of fused vector operations on ``w``. BatchNorm running statistics are buffers, never parameters: they are
not in ``w``, so they never enter an aggregation rule or an estimator.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["FlatModel", "FlatAdam", "local_train", "count_steps", "accuracy", "cross_entropy", "classifier_positions"]

class FlatModel:
    """Wrap ``module`` so that its trainable parameters are views into one flat vector.

    Attributes:
        module: the wrapped module (its parameters now alias ``flat``).
        flat: (m,) the parameters; ``grad``: (m,) their gradients (autograd accumulates into the views).
        layout: list of (name, offset, numel, shape) of each trainable parameter, in order.
    """

    def __init__(self, module: nn.Module, device: torch.device | str = "cpu"):
        device = torch.device(device)
        self.module = module.to(device)
        params = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        if not params:
            raise ValueError("module has no trainable parameters")
        m = sum(p.numel() for _, p in params)
        dtype = params[0][1].dtype
        self.flat = torch.empty(m, device=device, dtype=dtype)
        self.grad = torch.zeros(m, device=device, dtype=dtype)
        self.layout: list[tuple[str, int, int, torch.Size]] = []
        off = 0
        for name, p in params:
            k = p.numel()
            self.flat[off:off + k].copy_(p.detach().reshape(-1))
            p.data = self.flat[off:off + k].view_as(p)
            p.grad = self.grad[off:off + k].view_as(p)
            self.layout.append((name, off, k, p.shape))
            off += k
        self.buffer_names = [n for n, b in module.named_buffers() if b.is_floating_point()]

    @property
    def m(self) -> int:
        return self.flat.numel()

    def buffers(self) -> dict[str, Tensor]:
        """A copy of the floating-point buffers (BatchNorm running statistics)."""
        return {n: b.detach().clone() for n, b in self.module.named_buffers() if n in self.buffer_names}

    def load_buffers(self, state: Mapping[str, Tensor]) -> None:
        if not state:
            return
        for n, b in self.module.named_buffers():
            if n in state:
                b.copy_(state[n])

    def as_dicts(self, rows: Tensor) -> list[dict[str, Tensor]]:
        """Per-tensor views {name: tensor of the parameter's shape} of each row of ``rows`` (N, m)."""
        return [self.as_dict(r) for r in rows]

    def as_dict(self, vec: Tensor) -> dict[str, Tensor]:
        """Per-tensor views of one flat vector (m,) (no copy)."""
        return {n: vec[o:o + k].view(s) for n, o, k, s in self.layout}


class FlatAdam:
    """Adam on a flat parameter vector: the update of ``torch.optim.Adam`` (no weight decay, no amsgrad;
    Kingma & Ba 2015, Alg. 1 with torch's ε placement), as fused vector operations. ``optimizer='sgd'``
    gives plain SGD (with optional momentum) through the same interface."""

    def __init__(self, m: int, device: torch.device, dtype: torch.dtype = torch.float32, kind: str = "adam",
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, momentum: float = 0.0):
        if kind not in ("adam", "sgd"):
            raise ValueError(f"optimizer must be 'adam' or 'sgd', got {kind!r}")
        self.kind, self.betas, self.eps, self.momentum = kind, betas, eps, momentum
        self.m1 = torch.zeros(m, device=device, dtype=dtype)
        self.m2 = torch.zeros(m, device=device, dtype=dtype) if kind == "adam" else None
        self._tmp = torch.empty(m, device=device, dtype=dtype)
        self.t = 0

    def reset(self) -> None:
        """Fresh optimiser state (NIID-Bench's ``train_net`` creates its optimiser at every local training)."""
        self.m1.zero_()
        if self.m2 is not None:
            self.m2.zero_()
        self.t = 0

    def step(self, w: Tensor, g: Tensor, lr: float) -> None:
        self.t += 1
        if self.kind == "sgd":
            if self.momentum:
                self.m1.mul_(self.momentum).add_(g) if self.t > 1 else self.m1.copy_(g)
                w.add_(self.m1, alpha=-lr)
            else:
                w.add_(g, alpha=-lr)
            return
        b1, b2 = self.betas
        self.m1.lerp_(g, 1 - b1)
        self.m2.mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        torch.sqrt(self.m2, out=self._tmp).div_(math.sqrt(bc2)).add_(self.eps)
        w.addcdiv_(self.m1, self._tmp, value=-lr / bc1)



def cross_entropy(module: nn.Module, x: Tensor, y: Tensor) -> Tensor:
    """The default local objective: mean cross-entropy of ``module(x)`` (logits (n, C)) against labels y (n,)."""
    return F.cross_entropy(module(x), y)


def local_train(fm: FlatModel, opt: FlatAdam, x: Tensor, y: Tensor, *, epochs: int, batch_size: int, lr: float,
                gen: torch.Generator, parts: Tensor | None = None, who: str = "client",
                loss_fn: Callable[[nn.Module, Tensor, Tensor], Tensor] | None = None,
                after_step: Callable[[], None] | None = None, before_step: Callable[[], None] | None = None) -> int:
    """Train ``fm`` in place on (x, y) for ``epochs`` epochs of shuffled mini-batches.

    ``loss_fn(module, x_batch, y_batch)`` is the local objective (default :func:`cross_entropy`, the mean
    cross-entropy of the module's logits); a method changes it to change what clients optimise.
    ``after_step()``, when given, runs after every optimiser step (e.g. a proximal step, or restoring
    frozen coordinates); it may change ``fm.flat`` in place (recorded ``parts`` include its change).
    ``before_step()``, when given, runs after the backward pass and before the optimiser step: it may add to
    ``fm.grad`` the gradient of a term the loss does not hold (Ditto's λ(v − w)), which the optimiser then sees.

    ``parts`` (steps, m), when given, receives the per-batch update w_after − w_before of every step
    (the target's parts for auto-β). Returns the number of steps. Raises FloatingPointError when a loss
    is NaN/inf (names the client)."""
    if loss_fn is None:
        loss_fn = cross_entropy
    fm.module.train()
    n = x.shape[0]
    steps = 0
    loss_sum = torch.zeros((), device=x.device)
    for _ in range(epochs):
        perm = torch.randperm(n, generator=gen).to(x.device)
        for s in range(0, n, batch_size):
            idx = perm[s:s + batch_size]
            fm.grad.zero_()
            loss = loss_fn(fm.module, x[idx], y[idx])
            loss.backward()
            loss_sum += loss.detach()
            if before_step is not None:
                before_step()
            if parts is not None:
                parts[steps].copy_(fm.flat)
            opt.step(fm.flat, fm.grad, lr)
            if after_step is not None:
                after_step()
            if parts is not None:
                parts[steps].sub_(fm.flat).neg_()  # w_after − w_before
            steps += 1
    if not bool(torch.isfinite(loss_sum)):
        raise FloatingPointError(f"{who}: the training loss became NaN/inf (lower the learning rate)")
    return steps


def classifier_positions(fm: FlatModel, who: str) -> Tensor:
    """Positions (in ``fm.flat``) of the module's ``classifier``, its last linear layer (every model of
    :mod:`fda_core.data.models` names it so): FedRep's head, what Finetune_Offline's ``freeze`` fine-tunes.
    ValueError naming ``who`` when the module has no classifier holding trainable parameters."""
    head = getattr(fm.module, "classifier", None)
    own = {id(p) for p in head.parameters()} if isinstance(head, nn.Module) else set()
    names = {n for n, p in fm.module.named_parameters() if id(p) in own}
    idx = [torch.arange(o, o + k) for n, o, k, _ in fm.layout if n in names]
    if not idx:
        raise ValueError(f"{who} needs a model with a `classifier` layer holding trainable parameters; "
                         f"{type(fm.module).__name__} has none")
    return torch.cat(idx).to(fm.flat.device)


def count_steps(n: int, batch_size: int, epochs: int) -> int:
    """Optimiser steps of ``epochs`` epochs of mini-batches of ``batch_size`` over ``n`` samples: ⌈n/bs⌉·epochs."""
    return math.ceil(n / batch_size) * epochs


@torch.no_grad()
def accuracy(fm: FlatModel, x: Tensor, y: Tensor, chunk: int = 2048) -> float:
    fm.module.eval()
    correct = 0
    for s in range(0, x.shape[0], chunk):
        correct += int((fm.module(x[s:s + chunk]).argmax(1) == y[s:s + chunk]).sum())
    return correct / max(x.shape[0], 1)
