"""`domaingen sweep status --watch`: one screen, refreshed, of a running sweep.

Each refresh reads the sweep directory: the job counts per state, every running job (its
run lock is held) with its latest recorded step and training-domain validation accuracy,
and an ETA. The ETA divides the steps left (every job not done or failed, from its last
checkpoint) by the sweep's throughput in steps per second: measured between this watch's
first refresh and now (steps reach the disk at checkpoints, so it settles after a few);
before any step has been measured, from the jobs' latest records: their `step_time` plus their
`eval_time` spread over the steps since the checkpoint before, over the jobs running (a record
without `eval_time` leaves evaluation out, and its ETA is low). The watch ends
when every job is done or failed, when no job has run for two refreshes in a row after one
did (the launcher stopped), or on Ctrl-C; started before a launch, it waits for one.
"""

from __future__ import annotations

import collections
import math
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

from domaingen.run.rundir import DONE_STATE, FAILED_STATE, RunDirectory
from domaingen.run.runlock import is_locked
from domaingen.sweep.slurm_jobs import active_jobs
from domaingen.sweep.spec import STATES, Job, job_states


@dataclass
class RunningJob:
    """A job whose lock is held: how far it got."""

    job_id: str
    label: str
    step: int | None  # the latest recorded step (None: no record yet)
    steps: int
    val_acc: float | None  # training-domain validation accuracy at that step


@dataclass
class Progress:
    """One refresh's reading of the sweep."""

    counts: dict[str, int]
    running: list[RunningJob]
    steps_done: int  # over every job: its steps if done or failed, else its checkpointed steps
    steps_left: int
    step_time: float | None  # mean over the latest records read of step_time + eval_time per step covered
    eval_counted: bool = False  # whether some record read had eval_time (a record without it leaves evaluation out)
    eta_s: float | None = None
    rate: float | None = None  # measured steps per second
    finished: bool = False
    notes: list[str] = field(default_factory=list)


def _val_acc(record: dict, test_envs: Sequence[int]) -> float | None:
    values = [v for k, v in record.items() if k.endswith("_out_acc") and k.startswith("env")
              and int(k[3:-8]) not in set(test_envs) and isinstance(v, (int, float))]
    return float(sum(values) / len(values)) if values else None


def read_progress(jobs: Sequence[Job], sweep_dir: str) -> Progress:
    """The sweep's state now, without an ETA (see Watch)."""
    states = job_states(jobs, sweep_dir)
    counts = collections.Counter(states.values())
    running, done_steps, left, step_times, eval_counted = [], 0, 0, [], False
    for job in jobs:
        steps = int(job.args["steps"])
        state = states[job.job_id]
        if state in (DONE_STATE, FAILED_STATE):
            done_steps += steps
            continue
        records = RunDirectory(job.directory(sweep_dir)).records() if state != "not launched" else []
        last = records[-1] if records else None
        reached = int(last["step"]) + 1 if last and isinstance(last.get("step"), int) else 0
        done_steps += reached
        left += steps - reached
        if last and isinstance(last.get("step_time"), (int, float)):
            covered = reached - (int(records[-2]["step"]) + 1 if len(records) > 1 else 0)
            timed = isinstance(last.get("eval_time"), (int, float))
            evaluation = last["eval_time"] if timed else 0.0
            eval_counted |= timed
            step_times.append(float(last["step_time"]) + float(evaluation) / max(1, covered))
        if is_locked(job.directory(sweep_dir)):
            a = job.args
            label = f"{a['dataset']} {a['algorithm']} test {a['test_envs']} h{a['hparams_seed']} t{a['trial_seed']}"
            running.append(RunningJob(job.job_id, label, None if last is None else int(last["step"]), steps,
                                      None if last is None else _val_acc(last, a["test_envs"])))
    counts = {s: counts.get(s, 0) for s in STATES}
    finished = counts[DONE_STATE] + counts[FAILED_STATE] == len(jobs)
    return Progress(counts, running, done_steps, left, sum(step_times) / len(step_times) if step_times else None,
                    eval_counted=eval_counted, finished=finished)


