"""The per-run lock: exclusive, dies with its holder, and two launches of one sweep never run a job twice."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from domaingen.cli.main import main
from domaingen.run.runlock import LOCK_FILE, RunLockedError, is_locked, run_lock
from domaingen.sweep.spec import build_jobs, load_spec

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
n_hparams = 1
n_trials = 1
steps = 3
checkpoint_freq = 2

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""
N_JOBS = 3  # 3 test environments x 1 trial


def launch_argv(spec: Path, out: Path) -> list[str]:
    return ["sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--data_dir", "embedded",
            "--launcher", "local", "--no_progress", "--yes"]


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def training_starts(run: Path) -> int:
    """How many times a training loop started in this run directory (one log line each)."""
    return sum(" on ColoredMNIST, test envs " in line for line in (run / "log.txt").read_text().splitlines())


def test_lock_is_exclusive_and_names_its_holder(tmp_path):
    run = tmp_path / "run"
    with run_lock(run):
        assert is_locked(run)
        with pytest.raises(RunLockedError) as info:
            with run_lock(run):
                pass
        message = str(info.value)
        assert f"pid {os.getpid()}" in message and "being run by another process" in message
        assert "\n" not in message
    assert not is_locked(run)
    with run_lock(run):  # free again once released
        assert (run / LOCK_FILE).exists()


def test_a_killed_holder_does_not_block_the_run(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from domaingen.run.runlock import run_lock\n"
         "with run_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)", str(run)],
        stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        assert is_locked(run)
        with pytest.raises(RunLockedError, match=f"pid {holder.pid}"):
            with run_lock(run):
                pass
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        assert not is_locked(run)
        with run_lock(run):
            pass
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()


def test_a_job_held_elsewhere_is_skipped_then_run_by_a_relaunch(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    held, single = tmp_path / "held", tmp_path / "single"
    victim = build_jobs(load_spec(spec))[0].directory(held)
    with run_lock(victim):
        code, stdout, _ = cli(capsys, *launch_argv(spec, held))
        assert code == 0 and f"launched {N_JOBS} jobs: {N_JOBS - 1} done, 1 running elsewhere" in stdout
        assert not (victim / "args.json").exists()  # never touched while held
    code, stdout, _ = cli(capsys, *launch_argv(spec, held))
    assert code == 0 and "launched 1 jobs: 1 done" in stdout
    assert cli(capsys, *launch_argv(spec, single))[0] == 0
    tables = [cli(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (held, single)]
    assert tables[0] == tables[1]


def test_two_concurrent_launches_run_every_job_exactly_once(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    shared, single = tmp_path / "shared", tmp_path / "single"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    argv = [sys.executable, "-m", "domaingen", "-q", *launch_argv(spec, shared)]
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for _ in range(2)]
    outputs = [p.communicate(timeout=600) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    runs = sorted(p for p in shared.iterdir() if p.is_dir())
    assert len(runs) == N_JOBS and all((r / "done").exists() for r in runs)
    # each run's training loop started once, and its records are one uninterrupted run's
    assert [training_starts(r) for r in runs] == [1] * N_JOBS
    for r in runs:
        steps = [json.loads(line)["step"] for line in (r / "results.jsonl").read_text().splitlines()]
        assert steps == [0, 2]
    assert cli(capsys, *launch_argv(spec, single))[0] == 0
    tables = [cli(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (shared, single)]
    assert tables[0] == tables[1]


def test_delete_incomplete_leaves_a_running_job_alone(tmp_path, capsys):
    spec = tmp_path / "spec.toml"
    spec.write_text(SPEC)
    out = tmp_path / "sweep"
    jobs = build_jobs(load_spec(spec))
    for job in jobs[:2]:  # two started runs, neither done
        job.directory(out).mkdir(parents=True)
        (job.directory(out) / "args.json").write_text("{}")
    with run_lock(jobs[0].directory(out)):
        code, stdout, _ = cli(capsys, "sweep", "delete-incomplete", "--spec", str(spec), "--output_dir", str(out),
                              "--yes")
        code2, status, _ = cli(capsys, "sweep", "status", "--spec", str(spec), "--output_dir", str(out))
    assert code == 0 and "deleted 1 incomplete" in stdout
    assert jobs[0].directory(out).exists() and not jobs[1].directory(out).exists()
    assert "of the jobs not done: 1 running (lock held)" in status
