"""PermutedMNIST: MNIST whose environments are fixed pixel permutations (Csordás et al., ICLR 2021).

Its own module, imported after the image datasets: `domaingen list` and name errors list datasets in
registration order, the MNIST and image datasets first.
"""

from __future__ import annotations

import torch

from domaingen.datasets.base import DATASETS
from domaingen.datasets.environment import Environment
from domaingen.datasets.mnist import MNISTDomains


@DATASETS.register("PermutedMNIST")
class PermutedMNIST(MNISTDomains):
    """Ten-class MNIST as flat 784-pixel vectors, each environment's pixels in its own fixed order
    (Csordás et al.'s permuted MNIST): `p0` the identity, the others random permutations drawn
    once from DATA_SEED (`pixel_permutation`)."""

    ENVIRONMENTS = ("p0", "p1", "p2")
    INPUT_SHAPE = (784,)
    NUM_CLASSES = 10

    def make_environment(self, images, labels, env_index, generator):
        return Environment("", images.flatten(1)[:, self.pixel_permutation(env_index)].contiguous(), labels)

    def pixel_permutation(self, env_index: int) -> torch.Tensor:
        """Environment `env_index`'s pixel order: input pixel j is image pixel order[j]."""
        return pixel_permutation(env_index, self.DATA_SEED)


def pixel_permutation(index: int, data_seed: int = 0) -> torch.Tensor:
    """Permutation `index`'s pixel order (any index >= 0; 0 is the identity), drawn from `data_seed`:
    input pixel j is image pixel order[j]. PermutedMNIST's environment i is permutation i."""
    if index == 0:
        return torch.arange(784)
    return torch.randperm(784, generator=torch.Generator().manual_seed(data_seed * 1000 + 500 + index))
