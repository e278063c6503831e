"""Group DRO (Sagawa et al., ICLR 2020) with the training environments as groups."""

from __future__ import annotations

from typing import Any, Mapping

import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform


@ALGORITHMS.register("GroupDRO")
class GroupDRO(FeaturizerClassifier):
    """min_theta max_{q in simplex} sum_e q_e R_e(theta), by the paper's online Algorithm 1.

    Each update first moves the group weights by exponentiated-gradient ascent,
    q_e <- q_e exp(eta R_e) / sum_f q_f exp(eta R_f), then takes one Adam step on
    sum_e q_e R_e (q held fixed). q starts uniform (all ones, normalised by the first
    update, as DomainBed's, so that the two agree to the last bit) and is a buffer, so
    checkpoints carry it. The same update as DomainBed's at HEAD b93c22a (its early versions divided
    the loss by the number of groups a second time).
    """

    HPARAMS = {
        "groupdro_eta": HParam(1e-2, log_uniform(-3, -1), "step size of the exponentiated-gradient ascent on q"),
    }
    EAGER_STEP = ""  # one fixed-size minibatch per domain; q is a buffer updated in place: static shapes

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.register_buffer("q", torch.ones(num_domains))

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        if not float(hparams["groupdro_eta"]) >= 0:
            raise DomaingenError(f"groupdro_eta must be >= 0 (a step size), got {hparams['groupdro_eta']}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        if len(minibatches) != len(self.q):
            raise DomaingenError(
                f"GroupDRO was built for {len(self.q)} training domains but got {len(minibatches)} minibatches"
            )
        # one forward per environment, as DomainBed (the same dropout draws in the same order)
        risks = torch.stack([classification_loss(self.predict(x), y) for x, y in minibatches])
        with torch.no_grad():
            q = self.q * torch.exp(float(self.hparams["groupdro_eta"]) * risks.detach().float())
            self.q.copy_(q / q.sum())
        loss = torch.dot(risks, self.q.to(risks.dtype))
        self.step(loss)
        return {"loss": loss.item(), **{f"q{e}": float(w) for e, w in enumerate(self.q)}}
