"""Variance risk extrapolation (Krueger et al. 2021)."""

from __future__ import annotations

import torch
from domaingen.algorithms.base import ALGORITHMS, Minibatches, classification_loss, concat, split_by_env
from domaingen.algorithms.penalties import AnnealedPenalty
from domaingen.hparams import HParam, int_log_uniform, log_uniform


@ALGORITHMS.register("VREx")
class VREx(AnnealedPenalty):
    """Mean environment risk + w * variance of the environment risks."""

    HPARAMS = {
        "vrex_lambda": HParam(1e1, log_uniform(-1, 5), "penalty weight after annealing"),
        "vrex_penalty_anneal_iters": HParam(500, int_log_uniform(0, 4), "updates before the penalty switches on"),
    }
    LAMBDA_KEY = "vrex_lambda"
    ANNEAL_KEY = "vrex_penalty_anneal_iters"
    # static shapes; the penalty weight is a Python number that changes once, compiling the step once more
    # (five compiled MLP updates through the switch: weights within 5e-5 of the eager ones)
    EAGER_STEP = ""

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        weight = self.penalty_weight()
        per_env = split_by_env(self.predict(concat(minibatches)[0]), minibatches)
        risks_t = torch.stack([classification_loss(logits, y) for logits, y in per_env])
        mean = risks_t.mean()
        penalty = ((risks_t - mean) ** 2).mean()
        loss = mean + weight * penalty
        self.step(loss)
        return {"loss": loss.item(), "nll": mean.item(), "penalty": penalty.item()}
