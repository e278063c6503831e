"""Each algorithm's defining computation against an independent calculation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from domaingen.algorithms.irm import irm_penalty
from domaingen.algorithms.sandmask import sand_mask
from test_algorithms_generic import build, separable_batches


def ce_grad_wrt_scale(z: np.ndarray, y: np.ndarray) -> float:
    """d/ds mean CE(s * z, y) at s = 1: mean over rows of (softmax(z) . z - z_y)."""
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    return float(np.mean((p * z).sum(1) - z[np.arange(len(y)), y]))


def test_irm_penalty_is_product_of_half_batch_gradients():
    g = torch.Generator().manual_seed(0)
    z = torch.randn(10, 3, generator=g, dtype=torch.float64)
    y = torch.randint(0, 3, (10,), generator=g)
    expected = ce_grad_wrt_scale(z[::2].numpy(), y[::2].numpy()) * ce_grad_wrt_scale(z[1::2].numpy(), y[1::2].numpy())
    assert irm_penalty(z, y).item() == pytest.approx(expected, rel=1e-9)


def test_irm_weight_switches_after_annealing_and_adam_restarts():
    shape = (64,)
    algorithm = build("IRM", shape, irm_penalty_anneal_iters=2, irm_lambda=1000.0)
    first_optimizer = algorithm.optimizer
    for step in range(4):
        out = algorithm.update(separable_batches(shape, seed=step))
        weight = 1.0 if step < 2 else 1000.0
        assert out["loss"] == pytest.approx(out["nll"] + weight * out["penalty"], rel=1e-5)
        if step < 2:
            assert algorithm.optimizer is first_optimizer
    assert algorithm.optimizer is not first_optimizer
    assert int(algorithm.update_count) == 4


def test_vrex_penalty_is_variance_of_environment_risks():
    shape = (64,)
    algorithm = build("VREx", shape, vrex_penalty_anneal_iters=0, vrex_lambda=3.0)
    batches = separable_batches(shape, seed=1)
    with torch.no_grad():
        risks = np.array([F.cross_entropy(algorithm.predict(x), y).item() for x, y in batches])
    out = algorithm.update(batches)
    assert out["nll"] == pytest.approx(risks.mean(), rel=1e-5)
    assert out["penalty"] == pytest.approx(risks.var(), rel=1e-4)
    assert out["loss"] == pytest.approx(risks.mean() + 3.0 * risks.var(), rel=1e-4)


def test_sand_mask_matches_formula():
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(4, 50, generator=g, dtype=torch.float64)
    k, tau = 2.0, 0.4
    arr = grads.numpy()
    agreement = np.abs(np.sign(arr).mean(0))
    expected = np.maximum(0.0, np.tanh(k * (agreement - tau) / arr.var(0, ddof=1)))
    np.testing.assert_allclose(sand_mask(grads, k, tau).numpy(), expected, rtol=1e-12)


def test_domainbed_default_tau_one_masks_every_gradient():
    """The reference default tau = 1.0 zeroes the whole update; ours (0.5) does not."""
    g = torch.Generator().manual_seed(0)
    grads = torch.randn(3, 1000, generator=g)
    assert torch.count_nonzero(sand_mask(grads, 10.0, 1.0)) == 0
    assert torch.count_nonzero(sand_mask(grads, 10.0, 0.5)) > 0


def test_sandmask_default_trains_and_moves_weights():
    shape = (64,)
    algorithm = build("SANDMask", shape)
    assert algorithm.hparams["tau"] == 0.5
    before = [p.detach().clone() for p in algorithm.parameters()]
    losses = [algorithm.update(separable_batches(shape, seed=s))["loss"] for s in range(30)]
    moved = sum(not torch.equal(a, b) for a, b in zip(before, algorithm.parameters()))
    assert moved == len(before)
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])


@pytest.mark.parametrize("meta_lr", [1.0, 0.5])
def test_fish_meta_step_interpolates_towards_inner_adam_step(meta_lr):
    shape = (64,)
    batch = separable_batches(shape, seed=3, domains=1)
    fish = build("Fish", shape, seed=7, meta_lr=meta_lr)
    erm = build("ERM", shape, seed=7)
    start = [p.detach().clone() for p in erm.network.parameters()]
    erm.update(batch)  # one Adam step on the single environment = Fish's inner step
    fish.update(batch)
    for p0, inner, meta in zip(start, erm.network.parameters(), fish.network.parameters()):
        torch.testing.assert_close(meta, p0 + meta_lr * (inner - p0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("meta_lr", [1.0, 0.5, 0.05])
def test_fish_meta_step_carries_batchnorm_statistics_as_domainbed_does(meta_lr):
    import copy

    from domaingen.algorithms.base import make_adam

    shape = (64,)
    fish = build("Fish", shape, seed=7, meta_lr=meta_lr)
    torch.manual_seed(0)
    fish.network = torch.nn.Sequential(torch.nn.Linear(64, 8), torch.nn.BatchNorm1d(8), torch.nn.Linear(8, 2))
    fish.inner = copy.deepcopy(fish.network)
    fish.optimizer = make_adam(fish.inner, fish.hparams)
    bn = fish.network[1]
    for step in range(3):
        mean0, var0, count0 = bn.running_mean.clone(), bn.running_var.clone(), int(bn.num_batches_tracked)
        batches = separable_batches(shape, seed=step, domains=2)
        fish.update(batches)
        inner = fish.inner[1]
        assert int(inner.num_batches_tracked) == count0 + 2  # one BatchNorm update per environment
        assert not torch.allclose(inner.running_mean, mean0)
        torch.testing.assert_close(bn.running_mean, mean0 + meta_lr * (inner.running_mean - mean0))
        torch.testing.assert_close(bn.running_var, var0 + meta_lr * (inner.running_var - var0))
        assert int(bn.num_batches_tracked) == int(count0 + meta_lr * 2)  # truncated, as load_state_dict does
