"""The launcher table: each launcher registers itself, with its help line and what it accepts.

A launcher is a function `(jobs, sweep_dir, data_dir, options) -> list[JobResult]` that
runs (or submits) every job and says how each ended. It registers with
`register_launcher`, in its own module (local.py, parallel.py, slurm.py,
ray_launcher.py) or in a plugin; `sweep.launch` dispatches by name through LAUNCHERS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, List, Optional, Sequence

from domaingen.registry import Registry
from domaingen.sweep.spec import Job
from domaingen.sweep.workers import JobResult, LaunchOptions

LaunchFunction = Callable[[Sequence[Job], str, Optional[str], LaunchOptions], List[JobResult]]


@dataclass(frozen=True)
class Launcher:
    """A registered launcher.

    `run` runs the jobs; `help` is its line in `--launcher`'s help; `check` refuses
    options that cannot work with it (a missing package, an unreachable cluster) before
    anything is written, raising DomaingenError; `jobs_per_task`: it accepts
    --jobs_per_task above 1 (one task runs several jobs); `detach`: it accepts --detach
    (submit and return); `runs_jobs`: False for one that only shows what it would run
    (dry): nothing is written, asked or checked beyond the options' names; `remote`: whether,
    with these options, the jobs run on machines with disks of their own (the data directory
    is then not checked here).
    """

    name: str
    run: LaunchFunction
    help: str
    check: Callable[[LaunchOptions], None] | None = None
    jobs_per_task: bool = False
    detach: bool = False
    runs_jobs: bool = True
    remote: Callable[[LaunchOptions], bool] | None = None

    @property
    def __wrapped__(self) -> LaunchFunction:
        # the registry names the function's module as the entry's owner
        return self.run


LAUNCHERS: Registry[Launcher] = Registry("launcher")


def register_launcher(
    name: str, help: str, *, check: Callable[[LaunchOptions], None] | None = None, jobs_per_task: bool = False,
    detach: bool = False, runs_jobs: bool = True, remote: Callable[[LaunchOptions], bool] | None = None,
) -> Callable[[LaunchFunction], LaunchFunction]:
    """Decorator: register the function as the launcher `name` (see Launcher for the arguments);
    the function itself is returned unchanged. A name taken already raises NameClashError."""

    def decorate(run: LaunchFunction) -> LaunchFunction:
        LAUNCHERS.register(name)(Launcher(name, run, help, check=check, jobs_per_task=jobs_per_task, detach=detach,
                                          runs_jobs=runs_jobs, remote=remote))
        return run

    return decorate
