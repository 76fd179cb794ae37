"""Published numbers of the FedGP, auto-weighted FDA, Fed INB and healthcare papers, for side-by-side comparison only.

These are the papers' numbers, copied from their tables and text (the source named per entry); the
workbook's own numbers are always computed by code. :data:`PAPER` holds tables (accuracies in %, and the
Fed INB paper's iteration counts); :data:`INB_PAPER` the Fed INB paper's single numbers and its setting.
Rows are keyed by the workbook's display labels of the methods
(:mod:`fda_core.experiments.methods`): the FedGP paper's "FedGP_1" is FedGP with β = 1, "FedGP (β=1)";
its Table-4 rows "FedDA (no projection)" and "FedGP (filter)" are "FedDA" and "FedGP". Settings differ (see each notebook): e.g. the papers use full MNIST /
Fashion-MNIST / CIFAR-10, 50 rounds and 5 trials.
"""

from __future__ import annotations

from collections.abc import Iterable

import pandas as pd

__all__ = ["PAPER", "SCRIPTS_TARGET_ONLY", "INB_PAPER", "REFERENCE_BUDGETS", "paper_table", "paper_setting", "paper_value", "beside_paper",
           "reference_budgets", "noniid_reference_setting", "label_shift_setting",
           "REFERENCE_ORACLE_TRAIN_FRACTION"]

_CMNIST_COLS = ["+90%", "+80%", "-90%", "Avg"]
_VLCS_COLS = ["C", "L", "V", "S", "Avg"]
_TI_COLS = ["L100", "L38", "L43", "L46", "Avg"]
_NOISE_COLS = [0.0, 0.2, 0.4, 0.6, 0.8]
_ETA_COLS = [0.45, 0.30, 0.15, 0.10, 0.05, 0.0]
#: Fed INB paper Tables 1-4 columns: unseen rotation and synchronisation period (mini-batches between FedAvg steps)
_DG_COLS = ["75 (1-batch)", "75 (10-batch)", "75 (100-batch)", "90 (1-batch)", "90 (10-batch)", "90 (100-batch)"]
_DG_SETTING_MNIST = ("1,000 training digits of full MNIST rotated by 0, 15, 30, 45 and 60 degrees (one client each), "
                     "tested on the same digits rotated by 75 and 90 degrees; DIRT's network with InstanceNorm, Adam lr "
                     "1e-3, batch 64, lambda = 2; 2,000 / 2,500 / 3,000 iterations for periods 1 / 10 / 100; 4 runs")
_DG_SETTING_FASHION = ("1,000 training images of Fashion-MNIST rotated as for MNIST; Adam lr 1e-4, batch 128, lambda = "
                       "10; 1,500 iterations (75 degrees) and 3,000 (90 degrees); 4 runs")

#: Healthcare paper (weakly-supervised FDA) Table 2 columns and setting (§ 5.1, App. A.3)
_HC_COLS = ["CheXpert ACC", "CheXpert AUC", "MIMIC ACC", "MIMIC AUC", "MIDRC ACC", "MIDRC AUC"]
_HC_SETTING = ("ImageNet-pretrained ResNet-18 with a hidden layer of 128 and one branch per auxiliary task; Adam, "
               "source lr 1e-3, target lr 2e-4, one local epoch; alpha = 1, beta = 0.5 (on the target update, Eq. 7); "
               "80 rounds (MIMIC), 50 (CheXpert, MIDRC); CheXpert: domains by condition, 4,000 images per source, "
               "1,000 labelled target; MIMIC: domains by race, 500 per source, 100 labelled target, sex and age as "
               "auxiliary labels; MIDRC: 5 US states, 2,000 labelled target, race, sex and age as auxiliary labels")


def _budgets(auto_target_batch: int, auto_warmup: int = 2) -> dict[str, dict[str, object]]:
    # the FDA rows warm up with FedAvg rounds before their 50 (counted in the rounds here: 2 + 50 = 52);
    # Target only has no warm-up (its method trains from the initial weights, methods.TargetOnly)
    fixed = {"rounds": 52, "warmup_rounds": 2, "lr_decay": 1.0, "target_batch_size": 16}
    auto = {"rounds": 50 + auto_warmup, "warmup_rounds": auto_warmup, "lr_decay": 0.1,
            "target_batch_size": auto_target_batch}
    rows = {"source_only": fixed, "finetune_offline": fixed, "fedda": fixed, "fedgp": fixed, "fedda_auto": auto,
            "fedgp_auto": auto, "target_only": {**fixed, "rounds": 50, "warmup_rounds": 0}}
    return {rule: dict(keys) for rule, keys in rows.items()}


