"""Uniform risk minimisation, URM (Krishnamachari et al., TMLR 2024, "Uniformly distributed
feature representations for fair and robust learning"), adversarial form.

The featurizer's output goes through a bounded activation (tanh: [-1, 1]; relu or
sigmoid: [0, 1]) and is pushed towards the uniform distribution on that box by a
discriminator D (an MLP with one logit) that tells features from uniform noise u:

    featurizer + classifier:  min  CE(c(z), y) + lambda * BCE(D(z), 1)
    discriminator (after it): min  BCE(D(u), 1) + lambda * BCE(D(z.detach()), 0)

with z = f(x) from before the featurizer's step, as in DomainBed. With label smoothing s > 0
the discriminator's targets are drawn from U(1 - s, 1) and U(0, s) (DomainBed's calls, in
its order: the noise, then the true targets, then the fake ones).
"""

from __future__ import annotations

from typing import Any, Mapping

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, by_dataset, choice, log_uniform, uniform

# the box each bounded activation maps into: the support of the uniform target
BOXES = {"tanh": (-1.0, 1.0), "relu": (0.0, 1.0), "sigmoid": (0.0, 1.0)}
ACTIVATIONS = {"tanh": nn.Tanh, "relu": nn.ReLU, "sigmoid": nn.Sigmoid}
DISCRIMINATOR_WIDTH = 100


class OutputActivation:
    """A forward hook that passes a module's output through `activation` (the featurizer keeps its layout)."""

    def __init__(self, activation: nn.Module) -> None:
        self.activation = activation

    def __call__(self, module: nn.Module, inputs: Any, output: torch.Tensor) -> torch.Tensor:
        return self.activation(output)


def discriminator(n_inputs: int, hidden_layers: int) -> nn.Sequential:
    """Linear(n, 100), LeakyReLU, `hidden_layers` x (Linear(100, 100), LeakyReLU), Linear(100, 1)."""
    layers: list[nn.Module] = [nn.Linear(n_inputs, DISCRIMINATOR_WIDTH), nn.LeakyReLU()]
    for _ in range(hidden_layers):
        layers += [nn.Linear(DISCRIMINATOR_WIDTH, DISCRIMINATOR_WIDTH), nn.LeakyReLU()]
    layers.append(nn.Linear(DISCRIMINATOR_WIDTH, 1))
    return nn.Sequential(*layers)


