"""Ways to run a list of sweep jobs: local, parallel, slurm (submitit), ray (ray_launcher.py), dry.

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
from domaingen.gpus import CUDA_VISIBLE_DEVICES, detect_gpus, worker_gpus
from domaingen.runlock import RUNNING_ELSEWHERE, RunLockedError, run_lock
from domaingen.sweep import Job, train_command

log = logging.getLogger(__name__)

LAUNCHERS = ("local", "parallel", "slurm", "ray", "dry")
SUBMITTED, NOT_SUBMITTED = "submitted", "not submitted"  # slurm --detach: the job's fate is the scheduler's now


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
    """Run one job in this process (resuming it if it is incomplete).

    The job's run lock is held throughout; a job another process holds is not
    run and ends as RUNNING_ELSEWHERE.
    """
    import torch

    from domaingen.training import TrainConfig, train

    if threads:
        torch.set_num_threads(threads)
    try:
        with run_lock(config_kwargs["output_dir"]):  # another launch may be running this job
            failure = _load_job_plugins(config_kwargs)
            if failure is not None:
                return JobResult(job_id, "failed", failure)
            outcome = train(TrainConfig(**config_kwargs))
        return JobResult(job_id, outcome.state, outcome.message)
    except RunLockedError as exc:
        return JobResult(job_id, RUNNING_ELSEWHERE, str(exc))
    except Exception as exc:  # the job's failure is its own; the sweep goes on
        return JobResult(job_id, "failed", f"{type(exc).__name__}: {exc}")


def _load_job_plugins(config_kwargs: Mapping[str, Any]) -> str | None:
    """Load the job's recorded plugins in this (worker) process; on failure mark the job failed
    and return the one-line reason, which names the plugin and its import error."""
    from domaingen.plugins import PluginError, load_plugins
    from domaingen.rundir import RunDirectory

    try:
        load_plugins(config_kwargs.get("plugins") or ())
    except PluginError as exc:
        rundir = RunDirectory(config_kwargs["output_dir"])
        try:
            rundir.path.mkdir(parents=True, exist_ok=True)
            rundir.mark_failed(str(exc))
        except OSError as os_exc:  # the reason still reaches the launcher
            log.warning("cannot mark %s failed: %s", rundir.path, os_exc)
        return str(exc)
    return None


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
    jobs_per_gpu: int = 1  # parallel on a CUDA machine: workers per visible GPU
    gpus: Sequence[str] | None = None  # parallel: GPU ids to pin workers to; None = detect
    detach: bool = False  # slurm: return once submitted
    ray_address: str | None = None  # ray: a running cluster's HOST:PORT; None = a new local instance
    ray_cpus: float = 1  # ray: CPUs per task
    ray_gpus: float = 0  # ray: GPUs per task (fractions share a GPU)


def check_options(launcher: str, options: LaunchOptions) -> None:
    """Refuse launch options that cannot work, before anything is written or submitted."""
    if options.jobs_per_gpu < 1:
        raise DomaingenError(f"--jobs_per_gpu must be at least 1, got {options.jobs_per_gpu}")
    if options.detach and launcher not in ("slurm", "dry"):
        raise DomaingenError(f"--detach works with --launcher slurm only, not {launcher}; drop --detach")
    if launcher == "ray":
        from domaingen.ray_launcher import check_ray

        check_ray(options.ray_address)


def launch(
    jobs: Sequence[Job], sweep_dir: str, data_dir: str | None, launcher: str, options: LaunchOptions
) -> list[JobResult]:
    """Run `jobs` with the named launcher and return how each ended."""
    if launcher not in LAUNCHERS:
        raise DomaingenError(f"unknown launcher '{launcher}'; valid launchers: {', '.join(LAUNCHERS)}")
    runner = {"local": _launch_local, "parallel": _launch_parallel, "slurm": _launch_slurm, "ray": _launch_ray,
              "dry": _launch_dry}
    return runner[launcher](jobs, sweep_dir, data_dir, options)


def _progress(total: int, options: LaunchOptions) -> tqdm:
    return tqdm(total=total, unit="job", disable=not options.progress, dynamic_ncols=True, smoothing=0.1)


def _launch_ray(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    from domaingen.ray_launcher import launch_ray

    return launch_ray(jobs, sweep_dir, data_dir, options)


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
    gpus = detect_gpus() if options.gpus is None else list(options.gpus)
    if gpus:
        return _launch_parallel_gpus(jobs, sweep_dir, data_dir, options, gpus)
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


def _pin_worker(slots: Any, threads: int) -> None:
    # runs before the worker touches CUDA, so the variable decides the one GPU it sees
    os.environ[CUDA_VISIBLE_DEVICES] = slots.get()
    _quiet_worker(threads)


def _run_pinned(job_id: str, config_kwargs: Mapping[str, Any], threads: int | None) -> JobResult:
    result = run_job(job_id, config_kwargs, threads)
    gpu = os.environ.get(CUDA_VISIBLE_DEVICES, "")
    return JobResult(result.job_id, result.state, f"{result.message} (GPU {gpu})".lstrip())


def _launch_parallel_gpus(jobs, sweep_dir, data_dir, options, gpus: Sequence[str]) -> list[JobResult]:
    """One worker process per (GPU, slot), each pinned to its GPU by CUDA_VISIBLE_DEVICES."""
    assignment = worker_gpus(gpus, options.jobs_per_gpu, len(jobs))
    workers = len(assignment)
    threads = options.threads or threads_per_worker(workers)
    log.info("%d workers on GPUs %s (%d per GPU), %d threads each", workers, ",".join(gpus), options.jobs_per_gpu,
             threads)
    context = multiprocessing.get_context("spawn")
    slots = context.Queue()
    for gpu in assignment:
        slots.put(gpu)
    results = []
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_pin_worker, initargs=(slots, threads)) as pool:
        futures = [pool.submit(_run_pinned, job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads) for job in jobs]
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


def _slurm_executor(sweep_dir: str, options: LaunchOptions) -> tuple[Any, str, str, int | None]:
    """submitit's executor for the sweep, its cluster name, log folder, and threads per job."""
    try:
        import submitit
    except ImportError:
        raise DomaingenError("the slurm launcher needs submitit; install it with pip install 'domaingen[slurm]'") from None
    slurm = dict(options.slurm)
    cluster = slurm.pop("cluster", None)  # "local" runs the same job arrays as local processes (for tests)
    slurm.pop("max_array", None)
    folder = os.path.join(sweep_dir, "slurm_logs", "%j")
    executor = submitit.AutoExecutor(folder=folder, cluster=cluster)
    params = {k: v for k, v in slurm.items() if v is not None}
    executor.update_parameters(**params)
    threads = options.threads or params.get("cpus_per_task")
    return executor, executor.cluster, folder, threads