#: The auto-weighted FDA paper's reference scripts run its rows with different budgets (docs/experiments.md
#: § Warm-up and learning rates): per data set, canonical method name → config keys. Source only (FedAvg), FedDA
#: and FedGP at β = 0.5: 2 FedAvg warm-up rounds, then 50 rounds at the same learning rates, target batches of
#: 16; FedDA_Auto and FedGP_Auto: the same warm-up (5 rounds on TerraIncognita), then both learning rates × 0.1
#: and target batches of 1 (ColoredMNIST), 4 (VLCS) or 8 (TerraIncognita); Target only: 50 rounds from the
#: initial weights, batches of 16; Finetune_Offline: fine-tuning of the FedAvg model of the Source-only budget
#: (the reference: 50 epochs, here as many epochs as rounds, 52).
#: Notebook 04 applies them at ``paper_scale``; rows without an entry (the Oracle, the personalisation
#: baselines, run with other code) keep the notebook's setting.
REFERENCE_BUDGETS: dict[str, dict[str, dict[str, object]]] = {
    "ColoredMNIST": _budgets(1), "VLCS": _budgets(4), "TerraIncognita": _budgets(8, auto_warmup=5)}


#: The FedGP paper's semi-synthetic scripts train Target only after their 2 FedAvg warm-up rounds
#: (:func:`noniid_reference_setting`), so our "Target only (after warm-up)" is their "Target only" (``docs/reproduction.md``
#: row 13); for tables put beside theirs (``paper_aliases`` of :func:`fda_core.workbook.reports.compare_methods`, the
#: reproduction report).
SCRIPTS_TARGET_ONLY: dict[str, str] = {"Target only (after warm-up)": "Target only"}


def noniid_reference_setting(rounds: int = 50, auto_target_batch: int = 4, oracle_options: bool = True) -> dict[str, object]:
    """The FedGP paper's semi-synthetic rows as its reference scripts run them (``docs/reproduction.md`` row 13), as
    one variant of notebook 05's grid (config keys, plus ``per_method`` and method ``options`` for single rows,
    :func:`fda_core.experiments.federated.sweep_configs`).

    The scripts (``scripts/noniid_exp/*.sh`` of the reference code) pass no learning rate for Fashion-MNIST, so
    ``main_noniid.py``'s defaults run: source lr 0.01 and target lr **0.005** (the paper's App. B.6 says 0.05);
    every row of ``main_noniid.py`` first trains 2 FedAvg rounds (Source only, FedDA, FedGP, and Target only too,
    which then trains alone from that model), then ``rounds`` rounds without decay, target batches of 16;
    ``main_noniid_auto_beta.py`` (FedDA_Auto, FedGP_Auto) has the same warm-up, then both learning rates × 0.1 and
    target batches of 4; ``oracle_noniid.py`` trains on the target's data for ``rounds`` rounds of one epoch at lr
    0.003 in batches of 64 (the source batch), without a warm-up.

    The budgets are per row (``per_method``, one entry for every registered method), since a variant's own keys win
    over its rows' (:func:`fda_core.experiments.federated.sweep_configs`); the learning rates are the variant's.
    ``oracle_options=False`` leaves the Oracle's method options (the scripts' 1 epoch per round at lr 0.003) to the
    caller's method spec, e.g. notebook 05's sweeps keep their Oracle's budget; its rounds stay the scripts'."""
    from .methods import list_methods

    fixed = {"rounds": rounds + 2, "warmup_rounds": 2, "lr_decay": 1.0, "target_batch_size": 16}
    rows = {name: dict(fixed) for name in list_methods()}
    for name in ("fedda_auto", "fedgp_auto"):
        rows[name].update(lr_decay=0.1, target_batch_size=auto_target_batch)
    rows["oracle"].update(rounds=rounds, warmup_rounds=0)
    options = {"target_only": {"warmup": True}, **({"oracle": {"epochs": 1, "lr": 0.003}} if oracle_options else {})}
    return {"source_lr": 0.01, "target_lr": 0.005, "per_method": rows, "options": options}


#: The reference's Oracle of the semi-synthetic rows (``oracle_noniid.py``) trains on a random 90 % of the target
#: client, all labelled, and is tested on the other 10 % (``docs/experiments.md`` § Semi-synthetic shifts).
REFERENCE_ORACLE_TRAIN_FRACTION = 0.9


