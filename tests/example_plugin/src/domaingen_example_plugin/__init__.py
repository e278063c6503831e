"""An example domaingen plugin: ERM with label smoothing, registered as `LabelSmoothing`.

Importing this module registers the algorithm; domaingen imports it through the
`domaingen.plugins` entry point of this package (see pyproject.toml), through
`DOMAINGEN_PLUGINS=domaingen_example_plugin`, or through `--plugins domaingen_example_plugin`.
"""

from __future__ import annotations

from typing import Any

import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat
from domaingen.hparams import HParam, uniform


@ALGORITHMS.register("LabelSmoothing")
class LabelSmoothing(FeaturizerClassifier):
    """ERM on label-smoothed targets: (1 - eps) on the true class, eps spread over all classes."""

    # Declared beside the class. A name that another algorithm or the dataset declares too
    # (lr, batch_size, mlp_width...) draws one value for both at a given hparams_seed;
    # `smoothing` is this algorithm's own.
    HPARAMS = {
        "smoothing": HParam(0.1, uniform(0.0, 0.2), "weight of the uniform distribution mixed into each target"),
    }

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self._confidence = float("nan")

    def smoothed_loss(self, logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """(1 - eps) * loss(y) + eps * mean over classes k of loss(k).

        classification_loss takes one logit (the logistic loss of a binary task) as
        well as one logit per class, so the smoothing works for both heads.
        """
        eps = float(self.hparams["smoothing"])
        uniform_part = sum(classification_loss(logits, torch.full_like(y, k)) for k in range(self.num_classes))
        return (1 - eps) * classification_loss(logits, y) + eps * uniform_part / self.num_classes

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        logits = self.predict(x)
        loss = self.smoothed_loss(logits, y)
        self.step(loss)  # adds the regularization terms (L2, X+ModReg's penalty), then one Adam step
        with torch.no_grad():
            self._confidence = predicted_class_probability(logits.float()).mean().item()
        return {"loss": loss.item(), "nll": classification_loss(logits.detach(), y).item()}

    def diagnostics(self) -> dict[str, Any]:
        """A field of every results record: the mean probability of the predicted class in the last batch."""
        return {"label_smoothing_confidence": self._confidence}


def predicted_class_probability(logits: torch.Tensor) -> torch.Tensor:
    """Per example, the probability the model gives its predicted class (one logit: a sigmoid)."""
    if logits.shape[1] == 1:
        p = torch.sigmoid(logits[:, 0])
        return torch.maximum(p, 1 - p)
    return torch.softmax(logits, dim=1).max(dim=1).values
