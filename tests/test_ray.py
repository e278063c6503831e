"""The Ray launcher on a local 2-CPU instance the tests start and stop, and its one-line errors."""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

from domaingen.cli.main import main
from domaingen.sweep.launch import launch
from domaingen.sweep.workers import LaunchOptions
from domaingen.run.runlock import LOCK_FILE
from domaingen.sweep.spec import build_jobs, load_spec

SPEC = """
algorithms = ["ERM"]
datasets = ["ColoredMNIST"]
n_hparams = 1
n_trials = 1
steps = 40
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


def launch_argv(spec: Path, out: Path, *extra: str) -> list[str]:
    return ["sweep", "launch", "--spec", str(spec), "--output_dir", str(out), "--data_dir", "embedded",
            "--no_progress", "--yes", *extra]


@pytest.fixture(scope="module")
def local_ray():
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 2**20)
    yield ray
    ray.shutdown()


def test_without_ray_installed_one_line_and_nothing_written(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` now raises ImportError
    spec, out = tmp_path / "spec.toml", tmp_path / "sweep"
    spec.write_text(SPEC)
    code, _, err = cli(capsys, *launch_argv(spec, out, "--launcher", "ray"))
    assert code == 2 and "the ray launcher needs ray; install it with pip install 'domaingen-bench[ray]'" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_an_address_that_does_not_answer_one_line_and_nothing_written(tmp_path, capsys):
    pytest.importorskip("ray")
    spec, out = tmp_path / "spec.toml", tmp_path / "sweep"
    spec.write_text(SPEC)
    code, _, err = cli(capsys, *launch_argv(spec, out, "--launcher", "ray", "--ray_address", "127.0.0.1:1"))
    assert code == 2 and "no Ray cluster answers at 127.0.0.1:1" in err and "ray start --head" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_job_failures_are_reported_per_job(tmp_path, capsys, local_ray):
    spec, out = tmp_path / "spec.toml", tmp_path / "sweep"
    spec.write_text(SPEC)
    (tmp_path / "no_data").mkdir()  # exists, so the launch goes ahead, but holds no MNIST: every job fails
    argv = [a if a != "embedded" else str(tmp_path / "no_data") for a in launch_argv(spec, out, "--launcher", "ray")]
    code, stdout, _ = cli(capsys, *argv)
    failed = [line for line in stdout.splitlines() if line.startswith("  failed ")]
    assert code == 1 and "launched 3 jobs: 3 failed" in stdout
    assert sorted(line.split()[1].rstrip(":") for line in failed) == sorted(j.job_id for j in build_jobs(load_spec(spec)))
    assert all("DataNotFoundError" in line for line in failed)


def _holder_pid(run: Path) -> int | None:
    text = (run / LOCK_FILE).read_text() if (run / LOCK_FILE).exists() else ""
    words = text.split()
    return int(words[words.index("pid") + 1]) if "pid" in words else None


# Long enough (about a second a job) that the job found between its first checkpoint and its
# third record is still running when the kill lands: with 40 steps of 1 ms a job could finish,
# and its worker move on to the next job, between the poll that chose it and the kill.
LONG_SPEC = SPEC.replace("steps = 40\ncheckpoint_freq = 10", "steps = 1000\ncheckpoint_freq = 100")


def _records(run: Path) -> int:
    return len((run / "results.jsonl").read_text().splitlines())


def test_a_worker_killed_mid_job_is_retried_and_resumes(tmp_path, capsys, local_ray):
    spec, out, straight = tmp_path / "spec.toml", tmp_path / "sweep", tmp_path / "straight"
    assert LONG_SPEC != SPEC
    spec.write_text(LONG_SPEC)
    jobs = build_jobs(load_spec(spec))
    results = []
    runner = threading.Thread(target=lambda: results.extend(
        launch(jobs, str(out), "embedded", "ray", LaunchOptions(progress=False, ray_cpus=1))))
    runner.start()
    victim, pid = None, None
    deadline = time.time() + 300
    while victim is None and time.time() < deadline:
        for run in out.glob("*/results.jsonl") if out.exists() else []:
            # a checkpoint, written right after the first record, is what a resume starts from
            if (run.parent / "checkpoint.pt").exists() and _records(run.parent) <= 2 \
                    and not (run.parent / "done").exists():
                victim, pid = run.parent, _holder_pid(run.parent)
                break
        time.sleep(0.05)
    assert victim is not None and pid is not None and pid != os.getpid(), "no job was caught mid-run"
    os.kill(pid, signal.SIGKILL)
    runner.join(timeout=600)
    assert not runner.is_alive()
    assert sorted(r.job_id for r in results) == sorted(j.job_id for j in jobs)
    assert {r.state for r in results} == {"done"}, [(r.state, r.message) for r in results]
    assert "resuming from step" in (victim / "log.txt").read_text()
    steps = [json.loads(line)["step"] for line in (victim / "results.jsonl").read_text().splitlines()]
    assert steps == [*range(0, 1000, 100), 999]
    # same resume semantics as the other launchers: a relaunch finds nothing to do
    code, stdout, _ = cli(capsys, *launch_argv(spec, out, "--launcher", "ray"))
    assert code == 0 and "nothing to launch" in stdout
    assert cli(capsys, *launch_argv(spec, straight, "--launcher", "local"))[0] == 0
    tables = [cli(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (out, straight)]
    assert tables[0] == tables[1]


def test_tasks_of_two_jobs_give_the_tables_of_single_jobs(tmp_path, capsys, local_ray):
    spec, out, straight = tmp_path / "spec.toml", tmp_path / "sweep", tmp_path / "straight"
    spec.write_text(SPEC.replace("steps = 40", "steps = 5"))
    code, stdout, _ = cli(capsys, *launch_argv(spec, out, "--launcher", "ray", "--jobs_per_task", "2"))
    assert code == 0 and "launched 3 jobs: 3 done" in stdout
    assert cli(capsys, *launch_argv(spec, straight, "--launcher", "local", "--dataset_cache_mb", "0"))[0] == 0
    tables = [cli(capsys, "collect", "--input_dir", str(d), "--format", "csv")[1] for d in (out, straight)]
    assert tables[0] == tables[1]