def label_shift_setting(partition: str, labelled_fraction: float, client_size: int,
                        images_per_class: int = 0) -> tuple[dict, dict, dict[str, dict[str, float]]]:
    """The label-shift runs' ``dataset_options`` for :class:`~fda_core.data.datasets.LabelShift`, the target's split
    (config keys) and the per-row split of the Oracle (``per_method`` of
    :func:`fda_core.experiments.federated.sweep_configs`), for its ``partition``.

    "equal_size": clients of ``client_size`` and ``labelled_fraction`` of the target's train split labelled (the engine's
    ``train_fraction`` stays the caller's, the Oracle's too). "reference": the reference's ``imbalance-class-η``
    clients, and its ``main_noniid.py`` split of the target: ``labelled_fraction`` of the whole target client
    labelled, tested on the rest (``train_fraction`` = ``labelled_fraction``, ``target_fraction`` 1); its Oracle
    (``oracle_noniid.py``) trains on :data:`REFERENCE_ORACLE_TRAIN_FRACTION` of the target client and is tested on the
    rest (``docs/experiments.md`` § Semi-synthetic shifts). ``images_per_class`` > 0 keeps that many images of every
    class first (``LabelShift``'s option; 6,000 on Fashion-MNIST: its training set's class sizes, what the reference
    partitions); 0 keeps all and leaves the option out of the configs. ValueError for another partition, or an
    ``images_per_class`` that is not an integer >= 0."""
    from ..common.checks import check_int
    from ..data.datasets.semi_synthetic import LABEL_SHIFT_PARTITIONS

    if partition not in LABEL_SHIFT_PARTITIONS:
        raise ValueError(f"partition must be one of {list(LABEL_SHIFT_PARTITIONS)}, got {partition!r}")
    subset = {"images_per_class": images_per_class} if check_int(images_per_class, "images_per_class", 0) else {}
    if partition == "equal_size":
        return {"client_size": client_size, **subset}, {"target_fraction": labelled_fraction}, {}
    return ({"partition": "reference", **subset}, {"train_fraction": labelled_fraction, "target_fraction": 1.0},
            {"oracle": {"train_fraction": REFERENCE_ORACLE_TRAIN_FRACTION}})


