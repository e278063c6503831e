"""The dataset table. Importing this package registers every built-in dataset."""

from domaingen.datasets.base import DATASETS, EMBEDDED, Environment, MultiDomainDataset, resolve_data_dir
from domaingen.datasets import mnist  # noqa: F401  (registers ColoredMNIST, RotatedMNIST)
from domaingen.datasets import images  # noqa: F401  (registers PACS, DomainNet, OfficeHome, VLCS, TerraIncognita)
from domaingen.datasets.images import ImageFolderDataset
from domaingen.datasets import wilds  # noqa: F401  (registers Camelyon17, FMoW and their official-split forms)
from domaingen.datasets.splits import Split, split_environments

__all__ = [
    "DATASETS",
    "EMBEDDED",
    "Environment",
    "ImageFolderDataset",
    "MultiDomainDataset",
    "Split",
    "resolve_data_dir",
    "split_environments",
]
