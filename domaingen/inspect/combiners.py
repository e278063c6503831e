"""Ways to combine the runs of one trial into one model, by the label their table rows carry.

A combiner chooses which runs to combine and how: the weights averaged (DiWA, a soup;
the runs must share their initialisation and architecture) or the softmax outputs
averaged (ENS). COMBINERS is a registry: a plugin adds its own with `register_combiner`.

- DiWA-uniform: every run of the trial, at the checkpoint training-domain validation
  selected (DiWA's `model_best`), weights averaged;
- DiWA-greedy: DiWA's restricted selection: the runs in decreasing order of their
  training-domain validation accuracy, each kept when the average with it validates at
  least as well as the average without it (a rejected run is skipped, the next one tried);
- soup: the uniform soup of Wortsman et al., every run's last checkpoint averaged;
- ENS: the selected checkpoints' softmax outputs averaged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence, TypeVar

import torch
from torch import nn

from domaingen.registry import Registry

T = TypeVar("T")
# (candidates, a candidate's own validation accuracy, the validation accuracy of a list's combination) -> the chosen
Choose = Callable[[Sequence[T], Callable[[T], float], Callable[[list[T]], float]], list[T]]


@dataclass(frozen=True)
class Combiner:
    """One way to combine a trial's runs: `choose` picks them, at `checkpoint` ('selected' or 'last');
    `averages_weights` (else their softmax outputs are averaged); `needs_validation`: `choose`
    reads validation accuracies."""

    name: str
    choose: Choose
    description: str
    checkpoint: str = "selected"
    averages_weights: bool = True
    needs_validation: bool = False

    @property
    def __wrapped__(self) -> Choose:
        return self.choose


COMBINERS: Registry[Combiner] = Registry("combiner")


def register_combiner(name: str, description: str, **options: object) -> Callable[[Choose], Choose]:
    """Decorator: register the function as the `choose` of combiner `name` (options: Combiner's fields)."""

    def decorate(choose: Choose) -> Choose:
        COMBINERS.register(name)(Combiner(name, choose, description, **options))
        return choose

    return decorate


def uniform(candidates: Sequence[T], member_val: Callable[[T], float], combined_val: Callable[[list[T]], float]) -> list[T]:
    """Every candidate."""
    return list(candidates)


def greedy(candidates: Sequence[T], member_val: Callable[[T], float], combined_val: Callable[[list[T]], float]) -> list[T]:
    """DiWA's restricted selection (its scripts/diwa.py): candidates in decreasing order of `member_val`
    (a stable sort: equals keep their given order), each kept when `combined_val` of the kept ones and
    it is at least the best so far; the first is always kept."""
    chosen: list[T] = []
    best = -math.inf
    for candidate in sorted(candidates, key=member_val, reverse=True):
        score = combined_val([*chosen, candidate])
        if score >= best:
            chosen.append(candidate)
            best = score
    return chosen


register_combiner("DiWA-uniform", "every run's selected weights averaged", needs_validation=False)(uniform)
register_combiner("DiWA-greedy", "selected weights added in order of validation accuracy while it does not fall",
                  needs_validation=True)(greedy)
register_combiner("soup", "every run's last weights averaged (uniform soup)", checkpoint="last")(uniform)
register_combiner("ENS", "every run's selected model, softmax outputs averaged", averages_weights=False)(uniform)


def average_states(states: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The mean of state_dicts of one architecture: floating-point entries averaged (parameters and
    buffers such as BatchNorm statistics), the others (counters) taken from the first."""
    first = states[0]
    return {name: torch.stack([s[name] for s in states]).mean(0) if value.is_floating_point() else value.clone()
            for name, value in first.items()}


class Ensemble(nn.Module):
    """Models whose predicted probabilities are averaged (a one-logit model's sigmoid, else the softmax);
    `predict` returns the average's log (logit for one logit), so its argmax is the ensemble's class."""

    EVAL_MODES: dict[str, bool] = {}

    def __init__(self, members: Sequence[nn.Module]) -> None:
        super().__init__()
        self.members = nn.ModuleList(members)
        self.EVAL_BATCH_SIZE = getattr(members[0], "EVAL_BATCH_SIZE", None)

    def predict(self, x: torch.Tensor, domain: int | torch.Tensor | None = None) -> torch.Tensor:
        logits = [member.predict(x).float() for member in self.members]
        if logits[0].shape[1] == 1:
            return torch.logit(torch.stack([z.sigmoid() for z in logits]).mean(0))
        return torch.stack([z.softmax(dim=1) for z in logits]).mean(0).log()
