"""Model selection and table cells against hand-computed expectations on synthetic records."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from domaingen.tables.collect import Collection
from domaingen.tables.reporting import Cell, build_tables, to_csv
from domaingen.tables.selection import select


def rec(alg, test_envs, hseed, trial, step, ins, outs, dataset="Toy"):
    row = {"run": f"{alg}-{test_envs}-{hseed}-{trial}", "dataset": dataset, "algorithm": alg,
           "test_envs": tuple(test_envs), "hparams_seed": hseed, "trial_seed": trial, "step": step}
    for i, (a, b) in enumerate(zip(ins, outs)):
        row[f"env{i}_in_acc"], row[f"env{i}_out_acc"] = a, b
    return row


def frame(rows):
    return pd.DataFrame(rows)


def test_training_domain_validation_picks_step_then_hparams_per_trial():
    rows = [
        # hparams 0: val (mean out of envs 1, 2) = .5 then .7 (trial 0); .6 then .4 (trial 1)
        rec("A", [0], 0, 0, 0, [.10, .9, .9], [.20, .4, .6]),
        rec("A", [0], 0, 0, 1, [.30, .9, .9], [.20, .6, .8]),
        rec("A", [0], 0, 1, 0, [.50, .9, .9], [.20, .6, .6]),
        rec("A", [0], 0, 1, 1, [.70, .9, .9], [.20, .4, .4]),
        # hparams 1: val .8 (trial 0), .9 (trial 1): better in both trials
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


def per_trial_vs_pooled_rows():
    """Trial 0 prefers draw 0 (val .9 vs .8), trial 1 draw 1 (.85 vs .5); averaged, draw 1 wins (.825 vs .7)."""
    return [
        rec("A", [0], 0, 0, 0, [.11, .9], [.0, .9]),
        rec("A", [0], 0, 1, 0, [.22, .9], [.0, .5]),
        rec("A", [0], 1, 0, 0, [.33, .9], [.0, .8]),
        rec("A", [0], 1, 1, 0, [.44, .9], [.0, .85]),
    ]


def test_per_trial_and_pooled_choose_different_draws():
    per_trial = select(frame(per_trial_vs_pooled_rows()), "training")
    assert per_trial[["trial_seed", "hparams_seed", "test_acc"]].values.tolist() == [[0, 0, .11], [1, 1, .44]]
    pooled = select(frame(per_trial_vs_pooled_rows()), "training", "pooled")
    assert pooled[["trial_seed", "hparams_seed", "test_acc"]].values.tolist() == [[0, 1, .33], [1, 1, .44]]
    tables = build_tables(Collection(frame(per_trial_vs_pooled_rows())), ["training"])
    assert tables[0].rows["A"][0].values == [.11, .44]
    assert "pooled" not in tables[0].title
    pooled_tables = build_tables(Collection(frame(per_trial_vs_pooled_rows())), ["training"], "pooled")
    assert pooled_tables[0].rows["A"][0].values == [.33, .44]
    assert all("pooled" in t.title for t in pooled_tables)


def test_ties_go_to_the_earliest_step_and_the_largest_hparams_seed_as_in_domainbed():
    rows = [
        rec("A", [0], 0, 0, 0, [.1, .9], [.0, .5]),
        rec("A", [0], 0, 0, 1, [.2, .9], [.0, .5]),  # same val: the earlier step (0) wins
        rec("A", [0], 3, 0, 0, [.7, .9], [.0, .5]),  # same val as hparams 0: the larger seed (3) wins
        rec("A", [0], 2, 0, 0, [.6, .9], [.0, .5]),
    ]
    chosen = select(frame(rows), "training")
    assert chosen[["hparams_seed", "step", "test_acc"]].values.tolist() == [[3, 0, .7]]
    # pooled keeps its own rule: the smaller hparams_seed wins a tie
    chosen = select(frame(rows), "training", "pooled")
    assert chosen[["hparams_seed", "step", "test_acc"]].values.tolist() == [[0, 0, .1]]


def test_exact_ties_are_decided_on_the_same_floating_point_values_as_domainbed():
    # mathematically both checkpoints validate at .2, but in floating point
    # (.3 + .2) + .1 < (.1 + .2) + .3, so np.mean, as DomainBed computes it, prefers step 1
    outs = {0: [.0, .3, .2, .1], 1: [.0, .1, .2, .3]}
    rows = [rec("A", [0], 0, 0, step, [.1 * (step + 1), .9, .9, .9], outs[step]) for step in (0, 1)]
    expected = max((0, 1), key=lambda s: np.mean(outs[s][1:]))
    assert np.mean(outs[0][1:]) != np.mean(outs[1][1:]) and expected == 1
    assert select(frame(rows), "training")["step"].tolist() == [expected]


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
    assert cell.text(error="se") == f"30.0 ± {100 * cell.se:.1f}"


def test_cell_error_bars_domainbed_and_sample_standard_error():
    cell = Cell([0.5, 0.7, 0.9])
    assert cell.mean == pytest.approx(0.7)
    # DomainBed: population std (ddof 0) of the values, over sqrt(n): sqrt((.04 + 0 + .04) / 3) / sqrt(3)
    assert cell.domainbed_se == pytest.approx(math.sqrt(0.08 / 3) / math.sqrt(3))
    assert cell.text() == "70.0 ± 9.4"
    assert cell.text(show_n=True) == "70.0 ± 9.4 (n=3)"
    # sample standard error (ddof 1): sqrt(.08 / 2) / sqrt(3), sqrt(3 / 2) times DomainBed's
    assert cell.se == pytest.approx(math.sqrt(0.08 / 2) / math.sqrt(3))
    assert cell.se / cell.domainbed_se == pytest.approx(math.sqrt(1.5))
    assert cell.text(error="se") == "70.0 ± 11.5"
    two = Cell([0.6, 0.8])  # at 2 trials the two differ by sqrt(2): 7.1 and 10.0
    assert (two.text(), two.text(error="se")) == ("70.0 ± 7.1", "70.0 ± 10.0")
    assert Cell([0.5]).text() == "50.0" and Cell([0.5]).domainbed_se == 0.0


def test_table_cells_average_column_and_averages_table():
    rows = []
    for trial, (a0, a1) in enumerate([(.6, .2), (.8, .4)]):
        rows.append(rec("A", [0], 0, trial, 0, [a0, .9], [.5, .7]))
        rows.append(rec("A", [1], 0, trial, 0, [.9, a1], [.3, .5]))
    rows.append(rec("A", [0], 0, 2, 0, [.3, .9], [.5, .7]))  # a third trial with test env 0 only
    rows += [{**row, "dataset": "Zoo"} for row in rows]  # a second dataset: an averages table has two columns
    tables = build_tables(Collection(frame(rows)), ["training"])
    assert [t.key for t in tables] == ["Toy/training/test", "Zoo/training/test", "all/training/averages",
                                       "Toy/training/indomain", "Zoo/training/indomain"]
    test_table = tables[0]
    assert test_table.columns == ["env0", "env1", "Avg"]
    cells = test_table.rows["A"]
    env0_mean = (.6 + .8 + .3) / 3
    assert [c.mean for c in cells] == pytest.approx([env0_mean, .3, (env0_mean + .3) / 2])
    # Avg: the mean of the column means, no error bar (DomainBed's Avg column)
    assert not cells[2].error_bar and cells[2].text() == f"{100 * (env0_mean + .3) / 2:.1f}"
    # averages over datasets: per trial, the mean over the environments that trial has (DomainBed's)
    averages = tables[2].rows["A"][0]
    per_trial = [(.6 + .2) / 2, (.8 + .4) / 2, .3]
    assert averages.values == pytest.approx(per_trial)
    assert averages.domainbed_se == pytest.approx(float(np.std(np.array(per_trial) / math.sqrt(3))))
    assert "1 trial(s) averaged over fewer than 2 environments" in averages.note
    # the table shows that the number rests on fewer environments in some trial
    assert averages.footnote == ("1 of 3 trial(s) averaged over the environments they have, fewer than 2 "
                                 "(as DomainBed's collect_results averages)")
    assert tables[2].rows["A"][-1].footnote == averages.footnote  # and so does the Avg that rests on it
    csv = pd.read_csv(__import__("io").StringIO(to_csv(tables)))
    avg = csv[(csv["table"] == "test") & (csv["column"] == "Avg") & (csv["dataset"] == "Toy")]
    assert avg["mean"].iloc[0] == pytest.approx((env0_mean + .3) / 2) and pd.isna(avg["error"].iloc[0])
    indomain = tables[3].rows["A"]
    assert [c.mean for c in indomain[:2]] == pytest.approx([.7, .3])  # the other env's out split


def test_csv_traces_every_cell_to_its_runs(tmp_path):
    rows = per_trial_vs_pooled_rows()
    for row in rows:
        row["step"] = 10 * row["hparams_seed"] + row["trial_seed"]
    tables = build_tables(Collection(frame(rows)), ["training"])
    csv = pd.read_csv(__import__("io").StringIO(to_csv(tables)), dtype=str, keep_default_na=False)
    cell = csv[(csv["table"] == "test") & (csv["column"] == "env0")].iloc[0]
    assert cell["trial_seeds"] == "0;1" and cell["hparams_seeds"] == "0;1" and cell["steps"] == "0;11"
    assert cell["runs"] == f"{rows[0]['run']};{rows[3]['run']}"  # draw 0 in trial 0, draw 1 in trial 1
    assert cell["hparams_choice"] == "per_trial" and cell["error_kind"] == "domainbed"
    assert float(cell["error"]) == pytest.approx(float(np.std(np.array([.11, .44]) / math.sqrt(2))))
    assert cell["missing"] == "0"


def test_domainbed_output_directories_are_collected(tmp_path):
    """A sweep directory as DomainBed writes it: results.jsonl with its field names and a `done` file."""
    import json

    from domaingen.tables.collect import collect

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
    # only environments 0 and 1 were held out: no -90% column, and Avg says what it averages
    assert tables[0].columns == ["+90%", "+80%", "Avg (+90%, +80%)"]
