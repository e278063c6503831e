"""The in/out split of every environment (DomainBed's protocol), and the in-domain test split.

Each environment is split once into `out` (holdout_fraction, validation) and
`in` (the rest, training or reported test accuracy), seeded by
(trial_seed, environment index), so trials differ and runs of one trial agree.

With `in_domain_test` f (off by default, `--in_domain_test`), each *training*
environment is split three ways by the same seeded permutation: `out` is exactly the
validation split it would be without f, the next int(n * f) examples are the
in-domain test split (`idtest`, read by no training and no selection, only by the
in-domain table), and `in`, what training reads, is the rest. Held-out environments
keep their in/out split.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

import torch

from domaingen.datasets.environment import Environment
from domaingen.errors import DomaingenError
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


def three_way_indices(
    n: int, holdout_fraction: float, in_domain_test: float, seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(in, out, idtest) index tensors of the permutation `split_indices` draws: `out` is the same
    as split_indices', `idtest` the next int(n * in_domain_test) positions, `in` the rest."""
    in_idx, out_idx = split_indices(n, holdout_fraction, seed)
    n_test = int(n * in_domain_test)
    return in_idx[n_test:], out_idx, in_idx[:n_test]


def split_environments(
    dataset: HasEnvironments, holdout_fraction: float, trial_seed: int,
    in_domain_test: float | None = None, test_envs: Sequence[int] = (),
) -> list[tuple[Split, Split]]:
    """(in, out) splits of every environment, in environment order.

    With `in_domain_test`, the training environments' `in` splits leave out their
    in-domain test examples (`in_domain_test_splits`).
    """
    splits = []
    for i, env in enumerate(dataset.environments):
        fraction = in_domain_test if in_domain_test and i not in test_envs else 0.0
        in_idx, out_idx, _ = three_way_indices(len(env), holdout_fraction, fraction, seed_hash(trial_seed, i))
        splits.append((Split(env, in_idx), Split(env, out_idx)))
    return splits


def in_domain_test_splits(
    dataset: HasEnvironments, holdout_fraction: float, trial_seed: int,
    in_domain_test: float | None, test_envs: Sequence[int],
) -> list[Split | None]:
    """Per environment, its in-domain test split; None for a held-out environment or when `in_domain_test` is off."""
    if not in_domain_test:
        return [None] * len(dataset.environments)
    return [
        None if i in test_envs
        else Split(env, three_way_indices(len(env), holdout_fraction, in_domain_test, seed_hash(trial_seed, i))[2])
        for i, env in enumerate(dataset.environments)
    ]


MAX_IN_DOMAIN_TEST = 0.5


def check_in_domain_test(fraction: float | None, holdout_fraction: float) -> None:
    """Raise a one-line DomaingenError unless `fraction` is None (off) or in (0, 0.5) and leaves a training split."""
    if fraction is None:
        return
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction < MAX_IN_DOMAIN_TEST:
        raise DomaingenError(
            f"in_domain_test must be a fraction in (0, {MAX_IN_DOMAIN_TEST}) of each training domain, got {fraction!r}; "
            "leave it out for the two-way in/out split")
    if holdout_fraction + fraction >= 1:
        raise DomaingenError(
            f"holdout_fraction {holdout_fraction} + in_domain_test {fraction} leave no training examples; "
            "lower one of them")


def check_class_coverage(
    splits: Sequence[tuple[Split, Split]], idtest: Sequence[Split | None], class_names: Sequence[str] | None = None,
) -> None:
    """Raise a one-line DomaingenError when a training environment's train, validation or in-domain
    test split lacks a class that the environment has (checked only where an in-domain test split exists)."""
    for i, ((split_in, split_out), test) in enumerate(zip(splits, idtest)):
        if test is None:
            continue  # a held-out environment keeps DomainBed's split
        labels = split_in.env.y
        present = set(torch.unique(labels).tolist())
        for part, split in (("train", split_in), ("validation", split_out), ("in-domain test", test)):
            missing = present - set(torch.unique(labels[split.index]).tolist())
            if missing:
                name = getattr(split.env, "name", f"env{i}")
                label = min(missing)
                shown = class_names[label] if class_names and label < len(class_names) else label
                raise DomaingenError(
                    f"the {part} split of environment {i} ({name}) has no example of class {shown}: "
                    f"{len(split)} of {len(labels)} examples; lower in_domain_test or holdout_fraction, or use more data")
