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
from domaingen.algorithms.modreg import penalty_and_gradient, penalty_gradient, with_modreg
from domaingen.errors import DomaingenError
from domaingen.masks.weight_masks import (
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


@pytest.mark.parametrize("shape", [(5, 7), (4, 3, 3, 3)], ids=["linear", "conv"])
def test_closed_form_gradient_of_the_logit_reading_equals_autograd(shape):
    """pi = l: S1 = sum_p (sum of l leaving p)^2, S2 = sum_p sqrt(sum of l^2 leaving p)."""
    logits = (torch.randn(shape, generator=torch.Generator().manual_seed(2)) * 2).double().requires_grad_()
    dims = [0] + list(range(2, len(shape)))
    s1 = logits.sum(dim=dims).square().sum()
    s2 = logits.square().sum(dim=dims).sqrt().sum()
    (0.3 * s1 + 0.7 * s2).backward()
    got_s1, got_s2, grad = penalty_and_gradient(logits.detach(), 0.3, 0.7, "logit")
    assert (got_s1.item(), got_s2.item()) == (pytest.approx(s1.item()), pytest.approx(s2.item()))
    assert torch.allclose(grad, logits.grad, rtol=1e-9, atol=1e-12)


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
    from domaingen.masks.weight_masks import _InterleavedGroupLinear

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


def test_erm_step_equals_one_adam_step_on_the_loss_plus_the_penalty():
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


def test_strong_penalty_prunes_weights_and_records_say_so():
    algorithm = build("ERM+ModReg", (12,), modreg_alpha=0.0, modreg_beta=10.0, featurizer="MLP", mlp_width=8,
                      modreg_mask_lr=0.2)
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
    from domaingen.masks.weight_masks import sample_hard_masks

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


# --- the mask logits' own optimisation (parameter group, learning rate, no weight decay) ---

BASES = ["ERM", "IRM", "VREx", "Fish", "SANDMask", "DMG"]


def _groups_by_kind(algorithm):
    """For each optimizer: [(is a mask-logit group, lr, weight_decay, number of tensors)]."""
    logits = {id(m.mask_logits) for m in algorithm.modules() if hasattr(m, "mask_logits")}
    out = {}
    for name, opt in algorithm.optimizers().items():
        out[name] = [
            (all(id(p) in logits for p in g["params"]), g["lr"], g["weight_decay"], len(g["params"]))
            for g in opt.param_groups
        ]
    return out


@pytest.mark.parametrize("base", BASES)
def test_mask_logits_have_their_own_group_at_the_mask_lr_without_weight_decay(base):
    algorithm = build(f"{base}+ModReg", (12,), featurizer="MLP", mlp_width=8, lr=1e-4, weight_decay=1e-3,
                      modreg_mask_lr=3e-2, irm_penalty_anneal_iters=1, vrex_penalty_anneal_iters=1)
    batches = separable_batches((12,), n=8)
    for _ in range(3):  # IRM and VREx re-create Adam at their anneal step: the new one is checked too
        algorithm.update(batches)
        for name, groups in _groups_by_kind(algorithm).items():
            masked = [g for g in groups if g[0]]
            # MLP of depth 3 plus the classifier: 4 masked layers, all in one group
            assert [(lr, wd, n) for _, lr, wd, n in masked] == [(3e-2, 0.0, 4)], (name, groups)
            assert (False, 1e-4, 1e-3) in [(m, lr, wd) for m, lr, wd, _ in groups], (name, groups)


def test_first_adam_step_moves_the_logits_by_the_mask_lr_and_the_weights_by_the_lr():
    """Adam's first step moves a parameter by lr * g / (|g| + eps): about lr wherever |g| >> eps."""
    algorithm = build("ERM+ModReg", (12,), featurizer="MLP", mlp_width=8, lr=1e-4, modreg_mask_lr=1e-2)
    before = copy.deepcopy(algorithm)
    algorithm.update(separable_batches((12,), n=8))
    layer, old = algorithm.classifier, before.classifier
    grad = layer.mask_logits.grad
    moved = (layer.mask_logits - old.mask_logits).detach()
    big = grad.abs() > 1e-5
    assert big.sum() > 10
    assert torch.allclose(moved[big], -1e-2 * grad[big].sign(), rtol=1e-2)
    moved_w = (layer.weight - old.weight).detach()
    big_w = layer.weight.grad.abs() > 1e-5
    assert torch.allclose(moved_w[big_w], -1e-4 * layer.weight.grad[big_w].sign(), rtol=1e-2)


def test_mask_lr_default_and_search_range():
    space = ALGORITHMS.get("ERM+ModReg").hparam_space()
    assert space["modreg_mask_lr"].default == 1e-3 and str(space["modreg_mask_lr"].sampler) == "10^U(-3,-1)"
    assert space["modreg_init_logit"].default == 2.0


@pytest.mark.parametrize("value", [-0.01, 0.0])
def test_a_mask_lr_that_is_not_positive_is_an_error(value):
    with pytest.raises(DomaingenError, match=rf"^modreg_mask_lr must be > 0 \(the Adam learning rate of the mask logits\), got {value}$"):
        build("ERM+ModReg", (12,), modreg_mask_lr=value)


@pytest.mark.parametrize("value", [-1.0, 0.0])
def test_a_penalty_scale_that_is_not_positive_is_an_error(value):
    with pytest.raises(DomaingenError, match=rf"^modreg_scale must be > 0 \(it multiplies ModReg's penalty\), got {value}$"):
        build("ERM+ModReg", (12,), modreg_scale=value)


def test_an_unknown_reading_of_pi_is_an_error():
    with pytest.raises(DomaingenError, match=r"^modreg_pi must be one of sigmoid, logit, got 'probability'$"):
        build("ERM+ModReg", (12,), modreg_pi="probability")


@pytest.mark.parametrize("overrides, message", [
    ('{"modreg_mask_lr": -1}', "modreg_mask_lr must be > 0 (the Adam learning rate of the mask logits), got -1"),
    ('{"modreg_mask_lr": 0}', "modreg_mask_lr must be > 0 (the Adam learning rate of the mask logits), got 0"),
    ('{"modreg_scale": 0}', "modreg_scale must be > 0 (it multiplies ModReg's penalty), got 0"),
    ('{"modreg_scale": -0.1}', "modreg_scale must be > 0 (it multiplies ModReg's penalty), got -0.1"),
    ('{"modreg_pi": "pi"}', "modreg_pi must be one of sigmoid, logit, got 'pi'"),
    ('{"modreg_rescaled": "no"}', "modreg_rescaled must be true or false, got 'no'"),
], ids=["negative-mask-lr", "zero-mask-lr", "zero-scale", "negative-scale", "unknown-pi", "rescaled-not-bool"])
def test_bad_modreg_input_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys, overrides, message):
    from domaingen.cli.main import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", "ERM+ModReg", "--data_dir", "embedded",
                 "--steps", "1", "--hparams", overrides, "--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == [f"domaingen: error: {message}"]
    assert not out.exists()  # refused before the run directory is made


