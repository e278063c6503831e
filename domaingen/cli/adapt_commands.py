"""The `adapt` subcommand: one adaptation job per done run of a sweep, through a sweep launcher."""

from __future__ import annotations

import argparse
import collections

from tabulate import tabulate

from domaingen.errors import DomaingenError


def add_parser(sub: argparse._SubParsersAction) -> None:
    from domaingen.adapt import ADAPTERS
    from domaingen.cli.launch_flags import add_launch_flags

    p = sub.add_parser("adapt", help="test-time adaptation of every done run of a sweep (T3A, Tent, SHOT, ...), "
                                     "one job per run on any launcher, stored beside each run; collect shows the "
                                     "rows X+ADAPTER")
    p.add_argument("--input_dir", required=True, help="the sweep's output directory (or one run)")
    p.add_argument("--adapters", nargs="+", metavar="ADAPTER", default=None,
                   help=f"default: every adapter defined for each run ({', '.join(ADAPTERS.names())}); one named here "
                        "that a run cannot use is an error")
    p.add_argument("--data_dir", default=None, help="default: the directory each run was trained from")
    p.add_argument("--device", default="auto", help="auto (CUDA when present), cpu, cuda, cuda:N")
    add_launch_flags(p, None, 1, launcher_help="; default: local, or parallel when --workers is above 1",
                     workers_help="runs adapted at once, each in its own process (the parallel launcher; default 1)")


def launcher_of(ns: argparse.Namespace) -> str:
    """--dry's dry, --launcher's, or by --workers: local for 1, parallel for more."""
    if ns.dry:
        return "dry"
    return ns.launcher or ("parallel" if ns.workers > 1 else "local")


def run(ns: argparse.Namespace) -> int:
    from domaingen.adapt.sweep import outcome_counts, plan_adaptation, raise_refusal
    from domaingen.cli.launch_flags import launch_options
    from domaingen.sweep.launch import LAUNCHERS, check_options, launch
    from domaingen.sweep.slurm_jobs import active_jobs, describe
    from domaingen.sweep.workers import NOT_SUBMITTED, SUBMITTED

    if ns.workers < 1:
        raise DomaingenError(f"--workers must be at least 1, got {ns.workers}")
    launcher = launcher_of(ns)
    options = launch_options(ns)
    options.progress = options.progress and not ns.quiet
    check_options(launcher, options)
    entry = LAUNCHERS.get(launcher)
    plan = plan_adaptation(ns.input_dir, ns.adapters, ns.device)
    todo = plan.jobs
    print(f"{len(plan.stored) + len(todo)} done runs: {len(plan.stored)} adapted already with every adapter asked "
          f"(skipped), {len(todo)} to adapt")
    queued = active_jobs(ns.input_dir, [job.job_id for job in todo]) if entry.runs_jobs else {}
    if queued:
        print(f"{len(queued)} of them queued or running in Slurm ({describe(queued)}): not submitted again")
        todo = [job for job in todo if job.job_id not in queued]
    results = launch(todo, str(ns.input_dir), ns.data_dir, launcher, options) if todo else []
    if not entry.runs_jobs:
        return 0
    ended = collections.Counter(r.state for r in results)
    if options.detach and ended.get(SUBMITTED):
        print(f"submitted {ended[SUBMITTED]} adaptation jobs; the same command, once they end, counts what is stored")
    rows = [[adapter, what, n] for (adapter, what), n in sorted(outcome_counts(plan, results).items())]
    print(tabulate(rows, headers=["adapter", "outcome", "runs"]))
    failed = [r for r in results if r.state in ("failed", NOT_SUBMITTED)]
    for r in failed:
        print(f"  {r.state} {r.job_id}: {r.message}")
    raise_refusal(results)
    print(f"Runs were adapted with the {launcher} launcher; rerunning skips what is stored.")
    return 1 if failed else 0
