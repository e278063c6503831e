"""Model selection and table cells against hand-computed expectations on synthetic records."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from domaingen.collect import Collection
from domaingen.reporting import Cell, build_tables, to_csv
from domaingen.selection import select


def rec(alg, test_envs, hseed, trial, step, ins, outs, dataset="Toy"):
    row = {"run": f"{alg}-{test_envs}-{hseed}-{trial}", "dataset": dataset, "algorithm": alg,
           "test_envs": tuple(test_envs), "hparams_seed": hseed, "trial_seed": trial, "step": step}
    for i, (a, b) in enumerate(zip(ins, outs)):
        row[f"env{i}_in_acc"], row[f"env{i}_out_acc"] = a, b
    return row


def frame(rows):
    return pd.DataFrame(rows)


def test_training_domain_validation_picks_step_then_hparams():
    rows = [
        # hparams 0: val (mean out of envs 1, 2) = .5 then .7 (trial 0); .6 then .4 (trial 1)
        rec("A", [0], 0, 0, 0, [.10, .9, .9], [.20, .4, .6]),
        rec("A", [0], 0, 0, 1, [.30, .9, .9], [.20, .6, .8]),
        rec("A", [0], 0, 1, 0, [.50, .9, .9], [.20, .6, .6]),
        rec("A", [0], 0, 1, 1, [.70, .9, .9], [.20, .4, .4]),
        # hparams 1: val .8 (trial 0), .9 (trial 1): mean .85 > hparams 0's (.7 + .6) / 2
        rec("A", [0], 1, 0, 0, [.40, .9, .9], [.99, .8, .8]),
        rec("A", [0], 1, 1, 0, [.60, .9, .9], [.99, .9, .9]),
    ]
    chosen = select(frame(rows), "training")
    assert chosen["hparams_seed"].tolist() == [1, 1]
    assert chosen["test_acc"].tolist() == [.40, .60]
    assert chosen["val_acc"].tolist() == pytest.approx([.8, .9])
    rows = rows[:4]  # without hparams 1: trial 0 picks step 1 (test .30), trial 1 picks step 0 (.50)
    chosen = select(frame(rows), "training")
    assert chosen["test_acc"].tolist() == [.30, .50]
    assert chosen["step"].tolist() == [1, 0]


def test_ties_go_to_later_step_and_smaller_hparams_seed():
    rows = [
        rec("A", [0], 0, 0, 0, [.1, .9], [.0, .5]),
        rec("A", [0], 0, 0, 1, [.2, .9], [.0, .5]),  # same val: the later step wins
        rec("A", [0], 3, 0, 0, [.7, .9], [.0, .5]),  # same val as hparams 0: the smaller seed wins
    ]
    chosen = select(frame(rows), "training")
    assert chosen[["hparams_seed", "step", "test_acc"]].values.tolist() == [[0, 1, .2]]


def test_oracle_uses_the_last_checkpoint_and_the_test_env_out_split():
    rows = [
        rec("A", [1], 0, 0, 0, [.9, .99], [.9, .99]),  # best test acc, but not the last step
        rec("A", [1], 0, 0, 5, [.9, .30], [.9, .40]),
        rec("A", [1], 1, 0, 0, [.9, .50], [.9, .45]),
    ]
    chosen = select(frame(rows), "oracle")
    assert chosen[["hparams_seed", "step", "val_acc", "test_acc"]].values.tolist() == [[1, 0, .45, .50]]


def test_leave_one_domain_out_validates_on_held_out_pairs():
    rows = []
    for step, (v1, v2, test) in enumerate([(.5, .7, .11), (.9, .7, .22)]):
        rows.append(rec("A", [0], 0, 0, step, [test, .9, .9], [.3, .9, .9]))
        rows.append(rec("A", [0, 1], 0, 0, step, [.0, v1, .0], [.0, .0, .9]))
        rows.append(rec("A", [0, 2], 0, 0, step, [.0, .0, v2], [.0, .9, .0]))
    # hparams 1 has better pair accuracy but lacks the {0, 2} run: it cannot be validated
    rows.append(rec("A", [0], 1, 0, 0, [.99, .9, .9], [.3, .9, .9]))
    rows.append(rec("A", [0, 1], 1, 0, 0, [.0, 1.0, .0], [.0, .0, .9]))
    chosen = select(frame(rows), "loo")
    assert chosen[["test_env", "hparams_seed", "step", "test_acc"]].values.tolist() == [[0, 0, 1, .22]]
    assert chosen["val_acc"].tolist() == pytest.approx([(.9 + .7) / 2])


def test_missing_pairs_give_a_cell_that_says_so():
    rows = [rec("A", [0], 0, 0, 0, [.5, .9], [.5, .9]), rec("A", [1], 0, 0, 0, [.9, .5], [.9, .5])]
    runs = pd.DataFrame([{"run": r["run"], "state": "done", "dataset": "Toy", "algorithm": "A",
                          "test_envs": r["test_envs"], "hparams_seed": 0, "trial_seed": 0} for r in rows])
    tables = build_tables(Collection(frame(rows), runs=runs), ["loo"])
    cell = tables[0].rows["A"][0]
    assert not cell.values and "pair runs" in cell.text()
    assert "missing" in tables[0].rows["A"][-1].text()


def test_last_selection_takes_every_runs_final_checkpoint_and_training_accuracy():
    rows = [
        rec("A", [2], 0, 0, 0, [.9, .8, .1], [None, None, None]),
        rec("A", [2], 0, 0, 500, [.7, .6, .5], [None, None, None]),
        rec("A", [2], 0, 1, 500, [.8, .6, .3], [None, None, None]),
        rec("A", [2], 1, 0, 500, [.9, .9, .9], [None, None, None]),  # another draw: not chosen
    ]
    chosen = select(frame(rows), "last")
    assert chosen["hparams_seed"].tolist() == [0, 0]
    assert chosen["step"].tolist() == [500, 500]
    assert chosen["test_acc"].tolist() == [.5, .3]
    assert chosen["indomain_acc"].tolist() == pytest.approx([.65, .7])


def test_cell_std_is_the_sample_standard_deviation():
    cell = Cell([0.1, 0.2, 0.6])
    assert cell.std == pytest.approx(float(pd.Series([0.1, 0.2, 0.6]).std()))
    assert cell.text(error="std") == f"30.0 ± {100 * cell.std:.1f}"
    assert cell.text() == f"30.0 ± {100 * cell.se:.1f}"


def test_cell_mean_and_standard_error_use_the_sample_std():
    cell = Cell([0.5, 0.7, 0.9])
    assert cell.mean == pytest.approx(0.7)
    assert cell.se == pytest.approx(math.sqrt(((0.2**2) * 2) / 2) / math.sqrt(3))
    assert cell.text() == "70.0 ± 11.5"
    assert cell.text(show_n=True) == "70.0 ± 11.5 (n=3)"
    assert Cell([0.5]).text() == "50.0"


def test_table_cells_and_average_column():
    rows = []
    for trial, (a0, a1) in enumerate([(.6, .2), (.8, .4)]):
        rows.append(rec("A", [0], 0, trial, 0, [a0, .9], [.5, .7]))
        rows.append(rec("A", [1], 0, trial, 0, [.9, a1], [.3, .5]))
    tables = build_tables(Collection(frame(rows)), ["training"])
    test_table = tables[0]
    assert test_table.columns == ["env0", "env1", "Avg"]
    cells = test_table.rows["A"]
    assert [c.mean for c in cells] == pytest.approx([.7, .3, .5])
    assert cells[2].values == pytest.approx([.4, .6])  # per-trial averages over environments
    csv = pd.read_csv(__import__("io").StringIO(to_csv(tables)))
    avg = csv[(csv["table"] == "test") & (csv["column"] == "Avg") & (csv["dataset"] == "Toy")]
    assert avg["mean"].iloc[0] == pytest.approx(.5) and avg["n"].iloc[0] == 2
    indomain = tables[2].rows["A"]
    assert [c.mean for c in indomain[:2]] == pytest.approx([.7, .3])


def test_domainbed_output_directories_are_collected(tmp_path):
    """A sweep directory as DomainBed writes it: results.jsonl with its field names and a `done` file."""
    import json

    from domaingen.collect import collect

    for test_env in (0, 1):
        for trial in (0, 1):
            run = tmp_path / f"{test_env}{trial}abcdef"
            run.mkdir()
            args = {"algorithm": "ERM", "checkpoint_freq": None, "data_dir": "/data", "dataset": "ColoredMNIST",
                    "holdout_fraction": 0.2, "hparams": None, "hparams_seed": 0, "output_dir": str(run),
                    "save_model_every_checkpoint": False, "seed": 123, "skip_model_save": False, "steps": None,
                    "task": "domain_generalization", "test_envs": [test_env], "trial_seed": trial,
                    "uda_holdout_fraction": 0}
            lines = []
            for step, acc in ((0, 0.5), (100, 0.6 + 0.1 * trial)):
                record = {"args": args, "epoch": step / 291.0, "hparams": {"batch_size": 64, "lr": 0.001},
                          "loss": 0.6, "mem_gb": 1.2, "step": step, "step_time": 0.05}
                for i in range(3):
                    record[f"env{i}_in_acc"] = acc if i == test_env else 0.9
                    record[f"env{i}_out_acc"] = 0.5 + step / 1000
                lines.append(json.dumps(record, sort_keys=True))
            (run / "results.jsonl").write_text("\n".join(lines) + "\n")
            (run / "done").write_text("done")
    collection = collect(tmp_path)
    assert len(collection.records) == 8
    tables = build_tables(collection, ["training"])
    assert [round(c.mean, 4) for c in tables[0].rows["ERM"][:2]] == [0.65, 0.65]
    assert "missing" in tables[0].rows["ERM"][2].text()
