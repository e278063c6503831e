"""Slurm without a waiting terminal: --detach, recorded job ids, status, relaunch without double submission."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from domaingen.sweep import slurm_jobs
from domaingen.cli.main import main
from domaingen.sweep.slurm_jobs import SUBMISSIONS_FILE, read_submissions, scheduler_states, submit_arrays

submitit = pytest.importorskip("submitit")

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
n_hparams = 1
n_trials = 1
steps = {steps}
checkpoint_freq = 10

[hparams]
featurizer = "MLP"
mlp_width = 16
batch_size = 16
"""


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(["-q", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def slurm_argv(spec: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--data_dir", "embedded",
            "--launcher", "slurm", "--slurm_cpus", "1", "--no_progress", "--yes", *extra]


class FakeHandle:
    def __init__(self, job_id: str) -> None:
        self.job_id = job_id


class FlakyExecutor:
    """An executor whose second array submission is refused, as sbatch refuses one over a QOS limit."""

    cluster = "slurm"

    def __init__(self, *args, **kwargs) -> None:
        self.calls = 0

    def update_parameters(self, **kwargs) -> None:
        pass

    def map_array(self, function, *columns):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("sbatch: error: Batch job submission failed:\n Job violates accounting/QOS policy")
        return [FakeHandle(f"{100 + self.calls}_{i}") for i in range(len(columns[0]))]


def test_submit_arrays_reports_a_refused_chunk_and_submits_the_rest():
    ids = [f"job{i}" for i in range(5)]
    pairs, failures = submit_arrays(FlakyExecutor(), print, ids, [(i, {}, 1) for i in ids], max_array=2)
    assert [(job, h.job_id) for job, h in pairs] == [("job0", "101_0"), ("job1", "101_1"), ("job4", "103_0")]
    assert len(failures) == 1 and failures[0].job_ids == ("job2", "job3")
    assert failures[0].reason == "RuntimeError: sbatch: error: Batch job submission failed: Job violates accounting/QOS policy"


def test_detached_slurm_partial_failure_status_and_relaunch(tmp_path, capsys, monkeypatch):
    """Fake scheduler: ids recorded, refused jobs listed, status shows Slurm states, relaunch submits only the rest."""
    monkeypatch.setattr(submitit, "AutoExecutor", FlakyExecutor)
    spec, out = tmp_path / "spec.toml", tmp_path / "sweep"
    spec.write_text(SPEC.format(steps=20))
    code, stdout, _ = cli(capsys, *slurm_argv(spec, out, "--detach", "--slurm_max_array", "2"))
    assert code == 1 and "submitted 3 jobs: 1 not submitted, 2 submitted" in stdout
    recorded = read_submissions(out)
    assert sorted(s.scheduler_id for s in recorded.values()) == ["101_0", "101_1"]
    refused = [line for line in stdout.splitlines() if line.startswith("  not submitted ")]
    assert len(refused) == 1 and "Job violates accounting/QOS policy" in refused[0]
    refused_id = refused[0].split()[2].rstrip(":")
    assert refused_id not in recorded and not (out / refused_id).exists()

    fake_states = {"101_0": "PENDING", "101_1": "RUNNING"}
    monkeypatch.setattr(slurm_jobs, "_slurm_states", lambda ids: {i: fake_states[i] for i in ids})
    code, status, _ = cli(capsys, "sweep", "status", "--output_dir", str(out))
    assert "3 jobs in" in status and "0 done, 0 incomplete, 0 failed, 3 not launched" in status
    assert "of the jobs not done: 1 PENDING, 1 RUNNING" in status
    # relaunch: the queued and the running job are not submitted again, the refused one is
    code, stdout, _ = cli(capsys, *slurm_argv(spec, out, "--detach"))
    assert code == 0 and "2 of them queued or running in Slurm (1 PENDING, 1 RUNNING)" in stdout
    assert "submitted 1 jobs: 1 submitted" in stdout
    assert set(read_submissions(out)) == set(recorded) | {refused_id}


def _children(pid: int) -> list[int]:
    try:
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.time() + timeout
    while not predicate():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_detached_local_cluster_kill_and_relaunch(tmp_path, capsys):
    """submitit's local executor: detach returns, status follows, a killed job is resubmitted and resumes."""
    spec, out, straight = tmp_path / "spec.toml", tmp_path / "sweep", tmp_path / "straight"
    spec.write_text(SPEC.format(steps=40))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])}
    argv = [sys.executable, "-m", "domaingen", "-q", *slurm_argv(spec, out, "--slurm_cluster", "local", "--detach")]
    groups = []

    def detach(log_name: str) -> str:
        # output to a file: the local cluster's job processes inherit it and outlive the launch
        with open(tmp_path / log_name, "w") as log:
            proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            groups.append(proc.pid)
            assert proc.wait(timeout=300) == 0, (tmp_path / log_name).read_text()
        return (tmp_path / log_name).read_text()

    try:
        assert "submitted 3 jobs: 3 submitted" in detach("first.log")
        first = read_submissions(out)
        assert len(first) == 3
        # a relaunch while they run submits nothing
        code, stdout, _ = cli(capsys, *slurm_argv(spec, out, "--slurm_cluster", "local", "--detach"))
        states = scheduler_states(first)
        assert code == 0 and "nothing to launch" in stdout, (stdout, states)
        assert len((out / SUBMISSIONS_FILE).read_text().splitlines()) == 3

        def caught() -> Path | None:
            for run in out.glob("*/results.jsonl"):
                if (run.parent / "checkpoint.pt").exists() and not (run.parent / "done").exists():
                    return run.parent
            return None

        _wait(lambda: caught() is not None, 300, "a job mid-run")
        victim = caught()
        controller = int(first[victim.name].scheduler_id)
        for task in _children(controller):
            os.kill(task, signal.SIGKILL)
        _wait(lambda: all(s != "RUNNING" for s in scheduler_states(read_submissions(out)).values()), 300,
              "the other jobs to end")
        code, status, _ = cli(capsys, "sweep", "status", "--output_dir", str(out))
        assert "2 done, 1 incomplete, 0 failed, 0 not launched" in status and "of the jobs not done" not in status
        assert scheduler_states({victim.name: first[victim.name]}) == {victim.name: "INTERRUPTED"}

        assert "submitted 1 jobs: 1 submitted" in detach("relaunch.log")
        again = read_submissions(out)[victim.name]
        assert again.scheduler_id != first[victim.name].scheduler_id
        _wait(lambda: (victim / "done").exists() and scheduler_states({"v": again})["v"] != "RUNNING", 300,
              "the resubmitted job")
        assert "resuming from step" in (victim / "log.txt").read_text()
        steps = [json.loads(line)["step"] for line in (victim / "results.jsonl").read_text().splitlines()]
        assert steps == [0, 10, 20, 30, 39]
    finally:
        for group in groups:
            try:
                os.killpg(group, signal.SIGKILL)
            except ProcessLookupError:
                pass
    local = ["sweep", "launch", "--spec", str(spec), "--output_dir", str(straight), "--data_dir", "embedded",
             "--launcher", "local", "--no_progress", "--yes"]
    assert cli(capsys, *local)[0] == 0
    tables = [cli(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (out, straight)]
    assert tables[0] == tables[1]
