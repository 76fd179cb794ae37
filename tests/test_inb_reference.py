"""Fed INB's reference-code options (``docs/translation.md`` § Reference-code conventions), pinned on tiny cases:

* the probit input transform of pixel-space INB (official code: Φ⁻¹ of pixels clamped to [ε, 1 − ε] on the way
  in, Φ on the way out): exact round trip inside (ε, 1 − ε), outputs in [0, 1], "auto" picks it for pixels only;
* ``convention="reference"``: the objective is exactly M× the library's (the official code sums per-client means),
  the Armijo search with it equals the library search with an M× first trial, and equals a transcription of
  the official search loop step for step; the client-histogram bins follow round(√(M·n));
* bad option values raise ValueError naming the allowed values.
"""

import math

import pytest
import torch

from fda_core.core.barycenter import ndtr
from fda_core.core.stiefel import armijo_cayley_maximize, haar_stiefel
from fda_core.experiments.translation.inb import (CONVENTIONS, INPUT_TRANSFORMS, PROBIT_EPS, FedINB, FedMaxKSW,
                                                  ProbitTransform, federated_gradient, max_k_sw_objective,
                                                  objective_norm)

F64 = torch.float64


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _pixels(m=3, n=30, d=8, classes=2, seed=0):
    """Pixel-like clients in [0, 1] with exact 0s and 1s (like MNIST backgrounds and strokes), shifted per client."""
    g = torch.Generator().manual_seed(seed)
    doms, labs = [], []
    for i in range(m):
        xs = [(torch.rand(n, d, generator=g) * 1.6 - 0.5 + 0.15 * i * (c + 1) * torch.linspace(-1, 1, d)).clamp(0, 1)
              for c in range(classes)]
        doms.append(torch.cat(xs))
        labs.append(torch.arange(classes).repeat_interleave(n))
    return doms, labs


def _blobs(m=3, n=30, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(n, d, generator=g, dtype=F64) * (1 + 0.5 * i) + i for i in range(m)]


# ------------------------------------------------------------------------------------ input transform
def test_probit_transform_round_trip_and_clamp():
    t = ProbitTransform()
    assert t.eps == PROBIT_EPS == 1e-6
    x = torch.cat([torch.rand(10_000, generator=torch.Generator().manual_seed(1), dtype=F64),
                   torch.tensor([PROBIT_EPS, 1e-5, 0.5, 1 - 1e-5, 1 - PROBIT_EPS], dtype=F64)])
    x = x.clamp(PROBIT_EPS, 1 - PROBIT_EPS)
    z = t.forward(x)
    assert torch.isfinite(z).all()
    assert torch.allclose(t.inverse(z), x, rtol=0, atol=1e-14)  # exact up to float64 rounding on [ε, 1 − ε]
    # the clamp: 0 and 1 map to Φ⁻¹(ε) and Φ⁻¹(1 − ε) (finite, ±4.753…) and come back as ε and 1 − ε
    ends = t.forward(torch.tensor([0.0, 1.0]))
    assert math.isclose(float(ends[1]), 4.753424308822899, rel_tol=1e-9) and math.isclose(-float(ends[0]), float(ends[1]), rel_tol=1e-9)
    assert torch.allclose(t.inverse(ends), torch.tensor([PROBIT_EPS, 1 - PROBIT_EPS], dtype=F64), rtol=0, atol=1e-15)
    # Φ maps every real number into [0, 1]
    out = t.inverse(torch.linspace(-60, 60, 2001, dtype=F64))
    assert (out >= 0).all() and (out <= 1).all() and (out.diff() >= 0).all()
    assert torch.equal(t.inverse(z), ndtr(z))