def test_an_optimizer_built_from_bare_parameters_is_refused():
    from domaingen.algorithms.erm import ERM

    class BareAdam(ERM):
        def __init__(self, *args) -> None:
            super().__init__(*args)
            self.optimizer = torch.optim.Adam(self.network.parameters(), lr=self.hparams["lr"])

    with pytest.raises(DomaingenError, match="BareAdamModReg.optimizer trains mask logits with the weights"):
        with_modreg(BareAdam)((12,), 2, 3, build("ERM+ModReg", (12,)).hparams)


# --- the penalty is part of X's objective, for every registered base X ---

ALPHA, BETA, L2 = 2e-3, 5e-2, 1e-3


def brute_force_objective_penalty(module: nn.Module, reading: str = "sigmoid", scale: float = 1.0) -> torch.Tensor:
    """scale * (alpha * S1 + beta * S2) of `module`'s weight-mask logits, by autograd through a per-feature
    loop, with pi the keep probability sigmoid(l) (reading "sigmoid") or the logit l itself ("logit")."""
    total = torch.zeros(())
    for layer in module.modules():
        if hasattr(layer, "mask_logits"):
            pi = torch.sigmoid(layer.mask_logits) if reading == "sigmoid" else layer.mask_logits
            for p in range(pi.shape[1]):
                leaving = pi[:, p]
                total = total + ALPHA * leaving.sum() ** 2 + BETA * leaving.square().sum().sqrt()
    return scale * total


