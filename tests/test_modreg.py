"""ModReg: weight masks, the S1/S2 penalties, composition with any algorithm, sub-network stats."""

from __future__ import annotations

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.base import FeaturizerClassifier
from domaingen.algorithms.modreg import penalty_gradient, with_modreg
from domaingen.errors import DomaingenError
from domaingen.masks import (
    MaskedConv2d,
    MaskedLinear,
    add_weight_masks,
    gumbel_sigmoid,
    reuse_penalty,
    specialization_penalty,
    subnetwork_stats,
)
from tests.test_algorithms_generic import build, separable_batches


def brute_force_penalties(logits: torch.Tensor) -> tuple[float, float]:
    """S1 and S2 by a loop over input features and over every weight leaving each one."""
    pi = torch.sigmoid(logits.double())
    s1 = s2 = 0.0
    for p in range(pi.shape[1]):
        leaving = [pi[o, p].flatten().tolist() for o in range(pi.shape[0])]
        values = [v for row in leaving for v in row]
        s1 += sum(values) ** 2
        s2 += math.sqrt(sum(v * v for v in values))
    return s1, s2


@pytest.mark.parametrize("shape", [(5, 7), (4, 3, 3, 3)], ids=["linear", "conv"])
def test_penalties_equal_a_loop_over_input_features(shape):
    logits = torch.randn(shape, generator=torch.Generator().manual_seed(0)) * 2
    s1, s2 = brute_force_penalties(logits)
    assert specialization_penalty(logits).item() == pytest.approx(s1, rel=1e-5)
    assert reuse_penalty(logits).item() == pytest.approx(s2, rel=1e-5)


@pytest.mark.parametrize("shape", [(5, 7), (4, 3, 3, 3)], ids=["linear", "conv"])
def test_closed_form_penalty_gradient_equals_autograd(shape):
    logits = (torch.randn(shape, generator=torch.Generator().manual_seed(1)) * 2).double().requires_grad_()
    alpha, beta = 0.3, 0.7
    (alpha * specialization_penalty(logits) + beta * reuse_penalty(logits)).backward()
    assert torch.allclose(penalty_gradient(logits.detach(), alpha, beta), logits.grad, rtol=1e-9, atol=1e-12)


def test_mask_samples_are_bernoulli_of_sigmoid_logits():
    torch.manual_seed(0)
    logits = torch.tensor([-2.0, -0.5, 0.0, 1.0, 2.0, 3.0])
    samples = gumbel_sigmoid(logits.expand(40_000, -1))
    assert set(samples.unique().tolist()) <= {0.0, 1.0}
    p = torch.sigmoid(logits)
    se = (p * (1 - p) / 40_000).sqrt()
    assert ((samples.mean(0) - p).abs() < 4 * se).all(), (samples.mean(0), p)


def test_straight_through_gradient_reaches_the_logits():
    torch.manual_seed(0)
    layer = nn.Linear(6, 3)
    add_weight_masks(layer)
    layer(torch.randn(8, 6)).square().sum().backward()
    assert layer.mask_logits.grad is not None
    assert layer.mask_logits.grad.abs().sum() > 0
    assert layer.weight.grad.abs().sum() > 0


def test_initial_keep_probability_is_about_0_88():
    layer = nn.Linear(50, 40)
    add_weight_masks(layer)
    assert torch.sigmoid(layer.mask_logits).mean().item() == pytest.approx(0.8808, abs=1e-3)


def test_evaluation_mask_is_deterministic_and_thresholds_sigmoid():
    torch.manual_seed(0)
    layer = nn.Linear(6, 3)
    add_weight_masks(layer)
    with torch.no_grad():
        layer.mask_logits.copy_(torch.randn(3, 6))
    layer.eval()
    x = torch.randn(5, 6)
    expected = x @ (layer.weight * (torch.sigmoid(layer.mask_logits) > 0.5)).T + layer.bias
    assert torch.equal(layer(x), layer(x))
    assert torch.allclose(layer(x), expected, atol=1e-6)


