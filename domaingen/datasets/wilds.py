"""WILDS Camelyon17 and FMoW: one environment per hospital or region, or WILDS' official splits.

The files are WILDS' own (<data_dir>/camelyon17_v1.0, <data_dir>/fmow_v1.1). With the
`wilds` package installed (pip install 'domaingen-bench[wilds]') its dataset classes read
the labels, metadata and splits, and the official-split datasets record WILDS'
`dataset.eval()` metrics. Without it, the leave-one-domain-out datasets read the same
metadata files with our own reader (the same rules, checked against wilds in the tests).
"""

from __future__ import annotations

import datetime
import logging
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Mapping, Sequence

import numpy as np
import torch

from domaingen.datasets.base import DATASETS, data_path
from domaingen.datasets.loading import FileDomains, FileEnvironment
from domaingen.errors import DataNotFoundError, DomaingenError

log = logging.getLogger(__name__)

WILDS_INSTALL = "pip install 'domaingen-bench[wilds]'"

FMOW_CATEGORIES = (
    "airport", "airport_hangar", "airport_terminal", "amusement_park", "aquaculture", "archaeological_site", "barn",
    "border_checkpoint", "burial_site", "car_dealership", "construction_site", "crop_field", "dam", "debris_or_rubble",
    "educational_institution", "electric_substation", "factory_or_powerplant", "fire_station", "flooded_road",
    "fountain", "gas_station", "golf_course", "ground_transportation_station", "helipad", "hospital",
    "impoverished_settlement", "interchange", "lake_or_pond", "lighthouse", "military_facility",
    "multi-unit_residential", "nuclear_powerplant", "office_building", "oil_or_gas_facility", "park",
    "parking_lot_or_garage", "place_of_worship", "police_station", "port", "prison", "race_track", "railway_bridge",
    "recreational_facility", "road_bridge", "runway", "shipyard", "shopping_mall", "single-unit_residential",
    "smokestack", "solar_farm", "space_facility", "stadium", "storage_tank", "surface_mine", "swimming_pool",
    "toll_booth", "tower", "tunnel_opening", "waste_disposal", "water_treatment_facility", "wind_farm", "zoo",
)


@dataclass
class WildsTable:
    """One WILDS dataset as files and arrays, whichever reader produced it."""

    paths: list[str]
    y: torch.Tensor
    metadata: torch.Tensor  # WILDS' metadata_array
    metadata_fields: list[str]
    split: np.ndarray  # WILDS' split code per example
    split_codes: dict[str, int]
    reader: str  # "wilds" or "domaingen"
    wilds_dataset: Any = None

    def column(self, field: str) -> torch.Tensor:
        return self.metadata[:, self.metadata_fields.index(field)]


def scatter_mean(src: torch.Tensor, index: torch.Tensor, dim_size: int, reduce: str = "mean", **_: Any) -> torch.Tensor:
    """Per-group mean (or sum) of `src` over `index`, 0 for an empty group: torch_scatter.scatter's result."""
    if reduce not in ("mean", "sum"):
        raise ValueError(f"reduce={reduce!r} is not supported by domaingen's stand-in")
    total = torch.zeros(dim_size, dtype=src.dtype, device=src.device).index_add_(0, index, src)
    if reduce == "sum":
        return total
    counts = torch.zeros(dim_size, dtype=src.dtype, device=src.device).index_add_(0, index, torch.ones_like(src))
    return total / counts.clamp(min=1)


def ensure_group_means() -> None:
    """WILDS' metrics average over groups with torch_scatter, which has no wheels for recent torch;
    when it is absent, stand in a module with the one function WILDS calls (scatter)."""
    try:
        import torch_scatter  # noqa: F401
    except ImportError:
        log.info("torch_scatter is not installed; WILDS' group means use domaingen's stand-in")
        sys.modules["torch_scatter"] = types.SimpleNamespace(scatter=scatter_mean, __name__="torch_scatter")


