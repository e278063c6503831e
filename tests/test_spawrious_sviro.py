"""SVIRO and the six Spawrious benchmarks as DomainBed builds them (datasets.py at HEAD b93c22a), on generated trees."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from domaingen.cli.main import main
from domaingen.datasets import DATASETS, ImageFolderDataset
from domaingen.datasets.images import PACS
from domaingen.errors import DataNotFoundError
from domaingen.run import protocol
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from imagetree import SVIRO_VEHICLES, make_spawrious_tree, make_sviro_tree

SMALL = {"featurizer": "MLP", "pretrained": False, "image_size": 8, "batch_size": 4, "num_workers": 0}

# DomainBed's constructor arguments, copied as data: (group, test, filler) and whether it is one-to-one
DOMAINBED_SPAWRIOUS = {
    "SpawriousO2O_easy": (["desert", "jungle", "dirt", "snow"], ["dirt", "snow", "desert", "jungle"], "beach"),
    "SpawriousO2O_medium": (["mountain", "beach", "dirt", "jungle"], ["jungle", "dirt", "beach", "snow"], "desert"),
    "SpawriousO2O_hard": (["jungle", "mountain", "snow", "desert"], ["mountain", "snow", "desert", "jungle"], "beach"),
    "SpawriousM2M_easy": (["desert", "mountain", "dirt", "jungle"], ["dirt", "jungle", "mountain", "desert"], None),
    "SpawriousM2M_medium": (["beach", "snow", "mountain", "desert"], ["desert", "mountain", "beach", "snow"], None),
    "SpawriousM2M_hard": (["dirt", "jungle", "snow", "beach"], ["snow", "beach", "dirt", "jungle"], None),
}
CLASS_LIST = ["bulldog", "corgi", "dachshund", "labrador"]


def domainbed_tables(group, test, filler):
    """DomainBed's combination dictionaries (build_type1/2_combination), in its own format."""
    if filler is not None:
        c = [int(0.97 * 3168), int(0.87 * 3168)]
        train_ = {("bulldog",): [(group[0], c[0]), (group[0], c[1])], ("dachshund",): [(group[1], c[0]), (group[1], c[1])],
                  ("labrador",): [(group[2], c[0]), (group[2], c[1])], ("corgi",): [(group[3], c[0]), (group[3], c[1])],
                  ("bulldog", "dachshund", "labrador", "corgi"): [(filler, 3168 - c[0]), (filler, 3168 - c[1])]}
        test_ = {("bulldog",): [test[0]] * 2, ("dachshund",): [test[1]] * 2, ("labrador",): [test[2]] * 2,
                 ("corgi",): [test[3]] * 2}
    else:
        train_ = {("bulldog",): [(group[0], 3168), (group[1], 3168)], ("dachshund",): [(group[1], 3168), (group[0], 3168)],
                  ("labrador",): [(group[2], 3168), (group[3], 3168)], ("corgi",): [(group[3], 3168), (group[2], 3168)]}
        test_ = {("bulldog",): [test[0], test[1]], ("dachshund",): [test[1], test[0]], ("labrador",): [test[2], test[3]],
                 ("corgi",): [test[3], test[2]]}
    return train_, test_


def expand(table, one_to_one):
    """Per group index: the (folder, location, breed, limit) entries in DomainBed's concatenation order."""
    groups = [[], []]
    for breeds, entries in table.items():
        for ind, entry in enumerate(entries):
            location, limit = entry if isinstance(entry, tuple) else (entry, None)
            groups[ind] += [(ind if one_to_one else 0, location, breed, limit) for breed in breeds]
    return groups


def expected_environments(name):
    group, test, filler = DOMAINBED_SPAWRIOUS[name]
    train_, test_ = domainbed_tables(group, test, filler)
    one_to_one = filler is not None
    tests, trains = expand(test_, one_to_one), expand(train_, one_to_one)
    return {"Test": tests[0] + tests[1], "SC_group_1": trains[0], "SC_group_2": trains[1]}


