"""SelfReg (Kim et al., "SelfReg: Self-supervised Contrastive Regularization for Domain
Generalization", ICCV 2021): pull each example towards same-class examples, without negatives.

The batch (all domains) is sorted by label. For each example i, two same-class partners
j = p(i) and k = q(i) come from two random permutations within its class; with
lam ~ Beta(0.5, 0.5), logits o, features z and their CDPL projection h = cdpl(z):

    loss = CE + min(CE, 1) * [lam * (L(o, o_p) + 0.3 L(z, h_p))
                              + (1 - lam) * (L(o, lam o_p + (1 - lam) o_q) + 0.3 L(z, lam h_p + (1 - lam) h_q))]

with L the mean squared error over all entries and min(CE, 1) a constant (no gradient).
The CDPL ("class-specific domain perturbation layer") is a 3-layer MLP with
BatchNorm, hidden width 2k (k for 2048 features).

Random draws: the permutations are torch.randperm calls (two per class, in label
order, on torch's generator) exactly as DomainBed's; lam comes from the algorithm's
own numpy stream (`numpy_draws`), the generator and call DomainBed draws it with from
numpy's global one.

DomainBed's class leaves the CDPL out of its optimizer, so the CDPL keeps its
initial weights (facebookresearch/DomainBed issue #62; the authors' own code trains
it). The default here trains it (selfreg_cdpl = "trained"); "frozen" reproduces
DomainBed's class, on which its published SelfReg numbers rest.
"""

from __future__ import annotations

from typing import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat, make_adam
from domaingen.algorithms.numpy_draws import NumpyDraws
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam

CDPL_MODES = ("trained", "frozen")
# weight of the feature-level terms relative to the logit-level ones (fixed in the method)
FEATURE_WEIGHT = 0.3


def cdpl(width: int) -> nn.Sequential:
    """The class-specific domain perturbation layer: width -> h -> h -> width, BatchNorm after each Linear."""
    hidden = width if width == 2048 else 2 * width
    return nn.Sequential(
        nn.Linear(width, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        nn.Linear(hidden, hidden), nn.BatchNorm1d(hidden), nn.ReLU(),
        nn.Linear(hidden, width), nn.BatchNorm1d(width),
    )


def same_class_partners(counts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """For a label-sorted batch with class sizes `counts`: two random permutations within each
    class, as row indices into the batch. Per class, in label order, two torch.randperm calls."""
    first, second, start = [], [], 0
    for count in counts:
        first.append(torch.randperm(count) + start)
        second.append(torch.randperm(count) + start)
        start += count
    return torch.cat(first), torch.cat(second)


@ALGORITHMS.register("SelfReg")
class SelfReg(NumpyDraws, FeaturizerClassifier):
    """CE + min(CE, 1) * same-class logit and feature regression, with Beta(0.5, 0.5) mixup of partners."""

    HPARAMS = {
        "selfreg_cdpl": HParam("trained", help="trained (the paper's code) or frozen (DomainBed's code: the CDPL keeps its initial weights)"),
    }

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.cdpl = cdpl(self.featurizer.n_outputs)
        if self.hparams["selfreg_cdpl"] == "trained":
            self.optimizer = make_adam(nn.ModuleDict({"network": self.network, "cdpl": self.cdpl}), self.hparams)
        else:
            self.cdpl.requires_grad_(False)
        self.init_numpy_draws()

    @classmethod
    def check_hparams(cls, hparams: Mapping) -> None:
        super().check_hparams(hparams)
        mode = hparams.get("selfreg_cdpl", "trained")
        if mode not in CDPL_MODES:
            raise DomaingenError(f"selfreg_cdpl must be one of {', '.join(CDPL_MODES)}, got {mode!r}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        lam = float(self.numpy_rng.beta(0.5, 0.5))
        y, order = torch.sort(y)
        x = x[order]
        counts = torch.unique_consecutive(y, return_counts=True)[1].tolist()
        features = self.featurizer(x)
        projected = self.cdpl(features)
        logits = self.classifier(features)
        first, second = (index.to(y.device) for index in same_class_partners(counts))
        # the partners' mixup: lam * first partner + (1 - lam) * second partner
        mixed_logits = lam * logits[first] + (1 - lam) * logits[second]
        mixed_projected = lam * projected[first] + (1 - lam) * projected[second]
        individual = F.mse_loss(logits, logits[first]) + FEATURE_WEIGHT * F.mse_loss(features, projected[first])
        mixed = F.mse_loss(logits, mixed_logits) + FEATURE_WEIGHT * F.mse_loss(features, mixed_projected)
        nll = classification_loss(logits, y)
        scale = min(nll.item(), 1.0)
        loss = nll + scale * (lam * individual + (1 - lam) * mixed)
        self.step(loss)
        return {"loss": loss.item()}
