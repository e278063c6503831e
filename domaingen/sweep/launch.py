"""Running a list of sweep jobs with a launcher named from the LAUNCHERS table.

Each built-in launcher registers itself in its own module (local.py, parallel.py,
slurm.py, ray_launcher.py, dry.py; what they share is in workers.py); a plugin
registers its own with `register_launcher`. Importing this module registers the
built-in ones; ray and submitit are imported only when their launcher runs.
"""

from __future__ import annotations

from typing import Sequence

# the built-in launchers register themselves on import, in the order the CLI lists them
from domaingen.sweep import local, parallel, slurm, ray_launcher, dry  # noqa: F401
from domaingen.errors import DomaingenError
from domaingen.run.loggers import check_logger_names, check_loggers
from domaingen.sweep.launcher_registry import LAUNCHERS, Launcher, register_launcher
from domaingen.sweep.spec import Job
from domaingen.sweep.workers import JobResult, LaunchOptions

__all__ = ["LAUNCHERS", "Launcher", "register_launcher", "launcher_names", "launcher_help", "check_options", "launch"]


def launcher_names() -> list[str]:
    """Every registered launcher's name, built-in ones first (the CLI's --launcher choices)."""
    return LAUNCHERS.names()


def launcher_help() -> str:
    """The --launcher help text: each launcher and its help line (escaped for argparse)."""
    return "; ".join(f"{name}: {LAUNCHERS.get(name).help}" for name in LAUNCHERS).replace("%", "%%")


def _those(flag: str) -> str:
    """'slurm only' / 'slurm or ray': the launchers that run jobs and accept `flag` (a Launcher field)."""
    names = [name for name in LAUNCHERS if LAUNCHERS.get(name).runs_jobs and getattr(LAUNCHERS.get(name), flag)]
    if len(names) == 1:
        return f"{names[0]} only"
    return ", ".join(names[:-1]) + f" or {names[-1]}" if names else "none"


def check_options(launcher: str, options: LaunchOptions) -> None:
    """Refuse launch options that cannot work, before anything is written or submitted
    (an unknown launcher raises one line listing the valid ones)."""
    entry = LAUNCHERS.get(launcher)
    if options.jobs_per_gpu < 1:
        raise DomaingenError(f"--jobs_per_gpu must be at least 1, got {options.jobs_per_gpu}")
    if options.jobs_per_task < 1:
        raise DomaingenError(f"--jobs_per_task must be at least 1, got {options.jobs_per_task}")
    if options.jobs_per_task > 1 and not entry.jobs_per_task:
        raise DomaingenError(
            f"--jobs_per_task works with --launcher {_those('jobs_per_task')}, not {entry.name} (its workers already "
            "run job after job); drop --jobs_per_task"
        )
    if options.dataset_cache_mb is not None and options.dataset_cache_mb < 0:
        raise DomaingenError(f"--dataset_cache_mb must be at least 0 (0 turns the cache off), got "
                             f"{options.dataset_cache_mb:g}")
    if options.detach and not entry.detach:
        raise DomaingenError(f"--detach works with --launcher {_those('detach')}, not {entry.name}; drop --detach")
    options.loggers = check_loggers(options.loggers) if entry.runs_jobs else check_logger_names(options.loggers)
    if entry.check is not None:
        entry.check(options)


def launch(
    jobs: Sequence[Job], sweep_dir: str, data_dir: str | None, launcher: str, options: LaunchOptions
) -> list[JobResult]:
    """Run `jobs` with the named launcher and return how each ended."""
    return LAUNCHERS.get(launcher).run(jobs, sweep_dir, data_dir, options)
