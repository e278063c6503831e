"""manifest.json: what a run was computed with, checked on resume; collect --manifest and the mixed-versions note."""

from __future__ import annotations

import getpass
import json
import logging
import socket
import subprocess
from pathlib import Path

import numpy
import pytest
import torch

import domaingen
from conftest import FAST_HPARAMS
from domaingen.cli import main
from domaingen.run.manifest import MANIFEST, cpu_model, git_state, read_manifest
from domaingen.run.training import TrainConfig, train


def config(out, **kw) -> TrainConfig:
    base = dict(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(out), test_envs=[2], data_dir="embedded",
                hparams=dict(FAST_HPARAMS), steps=3, checkpoint_freq=2)
    return TrainConfig(**{**base, **kw})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("manifest") / "run"
    train(config(out))
    return out


def test_a_run_writes_what_it_was_computed_with(run_dir):
    manifest = json.loads((run_dir / MANIFEST).read_text())
    assert manifest["domaingen"]["version"] == domaingen.__version__
    assert manifest["libraries"]["torch"] == torch.__version__
    assert manifest["libraries"]["numpy"] == numpy.__version__
    assert "timm" not in manifest["libraries"] and "wilds" not in manifest["libraries"]  # not used by this run
    assert manifest["threads"] == torch.get_num_threads()
    assert manifest["resolved_precision"] == "fp32"
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags = set(line.split(":", 1)[1].split())
            break
    assert manifest["device"]["type"] == "cpu"
    assert set(manifest["device"]["flags"]) == flags & {"avx2", "fma", "avx512f", "avx512_bf16", "avx512_fp16",
                                                         "amx_tile", "amx_bf16", "amx_int8"}
    assert manifest["device_class"] == f"cpu: {cpu_model()}"
    root = Path(domaingen.__file__).resolve().parents[1]
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        head = None
    assert manifest["domaingen"].get("commit") == head
    text = (run_dir / MANIFEST).read_text()
    for private in {socket.gethostname(), getpass.getuser()}:
        if len(private) > 3:  # a short name would match ordinary words
            assert private not in text
    assert str(run_dir) not in text


def test_git_state_outside_a_checkout_is_none(tmp_path):
    package = tmp_path / "domaingen"
    package.mkdir()
    assert git_state(package) is None


def test_a_resume_on_another_torch_or_device_warns_once_and_records_it(tmp_path, caplog):
    out = tmp_path / "run"
    train(config(out))
    manifest = read_manifest(out)
    manifest["libraries"]["torch"] = "1.0.0"
    manifest["device_class"] = "cuda: Some GPU"
    (out / MANIFEST).write_text(json.dumps(manifest))
    (out / "done").unlink()  # the checkpoint says step 3 of 3: the resume runs no step but starts
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        train(config(out))
    warnings = [r.getMessage() for r in caplog.records if "resumed at step" in r.getMessage()]
    assert len(warnings) == 1 and "\n" not in warnings[0]
    assert f"torch 1.0.0 -> {torch.__version__}" in warnings[0]
    assert f"device class cuda: Some GPU -> cpu: {cpu_model()}" in warnings[0]
    resumed = read_manifest(out)
    assert resumed["resumes"] == [{"step": 3, "torch": torch.__version__, "device_class": f"cpu: {cpu_model()}"}]
    assert resumed["libraries"]["torch"] == "1.0.0"  # where it started stays
    caplog.clear()
    (out / "done").unlink()
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        train(config(out))  # same machine as the last resume: nothing new
    assert not [r for r in caplog.records if "resumed at step" in r.getMessage()]
    assert len(read_manifest(out)["resumes"]) == 1


