"""The source clients of one round trained as one batched computation (``torch.func.vmap`` over stacked parameters).

Algorithm 1 (FedGP paper) trains every source client from the global model h^(r-1) on its own data, one after the
other. The clients never interact inside a round, so on a GPU they can run as one computation: their parameters
stacked into W (N, m), every mini-batch step one ``vmap``-ed forward/backward of the shared module over the N
clients (``torch.func.functional_call`` with each client's parameter row), and Adam (or SGD) as the same fused
vector operations on all N·m numbers (:class:`fda_core.experiments.flat.FlatAdam`; its moments are per coordinate,
so per client, and every client takes the same number of steps).

What is kept from the loop, exactly: each client's mini-batch stream (the same generator and permutations as
:func:`fda_core.experiments.flat.local_train`), the objective (mean cross-entropy per client and batch), the
optimiser's state reset per round, the step count, and the error naming a client whose loss became NaN/inf. What
differs: the order of floating-point operations inside the batched convolutions and matrix products, so the
updates agree with the loop's to float rounding, not bit for bit (``tests/test_batched_clients.py``).

Which runs qualify (:func:`batching_blockers`): two or more sources of equal size, the default objective (no
method-specific ``local_loss``, no auxiliary labels) and a module without BatchNorm statistics. The engine's
``client_batching`` option chooses: ``"auto"`` batches qualifying runs on CUDA devices (the CPU keeps the loop, so
CPU results stay as they were), ``"vmap"`` always (an error if the run does not qualify), ``"loop"`` never.
"""

from __future__ import annotations

from collections.abc import Sequence
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
    if fm.buffer_names:
        reasons.append("the model keeps BatchNorm statistics (" + ", ".join(fm.buffer_names[:3]) + ", ...)")
    return reasons


def train_sources_batched(fm: FlatModel, optimizer: FlatAdam, theta: Tensor, xs: Tensor, ys: Tensor, *,
                          epochs: int, batch_size: int, lr: float, generators: Sequence[torch.Generator],
                          names: Sequence[str], out: Tensor) -> int:
    """Train N clients from ``theta`` (m,) on their data ``xs`` (N, n, *input) / ``ys`` (N, n) and write their
    final parameters into ``out`` (N, m); ``optimizer`` is a :class:`FlatAdam` over N·m coordinates (reset here).
    ``generators[i]`` draws client i's permutations, as in :func:`fda_core.experiments.flat.local_train`. Returns
    the number of optimiser steps each client took. Raises FloatingPointError naming a client whose loss became
    NaN/inf."""
    from torch.func import functional_call, vmap

    n_clients, n = ys.shape[0], ys.shape[1]
    layout = fm.layout
    module = fm.module

    def logits(w: Tensor, x: Tensor) -> Tensor:  # one client: parameters (m,), inputs (b, *input)
        params = {name: w[o:o + k].view(shape) for name, o, k, shape in layout}
        return functional_call(module, params, (x,))

    batched = vmap(logits, randomness="different")
    out.copy_(theta.expand(n_clients, -1))
    optimizer.reset()
    module.train()
    rows = torch.arange(n_clients, device=xs.device).unsqueeze(1)
    loss_sum = torch.zeros(n_clients, device=xs.device)
    steps = 0
    for _ in range(epochs):
        perms = torch.stack([torch.randperm(n, generator=g) for g in generators]).to(xs.device)  # (N, n)
        for s in range(0, n, batch_size):
            idx = perms[:, s:s + batch_size]
            w = out.detach().requires_grad_(True)
            z = batched(w, xs[rows, idx])  # (N, b, C)
            losses = F.cross_entropy(z.flatten(0, 1), ys[rows, idx].flatten(), reduction="none").view(idx.shape).mean(1)
            (grad,) = torch.autograd.grad(losses.sum(), w)  # client i's loss depends on row i only
            loss_sum += losses.detach()
            with torch.no_grad():
                optimizer.step(out.view(-1), grad.view(-1), lr)
            steps += 1
    bad = (~torch.isfinite(loss_sum)).nonzero().flatten().tolist()
    if bad:
        raise FloatingPointError(f"{names[bad[0]]}: the training loss became NaN/inf (lower the learning rate)")
    return steps
