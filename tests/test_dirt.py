"""FedDIRT, its shared-space variant and the FedAvg baseline (fda_core.experiments.translation.dirt), the DIRT
network, and fitted translators kept beside the result store (translation.translators)."""

import math

import pandas as pd
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
import torch.nn.functional as F
from scipy import stats

from device_reads import DeviceReads

from fda_core.common.seeding import derive_seed, generator
from fda_core.data.dirt_models import DIRTNet
from fda_core.experiments.translation import dirt
from fda_core.experiments.translation.comms import expected_messages
from fda_core.experiments.translation.inb import FedINB
from fda_core.experiments.translation.translators import load_translator, save_translator

pytestmark = pytest.mark.usefixtures("one_thread")


def _clients(m=3, n=40, seed=0):
    """m clients holding the same n random 'digits' shifted per client, labels of 4 classes (class-sorted)."""
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(n, 784, generator=g)
    x = torch.stack([(base + 0.1 * i).clamp(0, 1) for i in range(m)])
    y = torch.arange(4).repeat_interleave(n // 4)
    return x, y


def _flat(net):
    return torch.cat([p.detach().reshape(-1) for p in net.state_dict().values() if p.is_floating_point()])


# -- the network ---------------------------------------------------------------------------------------
def test_dirt_net_has_dirts_shapes_and_parameter_count():
    net = DIRTNet(10)
    # conv 1→32 5x5 (no bias) + IN affine, conv 32→64 5x5 + IN affine, Linear(1024→64), Linear(64→10)
    expected = 32 * 25 + 2 * 32 + 64 * 32 * 25 + 2 * 64 + 1024 * 64 + 64 + 64 * 10 + 10
    assert sum(p.numel() for p in net.parameters()) == expected == 118_442
    x = torch.rand(3, 784)
    assert net.features(x).shape == (3, 64) and net(x).shape == (3, 10)
    assert torch.allclose(net(x), net.head(net.features(x.view(3, 1, 28, 28))))
    assert not any(b.is_floating_point() for b in net.buffers())  # InstanceNorm: no statistics to average
    assert DIRTNet(10, width=0.25).channels == (8, 16)
    with pytest.raises(ValueError, match="width"):
        DIRTNet(10, width=0)
    with pytest.raises(ValueError, match="norm"):
        DIRTNet(10, norm="layer")


# -- the pieces of the objective --------------------------------------------------------------------------
def test_targets_are_uniform_over_the_other_domains_or_over_all():
    m, n = 5, 20_000
    for own in range(m):
        t = dirt.draw_targets(own, m, n, torch.Generator().manual_seed(own))
        assert t.shape == (n,) and not (t == own).any() and t.min() >= 0 and t.max() < m
        counts = torch.bincount(t, minlength=m)[[d for d in range(m) if d != own]].numpy()
        assert stats.chisquare(counts).pvalue > 1e-4  # uniform over the M - 1 other domains
    batch = dirt.draw_targets(2, m, 64, torch.Generator().manual_seed(0), per_sample=False)
    assert len(set(batch.tolist())) == 1 and batch[0] != 2  # DIRT's per-batch draw: one target
    # FedDIRT's default (eq. 5's (1/M) Σ over m' = 1..M, DIRT's np.random.choice over every domain): the own too
    for own in range(m):
        t = dirt.draw_targets(own, m, n, torch.Generator().manual_seed(own), include_own=True)
        assert t.min() >= 0 and t.max() < m
        assert stats.chisquare(torch.bincount(t, minlength=m).numpy()).pvalue > 1e-4  # uniform over all M
    drawn = {int(dirt.draw_targets(2, m, 8, torch.Generator().manual_seed(s), per_sample=False, include_own=True)[0])
             for s in range(60)}
    assert drawn == set(range(m))
    assert dirt.get_dg_method("feddirt").domains == "all"
    assert dirt.get_dg_method("feddirt", domains="others").display_label == "FedDIRT (m' from others)"
    with pytest.raises(ValueError, match="domains"):
        dirt.get_dg_method("feddirt", domains="mine")
    with pytest.raises(ValueError, match="own"):
        dirt.draw_targets(5, 5, 3, torch.Generator())
    with pytest.raises(ValueError, match="n_domains"):
        dirt.draw_targets(0, 1, 3, torch.Generator())


def test_dis_is_dirts_mean_squared_difference():
    z, w = torch.tensor([[1.0, 2.0], [0.0, 0.0]]), torch.tensor([[1.0, 0.0], [3.0, 0.0]])
    assert float(dirt.dis(z, w)) == pytest.approx((0 + 4 + 9 + 0) / 4)
    with pytest.raises(ValueError, match="same shape"):
        dirt.dis(z, w[:1])


def test_regulariser_is_zero_for_the_identity_translator():
    """A Fed INB translator with no layer (and no input transform) is the identity: the translation bank
    holds each client's own digits and FedDIRT's objective is the cross-entropy alone."""
    x, y = _clients(m=3, n=40)
    ident = FedINB(0, 2, 1, variant="INB", input_transform="none").fit(list(x), [y] * 3)
    bank = dirt.translation_bank(ident, x, y)
    assert bank.shape == (3, 3, 40, 784)
    for s in range(3):
        for t in range(3):
            assert torch.equal(bank[s, t], x[s])
    net = DIRTNet(4, width=0.25)
    method = dirt.get_dg_method("feddirt")
    b = torch.arange(8)
    with torch.no_grad():
        total, ce = method.dg_loss(net, x[0, b], y[b], bank[0, 2, b])
    assert float(total) == pytest.approx(float(ce), abs=1e-6) and float(ce) == pytest.approx(
        float(F.cross_entropy(net(x[0, b]), y[b]).detach()), rel=1e-6)
    # a real translation makes it positive, weighted by lambda
    shifted = (x[0, b] + 0.3).clamp(0, 1)
    with torch.no_grad():
        t2, ce2 = dirt.get_dg_method("feddirt", lam=2.0).dg_loss(net, x[0, b], y[b], shifted)
        t4, _ = dirt.get_dg_method("feddirt", lam=4.0).dg_loss(net, x[0, b], y[b], shifted)
    assert float(t2) > float(ce2) and float(t4 - ce2) == pytest.approx(2 * float(t2 - ce2), rel=1e-5)
    # the shared space of the identity translator is the data itself
    assert torch.equal(dirt.shared_space_images(ident, x, y), x)


def test_translation_bank_matches_translate_pair_by_pair():
    x, y = _clients(m=3, n=40, seed=1)
    tr = FedINB(2, 3, 5, variant="INB", input_transform="none", seed=0).fit(list(x), [y] * 3)
    bank = dirt.translation_bank(tr, x, y)
    for s, t in [(0, 1), (2, 0), (1, 2)]:
        assert torch.allclose(bank[s, t], tr.translate(x[s], s, t, y).float(), atol=1e-6)
    assert not torch.allclose(bank[0, 1], x[0])
    with pytest.raises(ValueError, match="sorted by class"):
        dirt.translation_bank(tr, x, y.flip(0))


# -- the federated loop -------------------------------------------------------------------------------
def _plain_training(x, y, iterations, seed, run=0, width=0.25, lr=1e-3, batch_size=16):
    """Centralised training written out: the same initial model and batch order as client 0 of the loop."""
    torch.manual_seed(derive_seed(seed, 11, run))
    net = DIRTNet(10, width=width)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    g = generator(seed, 12, run, 0)
    order = torch.cat([torch.randperm(x.shape[0], generator=g) for _ in range(math.ceil(iterations * batch_size
                                                                                           / x.shape[0]) + 1)])
    for it in range(iterations):
        b = order[it * batch_size:(it + 1) * batch_size]
        loss = F.cross_entropy(net(x[b]), y[b])
        opt.zero_grad()
        loss.backward()
        opt.step()
    return net


def test_fedavg_with_period_one_and_one_client_is_plain_training():
    x, y = _clients(m=1, n=40)
    keep = {}
    rec = dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, period=1, iterations=7, batch_size=16, width=0.25,
                               seed=3, keep=keep)
    plain = _plain_training(x[0], y, 7, seed=3)
    assert torch.equal(_flat(keep["server"]), _flat(plain))
    assert rec["syncs"] == 7


