"""The generic algorithm checks, for domaingen's own suite and for your plugin's repository.

Every algorithm in the table must pass them: it builds on every input shape, trains
and predicts with the right shapes and finite values, its held-out loss falls on an
easy problem, equal seeds give equal results, and a checkpoint round trip continues
identically. Two ways to run them on your own algorithm:

    # in a test file of your repository
    from domaingen.testing import check_algorithm

    def test_my_algorithm():
        check_algorithm("MyAlgorithm")          # raises AssertionError naming the failed check

    # or from the command line, with the plugin loaded by entry point, DOMAINGEN_PLUGINS or
    # DOMAINGEN_PLUGINS=path/to/my_algs.py; DOMAINGEN_CHECK_ALGORITHMS picks the names
    pytest --pyargs domaingen.testing

Without DOMAINGEN_CHECK_ALGORITHMS, `pytest --pyargs domaingen.testing` checks the
algorithms the loaded plugins registered, each also composed with every modifier
(`X+ModReg`), or every algorithm when no plugin registered one.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from domaingen.algorithms import ALGORITHMS, Algorithm
from domaingen.datasets import DATASETS
from domaingen.hparams import draw_hparams, run_space
from domaingen.plugins import load_plugins, split_specs

__all__ = [
    "CHECKS", "INPUT_SHAPES", "NUM_DOMAINS", "algorithms_to_check", "build", "check_algorithm",
    "check_builds_updates_and_predicts", "check_checkpoint_round_trip", "check_equal_seeds",
    "check_loss_falls", "default_hparams", "separable_batches",
]

INPUT_SHAPES: list[tuple[int, ...]] = [(2, 28, 28), (1, 28, 28), (2, 14, 14), (64,)]
NUM_DOMAINS = 3
# record fields that differ between two runs of the same job (timings, memory, the args with its paths)
VOLATILE_FIELDS = frozenset({"step_time", "eval_time", "startup_time", "mem_gb", "args"})
CHECK_ENV_VAR = "DOMAINGEN_CHECK_ALGORITHMS"


def default_hparams(name: str, **overrides: Any) -> dict[str, Any]:
    """The defaults of algorithm `name` on ColoredMNIST (hparams_seed 0), with `overrides`."""
    space = run_space("ColoredMNIST", DATASETS.get("ColoredMNIST"), ALGORITHMS.get(name))
    return {**draw_hparams(space, "ColoredMNIST", 0), **overrides}


def separable_batches(shape: Sequence[int], n: int = 16, seed: int = 0,
                      domains: int = NUM_DOMAINS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """One batch per domain; the class shifts the whole input by +-1, plus a domain offset."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for d in range(domains):
        y = torch.randint(0, 2, (n,), generator=g)
        sign = (2 * y - 1).float().view(-1, *([1] * len(shape)))
        x = 0.5 * torch.randn(n, *shape, generator=g) + sign + 0.1 * d
        batches.append((x, y))
    return batches


def build(name: str, shape: Sequence[int], num_classes: int = 2, seed: int = 0, **overrides: Any) -> Algorithm:
    """Algorithm `name` for inputs of `shape`, NUM_DOMAINS training domains, default hparams + overrides."""
    torch.manual_seed(seed)
    return ALGORITHMS.get(name)(tuple(shape), num_classes, NUM_DOMAINS, default_hparams(name, **overrides))


def check_builds_updates_and_predicts(name: str, shape: Sequence[int]) -> None:
    """Two updates return float losses with a 'loss'; predict gives finite (batch, classes) logits."""
    algorithm = build(name, shape, num_classes=3)
    batches = [(x, y % 3) for x, y in separable_batches(shape, n=8)]
    for _ in range(2):
        losses = algorithm.update(batches)
        assert isinstance(losses, dict) and "loss" in losses, f"{name}: update() returned {losses!r}, not a dict with 'loss'"
        assert all(isinstance(v, float) for v in losses.values()), f"{name}: update() returned non-float losses {losses}"
    logits = algorithm.predict(batches[0][0])
    assert logits.shape == (8, 3), f"{name}: predict gave shape {tuple(logits.shape)} for 8 examples of 3 classes"
    assert torch.isfinite(logits).all(), f"{name}: predict gave non-finite logits"


