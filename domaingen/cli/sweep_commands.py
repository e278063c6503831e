"""The `sweep` and `export` subcommands, and the helpers `collect` reads runs and writes its output with."""

from __future__ import annotations

import argparse
import collections
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Any, Sequence

from tabulate import tabulate

from domaingen.errors import DomaingenError
from domaingen.hparams import parse_overrides
from domaingen.sweep.launch import LAUNCHERS, check_options, launch
from domaingen.cli.launch_flags import launch_options
from domaingen.sweep.workers import NOT_SUBMITTED, SUBMITTED
from domaingen.plugins import PluginError, load_plugins, loaded_plugins, merge_specs, portable, recorded_plugins
from domaingen.run.rundir import DONE_STATE, FAILED_STATE, INCOMPLETE, NOT_LAUNCHED
from domaingen.run.runlock import is_locked
from domaingen.sweep.slurm_jobs import ACTIVE_STATES, active_jobs, describe, read_submissions, scheduler_states
from domaingen.run.settings import namespace_value
from domaingen.run.training import LAUNCH_SETTINGS, REQUEUE_EXIT_STATUS
from domaingen.sweep.spec import (
    FLAG_SETTINGS,
    SPEC_FILE,
    STATES,
    SpecError,
    build_jobs,
    delete_incomplete,
    job_states,
    read_spec_data,
    parse_spec,
    select_parts,
    prepare_sweep_dir,
    read_recorded_spec,
    trial_major,
)

log = logging.getLogger(__name__)



def spec_path(given: str) -> str:
    """--spec's file: the path given, or, when no such file exists and it is a bare name, the spec the
    package ships under that name (`domaingen spec` lists them), so an installed wheel runs `--spec demo`."""
    from domaingen.cli.spec_commands import shipped_specs

    name = given.removesuffix(".toml")
    if Path(given).exists() or "/" in given or name not in shipped_specs():
        return given
    return str(shipped_specs()[name])


def spec_from_args(ns: argparse.Namespace):
    """The sweep spec: the TOML file's keys, overridden by any flags given."""
    if getattr(ns, "spec", None):
        ns.spec = spec_path(ns.spec)
    data: dict[str, Any] = {}
    source = "command line"
    recorded = read_recorded_spec(ns.output_dir)
    if recorded is not None:  # a relaunch in a fresh shell: the plugins the sweep was launched with
        load_plugins(recorded.get("plugins") if isinstance(recorded.get("plugins"), list) else ())
    if not ns.spec and recorded is not None and ns.algorithms is None and ns.datasets is None:
        # status / delete-incomplete / relaunch of an existing sweep: its own recorded spec
        data = {k: v for k, v in recorded.items() if v is not None}
        source = f"{ns.output_dir}/sweep.json"
    elif ns.spec:
        written = read_spec_data(ns.spec)
        data = {k: v for k, v in parse_spec(written, ns.spec).canonical().items() if v is not None}
        if "protocol" not in written:  # the default: the recorded sweep's, else the one its runs call for
            data["protocol"] = recorded["protocol"] if recorded is not None else None
        source = ns.spec
    if getattr(ns, "parts", None):
        if not ns.spec:  # the numbers name the spec file's parts; a recorded sweep holds only those chosen
            raise SpecError("--parts needs --spec: it numbers the parts of the spec file")
        data = select_parts(data, ns.parts, source)
    for item in FLAG_SETTINGS:
        value = namespace_value(item, ns) if item.name != "hparams" else None
        if value is not None:
            data[item.name] = value
    if getattr(ns, "hparams", None):
        data["hparams"] = {**data.get("hparams", {}), **parse_overrides(ns.hparams)}
    if "algorithms" not in data or "datasets" not in data:
        raise SpecError(
            "give --spec FILE, or --algorithms and --datasets (or an --output_dir that holds a launched sweep)"
        )
    # every plugin this process loaded (entry points, $DOMAINGEN_PLUGINS, --plugins, the spec's,
    # the recorded ones) travels with the jobs and into sweep.json
    data["plugins"] = merge_specs([portable(s) for s in data.get("plugins") or ()], loaded_plugins())
    return parse_spec(data, source)


