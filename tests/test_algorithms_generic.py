"""Every algorithm in the table passes these tests automatically."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS
from domaingen.hparams import draw_hparams

INPUT_SHAPES = [(2, 28, 28), (1, 28, 28), (2, 14, 14), (64,)]
NUM_DOMAINS = 3
# every registered algorithm, and every composition such as X+ModReg
ALL_ALGORITHMS = ALGORITHMS.names() + ALGORITHMS.composed_names()


def default_hparams(name: str, **overrides) -> dict:
    space = {**DATASETS.get("ColoredMNIST").hparam_space(), **ALGORITHMS.get(name).hparam_space()}
    return {**draw_hparams(space, "ColoredMNIST", 0), **overrides}


def separable_batches(shape, n=16, seed=0, domains=NUM_DOMAINS):
    """One batch per domain; the class shifts the whole input by +-1, plus a domain offset."""
    g = torch.Generator().manual_seed(seed)
    batches = []
    for d in range(domains):
        y = torch.randint(0, 2, (n,), generator=g)
        sign = (2 * y - 1).float().view(-1, *([1] * len(shape)))
        x = 0.5 * torch.randn(n, *shape, generator=g) + sign + 0.1 * d
        batches.append((x, y))
    return batches


def build(name, shape, num_classes=2, seed=0, **overrides):
    torch.manual_seed(seed)
    cls = ALGORITHMS.get(name)
    return cls(shape, num_classes, NUM_DOMAINS, default_hparams(name, **overrides))


@pytest.mark.parametrize("shape", INPUT_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_builds_updates_and_predicts(name, shape):
    algorithm = build(name, shape, num_classes=3)
    batches = [(x, y % 3) for x, y in separable_batches(shape, n=8)]
    for _ in range(2):
        losses = algorithm.update(batches)
        assert "loss" in losses and all(isinstance(v, float) for v in losses.values())
    logits = algorithm.predict(batches[0][0])
    assert logits.shape == (8, 3)
    assert torch.isfinite(logits).all()


@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_loss_falls_on_separable_problem(name):
    # the update rule is under test, not the featurizer (every featurizer runs in the build test)
    shape = (2, 14, 14)
    algorithm = build(name, shape, featurizer="MLP", mlp_width=64)
    held_out = separable_batches(shape, n=64, seed=99)
    x_eval = torch.cat([x for x, _ in held_out])
    y_eval = torch.cat([y for _, y in held_out])

    def eval_loss() -> float:
        with torch.no_grad():
            return F.cross_entropy(algorithm.predict(x_eval), y_eval).item()

    before = eval_loss()
    for step in range(40):
        algorithm.update(separable_batches(shape, seed=step))
    after = eval_loss()
    assert after < 0.5 * before, f"{name}: held-out loss {before:.3f} -> {after:.3f}"


@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_equal_seeds_give_equal_results(name):
    shape = (2, 14, 14)
    outputs = []
    for _ in range(2):
        algorithm = build(name, shape, seed=5, featurizer="MLP", mlp_width=64)
        losses = [algorithm.update(separable_batches(shape, seed=s)) for s in range(3)]
        outputs.append((losses, algorithm.predict(separable_batches(shape, seed=9)[0][0])))
    assert outputs[0][0] == outputs[1][0]
    assert torch.equal(outputs[0][1], outputs[1][1])


@pytest.mark.parametrize("name", ALL_ALGORITHMS)
def test_checkpoint_state_round_trip_continues_identically(name):
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
    assert losses_a == b.update(batch)
    x = batch[0][0]
    torch.manual_seed(4)  # training-mode predictions may sample (masks, dropout)
    logits_a = a.predict(x)
    torch.manual_seed(4)
    assert torch.equal(logits_a, b.predict(x))
