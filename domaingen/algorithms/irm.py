"""Invariant risk minimisation (Arjovsky et al. 2019), IRMv1 penalty."""

from __future__ import annotations

import torch

from domaingen.algorithms.base import ALGORITHMS, Minibatches, classification_loss, concat, split_by_env
from domaingen.algorithms.penalties import AnnealedPenalty
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, int_log_uniform, log_uniform

ESTIMATORS = ("halves", "full")


def irm_penalty(logits: torch.Tensor, y: torch.Tensor, estimator: str = "halves") -> torch.Tensor:
    """Squared gradient of the risk w.r.t. a dummy scale 1.0 on the logits.

    "halves" (DomainBed): the unbiased product of the gradients on the two halves
    (even and odd positions) of the batch. "full" (the IRM paper's code): the
    square of the gradient on the whole batch.
    """
    # at least fp32, so that under bf16 autocast the penalty is not computed in bf16
    dtype = torch.promote_types(logits.dtype, torch.float32)
    scale = torch.ones((), device=logits.device, dtype=dtype, requires_grad=True)
    if estimator == "full":
        grad = torch.autograd.grad(classification_loss(logits * scale, y), [scale], create_graph=True)[0]
        return grad.square()
    loss_a = classification_loss(logits[::2] * scale, y[::2])
    loss_b = classification_loss(logits[1::2] * scale, y[1::2])
    grad_a = torch.autograd.grad(loss_a, [scale], create_graph=True)[0]
    grad_b = torch.autograd.grad(loss_b, [scale], create_graph=True)[0]
    return grad_a * grad_b


@ALGORITHMS.register("IRM")
class IRM(AnnealedPenalty):
    """Mean risk + w * mean IRMv1 penalty over training environments."""

    HPARAMS = {
        "irm_lambda": HParam(1e2, log_uniform(-1, 5), "penalty weight after annealing"),
        "irm_penalty_anneal_iters": HParam(500, int_log_uniform(0, 4), "updates before the penalty switches on"),
        "irm_penalty_estimator": HParam("halves", help="halves (unbiased, DomainBed) or full (the IRM paper's code)"),
    }
    LAMBDA_KEY = "irm_lambda"
    ANNEAL_KEY = "irm_penalty_anneal_iters"
    EAGER_STEP = ("its penalty is a gradient that the loss differentiates again (double backward), which "
                  "torch.compile does not support")

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        if self.hparams["irm_penalty_estimator"] not in ESTIMATORS:
            raise DomaingenError(
                f"irm_penalty_estimator must be one of {', '.join(ESTIMATORS)}, "
                f"got {self.hparams['irm_penalty_estimator']!r}"
            )

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        weight = self.penalty_weight()
        estimator = self.hparams["irm_penalty_estimator"]
        per_env = split_by_env(self.predict(concat(minibatches)[0]), minibatches)
        nll = torch.stack([classification_loss(logits, y) for logits, y in per_env]).mean()
        penalty = torch.stack([irm_penalty(logits, y, estimator) for logits, y in per_env]).mean()
        loss = nll + weight * penalty
        self.step(loss)
        return {"loss": loss.item(), "nll": nll.item(), "penalty": penalty.item()}
