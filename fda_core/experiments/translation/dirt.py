"""Federated domain generalisation with the Fed INB translators: FedDIRT, its shared-space variant and the
FedAvg baseline (Fed INB paper Sec. 4.3, eq. 5–6, App. E.2, Tables 1–4, Fig. 14; ``docs/translation.md``
§ FedDIRT and § FedDIRT in the shared space).

Setting. M training clients, client m holding only its own rotated domain (0°, 15°, 30°, 45°, 60°); the
model is DIRT's encoder g and classifier h (:class:`~fda_core.data.dirt_models.DIRTNet`). Each client takes one
Adam step per iteration on one mini-batch of its own data; every ``period`` iterations the server averages
the clients' models (FedAvg, uniform weights) and sends the average back. After training, the server's model
is evaluated on unseen rotations (75°, 90°). The local objectives (one class per method, in the style of
:mod:`fda_core.experiments.methods`: a canonical name, a display label, declared options):

* ``fedavg`` — CE(h(g(x)), y) (the paper's baseline, the same network);
* ``feddirt`` — CE + λ·dis(g(x), g(f_{m→m'}(x))), m' ≠ m drawn uniformly **per sample** (paper App. E.2; DIRT
  draws one target per batch, option ``targets="per_batch"``), f the class-conditional Fed INB translator;
* ``feddirt_shared`` — CE + λ·dis(g(x), g(S_m(x))), S_m(x) the sample mapped into the translators' shared
  space by the client's own map T_m and rendered as an image by the client's own decoder (paper eq. 6,
  left as future work there): no other client's translator is needed.

dis is DIRT's mean squared difference of the representations (mean over the batch and the coordinates of z).
Translations are deterministic, so each client's translations to every other domain (and its shared-space
images) are computed once before training (:func:`translation_bank`, :func:`shared_space_images`) and looked
up per sample.

Communication (``docs/translation.md`` § FedDIRT, communication): every model exchange goes through a
:class:`~fda_core.experiments.translation.comms.CommunicationLog` (stage ``fedavg``): the initial model ↓ P
once, then per synchronisation the client's model ↑ P and the average ↓ P, P = the floating-point entries of
the model's state (its parameters; InstanceNorm keeps no statistics). :func:`translator_exchange` counts what
FedDIRT additionally needs once: every client's own translator part sent up and the other clients' parts
received.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor

from ...common.checks import check_choice, check_int, check_number
from ...common.devices import resolve_device
from ...common.seeding import derive_seed, generator
from ...data.dirt_models import NORMS, DIRTNet
from ...data.rotated_domains import rotated_mnist
from ..methods import Method, Option
from .comms import CommunicationLog
from .dg_clients import BatchedClients, DeferredLosses, LoopClients, choose_client_batching
from .inb import FedINB

__all__ = ["DGData", "dg_data", "draw_targets", "dis", "translation_bank", "shared_space_images", "DGMethod",
           "FedAvgDG", "FedDIRT", "FedDIRTShared", "DG_METHODS", "get_dg_method", "parse_dg_spec", "model_entries",
           "train_federated", "translator_exchange", "TARGETS", "TARGET_DOMAINS"]

#: how often FedDIRT draws the target domain m': per sample (the Fed INB paper) or one per batch (DIRT's code)
TARGETS = ("per_sample", "per_batch")
#: which domains FedDIRT's targets m' are drawn from: "all" M training domains, the client's own included (eq. 5's
#: (1/M) Σ over m' = 1..M, and DIRT's code, ``np.random.choice`` over every domain), or the M − 1 "others"
TARGET_DOMAINS = ("all", "others")

# seed-stream tags (fda_core.common.seeding): one per purpose
_INIT, _BATCHES, _TARGETS = 11, 12, 13


# ---------------------------------------------------------------------------------------------
# Data
# ---------------------------------------------------------------------------------------------
@dataclass
class DGData:
    """The domain-generalisation clients and test domains.

    x: (M, N, 784) client m's training digits (the same N digits rotated by ``angles[m]``); y: (N,) their
    labels (class-sorted); ``index``: their positions among the translators' training digits (per client the
    same). test_x: {angle: (N, 784)} the same digits rotated by each unseen angle (paper App. E.2, the
    DIRT / DIVA protocol); heldout_x: {angle: (N_h, 784)} held-out digits rotated by each unseen angle, with
    heldout_y. ``source``: where the digits come from.
    """

    angles: list[float]
    test_angles: list[float]
    x: Tensor
    y: Tensor
    index: Tensor
    test_x: dict[float, Tensor]
    heldout_x: dict[float, Tensor]
    heldout_y: Tensor
    source: str
    sizes: dict = field(default_factory=dict)


def dg_data(angles: Sequence[float] = (0, 15, 30, 45, 60), test_angles: Sequence[float] = (75, 90),
            n_train_per_class: int = 400, n_test_per_class: int = 100, n_dg_per_class: int = 100,
            data_root: str = "", seed: int = 0) -> DGData:
    """The clients of FedDIRT: the first ``n_dg_per_class`` digits per class of the translators' training digits
    (:func:`~fda_core.data.rotated_domains.rotated_mnist` with the same ``n_train_per_class``,
    ``n_test_per_class``, ``data_root`` and ``seed``, so they are the digits the translators were fitted on,
    rotated by each training angle); the test domains rotate the same digits (paper App. E.2) and, as a second
    test, the translators' held-out digits. Raises ValueError for a bad size or an unseen angle that is also a
    training angle."""
    check_int(n_train_per_class, "n_train_per_class", 2)
    check_int(n_test_per_class, "n_test_per_class", 1)
    check_int(n_dg_per_class, "n_dg_per_class", 1, n_train_per_class)
    angles, test_angles = [float(a) for a in angles], [float(a) for a in test_angles]
    if len(angles) < 2:
        raise ValueError(f"angles must name at least 2 training domains, got {angles}")
    if not test_angles or set(test_angles) & set(angles):
        raise ValueError(f"test_angles must be non-empty and unseen (not in angles {angles}), got {test_angles}")
    dom = rotated_mnist(angles + test_angles, n_train_per_class, n_test_per_class, data_root, seed)
    index = torch.cat([torch.arange(c * n_train_per_class, c * n_train_per_class + n_dg_per_class) for c in range(10)])
    y = dom.train_y[0][index]
    if not torch.equal(y, torch.arange(10).repeat_interleave(n_dg_per_class)):
        raise ValueError("the translators' training digits are not class-sorted with n_train_per_class per class")
    m = len(angles)
    return DGData(angles, test_angles, torch.stack([dom.train_x[i][index] for i in range(m)]), y, index,
                  {a: dom.train_x[m + j][index] for j, a in enumerate(test_angles)},
                  {a: dom.test_x[m + j] for j, a in enumerate(test_angles)}, dom.test_y[0], dom.source,
                  dict(n_train_per_class=n_train_per_class, n_test_per_class=n_test_per_class,
                       n_dg_per_class=n_dg_per_class))


def draw_targets(own: int, n_domains: int, n: int, gen: torch.Generator, per_sample: bool = True,
                 include_own: bool = False) -> Tensor:
    """Target domains for n samples (``docs/translation.md`` § FedDIRT), drawn per sample (the Fed INB paper) or
    once for the whole batch (``per_sample=False``, DIRT's code). ``include_own``: uniform over all n_domains
    domains, ``own`` included (FedDIRT's default, eq. 5 and DIRT's code); otherwise m' ≠ ``own``, uniform over the
    other n_domains − 1: m' = (own + 1 + U) mod M, U uniform on {0, …, M − 2} (FedStarGAN's targets, and
    FedDIRT's ``domains="others"``). (n,) int64."""
    check_int(n_domains, "n_domains", 2)
    check_int(own, "own", 0, n_domains - 1)
    check_int(n, "n", 0)
    if include_own:
        return torch.randint(0, n_domains, (n if per_sample else 1,), generator=gen).expand(n).clone()
    u = torch.randint(0, n_domains - 1, (n if per_sample else 1,), generator=gen)
    return ((own + 1 + u) % n_domains).expand(n).clone()


def dis(z: Tensor, z_other: Tensor) -> Tensor:
    """DIRT's distance between representations (its code: ``F.mse_loss(z', z, 'mean')``): the mean over the
    batch and the coordinates of (z − z')²; the Fed INB paper's dis of eq. 5–6 (``docs/translation.md``
    § FedDIRT). Both (n, k)."""
    if z.shape != z_other.shape:
        raise ValueError(f"z and z_other must have the same shape, got {tuple(z.shape)} and {tuple(z_other.shape)}")
    return F.mse_loss(z_other, z, reduction="mean")


@torch.inference_mode()
def translation_bank(translator: FedINB, x: Tensor, y: Tensor) -> Tensor:
    """Every client's digits translated to every other client's domain: (M, M, N, 784) float32 with
    bank[m, m'] = f_{m→m'}(x[m]) = T_{m'}⁻¹(T_m(x[m])) (class-conditional; ``docs/translation.md`` § One INB
    layer) and bank[m, m] = x[m]. x: (M, N, 784) the clients' digits (class-sorted, the same labels y (N,) on
    every client); the translator's clients must be the same M domains."""
    m, n, d = x.shape
    if m != translator.n_domains:
        raise ValueError(f"x has {m} clients, the translator {translator.n_domains}")
    if y.shape != (n,):
        raise ValueError(f"y must have shape ({n},), got {tuple(y.shape)}")
    bank = x[:, None].repeat(1, m, 1, 1).float()
    order = torch.argsort(y, stable=True)
    if not torch.equal(order, torch.arange(n)):
        raise ValueError("y must be sorted by class (translate_all returns class-sorted digits)")
    for _, s, t, out, labels in translator.translate_all(list(x), [y] * m, [translator.n_layers]):
        if not torch.equal(labels.cpu(), y):
            raise ValueError("translated digits came back in another order than y")
        bank[s, t] = out.float().cpu()
    return bank


@torch.inference_mode()
def shared_space_images(translator: FedINB, x: Tensor, y: Tensor) -> Tensor:
    """Client m's digits mapped into the translators' shared space by its own T_m and rendered with its own
    decoding (:meth:`~fda_core.experiments.translation.inb.FedINB.inverse_transform` with no layer: the
    client's decoder for the AE variants, Φ for pixel INB with the probit transform):
    S_m(x) = D_m(T_m(x)) (paper eq. 6; ``docs/translation.md`` § FedDIRT in the shared space). (M, N, 784)."""
    out = []
    for m in range(x.shape[0]):
        z = translator.transform(x[m], m, y)
        out.append(translator.inverse_transform(z, m, y, layers=0).float().cpu())
    return torch.stack(out)


# ---------------------------------------------------------------------------------------------
# Methods
# ---------------------------------------------------------------------------------------------
class DGMethod(Method):
    """A federated domain-generalisation method: the local objective of a client on one mini-batch, given the
    precomputed image of each sample the method needs (``view``: "translated", "shared" or None); the server
    step is FedAvg every ``period`` mini-batches (:func:`train_federated`). Options and labels as
    :class:`~fda_core.experiments.methods.Method` (the FDA round hooks are not used)."""

    view: ClassVar[str | None] = None
    uses_translator: ClassVar[bool] = False

    def dg_loss(self, net: DIRTNet, x: Tensor, y: Tensor, x_view: Tensor | None) -> tuple[Tensor, Tensor]:
        """(total loss, cross-entropy) of one mini-batch."""
        raise NotImplementedError


class FedAvgDG(DGMethod):
    """FedAvg: the clients minimise the cross-entropy only (the Fed INB paper's baseline)."""

    name, label = "fedavg", "FedAvg"

    def dg_loss(self, net, x, y, x_view):
        ce = F.cross_entropy(net(x), y)
        return ce, ce


def _lam_option(default: float = 2.0) -> Option:
    return Option(default, lambda v, n: check_number(v, n, 0.0), lambda v: f"λ={v:g}",
                  "λ, the weight of the invariance term (paper App. E.2: 2 on MNIST, 10 on Fashion-MNIST) ≥ 0")


class _Regularised(DGMethod):
    def dg_loss(self, net, x, y, x_view):
        z = net.features(torch.cat([x, x_view]))
        z_x, z_v = z[: x.shape[0]], z[x.shape[0]:]
        ce = F.cross_entropy(net.head(z_x), y)
        return ce + self.lam * dis(z_x, z_v), ce


class FedDIRT(_Regularised):
    """FedDIRT (paper eq. 5): CE + λ·dis(g(x), g(f_{m→m'}(x))), m' drawn per sample (``targets``) from every
    training domain, the client's own included (``domains``; f_{m→m} is the identity, bank[m, m] = x)."""

    name, label = "feddirt", "FedDIRT"
    view = "translated"
    uses_translator = True
    options = {"lam": _lam_option(),
               "targets": Option("per_sample", lambda v, n: check_choice(v, n, TARGETS), lambda v: v.replace("_", "-"),
                                 "'per_sample' (the Fed INB paper) or 'per_batch' (DIRT: one target per batch)"),
               "domains": Option("all", lambda v, n: check_choice(v, n, TARGET_DOMAINS), lambda v: f"m' from {v}",
                                 "'all' (eq. 5 and DIRT's code: every training domain, the own included) or "
                                 "'others' (m' ≠ m, the workbook's rule before 2026-11-27)")}


class FedDIRTShared(_Regularised):
    """FedDIRT in the shared space (paper eq. 6): CE + λ·dis(g(x), g(S_m(x))) with the client's own T_m only."""

    name, label = "feddirt_shared", "FedDIRT (shared space)"
    view = "shared"
    uses_translator = True
    options = {"lam": _lam_option()}


#: the domain-generalisation methods by canonical name
DG_METHODS: dict[str, type[DGMethod]] = {c.name: c for c in (FedAvgDG, FedDIRT, FedDIRTShared)}


def get_dg_method(name: str, **options: Any) -> DGMethod:
    """A DG method by canonical name with options (ValueError naming the allowed names or options)."""
    if name not in DG_METHODS:
        raise ValueError(f"method must be one of {sorted(DG_METHODS)}, got {name!r}")
    return DG_METHODS[name](**options)


def parse_dg_spec(spec: str | Mapping[str, Mapping[str, Any]]) -> DGMethod:
    """A method from a name (``"feddirt"``) or a one-entry mapping ``{"feddirt": {"lam": 10}}`` (notebook
    parameters cannot hold ``=`` signs)."""
    if isinstance(spec, str):
        return get_dg_method(spec)
    if isinstance(spec, Mapping) and len(spec) == 1:
        (name, opts), = spec.items()
        return get_dg_method(name, **dict(opts or {}))
    raise ValueError(f"a method must be a name or a one-entry mapping {{name: {{options}}}}, got {spec!r}")


# ---------------------------------------------------------------------------------------------
# Training
# ---------------------------------------------------------------------------------------------
def model_entries(net: torch.nn.Module) -> list[str]:
    """The state entries a FedAvg exchange sends: the floating-point entries of the state dict (parameters,
    and BatchNorm statistics when there are any), in order."""
    return [k for k, v in net.state_dict().items() if v.is_floating_point()]


def _flat(net: torch.nn.Module, keys: Sequence[str]) -> Tensor:
    sd = net.state_dict()
    return torch.cat([sd[k].reshape(-1) for k in keys])


def _load_flat(net: torch.nn.Module, keys: Sequence[str], flat: Tensor) -> None:
    sd = net.state_dict()
    off = 0
    with torch.no_grad():
        for k in keys:
            t = sd[k]
            t.copy_(flat[off:off + t.numel()].view_as(t))
            off += t.numel()


def _batches(n: int, batch_size: int, gen: torch.Generator):
    """An endless stream of mini-batch indices: consecutive slices of a fresh permutation of the n samples,
    continuing into the next permutation at an epoch's end, so every batch holds ``batch_size`` samples."""
    buf = torch.empty(0, dtype=torch.long)
    while True:
        while buf.numel() < batch_size:
            buf = torch.cat([buf, torch.randperm(n, generator=gen)])
        yield buf[:batch_size]
        buf = buf[batch_size:]


#: iterations whose mini-batch indices (and target domains) are drawn on the host ahead of time and sent to the
#: device in one copy (:func:`_index_chunks`)
INDEX_CHUNK = 256


def _index_chunks(streams: Sequence, target_gens: Sequence[torch.Generator], batch_size: int, iterations: int,
                  translated: bool, per_sample: bool, device: torch.device, include_own: bool = False):
    """The clients' mini-batch indices, (k, M, B), and target domains, (k, M, B) or None unless ``translated``,
    of up to :data:`INDEX_CHUNK` iterations at a time, until ``iterations``: one host-to-device copy per chunk
    instead of two blocking copies per client step. Each generator serves one client and one purpose, so drawing a
    client's next k steps at once gives the numbers the loop drew one step at a time."""
    n_clients, done = len(streams), 0
    while done < iterations:
        k = min(INDEX_CHUNK, iterations - done)
        parts = [torch.stack([torch.stack([next(s) for s in streams]) for _ in range(k)])]
        if translated:
            parts.append(torch.stack([torch.stack([draw_targets(m, n_clients, batch_size, g, per_sample, include_own)
                                                   for m, g in enumerate(target_gens)]) for _ in range(k)]))
        both = torch.stack(parts)
        both = both.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else both.to(device)
        yield both[0], (both[1] if translated else None)
        done += k


@torch.inference_mode()
def _accuracy(net: DIRTNet, x: Tensor, y: Tensor, chunk: int = 2000) -> float:
    correct = sum(int((net(x[i:i + chunk]).argmax(1) == y[i:i + chunk]).sum()) for i in range(0, x.shape[0], chunk))
    return 100.0 * correct / x.shape[0]


def train_federated(method: DGMethod, x: Tensor, y: Tensor, *, views: Tensor | None = None, period: int = 1,
                    iterations: int = 100, batch_size: int = 64, lr: float = 1e-3, width: float = 1.0,
                    norm: str = "instance", seed: int = 0, run: int = 0, eval_every: int = 0,
                    tests: Mapping[str, tuple[Tensor, Tensor]] | None = None, device: str = "cpu",
                    keep: dict | None = None, client_batching: str = "auto",
                    budgets: Mapping[str, int] | None = None) -> dict[str, Any]:
    """Train ``method`` with FedAvg every ``period`` mini-batches (module docstring; paper App. E.2).

    x: (M, N, 784) client m's digits, y: (N,) or (M, N) labels. views: what the method's ``view`` needs —
    the :func:`translation_bank` (M, M, N, 784) for "translated", :func:`shared_space_images` (M, N, 784) for
    "shared". iterations: mini-batches per client (each an Adam step with the client's own optimiser state,
    kept between synchronisations); the last iteration always ends with a synchronisation, so the evaluated
    server model averages every client's last step. Seeds: the initial model from (seed, run), client m's
    batches and targets from (seed, run, m) (:func:`fda_core.common.seeding.derive_seed`).
    tests: {name: (x, y)} evaluated with the server model every ``eval_every`` iterations (0: at the end only)
    and at the end. Returns a JSON-serialisable record: ``curve`` (iteration, synchronisations so far,
    parameters per client so far, accuracy per test), ``final`` (the last point), ``loss`` (mean training
    loss and cross-entropy between evaluation points), ``n_params``, ``syncs``, the communication by message
    and ``seconds``. ``keep``: a dict that receives the trained server model under ``"server"``.

    ``client_batching`` (:mod:`~fda_core.experiments.translation.dg_clients`): "loop" trains the clients one after
    the other (the CPU's form under "auto"; every earlier version's results, bit for bit); "vmap" as one batched
    computation (the form "auto" takes on CUDA; equal to the loop to rounding); it does not enter the record.
    Nothing is read back from the device between evaluations (the losses are summed when evaluated).

    ``budgets``: {test name: iterations} for tests whose paper protocol trains for fewer iterations than
    ``iterations`` (Rotated Fashion-MNIST, App. E.2: 1,500 for 75°, 3,000 for 90°). Such a test's ``final``
    accuracy is read at its budget from the average of the clients' models there: the server model a run of that
    many iterations ends with (its last iteration always synchronises; equal bit for bit, tested), so one run
    serves every budget. The record then holds ``budgets`` too.
    """
    if not isinstance(method, DGMethod):
        raise ValueError(f"method must be a DGMethod (get_dg_method), got {method!r}")
    if x.ndim != 3 or x.shape[2] != 784:
        raise ValueError(f"x must have shape (M, N, 784), got {tuple(x.shape)}")
    m_clients, n = x.shape[:2]
    y = y.expand(m_clients, n) if y.ndim == 1 else y
    if y.shape != (m_clients, n):
        raise ValueError(f"y must have shape ({n},) or ({m_clients}, {n}), got {tuple(y.shape)}")
    period = check_int(period, "period", 1)
    iterations = check_int(iterations, "iterations", 1)
    batch_size = check_int(batch_size, "batch_size", 1)
    lr = check_number(lr, "lr", 0.0, lo_open=True)
    eval_every = check_int(eval_every, "eval_every", 0)
    check_int(run, "run", 0)
    check_choice(norm, "norm", NORMS)
    want = {"translated": (m_clients, m_clients, n, 784), "shared": (m_clients, n, 784), None: None}[method.view]
    if want is not None and (views is None or tuple(views.shape) != want):
        raise ValueError(f"method {method.name!r} needs views of shape {want} ({method.view} images), got "
                         f"{None if views is None else tuple(views.shape)}")
    budgets = dict(budgets or {})
    for name, b in budgets.items():
        if name not in (tests or {}):
            raise ValueError(f"budgets names a test {name!r} that is not among tests {sorted(tests or {})}")
        check_int(b, f"budgets[{name!r}]", 1, iterations)
    dev = resolve_device(device)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, _INIT, run))
        server = DIRTNet(10, width=width, norm=norm).to(dev)
    keys = model_entries(server)
    form = choose_client_batching(client_batching, server, dev)
    log = CommunicationLog(m_clients)
    global_flat = log.down(0, "fedavg", "initial_model", _flat(server, keys))
    if form == "vmap":
        clients = BatchedClients(DIRTNet(10, width=width, norm=norm).to(dev), keys, global_flat, m_clients, lr)
    else:
        clients = LoopClients(lambda: DIRTNet(10, width=width, norm=norm).to(dev), keys, global_flat, m_clients, lr,
                              _load_flat, _flat)
    streams = [_batches(n, batch_size, generator(seed, _BATCHES, run, m)) for m in range(m_clients)]
    target_gens = [generator(seed, _TARGETS, run, m) for m in range(m_clients)]
    per_sample = getattr(method, "targets", "per_sample") == "per_sample"
    include_own = getattr(method, "domains", "all") == "all"
    xd, yd = x.to(dev), y.to(dev)
    views_d = None if views is None else views.to(dev)
    rows = torch.arange(m_clients, device=dev).unsqueeze(1)  # (M, 1): client m's row of every (M, B) index
    tests = {name: (tx.to(dev), ty.to(dev)) for name, (tx, ty) in (tests or {}).items()}  # on the device once
    curve, losses = [], []
    at_budget: dict[str, float] = {}  # accuracy of each budgeted test at its budget
    budget_net = None  # the model a run of a budget's length ends with, for budgets short of ``iterations``
    pending = DeferredLosses(m_clients)
    steps, syncs, it = 0, 0, 0
    t0 = time.perf_counter()

    def evaluate(it: int) -> None:
        nonlocal steps
        server.eval()
        point = dict(iteration=it, syncs=syncs, params=int(log.total()))
        point.update({name: _accuracy(server, tx, ty) for name, (tx, ty) in tests.items()})
        curve.append(point)
        loss_sum, ce_sum = pending.read()
        losses.append(dict(iteration=it, loss=loss_sum / max(steps, 1), ce=ce_sum / max(steps, 1)))
        steps = 0

    for batches, targets in _index_chunks(streams, target_gens, batch_size, iterations,
                                          method.view == "translated", per_sample, dev, include_own):
        for j in range(batches.shape[0]):
            it += 1
            b = batches[j]  # (M, B): client m's mini-batch is row m
            if method.view == "translated":
                xv = views_d[rows, targets[j], b]  # client m's sample i translated into domain targets[j, m, i]
            elif method.view == "shared":
                xv = views_d[rows, b]
            else:
                xv = None
            clients.step(method, xd[rows, b], yd[rows, b], xv, pending)
            steps += 1
            if it % period == 0 or it == iterations:
                syncs += 1
                stacked = log.up(syncs, "fedavg", "client_model", clients.stacked(), 0)
                global_flat = log.down(syncs, "fedavg", "average_model", stacked.mean(0))  # uniform FedAvg weights
                _load_flat(server, keys, global_flat)
                clients.load(global_flat)
            if (eval_every and it % eval_every == 0) or it == iterations:
                evaluate(it)
            due = [name for name, b in budgets.items() if b == it and b < iterations]
            if due:  # a shorter run would end here with a synchronisation: evaluate the clients' average
                if budget_net is None:  # its initial weights are overwritten: keep the global stream untouched
                    with torch.random.fork_rng(devices=[]):
                        budget_net = DIRTNet(10, width=width, norm=norm).to(dev)
                _load_flat(budget_net, keys, clients.stacked().mean(0))
                budget_net.eval()
                at_budget.update({name: _accuracy(budget_net, *tests[name]) for name in due})
    seconds = time.perf_counter() - t0
    if keep is not None:
        keep["server"] = server
    table = log.table()
    extra = {"budgets": budgets} if budgets else {}
    return dict(method=method.spec, label=method.display_label, period=period, iterations=iterations, **extra,
                n_params=len(global_flat), syncs=syncs, curve=curve, final={**curve[-1], **at_budget}, loss=losses,
                params_total=int(log.total()), params_up=int(log.total("up")), params_down=int(log.total("down")),
                comm_by_tag=[dict(tag=t, direction=d, params=int(v)) for (t, d), v in
                             table.groupby(["tag", "direction"]).params_per_client.sum().items()],
                seconds=seconds)


def translator_exchange(translator: FedINB, n_decoder_params: int = 0) -> dict[str, int]:
    """Parameters per client to hand every client the other clients' translators once, before FedDIRT
    (``docs/translation.md`` § FedDIRT, communication). Client m's own part of f is its 1-D maps — per layer,
    class and direction the client CDF (μ, σ and B masses: the ``client_cdf`` message of the fit) — plus, for
    IndAEINB, its decoder; Θ and the barycenter quantile functions were broadcast during the fit and every
    client has them. Each client sends its part up once and receives the M − 1 others' parts:
    up = own, down = (M − 1)·own. ``n_decoder_params``: the entries of one client's decoder (0 for INB and
    AEINB, whose decoder every client already shares). The shared-space variant needs none of it."""
    if translator.communication is None:
        raise ValueError("translator is not fitted")
    check_int(n_decoder_params, "n_decoder_params", 0)
    own = int(translator.communication.total(direction="up", stage="barycenter")) + n_decoder_params
    m = translator.n_domains
    return dict(up=own, down=(m - 1) * own, total=m * own)
