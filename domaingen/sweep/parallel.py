"""The parallel launcher: a pool of worker processes on this machine, each pinned to one GPU
when there are GPUs, and how an interrupt stops them all."""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import os
import signal
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Mapping, Sequence

from domaingen.sweep.gpus import CUDA_VISIBLE_DEVICES, detect_gpus, worker_gpus
from domaingen.sweep.launcher_registry import register_launcher
from domaingen.sweep.workers import (
    JobResult,
    LaunchOptions,
    available_cores,
    job_kwargs,
    progress_bar,
    run_job,
    threads_per_worker,
    warm_worker,
    worker_cache,
)

log = logging.getLogger(__name__)

# A parallel worker stops at the first interrupt: its running job ends as interrupted (and
# resumes from its last checkpoint when relaunched), and the worker takes no further job.
_WORKER_STATE = {"running_job": False, "stopping": False}


# Seconds a launcher gives its workers to stop after an interrupt before it kills them.
INTERRUPT_GRACE_S = 1.0


STOP_TIMEOUT_S = 60.0

# The exit status of a worker that an interrupt stopped (128 + SIGINT, as a shell reports it).
INTERRUPTED_EXIT = 130
# how often _interrupted reads again a worker exit code that another thread has yet to record
EXIT_CODE_POLL_S = 0.01
# how often the launcher's main thread wakes while it waits for jobs, to run a signal handler
SIGNAL_POLL_S = 0.5


def _interrupt_worker(signum: int, frame: Any) -> None:
    """A parallel worker's SIGINT handler: interrupt the running job once; otherwise exit."""
    if _WORKER_STATE["running_job"] and not _WORKER_STATE["stopping"]:
        _WORKER_STATE["stopping"] = True
        raise KeyboardInterrupt
    os._exit(INTERRUPTED_EXIT)  # idle between jobs, or interrupted again while stopping: nothing to save


def _quiet_worker(threads: int) -> None:
    signal.signal(signal.SIGINT, _interrupt_worker)
    # workers log only to each run's log.txt; the launcher's progress bar is the console
    logging.getLogger().addHandler(logging.NullHandler())
    logging.getLogger("domaingen").propagate = False
    import torch

    torch.set_num_threads(threads)


def _start_worker(threads: int, cache_mb: float | None = None, device: str = "cpu") -> None:
    """A parallel worker's initializer: quiet logging, its threads, its dataset cache's bound, and the
    imports (and on device 'auto', CUDA's start-up) its first job would pay (`warm_worker`)."""
    _quiet_worker(threads)
    worker_cache(cache_mb)
    try:
        warm_worker(device)
    except Exception as exc:  # the job meets it again and fails alone; a failing initializer breaks the pool
        log.warning("warming the worker failed: %s: %s", type(exc).__name__, exc)


def cached_job(job_id: str, config_kwargs: Mapping[str, Any], threads: int | None) -> JobResult:
    """run_job with the worker process's dataset cache (what a parallel worker runs).

    An interrupt ends the job (its run logs it and keeps its last checkpoint) and then
    the worker process, so that the pool cannot hand it the next job.
    """
    _WORKER_STATE["running_job"] = True
    try:
        return run_job(job_id, config_kwargs, threads, worker_cache())
    except KeyboardInterrupt:
        os._exit(INTERRUPTED_EXIT)
    finally:
        _WORKER_STATE["running_job"] = False


def _completed(futures: Sequence[Any], poll_s: float | None = None) -> Any:
    """The futures as they finish, like `as_completed`, waking every `poll_s` (SIGNAL_POLL_S).

    The kernel may hand a SIGTERM or SIGINT sent to the launcher to any of its threads (the
    pool's, the progress bar's). Python then runs the handler in the main thread only when that
    thread next executes bytecode, and a main thread blocked in `as_completed` would not do so
    before the next job finished, hours later for a long job. The timed wait bounds that delay.
    """
    pending = set(futures)
    while pending:
        done, pending = wait(pending, timeout=SIGNAL_POLL_S if poll_s is None else poll_s,
                             return_when=FIRST_COMPLETED)
        yield from done


def _collect_results(pool: ProcessPoolExecutor, futures: Sequence[Any], options: LaunchOptions) -> list[JobResult]:
    """The futures' results as they finish; on an interrupt (Ctrl-C, or SIGTERM through the
    CLI) the pending jobs are cancelled and the workers stopped before it propagates."""
    workers = list(getattr(pool, "_processes", {}).values())
    results = []
    try:
        with progress_bar(len(futures), options) as bar:
            for future in _completed(futures):
                results.append(future.result())
                bar.update(1)
    except KeyboardInterrupt:
        _stop_workers(pool)
        raise
    except BrokenProcessPool:
        # A Ctrl-C reaches the whole process group at once. The kernel may hand the launcher's
        # copy to the pool's thread, whose wake-up then shows the main thread a pool broken by
        # its interrupted workers before the KeyboardInterrupt: that is the same interrupt.
        if not _interrupted(workers):
            raise
        _stop_workers(pool)
        raise KeyboardInterrupt from None
    return results


def _interrupted(workers: Sequence[Any]) -> bool:
    """Whether any of the pool's worker processes ended because an interrupt stopped it."""
    for process in workers:
        process.join(INTERRUPT_GRACE_S)
    # The pool's own thread reaps its dead workers too. When its waitpid wins, ours finds no child
    # and a worker reads as ended without an exit code until that thread records it: wait for it.
    deadline = time.monotonic() + INTERRUPT_GRACE_S
    while True:
        codes = [process.exitcode for process in workers]
        if INTERRUPTED_EXIT in codes:
            return True
        if None not in codes or time.monotonic() > deadline:
            return False
        time.sleep(EXIT_CODE_POLL_S)


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


@register_launcher("parallel", "--workers processes on this machine (on a CUDA machine --jobs_per_gpu per GPU, "
                               "each pinned to its GPU)")
def launch_parallel(jobs, sweep_dir, data_dir, options) -> list[JobResult]:
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
        futures = [pool.submit(cached_job, job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers), threads) for job in jobs]
        return _collect_results(pool, futures, options)


def _pin_worker(slots: Any, threads: int, cache_mb: float | None = None) -> None:
    # runs before the worker touches CUDA, so the variable decides the one GPU it sees
    os.environ[CUDA_VISIBLE_DEVICES] = slots.get()
    _start_worker(threads, cache_mb, "auto")


def _run_pinned(job_id: str, config_kwargs: Mapping[str, Any], threads: int | None) -> JobResult:
    result = cached_job(job_id, config_kwargs, threads)
    gpu = os.environ.get(CUDA_VISIBLE_DEVICES, "")
    return dataclasses.replace(result, message=f"{result.message} (GPU {gpu})".lstrip())


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
    with ProcessPoolExecutor(workers, mp_context=context, initializer=_pin_worker,
                             initargs=(slots, threads, options.dataset_cache_mb)) as pool:
        futures = [pool.submit(_run_pinned, job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers), threads) for job in jobs]
        return _collect_results(pool, futures, options)

