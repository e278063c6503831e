"""Sweeps: a spec (TOML or flags) -> a deterministic job list -> job states on disk.

A job's directory is a hash of its canonical arguments, so relaunching a sweep
skips done jobs and resumes incomplete ones from their checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import os
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS, check_in_domain_test
from domaingen.errors import DomaingenError
from domaingen.run.eval_plan import DEFAULT_EVAL_SPLITS, LOO_EVAL_SPLITS, check_eval_splits
from domaingen.plugins import load_plugins, merge_specs
from domaingen.run.runlock import is_locked
from domaingen.run.rundir import DONE_STATE, FAILED_STATE, INCOMPLETE, NOT_LAUNCHED, RunDirectory, atomic_write_bytes
from domaingen.hparams import apply_overrides, parse_overrides, run_space
from domaingen.run.protocol import DOMAINBED, RECORDED_DEFAULT, check_domainbed_problem, default_protocol
from domaingen.run.settings import (
    BOOL,
    INT,
    NAMES,
    NEVER,
    Kind,
    as_field,
    check_value,
    closest,
    command_line,
    declared,
    environment_token,
    job_identity,
    setting,
)
from domaingen.run.training import SETTINGS, SWEEP_SETTINGS, TrainConfig

SPEC_FILE = "sweep.json"
STATES = (DONE_STATE, INCOMPLETE, FAILED_STATE, NOT_LAUNCHED)


class SpecError(DomaingenError):
    """A sweep spec that cannot be used."""


def _at_least_one(value: int) -> str | None:
    return None if value >= 1 else f"at least 1, got {value}"


def _nonempty(value: list) -> str | None:
    return None if value else "a non-empty list of names"


def _is_set_entry(value: Any) -> bool:
    entry = value if isinstance(value, list) else [value]
    return bool(entry) and all(isinstance(e, str) or isinstance(e, int) and not isinstance(e, bool) for e in entry)


def _environment_set_text(text: str) -> list[int | str]:
    tokens = [t for t in text.split(",") if t.strip()]
    if not tokens:
        raise ValueError(text)
    return [environment_token(t) for t in tokens]


ENVIRONMENT_SETS = Kind('a list of held-out sets, e.g. [2] (environment 2), ["-90%"] (by name) or [[0], [1, 2]] '
                        "(two runs)", _environment_set_text,
                        lambda v: isinstance(v, list) and all(_is_set_entry(e) for e in v), many=True)
TABLE = Kind("a table", str, lambda v: isinstance(v, dict))
TABLES = Kind("an array of tables ([[parts]])", str, lambda v: isinstance(v, list) and all(isinstance(e, dict) for e in v))


@dataclass
class _SweepKeys:
    """The keys only a sweep has: what it runs. The run settings a sweep may set are added to these
    from their declaration (run.training.TrainConfig)."""

    algorithms: list[str] = setting(kind=NAMES, check=_nonempty, required=True,
                                    help="algorithm names (any case), X+MODIFIER for compositions")
    datasets: list[str] = setting(kind=NAMES, check=_nonempty, required=True, help="dataset names (any case)")
    test_envs: list[list[int | str]] | None = setting(
        None, kind=ENVIRONMENT_SETS, optional=True, metavar="SET",
        help="held-out sets, one run each: indices or names, a set's environments joined by commas (--test_envs 2 "
             "0,1 holds out 2, then 0 and 1; --test_envs -90%%); default: every single environment")
    pairs: bool = setting(False, kind=BOOL, help="add every pair of test environments (leave-one-domain-out "
                                                 "selection needs them)")
    n_hparams: int = setting(20, kind=INT, check=_at_least_one, help="hparams_seed 0 (defaults) .. n_hparams - 1")
    n_trials: int = setting(3, kind=INT, check=_at_least_one, help="trial_seed 0 .. n_trials - 1")
    algorithm_hparams: dict[str, dict[str, Any]] = setting(
        {}, kind=TABLE, help="per algorithm, hyperparameter overrides ([algorithm_hparams.NAME])")
    parts: list[dict[str, Any]] = setting(
        [], kind=TABLES, help="sub-sweeps, each the top-level keys overridden by its own; their jobs run in order")


def _spec_fields() -> list[tuple[str, Any, Any]]:
    return [(item.name, Any, as_field(item)) for item in (*declared(_SweepKeys), *SWEEP_SETTINGS)]


class _SweepSpecMethods:
    def sub_specs(self) -> list["SweepSpec"]:
        """The parts as complete specs (a spec without parts is its own single part)."""
        if not self.parts:
            return [self]
        top = {k: v for k, v in self.canonical().items() if k != "parts" and v is not None}
        return [parse_spec({**top, **part}, f"parts[{i}]") for i, part in enumerate(self.parts)]

    def canonical(self) -> dict[str, Any]:
        """The spec as plain JSON-able data, for sweep.json and comparison."""
        return json.loads(json.dumps(dataclasses.asdict(self), sort_keys=True))


SweepSpec = dataclasses.make_dataclass("SweepSpec", _spec_fields(), bases=(_SweepSpecMethods,))
SweepSpec.__module__ = __name__  # picklable by name, as a class statement here would be
SweepSpec.__doc__ = ("What a sweep runs: every algorithm x dataset x test-env set x hparams draw x trial, with the "
                     "run settings every job shares.")
SPEC_SETTINGS = declared(SweepSpec)
SPEC_KEYS = {item.name for item in SPEC_SETTINGS}
# the spec keys `sweep launch` has a flag for: tables have none, and --plugins is every command's
FLAG_SETTINGS = [item for item in SPEC_SETTINGS if item.name not in ("parts", "algorithm_hparams", "plugins")]


def parse_spec(data: Mapping[str, Any], source: str = "spec") -> SweepSpec:
    """Validate raw spec data (from TOML or flags); every problem names its key and `source`."""
    for key in data:
        if key not in SPEC_KEYS:
            raise SpecError(f"{source}: unknown key '{key}'{closest(key, SPEC_KEYS)} (valid keys: "
                            f"{', '.join(sorted(SPEC_KEYS))})")
    if data.get("plugins") is not None:
        _check(data, "plugins", source)
        load_plugins(data["plugins"])  # before the names below are checked: plugins register them
    if data.get("protocol") is None:
        data = {**data, "protocol": default_protocol(_problems(data))}
    if data.get("parts"):
        return _parse_parts(data, source)
    for key in ("algorithms", "datasets"):
        if key not in data:
            raise SpecError(f"{source}: missing key '{key}'")
    for key in data:
        _check(data, key, source)
    data = {**data, **_canonical_names(data, source)}
    try:
        check_eval_splits(data.get("eval_splits"), data.get("train_in_every"))
        check_in_domain_test(data.get("in_domain_test"), float(data.get("holdout_fraction", 0.2)))
    except DomaingenError as exc:
        raise SpecError(f"{source}: {exc}") from None
    if data.get("protocol") == DOMAINBED:
        for algorithm, dataset in itertools.product(data["algorithms"], data["datasets"]):
            try:
                check_domainbed_problem(algorithm, dataset)
            except DomaingenError as exc:
                raise SpecError(f"{source}: {exc}") from None
    if data.get("test_envs") is not None:
        data = {**data, "test_envs": [e if isinstance(e, list) else [e] for e in data["test_envs"]]}
    for name, table in data.get("algorithm_hparams", {}).items():
        if name not in data["algorithms"]:
            raise SpecError(f"{source}: 'algorithm_hparams.{name}' names an algorithm the spec does not run")
        if not isinstance(table, dict):
            raise SpecError(f"{source}: key 'algorithm_hparams.{name}' must be a table of hyperparameter overrides, "
                            f"got {table!r}")
    if isinstance(data.get("hparams"), str):
        data = {**data, "hparams": parse_overrides(data["hparams"])}
    spec = SweepSpec(**{k: data[k] for k in data})
    _check_overrides(spec, source)
    return spec


_SPEC_SETTING = {item.name: item for item in SPEC_SETTINGS}


def _problems(data: Mapping[str, Any]) -> list[tuple[str, str]]:
    """Every (algorithm, dataset) the spec and its parts run, with names as registered (an unknown name
    is left as written: its own check names it)."""
    def names(table, values) -> list[str]:
        out = []
        for name in values if isinstance(values, list) else []:
            try:
                out.append(table.canonical(str(name)))
            except DomaingenError:
                out.append(str(name))
        return out

    scopes = [{**data, **part} for part in data.get("parts") or [] if isinstance(part, dict)] or [data]
    return [(a, d) for scope in scopes for a in names(ALGORITHMS, scope.get("algorithms"))
            for d in names(DATASETS, scope.get("datasets"))]


def _check(data: Mapping[str, Any], key: str, source: str) -> None:
    """One key's type and range: one line naming `source` and the key."""
    try:
        check_value(_SPEC_SETTING[key], data[key], f"{source}, key '{key}'")
    except DomaingenError as exc:
        raise SpecError(str(exc)) from None