def wilds_installed() -> bool:
    """True when the wilds package can be imported."""
    try:
        import wilds  # noqa: F401
    except ImportError:
        return False
    return True


def _camelyon_paths(root: Path, frame) -> list[str]:
    return [
        str(root / f"patches/patient_{p}_node_{n}/patch_patient_{p}_node_{n}_x_{x}_y_{y}.png")
        for p, n, x, y in frame.loc[:, ["patient", "node", "x_coord", "y_coord"]].itertuples(index=False, name=None)
    ]


def read_camelyon17(root: Path) -> WildsTable:
    """Camelyon17 from metadata.csv: hospital 1 is the OOD validation split, hospital 2 the test split."""
    import pandas as pd

    frame = pd.read_csv(root / "metadata.csv", index_col=0, dtype={"patient": "str"})
    codes = {"train": 0, "id_val": 1, "test": 2, "val": 3}
    center = frame["center"].to_numpy().astype(np.int64)
    split = frame["split"].to_numpy().astype(np.int64).copy()
    split[center == 1] = codes["val"]
    split[center == 2] = codes["test"]
    y = torch.tensor(frame["tumor"].to_numpy(), dtype=torch.long)
    metadata = torch.stack([torch.tensor(center), torch.tensor(frame["slide"].to_numpy(), dtype=torch.long), y], 1)
    return WildsTable(_camelyon_paths(root, frame), y, metadata, ["hospital", "slide", "y"], split, codes, "domaingen")


def read_fmow(root: Path) -> WildsTable:
    """FMoW from rgb_metadata.csv: regions in order of appearance, WILDS' time_after_2016 splits, 'seq' rows dropped."""
    import pandas as pd

    frame = pd.read_csv(root / "rgb_metadata.csv")
    countries = pd.read_csv(root / "country_code_mapping.csv")
    to_region = dict(zip(countries["alpha-3"], countries["region"]))
    regions = [to_region.get(code, "Other") for code in frame["country_code"].to_list()]
    region_order = list(dict.fromkeys(regions))
    region = np.array([region_order.index(r) for r in regions])
    stamps = pd.to_datetime(frame["timestamp"])
    test_ood = np.asarray(stamps >= datetime.datetime(2016, 1, 1, tzinfo=datetime.timezone.utc))
    val_ood = np.asarray(stamps >= datetime.datetime(2013, 1, 1, tzinfo=datetime.timezone.utc)) & ~test_ood
    ood = test_ood | val_ood
    given = frame["split"].to_numpy()
    codes = {"train": 0, "id_val": 1, "id_test": 2, "val": 3, "test": 4}
    split = np.full(len(frame), -1)
    split[(given == "train") & ~ood] = codes["train"]
    split[(given == "val") & ~ood] = codes["id_val"]
    split[(given == "test") & ~ood] = codes["id_test"]
    split[(given == "val") & val_ood] = codes["val"]
    split[(given == "test") & test_ood] = codes["test"]
    year = np.full(len(frame), -1)
    for value in range(2002, 2018):
        start = datetime.datetime(value, 1, 1, tzinfo=datetime.timezone.utc)
        end = datetime.datetime(value + 1, 1, 1, tzinfo=datetime.timezone.utc)
        year[np.asarray((stamps >= start) & (stamps < end))] = value - 2002
    keep = given != "seq"
    category = {name: i for i, name in enumerate(FMOW_CATEGORIES)}
    y = torch.as_tensor([category[c] for c in frame["category"]], dtype=torch.long)[keep]
    metadata = torch.as_tensor(np.stack([region, year], 1)[keep], dtype=torch.long)
    metadata = torch.cat([metadata, y[:, None]], 1)
    paths = [str(root / "images" / f"rgb_img_{i}.png") for i in np.flatnonzero(keep)]
    return WildsTable(paths, y, metadata, ["region", "year", "y"], split[keep], codes, "domaingen")


