"""CAD and CondCAD (Ruan et al., "Optimal Representations for Covariate Shift", ICLR 2022):
cross-entropy + lmbda * a contrastive domain bottleneck on the features.

With z the features of the whole batch (all domains; projected by a 2-layer head
when is_project, L2-normalized when is_normalized), s_ij = z_i . z_j / temperature
and, for an anchor i, softmaxes over the other examples j != i:

- CAD (bottleneck on I(D; Z)): p_ij = exp(s_ij) / sum_{k != i} exp(s_ik); anchors: the
  examples with another example of their label. is_flipped (the default): the anchor's
  loss is -log sum_{j: d_j != d_i} p_ij (maximize the probability of another
  domain), else log sum_{j != i: d_j = d_i} p_ij (minimize that of its own domain).
- CondCAD (bottleneck on I(D; Z | Y)): the softmax runs over the same-label examples
  only, q_ij = exp(s_ij) / sum_{k != i, y_k = y_i} exp(s_ik), and the sums over
  same-label examples of another domain (is_flipped) or of the anchor's domain.

The bottleneck is (temperature / 0.07) times the mean over the anchors whose sum is
not empty (0 without any), computed in (at least) fp32.

Differences from DomainBed's class: its is_project = true fails (the head's width
is an undefined name), here the head is Linear(k, k) - ReLU - Linear(k, 128) on the
k features, trained with the rest; and its unconditional bottleneck without
is_flipped counts the anchor itself among its own domain (with a logit of 0), here
the sum runs over the other examples of the domain, as the method defines it. With
DomainBed's search (is_project false, is_flipped true, both fixed) the updates are the same.
"""

from __future__ import annotations

from typing import ClassVar, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat, make_adam
from domaingen.algorithms.kernels import at_least_fp32
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, choice

# the SupCon reference temperature the bottleneck's scale is relative to
BASE_TEMPERATURE = 0.07
PROJECTION_WIDTH = 128


def masked_logsumexp(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """log sum_j exp(values_ij) over the entries where mask_ij is true, per row (-inf for an empty row)."""
    return torch.logsumexp(values.masked_fill(~mask, float("-inf")), dim=1)


def bottleneck_loss(
    z: torch.Tensor, y: torch.Tensor, domains: torch.Tensor, temperature: float,
    conditional: bool, flipped: bool, normalized: bool = False,
) -> torch.Tensor:
    """The contrastive domain bottleneck of features z (one row per example); see the module docstring."""
    if normalized:
        z = F.normalize(z, dim=1)
    n = z.shape[0]
    others = ~torch.eye(n, dtype=torch.bool, device=z.device)
    same_label = (y.view(-1, 1) == y.view(1, -1)) & others
    same_domain = domains.view(-1, 1) == domains.view(1, -1)
    similarity = z @ z.transpose(0, 1) / temperature
    # shifted per row by its largest off-diagonal entry or 0 (no effect on the softmaxes; without
    # normalization the similarities reach thousands), in DomainBed's order of operations: with
    # large similarities the softmaxes are nearly one-hot and amplify rounding differences
    similarity = similarity * others
    similarity = similarity - similarity.max(1, keepdim=True)[0].detach()
    # the softmax's support: every other example (CAD) or the other examples of the label (CondCAD)
    support = same_label if conditional else others
    log_prob = similarity - masked_logsumexp(similarity, support).unsqueeze(1)
    target = support & (~same_domain if flipped else same_domain)
    anchors = target.any(1) & same_label.any(1)
    if not bool(anchors.any()):
        return z.new_zeros(())
    scale = (-1.0 if flipped else 1.0) * temperature / BASE_TEMPERATURE
    return (scale * masked_logsumexp(log_prob[anchors], target[anchors])).mean()


class ContrastiveBottleneck(FeaturizerClassifier):
    """CE + lmbda * the contrastive domain bottleneck (CONDITIONAL: on I(D; Z | Y), else I(D; Z))."""

    HPARAMS = {
        "lmbda": HParam(0.1, choice([1e-4, 1e-3, 1e-2, 1e-1, 1, 1e1, 1e2]), "weight of the domain bottleneck"),
        "temperature": HParam(0.1, choice([0.05, 0.1]), "temperature of the contrastive softmax"),
        "is_normalized": HParam(False, help="L2-normalize the representation in the bottleneck"),
        "is_project": HParam(False, help="compute the bottleneck on a 2-layer projection head (k -> k -> 128)"),
        "is_flipped": HParam(True, help="maximize log p(other domain) (true) instead of minimizing log p(own domain)"),
    }
    MIN_TRAIN_DOMAINS = 2  # the bottleneck contrasts domains
    CONDITIONAL: ClassVar[bool] = False

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.project: nn.Module | None = None
        if self.hparams["is_project"]:
            width = self.featurizer.n_outputs
            self.project = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, PROJECTION_WIDTH))
            self.optimizer = make_adam(nn.ModuleDict({"network": self.network, "project": self.project}), self.hparams)

    @classmethod
    def check_hparams(cls, hparams: Mapping) -> None:
        super().check_hparams(hparams)
        lmbda, temperature = hparams.get("lmbda", 0.1), hparams.get("temperature", 0.1)
        if not float(lmbda) >= 0:
            raise DomaingenError(f"lmbda must be >= 0 (it weighs the bottleneck), got {lmbda}")
        if not float(temperature) > 0:
            raise DomaingenError(f"temperature must be > 0 (it divides the similarities), got {temperature}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        domains = torch.cat([torch.full((len(yb),), d, dtype=torch.long, device=y.device)
                             for d, (_, yb) in enumerate(minibatches)])
        z = self.featurizer(x)
        with torch.autocast(z.device.type, enabled=False):
            represented = at_least_fp32(z) if self.project is None else self.project(at_least_fp32(z))
            bottleneck = bottleneck_loss(
                represented, y, domains, float(self.hparams["temperature"]), self.CONDITIONAL,
                bool(self.hparams["is_flipped"]), bool(self.hparams["is_normalized"]),
            )
        nll = classification_loss(self.classifier(z), y)
        loss = nll + float(self.hparams["lmbda"]) * bottleneck
        self.step(loss)
        return {"loss": loss.item(), "clf_loss": nll.item(), "bn_loss": bottleneck.item()}


@ALGORITHMS.register("CAD")
class CAD(ContrastiveBottleneck):
    """Contrastive adversarial domain bottleneck: CE + lmbda * contrastive bound on I(D; Z)."""


@ALGORITHMS.register("CondCAD")
class CondCAD(ContrastiveBottleneck):
    """Conditional CAD: CE + lmbda * contrastive bound on I(D; Z | Y), contrasting same-label examples only."""

    CONDITIONAL = True