PAPER: dict[str, dict] = {
    # auto-weighted FDA paper, Table 1 (main text; 0.1% labelled target, R = 50, 5 trials)
    "ColoredMNIST": {"source": "auto-weighted FDA paper, Table 1", "setting": "full MNIST (about 23,000 images per domain) at 28x28, DomainBed's 4-conv CNN with GroupNorm (the reference code; the text says batch-norm), 50 rounds after 2 FedAvg warm-up rounds (none for Target only), Adam with source lr 1e-3 and target lr = source lr / 5, after the warm-up both x 0.1 for the auto rules only (the reference scripts), 1 target epoch per round in batches of 16 (auto rules: 1), 0.1% of the target's train split labelled, 5 trials, accuracy averaged over the last 5 rounds", "columns": _CMNIST_COLS, "rows": {
        "Source only": [56.82, 62.37, 27.77, 48.99], "Finetune_Offline": [66.58, 69.09, 53.86, 63.18],
        "FedDA": [60.49, 65.07, 33.04, 52.87], "FedGP": [88.14, 76.34, 89.80, 84.76],
        "FedDA_Auto": [87.41, 76.33, 85.57, 83.10], "FedGP_Auto": [89.85, 76.43, 89.62, 85.30],
        "Target only": [85.60, 73.54, 87.05, 82.06], "Oracle": [89.94, 80.32, 89.99, 86.75],
        # the personalisation baselines of the same table (docs/baselines.md); "FedAvg" is the paper's own row
        "FedAvg": [63.17, 71.92, 10.92, 48.67], "Ditto": [62.17, 71.26, 19.32, 50.92],
        "FedRep": [65.41, 36.44, 31.72, 44.52], "APFL": [43.78, 61.60, 30.23, 45.20],
        "KNN-per": [64.87, 71.24, 10.44, 48.85]}},
    "VLCS": {"source": "auto-weighted FDA paper, Table 1 (5% labelled target, ResNet-18)", "setting": "ResNet-18 with ImageNet weights, 5% of the target's train split labelled, source lr 5e-5, 50 rounds, 5 trials", "columns": _VLCS_COLS, "rows": {
        "Source only": [90.49, 60.65, 70.24, 69.10, 72.62], "Finetune_Offline": [96.65, 68.22, 74.34, 74.66, 78.47],
        "FedDA": [97.72, 68.17, 75.27, 76.68, 79.46], "FedGP": [99.43, 71.09, 73.65, 78.70, 80.72],
        "FedDA_Auto": [99.41, 70.99, 75.38, 80.08, 81.46], "FedGP_Auto": [99.48, 70.71, 75.24, 79.99, 81.36],
        "Target only": [97.77, 68.88, 72.29, 76.00, 78.74], "Oracle": [100.00, 72.72, 78.65, 82.71, 83.52],
        "FedAvg": [96.31, 68.03, 69.84, 68.67, 75.71], "Ditto": [95.94, 67.45, 70.48, 66.05, 74.98],
        "FedRep": [91.14, 60.39, 70.31, 70.06, 72.98], "APFL": [68.63, 60.98, 65.40, 49.85, 61.22],
        "KNN-per": [96.31, 68.04, 69.84, 68.67, 75.72]}},
    "TerraIncognita": {"source": "auto-weighted FDA paper, App. C.2 Table 5 (5% labelled target, ResNet-18)", "setting": "ResNet-18 with ImageNet weights, 5% of the target's train split labelled, source lr 5e-5, 50 rounds, 5 trials",
                       "columns": _TI_COLS, "rows": {
        "Source only": [54.62, 31.39, 36.85, 27.15, 37.50], "Finetune_Offline": [77.45, 75.22, 61.16, 58.89, 68.18],
        "FedDA": [77.24, 69.21, 58.55, 53.78, 64.70], "FedGP": [81.46, 77.75, 64.18, 61.56, 71.24],
        "FedDA_Auto": [79.06, 78.59, 66.02, 63.37, 71.76], "FedGP_Auto": [78.70, 78.28, 65.55, 63.78, 71.58],
        "Target only": [78.85, 74.25, 58.96, 56.90, 67.24], "Oracle": [96.41, 95.01, 91.98, 89.04, 93.11],
        "FedAvg": [38.46, 21.24, 39.76, 20.54, 30.00], "Ditto": [44.30, 12.57, 40.16, 17.98, 28.75],
        "FedRep": [45.27, 6.15, 21.13, 10.89, 20.86], "APFL": [65.16, 64.42, 38.97, 42.33, 52.72],
        "KNN-per": [38.46, 21.24, 39.76, 20.55, 30.00]}},
    # FedGP paper, Table 6 (Fashion-MNIST part; 100 labelled target samples, 10 clients)
    "NoisyFeatures": {"source": "FedGP paper, App. B.5 Table 6 (Fashion-MNIST, 100 labelled target samples)", "setting": "Fashion-MNIST, 10 clients of 6,000 images (9 sources), 100 labelled target samples, 50 rounds, Adam with source lr 0.01 and target lr 0.05, batches 64/16, 1 local epoch, 5 trials",
                      "columns": _NOISE_COLS, "rows": {
        "Source only": [83.94, 25.49, 18.55, 16.71, 14.99], "Finetune_Offline": [81.39, 48.26, 40.15, 36.64, 33.71],
        "FedDA": [86.41, 69.73, 58.6, 50.13, 45.51], "FedGP": [76.33, 75.09, 71.09, 68.01, 62.22],
        "FedGP (β=1)": [79.40, 77.03, 71.67, 63.71, 54.18], "Target only": [74.00, 70.59, 66.03, 61.26, 57.82],
        "Oracle": [82.00, 82.53, 81.20, 75.60, 72.60]}},
    # FedGP paper, Table 7 (label shift on Fashion-MNIST, 15% labelled target)
    "LabelShift": {"source": "FedGP paper, App. B.5 Table 7 (Fashion-MNIST, 15% labelled target)", "setting": "Fashion-MNIST, 10 clients, 15% of the target's train split labelled, classes {6, 8, 9} vs the rest, 50 rounds, 5 trials",
                   "columns": _ETA_COLS, "rows": {
        "Source only": [83.97, 79.71, 69.15, 59.90, 52.51, 0.00], "Finetune_Offline": [79.84, 80.21, 83.13, 85.43, 89.63, 33.25],
        "FedDA": [82.44, 80.85, 77.50, 76.51, 68.26, 59.56], "FedGP": [82.97, 83.24, 85.97, 88.72, 91.89, 98.71],
        "FedGP (β=1)": [77.41, 73.12, 62.54, 53.56, 27.62, 0.00], "Target only": [81.05, 82.44, 84.00, 88.02, 89.80, 98.32],
        "Oracle": [87.68, 88.06, 90.56, 91.9, 93.46, 98.73]}},
    # FedGP paper, Table 3 (Fashion-MNIST noise 0.2/0.4/0.6, number of labelled target samples)
    "TargetSamples": {"source": "FedGP paper, Table 3 (Fashion-MNIST)", "setting": "Fashion-MNIST noisy features (noise 0.2, 0.4, 0.6), 100 to 1,000 labelled target samples of 6,000",
                      "columns": ["FedDA 0.2", "FedGP 0.2", "FedDA 0.4", "FedGP 0.4", "FedDA 0.6", "FedGP 0.6"], "rows": {
        100: [69.73, 75.09, 58.6, 71.09, 50.13, 68.01], 200: [72.07, 74.21, 58.59, 70.93, 52.67, 70.31],
        500: [76.59, 78.41, 65.34, 74.07, 54.97, 70.52], 1000: [77.92, 78.68, 68.26, 75.17, 59.16, 71.63]}},
    # FedGP paper, Table 4 (projection and filtering, Fashion-MNIST noisy features)
    "Projection": {"source": "FedGP paper, Table 4 (Fashion-MNIST)", "setting": "Fashion-MNIST noisy features, β = 0.5, 100 labelled target samples", "columns": [0.2, 0.4, 0.6, 0.8], "rows": {
        "FedDA": [69.73, 58.6, 50.13, 45.51], "FedGP (no filter)": [72.93, 69.51, 65.46, 60.70],
        "FedGP": [75.09, 71.09, 68.01, 62.22]}},
    # FedGP paper, App. B.4 Table 5 (labels per source client; target noise 0.4, 100 labelled target samples)
    "SourceLabels": {"source": "FedGP paper, App. B.4 Table 5 (Fashion-MNIST)", "setting": "Fashion-MNIST, target noise 0.4, 100 labelled target samples, each source client holding k classes", "columns": [9, 7, 3, 5], "rows": {
        "Source only": [11.27, 18.81, 25.54, 34.11], "Finetune_Offline": [37.79, 64.75, 68.69, 65.41],
        "FedDA": [55.01, 57.9, 54.16, 61.62], "FedGP": [68.50, 68.64, 64.43, 66.59], "FedGP (β=1)": [65.27, 59.07, 26.37, 39.86],
        "Target only": [63.06, 65.76, 61.8, 63.65], "Oracle": [81.2, 81.2, 81.2, 81.2]}},
    # auto-weighted FDA paper, App. C.5 Tables 7-9 (ColoredMNIST, β on the source part)
    "BetaColoredMNIST": {"source": "auto-weighted FDA paper, App. C.5 (ColoredMNIST)",
                         "columns": [0.0, 0.2, 0.4, 0.6, 0.8, 1.0], "rows": {
        ("FedDA", "-90%"): [84.41, 73.55, 54.19, 35.16, 31.16, 27.59], ("FedGP", "-90%"): [84.41, 88.96, 89.50, 89.95, 90.03, 9.85],
        ("FedDA", "+90%"): [88.96, 82.37, 71.32, 62.03, 58.77, 55.23], ("FedGP", "+90%"): [88.96, 89.98, 89.76, 89.84, 90.18, 69.47],
        ("FedDA", "+80%"): [73.66, 75.12, 70.21, 65.14, 61.84, 61.32], ("FedGP", "+80%"): [73.66, 73.61, 74.39, 79.32, 80.11, 76.67]}},
    # Fed INB paper, Tables 5-6 (Rotated MNIST, L = 10, K = 10; columns: J): Armijo iterations per digit
    # (objective evaluations including backtracking, summed over the layers), mean over the 10 digits
    "INBIterations": {"source": "Fed INB paper, Table 5 (J = 100) and Table 6 (J = 300); L = 10, K = 10, mean over the "
                                "10 digits", "setting": "Rotated MNIST from full MNIST, 5 clients (0 to 60 degrees), 1,000 training "
                                "digits per class and client", "columns": [100, 300], "rows": {
        "INB": [1602.03, 4774.27], "Hist INB": [1602.38, 4784.80], "IndAEINB": [1583.13, 4755.20]}},
    # Fed INB paper, Tables 3-4 (App. F.5; Tables 1-2 of the main text repeat the L20 rows): accuracy (%) on the
    # unseen rotations, FedAvg of the model every 1, 10, 100 mini-batches, mean and std over 4 runs; FedDIRT
    # with Hist IndAEINB translators (J = 100, V = 500) of several L and K
    "FedDIRT_RotatedMNIST": {"source": "Fed INB paper, App. F.5 Table 3 (Rotated MNIST), mean over 4 runs",
                             "setting": _DG_SETTING_MNIST, "columns": _DG_COLS, "rows": {
        "FedDIRT (L10-K20)": [92.4, 91.7, 90.2, 70.1, 68.5, 65.7], "FedDIRT (L20-K10)": [92.2, 89.3, 91.9, 69.8, 70.4, 69.9],
        "FedDIRT (L10-K10)": [92.4, 92.2, 90.9, 70.5, 70.8, 65.9], "FedDIRT (L20-K20)": [92.2, 90.8, 91.4, 69.4, 71.1, 69.8],
        "FedAvg": [85.2, 85.1, 80.1, 63.8, 63.6, 55.6]}},
    "FedDIRT_RotatedMNIST_std": {"source": "Fed INB paper, App. F.5 Table 3 (Rotated MNIST), std over 4 runs",
                                 "setting": _DG_SETTING_MNIST, "columns": _DG_COLS, "rows": {
        "FedDIRT (L10-K20)": [0.3, 1.2, 1.0, 0.3, 3.8, 2.9], "FedDIRT (L20-K10)": [0.3, 4.2, 0.9, 0.7, 2.2, 0.3],
        "FedDIRT (L10-K10)": [0.4, 0.7, 0.8, 0.5, 0.8, 4.7], "FedDIRT (L20-K20)": [1.3, 1.2, 0.6, 0.8, 1.3, 1.5],
        "FedAvg": [0.7, 0.5, 2.3, 2.1, 0.8, 2.0]}},
    "FedDIRT_RotatedFashionMNIST": {"source": "Fed INB paper, App. F.5 Table 4 (Rotated Fashion-MNIST), mean over 4 runs",
                                    "setting": _DG_SETTING_FASHION, "columns": _DG_COLS, "rows": {
        "FedDIRT (L10-K20)": [65.8, 64.1, 62.9, 18.4, 18.3, 19.0], "FedDIRT (L20-K10)": [65.8, 63.6, 63.0, 18.2, 18.1, 18.8],
        "FedDIRT (L10-K10)": [65.1, 63.5, 62.6, 17.9, 18.3, 18.8], "FedDIRT (L20-K20)": [65.5, 64.5, 63.5, 19.0, 18.5, 18.9],
        "FedAvg": [51.9, 50.4, 40.4, 13.7, 14.6, 13.1]}},
    "FedDIRT_RotatedFashionMNIST_std": {"source": "Fed INB paper, App. F.5 Table 4 (Rotated Fashion-MNIST), std over 4 runs",
                                        "setting": _DG_SETTING_FASHION, "columns": _DG_COLS, "rows": {
        "FedDIRT (L10-K20)": [1.3, 0.9, 1.4, 0.5, 0.6, 0.4], "FedDIRT (L20-K10)": [1.3, 0.9, 1.0, 0.9, 0.4, 0.6],
        "FedDIRT (L10-K10)": [1.8, 0.6, 0.6, 0.5, 0.3, 0.6], "FedDIRT (L20-K20)": [1.8, 1.5, 1.3, 0.3, 1.0, 0.4],
        "FedAvg": [2.9, 1.2, 4.1, 1.6, 1.8, 0.9]}},
    # Healthcare paper (weakly-supervised FDA), Table 2: ACC and AUC (%) on three medical data sets, mean and
    # the half-width of a 95% CI over 3 trials; rows keyed by the paper's method names (its registry specs:
    # fda_core.experiments.auxiliary.PAPER_METHODS; FADA and KD3A are the registry's fada and kd3a, docs/baselines.md)
    "Healthcare_Table2": {"source": "healthcare paper, Table 2 (mean over 3 trials)", "setting": _HC_SETTING,
                          "columns": _HC_COLS, "rows": {
        "FedAvg": [53.28, 54.13, 69.95, 76.34, 53.56, 52.45],
        "FedAvg Finetune": [58.90, 63.81, 70.21, 77.18, 62.33, 66.66],
        "FedAvg Finetune AuxInfo": [63.15, 69.10, 69.41, 76.38, 68.22, 73.41],
        "FedAvg Finetune GP": [72.63, 82.40, 70.69, 77.24, 69.36, 72.10],
        "FedAvg Finetune AuxInfo GP": [75.61, 83.09, 68.68, 75.54, 70.28, 74.61],
        "FADA": [61.83, 64.83, 65.92, 70.11, 51.98, 53.19], "KD3A": [62.61, 67.72, 70.08, 75.50, 51.27, 55.76],
        "Oracle": [75.72, 82.51, 71.28, 76.29, 84.28, 87.62]}},
    "Healthcare_Table2_ci": {"source": "healthcare paper, Table 2 (95% CI half-widths over 3 trials)", "setting": _HC_SETTING,
                             "columns": _HC_COLS, "rows": {
        "FedAvg": [2.44, 3.77, 1.57, 3.02, 2.33, 4.23], "FedAvg Finetune": [0.77, 2.92, 1.38, 0.87, 2.34, 2.17],
        "FedAvg Finetune AuxInfo": [2.11, 4.08, 1.40, 1.27, 3.68, 1.68],
        "FedAvg Finetune GP": [2.27, 2.17, 0.91, 1.87, 2.93, 2.48],
        "FedAvg Finetune AuxInfo GP": [1.17, 2.28, 2.16, 2.44, 1.68, 3.16],
        "FADA": [3.33, 5.44, 1.43, 2.04, 1.59, 2.39], "KD3A": [0.50, 2.50, 0.64, 0.94, 2.69, 0.55],
        "Oracle": [1.27, 1.15, 0.79, 0.94, 1.01, 1.54]}},
    # Healthcare paper, Table 4: target AUC (%) on MIDRC against the number of labelled target samples
    "Healthcare_Table4": {"source": "healthcare paper, Table 4 (MIDRC, AUC)", "setting": _HC_SETTING,
                          "columns": [50, 100, 500, 1000, 2000], "rows": {
        "FedAvg": [52.45, 52.45, 52.45, 52.45, 52.45], "FedAvg Finetune": [51.92, 54.56, 58.52, 60.48, 65.57],
        "FedAvg Finetune AuxInfo": [55.13, 57.38, 61.30, 64.88, 72.51],
        "FedAvg Finetune GP": [53.27, 55.38, 63.45, 67.44, 71.98]}},
    # Healthcare paper, App. A.6 Table 6: target accuracy (%) on Non-IID MNIST
    "Healthcare_Table6": {"source": "healthcare paper, App. A.6 Table 6 (Non-IID MNIST)",
                          "setting": "full MNIST, 8 sources with 3 classes each (NIID-Bench #C=3), a 10-class target "
                                     "with feature noise (level not given), 100 labelled target samples, tested on "
                                     "10,000 target images, a CNN (learning rates, rounds and trials not given)",
                          "columns": ["ACC"], "rows": {
        "FedAvg": [60.11], "FedAvg Finetune": [69.82], "FedAvg Finetune GP": [79.74]}},
}

