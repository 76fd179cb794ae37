"""The federated loop (fda_core.experiments.federated): every rule inside the loop, the flat-parameter machinery
against torch's own optimiser, equivalences between rules, BatchNorm handling, determinism, bad
configs, and resuming a sweep from the result store."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
import torch
from torch import nn

from fda_core.common.store import ResultStore
from fda_core.core import aggregation
from fda_core.data.datasets import get_dataset
from fda_core.experiments import federated, methods, tables
from fda_core.experiments.federated import make_config, run_experiment, run_many
from fda_core.experiments.flat import FlatAdam, FlatModel
from fda_core.experiments.methods import FDAMethod, FedDA, get_method, list_methods, register_method

#: every built-in method, plus the β = 1 variant of FedGP the papers' tables call FedGP_1
METHOD_SPECS = [*list_methods()[:8], "fedgp(beta=1.0)"]


class Blobs:
    """A tiny 3-environment dataset (DomainBed interface): class-dependent means, one scale per env."""

    ENVIRONMENTS = ["e0", "e1", "e2"]
    input_shape = (1, 4, 4)
    num_classes = 3
    default_target = None

    def __init__(self, n: int = 240, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = []
        for e in range(3):
            y = torch.randint(0, 3, (n,), generator=g)
            x = torch.randn(n, 1, 4, 4, generator=g) + (y[:, None, None, None] - 1) * (0.6 + 0.4 * e)
            self.data.append((x, y))

    def __len__(self):
        return len(self.data)

    def __getitem__(self, i):
        return self.data[i]

    def env_index(self, env):
        if isinstance(env, int) and 0 <= env < len(self):
            return env
        if env in self.ENVIRONMENTS:
            return self.ENVIRONMENTS.index(env)
        raise ValueError(f"unknown environment {env!r}")


BASE = dict(target=0, rounds=4, warmup_rounds=1, n_target_labeled=24, target_batch_size=6, source_lr=0.02,
            model="mlp", source_batch_size=32)


def run(**cfg):
    return run_experiment(_dataset=Blobs(), **{**BASE, **cfg})


# --- flat machinery ----------------------------------------------------------------------------
def _net(seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(5, 7), nn.Tanh(), nn.Linear(7, 3))


@pytest.mark.parametrize("kind", ["adam", "sgd"])
def test_flat_optimiser_matches_torch(kind):
    ref, mine = _net(), _net()
    fm = FlatModel(mine)
    opt_ref = torch.optim.Adam(ref.parameters(), lr=0.01) if kind == "adam" else torch.optim.SGD(ref.parameters(), lr=0.01)
    opt = FlatAdam(fm.m, torch.device("cpu"), kind=kind)
    g = torch.Generator().manual_seed(1)
    for _ in range(6):
        x, y = torch.randn(8, 5, generator=g), torch.randint(0, 3, (8,), generator=g)
        opt_ref.zero_grad()
        nn.functional.cross_entropy(ref(x), y).backward()
        opt_ref.step()
        fm.grad.zero_()
        nn.functional.cross_entropy(fm.module(x), y).backward()
        opt.step(fm.flat, fm.grad, 0.01)
    for a, b in zip(ref.parameters(), mine.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_flat_model_views_and_layout():
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.BatchNorm2d(2), nn.Flatten(), nn.Linear(8, 3))
    fm = FlatModel(net)
    assert fm.m == sum(p.numel() for p in net.parameters())
    fm.flat.zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in net.parameters())  # parameters alias the flat vector
    # BatchNorm running statistics are buffers, not in the flat vector (never projected or estimated)
    assert set(fm.buffer_names) == {"1.running_mean", "1.running_var"}
    assert [n for n, *_ in fm.layout] == [n for n, _ in net.named_parameters()]
    d = fm.as_dict(torch.arange(fm.m, dtype=torch.float32))
    assert d["3.bias"].shape == (3,) and float(d["0.weight"].reshape(-1)[0]) == 0.0


# --- every rule inside the loop ----------------------------------------------------------------
@pytest.mark.parametrize("spec", METHOD_SPECS)
def test_every_method_runs(spec):
    res = run(rule=spec)
    assert 0.0 <= res["final_target_acc"] <= 1.0
    assert res["method"] == get_method(spec).display_label
    hist = res["history"]
    expected_rounds = BASE["rounds"] + (BASE["rounds"] if spec == "finetune_offline" else 0)
    assert [h["round"] for h in hist] == list(range(1, expected_rounds + 1))
    uses_beta = res["config"]["rule"] in ("fedda", "fedgp", "fedda_auto", "fedgp_auto")
    for h in hist:
        if h["phase"] == "fda" and uses_beta:
            assert len(h["beta"]) == 2 and all(0.0 <= b <= 1.0 for b in h["beta"])
        else:
            assert h["beta"] is None
    if spec == "fedgp(beta=1.0)":
        assert all(h["beta"] == [1.0, 1.0] for h in hist if h["phase"] == "fda")


def _fine_tuning_calls(monkeypatch) -> list[dict]:
    """The keyword arguments of every fine-tuning epoch's ``Run.train_target`` call from now on (Finetune_Offline's
    epochs, ``who="target fine-tuning"``), in order; the calls still train."""
    calls: list[dict] = []
    original = federated.Run.train_target

    def spy(self, **kw):
        if kw.get("who") == "target fine-tuning":
            calls.append(kw)
        return original(self, **kw)

    monkeypatch.setattr(federated.Run, "train_target", spy)
    return calls


def test_finetune_offline_starts_a_fresh_optimiser_every_epoch_by_default(monkeypatch):
    """The reference scripts build a new Adam for every fine-tuning epoch (docs/reproduction.md row 12):
    the default resets the target's optimiser before each epoch, 'once' only before the first; the first
    fine-tuning epoch is the same in both."""
    calls = _fine_tuning_calls(monkeypatch)
    fresh = run(rule="finetune_offline", finetune_epochs=3)
    assert [c["reset_optimizer"] for c in calls] == [True, True, True]
    calls.clear()
    once = run(rule="finetune_offline", method_options={"optimizer_reset": "once"}, finetune_epochs=3)
    assert [c["reset_optimizer"] for c in calls] == [True, False, False] and once["method"] == "Finetune_Offline (3 epochs, one optimiser run)"
    tune = [[h["target_acc"] for h in r["history"] if h["phase"] == "finetune"] for r in (fresh, once)]
    assert len(tune[0]) == len(tune[1]) == 3 and tune[0][0] == tune[1][0]
    with pytest.raises(ValueError, match="optimizer_reset must be one of"):
        run(rule="finetune_offline", method_options={"optimizer_reset": "never"})


def test_finetune_offline_lr_option_sets_the_fine_tuning_rate_only(monkeypatch):
    """Option ``lr``: None (the default) fine-tunes at the target's lr × lr_decay after warm-up rounds, as the
    reference scripts; a number fine-tunes at that rate, shows in the label and leaves the FedAvg rounds as they were
    (the same global model before the fine-tuning). Added after runs were stored: at its default it stays out of
    method_options (Option keyed=False). A rate that is not a number > 0 is refused before any training."""
    calls = _fine_tuning_calls(monkeypatch)
    default = run(rule="finetune_offline", finetune_epochs=2, warmup_rounds=1, lr_decay=0.1, target_lr=0.02)
    assert [c["lr"] for c in calls] == [pytest.approx(0.002)] * 2 and "lr" not in default["config"]["method_options"]
    calls.clear()
    slow = run(rule="finetune_offline", finetune_epochs=2, warmup_rounds=1, lr_decay=0.1, target_lr=0.02,
               method_options={"lr": 0.0005})
    assert [c["lr"] for c in calls] == [0.0005, 0.0005] and slow["method"] == "Finetune_Offline (2 epochs, lr 0.0005)"
    fedavg = [[h["target_acc"] for h in r["history"] if h["phase"] != "finetune"] for r in (default, slow)]
    assert fedavg[0] == fedavg[1]
    method = get_method("finetune_offline", lr=0.0005)
    assert method.option_values["lr"] == 0.0005 and get_method(method.spec).option_values == method.option_values
    for bad in (0, -0.1, "fast", float("nan")):
        with pytest.raises(ValueError, match="lr must be a finite number > 0"):
            get_method("finetune_offline", lr=bad)

@pytest.mark.parametrize("freeze", [True, False])
def test_finetune_offline_freeze_fine_tunes_the_last_layer_only(freeze):
    """freeze=True (the reference's main_noniid_finetune_offline.py --freeze, which trains only fc3): the fine-tuning
    epochs move the classifier's parameters and no other; False moves the others too. The option was added after
    runs were stored, so at its default it stays out of method_options (Option keyed=False): their keys stand."""
    from fda_core.experiments.methods.fda import _all_but_classifier

    method = get_method("finetune_offline", freeze=freeze)
    c = make_config(**{**BASE, "rule": "finetune_offline", "method_options": method.option_values})
    r = federated.Run(c, method, Blobs())
    for k in range(1, c["rounds"] + 1):
        r.round(k)
    before = r.theta.clone()
    r.method.after_training(r)
    moved, frozen = r.theta != before, _all_but_classifier(r.model)
    head = r.model.module.classifier
    assert int((~frozen).sum()) == head.weight.numel() + head.bias.numel()  # the mask is the classifier's
    assert moved[~frozen].any()
    assert moved[frozen].any() != freeze
    assert ("freeze" in method.option_values) == freeze and method.display_label.endswith("(last layer only)") == freeze
    assert get_method(method.spec).option_values == method.option_values


def test_finetune_offline_freeze_needs_a_classifier():
    from fda_core.experiments.methods.fda import _all_but_classifier
    from fda_core.experiments.flat import FlatModel

    with pytest.raises(ValueError, match="freeze=True needs a model with a `classifier`"):
        _all_but_classifier(FlatModel(nn.Sequential(nn.Linear(3, 2))))


@pytest.mark.parametrize("projection", ["exact", "exact_layerwise", "cosine"])
def test_projection_variants_differ_and_run(projection):
    res = run(rule="fedgp", projection=projection, rounds=3)
    assert math.isfinite(res["final_target_acc"])


def test_learning_happens():
    """On separable blobs every method that sees labels beats chance (1/3) clearly."""
    for method in ("fedgp", "fedgp_auto", "target_only", "oracle"):
        res = run(rule=method, rounds=8)
        assert res["final_target_acc"] > 0.5, (method, res["final_target_acc"])


def test_rule_equivalences_inside_the_loop():
    """β = 0 makes FedDA and FedGP the target-only update after the same warm-up (same seeds, same numbers);
    FedGP via the registered 'fedgp_cosine' rule equals rule='fedgp' with projection='cosine'."""
    t = run(rule="target_only(warmup=True)")
    for rule in ("fedda", "fedgp"):
        r = run(rule=rule, beta=0.0)
        assert [h["target_acc"] for h in r["history"]] == [h["target_acc"] for h in t["history"]]
    a = run(rule="fedgp_cosine", beta=0.7)
    b = run(rule="fedgp", projection="cosine", beta=0.7)
    assert [h["target_acc"] for h in a["history"]] == [h["target_acc"] for h in b["history"]]


def test_target_only_trains_from_the_initial_weights_without_warmup_or_decay():
    """The default Target only is the reference code's: the warm-up rounds and the decay do not apply to it,
    so a run with 2 warm-up rounds and lr × 0.1 equals one without warm-up, round for round; with
    ``warmup=True`` and no warm-up rounds it is the same run too (the option only adds the warm-up)."""
    plain = run(rule="target_only", warmup_rounds=2, lr_decay=0.1)
    assert [h["phase"] for h in plain["history"]] == ["fda"] * len(plain["history"])
    lr_t = plain["config"]["target_lr"]
    assert {h["lr_target"] for h in plain["history"]} == {lr_t}
    for other in (run(rule="target_only", warmup_rounds=0, lr_decay=0.1),
                  run(rule="target_only(warmup=True)", warmup_rounds=0)):
        assert [h["target_acc"] for h in other["history"]] == [h["target_acc"] for h in plain["history"]]
    warm = run(rule="target_only(warmup=True)", warmup_rounds=2, lr_decay=0.1)
    assert [h["phase"] for h in warm["history"]][:3] == ["warmup", "warmup", "fda"]
    assert warm["history"][2]["lr_target"] == pytest.approx(0.1 * lr_t)
    assert warm["method"] == "Target only (after warm-up)" and plain["method"] == "Target only"
    assert [h["target_acc"] for h in warm["history"]] != [h["target_acc"] for h in plain["history"]]


def test_per_method_config_keys_reach_only_their_methods_runs():
    """``per_method`` sets config keys in one method's runs (over the base, under a variant); names of methods
    not in the grid are ignored; keys that are not config keys, or that name the run, are refused by name."""
    budgets = {"target_only": {"warmup_rounds": 0, "target_batch_size": 16}, "fedgp_auto": {"lr_decay": 0.5}}
    configs, labels = federated.sweep_configs(BASE, ["fedgp", "target_only"], seeds=[0, 1], per_method=budgets,
                                              variants=[{}, {"target_batch_size": 3}])
    by = [(lab["method"], cfg["warmup_rounds"], cfg["target_batch_size"]) for cfg, lab in zip(configs, labels)]
    assert by == [("FedGP", 1, 6)] * 2 + [("Target only", 0, 16)] * 2 + [("FedGP", 1, 3)] * 2 + \
        [("Target only", 0, 3)] * 2
    assert all("lr_decay" not in c for c in configs)  # fedgp_auto's keys reach no other method's runs
    # a display label keys one variant of a method and wins over the canonical name
    configs, labels = federated.sweep_configs(
        BASE, ["target_only", "target_only(warmup=True)"],
        per_method={**budgets, "Target only (after warm-up)": {"warmup_rounds": 2}})
    assert [(lab["method"], cfg["warmup_rounds"]) for cfg, lab in zip(configs, labels)] == \
        [("Target only", 0), ("Target only (after warm-up)", 2)]
    for bad in ({"fedgp": {"rounds": 3, "learning_rate": 0.1}}, {"fedgp": {"rule": "fedda"}},
                {"fedgp": {"seed": 3}}):
        with pytest.raises(ValueError, match=r"per_method\['fedgp'\].*config keys"):
            federated.sweep_configs(BASE, ["fedgp"], per_method=bad)


def test_per_trial_data_seed_redraws_each_trials_data_set():
    """data_seed='per_trial' sets the data set's seed to the trial's seed in every run (the DomainBed scripts'
    --seed), over the base's and a variant's other data set options; 'fixed' leaves them as given. A data set
    without a seed option, a seed already set, or another choice is refused by name before anything runs."""
    base = {**BASE, "dataset": "ColoredMNIST", "dataset_options": {"image_size": 14}}
    variants = [{}, {"dataset": "RotatedMNIST", "dataset_options": {"angles": [0, 30]}}]
    configs, labels = federated.sweep_configs(base, ["fedgp", "source_only"], seeds=[3, 4, 5], variants=variants,
                                              data_seed="per_trial")
    got = [(c["dataset"], c["rule"], c["seed"], c["dataset_options"]) for c in configs]
    assert got[:3] == [("ColoredMNIST", "fedgp", s, {"image_size": 14, "seed": s}) for s in (3, 4, 5)]
    assert got[-3:] == [("RotatedMNIST", "source_only", s, {"angles": [0, 30], "seed": s}) for s in (3, 4, 5)]
    assert [lab["trial"] for lab in labels] == [0, 1, 2] * 4
    fixed, _ = federated.sweep_configs(base, ["fedgp"], seeds=[3, 4])
    assert [c["dataset_options"] for c in fixed] == [{"image_size": 14}] * 2
    assert base["dataset_options"] == {"image_size": 14}  # not mutated
    # what the runs then build: other shuffles, label noise and colours per trial
    first, second = (get_dataset(c["dataset"], **c["dataset_options"]) for c in configs[:2])
    assert not torch.equal(first.datasets[0][1], second.datasets[0][1])
    with pytest.raises(ValueError, match="data_seed='per_trial'.*'MNIST' takes none"):
        federated.sweep_configs({**BASE, "dataset": "MNIST"}, ["fedgp"], data_seed="per_trial")
    # a factory that passes its keyword options on may take a seed
    from fda_core.data.datasets import _REGISTRY, register_dataset

    register_dataset("_PassesOptions", lambda **options: get_dataset("ColoredMNIST", **options))
    try:
        configs, _ = federated.sweep_configs({**BASE, "dataset": "_PassesOptions"}, ["fedgp"], seeds=[2],
                                             data_seed="per_trial")
        assert configs[0]["dataset_options"] == {"seed": 2}
    finally:
        _REGISTRY.pop("_PassesOptions")
    with pytest.raises(ValueError, match=r"data_seed='per_trial'.*already sets it \(7\)"):
        federated.sweep_configs(base, ["fedgp"], variants=[{"dataset_options": {"seed": 7}}], data_seed="per_trial")
    with pytest.raises(ValueError, match="data_seed"):
        federated.sweep_configs(base, ["fedgp"], data_seed="per_run")


def test_a_variant_carries_its_own_per_method_keys_and_method_options():
    """A variant's ``per_method`` reaches that variant's runs only (over the call's ``per_method``, under the
    variant's own keys); its ``options`` set method options in that variant's runs, whose label then says so; bad
    keys or options are refused by name before anything runs."""
    variants = [{}, {"target_lr": 0.5, "per_method": {"fedgp": {"warmup_rounds": 2, "target_lr": 9.0}},
                     "options": {"target_only": {"warmup": True}}, "labels": {"setting": "reference"}}]
    configs, labels = federated.sweep_configs(BASE, ["fedgp", "target_only"], variants=variants,
                                              per_method={"fedgp": {"warmup_rounds": 3, "lr_decay": 0.5}})
    got = [(lab["method"], lab.get("setting"), c["warmup_rounds"], c.get("lr_decay"), c.get("target_lr"),
            c["method_options"]) for c, lab in zip(configs, labels)]
    assert got == [("FedGP", None, 3, 0.5, None, get_method("fedgp").option_values),
                   ("Target only", None, 1, None, None, {"epochs": None, "warmup": False}),
                   ("FedGP", "reference", 2, 0.5, 0.5, get_method("fedgp").option_values),
                   ("Target only (after warm-up)", "reference", 1, None, 0.5, {"epochs": None, "warmup": True})]
    assert all("per_method" not in c and "options" not in c for c in configs)
    with pytest.raises(ValueError, match=r"variants\[0\]\['per_method'\]\['fedgp'\].*config keys"):
        federated.sweep_configs(BASE, ["fedgp"], variants=[{"per_method": {"fedgp": {"seed": 1}}}])
    with pytest.raises(ValueError, match="warmup"):
        federated.sweep_configs(BASE, ["target_only"], variants=[{"options": {"target_only": {"warmup": 3}}}])


def test_noniid_reference_setting_is_the_semi_synthetic_scripts():
    """docs/reproduction.md row 13: the FedGP paper's semi-synthetic scripts as a variant of notebook 05: target lr
    0.005 (their default), source lr 0.01; every row 2 FedAvg warm-up rounds + 50 without decay in target batches of
    16, the auto rows decayed x 0.1 with batches of 4; Target only after the warm-up; the Oracle 50 rounds of one
    epoch at lr 0.003 without warm-up. The rows' budgets reach their runs through sweep_configs."""
    from fda_core.experiments.paper_numbers import noniid_reference_setting

    variant = noniid_reference_setting(50)
    assert (variant["source_lr"], variant["target_lr"]) == (0.01, 0.005)
    assert set(variant["per_method"]) == set(list_methods())
    configs, labels = federated.sweep_configs({**BASE, "target_batch_size": 3}, ["fedgp", "fedgp_auto", "target_only",
                                              "oracle(epochs=4, lr=0.003)"], variants=[variant])
    got = {lab["method"]: (c["rounds"], c["warmup_rounds"], c["lr_decay"], c["target_batch_size"], c["target_lr"])
           for c, lab in zip(configs, labels)}
    assert got == {"FedGP": (52, 2, 1.0, 16, 0.005), "FedGP_Auto": (52, 2, 0.1, 4, 0.005),
                   "Target only (after warm-up)": (52, 2, 1.0, 16, 0.005),
                   "Oracle (1 epochs/round, lr 0.003)": (50, 0, 1.0, 16, 0.005)}


def test_reference_budgets_are_the_scripts_settings():
    """The reference scripts' per-row budgets (auto-weighted paper's code): the auto rules decay both learning
    rates × 0.1 and use their data set's target batch; every other row keeps them and uses batches of 16;
    Target only runs 50 rounds without warm-up, the rows with a warm-up 2 + 50."""
    from fda_core.experiments.paper_numbers import reference_budgets

    for name, auto_batch in (("ColoredMNIST", 1), ("VLCS", 4), ("TerraIncognita", 8)):
        b = reference_budgets(name)
        assert {b[r]["lr_decay"] for r in ("fedda_auto", "fedgp_auto")} == {0.1}
        assert {b[r]["target_batch_size"] for r in ("fedda_auto", "fedgp_auto")} == {auto_batch}
        rest = [r for r in b if not r.endswith("_auto")]
        assert {b[r]["lr_decay"] for r in rest} == {1.0} and {b[r]["target_batch_size"] for r in rest} == {16}
        assert (b["target_only"]["rounds"], b["target_only"]["warmup_rounds"]) == (50, 0)
        assert {(b[r]["rounds"], b[r]["warmup_rounds"]) for r in rest if r != "target_only"} == {(52, 2)}
        warm = 5 if name == "TerraIncognita" else 2  # the auto script's warm-up: 5 FedAvg rounds on TerraIncognita
        assert {(b[r]["rounds"], b[r]["warmup_rounds"]) for r in ("fedda_auto", "fedgp_auto")} == {(50 + warm, warm)}
        configs, _ = federated.sweep_configs(BASE, list(b), per_method=b)  # every key is a config key
        assert len(configs) == len(b)
    more = reference_budgets("ColoredMNIST", others=["ditto", "Target only (after warm-up)"])
    assert more["ditto"] == more["Target only (after warm-up)"] == more["fedgp"] and more["ditto"] is not more["fedgp"]
    capped = reference_budgets("ColoredMNIST", others=["ditto"], max_rounds=3)  # quick runs
    assert {k["rounds"] for k in capped.values()} == {3} and capped["fedgp"]["warmup_rounds"] == 2
    assert reference_budgets("ColoredMNIST")["fedgp"]["rounds"] == 52
    for bad in (0, 2.5, True):
        with pytest.raises(ValueError, match="max_rounds"):
            reference_budgets("ColoredMNIST", max_rounds=bad)
    b["fedgp"]["rounds"] = 1  # a copy: the table itself is unchanged
    assert reference_budgets("TerraIncognita")["fedgp"]["rounds"] == 52
    with pytest.raises(KeyError, match="known"):
        reference_budgets("PACS")


class _Spy(FedDA):
    """FedDA that records what the server step sees (a method defined in a test, as a user would)."""

    name, label = "test_spy_fedda", "Spy FedDA"
    seen: dict = {}

    def combine(self, rnd, res, out):
        raw = res.source_updates.clone()
        beta = super().combine(rnd, res, out)
        self.seen.update(raw=raw, aligned=res.source_updates.clone(), gT=res.target_update.clone(),
                         weights=res.weights.clone(), agg=out.clone(), steps=list(res.source_steps),
                         target_steps=res.target_steps)
        return beta


def test_one_round_equals_hand_computation():
    """One FDA round (no warm-up) moves the global model by exactly (1 − β) g_T + β Σ w_i a_i g_i."""
    register_method(_Spy)
    try:
        run(rule="test_spy_fedda", beta=0.3, rounds=1, warmup_rounds=0)
        seen = _Spy.seen
        w, a, gT = seen["weights"], seen["aligned"], seen["gT"]
        torch.testing.assert_close(w, torch.full((2,), 0.5, device=w.device))  # equal-size sources
        torch.testing.assert_close(seen["agg"], 0.7 * gT + 0.3 * (w[:, None] * a).sum(0), rtol=1e-5, atol=1e-7)
    finally:
        methods._REGISTRY.pop("test_spy_fedda")
    captured = {}

    @register_method("test_spy_fedgp", label="Spy FedGP")
    def spy_fedgp(rnd, res):
        captured.update(aligned=res.aligned_source_updates().clone(), gT=res.target_update.clone())
        return aggregation.fedgp(res.aligned_source_updates(), res.target_update, 1.0, res.weights)

    try:
        run(rule="test_spy_fedgp", rounds=1, warmup_rounds=0)
        fedgp_run = run(rule="fedgp", beta=1.0, rounds=1, warmup_rounds=0)
        mine = run(rule="test_spy_fedgp", rounds=1, warmup_rounds=0)
        # the function form reproduces the built-in exactly (it records no β: the function returns only the update)
        assert [h["target_acc"] for h in mine["history"]] == [h["target_acc"] for h in fedgp_run["history"]]
        a, gT = captured["aligned"], captured["gT"]
        proj = sum(0.5 * max(float(gT @ ai), 0.0) / float(ai @ ai) * ai for ai in a)
        torch.testing.assert_close(aggregation.fedgp(a, gT, 1.0, torch.full((2,), 0.5, device=a.device)), proj, rtol=1e-4, atol=1e-7)
    finally:
        methods._REGISTRY.pop("test_spy_fedgp")


@pytest.mark.parametrize("alignment_steps", ["fractional", "taken"])
def test_alignment_factor(alignment_steps):
    """With align=True, source updates reach FedDA scaled by a_i = (lr_T/lr_S)·s_T/s_i (FedGP paper Eq. B.2):
    s = n/bs·epochs for 'fractional' (the paper's formula and its code), the steps taken ⌈n/bs⌉·epochs for
    'taken'; 240 source samples in batches of 32 make the two differ (7.5 vs 8 steps)."""
    register_method(_Spy)
    try:
        run(rule="test_spy_fedda", beta=0.5, rounds=1, warmup_rounds=0, source_lr=0.02, target_lr=0.005,
            method_options={"align": True}, alignment_steps=alignment_steps)
    finally:
        methods._REGISTRY.pop("test_spy_fedda")
    seen = _Spy.seen
    # 24 labelled target samples in batches of 6 (4 steps); 240 source samples in batches of 32 (8 steps)
    assert seen["steps"] == [8, 8] and seen["target_steps"] == 4
    if alignment_steps == "taken":
        expected = (0.005 / 0.02) * math.ceil(24 / 6) / math.ceil(240 / 32)
    else:
        expected = aggregation.magnitude_alignment(0.005, 0.02, 24, 6, [240, 240], 32)[0]
        assert expected == pytest.approx((0.005 / 0.02) * (24 / 6) / (240 / 32))
    torch.testing.assert_close(seen["aligned"], seen["raw"] * expected)
    assert seen["raw"].abs().max() > 0
    w, gT = seen["weights"], seen["gT"]
    torch.testing.assert_close(seen["agg"], 0.5 * gT + 0.5 * (w[:, None] * seen["raw"] * expected).sum(0),
                               rtol=1e-5, atol=1e-7)


def test_fedda_uses_raw_updates_by_default():
    """FedDA combines the source updates as sent (the reference code aligns only FedGP); align=True differs."""
    register_method(_Spy)
    try:
        raw = run(rule="test_spy_fedda", beta=0.5, rounds=1, warmup_rounds=0, source_lr=0.02, target_lr=0.005)
        seen = dict(_Spy.seen)
        aligned = run(rule="test_spy_fedda", beta=0.5, rounds=1, warmup_rounds=0, source_lr=0.02, target_lr=0.005,
                      method_options={"align": True})
    finally:
        methods._REGISTRY.pop("test_spy_fedda")
    torch.testing.assert_close(seen["aligned"], seen["raw"])  # nothing rescaled
    w = seen["weights"]
    torch.testing.assert_close(seen["agg"], 0.5 * seen["gT"] + 0.5 * (w[:, None] * seen["raw"]).sum(0),
                               rtol=1e-5, atol=1e-7)
    assert raw["history"][-1]["target_acc"] != aligned["history"][-1]["target_acc"] or \
        not torch.equal(seen["agg"], _Spy.seen["agg"])
    assert get_method("fedda", align=True).display_label == "FedDA (aligned)"


def test_auto_beta_lr_scaling_reference_collapses_beta():
    """The reference scripts' auto-β scaling (target parts × lr_T/lr_S, sources unscaled) equals the paper's
    definition with the target's parts scaled by (lr_T/lr_S)² (β is invariant to a common scale), so with
    lr_T < lr_S it puts β far lower; with lr_T = lr_S the two agree exactly."""
    common = dict(rounds=2, warmup_rounds=0, source_lr=0.02, target_lr=0.004)
    paper = run(rule="fedda_auto", **common)
    ref = run(rule="fedda_auto", method_options={"lr_scaling": "reference"}, **common)
    b_paper, b_ref = paper["history"][0]["beta"], ref["history"][0]["beta"]
    assert all(r < p for r, p in zip(b_ref, b_paper)), (b_ref, b_paper)
    same = dict(common, target_lr=0.02)
    assert run(rule="fedda_auto", **same)["history"][0]["beta"] == pytest.approx(
        run(rule="fedda_auto", method_options={"lr_scaling": "reference"}, **same)["history"][0]["beta"], rel=1e-5)


def test_auto_beta_lr_scaling_hand_computation():
    """'reference' scaling = the paper's estimator applied to target parts × (lr_T/lr_S)² (homogeneity)."""
    from fda_core.core.estimators import auto_beta
    gen = torch.Generator().manual_seed(0)
    parts, src = torch.randn(5, 40, generator=gen), torch.randn(3, 40, generator=gen)
    r = 0.2
    paper = auto_beta(parts / r, src, rule="fedda")  # paper: both at the source's lr
    ref = auto_beta(parts * r, src, rule="fedda")
    torch.testing.assert_close(ref, auto_beta(parts * r * r, src * r, rule="fedda"))  # β is scale-invariant
    torch.testing.assert_close(paper, auto_beta(parts, src * r, rule="fedda"))  # = the library's form
    assert (ref < paper).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 2 ** 31 - 1), st.floats(1e-3, 1e3), st.integers(2, 6))
