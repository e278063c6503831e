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
from domaingen.hparams import run_space
from domaingen.plugins import load_plugins, merge_specs
from domaingen.run.runlock import is_locked
from domaingen.run.rundir import DONE_STATE, FAILED_STATE, INCOMPLETE, NOT_LAUNCHED, RunDirectory, atomic_write_bytes
from domaingen.run.precision import REQUESTED_PRECISIONS
from domaingen.run.protocol import DEFAULT_PROTOCOL, DOMAINBED, PROTOCOLS, check_domainbed_problem
from domaingen.run.training import NON_IDENTITY_ARGS, TrainConfig

SPEC_FILE = "sweep.json"
STATES = (DONE_STATE, INCOMPLETE, FAILED_STATE, NOT_LAUNCHED)


class SpecError(DomaingenError):
    """A sweep spec that cannot be used."""


@dataclass
class SweepSpec:
    """What a sweep runs: every algorithm x dataset x test-env set x hparams draw x trial."""

    algorithms: list[str]
    datasets: list[str]
    test_envs: list[list[int | str]] | None = None  # held-out sets, indices or names; None: every single one
    pairs: bool = False  # add every pair of environments (leave-one-domain-out selection)
    n_hparams: int = 20  # hparams_seed 0 (defaults) .. n_hparams - 1
    n_trials: int = 3
    steps: int | None = None  # None: each dataset's N_STEPS
    checkpoint_freq: int | None = None
    holdout_fraction: float = 0.2
    precision: str = "fp32"
    eval_splits: str | None = None  # None: the default (eval_plan); not part of a job's id unless set
    train_in_every: int | None = None
    in_domain_test: float | None = None  # a third split of each training domain (run.training); None: off
    hparams: dict[str, Any] = field(default_factory=dict)  # overrides for every job
    algorithm_hparams: dict[str, dict[str, Any]] = field(default_factory=dict)  # per algorithm
    # [[parts]]: sub-sweeps, each the top-level keys overridden by its own; their jobs run in order
    parts: list[dict[str, Any]] = field(default_factory=list)
    # plugin modules the jobs load (domaingen.plugins); not part of the sweep's identity
    plugins: list[str] = field(default_factory=list)
    protocol: str = DEFAULT_PROTOCOL  # paired or domainbed (domaingen.run.protocol)

    def sub_specs(self) -> list["SweepSpec"]:
        """The parts as complete specs (a spec without parts is its own single part)."""
        if not self.parts:
            return [self]
        top = {k: v for k, v in self.canonical().items() if k != "parts" and v is not None}
        return [parse_spec({**top, **part}, f"parts[{i}]") for i, part in enumerate(self.parts)]

    def canonical(self) -> dict[str, Any]:
        """The spec as plain JSON-able data, for sweep.json and comparison."""
        return json.loads(json.dumps(dataclasses.asdict(self), sort_keys=True))


SPEC_KEYS = {f.name for f in dataclasses.fields(SweepSpec)}


def _expect(key: str, value: Any, kind: type | tuple[type, ...], what: str) -> None:
    if not isinstance(value, kind) or isinstance(value, bool) and kind is not bool:
        raise SpecError(f"spec key '{key}' must be {what}, got {value!r}")


