"""Adapt a run's selected weights to every split selection reads, and store the results beside it.

The T3A fork's protocol (`unsupervised_adaptation.py`): the weights training-domain
validation selected are adapted, for every point of the adapter's grid, to each split
separately, starting afresh on each (a new adapter per split), online, in batches of
32 in the split's order; each split's accuracy is that of the predictions made while
adapting. The splits are every environment's `out` split (the training domains' ones
feed training-domain validation, the held-out one the oracle) and each held-out
environment's `in` split (the reported test accuracy); the training domains' `in`
splits, which no selection reads, are not adapted. A last batch of one example joins
the batch before it (BatchNorm on batch statistics needs two); the fork's feature
batches drop their short last batch instead, so its accuracies leave out up to 31
examples of each split and these do not.

Each adapter's results are one file, `adapted_{ADAPTER}.jsonl`, written whole through a
rename when every grid point is done: one line per point, with the adapter, its
hyperparameters, the point's index and the grid's size, the selected step, and the
accuracies under the fields a run records (`env{i}_out_acc`, `env{t}_in_acc`). A file
present is a finished adapter: adapting again skips it.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Iterable, Iterator, Sequence

import torch

from domaingen.adapt.base import ADAPTERS, Adapter, grid_points
from domaingen.errors import DomaingenError, RunDirectoryError
from domaingen.run.rundir import RunDirectory, atomic_write_bytes, to_json

log = logging.getLogger(__name__)

TEST_BATCH_SIZE = 32  # the fork's default --adapt_algorithm batch size
ADAPTED_PREFIX = "adapted_"
Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


def adapted_file(run_dir: str | Path, adapter: str) -> Path:
    """Where `adapter`'s results on the run `run_dir` are stored."""
    return Path(run_dir) / f"{ADAPTED_PREFIX}{adapter}.jsonl"


def adapter_names(names: Sequence[str] | None) -> list[str]:
    """The registered spelling of each name (every adapter when None); an unknown one raises one line
    listing the valid ones."""
    return list(ADAPTERS.names()) if names is None else [ADAPTERS.canonical(n, " in --adapters") for n in names]


def no_single_batches(batches: Batches) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """`batches`, with a last batch of one example joined to the batch before it."""
    previous = None
    for batch in batches:
        if previous is not None:
            if len(batch[0]) == 1:
                batch = (torch.cat([previous[0], batch[0]]), torch.cat([previous[1], batch[1]]))
            else:
                yield previous
        previous = batch
    if previous is not None:
        yield previous


def adapted_accuracy(adapter: Adapter, batches: Batches, device: torch.device) -> float:
    """The accuracy of the predictions `adapter` makes while it adapts online to `batches`."""
    correct = total = 0
    for x, y in batches:
        logits = adapter.adapt(x.to(device))
        correct += int((logits.argmax(1).cpu() == y).sum())
        total += len(y)
    return correct / total if total else float("nan")


@torch.no_grad()
def feature_batches(algorithm: torch.nn.Module, batches: Batches, device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(featurizer output, labels) per batch, the featurizer in eval mode (the fork's cached features)."""
    algorithm.eval()
    return [(algorithm.featurizer(x.to(device)), y) for x, y in batches]


def check_selected(run_dir: str | Path) -> None:
    """Raise one line naming the run when it has no selected weights to adapt."""
    rundir = RunDirectory(run_dir)
    if not rundir.file(rundir.selected_name()).exists():
        raise RunDirectoryError(f"run {rundir.path} has no selected weights (selected.pt) to adapt: it was trained "
                                "before runs kept them, or has no validation split; retrain it to adapt it")


def adapt_run(run_dir: str | Path, adapters: Sequence[str], data_dir: str | None = None, device: str = "auto",
              skip_undefined: bool = False) -> dict[str, str]:
    """Adapt the run's selected weights with each of `adapters` not stored yet; adapter -> what happened
    ('done', 'stored already', or why it is undefined for this run when `skip_undefined`, which
    otherwise raises that reason as a DomaingenError)."""
    from domaingen.run.reload import load_run

    outcome: dict[str, str] = {}
    todo = [name for name in adapter_names(adapters) if not adapted_file(run_dir, name).exists()]
    outcome.update({name: "stored already" for name in adapter_names(adapters) if name not in todo})
    if not todo:
        return outcome
    check_selected(run_dir)
    loaded = load_run(run_dir, "selected", data_dir=data_dir, device=device)
    algorithm, test_envs = loaded.algorithm, loaded.test_envs
    plan = [(f"env{i}_out_acc", out) for i, (_, out) in enumerate(loaded.splits)]
    plan += [(f"env{t}_in_acc", loaded.splits[t][0]) for t in test_envs]

    def inputs(split) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        return no_single_batches(loaded.dataset.eval_batches(split, TEST_BATCH_SIZE))

    features: dict[str, list] = {}
    for name in todo:
        cls = ADAPTERS.get(name)
        try:
            cls.check(algorithm)
        except DomaingenError as exc:
            if not skip_undefined:
                raise
            outcome[name] = str(exc)
            continue
        started = time.perf_counter()
        if cls.USES_FEATURES and not features:
            features = {field: feature_batches(algorithm, inputs(split), loaded.device) for field, split in plan}
        points = grid_points(cls.GRID)
        lines = []
        for index, point in enumerate(points):
            record: dict[str, Any] = {"adapter": name, "adapt_hparams": point, "grid_index": index,
                                      "grid_size": len(points), "step": loaded.step}
            for field, split in plan:
                adapter = cls(algorithm, point, loaded.hparams).to(loaded.device)
                batches = features[field] if cls.USES_FEATURES else inputs(split)
                record[field] = adapted_accuracy(adapter, batches, loaded.device)
            lines.append(to_json(record))
        log.info("%s: %s adapted (%d grid points) in %.1f s", loaded.path.name, name, len(points),
                 time.perf_counter() - started)
        atomic_write_bytes(adapted_file(run_dir, name), ("\n".join(lines) + "\n").encode())
        outcome[name] = "done"
    return outcome
