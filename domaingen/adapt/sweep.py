"""Adapt every done run of a sweep with a sweep launcher, one adaptation job per run, skipping
what is stored.

`plan_adaptation` splits a sweep's done runs, in order of their directory names, into
those whose results are stored for every adapter asked (skipped) and one `AdaptJob`
for each of the others; any launcher (local, parallel, slurm, ray, dry, a plugin's)
runs the jobs. Each adapter's results on a run are written whole (adapt.run), so an
interrupted job loses at most the adapter it was in and the next command redoes it;
two commands on one sweep never corrupt a file, they may only repeat each other's work.
With every adapter asked (`adapters` None), a run on which some adapter is undefined
(TentFull without BatchNorm) has no file for it, so such a run is visited again, and
ends at once with nothing to adapt.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Sequence

from domaingen.adapt.jobs import REFUSED, AdaptJob
from domaingen.adapt.run import adapted_file, adapter_names, check_selected
from domaingen.errors import DomaingenError
from domaingen.run.rundir import ARGS, DONE
from domaingen.sweep.launch import check_options, launch
from domaingen.sweep.workers import JobResult, LaunchOptions

STORED = "stored already"


def done_runs(sweep_dir: str | Path) -> list[Path]:
    """The done run directories of a sweep (or the run itself, given one)."""
    root = Path(sweep_dir)
    if not root.is_dir():
        raise DomaingenError(f"--input_dir {root} is not a directory; give a sweep's output directory")
    if (root / ARGS).exists():
        return [root] if (root / DONE).exists() else []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / DONE).exists() and (p / ARGS).exists())


@dataclass(frozen=True)
class AdaptPlan:
    """A sweep's done runs: those stored for every adapter in `names` and a job for each of the others."""

    names: list[str]
    stored: list[Path]
    jobs: list[AdaptJob]


def plan_adaptation(sweep_dir: str | Path, adapters: Sequence[str] | None = None, device: str = "auto") -> AdaptPlan:
    """The plan for adapting `sweep_dir` with `adapters` (None: every registered one, each run skipping
    those undefined for it). An unknown adapter, a sweep without done runs, or a run to adapt without
    selected weights raises one line, before any job is launched."""
    names = adapter_names(adapters)
    runs = done_runs(sweep_dir)
    if not runs:
        raise DomaingenError(f"no done runs in {sweep_dir}; launch or resume the sweep first (domaingen sweep launch)")
    stored = [run for run in runs if all(adapted_file(run, name).exists() for name in names)]
    todo = [run for run in runs if run not in stored]
    for run in todo:
        check_selected(run)
    jobs = [AdaptJob.of_run(run, None if adapters is None else names, device) for run in todo]
    return AdaptPlan(names, stored, jobs)


def outcome_counts(plan: AdaptPlan, results: Iterable[JobResult]) -> Counter:
    """How many (adapter, run) pairs ended each way: 'done', 'stored already' (the skipped runs' too),
    or 'undefined: REASON'."""
    counts: Counter = Counter({(name, STORED): len(plan.stored) for name in plan.names if plan.stored})
    for result in results:
        for name, what in result.details.items():
            counts[(name, what if what in ("done", STORED) else f"undefined: {what}")] += 1
    return counts


def raise_refusal(results: Iterable[JobResult]) -> None:
    """Raise the first refused job's one-line reason (a run that cannot be adapted as asked)."""
    for result in results:
        if result.state == REFUSED:
            raise DomaingenError(result.message)


def adapt_sweep(sweep_dir: str | Path, adapters: Sequence[str] | None = None, data_dir: str | None = None,
                device: str = "auto", workers: int = 1, threads: int | None = None) -> Counter:
    """Adapt every done run of `sweep_dir` with `adapters` (every registered one when None); returns
    how many (adapter, run) pairs ended each way (outcome_counts). With `adapters` None an adapter
    undefined for a run (TentFull without BatchNorm) is skipped there; one named explicitly raises
    its reason. `workers` 1 adapts in this process (the local launcher); more runs the parallel
    launcher, `workers` spawned processes with `threads` threads each (default: the cores shared
    out among them). A job that failed otherwise raises one line naming its run and the error."""
    if workers < 1:
        raise DomaingenError(f"--workers must be at least 1, got {workers}")
    plan = plan_adaptation(sweep_dir, adapters, device)
    launcher = "local" if workers == 1 else "parallel"
    options = LaunchOptions(workers=workers, threads=threads, progress=False)
    check_options(launcher, options)
    results = launch(plan.jobs, str(sweep_dir), data_dir, launcher, options) if plan.jobs else []
    raise_refusal(results)
    failed = [r for r in results if r.state != "done"]
    if failed:
        raise DomaingenError(f"{len(failed)} of {len(results)} runs ended {failed[0].state}; "
                             f"{failed[0].job_id}: {failed[0].message}")
    return outcome_counts(plan, results)
