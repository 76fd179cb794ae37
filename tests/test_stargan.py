"""FedStarGAN (fda_core.experiments.translation.stargan), the compact StarGAN networks, the Fréchet distance and
the InceptionV3 loader of FID."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import linalg

from device_reads import DeviceReads

from fda_core.common.seeding import generator
from fda_core.core.frechet import feature_statistics, frechet_distance, frechet_distance_of_features
from fda_core.data.inception import inception_features, load_inception
from fda_core.data.rotated_domains import rotated_mnist
from fda_core.data.stargan_models import StarDiscriminator, StarGenerator, from_gan, one_hot, to_gan
from fda_core.experiments.deferred import DeferredSums
from fda_core.experiments.translation import dirt
from fda_core.experiments.translation import stargan as sg
from fda_core.experiments.translation import stargan_study as sgs
from fda_core.experiments.translation.experiments import identity_wd

pytestmark = pytest.mark.usefixtures("one_thread")


def _n(net):
    return sum(p.numel() for p in net.parameters())


def test_compact_stargan_shapes_and_parameter_count():
    g, d = StarGenerator(conv_dim=2, c_dim=5, repeat_num=0), StarDiscriminator(28, conv_dim=2, c_dim=5, repeat_num=3)
    # G: 7x7 conv (1 + 2*5 -> 2), two 4x4 down (2->4->8), two 4x4 transposed up (8->4->2), 7x7 conv (2->1); IN affine
    assert _n(g) == 11 * 2 * 49 + 2 * 4 * 16 + 4 * 8 * 16 + 8 * 4 * 16 + 4 * 2 * 16 + 2 * 49 + 2 * (2 + 4 + 8 + 4 + 2)
    # D: 4x4 stride-2 convs 1->2->4->8 with biases, out_src 3x3 (8->1), out_cls 3x3 over the 3x3 map (8->5)
    assert _n(d) == (16 * 2 + 2) + (2 * 4 * 16 + 4) + (4 * 8 * 16 + 8) + 8 * 9 + 8 * 5 * 9
    x = to_gan(torch.rand(6, 784))
    c = one_hot(torch.tensor([0, 1, 2, 3, 4, 0]), 5)
    out = g(x, c, c.roll(1, 0))
    assert out.shape == (6, 1, 28, 28) and out.abs().max() <= 1
    src, cls = d(x)
    assert src.shape == (6, 1, 3, 3) and cls.shape == (6, 5)
    assert not any(b.is_floating_point() for b in g.buffers())  # no statistics to average
    assert torch.allclose(from_gan(to_gan(torch.full((2, 784), 0.25))), torch.full((2, 784), 0.25))
    with pytest.raises(ValueError, match="repeat_num"):
        StarDiscriminator(28, 2, 5, repeat_num=6)


@given(st.lists(st.integers(0, 6), max_size=40), st.integers(7, 9))
@settings(max_examples=40, deadline=None)
def test_one_hot_is_torchs_one_hot(labels, c_dim):
    t = torch.tensor(labels, dtype=torch.long)
    out = one_hot(t, c_dim)
    assert out.dtype == torch.get_default_dtype() and out.shape == (len(labels), c_dim)
    assert torch.equal(out, F.one_hot(t, c_dim).to(out.dtype))


@pytest.mark.parametrize("labels", [[0, 5], [-1, 2]])
def test_one_hot_names_labels_out_of_range(labels):
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 5\)"):
        one_hot(torch.tensor(labels), 5)


def _domains():
    return rotated_mnist([0, 30, 60], 6, 4, "", 0)


@pytest.mark.parametrize("sync_every,iterations", [(2, 5), (4, 4), (10, 3)])
def test_communication_is_the_model_size_times_the_exchanges(sync_every, iterations):
    dom = _domains()
    rec = sg.train_fedstargan(dom.train_x, sync_every=sync_every, iterations=iterations, batch_size=4, conv_dim=2,
                              g_repeat=0, n_critic=2, seed=0)
    p_g = _n(StarGenerator(2, 3, 0))
    p_d = _n(StarDiscriminator(28, 2, 3, 3))
    syncs = math.ceil(iterations / sync_every)
    assert (rec["n_params_g"], rec["n_params_d"], rec["syncs"]) == (p_g, p_d, syncs)
    # the initial G and D down once, then per synchronisation each client's G and D up and the averages down
    assert rec["params_total"] == (p_g + p_d) * (1 + 2 * syncs)
    assert rec["params_up"] == (p_g + p_d) * syncs
    by_tag = {(r["tag"], r["direction"]): r["params"] for r in rec["comm_by_tag"]}
    assert by_tag[("client_generator", "up")] == syncs * p_g and by_tag[("initial_discriminator", "down")] == p_d


def test_fedstargan_is_seeded_and_evaluates_the_server_generator_at_the_asked_synchronisations():
    dom = _domains()
    seen = []

    def evaluate(gen):
        seen.append(sum(float(p.sum()) for p in gen.parameters()))
        return float(len(seen))

    kw = dict(sync_every=2, iterations=6, batch_size=4, conv_dim=2, g_repeat=0, n_critic=2, eval_syncs=[1, 3])
    a = sg.train_fedstargan(dom.train_x, seed=1, evaluate=evaluate, **kw)
    assert [c["syncs"] for c in a["curve"]] == [1, 3] and [c["iteration"] for c in a["curve"]] == [2, 6]
    assert [c["params"] for c in a["curve"]] == [(a["n_params_g"] + a["n_params_d"]) * (1 + 2 * s) for s in (1, 3)]
    b = sg.train_fedstargan(dom.train_x, seed=1, evaluate=evaluate, **kw)
    assert a["losses"] == b["losses"] and seen[:2] == seen[2:]
    c = sg.train_fedstargan(dom.train_x, seed=2, **kw)
    assert c["losses"] != a["losses"]
    with pytest.raises(ValueError, match="sync_every"):
        sg.train_fedstargan(dom.train_x, sync_every=0, iterations=2)
    with pytest.raises(ValueError, match="train_x"):
        sg.train_fedstargan(dom.train_x[:1], sync_every=1, iterations=2)


def test_draws_ahead_are_the_draws_of_one_client_step_at_a_time(monkeypatch):
    """The mini-batch indices, target domains and interpolation weights, drawn ahead a chunk of iterations at a time
    (chunks of 3 here, the last one short), are the numbers the loop of earlier versions drew one client step at a
    time from the same generators (``next(stream)``, ``draw_targets``, ``torch.rand(B, 1, 1, 1)``)."""
    monkeypatch.setattr(dirt, "INDEX_CHUNK", 3)
    m_clients, n, batch, iterations = 3, 10, 4, 7

    def generators():
        return ([dirt._batches(n, batch, generator(5, sg._BATCHES, m)) for m in range(m_clients)],
                [generator(5, sg._TARGETS, m) for m in range(m_clients)],
                [generator(5, sg._ALPHA, m) for m in range(m_clients)])

    chunks = list(sg._draws(*generators(), batch, iterations, torch.device("cpu")))
    assert [c[0].shape[0] for c in chunks] == [3, 3, 1]
    idx, trg, alpha = (torch.cat(parts) for parts in zip(*chunks))
    assert idx.shape == trg.shape == (iterations, m_clients, batch) and alpha.shape == (*idx.shape, 1, 1, 1)
    streams, t_gens, a_gens = generators()
    for it in range(iterations):
        for m in range(m_clients):
            assert torch.equal(idx[it, m], next(streams[m]))
            assert torch.equal(trg[it, m], dirt.draw_targets(m, m_clients, batch, t_gens[m]))
            assert torch.equal(alpha[it, m], torch.rand(batch, 1, 1, 1, generator=a_gens[m]))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_chunks_of_draws_give_the_same_run(monkeypatch, device):
    """A run whose draws come in chunks of 3 iterations (boundaries inside synchronisation periods and at an
    evaluation) is the run of one chunk, bit for bit: the server's G and D, the losses and the curve (on CUDA, where
    the draws travel through pinned memory, to rounding)."""
    dom = _domains()
    kw = dict(sync_every=2, iterations=7, batch_size=4, conv_dim=2, g_repeat=0, n_critic=2, seed=4, eval_syncs=[1, 3],
              evaluate=lambda gen: sum(float(p.detach().double().sum()) for p in gen.parameters()), device=device)
    keep_one, keep_chunked = {}, {}
    one = sg.train_fedstargan(dom.train_x, keep=keep_one, **kw)
    monkeypatch.setattr(dirt, "INDEX_CHUNK", 3)
    chunked = sg.train_fedstargan(dom.train_x, keep=keep_chunked, **kw)
    if device == "cpu":
        for net in ("generator", "discriminator"):
            assert torch.equal(sg._flat([keep_one[net]]), sg._flat([keep_chunked[net]]))
        assert one["losses"] == chunked["losses"] and one["curve"] == chunked["curve"] and len(one["curve"]) == 3
    else:  # a GPU's kernels need not repeat their rounding from run to run (atomic adds in backward passes)
        for net in ("generator", "discriminator"):
            torch.testing.assert_close(sg._flat([keep_one[net]]), sg._flat([keep_chunked[net]]), rtol=1e-4, atol=1e-5)
        assert one["losses"] == pytest.approx(chunked["losses"], rel=1e-4)
        assert [c["syncs"] for c in one["curve"]] == [c["syncs"] for c in chunked["curve"]]


def test_training_reads_nothing_back_per_step():
    """In both forms the losses stay on the device until the end and the draws arrive a chunk at a time: the reads
    of a tensor's value (on a GPU each a host synchronisation) do not grow with the iterations. Earlier versions
    read five per client step on a G step (d_loss, d_cls, g_fake, g_rec, g_cls) and made three blocking copies to
    the device."""
    dom = _domains()
    for form in ("loop", "vmap"):
        counts = {}
        for iterations in (4, 12):
            with DeviceReads() as reads:
                rec = sg.train_fedstargan(dom.train_x, sync_every=2, iterations=iterations, batch_size=4, conv_dim=2,
                                          g_repeat=0, n_critic=2, seed=0, client_batching=form)
            counts[iterations] = reads.count
            assert rec["losses"]["g_rec"] > 0 and rec["losses"]["d_cls"] > 0
        assert counts[4] == counts[12], (form, counts)


DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("sync_every,n_critic", [(2, 2), (3, 1), (10, 5)])
def test_batched_clients_train_what_the_loop_trains_in_float64(device, sync_every, n_critic):
    """client_batching='vmap' (every client's D step, gradient penalty included, and G step as one vmap-ed
    computation, FlatAdam on the stacked rows) trains what the loop of modules and torch.optim.Adam trains: in
    float64, where rounding is out of the way, the server's G and D, the losses and the evaluated values agree to
    1e-9 after 7 iterations with synchronisations inside and at the end; the communication is the same."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        dom = _domains()
        xs = [x.double() for x in dom.train_x]
        got = {}
        for form in ("loop", "vmap"):
            keep = {}
            rec = sg.train_fedstargan(xs, sync_every=sync_every, iterations=7, batch_size=4, conv_dim=2, g_repeat=1,
                                      n_critic=n_critic, seed=3, keep=keep, client_batching=form, device=device,
                                      eval_syncs=[1], evaluate=lambda gen: float(sum(p.detach().sum() for p in
                                                                                    gen.parameters())))
            got[form] = rec, sg._flat([keep["generator"], keep["discriminator"]]).cpu()
    finally:
        torch.set_default_dtype(old)
    (loop, w_loop), (vmap, w_vmap) = got["loop"], got["vmap"]
    assert w_loop.dtype == torch.float64 and (w_loop - w_vmap).abs().max() < 1e-9
    assert loop["losses"] == pytest.approx(vmap["losses"], rel=1e-9, abs=1e-12)
    assert [c["value"] for c in loop["curve"]] == pytest.approx([c["value"] for c in vmap["curve"]], rel=1e-9)
    for key in ("syncs", "params_total", "comm_by_tag", "n_params_g", "n_params_d"):
        assert loop[key] == vmap[key]
    assert [(c["iteration"], c["syncs"]) for c in loop["curve"]] == [(c["iteration"], c["syncs"]) for c in vmap["curve"]]


