"""Collecting DomainBed's own output directories, whose hyperparameters depend on the trial.

The fixture writes run directories as DomainBed's train.py does: results.jsonl
records with its field names (args with hparams_seed, trial_seed, test_envs and
hparams; env{i}_{in,out}_acc, step, epoch, loss, mem_gb, step_time) and a `done`
file, no args.json. Its draws differ per trial, as DomainBed's do (they are seeded
by (hparams_seed, trial_seed)), so only per-trial selection is meaningful there.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from domaingen.cli.main import main
from domaingen.tables.collect import collect
from domaingen.tables.reporting import build_tables, to_csv

# (trial_seed, hparams_seed) -> per checkpoint (step 0, 100, 200): (validation, test) accuracy for test env 0.
# Validation is the mean `out` accuracy of the training envs 1 and 2, both set to it.
CHECKPOINTS = {
    (0, 0): [(.70, .10), (.80, .20), (.75, .30)],  # best: step 100, test .20
    (0, 1): [(.60, .40), (.85, .50), (.85, .60)],  # best: .85, tie -> the earlier step 100, test .50
    (0, 2): [(.50, .70), (.55, .75), (.60, .80)],  # best: step 200, test .80
    (1, 0): [(.90, .35), (.60, .95), (.60, .95)],  # best: step 0, test .35
    (1, 1): [(.65, .45), (.70, .45), (.60, .15)],  # best: step 100, test .45
    (1, 2): [(.40, .99), (.50, .99), (.55, .99)],  # best: step 200, test .99
}
# Per trial, the best draw: trial 0 -> draw 1 (.85, test .50), trial 1 -> draw 0 (.90, test .35).
PER_TRIAL_TESTS = [.50, .35]
# Pooled over trials: draw 0 validates at (.80 + .90) / 2 = .85 > draw 1's (.85 + .70) / 2, draw 2's .575,
# so both trials report draw 0: tests .20 and .35.
POOLED_TESTS = [.20, .35]


def domainbed_hparams(hparams_seed: int, trial_seed: int) -> dict:
    """Stands for DomainBed's random_hparams(seed_hash(hparams_seed, trial_seed)): differs per trial."""
    if hparams_seed == 0:
        return {"batch_size": 64, "lr": 1e-3, "weight_decay": 0.0}
    rng = np.random.default_rng([hparams_seed, trial_seed])
    return {"batch_size": int(2 ** rng.uniform(3, 9)), "lr": float(10 ** rng.uniform(-4.5, -2.5)),
            "weight_decay": float(10 ** rng.uniform(-6, -2))}


def write_domainbed_run(root: Path, trial: int, draw: int, checkpoints) -> Path:
    # DomainBed names a run by a hash of its args; the last two characters here say trial and draw
    run = root / f"{hashlib.md5(f'ERM{trial}{draw}'.encode()).hexdigest()[:30]}{trial}{draw}"
    run.mkdir()
    args = {"algorithm": "ERM", "checkpoint_freq": 100, "data_dir": "/data", "dataset": "ColoredMNIST",
            "holdout_fraction": 0.2, "hparams": None, "hparams_seed": draw, "output_dir": str(run),
            "save_model_every_checkpoint": False, "seed": 0, "skip_model_save": False, "steps": 201,
            "task": "domain_generalization", "test_envs": [0], "trial_seed": trial, "uda_holdout_fraction": 0}
    lines = []
    for step, (val, test) in zip((0, 100, 200), checkpoints):
        record = {"args": args, "epoch": step / 291.0, "hparams": domainbed_hparams(draw, trial), "loss": 0.6,
                  "mem_gb": 0.1, "step": step, "step_time": 0.01,
                  "env0_in_acc": test, "env0_out_acc": test - .01, "env1_in_acc": .9, "env1_out_acc": val,
                  "env2_in_acc": .9, "env2_out_acc": val}
        lines.append(json.dumps(record, sort_keys=True))
    (run / "results.jsonl").write_text("\n".join(lines) + "\n")
    (run / "out.txt").write_text("")
    (run / "done").write_text("done")
    return run


@pytest.fixture
def domainbed_dir(tmp_path) -> Path:
    root = tmp_path / "domainbed_sweep"
    root.mkdir()
    for (trial, draw), checkpoints in CHECKPOINTS.items():
        write_domainbed_run(root, trial, draw, checkpoints)
    return root


