"""Spectral decoupling (Pezeshki et al., NeurIPS 2021, "Gradient Starvation")."""

from __future__ import annotations

from typing import Any, Mapping

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss, concat
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform


@ALGORITHMS.register("SD")
class SD(FeaturizerClassifier):
    """Cross-entropy + sd_reg * mean over examples and logits of logit^2 (an L2 penalty on the logits).

    The paper writes the penalty as (lambda / 2) * ||y_hat||^2 per example (summed over the
    K logits, averaged over examples); DomainBed's, kept here so that its sd_reg values
    carry over, averages over the logits as well: sd_reg = lambda * K / 2 (the same for
    K = 2). The objective is otherwise the paper's, and the same update as DomainBed's.
    """

    HPARAMS = {"sd_reg": HParam(0.1, log_uniform(-5, -1), "weight of the squared-logit penalty")}

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        if not float(hparams["sd_reg"]) >= 0:
            raise DomaingenError(f"sd_reg must be >= 0 (it weighs a penalty), got {hparams['sd_reg']}")

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        logits = self.predict(x)
        nll = classification_loss(logits, y)
        penalty = logits.float().square().mean()  # fp32 under bf16 autocast
        self.step(nll + float(self.hparams["sd_reg"]) * penalty)
        return {"loss": nll.item(), "penalty": penalty.item()}
