"""The Ray launcher: each sweep job a Ray task, on a local instance or a running cluster.

Resume semantics are the other launchers': the sweep skips done jobs, `run_job`
resumes incomplete ones from their checkpoint and holds the job's run lock, so
a second launch (Ray or not) never runs a job at the same time. A worker that
dies mid-job (killed, out of memory, node lost) is retried by Ray up to
`max_retries` times; the retry resumes from the job's last checkpoint, since the
dead worker's lock died with it.
"""

from __future__ import annotations

import logging
import socket
from typing import Any, Mapping, Sequence

from domaingen.errors import DomaingenError
from domaingen.sweep.launcher_registry import register_launcher
from domaingen.sweep.workers import JobResult, available_cores, chunks, job_kwargs, progress_bar, run_job_chunk

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'domaingen-bench[ray]'"
OBJECT_STORE_BYTES = 256 * 2**20  # a local instance passes job arguments and results only: keep /dev/shm free
MAX_RETRIES = 3  # Ray's own default for tasks whose worker died


def import_ray() -> Any:
    """The ray module, or a one-line error naming the install command."""
    try:
        import ray
    except ImportError:
        raise DomaingenError(f"the ray launcher needs ray; install it with {INSTALL_HINT}") from None
    return ray


def _host_port(address: str) -> tuple[str, int] | None:
    text = address.split("://", 1)[-1].rstrip("/")
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def check_ray(address: str | None, timeout_s: float = 5.0) -> None:
    """Raise a one-line error if ray is missing or nothing answers at `address` (None: a local instance)."""
    import_ray()
    if address in (None, "", "auto", "local"):
        return
    target = _host_port(address)
    if target is None:
        raise DomaingenError(f"--ray_address {address!r} is not HOST:PORT (or ray://HOST:PORT, auto)")
    try:
        with socket.create_connection(target, timeout=timeout_s):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise DomaingenError(
            f"no Ray cluster answers at {address} ({reason}); start one there with `ray start --head` "
            "or give the address of a running one (ray status prints it)"
        ) from None


def connect(ray: Any, address: str | None, num_cpus: int) -> bool:
    """Connect to the cluster at `address`, or start a local instance; True if this call started Ray."""
    if ray.is_initialized():
        return False
    try:
        if address in (None, "", "local"):
            ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=False,
                     object_store_memory=OBJECT_STORE_BYTES)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise DomaingenError(f"cannot connect to Ray at {address or 'a new local instance'}: {first}") from None
    return True


def ray_chunk(chunk: Sequence[tuple[str, Mapping[str, Any]]], threads: int | None, cache_mb: float | None) -> Any:
    """The task body: run_job_chunk (one job, or --jobs_per_task of them) with the worker's logging kept
    out of the driver's console. Ray's workers live across tasks, so their dataset cache does too."""
    logging.getLogger("domaingen").propagate = False
    return run_job_chunk(chunk, threads, cache_mb)


def _check_options(options: Any) -> None:
    check_ray(options.ray_address)


@register_launcher("ray", "each job a Ray task, on a local instance or the cluster at --ray_address",
                   check=_check_options, jobs_per_task=True, remote=lambda options: bool(options.ray_address))
def launch_ray(jobs: Sequence[Any], sweep_dir: str, data_dir: str | None, options: Any) -> list[Any]:
    """Run every job as a Ray task; returns one JobResult per job, a dead task's as failed."""
    ray = import_ray()
    started = connect(ray, options.ray_address, available_cores())
    try:
        # a task that dies is retried whole: its done jobs are skipped, the interrupted one resumes
        task = ray.remote(num_cpus=options.ray_cpus, num_gpus=options.ray_gpus, max_retries=MAX_RETRIES)(ray_chunk)
        threads = options.threads or max(1, int(options.ray_cpus))
        groups = chunks([(job.job_id, job_kwargs(job, sweep_dir, data_dir, options.loggers)) for job in jobs], options.jobs_per_task)
        pending = {task.remote(group, threads, options.dataset_cache_mb): [job_id for job_id, _ in group]
                   for group in groups}
        results = []
        with progress_bar(len(jobs), options) as bar:
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1)
                for ref in ready:
                    job_ids = pending.pop(ref)
                    try:
                        results.extend(ray.get(ref))
                    except Exception as exc:  # a task Ray gave up on (worker died past its retries, cancelled)
                        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                        results.extend(JobResult(job_id, "failed", f"{type(exc).__name__}: {first}")
                                       for job_id in job_ids)
                    bar.update(len(job_ids))
        return results
    finally:
        if started:
            ray.shutdown()