@ALGORITHMS.register("URM")
class URM(FeaturizerClassifier):
    """URM (Krishnamachari et al. 2024): CE + lambda * an adversarial loss that makes bounded features uniform."""

    HPARAMS = {
        "urm": HParam("adversarial", choice(["adversarial"]), "how uniformity is enforced (adversarial only)"),
        "urm_adv_lambda": HParam(0.1, uniform(0.0, 0.2), "weight of the adversarial term"),
        "urm_discriminator_label_smoothing": HParam(0.0, uniform(0.0, 0.0), "discriminator label smoothing s in [0, 1]"),
        "urm_discriminator_optimizer": HParam("adam", choice(["adam"]), "adam or sgd (momentum 0.9)"),
        "urm_discriminator_hidden_layers": HParam(1, choice([1, 2, 3]), "hidden 100-unit layers of the discriminator"),
        "urm_generator_output": HParam("tanh", choice(["tanh", "relu"]), "featurizer output activation: tanh, relu, sigmoid"),
        "urm_discriminator_lr": by_dataset(
            HParam(5e-5, log_uniform(-6, -4.5), "learning rate of the discriminator"),
            ("small_images", HParam(1e-3, log_uniform(-5.5, -3.5), "learning rate of the discriminator")),
        ),
    }

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        self.check_hparams(hparams)
        super().__init__(input_shape, num_classes, num_domains, hparams)
        hp = self.hparams
        self.discriminator = discriminator(self.featurizer.n_outputs, int(hp["urm_discriminator_hidden_layers"]))
        lr, decay = float(hp["urm_discriminator_lr"]), float(hp.get("weight_decay", 0.0))
        if hp["urm_discriminator_optimizer"] == "sgd":
            self.disc_optimizer: torch.optim.Optimizer = torch.optim.SGD(
                self.discriminator.parameters(), lr=lr, weight_decay=decay, momentum=0.9)
        else:
            self.disc_optimizer = torch.optim.Adam(self.discriminator.parameters(), lr=lr, weight_decay=decay)

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        if hparams["urm"] != "adversarial":
            raise DomaingenError(f"urm must be adversarial (the only form implemented), got {hparams['urm']!r}")
        if hparams["urm_generator_output"] not in BOXES:
            raise DomaingenError(
                f"urm_generator_output must be one of {', '.join(BOXES)}, got {hparams['urm_generator_output']!r}")
        if hparams["urm_discriminator_optimizer"] not in ("adam", "sgd"):
            raise DomaingenError(
                f"urm_discriminator_optimizer must be adam or sgd, got {hparams['urm_discriminator_optimizer']!r}")
        layers = hparams["urm_discriminator_hidden_layers"]
        if isinstance(layers, bool) or not float(layers).is_integer() or layers < 0:
            raise DomaingenError(f"urm_discriminator_hidden_layers must be an integer >= 0, got {layers}")
        if not 0.0 <= float(hparams["urm_discriminator_label_smoothing"]) <= 1.0:
            raise DomaingenError(
                "urm_discriminator_label_smoothing must be in [0, 1], "
                f"got {hparams['urm_discriminator_label_smoothing']}")
        if not float(hparams["urm_adv_lambda"]) >= 0:
            raise DomaingenError(f"urm_adv_lambda must be >= 0 (it weighs a loss term), got {hparams['urm_adv_lambda']}")

    def prepare_modules(self) -> None:
        # the bounded output is part of the featurizer (every call of it, diagnostics included), added as a
        # hook so that its layers keep their names
        self.feature_activation = ACTIVATIONS[self.hparams["urm_generator_output"]]()
        self.featurizer.register_forward_hook(OutputActivation(self.feature_activation))
        super().prepare_modules()

    def discriminator_logit(self, features: torch.Tensor) -> torch.Tensor:
        return self.discriminator(features)[:, 0].float()

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        weight = float(self.hparams["urm_adv_lambda"])
        features = self.featurizer(x)
        ce = classification_loss(self.classifier(features), y)
        fooled = self.discriminator_logit(features)
        g_loss = F.binary_cross_entropy_with_logits(fooled, torch.ones_like(fooled))
        loss = ce + weight * g_loss
        self.optimizer.zero_grad(set_to_none=True)
        (loss + self.regularization()).backward(inputs=[p for p in self.network.parameters() if p.requires_grad])
        self.optimizer.step()
        d_loss = self.discriminator_step(features.detach().float(), weight)
        return {"loss": loss.item(), "ce": ce.item(), "g_loss": g_loss.item(), "d_loss": d_loss}

    def discriminator_step(self, features: torch.Tensor, weight: float) -> float:
        """One step of D: uniform noise on the activation's box is 'true', the features are 'fake'."""
        low, high = BOXES[self.hparams["urm_generator_output"]]
        noise = (high - low) * torch.rand(features.size(), dtype=features.dtype, device=features.device) + low
        noise_logit, feature_logit = self.discriminator_logit(noise), self.discriminator_logit(features)
        smoothing = float(self.hparams["urm_discriminator_label_smoothing"])
        if smoothing:
            true = (1.0 - (1.0 - smoothing)) * torch.rand(len(noise), device=noise.device) + (1.0 - smoothing)
            fake = smoothing * torch.rand(len(features), device=features.device)
        else:
            true, fake = torch.ones_like(noise_logit), torch.zeros_like(feature_logit)
        d_loss = (F.binary_cross_entropy_with_logits(noise_logit, true)
                  + weight * F.binary_cross_entropy_with_logits(feature_logit, fake))
        self.disc_optimizer.zero_grad(set_to_none=True)
        d_loss.backward()
        self.disc_optimizer.step()
        return d_loss.item()