def parse_spec(data: Mapping[str, Any], source: str = "spec") -> SweepSpec:
    """Validate raw spec data (from TOML or flags); every problem names its key."""
    unknown = sorted(set(data) - SPEC_KEYS)
    if unknown:
        raise SpecError(f"{source}: unknown key(s) {', '.join(unknown)}; valid keys: {', '.join(sorted(SPEC_KEYS))}")
    if data.get("plugins") is not None:
        _expect("plugins", data["plugins"], list, "a list of plugin modules or .py paths")
        load_plugins(data["plugins"])  # before the names below are checked: plugins register them
    if data.get("parts"):
        return _parse_parts(data, source)
    for key in ("algorithms", "datasets"):
        if key not in data:
            raise SpecError(f"{source}: missing key '{key}'")
        _expect(key, data[key], list, "a list of names")
        if not data[key]:
            raise SpecError(f"{source}: '{key}' is empty")
    data = {**data, **_canonical_names(data, source)}
    for key in ("n_hparams", "n_trials"):
        if key in data:
            _expect(key, data[key], int, "a positive integer")
            if data[key] < 1:
                raise SpecError(f"{source}: '{key}' must be at least 1, got {data[key]}")
    for key in ("steps", "checkpoint_freq"):
        if data.get(key) is not None:
            _expect(key, data[key], int, "a positive integer")
            if data[key] < 1:
                raise SpecError(f"{source}: '{key}' must be at least 1, got {data[key]}")
    if "pairs" in data:
        _expect("pairs", data["pairs"], bool, "true or false")
    if "precision" in data and data["precision"] not in REQUESTED_PRECISIONS:
        raise SpecError(
            f"{source}: 'precision' must be one of {', '.join(REQUESTED_PRECISIONS)}, got {data['precision']!r}"
        )
    try:
        check_eval_splits(data.get("eval_splits"), data.get("train_in_every"))
    except DomaingenError as exc:
        raise SpecError(f"{source}: {exc}") from None
    if "protocol" in data and data["protocol"] not in PROTOCOLS:
        raise SpecError(f"{source}: 'protocol' must be one of {', '.join(PROTOCOLS)}, got {data['protocol']!r}")
    if data.get("protocol") == DOMAINBED:
        for algorithm, dataset in itertools.product(data["algorithms"], data["datasets"]):
            try:
                check_domainbed_problem(algorithm, dataset)
            except DomaingenError as exc:
                raise SpecError(f"{source}: {exc}") from None
    if "holdout_fraction" in data:
        _expect("holdout_fraction", data["holdout_fraction"], (int, float), "a number in [0, 1)")
    try:
        check_in_domain_test(data.get("in_domain_test"), float(data.get("holdout_fraction", 0.2)))
    except DomaingenError as exc:
        raise SpecError(f"{source}: {exc}") from None
    if data.get("test_envs") is not None:
        data = {**data, "test_envs": _environment_sets(data["test_envs"], source)}
    if "hparams" in data:
        _expect("hparams", data["hparams"], dict, "a table of hyperparameter overrides")
    if "algorithm_hparams" in data:
        _expect("algorithm_hparams", data["algorithm_hparams"], dict, "a table of tables, one per algorithm")
        for name, table in data["algorithm_hparams"].items():
            if name not in data["algorithms"]:
                raise SpecError(f"{source}: 'algorithm_hparams.{name}' names an algorithm the spec does not run")
            _expect(f"algorithm_hparams.{name}", table, dict, "a table of hyperparameter overrides")
    spec = SweepSpec(**{k: data[k] for k in data})
    _check_overrides(spec, source)
    return spec


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


def _is_environment(value: Any) -> bool:
    return isinstance(value, str) or isinstance(value, int) and not isinstance(value, bool)


def _environment_sets(value: Any, source: str) -> list[list[int | str]]:
    """`test_envs` as a list of held-out sets: an entry that is one environment (2 or "-90%") is a
    single-environment set, a list ([0, 1]) a set of its own; indices and names are resolved per
    dataset (environment_sets)."""
    example = 'test_envs = [2] (environment 2), ["-90%"] (by name) or [[0], [1, 2]] (two runs)'
    if not isinstance(value, list):
        raise SpecError(f"{source}: 'test_envs' must be a list, e.g. {example}; got {value!r}")
    sets = []
    for item in value:
        entry = item if isinstance(item, list) else [item]
        if not entry or not all(_is_environment(e) for e in entry):
            raise SpecError(f"{source}: 'test_envs' entry {item!r} is not an environment index, name or list of "
                            f"them; e.g. {example}")
        sets.append(entry)
    return sets


def _parse_parts(data: Mapping[str, Any], source: str) -> SweepSpec:
    _expect("parts", data["parts"], list, "an array of tables ([[parts]])")
    top = {k: v for k, v in data.items() if k != "parts"}
    for i, part in enumerate(data["parts"]):
        _expect(f"parts[{i}]", part, dict, "a table")
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
        try:  # values the algorithm refuses (a negative penalty weight) stop the launch, not each job
            ALGORITHMS.get(algorithm).check_hparams({**defaults, **overrides})
        except DomaingenError as exc:
            raise SpecError(f"{source}: {algorithm}: {exc}") from None
        for envs in _resolved_sets(spec, dataset, source) if spec.test_envs is not None else []:
            algorithm_cls = ALGORITHMS.get(algorithm)
            n_train = len(DATASETS.get(dataset).ENVIRONMENTS) - len(envs)
            try:
                fitted = algorithm_cls.fit_hparams({**defaults, **overrides}, n_train, set(overrides))
                algorithm_cls.check_problem(n_train, fitted, algorithm)
            except DomaingenError as exc:
                raise SpecError(f"{source}: {exc}") from None


