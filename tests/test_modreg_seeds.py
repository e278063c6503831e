"""ModReg's default learns the same on every seed and keeps what the task needs (a small-scale check of issue 53).

A tiny MLP on two synthetic domains whose 12 input features are 4 carrying the class, 4 of noise and
4 always zero. Adam moves a logit whose gradient keeps its sign by about the mask learning rate per
step, whatever the gradient's size, so the distance a logit can travel is mask lr x steps: 250 steps
at 1e-2 stand for the default's 2500 steps at 1e-3 (RotatedMNIST's length), at the default penalty.
"""

from __future__ import annotations

import pytest
import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.testing import build

STEPS, MASK_LR, SEEDS = 250, 1e-2, range(5)
SIGNAL, DEAD = slice(0, 4), slice(8, 12)


def _batches(step: int, n: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(1000 + step)
    batches = []
    for _ in range(2):
        y = torch.randint(0, 2, (n,), generator=g)
        x = torch.randn(n, 12, generator=g)
        x[:, SIGNAL] += (2 * y - 1).float().unsqueeze(1)
        x[:, DEAD] = 0.0
        batches.append((x, y))
    return batches


@pytest.fixture(scope="module")
def trained() -> list:
    """ERM+ModReg at its defaults (but the mask lr, see the module docstring), one per seed, same batches."""
    runs = []
    for seed in SEEDS:
        algorithm = build("ERM+ModReg", (12,), seed=seed, featurizer="MLP", mlp_width=16, mlp_depth=3,
                          mlp_dropout=0.0, lr=1e-3, modreg_mask_lr=MASK_LR)
        for step in range(STEPS):
            algorithm.update(_batches(step))
        runs.append(algorithm)
    return runs


def test_the_default_keeps_the_same_fraction_on_every_seed(trained):
    kept = [run.diagnostics()["modreg_kept_fraction"] for run in trained]
    assert max(kept) - min(kept) <= 0.10, kept
    assert all(k < 1.0 for k in kept), kept  # it prunes (the dead inputs' weights, below)


def test_every_seed_prunes_the_dead_inputs_and_keeps_the_class_carrying_ones(trained):
    for run in trained:
        logits = run.featurizer.layers[1].mask_logits.detach()
        assert (logits[:, DEAD] <= 0).all()
        assert ((logits[:, SIGNAL] > 0).float().mean(0) == 1).all()


def test_a_dead_inputs_logits_follow_adam_on_the_penalty_alone(trained):
    """No loss gradient reaches a weight leaving an always-zero input, so its logit is Adam on the penalty's
    gradient alone: for a group of n identical logits l (pi = sigmoid(l)), 2 alpha n pi * pi(1 - pi) from S1
    and beta pi(1 - pi) / sqrt(n) from S2. Replayed here on one scalar, it ends where every seed's do,
    about mask lr x steps below the start: the pruning that no task gradient opposes never stops."""
    space = ALGORITHMS.get("ERM+ModReg").hparam_space()
    alpha, beta = space["modreg_alpha"].default, space["modreg_beta"].default
    n = trained[0].featurizer.layers[1].mask_logits.shape[0]
    logit = torch.tensor(space["modreg_init_logit"].default, dtype=torch.float64, requires_grad=True)
    adam = torch.optim.Adam([logit], lr=MASK_LR)
    for _ in range(STEPS):
        pi = torch.sigmoid(logit.detach())
        logit.grad = 2 * alpha * n * pi * pi * (1 - pi) + beta * pi * (1 - pi) / n ** 0.5
        adam.step()
    assert logit.item() < space["modreg_init_logit"].default - STEPS * MASK_LR  # at least mask lr per step
    for run in trained:
        dead = run.featurizer.layers[1].mask_logits.detach()[:, DEAD]
        assert torch.allclose(dead.double(), logit.detach(), atol=1e-3), (dead, logit)


def test_the_defaults_are_a_tenth_of_the_first_penalty_with_the_weights_mask_lr():
    space = ALGORITHMS.get("ERM+ModReg").hparam_space()
    defaults = {k: space[k].default for k in ("modreg_alpha", "modreg_beta", "modreg_scale", "modreg_mask_lr", "modreg_pi")}
    assert defaults == {"modreg_alpha": 6.93e-10, "modreg_beta": 1.12e-5, "modreg_scale": 1.0,
                        "modreg_mask_lr": 1e-3, "modreg_pi": "sigmoid"}
