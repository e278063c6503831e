"""The shipped published numbers (domaingen/tables/published/*.csv): readable, named as domaingen names things, consistent."""

from __future__ import annotations

import csv

import pytest

from domaingen.datasets import DATASETS
from domaingen.tables.reference import AVG, PUBLISHED_DIR, VIEW_FILES, read_reference

REFERENCE_FILES = sorted(p for p in PUBLISHED_DIR.glob("*.csv") if p.stem not in VIEW_FILES)
DOMAINBED_FILES = sorted(PUBLISHED_DIR.glob("domainbed_*.csv"))
DOMAINBED_SOURCE = "DomainBed results.tex 7df6f06"

# DomainBed's ALGORITHMS list (domainbed/algorithms.py at facebookresearch/DomainBed b93c22a)
DOMAINBED_ALGORITHMS = {
    "ERM", "ERMPlusPlus", "Fish", "IRM", "GroupDRO", "Mixup", "MLDG", "CORAL", "MMD", "DANN", "CDANN", "MTL",
    "SagNet", "ARM", "VREx", "RSC", "SD", "ANDMask", "SANDMask", "IGA", "SelfReg", "Fishr", "TRM", "IB_ERM",
    "IB_IRM", "CAD", "CondCAD", "Transfer", "CausIRL_CORAL", "CausIRL_MMD", "EQRM", "RDM", "ADRMX", "URM",
}
# the 14 algorithms of DomainBed's results.tex (2020_10_06_7df6f06), each with every cell of every table
RESULTS_TEX_ALGORITHMS = ["ERM", "IRM", "GroupDRO", "Mixup", "MLDG", "CORAL", "MMD", "DANN", "CDANN", "MTL",
                          "SagNet", "ARM", "VREx", "RSC"]
RESULTS_TEX_DATASETS = ["ColoredMNIST", "RotatedMNIST", "VLCS", "PACS", "OfficeHome", "TerraIncognita", "DomainNet"]

# (dataset, algorithm, selection, test_env) -> (mean, error) as printed; read by hand from
# results.tex (Avg errors from its "Averages" tables) and, for Fishr, from its README's table
SPOT_CHECKS = {
    ("ColoredMNIST", "ERM", "training", "-90%"): ("10.0", "0.1"),
    ("ColoredMNIST", "ERM", "oracle", "-90%"): ("28.7", "0.5"),
    ("ColoredMNIST", "Mixup", "oracle", "Avg"): ("58.4", "0.2"),
    ("ColoredMNIST", "ARM", "loo", "-90%"): ("10.2", "0.0"),
    ("RotatedMNIST", "ERM", "loo", "0"): ("95.3", "0.2"),
    ("RotatedMNIST", "ARM", "training", "0"): ("96.7", "0.2"),
    ("VLCS", "ARM", "loo", "L"): ("62.7", "1.5"),
    ("PACS", "CORAL", "training", "art_painting"): ("88.3", "0.2"),
    ("PACS", "ERM", "training", "Avg"): ("85.5", "0.2"),
    ("OfficeHome", "CDANN", "training", "C"): ("50.4", "2.4"),
    ("TerraIncognita", "SagNet", "training", "L46"): ("40.4", "1.3"),
    ("DomainNet", "RSC", "training", "quickdraw"): ("12.2", "0.2"),
    ("DomainNet", "VREx", "oracle", "real"): ("43.5", "5.6"),
    ("DomainNet", "VREx", "oracle", "Avg"): ("30.1", "3.7"),
    ("DomainNet", "MMD", "training", "Avg"): ("23.4", "9.5"),
    ("ColoredMNIST", "Fishr", "oracle", "Avg"): ("68.8", "1.4"),
    ("DomainNet", "Fishr", "training", "Avg"): ("41.7", "0.0"),
}


def _domainbed() -> "pd.DataFrame":  # noqa: F821
    import pandas as pd

    return pd.concat([read_reference(path) for path in DOMAINBED_FILES], ignore_index=True)


def test_the_files_are_there():
    assert [p.name for p in DOMAINBED_FILES] == ["domainbed_images.csv", "domainbed_mnist.csv"]


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=lambda p: p.name)
def test_every_reference_file_reads_and_names_our_datasets_and_environments(path):
    frame = read_reference(path)  # raises on a bad column, number, selection or environment
    assert len(frame) > 0
    assert set(frame["dataset"]) <= set(DATASETS), set(frame["dataset"]) - set(DATASETS)
    # written as environment names (or Avg), not indices: the file reads the same to a person
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            assert row["test_env"] in (*DATASETS.get(row["dataset"]).ENVIRONMENTS, AVG), row
    # one cell per column of a row
    key = ["dataset", "algorithm", "source", "selection", "table", "test_env"]
    assert not frame.duplicated(key).any(), frame[frame.duplicated(key, keep=False)]