def test_fedavg_with_one_synchronisation_averages_independent_trainings():
    """period ≥ iterations: the clients train on their own from the same model and are averaged once at the end."""
    x, y = _clients(m=2, n=40)
    keep = {}
    dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, period=50, iterations=5, batch_size=16, width=0.25,
                         seed=1, keep=keep)
    # client m's batches come from stream (seed, 12, run, m): train each alone with its own stream
    nets = []
    for m in range(2):
        torch.manual_seed(derive_seed(1, 11, 0))
        net = DIRTNet(10, width=0.25)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        g = generator(1, 12, 0, m)
        order = torch.cat([torch.randperm(40, generator=g) for _ in range(3)])
        for it in range(5):
            b = order[it * 16:(it + 1) * 16]
            loss = F.cross_entropy(net(x[m, b]), y[b])
            opt.zero_grad()
            loss.backward()
            opt.step()
        nets.append(_flat(net))
    assert torch.allclose(_flat(keep["server"]), (nets[0] + nets[1]) / 2, atol=1e-7)


@pytest.mark.parametrize("period,iterations", [(1, 6), (10, 25), (100, 30), (4, 8)])
def test_synchronisation_period_is_respected_and_counted(period, iterations):
    x, y = _clients(m=3, n=40)
    rec = dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, period=period, iterations=iterations,
                               batch_size=8, width=0.125, eval_every=2, tests={"t": (x[0], y)})
    syncs = math.ceil(iterations / period)  # every `period` mini-batches, and once at the end
    p = rec["n_params"]
    assert p == sum(q.numel() for q in DIRTNet(10, width=0.125).parameters())
    assert rec["syncs"] == syncs
    assert rec["params_up"] == syncs * p and rec["params_down"] == (syncs + 1) * p  # + the initial model
    by_tag = {(r["tag"], r["direction"]): r["params"] for r in rec["comm_by_tag"]}
    assert by_tag == {("initial_model", "down"): p, ("client_model", "up"): syncs * p,
                      ("average_model", "down"): syncs * p}
    # the curve records the synchronisations and parameters so far at every evaluation
    for point in rec["curve"]:
        done = point["iteration"] // period + (point["iteration"] == iterations and iterations % period != 0)
        assert point["syncs"] == done and point["params"] == p * (1 + 2 * done)
    assert [c["iteration"] for c in rec["curve"]] == sorted({*range(2, iterations + 1, 2), iterations})