def _fixed_masks(layer: nn.Module, groups: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    masks = (torch.rand(groups, *layer.weight.shape, generator=g) > 0.3).float()
    layer.sample_masks = lambda logits: masks  # the grouping, not the sampling, is under test
    return masks


@pytest.mark.parametrize("n", [8, 7])
def test_grouped_linear_uses_one_mask_per_interleaved_group(n):
    torch.manual_seed(0)
    layer = nn.Linear(6, 3)
    add_weight_masks(layer, groups=4)
    masks = _fixed_masks(layer, 4, seed=n)
    x = torch.randn(n, 6)
    expected = torch.stack([x[i] @ (layer.weight * masks[i % 4]).T + layer.bias for i in range(n)])
    assert torch.allclose(layer(x), expected, atol=1e-5)


def test_interleaved_group_matmul_backward_passes_gradcheck():
    from domaingen.masks import _InterleavedGroupLinear

    g = torch.Generator().manual_seed(0)
    x = torch.randn(12, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weights = torch.randn(3, 4, 5, dtype=torch.float64, generator=g, requires_grad=True)
    shared_bias = torch.randn(4, dtype=torch.float64, generator=g, requires_grad=True)
    group_bias = torch.randn(3, 4, dtype=torch.float64, generator=g, requires_grad=True)
    for bias in (None, shared_bias, group_bias):
        assert torch.autograd.gradcheck(_InterleavedGroupLinear.apply, (x, weights, bias))
    (grad_x,) = torch.autograd.grad(_InterleavedGroupLinear.apply(x, weights, None).square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="twice"):
        grad_x.sum().backward()


@pytest.mark.parametrize("n", [8, 7])
def test_grouped_linear_gradients_equal_the_per_example_loop(n):
    torch.manual_seed(0)
    layer = nn.Linear(6, 3)
    add_weight_masks(layer, groups=4)
    masks = _fixed_masks(layer, 4, seed=n)
    x = torch.randn(n, 6, requires_grad=True)
    upstream = torch.randn(n, 3)
    (layer(x) * upstream).sum().backward()
    grads = (x.grad.clone(), layer.weight.grad.clone(), layer.bias.grad.clone())
    x.grad = None
    reference = copy.deepcopy(layer)
    reference.weight.grad = reference.bias.grad = None
    looped = torch.stack([x[i] @ (reference.weight * masks[i % 4]).T + reference.bias for i in range(n)])
    (looped * upstream).sum().backward()
    for got, expected in zip(grads, (x.grad, reference.weight.grad, reference.bias.grad)):
        assert torch.allclose(got, expected, atol=1e-5)


def test_grouped_linear_with_masked_bias_gives_each_group_its_bias_sample():
    torch.manual_seed(0)
    layer = nn.Linear(6, 3)
    add_weight_masks(layer, groups=4, mask_bias=True)
    masks = _fixed_masks(layer, 4, seed=1)
    bias_masks = (torch.rand(4, 3, generator=torch.Generator().manual_seed(2)) > 0.5).float()
    layer.sample_masks = lambda logits: masks if logits.dim() == 2 else bias_masks
    x = torch.randn(10, 6, requires_grad=True)
    out = layer(x)
    expected = torch.stack([x[i] @ (layer.weight * masks[i % 4]).T + layer.bias * bias_masks[i % 4] for i in range(10)])
    assert torch.allclose(out, expected, atol=1e-5)
    out.sum().backward()
    # the bias gradient counts the rows whose group kept each bias entry: groups 0, 1 have 3 rows, 2, 3 have 2
    rows_per_group = torch.tensor([3.0, 3.0, 2.0, 2.0])
    assert torch.allclose(layer.bias.grad, (bias_masks * rows_per_group[:, None]).sum(0))


def test_grouped_linear_under_bf16_autocast_computes_in_bf16_and_gives_the_weights_a_gradient():
    torch.manual_seed(0)
    layer = nn.Linear(16, 8, bias=False)
    add_weight_masks(layer, groups=4)
    masks = _fixed_masks(layer, 4, seed=3)
    x = torch.randn(32, 16)
    expected = torch.stack([x[i] @ (layer.weight * masks[i % 4]).T for i in range(32)])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), expected, atol=0.05, rtol=0.02)
    out.float().sum().backward()
    assert layer.weight.grad is not None and layer.weight.grad.dtype == torch.float32
    assert torch.isfinite(layer.weight.grad).all() and layer.weight.grad.abs().sum() > 0