@pytest.mark.parametrize("path", DOMAINBED_FILES, ids=lambda p: p.name)
def test_domainbed_files_name_domainbed_algorithms_and_a_selection(path):
    frame = read_reference(path)
    assert set(frame["algorithm"]) <= DOMAINBED_ALGORITHMS, set(frame["algorithm"]) - DOMAINBED_ALGORITHMS
    assert set(frame["selection"]) <= {"training", "loo", "oracle"}  # every number depends on it
    assert set(frame["table"]) == {"test"}


@pytest.mark.parametrize("path", REFERENCE_FILES, ids=lambda p: p.name)
def test_each_avg_is_the_mean_of_its_environments(path):
    """Where a row has every environment, its Avg is their mean to the rounding.

    The source averages unrounded cells and prints one decimal: the printed cells' mean may
    differ from the printed Avg by up to 0.05 + 0.05.
    """
    frame = read_reference(path)
    checked = 0
    for (dataset, *_), row in frame.groupby(["dataset", "algorithm", "source", "selection", "table"]):
        cells = dict(zip(row["test_env"], 100 * row["mean"]))
        if AVG not in cells or dataset not in DATASETS:
            continue
        environments = DATASETS.get(dataset).ENVIRONMENTS
        if all(env in cells for env in environments):
            mean = sum(cells[env] for env in environments) / len(environments)
            assert abs(mean - cells[AVG]) <= 0.1 + 1e-9, (path.name, row.iloc[0].to_dict(), mean)
            checked += 1
    if path in DOMAINBED_FILES:
        assert checked > 0


def test_domainbed_results_tex_is_complete():
    """Every results.tex table: 14 algorithms x 3 selections x 7 datasets, each cell with its error bar."""
    frame = _domainbed()
    ours = frame[frame["source"] == DOMAINBED_SOURCE]
    assert sorted(set(ours["dataset"])) == sorted(RESULTS_TEX_DATASETS)
    for (dataset, selection), table in ours.groupby(["dataset", "selection"]):
        assert list(dict.fromkeys(table["algorithm"])) == RESULTS_TEX_ALGORITHMS, (dataset, selection)
        columns = [*DATASETS.get(dataset).ENVIRONMENTS, AVG]
        for algorithm, row in table.groupby("algorithm"):
            assert list(row["test_env"]) == columns, (dataset, selection, algorithm)
    assert set(ours["selection"]) == {"training", "loo", "oracle"}
    assert len(ours) == 3 * 14 * sum(len(DATASETS.get(d).ENVIRONMENTS) + 1 for d in RESULTS_TEX_DATASETS)
    assert (ours["error_text"] != "").all()


def test_spot_checks_against_the_published_tables():
    frame = _domainbed()
    found = {}
    for row in frame.to_dict("records"):
        key = (row["dataset"], row["algorithm"], row["selection"], row["test_env"])
        if key in SPOT_CHECKS:
            assert key not in found, key
            found[key] = (row["mean_text"], row["error_text"])
    assert found == SPOT_CHECKS


def test_later_algorithms_name_their_paper_and_table():
    """Rows not from DomainBed's results.tex name the paper and the table they come from, or that
    they are quoted from the project's reference notes (the paper named, its table not re-checked)."""
    frame = _domainbed()
    later = frame[frame["source"] != DOMAINBED_SOURCE]
    assert not set(later["algorithm"]) & set(RESULTS_TEX_ALGORITHMS)
    for source in set(later["source"]):
        assert " paper (" in source and ("Table" in source or "as quoted in" in source), source


def test_dmg_file_gives_the_papers_averages_per_backbone_under_every_selection():
    """domaingen/tables/published/dmg.csv: DMG's published out-of-domain averages, one row per backbone, no selection named
    (the paper selects on its own source-domain validation split), so each prints under every selection method."""
    from domaingen.tables.reference import reference_rows

    frame = read_reference(PUBLISHED_DIR / "dmg.csv")
    for method in ("training", "loo", "oracle"):
        pacs = reference_rows(frame, "PACS", method, "test")
        assert {source.split(", ")[1]: cells[AVG][2] for (algorithm, source), cells in pacs.items()
                if algorithm == "DMG"} == {"AlexNet ImageNet": "73.32", "ResNet-18 ImageNet": "81.46",
                                           "ResNet-50 ImageNet": "83.37"}
        domainnet = reference_rows(frame, "DomainNet", method, "test")
        assert {(algorithm, cells[AVG][2]) for (algorithm, _), cells in domainnet.items()} == \
            {("DMG", "43.63"), ("MetaReg", "43.62")}
    assert reference_rows(frame, "PACS", "training", "indomain") == {}  # Table 3 is not in the file


def test_reference_takes_a_shipped_name_and_refuses_an_unknown_one_in_one_line():
    from domaingen.errors import DomaingenError

    by_name = read_reference("domainbed_mnist")
    by_path = read_reference(PUBLISHED_DIR / "domainbed_mnist.csv")
    assert by_name.equals(by_path) and len(by_name) > 0
    with pytest.raises(DomaingenError) as exc:
        read_reference("domainbed_mnsit")
    assert str(exc.value) == ("reference domainbed_mnsit: no such file and no shipped one of that name (shipped: "
                              "dmg, domainbed_images, domainbed_mnist, modreg_table1, pacs_modern)")
