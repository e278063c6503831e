"""The six Spawrious benchmarks (Lynch et al., 2023) as DomainBed builds them (its datasets.py, HEAD b93c22a).

Images of four dog breeds in front of six backgrounds live in
`<data_dir>/spawrious224/<folder>/<location>/<breed>/<image>` (folder `0` or `1`: the
two halves of the published tarball). Each benchmark has three environments:

- `Test` (index 0): every breed at a location it never has in training, read from both
  halves (one-to-one) or from folder 0 with two location assignments (many-to-many);
- `SC_group_1`, `SC_group_2`: the spuriously correlated training groups. One-to-one
  (O2O): breed k at location `GROUP[k]` (the first 3072 images in group 1, the first 2756
  in group 2, from folders 0 and 1), plus every breed at the `FILLER` location (the first
  96, resp. 412); many-to-many (M2M): breeds paired, each pair swapping its two locations
  between the groups, the first 3168 images of each, all from folder 0.

As in DomainBed, labels index `CLASSES` (bulldog, corgi, dachshund, labrador); only
`.png`, `.jpg` and `.jpeg` files count; `SC_group_*` always go through Spawrious's
augmentation (resize, flip, colour jitter, grayscale: no crop) and `Test` never does,
whatever the test environments; a checkpoint every 100 steps. One difference: DomainBed
keeps the first N names in `os.listdir` order, which depends on the filesystem; here the
names are sorted first, so every machine reads the same images.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, ClassVar, Mapping, Sequence

import torch
from PIL import Image

from domaingen.datasets.base import DATASETS, data_path
from domaingen.datasets.loading import IMAGENET_MEAN, IMAGENET_STD, FileDomains, FileEnvironment
from domaingen.errors import DataNotFoundError

DATASET_DIR = "spawrious224"
CLASSES = ("bulldog", "corgi", "dachshund", "labrador")
# the order in which DomainBed's combination tables list the breeds (their position k in GROUP and TEST)
BREEDS = ("bulldog", "dachshund", "labrador", "corgi")
LOCATIONS = ("beach", "desert", "dirt", "jungle", "mountain", "snow")
EXTENSIONS = (".png", ".jpg", ".jpeg")  # case-sensitive, as DomainBed's
TOTAL = 3168  # images per (breed, location) group in a training environment
O2O_COUNTS = (int(0.97 * TOTAL), int(0.87 * TOTAL))  # correlated images per group: 3072, 2756


@dataclass(frozen=True)
class Group:
    """The first `limit` images (None: all) of one breed at one location in one folder."""

    folder: int
    location: str
    breed: str
    limit: int | None = None

    def relative_dir(self) -> str:
        return f"{self.folder}/{self.location}/{self.breed}"


def one_to_one(group: Sequence[str], test: Sequence[str], filler: str) -> dict[str, list[Group]]:
    """Each environment's groups, in DomainBed's order, for an O2O benchmark: breed k at group[k]
    in both training environments (folder 0 for the first, 1 for the second), every breed at the filler."""
    envs: dict[str, list[Group]] = {"Test": []}
    for g, count in enumerate(O2O_COUNTS):
        envs["Test"] += [Group(g, test[k], breed) for k, breed in enumerate(BREEDS)]
        envs[f"SC_group_{g + 1}"] = ([Group(g, group[k], breed, count) for k, breed in enumerate(BREEDS)]
                                     + [Group(g, filler, breed, TOTAL - count) for breed in BREEDS])
    return envs


def many_to_many(group: Sequence[str], test: Sequence[str]) -> dict[str, list[Group]]:
    """Each environment's groups, in DomainBed's order, for an M2M benchmark: breeds (0, 1) and (2, 3)
    take locations (k, k^1) in the first group and swap them in the second; all from folder 0."""
    envs: dict[str, list[Group]] = {"Test": []}
    for g in range(2):
        where = [k ^ g for k in range(len(BREEDS))]  # g=0: 0,1,2,3; g=1: 1,0,3,2
        envs["Test"] += [Group(0, test[where[k]], breed) for k, breed in enumerate(BREEDS)]
        envs[f"SC_group_{g + 1}"] = [Group(0, group[where[k]], breed, TOTAL) for k, breed in enumerate(BREEDS)]
    return envs


def spawrious_train_transform(size: int) -> Callable[[Image.Image], torch.Tensor]:
    """Spawrious's training augmentation (DomainBed's SpawriousBenchmark): resize, flip, colour jitter
    0.3, grayscale with probability 0.1, ImageNet normalisation; unlike the image folders, no crop."""
    from torchvision import transforms as T

    return T.Compose([
        T.Resize((size, size)),
        T.RandomHorizontalFlip(),
        T.ColorJitter(0.3, 0.3, 0.3, 0.3),
        T.RandomGrayscale(p=0.1),
        T.ToTensor(),
        T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
    ])


def group_files(root: Path, group: Group) -> list[str]:
    """The image paths `group` selects: its folder's image names, sorted, the first `limit`."""
    folder = root / group.relative_dir()
    names = sorted(name for name in os.listdir(folder) if name.endswith(EXTENSIONS))
    return [str(folder / name) for name in names[:group.limit]]


