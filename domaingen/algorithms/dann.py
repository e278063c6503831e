"""Domain-adversarial training: DANN (Ganin et al., JMLR 2016) and its class-conditional
variant CDANN (Li et al., ECCV 2018), as DomainBed alternates them.

A domain discriminator D reads the features z = f(x) (CDANN: z + an embedding of the
class label) and learns to name each example's training domain; the featurizer and
classifier learn to classify while making D's job hard:

    D step:  min_D  L_D = CE_dom(D(z), d) + grad_penalty * mean_i ||dCE_sum/d input_i||^2
    G step:  min_fc CE(c(z), y) - lambda * L_D

`d_steps_per_g_step` D steps alternate with one G step (the update counter starts at 1,
so with the default of 1 the first update is a G step, as in DomainBed).
"""

from __future__ import annotations

from typing import Any, Mapping

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
from domaingen.hparams import HParam, by_dataset, choice, int_pow2_uniform, log_uniform
from domaingen.networks import MLP


def adam(module: nn.Module, hparams: Mapping[str, Any], lr: float, weight_decay: float, beta1: float) -> torch.optim.Adam:
    """Adam over `module` (mask logits in a group of their own) with betas (beta1, 0.9), DomainBed's GAN setting."""
    return torch.optim.Adam(
        parameter_groups(module, hparams), lr=float(lr), weight_decay=float(weight_decay), betas=(float(beta1), 0.9)
    )


def domain_labels(minibatches: Minibatches) -> torch.Tensor:
    """The training-domain index of every example of the concatenated minibatches."""
    return torch.cat([torch.full((len(y),), i, dtype=torch.long, device=y.device) for i, (_, y) in enumerate(minibatches)])


def check_d_steps(hparams: Mapping[str, Any]) -> None:
    value = hparams["d_steps_per_g_step"]
    if isinstance(value, bool) or not float(value).is_integer() or value < 1:
        raise DomaingenError(
            f"d_steps_per_g_step must be an integer >= 1 (discriminator steps per generator step), got {value}"
        )


def check_beta1(hparams: Mapping[str, Any]) -> None:
    if not 0.0 <= float(hparams["beta1"]) < 1.0:
        raise DomaingenError(f"beta1 must be in [0, 1) (Adam's first-moment decay), got {hparams['beta1']}")


def discriminator_turn(update_count: int, d_steps: int) -> bool:
    """Whether update number `update_count` (counted from 1) trains the discriminator."""
    return update_count % (1 + d_steps) < d_steps


SMALL_LR = HParam(1e-3, log_uniform(-4.5, -2.5))
LARGE_LR = HParam(5e-5, log_uniform(-5, -3.5))