def test_fedgp_auto_beta_does_not_depend_on_the_lr_scaling(seed, ratio, n_parts):
    """FedGP_Auto's β sees a source only through its direction (the projected target, docs/theory.md §
    Optimal weights) and is invariant to a common scale, so the reference scaling (target parts × r, sources as
    sent) and the paper's (sources × r) give the same β for any r > 0: row 7 of docs/reproduction.md moves
    FedDA_Auto only."""
    from fda_core.core.estimators import auto_beta
    gen = torch.Generator().manual_seed(seed)
    parts, src = torch.randn(n_parts, 30, generator=gen), torch.randn(2, 30, generator=gen)
    torch.testing.assert_close(auto_beta(parts * ratio, src, rule="fedgp"), auto_beta(parts, src * ratio, rule="fedgp"),
                               rtol=1e-4, atol=1e-6)


    paper = aggregation.magnitude_alignment(0.005, 0.02, 24, 6, [240, 240], 32)
    assert paper[0] == pytest.approx((0.005 / 0.02) * (24 / 6) / (240 / 32))


def test_auto_beta_recorded_per_source_and_round():
    res = run(rule="fedgp_auto", rounds=5)
    betas = [h["beta"] for h in res["history"] if h["phase"] == "fda"]
    assert len(betas) == 4 and all(len(b) == 2 for b in betas)
    tab = tables.beta_table([res])
    assert len(tab) == 8 and set(tab["source"]) == {"e1", "e2"}


