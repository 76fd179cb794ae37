"""FedStarGAN: a StarGAN trained with FedAvg across the domain-clients, the Fed INB paper's federated
translation baseline (Sec. 4.2, Fig. 2d–f, Fig. 3b–c, Fig. 4d, App. E.1; ``docs/translation.md`` § FedStarGAN).

Each client holds one domain and its own copy of the generator G and discriminator D
(:mod:`fda_core.data.stargan_models`); it trains them with StarGAN's losses (the objective of DIRT's StarGAN
solver, which the paper starts from) on mini-batches of its own images, and every ``sync_every`` mini-batches
the server averages the clients' G and D with uniform weights and sends the averages back (FedAvg; each
client keeps its own Adam states). One iteration, per client (``docs/translation.md`` § FedStarGAN):

* D: −mean D_src(x) + mean D_src(G(x, m, m′)) + λ_cls·CE(D_cls(x), m) + λ_gp·(‖∇D_src(x̂)‖ − 1)²
  (WGAN-GP, x̂ a random interpolate of x and G(x));
* every ``n_critic`` iterations, G: −mean D_src(G(x, m, m′)) + λ_cls·CE(D_cls(G(x, m, m′)), m′)
  + λ_rec·mean|x − G(G(x, m, m′), m′, m)|.

m is the client's own domain and m′ ≠ m a target drawn per sample (StarGAN permutes the labels of a batch,
which on a one-domain client would always give m itself). Every exchange goes through a
:class:`~fda_core.experiments.translation.comms.CommunicationLog` (stage ``fedavg``): the initial G and D ↓
once, then per synchronisation each client's G and D ↑ and the averages ↓, so a client transmits
(P_G + P_D)·(1 + 2S) parameters after S synchronisations. The evaluation translates with the server's G.

Nothing is read back from the device between evaluations (``docs/architecture.md`` § Reads from the device): the
step losses are summed when the run ends (:class:`~fda_core.experiments.deferred.DeferredSums`) and the draws
arrive a chunk of iterations at a time (:func:`_draws`); on the CPU the runs are those of the earlier per-step
reads bit for bit.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import Tensor

from ...common.checks import check_int, check_number
from ...common.devices import resolve_device
from ...common.seeding import derive_seed, generator
from ...core.wasserstein import wasserstein_distances
from ...data.stargan_models import StarDiscriminator, StarGenerator, from_gan, one_hot, to_gan
from ..deferred import DeferredSums
from .comms import CommunicationLog
from .dg_clients import choose_client_batching
from .dirt import _batches, _index_chunks
from .stargan_clients import BatchedGANClients, LoopGANClients
from .stargan_clients import flat_state as _flat
from .stargan_clients import load_flat_state as _load

__all__ = ["train_fedstargan", "translate_gan", "gan_wd", "eval_points"]

_INIT, _BATCHES, _TARGETS, _ALPHA = 21, 22, 23, 24
#: client steps whose losses are kept on the device between reads (:class:`~fda_core.experiments.deferred.DeferredSums`;
#: 1 reads after every step, as earlier versions did: ``benchmarks/fedstargan.py`` times both)
LOSS_FLUSH_EVERY = 512


def _draws(streams: Sequence, target_gens: Sequence[torch.Generator], alpha_gens: Sequence[torch.Generator],
           batch_size: int, iterations: int, device: torch.device):
    """The clients' mini-batch indices and target domains, (k, M, B) each, and the weights of the gradient
    penalty's interpolates, (k, M, B, 1, 1, 1), of up to ``dirt.INDEX_CHUNK`` iterations at a time, until
    ``iterations``: a few host-to-device copies per chunk instead of three blocking copies per client step. Each
    generator serves one client and one purpose, so drawing a client's next k steps at once gives the numbers the
    loop of earlier versions drew one step at a time."""
    for batches, targets in _index_chunks(streams, target_gens, batch_size, iterations, True, True, device):
        k = batches.shape[0]
        # a client's next k draws in one call: the generator fills them in order, as k calls of one step each
        # (tests/test_stargan.py checks it against the per-step draws)
        alphas = torch.stack([torch.rand(k, batch_size, 1, 1, 1, generator=g) for g in alpha_gens], dim=1)
        alphas = alphas.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else alphas.to(device)
        yield batches, targets, alphas


def _clock(device: torch.device) -> float:
    """``time.perf_counter()`` once the device has run what was queued (on a GPU the host runs ahead)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def eval_points(total_syncs: int, n: int) -> list[int]:
    """About n synchronisation counts in [1, total_syncs], roughly geometric (the x axis of the WD curves is
    logarithmic), always including 1 and total_syncs."""
    check_int(total_syncs, "total_syncs", 1)
    check_int(n, "n", 1)
    pts = {1, total_syncs} | {int(round(v)) for v in torch.logspace(0, torch.log10(torch.tensor(float(total_syncs))),
                                                                     n).tolist()}
    return sorted(p for p in pts if 1 <= p <= total_syncs)