def l2_term(module: nn.Module) -> torch.Tensor:
    return L2 * sum(p.square().sum() for n, p in module.named_parameters() if "mask_logits" not in n)


def composed(base: str, **overrides):
    return build(f"{base}+ModReg", (12,), featurizer="MLP", mlp_width=8, modreg_alpha=ALPHA, modreg_beta=BETA,
                 l2_weight=L2, modreg_mask_lr=1e-2, **overrides)


def logit_grads(module: nn.Module) -> list[torch.Tensor]:
    return [m.mask_logits.grad.clone() for m in module.modules() if hasattr(m, "mask_logits")]


def mask_logits(module: nn.Module) -> list[torch.Tensor]:
    return [m.mask_logits for m in module.modules() if hasattr(m, "mask_logits")]


def irmv1(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The IRMv1 penalty, unbiased: (dR/dw on the even rows) * (dR/dw on the odd rows) at w = 1."""
    w = torch.tensor(1.0, requires_grad=True)
    ga = torch.autograd.grad(F.cross_entropy(logits[::2] * w, y[::2]), w, create_graph=True)[0]
    gb = torch.autograd.grad(F.cross_entropy(logits[1::2] * w, y[1::2]), w, create_graph=True)[0]
    return ga * gb


def assert_grads_match(got: list[torch.Tensor], expected: list[torch.Tensor], without: list[torch.Tensor]) -> None:
    for g, e in zip(got, expected):
        assert torch.allclose(g, e, rtol=1e-4, atol=1e-8), (g - e).abs().max()
    # the penalty's share is large enough for the comparison to see it
    assert any(not torch.allclose(g, w, rtol=1e-3, atol=1e-6) for g, w in zip(got, without))


def objective_grads(b, batches, objective) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """d/d(logits) of objective(b, batches, penalty) with and without ModReg's penalty, same mask samples."""
    out = []
    for with_penalty in (True, False):
        model = copy.deepcopy(b)
        torch.manual_seed(7)
        loss = objective(model, batches, brute_force_objective_penalty(model.network) if with_penalty else 0.0)
        out.append(list(torch.autograd.grad(loss, mask_logits(model.network))))
    return out[0], out[1]


@pytest.mark.parametrize("base", ["ERM", "VREx", "IRM-domainbed", "IRM-irm_paper"])
def test_penalty_is_in_the_objective_before_the_base_rescales_it(base):
    """Logit gradients after one update = autograd of X's own objective with alpha*S1 + beta*S2 added.

    The penalty weight is on from the first update (anneal 0, lambda 10), so the IRM paper's
    schedule divides the whole objective, ModReg's penalty included, by 10.
    """
    name, _, schedule = base.partition("-")
    a = composed(name, irm_lambda=10.0, irm_penalty_anneal_iters=0, vrex_lambda=10.0, vrex_penalty_anneal_iters=0,
                 penalty_schedule=schedule or "domainbed")
    b = copy.deepcopy(a)
    batches = separable_batches((12,), n=8)
    torch.manual_seed(7)
    a.update(batches)

    def objective(model, batches, penalty):
        x = torch.cat([x for x, _ in batches])
        logits = model.network(x).split([len(y) for _, y in batches])
        risks = torch.stack([F.cross_entropy(l, y) for l, (_, y) in zip(logits, batches)])
        if name == "ERM":
            return F.cross_entropy(torch.cat(logits), torch.cat([y for _, y in batches])) + l2_term(model.network) + penalty
        if name == "VREx":
            data = risks.mean() + 10.0 * risks.var(unbiased=False)
        else:
            data = risks.mean() + 10.0 * torch.stack([irmv1(l, y) for l, (_, y) in zip(logits, batches)]).mean()
        total = data + l2_term(model.network) + penalty
        return total / 10.0 if schedule == "irm_paper" else total

    expected, without = objective_grads(b, batches, objective)
    assert_grads_match(logit_grads(a.network), expected, without)


@pytest.mark.parametrize("reading", ["sigmoid", "logit"])
@pytest.mark.parametrize("rescaled", [True, False])
def test_reading_scale_and_rescaling_enter_irm_papers_objective(reading, rescaled):
    """IRM+ModReg under the IRM paper's schedule (weight 10 from the first update): the logit gradients are
    autograd of (mean risk + 10 * IRMv1 + L2) / 10 + 0.3 * (alpha S1 + beta S2) / (10 if rescaled else 1)."""
    a = composed("IRM", irm_lambda=10.0, irm_penalty_anneal_iters=0, penalty_schedule="irm_paper",
                 modreg_pi=reading, modreg_scale=0.3, modreg_rescaled=rescaled)
    with torch.no_grad():  # logits of both signs and sizes, so that the two readings differ
        for logits in mask_logits(a.network):
            logits.copy_(torch.randn(logits.shape, generator=torch.Generator().manual_seed(logits.numel())) * 2)
    b = copy.deepcopy(a)
    batches = separable_batches((12,), n=8)
    torch.manual_seed(7)
    a.update(batches)

    def objective(model, batches, penalty):
        x = torch.cat([x for x, _ in batches])
        logits = model.network(x).split([len(y) for _, y in batches])
        risks = torch.stack([F.cross_entropy(l, y) for l, (_, y) in zip(logits, batches)])
        data = risks.mean() + 10.0 * torch.stack([irmv1(l, y) for l, (_, y) in zip(logits, batches)]).mean()
        return (data + l2_term(model.network)) / 10.0 + (penalty / 10.0 if rescaled else penalty)

    expected = []
    for with_penalty in (True, False):
        model = copy.deepcopy(b)
        torch.manual_seed(7)
        penalty = brute_force_objective_penalty(model.network, reading, 0.3) if with_penalty else 0.0
        expected.append(list(torch.autograd.grad(objective(model, batches, penalty), mask_logits(model.network))))
    assert_grads_match(logit_grads(a.network), *expected)


def test_the_two_readings_of_pi_give_different_penalties():
    """With pi = l, S2 of a layer whose logits all equal 2 is sqrt(n_out) * 2 per input feature; with
    pi = sigmoid(l), sqrt(n_out) * sigmoid(2)."""
    logits = torch.full((9, 4), 2.0)
    s2 = {reading: penalty_and_gradient(logits, 0.0, 1.0, reading)[1].item() for reading in ("sigmoid", "logit")}
    assert s2["logit"] == pytest.approx(4 * 3 * 2.0)
    assert s2["sigmoid"] == pytest.approx(4 * 3 * torch.sigmoid(torch.tensor(2.0)).item())


def test_fish_adds_the_penalty_to_every_inner_step():
    """Fish: each inner Adam step minimises CE on one environment + L2 + the penalty of the inner clone's logits."""
    a = composed("Fish")
    b = copy.deepcopy(a)
    batches = separable_batches((12,), n=8)
    torch.manual_seed(7)
    a.update(batches)
    torch.manual_seed(7)
    inner = copy.deepcopy(b.network)
    optimizer = torch.optim.Adam(
        [{"params": [p for n, p in inner.named_parameters() if "mask_logits" not in n]},
         {"params": mask_logits(inner), "lr": 1e-2, "weight_decay": 0.0}], lr=b.hparams["lr"])
    for x, y in batches:
        optimizer.zero_grad()
        (F.cross_entropy(inner(x), y) + l2_term(inner) + brute_force_objective_penalty(inner)).backward()
        optimizer.step()
    for got, expected in zip(logit_grads(a.inner), [l.grad for l in mask_logits(inner)]):
        assert torch.allclose(got, expected, rtol=1e-4, atol=1e-8)
    # the meta step then moves the network's logits like every other parameter: meta + 0.5 * (inner - meta)
    for meta, start, end in zip(mask_logits(a.network), mask_logits(b.network), mask_logits(inner)):
        assert torch.allclose(meta, start + 0.5 * (end - start), atol=1e-6)


def test_sandmask_masks_the_combined_gradient():
    """SAND-mask's sign agreement and variance are those of CE_e + L2 + penalty, per environment."""
    a = composed("SANDMask", tau=0.3, k=10.0)
    b = copy.deepcopy(a)
    batches = separable_batches((12,), n=8)
    torch.manual_seed(7)
    a.update(batches)

    def surgery(with_penalty: bool) -> list[torch.Tensor]:
        model = copy.deepcopy(b)
        torch.manual_seed(7)
        per_env = []
        for x, y in batches:
            penalty = brute_force_objective_penalty(model.network) if with_penalty else 0.0
            loss = F.cross_entropy(model.network(x), y) + l2_term(model.network) + penalty
            per_env.append(torch.autograd.grad(loss, mask_logits(model.network)))
        out = []
        for grads in zip(*per_env):
            g = torch.stack(grads)
            agreement = g.sign().mean(0).abs()
            mask = torch.tanh(10.0 * (agreement - 0.3) / g.var(0, unbiased=True)).clamp_min(0)
            out.append(mask * g.mean(0) / (1e-10 + mask.mean()))
        return out

    assert_grads_match(logit_grads(a.network), surgery(True), surgery(False))


def test_dmg_adds_the_penalty_beside_its_overlap_penalty():
    """DMG: CE under each domain's sampled neuron mask + lambda_O * summed pairwise soft IoU + L2 + penalty."""
    a = composed("DMG", dmg_lambda_o=0.5)
    b = copy.deepcopy(a)
    batches = separable_batches((12,), n=8)
    torch.manual_seed(7)
    a.update(batches)

    def objective(model, batches, penalty):
        generator = torch.Generator().manual_seed(model._mask_seed)
        domains = torch.cat([torch.full((len(y),), d) for d, (_, y) in enumerate(batches)])
        probs = [torch.sigmoid(logit) for logit in model.masks.logits]
        masks = [torch.bernoulli(p[domains].detach(), generator=generator) + p[domains] - p[domains].detach()
                 for p in probs]
        x, y = torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])
        nll = F.cross_entropy(model._masked_forward(x, masks), y)
        overlap = 0.0
        for p in probs:
            pairs = [(i, j) for i in range(len(p)) for j in range(i + 1, len(p))]
            overlap = overlap + sum(((p[i] * p[j]).sum() + 1e-8) / ((p[i] + p[j] - p[i] * p[j]).sum() + 1e-8)
                                    for i, j in pairs)
        return nll + 0.5 * overlap + l2_term(model.network) + penalty

    expected, without = objective_grads(b, batches, objective)
    assert_grads_match(logit_grads(a.network), expected, without)