def run(ns: argparse.Namespace) -> int:
    if ns.action == "restore":
        return _restore(ns)
    if ns.action != "launch":
        _check_holds_sweep(ns)
    spec = spec_from_args(ns)
    jobs = build_jobs(spec)
    if ns.action == "status":
        return _watch(jobs, ns) if ns.watch else _status(jobs, ns.output_dir)
    if ns.action == "delete-incomplete":
        return _delete(jobs, ns)
    return _launch(spec, jobs, ns)


def _restore(ns: argparse.Namespace) -> int:
    from domaingen.tables.restore import restore_bundle

    done = restore_bundle(ns.bundle, ns.output_dir)
    weights = f" ({done.with_weights} with weights)" if done.with_weights else ""
    spec = f" and its {SPEC_FILE}" if done.spec_written else ""
    print(f"restored {len(done.restored)} done runs{weights}{spec} from {ns.bundle} into {ns.output_dir}")
    if done.present:
        print(f"{len(done.present)} of the bundle's done runs were there already and are left as they are")
    if done.not_done:
        print(f"{len(done.not_done)} of its runs were not done (incomplete or failed) and are not restored: "
              f"sweep launch runs them from the start")
    print(f"continue it with: domaingen sweep launch --spec SPEC --output_dir {ns.output_dir} (--parts and "
          f"--n_trials launch some of its jobs)")
    return 0


def _check_holds_sweep(ns: argparse.Namespace) -> None:
    """status and delete-incomplete: refuse an output_dir that does not exist, or, without a spec, one that
    no sweep was launched into."""
    exists = Path(ns.output_dir).exists()
    if exists and (ns.spec or ns.algorithms is not None or ns.datasets is not None
                   or read_recorded_spec(ns.output_dir)):
        return
    where = "no such directory" if not exists else f"no {SPEC_FILE} there"
    raise DomaingenError(f"{ns.output_dir} holds no sweep ({where}): give the directory a sweep was launched "
                         f"into, or --spec FILE to count that spec's jobs there")


