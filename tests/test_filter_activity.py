"""How often FedGP's filter acts (fda_core.experiments.filter_activity): the per-layer cosines by hand, a recorder that
changes no bit of the run, and the config of Table 4's committed Fashion-MNIST runs."""

import math
from pathlib import Path

import pytest
import torch

from fda_core.common.files import read_note
from fda_core.experiments import filter_activity as fa
from fda_core.experiments.federated import run_experiment
from fda_core.experiments.tables import format_value
from test_federated import Blobs

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(target=0, model="mlp", rounds=4, warmup_rounds=1, n_target_labeled=24, target_batch_size=6,
             source_batch_size=32, source_lr=0.02, seed=0)


def test_layer_cosines_by_hand():
    # two segments (lengths 2 and 1); source 0 = (1, 0 | −2), source 1 = (0, 0 | 1); target (1, 1 | 3)
    S = torch.tensor([[1.0, 0.0, -2.0], [0.0, 0.0, 1.0]])
    t = torch.tensor([1.0, 1.0, 3.0])
    cos = fa.layer_cosines(S, t, [2, 1])
    # segment 0: cos((1,1),(1,0)) = 1/√2; source 1 is zero there: 0. Segment 1: sign(3·−2) = −1, sign(3·1) = 1
    torch.testing.assert_close(cos, torch.tensor([[1 / math.sqrt(2), -1.0], [0.0, 1.0]], dtype=torch.float64))
    with pytest.raises(ValueError, match=r"segments must be positive lengths summing to m = 3, got \[2, 2\]"):
        fa.layer_cosines(S, t, [2, 2])
    with pytest.raises(ValueError, match=r"sources must be \(N, m\) and target \(m,\), got \(2, 3\) and \(2,\)"):
        fa.layer_cosines(S, t[:2], [2, 1])


def test_filter_terms_are_the_rules_own_difference():
    """filter_change = ‖rule without the filter − FedGP‖ / ‖FedGP‖ and source_to_target = ‖FedGP − T‖ / ‖T‖ with
    T = (1 − Σ w_i β_i) t, from fedgp_cosine itself (β per source, weights, alignment)."""
    from fda_core.core.aggregation import fedgp_cosine

    gen = torch.Generator().manual_seed(1)
    S, t = torch.randn(3, 9, generator=gen, dtype=torch.float64), torch.randn(9, generator=gen, dtype=torch.float64)
    lengths, beta, w, a = [4, 2, 3], [0.5, 0.3, 0.8], [1.0, 2.0, 3.0], [0.5, 2.0, 1.5]
    cos = fa.layer_cosines(S, t, lengths)
    assert (cos < 0).any() and (cos > 0).any()
    terms = fa.filter_terms(S, t, lengths, beta, w, a)
    with_filter = fedgp_cosine(S, t, beta, w, a, segments=lengths)
    without = fedgp_cosine(S, t, beta, w, a, segments=lengths, filter_negative=False)
    target_term = (1 - sum(wi / 6 * bi for wi, bi in zip(w, beta))) * t
    assert terms["filter_change"] == pytest.approx(float((without - with_filter).norm() / with_filter.norm()))
    assert terms["source_to_target"] == pytest.approx(float((with_filter - target_term).norm() / target_term.norm()))
    one = fa.filter_terms(S, t, lengths, 0.5)  # one β, uniform weights, no alignment
    assert one["filter_change"] == pytest.approx(float(
        (fedgp_cosine(S, t, 0.5, segments=lengths, filter_negative=False) - fedgp_cosine(S, t, 0.5, segments=lengths)).norm()
        / fedgp_cosine(S, t, 0.5, segments=lengths).norm()))


@pytest.mark.parametrize("keep", [False, True])
def test_the_recorder_changes_no_bit_and_counts_the_negative_pairs(keep):
    """filter_activity runs the config as run_experiment does, to the last bit (with and without the filter), and
    records one row per aggregated round (the rounds after the warm-up) with shares in [0, 1] that the recorded
    cosines give; a run that never calls the cosine rule is refused."""
    config = {**SMALL, "rule": "fedgp", "method_options": {"projection": "cosine", "filter": not keep}}
    activity, result = fa.filter_activity(config, _dataset=Blobs(seed=1))
    plain = run_experiment(_dataset=Blobs(seed=1), **config)
    assert [h["target_acc"] for h in result["history"]] == [h["target_acc"] for h in plain["history"]]
    assert list(activity["round"]) == [1, 2, 3]  # 4 rounds, 1 of them warm-up
    assert activity["negative_pairs"].between(0, 1).all() and activity["negative_parameters"].between(0, 1).all()
    assert (activity["negative_pairs"] > 0).all()  # these blobs (seed 1) give the filter something to drop every round
    with fa.recording_cosines() as record:
        run_experiment(_dataset=Blobs(seed=1), **config)
    for (cos, lengths, _), row in zip(record, activity.itertuples()):
        assert row.pairs == cos.numel() == cos.shape[0] * len(lengths)
        assert row.negative_pairs == pytest.approx(float((cos < 0).double().mean()))
        by_entries = sum(k * int((cos[:, j] < 0).sum()) for j, k in enumerate(lengths)) / (sum(lengths) * cos.shape[0])
        assert row.negative_parameters == pytest.approx(by_entries)
        assert math.isnan(row.mean_negative_cos) or row.mean_negative_cos < 0 < row.mean_positive_cos
        assert row.filter_change >= 0 and row.source_to_target >= 0
    with pytest.raises(ValueError, match="config must run FedGP with projection='cosine'"):
        fa.filter_activity({**SMALL, "rule": "fedda"}, _dataset=Blobs(seed=1))


def test_table_4_config_is_the_committed_runs_setting():
    """table_4_config gives every setting that the note of Table 4's five-seed Fashion-MNIST file says its runs share,
    and the values that vary (noise, seed) as the file's runs of FedGP have them; its method is the cosine rule."""
    from fda_core.workbook.reproduction import _settings

    path = ROOT / "figures" / "05_semi_synthetic" / "fashion_mnist_projection_5_seeds" / "projection_filtering.csv"
    settings = _settings(read_note(path))
    config = fa.table_4_config(0.6, 3)
    same = {k: v for k, v in settings.items() if len(v) == 1}
    assert len(same) >= 15, same
    for key, values in same.items():
        assert format_value(config[key]) in values, key
    assert format_value(config["dataset_options"]) in settings["dataset_options"]
    assert config["method_options"] == {"beta": 0.5, "projection": "cosine", "filter": True}
    assert fa.table_4_config(0.6, 3, filter_negative=False)["method_options"]["filter"] is False
    with pytest.raises(ValueError, match="noise_std"):
        fa.table_4_config(-0.2, 0)
    with pytest.raises(ValueError, match="rounds"):
        fa.main(["--noise", "0.4", "--rounds", "0", "--out", "unused.csv"])