@torch.inference_mode()
def translate_gan(gen: StarGenerator, x: Tensor, source: int, target: int, chunk: int = 2000) -> Tensor:
    """x (N, 784) of domain ``source`` translated by G to domain ``target``: (N, 784) pixels in [0, 1]."""
    gen.eval()
    out = []
    for i in range(0, x.shape[0], chunk):
        xb = to_gan(x[i:i + chunk])
        c_org = one_hot(torch.full((xb.shape[0],), source, device=xb.device), gen.c_dim)
        c_trg = one_hot(torch.full((xb.shape[0],), target, device=xb.device), gen.c_dim)
        out.append(from_gan(gen(xb, c_org, c_trg)))
    return torch.cat(out) if out else x.new_zeros(0, 784)


def gan_wd(gen: StarGenerator, test_x: Sequence[Tensor], test_y: Sequence[Tensor], method: str = "emd",
           reg: float = 0.02, chunk: int = 1000) -> float:
    """The Fed INB metric for a generator: mean over ordered client pairs (s, t ≠ s) and classes c of
    WD(real held-out class-c digits of t, class-c digits of s translated to t) (``docs/translation.md``
    § Variants, Metric; the same pairs and solver as the INB curves)."""
    dev = next(gen.parameters()).device
    pairs = []
    m = len(test_x)
    classes = sorted(test_y[0].unique().tolist())
    for s in range(m):
        for t in range(m):
            if s != t:
                out = translate_gan(gen, test_x[s].to(dev), s, t).cpu()
                pairs += [(test_x[t][test_y[t] == c], out[test_y[s] == c]) for c in classes]
    return float(wasserstein_distances(pairs, method, reg, chunk=chunk, device=dev).mean())


