"""The source clients of one round trained as one batched computation (``torch.func.vmap`` over stacked parameters).

Algorithm 1 (FedGP paper) trains every source client from the global model h^(r-1) on its own data, one after the
other. The clients never interact inside a round, so on a GPU they can run as one computation: their parameters
stacked into W (N, m), every mini-batch step one ``vmap``-ed forward/backward of the shared module over the N
clients (``torch.func.functional_call`` with each client's parameters, as (N, *shape) views of W, and each
client's BatchNorm statistics, as (N, *shape) buffers), and Adam (or SGD) as the same fused vector operations on
all N·m numbers (:class:`fda_core.experiments.flat.FlatAdam`; its moments are per coordinate, so per client, and
every client takes the same number of steps).

What is kept from the loop, exactly: each client's mini-batch stream (the same generator and permutations as
:func:`fda_core.experiments.flat.local_train`), the objective (mean cross-entropy per client and batch), the
optimiser's state reset per round, the step count, each client's BatchNorm running statistics (starting from the
global model's, updated by its own batches) and BatchNorm's step counter, and the error naming a client whose loss
became NaN/inf. What differs: the order of floating-point operations inside the batched convolutions and matrix
products, so the updates agree with the loop's to float rounding, not bit for bit; in float64 they agree to
1e-10 (``tests/test_batched_clients.py``).

Kernel count (what bounds a GPU step at these sizes): the parameter views are made once per round, outside
``vmap``, and the gradient is taken at them and written into one (N, m) buffer with one ``torch.cat``. Taking it
at W instead makes autograd zero-fill and copy an (N, m) tensor for every parameter tensor (2·L + 1 more kernels
per step).

Which runs qualify (:func:`batching_blockers`): two or more sources of equal size and the default objective (no
method-specific ``local_loss``, no auxiliary labels). The engine's
``client_batching`` option chooses: ``"auto"`` batches qualifying runs on CUDA devices (the CPU keeps the loop, so
CPU results stay as they were), ``"vmap"`` always (an error if the run does not qualify), ``"loop"`` never.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from .flat import FlatAdam, FlatModel

__all__ = ["CLIENT_BATCHING", "batching_blockers", "train_sources_batched"]

#: allowed values of the engine's ``client_batching`` option
CLIENT_BATCHING = ("auto", "loop", "vmap")


def batching_blockers(fm: FlatModel, sources: Sequence[dict[str, Any]], *, custom_loss: bool,
                      aux_labels: bool) -> list[str]:
    """Why these source clients cannot be trained as one batched computation (empty: they can)."""
    reasons = []
    if len(sources) < 2:
        reasons.append("fewer than two source clients")
    if len({s["x"].shape[0] for s in sources}) > 1:
        reasons.append("source clients of different sizes (" + ", ".join(str(s["x"].shape[0]) for s in sources) + ")")
    if custom_loss:
        reasons.append("the method changes the clients' objective (local_loss)")
    if aux_labels:
        reasons.append("the sources train on auxiliary labels")
    return reasons


def train_sources_batched(fm: FlatModel, optimizer: FlatAdam, theta: Tensor, xs: Tensor, ys: Tensor, *,
                          epochs: int, batch_size: int, lr: float, generators: Sequence[torch.Generator],
                          names: Sequence[str], out: Tensor, buffers: Mapping[str, Tensor] | None = None) -> int:
    """Train N clients from ``theta`` (m,) on their data ``xs`` (N, n, *input) / ``ys`` (N, n) and write their
    final parameters into ``out`` (N, m); ``optimizer`` is a :class:`FlatAdam` over N·m coordinates (reset here).
    ``generators[i]`` draws client i's permutations, as in :func:`fda_core.experiments.flat.local_train`.

    ``buffers``: {name: (N, *shape)} every floating-point buffer of the module (``fm.buffer_names``: BatchNorm
    running statistics), row i client i's, each row holding the global model's values on entry; they are updated
    in place as client i's own module would update them (required when the module has such buffers). Integer
    buffers (BatchNorm's ``num_batches_tracked``) stay the module's own and count every client's steps, as in the
    loop. Returns the number of optimiser steps each client took. Raises FloatingPointError naming a client whose
    loss became NaN/inf."""
    from torch.func import functional_call, vmap

    n_clients, n = ys.shape[0], ys.shape[1]
    module = fm.module
    buffers = dict(buffers or {})
    if sorted(buffers) != sorted(fm.buffer_names):
        raise ValueError(f"buffers must hold the module's floating-point buffers {fm.buffer_names}, got {sorted(buffers)}")
    for name, b in buffers.items():
        if b.shape[0] != n_clients:
            raise ValueError(f"buffers[{name!r}] must have one row per client ({n_clients}), got shape {tuple(b.shape)}")
    counters = {name: b for name, b in module.named_buffers() if not b.is_floating_point()}
    counted = {name: b.clone() for name, b in counters.items()}

    def logits(params: dict[str, Tensor], bufs: dict[str, Tensor], x: Tensor) -> Tensor:  # one client's (b, C)
        return functional_call(module, (params, bufs), (x,))

    batched = vmap(logits, randomness="different")
    out.copy_(theta.expand(n_clients, -1))
    grad = torch.empty_like(out)
    # the parameters as (N, *shape) views of ``out``, made once: the optimiser updates ``out`` in place
    params = [out[:, o:o + k].view(n_clients, *shape) for _, o, k, shape in fm.layout]
    param_names = [name for name, *_ in fm.layout]
    optimizer.reset()
    module.train()
    rows = torch.arange(n_clients, device=xs.device).unsqueeze(1)
    loss_sum = torch.zeros(n_clients, device=xs.device)
    steps = 0
    for _ in range(epochs):
        perms = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(xs.device)  # (N, n)
        for s in range(0, n, batch_size):
            idx = perms[:, s:s + batch_size]
            leaves = [p.detach().requires_grad_(True) for p in params]
            z = batched(dict(zip(param_names, leaves)), buffers, xs[rows, idx])  # (N, b, C)
            losses = F.cross_entropy(z.flatten(0, 1), ys[rows, idx].flatten(), reduction="none").view(idx.shape).mean(1)
            # client i's loss depends on row i only; the gradients of the (N, *shape) leaves are laid out as ``out``
            grads = torch.autograd.grad(losses.sum(), leaves)
            loss_sum += losses.detach()
            with torch.no_grad():
                torch.cat([g.flatten(1) for g in grads], dim=1, out=grad)
                optimizer.step(out.view(-1), grad.view(-1), lr)
            steps += 1
    with torch.no_grad():  # one vmap-ed forward counted once what the loop counts once per client
        for name, b in counters.items():
            b.add_((b - counted[name]) * (n_clients - 1))
    bad = (~torch.isfinite(loss_sum)).nonzero().flatten().tolist()
    if bad:
        raise FloatingPointError(f"{names[bad[0]]}: the training loss became NaN/inf (lower the learning rate)")
    return steps