#: Single numbers and the setting of the Fed INB paper (*Efficient Federated Domain Translation*, ICLR 2023),
#: each with its source. Its Fig. 2 WD values are only drawn, not printed.
INB_PAPER: dict[str, dict] = {
    "fig3_params_per_client": {"value": 2e8, "source": "Fed INB paper, Fig. 3 caption: Hist IndAEINB-L10-K10-J100 "
                               "with V = 500 after about 2e8 parameters transmitted per client"},
    "train_minutes_a5000": {"value": 5.0, "source": "Fed INB paper, Sec. 4.2: about 5 minutes to train INB on one "
                            "RTX A5000"},
    "fig2a_wd_order": {"value": ["IndAEINB", "AEINB", "INB"],
                       "source": "Fed INB paper, Sec. 4.1 and Fig. 2a (App. F.2, Fig. 5): AEINB and IndAEINB reach a "
                       "lower WD than INB, IndAEINB lower than AEINB at the same communication; lowest WD first (the "
                       "WD values are only drawn)"},
    "stargan_hours_p100": {"value": 2.5, "source": "Fed INB paper, Sec. 4.2: FedStarGAN takes about 2.5 hours to "
                           "generate good samples on one Tesla P100 (and still only reconstructs, Fig. 3b-c)"},
    "stargan_sync_steps": {"value": [16, 128], "source": "Fed INB paper, Sec. 4.2 and Fig. 2d / 4d: FedStarGAN-16 and "
                           "FedStarGAN-128 synchronise every 16 and 128 mini-batches"},
    "feddirt_iterations": {"value": {1: 2000, 10: 2500, 100: 3000}, "source": "Fed INB paper, App. E.2: FedDIRT and "
                           "FedAvg run 2,000 / 2,500 / 3,000 iterations with synchronisation every 1 / 10 / 100 "
                           "mini-batches (Rotated MNIST)"},
    "feddirt_iterations_fashion": {"value": {"75": 1500, "90": 3000}, "source": "Fed INB paper, App. E.2: on "
                                   "Rotated Fashion-MNIST FedDIRT and FedAvg run 1,500 iterations for the unseen "
                                   "domain 75 and 3,000 for 90, at every synchronisation period"},
    "feddirt_hyper": {"value": {"mnist": {"batch_size": 64, "lr": 1e-3, "lam": 2.0},
                                "fashion": {"batch_size": 128, "lr": 1e-4, "lam": 10.0}},
                      "source": "Fed INB paper, App. E.2: batch size, Adam learning rate and DIRT weight lambda"},
    "setting": {"source": "Fed INB paper, Sec. 4 and App. E", "value": {
        "data": "full MNIST", "angles": [0, 15, 30, 45, 60], "n_train_per_class": 1000, "n_test_per_class": 1000,
        "L": 10, "K": 10, "J": 100, "V_range": [50, 2000], "wd": "Sinkhorn (100 iterations)",
        "wd_depths": "every layer", "autoencoder_training": "not specified"}},
}


