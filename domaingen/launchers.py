"""Ways to run a list of sweep jobs: local, parallel, slurm (submitit), ray (ray_launcher.py), dry.

Every launcher runs the same `run_job` function, which calls `training.train`
in the worker process; a job's own errors end up in its `failed` marker and its
state, never in the launcher. A worker process keeps the datasets it built in
its `worker_cache` for its later jobs; Slurm and Ray tasks run a chunk of
`jobs_per_task` jobs (`run_job_chunk`), so that a task pays the imports and the
dataset once per chunk.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import multiprocessing

from tqdm.auto import tqdm

from domaingen.datasets.cache import DatasetCache, cache_mb_default
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


# The datasets a worker process built, for its later jobs. Process-wide on purpose: a
# worker (a pool process, a Slurm or Ray task) lives across jobs, and only the process
# can own what it keeps; `worker_cache` is the one way to reach it.
_WORKER_CACHE: list[DatasetCache] = []


def worker_cache(max_mb: float | None = None) -> DatasetCache:
    """This process's dataset cache, created on first use with `max_mb` (None: cache_mb_default()).

    A later call with another `max_mb` replaces it (empty) with one of that bound.
    """
    bound = cache_mb_default() if max_mb is None else float(max_mb)
    if not _WORKER_CACHE or _WORKER_CACHE[0].max_bytes != int(bound * 2**20):
        _WORKER_CACHE[:] = [DatasetCache(bound)]
    return _WORKER_CACHE[0]


def run_job(
    job_id: str, config_kwargs: Mapping[str, Any], threads: int | None = None, cache: DatasetCache | None = None
) -> JobResult:
    """Run one job in this process (resuming it if it is incomplete).

    The job's run lock is held throughout; a job another process holds is not
    run and ends as RUNNING_ELSEWHERE. `cache` serves datasets built by earlier
    jobs of this process (see datasets.cache).
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
            outcome = train(TrainConfig(**config_kwargs), dataset_cache=cache)
        return JobResult(job_id, outcome.state, outcome.message)
    except RunLockedError as exc:
        return JobResult(job_id, RUNNING_ELSEWHERE, str(exc))
    except Exception as exc:  # the job's failure is its own; the sweep goes on
        return JobResult(job_id, "failed", f"{type(exc).__name__}: {exc}")


def run_job_chunk(
    chunk: Sequence[tuple[str, Mapping[str, Any]]], threads: int | None = None, cache_mb: float | None = None
) -> list[JobResult]:
    """Run (job id, config kwargs) pairs one after another in this process, sharing its dataset cache.

    A job that raises ends as failed and the chunk goes on. Jobs already done are
    skipped and incomplete ones resume, so a requeued chunk finishes what is unfinished.
    """
    cache = worker_cache(cache_mb)
    return [run_job(job_id, kwargs, threads, cache) for job_id, kwargs in chunk]


def chunks(items: Sequence[Any], size: int) -> list[list[Any]]:
    """`items` in consecutive chunks of `size` (the last may be shorter)."""
    return [list(items[i:i + size]) for i in range(0, len(items), max(1, size))]


def _cached_job(job_id: str, config_kwargs: Mapping[str, Any], threads: int | None) -> JobResult:
    """run_job with the worker process's dataset cache (what a parallel worker runs).

    An interrupt ends the job (its run logs it and keeps its last checkpoint) and then
    the worker process, so that the pool cannot hand it the next job.
    """
    _WORKER_STATE["running_job"] = True
    try:
        return run_job(job_id, config_kwargs, threads, worker_cache())
    except KeyboardInterrupt:
        os._exit(130)
    finally:
        _WORKER_STATE["running_job"] = False


