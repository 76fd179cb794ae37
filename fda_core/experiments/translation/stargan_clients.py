"""The M clients of a FedStarGAN run, in two forms behind one interface (``client_batching`` of
:func:`fda_core.experiments.translation.stargan.train_fedstargan`; ``docs/translation.md`` § FedStarGAN).

Every iteration each client takes one discriminator step on its own mini-batch and, every ``n_critic`` iterations,
one generator step (StarGAN's losses, module docstring of :mod:`~fda_core.experiments.translation.stargan`); at a
synchronisation the server averages the clients' G and D and every client continues from the averages with its
own Adam states.

* :class:`LoopGANClients` (``"loop"``): one G, one D and two ``torch.optim.Adam`` per client, stepped one client
  after the other, as StarGAN's solver steps its one pair. The CPU's form; its results are those of every earlier
  version bit for bit.
* :class:`BatchedGANClients` (``"vmap"``): the M clients' G parameters are the rows of one (M, P_G) tensor and
  their D parameters the rows of one (M, P_D) tensor; a D step is one ``torch.func.vmap``-ed computation of the
  discriminator loss of all M clients (the gradient penalty's input gradient included: client m's score depends on
  its own interpolates only, so the gradient of the sum is every client's own), and one Adam step on all M·P_D
  numbers (:class:`fda_core.experiments.flat.FlatAdam`, the update of ``torch.optim.Adam`` with StarGAN's betas);
  a G step likewise. A GPU step at these sizes is bound by kernel launches, M per layer in the loop and one here.
  What differs from the loop is the order of floating-point operations inside the batched convolutions: the two
  forms agree to rounding, not bit for bit (in float64 to 1e-9, ``tests/test_stargan.py``).

Neither form reads a value back from the device: the step losses go to the caller's
:class:`~fda_core.experiments.deferred.DeferredSums`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ...data.stargan_models import StarDiscriminator, StarGenerator, one_hot
from ..deferred import DeferredSums
from ..flat import FlatAdam
from .dg_clients import ParameterRows

__all__ = ["LoopGANClients", "BatchedGANClients", "flat_state", "load_flat_state"]

#: Adam's ε in ``torch.optim.Adam`` (StarGAN's solver keeps the default)
_EPS = 1e-8


def flat_state(nets: Sequence[nn.Module]) -> Tensor:
    """The floating-point state of ``nets`` (their parameters, in order: the StarGAN networks keep no buffers) as
    one vector, as the exchange sends it."""
    return torch.cat([p.detach().reshape(-1) for net in nets for p in net.state_dict().values()
                      if p.is_floating_point()])


def load_flat_state(nets: Sequence[nn.Module], flat: Tensor) -> None:
    """Copy ``flat`` (from :func:`flat_state`) into ``nets``."""
    off = 0
    with torch.no_grad():
        for net in nets:
            for t in net.state_dict().values():
                if t.is_floating_point():
                    t.copy_(flat[off:off + t.numel()].view_as(t))
                    off += t.numel()


def gradient_penalty(out: Tensor, x: Tensor) -> Tensor:
    """mean over the batch of (‖∂ Σ out / ∂x‖₂ − 1)² (WGAN-GP, as StarGAN's ``gradient_penalty``)."""
    grad = torch.autograd.grad(out, x, torch.ones_like(out), create_graph=True, retain_graph=True)[0]
    return (grad.flatten(1).norm(dim=1) - 1).square().mean()


class LoopGANClients:
    """M copies of G and D loaded with ``flat_g`` and ``flat_d``, each with its own ``torch.optim.Adam`` (lr ``g_lr``,
    ``d_lr``, ``betas``); ``lambdas``: the losses' weights {"cls": λ_cls, "rec": λ_rec, "gp": λ_gp}."""

    def __init__(self, make_g: Callable[[], StarGenerator], make_d: Callable[[], StarDiscriminator], flat_g: Tensor,
                 flat_d: Tensor, n_clients: int, g_lr: float, d_lr: float, betas: tuple[float, float],
                 lambdas: dict[str, float]):
        self.gens = [make_g() for _ in range(n_clients)]
        self.discs = [make_d() for _ in range(n_clients)]
        self.load(flat_g, flat_d)
        for g, d in zip(self.gens, self.discs):
            g.train()
            d.train()
        self.g_opts = [torch.optim.Adam(g.parameters(), g_lr, betas=betas) for g in self.gens]
        self.d_opts = [torch.optim.Adam(d.parameters(), d_lr, betas=betas) for d in self.discs]
        self.lam = lambdas  # the losses' weights λ_cls, λ_rec, λ_gp (keys cls, rec, gp)
        self.n_clients = n_clients

    def step(self, x: Tensor, org: Tensor, trg: Tensor, alpha: Tensor, train_g: bool, d_sums: DeferredSums,
             g_sums: DeferredSums) -> None:
        """One D step of every client (and a G step when ``train_g``): x (M, B, 1, 28, 28) the clients' images in
        [−1, 1], org and trg (M, B) their own and target domains, alpha (M, B, 1, 1, 1) the interpolation weights.
        Adds (D loss, D's domain CE) per client to ``d_sums`` and (G's adversarial, reconstruction, domain CE) to
        ``g_sums``, client after client."""
        lam, n_clients = self.lam, self.n_clients
        for m in range(n_clients):
            g, d = self.gens[m], self.discs[m]
            xm = x[m]
            c_org, c_trg = one_hot(org[m], n_clients), one_hot(trg[m], n_clients)
            # discriminator
            out_src, out_cls = d(xm)
            d_real, d_cls = -out_src.mean(), F.cross_entropy(out_cls, org[m])
            fake = g(xm, c_org, c_trg)
            d_fake = d(fake.detach())[0].mean()
            x_hat = (alpha[m] * xm + (1 - alpha[m]) * fake.detach()).requires_grad_(True)
            gp = gradient_penalty(d(x_hat)[0], x_hat)
            d_loss = d_real + d_fake + lam["cls"] * d_cls + lam["gp"] * gp
            self.d_opts[m].zero_grad(set_to_none=True)
            d_loss.backward()
            self.d_opts[m].step()
            d_sums.add(torch.stack([d_loss.detach(), d_cls.detach()]))
            # generator
            if train_g:
                fake = g(xm, c_org, c_trg)
                out_src, out_cls = d(fake)
                g_fake, g_cls = -out_src.mean(), F.cross_entropy(out_cls, trg[m])
                g_rec = (xm - g(fake, c_trg, c_org)).abs().mean()
                g_loss = g_fake + lam["rec"] * g_rec + lam["cls"] * g_cls
                self.g_opts[m].zero_grad(set_to_none=True)
                g_loss.backward()
                self.g_opts[m].step()
                g_sums.add(torch.stack([g_fake.detach(), g_rec.detach(), g_cls.detach()]))

    def stacked(self) -> tuple[Tensor, Tensor]:
        """The clients' G and D, (M, P_G) and (M, P_D), as the exchange sends them."""
        return (torch.stack([flat_state([g]) for g in self.gens]), torch.stack([flat_state([d]) for d in self.discs]))

    def load(self, flat_g: Tensor, flat_d: Tensor) -> None:
        for g, d in zip(self.gens, self.discs):
            load_flat_state([g], flat_g)
            load_flat_state([d], flat_d)


class BatchedGANClients:
    """M clients of ``gen``'s and ``disc``'s architectures as the rows of two parameter tensors, trained by one
    ``vmap``-ed D step (and G step) per iteration and :class:`FlatAdam` on all rows (module docstring)."""

    def __init__(self, gen: StarGenerator, disc: StarDiscriminator, flat_g: Tensor, flat_d: Tensor, n_clients: int,
                 g_lr: float, d_lr: float, betas: tuple[float, float], lambdas: dict[str, float]):
        gen.train()
        disc.train()
        self.g = ParameterRows.of(gen, flat_g, n_clients)
        self.d = ParameterRows.of(disc, flat_d, n_clients)
        self._g, self._d = self.g.batched((0, 0, 0)), self.d.batched((0,))  # G(x, c, c'), D(x) of every client
        dev, dtype = flat_g.device, flat_g.dtype
        self.g_opt = FlatAdam(self.g.rows.numel(), dev, dtype, betas=betas, eps=_EPS)
        self.d_opt = FlatAdam(self.d.rows.numel(), dev, dtype, betas=betas, eps=_EPS)
        self.g_lr, self.d_lr, self.lam, self.n_clients = g_lr, d_lr, lambdas, n_clients

    def _per_client_ce(self, logits: Tensor, labels: Tensor) -> Tensor:
        """(M, B, C) logits and (M, B) labels → (M,) each client's mean cross-entropy."""
        m, b = labels.shape
        return F.cross_entropy(logits.reshape(m * b, -1), labels.reshape(-1), reduction="none").view(m, b).mean(1)

    def step(self, x: Tensor, org: Tensor, trg: Tensor, alpha: Tensor, train_g: bool, d_sums: DeferredSums,
             g_sums: DeferredSums) -> None:
        """As :meth:`LoopGANClients.step`, every client at once."""
        lam, n_clients = self.lam, self.n_clients
        c_org, c_trg = one_hot(org.reshape(-1), n_clients), one_hot(trg.reshape(-1), n_clients)
        c_org, c_trg = c_org.view(*org.shape, n_clients), c_trg.view(*trg.shape, n_clients)
        # discriminator: every client's loss depends on its own row only, so the gradient of the sum is each one's
        d_leaves = self.d.leaves(True)
        out_src, out_cls = self._d(d_leaves, x)
        d_real, d_cls = -out_src.flatten(1).mean(1), self._per_client_ce(out_cls, org)
        with torch.no_grad():
            fake = self._g(self.g.leaves(False), x, c_org, c_trg)
        d_fake = self._d(d_leaves, fake)[0].flatten(1).mean(1)
        x_hat = (alpha * x + (1 - alpha) * fake).requires_grad_(True)
        out = self._d(d_leaves, x_hat)[0]
        grad = torch.autograd.grad(out.sum(), x_hat, create_graph=True)[0]  # client m's rows: its own ∂D/∂x̂
        gp = (grad.flatten(2).norm(dim=2) - 1).square().mean(1)
        d_loss = d_real + d_fake + lam["cls"] * d_cls + lam["gp"] * gp
        self.d.step(self.d_opt, torch.autograd.grad(d_loss.sum(), d_leaves), self.d_lr)
        d_sums.add(torch.stack([d_loss.detach(), d_cls.detach()], 1))
        if not train_g:
            return
        # generator, against the discriminators just updated
        g_leaves, d_fixed = self.g.leaves(True), self.d.leaves(False)
        fake = self._g(g_leaves, x, c_org, c_trg)
        out_src, out_cls = self._d(d_fixed, fake)
        g_fake, g_cls = -out_src.flatten(1).mean(1), self._per_client_ce(out_cls, trg)
        g_rec = (x - self._g(g_leaves, fake, c_trg, c_org)).abs().flatten(1).mean(1)
        g_loss = g_fake + lam["rec"] * g_rec + lam["cls"] * g_cls
        self.g.step(self.g_opt, torch.autograd.grad(g_loss.sum(), g_leaves), self.g_lr)
        g_sums.add(torch.stack([g_fake.detach(), g_rec.detach(), g_cls.detach()], 1))

    def stacked(self) -> tuple[Tensor, Tensor]:
        return self.g.rows, self.d.rows

    def load(self, flat_g: Tensor, flat_d: Tensor) -> None:
        self.g.rows.copy_(flat_g.expand_as(self.g.rows))
        self.d.rows.copy_(flat_d.expand_as(self.d.rows))
