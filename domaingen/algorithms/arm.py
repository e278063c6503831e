"""Adaptive risk minimization, ARM-CML (Zhang et al., NeurIPS 2021)."""

from __future__ import annotations

import torch
from torch import nn

from domaingen.algorithms.base import (ALGORITHMS, DOMAINBED_EVAL_BATCH_SIZE, FeaturizerClassifier, Minibatches,
                                      classification_loss, concat, make_adam)
from domaingen.hparams import HParam, by_dataset, int_pow2_uniform
from domaingen.networks import build_context_net


@ALGORITHMS.register("ARM")
class ARM(FeaturizerClassifier):
    """ERM on f(x, c), with c the mean of a context network's outputs over x's support set.

    The support set of an example is its block of `batch_size` consecutive examples (one
    training environment's minibatch); a batch whose length is not a multiple of
    `batch_size` is one support set. Images get the context as extra channels, flat
    inputs as extra features. The context network is taken from
    networks.CONTEXT_NETS (`arm_context_net`; auto: ARM_CNN for images, ARM_MLP otherwise).

    Departs from DomainBed: DomainBed builds its Adam over the featurizer and classifier
    before it creates the context network, so its context network is never trained and
    stays at its random initialisation (its BatchNorm statistics still move). ARM trains
    the two jointly (the paper's objective); `arm_train_context: false` reproduces
    DomainBed, whose published ARM numbers were obtained so.

    Evaluation cuts support sets as DomainBed's does: batches of 64, the last one short
    (EVAL_BATCH_SIZE). Which examples share a batch differs: DomainBed's evaluation loader
    draws a new random order at every evaluation, domaingen takes the split's own seeded
    (already shuffled) order, the same at every checkpoint.
    """

    HPARAMS = {
        "batch_size": by_dataset(
            HParam(8, help="examples per training environment per step (ARM's support size)"),
            ("small_images", HParam(64, int_pow2_uniform(3, 9), "examples per training environment per step")),
        ),
        "arm_context_net": HParam("auto", help="context network in networks.CONTEXT_NETS (auto: ARM_CNN / ARM_MLP)"),
        "arm_train_context": HParam(True, help="train the context network (false: DomainBed's frozen one)"),
    }
    # At test time a support set is a block of `batch_size` examples of an evaluation batch, or
    # the whole batch when `batch_size` does not divide it: evaluate in DomainBed's batches of 64,
    # unpadded, so that each context averages over as many examples as DomainBed's does.
    EVAL_BATCH_SIZE = DOMAINBED_EVAL_BATCH_SIZE

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        original = tuple(input_shape)
        context_net = build_context_net(original, hparams, str(hparams.get("arm_context_net", "auto")))
        widened = (original[0] + context_net.out_channels, *original[1:])
        super().__init__(widened, num_classes, num_domains, hparams)
        self.input_shape = original
        self.context_net = context_net
        self.support_size = int(self.hparams["batch_size"])
        if self.hparams.get("arm_train_context", True):
            self.optimizer = make_adam(nn.ModuleDict({"network": self.network, "context_net": self.context_net}),
                                       self.hparams)

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        n = len(x)
        support = self.support_size if n % self.support_size == 0 else n
        context = self.context_net(x)
        context = context.reshape(n // support, support, *context.shape[1:]).mean(dim=1)
        context = context.repeat_interleave(support, dim=0)
        return self.network(torch.cat([x, context.to(x.dtype)], dim=1))

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        loss = classification_loss(self.predict(x), y)
        self.step(loss)
        return {"loss": loss.item()}