def test_fedinb_probit_is_invertible_and_translates_into_pixels():
    doms, labs = _pixels()
    model = FedINB(3, 3, 10, seed=2, device="cpu").fit(doms, labs)
    assert model.input_transform == "auto" and model.input_transform_ == "probit"
    g = torch.Generator().manual_seed(4)
    for m in range(3):
        inside = torch.rand(doms[m].shape, generator=g, dtype=F64).clamp(2 * PROBIT_EPS, 1 - 2 * PROBIT_EPS)
        z = model.transform(inside, m, labs[m])
        # exact wherever the shared point lies within the official clamp (±Φ⁻¹(1 − ε), see the next test)
        kept = (z.abs() <= 4.7534).all(dim=1)
        assert kept.float().mean() > 0.9
        back = model.inverse_transform(z, m, labs[m])
        assert torch.allclose(back[kept], inside[kept], rtol=0, atol=1e-9)
        # a pixel of exactly 0 or 1 is clamped first: it comes back as ε or 1 − ε
        back = model.translate(doms[m], m, m, labs[m])
        kept = (model.transform(doms[m], m, labs[m]).abs() <= 4.7534).all(dim=1)
        assert kept.sum() >= 10  # (the exact 0s and 1s start at the bound: many rows end up outside it)
        assert torch.allclose(back[kept], doms[m].double().clamp(PROBIT_EPS, 1 - PROBIT_EPS)[kept], rtol=0, atol=1e-9)
        for t in range(3):
            out = model.translate(doms[m], m, t, labs[m])
            assert (out >= 0).all() and (out <= 1).all()
    # without the transform the same layers move pixels out of [0, 1]
    plain = FedINB(3, 3, 10, seed=2, device="cpu", input_transform="none").fit(doms, labs)
    assert plain.input_transform_ == "none"
    outs = torch.cat([plain.translate(doms[0], 0, t, labs[0]) for t in (1, 2)])
    assert outs.min() < 0 or outs.max() > 1


def test_probit_translation_clamps_the_shared_space_as_the_official_end_layer():
    """The official code translates through its ``end`` layer: Φ out of the shared space, clamp to [ε, 1 − ε],
    Φ⁻¹ back in, i.e. shared-space coordinates clamped to ±Φ⁻¹(1 − ε) = ±4.7534… before the inverse layers."""
    t = ProbitTransform()
    bound = 4.753424308822899  # Φ⁻¹(1 − 1e-6)
    got = t.shared(torch.tensor([-10.0, -4.7, 0.0, 4.7, 10.0], dtype=F64))
    assert torch.allclose(got, torch.tensor([-bound, -4.7, 0.0, 4.7, bound], dtype=F64), rtol=0, atol=1e-12)
    # the same as the official round trip Φ⁻¹(clamp(Φ(z), ε, 1 − ε)) wherever Φ is exact
    z = torch.linspace(-8, 8, 161, dtype=F64)
    assert torch.allclose(t.shared(z), t.forward(t.inverse(z)), rtol=0, atol=1e-6)
    doms, labs = _pixels()
    model = FedINB(3, 3, 10, seed=2, device="cpu").fit(doms, labs)
    z = model.transform(doms[0], 0, labs[0])
    far = z.clone()
    far[:, 0], far[:, 1] = 10.0, -10.0
    clamped = far.clone()
    clamped[:, 0], clamped[:, 1] = bound, -bound
    for target in range(3):
        assert torch.allclose(model.inverse_transform(far, target, labs[0]),
                              model.inverse_transform(clamped, target, labs[0]), rtol=0, atol=1e-12)
    # without the probit transform nothing is clamped: far points map elsewhere than clamped ones
    plain = FedINB(3, 3, 10, seed=2, device="cpu", input_transform="none").fit(doms, labs)
    assert not torch.allclose(plain.inverse_transform(far, 1, labs[0]), plain.inverse_transform(clamped, 1, labs[0]))
    # the batched evaluation translates as translate() does, clamp included
    for depth, s, tgt, out, lab in model.translate_all(doms, labs, [0, 2, 3]):
        order = torch.argsort(labs[s], stable=True)
        want = model.translate(doms[s][order], s, tgt, labs[s][order], layers=depth)
        assert torch.equal(lab, labs[s][order])
        assert torch.allclose(out.double(), want, rtol=0, atol=1e-9), (depth, s, tgt)


def test_auto_transform_only_for_pixel_space_inb():
    blobs = [x.float() for x in _blobs()]
    assert FedINB(1, 2, 3, device="cpu").fit(blobs).input_transform_ == "none"  # not pixels: no transform
    doms, labs = _pixels()
    assert FedINB(1, 2, 3, device="cpu", input_transform="none").fit(doms, labs).input_transform_ == "none"
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        FedINB(1, 2, 3, device="cpu", input_transform="probit").fit(blobs)
    with pytest.raises(ValueError, match="variant 'INB'"):
        FedINB(1, 2, 3, variant="IndAEINB", input_transform="probit")
    with pytest.raises(ValueError, match=r"input_transform must be one of \('auto', 'probit', 'none'\)"):
        FedINB(1, 2, 3, input_transform="logit")
    assert INPUT_TRANSFORMS == ("auto", "probit", "none")


