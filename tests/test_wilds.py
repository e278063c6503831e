"""WILDS Camelyon17 and FMoW on fakes of their on-disk layout, read by wilds (when installed) and by our reader."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from domaingen.datasets import DATASETS
from domaingen.datasets import wilds as wilds_module
from domaingen.datasets.wilds import read_camelyon17, read_fmow, read_with_wilds, wilds_installed
from domaingen.errors import DataNotFoundError, DomaingenError
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from imagetree import make_fake_camelyon17, make_fake_fmow

SMALL = {"backbone": "resnet18", "pretrained": False, "image_size": 32, "batch_size": 4, "num_workers": 0}
needs_wilds = pytest.mark.skipif(not wilds_installed(), reason="the wilds package is not installed")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("wilds")
    make_fake_camelyon17(root)
    make_fake_fmow(root)
    return root


@pytest.fixture(params=["domaingen", "wilds"])
def reader(request, monkeypatch):
    """Run the test with our reader, and again with the wilds package's classes when installed."""
    if request.param == "wilds" and not wilds_installed():
        pytest.skip("the wilds package is not installed")
    if request.param == "domaingen":
        monkeypatch.setattr(wilds_module, "wilds_installed", lambda: False)
    return request.param


@needs_wilds
@pytest.mark.parametrize("name, read", [("camelyon17", read_camelyon17), ("fmow", read_fmow)])
def test_our_reader_agrees_with_the_wilds_classes(data_dir, name, read):
    folder = {"camelyon17": "camelyon17_v1.0", "fmow": "fmow_v1.1"}[name]
    ours = read(data_dir / folder)
    theirs = read_with_wilds(name, str(data_dir), ours)
    assert torch.equal(ours.y, theirs.y)
    assert torch.equal(ours.metadata, theirs.metadata[:, : len(ours.metadata_fields)])
    assert ours.metadata_fields == theirs.metadata_fields[: len(ours.metadata_fields)]
    assert (ours.split == theirs.split).all() and ours.split_codes == theirs.split_codes
    import numpy as np
    from PIL import Image

    for i in (0, len(ours.paths) - 1):  # the file our path names is the one wilds reads
        ours_pixels = np.asarray(Image.open(ours.paths[i]).convert("RGB"))
        assert np.array_equal(ours_pixels, np.asarray(theirs.wilds_dataset.get_input(i)))


def test_camelyon17_has_one_environment_per_hospital(data_dir, reader):
    dataset = DATASETS.get("Camelyon17")(str(data_dir), [0], SMALL)
    frame = pd.read_csv(data_dir / "camelyon17_v1.0" / "metadata.csv", index_col=0)
    assert [env.name for env in dataset.environments] == [f"hospital_{i}" for i in range(5)]
    for i, env in enumerate(dataset.environments):
        rows = frame[frame["center"] == i]
        assert len(env) == len(rows)
        assert env.y.tolist() == rows["tumor"].tolist()
        assert all(f"_x_{x}_y_{y}.png" in p for p, x, y in zip(env.paths, rows["x_coord"], rows["y_coord"]))
    assert dataset.num_classes == 2 and dataset.data_source == f"camelyon17_v1.0-20 ({reader} reader)"


def test_fmow_has_one_environment_per_region_and_drops_seq_rows(data_dir, reader):
    dataset = DATASETS.get("FMoW")(str(data_dir), [0], SMALL)
    frame = pd.read_csv(data_dir / "fmow_v1.1" / "rgb_metadata.csv")
    assert [env.name for env in dataset.environments] == [f"region_{i}" for i in range(6)]
    assert [len(env) for env in dataset.environments] == [5] * 6  # the fake's 'seq' row is not counted
    assert sum(len(env) for env in dataset.environments) == (frame["split"] != "seq").sum()
    # region 0 is the first country's region (China -> Asia), region 5 the unmapped 'Other'
    assert all(frame["country_code"][int(p.rsplit("_", 1)[1][:-4])] == "CHN" for p in dataset.environments[0].paths)
    assert all(frame["country_code"][int(p.rsplit("_", 1)[1][:-4])] == "XXX" for p in dataset.environments[5].paths)


def test_erm_trains_on_hospitals_end_to_end(data_dir, tmp_path, reader):
    cfg = TrainConfig(dataset="Camelyon17", algorithm="ERM", output_dir=str(tmp_path / "run"), test_envs=[2],
                      data_dir=str(data_dir), hparams=SMALL, steps=2, checkpoint_freq=1)
    records = train(cfg).records
    assert [r["step"] for r in records] == [0, 1]
    assert all(0.0 <= records[-1][f"env{i}_in_acc"] <= 1.0 for i in range(5))


@needs_wilds
@pytest.mark.parametrize("name, metric, n_envs", [
    ("Camelyon17Official", "acc_avg", 4), ("FMoWOfficial", "acc_worst_region", 5)])