def _canonical_names(data: Mapping[str, Any], source: str) -> dict[str, Any]:
    """algorithms, datasets and algorithm_hparams' keys as registered ("erm" -> "ERM"); one line when unknown."""
    try:
        names = {"algorithms": [ALGORITHMS.canonical(n, " in 'algorithms'") for n in data["algorithms"]],
                 "datasets": [DATASETS.canonical(n, " in 'datasets'") for n in data["datasets"]]}
    except DomaingenError as exc:
        raise SpecError(f"{source}: {exc}") from None
    if isinstance(data.get("algorithm_hparams"), dict):
        names["algorithm_hparams"] = {
            (ALGORITHMS.canonical(k) if k in ALGORITHMS else k): v for k, v in data["algorithm_hparams"].items()}
    return names


def _parse_parts(data: Mapping[str, Any], source: str) -> SweepSpec:
    _check(data, "parts", source)
    top = {k: v for k, v in data.items() if k != "parts"}
    for i, part in enumerate(data["parts"]):
        if "parts" in part:
            raise SpecError(f"{source}: parts[{i}] has parts of its own; parts do not nest")
        parse_spec({**top, **part}, f"{source}: parts[{i}]")
    # the top level needs no algorithms or datasets of its own when every part has them
    defaults = {"algorithms": [], "datasets": []}
    return SweepSpec(**{**defaults, **data})