def check_loss_falls(name: str, steps: int = 40) -> None:
    """On a separable problem (MLP featurizer), the held-out cross-entropy at least halves in `steps` updates."""
    shape = (2, 14, 14)
    algorithm = build(name, shape, featurizer="MLP", mlp_width=64)
    held_out = separable_batches(shape, n=64, seed=99)
    x_eval = torch.cat([x for x, _ in held_out])
    y_eval = torch.cat([y for _, y in held_out])

    def eval_loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(algorithm.predict(x_eval), y_eval).item()

    before = eval_loss()
    for step in range(steps):
        algorithm.update(separable_batches(shape, seed=step))
    after = eval_loss()
    assert after < 0.5 * before, f"{name}: held-out loss {before:.3f} -> {after:.3f}, not halved in {steps} updates"


def check_equal_seeds(name: str) -> None:
    """Two builds from one seed, fed the same batches, give the same losses and predictions."""
    shape = (2, 14, 14)
    outputs = []
    for _ in range(2):
        algorithm = build(name, shape, seed=5, featurizer="MLP", mlp_width=64)
        losses = [algorithm.update(separable_batches(shape, seed=s)) for s in range(3)]
        outputs.append((losses, algorithm.predict(separable_batches(shape, seed=9)[0][0])))
    assert outputs[0][0] == outputs[1][0], f"{name}: equal seeds gave different losses"
    assert torch.equal(outputs[0][1], outputs[1][1]), f"{name}: equal seeds gave different predictions"


def check_checkpoint_round_trip(name: str) -> None:
    """A model restored from checkpoint_state() takes the same next step and predicts the same as the original."""
    shape = (64,)
    a = build(name, shape, seed=1)
    for s in range(3):
        a.update(separable_batches(shape, seed=s))
    b = build(name, shape, seed=2)  # different initial weights, overwritten by the checkpoint
    b.load_checkpoint_state(a.checkpoint_state())
    batch = separable_batches(shape, seed=10)
    # the torch RNG (mask samples, dropout) is the run's, checkpointed by training.py, not the algorithm's
    torch.manual_seed(3)
    losses_a = a.update(batch)
    torch.manual_seed(3)
    assert losses_a == b.update(batch), f"{name}: a restored checkpoint took a different step"
    x = batch[0][0]
    torch.manual_seed(4)  # training-mode predictions may sample (masks, dropout)
    logits_a = a.predict(x)
    torch.manual_seed(4)
    assert torch.equal(logits_a, b.predict(x)), f"{name}: a restored checkpoint predicts differently"


CHECKS: dict[str, Callable[[str], None]] = {
    **{f"builds_updates_and_predicts[{'x'.join(map(str, s))}]":
       (lambda name, s=s: check_builds_updates_and_predicts(name, s)) for s in INPUT_SHAPES},
    "loss_falls_on_separable_problem": check_loss_falls,
    "equal_seeds_give_equal_results": check_equal_seeds,
    "checkpoint_state_round_trip_continues_identically": check_checkpoint_round_trip,
}


def check_algorithm(name: str) -> None:
    """Run every generic check on algorithm `name` (a registered name, or `X+ModReg`).

    Raises AssertionError naming the algorithm and the check that failed, or the
    registry's error for an unknown name.
    """
    ALGORITHMS.get(name)
    for check_name, check in CHECKS.items():
        try:
            check(name)
        except AssertionError as exc:
            raise AssertionError(f"{name} fails the generic check {check_name}: {exc}") from exc


def algorithms_to_check() -> list[str]:
    """$DOMAINGEN_CHECK_ALGORITHMS; else the plugins' algorithms and their compositions; else every algorithm."""
    load_plugins()
    chosen = split_specs(os.environ.get(CHECK_ENV_VAR))
    if chosen:
        return chosen
    own = [name for name, module in ALGORITHMS.owners().items() if not module.endswith("(built in)")]
    names = own or ALGORITHMS.names()
    modifiers = {c.rpartition("+")[2] for c in ALGORITHMS.composed_names()}
    return names + [f"{n}+{m}" for m in sorted(modifiers) for n in names]


try:  # the same checks as pytest tests: `pytest --pyargs domaingen.testing`
    import pytest
except ImportError:  # pragma: no cover - domaingen itself does not need pytest
    pytest = None

if pytest is not None:

    @pytest.mark.parametrize("check_name", list(CHECKS))
    @pytest.mark.parametrize("name", algorithms_to_check())
    def test_generic_check(name: str, check_name: str) -> None:
        """One generic check of one algorithm."""
        CHECKS[check_name](name)
