"""A shared initialisation per trial (`shared_init`), and the linear probe that makes it (`linear_probe`).

DiWA (Ramé et al., NeurIPS 2022) averages the weights of runs that start from one
initialisation: per trial, a linear probe first (the network's classifier trained by
cross-entropy on the training domains, everything else frozen, at the default
hyperparameters), then every hyperparameter draw fine-tunes the whole network from it.

Under `shared_init = "linear_probe"` a run first makes (or resumes, or finds done) the probe of
its trial, a run directory of its own under `shared_init/` beside the run: the same dataset,
algorithm, test environments, trial, steps and splits, hparams draw 0, `linear_probe` on. The
probe runs once per trial: a second draw of the trial waits for its lock and finds it done
(run.training.shared_initialisation).
The run loads the probe's last weights before its first step and records their identity,
`shared_init_id` (`state_id`), in every record, so that averaging can check that its runs share it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Mapping

import torch
from torch import nn

from domaingen.algorithms.base import Algorithm, classification_loss, concat, make_adam
from domaingen.errors import DomaingenError

if TYPE_CHECKING:  # run.training imports this module
    from domaingen.run.training import ResolvedRun

SHARED_INIT_CHOICES = ("linear_probe",)
PROBE_DIR = "shared_init"  # beside the runs: collect reads no run from it
INIT_FIELD = "shared_init_id"  # the record field naming the initialisation a run started from


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