def test_feddirt_needs_its_views_and_runs_deterministically():
    x, y = _clients(m=3, n=40)
    ident = FedINB(0, 2, 1, variant="INB", input_transform="none").fit(list(x), [y] * 3)
    bank = dirt.translation_bank(ident, x, y)
    method = dirt.get_dg_method("feddirt")
    with pytest.raises(ValueError, match="views"):
        dirt.train_federated(method, x, y, iterations=2)
    kw = dict(views=bank, period=2, iterations=4, batch_size=8, width=0.125, tests={"t": (x[1], y)})
    a = dirt.train_federated(method, x, y, seed=5, **kw)
    b = dirt.train_federated(method, x, y, seed=5, **kw)
    c = dirt.train_federated(method, x, y, seed=5, run=1, **kw)
    assert a["curve"] == b["curve"] and a["loss"] == b["loss"]
    assert a["loss"] != c["loss"]
    # with the identity translator the regulariser vanishes: FedDIRT trains exactly as FedAvg
    avg = dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, seed=5, **{k: v for k, v in kw.items()
                                                                              if k != "views"})
    assert [p["t"] for p in avg["curve"]] == [p["t"] for p in a["curve"]]
    shared = dirt.train_federated(dirt.get_dg_method("feddirt_shared"), x, y, seed=5,
                                  **{**kw, "views": dirt.shared_space_images(ident, x, y)})
    assert [p["t"] for p in shared["curve"]] == [p["t"] for p in avg["curve"]]


