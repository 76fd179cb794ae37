"""Every notebook's ``paper_scale`` setting is checked on the CPU without running it: its parameters cell and
its derived-values cell (the code cell after it) execute with ``paper_scale=True``, so a paper-scale setting that
cannot run (a count larger than the data holds, a missing data folder) fails here, in seconds, with the clear
error the notebook gives before any work starts, not minutes into a GPU lease (notebook 05's Table-3 counts
500 and 1000 against MNIST-5k's pool of 250 did, on an H200 on 2026-11-27)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from fda_core.workbook.parameters import notebook_parameters

ROOT = Path(__file__).resolve().parent.parent
PAPER_SCALE = [p for p in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
               if "paper_scale" in notebook_parameters(p)]
#: notebooks whose paper scale needs the full data set under data_root: without one they must refuse at once
NEEDS_DATA_ROOT = {"04_real_data", "06_inb_translation"}

_RUNNER = r"""
import json, sys
import matplotlib
matplotlib.use("Agg")
import nbformat
nb = nbformat.read(sys.argv[1], as_version=4)
overrides = json.loads(sys.argv[2])
cells = [c for c in nb.cells if c.cell_type == "code"]
first = next(i for i, c in enumerate(cells) if "parameters" in c.metadata.get("tags", []))
ns = {}
exec(compile(cells[first].source, "parameters", "exec"), ns)
ns.update(overrides)
try:
    exec(compile(cells[first + 1].source, "derived values", "exec"), ns)
except Exception as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
else:
    print(json.dumps({k: ns[k] for k in json.loads(sys.argv[3]) if k in ns}, default=str))