def paper_table(name: str) -> pd.DataFrame:
    """One published table as a DataFrame (index = method or setting, columns as in the paper)."""
    if name not in PAPER:
        raise ValueError(f"unknown paper table {name!r}; name must be one of {sorted(PAPER)}")
    entry = PAPER[name]
    df = pd.DataFrame.from_dict(entry["rows"], orient="index", columns=entry["columns"])
    df.attrs["source"] = entry["source"]
    df.attrs["setting"] = entry.get("setting", "")
    return df


def paper_setting(name: str) -> str:
    """One line naming the published table and the paper's setting, for notes beside our numbers."""
    table = paper_table(name)
    return f"Paper: {table.attrs['source']}" + (f"; {table.attrs['setting']}." if table.attrs["setting"] else ".")


def paper_value(name: str):
    """One of the Fed INB paper's single numbers (or its setting, a dict): ``INB_PAPER[name]["value"]``."""
    if name not in INB_PAPER:
        raise ValueError(f"unknown paper number {name!r}; name must be one of {sorted(INB_PAPER)}")
    return INB_PAPER[name]["value"]


def beside_paper(ours: pd.DataFrame, name: str) -> pd.DataFrame:
    """``ours`` (index = method or setting, numeric columns) rounded to 2 decimals, with the paper's columns
    that ``ours`` also has appended as ``paper <column>`` (rows the paper lacks get NaN)."""
    paper = paper_table(name)
    shared = [c for c in paper.columns if c in set(ours.columns)]
    return ours.round(2).join(paper[shared].add_prefix("paper "), how="left")


