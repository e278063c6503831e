"""Training minibatches from in-memory splits: `batch_size` examples per environment, by index."""

from __future__ import annotations

from typing import Any, Sequence

import torch

from domaingen.datasets.splits import Split
from domaingen.hparams import seed_hash
from domaingen.devices import to_device


class MinibatchSampler:
    """Draws `batch_size` examples with replacement from each training split, by index.

    The default `MultiDomainDataset.minibatch_sampler`. Its state is the generators'
    states, so a resumed run draws exactly the batches an uninterrupted one would.
    With `full_batch`, every step gets every example of every split, in a fixed order.
    """

    def __init__(
        self, splits: Sequence[Split], batch_size: int, seed: int, device: torch.device, full_batch: bool = False
    ) -> None:
        self.splits = list(splits)
        self.batch_size = int(batch_size)
        self.device = device
        self.generators = [torch.Generator().manual_seed(seed_hash(seed, "minibatch", i)) for i in range(len(splits))]
        self.full_batches: list[tuple[torch.Tensor, torch.Tensor]] | None = None
        if full_batch:
            # kept contiguous: full batches feed MLPs, which would copy a channels-last batch every step
            self.full_batches = [(x.to(device), y.to(device)) for x, y in (s.batch(slice(None)) for s in self.splits)]

    def next(self) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """One (x, y) batch per training split, on the device."""
        if self.full_batches is not None:
            return list(self.full_batches)
        batches = []
        for split, generator in zip(self.splits, self.generators):
            positions = torch.randint(len(split), (self.batch_size,), generator=generator)
            x, y = split.batch(positions)
            batches.append((to_device(x, self.device), y.to(self.device, non_blocking=True)))
        return batches

    def state(self) -> Any:
        """What a checkpoint stores to resume the draws."""
        return [g.get_state() for g in self.generators]

    def load_state(self, states: Sequence[torch.Tensor]) -> None:
        """Continue from a `state()`."""
        for generator, state in zip(self.generators, states):
            generator.set_state(state)