@pytest.fixture(scope="module")
def spawrious_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("spawrious")
    # 100 images where O2O_easy's first group takes the first 96 of the beach filler
    make_spawrious_tree(root, per_group=2, counts={"0/beach/bulldog": 100, "1/dirt/dachshund": 5})
    return root


@pytest.fixture(scope="module")
def sviro_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("sviro")
    make_sviro_tree(root, per_class=2)
    return root


def test_environment_lists_and_constants_are_domainbeds():
    assert DATASETS.get("SVIRO").ENVIRONMENTS == ("aclass", "escape", "hilux", "i3", "lexus", "tesla", "tiguan",
                                                  "tucson", "x5", "zoe")
    assert (DATASETS.get("SVIRO").CHECKPOINT_FREQ, DATASETS.get("SVIRO").N_STEPS) == (300, 5001)
    for name in DOMAINBED_SPAWRIOUS:
        cls = DATASETS.get(name)
        assert list(cls.ENVIRONMENTS) == ["Test", "SC_group_1", "SC_group_2"]
        assert (cls.CHECKPOINT_FREQ, cls.N_STEPS, cls.NUM_CLASSES, cls.INPUT_SHAPE) == (100, 5001, 4, (3, 224, 224))
        assert cls.hparam_space() == PACS.hparam_space()  # DomainBed's default image hyperparameters
        assert protocol.covered_by_domainbed("ERM", name)
        assert protocol.domainbed_run_seed(name, "ERM", [0], 0, 0) == protocol.domainbed_seed_hash(name, "ERM", [0], 0, 0)
    assert protocol.covered_by_domainbed("ERM", "SVIRO")


@pytest.mark.parametrize("name", list(DOMAINBED_SPAWRIOUS))
def test_each_group_lands_in_domainbeds_environment(spawrious_dir, name):
    dataset = DATASETS.get(name)(str(spawrious_dir), [0], SMALL)
    root = spawrious_dir / "spawrious224"
    expected = expected_environments(name)
    assert [env.name for env in dataset.environments] == list(expected)
    for env in dataset.environments:
        want_paths, want_labels = [], []
        for folder, location, breed, limit in expected[env.name]:
            directory = root / str(folder) / location / breed
            names = sorted(p.name for p in directory.iterdir() if p.suffix in (".png", ".jpg", ".jpeg"))
            want_paths += [str(directory / n) for n in (names[:limit] if limit else names)]
            want_labels += [CLASS_LIST.index(breed)] * len(names[:limit] if limit else names)
        assert env.paths == want_paths
        assert env.y.tolist() == want_labels


def test_limits_cut_the_sorted_names(spawrious_dir):
    dataset = DATASETS.get("SpawriousO2O_easy")(str(spawrious_dir), [0], SMALL)
    filler = [p for p in dataset.environments[1].paths if "/0/beach/bulldog/" in p]
    assert len(filler) == 96 == 3168 - int(0.97 * 3168)
    assert [Path(p).name for p in filler] == [f"beach_bulldog_{i:04d}.{('png', 'jpg', 'jpeg')[i % 3]}" for i in range(96)]
    # O2O reads its second group from folder 1, the M2M benchmarks only folder 0
    medium_test = DATASETS.get("SpawriousO2O_medium")(str(spawrious_dir), [0], SMALL)[0].paths
    assert sum("/1/dirt/dachshund/" in p for p in medium_test) == 5
    assert all("/spawrious224/0/" in p for env in DATASETS.get("SpawriousM2M_hard")(str(spawrious_dir), [0], SMALL)
               for p in env.paths)
    # 2 images per group: Test 8 groups, SC_group_1 4 + 4 filler groups (one of 100 cut to 96)
    assert [len(env) for env in dataset.environments] == [16, 8 + 6 + 96, 16]


