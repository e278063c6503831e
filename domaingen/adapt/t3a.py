"""T3A (Iwasawa & Matsuo, NeurIPS 2021): test-time templates adjusted from confident test features."""

from __future__ import annotations

from typing import Any, ClassVar, Mapping

import torch
import torch.nn.functional as F

from domaingen.adapt.base import Adapter, register_adapter, softmax_entropy
from domaingen.algorithms.base import Algorithm


@register_adapter()
class T3A(Adapter):
    """Classify by the cosine to per-class prototypes built from a support set of test features.

    The support set starts as the classifier's weight rows, labelled by the classifier's
    own prediction on them. Each batch's features join it, labelled by the classifier's
    prediction (a one-hot) and ranked by its entropy; then each class keeps its
    `filter_K` lowest-entropy supports (the set stays pruned), and the batch's logits are
    its features times the L2-normalized sums of each class's L2-normalized supports.
    The batch thus joins its own prototypes, and the classifier itself never changes.

    `filter_K` -1 follows the fork's slice `[:-1]`: at every batch each class drops its
    single highest-entropy support (keeping "all" as the fork does), so that results
    match the published code; ties in entropy keep the earlier support.
    """

    GRID: ClassVar[dict[str, list]] = {"filter_K": [1, 5, 20, 50, 100, -1]}
    USES_FEATURES: ClassVar[bool] = True

    def __init__(self, algorithm: Algorithm, hparams: Mapping[str, Any], train_hparams: Mapping[str, Any]) -> None:
        super().__init__(algorithm, hparams, train_hparams)
        self.classifier = algorithm.classifier
        self.num_classes = self.classifier.out_features
        self.filter_k = int(self.hparams["filter_K"])
        with torch.no_grad():
            weights = self.classifier.weight.detach().clone()
            self.supports, self.labels, self.entropy = self._labelled(weights)

    def _labelled(self, features: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        logits = self.classifier(features)
        return features, F.one_hot(logits.argmax(1), self.num_classes).float(), softmax_entropy(logits)

    def _prune(self) -> None:
        predicted = self.labels.argmax(1)
        positions = torch.arange(len(self.entropy))
        kept = []
        for c in range(self.num_classes):
            mine = positions[predicted == c]
            order = torch.sort(self.entropy[mine], stable=True).indices
            kept.append(mine[order][: self.filter_k])
        index = torch.cat(kept)
        self.supports, self.labels, self.entropy = self.supports[index], self.labels[index], self.entropy[index]

    @torch.no_grad()
    def adapt(self, batch: torch.Tensor) -> torch.Tensor:
        features, labels, entropy = self._labelled(batch)
        self.supports = torch.cat([self.supports.to(batch.device), features])
        self.labels = torch.cat([self.labels.to(batch.device), labels])
        self.entropy = torch.cat([self.entropy.to(batch.device), entropy])
        self._prune()
        prototypes = F.normalize(self.supports, dim=1).T @ self.labels
        return batch @ F.normalize(prototypes, dim=0)