def test_user_registered_rule_on_target_parts():
    def mean_of_all(source_grads, target_part_grads, weights=None):
        return 0.5 * target_part_grads.mean(0) + 0.5 * source_grads.mean(0)

    aggregation.register_rule("test_half_half", mean_of_all, uses_beta=False, uses_target_parts=True)
    try:
        res = run(rule="test_half_half")
        assert 0 <= res["final_target_acc"] <= 1
    finally:
        aggregation.RULES.pop("test_half_half")


def test_batchnorm_buffers_follow_the_target(monkeypatch):
    import fda_core.data.models as models

    def bn_net(name, input_shape, num_classes, seed=None, **kw):
        torch.manual_seed(seed or 0)
        return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                             nn.Linear(64, num_classes))

    monkeypatch.setattr(models, "get_model", bn_net)
    res = run(rule="fedgp", rounds=3)
    assert math.isfinite(res["final_target_acc"])


# --- determinism -------------------------------------------------------------------------------
def test_same_seed_same_numbers_and_seed_matters():
    a, b = run(rule="fedgp_auto", seed=3), run(rule="fedgp_auto", seed=3)
    assert a["history"] == b["history"]
    c = run(rule="fedgp_auto", seed=4)
    assert [h["beta"] for h in c["history"]] != [h["beta"] for h in a["history"]]


