"""Folder datasets: one ImageFolder-like environment per domain folder.

Layout: <data_dir>/<DATASET_DIR>/<domain>/<class>/<image>. Classes are the class
folder names in sorted order, which must be the same in every domain. Files whose
header PIL cannot read are skipped with one warning that counts them.

`ImageFolderDataset` is the public base class: PACS, DomainNet and DomainBed's
OfficeHome, VLCS and TerraIncognita are a few class attributes each, and so is a
plugin's own folder of domains.
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


class ImageFolderDataset(FileDomains):
    """A multi-domain dataset of image files in <data_dir>/<DATASET_DIR>/<domain folder>/<class>/<image>.

    A subclass sets, as class attributes:

    - `DATASET_DIR`: its folder under the data directory;
    - `ENVIRONMENTS`: the environments' names, in order (the order of test_envs indices);
    - `DOMAIN_FOLDERS` (optional): each environment's folder name, or a tuple of accepted
      spellings (the first that exists is read); default: the environment's name;
    - `NUM_CLASSES` (optional): the published class count, checked with a warning; default 0,
      no check. The classes are the class folders, which every domain must share.
    - `DOWNLOAD_NAME` (optional): its `domaingen download --dataset` name, for error messages.

    Everything else has DomainBed's defaults for image datasets: its transforms (random
    resized crop, flip, colour jitter, grayscale; ImageNet normalisation), the ResNet
    hyperparameters (`lr` 5e-5, `batch_size` 32, ... with their random-search
    distributions), 5001 steps and a checkpoint every 300. Override `HPARAMS`, `N_STEPS`
    or `CHECKPOINT_FREQ` to change them.
    """

    DATASET_DIR: ClassVar[str] = ""
    DOMAIN_FOLDERS: ClassVar[Sequence[str | Sequence[str]]] = ()
    DOWNLOAD_NAME: ClassVar[str] = ""
    INPUT_SHAPE = (3, 224, 224)
    CHECKPOINT_FREQ = 300

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        root = data_path(data_dir, self.DATASET_DIR)
        self._check_domain_folders(root)
        self.classes = self._shared_classes(root)
        if self.NUM_CLASSES and len(self.classes) != self.NUM_CLASSES:
            log.warning("%s has %d classes in %s, not the published %d", type(self).__name__,
                        len(self.classes), root, self.NUM_CLASSES)
        unreadable: list[str] = []
        for name in self.ENVIRONMENTS:
            paths, labels, bad = scan_domain(self._domain_dir(root, name), self.classes)
            if not paths:
                raise DataNotFoundError(f"{self._domain_dir(root, name)} holds no images; {self._fix(data_dir)}")
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

    def image_root(self) -> Path:
        return data_path(self.data_dir, self.DATASET_DIR)

    @classmethod
    def folder_names(cls, env: str) -> tuple[str, ...]:
        """The accepted folder names of environment `env`, preferred first."""
        if not cls.DOMAIN_FOLDERS:
            return (env,)
        if len(cls.DOMAIN_FOLDERS) != len(cls.ENVIRONMENTS):
            raise DomaingenError(f"{cls.__name__}: DOMAIN_FOLDERS names {len(cls.DOMAIN_FOLDERS)} folders for "
                                 f"{len(cls.ENVIRONMENTS)} environments; give one per environment")
        folders = cls.DOMAIN_FOLDERS[list(cls.ENVIRONMENTS).index(env)]
        return (folders,) if isinstance(folders, str) else tuple(folders)

    def _domain_dir(self, root: Path, env: str) -> Path:
        for folder in self.folder_names(env):
            if (root / folder).is_dir():
                return root / folder
        return root / self.folder_names(env)[0]

    def _fix(self, data_dir: str) -> str:
        folders = ", ".join(self.folder_names(env)[0] for env in self.ENVIRONMENTS)
        where = (f"get the data with `domaingen download --dataset {self.DOWNLOAD_NAME} --data_dir {data_dir}`"
                 if self.DOWNLOAD_NAME else f"put the images there (data_dir is {data_dir})")
        return f"expected <data_dir>/{self.DATASET_DIR}/<domain>/<class>/<image> with domain folders {folders}; {where}"

    def _check_domain_folders(self, root: Path) -> None:
        if not root.is_dir():
            raise DataNotFoundError(f"{type(self).__name__} not found: {root} is not a folder; {self._fix(self.data_dir)}")
        missing = [self.folder_names(env)[0] for env in self.ENVIRONMENTS if not self._domain_dir(root, env).is_dir()]
        if missing:
            raise DataNotFoundError(
                f"{type(self).__name__}: domain folder(s) {', '.join(missing)} missing in {root}; {self._fix(self.data_dir)}"
            )

    def _shared_classes(self, root: Path) -> list[str]:
        per_domain = {name: list_classes(self._domain_dir(root, name)) for name in self.ENVIRONMENTS}
        first = self.ENVIRONMENTS[0]
        reference = set(per_domain[first])
        for name, classes in per_domain.items():
            if set(classes) != reference:
                lacking = sorted(reference - set(classes))
                extra = sorted(set(classes) - reference)
                parts = ([f"lacks {', '.join(lacking)}"] if lacking else []) + ([f"has extra {', '.join(extra)}"] if extra else [])
                raise DomaingenError(
                    f"{type(self).__name__}: the class folders differ between domains: compared with "
                    f"{self._domain_dir(root, first).name}, {self._domain_dir(root, name)} {' and '.join(parts)}; "
                    "every domain needs the same class folders"
                )
        if not reference:
            raise DataNotFoundError(f"{self._domain_dir(root, first)} has no class folders; {self._fix(self.data_dir)}")
        return per_domain[first]


@DATASETS.register("PACS")
class PACS(ImageFolderDataset):
    """Photo, art painting, cartoon and sketch images of 7 classes (Li et al., 2017)."""

    ENVIRONMENTS = ("art_painting", "cartoon", "photo", "sketch")
    DATASET_DIR = "PACS"
    DOWNLOAD_NAME = "pacs"
    NUM_CLASSES = 7
    CHECKPOINT_FREQ = 300


@DATASETS.register("DomainNet")
class DomainNet(ImageFolderDataset):
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


@DATASETS.register("OfficeHome")
class OfficeHome(ImageFolderDataset):
    """Art, clipart, product and real-world images of 65 office and home objects (Venkateswara et al., 2017)."""

    ENVIRONMENTS = ("A", "C", "P", "R")
    DOMAIN_FOLDERS = ("Art", "Clipart", "Product", ("Real_World", "Real World"))  # the archive has a space
    DATASET_DIR = "office_home"
    DOWNLOAD_NAME = "officehome"
    NUM_CLASSES = 65


@DATASETS.register("VLCS")
class VLCS(ImageFolderDataset):
    """Five classes in four photo datasets: Caltech101, LabelMe, SUN09, VOC2007 (Fang et al., 2013)."""

    ENVIRONMENTS = ("C", "L", "S", "V")
    DOMAIN_FOLDERS = ("Caltech101", "LabelMe", "SUN09", "VOC2007")
    DATASET_DIR = "VLCS"
    DOWNLOAD_NAME = "vlcs"
    NUM_CLASSES = 5


@DATASETS.register("TerraIncognita")
class TerraIncognita(ImageFolderDataset):
    """Camera-trap photos of 10 classes at four locations (Beery et al., 2018), as DomainBed selects them."""

    ENVIRONMENTS = ("L100", "L38", "L43", "L46")
    DOMAIN_FOLDERS = ("location_100", "location_38", "location_43", "location_46")
    DATASET_DIR = "terra_incognita"
    DOWNLOAD_NAME = "terraincognita"
    NUM_CLASSES = 10


@DATASETS.register("SVIRO")
class SVIRO(ImageFolderDataset):
    """Synthetic grayscale rear-seat images of ten vehicle interiors (Dias Da Cruz et al., 2020), DomainBed's subset."""

    ENVIRONMENTS = ("aclass", "escape", "hilux", "i3", "lexus", "tesla", "tiguan", "tucson", "x5", "zoe")
    DATASET_DIR = "sviro"
    DOWNLOAD_NAME = "sviro"
