"""What every sweep launcher shares: how one job runs in a worker process, its result,
the worker's dataset cache, chunks of jobs, the launch options and the progress bar.

A job is any object with a `job_id`, a `payload(sweep_dir, data_dir, loggers)` (the
picklable keyword arguments its worker receives) and a `command(sweep_dir, data_dir,
loggers)` (the command line that runs it, what the dry launcher prints): a training job
(`sweep.spec.Job`) or another kind, such as an adaptation job (`adapt.jobs.AdaptJob`).
Every launcher runs the same `run_job` in the worker process. A training payload
becomes `run.training.train`'s config; a payload naming a `JOB_RUNNER` ("module:function")
is handed to that function, so the launchers run jobs of any kind without knowing it.
A job's own errors end up in its state (and a training job's `failed` marker), never in
the launcher. A worker process keeps the datasets it built (and, for datasets built per
run, the files they read) in its `worker_cache` for its later jobs, and a parallel
worker's initializer (`warm_worker`) pays the imports and CUDA's start-up before its
first job is handed out; Slurm and Ray tasks run a chunk of `jobs_per_task` jobs (`run_job_chunk`),
so that a task pays the imports and the dataset once per chunk.
"""

from __future__ import annotations

import importlib
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from tqdm.auto import tqdm

from domaingen.datasets.cache import DatasetCache, cache_mb_default
from domaingen.run.runlock import RUNNING_ELSEWHERE, RunLockedError, run_lock
from domaingen.sweep.spec import Job

log = logging.getLogger(__name__)

SUBMITTED, NOT_SUBMITTED = "submitted", "not submitted"  # slurm --detach: the job's fate is the scheduler's now
# A payload key: the "module:function" that runs a job of a kind other than training, as
# runner(job_id, payload without this key, dataset cache) -> JobResult, in the worker process.
JOB_RUNNER = "job_runner"


def available_cores() -> int:
    """Cores this process may use (respects CPU affinity, e.g. under Slurm or taskset)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not on Linux
        return os.cpu_count() or 1


def thread_limit() -> int | None:
    """OMP_NUM_THREADS when it is a positive integer, else None: the user's cap on a process's threads
    (two launchers sharing a machine, a shared cluster node). torch honours it at start-up, and a
    launcher that sets threads itself must too."""
    text = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(text) if text.isdigit() and int(text) > 0 else None


def threads_per_worker(workers: int, cores: int | None = None) -> int:
    """Torch threads per worker so that workers x threads never exceeds the cores, nor OMP_NUM_THREADS
    where it is set (`thread_limit`)."""
    share = max(1, (cores or available_cores()) // max(1, workers))
    limit = thread_limit()
    return min(share, limit) if limit else share


@dataclass
class JobResult:
    """How one job ended; `details`: what its kind reports besides (an adaptation job: adapter -> outcome)."""

    job_id: str
    state: str
    message: str = ""
    details: dict[str, Any] = field(default_factory=dict)


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


def warm_worker(device: str = "auto") -> dict[str, float]:
    """Pay in this (new worker) process what its first job would otherwise pay before its first step:
    the training modules' imports, torch._dynamo's (which torch's first optimizer imports), and on
    CUDA the context, cuBLAS and cuDNN (one small matmul and convolution). Returns the seconds of each part.
    """
    import time

    started = time.perf_counter()
    import torch
    import torch._dynamo  # noqa: F401  (torch.optim's first optimizer imports it: 2 s)

    import domaingen.run.training  # noqa: F401
    from domaingen.devices import resolve_device

    parts = {"imports": time.perf_counter() - started}
    target = resolve_device(device)
    if target.type == "cuda":
        started = time.perf_counter()
        x = torch.ones(1, 2, 8, 8, device=target)
        conv = torch.nn.functional.conv2d(x, torch.ones(4, 2, 3, 3, device=target))
        (conv.flatten(1) @ torch.ones(conv.flatten(1).shape[1], 2, device=target)).sum().item()
        parts["cuda"] = time.perf_counter() - started
    return parts


def run_job(
    job_id: str, config_kwargs: Mapping[str, Any], threads: int | None = None, cache: DatasetCache | None = None
) -> JobResult:
    """Run one job in this process: a payload with a JOB_RUNNER by that function, else a training
    job (resumed if it is incomplete).

    A training job's run lock is held throughout; a job another process holds is not
    run and ends as RUNNING_ELSEWHERE. `cache` serves datasets built by earlier
    jobs of this process (see datasets.cache). The job's first record holds its
    start-up: seconds from this call to its first step (`startup_time`).
    """
    import time

    started = time.perf_counter()
    import torch

    from domaingen.run.training import TrainConfig, train

    if threads:
        torch.set_num_threads(threads)
    if JOB_RUNNER in config_kwargs:
        return _run_by_runner(job_id, config_kwargs, cache)
    try:
        with run_lock(config_kwargs["output_dir"]):  # another launch may be running this job
            failure = _load_job_plugins(config_kwargs)
            if failure is not None:
                return JobResult(job_id, "failed", failure)
            outcome = train(TrainConfig(**config_kwargs), dataset_cache=cache, started=started)
        return JobResult(job_id, outcome.state, outcome.message)
    except RunLockedError as exc:
        return JobResult(job_id, RUNNING_ELSEWHERE, str(exc))
    except Exception as exc:  # the job's failure is its own; the sweep goes on
        return JobResult(job_id, "failed", f"{type(exc).__name__}: {exc}")


def _run_by_runner(job_id: str, payload: Mapping[str, Any], cache: DatasetCache | None) -> JobResult:
    """The job run by the function its payload names; whatever it raises ends the job as failed."""
    module, _, name = str(payload[JOB_RUNNER]).partition(":")
    try:
        runner = getattr(importlib.import_module(module), name)
        return runner(job_id, {k: v for k, v in payload.items() if k != JOB_RUNNER}, cache)
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


def _load_job_plugins(config_kwargs: Mapping[str, Any]) -> str | None:
    """Load the job's recorded plugins in this (worker) process; on failure mark the job failed
    and return the one-line reason, which names the plugin and its import error."""
    from domaingen.plugins import PluginError, load_plugins
    from domaingen.run.rundir import RunDirectory

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


def job_kwargs(job: Job, sweep_dir: str, data_dir: str | None, loggers: Sequence[str] = ()) -> dict[str, Any]:
    """What the job's worker receives (its `payload`): a training job's TrainConfig keyword arguments,
    with the launch's loggers (not part of the job)."""
    return job.payload(sweep_dir, data_dir, loggers)


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
    loggers: Sequence[str] = ()  # tensorboard, wandb: every job logs its curves there (run.loggers)


def progress_bar(total: int, options: LaunchOptions) -> tqdm:
    return tqdm(total=total, unit="job", disable=not options.progress, dynamic_ncols=True, smoothing=0.1)

