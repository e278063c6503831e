"""Shared logic of penalty methods whose weight switches on after an annealing period."""

from __future__ import annotations

import torch

from domaingen.algorithms.base import FeaturizerClassifier, make_adam


class AnnealedPenalty(FeaturizerClassifier):
    """Penalty weight 1 for the first `anneal_iters` updates, then `lambda`.

    Adam is re-created at the switch, as in DomainBed, because the loss scale
    jumps and the old moment estimates no longer fit it.
    """

    LAMBDA_KEY = ""
    ANNEAL_KEY = ""

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))

    def penalty_weight(self) -> float:
        if self.update_count.item() >= self.hparams[self.ANNEAL_KEY]:
            return float(self.hparams[self.LAMBDA_KEY])
        return 1.0

    def step(self, loss: torch.Tensor) -> None:
        if self.update_count.item() == self.hparams[self.ANNEAL_KEY]:
            self.optimizer = make_adam(self.network.parameters(), self.hparams)
        super().step(loss)
        self.update_count += 1
