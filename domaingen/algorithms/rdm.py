"""Risk distribution matching, RDM (Nguyen et al., WACV 2024, "Domain generalisation via risk
distribution matching").

Each example's loss is a sample of its environment's risk distribution. RDM matches the
worst environment's (highest mean loss) to the pooled one by a Gaussian-kernel MMD:

    loss = mean_e R_e + lambda * MMD^2(l_worst, l_all) + v * (Var(l_all) + Var(l_worst))

with MMD^2(a, b) = mean k(a, a') + mean k(b, b') - 2 mean k(a, b) and
k(a, b) = sum_{g in 1e-4..1e3} exp(-g (a - b)^2). lambda and v are 0 for the first
`rdm_penalty_anneal_iters` updates; at the switch Adam restarts with learning rate
`rdm_lr`, which it keeps (as DomainBed).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, concat, make_adam, split_by_env
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, Sampler, by_dataset, choice, int_pow2_uniform, uniform

KERNEL_GAMMAS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0, 1000.0)


def int_uniform(low: float, high: float) -> Sampler:
    """int(U(low, high))."""
    return Sampler(lambda r: int(r.uniform(low, high)), f"int(U({low:g},{high:g}))")


def per_example_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each example's cross-entropy (logistic loss for a single logit column), in at least fp32."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    if logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.to(logits.dtype), reduction="none")
    return F.cross_entropy(logits, y, reduction="none")


def gaussian_kernel_mean(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """mean over pairs (i, j) of sum_g exp(-g (a_i - b_j)^2), for 1-D `a` and `b`."""
    sq = (a[:, None] - b[None, :]).square()
    return sum(torch.exp(-g * sq) for g in KERNEL_GAMMAS).mean()


def mmd(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Squared MMD between the samples `a` and `b` under the summed Gaussian kernels."""
    return gaussian_kernel_mean(a, a) + gaussian_kernel_mean(b, b) - 2 * gaussian_kernel_mean(a, b)


@ALGORITHMS.register("RDM")
class RDM(FeaturizerClassifier):
    """RDM (Nguyen et al. 2024): mean risk + lambda * MMD^2(worst environment's losses, all losses) + variance terms."""

    HPARAMS = {
        "rdm_lambda": by_dataset(
            HParam(5.0, uniform(0.1, 10.0), "weight of the risk-distribution MMD after annealing"),
            ("DomainNet", HParam(0.5, uniform(0.1, 1.0), "weight of the risk-distribution MMD after annealing")),
            (("PACS", "TerraIncognita"), HParam(5.0, uniform(1.0, 10.0), "weight of the risk-distribution MMD after annealing")),
        ),
        "rdm_penalty_anneal_iters": by_dataset(
            HParam(1500, int_uniform(800, 2700), "updates before the penalties switch on"),
            ("DomainNet", HParam(2400, int_uniform(1500, 3000), "updates before the penalties switch on")),
        ),
        "variance_weight": by_dataset(
            HParam(0.004, uniform(0.001, 0.007), "weight of the loss-variance terms after annealing"),
            (("TerraIncognita", "OfficeHome", "DomainNet"),
             HParam(0.0, choice([0.0]), "weight of the loss-variance terms after annealing")),
        ),
        "rdm_lr": HParam(1.5e-5, uniform(8e-6, 2e-5), "Adam learning rate from the switch on"),
        "batch_size": by_dataset(
            HParam(88, int_uniform(70, 100), "examples per training environment per step"),
            ("small_images", HParam(64, int_pow2_uniform(3, 9), "examples per training environment per step")),
            (("DomainNet", "TerraIncognita"), HParam(40, int_uniform(30, 60), "examples per training environment per step")),
        ),
    }
    MIN_TRAIN_DOMAINS = 2

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        for key in ("rdm_lambda", "variance_weight"):
            if not float(hparams[key]) >= 0:
                raise DomaingenError(f"{key} must be >= 0 (it weighs a penalty), got {hparams[key]}")
        if not float(hparams["rdm_lr"]) > 0:
            raise DomaingenError(f"rdm_lr must be > 0 (the Adam learning rate after annealing), got {hparams['rdm_lr']}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        count = self.update_count.item()
        on = count >= self.hparams["rdm_penalty_anneal_iters"]
        match_weight = float(self.hparams["rdm_lambda"]) if on else 0.0
        variance_weight = float(self.hparams["variance_weight"]) if on else 0.0
        per_env = [per_example_loss(logits, y) for logits, y in split_by_env(self.predict(concat(minibatches)[0]), minibatches)]
        risks = torch.stack([losses.mean() for losses in per_env])
        nll = risks.mean()
        worst = per_env[int(torch.argmax(risks.detach()))]
        pooled = torch.cat(per_env)
        matching = mmd(worst, pooled)
        variance = pooled.var() + worst.var()
        loss = nll + match_weight * matching + variance_weight * variance
        if count == self.hparams["rdm_penalty_anneal_iters"]:
            self.optimizer = make_adam(self.network, self.hparams, lr=float(self.hparams["rdm_lr"]))
        self.step(loss)
        self.update_count += 1
        return {"loss": loss.item(), "nll": nll.item(), "matching_penalty": matching.item(),
                "variance_penalty": variance.item()}