def test_official_splits_record_wilds_metrics(data_dir, tmp_path, name, metric, n_envs):
    cfg = TrainConfig(dataset=name, algorithm="ERM", output_dir=str(tmp_path / "run"), test_envs=list(range(1, n_envs)),
                      data_dir=str(data_dir), hparams=SMALL, steps=1, checkpoint_freq=1, holdout_fraction=0.25)
    last = RunDirectory(train(cfg).output_dir).records()[-1]
    dataset = DATASETS.get(name)(str(data_dir), list(range(1, n_envs)), SMALL)
    assert dataset.environments[0].name == "train"
    test_index = [e.name for e in dataset.environments].index("test")
    assert f"wilds_test_{metric}" in last
    n = len(dataset.environments[test_index])
    n_out = int(n * 0.25)
    # WILDS' average accuracy over the whole split = our in/out accuracies weighted by their sizes
    expected = (last[f"env{test_index}_in_acc"] * (n - n_out) + last[f"env{test_index}_out_acc"] * n_out) / n
    assert last["wilds_test_acc_avg"] == pytest.approx(expected)
    assert not any(":" in key for key in last)


def test_official_splits_need_the_wilds_package(data_dir, monkeypatch):
    monkeypatch.setattr(wilds_module, "wilds_installed", lambda: False)
    with pytest.raises(DomaingenError, match=r"pip install 'domaingen-bench\[wilds\]'"):
        DATASETS.get("Camelyon17Official")(str(data_dir), [1, 2, 3], SMALL)


def test_official_splits_hold_out_every_split_but_train():
    with pytest.raises(DomaingenError, match="use --test_envs 1 2 3 4"):
        DATASETS.get("FMoWOfficial").check_test_envs([0])


@pytest.mark.parametrize("name, command", [("Camelyon17", "camelyon17"), ("FMoWOfficial", "fmow")])
def test_missing_data_gives_the_download_command(tmp_path, name, command):
    with pytest.raises(DataNotFoundError) as info:
        DATASETS.get(name)(str(tmp_path), [1, 2, 3, 4], SMALL)
    assert f"domaingen download --dataset {command} --data_dir {tmp_path}" in str(info.value)


def test_group_mean_stand_in_matches_a_direct_mean():
    from domaingen.datasets.wilds import scatter_mean

    values = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])
    groups = torch.tensor([0, 0, 2, 2, 2])
    assert scatter_mean(values, groups, dim_size=4).tolist() == pytest.approx([0.5, 0.0, 2 / 3, 0.0])
    assert scatter_mean(values, groups, dim_size=4, reduce="sum").tolist() == [1.0, 0.0, 2.0, 0.0]


@needs_wilds
def test_collect_tabulates_wilds_metrics_selected_on_the_ood_validation_split(data_dir, tmp_path):
    from domaingen.tables.collect import collect
    from domaingen.tables.reporting import build_tables, to_csv, to_markdown

    sweep = tmp_path / "sweep"
    for hparams_seed, trial in ((0, 0), (1, 0), (0, 1)):  # two draws in trial 0: selection across draws
        train(TrainConfig(dataset="FMoWOfficial", algorithm="ERM", output_dir=str(sweep / f"h{hparams_seed}t{trial}"),
                          test_envs=[1, 2, 3, 4], data_dir=str(data_dir), hparams=SMALL, hparams_seed=hparams_seed,
                          trial_seed=trial, steps=2, checkpoint_freq=1, holdout_fraction=0.25))
    collection = collect(sweep)
    tables = build_tables(collection, ["training", "oracle"])
    assert [t.key for t in tables] == ["FMoWOfficial/wilds/wilds"]  # no single test environment: no LODO tables
    table = tables[0]
    assert table.columns[0] == "test acc_worst_region"  # FMoW's primary metric first
    assert {"test acc_avg", "test acc_worst_year"} <= set(table.columns)
    # by hand: per trial, the checkpoint with the best OOD validation worst-region accuracy over every
    # draw and step; ties to the smaller hparams_seed, then the earlier step
    records = [r for run in sorted(sweep.iterdir()) for r in RunDirectory(run).records()]
    best = {}
    for trial in (0, 1):
        mine = [r for r in records if r["args"]["trial_seed"] == trial]
        best[trial] = max(mine, key=lambda r: (r["wilds_val_acc_worst_region"], -r["args"]["hparams_seed"], -r["step"]))
    for column, cell in zip(table.columns, table.rows["ERM"]):
        key = "wilds_" + column.replace(" ", "_", 1)
        assert cell.values == [best[0][key], best[1][key]]
    assert table.caption() == ("FMoWOfficial: WILDS' metrics of the OOD test split, selected per trial on "
                               "val_acc_worst_region (data: fmow_v1.1-30 (wilds reader); backbone resnet18, BatchNorm frozen; "
                               "protocol: paired)")
    assert "### FMoWOfficial: WILDS' metrics" in to_markdown(tables, collection)
    assert "test acc_worst_region" in to_csv(tables)
