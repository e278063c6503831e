"""Inter-domain Mixup (Xu et al., AAAI 2020, arXiv:2001.00677; Yan et al. 2020, arXiv:1912.01805)."""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform


@ALGORITHMS.register("Mixup")
class Mixup(FeaturizerClassifier):
    """Mean over environment pairs of lam * CE(f(x_mix), y_i) + (1 - lam) * CE(f(x_mix), y_j).

    x_mix = lam * x_i + (1 - lam) * x_j, with lam ~ Beta(mixup_alpha, mixup_alpha).

    The pairs: the environments in the order of one torch.randperm, each paired with the
    next (the last with the first), both truncated to the shorter batch; one lam per pair,
    drawn by numpy's legacy `beta`, as DomainBed draws them. The numpy generator is the
    algorithm's own (seeded from torch.initial_seed(), saved in checkpoints), not numpy's
    global one, which a run neither seeds nor checkpoints. A one-logit classifier mixes
    its two logistic losses the same way.
    """

    HPARAMS = {"mixup_alpha": HParam(0.2, log_uniform(-1, 1), "Beta(alpha, alpha) parameter of the mixing weight")}

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)
        self.rng = np.random.RandomState(torch.initial_seed() % 2**32)

    @classmethod
    def check_hparams(cls, hparams: Mapping[str, Any]) -> None:
        super().check_hparams(hparams)
        if not float(hparams["mixup_alpha"]) > 0:
            raise DomaingenError(
                f"mixup_alpha must be > 0 (the parameter of Beta(alpha, alpha)), got {hparams['mixup_alpha']}"
            )

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        alpha = float(self.hparams["mixup_alpha"])
        n = len(minibatches)
        order = torch.randperm(n).tolist()
        objective = 0.0
        for k in range(n):
            (xi, yi), (xj, yj) = minibatches[order[k]], minibatches[order[(k + 1) % n]]
            m = min(len(xi), len(xj))
            lam = float(self.rng.beta(alpha, alpha))
            logits = self.predict(lam * xi[:m] + (1 - lam) * xj[:m])
            objective = objective + lam * classification_loss(logits, yi[:m]) + (1 - lam) * classification_loss(logits, yj[:m])
        objective = objective / n
        self.step(objective)
        return {"loss": objective.item()}

    def checkpoint_state(self) -> dict[str, Any]:
        _, key, pos, has_gauss, gauss = self.rng.get_state()
        rng = {"key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos), "has_gauss": int(has_gauss),
               "gauss": float(gauss)}
        return {**super().checkpoint_state(), "mixup_rng": rng}

    def load_checkpoint_state(self, state: Mapping[str, Any]) -> None:
        super().load_checkpoint_state(state)
        rng = state["mixup_rng"]
        self.rng.set_state(("MT19937", rng["key"].numpy().astype(np.uint32), rng["pos"], rng["has_gauss"], rng["gauss"]))
