"""Empirical risk minimisation: one cross-entropy over all training environments."""

from __future__ import annotations

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, concat


@ALGORITHMS.register("ERM")
class ERM(FeaturizerClassifier):
    """Minimise the mean cross-entropy of the concatenated minibatches (or the loss `fc_loss` names)."""

    EAGER_STEP = ""  # one concatenated batch of fixed size: static shapes

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        x, y = concat(minibatches)
        loss = self.classification_objective(self.predict(x), y)
        self.step(loss)
        return {"loss": loss.item()}
