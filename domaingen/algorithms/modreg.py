"""ModReg (Ashok et al., AAAI-22 student abstract): modular-regularization weight masks on top of any algorithm.

`X+ModReg` is X with a Gumbel-sigmoid mask over every Linear and Conv2d weight
of its featurizer and classifier (domaingen.masks), trained jointly with the
weights by X's own optimizers, and with alpha * S1 + beta * S2 added to X's
loss, where for every masked layer and each input feature p, with pi = sigmoid(l):

    S1 = sum_p (sum of pi over the weights leaving p)^2          (specialization)
    S2 = sum_p sqrt(sum of pi^2 over the weights leaving p)      (reuse, a group lasso)

The penalty depends only on the mask logits, so instead of editing X's loss its
gradient is added to the logits' gradients just before each optimizer step that
X takes during `update` (a scoped optimizer step pre-hook). That equals adding
the penalty to every loss X backpropagates before a step, for any X: ERM's one
step, IRM's re-created Adam, Fish's inner steps on its cloned network,
SAND-mask's hand-set gradients.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn
from torch.optim.optimizer import register_optimizer_step_pre_hook

from domaingen.algorithms.base import ALGORITHMS, Algorithm, FeaturizerClassifier, Minibatches
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform
from domaingen.masks import (
    add_weight_masks,
    masked_layers,
    outgoing_sums,
    reuse_penalty,
    specialization_penalty,
    subnetwork_stats,
)

MODIFIER = "ModReg"


def penalty_and_gradient(logits: torch.Tensor, alpha: float, beta: float) -> tuple[float, float, torch.Tensor]:
    """(S1, S2, d(alpha * S1 + beta * S2)/d logits) of one layer, in closed form (no autograd graph).

    With pi = sigmoid(l) and a weight (o, p, ...) leaving input feature p:
    dS1/dl = 2 * (sum of pi leaving p) * pi (1 - pi);
    dS2/dl = pi * pi (1 - pi) / sqrt(sum of pi^2 leaving p).
    """
    with torch.no_grad():
        pi = torch.sigmoid(logits.to(torch.promote_types(logits.dtype, torch.float32)))
        shape = [1, -1] + [1] * (logits.dim() - 2)
        sums = outgoing_sums(pi)
        norms = outgoing_sums(pi.square()).sqrt()
        # one fused coefficient per input feature, then a single pass over the weights
        coefficient = (2 * alpha) * sums.view(shape) + beta * pi / norms.clamp_min(1e-12).view(shape)
        grad = coefficient.mul_(pi).mul_(1 - pi)
        return float(sums.square().sum()), float(norms.sum()), grad.to(logits.dtype)


def penalty_gradient(logits: torch.Tensor, alpha: float, beta: float) -> torch.Tensor:
    """d(alpha * S1 + beta * S2)/d logits for one layer (see `penalty_and_gradient`)."""
    return penalty_and_gradient(logits, alpha, beta)[2]


class ModRegMixin:
    """Adds weight masks and the S1/S2 penalty to a FeaturizerClassifier; see the module docstring."""

    HPARAMS = {
        "modreg_alpha": HParam(1e-7, log_uniform(-9, -5), "weight of S1, the specialization penalty"),
        "modreg_beta": HParam(1e-3, log_uniform(-5, -1), "weight of S2, the reuse (group lasso) penalty"),
        "modreg_groups": HParam(4, help="mask samples per batch (the batch is cut into this many groups)"),
        "modreg_init_logit": HParam(2.0, help="initial mask logit (2.0 keeps a weight with probability 0.88)"),
        "modreg_mask_bias": HParam(False, help="mask biases too (they are never in S1/S2)"),
    }

    # grouped convolutions over a batch cut into groups are free views of NCHW tensors, not of channels-last ones
    prefers_channels_last = False
    hparams: dict[str, Any]
    featurizer: nn.Module
    classifier: nn.Module

    def prepare_modules(self) -> None:
        super().prepare_modules()  # type: ignore[misc]
        for key in ("modreg_alpha", "modreg_beta"):
            if not float(self.hparams[key]) >= 0:
                raise DomaingenError(f"{key} must be >= 0 (it weighs a penalty), got {self.hparams[key]}")
        add_weight_masks(
            nn.ModuleDict({"featurizer": self.featurizer, "classifier": self.classifier}),
            groups=int(self.hparams["modreg_groups"]),
            init_logit=float(self.hparams["modreg_init_logit"]),
            mask_bias=bool(self.hparams["modreg_mask_bias"]),
        )

    def mask_layers(self) -> list[tuple[str, nn.Module]]:
        """The masked layers of the model being trained, named featurizer.* / classifier.*."""
        return masked_layers(nn.ModuleDict({"featurizer": self.featurizer, "classifier": self.classifier}))

    def modreg_penalties(self) -> tuple[float, float]:
        """(S1, S2) summed over the masked layers of the model being trained."""
        with torch.no_grad():
            layers = [layer for _, layer in self.mask_layers()]
            s1 = sum(float(specialization_penalty(layer.mask_logits)) for layer in layers)
            s2 = sum(float(reuse_penalty(layer.mask_logits)) for layer in layers)
        return s1, s2

    @contextlib.contextmanager
    def _penalised_steps(self) -> Iterator[None]:
        alpha, beta = float(self.hparams["modreg_alpha"]), float(self.hparams["modreg_beta"])
        # every masked layer this algorithm owns, Fish's inner clone included
        logits = {
            id(m.mask_logits): m.mask_logits for m in self.modules() if hasattr(m, "mask_logits")  # type: ignore[attr-defined]
        }

        def add_penalty_gradient(optimizer: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            s1 = s2 = 0.0
            for group in optimizer.param_groups:
                for param in group["params"]:
                    if id(param) in logits and param is logits[id(param)]:
                        layer_s1, layer_s2, extra = penalty_and_gradient(param, alpha, beta)
                        param.grad = extra if param.grad is None else param.grad.add_(extra)
                        s1, s2 = s1 + layer_s1, s2 + layer_s2
            if s1 or s2:
                self._last_penalties = (s1, s2)  # the values the step used, for the log

        handle = register_optimizer_step_pre_hook(add_penalty_gradient)
        try:
            yield
        finally:
            handle.remove()

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        self._last_penalties: tuple[float, float] | None = None
        with self._penalised_steps():
            losses = super().update(minibatches)  # type: ignore[misc]
        s1, s2 = self._last_penalties or self.modreg_penalties()
        alpha, beta = float(self.hparams["modreg_alpha"]), float(self.hparams["modreg_beta"])
        return {**losses, "modreg_penalty": alpha * s1 + beta * s2, "modreg_s1": s1, "modreg_s2": s2}

    def diagnostics(self) -> dict[str, Any]:
        """Per masked layer: kept-weight fraction, and input features that keep any outgoing weight."""
        fields: dict[str, Any] = dict(super().diagnostics())  # type: ignore[misc]
        kept = total = 0
        for name, layer in self.mask_layers():
            stats = subnetwork_stats(layer)
            fields[f"modreg_{name}_kept_fraction"] = stats.kept_fraction
            fields[f"modreg_{name}_inputs_kept"] = stats.inputs_kept
            fields[f"modreg_{name}_inputs_total"] = stats.inputs_total
            kept += stats.kept_fraction * layer.mask_logits.numel()
            total += layer.mask_logits.numel()
        fields["modreg_kept_fraction"] = kept / total
        return fields


def with_modreg(base: type[Algorithm]) -> type[Algorithm]:
    """The class `BASE+ModReg`: ModRegMixin in front of `base` in the MRO."""
    if not issubclass(base, FeaturizerClassifier):
        raise DomaingenError(
            f"ModReg needs an algorithm built on FeaturizerClassifier (a featurizer and a classifier); "
            f"{base.__name__} is not"
        )
    return type(f"{base.__name__}ModReg", (ModRegMixin, base), {"__doc__": f"{base.__name__} + ModReg weight masks."})


ALGORITHMS.register_modifier(MODIFIER, with_modreg)
