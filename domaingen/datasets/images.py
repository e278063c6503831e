"""Folder datasets: PACS and DomainNet, one ImageFolder-like environment per domain folder.

Layout: <data_dir>/<DATASET_DIR>/<domain>/<class>/<image>. Classes are the class
folder names in sorted order, which must be the same in every domain. Files whose
header PIL cannot read are skipped with one warning that counts them.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import torch
from PIL import Image, UnidentifiedImageError

from domaingen.datasets.base import DATASETS, data_path
from domaingen.datasets.loading import RESNET_HPARAMS, FileDomains, FileEnvironment
from domaingen.errors import DataNotFoundError, DomaingenError
from domaingen.hparams import HParam, int_pow2_uniform

log = logging.getLogger(__name__)

IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


def list_classes(domain_dir: Path) -> list[str]:
    """The class folder names of one domain folder, sorted."""
    return sorted(entry.name for entry in os.scandir(domain_dir) if entry.is_dir() and not entry.name.startswith("."))


def readable_image(path: str) -> bool:
    """True when PIL recognises the file's header (cheap: the pixels are not decoded)."""
    try:
        with Image.open(path) as image:
            image.size  # noqa: B018  (the header is parsed by open)
        return True
    except (UnidentifiedImageError, OSError, ValueError):
        return False


def scan_domain(domain_dir: Path, classes: Sequence[str]) -> tuple[list[str], list[int], list[str]]:
    """(image paths, labels, unreadable paths) of one domain folder, in class then file-name order."""
    paths, labels, unreadable = [], [], []
    for label, name in enumerate(classes):
        for entry in sorted(os.scandir(domain_dir / name), key=lambda e: e.name):
            if not entry.is_file() or not entry.name.lower().endswith(IMAGE_EXTENSIONS):
                continue
            if readable_image(entry.path):
                paths.append(entry.path)
                labels.append(label)
            else:
                unreadable.append(entry.path)
    return paths, labels, unreadable


class FolderDomains(FileDomains):
    """Environments read from <data_dir>/<DATASET_DIR>/<domain>/<class>/<image>."""

    DATASET_DIR: ClassVar[str] = ""
    DOWNLOAD_NAME: ClassVar[str] = ""
    INPUT_SHAPE = (3, 224, 224)

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        root = data_path(data_dir, self.DATASET_DIR)
        self._check_domain_folders(root)
        self.classes = self._shared_classes(root)
        if len(self.classes) != self.NUM_CLASSES:
            log.warning("%s has %d classes in %s, not the published %d", type(self).__name__,
                        len(self.classes), root, self.NUM_CLASSES)
        unreadable: list[str] = []
        for name in self.ENVIRONMENTS:
            paths, labels, bad = scan_domain(root / name, self.classes)
            if not paths:
                raise DataNotFoundError(f"{root / name} holds no images; {self._fix(data_dir)}")
            unreadable += bad
            self.environments.append(FileEnvironment(name, paths, torch.tensor(labels, dtype=torch.long)))
        if unreadable:
            log.warning("skipped %d unreadable image file(s) in %s, e.g. %s", len(unreadable), root, unreadable[0])
        self.skipped_files = len(unreadable)
        total = sum(len(env) for env in self.environments)
        self.data_source = f"{self.DATASET_DIR}-{total}"

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def _fix(self, data_dir: str) -> str:
        return (
            f"expected <data_dir>/{self.DATASET_DIR}/<domain>/<class>/<image> with domains "
            f"{', '.join(self.ENVIRONMENTS)}; get the data with "
            f"`domaingen download --dataset {self.DOWNLOAD_NAME} --data_dir {data_dir}`"
        )

    def _check_domain_folders(self, root: Path) -> None:
        if not root.is_dir():
            raise DataNotFoundError(f"{type(self).__name__} not found: {root} is not a folder; {self._fix(self.data_dir)}")
        missing = [name for name in self.ENVIRONMENTS if not (root / name).is_dir()]
        if missing:
            raise DataNotFoundError(
                f"{type(self).__name__}: domain folder(s) {', '.join(missing)} missing in {root}; {self._fix(self.data_dir)}"
            )

    def _shared_classes(self, root: Path) -> list[str]:
        per_domain = {name: list_classes(root / name) for name in self.ENVIRONMENTS}
        first = self.ENVIRONMENTS[0]
        reference = set(per_domain[first])
        for name, classes in per_domain.items():
            if set(classes) != reference:
                lacking = sorted(reference - set(classes))
                extra = sorted(set(classes) - reference)
                parts = ([f"lacks {', '.join(lacking)}"] if lacking else []) + ([f"has extra {', '.join(extra)}"] if extra else [])
                raise DomaingenError(
                    f"{type(self).__name__}: the class folders differ between domains: compared with {first}, "
                    f"{root / name} {' and '.join(parts)}; every domain needs the same class folders"
                )
        if not reference:
            raise DataNotFoundError(f"{root / first} has no class folders; {self._fix(self.data_dir)}")
        return per_domain[first]


@DATASETS.register("PACS")
class PACS(FolderDomains):
    """Photo, art painting, cartoon and sketch images of 7 classes (Li et al., 2017)."""

    ENVIRONMENTS = ("art_painting", "cartoon", "photo", "sketch")
    DATASET_DIR = "PACS"
    DOWNLOAD_NAME = "pacs"
    NUM_CLASSES = 7
    CHECKPOINT_FREQ = 300


@DATASETS.register("DomainNet")
class DomainNet(FolderDomains):
    """Six domains of 345 object classes (Peng et al., 2019), DomainBed's duplicate files removed."""

    ENVIRONMENTS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
    DATASET_DIR = "DomainNet"
    DOWNLOAD_NAME = "domainnet"
    NUM_CLASSES = 345
    CHECKPOINT_FREQ = 1000
    HPARAMS = {
        **RESNET_HPARAMS,
        "batch_size": HParam(32, int_pow2_uniform(3, 5), "examples per training environment per step"),
    }