def reference_budgets(dataset: str, *, others: Iterable[str] = (),
                      max_rounds: int | None = None) -> dict[str, dict[str, object]]:
    """The reference scripts' per-row budgets on ``dataset`` (:data:`REFERENCE_BUDGETS`; a copy), for
    :func:`fda_core.experiments.federated.sweep_configs`'s ``per_method``. ``others``: rows with no script of
    their own (canonical names or display labels, e.g. the personalisation baselines) that get the FedGP row's
    budget (warm-up, then the same learning rates). ``max_rounds``: caps every row's rounds (quick runs; the
    warm-up rounds are kept). KeyError names the data sets known."""
    if dataset not in REFERENCE_BUDGETS:
        raise KeyError(f"no reference budgets for {dataset!r}; known: {sorted(REFERENCE_BUDGETS)}")
    if max_rounds is not None and (isinstance(max_rounds, bool) or not isinstance(max_rounds, int) or max_rounds < 1):
        raise ValueError(f"max_rounds must be None or an integer >= 1, got {max_rounds!r}")
    budgets = {rule: dict(keys) for rule, keys in REFERENCE_BUDGETS[dataset].items()}
    budgets.update({row: dict(budgets["fedgp"]) for row in others})
    if max_rounds is not None:
        for keys in budgets.values():
            keys["rounds"] = min(keys["rounds"], max_rounds)
    return budgets
