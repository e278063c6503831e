"""Reload a trained model from a run directory: its selected or last checkpoint, with its data.

`evaluate`, `diagnose` and the report read runs through here, so they see exactly
the model, splits and domain indices that training evaluated.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from domaingen.algorithms import Algorithm
from domaingen.datasets import MultiDomainDataset, in_domain_test_splits, split_environments
from domaingen.datasets.splits import Split
from domaingen.errors import RunDirectoryError
from domaingen.run.evaluation import evaluate, training_domains
from domaingen.devices import place_model, resolve_device
from domaingen.plugins import load_plugins
from domaingen.run.precision import resolve_precision
from domaingen.run.protocol import RECORDED_DEFAULT
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, resolve

log = logging.getLogger(__name__)

CHECKPOINTS = ("selected", "last")


@dataclass
class LoadedRun:
    """A run's model at one checkpoint, with the data it was evaluated on."""

    path: Path
    args: dict[str, Any]
    hparams: dict[str, Any]
    algorithm: Algorithm
    dataset: MultiDomainDataset
    splits: list[tuple[Split, Split]]
    env_domains: list[int | None]
    checkpoint: str
    step: int
    device: torch.device
    idtest: list[Split | None] | None = None  # the in-domain test splits (--in_domain_test); None: off

    @property
    def test_envs(self) -> list[int]:
        return list(self.args["test_envs"])

    def record(self) -> dict[str, Any] | None:
        """The results.jsonl record written at this checkpoint's step, if any."""
        for record in RunDirectory(self.path).records():
            if record.get("step") == self.step:
                return record
        return None


def read_weights(rundir: RunDirectory, checkpoint: str) -> tuple[int, Mapping[str, torch.Tensor]]:
    """(step, model state_dict) of the run's selected or last checkpoint.

    Raises RunDirectoryError saying what to do when the run has no such checkpoint.
    """
    if checkpoint not in CHECKPOINTS:
        raise RunDirectoryError(f"unknown checkpoint '{checkpoint}'; valid checkpoints: {', '.join(CHECKPOINTS)}")
    if checkpoint == "selected":
        state = rundir.load_selected()
        if state is None:
            has_last = rundir.load_checkpoint() is not None
            raise RunDirectoryError(
                f"{rundir.path} has no selected checkpoint (selected.pt): the run was made before runs kept one, "
                "or has no validation split"
                + ("; use --checkpoint last for its last checkpoint" if has_last else ", and no checkpoint at all")
            )
        return int(state["step"]), state["model"]
    state = rundir.load_checkpoint()
    if state is None:
        raise RunDirectoryError(f"{rundir.path} has no checkpoint.pt yet: the run has not reached its first checkpoint")
    return int(state["next_step"]) - 1, state["algorithm"]["model"]


def _config_from_args(args: Mapping[str, Any], data_dir: str | None) -> TrainConfig:
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    kwargs = {k: v for k, v in args.items() if k in fields}
    kwargs["data_dir"] = data_dir or args.get("data_dir")
    kwargs["protocol"] = args.get("protocol") or RECORDED_DEFAULT
    kwargs["compile_eval"] = False
    kwargs["device"] = "auto"
    return TrainConfig(**kwargs)


def load_run(
    run_dir: str | Path, checkpoint: str = "selected", data_dir: str | None = None, device: str = "auto"
) -> LoadedRun:
    """The model of `run_dir` at `checkpoint` ('selected' or 'last'), its dataset and splits.

    `data_dir` None: the directory the run was trained from. Reads only; raises
    RunDirectoryError for a directory that is not a run or lacks the checkpoint, and the
    dataset's own DataNotFoundError (the one `train` gives) when its data are missing.
    """
    rundir = RunDirectory(run_dir)
    if not rundir.path.is_dir():
        raise RunDirectoryError(f"{rundir.path} is not a directory; give a run directory (it holds args.json)")
    args = rundir.read_args()
    if args is None:
        raise RunDirectoryError(f"{rundir.path} is not a run directory (no args.json); give one run of a sweep, not the sweep")
    step, weights = read_weights(rundir, checkpoint)
    load_plugins(args.get("plugins") if isinstance(args.get("plugins"), list) else ())  # its algorithm may be one's
    run = resolve(_config_from_args(args, data_dir))
    settings, test_envs = run.settings, run.test_envs
    records = rundir.records()
    hparams = dict(records[0]["hparams"]) if records and isinstance(records[0].get("hparams"), dict) else run.hparams
    dataset = run.dataset_cls(settings.data_dir, test_envs, hparams)
    dataset.eval_round = step  # augmented evaluation draws as training's did at this checkpoint
    fraction = settings.in_domain_test
    splits = split_environments(dataset, settings.holdout_fraction, settings.trial_seed, fraction, test_envs)
    idtest = in_domain_test_splits(dataset, settings.holdout_fraction, settings.trial_seed, fraction,
                                   test_envs) if fraction else None
    n_train = len(splits) - len(test_envs)
    torch_device = resolve_device(device)
    torch.manual_seed(settings.seed)
    algorithm = run.algorithm_cls(dataset.input_shape, dataset.num_classes, n_train, hparams)
    algorithm.load_state_dict(weights)
    algorithm = place_model(algorithm, torch_device, dataset.input_shape)
    algorithm.eval()
    return LoadedRun(
        path=rundir.path,
        args={**args, "data_dir": settings.data_dir},
        hparams=hparams,
        algorithm=algorithm,
        dataset=dataset,
        splits=splits,
        env_domains=training_domains(len(splits), test_envs),
        checkpoint=checkpoint,
        step=step,
        device=torch_device,
        idtest=idtest,
    )


def run_precision(loaded: LoadedRun) -> str:
    """The precision the run trained and evaluated in: what `auto` resolved to where it started
    (`resolved_precision`), else the one it asked for."""
    precision = loaded.args.get("resolved_precision") or loaded.args.get("precision") or "fp32"
    return resolve_precision(precision, loaded.device.type) if precision == "auto" else precision


def evaluate_run(loaded: LoadedRun, precision: str | None = None) -> dict[str, float]:
    """Every environment's in/out accuracy, and the algorithm's test-time modes, as training records them.

    `precision` None: the run's own (`run_precision`)."""
    return evaluate(
        loaded.algorithm,
        loaded.splits,
        loaded.device,
        precision or run_precision(loaded),
        dataset=loaded.dataset,
        env_domains=loaded.env_domains,
        extra={"idtest": loaded.idtest} if loaded.idtest else None,
    )