def test_client_batching_is_checked_and_auto_keeps_the_loop_on_the_cpu():
    dom = _domains()
    kw = dict(sync_every=2, iterations=3, batch_size=4, conv_dim=2, g_repeat=0, seed=0)
    assert sg.train_fedstargan(dom.train_x, **kw)["losses"] == sg.train_fedstargan(dom.train_x, client_batching="loop",
                                                                                   **kw)["losses"]
    with pytest.raises(ValueError, match="client_batching"):
        sg.train_fedstargan(dom.train_x, client_batching="batched", **kw)


def test_clients_of_unequal_sizes_train_in_both_forms():
    """Clients holding different numbers of images (no stacked (M, n, 784) copy): both forms run and agree."""
    dom = _domains()
    xs = [dom.train_x[0], dom.train_x[1][:30], dom.train_x[2][:45]]
    kw = dict(sync_every=2, iterations=4, batch_size=4, conv_dim=2, g_repeat=0, n_critic=2, seed=1)
    loop = sg.train_fedstargan(xs, client_batching="loop", **kw)
    vmap = sg.train_fedstargan(xs, client_batching="vmap", **kw)
    assert loop["losses"] == pytest.approx(vmap["losses"], rel=1e-4)
    assert loop["losses"] != sg.train_fedstargan(dom.train_x, client_batching="loop", **kw)["losses"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.lists(st.floats(-1e6, 1e6, allow_nan=False, width=32), min_size=3, max_size=3), min_size=1,
                max_size=30), st.integers(1, 5), st.sampled_from([None, 3.0, 7.0]))