def _check_overrides(spec: SweepSpec, source: str) -> None:
    for algorithm, dataset in itertools.product(spec.algorithms, spec.datasets):
        space = run_space(dataset, DATASETS.get(dataset), ALGORITHMS.get(algorithm))
        overrides = {**spec.hparams, **spec.algorithm_hparams.get(algorithm, {})}
        unknown = sorted(set(overrides) - set(space))
        if unknown:
            raise SpecError(
                f"{source}: hyperparameter(s) {', '.join(unknown)} unknown to {algorithm} on {dataset}; "
                f"valid names: {', '.join(sorted(space))}; put algorithm-specific ones under [algorithm_hparams.NAME]"
            )
        defaults = {name: hp.default for name, hp in space.items()}
        try:
            apply_overrides(defaults, overrides, space)
        except DomaingenError as exc:
            raise SpecError(f"{source}: {exc} (key 'hparams' or 'algorithm_hparams.{algorithm}')") from None
        try:  # values the algorithm refuses (a negative penalty weight) stop the launch, not each job
            ALGORITHMS.get(algorithm).check_hparams({**defaults, **overrides})
        except DomaingenError as exc:
            raise SpecError(f"{source}: {algorithm}: {exc}") from None
        try:
            DATASETS.get(dataset).check_hparams({**defaults, **overrides}, algorithm)
        except DomaingenError as exc:
            raise SpecError(f"{source}: {algorithm} on {dataset}: {exc}") from None
        for envs in _resolved_sets(spec, dataset, source) if spec.test_envs is not None else []:
            algorithm_cls = ALGORITHMS.get(algorithm)
            n_train = len(DATASETS.get(dataset).ENVIRONMENTS) - len(envs)
            try:
                fitted = algorithm_cls.fit_hparams({**defaults, **overrides}, n_train, set(overrides))
                algorithm_cls.check_problem(n_train, fitted, algorithm)
            except DomaingenError as exc:
                raise SpecError(f"{source}: {exc}") from None


