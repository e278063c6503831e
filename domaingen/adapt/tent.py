"""Tent (Wang et al., ICLR 2021) and the T3A fork's variants: entropy minimization at test time."""

from __future__ import annotations

import copy
from typing import Any, ClassVar, Mapping

import torch
from torch import nn

from domaingen.adapt.base import Adapter, GradientAdapter, register_adapter, softmax_entropy, use_batch_statistics
from domaingen.algorithms.base import Algorithm


@register_adapter()
class TentFull(GradientAdapter):
    """Tent: the featurizer's BatchNorm layers normalize with each test batch's statistics and their
    affine parameters take `gamma` Adam steps on the mean prediction entropy of each batch."""

    NEEDS_BATCH_NORM: ClassVar[bool] = True

    def prepare_parameters(self) -> list[nn.Parameter]:
        return use_batch_statistics(self.model.featurizer)

    def loss(self, logits: torch.Tensor) -> torch.Tensor:
        return softmax_entropy(logits).mean(0)


@register_adapter()
class TentNorm(Adapter):
    """Test-batch normalization: TentFull's BatchNorm on batch statistics, without any update.

    Its grid is a single point: the fork searches TentFull's alpha and gamma for it,
    which never act (it takes no step), so every point gives the same predictions.
    """

    NEEDS_BATCH_NORM: ClassVar[bool] = True

    def __init__(self, algorithm: Algorithm, hparams: Mapping[str, Any], train_hparams: Mapping[str, Any]) -> None:
        super().__init__(algorithm, hparams, train_hparams)
        self.model = copy.deepcopy(algorithm).eval()
        use_batch_statistics(self.model.featurizer)

    @torch.no_grad()
    def adapt(self, batch: torch.Tensor) -> torch.Tensor:
        return self.model.predict(batch)


class PreBN(nn.Module):
    """A fresh BatchNorm1d on the features (batch statistics, affine 1 and 0), then the classifier."""

    def __init__(self, classifier: nn.Linear) -> None:
        super().__init__()
        self.bn = nn.BatchNorm1d(classifier.in_features, track_running_stats=False)
        self.classifier = classifier

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.classifier(self.bn(features))


@register_adapter()
class TentPreBN(TentFull):
    """Tent-BN: a BatchNorm1d inserted before the classifier, on batch statistics; only its affine
    parameters train, on the entropy of each batch of features. Needs no BatchNorm in the network."""

    USES_FEATURES: ClassVar[bool] = True
    NEEDS_BATCH_NORM: ClassVar[bool] = False

    def prepare_parameters(self) -> list[nn.Parameter]:
        self.model.requires_grad_(False)
        self.model.classifier = PreBN(self.model.classifier).to(self.model.classifier.weight.device).eval()
        return list(self.model.classifier.bn.parameters())


@register_adapter()
class TentClf(TentFull):
    """Tent-C: the classifier's weights and bias take the entropy steps, on each batch of features."""

    USES_FEATURES: ClassVar[bool] = True
    NEEDS_BATCH_NORM: ClassVar[bool] = False

    def prepare_parameters(self) -> list[nn.Parameter]:
        return list(self.model.classifier.parameters())
