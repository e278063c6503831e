"""Information-bottleneck penalties (Ahuja et al., NeurIPS 2021, "Invariance principle meets
information bottleneck for out-of-distribution generalization"): IB-ERM and IB-IRM.

The bottleneck term is the mean over feature dimensions of the features' (unbiased)
variance within each training environment, averaged over environments:

    IB = mean_e mean_k Var_{i in e}(f(x_i)_k)

It is off (weight 0) for the first `ib_penalty_anneal_iters` updates, then weighs `ib_lambda`.
"""

from __future__ import annotations

import torch

from domaingen.algorithms.base import ALGORITHMS, Minibatches, classification_loss, concat, make_adam
from domaingen.algorithms.irm import IRM, irm_penalty
from domaingen.algorithms.penalties import AnnealedPenalty
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, int_log_uniform, log_uniform

IB_HPARAMS = {
    "ib_lambda": HParam(1e2, log_uniform(-1, 5), "weight of the information-bottleneck penalty after annealing"),
    "ib_penalty_anneal_iters": HParam(500, int_log_uniform(0, 4), "updates before the bottleneck penalty switches on"),
}


def ib_penalty(features: torch.Tensor) -> torch.Tensor:
    """Mean over dimensions of the (unbiased) variance of `features` over the batch, in at least fp32."""
    return features.to(torch.promote_types(features.dtype, torch.float32)).var(dim=0).mean()


def check_ib_hparams(hparams) -> None:
    if not float(hparams["ib_lambda"]) >= 0:
        raise DomaingenError(f"ib_lambda must be >= 0 (it weighs a penalty), got {hparams['ib_lambda']}")


class BottleneckMixin:
    """The bottleneck weight and the per-environment features and logits of one forward pass."""

    hparams: dict
    update_count: torch.Tensor

    def ib_weight(self) -> float:
        if self.update_count.item() >= self.hparams["ib_penalty_anneal_iters"]:
            return float(self.hparams["ib_lambda"])
        return 0.0

    def forward_by_env(self, minibatches: Minibatches) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """(features, logits, labels) per environment, from one pass over the concatenated minibatches."""
        features = self.featurizer(concat(minibatches)[0])  # type: ignore[attr-defined]
        logits = self.classifier(features)  # type: ignore[attr-defined]
        sizes = [len(y) for _, y in minibatches]
        return list(zip(torch.split(features, sizes), torch.split(logits, sizes), [y for _, y in minibatches]))


@ALGORITHMS.register("IB_ERM")
class IB_ERM(BottleneckMixin, AnnealedPenalty):
    """IB-ERM (Ahuja et al. 2021): mean environment risk + w * mean within-environment feature variance.

    w is 0 before annealing, then ib_lambda; Adam restarts at the switch (penalty_schedule
    "domainbed", as in DomainBed; "irm_paper" instead divides the loss by w when w > 1).
    """

    HPARAMS = dict(IB_HPARAMS)
    LAMBDA_KEY = "ib_lambda"
    ANNEAL_KEY = "ib_penalty_anneal_iters"

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        check_ib_hparams(hparams)

    def penalty_weight(self) -> float:
        return self.ib_weight()

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        weight = self.ib_weight()
        per_env = self.forward_by_env(minibatches)
        nll = torch.stack([classification_loss(logits, y) for _, logits, y in per_env]).mean()
        bottleneck = torch.stack([ib_penalty(features) for features, _, _ in per_env]).mean()
        loss = nll + weight * bottleneck
        self.step(loss)
        return {"loss": loss.item(), "nll": nll.item(), "ib_penalty": bottleneck.item()}


@ALGORITHMS.register("IB_IRM")
class IB_IRM(BottleneckMixin, IRM):
    """IB-IRM (Ahuja et al. 2021): IRM's objective + w_ib * mean within-environment feature variance.

    IRM's penalty and its schedule as in `IRM` (weight 1, then irm_lambda); the bottleneck
    weight is 0, then ib_lambda. Adam restarts when either switches on (DomainBed).
    """

    HPARAMS = dict(IB_HPARAMS)

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        check_ib_hparams(hparams)

    def step(self, loss: torch.Tensor) -> None:
        count = self.update_count.item()
        if (self.hparams["penalty_schedule"] == "domainbed" and count == self.hparams["ib_penalty_anneal_iters"]
                and count != self.hparams[self.ANNEAL_KEY]):
            self.optimizer = make_adam(self.network, self.hparams)
        super().step(loss)

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        irm_weight, ib_weight = self.penalty_weight(), self.ib_weight()
        estimator = self.hparams["irm_penalty_estimator"]
        per_env = self.forward_by_env(minibatches)
        nll = torch.stack([classification_loss(logits, y) for _, logits, y in per_env]).mean()
        invariance = torch.stack([irm_penalty(logits, y, estimator) for _, logits, y in per_env]).mean()
        bottleneck = torch.stack([ib_penalty(features) for features, _, _ in per_env]).mean()
        loss = nll + irm_weight * invariance + ib_weight * bottleneck
        self.step(loss)
        return {"loss": loss.item(), "nll": nll.item(), "irm_penalty": invariance.item(), "ib_penalty": bottleneck.item()}
