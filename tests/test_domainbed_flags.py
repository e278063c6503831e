"""DomainBed's flags on domaingen's commands: aliases mean the same, the rest are one line naming what to do."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from domaingen.cli.domainbed_flags import translate
from domaingen.cli.main import main

FIXTURE = Path(__file__).parent / "fixtures" / "release_0_2_0"


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("argv, expected", [
    (["sweep", "launch", "--skip_confirmation", "--command_launcher", "multi_gpu", "--output_dir", "o"],
     ["sweep", "launch", "--yes", "--launcher", "parallel", "--output_dir", "o"]),
    (["sweep", "launch", "--command_launcher=dummy", "--single_test_envs"],
     ["sweep", "launch", "--launcher", "dry", "--no-pairs"]),
    (["sweep", "delete_incomplete", "--skip_confirmation"], ["sweep", "delete-incomplete", "--yes"]),
    (["-q", "collect", "--input_dir", "d", "--latex"], ["-q", "collect", "--input_dir", "d", "--format", "latex"]),
    (["train", "--task", "domain_generalization", "--steps", "3"], ["train", "--steps", "3"]),
    (["train", "--latex"], ["train", "--latex"]),  # not a train flag in DomainBed either: argparse refuses it
])
def test_domainbed_flags_become_domaingens(argv, expected):
    assert translate(argv) == expected


@pytest.mark.parametrize("argv, message", [
    (["sweep", "launch", "--n_hparams_from", "5"], "--n_hparams_from has no equivalent: a sweep runs hparams_seed 0 "
                                                   "to n_hparams - 1, and relaunching it with a larger --n_hparams "
                                                   "runs only the new draws"),
    (["sweep", "launch", "--seed", "3"], "sweep launch takes no --seed (DomainBed's sweep ignores it too)"),
    (["sweep", "launch", "--command_launcher", "slurm"], "--command_launcher slurm: DomainBed's launchers are local, "
                                                         "multi_gpu, dummy; use --launcher"),
    (["train", "--task", "domain_adaptation"], "--task domain_adaptation: domaingen runs domain generalization only"),
    (["train", "--uda_holdout_fraction", "0.1"], "--uda_holdout_fraction has no equivalent"),
    (["train", "--skip_model_save"], "--skip_model_save has no equivalent: a run keeps checkpoint.pt"),
    (["train", "--save_model_every_checkpoint"], "--save_model_every_checkpoint has no equivalent"),
    (["collect", "--input_dir", "d", "--auto_lr"], "--auto_lr has no equivalent: register the selection method"),
])
def test_domainbed_flags_without_an_equivalent_are_one_line_and_exit_2(capsys, argv, message):
    code, _, err = cli(capsys, *argv)
    assert code == 2 and err.startswith(f"domaingen: error: {message}") and len(err.splitlines()) == 1


def test_collect_latex_is_collect_format_latex(tmp_path, capsys):
    sweep = shutil.copytree(FIXTURE / "sweep", tmp_path / "sweep")
    code, text, _ = cli(capsys, "collect", "--input_dir", str(sweep), "--latex")
    assert code == 0 and "\\begin{tabular}" in text
    assert text == cli(capsys, "collect", "--input_dir", str(sweep), "--format", "latex")[1]


def test_a_domainbed_style_sweep_command_launches_and_deletes(tmp_path, capsys):
    sweep = shutil.copytree(FIXTURE / "sweep", tmp_path / "sweep")
    code, out, _ = cli(capsys, "sweep", "launch", "--spec", str(FIXTURE / "sweep.toml"), "--output_dir", str(sweep),
                       "--data_dir", "embedded", "--command_launcher", "local", "--skip_confirmation")
    assert code == 0 and "48 jobs: 48 done" in out and "nothing to launch" in out
    code, out, _ = cli(capsys, "sweep", "delete_incomplete", "--output_dir", str(sweep), "--skip_confirmation")
    assert code == 0 and "deleted 0 incomplete or failed job directories" in out


DOMAINBED_SWEEP = Path(__file__).parent / "fixtures" / "domainbed_b93c22a"


def test_collect_reads_a_directory_written_by_domainbeds_own_train_py(capsys):
    """Two runs of DomainBed b93c22a's `python -m domainbed.scripts.train --dataset ColoredMNIST --algorithm ERM
    --test_envs 2 --steps 2 --checkpoint_freq 1 --trial_seed {0,1} --skip_model_save` on real MNIST, as it left them."""
    expected = []
    for run in ("run0", "run1"):
        records = [json.loads(line) for line in (DOMAINBED_SWEEP / run / "results.jsonl").read_text().splitlines()]
        best = max(records, key=lambda r: (r["env0_out_acc"] + r["env1_out_acc"]) / 2)  # the first best wins
        expected.append(best["env2_in_acc"])
    mean = 100 * sum(expected) / 2
    bar = 100 * abs(expected[0] - expected[1]) / 2 / math.sqrt(2)  # DomainBed's std(x / sqrt(n)), ddof 0, n = 2
    code, text, _ = cli(capsys, "collect", "--input_dir", str(DOMAINBED_SWEEP))
    first = text.split("\n\n")[:2]
    assert code == 0 and first[0] == ("### ColoredMNIST: test accuracy, training-domain validation (data: unknown; "
                                      "protocol: domainbed)")
    assert f"| ERM         | {mean:.1f} ± {bar:.1f} †" in first[1]
