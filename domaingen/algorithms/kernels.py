"""Feature-distribution matching: CORAL, MMD, and their CausIRL variants.

- CORAL (Sun & Saenko, "Deep CORAL", ECCV-W 2016) and MMD (Li et al., "Domain
  Generalization with Adversarial Feature Learning", CVPR 2018) add to the mean
  environment risk mmd_gamma times the mean, over pairs of training domains, of a
  distance between the two domains' feature distributions.
- CausIRL (Chevalley et al., "Invariant Causal Mechanisms through Distribution
  Matching", 2022) cuts each domain's minibatch at a random point and matches the
  distribution of the pooled first parts with that of the pooled second parts.

The distances, on features x (n x k) and y (m x k), computed in (at least) fp32:
- "mean_cov" (CORAL): mean_j (mu_x - mu_y)_j^2 + mean_jl (C_x - C_y)_jl^2, with
  unbiased (n - 1) covariances C;
- "gaussian" (MMD): mean K(x, x) + mean K(y, y) - 2 mean K(x, y), the biased
  estimate of the squared MMD, for the kernel K(a, b) = sum_g exp(-g |a - b|^2)
  over g in GAMMAS.

As in DomainBed's classes, the featurizer runs once per domain. Differences
from them: CausIRL's split points come from the algorithm's own numpy stream
(`numpy_draws`), the generator and call DomainBed draws them with from numpy's
global one; the 1e-16 that DomainBed adds to CausIRL's logits (no effect on the
cross-entropy) is left out.
"""

from __future__ import annotations

from typing import Callable, ClassVar, Mapping

import torch

from domaingen.algorithms.base import ALGORITHMS, FeaturizerClassifier, Minibatches, classification_loss
from domaingen.algorithms.numpy_draws import NumpyDraws
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, log_uniform

# the bandwidths of the Gaussian kernel mixture (DomainBed's)
GAMMAS = (0.001, 0.01, 0.1, 1.0, 10.0, 100.0, 1000.0)
# squared distances are clamped below at this value (the expansion may round a zero distance below 0)
MIN_SQUARED_DISTANCE = 1e-30


