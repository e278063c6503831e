"""--in_domain_test: a third split of each training domain that only the in-domain table reads."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.cli.main import main
from domaingen.datasets import DATASETS, in_domain_test_splits, split_environments
from domaingen.datasets.splits import split_indices, three_way_indices
from domaingen.errors import DomaingenError
from domaingen.hparams import seed_hash
from domaingen.run.eval_plan import evaluated_at_end, in_domain_test_names, planned_splits
from domaingen.run.reload import evaluate_run, load_run
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from domaingen.sweep.spec import build_jobs, parse_spec
from domaingen.tables.collect import collect
from domaingen.tables.reporting import build_tables, to_markdown
from domaingen.testing import VOLATILE_FIELDS


def test_three_way_split_keeps_the_validation_split_and_partitions_the_rest():
    seed = seed_hash(0, 1)
    two_in, two_out = split_indices(1000, 0.2, seed)
    train_idx, val, test = three_way_indices(1000, 0.2, 0.1, seed)
    assert torch.equal(val, two_out)  # selection reads exactly what it read without the option
    assert len(test) == 100 and len(train_idx) == 700
    assert sorted(torch.cat([train_idx, val, test]).tolist()) == list(range(1000))
    assert torch.equal(torch.cat([test, train_idx]), two_in)  # the same permutation, cut once more


def test_only_training_environments_lose_their_test_part():
    dataset = DATASETS.get("ColoredMNIST")("embedded", [1], {})
    plain = split_environments(dataset, 0.2, 3)
    three = split_environments(dataset, 0.2, 3, 0.1, [1])
    idtest = in_domain_test_splits(dataset, 0.2, 3, 0.1, [1])
    assert idtest[1] is None
    assert torch.equal(three[1][0].index, plain[1][0].index)  # the held-out env keeps DomainBed's split
    for env in (0, 2):
        n = len(dataset.environments[env])
        assert len(idtest[env]) == int(n * 0.1)
        assert torch.equal(three[env][1].index, plain[env][1].index)
        seen = set(three[env][0].index.tolist()) | set(three[env][1].index.tolist())
        assert not seen & set(idtest[env].index.tolist())
        assert len(seen) + len(idtest[env]) == n


def test_eval_plan_adds_the_in_domain_test_splits():
    names = in_domain_test_names(3, [1], 0.1)
    assert names == ["env0_idtest", "env2_idtest"]
    assert in_domain_test_names(3, [1], None) == []
    plan = planned_splits(0, 10, 5, 3, [1], "selection", None, names)
    assert plan[-2:] == names and "env0_in" not in plan
    # final: only where the in-domain table (or a curve) reads them; the final evaluation adds them
    assert planned_splits(5, 10, 5, 3, [1], "final", None, names) == ["env0_out", "env2_out"]
    assert planned_splits(9, 10, 5, 3, [1], "final", None, names)[-2:] == names
    assert planned_splits(5, 10, 5, 3, [1], "final", 1, names) == ["env0_in", "env0_out", "env2_in", "env2_out", *names]
    assert evaluated_at_end("final", [1], names) == ["env1_in", "env1_out", *names]
    # no final evaluation (two held-out environments, or selection): every checkpoint
    assert planned_splits(5, 10, 5, 4, [1, 3], "final", None, ["env0_idtest", "env2_idtest"])[-2:] == [
        "env0_idtest", "env2_idtest"]
    assert evaluated_at_end("selection", [1], names) == [] and evaluated_at_end("final", [1, 2], names) == []


@pytest.fixture(scope="module")
def idtest_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("idtest") / "run"
    train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[1],
                      data_dir="embedded", hparams=dict(FAST_HPARAMS), steps=4, checkpoint_freq=2,
                      in_domain_test=0.1))
    return out


def test_records_hold_the_in_domain_test_accuracy_recomputed_from_the_weights(idtest_run):
    records = RunDirectory(idtest_run).records()
    # under the default `final`, a record holds them where the checkpoint, or the final
    # evaluation of a selected checkpoint, evaluated them: the last and the selected ones
    for r in records:
        evaluated = {*r["evaluated"], *r.get("evaluated_at_end", [])}
        assert ({"env0_idtest_acc", "env2_idtest_acc"} <= set(r)) == ({"env0_idtest", "env2_idtest"} <= evaluated)
    best = max(records, key=lambda r: (np.mean([r["env0_out_acc"], r["env2_out_acc"]]), -r["step"]))
    assert {"env0_idtest_acc", "env2_idtest_acc"} <= set(records[-1]) & set(best)
    assert "env1_idtest_acc" not in records[-1]
    loaded = load_run(idtest_run, "last")
    x, y = loaded.idtest[2].batch(slice(None))
    with torch.no_grad():
        by_hand = float((loaded.algorithm.predict(x).argmax(1) == y).float().mean())
    assert records[-1]["env2_idtest_acc"] == pytest.approx(by_hand)
    assert evaluate_run(loaded)["env2_idtest_acc"] == records[-1]["env2_idtest_acc"]


def test_in_domain_table_reads_only_the_test_split_and_says_so(idtest_run):
    collection = collect(str(idtest_run.parent))
    records = RunDirectory(idtest_run).records()
    training = [t for t in build_tables(collection, ["training"]) if t.key.endswith("/indomain")][0]
    cell = training.rows["ERM"][0]
    # the selected checkpoint: best mean out accuracy over envs 0 and 2, earliest on a tie
    best = max(records, key=lambda r: (np.mean([r["env0_out_acc"], r["env2_out_acc"]]), -r["step"]))
    assert cell.values == [pytest.approx(np.mean([best["env0_idtest_acc"], best["env2_idtest_acc"]]))]
    assert "in-domain test splits (0.1 of each), seen by no training or selection" in training.title


def test_without_the_option_the_caption_names_the_selection_split(tmp_path):
    out = tmp_path / "run"
    train(TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[1],
                      data_dir="embedded", hparams=dict(FAST_HPARAMS), steps=2, checkpoint_freq=2))
    tables = build_tables(collect(str(tmp_path)), ["training"])
    indomain = [t for t in tables if t.key.endswith("/indomain")][0]
    assert "training envs' out splits: the selection split" in indomain.title
    assert "selection split" in to_markdown(tables, collect(str(tmp_path)))


def test_spec_key_reaches_the_jobs_and_leaves_other_ids_alone():
    base = {"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "n_hparams": 1, "n_trials": 1, "test_envs": [0]}
    plain = build_jobs(parse_spec(base))[0]
    three = build_jobs(parse_spec({**base, "in_domain_test": 0.1}))[0]
    assert "in_domain_test" not in plain.args and three.args["in_domain_test"] == 0.1
    assert plain.job_id != three.job_id


@pytest.mark.parametrize("value", ["0", "0.5", "-0.1", "0.7"])
def test_fraction_outside_the_interval_is_one_line_and_exit_2(tmp_path, capsys, value):
    out = tmp_path / "run"
    code = main(["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                 "--output_dir", str(out), "--in_domain_test", value])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert len(err.splitlines()) == 1 and "argument --in_domain_test: expected a fraction in (0, 0.5)" in err


def test_spec_with_a_bad_fraction_is_refused():
    with pytest.raises(DomaingenError, match=r"in_domain_test must be a fraction in \(0, 0.5\)"):
        parse_spec({"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "in_domain_test": 0.6})


def test_a_split_left_without_some_class_is_one_line_and_exit_2(tmp_path, capsys):
    out = tmp_path / "run"
    # about 1,700 examples per environment: a fraction of 1e-4 leaves the in-domain test split empty
    code = main(["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                 "--output_dir", str(out), "--test_envs", "1", "--in_domain_test", "0.0001"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert len(err.splitlines()) == 1
    assert "the in-domain test split of environment 0 (+90%) has no example of class 0: 0 of" in err


def _timeless(records):
    return [{**{k: v for k, v in r.items() if k not in VOLATILE_FIELDS},
             "args": {k: v for k, v in r["args"].items() if k != "output_dir"}} for r in records]


def test_an_interrupted_dmg_run_resumes_to_the_same_records_and_final_evaluation(tmp_path, monkeypatch):
    # the known-domain mode's selected checkpoint (kept for its in-domain test numbers) survives a resume
    from domaingen.run import training

    kw = dict(dataset="ColoredMNIST", algorithm="DMG", test_envs=[1], data_dir="embedded",
              hparams={**FAST_HPARAMS, "lr": 0.01}, steps=13, checkpoint_freq=2, in_domain_test=0.2)
    train(TrainConfig(output_dir=str(tmp_path / "straight"), **kw))
    calls = {"n": 0}
    real_evaluate = training.evaluate

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 7:  # after the checkpoints at steps 0 to 10, the one every mode selects among them
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(output_dir=str(tmp_path / "resumed"), **kw))
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    train(TrainConfig(output_dir=str(tmp_path / "resumed"), **kw))
    straight, resumed = RunDirectory(tmp_path / "straight"), RunDirectory(tmp_path / "resumed")
    assert _timeless(resumed.records()) == _timeless(straight.records())
    finals = [json.loads((d / "final.json").read_text()) for d in (tmp_path / "straight", tmp_path / "resumed")]
    assert [{k: v for k, v in f.items() if k != "seconds"} for f in finals][0] == \
        {k: v for k, v in finals[1].items() if k != "seconds"}
    assert finals[0]["evaluated"] == ["env1_in", "env1_out", "env0_idtest", "env2_idtest"]
    assert finals[0]["checkpoints"] and {"default", "mask_ens", "kd"} <= {m for c in finals[0]["checkpoints"]
                                                                           for m in c["modes"]}
    # each mode's in-domain numbers sit at the checkpoint its own validation selects, as collect reads them
    for suffix in ("", "_mask_ens", "_kd"):
        rows = straight.records()
        best = max(rows, key=lambda r: (np.mean([r[f"env0_out_acc{suffix}"], r[f"env2_out_acc{suffix}"]]), -r["step"]))
        assert best.get(f"env0_idtest_acc{suffix}") is not None and best.get(f"env2_idtest_acc{suffix}") is not None


def test_a_checkpoint_without_its_runs_in_domain_test_reads_nan_not_the_selection_split():
    from domaingen.tables.selection import _in_domain_acc, runs_with_in_domain_test

    records = pd.DataFrame({
        "test_env": [1, 1, 1], "in_domain_test": [0.1, 0.1, None],
        "env0_out_acc": [0.5, 0.6, 0.7], "env2_out_acc": [0.7, 0.8, 0.9],
        "env0_idtest_acc": [0.2, None, None], "env2_idtest_acc": [0.4, None, None],
    })
    assert runs_with_in_domain_test(records).tolist() == [True, True, False]
    got = _in_domain_acc(records, "out", 3)
    assert got[0] == pytest.approx(0.3) and np.isnan(got[1]) and got[2] == pytest.approx(0.8)