def test_a_run_restarted_from_step_0_gets_a_new_manifest_naming_this_machine(tmp_path, caplog):
    out = tmp_path / "run"
    train(config(out))
    fresh = read_manifest(out)
    elsewhere = {**fresh, "device_class": "cuda: Some GPU", "domaingen": {"version": "0.0.1", "commit": "f" * 40},
                 "resumes": [{"step": 2, "device_class": "cuda: Other GPU"}]}
    (out / MANIFEST).write_text(json.dumps(elsewhere))
    (out / "checkpoint.pt").unlink()  # an attempt cut off before its first checkpoint: nothing to resume
    (out / "done").unlink()
    with caplog.at_level(logging.WARNING, logger="domaingen"):
        train(config(out))
    assert not [r for r in caplog.records if "resumed at step" in r.getMessage()]
    restarted = read_manifest(out)
    assert "resumes" not in restarted and "started_at_step" not in restarted
    assert restarted["device_class"] == f"cpu: {cpu_model()}"
    assert restarted["domaingen"] == fresh["domaingen"]


def test_a_run_started_before_manifests_gets_one_on_resume(tmp_path):
    out = tmp_path / "run"
    train(config(out))
    (out / MANIFEST).unlink()
    (out / "done").unlink()
    train(config(out))
    assert read_manifest(out)["started_at_step"] == 3


def _fake_sweep(tmp_path: Path, run_dir: Path, versions: list[str | None]) -> Path:
    """Copies of one run under a sweep directory, each with its own test env and manifest version."""
    import shutil

    sweep = tmp_path / "sweep"
    for i, version in enumerate(versions):
        target = sweep / f"run{i}"
        shutil.copytree(run_dir, target)
        records = [json.loads(line) for line in (target / "results.jsonl").read_text().splitlines()]
        for r in records:
            r["args"]["trial_seed"] = i
        (target / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        if version is None:
            (target / MANIFEST).unlink()
        else:
            manifest = read_manifest(target)
            manifest["domaingen"] = {"version": version}
            (target / MANIFEST).write_text(json.dumps(manifest))
    return sweep


def test_collect_manifest_counts_runs_per_code_torch_and_device(tmp_path, run_dir, capsys):
    sweep = _fake_sweep(tmp_path, run_dir, ["0.1.0", "0.2.0", "0.2.0", None])
    assert main(["collect", "manifest", "--input_dir", str(sweep), "--format", "csv"]) == 0
    import io

    import pandas as pd

    table = pd.read_csv(io.StringIO(capsys.readouterr().out))
    rows = {(k, v): n for k, v, n in table.itertuples(index=False)}
    assert rows[("code version", "0.1.0")] == 1 and rows[("code version", "0.2.0")] == 2
    assert rows[("code version", "unknown (no manifest.json)")] == 1
    assert rows[("torch", torch.__version__)] == 3
    assert sum(n for (k, _), n in rows.items() if k == "device") == 4


def test_a_table_whose_runs_mix_code_versions_says_so(tmp_path, run_dir, capsys):
    sweep = _fake_sweep(tmp_path, run_dir, ["0.1.0", "0.2.0"])
    assert main(["collect", "--input_dir", str(sweep), "--selection", "training"]) == 0
    text = capsys.readouterr().out
    assert "Its runs mix code versions: 0.1.0 (1 run), 0.2.0 (1 run)" in text
    assert main(["collect", "--input_dir", str(sweep), "--selection", "training", "--format", "latex"]) == 0
    assert r"{\footnotesize Its runs mix code versions: 0.1.0 (1 run), 0.2.0 (1 run)" in capsys.readouterr().out
    same = _fake_sweep(tmp_path / "b", run_dir, ["0.2.0", "0.2.0"])
    assert main(["collect", "--input_dir", str(same), "--selection", "training"]) == 0
    assert "mix code versions" not in capsys.readouterr().out


def test_manifest_takes_no_fields(tmp_path, run_dir, capsys):
    sweep = _fake_sweep(tmp_path, run_dir, ["0.2.0"])
    assert main(["collect", "manifest", "--input_dir", str(sweep), "--fields", "loss"]) == 2
    assert capsys.readouterr().err.strip() == "domaingen collect manifest: error: unknown flag --fields"
