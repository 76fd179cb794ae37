"""The M clients of a FedDIRT / FedAvg run, in two forms behind one interface (``client_batching`` of
:func:`fda_core.experiments.translation.dirt.train_federated`; ``docs/translation.md`` § FedDIRT, how the
clients are computed).

Every iteration each client takes one Adam step on its own mini-batch (its objective is the method's
``dg_loss``), and at a synchronisation the server averages the clients' models (FedAvg, uniform weights) and
every client continues from the average with its own optimiser state.

* :class:`LoopClients` (``"loop"``): one module and one ``torch.optim.Adam`` per client, stepped one after the
  other. This is the form of the papers' code; on the CPU it is the default, and its results are those of
  every earlier version bit for bit.
* :class:`BatchedClients` (``"vmap"``): the M clients' parameters are the rows of one (M, P) tensor; an
  iteration is one ``torch.func.vmap``-ed forward and backward of the method's objective over the M clients
  (``torch.func.functional_call`` with each client's parameters), and one Adam step on all M·P numbers
  (:class:`fda_core.experiments.flat.FlatAdam`: the update of ``torch.optim.Adam``; its moments are per
  coordinate, so per client, and every client has taken the same number of steps). A GPU step at these sizes
  is bound by kernel launches, M per layer in the loop and one in this form. What differs from the loop is the
  order of floating-point operations inside the batched convolutions and matrix products: the results agree
  to rounding, not bit for bit (in float64 to 1e-10, ``tests/test_dirt.py``). Models with BatchNorm
  statistics (``norm="batch"``) keep the loop: their running statistics are not parameters.

Neither form reads anything back from the device during training: the losses of each step are kept on the
device and read by :class:`DeferredLosses` at evaluation points, and the mini-batch indices arrive from the
host ahead of time (``dirt._index_chunks``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from ..deferred import DeferredSums
from ..flat import FlatAdam

__all__ = ["CLIENT_BATCHING", "DeferredLosses", "LoopClients", "ParameterRows", "BatchedClients", "batching_blockers",
           "choose_client_batching"]

#: the values of ``client_batching``: "auto" (the batched form on CUDA where the model qualifies, the loop
#: otherwise), "loop", "vmap" (the batched form, an error where the model does not qualify)
CLIENT_BATCHING = ("auto", "loop", "vmap")

#: Adam's defaults in ``torch.optim.Adam`` (the loop's optimiser; the batched form uses the same)
_BETAS, _EPS = (0.9, 0.999), 1e-8


def batching_blockers(net: nn.Module) -> list[str]:
    """Why the clients of ``net``'s architecture cannot train as one batched computation (empty: they can)."""
    stats = [name for name, b in net.named_buffers() if b.is_floating_point()]
    if stats:
        return [f"the model keeps running statistics ({', '.join(stats[:2])}{', …' if len(stats) > 2 else ''}: "
                "BatchNorm), which the clients exchange but the batched form does not train; use norm='instance'"]
    return []


def choose_client_batching(mode: str, net: nn.Module, device: torch.device) -> str:
    """"loop" or "vmap" for ``mode`` (:data:`CLIENT_BATCHING`): "auto" batches on CUDA where the model
    qualifies; "vmap" raises ValueError naming what blocks it."""
    if mode not in CLIENT_BATCHING:
        raise ValueError(f"client_batching must be one of {list(CLIENT_BATCHING)}, got {mode!r}")
    blockers = batching_blockers(net)
    if mode == "vmap" and blockers:
        raise ValueError("client_batching='vmap' cannot batch these clients: " + "; ".join(blockers))
    if mode == "auto":
        return "vmap" if device.type == "cuda" and not blockers else "loop"
    return mode