def test_every_registered_base_is_covered_by_a_composition_test():
    # built-in ones; a plugin's (the example's LabelSmoothing, loaded by the generic tests) is the plugin's to test
    builtin = {name for name, owner in ALGORITHMS.owners().items() if owner.endswith("(built in)")}
    # each family's composition tests live in its own file (tests/test_algorithms_*.py)
    kernels = {"CORAL", "MMD", "CausIRL_CORAL", "CausIRL_MMD", "MTL", "SelfReg", "CAD", "CondCAD"}
    adversarial = {"DANN", "CDANN", "SagNet", "URM", "ADRMX", "IB_ERM", "IB_IRM", "RDM"}
    risk = {"GroupDRO", "Mixup", "MLDG", "ARM", "RSC", "SD", "EQRM"}
    gradients = {"ANDMask", "IGA", "Fishr", "TRM", "Transfer"}
    # tests/test_algorithms_ermpp.py, tests/test_multihead.py; CLIP refuses ModReg (its tower is frozen): tests/test_clip.py
    others = {"ERMPlusPlus", "MultiHead", "CLIP"}
    known = {"ERM", "IRM", "VREx", "Fish", "SANDMask", "DMG"} | kernels | adversarial | risk | gradients | others
    assert builtin <= known


def test_a_base_whose_objective_takes_no_additive_term_is_refused():
    from domaingen.algorithms.erm import ERM

    class Closed(ERM):
        NO_ADDITIVE_PENALTY = "its update is a closed-form solve, not a gradient step on a loss"

    with pytest.raises(DomaingenError, match="ModReg cannot be composed with Closed: its update is a closed-form solve"):
        with_modreg(Closed)


