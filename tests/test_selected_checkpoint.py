"""The selected checkpoint: kept beside the last one, earliest best wins, exact across a resume."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.run import training
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train


def config(out, **kw) -> TrainConfig:
    base = dict(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[2], data_dir="embedded",
                hparams=dict(FAST_HPARAMS), steps=9, checkpoint_freq=3)
    base.update(kw)
    return TrainConfig(**base)


REAL_EVALUATE = training.evaluate


def scripted_evaluate(monkeypatch, out_accs, die_at=None):
    """evaluate() whose training envs' `out` accuracies follow `out_accs`, one pair per checkpoint."""
    real = REAL_EVALUATE
    calls = {"n": 0}

    def fake(*args, **kwargs):
        n = calls["n"]
        calls["n"] += 1
        if die_at is not None and n == die_at:
            raise KeyboardInterrupt
        result = real(*args, **kwargs)
        result["env0_out_acc"], result["env1_out_acc"] = out_accs[n]
        return result

    monkeypatch.setattr(training, "evaluate", fake)


def test_selected_is_the_best_validation_checkpoint(tmp_path):
    train(config(tmp_path / "run", steps=13, hparams={**FAST_HPARAMS, "lr": 3e-3}))
    rundir = RunDirectory(tmp_path / "run")
    records = rundir.records()
    val = np.array([(r["env0_out_acc"] + r["env1_out_acc"]) / 2 for r in records])
    expected = records[int(np.argmax(val))]["step"]  # argmax: the first of equal maxima
    selected = rundir.load_selected()
    assert selected["step"] == expected
    assert selected["val_acc"] == pytest.approx(val.max())
    assert set(selected["model"]) == set(torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["algorithm"]["model"])


def test_a_tie_keeps_the_earliest_checkpoint(tmp_path, monkeypatch):
    scripted_evaluate(monkeypatch, [(0.5, 0.7), (0.7, 0.5), (0.6, 0.6), (0.4, 0.4)])
    train(config(tmp_path / "run"))
    assert RunDirectory(tmp_path / "run").load_selected()["step"] == 0


def test_a_strictly_better_checkpoint_replaces_it(tmp_path, monkeypatch):
    scripted_evaluate(monkeypatch, [(0.5, 0.5), (0.5, 0.6), (0.55, 0.55), (0.9, 0.1)])
    train(config(tmp_path / "run"))
    selected = RunDirectory(tmp_path / "run").load_selected()
    assert selected["step"] == 3 and selected["val_acc"] == pytest.approx(0.55)


def test_best_so_far_survives_a_resume(tmp_path, monkeypatch):
    # step 3 is best; a resumed run that forgot it would select step 6 (better than step 0 only)
    accs = [(0.5, 0.5), (0.8, 0.8), (0.7, 0.7), (0.1, 0.1)]
    scripted_evaluate(monkeypatch, accs)
    train(config(tmp_path / "straight"))
    scripted_evaluate(monkeypatch, accs, die_at=2)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed"))
    assert RunDirectory(tmp_path / "resumed").load_selected()["step"] == 3
    scripted_evaluate(monkeypatch, accs[2:])
    train(config(tmp_path / "resumed"))
    straight = RunDirectory(tmp_path / "straight").load_selected()
    resumed = RunDirectory(tmp_path / "resumed").load_selected()
    assert resumed["step"] == straight["step"] == 3
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name


def test_no_validation_split_selects_nothing(tmp_path):
    train(config(tmp_path / "run", holdout_fraction=0.0, steps=2))
    assert RunDirectory(tmp_path / "run").load_selected() is None