SHARING_METHODS = ["source_only", "finetune_offline", "fedda", "fedgp", "fedda_auto", "fedgp_auto", "target_only",
                   "target_only(warmup=True)", "oracle", "fedgp(beta=1.0)", "ditto"]


def _bn_net(name, input_shape, num_classes, seed=None, **kw):
    torch.manual_seed(seed or 0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(),
                         nn.Linear(64, num_classes))


@pytest.mark.parametrize("batchnorm", [False, True])
def test_runs_of_a_sweep_share_their_fedavg_rounds_with_the_same_results(monkeypatch, batchnorm):
    """Within shared_rounds.sharing(), Source only's rounds, Finetune_Offline's and every FDA method's warm-up are
    computed once per config and the other runs start from the snapshot: every result (histories with their phases,
    β, learning rates, final accuracies) is the same as when every round is computed, with and without BatchNorm
    statistics; a method that changes the rounds (Oracle, Target only from the start, Ditto) shares nothing."""
    if batchnorm:
        import fda_core.data.models as models

        monkeypatch.setattr(models, "get_model", _bn_net)
    from fda_core.experiments import shared_rounds

    ds = Blobs()
    cfgs, _ = federated.sweep_configs({**BASE, "warmup_rounds": 2, "rounds": 5, "lr_decay": 0.5}, SHARING_METHODS,
                                      seeds=(0, 1))

    def sweep(share):
        with shared_rounds.sharing(share):
            return [run_experiment(_dataset=ds, **c) for c in cfgs]

    shared, every = sweep(True), sweep(False)
    for a, b in zip(shared, every):
        assert a["history"] == b["history"] and a["final_target_acc"] == b["final_target_acc"], a["method"]
        assert b["shared_rounds"] == 0
    got = {(r["method"], r["config"]["seed"]): r["shared_rounds"] for r in shared}
    expected = {"Source only": 0, "Finetune_Offline": 5, "FedDA": 2, "FedGP": 2, "FedDA_Auto": 2, "FedGP_Auto": 2,
                "Target only": 0, "Target only (after warm-up)": 2, "Oracle": 0, "FedGP (β=1)": 2, "Ditto": 0}
    assert got == {(m, s): k for m, k in expected.items() for s in (0, 1)}
    assert [h["phase"] for h in shared[4]["history"]][:3] == ["warmup", "warmup", "fda"]
    # another data set object, or another config, finds no snapshot
    with shared_rounds.sharing():
        run_experiment(_dataset=ds, **cfgs[0])
        assert run_experiment(_dataset=Blobs(), **cfgs[2])["shared_rounds"] == 0
        assert run_experiment(_dataset=ds, **{**cfgs[2], "source_lr": 0.03})["shared_rounds"] == 0
        assert run_experiment(_dataset=ds, **cfgs[2])["shared_rounds"] == 5
    assert run_experiment(_dataset=ds, **cfgs[2])["shared_rounds"] == 0  # outside sharing(): every round


