"""Transfer (Zhang, Zhao, Yu & Poupart, NeurIPS 2021, "Quantifying and improving transferability in
domain generalization"), their Algorithm 1."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import (
    ALGORITHMS,
    FeaturizerClassifier,
    Minibatches,
    classification_loss,
    concat,
    parameter_groups,
)
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, choice, log_uniform, uniform


def per_example_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each example's classification loss (cross-entropy, or logistic for one logit column)."""
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.to(logits.dtype), reduction="none")
    return F.cross_entropy(logits, y, reduction="none")


def loss_gap(logits: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """max_e R_e - min_e R_e over the environments (consecutive blocks of `sizes` rows); the first of tied
    environments is the one that gets the gradient."""
    risks = torch.stack([part.mean() for part in torch.split(per_example_loss(logits, y), sizes)])
    return risks[torch.argmax(risks)] - risks[torch.argmin(risks)]


@ALGORITHMS.register("Transfer")
class Transfer(FeaturizerClassifier):
    """Risk, then t_lambda * the loss gap max_e R_e - min_e R_e of an adversarial head near the classifier.

    Each update: an Adam step on the risk of all examples; an Adam step of the featurizer on
    t_lambda * (max_e R_e(h') - min_e R_e(h')) for the adversarial head h'; then h' <- h, followed by
    `d_steps_per_g` SGD (lr_d) ascent steps of h' on that gap, each projected onto the ball of
    radius `delta` around the classifier h (Euclidean norm over weight and bias).

    The adversary h' (a plain linear head; with X+ModReg it copies the classifier's unmasked
    weights) persists between updates and is restored with checkpoints, as its optimizer.

    Differs from DomainBed's class: with gda (gradient descent-ascent, always on in DomainBed's random
    search) DomainBed's main optimizer is an SGD over the adversary's parameters, so the featurizer and
    classifier never train; here gda replaces Adam by plain SGD (lr) over the featurizer and
    classifier, the descent half of the paper's descent-ascent. The adversary's steps reuse one
    featurizer pass (the featurizer does not change during them; DomainBed repeats the pass,
    which only matters for dropout draws), and every gap is computed from one pass over all
    environments, not one per environment. `weight_decay_d` and `beta1` are declared, as in
    DomainBed, but unused there and here.
    """

    HPARAMS = {
        "t_lambda": HParam(1.0, log_uniform(-2, 1), "weight of the featurizer's loss-gap step"),
        "delta": HParam(2.0, uniform(0.1, 3.0), "radius of the ball around the classifier the adversary stays in"),
        "d_steps_per_g": HParam(10, choice([1, 2, 5]), "adversary ascent steps per update"),
        "weight_decay_d": HParam(0.0, log_uniform(-6, -2), "unused (declared by DomainBed's Transfer)"),
        "gda": HParam(False, choice([True]), "SGD instead of Adam for the featurizer and classifier"),
        "beta1": HParam(0.5, choice([0.0, 0.5]), "unused (declared by DomainBed's Transfer)"),
        "lr_d": HParam(1e-3, log_uniform(-4.5, -2.5), "SGD learning rate of the adversary"),
    }
    MIN_TRAIN_DOMAINS = 2

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        delta = hparams.get("delta", 2.0)
        if not float(delta) >= 0:
            raise DomaingenError(f"delta must be >= 0 (the radius of the adversary's ball), got {delta}")
        steps = hparams.get("d_steps_per_g", 10)
        if not (float(steps) >= 0 and float(steps) == int(steps)):
            raise DomaingenError(f"d_steps_per_g must be an integer >= 0, got {steps}")

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.adversary = nn.Linear(self.classifier.in_features, self.classifier.out_features)
        self.sync_adversary()
        if self.hparams["gda"]:
            self.optimizer = torch.optim.SGD(
                parameter_groups(self.network, self.hparams),
                lr=self.hparams["lr"],
                weight_decay=self.hparams.get("weight_decay", 0.0),
            )
        self.adversary_optimizer = torch.optim.SGD(self.adversary.parameters(), lr=float(self.hparams["lr_d"]))

    def classifier_params(self) -> tuple[torch.Tensor, torch.Tensor]:
        return self.classifier.weight, self.classifier.bias

    def sync_adversary(self) -> None:
        with torch.no_grad():
            for adv, own in zip(self.adversary.parameters(), self.classifier_params()):
                adv.copy_(own)

    def project_adversary(self) -> None:
        """Move the adversary onto the ball of radius delta around the classifier if it left it."""
        with torch.no_grad():
            pairs = list(zip(self.adversary.parameters(), self.classifier_params()))
            distance = torch.sqrt(sum((adv - own).float().square().sum() for adv, own in pairs))
            delta = float(self.hparams["delta"])
            if distance > delta:
                ratio = delta / distance
                for adv, own in pairs:
                    adv.copy_(own + ratio * (adv - own))

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        sizes = [len(yb) for _, yb in minibatches]
        t_lambda = float(self.hparams["t_lambda"])
        loss = classification_loss(self.predict(x), y)
        self.step(loss)
        # the featurizer narrows the gap the adversary found
        self.step(t_lambda * loss_gap(self.adversary(self.featurizer(x)), y, sizes))
        self.sync_adversary()
        with torch.no_grad():
            features = self.featurizer(x)
        gap = torch.zeros((), device=x.device)
        for _ in range(int(self.hparams["d_steps_per_g"])):
            gap = loss_gap(self.adversary(features), y, sizes)
            self.adversary_optimizer.zero_grad(set_to_none=True)
            (-t_lambda * gap).backward()
            self.adversary_optimizer.step()
            self.project_adversary()
        return {"loss": loss.item(), "gap": t_lambda * gap.item()}
