"""Fish (Shi et al. 2022): inter-domain gradient matching by a first-order meta step."""

from __future__ import annotations

import copy

import torch
from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, make_adam
from domaingen.hparams import HParam, choice


@ALGORITHMS.register("Fish")
class Fish(FeaturizerClassifier):
    """Inner Adam steps on each environment in turn, then meta <- meta + meta_lr * (inner - meta).

    The inner network and its Adam state persist across updates (DomainBed
    re-clones the network each step but carries the inner Adam state over,
    which is the same computation). The meta step moves buffers too, as
    DomainBed's (which interpolates the whole state dict): BatchNorm running
    statistics that the inner steps update (`freeze_bn=false`) reach the meta
    network; an integer buffer (num_batches_tracked) is truncated, as
    DomainBed's load_state_dict truncates it.
    """

    HPARAMS = {"meta_lr": HParam(0.5, choice([0.05, 0.1, 0.5]), "step size of the meta update")}

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.inner = copy.deepcopy(self.network)
        self.optimizer = make_adam(self.inner, self.hparams)

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        self.inner.load_state_dict(self.network.state_dict())
        losses = []
        for x, y in minibatches:
            loss = classification_loss(self.inner(x), y)
            self.optimizer.zero_grad(set_to_none=True)
            (loss + self.regularization(self.inner)).backward()
            self.optimizer.step()
            losses.append(loss.item())
        meta_lr = float(self.hparams["meta_lr"])
        with torch.no_grad():
            for meta, inner in zip(self.network.parameters(), self.inner.parameters()):
                meta.add_(inner - meta, alpha=meta_lr)
            for meta, inner in zip(self.network.buffers(), self.inner.buffers()):
                if meta.is_floating_point():
                    meta.add_(inner - meta, alpha=meta_lr)
                else:
                    meta.copy_(meta + (inner - meta) * meta_lr)
        return {"loss": sum(losses) / len(losses)}
