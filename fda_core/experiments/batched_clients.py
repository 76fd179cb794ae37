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

Which runs qualify (:func:`batching_blockers`): two or more sources that take the same number of steps per epoch
(sizes may differ: ColoredMNIST's environments are 1,667 and 1,666 images; the short last batches, of different
sizes, are the one step per epoch whose gradients are computed client by client) and the default objective (no
method-specific ``local_loss``, no auxiliary labels). The engine's ``client_batching`` option chooses: ``"auto"``
batches qualifying runs on CUDA devices (the CPU keeps the loop, so CPU results stay as they were), ``"vmap"``
always (an error if the run does not qualify), ``"compile"`` likewise with the objective through ``torch.compile``
(:func:`batched_losses`), ``"loop"`` never.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .flat import FlatAdam, FlatModel, count_steps

__all__ = ["CLIENT_BATCHING", "batched_losses", "batching_blockers", "stack_clients", "train_sources_batched"]

#: allowed values of the engine's ``client_batching`` option
CLIENT_BATCHING = ("auto", "loop", "vmap", "compile")

#: graphs that torch.compile may make of the batched objective in one process, one per (clients, mini-batch) shape
#: (torch's default, 8 per function, is raised to this while the compiled objective runs)
RECOMPILE_LIMIT = 64

#: A batched objective: (parameter leaves [(N, *shape)], buffers {name: (N, *shape)}, x (N, b, *input),
#: y (N, b)) -> the N clients' mean cross-entropies (N,)
BatchedLosses = Callable[[list[Tensor], dict[str, Tensor], Tensor, Tensor], Tensor]