@pytest.mark.parametrize("n", [8, 6])
def test_grouped_conv_uses_one_mask_per_interleaved_group(n):
    torch.manual_seed(0)
    layer = nn.Conv2d(3, 5, 3, stride=2, padding=1)
    add_weight_masks(layer, groups=4)
    masks = _fixed_masks(layer, 4, seed=n)
    x = torch.randn(n, 3, 9, 9)
    expected = torch.cat(
        [F.conv2d(x[i : i + 1], layer.weight * masks[i % 4], layer.bias, stride=2, padding=1) for i in range(n)]
    )
    assert torch.allclose(layer(x), expected, atol=1e-5)
    assert torch.allclose(layer(x.to(memory_format=torch.channels_last)), expected, atol=1e-5)


def test_biases_are_unmasked_unless_asked():
    plain = add_weight_masks(nn.Linear(4, 2))[0][1]
    assert plain.bias_mask_logits is None
    masked = add_weight_masks(nn.Linear(4, 2), mask_bias=True)[0][1]
    assert masked.bias_mask_logits.shape == (2,)


def test_every_linear_and_conv_is_masked_and_nothing_else():
    model = nn.Sequential(nn.Conv2d(1, 4, 3), nn.GroupNorm(2, 4), nn.Flatten(), nn.Linear(4 * 4 * 4, 3))
    names = [name for name, _ in add_weight_masks(model)]
    assert names == ["0", "3"]
    assert isinstance(model[0], MaskedConv2d) and isinstance(model[3], MaskedLinear)


def test_subnetwork_stats_count_kept_weights_and_live_inputs():
    layer = add_weight_masks(nn.Linear(4, 3))[0][1]
    with torch.no_grad():
        layer.mask_logits.copy_(torch.tensor([[1.0, -1, -1, 2], [-1, -1, -1, 3], [-2, -1, 0.5, -1]]))
    stats = subnetwork_stats(layer)
    assert stats.kept_fraction == pytest.approx(4 / 12)
    assert (stats.inputs_kept, stats.inputs_total) == (3, 4)  # input 1 keeps no outgoing weight


def test_hook_adds_exactly_the_penalty_gradient_to_the_base_loss():
    """ERM+ModReg's step equals one Adam step on CE + alpha*S1 + beta*S2 computed by autograd."""
    shape = (12,)
    a = build("ERM+ModReg", shape, seed=0, modreg_alpha=1e-3, modreg_beta=1e-2, featurizer="MLP", mlp_width=8)
    b = copy.deepcopy(a)
    batches = separable_batches(shape, n=8)
    torch.manual_seed(7)
    a.update(batches)
    torch.manual_seed(7)
    x = torch.cat([x for x, _ in batches])
    y = torch.cat([y for _, y in batches])
    logits = [m.mask_logits for m in b.modules() if hasattr(m, "mask_logits")]
    loss = F.cross_entropy(b.network(x), y)
    loss = loss + 1e-3 * sum(specialization_penalty(l) for l in logits) + 1e-2 * sum(reuse_penalty(l) for l in logits)
    b.optimizer.zero_grad()
    loss.backward()
    b.optimizer.step()
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_hook_is_removed_after_update():
    a = build("ERM+ModReg", (12,), featurizer="MLP", mlp_width=8)
    a.update(separable_batches((12,), n=4))
    other = nn.Linear(2, 2)
    add_weight_masks(other)
    opt = torch.optim.SGD(other.parameters(), lr=1.0)
    before = other.mask_logits.detach().clone()
    opt.step()  # no gradients: nothing may change if no hook is left behind
    assert torch.equal(before, other.mask_logits)


