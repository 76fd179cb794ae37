"""The synthetic phase-diagram experiment: data generator, network, batched trainer vs a plain loop,
metrics at the initialisation, bad input, and a smoke run of benchmarks/phase_diagram.py."""

import importlib.util
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from fda_core.core.estimators import per_sample_gradients, unit_directions
from fda_core.data import sigmoid_net as N
from fda_core.experiments import phase_diagram as S
from fda_core.experiments.phase_diagram import trainer as T

ROOT = Path(__file__).resolve().parent.parent
F64 = torch.float64


@pytest.fixture(scope="module")
def small():
    """n = 200, 3 shift levels, 3 subset sizes, 2 trials, float64."""
    return S.make_phase_diagram_data(200, shift_levels=[0.0, 0.25, 0.5], subset_sizes=[6, 20, 60], n_trials=2,
                                     seed=3, dtype=F64)


# --------------------------------------------------------------------------------------------- data
def test_generator_shapes_and_determinism():
    a = S.make_phase_diagram_data(300, n_trials=2, seed=5)
    assert a.x.shape == (300, 50) and a.y_target.shape == (300, 10)
    assert a.y_sources.shape == (9, 300, 10) and a.x.dtype == torch.float32 and a.x.device.type == "cpu"
    assert len(a.shift_levels) == 9 and a.shift_levels[0] == 0 and a.shift_levels[-1] == S.DEFAULT_S_MAX
    assert a.subset_sizes == S.scaled_subset_sizes(300) and len(a.subset_sizes) == 9
    assert a.subset_idx.shape == (9, 2, max(a.subset_sizes)) and a.test_mask.shape == (9, 2, 300)
    assert torch.bincount(a.cluster).tolist() == [30] * 10
    b = S.make_phase_diagram_data(300, n_trials=2, seed=5)
    for f in a.__dataclass_fields__:
        va, vb = getattr(a, f), getattr(b, f)
        assert torch.equal(va, vb) if isinstance(va, torch.Tensor) else np.array_equal(va, vb), f
    c = S.make_phase_diagram_data(300, n_trials=2, seed=6)
    assert not torch.equal(a.x, c.x) and not torch.equal(a.y_sources, c.y_sources)
    assert not torch.equal(a.subset_idx, c.subset_idx)
    # shift level 0 is the target set itself; shifted levels change the labels, never x
    assert torch.equal(a.y_sources[0], a.y_target)
    assert all(not torch.equal(a.y_sources[i], a.y_target) for i in range(1, 9))
    # adding trials or levels leaves the earlier draws unchanged
    d = S.make_phase_diagram_data(300, shift_levels=list(a.shift_levels) + [1.0], n_trials=3, seed=5)
    assert torch.equal(d.y_sources[:9], a.y_sources) and torch.equal(d.subset_idx[:, :2], a.subset_idx)
    assert "prose" in a.describe() and "D_1" in a.describe()


def test_subsets_disjoint_from_test_set_and_sizes():
    assert S.scaled_subset_sizes(5000) == S.PAPER_SUBSET_SIZES
    assert S.scaled_subset_sizes(2000) == (6, 11, 20, 36, 66, 120, 218, 398, 724)
    small_sizes = S.scaled_subset_sizes(100)
    assert min(small_sizes) >= 4 and len(set(small_sizes)) == 9 and list(small_sizes) == sorted(small_sizes)
    d = S.make_phase_diagram_data(400, n_trials=3, seed=1)
    for j, k in enumerate(d.subset_sizes):
        for t in range(3):
            idx, test = d.train_indices(j, t), d.test_indices(j, t)
            assert len(idx) == k == len(set(idx.tolist())) and len(test) == 400 - k
            assert not set(idx.tolist()) & set(test.tolist())
            assert int(d.subset_mask[j, t].sum()) == k
    assert not torch.equal(d.train_indices(4, 0), d.train_indices(4, 1))  # trials draw different subsets


def test_network_matches_nn_module_and_autograd(small):
    theta = S.init_params(small, 1)
    assert theta.shape == (N.N_PARAMS,) == (6110,) and float(theta.abs().max()) <= 0.5
    assert torch.equal(theta, S.init_params(small, 1)) and not torch.equal(theta, S.init_params(small, 0))
    net = S.make_network(theta)
    x, y = small.x, small.y_sources[1]
    assert torch.allclose(N.predict(theta, x), net(x), atol=1e-12)
    loss = nn.MSELoss()(net(x), y)
    assert float(N.mse_loss(theta, x, y)) == pytest.approx(loss.item(), rel=1e-12)
    ref = torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(net.parameters()))])
    assert torch.allclose(N.full_gradients(theta, x, y), ref, atol=1e-12)
    # the package's per-sample gradients of the network as an nn.Module (per-point loss (1/10)‖f(x_i) − y_i‖²)
    assert torch.allclose(per_sample_gradients(net, nn.MSELoss(), x, y).mean(0), ref, atol=1e-12)
    stacked = torch.stack([theta, S.init_params(small, 0)])
    assert torch.allclose(N.full_gradients(stacked, x, y)[0], ref, atol=1e-12)