def test_deferred_sums_are_the_per_step_sums(steps, flush_every, divisor):
    """DeferredSums.read() equals the running sums of ``v.item()`` (/ divisor) added in Python floats after every
    step, bit for bit, however often it flushes; a read starts the sums afresh."""
    sums = DeferredSums(("a", "b", "c"), divisor=divisor, flush_every=flush_every)
    expected = dict.fromkeys("abc", 0.0)
    for values in steps:
        t = torch.tensor(values, dtype=torch.float32)
        sums.add(t)
        for name, v in zip("abc", t):
            expected[name] += v.item() if divisor is None else v.item() / divisor
    assert sums.read() == expected
    assert sums.read() == dict.fromkeys("abc", 0.0)


def test_deferred_sums_refuse_bad_arguments():
    with pytest.raises(ValueError, match="names"):
        DeferredSums(("a", "a"))
    with pytest.raises(ValueError, match="flush_every"):
        DeferredSums(("a",), flush_every=0)
    with pytest.raises(ValueError, match="multiple of 2"):
        DeferredSums(("a", "b")).add(torch.zeros(3))


def test_eval_points_cover_the_first_and_last_synchronisation():
    assert sg.eval_points(1, 3) == [1]
    pts = sg.eval_points(80, 4)
    assert pts[0] == 1 and pts[-1] == 80 and pts == sorted(set(pts)) and len(pts) <= 4