def test_augmentation_is_tied_to_the_environment_as_in_domainbed(spawrious_dir):
    from torchvision import transforms as T

    dataset = DATASETS.get("SpawriousM2M_easy").built_as_domainbed(3)(str(spawrious_dir), [1], SMALL)
    examples = dataset.examples()
    assert [type(t) for t in examples.train_tf.transforms] == [T.Resize, T.RandomHorizontalFlip, T.ColorJitter,
                                                               T.RandomGrayscale, T.ToTensor, T.Normalize]
    plain = examples[(0, 0, None)][0]
    assert torch.equal(examples[(0, 0, 12345)][0], plain)  # Test: never augmented, even when drawn with a seed
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(12345)
        from domaingen.datasets.loading import load_rgb
        augmented = examples.train_tf(load_rgb(dataset.environments[1].paths[0]))
    assert torch.equal(examples[(1, 0, 12345)][0], augmented)
    # DomainBed evaluates SC_group_1 through the augmentation although it is the test environment here
    assert dataset._eval_augmentation_seed(0, 0) is None and dataset._eval_augmentation_seed(1, 0) is not None


def test_sviro_is_an_image_folder_of_ten_vehicles(sviro_dir):
    cls = DATASETS.get("SVIRO")
    assert issubclass(cls, ImageFolderDataset) and cls.hparam_space() == PACS.hparam_space()
    dataset = cls(str(sviro_dir), [0], SMALL)
    assert [env.name for env in dataset.environments] == list(SVIRO_VEHICLES)
    assert dataset.classes == ["0", "1", "2"]
    for env in dataset.environments:
        assert [Path(p).parent.parent.name for p in env.paths] == [env.name] * 6
        assert env.y.tolist() == [0, 0, 1, 1, 2, 2]


def test_missing_spawrious_data_names_the_folder_and_the_download(tmp_path):
    with pytest.raises(DataNotFoundError) as info:
        DATASETS.get("SpawriousO2O_hard")(str(tmp_path), [0], SMALL)
    message = str(info.value)
    assert "\n" not in message and f"{tmp_path / 'spawrious224' / '0' / 'mountain' / 'bulldog'} is missing" in message
    assert f"domaingen download --dataset spawrious --data_dir {tmp_path}" in message


@pytest.mark.parametrize("name, fixture", [("SpawriousO2O_easy", "spawrious_dir"), ("SVIRO", "sviro_dir")])
def test_a_three_step_run_trains_and_is_tabulated(name, fixture, request, tmp_path):
    from domaingen.tables.collect import collect
    from domaingen.tables.reporting import build_tables

    data_dir = request.getfixturevalue(fixture)
    sweep = tmp_path / "sweep"
    train(TrainConfig(dataset=name, algorithm="ERM", output_dir=str(sweep / "run"), test_envs=[0],
                      data_dir=str(data_dir), hparams=SMALL, steps=3, checkpoint_freq=1))
    records = RunDirectory(sweep / "run").records()
    assert [r["step"] for r in records] == [0, 1, 2]
    n_envs = len(DATASETS.get(name).ENVIRONMENTS)
    # training-domain validation by hand: the best mean `out` accuracy of the training environments, earliest first
    best = max(records, key=lambda r: (sum(r[f"env{i}_out_acc"] for i in range(1, n_envs)), -r["step"]))
    tables = build_tables(collect(sweep), ["training"])
    cell = tables[0].rows["ERM"][0]
    assert cell.values == [pytest.approx(best["env0_in_acc"])]


def test_spawrious_trains_from_the_command_line(spawrious_dir, tmp_path, capsys):
    code = main(["-q", "train", "--dataset", "SpawriousM2M_medium", "--algorithm", "ERM", "--test_envs", "0",
                 "--data_dir", str(spawrious_dir), "--steps", "2", "--checkpoint_freq", "1",
                 "--hparams", json.dumps(SMALL), "--output_dir", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    record = RunDirectory(tmp_path / "run").records()[-1]
    # Test: 8 groups of 2; SC_group_1: bulldog at beach (100 images, under the limit of 3168) and 3 groups of 2;
    # SC_group_2: 4 groups of 2
    assert record["data_source"] == f"spawrious224-SpawriousM2M_medium-{16 + 100 + 6 + 8}"