def test_unit_directions():
    """The one unit-direction helper (core.estimators; used by estimate_deltas, the estimator checks and
    init_metrics): x/‖x‖ along a dimension, 0 for a zero vector."""
    x = torch.tensor([[3.0, 4.0], [0.0, 0.0], [0.0, -2.0]], dtype=F64)
    u = unit_directions(x)
    assert torch.equal(u, torch.tensor([[0.6, 0.8], [0.0, 0.0], [0.0, -1.0]], dtype=F64))
    assert torch.equal(unit_directions(x.T, dim=0), u.T)
    assert torch.equal(unit_directions(torch.zeros(3)), torch.zeros(3))  # no direction, no NaN
    g = torch.randn(4, 7, 5, dtype=F64)
    assert torch.allclose(torch.linalg.vector_norm(unit_directions(g), dim=-1), torch.ones(4, 7, dtype=F64))


# --------------------------------------------------------------------------------------------- training
@pytest.mark.parametrize("options", [{}, dict(training_step="library", granularity="flat")],
                         ids=["reference (defaults)", "library"])
def test_batched_training_matches_single_loop(small, options):
    kw = dict(steps=12, eval_every=5, reestimate_every=4, lr=0.2, momentum=0.9, **options)
    res = S.train_grid(small, betas=(0.5, 0.25), chunk_size=4, progress=False, **kw)
    tab = res.table
    assert len(tab) == 2 * 3 * 3 * 8 and list(res.eval_steps) == [0, 5, 10, 12]
    assert res.timing["n_trainings_run"] < len(tab)  # target/source only run once per trial and size/shift
    assert {"row", "trial", "shift_index", "shift", "size_index", "subset_size", "rule", "beta", "method",
            "beta_used", "beta_init", "final_test_loss", "initial_test_loss", "diverged"} <= set(tab.columns)
    for r in tab.itertuples():
        ref = S.train_single(small, shift_index=r.shift_index, size_index=r.size_index, rule=r.rule,
                             beta=0.5 if math.isnan(r.beta) else r.beta, trial=r.trial, **kw)
        np.testing.assert_allclose(res.curves[r.row], ref["test_loss"], rtol=1e-9, atol=1e-12)
        assert r.beta_used == pytest.approx(ref["beta_used"], abs=1e-9)
        assert r.beta_init == pytest.approx(ref["beta_init"], abs=1e-9)
    auto = tab[tab.rule.str.endswith("_auto")]
    assert ((auto.beta_used >= 0) & (auto.beta_used <= 1)).all() and auto.beta_init.between(0, 1).all()
    assert (tab[tab.rule == "source_only"].beta_used == 1).all() and (tab[tab.rule == "target_only"].beta_used == 0).all()
    # no dedupe, other chunking: the same numbers
    res2 = S.train_grid(small, betas=(0.5, 0.25), chunk_size=7, dedupe=False, progress=False, **kw)
    assert res2.timing["n_trainings_run"] == len(tab)
    np.testing.assert_allclose(res2.curves, res.curves, rtol=1e-10, atol=1e-12)
    # helpers
    long = res.curves_long()
    assert len(long) == len(tab) * 4 and {"step", "test_loss", "method"} <= set(long.columns)
    steps, losses = res.curve(2, 1, "fedgp(beta=0.25)")
    assert losses.shape == (2, 4) and list(steps) == [0, 5, 10, 12]
    np.testing.assert_array_equal(res.curve(2, 1, "FedGP (β=0.25)")[1], losses)  # by display label too
    assert len(res.mean_table()) == len(tab) // 2


def test_training_learns_and_diverged_runs_are_flagged(small):
    res = S.train_grid(small, rules=("target_only", "fedgp"), steps=60, progress=False, size_indices=[2],
                       shift_indices=[0])
    assert (res.table.final_test_loss < res.table.initial_test_loss).all() and not res.table.diverged.any()
    bad = S.train_grid(small, rules=("fedda", "fedgp_auto"), steps=40, lr=1e6, progress=False, size_indices=[0],
                       shift_indices=[2], reestimate_every=2)
    assert bad.table.diverged.all()