@pytest.mark.parametrize("form", ["loop", "vmap"])
@pytest.mark.parametrize("period", [1, 3, 4])
def test_a_budget_reads_what_a_run_of_that_length_ends_with(period, form):
    """``budgets`` (Rotated Fashion-MNIST's 1,500 iterations for 75° and 3,000 for 90°, one run for both): a test's
    final accuracy at its budget is that of a run of the budget's length, bit for bit, whether or not the budget
    falls on a synchronisation; the other tests and the training itself are as without budgets."""
    x, y = _clients(m=3, n=40)
    method = dirt.get_dg_method("feddirt")
    tests = {"short": (x[1], y), "long": (x[2], y)}
    kw = dict(views=_views_of(method, x, y), period=period, batch_size=8, width=0.125, seed=2, tests=tests,
              client_batching=form)
    both = dirt.train_federated(method, x, y, iterations=9, budgets={"short": 7}, **kw)
    short = dirt.train_federated(method, x, y, iterations=7, **kw)
    full = dirt.train_federated(method, x, y, iterations=9, **kw)
    assert both["final"]["short"] == short["final"]["short"] and both["budgets"] == {"short": 7}
    assert both["final"]["long"] == full["final"]["long"] and both["curve"] == full["curve"]
    assert "budgets" not in full
    with pytest.raises(ValueError, match="budgets names a test 'other'"):
        dirt.train_federated(method, x, y, iterations=9, budgets={"other": 3}, **kw)
    with pytest.raises(ValueError, match=r"budgets\['short'\]"):
        dirt.train_federated(method, x, y, iterations=9, budgets={"short": 10}, **kw)


# -- the clients' two forms (dg_clients) ---------------------------------------------------------------------
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def _views_of(method, x, y, seed=0):
    """Views for ``method`` that make its regulariser non-zero: a perturbed identity translation."""
    g = torch.Generator().manual_seed(seed)
    m, n = x.shape[:2]
    ident = FedINB(0, 2, 1, variant="INB", input_transform="none").fit(list(x.float()), [y] * m)
    if method.view == "translated":
        return (dirt.translation_bank(ident, x.float(), y) + 0.1 * torch.rand(m, m, n, 784, generator=g)).to(x.dtype)
    if method.view == "shared":
        return (0.5 * dirt.shared_space_images(ident, x.float(), y) + 0.5 * torch.rand(m, n, 784, generator=g)).to(x.dtype)
    return None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("spec,period", [("fedavg", 1), ("feddirt", 3), ({"feddirt": {"targets": "per_batch"}}, 2),
                                         ("feddirt_shared", 100)])
