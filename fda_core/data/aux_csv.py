"""Your own CheXpert / MIMIC-style data: a CSV of image paths, labels, domains and demographics under ``data_root``.

The paper's data sets need credentials, so the workbook reads them from files you have
(``docs/auxiliary.md`` § Your own data). One CSV file, one row per image:

==================  =====================================================================================
column              meaning
==================  =====================================================================================
``path``            the image file, relative to the CSV's folder (or absolute); PNG or JPEG, any size,
                    grey or colour (read as RGB)
``label``           the main task's label (e.g. 0/1 for a finding); rows whose label is empty are left out
``domain``          the client the row belongs to: a hospital, a condition, a race group, ...
auxiliary columns   ``aux_columns`` (default ``sex``, ``age``, ``race``): each a classification task over
                    its distinct values (sorted) or, for numeric columns with more than
                    ``max_classes`` distinct values, a regression task on the standardised value;
                    ``aux_kinds`` overrides the choice per column. Empty cells are missing labels (left
                    out of that task's loss).
==================  =====================================================================================

Column names are options (``path_column``, ``label_column``, ``domain_column``), so CheXpert's
``Path``/``Sex``/``Age`` or MIMIC's admission tables work after choosing the label and the domain column.
Images are resized to ``image_size`` (bilinear) and standardised with the ImageNet statistics, as the
pretrained ResNet-18 of the paper's Fig. 5 expects (``get_model("resnet18", hidden=128, weights=<file>)``;
the federated loop adds one head per auxiliary column). Nothing is downloaded: a missing CSV, image or
weights file raises FileNotFoundError naming it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..common.checks import check_choice, check_int
from .auxiliary import TASK_KINDS, AuxDataset, AuxTask
from .datasets import IMAGENET_MEAN, IMAGENET_STD, register_dataset

__all__ = ["AuxCSVDataset", "CSV_LAYOUT"]

CSV_LAYOUT = ("a CSV with one row per image and the columns path (image file relative to the CSV), label (main "
              "task), domain (client) and one column per auxiliary label (e.g. sex, age, race)")


def _load_image(path: Path, size: int, normalize: bool) -> Tensor:
    """(3, size, size) float32: RGB, bilinear resize, /255, optional ImageNet normalisation."""
    from PIL import Image

    with Image.open(path) as im:
        im = im.convert("RGB")
        if im.size != (size, size):
            im = im.resize((size, size), Image.BILINEAR)
        arr = np.asarray(im, dtype=np.float32) / 255.0
    x = torch.from_numpy(arr.copy()).permute(2, 0, 1)
    if normalize:
        x = (x - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
    return x.contiguous()


class AuxCSVDataset(AuxDataset):
    """Images with labels, domains and auxiliary labels from a CSV (module docstring: the layout).

    Args:
        data_root: the folder holding ``csv`` (required).
        csv: the CSV file name (or a path relative to ``data_root``).
        aux_columns: the auxiliary label columns, in head order.
        aux_kinds: optional ``{column: "classification" | "regression"}``.
        max_classes: a numeric column with more distinct values than this is a regression task.
        image_size, normalize: image size and ImageNet standardisation.
        max_per_domain: keep at most this many rows per domain (seeded subset, file order kept).
        target: the default target domain (a name; None: leave-one-domain-out, give ``target`` to the run).
    ENVIRONMENTS are the sorted domain names; main classes the sorted distinct labels (``self.classes``);
    ``self.aux_classes[name]`` the values of each classification column, ``self.aux_scale[name]`` the
    (mean, sd) that standardised a regression column.
    """

    name = "AuxCSV"

    def __init__(self, data_root: str | os.PathLike | None = None, csv: str = "labels.csv",
                 path_column: str = "path", label_column: str = "label", domain_column: str = "domain",
                 aux_columns: Sequence[str] = ("sex", "age", "race"), aux_kinds: Mapping[str, str] | None = None,
                 max_classes: int = 10, image_size: int = 224, normalize: bool = True,
                 max_per_domain: int | None = None, target: str | None = None, seed: int = 0) -> None:
        super().__init__()
        import pandas as pd

        if data_root is None or str(data_root) == "":
            raise FileNotFoundError(f"AuxCSV needs data_root: the folder holding {csv!r}, {CSV_LAYOUT}")
        path = Path(data_root).expanduser() / csv
        if not path.is_file():
            raise FileNotFoundError(f"no CSV file {path}; AuxCSV reads {CSV_LAYOUT}")
        self.seed = check_int(seed, "seed", 0)
        self.image_size = check_int(image_size, "image_size", 1)
        max_classes = check_int(max_classes, "max_classes", 2)
        if max_per_domain is not None:
            max_per_domain = check_int(max_per_domain, "max_per_domain", 1)
        if isinstance(aux_columns, str) or not isinstance(aux_columns, Sequence) or not aux_columns:
            raise ValueError(f"aux_columns must be a non-empty list of column names, got {aux_columns!r}")
        aux_kinds = dict(aux_kinds or {})
        for col, kind in aux_kinds.items():
            check_choice(kind, f"aux_kinds[{col!r}]", TASK_KINDS)
        df = pd.read_csv(path)
        need = [path_column, label_column, domain_column, *aux_columns]
        missing = [c for c in need if c not in df.columns]
        if missing:
            raise ValueError(f"{path} lacks the columns {missing}; it has {list(df.columns)} ({CSV_LAYOUT})")
        unknown = sorted(set(aux_kinds) - set(aux_columns))
        if unknown:
            raise ValueError(f"aux_kinds names columns {unknown} that are not in aux_columns {list(aux_columns)}")
        n_rows = len(df)
        df = df[df[label_column].notna() & df[domain_column].notna()].reset_index(drop=True)
        self.n_dropped = n_rows - len(df)
        if df.empty:
            raise ValueError(f"{path} has no row with both a {label_column!r} and a {domain_column!r} value")
        self.csv, self.folder, self.normalize = path, path.parent, bool(normalize)
        self.classes = sorted(df[label_column].unique().tolist())
        if len(self.classes) < 2:
            raise ValueError(f"the label column {label_column!r} of {path} has one value {self.classes}; the main "
                             "task needs at least 2 classes")
        labels = df[label_column].map({c: i for i, c in enumerate(self.classes)}).to_numpy(np.int64)
        tasks, columns = [], []
        self.aux_classes: dict[str, list] = {}
        self.aux_scale: dict[str, tuple[float, float]] = {}
        for col in aux_columns:
            values = df[col]
            numeric = pd.api.types.is_numeric_dtype(values)
            kind = aux_kinds.get(col) or (
                "regression" if numeric and values.dropna().nunique() > max_classes else "classification")
            if kind == "regression":
                if not numeric:
                    raise ValueError(f"aux column {col!r} is not numeric, so it cannot be a regression task")
                v = values.to_numpy(float)
                mean, sd = float(np.nanmean(v)), float(np.nanstd(v)) or 1.0
                self.aux_scale[col] = (mean, sd)
                columns.append((v - mean) / sd)
                tasks.append(AuxTask(col, "regression", 0))
            else:
                levels = sorted(values.dropna().unique().tolist(), key=str)
                if len(levels) < 2:
                    raise ValueError(f"aux column {col!r} has fewer than 2 distinct values {levels}; drop it from "
                                     "aux_columns")
                self.aux_classes[col] = levels
                columns.append(values.map({v: float(i) for i, v in enumerate(levels)}).to_numpy(float))
                tasks.append(AuxTask(col, "classification", len(levels)))
        self.aux_tasks = tuple(tasks)
        aux_all = np.stack(columns, 1).astype(np.float32)
        domains = df[domain_column].astype(str)
        self.ENVIRONMENTS = sorted(domains.unique().tolist())
        self.default_target = None if target is None else self.env_index(target)
        self.num_classes = len(self.classes)
        self.input_shape = (3, self.image_size, self.image_size)
        self.files: list[list[Path]] = []
        g = torch.Generator().manual_seed(self.seed)
        for env in self.ENVIRONMENTS:
            idx = np.flatnonzero(domains.to_numpy() == env)
            if max_per_domain is not None and len(idx) > max_per_domain:
                idx = idx[torch.randperm(len(idx), generator=g)[:max_per_domain].sort().values.numpy()]
            files = []
            for i in idx:
                f = Path(str(df[path_column].iloc[i])).expanduser()
                f = f if f.is_absolute() else self.folder / f
                if not f.is_file():
                    raise FileNotFoundError(f"image {f} (row {i + 2} of {path}, column {path_column!r}) does not exist")
                files.append(f)
            x = torch.stack([_load_image(f, self.image_size, self.normalize) for f in files])
            self.files.append(files)
            self.datasets.append((x, torch.from_numpy(labels[idx])))
            self.aux_labels.append(torch.from_numpy(aux_all[idx]))
        self.check()

    def describe(self) -> str:
        tasks = ", ".join(f"{t.name} ({t.kind}{', ' + str(t.num_classes) + ' classes' if t.num_classes else ''})"
                          for t in self.aux_tasks)
        return (
            f"{self.csv}: {len(self)} domains ({self._sizes_text()}), main classes {self.classes}, auxiliary tasks "
            f"{tasks}; images {self.image_size}x{self.image_size}{' ImageNet-normalised' if self.normalize else ''}; "
            f"{self.n_dropped} rows without a label or domain left out."
        )


register_dataset("AuxCSV", AuxCSVDataset)