def test_methods_come_from_the_registry(small):
    """Rules are registry methods: the default is every method with a gradient rule; the table shows their
    display labels, canonical names and fixed β; unsupported methods are named with the supported ones."""
    from fda_core.experiments.methods import get_method, list_methods, method_class

    expected = [n for n in list_methods() if method_class(n).gradient_rule]
    assert S.synthetic_methods() == expected
    res = S.train_grid(small, steps=2, progress=False, trials=[0], shift_indices=[1], size_indices=[1])
    assert list(res.table.rule) == expected
    assert list(res.table.method) == [get_method(n).display_label for n in expected]
    assert list(res.table.method) == ["Source only", "Target only", "FedDA", "FedGP", "FedDA_Auto", "FedGP_Auto"]
    assert res.config["rules"] == expected and res.config["methods"] == list(res.table.method)
    two = S.train_grid(small, rules=("fedda", "fedgp(beta=0.2)"), betas=(0.5, 0.25), steps=2, progress=False,
                       trials=[0], shift_indices=[1], size_indices=[1])
    assert list(two.table.method) == ["FedDA", "FedDA (β=0.25)", "FedGP (β=0.2)"]
    assert list(two.table.beta) == [0.5, 0.25, 0.2] and list(two.table.rule) == ["fedda", "fedda", "fedgp"]
    for bad in ("finetune_offline", "fedgp(filter=False)", "fedgp_auto(projection='cosine')"):
        with pytest.raises(ValueError, match=r"supported methods: \['source_only'"):
            S.train_grid(small, rules=(bad,), progress=False)
        with pytest.raises(ValueError, match="supported methods"):
            S.train_single(small, shift_index=0, size_index=0, rule=bad)


# --------------------------------------------------------------------------------------------- metrics
def test_init_metrics_columns_and_fedda_formula():
    data = S.make_phase_diagram_data(300, shift_levels=[0.0, 0.2, 0.5], subset_sizes=[8, 40, 150], seed=2,
                                     dtype=F64)
    met = S.init_metrics(data, n_subsets=600, progress=False)
    cols = {"trial", "shift_index", "shift", "size_index", "subset_size", "d2", "sigma2", "sigma2_stderr",
            "sigma2_exact", "tau2d2", "tau2", "g_norm2", "delta_bar", "d2_over_sigma2", "sigma2_hat", "d2_hat",
            "tau2d2_hat", "method", "rule", "beta", "beta_hat", "delta_mc", "delta_mc_stderr", "delta_formula",
            "formula_kind", "delta_projected", "z_formula"}
    assert cols <= set(met.columns) and len(met) == 3 * 3 * 6
    cells = S.cell_metrics(met)
    assert len(cells) == 9 and (cells[cells.shift_index == 0].d2 == 0).all() and (cells.tau2 <= 1).all()
    # σ² by Monte Carlo vs its exact finite-population value; σ² falls with the subset size
    assert (abs(cells.sigma2 - cells.sigma2_exact) < 4 * cells.sigma2_stderr).all()
    assert cells.groupby("shift_index").sigma2.apply(lambda s: s.is_monotonic_decreasing).all()
    da = met[met.rule == "fedda"]
    assert (da.z_formula.abs() < 4).all()  # closed-form FedDA Δ² = Monte-Carlo Δ² within 4 standard errors
    exact = (1 - 0.5) ** 2 * da.sigma2_exact + 0.25 * da.d2
    assert (abs(da.delta_mc - exact) < 4 * da.delta_mc_stderr + 1e-12).all()
    for rule in ("source_only", "target_only"):
        sub = met[met.rule == rule]
        assert np.allclose(sub.delta_mc, sub.delta_formula)
    gp = met[met.rule == "fedgp"]  # with the measured projected noise the FedGP expression is close
    assert (abs(gp.delta_mc - gp.delta_projected) < 5 * gp.delta_mc_stderr + 1e-9).all()
    auto = met[met.rule.str.endswith("_auto")]
    assert auto.beta_hat.between(0, 1).all() and auto.beta_mc.between(0, 1).all()
    # the trainer's auto β at θ0 is the metrics' β̂ from the same training subset and parts
    res = S.train_grid(data, rules=("fedda_auto", "fedgp_auto"), steps=1, progress=False)
    merged = res.table.merge(met, on=["trial", "shift_index", "size_index", "method"])
    np.testing.assert_allclose(merged.beta_init, merged.beta_hat, atol=1e-8)


