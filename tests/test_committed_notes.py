"""The data description in the note of each committed notebook-05 CSV is of the data its own runs used.

Until 2026-12-02 notebook 05 wrote one description into every noisy-feature file: ``NoisyFeatures`` at noise 0.4
with the IID partition, whatever noise and partition the file's runs had, and the label-shift files described the
last η. Since then :func:`fda_core.workbook.reports.data_description` describes each file's first run. The
committed files made before are listed in :data:`STALE` with the command that remakes them (recomputing their
runs: from a few minutes to hours); their config lines ("same for every run", "varies") were always generated from
the runs and are right. The test fails when a file not listed describes other data than its runs', and when a
listed one has been remade (so the list shrinks as files are regenerated).
"""

import re
from pathlib import Path

import pytest

from fda_core.common.files import read_note

ROOT = Path(__file__).resolve().parent.parent
FOLDER = ROOT / "figures" / "05_semi_synthetic"

#: committed CSVs whose note describes other data than their runs' (module docstring), relative to FOLDER → the
#: run that remakes them
STALE = {
    "fashion_mnist_ablations_noise_0.6_xeon/target_samples.csv": "notebook 05's TABLE_3_NOISE_06_RUN on an Intel Xeon VM",
    **{f"fashion_mnist_finetune_freeze_xeon/{n}.csv": "docs/reproduction.md, Finetune_Offline's last-layer form"
       for n in ("source_labels", "source_labels_table")},
}


def _first(pattern: str, text: str) -> str | None:
    m = re.search(pattern, text)
    return m.group(1) if m else None


def mismatches(note: list[str]) -> list[str]:
    """How the data description in a CSV note differs from the data of the runs its config lines give (the first
    run's data set is the first one those lines list), as phrases; empty when it agrees or there is none."""
    config = "\n".join(line for line in note if line.startswith(("same for every run: ", "varies: ")))
    found = []
    for line in note:
        if line.startswith("NoisyFeatures (FedGP paper"):
            described, ran = _first(r"noise of std ([0-9.]+)", line), _first(r"noise_std: ([0-9.]+)", config)
            if described is not None and ran is not None and float(described) != float(ran):
                found.append(f"noise {described} described, {ran} in the first run")
            labels = _first(r"source_labels: (\d+)", config)
            if labels is not None and f"#C={labels} " not in line:
                found.append(f"sources of {labels} classes each ran, another partition described")
            held = _first(r"test_per_class: (\d+)", config)
            if (held is None) != ("held-out test set of the target" not in line) or (
                    held is not None and f"test set of the target ({int(held):,} images of each class" not in line):
                found.append("no held-out test set ran, one described" if held is None
                             else f"a held-out test set of {held} images per class ran, another described")
        elif line.startswith("LabelShift (FedGP paper"):
            described, ran = _first(r"η = ([0-9.]+);", line), _first(r"eta: ([0-9.]+)", config)
            if described is not None and ran is not None and float(described) != float(ran):
                found.append(f"η = {described} described, {ran} in the first run")
    return found


def test_the_check_finds_what_it_checks():
    """Hand-made notes: a described noise other than the first run's, a partition not described, an η."""
    same = "same for every run: dataset=NoisyFeatures, rounds=2"
    varies = "varies: dataset_options in [{base: mnist, noise_std: 0.6, seed: 0}, {base: mnist, noise_std: 0.2, seed: 0}]"
    noisy = "NoisyFeatures (FedGP paper Sec. 5.2 / App. B.4): MNIST-5k; IID equal partition into 10 clients; target inputs + Gaussian noise of std {}; seed 0."
    assert mismatches([same, varies, noisy.format(0.6)]) == []
    assert mismatches([same, varies, noisy.format(0.4)]) == ["noise 0.4 described, 0.6 in the first run"]
    quantity = varies.replace("seed: 0}", "seed: 0, source_labels: 3}")
    assert mismatches([same, quantity, noisy.format(0.6)]) == ["sources of 3 classes each ran, another partition described"]
    assert mismatches([same, quantity, noisy.format(0.6).replace("IID equal partition", "NIID-Bench's #C=3 label")]) == []
    held = varies.replace("seed: 0}", "seed: 0, test_per_class: 1000}")
    held_text = noisy.format(0.6).replace("10 clients;", "10 clients, cut from the base less a held-out test set of the "
                                          "target (1,000 images of each class, 10,000 in all);")
    assert mismatches([same, held, held_text]) == []
    assert mismatches([same, held, noisy.format(0.6)]) == ["a held-out test set of 1000 images per class ran, another described"]
    assert mismatches([same, varies, held_text]) == ["no held-out test set ran, one described"]
    assert mismatches([same, held.replace("1000", "500"), held_text]) != []
    shift = "LabelShift (FedGP paper Sec. 5.2): MNIST-5k; D1 = classes [6, 8, 9]; η = {}; seed 0."
    etas = "varies: dataset_options in [{base: mnist, eta: 0.45}, {base: mnist, eta: 0}]"
    assert mismatches([same, etas, shift.format(0.45)]) == []
    assert mismatches([same, etas, shift.format(0)]) == ["η = 0 described, 0.45 in the first run"]


@pytest.mark.parametrize("path", sorted(str(p.relative_to(FOLDER)) for p in FOLDER.rglob("*.csv")))
def test_each_committed_note_describes_its_own_runs_data(path):
    found = mismatches(read_note(FOLDER / path))
    if path in STALE:
        assert found, (f"{path} now describes its own runs' data: drop it from STALE")
    else:
        assert not found, (f"the note of {path} describes other data than its runs': {'; '.join(found)} (a file made "
                           "before notebook 05 described each file's first run? list it in STALE)")


def test_every_stale_file_is_committed():
    missing = sorted(p for p in STALE if not (FOLDER / p).is_file())
    assert not missing, f"STALE lists files that are not committed: {missing}"
