"""CLIP: the zero-shot and linear-probe baselines of a CLIP-like model (open_clip).

`clip_model` names the open_clip model and, after a colon, its pretrained weights
(`ViT-B-32`, `ViT-B-32:laion2b_s34b_b79k`; see networks/clip_models.py). The image tower is
frozen (eval mode, no gradients). Training fits a linear classifier over its image embedding
by cross-entropy on the training domains: the linear probe, the default prediction, selected
like any run's (row `CLIP`). The test-time mode `zero_shot` (row `CLIP-ZeroShot`) classifies
by the text tower instead: logit scale x the cosine similarity of the image embedding and each
class's text embedding (its `clip_prompt` templates filled with the dataset's class name,
embedded, normalised, averaged and normalised again). Training never changes it, so every
checkpoint, the first (step 0) included, gives the same zero-shot accuracies.

    domaingen train --dataset RotatedMNIST --algorithm CLIP --test_envs 5 --steps 1001 \
        --hparams '{"clip_model": "ViT-B-32", "clip_prompt": "a photo of the number {}.|the digit {}"}'

Without `clip_model` the tower is the dataset's featurizer, frozen at its random
initialisation, and there is no zero-shot mode: what the generic algorithm checks build. A
run refuses that (`check_hparams`), and a dataset without class names (`class_names`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms.base import ALGORITHMS, Algorithm, Minibatches, classification_loss, concat, make_adam
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam
from domaingen.networks import as_bool, build_classifier, build_featurizer
from domaingen.networks.clip_models import PREFIX, CLIPFeaturizer, check_templates, check_weights

ZERO_SHOT = "zero_shot"


@ALGORITHMS.register("CLIP")
class CLIP(Algorithm):
    """A linear probe of a frozen CLIP image tower, and its zero-shot prediction (`predict_mode(x, "zero_shot")`)."""

    HPARAMS = {
        "clip_model": HParam("", help="the open_clip model, MODEL or MODEL:TAG (ViT-B-32, "
                                      "ViT-B-32:laion2b_s34b_b79k, domaingen-tiny for tests); a run needs one"),
        "clip_pretrained": HParam(True, help="load the model's pretrained weights ($DOMAINGEN_WEIGHTS or the "
                                             "Hugging Face cache); false = random initialisation"),
        "clip_prompt": HParam("a photo of a {}.", help="zero-shot prompt templates separated by '|', each with "
                                                       "one {} for the class name; their embeddings are averaged"),
    }
    NO_ADDITIVE_PENALTY = ("a linear probe trains the classifier alone over a frozen tower, so masks of the tower "
                           "never train")
    NEEDS_CLASS_NAMES = "its zero-shot classifier embeds the class names"

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        model = str(self.hparams.get("clip_model", "") or "")
        if model:
            self.featurizer = CLIPFeaturizer(self.input_shape, PREFIX + model,
                                             pretrained=as_bool(self.hparams.get("clip_pretrained", True),
                                                                "clip_pretrained"))
            self.templates = check_templates(self.hparams.get("clip_prompt", "a photo of a {}."))
            self.register_buffer("zero_shot_weights", torch.zeros(num_classes, self.featurizer.n_outputs))
            self.EVAL_MODES = {ZERO_SHOT: False}
        else:
            self.featurizer = build_featurizer(self.input_shape, self.hparams)
        self.featurizer.requires_grad_(False)
        self.classifier = build_classifier(self.featurizer.n_outputs, num_classes,
                                           single_logit=bool(self.hparams.get("single_logit", False)))
        self.network = nn.Sequential(self.featurizer, self.classifier)
        self.optimizer = make_adam(self.classifier, self.hparams)
        self.train()

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        model = str(hparams.get("clip_model", "") or "")
        if not model:
            raise DomaingenError("CLIP needs an open_clip model: --hparams '{\"clip_model\": \"ViT-B-32\"}' "
                                 "(MODEL or MODEL:TAG; domaingen-tiny with clip_pretrained false for a test)")
        check_templates(hparams.get("clip_prompt", "a photo of a {}."))
        check_weights(PREFIX + model, as_bool(hparams.get("clip_pretrained", True), "clip_pretrained"))

    def train(self, mode: bool = True) -> "CLIP":
        super().train(mode)
        self.featurizer.eval()  # frozen: dropout off, normalisation statistics fixed
        return self

    def set_class_names(self, names: Sequence[str]) -> None:
        """Embed the class names' prompts: the zero-shot classifier (nothing to do without a CLIP model)."""
        if isinstance(self.featurizer, CLIPFeaturizer):
            if len(names) != self.num_classes:
                raise DomaingenError(f"CLIP got {len(names)} class names for {self.num_classes} classes")
            weights = self.featurizer.text_classifier(list(names), self.templates)
            self.zero_shot_weights.copy_(weights.to(self.zero_shot_weights))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        """The frozen tower's features of `x` (no graph)."""
        with torch.no_grad():
            return self.featurizer(x)

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        loss = classification_loss(self.classifier(self.features(x)), y)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return {"loss": loss.item()}

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        return self.classifier(self.features(x))

    def predict_mode(self, x: torch.Tensor, mode: str, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        if mode != ZERO_SHOT or ZERO_SHOT not in self.EVAL_MODES:
            return super().predict_mode(x, mode, domain)
        image = F.normalize(self.features(x).float(), dim=-1)
        return self.featurizer.logit_scale * image @ self.zero_shot_weights.t()

    def predict_modes(self, x: torch.Tensor, modes: Sequence[str | None],
                      domain: int | torch.Tensor | None = None) -> list[torch.Tensor]:
        """One pass of the tower for every mode: the probe's logits and the zero-shot logits share the features."""
        if ZERO_SHOT not in self.EVAL_MODES:
            return super().predict_modes(x, modes, domain)
        features = self.features(x)
        image = F.normalize(features.float(), dim=-1)
        return [self.classifier(features) if mode is None else
                (self.featurizer.logit_scale * image @ self.zero_shot_weights.t()).to(features.dtype)
                if mode == ZERO_SHOT else self.predict_mode(x, mode, domain) for mode in modes]
