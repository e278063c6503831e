"""The adapter contract, the adapter table, and the pieces the adapters share.

An adapter adapts a trained algorithm online to a stream of unlabeled batches of one
domain and returns its logits for each batch as it goes. It is built fresh for every
split it adapts to (the T3A fork resets its adapters between splits), from the
algorithm's selected weights, one of its hyperparameter points (`GRID`, the fork's
grids) and the run's training hyperparameters (`lr`, `weight_decay`: the Tent family,
pseudo-labels and SHOT take Adam with `lr * alpha`, as the fork does).

An adapter whose `USES_FEATURES` is True reads featurizer outputs computed once with
the featurizer in eval mode (the fork's "cached loader": T3A, TentPreBN, TentClf,
PLClf); the others read the inputs and run the algorithm's `predict`.
"""

from __future__ import annotations

import copy
import itertools
from typing import Any, Callable, ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import Algorithm
from domaingen.errors import DomaingenError
from domaingen.registry import Registry

ADAPTERS: Registry[type["Adapter"]] = Registry("adapter")


def register_adapter(name: str | None = None) -> Callable[[type["Adapter"]], type["Adapter"]]:
    """Class decorator: add an Adapter subclass to ADAPTERS under `name` (default: its class name).
    A name taken already raises NameClashError."""
    return ADAPTERS.register(name)


def adapter_class(name: str) -> type["Adapter"]:
    """The adapter registered as `name` (any case); an unknown name raises one line listing the valid ones."""
    return ADAPTERS.get(name)


def softmax_entropy(logits: torch.Tensor) -> torch.Tensor:
    """Per row, the entropy of softmax(logits)."""
    return -(logits.softmax(1) * logits.log_softmax(1)).sum(1)


def grid_points(grid: Mapping[str, list]) -> list[dict[str, Any]]:
    """Every combination of a grid's values, the last name varying fastest (itertools.product's order)."""
    return [dict(zip(grid, values)) for values in itertools.product(*grid.values())]


def confident_cross_entropy(logits: torch.Tensor, threshold: float) -> torch.Tensor:
    """Cross-entropy of the rows whose top softmax probability exceeds `threshold`, against their own
    argmax; 0 (with zero gradients, as the empty mean's) when no row does."""
    top, label = logits.softmax(1).max(1)
    keep = top > threshold
    if not bool(keep.any()):
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep], label[keep])


def information_maximization(logits: torch.Tensor) -> torch.Tensor:
    """SHOT's IM loss: mean per-row entropy minus the entropy of the mean prediction (with SHOT's 1e-5)."""
    mean = logits.softmax(1).mean(0)
    return softmax_entropy(logits).mean(0) + torch.sum(mean * torch.log(mean + 1e-5))


def batch_norms(module: nn.Module) -> list[nn.Module]:
    """The BatchNorm layers (1d, 2d, 3d) of `module`."""
    return [m for m in module.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]


def use_batch_statistics(module: nn.Module) -> list[nn.Parameter]:
    """Tent's configuration: every BatchNorm of `module` normalizes with the batch's statistics (its
    running statistics dropped) and only their affine parameters train; returns those parameters."""
    module.requires_grad_(False)
    params = []
    for norm in batch_norms(module):
        norm.track_running_stats = False
        norm.running_mean = None
        norm.running_var = None
        for name, p in norm.named_parameters(recurse=False):
            if name in ("weight", "bias"):
                p.requires_grad_(True)
                params.append(p)
    return params


class Adapter(nn.Module):
    """A test-time adaptation method (see the module docstring).

    Subclasses declare `GRID` (hyperparameter -> the values searched), `USES_FEATURES`,
    and implement `adapt(batch) -> logits`; `check(algorithm)` refuses an algorithm the
    method is undefined for, in one line.
    """

    GRID: ClassVar[dict[str, list]] = {}
    USES_FEATURES: ClassVar[bool] = False
    NEEDS_BATCH_NORM: ClassVar[bool] = False  # it adapts the featurizer's own BatchNorm layers

    def __init__(self, algorithm: Algorithm, hparams: Mapping[str, Any], train_hparams: Mapping[str, Any]) -> None:
        super().__init__()
        self.check(algorithm)
        self.hparams = dict(hparams)
        self.train_hparams = dict(train_hparams)

    @classmethod
    def check(cls, algorithm: Algorithm) -> None:
        """Raise DomaingenError when the method is undefined for `algorithm`: it needs a `featurizer` and
        a linear `classifier` with one row per class (what the fork's adapters read), and BatchNorm
        layers in the featurizer when NEEDS_BATCH_NORM."""
        name = cls.__name__
        featurizer, classifier = getattr(algorithm, "featurizer", None), getattr(algorithm, "classifier", None)
        if not isinstance(featurizer, nn.Module) or not isinstance(classifier, nn.Linear):
            raise DomaingenError(f"{name} adapts a featurizer and a linear classifier; {type(algorithm).__name__} "
                                 "has no such pair (adapt an algorithm built on them, e.g. ERM, IRM, CORAL)")
        if classifier.out_features < 2:
            raise DomaingenError(f"{name} is undefined for a one-logit classifier; adapt a run trained without "
                                 "single_logit")
        if cls.NEEDS_BATCH_NORM and not batch_norms(featurizer):
            raise DomaingenError(
                f"{name} adapts the featurizer's BatchNorm layers and {type(featurizer).__name__} has none; adapt a "
                "run with a BatchNorm featurizer (a ResNet), or use TentPreBN, which adds its own")

    def optimizer(self, params) -> torch.optim.Optimizer:
        """Adam at the run's lr times `alpha`, with the run's weight decay (the fork's optimizer)."""
        lr = float(self.train_hparams["lr"]) * float(self.hparams["alpha"])
        return torch.optim.Adam(params, lr=lr, weight_decay=float(self.train_hparams.get("weight_decay", 0.0)))

    def adapt(self, batch: torch.Tensor) -> torch.Tensor:
        """Adapt on one unlabeled batch (features or inputs, see USES_FEATURES); its logits."""
        raise NotImplementedError


class GradientAdapter(Adapter):
    """An adapter that takes `gamma` Adam steps on each batch, on a copy of the algorithm.

    The logits it returns for a batch are those of its last forward pass, computed
    before the last step (the fork's order: predict, then update).
    """

    GRID: ClassVar[dict[str, list]] = {"alpha": [0.1, 1.0, 10.0], "gamma": [1, 3]}

    def __init__(self, algorithm: Algorithm, hparams: Mapping[str, Any], train_hparams: Mapping[str, Any]) -> None:
        super().__init__(algorithm, hparams, train_hparams)
        self.model = copy.deepcopy(algorithm).eval()
        self.opt = self.optimizer(self.prepare_parameters())

    def prepare_parameters(self) -> list[nn.Parameter]:
        """Set up the copied model (`self.model`) for adaptation; the parameters its Adam updates."""
        raise NotImplementedError

    def forward_logits(self, batch: torch.Tensor) -> torch.Tensor:
        """Logits of `batch`: the classifier on features, else the algorithm's predict on inputs."""
        return self.model.classifier(batch) if self.USES_FEATURES else self.model.predict(batch)

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        """The unsupervised loss minimized on each batch."""
        raise NotImplementedError

    def adapt(self, batch: torch.Tensor) -> torch.Tensor:
        logits = batch
        with torch.enable_grad():
            for _ in range(int(self.hparams["gamma"])):
                self.opt.zero_grad()
                logits = self.forward_logits(batch)
                self.loss(logits).backward()
                self.opt.step()
        return logits.detach()