def _launch_slurm(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
    import submitit

    from domaingen.slurm_jobs import DEFAULT_MAX_ARRAY, as_submissions, record_submissions, submit_arrays

    executor, cluster, folder, threads = _slurm_executor(sweep_dir, options)
    arguments = [(job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads) for job in jobs]
    max_array = options.slurm.get("max_array") or DEFAULT_MAX_ARRAY
    pairs, failures = submit_arrays(executor, _RequeueableJob(), [j.job_id for j in jobs], arguments, max_array)
    record_submissions(sweep_dir, as_submissions(pairs, cluster, folder))
    arrays = sorted({str(handle.job_id).split("_")[0] for _, handle in pairs})
    options.print_fn(f"submitted {len(pairs)} jobs as {len(arrays)} array(s): {' '.join(arrays) or '-'}")
    results = [JobResult(job_id, NOT_SUBMITTED, failure.reason) for failure in failures for job_id in failure.job_ids]
    if options.detach:
        return results + [JobResult(job_id, SUBMITTED, str(handle.job_id)) for job_id, handle in pairs]
    ids = {id(handle): job_id for job_id, handle in pairs}
    with _progress(len(pairs), options) as bar:
        for handle in submitit.helpers.as_completed([handle for _, handle in pairs]):
            try:
                results.append(handle.result())
            except Exception as exc:  # the scheduler killed or lost it
                results.append(JobResult(ids[id(handle)], "failed", f"{type(exc).__name__}: {exc}"))
            bar.update(1)
    return results