def test_a_method_that_changes_its_rounds_shares_none_unless_it_says_so():
    """shareable_rounds: a subclass that overrides a round, the server step, the local objective or a hook keeps
    nothing of another run's rounds; one that only changes the combination (FedGP's subclass below) keeps the
    warm-up."""
    from fda_core.experiments.shared_rounds import shareable_rounds

    c = make_config(rounds=6, warmup_rounds=2)

    class Combined(methods.FedGP):
        def combine(self, rnd, res, out):
            return super().combine(rnd, res, out)

    class OwnLoss(methods.FedGP):
        def local_loss(self, model, x, y, client):
            return super().local_loss(model, x, y, client)

    class OwnRound(methods.Method):
        def configure_round(self, rnd):
            return super().configure_round(rnd)

    class Hooked(methods.Method):
        def after_round(self, rnd, run):
            pass

    assert shareable_rounds(Combined(), c) == 2 and shareable_rounds(methods.Method(), c) == 6
    assert [shareable_rounds(m(), c) for m in (OwnLoss, OwnRound, Hooked)] == [0, 0, 0]


def test_run_many_shares_rounds_by_default_and_not_when_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(federated, "run_experiment",
                        lambda real=federated.run_experiment, **cfg: real(_dataset=_SHARED_BLOBS, **cfg))
    cfgs = [{**BASE, "rounds": 3, "warmup_rounds": 1, "rule": m} for m in ("source_only", "finetune_offline", "fedgp")]
    on = run_many(cfgs, progress=False)
    off = run_many(cfgs, progress=False, share_rounds=False)
    assert [r["shared_rounds"] for r in on] == [0, 3, 1] and [r["shared_rounds"] for r in off] == [0, 0, 0]
    assert [r["history"] for r in on] == [r["history"] for r in off]
    with pytest.raises(ValueError, match="share_rounds"):
        run_many(cfgs, progress=False, share_rounds="yes")


_SHARED_BLOBS = Blobs()


def test_shared_rounds_keep_the_targets_noise_of_every_round():
    """Notebook 05's noisy target (noise drawn anew every round, and every fine-tuning epoch): runs that start from
    another run's rounds draw the same noise in the rounds they compute, so their results are those of every round."""
    kw = dict(dataset="NoisyFeatures", dataset_options={"noise_std": 0.4, "noise_draw": "per_round"}, rounds=3,
              warmup_rounds=1, model="mlp", n_target_labeled=40, target_batch_size=8, source_lr=0.01, lr_decay=0.1)
    cfgs = [{**kw, "rule": m} for m in ("source_only", "finetune_offline", "fedgp", "fedda_auto")]
    on, off = run_many(cfgs, progress=False), run_many(cfgs, progress=False, share_rounds=False)
    assert [r["shared_rounds"] for r in on] == [0, 3, 1, 1]
    assert [r["history"] for r in on] == [r["history"] for r in off]


# --- bad input -----------------------------------------------------------------------------------
@pytest.mark.parametrize("cfg, word", [
    ({"beta": 1.5}, "beta"), ({"rounds": 0}, "rounds"), ({"rule": "fedxx"}, "rule"), ({"optimizer": "lbfgs"}, "optimizer"),
    ({"projection": "oblique"}, "projection"), ({"bogus": 1}, "bogus"), ({"source_lr": -1.0}, "source_lr"),
    ({"n_target_labeled": 0}, "n_target_labeled"), ({"target_fraction": 1.5}, "target_fraction"),
    ({"rounds": 2.5}, "rounds"), ({"device": "tpu"}, "device"),
])
def test_bad_config_names_the_key(cfg, word):
    with pytest.raises(ValueError, match=word):
        make_config(**cfg)


def test_auto_rule_needs_two_target_batches():
    with pytest.raises(ValueError, match="target_batch_size"):
        run(rule="fedgp_auto", n_target_labeled=6, target_batch_size=6)


