"""Representation self-challenging, RSC (Huang et al., ECCV 2020)."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, uniform


def true_class_logit(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each example's logit of its own class; for one logit, the signed logit (2y - 1) * z."""
    if logits.shape[1] == 1:
        return (2 * y.to(logits.dtype) - 1) * logits[:, 0]
    return logits.gather(1, y.view(-1, 1))[:, 0]


def true_class_probability(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each example's predicted probability of its own class (softmax, or sigmoid of the signed logit)."""
    if logits.shape[1] == 1:
        return torch.sigmoid(true_class_logit(logits, y))
    return torch.softmax(logits, dim=1).gather(1, y.view(-1, 1))[:, 0]


@ALGORITHMS.register("RSC")
class RSC(FeaturizerClassifier):
    """Cross-entropy of the classifier on features with their most predictive units muted.

    Per example, the features whose gradient of the true-class logit lies at or above the
    (1 - rsc_f_drop_factor) quantile are muted (Eq. 1-3); the muting is kept only for the
    rsc_b_drop_factor fraction of examples whose true-class probability drops most under
    it (Sec. 3.3), and the loss is the cross-entropy of the classifier on the muted
    features (Eq. 5). Quantiles interpolate linearly (torch.quantile), as DomainBed's
    np.percentile does. Nothing is drawn at random: like DomainBed, this drops by
    percentile on the pooled features (the paper's code also picks spatial or channel
    dropping at random on feature maps, which a featurizer ending in a vector lacks).
    """

    HPARAMS = {
        "rsc_f_drop_factor": HParam(1 / 3, uniform(0, 0.5), "fraction of feature units muted per example"),
        "rsc_b_drop_factor": HParam(1 / 3, uniform(0, 0.5), "fraction of examples whose features are muted"),
    }

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        for key in ("rsc_f_drop_factor", "rsc_b_drop_factor"):
            if not 0 <= float(hparams[key]) <= 1:
                raise DomaingenError(f"{key} must be in [0, 1] (a fraction), got {hparams[key]}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        features = self.featurizer(x)
        logits = self.classifier(features)
        grads = torch.autograd.grad(true_class_logit(logits, y).sum(), features)[0].float()
        keep_f = 1.0 - float(self.hparams["rsc_f_drop_factor"])
        keep_b = 1.0 - float(self.hparams["rsc_b_drop_factor"])
        feature_mask = grads < torch.quantile(grads, keep_f, dim=1, keepdim=True)
        with torch.no_grad():
            muted_logits = self.classifier(features * feature_mask.to(features.dtype))
            drop = (true_class_probability(logits, y) - true_class_probability(muted_logits, y)).float()
            example_unmuted = drop < torch.quantile(drop, keep_b)
        mask = feature_mask | example_unmuted.view(-1, 1)
        loss = classification_loss(self.classifier(features * mask.to(features.dtype)), y)
        self.step(loss)
        return {"loss": loss.item()}
