"""Style-agnostic networks, SagNet (Nam et al., CVPR 2021), in DomainBed's form (Algorithm 1,
with the randomisation on the featurizer's output vector).

A feature vector's style is its mean and variance over its entries, its content the
normalised vector. Three steps per update, each with its own Adam:

    content:   min_{f,c}  CE(c(content(z_i) * style mixed with z_j's), y_i)
    style:     min_s      CE(s(content of z_j * style(z_i)), y_i)
    adversary: min_f      w_adv * -mean_k log softmax(s(content of z_j * style(z_i)))_k

with z = f(x), j a random permutation of the batch and the mixing weight alpha ~ U(0, 1)
per example. The random numbers are drawn with DomainBed's calls in its order (per
randomisation one torch.rand(n, 1) and one torch.randperm(n), both on the CPU).

Faster than DomainBed and the same update: the style step's featurizer gradient is thrown
away there (the adversary step zeroes it), so its features are computed once, after the
content step, and shared by the style and adversary steps (f does not change between
them). With dropout in the featurizer, those two steps then share one dropout mask
where DomainBed draws two.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat, make_adam
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform
from domaingen.networks import build_classifier

EPS = 1e-5


def randomize(features: torch.Tensor, mix_style: bool) -> torch.Tensor:
    """Each row's content with a random style (mix_style), or a random row's content with its own style.

    Style = the row's mean and (unbiased) variance over its entries. mix_style: the style becomes
    alpha * own + (1 - alpha) * a permuted row's; else the content is the permuted row's, detached.
    """
    n = features.shape[0]
    alpha = torch.rand(n, 1).to(features.device)  # drawn (on the CPU) even when unused, as DomainBed
    x = features.float()
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True)
    content = (x - mean) / (var + EPS).sqrt()
    perm = torch.randperm(n).to(features.device)
    if mix_style:
        mean = alpha * mean + (1 - alpha) * mean[perm]
        var = alpha * var + (1 - alpha) * var[perm]
    else:
        content = content[perm].detach()
    return content * (var + EPS).sqrt() + mean


def as_two_columns(logits: torch.Tensor) -> torch.Tensor:
    """A one-logit (binary logistic) head's logits as the equivalent two-class softmax logits [0, z]."""
    return torch.cat([torch.zeros_like(logits), logits], dim=1) if logits.shape[1] == 1 else logits


@ALGORITHMS.register("SagNet")
class SagNet(FeaturizerClassifier):
    """SagNet (Nam et al. 2021): content classifier on style-randomised features, adversarial style head.

    The content head is `classifier` (what predict uses); `style_classifier` is the
    style head. A one-logit head's adversarial term uses the two-class form [0, z].
    The content loss carries the network's regularization terms (L2, X+ModReg's penalty)
    and the adversary's loss the featurizer's, since each step trains those parameters.
    """

    HPARAMS = {"sag_w_adv": HParam(0.1, log_uniform(-2, 1), "weight of the adversarial (style-confusion) loss")}

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.style_classifier = build_classifier(
            self.featurizer.n_outputs,
            num_classes,
            single_logit=bool(self.hparams.get("single_logit", False)),
            init=getattr(self.featurizer, "head_init", "default"),
        )
        del self.optimizer
        self.optimizer_f = make_adam(self.featurizer, self.hparams)
        self.optimizer_c = make_adam(self.classifier, self.hparams)
        self.optimizer_s = make_adam(self.style_classifier, self.hparams)

    @classmethod
    def check_hparams(cls, hparams) -> None:
        super().check_hparams(hparams)
        if not float(hparams["sag_w_adv"]) >= 0:
            raise DomaingenError(f"sag_w_adv must be >= 0 (it weighs the adversarial loss), got {hparams['sag_w_adv']}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        # content: featurizer and content head on style-mixed features
        loss_c = classification_loss(self.classifier(randomize(self.featurizer(x), mix_style=True)), y)
        self.optimizer_f.zero_grad(set_to_none=True)
        self.optimizer_c.zero_grad(set_to_none=True)
        (loss_c + self.regularization()).backward()
        self.optimizer_f.step()
        self.optimizer_c.step()
        # style: the style head on content-swapped features (the featurizer is not trained here)
        features = self.featurizer(x)
        loss_s = classification_loss(self.style_classifier(randomize(features.detach(), mix_style=False)), y)
        self.optimizer_s.zero_grad(set_to_none=True)
        loss_s.backward()
        self.optimizer_s.step()
        # adversary: the featurizer makes the (new) style head's prediction uniform
        logits = as_two_columns(self.style_classifier(randomize(features, mix_style=False)).float())
        loss_adv = -F.log_softmax(logits, dim=1).mean(dim=1).mean() * float(self.hparams["sag_w_adv"])
        self.optimizer_f.zero_grad(set_to_none=True)
        # the featurizer's own regularization terms: this step trains it alone
        (loss_adv + self.regularization(self.featurizer)).backward(inputs=[p for p in self.featurizer.parameters() if p.requires_grad])
        self.optimizer_f.step()
        return {"loss": loss_c.item(), "loss_c": loss_c.item(), "loss_s": loss_s.item(), "loss_adv": loss_adv.item()}
