"""--eval_splits final|selection|all and --train_in_every: the plan, the records, the final evaluation,
resume, and equal tables."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.tables.collect import collect
from domaingen.run.eval_plan import evaluated_at_end, evaluated_fraction, null_fields, planned_splits
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


def test_final_plan_reads_what_selection_reads_at_each_checkpoint():
    # a single run: the training environments' out splits; the last checkpoint evaluates everything
    assert planned_splits(0, 11, 5, 3, [2], "final") == ["env0_out", "env1_out"]
    assert planned_splits(5, 11, 5, 3, [0], "final") == ["env1_out", "env2_out"]
    assert planned_splits(10, 11, 5, 3, [0], "final") == ALL3
    # a pair run: also the held-out splits (leave-one-domain-out reads the in splits at every checkpoint)
    assert planned_splits(5, 11, 5, 3, [0, 2], "final") == ["env0_in", "env0_out", "env1_out", "env2_in", "env2_out"]
    # train_in_every adds the training environments' in splits
    assert planned_splits(10, 21, 5, 3, [2], "final", 2) == ["env0_in", "env0_out", "env1_in", "env1_out"]
    # the final evaluation: the held-out splits of a single run under final only
    assert evaluated_at_end("final", [1]) == ["env1_in", "env1_out"]
    assert evaluated_at_end("final", [0, 1]) == [] and evaluated_at_end("selection", [1]) == []
    # what a checkpoint did not evaluate of the held-out environments is written as null
    assert null_fields(["env0_out", "env1_out"], [2]) == {"env2_in_acc": None, "env2_out_acc": None}
    assert null_fields(["env0_in", "env1_out", "env2_in"], [0, 2]) == {"env0_out_acc": None, "env2_out_acc": None}
    assert null_fields(planned_splits(5, 11, 5, 3, [0, 2], "final"), [0, 2]) == {}


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
    # final: 20 + 20 at two checkpoints, everything at the last, and the held-out 100 once more
    assert evaluated_fraction(11, 5, [(80, 20)] * 3, [2], "final") == pytest.approx((40 * 2 + 300 + 100) / 900)
    # the published protocol on ColoredMNIST (23,334 / 23,333 / 23,333 examples, 20% held out):
    # 50 checkpoints of out splits + the test env's in split, and one full
    sizes = [(n - int(n * 0.2), int(n * 0.2)) for n in (23_334, 23_333, 23_333)]
    partial = (sizes[0][1] + sizes[1][1] + sum(sizes[2])) / sum(map(sum, sizes))
    assert evaluated_fraction(5001, 100, sizes, [2], "selection") == pytest.approx((50 * partial + 1) / 51)
    assert partial == pytest.approx(0.4667, abs=1e-3)


def config(out, **kw) -> TrainConfig:
    base = dict(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[2], data_dir="embedded",
                hparams=dict(FAST_HPARAMS), steps=5, checkpoint_freq=2, protocol="paired")
    base.update(kw)
    return TrainConfig(**base)


def test_records_say_what_they_evaluated_and_match_all(tmp_path):
    train(config(tmp_path / "sel", eval_splits="selection"))
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


def _held_out(record: dict, env: int) -> dict:
    return {k: v for k, v in record.items() if k.startswith(f"env{env}_") and "_acc" in k}


def test_final_evaluation_fills_the_selected_checkpoint_with_the_numbers_all_computes(tmp_path):
    # 21 steps, a checkpoint every 4, holding out environment 1: the selected checkpoint is not the last
    kw = dict(steps=21, checkpoint_freq=4, test_envs=[1], hparams={**FAST_HPARAMS, "lr": 0.01})
    train(config(tmp_path / "final", **kw))
    train(config(tmp_path / "all", eval_splits="all", **kw))
    final, full = RunDirectory(tmp_path / "final").records(), RunDirectory(tmp_path / "all").records()
    chosen = RunDirectory(tmp_path / "final").load_selected()["step"]
    assert chosen != 20
    summary = json.loads((tmp_path / "final" / "final.json").read_text())
    assert [c["step"] for c in summary["checkpoints"]] == [chosen] and summary["evaluated"] == ["env1_in", "env1_out"]
    for a, b in zip(final, full):
        assert a["step"] == b["step"] and a["loss"] == b["loss"]
        assert a["evaluated"] == planned_splits(a["step"], 21, 4, 3, [1], "final")
        if a["step"] in (chosen, 20):
            assert _held_out(a, 1) == _held_out(b, 1) and a["env1_in_acc"] is not None
        else:  # present, null: DomainBed's collect_results indexes them
            assert a["env1_in_acc"] is None and a["env1_out_acc"] is None
        assert a.get("evaluated_at_end") == (["env1_in", "env1_out"] if a["step"] == chosen else None)
        assert {k: v for k, v in a.items() if k.endswith("_out_acc") and v is not None} == \
            {k: b[k] for k in a if k.endswith("_out_acc") and a[k] is not None}
    assert summary["checkpoints"][0]["env1_in_acc"] == full[[r["step"] for r in full].index(chosen)]["env1_in_acc"]
    # training-domain validation as collect computes it picks that checkpoint in both runs
    for records in (final, full):
        vals = [np.mean([[r["env0_out_acc"], r["env2_out_acc"]]], axis=1)[0] for r in records]
        assert records[int(np.argmax(vals))]["step"] == chosen


def test_a_run_interrupted_before_its_final_evaluation_does_it_when_resumed(tmp_path):
    out = tmp_path / "run"
    kw = dict(steps=21, checkpoint_freq=4, test_envs=[1], hparams={**FAST_HPARAMS, "lr": 0.01})
    train(config(out, **kw))
    complete = RunDirectory(out).records()
    summary = json.loads((out / "final.json").read_text())
    # back to the state after the last checkpoint: the selected record without its held-out numbers
    undone = [{k: v for k, v in r.items() if k != "evaluated_at_end"} for r in complete]
    for r in undone:
        if r["step"] == summary["checkpoints"][0]["step"]:
            r.update(env1_in_acc=None, env1_out_acc=None)
    (out / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in undone))
    (out / "final.json").unlink()
    (out / "done").unlink()
    train(config(out, **kw))
    assert RunDirectory(out).records() == complete
    again = json.loads((out / "final.json").read_text())
    assert {k: v for k, v in again.items() if k != "seconds"} == {k: v for k, v in summary.items() if k != "seconds"}


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
    with pytest.raises(RunDirectoryError, match="started with eval_splits 'all', not 'final'"):
        train(config(out, eval_splits="final"))
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
    (["--eval_splits", "some"], "argument --eval_splits: expected one of final, selection, all, got 'some'"),
    (["--train_in_every", "0"], "argument --train_in_every: expected at least 1, got 0"),
    (["--train_in_every", "-3"], "argument --train_in_every: expected at least 1, got -3"),
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


# --- the same cells from `final`, `selection` and `all` sweeps --------------------------------------------

SPEC = """
algorithms = {algorithms}
datasets = ["ColoredMNIST"]
test_envs = {test_envs}
n_hparams = 2
n_trials = 1
steps = {steps}
checkpoint_freq = 2
protocol = "paired"
{eval_splits}
{extra}

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
lr = 0.01
"""
PAIRS = [[0], [1], [2], [0, 1], [0, 2], [1, 2]]


def launch(tmp_path: Path, name: str, eval_splits: str | None, algorithms=("ERM",), test_envs=PAIRS,
           steps: int = 5, extra: str = "") -> Path:
    spec = tmp_path / f"{name}.toml"
    spec.write_text(SPEC.format(algorithms=json.dumps(list(algorithms)), test_envs=json.dumps(test_envs), steps=steps,
                                eval_splits=f'eval_splits = "{eval_splits}"' if eval_splits else "", extra=extra))
    assert main(["-q", "sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / name),
                 "--data_dir", "embedded", "--launcher", "local", "--yes", "--no_progress"]) == 0
    return tmp_path / name


def domainbed_cells(sweep_dir: Path) -> dict[tuple[str, int], float]:
    """Training-domain validation and oracle cells as DomainBed's collect_results reads records
    (draws in hparams_seed order).

    DomainBed counts environments by the `out` fields of a record and indexes, in every
    record, the training envs' `out` accuracies and the test env's `in` accuracy (a missing
    field would be a KeyError; a null one is read as None and never chosen here).
    """
    per_trial: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for done in sorted(sweep_dir.glob("*/done")):
        records = [json.loads(line) for line in (done.parent / "results.jsonl").read_text().splitlines()]
        args = records[0]["args"]
        if len(args["test_envs"]) != 1:
            continue
        t = args["test_envs"][0]
        n_envs = sum(1 for i in range(10) if f"env{i}_out_acc" in records[0])
        vals, tests = [], []
        for r in records:
            vals.append(np.mean([r[f"env{i}_out_acc"] for i in range(n_envs) if i != t]))
            tests.append(r[f"env{t}_in_acc"])
        best = int(np.argmax(vals))
        seed = args["hparams_seed"]
        per_trial.setdefault(("training", t, args["trial_seed"]), []).append((vals[best], seed, tests[best]))
        last = records[-1]
        per_trial.setdefault(("oracle", t, args["trial_seed"]), []).append(
            (last[f"env{t}_out_acc"], seed, last[f"env{t}_in_acc"]))
    cells: dict[tuple[str, int], list[float]] = {}
    for (method, t, _), candidates in per_trial.items():
        # DomainBed sorts the draws by validation accuracy, stably, and reverses: on a tie the last
        # draw in its order wins, the largest hparams_seed when the draws come in seed order
        cells.setdefault((method, t), []).append(max(candidates, key=lambda c: (c[0], c[1]))[2])
    return {key: float(np.mean(v)) for key, v in cells.items()}


def table_cells(sweep_dir: Path) -> dict:
    tables = build_tables(collect(sweep_dir), ["training", "oracle", "loo", "last"])
    return {(t.key, row, column): cell.values for t in tables for row, cells in t.rows.items()
            for column, cell in zip(t.columns, cells)}


def collect_csv(sweep_dir: Path, capsys, *flags: str):
    import pandas as pd

    assert main(["collect", "--input_dir", str(sweep_dir), "--format", "csv", *flags]) == 0
    return pd.read_csv(io.StringIO(capsys.readouterr().out)).drop(columns=["runs"], errors="ignore")


def test_final_and_all_sweeps_give_the_same_cells(tmp_path, capsys):
    import pandas as pd

    # `selection` lies between the two (test_records_say_what_they_evaluated_and_match_all)
    dirs = {mode: launch(tmp_path, mode or "default", mode) for mode in (None, "all")}
    capsys.readouterr()
    # the default is final: pair runs evaluate only what leave-one-domain-out reads before their last
    # checkpoint; the single runs of a sweep with pairs evaluate their held-out in split at every one
    for args in (json.loads(p.read_text()) for p in dirs[None].glob("*/args.json")):
        assert args["eval_splits"] == ("final" if len(args["test_envs"]) == 2 else "selection")
    cells = {mode: table_cells(d) for mode, d in dirs.items()}
    assert cells[None] == cells["all"]
    methods = {key.split("/")[1] for key, _, _ in cells["all"]}
    kinds = {key.split("/")[-1] for key, _, _ in cells["all"]}
    assert {"training", "oracle", "loo", "last"} <= methods and {"test", "indomain"} <= kinds
    assert sum(map(len, cells["all"].values())) >= 24
    # DomainBed's own reading of the records gives the same cells from each, and the same as ours
    theirs = domainbed_cells(dirs["all"])
    assert all(domainbed_cells(d) == theirs for d in dirs.values()) and len(theirs) == 6
    ours = {(key.split("/")[1], column): values for (key, row, column), values in cells["all"].items()
            if row == "ERM" and key.endswith("/test")}
    for (method, env), value in theirs.items():
        column = [c for (m, c) in ours if m == method][env]
        assert np.mean(ours[(method, column)]) == pytest.approx(value, abs=1e-12)
    frames = [collect_csv(d, capsys) for d in dirs.values()]
    pd.testing.assert_frame_equal(frames[0], frames[1])


def test_final_single_runs_with_test_time_modes_give_the_same_cells_versus_and_paired(tmp_path, capsys):
    import pandas as pd

    singles = [[0], [1], [2]]
    dirs = {mode: launch(tmp_path, mode, mode, ("ERM", "DMG"), singles, steps=7) for mode in ("final", "all")}
    capsys.readouterr()
    cells = {mode: table_cells(d) for mode, d in dirs.items()}
    assert cells["final"] == cells["all"]
    assert any(row.startswith("DMG-") for _, row, _ in cells["all"])  # DMG's mask_ens (and kd) rows
    # the final evaluation ran where a selected checkpoint was not the last
    finals = [json.loads(p.read_text()) for p in dirs["final"].glob("*/final.json")]
    assert len(finals) == 12 and any(f["checkpoints"] for f in finals)
    assert domainbed_cells(dirs["final"]) == domainbed_cells(dirs["all"])
    pd.testing.assert_frame_equal(collect_csv(dirs["final"], capsys, "--paired", "DMG:ERM"),
                                  collect_csv(dirs["all"], capsys, "--paired", "DMG:ERM"))
    assert main(["collect", "versus", "--input_dir", str(dirs["final"]), "--other", str(dirs["all"]),
                 "--format", "csv"]) == 0
    versus = pd.read_csv(io.StringIO(capsys.readouterr().out))
    differences = versus[[c for c in versus.columns if "diff" in c.lower()]]
    assert len(versus) and differences.notna().all().all() and (differences.to_numpy() == 0).all()


def test_in_domain_test_splits_evaluated_at_the_end_give_the_same_cells_for_every_mode(tmp_path, capsys):
    import pandas as pd

    singles = [[0], [1], [2]]
    dirs = {mode: launch(tmp_path, mode, mode, ("ERM", "DMG", "MultiHead"), singles, steps=7,
                         extra="in_domain_test = 0.2") for mode in ("final", "all")}
    capsys.readouterr()
    # under final the checkpoints before the last skip the in-domain test splits, and the final
    # evaluation adds them where a mode (known-domain prediction included) selected a checkpoint
    records = [json.loads(line) for p in dirs["final"].glob("*/results.jsonl") for line in p.read_text().splitlines()]
    assert all(not any(name.endswith("_idtest") for name in r["evaluated"]) for r in records if r["step"] != 6)
    assert all(any(name.endswith("_idtest") for name in r["evaluated"]) for r in records if r["step"] == 6)
    filled = [r for r in records if "evaluated_at_end" in r]
    assert any(any(k.endswith("_idtest_acc_kd") for k in r) for r in filled)
    cells = {mode: table_cells(d) for mode, d in dirs.items()}
    assert cells["final"] == cells["all"]
    indomain_rows = {row for key, row, _ in cells["all"] if key.endswith("/indomain")}
    assert {"DMG", "DMG-KD", "DMG-MaskEns", "MultiHead", "MultiHead-KD"} <= indomain_rows
    # the caption names the in-domain test split although most checkpoints did not evaluate it
    titles = {t.title for t in build_tables(collect(dirs["final"]), ["training", "oracle"]) if t.key.endswith("/indomain")}
    assert titles and all("in-domain test splits (0.2 of each), seen by no training or selection" in t
                          and "where runs have one" not in t for t in titles)
    pd.testing.assert_frame_equal(collect_csv(dirs["final"], capsys, "--paired", "DMG:ERM"),
                                  collect_csv(dirs["all"], capsys, "--paired", "DMG:ERM"))