def test_diverging_training_is_reported():
    with pytest.raises(FloatingPointError, match="client"):
        run(rule="fedgp", source_lr=1e30, optimizer="sgd")


# --- the store: skip finished runs, resume an interrupted sweep -----------------------------------
def test_run_many_resumes_from_store(tmp_path, monkeypatch):
    calls = []
    real = federated.run_experiment

    def counting(**cfg):
        calls.append(cfg["rule"])
        return real(_dataset=Blobs(), **cfg)

    monkeypatch.setattr(federated, "run_experiment", counting)
    cfgs = [{**BASE, "rounds": 2, "rule": m} for m in ("fedgp", "fedda", "target_only")]
    labels = [{"method": m} for m in ("FedGP", "FedDA", "Target only")]

    def interrupt(res):
        if res["labels"]["method"] == "FedDA":
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_many(cfgs, store=tmp_path, experiment="t", progress=False, labels=labels, on_result=interrupt)
    assert calls == ["fedgp", "fedda"]
    assert len(list((tmp_path / "t").glob("*.json"))) == 2  # both finished runs were saved before the stop
    calls.clear()
    out = run_many(cfgs, store=ResultStore(tmp_path), experiment="t", progress=False, labels=labels)
    assert calls == ["target_only"]  # only the missing run is computed
    assert [r["labels"]["method"] for r in out] == ["FedGP", "FedDA", "Target only"]
    table = tables.results_table(out)
    fmt, mean, _ = tables.summary_table(table, by=("method",), across="target")
    assert set(mean.index) == {"FedGP", "FedDA", "Target only"} and "Avg" in mean.columns


def test_run_many_refuses_what_a_run_would_refuse_before_the_first_run(tmp_path, monkeypatch):
    """A labelled count above the target's train pool, an unknown target or a data set that cannot be built stops the
    sweep before any run (they used to stop it when that run started, after the earlier ones: notebook 05 at paper
    scale, run 405 of 649 on a GPU)."""
    calls = []
    monkeypatch.setattr(federated, "run_experiment", lambda **cfg: calls.append(cfg) or {})
    base = {**BASE, "rounds": 1, "rule": "fedgp", "dataset": "NoisyFeatures", "target": None, "train_fraction": 0.5}
    ok = [{**base, "n_target_labeled": n} for n in (1, 250)]  # MNIST-5k: 500 target images, a pool of 250
    with pytest.raises(ValueError) as info:
        run_many([*ok, {**base, "n_target_labeled": 251}], store=tmp_path, experiment="p", progress=False)
    assert str(info.value) == (
        "run 3 of 3 of 'p' (rule 'fedgp', dataset 'NoisyFeatures', target None, seed 0): n_target_labeled must be an "
        "integer in [1, 250] (the train pool of target 'target' of 'NoisyFeatures': train_fraction 0.5 of its 500 "
        "examples), got 251; nothing has run yet")
    assert calls == [] and not (tmp_path / "p").exists()
    with pytest.raises(ValueError, match=r"run 2 of 2 .*: target: env must be .*'\+90%'.*got 'nowhere'"):
        run_many([{**BASE, "dataset": "ColoredMNIST"}, {**BASE, "dataset": "ColoredMNIST", "target": "nowhere"}],
                 progress=False)
    with pytest.raises(ValueError, match=r"noise_std") as info:
        run_many([{**base, "dataset_options": {"noise_std": -1.0}}], progress=False)
    assert "building the data set of run 1 of 1" in "\n".join(info.value.__notes__)
    assert calls == []
    run_many(ok + [{**base, "target_fraction": 1.0}], progress=False)  # every count of the pool, and all of it
    assert [c["n_target_labeled"] for c in calls] == [1, 250, None]



@settings(max_examples=50, deadline=None)
@given(options=st.dictionaries(st.sampled_from(["noise_std", "seed", "base", "n"]),
                               st.one_of(st.integers(-3, 3), st.floats(0, 1), st.sampled_from(["mnist", "fashion"])),
                               min_size=1))
def test_dataset_key_is_one_per_data_set_whatever_the_options_order(options):
    """:func:`federated.dataset_key`, by which a sweep builds each data set once (``check_configs_fit_data``) and a
    note counts the data sets its runs use (``reports.data_description``): the options' order does not matter;
    another data set name or any changed option gives another key."""
    key = federated.dataset_key({"dataset": "NoisyFeatures", "dataset_options": options})
    reordered = dict(reversed(list(options.items())))
    assert federated.dataset_key({"dataset": "NoisyFeatures", "dataset_options": reordered, "seed": 9}) == key
    assert federated.dataset_key({"dataset": "LabelShift", "dataset_options": options}) != key
    name = next(iter(options))
    changed = {**options, name: [options[name]]}
    assert federated.dataset_key({"dataset": "NoisyFeatures", "dataset_options": changed}) != key
    assert federated.dataset_key({"dataset": "NoisyFeatures", "dataset_options": {**options, "extra": 1}}) != key

# --- the method registry -------------------------------------------------------------------------
def test_registry_names_labels_and_variants():
    assert list_methods()[:8] == ["source_only", "target_only", "fedda", "fedgp", "fedda_auto", "fedgp_auto",
                                  "finetune_offline", "oracle"]
    assert [get_method(n).display_label for n in list_methods()[:8]] == [
        "Source only", "Target only", "FedDA", "FedGP", "FedDA_Auto", "FedGP_Auto", "Finetune_Offline", "Oracle"]
    m = get_method("fedgp", beta=1.0, projection="cosine")
    assert m.display_label == "FedGP (β=1, cosine)" and m.spec == "fedgp(beta=1.0, projection='cosine')"
    assert get_method(m.spec).option_values == m.option_values  # a spec round-trips
    # former names are options of one method now
    assert get_method("fedgp_cosine").option_values == get_method("fedgp", projection="cosine").option_values
    assert get_method("fedgp_nofilter").display_label == "FedGP (no filter)"
    assert make_config(rule="fedgp_nofilter")["rule"] == "fedgp"
    with pytest.raises(ValueError, match="rule must be one of .*fedgp_auto"):
        get_method("fedgpx")
    with pytest.raises(ValueError, match="beta must be a finite number in \\[0, 1\\]"):
        get_method("fedda", beta=2)
    with pytest.raises(ValueError, match="no option"):
        get_method("source_only", beta=0.5)
    with pytest.raises(ValueError, match="malformed method spec"):
        get_method("fedgp(0.5)")
    with pytest.raises(ValueError, match="taken by the built-in"):
        register_method("fedgp")(lambda rnd, res: res.target_update)


def test_a_method_defined_in_a_cell_runs_through_run_experiment_and_run_many(tmp_path):
    """The README's example: a user method in a few lines, found by name by run_experiment and run_many."""

    @register_method
    class HalfWay(FDAMethod):
        name, label = "test_halfway", "Half-way"

        def combine(self, rnd, res, out):
            aggregation.fedda(res.source_updates, res.target_update, 0.5, res.weights, out=out)

    try:
        mine = run(rule="test_halfway")
        assert mine["history"][-1]["phase"] == "fda" and mine["method"] == "Half-way"
        # it is FedDA with β = 0.5 (the same numbers), and its β is not recorded (combine returned None)
        assert [h["target_acc"] for h in mine["history"]] == [h["target_acc"] for h in run(rule="fedda")["history"]]
        cfg = {**BASE, "rule": "test_halfway"}
        out = run_many([cfg], store=tmp_path, experiment="cell", progress=False)
        assert out[0]["method"] == "Half-way" and len(list((tmp_path / "cell").glob("*.json"))) == 1
    finally:
        methods._REGISTRY.pop("test_halfway")


def test_local_objective_is_the_methods():
    """A method's local_loss is what clients minimise: a zero loss leaves every client where it started."""

    @register_method
    class Frozen(FedDA):
        name, label = "test_frozen", "Frozen"

        def local_loss(self, model, x, y, client):
            return 0.0 * model(x).sum()

    try:
        res = run(rule="test_frozen", rounds=2, warmup_rounds=0)
        assert len({h["target_acc"] for h in res["history"]}) == 1  # the global model never moves
    finally:
        methods._REGISTRY.pop("test_frozen")