class SpawriousBenchmark(FileDomains):
    """One Spawrious benchmark: subclasses set GROUP and TEST (four locations each, in BREEDS order)
    and, for one-to-one benchmarks, FILLER."""

    ENVIRONMENTS = ("Test", "SC_group_1", "SC_group_2")
    INPUT_SHAPE = (3, 224, 224)
    NUM_CLASSES = len(CLASSES)
    CHECKPOINT_FREQ = 100
    AUGMENTED_ENVIRONMENTS = (1, 2)
    GROUP: ClassVar[tuple[str, ...]] = ()
    TEST: ClassVar[tuple[str, ...]] = ()
    FILLER: ClassVar[str | None] = None

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        self.classes = list(CLASSES)
        root = data_path(data_dir, DATASET_DIR)
        for name, groups in self.groups().items():
            paths: list[str] = []
            labels: list[int] = []
            for group in groups:
                if not (root / group.relative_dir()).is_dir():
                    raise DataNotFoundError(
                        f"{type(self).__name__}: {root / group.relative_dir()} is missing; expected "
                        f"<data_dir>/{DATASET_DIR}/<0|1>/<location>/<breed>/<image>: get the data with "
                        f"`domaingen download --dataset spawrious --data_dir {data_dir}`")
                files = group_files(root, group)
                paths += files
                labels += [CLASSES.index(group.breed)] * len(files)
            self.environments.append(FileEnvironment(name, paths, torch.tensor(labels, dtype=torch.long)))
        total = sum(len(env) for env in self.environments)
        self.data_source = f"{DATASET_DIR}-{type(self).__name__}-{total}"

    @classmethod
    def groups(cls) -> dict[str, list[Group]]:
        """Each environment's (folder, location, breed, limit) groups, in DomainBed's order."""
        if cls.FILLER is not None:
            return one_to_one(cls.GROUP, cls.TEST, cls.FILLER)
        return many_to_many(cls.GROUP, cls.TEST)

    def training_transform(self) -> Callable[[Image.Image], torch.Tensor]:
        return spawrious_train_transform(self.image_size)


@DATASETS.register("SpawriousO2O_easy")
class SpawriousO2O_easy(SpawriousBenchmark):  # noqa: N801 (DomainBed's name)
    """Spawrious one-to-one, easy: one spurious location per breed, beach as filler."""

    GROUP = ("desert", "jungle", "dirt", "snow")
    TEST = ("dirt", "snow", "desert", "jungle")
    FILLER = "beach"


@DATASETS.register("SpawriousO2O_medium")
class SpawriousO2O_medium(SpawriousBenchmark):  # noqa: N801
    """Spawrious one-to-one, medium: one spurious location per breed, desert as filler."""

    GROUP = ("mountain", "beach", "dirt", "jungle")
    TEST = ("jungle", "dirt", "beach", "snow")
    FILLER = "desert"


@DATASETS.register("SpawriousO2O_hard")
class SpawriousO2O_hard(SpawriousBenchmark):  # noqa: N801
    """Spawrious one-to-one, hard: one spurious location per breed, beach as filler."""

    GROUP = ("jungle", "mountain", "snow", "desert")
    TEST = ("mountain", "snow", "desert", "jungle")
    FILLER = "beach"


@DATASETS.register("SpawriousM2M_easy")
class SpawriousM2M_easy(SpawriousBenchmark):  # noqa: N801
    """Spawrious many-to-many, easy: pairs of breeds swap two spurious locations between groups."""

    GROUP = ("desert", "mountain", "dirt", "jungle")
    TEST = ("dirt", "jungle", "mountain", "desert")


@DATASETS.register("SpawriousM2M_medium")
class SpawriousM2M_medium(SpawriousBenchmark):  # noqa: N801
    """Spawrious many-to-many, medium: pairs of breeds swap two spurious locations between groups."""

    GROUP = ("beach", "snow", "mountain", "desert")
    TEST = ("desert", "mountain", "beach", "snow")


@DATASETS.register("SpawriousM2M_hard")
class SpawriousM2M_hard(SpawriousBenchmark):  # noqa: N801
    """Spawrious many-to-many, hard: pairs of breeds swap two spurious locations between groups."""

    GROUP = ("dirt", "jungle", "snow", "beach")
    TEST = ("snow", "beach", "dirt", "jungle")