def read_spec_data(path: str | os.PathLike) -> dict[str, Any]:
    """The keys of a TOML sweep spec as written (not validated)."""
    try:
        with open(path, "rb") as f:
            return tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(f"sweep spec {path} not found (`domaingen spec` lists the specs --spec takes by name)") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"sweep spec {path} is not valid TOML: {exc}") from None


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read and validate a TOML sweep spec."""
    return parse_spec(read_spec_data(path), str(path))


@dataclass(frozen=True)
class Job:
    """One run of a sweep: its arguments (job_id hashes them), the arguments the launcher adds that
    are not part of its id (`launch_args`), and its directory."""

    job_id: str
    args: Mapping[str, Any]
    launch_args: Mapping[str, Any] = field(default_factory=dict)

    def directory(self, sweep_dir: str | os.PathLike) -> Path:
        return Path(sweep_dir) / self.job_id

    def config(self, sweep_dir: str | os.PathLike, data_dir: str | None) -> TrainConfig:
        return TrainConfig(**{**self.args, **self.launch_args}, output_dir=str(self.directory(sweep_dir)),
                           data_dir=data_dir)

    def payload(self, sweep_dir: str | os.PathLike, data_dir: str | None,
                loggers: Sequence[str] = ()) -> dict[str, Any]:
        """What a launcher's worker receives: the TrainConfig's keyword arguments, with the launch's loggers."""
        return {**dataclasses.asdict(self.config(sweep_dir, data_dir)), "loggers": list(loggers)}

    def command(self, sweep_dir: str | os.PathLike, data_dir: str | None, loggers: Sequence[str] = ()) -> str:
        """The `domaingen train` command line that runs this job (what the dry launcher prints)."""
        return train_command(self, sweep_dir, data_dir, loggers)


def job_id(args: Mapping[str, Any]) -> str:
    """A hash of the job's identity settings (also the job's directory name)."""
    canonical = json.dumps(job_identity(SETTINGS, args), sort_keys=True)
    return hashlib.md5(canonical.encode()).hexdigest()


def _resolved_sets(spec: SweepSpec, dataset: str, source: str = "spec") -> list[list[int]]:
    """The spec's test_envs as sorted index lists of `dataset`; one line naming the dataset when wrong."""
    try:
        return [DATASETS.get(dataset).resolve_test_envs(s) for s in spec.test_envs or []]
    except DomaingenError as exc:
        raise SpecError(f"{source}: 'test_envs' for {dataset}: {exc}") from None


def environment_sets(spec: SweepSpec, dataset: str) -> list[list[int]]:
    """The test-environment sets of one dataset: the spec's (indices or names), or all singles (plus pairs)."""
    if spec.test_envs is not None:
        sets = []
        for s in _resolved_sets(spec, dataset):  # [2] and ["-90%"] are one set: one run
            sets += [s] if s not in sets else []
    else:
        sets = [[i] for i in range(len(DATASETS.get(dataset).ENVIRONMENTS))]
    if spec.pairs:
        n = len(DATASETS.get(dataset).ENVIRONMENTS)
        sets += [list(p) for p in itertools.combinations(range(n), 2) if list(p) not in sets]
    return sets


