"""The in/out split of every environment (DomainBed's protocol), and the in-domain test split.

Each environment is split once into `out` (holdout_fraction, validation) and
`in` (the rest, training or reported test accuracy), seeded by
(trial_seed, environment index), so trials differ and runs of one trial agree.

Under the domainbed protocol (a dataset built with `DOMAINBED_SEED`) the permutation is
DomainBed's own (`misc.split_dataset` in its train.py): numpy's RandomState seeded by DomainBed's
hash of (trial_seed, environment index) shuffles the environment, so every split holds DomainBed's
examples in DomainBed's order.

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

import numpy as np
import torch

from domaingen.datasets.environment import Environment
from domaingen.errors import DomaingenError
from domaingen.hparams import domainbed_seed_hash, seed_hash


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


def _check_holdout(holdout_fraction: float) -> None:
    if not 0.0 <= holdout_fraction < 1.0:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")


def split_indices(n: int, holdout_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(in, out) index tensors of a seeded permutation; out holds int(n * holdout_fraction)."""
    _check_holdout(holdout_fraction)
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


def _domainbed_order(n: int, seed: int) -> torch.Tensor:
    # numpy's legacy permutation draws what DomainBed's RandomState(seed).shuffle(list(range(n))) does
    return torch.from_numpy(np.random.RandomState(seed).permutation(n).astype(np.int64))


def domainbed_three_way_indices(
    n: int, holdout_fraction: float, in_domain_test: float, trial_seed: int, env_index: int, held_out: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(in, out, idtest) index tensors of DomainBed's split of environment `env_index` (n examples).

    `out` and `in` are DomainBed's (`misc.split_dataset` seeded by its hash of (trial_seed, env_index)),
    in its order; `idtest` takes the next int(n * in_domain_test) positions, as `three_way_indices`
    does. A `held_out` environment's in split is reordered as DomainBed's second split (its
    unlabelled part, empty at its default uda_holdout_fraction 0) reorders it: same examples.
    """
    _check_holdout(holdout_fraction)
    seed = domainbed_seed_hash(int(trial_seed), int(env_index))
    order = _domainbed_order(n, seed)
    n_out, n_test = int(n * holdout_fraction), int(n * in_domain_test)
    out_idx, in_idx = order[:n_out], order[n_out:]
    if held_out:
        in_idx = in_idx[_domainbed_order(len(in_idx), seed)]
    return in_idx[n_test:], out_idx, in_idx[:n_test]


def built_as_domainbed(dataset: HasEnvironments) -> bool:
    """Whether `dataset` was built as DomainBed's run builds it (the domainbed protocol), which splits it as DomainBed does."""
    return getattr(dataset, "DOMAINBED_SEED", None) is not None


def environment_indices(
    dataset: HasEnvironments, env_index: int, holdout_fraction: float, in_domain_test: float, trial_seed: int,
    held_out: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(in, out, idtest) index tensors of one environment of `dataset`: DomainBed's split under the
    domainbed protocol, else the permutation seeded by seed_hash(trial_seed, env_index)."""
    n = len(dataset.environments[env_index])
    if built_as_domainbed(dataset):
        return domainbed_three_way_indices(n, holdout_fraction, in_domain_test, trial_seed, env_index, held_out)
    return three_way_indices(n, holdout_fraction, in_domain_test, seed_hash(trial_seed, env_index))


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
        in_idx, out_idx, _ = environment_indices(dataset, i, holdout_fraction, fraction, trial_seed, i in test_envs)
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
        else Split(env, environment_indices(dataset, i, holdout_fraction, in_domain_test, trial_seed, False)[2])
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