def test_compare_best(small):
    res = S.train_grid(small, rules=("source_only", "target_only", "fedda", "fedgp"), steps=5, progress=False)
    met = S.init_metrics(small, rules=("source_only", "target_only", "fedda", "fedgp"), n_subsets=20, progress=False)
    best = S.compare_best(res, met)
    assert len(best) == 9 and {"d", "sigma", "best_by_delta_mc", "best_by_loss", "agree"} <= set(best.columns)
    assert set(best.best_by_loss) <= {"Source only", "FedDA", "FedGP", "Target only"}
    assert (best[best.shift_index == 0].best_by_delta_mc == "Source only").all()  # d = 0: source only exact
    assert {"loss[FedGP]", "delta_mc[Source only]"} <= set(best.columns)
    # methods by name, spec or display label name the same columns
    same = S.compare_best(res, met, methods=("Source only", "fedda(beta=0.5)", "FedGP", "target_only"))
    assert same.equals(best)
    assert len(S.cell_metrics(met, average_trials=True)) == 9
    with pytest.raises(ValueError, match="methods"):
        S.compare_best(res, met, methods=("fedgp(beta=0.3)",))


# --------------------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("kwargs, name", [
    (dict(rules=("oracle",)), "oracle"),
    (dict(rules=("fedgp(projection='cosine')",)), "projection"),
    (dict(rules=("fedgp", "fedgp(beta=0.5)")), "duplicates"),
    (dict(rules=()), "rules"),
    (dict(steps=0), "steps"),
    (dict(shift_indices=[]), "shift_indices"),
    (dict(size_indices=[7]), "size_indices"),
    (dict(betas=(1.5,)), "betas"),
    (dict(betas=()), "betas"),
    (dict(eval_every=0), "eval_every"),
    (dict(n_parts=1), "n_parts"),
    (dict(chunk_size=0), "chunk_size"),
    (dict(device="tpu"), "device"),
])
def test_bad_training_input(small, kwargs, name):
    with pytest.raises(ValueError, match=name):
        S.train_grid(small, progress=False, **kwargs)


def test_bad_data_and_metrics_input(small):
    with pytest.raises(ValueError, match="subset_sizes"):
        S.make_phase_diagram_data(100, subset_sizes=[5, 100])  # larger than the set allows
    with pytest.raises(ValueError, match="subset_sizes"):
        S.make_phase_diagram_data(100, subset_sizes=[])
    with pytest.raises(ValueError, match="shift_levels"):
        S.make_phase_diagram_data(100, shift_levels=[0.0, -1.0])
    with pytest.raises(ValueError, match="n_points"):
        S.make_phase_diagram_data(12)  # too small for 9 distinct scaled sizes with a test set
    with pytest.raises(ValueError, match="n_trials"):
        S.make_phase_diagram_data(100, n_trials=0)
    with pytest.raises(ValueError, match="rule"):
        S.train_single(small, shift_index=0, size_index=0, rule="fedprox")
    with pytest.raises(ValueError, match="n_subsets"):
        S.init_metrics(small, n_subsets=1, progress=False)
    with pytest.raises(ValueError, match="rule"):
        S.init_metrics(small, rules=("nope",), progress=False)
    with pytest.raises(ValueError, match="n_parts"):
        S.train_grid(small, rules=("fedgp_auto",), n_parts=7, size_indices=[0], progress=False)


