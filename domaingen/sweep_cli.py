"""The `sweep` and `collect` subcommands: argument handling and what the user sees."""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path
from typing import Any

from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.hparams import parse_overrides
from domaingen.launchers import LaunchOptions, launch
from domaingen.rundir import FAILED_STATE, INCOMPLETE, NOT_LAUNCHED
from domaingen.sweep import (
    STATES,
    SpecError,
    build_jobs,
    delete_incomplete,
    job_states,
    load_spec,
    parse_spec,
    prepare_sweep_dir,
    read_recorded_spec,
)

FLAG_KEYS = ("algorithms", "datasets", "n_hparams", "n_trials", "steps", "checkpoint_freq", "precision", "pairs")


def spec_from_args(ns: argparse.Namespace):
    """The sweep spec: the TOML file's keys, overridden by any flags given."""
    data: dict[str, Any] = {}
    source = "command line"
    recorded = read_recorded_spec(ns.output_dir)
    if not ns.spec and recorded is not None and ns.algorithms is None and ns.datasets is None:
        # status / delete-incomplete / relaunch of an existing sweep: its own recorded spec
        data = {k: v for k, v in recorded.items() if v is not None}
        source = f"{ns.output_dir}/sweep.json"
    elif ns.spec:
        spec = load_spec(ns.spec)
        data = {k: v for k, v in spec.canonical().items() if v is not None}
        source = ns.spec
    for key in FLAG_KEYS:
        value = getattr(ns, key, None)
        if value is not None:
            data[key] = value
    if getattr(ns, "hparams", None):
        data["hparams"] = {**data.get("hparams", {}), **parse_overrides(ns.hparams)}
    if "algorithms" not in data or "datasets" not in data:
        raise SpecError(
            "give --spec FILE, or --algorithms and --datasets (or an --output_dir that holds a launched sweep)"
        )
    return parse_spec(data, source)


def run(ns: argparse.Namespace) -> int:
    spec = spec_from_args(ns)
    jobs = build_jobs(spec)
    if ns.action == "status":
        return _status(jobs, ns.output_dir)
    if ns.action == "delete-incomplete":
        return _delete(jobs, ns)
    return _launch(spec, jobs, ns)


def _status(jobs, sweep_dir: str) -> int:
    states = job_states(jobs, sweep_dir)
    counts = collections.Counter(states.values())
    print(f"{len(jobs)} jobs in {sweep_dir}: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES))
    per_group: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for job in jobs:
        per_group[(job.args["dataset"], job.args["algorithm"])][states[job.job_id]] += 1
    rows = [[ds, alg] + [c.get(s, 0) for s in STATES] for (ds, alg), c in per_group.items()]
    print(tabulate(rows, headers=["dataset", "algorithm", *STATES]))
    return 0


def _confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes or not sys.stdin.isatty():
        return True
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _delete(jobs, ns) -> int:
    states = job_states(jobs, ns.output_dir)
    doomed = sum(states[j.job_id] in (INCOMPLETE, FAILED_STATE) for j in jobs)
    if doomed and not _confirm(f"delete {doomed} incomplete or failed job directories?", ns.yes):
        print("nothing deleted")
        return 1
    removed = delete_incomplete(jobs, ns.output_dir)
    print(f"deleted {len(removed)} incomplete or failed job directories")
    return 0


def _launch(spec, jobs, ns) -> int:
    launcher = "dry" if ns.dry else ns.launcher
    if launcher != "dry":
        prepare_sweep_dir(ns.output_dir, spec, force=ns.force)
    states = job_states(jobs, ns.output_dir)
    wanted = (NOT_LAUNCHED, INCOMPLETE) + ((FAILED_STATE,) if ns.retry_failed else ())
    todo = [job for job in jobs if states[job.job_id] in wanted]
    counts = collections.Counter(states.values())
    print(
        f"{len(jobs)} jobs: {counts.get('done', 0)} done, {counts.get(INCOMPLETE, 0)} incomplete (to resume), "
        f"{counts.get(FAILED_STATE, 0)} failed ({'to retry' if ns.retry_failed else 'skipped; --retry_failed reruns them'}), "
        f"{counts.get(NOT_LAUNCHED, 0)} not launched"
    )
    if not todo:
        print("nothing to launch")
        return 0
    if launcher != "dry" and not _confirm(f"launch {len(todo)} jobs with the {launcher} launcher?", ns.yes):
        print("not launched")
        return 1
    options = LaunchOptions(
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
        },
    )
    results = launch(todo, ns.output_dir, ns.data_dir, launcher, options)
    if launcher == "dry":
        return 0
    ended = collections.Counter(r.state for r in results)
    print(f"launched {len(todo)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(ended.items())))
    for r in results:
        if r.state == FAILED_STATE:
            print(f"  failed {r.job_id}: {r.message}")
    return 0 if not ended.get(FAILED_STATE) else 1


def collect_command(ns: argparse.Namespace) -> int:
    from domaingen.collect import collect
    from domaingen.reporting import build_tables, to_csv, to_latex, to_markdown

    collection = collect(ns.input_dir)
    methods = ns.selection
    if methods is None:
        has_pairs = (collection.records["test_envs"].map(len) == 2).any()
        methods = ["training", "oracle"] + (["loo"] if has_pairs else [])
    tables = build_tables(collection, methods)
    if ns.format == "markdown":
        text = to_markdown(tables, collection, ns.show_trials, ns.error)
    elif ns.format == "latex":
        text = to_latex(tables, collection, ns.show_trials, ns.bare, ns.error)
    else:
        text = to_csv(tables)
    if ns.output:
        try:
            Path(ns.output).parent.mkdir(parents=True, exist_ok=True)
            Path(ns.output).write_text(text)
        except OSError as exc:
            raise DomaingenError(f"cannot write {ns.output}: {exc.strerror}") from None
        print(f"wrote {ns.output}")
    else:
        sys.stdout.write(text)
    return 0