def _status(jobs, sweep_dir: str) -> int:
    states = job_states(jobs, sweep_dir)
    counts = collections.Counter(states.values())
    print(f"{len(jobs)} jobs in {sweep_dir}: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in STATES))
    live = _live_states(jobs, sweep_dir, states)
    if live:
        print("of the jobs not done: " + describe(live))
    columns = list(STATES) + sorted(set(live.values()))
    per_group: dict[tuple[str, str], collections.Counter] = collections.defaultdict(collections.Counter)
    for job in jobs:
        group = per_group[(job.args["dataset"], job.args["algorithm"])]
        group[states[job.job_id]] += 1
        if job.job_id in live:
            group[live[job.job_id]] += 1
    rows = [[ds, alg] + [c.get(s, 0) for s in columns] for (ds, alg), c in per_group.items()]
    print(tabulate(rows, headers=["dataset", "algorithm", *columns]))
    return 0


def _watch(jobs, ns: argparse.Namespace) -> int:
    from domaingen.sweep.progress import watch

    if ns.interval <= 0:
        raise DomaingenError(f"--interval must be positive, got {ns.interval:g}")
    clear = "\x1b[H\x1b[2J" if sys.stdout.isatty() else ""

    def show(screen: str) -> None:
        print(f"{clear}{screen}" + ("" if clear else "\n"), flush=True)

    watch(jobs, ns.output_dir, show, ns.interval)
    return 0


def _live_states(jobs, sweep_dir: str, states: dict[str, str]) -> dict[str, str]:
    """job_id -> what is happening to a job not done: the scheduler's state, or 'running here' (lock held)."""
    pending = [job for job in jobs if states[job.job_id] != DONE_STATE]
    submissions = {j: s for j, s in read_submissions(sweep_dir).items() if j in {job.job_id for job in pending}}
    live = {j: state for j, state in scheduler_states(submissions).items() if state in ACTIVE_STATES} if submissions else {}
    for job in pending:
        if job.job_id not in live and is_locked(job.directory(sweep_dir)):
            live[job.job_id] = "running (lock held)"
    return live


def _confirm(question: str, assume_yes: bool) -> bool:
    if assume_yes or not sys.stdin.isatty():
        return True
    return input(f"{question} [y/N] ").strip().lower() in ("y", "yes")


def _delete(jobs, ns) -> int:
    states = job_states(jobs, ns.output_dir)
    doomed = sum(states[j.job_id] in (INCOMPLETE, FAILED_STATE) and not is_locked(j.directory(ns.output_dir))
                 for j in jobs)
    if doomed and not _confirm(f"delete {doomed} incomplete or failed job directories?", ns.yes):
        print("nothing deleted")
        return 1
    removed = delete_incomplete(jobs, ns.output_dir)
    print(f"deleted {len(removed)} incomplete or failed job directories")
    return 0


def _launch(spec, jobs, ns) -> int:
    launcher = "dry" if ns.dry else ns.launcher
    options = launch_options(ns)
    check_options(launcher, options)
    entry = LAUNCHERS.get(launcher)
    runs_jobs = entry.runs_jobs
    states = job_states(jobs, ns.output_dir)
    if runs_jobs and not (entry.remote and entry.remote(options)):  # jobs elsewhere read their own disks
        from domaingen.datasets import check_data_dir

        check_data_dir(ns.data_dir, sorted({job.args["dataset"] for job in jobs if states[job.job_id] != DONE_STATE}))
    if runs_jobs:
        if prepare_sweep_dir(ns.output_dir, spec, force=ns.force):
            print(f"these jobs are part of the sweep {ns.output_dir}/{SPEC_FILE} records: its record is kept "
                  f"(--force records this spec instead)")
    wanted = (NOT_LAUNCHED, INCOMPLETE) + ((FAILED_STATE,) if ns.retry_failed else ())
    todo = [job for job in jobs if states[job.job_id] in wanted]
    counts = collections.Counter(states.values())
    print(
        f"{len(jobs)} jobs: {counts.get('done', 0)} done, {counts.get(INCOMPLETE, 0)} incomplete (to resume), "
        f"{counts.get(FAILED_STATE, 0)} failed ({'to retry' if ns.retry_failed else 'skipped; --retry_failed reruns them'}), "
        f"{counts.get(NOT_LAUNCHED, 0)} not launched"
    )
    if getattr(ns, "order", "spec") == "trial":
        todo = trial_major(todo)
    queued = active_jobs(ns.output_dir, [job.job_id for job in todo])
    if queued:
        print(f"{len(queued)} of them queued or running in Slurm ({describe(queued)}): not submitted again")
        todo = [job for job in todo if job.job_id not in queued]
    if not todo:
        print("nothing to launch")
        return 0
    if runs_jobs and not _confirm(f"launch {len(todo)} jobs with the {launcher} launcher?", ns.yes):
        print("not launched")
        return 1
    given = {item.name: getattr(ns, item.name) for item in LAUNCH_SETTINGS if getattr(ns, item.name, None)}
    if given:  # launch arguments: job ids stay what the spec makes them
        todo = [dataclasses.replace(job, launch_args={**job.launch_args, **given}) for job in todo]
    results = launch(todo, ns.output_dir, ns.data_dir, launcher, options)
    if not runs_jobs:
        return 0
    ended = collections.Counter(r.state for r in results)
    verb = "submitted" if options.detach else "launched"
    print(f"{verb} {len(todo)} jobs: " + ", ".join(f"{n} {s}" for s, n in sorted(ended.items())))
    for r in results:
        if r.state in (FAILED_STATE, NOT_SUBMITTED):
            print(f"  {r.state} {r.job_id}: {r.message}")
    if options.detach and ended.get(SUBMITTED):
        print(f"follow them with: domaingen sweep status --output_dir {ns.output_dir}")
    if ended.get(FAILED_STATE) or ended.get(NOT_SUBMITTED):
        return 1
    if ended.get(INCOMPLETE):
        print(f"{ended[INCOMPLETE]} jobs stopped at their time budget; the same command resumes them")
        return REQUEUE_EXIT_STATUS
    return 0


def load_recorded_plugins(sweep_dir: str) -> None:
    """Load the plugins a sweep (or run) directory records, for the names of a plugin dataset's
    environments; tables do not need them otherwise, so one that fails is a warning."""
    try:
        load_plugins(recorded_plugins(sweep_dir))
    except PluginError as exc:
        log.warning("%s; tables of its datasets number their environments instead of naming them", exc)


def _methods(collection, asked: Sequence[str] | None, bundle: dict | None) -> list[str]:
    """The selection methods asked for, else collect's default; a bundle holds the runs of its own methods only,
    unless exported with --all_runs (every run's records: any method's tables)."""
    if bundle is not None and not bundle.get("all_runs"):
        held = bundle.get("selection", [])
        missing = [m for m in asked or () if m not in held]
        if missing:
            raise DomaingenError(f"this bundle holds the runs selected by {', '.join(held)}, not {', '.join(missing)}; "
                                 f"export the sweep again with --selection {' '.join(asked)}")
        return list(asked or held)
    if bundle is not None and not asked:
        return list(bundle.get("selection", []))
    if asked:
        return list(asked)
    from domaingen.tables.selection import default_selection_methods

    return default_selection_methods(has_pairs=bool((collection.records["test_envs"].map(len) == 2).any()))


def labelled_sources(sources: Sequence[str]) -> list[tuple[str, str]]:
    """`[LABEL=]DIR` arguments as (label, source); a label defaults to the directory's or bundle's name."""
    pairs = []
    for source in sources:
        label, sep, path = source.partition("=")
        if not sep or Path(source).exists():
            label, path = Path(source.rstrip("/")).stem, source
        pairs.append((label, path))
    labels = [label for label, _ in pairs]
    twice = sorted({label for label in labels if labels.count(label) > 1})
    if twice:
        raise DomaingenError(f"--input_dir: two sources are labelled {twice[0]}; name them LABEL=DIR")
    return pairs


def _collection(sweep_dir: str | Sequence[str], ns: argparse.Namespace):
    """The records and runs of `sweep_dir` (or of a bundle) as collect tabulates them (with --datasets and
    --algorithms applied, to each source before they are labelled);
    several sources are merged, each one's algorithms labelled (`tables.collect.merged`)."""
    from domaingen.tables.collect import collect, merged, only_algorithms, only_datasets
    from domaingen.tables.export import bundle_collection, is_bundle

    if not isinstance(sweep_dir, str):
        if len(sweep_dir) == 1:
            (label, path), = labelled_sources(sweep_dir)
            # one source: its rows are labelled only when LABEL= was given
            return _collection(path, ns) if path == sweep_dir[0] else merged([(label, _collection(path, ns))])
        parts = [(label, _collection(path, ns)) for label, path in labelled_sources(sweep_dir)]
        return merged(parts)
    if is_bundle(sweep_dir):
        collection, info = bundle_collection(sweep_dir, allow_mixed_sources=ns.allow_mixed_sources)
        collection.bundle = info
    else:
        load_recorded_plugins(sweep_dir)
        collection = collect(sweep_dir, allow_mixed_sources=ns.allow_mixed_sources,
                             protocol=getattr(ns, "protocol", None))
        _add_unlaunched_jobs(collection, sweep_dir)
    if getattr(ns, "datasets", None):
        collection = only_datasets(collection, ns.datasets, sweep_dir)
    if getattr(ns, "algorithms", None):
        collection = only_algorithms(collection, ns.algorithms, sweep_dir)
    return collection


def export_command(ns: argparse.Namespace) -> int:
    from domaingen.tables.export import bundled_run_dirs, export_bundle, is_bundle
    from domaingen.tables.reporting import build_tables, to_markdown
    from domaingen.tables.selection import check_hparams_choice

    check_hparams_choice(ns.hparams_choice)
    if not Path(ns.input_dir).is_dir() or is_bundle(ns.input_dir):
        raise DomaingenError(f"--input_dir {ns.input_dir}: name a sweep directory (one holding run directories)")
    collection = _collection(ns.input_dir, ns)
    methods = _methods(collection, ns.selection, None)
    text = to_markdown(build_tables(collection, methods, ns.hparams_choice), collection)
    info = export_bundle(ns.input_dir, ns.output, collection, methods, ns.hparams_choice, text,
                         weights=not ns.no_weights, backs=ns.backs, all_runs=ns.all_runs,
                         records=ns.records)
    size = Path(ns.output).stat().st_size / 2**20
    held = (f"the records of all {bundled_run_dirs(info)} runs ({info['done_runs']} done), "
            f"{len(info['bundled'])} of them" if info["all_runs"] else
            f"{len(info['bundled'])} of {info['done_runs']} done runs,")
    print(f"wrote {ns.output}: {held} selected by "
          f"{', '.join(methods)}{'' if info['weights'] else ', without weights'} ({size:.1f} MB)")
    return 0


def _versus_text(collection, methods: Sequence[str], ns: argparse.Namespace) -> str:
    """`collect versus`: the two sweeps' cells and their paired differences, after a line
    saying how their twin runs' arguments differ (a comment in LaTeX; stderr for CSV)."""
    from domaingen.tables.comparisons import argument_differences, versus_tables
    from domaingen.tables.reporting import build_tables, done_runs, to_csv, to_latex, to_markdown

    if not Path(ns.other).is_dir():
        raise DomaingenError(f"--other {ns.other}: no such directory; name a sweep directory to compare with")
    other = _collection(ns.other, ns)
    if other.protocol != collection.protocol:
        raise DomaingenError(f"collect versus: {ns.input_dir} holds protocol {collection.protocol} and {ns.other} "
                             f"protocol {other.protocol}; twin runs pair only within one protocol: set their tables "
                             "side by side")
    label_a, label_b = Path(ns.input_dir).resolve().name, Path(ns.other).resolve().name
    if label_a == label_b:
        label_a, label_b = str(ns.input_dir), str(ns.other)
    tables = versus_tables(build_tables(collection, methods, ns.hparams_choice),
                           build_tables(other, methods, ns.hparams_choice), label_a, label_b)
    summary = argument_differences(_recorded_args(ns.input_dir), _recorded_args(ns.other), label_a, label_b)
    summary += (f"; {label_b} has {done_runs(other.records['run'].nunique() if len(other.records) else 0)} "
                "(the counts at the end are the first sweep's)")
    if ns.format == "markdown":
        return f"{summary}.\n\n" + to_markdown(tables, collection, ns.show_trials, ns.error)
    if ns.format == "latex":
        return f"% {summary}.\n" + to_latex(tables, collection, ns.show_trials, ns.bare, ns.error,
                                             long_captions=getattr(ns, "long_captions", False))
    print(f"{summary}.", file=sys.stderr)
    return to_csv(tables, ns.error)


def _recorded_args(sweep_dir: str) -> list[dict]:
    """The args.json of every run directory directly under `sweep_dir`."""
    from domaingen.run.rundir import RunDirectory

    found = []
    for path in sorted(Path(sweep_dir).iterdir()):
        args = RunDirectory(path).read_args() if path.is_dir() else None
        if isinstance(args, dict):
            found.append(args)
    return found


def _write(text: str, output: str | None) -> int:
    """`text` into `output`, or to stdout when None."""
    if output:
        try:
            Path(output).parent.mkdir(parents=True, exist_ok=True)
            Path(output).write_text(text)
        except OSError as exc:
            raise DomaingenError(f"cannot write {output}: {exc.strerror}") from None
        print(f"wrote {output}")
    else:
        sys.stdout.write(text)
    return 0


def _add_unlaunched_jobs(collection, sweep_dir: str) -> None:
    """Jobs of the sweep's recorded spec with no directory yet, as runs 'not launched', so that their
    environments get columns and their cells say why they are empty."""
    import pandas as pd

    recorded = read_recorded_spec(sweep_dir)
    if recorded is None:
        return
    try:
        jobs = build_jobs(parse_spec({k: v for k, v in recorded.items() if v is not None}, f"{sweep_dir}/sweep.json"))
    except (DomaingenError, TypeError, KeyError):  # a recorded spec this version cannot parse: the runs found suffice
        return
    rows = [
        {"run": job.job_id, "state": NOT_LAUNCHED, "dataset": job.args["dataset"], "algorithm": job.args["algorithm"],
         "test_envs": tuple(sorted(job.args["test_envs"])), "hparams_seed": job.args["hparams_seed"],
         "trial_seed": job.args["trial_seed"]}
        for job in jobs if not job.directory(sweep_dir).exists()
    ]
    if rows:
        collection.runs = pd.concat([collection.runs, pd.DataFrame(rows)], ignore_index=True)
