"""sweeps/dmg_pacs.toml and sweeps/dmg_domainnet.toml: the paper's settings, and a smoke run of each
on a generated folder tree (the full runs are for a machine with the data and a GPU)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pytest

from domaingen.cli.main import main
from domaingen.run.rundir import RunDirectory
from domaingen.sweep.spec import build_jobs, load_spec
from domaingen.tables.collect import collect
from domaingen.tables.reporting import build_tables
from imagetree import make_folder_tree

SWEEPS = Path(__file__).resolve().parents[1] / "sweeps"
SPECS = {"dmg_pacs.toml": "PACS", "dmg_domainnet.toml": "DomainNet"}
LAMBDAS = [0.0, 0.001, 0.01, 0.1, 1.0]
# the paper's optimisation, as prithv1/DMG's configs give it (weight decay: PACS 1e-5, DomainNet 0)
PRESETS = {"dmg_pacs.toml": {"lr": 1e-4, "weight_decay": 1e-5}, "dmg_domainnet.toml": {"lr": 1e-4, "weight_decay": 0.0}}
SMOKE = {"pretrained": False, "image_size": 32, "batch_size": 2, "num_workers": 0}
DOMAINS = {"PACS": ["art_painting", "cartoon", "photo", "sketch"],
           "DomainNet": ["clipart", "infograph", "painting", "quickdraw", "real", "sketch"]}


@pytest.mark.parametrize("name", SPECS)
def test_parts_hold_the_backbones_the_preset_and_a_lambda_only_grid(name):
    parts = load_spec(SWEEPS / name).sub_specs()
    assert [p.hparams["backbone"] for p in parts] == ["resnet18", "resnet50"] * 2 + ["resnet18"] * 5
    assert all(p.in_domain_test == 0.1 and p.n_hparams == 1 for p in parts)  # defaults, not a search
    for part in parts[:4]:
        assert part.algorithms == ["ERM", "MultiHead", "DMG"]
        assert "pretrained" not in part.hparams  # ImageNet weights: the default
    for part in parts[2:4]:
        assert {k: part.hparams[k] for k in PRESETS[name]} == PRESETS[name]
        assert part.algorithm_hparams == {"DMG": {"dmg_mask_lr": 1e-4}}
    lambda_parts = parts[4:]
    assert [p.algorithm_hparams["DMG"] for p in lambda_parts] == [{"dmg_lambda_o": v} for v in LAMBDAS]
    assert all(p.algorithms == ["DMG"] and p.hparams == {"backbone": "resnet18"} for p in lambda_parts)
    jobs = build_jobs(load_spec(SWEEPS / name))
    n_envs = len(DOMAINS[SPECS[name]])
    assert len(jobs) == (4 * 3 + 5) * n_envs * 3  # parts x algorithms, every held-out env, 3 trials


def smoke_spec(tmp_path: Path, name: str, parts: list[int]) -> Path:
    """The spec's chosen parts at smoke scale: one held-out env, one trial, two steps, tiny images."""
    data = tomllib.loads((SWEEPS / name).read_text())
    chosen = [data["parts"][i - 1] for i in parts]
    for part in chosen:
        part["hparams"] = {**part["hparams"], **SMOKE}
    lines = [f'algorithms = {data["algorithms"]!r}'.replace("'", '"'), f'datasets = ["{data["datasets"][0]}"]',
             "n_hparams = 1", "n_trials = 1", "steps = 1", "checkpoint_freq = 1", "test_envs = [0]",
             # a tree of 12 images per class: a larger third split keeps every class in it
             "in_domain_test = 0.3"]
    for part in chosen:
        lines.append("[[parts]]")
        if "algorithms" in part:
            lines.append(f'algorithms = {part["algorithms"]!r}'.replace("'", '"'))
        lines.append("[parts.hparams]")
        lines += [f"{k} = {str(v).lower() if isinstance(v, bool) else repr(v).replace(chr(39), chr(34))}"
                  for k, v in part["hparams"].items()]
        for algorithm, values in part.get("algorithm_hparams", {}).items():
            lines.append(f"[parts.algorithm_hparams.{algorithm}]")
            lines += [f"{k} = {v!r}" for k, v in values.items()]
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


# PACS: the ResNet-18 part with every algorithm; DomainNet (six domains): one lambda_O part, DMG alone
@pytest.mark.parametrize("name, parts, algorithms", [("dmg_pacs.toml", [1], {"ERM", "MultiHead", "DMG"}),
                                                     ("dmg_domainnet.toml", [5], {"DMG"})])
def test_each_spec_runs_end_to_end_on_a_generated_tree(tmp_path, capsys, name, parts, algorithms):
    dataset = SPECS[name]
    make_folder_tree(tmp_path / "data" / dataset, DOMAINS[dataset], ["dog", "horse"], per_class=12, size=16)
    spec = smoke_spec(tmp_path, name, parts)
    out = tmp_path / "sweep"
    assert main(["-q", "sweep", "launch", "--spec", str(spec), "--output_dir", str(out),
                 "--data_dir", str(tmp_path / "data"), "--launcher", "local"]) == 0
    capsys.readouterr()
    runs = [RunDirectory(p) for p in sorted(out.iterdir()) if (p / "args.json").exists()]
    assert all(r.state() == "done" for r in runs)
    last = {r.read_args()["algorithm"]: r.records()[-1] for r in runs}
    assert set(last) == algorithms
    dmg = last["DMG"]
    # the three test modes of DMG, and the in-domain test splits of the training envs only
    assert {"env1_in_acc", "env1_in_acc_mask_ens", "env1_in_acc_kd", "env1_idtest_acc_kd"} <= set(dmg)
    assert "env0_in_acc_kd" not in dmg and "env0_idtest_acc" not in dmg
    tables = {t.key: t for t in build_tables(collect(str(out)), ["training"])}
    indomain = tables[f"{dataset}/training/indomain"]
    rows = {"DMG", "DMG-KD", "DMG-MaskEns"} | ({"MultiHead", "MultiHead-KD", "ERM"} if "ERM" in algorithms else set())
    assert set(indomain.rows) == rows
    assert "in-domain test splits (0.3 of each)" in indomain.title
    # the KD row reads the known-domain mode's own in-domain test accuracy
    train_envs = range(1, len(DOMAINS[dataset]))
    steps = [r.records() for r in runs if r.read_args()["algorithm"] == "DMG"][0]
    chosen = max(steps, key=lambda r: (np.mean([r[f"env{i}_out_acc_kd"] for i in train_envs]), -r["step"]))
    assert indomain.rows["DMG-KD"][0].values == [pytest.approx(np.mean([chosen[f"env{i}_idtest_acc_kd"]
                                                                        for i in train_envs]))]


@pytest.mark.parametrize("spec_name, setting, message", [
    ("dmg_pacs.toml", "dmg_lambda_o = 0.001", "parts[5]: DMG: dmg_lambda_o must be >= 0"),
    ("dmg_sparsity_rmnist.toml", "dmg_lambda_s = 0.001",
     "parts[3]: DMG: dmg_lambda_s must be >= 0 (the weight of the sparsity penalty)"),
])
def test_a_negative_lambda_in_a_grid_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, spec_name, setting,
                                                                           message):
    text = (SWEEPS / spec_name).read_text().replace(setting, setting.replace("= ", "= -"))
    spec = tmp_path / "bad.toml"
    spec.write_text(text)
    out = tmp_path / "sweep"
    code = main(["-q", "sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--launcher", "dry"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert len(err.splitlines()) == 1 and message in err