def batched_losses(fm: FlatModel, *, compile: bool = False) -> BatchedLosses:
    """The N clients' mean cross-entropies on their mini-batches as one ``vmap``-ed computation of ``fm.module``
    (each client its own parameters and BatchNorm buffers, :func:`torch.func.functional_call`).

    ``compile=True`` wraps it in :func:`torch.compile` (``dynamic=False``: one graph per mini-batch size, so an
    epoch's short last batch compiles once more). On CUDA the mode is ``"reduce-overhead"``: forward and backward
    replay from CUDA graphs, one launch instead of hundreds of kernels per step; the CPU uses the default mode.
    The first call with a new model and mini-batch shape pays the compilation (~10–20 s on the 2-core CPU); later
    runs of the same model and shapes in the process reuse the graph (torch 2.13: eleven runs, fresh modules, one
    graph). Up to :data:`RECOMPILE_LIMIT` shapes are compiled in one process (torch's own limit, 8, would be reached by
    two or three runs of different sizes, after which it runs the objective eagerly)."""
    from torch.func import functional_call, vmap

    module = fm.module
    names = [name for name, *_ in fm.layout]

    def logits(params: dict[str, Tensor], bufs: dict[str, Tensor], x: Tensor) -> Tensor:  # one client's (b, C)
        return functional_call(module, (params, bufs), (x,))

    batched = vmap(logits, randomness="different")

    def losses(leaves: list[Tensor], bufs: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        z = batched(dict(zip(names, leaves)), bufs, x)  # (N, b, C)
        return F.cross_entropy(z.flatten(0, 1), y.flatten(), reduction="none").view(y.shape).mean(1)

    if not compile:
        return losses
    mode = "reduce-overhead" if fm.flat.device.type == "cuda" else "default"
    compiled = torch.compile(losses, dynamic=False, mode=mode)

    def compiled_losses(leaves: list[Tensor], bufs: dict[str, Tensor], x: Tensor, y: Tensor) -> Tensor:
        # one graph per shape, all of them of one function: torch's default of 8 per function would be spent by two
        # or three runs (each has its sources' full and short batches, and its target's, with "compile"), and every
        # later shape would silently run eagerly
        with torch._dynamo.config.patch(recompile_limit=max(RECOMPILE_LIMIT, torch._dynamo.config.recompile_limit)):
            return compiled(leaves, bufs, x, y)

    return compiled_losses


def batching_blockers(fm: FlatModel, sources: Sequence[dict[str, Any]], *, custom_loss: bool,
                      aux_labels: bool, batch_size: int) -> list[str]:
    """Why these source clients cannot be trained as one batched computation (empty: they can). Clients of
    different sizes qualify when they take the same number of steps per epoch, ⌈n_i / batch_size⌉."""
    reasons = []
    if len(sources) < 2:
        reasons.append("fewer than two source clients")
    sizes = [s["x"].shape[0] for s in sources]
    if len({count_steps(n, batch_size, 1) for n in sizes}) > 1:
        reasons.append(f"source clients take different numbers of steps per epoch (sizes {', '.join(map(str, sizes))}, "
                       f"batch size {batch_size})")
    if custom_loss:
        reasons.append("the method changes the clients' objective (local_loss)")
    if aux_labels:
        reasons.append("the sources train on auxiliary labels")
    return reasons


def stack_clients(tensors: Sequence[Tensor]) -> Tensor:
    """Client tensors (n_i, *shape) stacked into (N, max n_i, *shape), zero-padded at the end (the padding is
    never drawn: each client's permutations run over its own n_i)."""
    n_max = max(t.shape[0] for t in tensors)
    out = tensors[0].new_zeros((len(tensors), n_max, *tensors[0].shape[1:]))
    for row, t in zip(out, tensors):
        row[:t.shape[0]].copy_(t)
    return out


def train_sources_batched(fm: FlatModel, optimizer: FlatAdam, theta: Tensor, xs: Tensor, ys: Tensor, *,
                          epochs: int, batch_size: int, lr: float, generators: Sequence[torch.Generator],
                          names: Sequence[str], out: Tensor, buffers: Mapping[str, Tensor] | None = None,
                          sizes: Sequence[int] | None = None, losses: BatchedLosses | None = None) -> int:
    """Train N clients from ``theta`` (m,) on their data ``xs`` (N, n, *input) / ``ys`` (N, n) and write their
    final parameters into ``out`` (N, m); ``optimizer`` is a :class:`FlatAdam` over N·m coordinates (reset here).
    ``generators[i]`` draws client i's permutations, as in :func:`fda_core.experiments.flat.local_train`.

    ``sizes``: client i's data are its first ``sizes[i]`` rows (default: all n; :func:`stack_clients` pads);
    every client must take the same number of steps per epoch. A step whose mini-batches have equal sizes is one
    ``vmap``-ed computation; a step where they differ (the short last batch of an epoch) computes each client's
    gradient on its own, and the optimiser step is still one for all.

    ``buffers``: {name: (N, *shape)} every floating-point buffer of the module (``fm.buffer_names``: BatchNorm
    running statistics), row i client i's, each row holding the global model's values on entry; they are updated
    in place as client i's own module would update them (required when the module has such buffers). BatchNorm's
    integer ``num_batches_tracked`` stays the module's own and counts every client's steps, as in the loop.
    ``losses``: the batched objective of the equal-size steps (default :func:`batched_losses` of ``fm``; pass one
    made once per run, compiled or not). Returns the number of optimiser steps each client took. Raises
    FloatingPointError naming a client whose loss became NaN/inf."""
    from torch.func import functional_call

    n_clients, n = ys.shape[0], ys.shape[1]
    sizes = [n] * n_clients if sizes is None else [operator.index(k) for k in sizes]
    if len(sizes) != n_clients or not all(1 <= k <= n for k in sizes):
        raise ValueError(f"sizes must give one size in [1, {n}] per client ({n_clients}), got {sizes}")
    per_epoch = [count_steps(k, batch_size, 1) for k in sizes]
    if len(set(per_epoch)) > 1:
        raise ValueError(f"every client must take the same number of steps per epoch, but sizes {sizes} with "
                         f"batch_size={batch_size} give {per_epoch}")
    module = fm.module
    buffers = dict(buffers or {})
    if sorted(buffers) != sorted(fm.buffer_names):
        raise ValueError(f"buffers must hold the module's floating-point buffers {fm.buffer_names}, got {sorted(buffers)}")
    for name, b in buffers.items():
        if b.shape[0] != n_clients:
            raise ValueError(f"buffers[{name!r}] must have one row per client ({n_clients}), got shape {tuple(b.shape)}")

    if losses is None:
        losses = batched_losses(fm)
    mark_step = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    mark_step = mark_step if out.device.type == "cuda" else None
    out.copy_(theta.expand(n_clients, -1))
    grad = torch.empty_like(out)
    # the parameters as (N, *shape) views of ``out``, made once: the optimiser updates ``out`` in place
    params = [out[:, o:o + k].view(n_clients, *shape) for _, o, k, shape in fm.layout]
    param_names = [name for name, *_ in fm.layout]
    optimizer.reset()
    module.train()
    rows = torch.arange(n_clients, device=xs.device).unsqueeze(1)
    loss_sum = torch.zeros(n_clients, device=xs.device)
    steps = vmapped = 0
    for _ in range(epochs):
        # row i: client i's permutation of range(n_i), padded to the longest; one transfer to the device
        perms = stack_clients([torch.randperm(k, generator=g) for k, g in zip(sizes, generators)]).to(xs.device)
        common = min(sizes)
        for s in range(0, max(sizes), batch_size):
            if all(min(k, s + batch_size) == min(common, s + batch_size) for k in sizes):  # within the common part
                idx = perms[:, s:min(s + batch_size, common)]
                if mark_step is not None:
                    mark_step()  # a new step: CUDA-graph outputs of the last one may be overwritten
                leaves = [p.detach().requires_grad_(True) for p in params]
                batch_losses = losses(leaves, buffers, xs[rows, idx], ys[rows, idx])  # (N,)
                # client i's loss depends on row i only; the gradients of the (N, *shape) leaves are laid out as ``out``
                # parameters the loss does not use (auxiliary heads under a plain method) get a zero gradient, as
                # the loop's flat gradient holds for them
                grads = torch.autograd.grad(batch_losses.sum(), leaves, materialize_grads=True)
                loss_sum += batch_losses.detach()
                with torch.no_grad():
                    torch.cat([g.flatten(1) for g in grads], dim=1, out=grad)
                vmapped += 1
            else:  # mini-batches of different sizes: each client's gradient on its own, into its row of ``grad``
                for i, k in enumerate(sizes):
                    idx = perms[i, s:min(s + batch_size, k)]
                    leaves = [p[i].detach().requires_grad_(True) for p in params]
                    own_buffers = {name: b[i] for name, b in buffers.items()}
                    z = functional_call(module, (dict(zip(param_names, leaves)), own_buffers), (xs[i, idx],))
                    loss = F.cross_entropy(z, ys[i, idx])
                    grads = torch.autograd.grad(loss, leaves, materialize_grads=True)
                    loss_sum[i] += loss.detach()
                    with torch.no_grad():
                        torch.cat([g.flatten() for g in grads], out=grad[i])
            with torch.no_grad():
                optimizer.step(out.view(-1), grad.view(-1), lr)
            steps += 1
    with torch.no_grad():  # a vmap-ed forward counted once what the loop counts once per client
        for m in module.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.num_batches_tracked is not None and m.training:
                m.num_batches_tracked.add_(vmapped * (n_clients - 1))
    bad = (~torch.isfinite(loss_sum)).nonzero().flatten().tolist()
    if bad:
        raise FloatingPointError(f"{names[bad[0]]}: the training loss became NaN/inf (lower the learning rate)")
    return steps
