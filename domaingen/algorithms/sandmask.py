"""SAND-mask (Shahtalebi et al. 2021): mask gradient elements on which environments disagree."""

from __future__ import annotations

import torch
from domaingen.algorithms.base import environment_gradients, ALGORITHMS, FeaturizerClassifier, Minibatches
from domaingen.hparams import HParam, log_uniform, uniform


def sand_mask(env_grads: torch.Tensor, k: float, tau: float) -> torch.Tensor:
    """Per-element mask max(0, tanh(k * (|mean_e sign g_e| - tau) / var_e g_e)).

    `env_grads` stacks one gradient per environment along dim 0. A NaN variance
    (a single environment) counts as 1e-17, as in the reference code.
    """
    n = env_grads.shape[0]
    # written out: torch.var(dim=0) is ~30x slower on CPU for this (E, many) layout
    centred = env_grads - env_grads.mean(dim=0)
    variance = centred.square().sum(dim=0) / (n - 1) if n > 1 else torch.full_like(env_grads[0], float("nan"))
    variance = torch.nan_to_num(variance, nan=1e-17)
    agreement = env_grads.sign().mean(dim=0).abs()
    mask = torch.tanh(k * (agreement - tau) / variance).clamp_min(0.0)
    return torch.nan_to_num(mask, nan=1e-17)


@ALGORITHMS.register("SANDMask")
class SANDMask(FeaturizerClassifier):
    """The step is mask * mean_e(g_e) / mean(mask), per parameter tensor.

    Default tau is 0.5, not DomainBed's 1.0: |mean sign| never exceeds 1, so
    tau = 1 makes every mask element max(0, tanh(<= 0)) = 0 and nothing trains.
    With tau = 0.5 an element passes when a clear majority of environments
    agree on its sign (both of two, or at least 4 of 5).
    """

    HPARAMS = {
        "tau": HParam(0.5, uniform(0.0, 1.0), "sign-agreement threshold"),
        "k": HParam(1e1, log_uniform(-3, 5), "mask sharpness"),
    }

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        params, per_env, total = environment_gradients(self, minibatches)
        self.optimizer.zero_grad(set_to_none=True)
        k, tau = float(self.hparams["k"]), float(self.hparams["tau"])
        for i, param in enumerate(params):
            grads = torch.stack([g[i] for g in per_env])
            mask = sand_mask(grads, k, tau)
            param.grad = mask * grads.mean(dim=0) / (1e-10 + mask.mean())
        self.optimizer.step()
        return {"loss": total / len(minibatches)}
