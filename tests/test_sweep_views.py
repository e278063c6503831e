"""collect trajectories and draws: fields over steps, and every hyperparameter draw of a sweep."""

from __future__ import annotations

import io
import json

import pandas as pd
import pytest

from domaingen.cli.main import main
from domaingen.errors import DomaingenError
from domaingen.tables.views import draws_table, render, trajectories
from test_comparisons import write_sweep
from test_selection import rec

# two draws x two datasets x two trials of ERM+ModReg; val = mean out acc of envs 1, 2 (test env 0);
# the out accuracies below make step 1 the selected checkpoint of every run
DRAWS = {0: {"modreg_beta": 1e-3, "lr": 1e-3}, 1: {"modreg_beta": 1e-4, "lr": 1e-3}}
VAL = {(0, "A"): [0.70, 0.72], (0, "B"): [0.80, 0.82], (1, "A"): [0.75, 0.77], (1, "B"): [0.90, 0.86]}
KEPT_LAST = {(0, "A"): [0.2, 0.4], (0, "B"): [0.6, 0.8], (1, "A"): [0.5, 0.7], (1, "B"): [0.1, 0.3]}


def draw_records() -> pd.DataFrame:
    rows = []
    for (seed, dataset), vals in VAL.items():
        for trial, val in enumerate(vals):
            for step in (0, 1):
                out = val if step else val - 0.3
                row = rec("ERM+ModReg", [0], seed, trial, step, [0.1 + step / 10 + trial / 100, .9, .9],
                          [.5, out, out], dataset=dataset)
                row["run"] = f"{dataset}-{seed}-{trial}"
                row["hparams"] = json.dumps(DRAWS[seed], sort_keys=True)
                row["modreg_kept_fraction"] = KEPT_LAST[(seed, dataset)][trial] if step else 1.0
                rows.append(row)
    return pd.DataFrame(rows)


def test_draws_sorted_by_validation_averaged_over_datasets():
    [(algorithm, table)] = draws_table(draw_records(), ["modreg_kept_fraction"]).items()
    assert algorithm == "ERM+ModReg"
    assert table["hparams_seed"].tolist() == [1, 0]  # mean val: (76 + 88) / 2 = 82 > (71 + 81) / 2 = 76
    best = table.iloc[0]
    assert list(table.columns[:2]) == ["hparams_seed", "modreg_beta"]  # lr is the same in every draw
    assert best["modreg_beta"] == 1e-4
    assert best["A val"] == pytest.approx(76.0) and best["B val"] == pytest.approx(88.0)
    assert best["mean val"] == pytest.approx(82.0)
    assert best["A test"] == pytest.approx(100 * (0.2 + 0.21) / 2)  # env 0's in accuracy at step 1
    assert best["A modreg_kept_fraction (last)"] == pytest.approx(0.6)
    assert best["B modreg_kept_fraction (last)"] == pytest.approx(0.2)
    assert best["runs"] == 4
    md = render({"ERM+ModReg": table}, "every draw", "markdown")
    assert "| 1              | 0.0001" in md and "| 82.0 " in md


def test_trajectories_average_runs_at_each_step():
    tables = trajectories(draw_records(), ["modreg_*"])
    assert list(tables) == [("A", "ERM+ModReg"), ("B", "ERM+ModReg")]
    a = tables[("A", "ERM+ModReg")]
    assert a.index.tolist() == [0, 1] and a["runs"].tolist() == [4, 4]
    assert a.loc[1, "modreg_kept_fraction"] == pytest.approx((0.2 + 0.4 + 0.5 + 0.7) / 4)
    assert a.loc[0, "modreg_kept_fraction"] == 1.0
    csv = pd.read_csv(io.StringIO(render(tables, "t", "csv")))
    assert list(csv.columns[:4]) == ["dataset", "algorithm", "step", "runs"]
    assert csv[(csv["dataset"] == "B") & (csv["step"] == 1)]["modreg_kept_fraction"].iloc[0] == pytest.approx((0.6 + 0.8 + 0.1 + 0.3) / 4)
    with pytest.raises(DomaingenError, match="no recorded field matches dmg_\\*"):
        trajectories(draw_records(), ["dmg_*"])
    with pytest.raises(DomaingenError, match="print markdown or csv, not latex"):
        render(tables, "t", "latex")


def test_collect_command_prints_the_views_and_refuses_other_options(tmp_path, capsys):
    write_sweep(tmp_path / "s")
    assert main(["-q", "collect", "trajectories", "--input_dir", str(tmp_path / "s"), "--fields",
                 "modreg_kept_fraction", "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(capsys.readouterr().out))
    # test_comparisons' ERM+ModReg: kept fraction 0.9, 0.8 at step 0 and 0.4, 0.3 at step 1 (trials 0, 1)
    assert csv["modreg_kept_fraction"].tolist() == pytest.approx([0.85, 0.35])
    assert main(["-q", "collect", "draws", "--input_dir", str(tmp_path / "s")]) == 0
    assert "### ERM+ModReg: every hparams draw" in capsys.readouterr().out
    for argv, message in (
        (["draws", "--paired"], "unknown flag --paired"),
        (["draws", "--selection", "training"], "unknown flag --selection"),
        (["trajectories"], "the following arguments are required: --fields"),
        (["trajectories", "--fields", "x", "--format", "latex"], "argument --format: invalid choice: 'latex'"),
    ):
        assert main(["collect", argv[0], "--input_dir", str(tmp_path / "s"), *argv[1:]]) == 2
        assert message in capsys.readouterr().err.strip().splitlines()[-1]


def test_draws_show_a_column_per_dataset_for_a_hyperparameter_the_datasets_drew_differently():
    records = draw_records()
    # dataset B drew another lr at draw 1 (each dataset draws its own values)
    b1 = (records["dataset"] == "B") & (records["hparams_seed"] == 1)
    records.loc[b1, "hparams"] = json.dumps({**DRAWS[1], "lr": 5e-4}, sort_keys=True)
    [(_, table)] = draws_table(records).items()
    assert list(table.columns[:4]) == ["hparams_seed", "lr (A)", "lr (B)", "modreg_beta"]
    best, other = table.iloc[0], table.iloc[1]
    assert (best["lr (A)"], best["lr (B)"], best["modreg_beta"]) == (1e-3, 5e-4, 1e-4)
    assert (other["lr (A)"], other["lr (B)"]) == (1e-3, 1e-3)