def test_a_stale_code_run_is_not_reused(tmp_path):
    """run_many reuses a stored run only when the method's code is unchanged: redefining a user method
    (same name, new body) recomputes its runs instead of serving the old ones."""
    def define(scale):
        @register_method
        class Scaled(FDAMethod):
            name, label = "test_scaled", "Scaled"

            def combine(self, rnd, res, out, _scale=scale):
                out.copy_(res.target_update * _scale)

        return Scaled

    cfg = {**BASE, "rule": "test_scaled", "rounds": 2}
    store = ResultStore(tmp_path)
    try:
        define(1.0)
        first = run_many([cfg], store=store, experiment="s", progress=False)
        again = run_many([cfg], store=store, experiment="s", progress=False)
        assert again[0]["history"] == first[0]["history"] and store.counts["s"]["reused"] == 1

        @register_method
        class Scaled(FDAMethod):  # edited in the "notebook": a different body under the same name
            name, label = "test_scaled", "Scaled"

            def combine(self, rnd, res, out):
                out.copy_(res.target_update * 0.0)

        store2 = ResultStore(tmp_path)
        out = run_many([cfg], store=store2, experiment="s", progress=False)
        assert store2.counts["s"] == {"reused": 0, "computed": 1, "stale": 1}
        assert len({h["target_acc"] for h in out[0]["history"] if h["phase"] == "fda"}) == 1  # frozen by ĝ = 0
    finally:
        methods._REGISTRY.pop("test_scaled")


def test_a_users_aggregation_rule_is_part_of_the_code_revision():
    """A rule registered in core.aggregation (not a method) runs through a RuleMethod; editing the rule's
    body changes the revision the store checks, so its old runs are not reused."""
    def half(source_grads, target_part_grads, weights=None):
        return 0.5 * target_part_grads.mean(0)

    def quarter(source_grads, target_part_grads, weights=None):
        return 0.25 * target_part_grads.mean(0)

    try:
        aggregation.register_rule("test_edited_rule", half, uses_beta=False, uses_target_parts=True)
        before = federated.code_revision_of("test_edited_rule")
        aggregation.register_rule("test_edited_rule", quarter, uses_beta=False, uses_target_parts=True)
        assert federated.code_revision_of("test_edited_rule") != before
        assert federated.code_revision_of("fedgp") == federated.code_revision_of("fedda")  # package code only
    finally:
        aggregation.RULES.pop("test_edited_rule")


def test_setting_note_does_not_depend_on_key_order():
    """A run computed now (config in resolution order) and the same run read back from the store (JSON with
    sorted keys) give the same CSV note: regenerating from a partly filled store is byte-identical."""
    import json

    fresh = [{"method": "FedGP", "config": {"rounds": 8, "seed": s, "rule": "fedgp", "device": "cpu",
                                            "method_options": {"projection": "cosine", "beta": 0.5},
                                            "dataset_options": {"noise_std": 0.4, "data_root": None}}}
             for s in (0, 1)]
    stored = json.loads(json.dumps(fresh, sort_keys=True))
    assert list(stored[0]["config"]) != list(fresh[0]["config"])  # the orders differ ...
    note = tables.setting_note(fresh)
    assert note == tables.setting_note(stored)  # ... the notes do not
    assert "same for every run: dataset_options={data_root: None, noise_std: 0.4}, rounds=8" in note
    assert "varies: seed in [0, 1]" in note and "fedgp{beta: 0.5, projection: cosine}" in note


def test_a_batchnorm_model_on_batches_of_one_image_is_warned_about_before_training():
    """docs/reproduction.md row 10: a one-image batch gives mnist_cnn with BatchNorm constant features, so the engine
    warns, naming the batch-size key, before any training; GroupNorm (the default) and batches of 2+ do not warn."""
    import warnings

    def warned(**setting):
        c = make_config(model="mnist_cnn", rule="fedgp_auto", rounds=1, source_fraction=0.05, **setting)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            federated.Run(c, get_method(c["rule"]))
        return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    batch = {"model_options": {"norm": "batch"}}
    (message,) = warned(target_batch_size=1, **batch)
    assert "target_batch_size=1" in message and "every batch" in message and "GroupNorm" in message
    (message,) = warned(target_batch_size=17, n_target_labeled=18, **batch)  # 18 = 17 + a last batch of one
    assert "target_batch_size=17" in message and "last batch of each epoch (18 samples)" in message
    assert warned(target_batch_size=1) == []  # GroupNorm
    assert warned(target_batch_size=4, **batch) == []  # 18 = 4·4 + 2


def test_input_noise_is_drawn_anew_every_round_on_the_target():
    """A dataset's input_noise (NoisyFeatures with noise_draw="per_round", docs/reproduction.md row 14): the engine
    makes the target's images clean + N(0, std²) noise drawn anew each round from the seed's stream, in place (so the
    unlabelled view follows), reproducibly; runs are deterministic and differ from the noise drawn once; Flower,
    which cannot redraw it, refuses such a run by name."""
    opts = {"noise_std": 0.4, "noise_draw": "per_round"}
    c = make_config(dataset="NoisyFeatures", dataset_options=opts, rule="fedgp", rounds=2, warmup_rounds=0,
                    model="mlp", n_target_labeled=40, target_batch_size=8, source_lr=0.01)
    r = federated.Run(c, get_method("fedgp"))
    clean, t = r.target["clean"], r.target
    first = {k: t[k].clone() for k in clean}
    for k in clean:
        noise = first[k] - clean[k]
        assert abs(noise.std().item() - 0.4) < 0.02 and abs(noise.mean().item()) < 0.01, k
    r.refresh_input_noise(1)
    assert not torch.equal(t["x_test"], first["x_test"]) and torch.equal(t["x_unlab"], t["x_train"][40:])
    again = t["x_lab"].clone()
    r.refresh_input_noise(1)
    assert torch.equal(t["x_lab"], again)  # the same round's draw again
    r.refresh_input_noise(0)
    assert all(torch.equal(t[k], first[k]) for k in clean)
    kw = dict(dataset="NoisyFeatures", rule="fedgp", rounds=2, warmup_rounds=0, model="mlp", n_target_labeled=40,
              target_batch_size=8, source_lr=0.01)
    a, b = (run_experiment(dataset_options=opts, **kw) for _ in range(2))
    assert a["history"] == b["history"]
    once = run_experiment(dataset_options={"noise_std": 0.4}, **kw)
    assert once["history"] != a["history"]
    pytest.importorskip("flwr")
    from fda_core.experiments.flower.client_app import NodeData

    with pytest.raises(ValueError, match="noise_draw='per_round'.*only the in-process loop"):
        NodeData(c)


def test_a_held_out_test_set_tests_the_target_and_its_whole_client_trains(tmp_path, monkeypatch):
    """NoisyFeatures(test_per_class=k) (docs/reproduction.md row 19): the engine tests the target on the data set's
    held-out images, draws the labelled examples from its whole client (train_fraction does not apply; the sweep's
    check allows all 470 and names the held-out set at 471), redraws the held-out images' noise every round with
    noise_draw="per_round", and runs deterministically."""
    opts = {"noise_std": 0.4, "noise_draw": "per_round", "test_per_class": 30}
    kw = dict(dataset="NoisyFeatures", dataset_options=opts, rule="fedgp", rounds=2, warmup_rounds=0, model="mlp",
              target_batch_size=8, source_lr=0.01, train_fraction=0.5)
    ds = get_dataset("NoisyFeatures", **opts)
    r = federated.Run(make_config(n_target_labeled=40, **kw), get_method("fedgp"))
    t = r.target
    assert torch.equal(t["clean"]["x_test"], ds.held_out_test[9][0]) and torch.equal(t["y_test"], ds.held_out_test[9][1])
    assert t["x_train"].shape[0] == 470 and t["x_lab"].shape[0] == 40  # all 470 of the target's client
    noise = t["x_test"] - t["clean"]["x_test"]
    assert abs(noise.std().item() - 0.4) < 0.02
    r.refresh_input_noise(1)
    assert not torch.equal(t["x_test"] - t["clean"]["x_test"], noise)
    a, b = (run_experiment(n_target_labeled=40, **kw) for _ in range(2))
    assert a["history"] == b["history"] and a["n_target_test"] == 300 and a["n_target_labeled"] == 40
    plain = run_experiment(n_target_labeled=40, **{**kw, "dataset_options": {"noise_std": 0.4, "noise_draw": "per_round"}})
    assert plain["n_target_test"] == 250 and plain["history"] != a["history"]
    calls = []
    monkeypatch.setattr(federated, "run_experiment", lambda **cfg: calls.append(cfg) or {})
    base = {**BASE, **kw, "target": None}
    with pytest.raises(ValueError) as info:
        run_many([{**base, "n_target_labeled": 470}, {**base, "n_target_labeled": 471}], store=tmp_path,
                 experiment="p", progress=False)
    assert "n_target_labeled must be an integer in [1, 470] (the train pool of target 'target' of 'NoisyFeatures': all (the data " \
           "set holds its test set apart) of its 470 examples), got 471; nothing has run yet" in str(info.value)
    assert calls == []


