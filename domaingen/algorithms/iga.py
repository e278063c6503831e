"""IGA, inter-environmental gradient alignment (Koyama & Yamaguchi 2020, "Out-of-distribution
generalization with maximal invariant predictor")."""

from __future__ import annotations

import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform


def gradient_variance(env_grads: list[tuple[torch.Tensor, ...]]) -> torch.Tensor:
    """sum_e ||g_e - mean_e' g_e'||^2 over every parameter tensor: the trace of the gradients' covariance
    times the number of environments.

    The mean enters as a constant: sum_e (g_e - mean) = 0, so its own derivative adds
    nothing to the gradient of this sum, and differentiating it would cost one more backward pass.
    """
    total = torch.zeros((), device=env_grads[0][0].device, dtype=torch.float32)
    for tensors in zip(*env_grads):
        stacked = torch.stack(tensors).float()
        total = total + (stacked - stacked.detach().mean(dim=0)).square().sum()
    return total


@ALGORITHMS.register("IGA")
class IGA(FeaturizerClassifier):
    """Mean environment risk + penalty * sum_e ||grad R_e - mean_e grad R_e||^2 (gradients of every weight).

    The penalty's gradient (a Hessian-vector product per environment) is taken by double
    backpropagation.
    """

    HPARAMS = {
        "penalty": HParam(1000, log_uniform(1, 5), "weight of the gradient-variance penalty"),
    }
    MIN_TRAIN_DOMAINS = 2
    NO_ADDITIVE_PENALTY = (
        "its penalty's gradient differentiates the environments' gradients (double backpropagation), "
        "which ModReg's masked layers do not support"
    )

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        weight = hparams.get("penalty", 1000)
        if not float(weight) >= 0:
            raise DomaingenError(f"penalty must be >= 0 (it weighs the gradient variance), got {weight}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        params = [p for p in self.network.parameters() if p.requires_grad]
        risks, grads = [], []
        for x, y in minibatches:
            risk = classification_loss(self.predict(x), y)
            grads.append(torch.autograd.grad(risk, params, create_graph=True))
            risks.append(risk)
        nll = torch.stack(risks).mean()
        penalty = gradient_variance(grads)
        loss = nll + float(self.hparams["penalty"]) * penalty
        self.step(loss)
        return {"loss": loss.item(), "nll": nll.item(), "penalty": penalty.item()}