def test_strong_penalty_prunes_weights_and_records_say_so():
    algorithm = build("ERM+ModReg", (12,), modreg_alpha=0.0, modreg_beta=10.0, featurizer="MLP", mlp_width=8, lr=0.2)
    before = algorithm.diagnostics()["modreg_kept_fraction"]
    for step in range(30):
        algorithm.update(separable_batches((12,), n=8, seed=step))
    after = algorithm.diagnostics()
    assert before == 1.0
    assert after["modreg_kept_fraction"] < 0.5
    assert after["modreg_classifier_inputs_total"] == 8
    assert 0 <= after["modreg_classifier_inputs_kept"] <= 8


@pytest.mark.parametrize("key", ["modreg_alpha", "modreg_beta"])
def test_negative_penalty_weight_is_an_error(key):
    with pytest.raises(DomaingenError, match=f"{key} must be >= 0"):
        build("ERM+ModReg", (12,), **{key: -1.0})


def test_network_without_maskable_layer_is_an_error():
    class Scale(nn.Module):
        n_outputs = 3

        def __init__(self) -> None:
            super().__init__()
            self.scale = nn.Parameter(torch.ones(3))

        def forward(self, x):
            return x[:, :3] * self.scale

    class NoLayers(FeaturizerClassifier):
        def prepare_modules(self) -> None:
            self.featurizer, self.classifier = Scale(), nn.Identity()
            super().prepare_modules()

    with pytest.raises(DomaingenError, match="ModReg found no layer to mask"):
        with_modreg(NoLayers)((12,), 3, 2, build("ERM+ModReg", (12,)).hparams)


def test_modreg_composes_only_with_featurizer_classifier_algorithms():
    from domaingen.algorithms.base import Algorithm

    with pytest.raises(DomaingenError, match="needs an algorithm built on FeaturizerClassifier"):
        with_modreg(Algorithm)


def test_composed_names_resolve_and_unknown_ones_list_the_rule():
    assert ALGORITHMS.get("IRM+ModReg").__mro__[2] is ALGORITHMS.get("IRM")
    assert "IRM+ModReg" in ALGORITHMS
    with pytest.raises(DomaingenError, match=r"unknown algorithm 'Nope\+ModReg'.*X\+ModReg"):
        ALGORITHMS.get("Nope+ModReg")


def test_straight_through_gradient_is_the_soft_samples_gradient():
    """The hard sample's gradient equals that of s = sigmoid((l - noise) / tau) for the same noise."""
    logits = torch.linspace(-3, 3, 50, dtype=torch.float64).requires_grad_()
    torch.manual_seed(4)
    hard = gumbel_sigmoid(logits, tau=0.7)
    weights = torch.arange(50, dtype=torch.float64)
    (hard * weights).sum().backward()
    torch.manual_seed(4)
    u = torch.rand_like(logits).clamp_(1e-7, 1 - 1e-7)
    soft = torch.sigmoid((logits.detach() - (u.log() - (-u).log1p())) / 0.7)
    assert torch.equal(hard.detach(), (soft > 0.5).double())
    assert torch.allclose(logits.grad, weights * soft * (1 - soft) / 0.7)


def test_tau_1_masks_are_bernoulli_with_the_soft_samples_gradient():
    """The per-group sampler (tau = 1): mean sigmoid(l), and the gradient of sigmoid(l - logit(u))."""
    from domaingen.masks import sample_hard_masks

    logits = torch.tensor([-2.0, 0.0, 1.0, 3.0], dtype=torch.float64, requires_grad=True)
    torch.manual_seed(0)
    masks = sample_hard_masks(logits, 50_000)
    p = torch.sigmoid(logits.detach())
    assert ((masks.detach().mean(0) - p).abs() < 4 * (p * (1 - p) / 50_000).sqrt()).all()
    torch.manual_seed(1)
    hard = sample_hard_masks(logits, 3)
    (hard * torch.arange(12.0, dtype=torch.float64).view(3, 4)).sum().backward()
    torch.manual_seed(1)
    u = torch.rand(3, 4, dtype=torch.float64).clamp_(1e-7, 1 - 1e-7)
    soft = torch.sigmoid(logits.detach() - (u.log() - (-u).log1p()))
    assert torch.equal(hard.detach(), (soft > 0.5).double())
    expected = (torch.arange(12.0, dtype=torch.float64).view(3, 4) * soft * (1 - soft)).sum(0)
    assert torch.allclose(logits.grad, expected)