class DeferredLosses(DeferredSums):
    """The per-step (loss, cross-entropy) of the clients, kept on the device and summed on the host when read
    (:class:`fda_core.experiments.deferred.DeferredSums`).

    ``add(values)``: one step's values as a tensor flattened in the order (loss of client 0, CE of client 0,
    loss of client 1, …). ``read()`` returns (Σ loss / M, Σ CE / M) since the last read, summed in Python floats
    in the order the values were added — the sums the loop formed with ``loss.item() / M`` after every step,
    bit for bit, with one device read instead of two per client step. At most ``flush_every`` steps are kept on
    the device between reads."""

    def __init__(self, n_clients: int, flush_every: int = 512):
        super().__init__(("loss", "ce"), divisor=n_clients, flush_every=flush_every)
        self.n_clients = n_clients

    def read(self) -> tuple[float, float]:  # type: ignore[override]
        """(Σ loss / M, Σ CE / M) of the steps since the last read."""
        sums = super().read()
        return sums["loss"], sums["ce"]


class LoopClients:
    """M copies of ``make_net()`` loaded with ``start`` (P,), each with its own ``torch.optim.Adam`` (lr)."""

    def __init__(self, make_net: Callable[[], nn.Module], keys: Sequence[str], start: Tensor, n_clients: int,
                 lr: float, load: Callable[[nn.Module, Sequence[str], Tensor], None],
                 flat: Callable[[nn.Module, Sequence[str]], Tensor]):
        self.keys, self._load, self._flat = keys, load, flat
        self.nets = [make_net() for _ in range(n_clients)]
        for net in self.nets:
            load(net, keys, start)
            net.train()
        self.opts = [torch.optim.Adam(net.parameters(), lr=lr) for net in self.nets]

    def step(self, method: Any, xb: Tensor, yb: Tensor, xv: Tensor | None, losses: DeferredLosses) -> None:
        """One Adam step of every client: ``xb`` (M, B, 784), ``yb`` (M, B), ``xv`` the views (M, B, 784) or None."""
        for m, (net, opt) in enumerate(zip(self.nets, self.opts)):
            loss, ce = method.dg_loss(net, xb[m], yb[m], None if xv is None else xv[m])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.add(torch.stack([loss.detach(), ce.detach()]))

    def stacked(self) -> Tensor:
        """The clients' models (M, P), as the exchange sends them."""
        return torch.stack([self._flat(net, self.keys) for net in self.nets])

    def load(self, global_flat: Tensor) -> None:
        for net in self.nets:
            self._load(net, self.keys, global_flat)


class _Objective(nn.Module):
    """(loss, CE) of ``method.dg_loss`` on ``net`` as one (2,) tensor: the function ``vmap`` maps over the
    clients (``functional_call`` swaps in each client's parameters, named ``net.<name>``)."""

    def __init__(self, net: nn.Module, method: Any):
        super().__init__()
        self.net = net
        self.method = method

    def forward(self, x: Tensor, y: Tensor, x_view: Tensor | None) -> Tensor:
        return torch.stack(self.method.dg_loss(self.net, x, y, x_view))


