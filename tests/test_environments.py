"""Held-out environments by index or by name, in `train`, in specs and in `sweep launch --test_envs`."""

from __future__ import annotations

import json
import shlex

import pytest

from conftest import FAST_HPARAMS
from domaingen.cli.main import main, protect_environment_names
from domaingen.datasets import DATASETS
from domaingen.datasets.base import MultiDomainDataset
from domaingen.errors import DomaingenError
from domaingen.run.training import TrainConfig, resolve
from domaingen.sweep.spec import build_jobs, load_spec, parse_spec

CMNIST = DATASETS.get("ColoredMNIST")  # 0=+90%, 1=+80%, 2=-90%
ROTATED = DATASETS.get("RotatedMNIST")  # 0=0, 1=15, 2=30, 3=45, 4=60, 5=75


def test_environment_by_index_or_name():
    assert [CMNIST.environment_index(t) for t in (2, "2", "-90%", "+80%", " 0 ")] == [2, 2, 2, 1, 0]
    # RotatedMNIST's names are numbers: an index in range is an index, a number out of range that names one is it
    assert [ROTATED.environment_index(t) for t in (0, "1", "15", 75)] == [0, 1, 1, 5]
    assert CMNIST.resolve_test_envs(["-90%", 0]) == [0, 2]


def test_unknown_or_ambiguous_environment_is_one_line():
    with pytest.raises(DomaingenError) as info:
        CMNIST.environment_index("-95%")
    assert str(info.value) == ("unknown test environment '-95%' of ColoredMNIST; give an index or a name: "
                               "0=+90%, 1=+80%, 2=-90%")

    class Shuffled(MultiDomainDataset):
        ENVIRONMENTS = ("2", "0", "1")

    with pytest.raises(DomaingenError, match="test environment 0 of Shuffled is ambiguous: index 0 is '2' but '0' "
                                             "names environment 1"):
        Shuffled.environment_index("0")


def test_environment_names_any_case():
    class Sites(MultiDomainDataset):
        ENVIRONMENTS = ("north", "South")

    assert Sites.environment_index("NORTH") == 0 and Sites.environment_index("south") == 1


def test_train_resolves_names_to_the_indices_it_records(tmp_path):
    by_name = resolve(TrainConfig(dataset="coloredmnist", algorithm="erm", test_envs=["-90%"], data_dir="embedded",
                                  hparams=json.dumps(FAST_HPARAMS), output_dir=str(tmp_path)))
    by_index = resolve(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", test_envs=[2], data_dir="embedded",
                                   hparams=json.dumps(FAST_HPARAMS), output_dir=str(tmp_path)))
    assert by_name.args["test_envs"] == [2] and by_name.args["dataset"] == "ColoredMNIST"
    assert by_name.args["algorithm"] == "ERM"
    assert by_name.args == by_index.args  # the same run: same identity, same seed


def spec(test_envs, datasets=("ColoredMNIST",)) -> list[list[int]]:
    data = {"algorithms": ["ERM"], "datasets": list(datasets), "n_hparams": 1, "n_trials": 1, "test_envs": test_envs}
    return [(job.args["dataset"], job.args["test_envs"]) for job in build_jobs(parse_spec(data))]


def test_spec_test_envs_forms():
    assert spec([2]) == spec([[2]]) == spec(["-90%"]) == spec([["-90%"]]) == [("ColoredMNIST", [2])]
    assert spec([0, 2]) == [("ColoredMNIST", [0]), ("ColoredMNIST", [2])]  # one single-environment run per entry
    assert spec([[0, 1], 2]) == [("ColoredMNIST", [0, 1]), ("ColoredMNIST", [2])]
    assert spec([2, "-90%"]) == [("ColoredMNIST", [2])]  # the same set twice is one run
    # names resolve per dataset
    assert spec(["+90%"], ["ColoredMNIST", "IRMColoredMNIST"]) == [("ColoredMNIST", [0]), ("IRMColoredMNIST", [0])]


@pytest.mark.parametrize("text, message", [
    ('test_envs = [true]', 'test_envs must be a list of held-out sets, e.g. [2] (environment 2), ["-90%"] (by name) '
                           "or [[0], [1, 2]] (two runs), got [True] ("),
    ('test_envs = 2', 'test_envs must be a list of held-out sets, e.g. [2] (environment 2), ["-90%"] (by name) or '
                      "[[0], [1, 2]] (two runs), got 2 ("),
    ('test_envs = ["-95%"]', "'test_envs' for ColoredMNIST: unknown test environment '-95%' of ColoredMNIST; "
                             "give an index or a name: 0=+90%, 1=+80%, 2=-90%"),
])
def test_bad_test_envs_say_what_to_write(tmp_path, text, message):
    path = tmp_path / "s.toml"
    path.write_text(f'algorithms = ["ERM"]\ndatasets = ["ColoredMNIST"]\n{text}\n')
    with pytest.raises(DomaingenError) as info:
        load_spec(path)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_protect_environment_names_keeps_options():
    argv = ["sweep", "launch", "--test_envs", "-90%", "0,-90%", "-y", "--steps", "-3"]
    assert protect_environment_names(argv) == ["sweep", "launch", "--test_envs", " -90%", " 0,-90%"[1:], "-y",
                                               "--steps", "-3"]


def test_sweep_launch_test_envs_flag(tmp_path, capsys):
    code = main(["-q", "sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--test_envs",
                 "-90%", "0,+80%", "--n_hparams", "1", "--n_trials", "1", "--launcher", "dry",
                 "--output_dir", str(tmp_path / "sweep"), "--yes"])
    out = capsys.readouterr().out
    assert code == 0
    held_out = []
    for line in out.splitlines():
        if line.startswith("domaingen train"):
            argv = shlex.split(line)
            start = argv.index("--test_envs") + 1
            held_out.append([int(a) for a in argv[start:start + 2] if a.isdigit()])
    assert held_out == [[2], [0, 1]]


def test_train_test_envs_by_name_on_the_command_line(tmp_path, capsys):
    code = main(["-q", "train", "--dataset", "coloredmnist", "--algorithm", "erm", "--test_envs", "-90%",
                 "--data_dir", "embedded", "--steps", "1", "--checkpoint_freq", "1",
                 "--hparams", json.dumps(FAST_HPARAMS), "--output_dir", str(tmp_path / "run")])
    assert code == 0
    args = json.loads((tmp_path / "run" / "args.json").read_text())
    assert (args["test_envs"], args["dataset"], args["algorithm"]) == ([2], "ColoredMNIST", "ERM")


def test_batches_gathered_by_index_equal_advanced_indexing():
    import torch

    from domaingen.datasets.environment import Environment

    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (50, 2, 3, 3), dtype=torch.uint8, generator=g)
    y = torch.randint(0, 10, (50,), generator=g)
    scaled, divided = Environment("a", x, y), Environment("b", x, y, divisor=255.0)
    index = torch.tensor([7, 0, 49, 7, 13])
    for env, expected in ((scaled, x[index].float() * (1.0 / 255.0)), (divided, x[index].float() / 255.0)):
        inputs, labels = env.batch(index)
        assert torch.equal(inputs, expected) and torch.equal(labels, y[index])
        sliced, sliced_labels = env.batch(slice(10, 20))  # a slice keeps the plain path
        assert torch.equal(sliced, env.batch(torch.arange(10, 20))[0]) and torch.equal(sliced_labels, y[10:20])
