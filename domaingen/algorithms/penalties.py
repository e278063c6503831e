"""Shared logic of penalty methods whose weight switches on after an annealing period."""

from __future__ import annotations

import torch

from domaingen.algorithms.base import FeaturizerClassifier, make_adam
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam

SCHEDULES = ("domainbed", "irm_paper")


class AnnealedPenalty(FeaturizerClassifier):
    """Penalty weight 1 for the first `anneal_iters` updates, then `lambda`.

    `penalty_schedule` says what happens at the switch:
    - "domainbed": Adam is re-created, because the loss scale jumps and the old
      moment estimates no longer fit it;
    - "irm_paper" (the IRM paper's code): Adam carries on, and the whole loss
      (L2 term and any regularizer's penalty included) is divided by the weight
      whenever it exceeds 1.
    """

    HPARAMS = {
        "penalty_schedule": HParam("domainbed", help="domainbed (Adam restart) or irm_paper (loss / weight)"),
    }
    LAMBDA_KEY = ""
    ANNEAL_KEY = ""

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        if self.hparams["penalty_schedule"] not in SCHEDULES:
            raise DomaingenError(
                f"penalty_schedule must be one of {', '.join(SCHEDULES)}, got {self.hparams['penalty_schedule']!r}"
            )
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))

    def penalty_weight(self) -> float:
        if self.update_count.item() >= self.hparams[self.ANNEAL_KEY]:
            return float(self.hparams[self.LAMBDA_KEY])
        return 1.0

    def loss_divisor(self) -> float:
        """What `step` divides the whole loss by at this update: the weight under "irm_paper" once it exceeds 1, else 1."""
        weight = self.penalty_weight()
        return weight if self.hparams["penalty_schedule"] == "irm_paper" and weight > 1.0 else 1.0

    def step(self, loss: torch.Tensor) -> None:
        schedule = self.hparams["penalty_schedule"]
        if schedule == "domainbed" and self.update_count.item() == self.hparams[self.ANNEAL_KEY]:
            self.optimizer = make_adam(self.network, self.hparams)
        total = loss + self.regularization()  # before the rescaling below, as the L2 term
        total = total / self.loss_divisor()
        self.apply_gradients(total)
        self.update_count += 1
