"""--logger tensorboard / wandb: the curves they hold equal the records; they never change a record or fail a run."""

from __future__ import annotations

import glob
import importlib.util
import json
import logging
import struct
from pathlib import Path

import pytest

from conftest import FAST_HPARAMS
from domaingen.cli import main
from domaingen.run import loggers as run_loggers
from domaingen.run.loggers import scalars
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from domaingen.testing import VOLATILE_FIELDS



def config(out, **kw) -> TrainConfig:
    base = dict(dataset="ColoredMNIST", algorithm="ERM+ModReg", output_dir=str(out), test_envs=[2],
                data_dir="embedded", hparams=dict(FAST_HPARAMS), steps=5, checkpoint_freq=2)
    return TrainConfig(**{**base, **kw})


def stable(records):
    """Records without timings, and args without the output directory (each test writes its own)."""
    return [{**{k: v for k, v in r.items() if k not in VOLATILE_FIELDS},
             "args": {k: v for k, v in r["args"].items() if k != "output_dir"}} for r in records]


def needs(package: str):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"the {package} extra is not installed (pip install 'domaingen-bench[{package}]')")


@pytest.fixture(scope="module")
def plain(tmp_path_factory) -> list[dict]:
    out = tmp_path_factory.mktemp("plain") / "run"
    train(config(out))
    return RunDirectory(out).records()


def test_scalars_are_grouped_by_what_they_are():
    record = {"step": 4, "epoch": 0.5, "loss": 0.7, "nll": 0.6, "env0_in_acc": 0.9, "env1_out_acc_kd": 0.8,
              "wilds_test_acc_avg": 0.7, "step_time": 0.01, "eval_time": 0.2, "mem_gb": 1.5, "modreg_fc1_kept_fraction": 0.4,
              "evaluated": ["env0_in"], "args": {}, "flag": True, "nan": float("nan")}
    assert scalars(record, ["loss", "nll"]) == {
        "loss/loss": 0.7, "loss/nll": 0.6, "accuracy/env0_in_acc": 0.9, "accuracy/env1_out_acc_kd": 0.8,
        "accuracy/wilds_test_acc_avg": 0.7, "system/epoch": 0.5, "system/step_time": 0.01, "system/eval_time": 0.2, "system/mem_gb": 1.5,
        "diagnostics/modreg_fc1_kept_fraction": 0.4}


@needs("tensorboard")
def test_tensorboard_event_files_hold_every_checkpoint_and_records_are_unchanged(tmp_path, plain):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    train(config(out, loggers=["tensorboard"]))
    records = RunDirectory(out).records()
    assert stable(records) == stable(plain)
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    numbers = {k for r in records for k, v in r.items()  # every finite number recorded, but the step
               if isinstance(v, (int, float)) and not isinstance(v, bool) and k != "step" and v == v}
    assert {t.split("/", 1)[1] for t in tags} == numbers
    assert {t.split("/", 1)[1] for t in tags if t.startswith("accuracy/")} == {k for k in numbers if "_acc" in k}
    assert any(t.startswith("diagnostics/modreg_") and t.endswith("kept_fraction") for t in tags)
    # the held-out env2 is evaluated at the last checkpoint only (--eval_splits final); env1 at every one
    for tag in ("loss/loss", "accuracy/env1_out_acc", "accuracy/env0_out_acc", "system/step_time"):
        logged = [(e.step, e.value) for e in events.Scalars(tag)]
        recorded = [(r["step"], r[tag.split("/", 1)[1]]) for r in records]
        assert [s for s, _ in logged] == [s for s, _ in recorded] == [0, 2, 4]
        assert [v for _, v in logged] == pytest.approx([v for _, v in recorded], rel=1e-6)  # float32 in events


def _wandb_records(path: str) -> list:
    """The protobuf records of a W&B transaction log (.wandb): a header, then 32 KiB blocks of
    length-prefixed chunks (LevelDB's log format)."""
    from wandb.proto import wandb_internal_pb2 as pb

    data = Path(path).read_bytes()
    assert data[:4] == b":W&B"
    block, pos, buf, out = 32 * 1024, 7, b"", []
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        buf += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = pb.Record()
            record.ParseFromString(buf)
            out.append(record)
            buf = b""
    return out


