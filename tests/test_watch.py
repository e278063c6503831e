"""sweep status --watch: counts, running jobs and an ETA, read from a sweep directory written by hand, on a fake clock."""

from __future__ import annotations

from pathlib import Path

import pytest

from domaingen.run.rundir import RunDirectory
from domaingen.run.runlock import run_lock
from domaingen.sweep.progress import Watch, duration, render, watch
from domaingen.sweep.spec import build_jobs, parse_spec


@pytest.fixture
def jobs():
    spec = parse_spec({"algorithms": ["ERM"], "datasets": ["ColoredMNIST"], "test_envs": [[2]], "n_hparams": 1,
                       "n_trials": 3, "steps": 10, "checkpoint_freq": 5})
    return build_jobs(spec)


def record(path: Path, step: int, step_time: float = 0.5, outs=(0.8, 0.6), **more) -> None:
    rundir = RunDirectory(path)
    rundir.create({"steps": 10})
    rundir.append_record({"step": step, "step_time": step_time, "env0_out_acc": outs[0], "env1_out_acc": outs[1],
                          "env2_out_acc": 0.1, "env2_in_acc": 0.1, **more})


def test_the_first_eta_counts_the_evaluations_spread_over_the_steps_they_follow(jobs, tmp_path):
    sweep = str(tmp_path)
    _, running, _ = jobs
    with run_lock(running.directory(sweep)):
        record(running.directory(sweep), 0, step_time=0.3, eval_time=2.0)
        record(running.directory(sweep), 5, step_time=0.25, eval_time=1.0)
        progress = Watch(jobs, sweep, Clock()).read()
    # the latest record covers steps 1-5: 0.25 s each plus its 1 s evaluation over those 5 steps
    assert progress.step_time == pytest.approx(0.25 + 1.0 / 5)
    assert progress.steps_left == 4 + 10 + 10
    assert progress.eta_s == pytest.approx(24 * (0.25 + 0.2))
    assert render(progress, sweep, 3).splitlines()[1] == (
        "steps: 6 done, 24 left; ETA 11s (from recorded step and evaluation times)")  # 24 x 0.45 s = 10.8 s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_eta_divides_the_steps_left_by_the_measured_throughput(jobs, tmp_path):
    sweep = str(tmp_path)
    done, running, waiting = jobs
    record(done.directory(sweep), 9)
    RunDirectory(done.directory(sweep)).mark_done({})
    clock = Clock()
    watcher = Watch(jobs, sweep, clock)
    with run_lock(running.directory(sweep)):
        record(running.directory(sweep), 0, step_time=0.25)
        first = watcher.read()
        # no throughput measured yet: the recorded step time x the steps left / the jobs running
        assert first.counts == {"done": 1, "incomplete": 1, "failed": 0, "not launched": 1}
        assert (first.steps_done, first.steps_left) == (10 + 1, 9 + 10)
        assert first.step_time == 0.25  # the latest records of the jobs not done
        assert first.eta_s == pytest.approx(19 * first.step_time / 1)
        # a record without eval_time (a run from before it was recorded): the screen says what is left out
        assert render(first, sweep, 3).splitlines()[1] == (
            "steps: 11 done, 19 left; ETA 5s (from recorded step times, evaluation not counted)")
        assert [(j.step, j.val_acc) for j in first.running] == [(0, pytest.approx(0.7))]
        clock.now += 20.0
        record(running.directory(sweep), 5, outs=(0.9, 0.7))
        second = watcher.read()
        assert second.rate == pytest.approx(5 / 20.0)  # 5 more steps reached the disk in 20 s
        assert second.eta_s == pytest.approx(14 / (5 / 20.0))
        assert [(j.step, j.val_acc) for j in second.running] == [(5, pytest.approx(0.8))]
        screen = render(second, sweep, 3)
        assert screen.splitlines()[:2] == [
            f"3 jobs in {sweep}: 1 done, 1 incomplete, 0 failed, 1 not launched",
            "steps: 16 done, 14 left; ETA 56s (0.25 steps/s measured)"]
        assert "ColoredMNIST ERM test [2] h0 t1: step 6/10, validation accuracy 80.0%" in screen
        assert not watcher.done(second)


def test_watch_ends_when_every_job_is_done_or_when_the_launcher_stopped(jobs, tmp_path):
    sweep = str(tmp_path)
    shown: list[str] = []
    clock = Clock()

    def sleep(seconds: float) -> None:
        clock.now += seconds
        # the launcher finishes one job per refresh
        pending = [j for j in jobs if not (j.directory(sweep) / "done").exists()]
        record(pending[0].directory(sweep), 9)
        RunDirectory(pending[0].directory(sweep)).mark_done({})

    last = watch(jobs, sweep, shown.append, interval=3.0, clock=clock, sleep=sleep)
    assert last.finished and len(shown) == 4 and shown[-1].endswith("the sweep has ended")
    assert clock.now == 109.0
    # a sweep nobody runs: the watch waits for a launch, and once a job ran and none runs for
    # two refreshes it says the launcher stopped and ends
    other = tmp_path / "other"
    watcher = Watch(jobs, str(other), Clock())
    assert not watcher.done(watcher.read()) and not watcher.done(watcher.read())
    with run_lock(jobs[0].directory(str(other))):
        assert not watcher.done(watcher.read())
    assert not watcher.done(watcher.read())
    stopped = watcher.read()
    assert watcher.done(stopped) and "the launcher stopped" in render(stopped, str(other), 3)


def test_durations_read_as_hours_minutes_seconds():
    assert [duration(s) for s in (None, 12.4, 185, 3720)] == ["-", "12s", "3m 05s", "1h 02m"]


def test_a_nonpositive_interval_is_refused(tmp_path, capsys):
    from domaingen.cli import main

    code = main(["sweep", "status", "--algorithms", "ERM", "--datasets", "ColoredMNIST", "--output_dir",
                 str(tmp_path), "--watch", "--interval", "0"])
    assert code == 2 and capsys.readouterr().err.strip() == "domaingen: error: --interval must be positive, got 0"