def squared_distances(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """|a_i - b_j|^2 for every row pair, as (|b_j|^2 - 2 a_i.b_j) + |a_i|^2, clamped at MIN_SQUARED_DISTANCE.

    The expansion's rounding error (large where |a_i| is large and a_i = b_j) is part of
    the method as published: the widest kernels (g = 1000) see it. It is computed in
    DomainBed's order of operations (one addmm, then |a_i|^2) so that the two agree.
    """
    norms_a = a.square().sum(1, keepdim=True)
    norms_b = b.square().sum(1, keepdim=True).transpose(0, 1)
    return torch.addmm(norms_b, a, b.transpose(0, 1), alpha=-2).add_(norms_a).clamp_min_(MIN_SQUARED_DISTANCE)


def gaussian_kernel(a: torch.Tensor, b: torch.Tensor, gammas=GAMMAS) -> torch.Tensor:
    """sum_g exp(-g |a_i - b_j|^2), one entry per row pair."""
    distances = squared_distances(a, b)
    return sum(torch.exp(-g * distances) for g in gammas)


def gaussian_mmd(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Biased estimate of the squared MMD between the rows of x and of y under `gaussian_kernel`."""
    return gaussian_kernel(x, x).mean() + gaussian_kernel(y, y).mean() - 2 * gaussian_kernel(x, y).mean()


def mean_cov_distance(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of the feature means plus that of the (unbiased) covariance matrices."""
    mean_x, mean_y = x.mean(0), y.mean(0)
    centred_x, centred_y = x - mean_x, y - mean_y
    cov_x = centred_x.transpose(0, 1) @ centred_x / (x.shape[0] - 1)
    cov_y = centred_y.transpose(0, 1) @ centred_y / (y.shape[0] - 1)
    return (mean_x - mean_y).square().mean() + (cov_x - cov_y).square().mean()


DISTANCES: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "gaussian": gaussian_mmd,
    "mean_cov": mean_cov_distance,
}


def at_least_fp32(t: torch.Tensor) -> torch.Tensor:
    """`t` in fp32, or as it is when wider (fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def feature_distance(kind: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """DISTANCES[kind](x, y) in at least fp32 with autocast off (under bf16 autocast the
    squared distances would be rounded to 3 digits before the exponentials of the wide kernels)."""
    with torch.autocast(x.device.type, enabled=False):
        return DISTANCES[kind](at_least_fp32(x), at_least_fp32(y))


class FeatureMatching(FeaturizerClassifier):
    """Shared pieces: the mmd_gamma hyperparameter and its check, features and logits per domain."""

    HPARAMS = {"mmd_gamma": HParam(1.0, log_uniform(-1, 1), "weight of the feature-distribution distance")}
    DISTANCE: ClassVar[str] = ""

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.check_hparams(self.hparams)

    @classmethod
    def check_hparams(cls, hparams: Mapping) -> None:
        super().check_hparams(hparams)
        gamma = hparams.get("mmd_gamma", 1.0)
        if not float(gamma) >= 0:
            raise DomaingenError(f"mmd_gamma must be >= 0 (it weighs the feature distance), got {gamma}")

    def features_and_logits(self, minibatches: Minibatches) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(features, logits) per domain, one featurizer pass per domain as in DomainBed.

        One pass over the concatenated minibatches would give the same features up to
        rounding, but the Gaussian kernels' widest bandwidths (g = 1000 on distances of
        features with norms in the tens) amplify rounding: after five MMD updates on
        MNIST_CNN the predictions of the two ways differ by ~3e-3 relative.
        """
        features = [self.featurizer(x) for x, _ in minibatches]
        return features, [self.classifier(z) for z in features]

    def finish(self, objective: torch.Tensor, penalty: torch.Tensor) -> dict[str, float]:
        """One step on objective + mmd_gamma * penalty; DomainBed's record ('loss' is the objective alone)."""
        self.step(objective + float(self.hparams["mmd_gamma"]) * penalty)
        return {"loss": objective.item(), "penalty": penalty.item()}


class PairwiseFeatureMatching(FeatureMatching):
    """Mean environment risk + mmd_gamma * the mean distance over pairs of training domains."""

    MIN_TRAIN_DOMAINS = 2  # the penalty compares domains
    EAGER_STEP = ""  # fixed-size minibatches, every pair of domains at every step: static shapes

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        features, logits = self.features_and_logits(minibatches)
        n = len(minibatches)
        objective = sum(classification_loss(z, y) for z, (_, y) in zip(logits, minibatches)) / n
        distances = [feature_distance(self.DISTANCE, features[i], features[j]) for i in range(n) for j in range(i + 1, n)]
        penalty = torch.stack(distances).mean() if distances else objective.new_zeros(())
        return self.finish(objective, penalty)


@ALGORITHMS.register("CORAL")
class CORAL(PairwiseFeatureMatching):
    """Deep CORAL: risk + mmd_gamma * mean over domain pairs of |mean difference|^2 + |covariance difference|^2 (means of squares)."""

    DISTANCE = "mean_cov"


@ALGORITHMS.register("MMD")
class MMD(PairwiseFeatureMatching):
    """MMD matching: risk + mmd_gamma * mean over domain pairs of the squared MMD under a mixture of Gaussian kernels."""

    DISTANCE = "gaussian"
    # after five compiled MLP updates the weights differed from the eager ones by 2e-3
    EAGER_STEP = ("its widest Gaussian kernels (g = 1000) amplify rounding, so compiled kernels, which round "
                  "differently, drift from the eager update")


class CausalFeatureMatching(NumpyDraws, FeatureMatching):
    """CausIRL: each domain's minibatch is cut at a uniformly drawn point s in [0, n); the pooled
    first parts and the pooled second parts are matched (no penalty unless both hold at least two
    examples; a non-finite distance counts as 0, as in DomainBed). The risk is the mean over domains.
    """

    def __init__(self, input_shape, num_classes, num_domains, hparams) -> None:
        super().__init__(input_shape, num_classes, num_domains, hparams)
        self.init_numpy_draws()

    def update(self, minibatches: Minibatches) -> dict[str, float]:
        features, logits = self.features_and_logits(minibatches)
        objective = sum(classification_loss(z, y) for z, (_, y) in zip(logits, minibatches)) / len(minibatches)
        cuts = [int(self.numpy_rng.randint(0, len(z))) for z in features]
        first = torch.cat([z[:cut] for z, cut in zip(features, cuts)])
        second = torch.cat([z[cut:] for z, cut in zip(features, cuts)])
        if len(first) > 1 and len(second) > 1:
            penalty = torch.nan_to_num(feature_distance(self.DISTANCE, first, second))
        else:
            penalty = objective.new_zeros((), dtype=torch.float32)
        return self.finish(objective, penalty)


@ALGORITHMS.register("CausIRL_CORAL")
class CausIRL_CORAL(CausalFeatureMatching):
    """CausIRL with the CORAL distance: risk + mmd_gamma * mean/covariance distance between two random parts of the batch."""

    DISTANCE = "mean_cov"


@ALGORITHMS.register("CausIRL_MMD")
class CausIRL_MMD(CausalFeatureMatching):
    """CausIRL with the MMD distance: risk + mmd_gamma * Gaussian-kernel MMD between two random parts of the batch."""

    DISTANCE = "gaussian"
