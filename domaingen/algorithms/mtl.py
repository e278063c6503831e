"""MTL: marginal transfer learning (Blanchard et al., "Domain Generalization by Marginal
Transfer Learning", JMLR 2021), in DomainBed's neural form.

The classifier sees each example's features next to an embedding of its domain's
marginal distribution, the mean feature of the domain's minibatch; the loss is the
sum over training domains of their cross-entropies. In training, domain d's
embedding is e_d <- mtl_ema * mean(features of the batch) + (1 - mtl_ema) * e_d
(so mtl_ema = 1 keeps no memory); gradients flow through the batch mean, not
through the stored e_d. At test time, without a domain, the embedding is the mean
feature of the batch being predicted (the test domain's marginal); with a
training-domain index d, it is the stored e_d.

DomainBed's class fills the embedding with standard normal noise before the
classifier sees it (an in-place `normal_()` on it, facebookresearch/DomainBed
issue #159), so its classifier never sees the domain embedding, in training or at
test time. The default here is the paper's method, mtl_embedding = "mean";
"noise" reproduces DomainBed's class (its published MTL numbers), with the same
torch draws in the same order.

Test-time predictions depend on the whole batch (its mean feature), as in the
paper and DomainBed: the batch size of evaluation, and padding a batch, change them.
"""

from __future__ import annotations

from typing import Mapping

import torch

from domaingen.algorithms.base import (ALGORITHMS, DOMAINBED_EVAL_BATCH_SIZE, FeaturizerClassifier, Minibatches,
                                      classification_loss)
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, choice
from domaingen.networks import build_classifier

EMBEDDINGS = ("mean", "noise")


@ALGORITHMS.register("MTL")
class MTL(FeaturizerClassifier):
    """Sum over domains of CE(classifier([features, EMA of the domain's mean feature]), y)."""

    HPARAMS = {
        "mtl_ema": HParam(0.99, choice([0.5, 0.9, 0.99, 1.0]), "weight of the new batch mean in the domain embedding's EMA"),
        "mtl_embedding": HParam("mean", help="mean (the paper: the domain's mean feature) or noise (DomainBed's code: N(0, 1) noise)"),
    }
    # At test time the embedding is the evaluation batch's mean feature: evaluate in DomainBed's
    # batches of 64, unpadded, so the predictions are those of DomainBed's protocol.
    EVAL_BATCH_SIZE = DOMAINBED_EVAL_BATCH_SIZE

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.register_buffer("embeddings", torch.zeros(num_domains, self.featurizer.n_outputs))

    @classmethod
    def check_hparams(cls, hparams: Mapping) -> None:
        super().check_hparams(hparams)
        ema = hparams.get("mtl_ema", 0.99)
        if not 0 <= float(ema) <= 1:
            raise DomaingenError(f"mtl_ema must be in [0, 1] (an EMA weight), got {ema}")
        embedding = hparams.get("mtl_embedding", "mean")
        if embedding not in EMBEDDINGS:
            raise DomaingenError(f"mtl_embedding must be one of {', '.join(EMBEDDINGS)}, got {embedding!r}")

    def prepare_modules(self) -> None:
        # the classifier reads the features and the domain embedding side by side
        self.classifier = build_classifier(
            2 * self.featurizer.n_outputs,
            self.num_classes,
            single_logit=bool(self.hparams.get("single_logit", False)),
            init=getattr(self.featurizer, "head_init", "default"),
        )
        super().prepare_modules()

    def classify(self, features: torch.Tensor, embedding: torch.Tensor) -> torch.Tensor:
        """Logits of `features` next to `embedding` (one row for all, or one per example;
        replaced by noise in "noise" mode)."""
        rows = embedding.expand(len(features), -1)
        if self.hparams["mtl_embedding"] == "noise":
            rows = torch.empty_like(features).normal_()
        return self.classifier(torch.cat([features, rows.to(features.dtype)], 1))

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        ema = float(self.hparams["mtl_ema"])
        loss = 0.0
        # domain by domain, featurizer pass then classifier, as DomainBed: the same rounding, and
        # in "noise" mode the same order of torch draws as its class (dropout, noise, dropout, ...)
        for domain, (x, y) in enumerate(minibatches):
            z = self.featurizer(x)
            embedding = ema * z.mean(0) + (1 - ema) * self.embeddings[domain]
            self.embeddings[domain] = embedding.detach()
            loss = loss + classification_loss(self.classify(z, embedding), y)
        self.step(loss)
        return {"loss": loss.item()}

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        features = self.featurizer(x)
        if domain is None:
            return self.classify(features, features.mean(0))
        index = torch.as_tensor(domain, device=self.embeddings.device).long()
        return self.classify(features, self.embeddings[index])
