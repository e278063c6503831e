"""Fishr (Rame, Dancette & Cord, ICML 2022, "Fishr: invariant gradient variances for
out-of-distribution generalization")."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, make_adam
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, Sampler, log_uniform, uniform


def int_uniform(low: float, high: float) -> Sampler:
    """int(U(low, high))."""
    return Sampler(lambda r: int(r.uniform(low, high)), f"int(U({low:g},{high:g}))")


def logit_gradients(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """d loss_n / d logits_n of each example's own classification loss, [n, classes], differentiable.

    Cross-entropy: softmax(logits) - onehot(y); one logit column (logistic loss): sigmoid(logit) - y.
    """
    if logits.shape[1] == 1:
        return torch.sigmoid(logits) - y.to(logits.dtype).unsqueeze(1)
    return torch.softmax(logits, dim=1) - F.one_hot(y, logits.shape[1]).to(logits.dtype)


def per_example_head_gradients(features: torch.Tensor, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each example's gradient of its own loss w.r.t. the linear head logits = W z + b that produced
    `logits` from `features`, flattened as [n, classes * features (W, row-major) + classes (b)].

    In closed form, outer(d loss/d logits, z) for W and d loss/d logits for b, so the result
    stays differentiable w.r.t. the features and the head (no per-example backward passes).
    """
    dlogits = logit_gradients(logits, y)
    grad_weight = dlogits.unsqueeze(2) * features.unsqueeze(1)
    return torch.cat([grad_weight.flatten(1), dlogits], dim=1)


def gradient_variances(grads: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """Per domain, the (biased) variance over its examples of every gradient element: [domains, elements]."""
    variances = []
    for part in torch.split(grads, sizes):
        variances.append((part - part.mean(dim=0)).square().mean(dim=0))
    return torch.stack(variances)


@ALGORITHMS.register("Fishr")
class Fishr(FeaturizerClassifier):
    """Risk + lambda * mean_d mean_j (v_dj - mean_d' v_d'j)^2, v_d: domain d's variances of per-example head gradients.

    v_d is domain d's variance of the classifier's per-example gradients, averaged over steps by an exponential
    moving average (weight `ema` on the past, divided by 1 - ema so that the penalty's
    gradient does not scale with it).

    The penalty weight is 0 for the first `penalty_anneal_iters` updates, then lambda, and Adam
    restarts at the switch (as DomainBed). The per-example gradients are computed in closed form
    for the linear head, with respect to the map it applies (with X+ModReg, the masked weight),
    not with BackPACK. The moving averages are buffers, restored with checkpoints.
    """

    HPARAMS = {
        "lambda": HParam(1000.0, log_uniform(1.0, 4.0), "weight of the gradient-variance penalty after annealing"),
        "penalty_anneal_iters": HParam(1500, int_uniform(0.0, 5000.0), "updates before the penalty switches on"),
        "ema": HParam(0.95, uniform(0.90, 0.99), "moving-average weight of past gradient variances, in [0, 1)"),
    }
    MIN_TRAIN_DOMAINS = 2

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        ema = hparams.get("ema", 0.95)
        if not 0.0 <= float(ema) < 1.0:
            raise DomaingenError(f"ema must be in [0, 1) (the weight of past gradient variances), got {ema}")
        weight = hparams.get("lambda", 1000.0)
        if not float(weight) >= 0:
            raise DomaingenError(f"lambda must be >= 0 (it weighs the gradient-variance penalty), got {weight}")
        anneal = hparams.get("penalty_anneal_iters", 1500)
        if not float(anneal) >= 0:
            raise DomaingenError(f"penalty_anneal_iters must be >= 0, got {anneal}")

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        head = self.classifier
        elements = head.out_features * head.in_features + head.out_features
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))
        # the moving averages of each domain's gradient variances (zeros: DomainBed's first step
        # averages with zeros too)
        self.register_buffer("variance_ema", torch.zeros(num_domains, elements))

    def fishr_penalty(self, features: torch.Tensor, logits: torch.Tensor, minibatches: Minibatches) -> torch.Tensor:
        """Update the moving averages with this batch's variances and return the penalty (fp32)."""
        y = torch.cat([yb for _, yb in minibatches])
        grads = per_example_head_gradients(features.float(), logits.float(), y)
        variances = gradient_variances(grads, [len(yb) for _, yb in minibatches])
        ema = float(self.hparams["ema"])
        averaged = ema * self.variance_ema + (1.0 - ema) * variances
        self.variance_ema.copy_(averaged.detach())
        averaged = averaged / (1.0 - ema)
        return (averaged - averaged.mean(dim=0)).square().mean()

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        if len(minibatches) != self.num_domains:
            raise DomaingenError(
                f"Fishr was built for {self.num_domains} training domains but got {len(minibatches)} minibatches"
            )
        x = torch.cat([xb for xb, _ in minibatches])
        y = torch.cat([yb for _, yb in minibatches])
        anneal = int(self.hparams["penalty_anneal_iters"])
        weight = 0.0
        if self.update_count.item() >= anneal:
            weight = float(self.hparams["lambda"])
            if self.update_count.item() == anneal != 0:
                # the loss scale jumps: Adam's moment estimates no longer fit it
                self.optimizer = make_adam(self.network, self.hparams)
        self.update_count += 1
        features = self.featurizer(x)
        logits = self.classifier(features)
        # while its weight is 0 the penalty only feeds the moving averages: no graph for it
        with torch.set_grad_enabled(weight != 0.0):
            penalty = self.fishr_penalty(features, logits, minibatches)
        nll = classification_loss(logits, y)
        loss = nll + weight * penalty
        self.step(loss)
        return {"loss": loss.item(), "nll": nll.item(), "penalty": penalty.item()}
