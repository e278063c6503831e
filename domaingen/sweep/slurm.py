"""The Slurm launcher (submitit): job arrays of chunks that requeue themselves on preemption."""

from __future__ import annotations

import os
from typing import Any, Mapping, Sequence

from domaingen.errors import DomaingenError
from domaingen.sweep.launcher_registry import register_launcher
from domaingen.sweep.workers import (
    NOT_SUBMITTED,
    SUBMITTED,
    JobResult,
    LaunchOptions,
    chunks,
    job_kwargs,
    progress_bar,
    run_job_chunk,
)

class _RequeueableChunk:
    """A submitit callable that runs a chunk of jobs and asks to be requeued on preemption or timeout.

    The requeued task runs the same chunk again: done jobs are skipped, the one that
    was interrupted resumes from its checkpoint, and the rest start, so requeueing is
    all it takes.
    """

    def __call__(
        self, chunk: Sequence[tuple[str, Mapping[str, Any]]], threads: int | None, cache_mb: float | None = None
    ) -> list[JobResult]:
        return run_job_chunk(chunk, threads, cache_mb)

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _slurm_executor(sweep_dir: str, options: LaunchOptions) -> tuple[Any, str, str, int | None]:
    """submitit's executor for the sweep, its cluster name, log folder, and threads per job."""
    try:
        import submitit
    except ImportError:
        raise DomaingenError("the slurm launcher needs submitit; install it with pip install 'domaingen-bench[slurm]'") from None
    slurm = dict(options.slurm)
    cluster = slurm.pop("cluster", None)  # "local" runs the same job arrays as local processes (for tests)
    slurm.pop("max_array", None)
    folder = os.path.join(sweep_dir, "slurm_logs", "%j")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    params = {k: v for k, v in slurm.items() if v is not None}
    executor.update_parameters(**params)
    threads = options.threads or params.get("cpus_per_task")
    return executor, executor.cluster, folder, threads


@register_launcher("slurm", "Slurm job arrays through submitit (the --slurm_* flags); --detach returns once submitted",
                   jobs_per_task=True, detach=True)
def launch_slurm(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    import submitit

    from domaingen.sweep.slurm_jobs import DEFAULT_MAX_ARRAY, as_submissions, record_submissions, submit_arrays

    executor, cluster, folder, threads = _slurm_executor(sweep_dir, options)
    groups = chunks([(job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers)) for job in jobs], options.jobs_per_task)
    arguments = [(group, threads, options.dataset_cache_mb) for group in groups]
    max_array = options.slurm.get("max_array") or DEFAULT_MAX_ARRAY
    task_ids = [group[0][0] for group in groups]  # a task is named by its first job
    pairs, failures = submit_arrays(executor, _RequeueableChunk(), task_ids, arguments, max_array)
    members = {group[0][0]: [job_id for job_id, _ in group] for group in groups}
    job_pairs = [(job_id, handle) for first, handle in pairs for job_id in members[first]]
    record_submissions(sweep_dir, as_submissions(job_pairs, cluster, folder))
    arrays = sorted({str(handle.job_id).split("_")[0] for _, handle in pairs})
    per_task = f" in {len(pairs)} tasks of up to {options.jobs_per_task}" if options.jobs_per_task > 1 else ""
    options.print_fn(f"submitted {len(job_pairs)} jobs{per_task} as {len(arrays)} array(s): {' '.join(arrays) or '-'}")
    results = [JobResult(job_id, NOT_SUBMITTED, failure.reason)
               for failure in failures for first in failure.job_ids for job_id in members[first]]
    if options.detach:
        return results + [JobResult(job_id, SUBMITTED, str(handle.job_id)) for job_id, handle in job_pairs]
    firsts = {id(handle): first for first, handle in pairs}
    with progress_bar(len(job_pairs), options) as bar:
        for handle in submitit.helpers.as_completed([handle for _, handle in pairs]):
            group = members[firsts[id(handle)]]
            try:
                results.extend(handle.result())
            except Exception as exc:  # the scheduler killed or lost it
                results.extend(JobResult(job_id, "failed", f"{type(exc).__name__}: {exc}") for job_id in group)
            bar.update(len(group))
    return results