def read_with_wilds(name: str, data_dir: str, ours: WildsTable) -> WildsTable:
    """The same table, its labels, metadata and splits taken from the wilds package's class."""
    from wilds import get_dataset

    try:
        dataset = get_dataset(dataset=name, root_dir=str(data_dir), download=False)
    except (FileNotFoundError, OSError) as exc:
        raise DataNotFoundError(f"the wilds package cannot read {name} in {data_dir}: {exc}") from None
    if len(dataset) != len(ours.paths):
        raise DomaingenError(
            f"{name}: the wilds package sees {len(dataset)} examples, the metadata file {len(ours.paths)}; "
            "the data folder is inconsistent"
        )
    return WildsTable(
        ours.paths,
        dataset.y_array.long(),
        dataset.metadata_array.long(),
        list(dataset.metadata_fields),
        np.asarray(dataset.split_array).astype(np.int64),
        dict(dataset.split_dict),
        "wilds",
        dataset,
    )


class WildsDomains(FileDomains):
    """A WILDS dataset read from <data_dir>/<FOLDER>; subclasses choose the environments."""

    WILDS_NAME: ClassVar[str] = ""
    FOLDER: ClassVar[str] = ""
    METADATA_FILE: ClassVar[str] = ""
    DOWNLOAD_SIZE: ClassVar[str] = ""
    NEEDS_WILDS: ClassVar[bool] = False
    CHECKPOINT_FREQ = 300

    def __init__(self, data_dir: str, test_envs: Sequence[int], hparams: Mapping[str, Any]) -> None:
        super().__init__(data_dir, test_envs, hparams)
        root = data_path(data_dir, self.FOLDER)
        if not (root / self.METADATA_FILE).is_file():
            raise DataNotFoundError(
                f"{self.WILDS_NAME} not found: {root / self.METADATA_FILE} is missing; get the data "
                f"({self.DOWNLOAD_SIZE}) with `domaingen download --dataset {self.WILDS_NAME} --data_dir {data_dir}`, "
                f"or extract WILDS' archive from https://wilds.stanford.edu/downloads into {root}"
            )
        reader = read_camelyon17 if self.WILDS_NAME == "camelyon17" else read_fmow
        table = reader(root)
        if wilds_installed():
            table = read_with_wilds(self.WILDS_NAME, data_dir, table)
        elif self.NEEDS_WILDS:
            raise DomaingenError(
                f"{type(self).__name__} reports WILDS' own metrics (dataset.eval), which need the wilds package: {WILDS_INSTALL}"
            )
        else:
            log.info("the wilds package is not installed; reading %s with domaingen's reader (%s for WILDS' own)",
                     root / self.METADATA_FILE, WILDS_INSTALL)
        self.table = table
        for name, mask in self.environment_masks(table):
            index = torch.as_tensor(np.flatnonzero(mask))
            self.environments.append(
                FileEnvironment(name, [table.paths[i] for i in index.tolist()], table.y[index], metadata=index)
            )
        self.data_source = f"{self.FOLDER}-{len(table.paths)} ({table.reader} reader)"

    def environment_masks(self, table: WildsTable) -> list[tuple[str, np.ndarray]]:
        """(environment name, boolean mask over the table's examples), in ENVIRONMENTS order."""
        raise NotImplementedError


class WildsByDomain(WildsDomains):
    """One environment per value of a metadata field (DomainBed's WILDS datasets)."""

    DOMAIN_FIELD: ClassVar[str] = ""

    def environment_masks(self, table):
        values = table.column(self.DOMAIN_FIELD).numpy()
        found = sorted(set(values.tolist()))
        if found != list(range(len(self.ENVIRONMENTS))):
            raise DomaingenError(
                f"{type(self).__name__} expects {self.DOMAIN_FIELD} values 0..{len(self.ENVIRONMENTS) - 1}, "
                f"the data holds {found}; is the data folder complete?"
            )
        return [(name, values == i) for i, name in enumerate(self.ENVIRONMENTS)]