# ------------------------------------------------------------------------------ objective scale
def _official_objective(xs: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """The official code's objective, written out: Σ_m mean over (K, n) of (sorted θᵀx_m − barycenter)²."""
    s = torch.sort(torch.einsum("mnd,dk->mkn", xs, theta), dim=-1).values
    bary = s.mean(0)
    return sum(((s[i] - bary) ** 2).mean() for i in range(xs.shape[0]))


def test_reference_objective_is_m_times_the_library_one():
    g = torch.Generator().manual_seed(0)
    m, n, d, k = 5, 17, 9, 3
    x = torch.randn(2, m, n, d, generator=g, dtype=F64) * torch.linspace(0.5, 2, m, dtype=F64)[:, None, None]
    theta = haar_stiefel(d, k, 2, g)
    lib = max_k_sw_objective(x, theta, convention="library")
    ref = max_k_sw_objective(x, theta, convention="reference")
    torch.testing.assert_close(ref, m * lib, rtol=1e-13, atol=0)
    for b in range(2):
        torch.testing.assert_close(ref[b], _official_objective(x[b], theta[b]), rtol=1e-13, atol=0)
    assert objective_norm(m, k, n, "library") == m * k * n and objective_norm(m, k, n, "reference") == k * n
    # the federated evaluation (clients' terms summed by the server) and its gradient scale the same way
    idx = torch.arange(2)
    f_lib = FedMaxKSW(x, k, convention="library").evaluate(theta, None, idx)[0]
    f_ref = FedMaxKSW(x, k, convention="reference").evaluate(theta, None, idx)[0]
    torch.testing.assert_close(f_ref, m * f_lib, rtol=1e-13, atol=0)
    torch.testing.assert_close(f_ref, ref, rtol=1e-13, atol=0)
    torch.testing.assert_close(federated_gradient(x, theta, convention="reference"),
                               m * federated_gradient(x, theta, convention="library"), rtol=1e-12, atol=0)
    # with VW histograms too (paper eq. 3)
    torch.testing.assert_close(max_k_sw_objective(x, theta, 6, "reference"), m * max_k_sw_objective(x, theta, 6),
                               rtol=1e-13, atol=0)


def _official_search(xs: torch.Tensor, theta0: torch.Tensor, max_iter: int, eps: float = 1e-6):
    """A transcription of the official code's direction search (float64 here), in its own notation: w = Θᵀ,
    loss = −objective, first trial 0.1, ×0.5 until loss(w₁) ≤ loss(w) + c·m·lr (c = 0.5), ×1.5 after an accepted
    step, Cayley step w₁ = w − lr·w V (I + lr/2 UᵀV)⁺ Uᵀ, stop when max|w₁ − w| < eps. Returns Θ and the number
    of objective evaluations after the first (its ``nums``, the count of the paper's Tables 5–6)."""
    k = theta0.shape[1]
    eye = torch.eye(2 * k, dtype=F64)
    w = theta0.T.clone().requires_grad_(True)
    lr, c = 0.1, 0.5
    loss = -_official_objective(xs, w.T)
    loss1 = loss
    w1 = w
    nums = 0
    for _ in range(max_iter):
        gt = torch.autograd.grad(loss, w)[0]
        w = w.detach()
        wt = w.T @ gt - gt.T @ w
        slope = torch.sum(gt * (-w @ wt))
        lr /= 0.5
        while loss1 > loss + c * slope * lr:
            lr *= 0.5
            ut = torch.cat((gt, w), 0)
            v = torch.cat((w.T, -gt.T), 1)
            w1 = (w - lr * w @ v @ torch.linalg.pinv(eye + lr / 2 * ut @ v) @ ut).requires_grad_(True)
            loss1 = -_official_objective(xs, w1.T)
            nums += 1
        if torch.max(torch.abs(w1.detach() - w)) < eps:
            w = w1.detach()
            break
        lr *= 1.5
        loss, w = loss1, w1
    return w.detach().T, nums


def test_reference_convention_search_matches_the_official_loop_and_the_scaled_step():
    m, n, d, k, iters = 5, 24, 10, 3, 25
    xs = torch.stack(_blobs(m, n, d, seed=3))
    theta0 = haar_stiefel(d, k, 1, torch.Generator().manual_seed(7))
    want_theta, want_trials = _official_search(xs, theta0[0], iters)

    def library_search(convention: str, init_step: float):
        return armijo_cayley_maximize(theta0, FedMaxKSW(xs[None], k, convention=convention), iters,
                                      init_step=init_step)

    ref = library_search("reference", 0.1)
    assert int(ref.n_trials[0]) == want_trials
    torch.testing.assert_close(ref.theta[0], want_theta, rtol=0, atol=1e-9)
    # the library's 1/(MKn) scale with an M× first trial takes the same steps: F_ref = M·F_lib, G_ref = M·G_lib,
    # and the Cayley curve depends on τ·G only, so every trial τ_lib = M·τ_ref gives the same Θ and decision
    scaled = library_search("library", 0.1 * m)
    assert torch.equal(scaled.n_trials, ref.n_trials) and torch.equal(scaled.n_iter, ref.n_iter)
    torch.testing.assert_close(scaled.theta, ref.theta, rtol=0, atol=1e-9)
    torch.testing.assert_close(torch.tensor(ref.trace[0], dtype=F64), m * torch.tensor(scaled.trace[0], dtype=F64),
                               rtol=1e-10, atol=0)
    # the library's own first trial (0.1 on the 1/(MKn) scale) is an M× shorter step: another search
    plain = library_search("library", 0.1)
    assert int(plain.n_trials[0]) != want_trials or not torch.allclose(plain.theta, ref.theta, atol=1e-6)


def test_fedinb_reference_convention_reproduces_the_official_first_layer():
    m, n, d, k, iters = 4, 20, 7, 2, 15
    doms = _blobs(m, n, d, seed=5)
    model = FedINB(1, k, iters, seed=11, device="cpu", search_dtype=F64, convention="reference").fit(doms)
    theta0 = haar_stiefel(d, k, 1, torch.Generator().manual_seed(11))  # the server's Θ₀ of layer 0, class 0
    theta, trials = _official_search(torch.stack(doms), theta0[0], iters)
    assert model.history[0]["n_trials"] == trials
    torch.testing.assert_close(model._blocks[0].layers[0].theta[0], theta, rtol=0, atol=1e-9)


# ------------------------------------------------------------------------------------- bin rule
@pytest.mark.parametrize("convention, bins", [("library", round(math.sqrt(20))), ("reference", round(math.sqrt(3 * 20)))])
def test_client_histogram_bins_follow_the_convention(convention, bins):
    doms, labs = _pixels(m=3, n=20, d=5)
    model = FedINB(2, 2, 4, seed=0, device="cpu", convention=convention).fit(doms, labs)
    assert model.client_bins(20) == bins
    for block in model._blocks:
        for layer in block.layers:
            assert layer.cdf.mass.shape[-1] == bins
    # the client CDF message carries B + 2 numbers per direction
    t = model.communication.table()
    cdf = t[(t.tag == "client_cdf") & (t.layer == 0)].params_per_client.sum()
    assert cdf == len(model.classes) * 2 * (bins + 2)
    assert FedINB(1, 2, 4, bary_bins=6, convention=convention).client_bins(20) == 6  # an explicit B wins
    assert FedINB(1, 2, 4, convention=convention).client_bins(20, n_domains=3) == bins  # before fit: M given


def test_bad_convention_raises():
    assert CONVENTIONS == ("library", "reference")
    with pytest.raises(ValueError, match=r"convention must be one of \('library', 'reference'\), got 'paper'"):
        FedINB(1, 2, 3, convention="paper")
    with pytest.raises(ValueError, match="convention must be one of"):
        objective_norm(2, 2, 2, "official")


# ------------------------------------------------------------------------------ notebook 06's option runs
def test_study_runs_table5_under_both_options(tmp_path):
    from fda_core.common.store import ResultStore
    from fda_core.experiments.paper_numbers import paper_table
    from fda_core.experiments.translation import experiments as ex
    from fda_core.experiments.translation import study as st
    from fda_core.experiments.translation import tables as tb

    plan = st.resolve_plan(angles=[0, 45], n_train_per_class=12, n_test_per_class=4, L=2, K=2, J=3, V=6,
                           variant="IndAEINB", variants=["INB", "IndAEINB"], J_values=[3], V_values=[6, 24],
                           eval_depths=[0, 1], ae_epochs=0, ae_shared_epochs=0)
    assert plan["option"] == "reference" and plan["compare_options"]
    s = st.TranslationStudy(plan, ResultStore(tmp_path))
    runs = s.option_runs()
    assert list(runs) == ["INB", "Hist INB", "IndAEINB"] and all(list(r) == ["reference", "library"]
                                                                for r in runs.values())
    ref, lib = runs["INB"]["reference"], runs["INB"]["library"]
    assert ref["input_transform"] == "probit" and lib["input_transform"] == "none"
    assert ref["convention"] == "reference" and lib["convention"] == "library"
    assert [p["depth"] for p in lib["curve"]] == [0, 2] and [p["depth"] for p in ref["curve"]] == [0, 1, 2]
    assert ref["bary_bins"] == round(math.sqrt(2 * 12)) and lib["bary_bins"] == round(math.sqrt(12))
    assert st.run_label(lib) == "INB-L2-K2-J3 (library)" and st.run_label(ref) == "INB-L2-K2-J3"
    # depth 0 is measured once per variant and input transform: the AE variant's two runs share it exactly
    ae_ref, ae_lib = runs["IndAEINB"]["reference"], runs["IndAEINB"]["library"]
    assert ae_ref["curve"][0]["wd"] == ae_lib["curve"][0]["wd"] and lib["wd_start"] != ref["wd_start"]
    model = FedINB(2, 2, 3, variant="IndAEINB", autoencoders=s.autoencoders["IndAEINB"], device="cpu",
                   convention="reference").fit(s.domains.train_x, s.domains.train_y)
    fresh = ex.wd_by_depth(model, s.domains, [0, 2])
    known = ex.wd_by_depth(model, s.domains, [0, 2], known={0: fresh[fresh.depth == 0]})
    assert fresh.equals(known)
    assert math.isclose(ae_ref["curve"][0]["wd"], float(fresh[fresh.depth == 0].wd.mean()), rel_tol=1e-12)
    # the Table-5 CSV: both options beside the paper; the summary names variant, option and ranks
    table = tb.iterations_by_option(runs)
    assert list(table.columns) == tb.OPTION_COLUMNS and len(table) == 6
    assert set(table.option) == {"reference", "library"}
    assert (table.paper == paper_table("INBIterations").loc[table.variant, 100].to_numpy()).all()
    assert table.set_index(["variant", "option"]).loc[("INB", "library"), "objective_scale"] == "1/(MKn)"
    assert "Table 5 under both option sets" in tb.describe_options(table)
    # without compare_options (the notebook's default) only the plan's option is fitted, and the committed CSV of
    # both options, read back, completes it when its runs are these; never when they are not
    from fda_core.common.files import write_table
    from fda_core.workbook.reports import committed_table

    write_table(tmp_path / "figs" / "iterations_vs_paper.csv", table,
                note=s.note({f"{k} ({o})": r for k, by in runs.items() for o, r in by.items()}))
    both = committed_table(tmp_path / "figs", "iterations_vs_paper", "fda run 06 -p compare_options true", index=False)
    committed, committed_note = both.table, both.note
    alone = st.TranslationStudy({**plan, "compare_options": False}, ResultStore(tmp_path))
    assert all(list(r) == ["reference"] for r in alone.option_runs().values())
    ours = tb.iterations_by_option(alone.option_runs())
    assert len(ours) == 3 and set(ours.option) == {"reference"}
    setting = alone.setting_note({row: by["reference"] for row, by in alone.option_runs().items()})
    assert committed_note[0] == setting
    shown, matched = tb.with_committed_options(ours, committed, committed_note, setting)
    assert matched and shown is committed and len(shown) == 6
    drift = committed.assign(wd_final=committed.wd_final * (1 + 1e-12), ours_max=committed.ours_max + 3)
    assert tb.with_committed_options(ours, drift, committed_note, setting)[1]  # another CPU kind's numbers
    renamed = committed.assign(run=committed.run.str.replace("J3", "J4"))  # another J: other runs
    for not_these, note in ((renamed, committed_note), (committed, [setting.replace("seed=0", "seed=1")]),
                            (None, committed_note), (committed.drop(columns="paper"), committed_note)):
        shown, matched = tb.with_committed_options(ours, not_these, note, setting)
        assert shown is ours and not matched
    summary = tb.summary_table(s.headline_runs(), s.wd_identity)
    assert list(summary.columns) == tb.SUMMARY_COLUMNS and set(summary.option) == {"reference"}
    assert summary.set_index("variant").loc["IndAEINB", "paper_fig2a_rank"] == 1
    assert summary.fig2a_rank.notna().sum() == 2 and summary.wd_rank.min() == 1
    assert (summary.wd_rank == summary.wd_final.rank(method="min")).all()
    note = s.note({f"{k} {o}": r for k, by in runs.items() for o, r in by.items()})
    assert "library = the paper's formulas" in note and "WD after layers [0, 2] only" in note
    # V = 24 = 2n is not refitted: the plain run's record with the VW messages (the timings say so)
    v24 = s.v_runs()["INB"]["V=24"]
    assert v24["derived_from"] == "INB-L2-K2-J3" and v24["wd_final_per_class"] == ref["wd_final_per_class"]
    assert "derived_from" not in s.v_runs()["INB"]["V=6"]
    timings = tb.timings_table(s.all_runs()).set_index("run")
    assert timings.loc["Hist INB-L2-K2-J3-V24", "derived_from"] == "INB-L2-K2-J3"
    assert "not refitted" in tb.describe_vw(s.v_runs(), s.plain_runs())
    with pytest.raises(ValueError, match=r"option must be one of \('reference', 'library'\)"):
        st.resolve_plan(option="official")


def test_vw_with_v_a_multiple_of_n_is_the_plain_run_with_vw_messages():
    """V = k·n reproduces the plain search bit for bit, so notebook 06 builds such a record from the plain run
    instead of refitting; the built record equals the fitted one, communication per layer and message included."""
    from fda_core.experiments.translation import experiments as ex

    d = ex.load_domains((0, 30, 60), n_train_per_class=8, n_test_per_class=3)
    base = dict(data=dict(n_train=8), seed=0, device="cpu", n_layers=2, n_directions=3, max_iter=6,
                eval_depths=[0, 1, 2], wd_method="emd", wd_reg=0.02, variant="INB", convention="reference",
                input_transform="auto")
    plain = {**ex.run_translation({**base, "n_bins": None}, d), "config": {**base, "n_bins": None}}
    assert ex.vw_equals_plain(16, 8) and ex.vw_equals_plain(8, 8)
    assert not ex.vw_equals_plain(12, 8) and not ex.vw_equals_plain(4, 8) and not ex.vw_equals_plain(None, 8)
    for v in (8, 16, 24):
        fitted = ex.run_translation({**base, "n_bins": v}, d)
        built = ex.vw_record_from_plain(plain, v)
        assert built["derived_from"] == plain["name"] and built["name"] == fitted["name"] == f"Hist {plain['name']}-V{v}"
        skip = {"fit_seconds", "eval_seconds", "derived_from"}
        assert set(built) - skip == set(fitted) - skip
        for key in set(fitted) - skip:
            assert built[key] == fitted[key], key
        assert built["params_total"] > plain["params_total"]  # V + 1 edges per message instead of n values
    with pytest.raises(ValueError, match="multiple of n=8"):
        ex.vw_record_from_plain(plain, 12)


def test_translate_all_takes_classes_of_unequal_counts():
    """Held-out data whose classes hold different counts (MNIST's test file: 892 to 1,135 digits per class), in
    any order: translate_all batches the classes of equal count and returns class-sorted digits, each translated as
    translate() translates it; a class whose count differs between clients is refused, naming it."""
    doms, labs = _pixels(classes=3)
    model = FedINB(2, 3, 10, seed=1, device="cpu").fit(doms, labs)
    held, held_labs = _pixels(n=12, classes=3, seed=5)
    keep = torch.cat([torch.arange(0, 5), torch.arange(12, 21), torch.arange(24, 26)])  # 5, 9 and 2 per class
    shuffle = torch.randperm(keep.numel(), generator=torch.Generator().manual_seed(0))
    held = [x[keep][shuffle] for x in held]
    held_labs = [y[keep][shuffle] for y in held_labs]
    seen = 0
    for depth, s, tgt, out, lab in model.translate_all(held, held_labs, [0, 1, 2]):
        order = torch.argsort(held_labs[s], stable=True)
        assert lab.tolist() == [0] * 5 + [1] * 9 + [2] * 2
        want = model.translate(held[s][order], s, tgt, held_labs[s][order], layers=depth)
        assert torch.allclose(out.double(), want, rtol=0, atol=1e-9), (depth, s, tgt)
        seen += 1
    assert seen == 3 * 3 * 2
    uneven = [held_labs[0], held_labs[1], torch.where(held_labs[2] == 2, 1, held_labs[2])]
    with pytest.raises(ValueError, match="class 1 has"):
        next(model.translate_all(held, uneven, [1]))