"""


def derived(nb: Path, tmp_path: Path, keep: tuple[str, ...] = (), **overrides) -> dict:
    """Execute ``nb``'s parameters and derived-values cells with ``overrides`` in a fresh interpreter (the cells
    set matplotlib's style and build data sets); return the variables named in ``keep``, or the error."""
    params = notebook_parameters(nb)
    paths = {k: str(tmp_path / k) for k in ("figures_dir", "results_dir") if k in params}
    out = subprocess.run([sys.executable, "-c", _RUNNER, str(nb), json.dumps({**paths, **overrides}), json.dumps(keep)],
                         cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_notebooks_with_a_paper_scale_are_found():
    assert {p.stem for p in PAPER_SCALE} >= {"02_phase_diagram", "04_real_data", "05_semi_synthetic"} | NEEDS_DATA_ROOT


@pytest.mark.parametrize("nb", PAPER_SCALE, ids=lambda p: p.stem)
def test_paper_scale_settings_are_valid_before_any_work(nb, tmp_path):
    got = derived(nb, tmp_path, ("target_sample_counts", "target_sample_noises", "pool", "rounds", "trials"), paper_scale=True)
    if nb.stem in NEEDS_DATA_ROOT:
        assert got.get("error") == "ValueError" and "data_root" in got["message"], got
        return
    assert "error" not in got, f"{nb.stem} at paper scale: {got}"
    if nb.stem == "05_semi_synthetic":  # the paper's Table-3 counts 500 and 1000 are left out, the rest kept
        # MNIST-5k: 10 clients of 500 images, half of the target's in its train pool (docs/experiments.md)
        assert got["pool"] == 250
        assert got["target_sample_counts"] == [100, 200] and (got["rounds"], got["trials"]) == (50, 5)
        assert got["target_sample_noises"] == [0.2, 0.4, 0.6]  # Table 3's three noise levels


def test_notebook_05_refuses_counts_above_the_pool_by_name(tmp_path):
    nb = ROOT / "notebooks" / "05_semi_synthetic.ipynb"
    got = derived(nb, tmp_path, target_sample_counts=[25, 251])
    assert got["error"] == "ValueError" and "target_sample_counts" in got["message"] and "250" in got["message"], got
    for noises in ([0.4, -0.2], []):
        got = derived(nb, tmp_path, target_sample_noises=noises)
        assert got["error"] == "ValueError" and "target_sample_noises" in got["message"], got
    got = derived(nb, tmp_path, n_target_labeled=0)
    assert got["error"] == "ValueError" and "n_target_labeled" in got["message"], got
    got = derived(nb, tmp_path, data_seed="sometimes")
    assert got["error"] == "ValueError" and "data_seed" in got["message"] and "per_trial" in got["message"], got
    # the notes describe each file's first run's data set (with the first trial's seed: tests/test_reports.py) and say
    # that it is drawn anew per trial
    got = derived(nb, tmp_path, ("report",), data_seed="per_trial", seed=3)
    assert got["report"]["describe_data"] is True and "drawn anew per trial" in got["report"]["note"], got


def test_semi_synthetic_sweeps_run_the_scripts_setting(tmp_path):
    """Notebook 05's label-shift sweep and ablations run the reference scripts' setting by default (docs/reproduction.md
    row 17): 2 FedAvg warm-up rounds before ``rounds`` rounds, target lr 0.005, the auto rows' decay and target batches
    of 4, Target only after the warm-up (named as the paper's Target only beside its tables); the Oracle keeps its
    budget. "workbook" adds nothing; anything else is refused by name before any run."""
    nb = ROOT / "notebooks" / "05_semi_synthetic.ipynb"
    got = derived(nb, tmp_path, ("sweep", "sweep_aliases", "rounds"))
    sweep, rounds = got["sweep"], got["rounds"]
    assert (sweep["source_lr"], sweep["target_lr"]) == (0.01, 0.005)
    fedgp, auto, oracle = (sweep["per_method"][k] for k in ("fedgp", "fedgp_auto", "oracle"))
    assert (fedgp["warmup_rounds"], fedgp["rounds"], fedgp["lr_decay"], fedgp["target_batch_size"]) == (2, rounds + 2, 1.0, 16)
    assert (auto["warmup_rounds"], auto["lr_decay"], auto["target_batch_size"]) == (2, 0.1, 4)
    assert (oracle["warmup_rounds"], oracle["rounds"]) == (0, rounds)
    assert sweep["options"] == {"target_only": {"warmup": True}}  # no Oracle option: its 4 epochs at lr 0.003 stay
    assert got["sweep_aliases"] == {"Target only (after warm-up)": "Target only"}
    got = derived(nb, tmp_path, ("sweep", "sweep_aliases"), sweep_setting="workbook")
    assert got == {"sweep": {}, "sweep_aliases": {}}, got
    got = derived(nb, tmp_path, sweep_setting="scripts")
    assert got["error"] == "ValueError" and "sweep_setting" in got["message"] and "workbook" in got["message"], got


def test_semi_synthetic_label_shift_partition(tmp_path):
    """Notebook 05's label_shift_partition: "reference" (the default) builds the reference's imbalance-class-η clients,
    labels label_shift_fraction of the whole target and tests on the rest (main_noniid.py), and trains the Oracle on
    90 % of the target, tested on the other 10 % (oracle_noniid.py); "equal_size" keeps the configs of the runs
    committed before (clients of label_shift_client_size, label_shift_fraction of the target's train split labelled,
    the Oracle on the whole train split); anything else is refused by name before any run; so is a negative
    label_shift_images_per_class."""
    nb = ROOT / "notebooks" / "05_semi_synthetic.ipynb"
    names = ("label_shift_data", "label_shift_split", "label_shift_rows")
    assert derived(nb, tmp_path, names) == {
        "label_shift_data": {"partition": "reference"}, "label_shift_split": {"train_fraction": 0.15, "target_fraction": 1.0},
        "label_shift_rows": {"oracle": {"train_fraction": 0.9}}}
    assert derived(nb, tmp_path, names, label_shift_partition="equal_size") == {
        "label_shift_data": {"client_size": 300}, "label_shift_split": {"target_fraction": 0.15}, "label_shift_rows": {}}
    got = derived(nb, tmp_path, label_shift_partition="imbalance")
    assert got["error"] == "ValueError" and "label_shift_partition" in got["message"] and "equal_size" in got["message"], got
    # label_shift_images_per_class: a per-class subset first (6,000 on Fashion-MNIST: its training set's class sizes)
    got = derived(nb, tmp_path, names[:1], label_shift_images_per_class=400)
    assert got == {"label_shift_data": {"partition": "reference", "images_per_class": 400}}, got
    got = derived(nb, tmp_path, label_shift_images_per_class=-1)
    assert got["error"] == "ValueError" and "label_shift_images_per_class must be an integer" in got["message"], got


def test_beside_paper_names_a_row_by_its_alias():
    """A label the paper's code ran as one of our variants sits beside the paper's row of that name; others match by
    paper_label, and our labels stay."""
    import pandas as pd

    from fda_core.experiments.paper_numbers import SCRIPTS_TARGET_ONLY, paper_table
    from fda_core.workbook.reports import _beside_paper

    means = pd.DataFrame({0.45: [50.0, 60.0]}, index=["Target only (after warm-up)", "FedGP (cosine)"])
    paper = paper_table("LabelShift")[0.45]
    got = _beside_paper(means, "LabelShift", SCRIPTS_TARGET_ONLY)
    assert list(got.index) == list(means.index)
    assert got["paper 0.45"].tolist() == [paper["Target only"], paper["FedGP"]]
    assert pd.isna(_beside_paper(means, "LabelShift").loc["Target only (after warm-up)", "paper 0.45"])


def test_target_train_pool_is_labeled_splits_pool():
    """The pool the notebooks check counts against is labeled_split's: the largest n_labeled it accepts."""
    from fda_core.data.datasets import get_dataset, labeled_split
    from fda_core.workbook.reports import target_train_pool

    data = get_dataset("NoisyFeatures")  # MNIST-5k: 10 clients of 500
    assert target_train_pool(data, 0.5) == 250 and target_train_pool(data, 0.8) == 400
    assert target_train_pool(data, 0.5, "target") == 250 and target_train_pool(data, 0.5, 0) == 250
    labeled_split(500, n_labeled=250, train_fraction=0.5)  # the pool's size is accepted, one more is not
    with pytest.raises(ValueError, match=r"\[1, 250\]"):
        labeled_split(500, n_labeled=251, train_fraction=0.5)


def test_target_train_pool_resolves_the_target_as_a_run_does():
    """A leave-one-domain-out set has no default target: the pool is that of the named target, else of
    environment 0, as the engine resolves ``target``; an unknown target is refused by name."""
    import torch

    from fda_core.data.datasets import FDADataset, UnknownEnvironmentError
    from fda_core.workbook.reports import target_train_pool

    class Domains(FDADataset):  # three domains of 10, 40 and 6 examples, no default target
        ENVIRONMENTS = ["a", "b", "c"]

        def __init__(self):
            super().__init__()
            self.datasets = [(torch.zeros(n, 1), torch.zeros(n, dtype=torch.long)) for n in (10, 40, 6)]

    data = Domains()
    assert data.default_target is None
    assert target_train_pool(data, 0.5) == 5  # environment 0: 10 examples, half of them
    assert target_train_pool(data, 0.5, "b") == 20 and target_train_pool(data, 0.5, 2) == 3
    with pytest.raises(UnknownEnvironmentError, match="one of the environment names"):
        target_train_pool(data, 0.5, "d")


def test_counts_within_pool_by_hand(capsys):
    """Counts are checked against the pool by name; leave_out drops those above it (printing them) and checks the rest."""
    from fda_core.workbook.reports import counts_within_pool

    assert counts_within_pool([25, 100, 250], 250, "target_sample_counts") == [25, 100, 250]
    with pytest.raises(ValueError, match=r"target_sample_counts must be an integer in \[1, 250\], got 500"):
        counts_within_pool([100, 500], 250, "target_sample_counts")
    assert counts_within_pool([100, 200, 500, 1000], 250, "target_sample_counts", leave_out=True) == [100, 200]
    assert "[500, 1000]" in capsys.readouterr().out
    with pytest.raises(ValueError, match="n_target_labeled"):  # below the range is refused even when leaving out
        counts_within_pool([0], 250, "n_target_labeled", leave_out=True)
