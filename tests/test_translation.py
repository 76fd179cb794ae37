"""Fed INB (fda_core.experiments.translation): Remark 1, the Stiefel step, invertibility, VW histograms with V = n,
monotone Armijo objective, held-out WD after translation, communication counts, bad input, and a smoke
run of benchmarks/inb.py."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest
import torch

from fda_core.experiments.translation import (CommunicationLog, FedINB, expected_parameters, federated_gradient,
                                  max_k_sw_objective, wasserstein_distance, wasserstein_distances)
from fda_core.data.autoencoder import LATENT_DIM, ConvAutoencoder, train_autoencoder
from fda_core.core.barycenter import (barycenter_grid, barycenter_quantile, fit_client_cdf, vw_edges,
                                             vw_pseudo_samples)
from fda_core.core.stiefel import cayley_step, descent_slope, haar_stiefel

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _blobs(m=3, n=40, d=6, classes=2, seed=0):
    """Client m: class c ~ N(shift_m,c, diag scale_m²) with different means and scales per client."""
    g = torch.Generator().manual_seed(seed)
    doms, labs = [], []
    for i in range(m):
        xs = [torch.randn(n, d, generator=g) * (1 + 0.4 * i) + 1.5 * i * (c + 1) for c in range(classes)]
        doms.append(torch.cat(xs))
        labs.append(torch.arange(classes).repeat_interleave(n))
    return doms, labs


@pytest.fixture(scope="module")
def fitted():
    doms, labs = _blobs()
    return FedINB(3, 2, 15, seed=1, device="cpu").fit(doms, labs), doms, labs


# -------------------------------------------------------------------------------------------- Stiefel
def test_haar_init_orthonormal_seeded():
    a = haar_stiefel(20, 5, 3, torch.Generator().manual_seed(4))
    b = haar_stiefel(20, 5, 3, torch.Generator().manual_seed(4))
    assert torch.equal(a, b) and a.shape == (3, 20, 5)
    assert torch.allclose(a.mT @ a, torch.eye(5, dtype=F64).expand(3, 5, 5), atol=1e-12)


def test_cayley_step_keeps_orthonormality_and_descends():
    g = torch.Generator().manual_seed(0)
    theta = haar_stiefel(30, 4, 2, g)
    for tau in (1e-3, 0.1, 1.0, 10.0, 1e3):
        grad = torch.randn(2, 30, 4, generator=g, dtype=F64) * 5
        theta = cayley_step(theta, grad, tau)
        assert torch.allclose(theta.mT @ theta, torch.eye(4, dtype=F64).expand(2, 4, 4), atol=1e-10), tau
    # the slope m = <G, -AΘ> is ≤ 0 and is the derivative of <G, Θ(τ)> at τ = 0
    grad = torch.randn(2, 30, 4, generator=g, dtype=F64)
    m = descent_slope(theta, grad)
    h = 1e-6
    fd = ((grad * cayley_step(theta, grad, h)).sum((1, 2)) - (grad * theta).sum((1, 2))) / h
    assert (m <= 0).all() and torch.allclose(fd, m, rtol=1e-4)


# ------------------------------------------------------------------------------------------ Remark 1
@pytest.mark.parametrize("m,n,d,k", [(2, 30, 5, 2), (4, 50, 12, 3)])
def test_remark1_federated_gradient_equals_centralised(m, n, d, k):
    g = torch.Generator().manual_seed(m)
    x = torch.randn(3, m, n, d, generator=g, dtype=F64) * torch.arange(1, m + 1, dtype=F64)[None, :, None, None]
    theta = haar_stiefel(d, k, 3, g).requires_grad_(True)
    max_k_sw_objective(x, theta).sum().backward()  # barycenter differentiated (a function of Θ)
    fed = federated_gradient(x, theta.detach())  # clients hold it constant, server sums
    assert torch.allclose(fed, theta.grad, rtol=1e-10, atol=1e-12)
    # the identity is a property of the sum: one client's constant-barycenter gradient is biased
    th = theta.detach().clone().requires_grad_(True)
    s = torch.matmul(x, th[:, None]).transpose(-1, -2).sort(-1).values
    y = s.mean(1, keepdim=True)
    term0 = (s[:, 0] - y[:, 0]).square().sum() / (m * k * n)
    true0 = torch.autograd.grad(term0, th, retain_graph=True)[0]
    const0 = torch.autograd.grad((s[:, 0] - y[:, 0].detach()).square().sum() / (m * k * n), th)[0]
    assert (true0 - const0).abs().max() > 1e-3


# ------------------------------------------------------------------------------- layers, invertibility
def test_layers_invertible_and_self_translation_is_identity(fitted):
    model, doms, labs = fitted
    g = torch.Generator().manual_seed(9)
    for m in range(3):
        held = doms[m] + 0.3 * torch.randn(doms[m].shape, generator=g)
        held[:3] *= 25  # far outside the training range: linear tails of the maps
        for x in (doms[m], held):
            z = model.transform(x, m, labs[m])
            assert z.shape == x.shape and z.dtype == F64
            assert torch.allclose(model.inverse_transform(z, m, labs[m]), x.double(), atol=1e-8)
            assert torch.allclose(model.translate(x, m, m, labs[m]), x.double(), atol=1e-8)
        for layer in range(model.n_layers + 1):  # every partial stack is invertible too
            z = model.transform(held, m, labs[m], layers=layer)
            assert torch.allclose(model.inverse_transform(z, m, labs[m], layers=layer), held.double(), atol=1e-8)


def test_one_d_barycenter_maps_are_monotone_and_reach_the_barycenter():
    g = torch.Generator().manual_seed(2)
    z = torch.stack([torch.randn(4000, generator=g, dtype=F64) - 2, 3 * torch.randn(4000, generator=g, dtype=F64) + 2])
    cdf = fit_client_cdf(z[None])  # leading (1, 2 clients)
    bary = barycenter_quantile(cdf, barycenter_grid(200), client_dim=1)  # W2 barycenter of N(-2,1), N(2,9): N(0, 4)
    grid = torch.linspace(-40, 40, 20001, dtype=F64).expand(1, 2, -1)
    s = cdf.forward(grid)
    assert (s.diff(dim=-1) > 0).all()
    assert torch.allclose(cdf.inverse(s), grid, atol=1e-9)
    t = bary.select((slice(None), None)).forward(cdf.forward(z[None]))  # t_m = F_bary⁻¹ ∘ F_m
    assert t.mean(-1).abs().max() < 0.1 and (t.std(-1) - 2).abs().max() < 0.15
    back = cdf.inverse(bary.select((slice(None), None)).inverse(t))
    assert torch.allclose(back, z[None], atol=1e-9)


def test_vw_edges_and_pseudo_samples():
    s = torch.sort(torch.randn(2, 3, 12, dtype=F64), -1).values
    e = vw_edges(s, 12)
    assert torch.equal(e[..., 1:], s) and torch.equal(e[..., 0], s[..., 0])
    assert torch.equal(vw_pseudo_samples(e, 12), s)
    e4 = vw_edges(s, 4)  # edges at order statistics 3, 6, 9, 12 (1-based)
    assert torch.equal(e4[..., 1:], s[..., 2::3])
    assert (vw_pseudo_samples(e4, 12).diff(dim=-1) >= 0).all()


# ----------------------------------------------------------------------------------- VW with V = n
def test_vw_with_v_equal_n_reproduces_plain():
    doms, labs = _blobs(n=30)
    plain = FedINB(2, 2, 12, None, seed=3, device="cpu").fit(doms, labs)
    hist = FedINB(2, 2, 12, 30, seed=3, device="cpu").fit(doms, labs)
    for hp, hh in zip(plain.history, hist.history):
        assert hp["trace"] == hh["trace"] and hp["n_trials"] == hh["n_trials"]
    x = doms[1]
    assert torch.equal(plain.translate(x, 1, 2, labs[1]), hist.translate(x, 1, 2, labs[1]))
    # the only difference is what travels: V + 1 = n + 1 quantile edges instead of n sorted values
    assert hist.communication.total() > plain.communication.total()
    # and a coarse histogram changes the optimisation
    coarse = FedINB(2, 2, 12, 5, seed=3, device="cpu").fit(doms, labs)
    assert coarse.history[0]["trace"] != plain.history[0]["trace"]


# ------------------------------------------------------------------------------------ Armijo ascent
def test_objective_non_decreasing_over_accepted_steps(fitted):
    model, _, _ = fitted
    for h in model.history:
        tr = np.asarray(h["trace"])
        assert len(tr) == h["n_iter"] + 1
        assert (np.diff(tr) >= -1e-12).all()
        assert tr[-1] > tr[0]
        assert h["n_trials"] >= h["n_iter"] - 1  # at least one trial per iteration that found a step
        assert h["objective_after_map"] < tr[-1]  # the 1-D maps align the chosen directions


def test_same_seed_same_numbers():
    doms, labs = _blobs(n=25)
    a = FedINB(2, 2, 8, seed=5, device="cpu").fit(doms, labs)
    b = FedINB(2, 2, 8, seed=5, device="cpu").fit(doms, labs)
    c = FedINB(2, 2, 8, seed=6, device="cpu").fit(doms, labs)
    ta, tb, tc = (mod.translate(doms[0], 0, 2, labs[0]) for mod in (a, b, c))
    assert torch.equal(ta, tb) and not torch.equal(ta, tc)


@pytest.mark.parametrize("n_bins", [None, 20])
def test_the_kept_copies_of_the_active_problems_data_give_the_same_fit(monkeypatch, n_bins):
    """FedMaxKSW keeps the copy of the active problems' data between iterations on the CPU (_data_rows): the fit is
    the same, bit for bit, as one that copies in every iteration; the copy is remade when the active set changes
    (with histograms, four classes converge at different iterations here, so it does change)."""
    from fda_core.experiments.translation import inb as inb_module

    doms, labs = _blobs(n=25, classes=4)
    copies = []
    real = inb_module.FedMaxKSW._data_rows

    def counting(self, idx):
        before = self._last_rows
        out = real(self, idx)
        copies.append(self._last_rows is not before)
        return out

    monkeypatch.setattr(inb_module.FedMaxKSW, "_data_rows", counting)
    kept = FedINB(2, 2, 20, n_bins, seed=5, device="cpu").fit(doms, labs)
    assert copies.count(True) < len(copies)  # copied when the set changed, kept otherwise
    assert any(copies) or n_bins is None  # with histograms some classes converge first (plain: none did here)
    monkeypatch.setattr(inb_module.FedMaxKSW, "_data_rows",
                        lambda self, idx: (self._rows(self.x, idx), self._rows(self.xt, idx)))
    every = FedINB(2, 2, 20, n_bins, seed=5, device="cpu").fit(doms, labs)
    assert torch.equal(kept.translate(doms[0], 0, 2, labs[0]), every.translate(doms[0], 0, 2, labs[0]))
    assert kept.iteration_counts() == every.iteration_counts()


# ------------------------------------------------------------------------ held-out WD, real digits
def test_translation_lowers_heldout_wd_on_rotated_mnist():
    from fda_core.data.datasets import downsample
    from fda_core.data.rotated_domains import rotated_mnist

    d = rotated_mnist((0, 45, 90), n_train_per_class=150, n_test_per_class=50, seed=0)
    keep = lambda x, y: (downsample(x[y < 3].reshape(-1, 1, 28, 28), 14).reshape(-1, 196), y[y < 3])  # noqa: E731
    tr = [keep(x, y) for x, y in zip(d.train_x, d.train_y)]
    te = [keep(x, y) for x, y in zip(d.test_x, d.test_y)]
    model = FedINB(4, 5, 30, seed=0, device="cpu").fit([t[0] for t in tr], [t[1] for t in tr])
    ident, trans = [], []
    for s, t in [(0, 2), (2, 0), (0, 1)]:
        out = model.translate(te[s][0], s, t, te[s][1])
        for c in range(3):
            real = te[t][0][te[t][1] == c]
            ident.append((real, te[s][0][te[s][1] == c]))
            trans.append((real, out[te[s][1] == c]))
    w_id, w_tr = wasserstein_distances(ident).mean(), wasserstein_distances(trans).mean()
    assert w_tr < 0.7 * w_id, (w_tr, w_id)


# ------------------------------------------------------------------------------- communication
@pytest.mark.parametrize("n_bins", [None, 7])
def test_communication_counts_match_formula(n_bins):
    doms, labs = _blobs(m=3, n=20, d=5, classes=2)
    k, j = 2, 6
    model = FedINB(2, k, j, n_bins, bary_bins=4, bary_grid=9, seed=0, device="cpu").fit(doms, labs)
    log = model.communication
    for layer in range(2):
        up = down = 0
        for h in (h for h in model.history if h["layer"] == layer):
            e = expected_parameters(5, k, 20, h["n_iter"], h["n_trials"], n_bins, 4, 9)
            up, down = up + e.up, down + e.down
        assert log.total("up", layer=layer) == up and log.total("down", layer=layer) == down
    # by hand for one layer of plain Fed INB: K·n per evaluation both ways, d·K per gradient both ways
    h0 = [h for h in model.history if h["layer"] == 0]
    t = log.table()
    row = lambda tag: int(t[(t.layer == 0) & (t.tag == tag)].params_per_client.sum())  # noqa: E731
    q = 20 if n_bins is None else n_bins + 1
    evals = sum(1 + h["n_trials"] for h in h0)
    assert row("projections" if n_bins is None else "vw_quantiles") == evals * k * q
    assert row("gradient") == sum(h["n_iter"] for h in h0) * 5 * k
    assert row("client_cdf") == 2 * k * (4 + 2) and row("barycenter_quantiles") == 2 * k * (9 + 1)
    per_layer = log.per_layer()
    assert per_layer.total.sum() == log.total() and list(per_layer.layer) == [0, 1]
    assert CommunicationLog.from_dict(log.to_dict()).table().equals(log.table())


# ----------------------------------------------------------------------------------- metric (POT)
def test_wasserstein_emd_and_sinkhorn_agree():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 8, generator=g)
    y = torch.randn(60, 8, generator=g) + 1.0
    emd = wasserstein_distance(x, y, "emd")
    sk = wasserstein_distance(x, y, "sinkhorn", reg=0.01)
    assert abs(sk - emd) / emd < 0.03 and sk >= emd - 1e-6
    assert wasserstein_distance(x, x, "emd") < 1e-6
    # one point each: the squared distance
    assert wasserstein_distance(x[:1], y[:1]) == pytest.approx(float((x[0] - y[0]).square().sum()), rel=1e-5)
    chunked = wasserstein_distance(x, y, "emd", chunk=30)
    assert chunked >= emd - 1e-6


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), 1e30])
@pytest.mark.parametrize("method", ["emd", "sinkhorn"])
def test_wasserstein_refuses_non_finite_points(bad, method):
    """NaN or ±inf in either set (or a value whose squared distances overflow) is refused before any solver runs,
    in a chunked problem too."""
    g = torch.Generator().manual_seed(3)
    x, y = torch.rand(6, 4, generator=g), torch.rand(6, 4, generator=g)
    for where in (x, y):
        broken = where.clone()
        broken[2, 1] = bad
        pair = (broken, y) if where is x else (x, broken)
        with pytest.raises(ValueError, match="NaN or infinite"):
            wasserstein_distances([(x, y), pair], method)
        with pytest.raises(ValueError, match="NaN or infinite"):
            wasserstein_distances([pair], method, chunk=3)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
def test_wasserstein_on_a_device_is_the_host_value(device):
    """``device`` moves the costs and the batched Sinkhorn there: on the CPU the same bits as the default, on
    CUDA the same values to float32 GEMM rounding (the exact solver always runs on the host)."""
    g = torch.Generator().manual_seed(1)
    pairs = [(torch.rand(n, 16, generator=g), torch.rand(n, 16, generator=g) + 0.2) for n in (40, 40, 25)]
    for method in ("emd", "sinkhorn"):
        host = wasserstein_distances(pairs, method, 0.05)
        there = wasserstein_distances(pairs, method, 0.05, device=device)
        if device == "cpu":
            assert np.array_equal(host, there), method
        else:
            assert np.allclose(there, host, rtol=1e-4, atol=0), method


def test_sinkhorn_in_the_kernel_domain_is_the_log_domain_sinkhorn():
    """The kernel form (POT's "sinkhorn" on exp(−C/ε)) and the log form (POT's "log_sinkhorn") run the same
    iterations from the same start: the same values to rounding on digits; "auto" takes the kernel form there."""
    from fda_core.core.wasserstein import sinkhorn_form, squared_distances

    g = torch.Generator().manual_seed(2)
    pairs = [(torch.rand(30, 784, generator=g).round(), torch.rand(30, 784, generator=g).round()) for _ in range(4)]
    log = wasserstein_distances(pairs, "sinkhorn", 0.02, sinkhorn_domain="log")
    kernel = wasserstein_distances(pairs, "sinkhorn", 0.02, sinkhorn_domain="kernel")
    assert np.allclose(kernel, log, rtol=1e-12, atol=0)
    assert np.array_equal(wasserstein_distances(pairs, "sinkhorn", 0.02), kernel)
    cost = squared_distances(torch.stack([a for a, _ in pairs]), torch.stack([b for _, b in pairs]))
    assert sinkhorn_form(cost / (0.02 * cost.mean())) == "sinkhorn"


def test_sinkhorn_takes_the_log_domain_where_the_kernel_would_underflow():
    """A point far from every point of the other set (its row of C/ε above the limit) would leave a row of
    exp(−C/ε) at 0 in float64: "auto" takes the log form there, and "kernel" is refused, naming the parameter."""
    from fda_core.core.wasserstein import KERNEL_DOMAIN_LIMIT, sinkhorn_form

    scaled = torch.zeros(2, 3, 3, dtype=torch.float64)
    assert sinkhorn_form(scaled) == "sinkhorn"
    scaled[1, 2] = KERNEL_DOMAIN_LIMIT + 1  # one row far from everything
    assert sinkhorn_form(scaled) == "log_sinkhorn" and sinkhorn_form(scaled, "log") == "log_sinkhorn"
    with pytest.raises(ValueError, match="sinkhorn_domain='kernel'"):
        sinkhorn_form(scaled, "kernel")
    scaled.transpose(1, 2)[0, 1] = KERNEL_DOMAIN_LIMIT + 1  # and a column (transposed: the same check)
    assert sinkhorn_form(scaled[:1]) == "log_sinkhorn"
    x = torch.zeros(5, 2)
    far = torch.cat([torch.zeros(4, 2), torch.full((1, 2), 100.0)])  # C/ε of the far point: 5 / reg = 500
    assert 5 / 0.01 > KERNEL_DOMAIN_LIMIT
    auto = wasserstein_distances([(x, far)], "sinkhorn", 0.01)
    assert auto[0] == wasserstein_distances([(x, far)], "sinkhorn", 0.01, sinkhorn_domain="log")[0]
    assert auto[0] == pytest.approx(20000 / 5, rel=1e-9)  # every point of x is at the origin: the mean cost
    with pytest.raises(ValueError, match="sinkhorn_domain='kernel'"):
        wasserstein_distances([(x, far)], "sinkhorn", 0.01, sinkhorn_domain="kernel")
    with pytest.raises(ValueError, match="sinkhorn_domain must be one of"):
        wasserstein_distances([(x, far)], "sinkhorn", 0.02, sinkhorn_domain="exp")


def test_cross_check_measures_the_primary_metrics_translations():
    """run_translation's Sinkhorn/EMD cross-check takes the translations the primary metric measured after the last
    layer: the value a separate evaluation at that depth gives."""
    from fda_core.experiments.translation import experiments as ex

    d = ex.load_domains((0, 30, 60), n_train_per_class=8, n_test_per_class=3)
    cfg = dict(seed=0, device="cpu", n_layers=2, n_directions=3, max_iter=4, n_bins=None, eval_depths=[0, 1],
               wd_method="emd", wd_reg=0.05, variant="INB", convention="reference", input_transform="auto")
    keep: dict = {}
    result = ex.run_translation(cfg, d, sinkhorn_check=True, keep=keep)
    again = ex.wd_by_depth(keep["model"], d, [2], "sinkhorn", 0.05)
    assert result["cross_check"]["method"] == "sinkhorn"
    assert result["cross_check"]["wd"] == float(again.wd.mean())
    assert result["cross_check"]["wd_primary"] == result["wd_final"]


# ---------------------------------------------------------------------------------- autoencoder
def test_autoencoder_shapes_and_training_runs():
    ae = ConvAutoencoder()
    x = torch.rand(5, 784)
    assert ae.encode(x).shape == (5, LATENT_DIM) and ae.decode(ae.encode(x)).shape == (5, 784)
    model, losses = train_autoencoder(torch.rand(64, 784), epochs=2, batch_size=32)
    assert len(losses) == 2 and not model.training
    with pytest.raises(ValueError, match="at least one image"):
        train_autoencoder(torch.rand(0, 784), epochs=1)


def test_autoencoder_epoch_loss_is_the_mean_over_images_read_once_per_epoch():
    """An epoch's loss is the mean BCE over its images, each batch weighted by its size (the last one short): with
    a learning rate too small to move any weight it is the initial model's BCE on all the images. The losses are
    read from the device once per epoch, not per step: the reads do not grow with the number of steps."""
    from device_reads import DeviceReads

    x = torch.rand(50, 784, generator=torch.Generator().manual_seed(3))
    torch.manual_seed(5)
    initial = ConvAutoencoder()
    with torch.no_grad():
        expected = float(torch.nn.functional.binary_cross_entropy(initial(x), x))
    counts = {}
    for batch_size in (7, 25):  # 8 steps (the last of 1 image) and 2 steps per epoch
        with DeviceReads() as reads:
            _, losses = train_autoencoder(x, epochs=2, batch_size=batch_size, lr=1e-30, seed=5)
        counts[batch_size] = reads.count
        assert losses == pytest.approx([expected, expected], rel=1e-6)
    assert counts[7] == counts[25], counts


def test_aeinb_variants_translate_images():
    from fda_core.data.rotated_domains import rotated_mnist

    d = rotated_mnist((0, 60), n_train_per_class=20, n_test_per_class=5)
    keep = lambda x, y: (x[y < 2], y[y < 2])  # noqa: E731
    tr = [keep(x, y) for x, y in zip(d.train_x, d.train_y)]
    for variant in ("AEINB", "IndAEINB"):
        model = FedINB(1, 3, 3, 10, variant=variant, ae_epochs=1, device="cpu").fit([t[0] for t in tr],
                                                                                   [t[1] for t in tr])
        assert model.dim == LATENT_DIM and model.name == f"Hist {variant}-L1-K3-J3-V10"
        out = model.translate(tr[0][0], 0, 1, tr[0][1])
        assert out.shape == tr[0][0].shape and float(out.min()) >= 0 and float(out.max()) <= 1


# ------------------------------------------------------------------------------------- bad input
def test_bad_input_raises_value_error(fitted):
    model, doms, labs = fitted
    with pytest.raises(ValueError, match="n_directions"):
        FedINB(1, 7, 5, device="cpu").fit(doms, labs)  # K = 7 > d = 6
    with pytest.raises(ValueError, match="n_bins"):
        FedINB(1, 2, 5, n_bins=1)
    with pytest.raises(ValueError, match="max_iter"):
        FedINB(1, 2, 0)
    with pytest.raises(ValueError, match="variant"):
        FedINB(1, 2, 5, variant="StarGAN")
    with pytest.raises(ValueError, match="domain"):
        model.transform(doms[0], 3, labs[0])
    with pytest.raises(ValueError, match="domain"):
        model.translate(doms[0], 0, -1, labs[0])
    with pytest.raises(ValueError, match="shape"):
        model.transform(doms[0][:, :4], 0, labs[0])
    with pytest.raises(ValueError, match="labels are required"):
        model.transform(doms[0], 0)
    with pytest.raises(ValueError, match="layers"):
        model.transform(doms[0], 0, labs[0], layers=4)
    bad = doms[0].clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        model.transform(bad, 0, labs[0])
    with pytest.raises(ValueError, match="NaN"):
        FedINB(1, 2, 5, device="cpu").fit([bad, doms[1]], labs[:2])
    with pytest.raises(ValueError, match="d="):
        FedINB(1, 2, 5, device="cpu").fit([doms[0], doms[1][:, :5]])
    with pytest.raises(ValueError, match="same number of samples"):
        FedINB(1, 2, 5, device="cpu").fit([doms[0], doms[1][:-1]], [labs[0], labs[1][:-1]])
    with pytest.raises(ValueError, match="at least 2"):
        FedINB(1, 2, 5, device="cpu").fit([doms[0]])
    with pytest.raises(ValueError, match="n_bins"):
        vw_edges(torch.zeros(3, 4), 1)
    with pytest.raises(ValueError, match="n_directions"):
        haar_stiefel(3, 4)
    with pytest.raises(ValueError, match="method"):
        wasserstein_distance(doms[0], doms[1], "fid")
    with pytest.raises(ValueError, match="same d"):
        wasserstein_distance(doms[0], doms[1][:, :3])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        train_autoencoder(torch.full((4, 784), 2.0))


# --------------------------------------------------------------------------------- benchmark smoke
def test_benchmark_quick_mode_runs():
    spec = importlib.util.spec_from_file_location("bench_inb", ROOT / "benchmarks" / "inb.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rec = bench.run(quick=True, device="cpu", threads=1)
    assert rec["fast_seconds"] > 0 and rec["reference_seconds"] > 0 and rec["ratio"] > 0
    assert rec["max_objective_rel_diff"] < 1e-3  # the reference and the fast code agree on the first layer
    assert "ratio" in bench.format_report(rec)


# ------------------------------------------------------------------------ notebook 06: store and tables
def _write_idx(path, arr):
    import gzip
    import struct

    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def test_rotated_domains_turn_as_the_official_code():
    """The Fed INB official code rotates PIL digits with torchvision's rotate at its default: counter-clockwise,
    nearest neighbour (rotated_mnist's default); bilinear is the option, and the source names which ran."""
    from fda_core.data.datasets import rotate_images
    from fda_core.data.rotated_domains import rotated_mnist

    d = rotated_mnist((0, 30), n_train_per_class=3, n_test_per_class=2)
    x0 = d.train_x[0].view(-1, 1, 28, 28)
    assert torch.equal(d.train_x[1], rotate_images(x0, 30, "nearest").reshape(len(x0), -1))
    assert "counter-clockwise (nearest-neighbour" in d.source
    b = rotated_mnist((0, 30), n_train_per_class=3, n_test_per_class=2, interpolation="bilinear")
    assert torch.allclose(b.train_x[0], d.train_x[0], atol=1e-5) and torch.allclose(
        b.train_x[1], rotate_images(x0, 30, "bilinear").reshape(len(x0), -1)) and "bilinear" in b.source
    with pytest.raises(ValueError, match="interpolation"):
        rotated_mnist((0, 30), 3, 2, interpolation="cubic")


def test_rotated_mnist_reads_idx_files_through_the_shared_reader(tmp_path):
    from fda_core.data.rotated_domains import load_idx_images, rotated_mnist

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for split, n in (("train", 40), ("t10k", 30)):
        _write_idx(raw / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(raw / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)
    d = load_idx_images(tmp_path)  # found in MNIST/raw, .gz
    assert d["train_x"].shape == (40, 1, 28, 28) and d["test_y"].tolist() == (np.arange(30) % 10).tolist()
    assert float(d["train_x"].max()) <= 1.0 and d["train_x"].dtype == torch.float32
    dom = rotated_mnist((0, 30), n_train_per_class=3, n_test_per_class=2, data_root=str(tmp_path))
    assert dom.train_x[0].shape == (30, 784) and dom.test_x[1].shape == (20, 784) and "IDX" in dom.source
    with pytest.raises(FileNotFoundError, match="train-images-idx3-ubyte"):
        load_idx_images(tmp_path / "nowhere")


def test_rotated_fashion_mnist_reads_fashion_mnist_where_both_are_present(tmp_path):
    """MNIST and Fashion-MNIST IDX files share their names and `fda data fetch` puts MNIST under data/MNIST/raw:
    a Fashion-MNIST run (notebook 08's dataset "fashion") reads the FashionMNIST folder, an MNIST run never enters
    it (found by audit: the search took MNIST/raw first, so a Fashion run trained on MNIST's digits)."""
    from fda_core.data.rotated_domains import fashion_idx_folder, load_idx_images
    from fda_core.experiments.translation.dg_study import resolve_plan

    rng = np.random.default_rng(2)
    for folder, n in (("MNIST/raw", 40), ("FashionMNIST/raw", 50)):
        (tmp_path / folder).mkdir(parents=True)
        for split, k in (("train", n), ("t10k", n // 2)):
            _write_idx(tmp_path / folder / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (k, 28, 28)))
            _write_idx(tmp_path / folder / f"{split}-labels-idx1-ubyte.gz", np.arange(k) % 10)
    fashion = fashion_idx_folder(tmp_path)
    assert fashion == str(tmp_path / "FashionMNIST" / "raw")
    assert load_idx_images(fashion)["train_x"].shape[0] == 50 and load_idx_images(tmp_path)["train_x"].shape[0] == 40
    assert resolve_plan(dataset="fashion", data_root=str(tmp_path))["data_root"] == fashion
    assert resolve_plan(dataset="mnist", data_root=str(tmp_path))["data_root"] == str(tmp_path)
    # the paper's Fashion-MNIST budgets (App. E.2): 1,500 iterations for 75 degrees and 3,000 for 90, every period,
    # one run of the longer read at both (× iterations_scale 0.08: 120 and 240); MNIST's per period, read at the end
    plan = resolve_plan(dataset="fashion", data_root=str(tmp_path))
    assert plan["iterations"] == {1: 240, 10: 240, 100: 240} and plan["budgets"] == {"75": 120}
    from types import SimpleNamespace

    from fda_core.experiments.translation.dg_study import DGStudy

    assert DGStudy._train_kwargs(SimpleNamespace(plan=plan))["budgets"] == {"75": 120, "75 held-out": 120}
    assert resolve_plan()["budgets"] == {} and resolve_plan()["iterations"] == {1: 160, 10: 200, 100: 240}
    only_fashion = tmp_path / "only"
    (only_fashion / "FashionMNIST").mkdir(parents=True)
    for f in (tmp_path / "FashionMNIST" / "raw").iterdir():
        (only_fashion / "FashionMNIST" / f.name).write_bytes(f.read_bytes())
    assert fashion_idx_folder(only_fashion) == str(only_fashion / "FashionMNIST")
    with pytest.raises(FileNotFoundError, match="Rotated MNIST"):  # an MNIST run does not take Fashion-MNIST
        load_idx_images(only_fashion)
    with pytest.raises(FileNotFoundError, match="keeps no training/test split"):
        fashion_idx_folder(tmp_path / "MNIST")


def _tiny_plan():
    from fda_core.experiments.translation.study import resolve_plan

    return resolve_plan(angles=[0, 45], n_train_per_class=12, n_test_per_class=4, L=1, K=2, J=3, V=6, variant="INB",
                        variants=["INB"], J_values=[2], V_values=[4], eval_depths=[0], ae_epochs=0, ae_shared_epochs=0)


def test_study_runs_are_tied_to_the_code_revision(tmp_path, monkeypatch):
    """A stored run and a cached autoencoder are reused only by the same code; recompute refits both."""
    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import experiments as ex
    from fda_core.experiments.translation import study as st
    from fda_core.experiments.translation import tables as tb

    plan = _tiny_plan()
    first = st.TranslationStudy(plan, ResultStore(tmp_path))
    first.prepare()
    assert not first.ae_info["shared"]["cached"]
    fresh = first.headline_runs()
    assert "2 computed" in first.store.summary() and first.revision in first.store.summary()
    again = st.TranslationStudy(plan, ResultStore(tmp_path))
    again.prepare()
    assert again.ae_info["shared"]["cached"] and again.ae_info["individual"]["cached"]
    loaded = again.headline_runs()
    assert "2 run(s) reused" in again.store.summary()
    # a stored record has sorted keys, a fresh one does not: the tables do not depend on it
    for fn in (lambda rs: tb.summary_table(rs, 1.0), tb.communication_table, tb.iterations_table,
               tb.cross_check_table):
        assert fn(fresh).to_csv(index=False) == fn(loaded).to_csv(index=False)
    a, b = (tb.communication_by_message(rs["INB-L1-K2-J3"]) for rs in (fresh, loaded))
    assert a.to_csv(index=False) == b.to_csv(index=False) and list(a.columns) == tb.BY_MESSAGE_COLUMNS
    shuffled = {**loaded["INB-L1-K2-J3"], "comm_by_tag": [dict(reversed(list(m.items())))
                                                         for m in reversed(loaded["INB-L1-K2-J3"]["comm_by_tag"])]}
    assert tb.communication_by_message(shuffled).to_csv(index=False) == a.to_csv(index=False)
    # no wall-clock time in any result table; the timings table has them
    for t in (tb.summary_table(fresh, 1.0), tb.communication_table(fresh), tb.final_table(fresh)):
        assert not [c for c in t.columns if "second" in c or c.endswith("_s")]
    assert "fit_seconds" in tb.timings_table(fresh).columns
    # other code: runs and autoencoders of the old revision are stale
    monkeypatch.setattr(st, "translation_revision", lambda: "other-code")
    monkeypatch.setattr(ex, "autoencoder_revision", lambda: "other-ae")
    changed = st.TranslationStudy(plan, ResultStore(tmp_path))
    changed.prepare()
    assert not changed.ae_info["shared"]["cached"] and changed.ae_info["shared"]["stale"]
    assert "retrained" in changed.autoencoder_summary()
    changed.headline_runs()
    summary = changed.store.summary()
    assert "2 computed" in summary and "2 stored run(s) of other code revisions recomputed" in summary
    forced = st.TranslationStudy(plan, ResultStore(tmp_path, recompute=True))
    forced.prepare()
    assert not forced.ae_info["shared"]["cached"] and not forced.ae_info["shared"]["stale"]
    forced.headline_runs()
    assert "0 run(s) reused" in forced.store.summary() and "recompute=True" in forced.store.summary()


def test_study_notes_come_from_the_configs_that_ran(tmp_path):
    from fda_core.common.store import ResultStore
    from fda_core.experiments.paper_numbers import paper_table, paper_value
    from fda_core.experiments.translation import study as st
    from fda_core.experiments.translation import tables as tb

    s = st.TranslationStudy(_tiny_plan(), ResultStore(tmp_path))
    runs = {**s.plain_vs_hist(), **s.v_runs()}
    note = s.note(runs, extra=s.vw_note())
    assert "clients at 0, 45 degrees; 12 training and 4 held-out digits" in note
    assert "L=1 layers, K=2 directions" in note and "after layers [0, 1]" in note
    assert "Hist INB-L1-K2-J3-V4 (INB, J=3, VW histograms with V=4, reference option)" in note
    assert note.count("INB-L1-K2-J3 (") == 1 and "Options: reference = as the official Fed INB code" in note
    assert f"{paper_value('setting')['n_train_per_class']} training" in note and "second" not in note
    assert "Sinkhorn epsilon = 0.02" in s.cross_check_note()
    r = runs["INB (sorted samples)"]
    with pytest.raises(ValueError, match="different settings"):
        s.note({"a": r, "b": {**r, "config": {**r["config"], "seed": 1}}})
    # the paper's iteration counts come from paper_numbers, matched by variant and histogram use
    it = tb.iterations_vs_paper(s.trace_runs())
    assert it.loc["Hist INB-L1-K2-J3-V6", "paper_table5_mean"] == paper_table("INBIterations").loc["Hist INB", 100]
    assert it.loc["INB-L1-K2-J3", "per_iteration"] == round(it.loc["INB-L1-K2-J3", "mean"] / 3, 3)
    text = tb.summary_paragraph(s)
    assert f"{s.wd_identity:.1f}" in text and "equal the closed form" in text
    with pytest.raises(ValueError, match="variant"):
        st.resolve_plan(variants=["StarGAN"])
    with pytest.raises(ValueError, match="wd_method"):
        st.resolve_plan(wd_method="fid")


def test_held_out_digits_zero_keeps_every_digit_left(tmp_path):
    """n_test_per_class = 0: every test-file digit (data_root; unequal classes kept) or, on MNIST-5k, the
    500 − n_train digits per class that are not training digits; the training digits are those of n_test > 0."""
    from fda_core.data.rotated_domains import load_idx_images, rotated_mnist

    raw = tmp_path / "MNIST" / "raw"
    raw.mkdir(parents=True)
    rng = np.random.default_rng(1)
    test_labels = np.array([0] * 5 + [1] * 7 + [2] * 3 + list(range(3, 10)) * 2)  # classes of 5, 7, 3, 2, ... digits
    for split, labels in (("train", np.arange(40) % 10), ("t10k", test_labels)):
        _write_idx(raw / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (len(labels), 28, 28)))
        _write_idx(raw / f"{split}-labels-idx1-ubyte.gz", labels)
    dom = rotated_mnist((0, 30), n_train_per_class=3, n_test_per_class=0, data_root=str(tmp_path))
    idx = load_idx_images(tmp_path)
    assert dom.test_y[0].tolist() == sorted(test_labels.tolist())
    assert torch.equal(dom.test_x[0], idx["test_x"][torch.sort(idx["test_y"], stable=True).indices].reshape(-1, 784))
    assert torch.equal(dom.train_x[0], rotated_mnist((0, 30), 3, 2, str(tmp_path)).train_x[0])
    five_k = rotated_mnist((0, 30), n_train_per_class=480, n_test_per_class=0)
    assert torch.bincount(five_k.test_y[1]).tolist() == [20] * 10 and five_k.train_x[0].shape == (4800, 784)
    held_out = set(map(tuple, five_k.test_x[0].tolist()))
    assert not any(row in held_out for row in map(tuple, five_k.train_x[0].tolist()))  # disjoint
    with pytest.raises(ValueError, match="n_test_per_class >= 0"):
        rotated_mnist((0, 30), 3, -1)
    with pytest.raises(ValueError, match="n_train_per_class < 500"):
        rotated_mnist((0, 30), 500, 0)


def test_paper_scale_plans(tmp_path):
    """Notebook 06's paper_scale: the paper's digit counts and every layer's WD (needs data_root), DIRT's
    StarGAN at k = 16 and 128; refused beside quick or without data_root, before anything loads."""
    from fda_core.experiments.translation import stargan_study as sgs
    from fda_core.experiments.translation import study as st

    plan = st.resolve_plan(paper_scale=True, data_root=str(tmp_path), L=4)
    assert (plan["n_train_per_class"], plan["n_test_per_class"]) == (1000, 0) and plan["paper_scale"]
    assert plan["eval_depths"] == [0, 1, 2, 3, 4] and plan["J"] == 100 and plan["V_values"] == [50, 200, 500, 2000]
    assert plan["wd_chunk"] == 2000 and st.resolve_plan()["wd_chunk"] == 1000  # no class of MNIST's test file split
    with pytest.raises(ValueError, match="wd_chunk must be an integer >= 2"):
        st.resolve_plan(wd_chunk=1)
    with pytest.raises(ValueError, match="needs data_root"):
        st.resolve_plan(paper_scale=True)
    with pytest.raises(ValueError, match="exclude each other"):
        st.resolve_plan(paper_scale=True, quick=True, data_root=str(tmp_path))
    with pytest.raises(ValueError, match="n_test_per_class must be an integer >= 0"):
        st.resolve_plan(n_test_per_class=-1)
    sg = sgs.resolve_stargan(paper_scale=True)
    assert (sg["iterations"], sg["sync_steps"], sg["conv_dim"], sg["g_repeat"]) == (2048, [16, 128], 64, 6)
    assert sgs.resolve_stargan()["conv_dim"] == 8 and not sgs.resolve_stargan()["paper_scale"]
    with pytest.raises(ValueError, match="exclude each other"):
        sgs.resolve_stargan(paper_scale=True, quick=True)
    assert sgs.resolve_stargan()["client_batching"] == "auto" and sgs.resolve_stargan(client_batching="vmap")[
        "client_batching"] == "vmap"
    with pytest.raises(ValueError, match="client_batching must be one of"):  # no compiled form for FedStarGAN
        sgs.resolve_stargan(client_batching="compile")


def test_study_note_counts_every_held_out_digit(tmp_path):
    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import study as st

    plan = st.resolve_plan(angles=[0, 45], n_train_per_class=490, n_test_per_class=0, L=1, K=2, J=3, V=6,
                           variant="INB", variants=["INB"], J_values=[2], V_values=[4], eval_depths=[0])
    s = st.TranslationStudy(plan, ResultStore(tmp_path))
    assert "490 training digits per class and client, and every other digit held out (100 per client)" in \
        s.setting_note()


def _without_times(value):
    """A record without its wall-clock times (they differ between any two fits)."""
    if isinstance(value, dict):
        return {k: _without_times(v) for k, v in value.items() if "seconds" not in k}
    if isinstance(value, list):
        return [_without_times(v) for v in value]
    return value


@pytest.mark.timeout(600)
def test_study_fits_side_by_side_as_one_after_another(tmp_path):
    """workers=2: fit_all fits every configuration the notebook's sections ask for in worker processes; the sections
    then get the records one worker gives, bit for bit (times aside), the drawn run's translator is kept, and a
    second study reads every run back from the store."""
    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import study as st

    plan = _tiny_plan()
    one = st.TranslationStudy(plan, ResultStore(tmp_path / "one"), threads=1)
    two = st.TranslationStudy(plan, ResultStore(tmp_path / "two"), threads=1, workers=2)
    configs = two.notebook_configs()
    assert len(configs) == len({st.config_hash(c) for c in configs}) >= 6 and any(c["grid"] for c in configs)
    assert one.fit_all() == 0  # one worker: each section fits its runs when it asks

    def sections(s):
        return {"a": s.variant_runs(), "b": s.j_runs(), "v": s.v_runs(), "c": s.plain_vs_hist(), "g": s.grid_runs(),
                "t": s.trace_runs(), "o": s.option_runs(), "h": s.headline_runs(), "x": s.cross_check_runs()}

    assert two.fit_all() == len(configs)
    assert f"{len(configs)} computed" in two.store.summary(st.EXPERIMENT)
    assert _without_times(sections(two)) == _without_times(sections(one))
    assert f"{len(configs)} computed" in two.store.summary(st.EXPERIMENT)  # the sections fitted nothing more
    model, reused = two.translator("INB")  # the drawn pixel-INB run's translator, saved by its worker
    assert reused and model.n_layers == plan["L"]
    again = st.TranslationStudy(plan, ResultStore(tmp_path / "two"), threads=1, workers=2)
    assert again.fit_all() == 0 and f"{len(configs)} run(s) reused" in again.store.summary(st.EXPERIMENT)
    lost = next(c for c in configs if not c["grid"])
    again.store.path(st.EXPERIMENT, lost).unlink()  # one run missing: fitted alone (here), counted once
    third = st.TranslationStudy(plan, ResultStore(tmp_path / "two"), threads=1, workers=2)
    assert third.fit_all() == 1 and "1 computed" in third.store.summary(st.EXPERIMENT)
    assert _without_times(sections(third)) == _without_times(sections(one))
    assert "1 computed" in third.store.summary(st.EXPERIMENT)
    with pytest.raises(ValueError, match="workers must be an integer"):
        st.TranslationStudy(plan, ResultStore(tmp_path / "three"), workers=0)


@pytest.mark.timeout(600)
def test_fedstargan_runs_side_by_side_are_the_runs_of_one_worker(tmp_path):
    """With the translation study's workers=2, FedStarGANStudy.runs() trains its runs the store lacks in two worker
    processes (which load the clients' images and held-out digits from a file) and gives the records one worker
    gives, bit for bit (training times aside); a second study reads both back; one worker trains nothing ahead."""
    from fda_core.common.store import ResultStore
    from fda_core.experiments.translation import stargan_study as sgs
    from fda_core.experiments.translation import study as st

    plan = _tiny_plan()
    sg_plan = sgs.resolve_stargan(sync_steps=[1, 2], iterations=3, conv_dim=2, g_repeat=0, eval_points=2)
    one_study = st.TranslationStudy(plan, ResultStore(tmp_path / "one"), threads=1)
    one_study.prepare()
    one = sgs.FedStarGANStudy(one_study, sg_plan)
    assert one.workers == 1 and one.run_all() == 0
    two_study = st.TranslationStudy(plan, ResultStore(tmp_path / "two"), threads=1, workers=2)
    two_study.prepare()
    two = sgs.FedStarGANStudy(two_study, sg_plan)
    assert two.run_all() == 2 and "2 computed" in two.store.summary(sgs.EXPERIMENT)
    assert _without_times(two.runs()) == _without_times(one.runs())
    assert [len(r["curve"]) for r in two.runs().values()] == [2, 2]
    again = sgs.FedStarGANStudy(two_study, sg_plan, store=ResultStore(tmp_path / "two"))
    assert again.run_all() == 0 and _without_times(again.runs()) == _without_times(one.runs())
    assert "2 run(s) reused" in again.store.summary(sgs.EXPERIMENT)
