"""The dry launcher: print each job's command (`domaingen train`, `domaingen adapt`) and run nothing."""

from __future__ import annotations

from domaingen.sweep.launcher_registry import register_launcher
from domaingen.sweep.workers import JobResult


@register_launcher("dry", "print each job's command (domaingen train, or adapt), run nothing", jobs_per_task=True,
                   detach=True, runs_jobs=False)
def launch_dry(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    for job in jobs:
        options.print_fn(job.command(sweep_dir, data_dir, options.loggers))
    return [JobResult(job.job_id, "not launched", "dry run") for job in jobs]
