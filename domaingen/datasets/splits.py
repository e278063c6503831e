"""The in/out split of every environment (DomainBed's protocol).

Each environment is split once into `out` (holdout_fraction, validation) and
`in` (the rest, training or reported test accuracy), seeded by
(trial_seed, environment index), so trials differ and runs of one trial agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from domaingen.datasets.environment import Environment
from domaingen.hparams import seed_hash


class HasEnvironments(Protocol):
    """What splitting needs of a dataset (a MultiDomainDataset): its environments, in order."""

    environments: Sequence[Environment]


@dataclass
class Split:
    """The examples of one environment that one split holds."""

    env: Environment
    index: torch.Tensor

    def __len__(self) -> int:
        return len(self.index)

    def batch(self, positions: torch.Tensor | slice) -> tuple[torch.Tensor, torch.Tensor]:
        """(float inputs, labels) of the split's examples at `positions`."""
        return self.env.batch(self.index[positions])


def split_indices(n: int, holdout_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(in, out) index tensors of a seeded permutation; out holds int(n * holdout_fraction)."""
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed))
    n_out = int(n * holdout_fraction)
    return order[n_out:], order[:n_out]


def split_environments(
    dataset: HasEnvironments, holdout_fraction: float, trial_seed: int
) -> list[tuple[Split, Split]]:
    """(in, out) splits of every environment, in environment order."""
    splits = []
    for i, env in enumerate(dataset.environments):
        in_idx, out_idx = split_indices(len(env), holdout_fraction, seed_hash(trial_seed, i))
        splits.append((Split(env, in_idx), Split(env, out_idx)))
    return splits
