"""--eval_splits selection|all and --train_in_every: the plan, the records, resume, and equal tables."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.tables.collect import collect
from domaingen.run.eval_plan import evaluated_fraction, planned_splits
from domaingen.errors import RunDirectoryError
from domaingen.tables.reporting import build_tables
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train

ALL3 = ["env0_in", "env0_out", "env1_in", "env1_out", "env2_in", "env2_out"]


def test_selection_plan_reads_out_splits_and_held_out_in_splits():
    # 11 steps, a checkpoint every 5: steps 0, 5 and 10 (the last)
    first = planned_splits(0, 11, 5, 3, [2], "selection")
    assert first == ["env0_out", "env1_out", "env2_in", "env2_out"]
    assert planned_splits(5, 11, 5, 3, [2], "selection") == first
    assert planned_splits(10, 11, 5, 3, [2], "selection") == ALL3
    # a pair run holds out two environments: both in splits (leave-one-domain-out reads them)
    assert planned_splits(5, 11, 5, 3, [0, 2], "selection") == ["env0_in", "env0_out", "env1_out", "env2_in",
                                                                   "env2_out"]
    assert all(planned_splits(s, 11, 5, 3, [2], "all") == ALL3 for s in (0, 5, 10))


def test_train_in_every_adds_every_kth_checkpoint_counting_step_zero():
    # 31 steps, freq 5: checkpoints 0, 5, ..., 30; k = 2 -> full at 0, 10, 20 and the last (30)
    full = [s for s in range(0, 31, 5) if "env0_in" in planned_splits(s, 31, 5, 3, [2], "selection", 2)]
    assert full == [0, 10, 20, 30]
    # the last checkpoint is full even when it is not a multiple of the frequency
    assert "env1_in" in planned_splits(32, 33, 5, 3, [2], "selection", 4)


def test_evaluated_fraction_by_hand():
    # 3 envs of 80 in + 20 out; checkpoints 0, 5, 10; non-last ones evaluate 20+20+(80+20) = 140 of 300
    assert evaluated_fraction(11, 5, [(80, 20)] * 3, [2], "selection") == pytest.approx((140 * 2 + 300) / 900)
    assert evaluated_fraction(11, 5, [(80, 20)] * 3, [2], "all") == 1.0
    # the published protocol on ColoredMNIST (23,334 / 23,333 / 23,333 examples, 20% held out):
    # 50 checkpoints of out splits + the test env's in split, and one full
    sizes = [(n - int(n * 0.2), int(n * 0.2)) for n in (23_334, 23_333, 23_333)]
    partial = (sizes[0][1] + sizes[1][1] + sum(sizes[2])) / sum(map(sum, sizes))
    assert evaluated_fraction(5001, 100, sizes, [2], "selection") == pytest.approx((50 * partial + 1) / 51)
    assert partial == pytest.approx(0.4667, abs=1e-3)


def config(out, **kw) -> TrainConfig:
    base = dict(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[2], data_dir="embedded",
                hparams=dict(FAST_HPARAMS), steps=5, checkpoint_freq=2)
    base.update(kw)
    return TrainConfig(**base)


def test_records_say_what_they_evaluated_and_match_all(tmp_path):
    train(config(tmp_path / "sel"))
    train(config(tmp_path / "all", eval_splits="all"))
    sel, full = RunDirectory(tmp_path / "sel").records(), RunDirectory(tmp_path / "all").records()
    assert [r["evaluated"] for r in sel] == [planned_splits(s, 5, 2, 3, [2], "selection") for s in (0, 2, 4)]
    assert [r["evaluated"] for r in full] == [ALL3] * 3
    for a, b in zip(sel, full):
        present = {f"{name}_acc" for name in a["evaluated"]}
        assert {k for k in a if k.endswith("_acc")} == present  # the others are absent, not null
        assert all(a[k] == b[k] for k in present)  # evaluation draws nothing: same training, same numbers
        assert a["loss"] == b["loss"]
    assert json.loads((tmp_path / "sel" / "args.json").read_text())["eval_splits"] == "selection"


def test_a_resumed_run_keeps_its_eval_splits_or_refuses_a_change(tmp_path, capsys):
    out = tmp_path / "run"
    train(config(out, eval_splits="all", train_in_every=3))
    # restart it from scratch (as if it had been interrupted before its first checkpoint)
    for name in ("done", "checkpoint.pt", "results.jsonl", "selected.pt"):
        (out / name).unlink()
    train(config(out))  # no --eval_splits: keeps 'all'
    assert [r["evaluated"] for r in RunDirectory(out).records()] == [ALL3] * 3
    with pytest.raises(RunDirectoryError, match="started with eval_splits 'all', not 'selection'"):
        train(config(out, eval_splits="selection"))
    argv = ["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--test_envs", "2", "--data_dir",
            "embedded", "--steps", "5", "--checkpoint_freq", "2", "--hparams", json.dumps(FAST_HPARAMS),
            "--output_dir", str(out)]
    assert main(argv + ["--train_in_every", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "started with train_in_every 3, not 2" in err


def test_a_run_from_before_eval_splits_resumes_evaluating_everything(tmp_path):
    out = tmp_path / "old"
    train(config(out, eval_splits="all"))
    args = json.loads((out / "args.json").read_text())
    del args["eval_splits"], args["train_in_every"]
    (out / "args.json").write_text(json.dumps(args))
    for name in ("done", "checkpoint.pt", "results.jsonl", "selected.pt"):
        (out / name).unlink()
    train(config(out))
    assert [r["evaluated"] for r in RunDirectory(out).records()] == [ALL3] * 3


@pytest.mark.parametrize("flags, message", [
    (["--eval_splits", "some"], "unknown eval_splits 'some'; choose one of selection, all"),
    (["--train_in_every", "0"], "train_in_every must be a positive integer"),
    (["--train_in_every", "-3"], "train_in_every must be a positive integer"),
])
def test_bad_eval_flags_one_line_exit_2(tmp_path, capsys, flags, message):
    argv = ["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
            "--output_dir", str(tmp_path / "run"), *flags]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err
    assert not (tmp_path / "run").exists()
    sweep = ["sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--output_dir",
             str(tmp_path / "sweep"), "--launcher", "local", "--yes", *flags]
    assert main(sweep) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and message in err


# --- the same cells from `selection` and `all` sweeps ---------------------------------------------------

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
test_envs = [[0], [1], [2], [0, 1], [0, 2], [1, 2]]
n_hparams = 2
n_trials = 1
steps = 5
checkpoint_freq = 2
eval_splits = "{eval_splits}"

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""


def domainbed_cells(sweep_dir: Path) -> dict[tuple[str, int], float]:
    """Training-domain validation and oracle cells as DomainBed's collect_results reads records.

    DomainBed indexes each record by the field names it needs (a missing one would be a
    KeyError): the training envs' `out` accuracies, the test env's `in` and `out`.
    """
    runs = []
    for done in sorted(sweep_dir.glob("*/done")):
        records = [json.loads(line) for line in (done.parent / "results.jsonl").read_text().splitlines()]
        runs.append(records)
    per_trial: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for records in runs:
        args = records[0]["args"]
        if len(args["test_envs"]) != 1:
            continue
        t = args["test_envs"][0]
        others = [i for i in range(3) if i != t]
        vals = [np.mean([r[f"env{i}_out_acc"] for i in others]) for r in records]
        best = records[int(np.argmax(vals))]
        per_trial.setdefault(("training", t, args["trial_seed"]), []).append((max(vals), best[f"env{t}_in_acc"]))
        last = records[-1]
        per_trial.setdefault(("oracle", t, args["trial_seed"]), []).append(
            (last[f"env{t}_out_acc"], last[f"env{t}_in_acc"]))
    cells: dict[tuple[str, int], list[float]] = {}
    for (method, t, _), candidates in per_trial.items():
        cells.setdefault((method, t), []).append(max(candidates, key=lambda c: c[0])[1])
    return {key: float(np.mean(v)) for key, v in cells.items()}


def table_cells(sweep_dir: Path) -> dict:
    tables = build_tables(collect(sweep_dir), ["training", "oracle", "loo", "last"])
    return {(t.key, row, column): cell.values for t in tables for row, cells in t.rows.items()
            for column, cell in zip(t.columns, cells)}


def test_selection_and_all_sweeps_give_the_same_cells(tmp_path, capsys):
    import pandas as pd

    dirs = {}
    for eval_splits in ("selection", "all"):
        spec = tmp_path / f"{eval_splits}.toml"
        spec.write_text(SPEC.format(eval_splits=eval_splits))
        dirs[eval_splits] = tmp_path / eval_splits
        assert main(["-q", "sweep", "launch", "--spec", str(spec), "--output_dir", str(dirs[eval_splits]),
                     "--data_dir", "embedded", "--launcher", "local", "--yes", "--no_progress"]) == 0
    capsys.readouterr()
    sel, full = table_cells(dirs["selection"]), table_cells(dirs["all"])
    assert sel.keys() == full.keys() and sel == full
    methods = {key.split("/")[1] for key, _, _ in sel}
    assert {"training", "oracle", "loo", "last"} <= methods and sum(map(len, sel.values())) >= 24
    # DomainBed's own reading of the records gives the same cells from both, and the same as ours
    theirs = domainbed_cells(dirs["selection"])
    assert theirs == domainbed_cells(dirs["all"]) and len(theirs) == 6
    ours = {(key.split("/")[1], column): values for (key, row, column), values in sel.items()
            if row == "ERM" and key.endswith("/test")}
    for (method, env), value in theirs.items():
        column = [c for (m, c) in ours if m == method][env]
        assert np.mean(ours[(method, column)]) == pytest.approx(value, abs=1e-12)
    frames = []
    for eval_splits in ("selection", "all"):
        assert main(["collect", "--input_dir", str(dirs[eval_splits]), "--format", "csv"]) == 0
        frames.append(pd.read_csv(io.StringIO(capsys.readouterr().out)).drop(columns=["runs"]))
    pd.testing.assert_frame_equal(frames[0], frames[1])