def _env0_cell(root: Path, hparams_choice: str = "per_trial"):
    tables = build_tables(collect(root), ["training"], hparams_choice)
    return tables[0].rows["ERM"][0], tables


def test_the_fixture_draws_differ_per_trial():
    assert domainbed_hparams(1, 0) != domainbed_hparams(1, 1) and domainbed_hparams(2, 0) != domainbed_hparams(2, 1)


def test_per_trial_selection_on_domainbed_runs_equals_the_hand_computation(domainbed_dir):
    cell, _ = _env0_cell(domainbed_dir)
    assert cell.values == pytest.approx(PER_TRIAL_TESTS)
    assert [t["hparams_seed"] for t in cell.trace] == [1, 0] and [t["step"] for t in cell.trace] == [100, 0]
    assert cell.mean == pytest.approx(.425)
    # DomainBed's error bar: std([.50, .35] / sqrt(2)), ddof 0 = (.15 / 2) / sqrt(2)
    assert cell.domainbed_se == pytest.approx(.075 / math.sqrt(2))
    assert cell.text() == "42.5 ± 5.3 †" and cell.marks == "†"  # trial 1 selected step 0
    pooled, _ = _env0_cell(domainbed_dir, "pooled")
    assert pooled.values == pytest.approx(POOLED_TESTS) and pooled.mean != pytest.approx(cell.mean)


def test_csv_names_the_selected_runs_and_their_hyperparameters(domainbed_dir, capsys):
    assert main(["-q", "collect", "--input_dir", str(domainbed_dir), "--selection", "training", "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out), dtype=str, keep_default_na=False)
    cell = csv[(csv["table"] == "test") & (csv["column"] == "+90%")].iloc[0]
    runs = {(t, d): p.name for p in domainbed_dir.iterdir() for t, d in [(int(p.name[-2]), int(p.name[-1]))]}
    assert cell["runs"] == f"{runs[0, 1]};{runs[1, 0]}"
    assert (cell["trial_seeds"], cell["hparams_seeds"], cell["steps"]) == ("0;1", "1;0", "100;0")
    assert float(cell["mean"]) == pytest.approx(.425) and cell["missing"] == "0"

    assert main(["-q", "collect", "top-hparams", "--input_dir", str(domainbed_dir), "--selection", "training"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("| +90%")]
    assert len(lines) == 2  # one per trial
    lr_trial0 = domainbed_hparams(1, 0)["lr"]
    assert f"| 0 " in lines[0] and "| 85.00 " in lines[0] and "| 50.00 " in lines[0] and f"| {lr_trial0:.4g} " in lines[0]
    assert runs[0, 1] in lines[0] and runs[1, 0] in lines[1] and "| 90.00 " in lines[1] and "| 35.00 " in lines[1]


def test_a_trial_missing_draws_gives_the_cell_from_what_exists_and_counts_the_missing_runs(domainbed_dir, capsys):
    for path in domainbed_dir.iterdir():
        if path.name.endswith("10") or path.name.endswith("12"):  # trial 1 lacks draws 0 and 2
            for f in path.iterdir():
                f.unlink()
            path.rmdir()
    cell, tables = _env0_cell(domainbed_dir)
    # trial 1 now picks draw 1 (val .70 at step 100, test .45); trial 0 is unchanged
    assert cell.values == pytest.approx([.50, .45]) and cell.missing_runs == 2
    csv = pd.read_csv(io.StringIO(to_csv(tables)))
    row = csv[(csv["table"] == "test") & (csv["column"] == "+90%")].iloc[0]
    assert row["missing"] == 2 and row["mean"] == pytest.approx(.475)
    # an environment no run ever held out (and no recorded spec names) gets no column at all
    assert set(csv[csv["table"] == "test"]["column"]) == {"+90%"}


def test_an_unknown_hparams_choice_is_one_line_and_exit_2(domainbed_dir, capsys):
    code = main(["collect", "--input_dir", str(domainbed_dir), "--hparams_choice", "best"])
    err = capsys.readouterr().err
    assert code == 2
    assert err == "domaingen: error: unknown --hparams_choice 'best'; choose one of per_trial, pooled\n"


def test_an_empty_directory_is_one_line_and_exit_2(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    code = main(["collect", "--input_dir", str(tmp_path / "empty")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert err.startswith(f"domaingen: error: no finished runs in {tmp_path / 'empty'}")
