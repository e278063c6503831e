"""The local launcher: every job one after another in this process."""

from __future__ import annotations

from domaingen.sweep.launcher_registry import register_launcher
from domaingen.sweep.workers import JobResult, job_kwargs, progress_bar, run_job, threads_per_worker, worker_cache


@register_launcher("local", "one job after another in this process")
def launch_local(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    results = []
    threads = options.threads or threads_per_worker(1)
    cache = worker_cache(options.dataset_cache_mb)
    with progress_bar(len(jobs), options) as bar:
        for job in jobs:
            results.append(run_job(job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers), threads, cache))
            bar.update(1)
    return results
