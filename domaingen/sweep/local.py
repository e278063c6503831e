"""The launchers that run jobs in this process: local (one after another) and dry (print the commands)."""

from __future__ import annotations

from domaingen.sweep.spec import train_command
from domaingen.sweep.workers import JobResult, available_cores, job_kwargs, progress_bar, run_job, worker_cache

def launch_dry(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    for job in jobs:
        options.print_fn(train_command(job, sweep_dir, data_dir, options.loggers))
    return [JobResult(job.job_id, "not launched", "dry run") for job in jobs]


def launch_local(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    results = []
    threads = options.threads or available_cores()
    cache = worker_cache(options.dataset_cache_mb)
    with progress_bar(len(jobs), options) as bar:
        for job in jobs:
            results.append(run_job(job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers), threads, cache))
            bar.update(1)
    return results

