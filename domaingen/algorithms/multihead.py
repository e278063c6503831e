"""MultiHead: one shared featurizer, one linear classifier head per training domain.

The Multi-Headed baseline of DMG's paper (Chattopadhyay, Balaji & Hoffman, ECCV 2020,
Section 4): every training example is classified by its own domain's head, and the loss
is the mean cross-entropy over the concatenated minibatches (ERM's, with the head chosen
by the example's domain). Known-domain prediction (`predict(x, domain=d)`, the `kd`
mode) uses head d; out-of-domain prediction averages the heads' logits, which is also
what `network(x)` computes, so every tool that runs the network sees the OOD prediction.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from domaingen.algorithms.base import (
    ALGORITHMS,
    FeaturizerClassifier,
    Minibatches,
    classification_loss,
    concat,
)
from domaingen.errors import DomaingenError
from domaingen.networks import build_classifier


class MultiHeadClassifier(nn.Module):
    """Linear heads, one per training domain; forward averages their logits."""

    def __init__(self, heads: list[nn.Module]) -> None:
        super().__init__()
        self.heads = nn.ModuleList(heads)

    def all_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[domains, n, classes]: every head's logits."""
        return torch.stack([head(features) for head in self.heads])

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        return self.all_logits(features).mean(0)


@ALGORITHMS.register("MultiHead")
class MultiHead(FeaturizerClassifier):
    """Shared featurizer, one linear head per training domain; OOD prediction averages the heads' logits."""

    EVAL_MODES = {"kd": True}

    def prepare_modules(self) -> None:
        # the base built one head; the other domains get theirs before ModReg masks them all
        first = self.classifier
        others = [
            build_classifier(self.featurizer.n_outputs, self.num_classes,
                             single_logit=bool(self.hparams.get("single_logit", False)),
                             init=getattr(self.featurizer, "head_init", "default"))
            for _ in range(self.num_domains - 1)
        ]
        self.classifier = MultiHeadClassifier([first, *others])
        super().prepare_modules()

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        if len(minibatches) != self.num_domains:
            raise DomaingenError(
                f"MultiHead was built for {self.num_domains} training domains but got {len(minibatches)} minibatches")
        x, y = concat(minibatches)
        features = self.featurizer(x)
        logits = torch.cat([
            self.classifier.heads[d](part)
            for d, part in enumerate(features.split([len(yb) for _, yb in minibatches]))
        ])
        loss = classification_loss(logits, y)
        self.step(loss)
        return {"loss": loss.item()}

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        """Logits: the mean of the heads' without `domain`, the given domain's head with it."""
        if domain is None:
            return self.network(x)
        return self.predict_mode(x, "kd", domain)

    def predict_mode(self, x: torch.Tensor, mode: str, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        """Logits in the `kd` mode: each example through its domain's head (`domain`: one index or one per example)."""
        if mode != "kd":
            raise DomaingenError(f"MultiHead has no test-time mode '{mode}'; valid modes: kd")
        index = self._domain_index(domain, x)
        every = self.classifier.all_logits(self.featurizer(x))
        return every[index, torch.arange(x.shape[0], device=x.device)]

    def predict_modes(
        self, x: torch.Tensor, modes: Sequence[str | None], domain: int | torch.Tensor | None = None
    ) -> list[torch.Tensor]:
        """The default and known-domain logits from one featurizer pass: the same numbers as
        `predict` and `predict_mode`, which make one pass each."""
        if any(mode not in (None, "kd") for mode in modes) or ("kd" in modes and domain is None):
            return super().predict_modes(x, modes, domain)
        index = self._domain_index(domain, x) if "kd" in modes else None
        every = self.classifier.all_logits(self.featurizer(x))
        return [every.mean(0) if mode is None else every[index, torch.arange(x.shape[0], device=x.device)]
                for mode in modes]

    def _domain_index(self, domain: int | torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
        """`domain` (one index, or one per example of `x`) as a checked [n] index tensor."""
        if domain is None:
            raise DomaingenError("MultiHead's known-domain (kd) mode needs domain= a training-domain index or one per example")
        index = torch.as_tensor(domain, device=x.device)
        if index.is_floating_point() or index.dtype == torch.bool:
            raise DomaingenError(f"domain must hold integer indices, got dtype {index.dtype}")
        index = index.long().expand(x.shape[0]) if index.dim() == 0 else index.long()
        if index.shape != (x.shape[0],):
            raise DomaingenError(f"domain must be one index or one per example ({x.shape[0]}), got shape {tuple(index.shape)}")
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= self.num_domains):
            raise DomaingenError(
                f"domain index out of range: MultiHead was trained on {self.num_domains} domains "
                f"(valid indices 0..{self.num_domains - 1})")
        return index