def test_batched_clients_are_the_loop_in_float64(spec, period, device):
    """client_batching='vmap' (one vmap-ed step of all clients, FlatAdam on the stacked rows) trains what the loop of
    modules and torch.optim.Adam trains: in float64, where rounding is out of the way, the server's model, the
    accuracies and the losses agree to 1e-10 after 9 iterations with synchronisations inside and at the end."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        x, y = _clients(m=3, n=40)
        x = x.double()
        method = dirt.parse_dg_spec(spec)
        views = _views_of(method, x, y)
        kw = dict(views=views, period=period, iterations=9, batch_size=8, width=0.125, seed=2, run=1, eval_every=3,
                  tests={"t": (x[1], y)}, device=device)
        got = {}
        for form in ("loop", "vmap"):
            keep = {}
            rec = dirt.train_federated(method, x, y, keep=keep, client_batching=form, **kw)
            got[form] = (rec, _flat(keep["server"]).cpu())
    finally:
        torch.set_default_dtype(old)
    (loop, w_loop), (vmap, w_vmap) = got["loop"], got["vmap"]
    assert w_loop.dtype == torch.float64
    assert (w_loop - w_vmap).abs().max() < 1e-10
    assert loop["curve"] == vmap["curve"] and loop["syncs"] == vmap["syncs"]
    assert loop["comm_by_tag"] == vmap["comm_by_tag"] and loop["n_params"] == vmap["n_params"]
    for a, b in zip(loop["loss"], vmap["loss"]):
        assert a["iteration"] == b["iteration"] and abs(a["loss"] - b["loss"]) < 1e-10 and abs(a["ce"] - b["ce"]) < 1e-10
    if method.view is not None:  # the regulariser is active: the total loss is not the cross-entropy
        assert any(abs(a["loss"] - a["ce"]) > 1e-3 for a in loop["loss"])


def test_client_batching_is_chosen_by_device_and_model():
    """'auto' batches on CUDA only, and only a model without BatchNorm statistics; 'vmap' names what blocks it;
    an unknown value names the parameter. On the CPU 'auto' keeps the loop (the results of earlier versions)."""
    from fda_core.experiments.translation.dg_clients import choose_client_batching

    inst, bn = DIRTNet(10, width=0.125), DIRTNet(10, width=0.125, norm="batch")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert choose_client_batching("auto", inst, cpu) == "loop"
    assert choose_client_batching("auto", inst, cuda) == "vmap"
    assert choose_client_batching("auto", bn, cuda) == "loop"
    assert choose_client_batching("vmap", inst, cpu) == "vmap"
    assert choose_client_batching("loop", inst, cuda) == "loop"
    with pytest.raises(ValueError, match="client_batching='vmap' cannot batch.*norm='instance'"):
        choose_client_batching("vmap", bn, cpu)
    x, y = _clients(m=2, n=16)
    with pytest.raises(ValueError, match="client_batching must be one of"):
        dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, iterations=2, client_batching="streams")
    with pytest.raises(ValueError, match="norm='instance'"):
        dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, iterations=2, norm="batch", client_batching="vmap")
    kw = dict(iterations=3, batch_size=8, width=0.125, seed=1)
    assert (dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, **kw)["curve"]
            == dirt.train_federated(dirt.get_dg_method("fedavg"), x, y, client_batching="loop", **kw)["curve"])


def test_indices_drawn_ahead_in_chunks_give_the_same_run(monkeypatch):
    """The mini-batch indices and target domains are drawn ahead, INDEX_CHUNK iterations at a time, from each
    client's own generators: chunks of 3 (boundaries inside the run, one ending on a synchronisation) give the
    run that one chunk gives, bit for bit."""
    x, y = _clients(m=3, n=40)
    method = dirt.get_dg_method("feddirt")
    kw = dict(views=_views_of(method, x, y), period=4, iterations=11, batch_size=8, width=0.125, seed=7,
              eval_every=5, tests={"t": (x[2], y)})
    keep_one, keep_chunked = {}, {}
    one = dirt.train_federated(method, x, y, keep=keep_one, **kw)
    monkeypatch.setattr(dirt, "INDEX_CHUNK", 3)
    chunked = dirt.train_federated(method, x, y, keep=keep_chunked, **kw)
    assert torch.equal(_flat(keep_one["server"]), _flat(keep_chunked["server"]))
    assert one["loss"] == chunked["loss"] and one["curve"] == chunked["curve"]


@pytest.mark.parametrize("form", ["loop", "vmap"])
def test_training_reads_nothing_back_per_step(form):
    """The losses stay on the device until an evaluation: the reads of a tensor's value (on a GPU each a host
    synchronisation; counted as aten._local_scalar_dense) do not grow with the iterations. The loop of earlier
    versions read two per client step (loss.item(), ce.item()). Not counted: torch.optim.Adam's reads of its step
    counts, which it keeps on the host whatever the model's device."""
    x, y = _clients(m=3, n=40)
    method = dirt.get_dg_method("feddirt")
    views = _views_of(method, x, y)
    counts = {}
    for iterations in (4, 12):
        with DeviceReads() as reads:
            rec = dirt.train_federated(method, x, y, views=views, period=2, iterations=iterations, batch_size=8,
                                       width=0.125, tests={"t": (x[0], y)}, client_batching=form)
        counts[iterations] = reads.count
        assert len(rec["loss"]) == 1 and rec["loss"][0]["loss"] > rec["loss"][0]["ce"] > 0
    assert counts[4] == counts[12], counts


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=2, max_size=8), min_size=1,
                max_size=30), st.integers(1, 5))
