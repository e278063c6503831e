"""AND-mask (Parascandolo et al., ICLR 2021, "Learning explanations that are hard to vary")."""

from __future__ import annotations

import torch

from domaingen.algorithms.base import environment_gradients, ALGORITHMS, FeaturizerClassifier, Minibatches
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, uniform


def and_mask(env_grads: torch.Tensor, tau: float) -> torch.Tensor:
    """Per-element mask 1[|mean_e sign g_e| >= tau] of gradients stacked along dim 0 (one row per environment)."""
    agreement = env_grads.sign().mean(dim=0).abs()
    return (agreement >= tau).to(env_grads.dtype)


@ALGORITHMS.register("ANDMask")
class ANDMask(FeaturizerClassifier):
    """Step on mask * mean_e(g_e) / mean(mask) per tensor; mask = 1[|mean_e sign g_e| >= tau].

    The mask keeps the gradient elements on whose sign the environments agree (tau = 1: all
    of them; each environment's gradient includes the regularization terms).

    `tau` has its own distribution, U(0.5, 1) (SANDMask's `tau` is U(0, 1)), as in DomainBed.
    """

    MIN_TRAIN_DOMAINS = 2  # one environment always agrees with itself: ERM
    HPARAMS = {
        "tau": HParam(1.0, uniform(0.5, 1.0), "sign-agreement threshold in [0, 1] (1: every environment agrees)"),
    }

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        tau = hparams.get("tau", 1.0)
        if not 0.0 <= float(tau) <= 1.0:
            raise DomaingenError(f"tau must be in [0, 1] (a fraction of agreeing environments), got {tau}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        params, per_env, total = environment_gradients(self, minibatches)
        self.optimizer.zero_grad(set_to_none=True)
        tau = float(self.hparams["tau"])
        for i, param in enumerate(params):
            grads = torch.stack([g[i] for g in per_env])
            mask = and_mask(grads, tau)
            param.grad = mask * grads.mean(dim=0) / (1e-10 + mask.mean())
        self.optimizer.step()
        return {"loss": total / len(minibatches)}
