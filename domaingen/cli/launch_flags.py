"""The launcher flags `sweep launch` and `adapt` share, and the LaunchOptions they make."""

from __future__ import annotations

import argparse

from domaingen.sweep.workers import LaunchOptions


def add_launch_flags(a: argparse.ArgumentParser, launcher_default: str | None, workers_default: int,
                     launcher_help: str = "", workers_help: str = "parallel: processes at once") -> None:
    """--launcher (choices from the launcher table), --workers, --threads, --dry, --no_progress, the
    --slurm_* flags, and the flags for GPUs, detached Slurm, Ray, chunks and the dataset cache."""
    from domaingen.sweep import launch

    a.add_argument("--launcher", default=launcher_default, choices=launch.launcher_names(),
                   help=launch.launcher_help() + launcher_help)
    a.add_argument("--workers", type=int, default=workers_default, help=workers_help)
    a.add_argument("--threads", type=int, default=None,
                   help="torch threads per job (default: cores / workers, at most OMP_NUM_THREADS where it is set)")
    a.add_argument("--dry", action="store_true", help="print the commands only")
    a.add_argument("--no_progress", action="store_true")
    a.add_argument("--slurm_partition")
    a.add_argument("--slurm_time", type=int, default=24 * 60, help="minutes per job")
    a.add_argument("--slurm_mem_gb", type=float, default=16)
    a.add_argument("--slurm_gpus", type=int, default=0, help="GPUs per job")
    a.add_argument("--slurm_cpus", type=int, default=4, help="CPUs per job")
    a.add_argument("--slurm_array_parallelism", type=int, default=64, help="max tasks running at once")
    a.add_argument("--slurm_cluster", default=None, help="submitit cluster (slurm, or local for testing)")
    _add_scale_flags(a)


def _add_scale_flags(a: argparse.ArgumentParser) -> None:
    """Flags for GPUs, detached Slurm, Ray, chunks of jobs and the dataset cache."""
    a.add_argument("--jobs_per_gpu", type=int, default=1,
                   help="parallel on a CUDA machine: jobs at once per visible GPU (one worker each, pinned by "
                        "CUDA_VISIBLE_DEVICES); --workers then does not apply")
    a.add_argument("--detach", action="store_true",
                   help="slurm: submit, record the Slurm job ids in the sweep directory and return at once")
    a.add_argument("--slurm_max_array", type=int, default=1000,
                   help="slurm: jobs per job array at most (Slurm's MaxArraySize; default 1000)")
    a.add_argument("--ray_address", default=None,
                   help="ray: HOST:PORT of a running cluster (ray start --head prints it); default: a local instance")
    a.add_argument("--ray_cpus", type=float, default=1, help="ray: CPUs per job (its torch threads, rounded)")
    a.add_argument("--ray_gpus", type=float, default=0, help="ray: GPUs per job (0.25 runs 4 jobs per GPU)")
    a.add_argument("--jobs_per_task", type=int, default=1, metavar="K",
                   help="slurm, ray: each task runs K jobs one after another, paying the imports and the dataset "
                        "once (give --slurm_time for K jobs); a requeued task resumes its unfinished jobs")
    a.add_argument("--dataset_cache_mb", type=float, default=None,
                   help="each worker keeps the datasets it built for its later jobs, up to this many MB, least "
                        "recently used evicted first; 0 = off (default: $DOMAINGEN_DATASET_CACHE_MB, else 1024)")


def launch_options(ns: argparse.Namespace) -> LaunchOptions:
    """The LaunchOptions of the flags add_launch_flags defined (and --loggers, where the command has it)."""
    return LaunchOptions(
        workers=ns.workers,
        threads=ns.threads,
        progress=not ns.no_progress,
        slurm={
            "cluster": ns.slurm_cluster,
            "slurm_partition": ns.slurm_partition,
            "timeout_min": ns.slurm_time,
            "mem_gb": ns.slurm_mem_gb,
            "gpus_per_node": ns.slurm_gpus or None,
            "cpus_per_task": ns.slurm_cpus,
            "slurm_array_parallelism": ns.slurm_array_parallelism,
            "max_array": ns.slurm_max_array,
        },
        jobs_per_gpu=ns.jobs_per_gpu,
        detach=ns.detach,
        ray_address=ns.ray_address,
        ray_cpus=ns.ray_cpus,
        ray_gpus=ns.ray_gpus,
        jobs_per_task=ns.jobs_per_task,
        dataset_cache_mb=ns.dataset_cache_mb,
        loggers=getattr(ns, "loggers", None) or [],
    )