# --------------------------------------------------------------------------------------------- benchmark
def test_benchmark_smoke(tmp_path):
    spec = importlib.util.spec_from_file_location("bench_phase_diagram", ROOT / "benchmarks" / "phase_diagram.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "b.json"
    report = bench.main(["--quick", "--device", "cpu", "--json", str(out)])
    assert out.exists() and "batched" in report and "ratio" in report and "paper scale" in report


def test_run_phase_diagram_store_reuses_and_resumes(tmp_path, monkeypatch):
    from fda_core.common.store import ResultStore

    data = S.make_phase_diagram_data(n_points=200, shift_levels=[0.0, 0.3], subset_sizes=[8, 40], n_trials=2, seed=1)
    kw = dict(steps=5, n_subsets=10, progress=False, device="cpu")
    store = ResultStore(tmp_path)
    calls = []
    real_train = T.train_grid

    def failing_on_trial_1(*args, **kwargs):
        calls.append(kwargs["trials"])
        if kwargs["trials"] == [1] and len(calls) == 2:
            raise KeyboardInterrupt("interrupted")
        return real_train(*args, **kwargs)

    monkeypatch.setattr(T, "train_grid", failing_on_trial_1)
    with pytest.raises(KeyboardInterrupt):
        S.run_phase_diagram(data, store=store, **kw)
    assert len(list((tmp_path / "synthetic_phase_diagram").glob("*.json"))) == 1  # trial 0 finished, kept
    assert not list((tmp_path / "synthetic_phase_diagram").glob("*.tmp"))
    res, met = S.run_phase_diagram(data, store=store, **kw)  # resumes: only trial 1 is computed
    assert calls == [[0], [1], [1]]
    res2, met2 = S.run_phase_diagram(data, store=store, **kw)  # everything reused
    assert calls == [[0], [1], [1]]
    assert sorted(res.table.trial.unique()) == [0, 1] and sorted(met.trial.unique()) == [0, 1]
    np.testing.assert_allclose(res.curves, res2.curves)
    fresh, _ = S.run_phase_diagram(data, store=None, **kw)
    np.testing.assert_allclose(fresh.curves, res.curves, rtol=1e-5)
    # rows of the combined table point into the combined curves: trial 1's rows come after trial 0's
    assert res.table.row.max() < res.curves.shape[0]
    t0_rows = res.table[res.table.trial == 0].row
    t1_rows = res.table[res.table.trial == 1].row
    assert t1_rows.min() > t0_rows.max()
    # every stored trial carries the code revision of the modules it ran
    import json

    stored = [json.loads(p.read_text()) for p in (tmp_path / "synthetic_phase_diagram").glob("*.json")]
    assert {s["revision"] for s in stored} == {S.run_revision()} and res.config["code_revision"] == S.run_revision()
    # timings: one record per trial, reused trials marked, never in the result tables
    timing = S.timing_table(res2)
    assert list(timing.trial) == [0, 1] and not timing.computed.any() and (timing.wall_s > 0).all()
    assert "metrics_wall_s" in timing and not {"wall_s", "ms_per_training_step"} & set(S.runs_table(res2, met2).columns)


def test_run_phase_diagram_recomputes_runs_of_other_code(tmp_path, monkeypatch):
    """A stored trial of another code revision is stale: recomputed and replaced; recompute=True ignores the store."""
    from fda_core.common.store import ResultStore
    from fda_core.experiments.phase_diagram import runs as R

    data = S.make_phase_diagram_data(n_points=200, shift_levels=[0.0, 0.3], subset_sizes=[8, 40], n_trials=1, seed=1)
    kw = dict(steps=3, n_subsets=5, progress=False, device="cpu")
    S.run_phase_diagram(data, store=ResultStore(tmp_path), **kw)
    store = ResultStore(tmp_path)
    S.run_phase_diagram(data, store=store, **kw)
    assert store.counts["synthetic_phase_diagram"] == {"reused": 1, "computed": 0, "stale": 0}
    monkeypatch.setattr(R, "run_revision", lambda: "othercode123")  # as if the trainer had changed
    store = ResultStore(tmp_path)
    res, _ = S.run_phase_diagram(data, store=store, **kw)
    assert store.counts["synthetic_phase_diagram"] == {"reused": 0, "computed": 1, "stale": 1}
    assert "recomputed" in store.summary() and S.timing_table(res).computed.all()
    store = ResultStore(tmp_path, recompute=True)
    S.run_phase_diagram(data, store=store, **kw)
    assert store.counts["synthetic_phase_diagram"]["computed"] == 1 and "recompute=True" in store.summary()


def test_setting_note_is_generated_from_what_ran(small):
    """The tables' note says what actually ran: data, network, training config and metrics config."""
    res = S.train_grid(small, rules=("source_only", "fedgp(beta=0.2)", "fedda_auto"), steps=3, eval_every=3,
                       reestimate_every=2, n_parts=3, progress=False, trials=[1], shift_indices=[0], size_indices=[2])
    note = S.setting_note(small, {**res.config, "metrics": {"n_subsets": 17, "n_parts": 3, "dtype": "float64"}})
    for text in ("n = 200 points", "Shift levels: [0, 0.25, 0.5]", "sizes [6, 20, 60]: chosen by the run",
                 f"m = {N.N_PARAMS} parameters", "3 steps, lr 0.2, momentum 0.9", "Source only, FedGP (β=0.2), FedDA_Auto",
                 "FedGP (β=0.2) 0.2", "B = 3 target parts, every 2 steps", "every 3 steps; trials 1.",
                 "over 17 random target subsets", "float64"):
        assert text in note, text
    assert "Metrics" not in S.setting_note(small, res.config)  # no metrics config, no metrics sentence
    assert S.spread_subset_sizes(2000, 4) == (6, 36, 120, 724) and S.spread_subset_sizes(2000) == S.scaled_subset_sizes(2000)
    with pytest.raises(ValueError, match="n_sizes"):
        S.spread_subset_sizes(2000, 10)