def select_parts(data: dict[str, Any], parts: Sequence[int], source: str) -> dict[str, Any]:
    """Spec data keeping only the [[parts]] numbered in `parts` (1-based, the file's order): one part of
    a long sweep launched, resumed and collected as a sweep of its own (its sweep.json records only it)."""
    available = data.get("parts") or []
    if not available:
        raise SpecError(f"--parts: {source} has no [[parts]]; launch it whole")
    bad = [n for n in parts if not 1 <= n <= len(available)]
    if bad:
        raise SpecError(f"--parts {' '.join(map(str, bad))}: {source} has parts 1 to {len(available)}")
    if len(set(parts)) != len(parts):
        raise SpecError(f"--parts names a part twice ({' '.join(map(str, parts))})")
    return {**data, "parts": [available[n - 1] for n in parts]}


def build_jobs(spec: SweepSpec) -> list[Job]:
    """Every job of the spec (of each of its parts, in order), in a deterministic order."""
    if spec.parts:
        jobs = [job for part in spec.sub_specs() for job in build_jobs(part)]
        unique = list({job.job_id: job for job in jobs}.values())
        return unique
    jobs = []
    # the run settings every job shares (those left unset, None, take the run's default); the job's id
    # leaves some out at one value (job_id)
    shared = {item.name: getattr(spec, item.name) for item in SWEEP_SETTINGS if getattr(spec, item.name) is not None}
    shared["plugins"] = list(spec.plugins)
    for dataset in spec.datasets:
        cls = DATASETS.get(dataset)
        steps = spec.steps or cls.N_STEPS
        freq = spec.checkpoint_freq or cls.CHECKPOINT_FREQ
        for algorithm in spec.algorithms:
            overrides = {**spec.hparams, **spec.algorithm_hparams.get(algorithm, {})}
            sets = environment_sets(spec, dataset)
            has_pairs = any(len(s) > 1 for s in sets)
            for test_envs, hseed, trial in itertools.product(sets, range(spec.n_hparams), range(spec.n_trials)):
                args = {
                    **shared,
                    "dataset": dataset,
                    "algorithm": algorithm,
                    "test_envs": test_envs,
                    "hparams": overrides,
                    "hparams_seed": hseed,
                    "trial_seed": trial,
                    "steps": steps,
                    "checkpoint_freq": freq,
                }
                jobs.append(Job(job_id(args), args, _loo_evaluation(args, has_pairs)))
    if not jobs:
        raise SpecError("the sweep has no jobs; check algorithms, datasets and test_envs")
    return jobs


def _loo_evaluation(args: Mapping[str, Any], has_pairs: bool) -> dict[str, Any]:
    """A single run of a sweep with pair runs evaluates its held-out `in` split at every checkpoint
    (leave-one-domain-out may select any), so under `final` it runs with LOO_EVAL_SPLITS; a launch
    argument, so that its job id stays what the spec makes it (see eval_plan)."""
    if not has_pairs or len(args["test_envs"]) != 1 or args.get("eval_splits", DEFAULT_EVAL_SPLITS) != "final":
        return {}
    return {"eval_splits": LOO_EVAL_SPLITS}


def trial_major(jobs: Sequence[Job]) -> list[Job]:
    """The jobs of trial 0 first (in their given order), then trial 1, ...: a sweep stopped early
    leaves every algorithm with the same finished trials, so their comparison pairs by restart."""
    return sorted(jobs, key=lambda job: int(job.args.get("trial_seed", 0)))


def job_states(jobs: Iterable[Job], sweep_dir: str | os.PathLike) -> dict[str, str]:
    """job_id -> done / incomplete / failed / not launched, read from the disk."""
    return {job.job_id: RunDirectory(job.directory(sweep_dir)).state() for job in jobs}