class AbstractDANN(FeaturizerClassifier):
    """Featurizer + classifier against a domain discriminator (an MLP), each side with its own Adam."""

    HPARAMS = {
        "lambda": HParam(1.0, log_uniform(-2, 2), "weight of the adversarial term in the generator's loss"),
        "weight_decay_d": HParam(0.0, log_uniform(-6, -2), "Adam weight decay of the discriminator"),
        "d_steps_per_g_step": HParam(1, int_pow2_uniform(0, 3), "discriminator steps per generator step"),
        "grad_penalty": HParam(0.0, log_uniform(-2, 1), "weight of the discriminator's input-gradient penalty"),
        "beta1": HParam(0.5, choice([0.0, 0.5]), "Adam beta1 of both optimizers (beta2 is 0.9)"),
        "mlp_width": HParam(256, int_pow2_uniform(6, 10), "discriminator (and MLP featurizer) width"),
        "mlp_depth": HParam(3, choice([3, 4, 5]), "discriminator (and MLP featurizer) depth"),
        "mlp_dropout": HParam(0.0, choice([0.0, 0.1, 0.5]), "discriminator (and MLP featurizer) dropout"),
        "lr_g": by_dataset(HParam(5e-5, LARGE_LR.sampler, "Adam lr of featurizer and classifier"),
                           ("small_images", HParam(1e-3, SMALL_LR.sampler, "Adam lr of featurizer and classifier"))),
        "lr_d": by_dataset(HParam(5e-5, LARGE_LR.sampler, "Adam lr of the discriminator"),
                           ("small_images", HParam(1e-3, SMALL_LR.sampler, "Adam lr of the discriminator"))),
        "weight_decay_g": by_dataset(HParam(0.0, log_uniform(-6, -2), "Adam weight decay of featurizer and classifier"),
                                     ("small_images", HParam(0.0, help="Adam weight decay of featurizer and classifier"))),
    }
    MIN_TRAIN_DOMAINS = 2
    CONDITIONAL = False

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        hp = self.hparams
        width = self.featurizer.n_outputs
        self.discriminator = MLP(width, num_domains, int(hp["mlp_width"]), int(hp["mlp_depth"]), float(hp["mlp_dropout"]))
        adversary = nn.ModuleDict({"discriminator": self.discriminator})
        if self.CONDITIONAL:
            self.class_embeddings = nn.Embedding(num_classes, width)
            adversary["class_embeddings"] = self.class_embeddings
        self.disc_optimizer = adam(adversary, hp, hp["lr_d"], hp["weight_decay_d"], hp["beta1"])
        self.optimizer = adam(self.network, hp, hp["lr_g"], hp["weight_decay_g"], hp["beta1"])
        self.register_buffer("update_count", torch.tensor(0, dtype=torch.long))

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        check_d_steps(hparams)
        check_beta1(hparams)
        for key in ("lambda", "grad_penalty"):
            if not float(hparams[key]) >= 0:
                raise DomaingenError(f"{key} must be >= 0 (it weighs a loss term), got {hparams[key]}")

    def discriminator_loss(self, features: torch.Tensor, y: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """L_D on `features` (CDANN adds the class embeddings and weighs classes equally)."""
        inputs = features + self.class_embeddings(y) if self.CONDITIONAL else features
        penalty_weight = float(self.hparams["grad_penalty"])
        if penalty_weight and not inputs.requires_grad:
            inputs = inputs.detach().requires_grad_()
        logits = self.discriminator(inputs).float()
        if self.CONDITIONAL:
            # each class weighs the same in total: example i counts 1 / (n_{y_i} * num_classes)
            counts = F.one_hot(y, self.num_classes).sum(dim=0)
            weights = 1.0 / (counts[y] * self.num_classes).float()
            loss = (weights * F.cross_entropy(logits, domains, reduction="none")).sum()
        else:
            loss = F.cross_entropy(logits, domains)
        if penalty_weight:
            grad = torch.autograd.grad(F.cross_entropy(logits, domains, reduction="sum"), [inputs], create_graph=True)[0]
            loss = loss + penalty_weight * grad.float().square().sum(dim=1).mean()
        return loss

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        self.update_count += 1
        x, y = concat(minibatches)
        domains = domain_labels(minibatches)
        if discriminator_turn(int(self.update_count.item()), int(self.hparams["d_steps_per_g_step"])):
            with torch.no_grad():  # this step trains the discriminator only
                features = self.featurizer(x)
            disc_loss = self.discriminator_loss(features, y, domains)
            self.disc_optimizer.zero_grad(set_to_none=True)
            disc_loss.backward()
            self.disc_optimizer.step()
            with torch.no_grad():  # the network is left as it is: its terms are evaluated, not trained
                self.regularization()
            return {"loss": disc_loss.item(), "disc_loss": disc_loss.item()}
        features = self.featurizer(x)
        disc_loss = self.discriminator_loss(features, y, domains)
        class_loss = classification_loss(self.classifier(features), y)
        gen_loss = class_loss - float(self.hparams["lambda"]) * disc_loss
        self.optimizer.zero_grad(set_to_none=True)
        # the G step trains the network only: no gradient is accumulated into the discriminator
        (gen_loss + self.regularization()).backward(inputs=[p for p in self.network.parameters() if p.requires_grad])
        self.optimizer.step()
        return {"loss": gen_loss.item(), "gen_loss": gen_loss.item(), "class_loss": class_loss.item()}


@ALGORITHMS.register("DANN")
class DANN(AbstractDANN):
    """DANN (Ganin et al. 2016): min over features of CE - lambda * the domain discriminator's CE, which it maximises.

    As DomainBed: the generator's adversarial term is the whole discriminator loss,
    gradient penalty included (DomainBed's addition; the paper has none).
    """


@ALGORITHMS.register("CDANN")
class CDANN(AbstractDANN):
    """CDANN (Li et al. 2018): DANN whose discriminator also sees a learned class embedding, classes weighed equally.

    The discriminator reads z + e_y and each example's domain loss is weighed by
    1 / (n_y * num_classes). DomainBed divides by max(y) + 1 of the batch instead of
    num_classes; the two agree whenever the highest class is in the batch.
    """

    CONDITIONAL = True