def test_a_base_that_leaves_out_the_regularization_is_caught_at_its_first_update():
    from domaingen.algorithms.erm import ERM

    class Forgetful(ERM):
        def step(self, loss):
            self.apply_gradients(loss)

    algorithm = with_modreg(Forgetful)((12,), 2, 3, build("ERM+ModReg", (12,), featurizer="MLP", mlp_width=8).hparams)
    with pytest.raises(DomaingenError, match="never added self.regularization"):
        algorithm.update(separable_batches((12,), n=4))


@pytest.mark.parametrize("base", BASES)
def test_records_carry_modreg_fields_for_every_base(base):
    """The logged S1, S2 are those the update's loss used (Fish: its last inner step's, on the inner clone)."""
    algorithm = composed(base)
    s1 = sum(specialization_penalty(l).item() for l in mask_logits(algorithm.network))
    s2 = sum(reuse_penalty(l).item() for l in mask_logits(algorithm.network))
    losses = algorithm.update(separable_batches((12,), n=8))
    if base != "Fish":
        assert losses["modreg_s1"] == pytest.approx(s1, rel=1e-5)
        assert losses["modreg_s2"] == pytest.approx(s2, rel=1e-5)
    assert losses["modreg_penalty"] == pytest.approx(ALPHA * losses["modreg_s1"] + BETA * losses["modreg_s2"])
    assert algorithm.diagnostics()["modreg_kept_fraction"] == 1.0