def test_gan_wd_is_the_inb_metric():
    """A generator that returns its input is the identity translator: its WD is the INB runs' identity baseline."""
    dom = _domains()

    class Identity(StarGenerator):
        def forward(self, x, c_org, c_trg):
            return x

    wd = sg.gan_wd(Identity(2, 3, 0), dom.test_x, dom.test_y)
    assert wd == pytest.approx(float(identity_wd(dom).wd.mean()), rel=1e-6)


# -- FID ---------------------------------------------------------------------------------------------------
def test_frechet_distance_closed_forms():
    rng = np.random.default_rng(0)
    mu1, mu2 = rng.normal(size=4), rng.normal(size=4)
    s1, s2 = rng.uniform(0.5, 2, 4), rng.uniform(0.5, 2, 4)
    # diagonal covariances: ||mu1 - mu2||^2 + sum (s1 - s2)^2 (standard deviations s)
    d = frechet_distance(torch.tensor(mu1), torch.diag(torch.tensor(s1 ** 2)), torch.tensor(mu2),
                         torch.diag(torch.tensor(s2 ** 2)))
    assert d == pytest.approx(((mu1 - mu2) ** 2).sum() + ((s1 - s2) ** 2).sum(), rel=1e-10)
    # general covariances: the textbook form with scipy's sqrtm of the product
    a, b = rng.normal(size=(5, 5)), rng.normal(size=(5, 5))
    c1, c2 = a @ a.T + 0.1 * np.eye(5), b @ b.T + 0.1 * np.eye(5)
    ref = np.trace(c1 + c2 - 2 * linalg.sqrtm(c1 @ c2).real)
    assert frechet_distance(torch.zeros(5), torch.tensor(c1), torch.zeros(5), torch.tensor(c2)) == pytest.approx(ref, rel=1e-8)
    f = torch.tensor(rng.normal(size=(50, 3)))
    assert frechet_distance_of_features(f, f) == pytest.approx(0.0, abs=1e-9)
    mu, cov = feature_statistics(f)
    assert torch.allclose(cov, torch.tensor(np.cov(f.numpy().T)))
    with pytest.raises(ValueError, match="features"):
        feature_statistics(f[:1])


def test_fid_needs_a_local_inception_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="cannot be downloaded"):
        load_inception("")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        load_inception(tmp_path / "inception-2015-12-05.pt")
    with pytest.raises(FileNotFoundError, match="InceptionV3"):
        sgs.resolve_stargan(metric="fid", inception_weights=str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="metric"):
        sgs.resolve_stargan(metric="is")
    bad = tmp_path / "not_torchscript.pt"
    torch.save({"w": torch.zeros(2)}, bad)
    with pytest.raises(ValueError, match="TorchScript"):
        load_inception(bad)


def test_fid_with_a_torchscript_feature_extractor(tmp_path):
    """A stand-in TorchScript extractor (mean intensity per channel and a few pooled values) goes through the same
    path as InceptionV3: loaded from a file, fed 299x299 three-channel images in [0, 255]."""

    class Pool(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            assert x.shape[1:] == (3, 299, 299)
            return torch.nn.functional.adaptive_avg_pool2d(x, 2).flatten(1)

    path = tmp_path / "pool.pt"
    torch.jit.save(torch.jit.script(Pool()), str(path))
    extract = load_inception(path)
    digits = torch.rand(7, 784)
    feats = inception_features(extract, digits)
    assert feats.shape == (7, 12) and feats.max() <= 255
    dom = _domains()
    same = sgs.fid_of_translations(lambda x, y, s, t: dom.test_x[t][:x.shape[0]], dom.test_x, dom.test_y, extract, n=8)
    other = sgs.fid_of_translations(lambda x, y, s, t: 1 - x, dom.test_x, dom.test_y, extract, n=8)
    assert other > same >= -1e-9