def prepare_sweep_dir(sweep_dir: str | os.PathLike, spec: SweepSpec, force: bool = False) -> bool:
    """Create the sweep directory and record its spec; refuse a different spec unless forced.

    A spec whose jobs are all jobs of the sweep recorded there (some of its parts, fewer trials) is part of
    that sweep: its record is kept, so that the tables still count the rest as not launched. Returns
    whether the recorded spec was kept for such a part."""
    path = Path(sweep_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DomaingenError(f"cannot create output_dir {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise DomaingenError(f"output_dir {path} is not writable; choose another --output_dir")
    recorded = read_recorded_spec(path)
    wanted = spec.canonical()
    if wanted.get("protocol") is None:  # a SweepSpec made without parse_spec: the default protocol
        wanted["protocol"] = default_protocol(_problems(wanted))
    if recorded is not None and recorded["protocol"] != wanted["protocol"]:
        raise DomaingenError(
            f"{path} holds a sweep of protocol {recorded['protocol']!r}, not {wanted['protocol']!r}; "
            f"relaunch it with --protocol {recorded['protocol']}, or use another --output_dir"
        )
    # a key the recorded spec lacks reads as None, the key's default: the same spec; the settings that
    # change no job id (plugins, compile_step) may differ between launches: the plugins loaded (an entry
    # point installed since) accumulate, the others are the latest launch's
    free = {item.name for item in SWEEP_SETTINGS if item.info.identity == NEVER}
    changed = sorted(k for k in set(recorded or {}) | set(wanted)
                     if k not in free and (recorded or {}).get(k) != wanted.get(k))
    if recorded is not None and changed and not force and _within_recorded(spec, recorded, path):
        return True
    if recorded is not None and changed and not force:
        detail = "; ".join(f"{k}: {recorded.get(k)!r} there, {wanted.get(k)!r} now" for k in changed)
        raise DomaingenError(
            f"{path} holds a sweep with a different spec ({detail}); "
            "use another --output_dir, or --force to launch this spec into it"
        )
    if recorded is not None and not force:
        wanted["plugins"] = merge_specs(recorded.get("plugins"), wanted.get("plugins"))
    atomic_write_bytes(path / SPEC_FILE, (json.dumps(wanted, indent=2, sort_keys=True) + "\n").encode())
    return False


def _within_recorded(spec: SweepSpec, recorded: dict[str, Any], path: Path) -> bool:
    """Whether every job of `spec` is a job of the sweep recorded in `path` (which then keeps its record)."""
    try:
        whole = {job.job_id for job in build_jobs(parse_spec({k: v for k, v in recorded.items() if v is not None},
                                                             str(path / SPEC_FILE)))}
    except (DomaingenError, TypeError, KeyError):  # a recorded spec this version cannot parse
        return False
    return {job.job_id for job in build_jobs(spec)} <= whole


def read_recorded_spec(sweep_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The spec a sweep directory was launched with, if any (one that names no protocol was paired)."""
    try:
        recorded = json.loads((Path(sweep_dir) / SPEC_FILE).read_text())
    except (OSError, json.JSONDecodeError):  # absent, unreadable, or a path through a file
        return None
    if isinstance(recorded, dict) and recorded.get("protocol") is None:
        recorded["protocol"] = RECORDED_DEFAULT
    return recorded


def delete_incomplete(jobs: Sequence[Job], sweep_dir: str | os.PathLike) -> list[Job]:
    """Remove the directories of incomplete and failed jobs; returns those jobs.

    A job some process is running now (its run lock is held) is left alone.
    """
    states = job_states(jobs, sweep_dir)
    removed = [
        job for job in jobs
        if states[job.job_id] in (INCOMPLETE, FAILED_STATE) and not is_locked(job.directory(sweep_dir))
    ]
    for job in removed:
        shutil.rmtree(job.directory(sweep_dir), ignore_errors=True)
    return removed


def train_command(job: Job, sweep_dir: str | os.PathLike, data_dir: str | None, loggers: Sequence[str] = ()) -> str:
    """The `domaingen train` command line that runs one job (with the launch's arguments and loggers)."""
    import shlex

    values = {**job.args, **job.launch_args, "output_dir": str(job.directory(sweep_dir)), "data_dir": data_dir,
              "loggers": list(loggers)}
    parts = ["domaingen", "train", *command_line(SETTINGS, values)]
    if values.get("plugins"):
        parts += ["--plugins", ",".join(values["plugins"])]
    return shlex.join(parts)