class Watch:
    """Successive readings of one sweep with an ETA from the throughput measured since the first."""

    def __init__(self, jobs: Sequence[Job], sweep_dir: str, clock: Callable[[], float] = time.monotonic) -> None:
        self.jobs, self.sweep_dir, self.clock = jobs, sweep_dir, clock
        self.start: tuple[float, int] | None = None
        self.idle = 0
        self.seen_running = False

    def read(self) -> Progress:
        progress = read_progress(self.jobs, self.sweep_dir)
        now = self.clock()
        if self.start is None:
            self.start = (now, progress.steps_done)
        elapsed, measured = now - self.start[0], progress.steps_done - self.start[1]
        if elapsed > 0 and measured > 0:
            progress.rate = measured / elapsed
            progress.eta_s = progress.steps_left / progress.rate
        elif progress.step_time and progress.running:
            progress.eta_s = progress.steps_left * progress.step_time / len(progress.running)
        queued = {} if progress.running or progress.finished else self.queued()
        if queued:
            progress.notes.append(f"{len(queued)} job(s) queued or running in Slurm")
        active = bool(progress.running or queued)
        self.seen_running |= active
        self.idle = 0 if active else self.idle + 1
        if not progress.finished and not active:
            progress.notes.append("no job is running: the launcher stopped (domaingen sweep launch resumes it)"
                                  if self.seen_running else "no job is running yet (waiting for a launch; Ctrl-C ends)")
        return progress

    def queued(self) -> dict[str, str]:
        """Jobs of this sweep that Slurm holds (none without recorded submissions)."""
        return active_jobs(self.sweep_dir, [job.job_id for job in self.jobs])

    def done(self, progress: Progress) -> bool:
        """Whether the watch should end after showing `progress`."""
        return progress.finished or (self.seen_running and self.idle >= 2)


def duration(seconds: float | None) -> str:
    """'1h 02m', '3m 05s', '12s', or '-' when unknown."""
    if seconds is None or not math.isfinite(seconds):
        return "-"
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}h {minutes:02d}m" if hours else f"{minutes}m {secs:02d}s" if minutes else f"{secs}s"


def render(progress: Progress, sweep_dir: str, total: int) -> str:
    """The screen of one refresh (plain text)."""
    lines = [f"{total} jobs in {sweep_dir}: " + ", ".join(f"{n} {s}" for s, n in progress.counts.items())]
    recorded = ("from recorded step and evaluation times" if progress.eval_counted
                else "from recorded step times, evaluation not counted")
    how = (f"{progress.rate:.2f} steps/s measured" if progress.rate else
           recorded if progress.eta_s is not None else "not measured yet")
    lines.append(f"steps: {progress.steps_done} done, {progress.steps_left} left; ETA {duration(progress.eta_s)} "
                 f"({how})")
    if progress.running:
        lines.append("")
        lines.append(f"running ({len(progress.running)}):")
        for job in progress.running:
            step = "starting" if job.step is None else f"step {job.step + 1}/{job.steps}"
            acc = "" if job.val_acc is None else f", validation accuracy {100 * job.val_acc:.1f}%"
            lines.append(f"  {job.label}: {step}{acc}")
    lines += progress.notes
    if progress.finished:
        lines.append("the sweep has ended")
    return "\n".join(lines)


def watch(jobs: Sequence[Job], sweep_dir: str, show: Callable[[str], None], interval: float = 5.0,
          clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> Progress:
    """Show `render` of the sweep every `interval` seconds until it ends (see Watch.done); returns the last reading."""
    watcher = Watch(jobs, sweep_dir, clock)
    while True:
        progress = watcher.read()
        show(render(progress, sweep_dir, len(jobs)))
        if watcher.done(progress):
            return progress
        sleep(interval)