class ParameterRows:
    """M copies of a model's parameters as the rows of one (M, P) tensor, starting from ``start`` (P,), each
    parameter also an (M, *shape) view of the rows (made once: an optimiser updates the rows in place). ``module``
    is called with client m's parameters in place of its own (``torch.func.functional_call`` under ``names``, the
    parameters in the order of the rows), for every client at once (``vmap``, :meth:`batched`)."""

    def __init__(self, module: nn.Module, names: Sequence[str], shapes: Sequence[torch.Size], start: Tensor,
                 n_clients: int):
        if any(b.is_floating_point() for b in module.buffers()):
            raise ValueError("the batched clients need a model without floating-point buffers (running statistics)")
        sizes = [math.prod(s) for s in shapes]
        if sum(sizes) != start.numel():
            raise ValueError(f"start must hold the model's {sum(sizes)} parameters, got {start.numel()}")
        self.rows = start.detach().expand(n_clients, -1).clone()  # (M, P): client m's model is row m
        self.grad = torch.empty_like(self.rows)
        offsets = [0, *itertools.accumulate(sizes)]
        self.params = [self.rows[:, o:o + k].view(n_clients, *s) for o, k, s in zip(offsets, sizes, shapes)]
        self._module, self._names = module, list(names)
        self._batched: dict[tuple, Callable] = {}

    @classmethod
    def of(cls, net: nn.Module, start: Tensor, n_clients: int) -> "ParameterRows":
        """The rows of ``net``'s parameters in the order of ``net.named_parameters()``."""
        named = dict(net.named_parameters())
        return cls(net, list(named), [p.shape for p in named.values()], start, n_clients)

    def batched(self, in_dims: tuple) -> Callable:
        """``f(leaves, *args)``: the module on every client's arguments with its own parameters ``leaves`` (the
        (M, *shape) tensors of :meth:`leaves`); ``in_dims`` says which arguments carry a client dimension (0) and
        which are shared (None)."""
        if in_dims not in self._batched:
            from torch.func import functional_call, vmap

            module, names = self._module, self._names

            def one(leaves: Sequence[Tensor], *args: Tensor | None) -> Any:
                return functional_call(module, dict(zip(names, leaves)), args)

            self._batched[in_dims] = vmap(one, in_dims=(0, *in_dims))
        return self._batched[in_dims]

    def leaves(self, trainable: bool) -> list[Tensor]:
        """The parameters to call :meth:`batched` with: fresh leaves that record gradients, or detached ones."""
        return [p.detach().requires_grad_(True) if trainable else p.detach() for p in self.params]

    def step(self, opt: FlatAdam, grads: Sequence[Tensor], lr: float) -> None:
        """One step of ``opt`` on all rows with ``grads``, one (M, *shape) tensor per parameter."""
        with torch.no_grad():
            torch.cat([g.flatten(1) for g in grads], dim=1, out=self.grad)
            opt.step(self.rows.view(-1), self.grad.view(-1), lr)


class BatchedClients:
    """M clients of ``net``'s architecture as the rows of one (M, P) parameter tensor, all starting from
    ``start`` (P,), trained by one ``vmap``-ed step per iteration and :class:`FlatAdam` (lr) on all rows.
    ``keys``: the parameter names in the order of the exchanged vector (the model's floating-point state, which
    for a model without buffers is its parameters in order)."""

    def __init__(self, net: nn.Module, keys: Sequence[str], start: Tensor, n_clients: int, lr: float):
        blockers = batching_blockers(net)
        if blockers:
            raise ValueError("; ".join(blockers))
        named = dict(net.named_parameters())
        if list(keys) != list(named):
            raise ValueError(f"keys must be the model's parameter names in order, got {list(keys)}")
        self.n_clients, self.lr = n_clients, lr
        self.objective = _Objective(net, None).train()
        self.clients = ParameterRows(self.objective, [f"net.{k}" for k in keys], [named[k].shape for k in keys],
                                     start, n_clients)
        self.rows = self.clients.rows
        self.opt = FlatAdam(self.rows.numel(), self.rows.device, self.rows.dtype, betas=_BETAS, eps=_EPS)

    def step(self, method: Any, xb: Tensor, yb: Tensor, xv: Tensor | None, losses: DeferredLosses) -> None:
        """One Adam step of every client, as :meth:`LoopClients.step`."""
        self.objective.method = method
        leaves = self.clients.leaves(True)
        objective = self.clients.batched((0, 0, 0 if xv is not None else None))
        values = objective(leaves, xb, yb, xv)  # (M, 2): (loss, CE) per client
        # client m's loss depends on row m only, so the gradient of the sum is every client's own gradient
        grads = torch.autograd.grad(values[:, 0].sum(), leaves, materialize_grads=True)
        self.clients.step(self.opt, grads, self.lr)
        losses.add(values)

    def stacked(self) -> Tensor:
        return self.rows

    def load(self, global_flat: Tensor) -> None:
        self.rows.copy_(global_flat.expand_as(self.rows))