# --- mask trajectories in the records ---


def test_keep_probability_mean_and_percentiles_by_hand():
    """sigmoid(l) = 0.05 + 0.08 i, i = 0..11, shuffled: linear-interpolation percentiles at (n-1) q / 100."""
    layer = add_weight_masks(nn.Linear(4, 3))[0][1]
    probs = 0.05 + 0.08 * torch.tensor([7, 2, 11, 0, 5, 9, 1, 10, 3, 8, 6, 4], dtype=torch.float64)
    with torch.no_grad():
        layer.mask_logits.copy_(torch.logit(probs).view(3, 4).float())
    stats = subnetwork_stats(layer)
    assert stats.keep_prob_mean == pytest.approx(0.05 + 0.08 * 5.5, abs=1e-6)
    for q, position in ((10, 1.1), (50, 5.5), (90, 9.9)):
        assert stats.keep_prob_quantiles[q] == pytest.approx(0.05 + 0.08 * position, abs=1e-6)
    assert stats.kept_fraction == pytest.approx(6 / 12)  # sigmoid > 0.5 for i >= 6


def test_every_checkpoint_record_carries_the_keep_probabilities_per_layer(tmp_path):
    from domaingen.run.rundir import RunDirectory
    from domaingen.run.training import TrainConfig, train

    train(TrainConfig("ColoredMNIST", "ERM+ModReg", str(tmp_path / "run"), test_envs=[2], data_dir="embedded",
                      hparams={"featurizer": "MLP", "mlp_width": 16, "batch_size": 8}, steps=2, checkpoint_freq=1))
    records = RunDirectory(tmp_path / "run").records()
    layers = ["featurizer.layers.1", "featurizer.layers.4", "featurizer.layers.7", "classifier"]
    assert len(records) == 2
    for record in records:
        for layer in layers:
            values = [record[f"modreg_{layer}_keep_prob_{k}"] for k in ("p10", "p50", "p90", "mean")]
            assert 0 < values[0] <= values[1] <= values[2] < 1 and 0 < values[3] < 1
            assert record[f"modreg_{layer}_kept_fraction"] == 1.0
    # step 0 is recorded after one update at mask lr 1e-2: every logit within 0.01 of 2
    assert records[0]["modreg_classifier_keep_prob_p50"] == pytest.approx(float(torch.sigmoid(torch.tensor(2.0))), abs=3e-3)
    # the median keep probability moves as the logits train (a second Adam step at 1e-2)
    assert records[-1]["modreg_classifier_keep_prob_p50"] != records[0]["modreg_classifier_keep_prob_p50"]


def test_the_masks_package_reexports_both_modules():
    import domaingen.masks as package
    from domaingen.masks import neuron_masks, weight_masks

    for name in package.__all__:
        source = weight_masks if hasattr(weight_masks, name) else neuron_masks
        assert getattr(package, name) is getattr(source, name), name
    assert not hasattr(weight_masks, "DomainNeuronMasks") and not hasattr(neuron_masks, "MaskedLinear")