def load_spec(path: str | os.PathLike) -> SweepSpec:
    """Read and validate a TOML sweep spec."""
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise SpecError(f"sweep spec {path} not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise SpecError(f"sweep spec {path} is not valid TOML: {exc}") from None
    return parse_spec(data, str(path))


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


def job_id(args: Mapping[str, Any]) -> str:
    """A hash of the canonical job arguments (also the job's directory name)."""
    canonical = json.dumps({k: v for k, v in args.items() if k not in NON_IDENTITY_ARGS}, sort_keys=True)
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
                    "dataset": dataset,
                    "algorithm": algorithm,
                    "test_envs": test_envs,
                    "hparams": overrides,
                    "hparams_seed": hseed,
                    "trial_seed": trial,
                    "steps": steps,
                    "checkpoint_freq": freq,
                    "holdout_fraction": spec.holdout_fraction,
                    "precision": spec.precision,
                    "plugins": list(spec.plugins),
                }
                # set only when asked for, so that the ids of sweeps launched before these keys existed stay
                args.update({k: getattr(spec, k) for k in ("eval_splits", "train_in_every", "in_domain_test")
                             if getattr(spec, k) is not None})
                if spec.protocol != DEFAULT_PROTOCOL:  # paired jobs keep the ids they had before protocols
                    args["protocol"] = spec.protocol
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


def prepare_sweep_dir(sweep_dir: str | os.PathLike, spec: SweepSpec, force: bool = False) -> None:
    """Create the sweep directory and record its spec; refuse a different spec unless forced."""
    path = Path(sweep_dir)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise DomaingenError(f"cannot create output_dir {path}: {exc.strerror}") from None
    if not os.access(path, os.W_OK):
        raise DomaingenError(f"output_dir {path} is not writable; choose another --output_dir")
    recorded = read_recorded_spec(path)
    if recorded is not None:
        recorded.setdefault("protocol", DEFAULT_PROTOCOL)  # a sweep launched before protocols existed was paired
    wanted = spec.canonical()
    if recorded is not None and recorded["protocol"] != wanted["protocol"]:
        raise DomaingenError(
            f"{path} holds a sweep of protocol {recorded['protocol']!r}, not {wanted['protocol']!r}; "
            f"relaunch it with --protocol {recorded['protocol']}, or use another --output_dir"
        )
    # a key the recorded spec lacks reads as None: a spec written before the key existed is the same spec;
    # the plugins loaded may differ between launches (an entry point installed since); they accumulate
    changed = sorted(k for k in set(recorded or {}) | set(wanted) if k != "plugins" and (recorded or {}).get(k) != wanted.get(k))
    if recorded is not None and changed and not force:
        raise DomaingenError(
            f"{path} holds a sweep with a different spec (differs in: {', '.join(changed)}); "
            "use another --output_dir, or --force to launch this spec into it"
        )
    if recorded is not None and not force:
        wanted["plugins"] = merge_specs(recorded.get("plugins"), wanted.get("plugins"))
    atomic_write_bytes(path / SPEC_FILE, (json.dumps(wanted, indent=2, sort_keys=True) + "\n").encode())


def read_recorded_spec(sweep_dir: str | os.PathLike) -> dict[str, Any] | None:
    """The spec a sweep directory was launched with, if any."""
    try:
        return json.loads((Path(sweep_dir) / SPEC_FILE).read_text())
    except (OSError, json.JSONDecodeError):  # absent, unreadable, or a path through a file
        return None


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
    """The `domaingen train` command line that runs one job (with the launch's loggers)."""
    import shlex

    a = {**job.args, **job.launch_args}
    parts = [
        "domaingen", "train",
        "--dataset", a["dataset"],
        "--algorithm", a["algorithm"],
        "--test_envs", *map(str, a["test_envs"]),
        "--hparams_seed", str(a["hparams_seed"]),
        "--trial_seed", str(a["trial_seed"]),
        "--steps", str(a["steps"]),
        "--checkpoint_freq", str(a["checkpoint_freq"]),
        "--holdout_fraction", str(a["holdout_fraction"]),
        "--precision", a["precision"],
        "--output_dir", str(job.directory(sweep_dir)),
    ]
    for key in ("eval_splits", "train_in_every", "in_domain_test", "protocol"):
        if a.get(key) is not None:
            parts += [f"--{key}", str(a[key])]
    if a["hparams"]:
        parts += ["--hparams", json.dumps(a["hparams"], sort_keys=True)]
    if data_dir:
        parts += ["--data_dir", data_dir]
    if a.get("plugins"):
        parts += ["--plugins", ",".join(a["plugins"])]
    if loggers:
        parts += ["--logger", *loggers]
    return shlex.join(parts)
