"""A shared initialisation per trial (`shared_init`), and the linear probe that makes it (`linear_probe`).

DiWA (Ramé et al., NeurIPS 2022) averages the weights of runs that start from one
initialisation: per trial, a linear probe first (the network's classifier trained by
cross-entropy on the training domains, everything else frozen, at the default
hyperparameters), then every hyperparameter draw fine-tunes the whole network from it.

Under `shared_init = "linear_probe"` a run first makes (or resumes, or finds done) the probe of
its trial, a run directory of its own under `shared_init/` beside the run: the same dataset,
algorithm, test environments, trial, steps and splits, hparams draw 0, `linear_probe` on. The
probe runs once per trial: a second draw of the trial waits for its lock and finds it done.
The run loads the probe's last weights before its first step and records their identity,
`shared_init_id` (`state_id`), in every record, so that averaging can check that its runs share it.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping

import torch
from torch import nn

from domaingen.algorithms.base import Algorithm, classification_loss, concat, make_adam
from domaingen.errors import DomaingenError
from domaingen.run.runlock import RunLockedError, run_lock
from domaingen.run.rundir import RunDirectory
from domaingen.run.settings import job_identity

if TYPE_CHECKING:  # run.training imports this module
    from domaingen.datasets.cache import DatasetCache
    from domaingen.run.training import ResolvedRun

log = logging.getLogger(__name__)

SHARED_INIT_CHOICES = ("linear_probe",)
PROBE_DIR = "shared_init"  # beside the runs: collect reads no run from it
INIT_FIELD = "shared_init_id"  # the record field naming the initialisation a run started from
WAIT_SECONDS = 2.0


def state_id(state: Mapping[str, torch.Tensor]) -> str:
    """A hash of a state_dict's names, dtypes, shapes and values (16 hex digits)."""
    digest = hashlib.sha256()
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)};".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


def prepare_linear_probe(algorithm: Algorithm) -> None:
    """Freeze everything but `algorithm.classifier` and give it an optimizer of its own (`probe_optimizer`,
    saved and resumed with the run's checkpoints as every optimizer attribute is)."""
    classifier = getattr(algorithm, "classifier", None)
    if not isinstance(classifier, nn.Module):
        raise DomaingenError(f"{type(algorithm).__name__} has no `classifier` module to probe; "
                             "use linear_probe / shared_init with an algorithm that has one (ERM)")
    head = {id(p) for p in classifier.parameters()}
    for p in algorithm.parameters():
        p.requires_grad_(id(p) in head)
    algorithm.probe_optimizer = make_adam(classifier, algorithm.hparams)


def linear_probe_update(algorithm: Algorithm, minibatches) -> dict[str, float]:
    """One step of the linear probe: cross-entropy of `predict` over every environment's minibatch,
    stepping the classifier only (DiWA's ERM with its optimizer over the classifier)."""
    x, y = concat(minibatches)
    loss = classification_loss(algorithm.predict(x), y)
    algorithm.probe_optimizer.zero_grad(set_to_none=True)
    loss.backward()
    algorithm.probe_optimizer.step()
    return {"loss": loss.item()}


def probe_config(run: "ResolvedRun") -> Any:
    """The TrainConfig of the linear probe that `run` (with shared_init) starts from."""
    from domaingen.run.training import SETTINGS, TrainConfig

    values = {item.name: getattr(run.settings, item.name) for item in SETTINGS}
    values.update(hparams_seed=0, seed=None, shared_init=None, linear_probe=True, train_in_every=None,
                  time_budget=None, loggers=[])
    name = hashlib.md5(json.dumps(job_identity(SETTINGS, values), sort_keys=True, default=list).encode()).hexdigest()
    values["output_dir"] = str(Path(run.settings.output_dir).parent / PROBE_DIR / name)
    return TrainConfig(**values)


def shared_initialisation(run: "ResolvedRun", dataset_cache: "DatasetCache | None" = None
                          ) -> tuple[dict[str, torch.Tensor], str]:
    """(the weights `run` starts from, their `state_id`): the last checkpoint of its trial's linear
    probe, trained here first unless done (another process training it is waited for)."""
    from domaingen.run.training import train

    config = probe_config(run)
    while True:
        try:
            with run_lock(config.output_dir):
                train(config, dataset_cache)
            break
        except RunLockedError:
            time.sleep(WAIT_SECONDS)
    state = RunDirectory(config.output_dir).load_checkpoint()
    if state is None:  # pragma: no cover - a done run always has its last checkpoint
        raise DomaingenError(f"the linear probe {config.output_dir} has no checkpoint; delete it and rerun")
    weights = state["algorithm"]["model"]
    return weights, state_id(weights)


def load_initialisation(algorithm: Algorithm, weights: Mapping[str, torch.Tensor], run: "ResolvedRun") -> None:
    """Load the shared initialisation into `algorithm`; one line when this draw's model does not fit it."""
    try:
        algorithm.load_state_dict(weights)
    except RuntimeError as exc:
        first = str(exc).strip().splitlines()
        raise DomaingenError(
            f"the shared initialisation does not fit hparams draw {run.settings.hparams_seed} of "
            f"{run.settings.algorithm} ({first[1].strip() if len(first) > 1 else first[0]}); shared_init needs "
            "draws of one architecture: fix the hyperparameters that change it (--hparams)") from None