def test_deferred_losses_sum_as_the_per_step_reads_did(steps, flush_every):
    """DeferredLosses.read() equals the running sums the loop formed with Python floats after every step
    (loss / M and CE / M added in step and client order), bit for bit, however often it flushes."""
    from fda_core.experiments.translation.dg_clients import DeferredLosses

    n_clients = 3
    deferred = DeferredLosses(n_clients, flush_every=flush_every)
    loss_sum = ce_sum = 0.0
    for values in steps:
        values = values[: len(values) // 2 * 2]
        t = torch.tensor(values, dtype=torch.float32)
        deferred.add(t)
        for loss, ce in zip(t[0::2], t[1::2]):
            loss_sum += loss.item() / n_clients
            ce_sum += ce.item() / n_clients
    assert deferred.read() == (loss_sum, ce_sum)
    assert deferred.read() == (0.0, 0.0)


def test_client_batching_of_notebook_08_reaches_every_run(tmp_path):
    """resolve_plan(client_batching=...) is checked before anything runs and passed to every run's training (an
    execution choice: the store key of a run, DGStudy.config, does not hold it)."""
    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import dg_study as dg

    with pytest.raises(ValueError, match="client_batching must be one of"):
        dg.resolve_plan(quick=True, client_batching="compile")
    for mode in ("auto", "loop", "vmap"):
        study = dg.DGStudy(dg.resolve_plan(quick=True, client_batching=mode), ResultStore(tmp_path / mode),
                           translation_root=str(tmp_path / "t"), threads=1)
        assert study._train_kwargs()["client_batching"] == mode


def test_bad_arguments_name_the_parameter():
    x, y = _clients(m=2, n=8)
    m = dirt.get_dg_method("fedavg")
    for kw, name in [(dict(period=0), "period"), (dict(iterations=0), "iterations"), (dict(lr=0.0), "lr"),
                     (dict(batch_size=0), "batch_size"), (dict(norm="group"), "norm"), (dict(eval_every=-1), "eval_every")]:
        with pytest.raises(ValueError, match=name):
            dirt.train_federated(m, x, y, **kw)
    with pytest.raises(ValueError, match="method must be one of"):
        dirt.get_dg_method("fedprox")
    with pytest.raises(ValueError, match="lam"):
        dirt.get_dg_method("feddirt", lam=-1)
    with pytest.raises(ValueError, match="targets"):
        dirt.get_dg_method("feddirt", targets="per_epoch")
    assert dirt.parse_dg_spec({"feddirt": {"lam": 10}}).display_label == "FedDIRT (λ=10)"
    assert dirt.parse_dg_spec("feddirt_shared").display_label == "FedDIRT (shared space)"


# -- communication of the translators ----------------------------------------------------------------------
def test_translator_exchange_counts_each_clients_maps_and_decoder():
    x, y = _clients(m=3, n=40)
    tr = FedINB(2, 3, 4, variant="INB", input_transform="none", seed=0).fit(list(x), [y] * 3)
    b = tr.client_bins(10)  # 10 samples per class and client
    per_layer_class = expected_messages(784, 3, 10, 1, 1, None, b, tr.bary_grid)[("barycenter", "client_cdf", "up")]
    own = 2 * 4 * per_layer_class  # L = 2 layers, 4 classes: K (B + 2) each
    assert per_layer_class == 3 * (b + 2)
    assert dirt.translator_exchange(tr) == dict(up=own, down=2 * own, total=3 * own)
    assert dirt.translator_exchange(tr, n_decoder_params=100) == dict(up=own + 100, down=2 * (own + 100),
                                                                      total=3 * (own + 100))


# -- fitted translators kept beside the store --------------------------------------------------------------
def test_a_saved_translator_translates_exactly_as_the_fitted_one(tmp_path):
    x, y = _clients(m=3, n=40, seed=2)
    cfg = dict(n_layers=2, n_directions=3, max_iter=4, n_bins=None, variant="INB", seed=0, device="cpu",
               convention="reference", input_transform="auto")
    from fda_core.experiments.translation.experiments import build_translator

    model = build_translator(cfg).fit(list(x), [y] * 3)
    path = tmp_path / "t.translator.pt"
    save_translator(path, model, cfg, "rev1")
    loaded = load_translator(path, cfg, "rev1")
    assert loaded is not None and loaded.input_transform_ == model.input_transform_ == "probit"
    for s, t in [(0, 2), (1, 0)]:
        assert torch.equal(loaded.translate(x[s], s, t, y), model.translate(x[s], s, t, y))
    assert loaded.communication.total() == model.communication.total()
    assert load_translator(path, cfg, "rev2") is None  # another code revision: stale
    assert load_translator(path, {**cfg, "max_iter": 5}, "rev1") is None  # another run's config
    assert load_translator(tmp_path / "missing.pt", cfg, "rev1") is None


def test_dg_data_rotates_the_translators_training_digits():
    from fda_core.data.rotated_domains import rotated_mnist

    data = dirt.dg_data(n_train_per_class=20, n_test_per_class=5, n_dg_per_class=4)
    dom = rotated_mnist([0, 15, 30, 45, 60, 75, 90], 20, 5, "", 0)
    assert data.x.shape == (5, 40, 784) and data.y.tolist() == [c for c in range(10) for _ in range(4)]
    assert torch.equal(data.x[2], dom.train_x[2][data.index])
    assert torch.equal(data.test_x[90.0], dom.train_x[6][data.index])  # the same digits, rotated by 90 degrees
    assert data.heldout_x[75.0].shape == (50, 784)
    with pytest.raises(ValueError, match="n_dg_per_class"):
        dirt.dg_data(n_train_per_class=20, n_test_per_class=5, n_dg_per_class=21)
    with pytest.raises(ValueError, match="test_angles"):
        dirt.dg_data(test_angles=(60,), n_train_per_class=20, n_test_per_class=5, n_dg_per_class=4)


def test_notebook_06_keeps_its_drawn_translator_and_the_next_study_reuses_it(tmp_path):
    """TranslationStudy.run writes the fitted translator of a run whose digits are drawn beside its store record;
    a later study (notebook 08) loads it instead of refitting, and it is the translator a fresh fit gives."""
    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import study as st
    from fda_core.experiments.translation.experiments import build_translator

    plan = st.resolve_plan(quick=True, variants=["INB"], J_values=[10], V_values=[20], eval_depths=[0, 2],
                           compare_options=False)
    first = st.TranslationStudy(plan, ResultStore(tmp_path), threads=1)
    rec = first.run("INB")
    assert rec["config"]["grid"] and first.translator_path(rec["config"]).exists()
    again = st.TranslationStudy(plan, ResultStore(tmp_path), threads=1)
    model, reused = again.translator("INB")
    assert reused and model.name == rec["name"] == "INB-L2-K5-J10"
    assert model.communication.total() == rec["params_total"]  # the stored record's count
    fresh = build_translator(rec["config"]).fit(again.domains.train_x, again.domains.train_y)
    x, y = again.domains.test_x[0][:30], again.domains.test_y[0][:30]
    assert torch.equal(model.translate(x, 0, 4, y), fresh.translate(x, 0, 4, y))
    # a configuration nobody drew is fitted on request and kept for the next caller
    other, reused = again.translator("INB", max_iter=3)
    assert not reused and again.translator_path(again.config("INB", max_iter=3)).exists()
    assert again.translator("INB", max_iter=3)[1]
    assert again.translator("INB", max_iter=4, fit_missing=False) == (None, False)


def test_dg_plan_checks_its_parameters():
    from fda_core.experiments.translation import dg_study as dg

    plan = dg.resolve_plan()
    assert plan["iterations"] == {1: 160, 10: 200, 100: 240}  # 8 % of the paper's 2,000 / 2,500 / 3,000
    assert (plan["lam"], plan["lr"], plan["batch_size"]) == (2.0, 1e-3, 64)  # paper App. E.2, MNIST
    paper = dg.resolve_plan(paper_scale=True)
    assert paper["iterations"] == {1: 2000, 10: 2500, 100: 3000} and paper["width"] == 1.0 and paper["runs"] == 4
    assert dg.resolve_plan(lam=10)["lam"] == 10.0
    for kw, name in [(dict(quick=True, paper_scale=True), "quick and paper_scale"), (dict(dataset="svhn"), "dataset"),
                     (dict(dataset="fashion"), "data_root"), (dict(periods=[0]), "periods"),
                     (dict(iterations_scale=0), "iterations_scale"), (dict(width=5), "width"),
                     (dict(methods=["fedprox"]), "method"), (dict(lam=-1), "lam"),
                     (dict(n_dg_per_class=500), "n_dg_per_class")]:
        with pytest.raises(ValueError, match=name):
            dg.resolve_plan(**kw)


def test_table3_rows_do_not_depend_on_the_records_key_order():
    """A FedDIRT run read back from the store (JSON, sorted keys) gives Table 3 in the same row order as one
    computed now: unseen angles in order, training digits before held-out digits."""
    import json

    from fda_core.experiments.translation.dg_study import table3_long

    final = {"75": 70.0, "90": 40.0, "75 held-out": 66.0, "90 held-out": 38.0, "iteration": 160, "syncs": 160,
             "params": 1}
    fresh = [{"label": "FedAvg", "period": 1, "iterations": 160, "final": dict(final)} for _ in range(2)]
    stored = json.loads(json.dumps(fresh, sort_keys=True))
    assert list(stored[0]["final"]) != list(fresh[0]["final"])
    a, b = table3_long(fresh, "L10-K10"), table3_long(stored, "L10-K10")
    assert list(a.domain) == ["75", "90", "75 held-out", "90 held-out"]
    pd.testing.assert_frame_equal(a, b)


@pytest.mark.timeout(300)
def test_notebook_08_runs_side_by_side_give_the_runs_of_one_after_another(tmp_path):
    """DGStudy.run_all(workers=2) trains the runs the store lacks in two worker processes (which load the clients'
    data and images from a file written by the study) and gives the records of workers=1, bit for bit (one thread
    everywhere); a second call reads them back; a bad count is refused when the study is made."""
    import json

    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import dg_study as dg

    plan = dg.resolve_plan(quick=True, methods=["fedavg", "feddirt", "feddirt_shared"], periods=[1],
                           shared_periods=[1], runs=2)
    with pytest.raises(ValueError, match="workers"):
        dg.DGStudy(plan, ResultStore(tmp_path / "a"), threads=1, workers=0)
    study = dg.DGStudy(plan, ResultStore(tmp_path / "a"), translation_root=str(tmp_path / "t"), threads=1)
    one = study.run_all()

    def strip(records):
        return json.dumps([{k: v for k, v in r.items() if k != "seconds"} for r in records], sort_keys=True)

    side = dg.DGStudy(plan, ResultStore(tmp_path / "b"), translation_root=str(tmp_path / "t"), threads=1, workers=2)
    two = side.run_all(progress=True)
    assert len(two) == 6 and strip(two) == strip(one)
    assert "0 run(s) reused from the result store, 6 computed" in side.store.summary(dg.EXPERIMENT)
    again = dg.DGStudy(plan, ResultStore(tmp_path / "b"), translation_root=str(tmp_path / "t"), threads=1, workers=2)
    assert strip(again.run_all()) == strip(one)
    assert "6 run(s) reused from the result store, 0 computed" in again.store.summary(dg.EXPERIMENT)