@needs("wandb")
def test_wandb_offline_run_holds_config_and_history(tmp_path, plain, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_PROJECT", "domaingen-test")
    sweep = tmp_path / "mysweep"
    sweep.mkdir()
    (sweep / "sweep.json").write_text("{}")  # a job of a sweep: grouped by its name
    out = sweep / "job1"
    train(config(out, loggers=["wandb", "tensorboard"]))
    assert stable(RunDirectory(out).records()) == stable(plain)
    files = glob.glob(str(out / "wandb" / "offline-run-*" / "run-*.wandb"))
    assert len(files) == 1
    records = _wandb_records(files[0])
    run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
    assert run.project == "domaingen-test" and run.run_group == "mysweep" and run.display_name == "job1"
    config_values = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config_values["hparams"] == RunDirectory(out).records()[0]["hparams"]
    assert config_values["args"]["algorithm"] == "ERM+ModReg"
    history = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in r.history.item}
            history[int(items["_step"])] = items
    assert sorted(history) == [0, 2, 4]
    for record in RunDirectory(out).records():
        assert history[record["step"]]["loss/loss"] == pytest.approx(record["loss"])
        assert history[record["step"]]["accuracy/env1_out_acc"] == pytest.approx(record["env1_out_acc"])
    assert history[4]["accuracy/env2_in_acc"] == pytest.approx(RunDirectory(out).records()[-1]["env2_in_acc"])


def test_a_logger_that_fails_warns_once_and_the_run_goes_on(tmp_path, plain, monkeypatch, caplog):
    class Broken:
        calls = 0

        def __init__(self, *args):
            pass

        def log(self, step, values):
            Broken.calls += 1
            raise RuntimeError("disk full")

        def close(self):
            raise AssertionError("a dropped logger is not closed")

    class NoStart:
        def __init__(self, *args):
            raise ConnectionError("no server")

    monkeypatch.setitem(run_loggers.OPENERS, "tensorboard", Broken)
    monkeypatch.setitem(run_loggers.OPENERS, "wandb", NoStart)
    out = tmp_path / "run"
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        outcome = train(config(out, loggers=["tensorboard", "wandb"]))
    assert outcome.state == "done" and stable(RunDirectory(out).records()) == stable(plain)
    warnings = [r.getMessage() for r in caplog.records if "logger" in r.getMessage()]
    assert warnings == ["logger wandb could not start (ConnectionError: no server); the run goes on without it",
                        "logger tensorboard failed (RuntimeError: disk full); the run goes on without it"]
    assert Broken.calls == 1


def test_an_unknown_logger_stops_before_anything_is_written(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                 "--output_dir", str(out), "--logger", "tensorboard", "mlflow"])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == "domaingen: error: unknown logger 'mlflow'; valid loggers: tensorboard, wandb"


@pytest.mark.parametrize("command", ["train", "sweep"])
def test_a_logger_without_its_package_stops_with_the_install_command(tmp_path, capsys, monkeypatch, command):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "out"
    if command == "train":
        argv = ["train", "--dataset", "ColoredMNIST", "--algorithm", "ERM", "--data_dir", "embedded",
                "--output_dir", str(out), "--logger", "wandb"]
    else:
        argv = ["sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--n_hparams", "1",
                "--n_trials", "1", "--output_dir", str(out), "--data_dir", "embedded", "--launcher", "local",
                "--yes", "--logger", "wandb"]
    assert main(argv) == 2 and not out.exists()
    assert capsys.readouterr().err.strip() == ("domaingen: error: --logger wandb needs the wandb package: "
                                               "pip install 'domaingen-bench[wandb]' (or pip install wandb)")


def test_dry_launch_passes_the_loggers_to_every_job(tmp_path, capsys):
    code = main(["sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--n_hparams", "1",
                 "--n_trials", "1", "--output_dir", str(tmp_path / "s"), "--launcher", "dry", "--yes",
                 "--logger", "tensorboard", "--logger", "wandb"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("domaingen train")]
    assert code == 0 and len(lines) == 3 and all("--logger tensorboard wandb" in line for line in lines)
