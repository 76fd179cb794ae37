"""DomainBed image folders ``root/<dataset>/<domain>/<class>/*.png|jpg`` (VLCS, PACS, OfficeHome,
TerraIncognita, or any folder of that shape), read from the user's ``data_root``."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from .base import DatasetFactory, FDADataset, _check_seed, register_dataset


IMAGENET_MEAN = (0.485, 0.456, 0.406)  # DomainBed MultipleEnvironmentImageFolder transform (ImageNet stats)
IMAGENET_STD = (0.229, 0.224, 0.225)
_IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg")
# folder names written by DomainBed's download script (domainbed/scripts/download.py, datasets.py)
DOMAINBED_FOLDERS = {"VLCS": "VLCS", "PACS": "PACS", "OfficeHome": "office_home", "TerraIncognita": "terra_incognita"}


def _download_hint(root) -> str:
    return (
        f"Run DomainBed's `python -m domainbed.scripts.download --data_dir={root}` on a machine with internet "
        f"(https://github.com/facebookresearch/DomainBed) and copy the folder here."
    )


class ImageFolderDataset(FDADataset):
    """DomainBed's ``MultipleEnvironmentImageFolder``: ``root/<dataset>/<domain>/<class>/*.{png,jpg,jpeg}``.

    ENVIRONMENTS = the sorted domain folders; classes = the sorted union of class folders over all domains
    (the same index in every domain; ``self.classes``). Images are read with PIL as RGB, resized to
    ``image_size × image_size`` (bilinear, as DomainBed's ``transforms.Resize((224, 224))``), scaled to
    [0, 1] and, when ``normalize``, standardised with the ImageNet mean/std (DomainBed). All images are
    loaded into one tensor per domain: ``x (n_i, 3, s, s)`` float32, ``y (n_i,)`` int64. ``max_per_domain``
    keeps a seeded random subset of each domain (in file order) to keep memory small.
    """

    default_target = None

    def __init__(
        self,
        root: str | os.PathLike | None = None,
        dataset: str | None = None,
        image_size: int = 224,
        max_per_domain: int | None = None,
        normalize: bool = True,
        seed: int = 0,
        *,
        data_root: str | os.PathLike | None = None,
    ) -> None:
        super().__init__()
        if root is None:
            root = data_root
        elif data_root is not None and Path(data_root) != Path(root):
            raise ValueError(f"pass root or data_root, not two different folders ({root!r}, {data_root!r})")
        if not isinstance(dataset, str) or not dataset or "/" in dataset or "\\" in dataset:
            raise ValueError(f"dataset must be a folder name such as 'VLCS' or 'terra_incognita', got {dataset!r}")
        if root is None:
            raise FileNotFoundError(
                f"{dataset} needs data_root: a folder holding {dataset}/<domain>/<class>/*.jpg. {_download_hint('<data_root>')}"
            )
        if isinstance(image_size, bool) or not isinstance(image_size, (int, np.integer)) or image_size < 1:
            raise ValueError(f"image_size must be an integer >= 1, got {image_size!r}")
        if max_per_domain is not None and (
            isinstance(max_per_domain, bool) or not isinstance(max_per_domain, (int, np.integer)) or max_per_domain < 1
        ):
            raise ValueError(f"max_per_domain must be None or an integer >= 1, got {max_per_domain!r}")
        self.seed = _check_seed(seed)
        folder = Path(root).expanduser() / dataset
        if not folder.is_dir():
            raise FileNotFoundError(f"no dataset folder {folder} (expected {folder}/<domain>/<class>/*.png|jpg). {_download_hint(root)}")
        domains = sorted(p.name for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        if not domains:
            raise FileNotFoundError(f"{folder} holds no domain folders (expected {folder}/<domain>/<class>/*.png|jpg). {_download_hint(root)}")
        classes = sorted(
            {c.name for d in domains for c in (folder / d).iterdir() if c.is_dir() and not c.name.startswith(".")}
        )
        self.name, self.root, self.folder = dataset, Path(root), folder
        self.ENVIRONMENTS, self.classes = domains, classes
        self.num_classes, self.input_shape = len(classes), (3, int(image_size), int(image_size))
        self.image_size, self.normalize, self.max_per_domain = int(image_size), bool(normalize), max_per_domain
        self.files: list[list[Path]] = []
        self.domain_totals: list[int] = []
        g = torch.Generator().manual_seed(self.seed)
        for d in domains:
            items = [
                (p, ci)
                for ci, c in enumerate(classes)
                if (folder / d / c).is_dir()
                for p in sorted((folder / d / c).iterdir())
                if p.is_file() and p.suffix.lower() in _IMAGE_EXTENSIONS
            ]
            if not items:
                raise FileNotFoundError(f"no images ({', '.join(_IMAGE_EXTENSIONS)}) under {folder / d}/<class>/. {_download_hint(root)}")
            self.domain_totals.append(len(items))
            if max_per_domain is not None and len(items) > max_per_domain:
                keep = torch.randperm(len(items), generator=g)[:max_per_domain].sort().values.tolist()
                items = [items[i] for i in keep]
            self.files.append([p for p, _ in items])
            x = torch.stack([self._load_image(p) for p, _ in items])
            y = torch.tensor([ci for _, ci in items], dtype=torch.int64)
            self.datasets.append((x, y))

    def _load_image(self, path: Path) -> Tensor:
        """(3, s, s) float32: RGB, bilinear resize, /255, optional ImageNet normalisation (DomainBed)."""
        from PIL import Image

        with Image.open(path) as im:
            im = im.convert("RGB")
            if im.size != (self.image_size, self.image_size):
                im = im.resize((self.image_size, self.image_size), Image.BILINEAR)
            arr = np.asarray(im, dtype=np.float32) / 255.0
        x = torch.from_numpy(arr.copy()).permute(2, 0, 1)
        if self.normalize:
            x = (x - torch.tensor(IMAGENET_MEAN).view(3, 1, 1)) / torch.tensor(IMAGENET_STD).view(3, 1, 1)
        return x.contiguous()

    def describe(self) -> str:
        sub = (
            f"; at most {self.max_per_domain} images per domain kept (seeded subset of {self.domain_totals})"
            if self.max_per_domain is not None
            else ""
        )
        return (
            f"{self.name} from {self.folder} as DomainBed's image folders: domains {self.ENVIRONMENTS}, "
            f"{self.num_classes} classes {self.classes}; images resized to {self.image_size}×{self.image_size} "
            f"(bilinear){' and ImageNet-normalised' if self.normalize else ''}{sub}. Sizes: {self._sizes_text()}. "
            f"Leave-one-domain-out; the FedGP paper labels 5% of the target's 80% train split (VLCS, TerraIncognita)."
        )


def _domainbed_factory(key: str) -> DatasetFactory:
    folder = DOMAINBED_FOLDERS[key]

    def factory(
        data_root: str | os.PathLike | None = None,
        image_size: int = 224,
        max_per_domain: int | None = None,
        normalize: bool = True,
        seed: int = 0,
    ) -> FDADataset:
        return ImageFolderDataset(data_root, folder, image_size, max_per_domain, normalize, seed)

    factory.__name__ = f"{key}_factory"
    factory.__doc__ = f"DomainBed {key}: ImageFolderDataset(data_root, {folder!r}, ...); data_root is required."
    return factory


register_dataset("ImageFolder", ImageFolderDataset)
for _key in DOMAINBED_FOLDERS:
    register_dataset(_key, _domainbed_factory(_key))
del _key