def train_fedstargan(train_x: Sequence[Tensor], *, sync_every: int, iterations: int, batch_size: int = 16,
                     conv_dim: int = 8, g_repeat: int = 1, d_repeat: int = 3, g_lr: float = 1e-4,
                     d_lr: float = 1e-4, beta1: float = 0.5, beta2: float = 0.999, lambda_cls: float = 1.0,
                     lambda_rec: float = 10.0, lambda_gp: float = 10.0, n_critic: int = 5, seed: int = 0,
                     eval_syncs: Sequence[int] = (), evaluate: Callable[[StarGenerator], float] | None = None,
                     device: str = "cpu", keep: dict | None = None, client_batching: str = "auto") -> dict[str, Any]:
    """Train FedStarGAN (module docstring) on the clients' images ``train_x`` (M tensors (n_m, 784) in [0, 1],
    client m = domain m). ``iterations``: mini-batches per client; FedAvg every ``sync_every`` of them (the
    paper's FedStarGAN-16 / -128) and after the last. ``evaluate(G)`` is called with the server's generator
    after the synchronisations listed in ``eval_syncs`` (and the last) — e.g. :func:`gan_wd`. StarGAN's
    defaults: batch 16, Adam lr 1e-4 with betas (0.5, 0.999), λ_cls = 1, λ_rec = 10, λ_gp = 10, n_critic = 5.
    Seeds: the initial G and D from ``seed``, client m's batches, targets and interpolation weights from
    (seed, m). Returns a JSON-serialisable record: ``curve`` (iteration, syncs, params, params_up, params_down
    per client, value of ``evaluate``), ``n_params_g``, ``n_params_d``, ``syncs``, the communication by message,
    mean losses and ``seconds`` (training only). ``client_batching``: how the clients are computed
    (:mod:`~fda_core.experiments.translation.stargan_clients`): "loop" (one client after another), "vmap" (all at
    once) or "auto" ("vmap" on CUDA, "loop" on the CPU); an execution choice, the same training to rounding."""
    m_clients = len(train_x)
    if m_clients < 2:
        raise ValueError(f"train_x must hold at least 2 clients' images, got {m_clients}")
    for i, x in enumerate(train_x):
        if x.ndim != 2 or x.shape[1] != 784:
            raise ValueError(f"train_x[{i}] must have shape (n, 784), got {tuple(x.shape)}")
    sync_every = check_int(sync_every, "sync_every", 1)
    iterations = check_int(iterations, "iterations", 1)
    batch_size = check_int(batch_size, "batch_size", 1)
    n_critic = check_int(n_critic, "n_critic", 1)
    for name, v in (("g_lr", g_lr), ("d_lr", d_lr)):
        check_number(v, name, 0.0, lo_open=True)
    for name, v in (("lambda_cls", lambda_cls), ("lambda_rec", lambda_rec), ("lambda_gp", lambda_gp)):
        check_number(v, name, 0.0)
    dev = resolve_device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, _INIT))
        server_g = StarGenerator(conv_dim, m_clients, g_repeat).to(dev)
        server_d = StarDiscriminator(28, conv_dim, m_clients, d_repeat).to(dev)
    n_g, n_d = len(_flat([server_g])), len(_flat([server_d]))
    log = CommunicationLog(m_clients)
    flat_g = log.down(0, "fedavg", "initial_generator", _flat([server_g]))
    flat_d = log.down(0, "fedavg", "initial_discriminator", _flat([server_d]))
    make_g = lambda: StarGenerator(conv_dim, m_clients, g_repeat).to(dev)  # noqa: E731
    make_d = lambda: StarDiscriminator(28, conv_dim, m_clients, d_repeat).to(dev)  # noqa: E731
    lam = dict(cls=lambda_cls, rec=lambda_rec, gp=lambda_gp)
    if choose_client_batching(client_batching, server_g, dev) == "vmap":
        clients = BatchedGANClients(make_g(), make_d(), flat_g, flat_d, m_clients, g_lr, d_lr, (beta1, beta2), lam)
    else:
        clients = LoopGANClients(make_g, make_d, flat_g, flat_d, m_clients, g_lr, d_lr, (beta1, beta2), lam)
    sizes = {x.shape[0] for x in train_x}
    stacked_data = torch.stack([x.to(dev) for x in train_x]) if len(sizes) == 1 else None  # (M, n, 784)
    data = None if stacked_data is not None else [x.to(dev) for x in train_x]
    rows = torch.arange(m_clients, device=dev).unsqueeze(1)  # (M, 1): client m's row of every (M, B) index
    streams = [_batches(x.shape[0], batch_size, generator(seed, _BATCHES, m)) for m, x in enumerate(train_x)]
    t_gens = [generator(seed, _TARGETS, m) for m in range(m_clients)]
    a_gens = [generator(seed, _ALPHA, m) for m in range(m_clients)]
    org = rows.expand(m_clients, batch_size)  # (M, B): client m's own domain is m
    wanted = {int(s) for s in eval_syncs}
    curve = []
    d_sums = DeferredSums(("d", "d_cls"), flush_every=LOSS_FLUSH_EVERY)
    g_sums = DeferredSums(("g_fake", "g_rec", "g_cls"), flush_every=LOSS_FLUSH_EVERY)
    syncs, g_steps, it = 0, 0, 0
    seconds = 0.0
    t0 = time.perf_counter()
    for batches, targets, alphas in _draws(streams, t_gens, a_gens, batch_size, iterations, dev):
        for j in range(batches.shape[0]):
            it += 1
            b = batches[j]  # (M, B): client m's mini-batch is row m
            pixels = stacked_data[rows, b] if stacked_data is not None else torch.stack(
                [x[i] for x, i in zip(data, b)])
            x = to_gan(pixels.reshape(-1, 784)).view(m_clients, batch_size, 1, 28, 28)
            train_g = it % n_critic == 0
            clients.step(x, org, targets[j], alphas[j], train_g, d_sums, g_sums)
            g_steps += train_g
            if it % sync_every == 0 or it == iterations:
                syncs += 1
                stacked_g, stacked_d = clients.stacked()
                up_g = log.up(syncs, "fedavg", "client_generator", stacked_g, 0)
                up_d = log.up(syncs, "fedavg", "client_discriminator", stacked_d, 0)
                flat_g = log.down(syncs, "fedavg", "average_generator", up_g.mean(0))
                flat_d = log.down(syncs, "fedavg", "average_discriminator", up_d.mean(0))
                clients.load(flat_g, flat_d)
                _load([server_g], flat_g)
                _load([server_d], flat_d)
                if evaluate is not None and (syncs in wanted or it == iterations):
                    seconds += _clock(dev) - t0
                    value = evaluate(server_g)
                    curve.append(dict(iteration=it, syncs=syncs, params=int(log.total()),
                                      params_up=int(log.total("up")), params_down=int(log.total("down")),
                                      value=float(value)))
                    t0 = time.perf_counter()
    seconds += _clock(dev) - t0
    sums = {**d_sums.read(), **g_sums.read()}
    losses = {k: sums[k] for k in ("d", "g_fake", "g_rec", "g_cls", "d_cls")}  # the records' order of earlier versions
    if keep is not None:
        keep["generator"], keep["discriminator"] = server_g, server_d
    steps_d, steps_g = iterations * m_clients, max(g_steps, 1) * m_clients
    table = log.table()
    return dict(sync_every=sync_every, iterations=iterations, syncs=syncs, n_params_g=n_g, n_params_d=n_d,
                curve=curve, params_total=int(log.total()), params_up=int(log.total("up")),
                params_down=int(log.total("down")),
                comm_by_tag=[dict(tag=t, direction=dr, params=int(v)) for (t, dr), v in
                             table.groupby(["tag", "direction"]).params_per_client.sum().items()],
                losses={k: v / (steps_d if k.startswith("d") else steps_g) for k, v in losses.items()},
                seconds=seconds)
