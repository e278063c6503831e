"""Ways to run a list of sweep jobs: local, parallel, slurm (submitit), dry.

Every launcher runs the same `run_job` function, which calls `training.train`
in the worker process; a job's own errors end up in its `failed` marker and its
state, never in the launcher.
"""

from __future__ import annotations

import logging
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import multiprocessing

from tqdm.auto import tqdm

from domaingen.errors import DomaingenError
from domaingen.sweep import Job, train_command

log = logging.getLogger(__name__)

LAUNCHERS = ("local", "parallel", "slurm", "dry")


def available_cores() -> int:
    """Cores this process may use (respects CPU affinity, e.g. under Slurm or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads per worker so that workers x threads never exceeds the cores."""
    return max(1, (cores or available_cores()) // max(1, workers))


@dataclass
class JobResult:
    """How one job ended."""

    job_id: str
    state: str
    message: str = ""


def run_job(job_id: str, config_kwargs: Mapping[str, Any], threads: int | None = None) -> JobResult:
    """Run one job in this process (resuming it if it is incomplete)."""
    import torch

    from domaingen.training import TrainConfig, train

    if threads:
        torch.set_num_threads(threads)
    try:
        outcome = train(TrainConfig(**config_kwargs))
        return JobResult(job_id, outcome.state, outcome.message)
    except Exception as exc:  # the job's failure is its own; the sweep goes on
        return JobResult(job_id, "failed", f"{type(exc).__name__}: {exc}")


def _quiet_worker(threads: int) -> None:
    # workers log only to each run's log.txt; the launcher's progress bar is the console
    logging.getLogger().addHandler(logging.NullHandler())
    logging.getLogger("domaingen").propagate = False
    import torch

    torch.set_num_threads(threads)


def _job_kwargs(job: Job, sweep_dir: str, data_dir: str | None) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(job.config(sweep_dir, data_dir))


@dataclass
class LaunchOptions:
    """Options shared by the launchers; slurm ones are ignored elsewhere."""

    workers: int = 2
    threads: int | None = None
    progress: bool = True
    slurm: dict[str, Any] = field(default_factory=dict)
    print_fn: Callable[[str], None] = print


def launch(
    jobs: Sequence[Job], sweep_dir: str, data_dir: str | None, launcher: str, options: LaunchOptions
) -> list[JobResult]:
    """Run `jobs` with the named launcher and return how each ended."""
    if launcher not in LAUNCHERS:
        raise DomaingenError(f"unknown launcher '{launcher}'; valid launchers: {', '.join(LAUNCHERS)}")
    runner = {"local": _launch_local, "parallel": _launch_parallel, "slurm": _launch_slurm, "dry": _launch_dry}
    return runner[launcher](jobs, sweep_dir, data_dir, options)


def _progress(total: int, options: LaunchOptions) -> tqdm:
    return tqdm(total=total, unit="job", disable=not options.progress, dynamic_ncols=True, smoothing=0.1)


def _launch_dry(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    for job in jobs:
        options.print_fn(train_command(job, sweep_dir, data_dir))
    return [JobResult(job.job_id, "not launched", "dry run") for job in jobs]


def _launch_local(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    results = []
    threads = options.threads or available_cores()
    with _progress(len(jobs), options) as bar:
        for job in jobs:
            results.append(run_job(job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads))
            bar.update(1)
    return results


def _launch_parallel(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    workers = max(1, min(options.workers, len(jobs)))
    threads = options.threads or threads_per_worker(workers)
    if workers * threads > available_cores():
        log.warning("%d workers x %d threads exceed the %d cores", workers, threads, available_cores())
    # spawn, not fork: a forked worker of a process that touched CUDA or OpenMP can hang
    context = multiprocessing.get_context("spawn")
    results = []
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_quiet_worker, initargs=(threads,)) as pool:
        futures = [pool.submit(run_job, job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads) for job in jobs]
        with _progress(len(jobs), options) as bar:
            for future in as_completed(futures):
                results.append(future.result())
                bar.update(1)
    return results


class _RequeueableJob:
    """A submitit callable that asks to be requeued on preemption or timeout.

    The job resumes from its own checkpoint when it starts again, so requeueing
    is all it takes.
    """

    def __call__(self, job_id: str, config_kwargs: Mapping[str, Any], threads: int | None) -> JobResult:
        return run_job(job_id, config_kwargs, threads)

    def checkpoint(self, *args: Any, **kwargs: Any):
        import submitit

        return submitit.helpers.DelayedSubmission(self, *args, **kwargs)


def _launch_slurm(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    try:
        import submitit
    except ImportError:
        raise DomaingenError("the slurm launcher needs submitit; install it with pip install 'domaingen[slurm]'") from None
    slurm = dict(options.slurm)
    cluster = slurm.pop("cluster", None)  # "local" runs the same job arrays as local processes (for tests)
    executor = submitit.AutoExecutor(folder=os.path.join(sweep_dir, "slurm_logs", "%j"), cluster=cluster)
    params = {k: v for k, v in slurm.items() if v is not None}
    executor.update_parameters(**params)
    threads = options.threads or params.get("cpus_per_task")
    kwargs = [_job_kwargs(job, sweep_dir, data_dir) for job in jobs]
    submitted = executor.map_array(
        _RequeueableJob(), [j.job_id for j in jobs], kwargs, [threads] * len(jobs)
    )
    options.print_fn(f"submitted {len(submitted)} jobs as array {submitted[0].job_id.split('_')[0] if submitted else '-'}")
    results = []
    with _progress(len(jobs), options) as bar:
        for job in submitit.helpers.as_completed(submitted):
            try:
                results.append(job.result())
            except Exception as exc:  # the scheduler killed or lost it
                results.append(JobResult(str(job.job_id), "failed", f"{type(exc).__name__}: {exc}"))
            bar.update(1)
    return results