@pytest.mark.parametrize("spec, rule", [("fedgp(projection='exact_layerwise')", "fedgp"),
                                        ("fedgp(projection='cosine')", "fedgp_cosine"), ("fedda", "fedda"),
                                        ("fedda(align=True)", "fedda")])
def test_fixed_beta_methods_pass_beta_and_weights_as_python_numbers(spec, rule):
    """The engine hands a fixed β and the FedAvg weights to the rule as Python numbers, which the rule checks on the
    host: as device tensors each of their checks would be a host synchronisation on a GPU. The weights are the
    engine's own, n_i / Σ n_i (as floats of the run's dtype)."""
    from unittest import mock

    seen = []
    real = getattr(aggregation, rule)

    def spy(sources, target, beta, weights=None, *args, **kwargs):
        seen.append((beta, weights))
        return real(sources, target, beta, weights, *args, **kwargs)

    with mock.patch.object(aggregation, rule, spy):
        run(rule=spec, rounds=2)
    assert seen and all(type(b) is float and b == 0.5 for b, _ in seen)
    assert all(type(w) is list and all(type(x) is float for x in w) for _, w in seen)
    assert all(w == pytest.approx([0.5, 0.5]) and w == seen[0][1] for _, w in seen)


def _round_results(seed: int, a: tuple[float, float]):
    """A round of 2 sources with alignment factors ``a`` (a_i = (target steps · lr_T) / (source steps · lr_S) with
    the steps given), 3 target parts, m = 5."""
    from fda_core.experiments.methods.interface import RoundResults

    g = torch.Generator().manual_seed(seed)
    src, parts = torch.randn(2, 5, generator=g, dtype=torch.float64), torch.randn(3, 5, generator=g, dtype=torch.float64)
    layout = [("w", 0, 5, torch.Size([5]))]

    def as_dict(v):
        return {name: v[o:o + k].view(shape) for name, o, k, shape in layout}

    return RoundResults(source_updates=src.clone(), source_steps=[4, 6], weights=torch.tensor([0.4, 0.6], dtype=torch.float64),
                        source_buffers=[{}, {}], target_update=parts.sum(0), target_params=parts.sum(0),
                        target_parts=parts, target_steps=3, target_buffers={}, lr_source=1e-3, lr_target=2e-4,
                        scratch=torch.empty(5, dtype=torch.float64), as_dict=as_dict,
                        as_dicts=lambda rows: [as_dict(r) for r in rows],
                        source_alignment_steps=[3 * 2e-4 / (a[0] * 1e-3), 3 * 2e-4 / (a[1] * 1e-3)],
                        target_alignment_steps=3), src


def test_fedda_auto_combines_the_updates_as_sent_by_default():
    """FedDA_Auto (reference scripts' ``update_global_convex``): Σ w_i [(1 − β_i) g_T + β_i g_i] with g_i as sent
    (``align=False``, the default and the reference variant); ``align=True`` (the library variant) scales g_i by a_i
    first. β comes from the same estimate either way. On the old code the default aligned the updates."""
    from fda_core.core.estimators import auto_beta
    from fda_core.experiments.methods.registry import with_variant

    assert with_variant("fedda_auto", "reference") == {"fedda_auto": {"align": False}}
    assert with_variant("fedda_auto", "library") == {"fedda_auto": {"align": True}}
    info = federated.RoundInfo(1, 1, False, 1e-3, 2e-4, {})
    for align in (False, True):
        res, src = _round_results(0, (0.25, 3.0))
        factors = res.alignment_factors()
        assert torch.allclose(factors, torch.tensor([0.25, 3.0], dtype=torch.float64))
        beta = auto_beta(res.target_parts, res.source_per_batch_updates(), rule="fedda")
        res, src = _round_results(0, (0.25, 3.0))
        theta = torch.zeros(5, dtype=torch.float64)
        get_method("fedda_auto", align=align).aggregate(info, res, theta)
        g_i = src * factors[:, None] if align else src
        w, g_t = torch.tensor([0.4, 0.6], dtype=torch.float64), res.target_update
        hand = sum(w[i] * ((1 - beta[i]) * g_t + beta[i] * g_i[i]) for i in range(2))
        assert torch.allclose(theta, hand, atol=1e-12), align


def test_fedgp_cosine_without_the_filter_keeps_the_signed_cosine():
    """FedGP(projection='cosine', filter=False), the filter's ablation in the papers' rule (FedGP paper Table 4):
    Σ w_i [(1 − β) g_T + β a_i cos(g_T, g_i) g_i] with the signed cosine, on the aligned updates; with the filter a
    source whose cosine is negative adds nothing. Seed 1 gives one source of each sign."""
    info = federated.RoundInfo(1, 1, False, 1e-3, 2e-4, {})
    assert get_method("fedgp", projection="cosine", filter=False).display_label == "FedGP (cosine, no filter)"
    results = {}
    for keep in (False, True):
        res, src = _round_results(1, (0.25, 3.0))
        theta = torch.zeros(5, dtype=torch.float64)
        get_method("fedgp", projection="cosine", filter=not keep, beta=0.5).aggregate(info, res, theta)
        results[keep] = theta
    g_t, w, a = res.target_update, torch.tensor([0.4, 0.6], dtype=torch.float64), (0.25, 3.0)
    cos = [float(torch.dot(g_t, src[i]) / (g_t.norm() * src[i].norm())) for i in range(2)]
    assert min(cos) < 0 < max(cos), cos
    for keep, theta in results.items():
        hand = sum(w[i] * (0.5 * g_t + 0.5 * a[i] * (cos[i] if keep else max(cos[i], 0.0)) * src[i]) for i in range(2))
        assert torch.allclose(theta, hand, atol=1e-12), keep


def test_finetune_offline_draws_the_target_noise_anew_every_epoch():
    """Finetune_Offline under per-round input noise: every fine-tuning epoch (and its evaluation) sees a new draw,
    draw rounds + e, as the rounds do (docs/reproduction.md row 14); the old code fine-tuned every epoch on the
    last round's draw. Without input noise nothing changes."""
    opts = {"noise_std": 0.4, "noise_draw": "per_round"}
    c = make_config(dataset="NoisyFeatures", dataset_options=opts, rule="finetune_offline", rounds=2, warmup_rounds=0,
                    model="mlp", n_target_labeled=40, target_batch_size=8, source_lr=0.01)
    r = federated.Run(c, get_method("finetune_offline"))
    seen = []
    train_target = r.train_target

    def spy(**kw):
        seen.append(r.target["x_lab"].sum().item())
        return train_target(**kw)

    r.train_target = spy
    for k in (1, 2):
        r.round(k)
    r.method.after_training(r)
    assert len(seen) == 2 and seen[0] != seen[1]  # two fine-tuning epochs, two draws
    expected = []
    for e in (1, 2):
        r.refresh_input_noise(c["rounds"] + e)
        expected.append(r.target["x_lab"].sum().item())
    assert seen == expected
