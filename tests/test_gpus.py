"""GPUs on one machine: which GPUs are visible, which worker runs where, and the parallel launcher's pinning."""

from __future__ import annotations

import collections
import os
import queue

import pytest

from domaingen.sweep import parallel as launchers
from domaingen.cli.main import main
from domaingen.errors import DomaingenError
from domaingen.sweep.gpus import visible_gpus, worker_gpus
from domaingen.sweep.launch import launch
from domaingen.sweep.workers import LaunchOptions
from domaingen.sweep.spec import build_jobs, parse_spec


@pytest.mark.parametrize("env, count, expected", [
    (None, 3, ["0", "1", "2"]),  # unset: every GPU by index
    ("3,5", 2, ["3", "5"]),  # kept as written
    (" 3, 5 ", 2, ["3", "5"]),
    ("3,,5", 4, ["3"]),  # CUDA stops at the first empty entry
    ("GPU-aa,GPU-bb", 1, ["GPU-aa"]),  # no more than CUDA counts
    ("", 8, []),  # set but empty: no GPU
    (None, 0, []),
])
def test_visible_gpus(env, count, expected):
    assert visible_gpus(env, count) == expected


@pytest.mark.parametrize("gpus, per_gpu, n_jobs", [
    (["0", "1"], 1, 10), (["0", "1"], 4, 10), (["0", "1", "2", "3"], 8, 100), (["0", "1", "2"], 2, 4), (["7"], 3, 1),
])
def test_worker_gpus_deal_jobs_per_gpu_round_robin(gpus, per_gpu, n_jobs):
    slots = worker_gpus(gpus, per_gpu, n_jobs)
    assert len(slots) == min(len(gpus) * per_gpu, n_jobs)
    counts = collections.Counter(slots)
    assert max(counts.values()) <= per_gpu and set(counts) <= set(gpus)
    # the first len(gpus) workers go to distinct GPUs, so a short list still spreads over every GPU
    first = slots[: len(gpus)]
    assert len(set(first)) == len(first)


def test_worker_gpus_by_hand():
    assert worker_gpus(["0", "1"], 2, 10) == ["0", "1", "0", "1"]
    assert worker_gpus(["0", "1", "2"], 2, 4) == ["0", "1", "2", "0"]
    with pytest.raises(DomaingenError, match="--jobs_per_gpu must be at least 1, got 0"):
        worker_gpus(["0"], 0, 3)


def test_a_worker_pins_itself_to_the_gpu_it_draws(monkeypatch):
    monkeypatch.setattr(launchers, "_quiet_worker", lambda threads: None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    slots = queue.Queue()
    slots.put("2")
    launchers._pin_worker(slots, 1)
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "2"


def test_parallel_launcher_pins_each_job_to_one_of_the_given_gpus(tmp_path):
    # fake GPU ids on a CPU machine: each worker still sets CUDA_VISIBLE_DEVICES, and torch runs on the CPU
    jobs = build_jobs(parse_spec({"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "n_hparams": 1, "n_trials": 1,
                                  "steps": 2, "checkpoint_freq": 2,
                                  "hparams": {"featurizer": "MLP", "mlp_width": 16, "batch_size": 16}}))
    options = LaunchOptions(progress=False, gpus=["3", "5"], jobs_per_gpu=2)
    results = launch(jobs, str(tmp_path), "embedded", "parallel", options)
    assert sorted(r.job_id for r in results) == sorted(j.job_id for j in jobs)
    assert {r.state for r in results} == {"done"}
    assert all(r.message.endswith(("(GPU 3)", "(GPU 5)")) for r in results), [r.message for r in results]


@pytest.mark.parametrize("flags, message", [
    (["--launcher", "parallel", "--jobs_per_gpu", "0"], "--jobs_per_gpu must be at least 1, got 0"),
    (["--launcher", "parallel", "--detach"], "--detach works with --launcher slurm only, not parallel"),
    (["--launcher", "local", "--detach"], "--detach works with --launcher slurm only, not local"),
])
def test_bad_launch_flags_give_one_line_and_write_nothing(tmp_path, capsys, flags, message):
    out = tmp_path / "sweep"
    code = main(["-q", "sweep", "launch", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--output_dir", str(out),
                 "--yes", *flags])
    err = capsys.readouterr().err
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not out.exists()
