"""Ways to run a list of sweep jobs, by name: local, parallel, slurm, ray, dry.

Each launcher is a module of this package (local.py, parallel.py, slurm.py,
ray_launcher.py); what they share is in workers.py.
"""

from __future__ import annotations

from typing import Sequence

from domaingen.errors import DomaingenError
from domaingen.run.loggers import check_logger_names, check_loggers
from domaingen.sweep.spec import Job
from domaingen.sweep.workers import JobResult, LaunchOptions

LAUNCHERS = ("local", "parallel", "slurm", "ray", "dry")


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
    options.loggers = check_loggers(options.loggers) if launcher != "dry" else check_logger_names(options.loggers)
    if launcher == "ray":
        from domaingen.sweep.ray_launcher import check_ray

        check_ray(options.ray_address)


def launch(
    jobs: Sequence[Job], sweep_dir: str, data_dir: str | None, launcher: str, options: LaunchOptions
) -> list[JobResult]:
    """Run `jobs` with the named launcher and return how each ended."""
    if launcher not in LAUNCHERS:
        raise DomaingenError(f"unknown launcher '{launcher}'; valid launchers: {', '.join(LAUNCHERS)}")
    if launcher == "parallel":
        from domaingen.sweep.parallel import launch_parallel as runner
    elif launcher == "slurm":
        from domaingen.sweep.slurm import launch_slurm as runner
    elif launcher == "ray":
        from domaingen.sweep.ray_launcher import launch_ray as runner
    else:
        from domaingen.sweep.local import launch_dry, launch_local

        runner = launch_local if launcher == "local" else launch_dry
    return runner(jobs, sweep_dir, data_dir, options)

