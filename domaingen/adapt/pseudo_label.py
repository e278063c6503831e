"""Pseudo-labelling and SHOT (Liang et al., ICML 2020) as test-time adapters, as the T3A fork runs them."""

from __future__ import annotations

from typing import ClassVar

import torch
from torch import nn

from domaingen.adapt.base import GradientAdapter, confident_cross_entropy, information_maximization, register_adapter


@register_adapter()
class PseudoLabel(GradientAdapter):
    """Every weight of the algorithm takes `gamma` Adam steps per batch on the cross-entropy of the
    batch's confident predictions (top softmax probability above `beta`) against themselves."""

    GRID: ClassVar[dict[str, list]] = {"alpha": [0.1, 1.0, 10.0], "gamma": [1, 3], "beta": [0.9]}

    def prepare_parameters(self) -> list[nn.Parameter]:
        return list(self.model.parameters())

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        return confident_cross_entropy(logits, float(self.hparams["beta"]))


@register_adapter()
class PLClf(PseudoLabel):
    """PseudoLabel on the classifier only, on each batch of features."""

    USES_FEATURES: ClassVar[bool] = True

    def prepare_parameters(self) -> list[nn.Parameter]:
        return list(self.model.classifier.parameters())


@register_adapter()
class SHOT(GradientAdapter):
    """SHOT: the featurizer (the classifier frozen, as the hypothesis) takes `gamma` Adam steps per
    batch on information maximization plus `theta` times PseudoLabel's confident cross-entropy."""

    GRID: ClassVar[dict[str, list]] = {"alpha": [0.1, 1.0, 10.0], "gamma": [1, 3], "beta": [0.9], "theta": [0.1]}

    def prepare_parameters(self) -> list[nn.Parameter]:
        return list(self.model.featurizer.parameters())

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        pseudo = confident_cross_entropy(logits, float(self.hparams["beta"]))
        return information_maximization(logits) + float(self.hparams["theta"]) * pseudo


@register_adapter()
class SHOTIM(SHOT):
    """SHOT's information maximization alone, on the featurizer."""

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        return information_maximization(logits)