class WildsOfficial(WildsDomains):
    """WILDS' official splits as environments: train on 'train' (environment 0), evaluate the rest.

    Each record also holds WILDS' `dataset.eval()` summary metrics of every split
    (in and out parts together) as `wilds_<split>_<metric>`, e.g. wilds_test_acc_avg.
    """

    NEEDS_WILDS = True
    # WILDS' model selection and ranking metric, read on its OOD validation split 'val'
    PRIMARY_METRIC: ClassVar[str] = "acc_avg"

    def environment_masks(self, table):
        return [(name, table.split == table.split_codes[name]) for name in self.ENVIRONMENTS]

    @classmethod
    def check_test_envs(cls, test_envs: Sequence[int]) -> None:
        others = list(range(1, len(cls.ENVIRONMENTS)))
        if sorted(test_envs) != others:
            raise DomaingenError(
                f"{cls.__name__} trains on WILDS' train split (environment 0) and evaluates the others: "
                f"use --test_envs {' '.join(map(str, others))}"
            )

    def environment_metrics(self, env_index: int, index: torch.Tensor, predicted: torch.Tensor) -> dict[str, float]:
        ensure_group_means()
        rows = self.environments[env_index].metadata[index]
        results, _ = self.table.wilds_dataset.eval(predicted, self.table.y[rows], self.table.metadata[rows])
        name = self.ENVIRONMENTS[env_index]
        # the summary metrics; per-group ones (e.g. 'acc_slide:3', 'count_region:1') stay out of the records
        return {f"wilds_{name}_{k}": float(v) for k, v in results.items() if ":" not in k}


@DATASETS.register("Camelyon17")
class Camelyon17(WildsByDomain):
    """WILDS Camelyon17 tumour patches, one environment per hospital (DomainBed's WILDSCamelyon)."""

    ENVIRONMENTS = ("hospital_0", "hospital_1", "hospital_2", "hospital_3", "hospital_4")
    INPUT_SHAPE = (3, 224, 224)
    NUM_CLASSES = 2
    WILDS_NAME = "camelyon17"
    FOLDER = "camelyon17_v1.0"
    METADATA_FILE = "metadata.csv"
    DOWNLOAD_SIZE = "about 10 GB"
    DOMAIN_FIELD = "hospital"


@DATASETS.register("FMoW")
class FMoW(WildsByDomain):
    """WILDS Functional Map of the World, one environment per region (DomainBed's WILDSFMoW)."""

    ENVIRONMENTS = ("region_0", "region_1", "region_2", "region_3", "region_4", "region_5")
    INPUT_SHAPE = (3, 224, 224)
    NUM_CLASSES = 62
    WILDS_NAME = "fmow"
    FOLDER = "fmow_v1.1"
    METADATA_FILE = "rgb_metadata.csv"
    DOWNLOAD_SIZE = "about 50 GB"
    DOMAIN_FIELD = "region"


@DATASETS.register("Camelyon17Official")
class Camelyon17Official(WildsOfficial):
    """WILDS Camelyon17 with its official splits; records WILDS' accuracy (wilds_test_acc_avg)."""

    ENVIRONMENTS = ("train", "id_val", "test", "val")
    INPUT_SHAPE = Camelyon17.INPUT_SHAPE
    NUM_CLASSES = 2
    WILDS_NAME, FOLDER, METADATA_FILE, DOWNLOAD_SIZE = "camelyon17", "camelyon17_v1.0", "metadata.csv", "about 10 GB"


@DATASETS.register("FMoWOfficial")
class FMoWOfficial(WildsOfficial):
    """WILDS FMoW with its official splits; records WILDS' worst-region accuracy (wilds_test_acc_worst_region)."""

    ENVIRONMENTS = ("train", "id_val", "id_test", "val", "test")
    PRIMARY_METRIC = "acc_worst_region"
    INPUT_SHAPE = FMoW.INPUT_SHAPE
    NUM_CLASSES = 62
    WILDS_NAME, FOLDER, METADATA_FILE, DOWNLOAD_SIZE = "fmow", "fmow_v1.1", "rgb_metadata.csv", "about 50 GB"
