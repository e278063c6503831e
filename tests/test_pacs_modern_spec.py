"""sweeps/pacs_modern.toml: what it launches, and a tiny version of each part run end to end on a
generated PACS-layout tree (small timm models of the same families, no weights, a few steps)."""

from __future__ import annotations

import csv
import io
import tomllib
from pathlib import Path

import pytest

from domaingen.cli import main as cli_main
from domaingen.sweep.spec import build_jobs, parse_spec, select_parts
from domaingen.run.training import train
from imagetree import make_folder_tree

pytest.importorskip("timm", reason="the spec's backbones need the [timm] extra: pip install timm")

SPEC = Path(__file__).resolve().parents[1] / "sweeps" / "pacs_modern.toml"
ALGORITHMS = ["ERM", "ERMPlusPlus", "ERM+EMA", "ERM+SWAD", "CORAL+SWAD"]
# each part's backbone -> a tiny timm model of the same family (BatchNorm CNN, ViT), built without weights
TINY_BACKBONE = {"resnet50_augmix": "timm:resnet10t", "dinov2": "timm:test_vit"}
TINY = {"pretrained": False, "image_size": 32, "batch_size": 2, "num_workers": 0}
TINY_ALGORITHM = {
    "ERMPlusPlus": {"linear_steps": 1, "sma_start_iter": 2},
    "ERM+SWAD": {"swad_n_converge": 1, "swad_n_tolerance": 1, "swad_bn_steps": 1},
    "CORAL+SWAD": {"swad_n_converge": 1, "swad_n_tolerance": 1, "swad_bn_steps": 1},
}


def spec_data(part: int) -> dict:
    with open(SPEC, "rb") as f:
        return select_parts(tomllib.load(f), [part], str(SPEC))


def test_each_part_launches_the_four_methods_on_its_backbone():
    expected = {1: ("resnet50_augmix", False, ALGORITHMS), 2: ("dinov2", False, ALGORITHMS),
                3: ("resnet50", True, ["ERM", "ERM+SWAD"])}
    for part, (backbone, freeze_bn, algorithms) in expected.items():
        jobs = build_jobs(parse_spec(spec_data(part), str(SPEC)))
        assert sorted({j.args["algorithm"] for j in jobs}) == sorted(algorithms)
        assert {(j.args["hparams"]["backbone"], j.args["hparams"]["freeze_bn"]) for j in jobs} == {(backbone, freeze_bn)}
        assert {(j.args["dataset"], j.args["steps"], j.args["checkpoint_freq"]) for j in jobs} == {("PACS", 5001, 300)}
        draws = 20 if part < 3 else 1
        assert len(jobs) == len(algorithms) * 4 * draws * 3  # 4 held-out domains x draws x 3 trials


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_folder_tree(root / "PACS", ["art_painting", "cartoon", "photo", "sketch"], ["dog", "horse"], per_class=3)
    return root


@pytest.mark.parametrize("part", [1, 2])
def test_a_tiny_version_of_each_part_runs_and_collects(part, data_dir, tmp_path, capsys):
    data = spec_data(part)
    backbone = data["parts"][0]["hparams"]["backbone"]
    data["parts"][0]["hparams"] = {**data["parts"][0]["hparams"], **TINY, "backbone": TINY_BACKBONE[backbone]}
    data.update(n_hparams=1, n_trials=1, steps=2, checkpoint_freq=1, test_envs=[3], algorithm_hparams=TINY_ALGORITHM)
    jobs = build_jobs(parse_spec(data, "tiny"))
    assert len(jobs) == len(ALGORITHMS)
    for job in jobs:
        records = train(job.config(tmp_path, str(data_dir))).records
        assert records[-1]["step"] == 1
    capsys.readouterr()
    assert cli_main(["collect", "--input_dir", str(tmp_path), "--format", "csv", "--selection", "training"]) == 0
    table = capsys.readouterr().out
    rows = [row for row in csv.DictReader(io.StringIO(table)) if row["table"] == "test"]
    assert sorted(row["algorithm"] for row in rows) == sorted(ALGORITHMS)
    tiny = TINY_BACKBONE[backbone]
    assert all(f"backbone {tiny}, " in row["data_source"] for row in rows)  # the caption names the backbone