def _collect_results(pool: ProcessPoolExecutor, futures: Sequence[Any], options: LaunchOptions) -> list[JobResult]:
    """The futures' results as they finish; on an interrupt (Ctrl-C, or SIGTERM through the
    CLI) the pending jobs are cancelled and the workers stopped before it propagates."""
    results = []
    try:
        with _progress(len(futures), options) as bar:
            for future in as_completed(futures):
                results.append(future.result())
                bar.update(1)
    except KeyboardInterrupt:
        _stop_workers(pool)
        raise
    return results


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Interrupt the running jobs and end every worker, killing one that does not stop
    within STOP_TIMEOUT_S; the pool, left without workers, fails what has not started.

    A terminal's Ctrl-C reaches the workers by itself (they share its process group);
    a SIGTERM sent to the launcher alone does not, so each worker still alive after
    INTERRUPT_GRACE_S gets a SIGINT. The pending futures are not cancelled: the pool's
    own thread fails them when it finds its workers gone, and a cancelled one makes it
    raise (Python 3.11).
    """
    # the executor offers no way to stop running calls; its worker processes are the handle
    processes = list(getattr(pool, "_processes", {}).values())
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
    for process in processes:
        if process.is_alive():
            _signal_process(process.pid, signal.SIGINT)
    deadline = time.monotonic() + STOP_TIMEOUT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
    pool.shutdown(wait=False)


def _signal_process(pid: int, signum: int) -> None:
    """Send signum to pid unless the process has already gone: a worker that ends between
    the liveness check and the signal (the pool's own thread may reap it) needs nothing."""
    try:
        os.kill(pid, signum)
    except ProcessLookupError:
        pass


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


# A parallel worker stops at the first interrupt: its running job ends as interrupted (and
# resumes from its last checkpoint when relaunched), and the worker takes no further job.
_WORKER_STATE = {"running_job": False, "stopping": False}
# Seconds a launcher gives its workers to stop after an interrupt before it kills them.
INTERRUPT_GRACE_S = 1.0
STOP_TIMEOUT_S = 60.0


def _interrupt_worker(signum: int, frame: Any) -> None:
    """A parallel worker's SIGINT handler: interrupt the running job once; otherwise exit."""
    if _WORKER_STATE["running_job"] and not _WORKER_STATE["stopping"]:
        _WORKER_STATE["stopping"] = True
        raise KeyboardInterrupt
    os._exit(130)  # idle between jobs, or interrupted again while stopping: nothing to save


def _quiet_worker(threads: int) -> None:
    signal.signal(signal.SIGINT, _interrupt_worker)
    # workers log only to each run's log.txt; the launcher's progress bar is the console
    logging.getLogger().addHandler(logging.NullHandler())
    logging.getLogger("domaingen").propagate = False
    import torch

    torch.set_num_threads(threads)


def _start_worker(threads: int, cache_mb: float | None = None) -> None:
    """A parallel worker's initializer: quiet logging, its threads, and its dataset cache's bound."""
    _quiet_worker(threads)
    worker_cache(cache_mb)


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
    jobs_per_task: int = 1  # slurm, ray: jobs run one after another by one task
    dataset_cache_mb: float | None = None  # each worker's dataset cache bound; None: cache_mb_default()


def check_options(launcher: str, options: LaunchOptions) -> None:
    """Refuse launch options that cannot work, before anything is written or submitted."""
    if options.jobs_per_gpu < 1:
        raise DomaingenError(f"--jobs_per_gpu must be at least 1, got {options.jobs_per_gpu}")
    if options.jobs_per_task < 1:
        raise DomaingenError(f"--jobs_per_task must be at least 1, got {options.jobs_per_task}")
    if options.jobs_per_task > 1 and launcher not in ("slurm", "ray", "dry"):
        raise DomaingenError(
            f"--jobs_per_task works with --launcher slurm or ray, not {launcher} (its workers already run job "
            "after job); drop --jobs_per_task"
        )
    if options.dataset_cache_mb is not None and options.dataset_cache_mb < 0:
        raise DomaingenError(f"--dataset_cache_mb must be at least 0 (0 turns the cache off), got "
                             f"{options.dataset_cache_mb:g}")
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
    cache = worker_cache(options.dataset_cache_mb)
    with _progress(len(jobs), options) as bar:
        for job in jobs:
            results.append(run_job(job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads, cache))
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
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_start_worker,
                             initargs=(threads, options.dataset_cache_mb)) as pool:
        futures = [pool.submit(_cached_job, job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads) for job in jobs]
        return _collect_results(pool, futures, options)


def _pin_worker(slots: Any, threads: int, cache_mb: float | None = None) -> None:
    # runs before the worker touches CUDA, so the variable decides the one GPU it sees
    os.environ[CUDA_VISIBLE_DEVICES] = slots.get()
    _quiet_worker(threads)
    worker_cache(cache_mb)


def _run_pinned(job_id: str, config_kwargs: Mapping[str, Any], threads: int | None) -> JobResult:
    result = _cached_job(job_id, config_kwargs, threads)
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
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_pin_worker,
                             initargs=(slots, threads, options.dataset_cache_mb)) as pool:
        futures = [pool.submit(_run_pinned, job.job_id, _job_kwargs(job, sweep_dir, data_dir), threads) for job in jobs]
        return _collect_results(pool, futures, options)


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
    groups = chunks([(job.job_id, _job_kwargs(job, sweep_dir, data_dir)) for job in jobs], options.jobs_per_task)
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
    with _progress(len(job_pairs), options) as bar:
        for handle in submitit.helpers.as_completed([handle for _, handle in pairs]):
            group = members[firsts[id(handle)]]
            try:
                results.extend(handle.result())
            except Exception as exc:  # the scheduler killed or lost it
                results.extend(JobResult(job_id, "failed", f"{type(exc).__name__}: {exc}") for job_id in group)
            bar.update(len(group))
    return results
