"""ERMPlusPlus: the warm-up, the moving average and its BatchNorm rule computed another way; LARS by hand;
hyperparameters; resume; compositions and refusals."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.base import concat
from domaingen.algorithms.ermpp import LARS
from domaingen.errors import DomaingenError
from domaingen.networks import FEATURIZERS
from domaingen.run import training
from domaingen.run.training import TrainConfig, resolve, train
from domaingen.testing import build as build_generic, VOLATILE_FIELDS
from domaingen.testing import separable_batches
from imagetree import make_folder_tree

HP = {"lr": 1e-2, "linear_lr": 1e-3, "weight_decay": 0.0, "batch_size": 8, "featurizer": "MLP", "mlp_width": 8,
      "mlp_depth": 3, "mlp_dropout": 0.0, "linear_steps": 2, "sma_start_iter": 5, "lars": False}


def minibatches(step: int, dim: int = 5):
    g = torch.Generator().manual_seed(step)
    return [(torch.randn(8, dim, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(2)]


def weights(module: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items() if v.is_floating_point()}


def build(**overrides):
    torch.manual_seed(0)
    return ALGORITHMS.get("ERMPlusPlus")((5,), 3, 2, {**HP, **overrides})


def test_warm_up_steps_the_head_only_at_linear_lr_then_the_whole_network_at_lr():
    algorithm = build()
    featurizer0, classifier0 = weights(algorithm.featurizer), weights(algorithm.classifier)
    for step in range(3):  # linear_steps 2: updates 1..3 (DomainBed counts the updates before the current one)
        assert algorithm.in_warm_up()
        before = weights(algorithm.classifier)
        algorithm.update(minibatches(step))
        assert all(torch.equal(v, featurizer0[k]) for k, v in weights(algorithm.featurizer).items())
        if step == 0:  # Adam's first step moves each weight by lr * g / (|g| + eps): at most linear_lr
            moved = max((v - before[k]).abs().max().item() for k, v in weights(algorithm.classifier).items())
            assert moved == pytest.approx(1e-3, rel=1e-3)
    assert any(not torch.equal(v, classifier0[k]) for k, v in weights(algorithm.classifier).items())
    assert not algorithm.in_warm_up()
    before = weights(algorithm.featurizer)
    algorithm.update(minibatches(3))  # the fourth update trains everything, from a fresh Adam at lr
    moved = max((v - before[k]).abs().max().item() for k, v in weights(algorithm.featurizer).items())
    assert moved == pytest.approx(1e-2, rel=1e-3)


def test_the_average_is_the_mean_of_the_snapshots_from_update_start_minus_one():
    algorithm = build()
    snapshots = [weights(algorithm.network)]  # snapshot n: the weights after update n (0: the initial ones)
    for step in range(9):
        algorithm.update(minibatches(step))
        snapshots.append(weights(algorithm.network))
        n = step + 1
        shown = weights(algorithm.network_sma)
        if n < 5:
            expected = snapshots[n]
        else:  # sma_start_iter 5: the plain mean of the weights after updates 4..n, by a loop
            expected = {}
            for k in snapshots[0]:
                total = torch.zeros_like(snapshots[0][k])
                for m in range(4, n + 1):
                    total += snapshots[m][k]
                expected[k] = total / (n - 3)
        assert all(torch.allclose(shown[k], expected[k], atol=1e-6) for k in expected), n
    x = minibatches(99)[0][0]
    assert torch.equal(algorithm.predict(x), algorithm.network_sma(x))
    assert algorithm.weights_evaluated() == "ERM++ simple moving average of the weights after updates 4..9"


@pytest.mark.parametrize("name", ["ERMPlusPlus", "ERMPlusPlus+ModReg"])
def test_it_learns_a_separable_problem_with_a_short_warm_up(name):
    # the generic check's problem, with a warm-up and an averaging start that fit in its 40 updates
    shape = (2, 14, 14)
    algorithm = build_generic(name, shape, featurizer="MLP", mlp_width=64, linear_steps=5, sma_start_iter=20)
    x, y = concat(separable_batches(shape, n=64, seed=99))
    with torch.no_grad():
        before = F.cross_entropy(algorithm.predict(x), y).item()
    for step in range(40):
        algorithm.update(separable_batches(shape, seed=step))
    with torch.no_grad():
        after = F.cross_entropy(algorithm.predict(x), y).item()
    assert after < 0.5 * before


class LinearBN(nn.Module):
    """Linear then BatchNorm: the batch statistics of the BatchNorm input are a hand formula."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.linear, self.bn = nn.Linear(dim, 4), nn.BatchNorm1d(4)
        self.n_outputs = 4

    def forward(self, x):
        return self.bn(self.linear(x))


@pytest.fixture
def linear_bn():
    FEATURIZERS.register("TestLinearBN")(lambda shape, hparams: LinearBN(shape[0]))
    yield "TestLinearBN"
    FEATURIZERS.unregister("TestLinearBN")


def test_the_averages_batchnorm_statistics_follow_domainbeds_rule_by_hand(linear_bn):
    algorithm = build(featurizer=linear_bn, freeze_bn=False, sma_start_iter=3)
    sma_mean = algorithm.network_sma[0].bn.running_mean.clone()
    sma_var = algorithm.network_sma[0].bn.running_var.clone()
    for step in range(6):
        batch = minibatches(step)
        algorithm.update(batch)
        n = step + 1
        live = algorithm.featurizer.bn
        # 1. averaged like a weight (a copy before sma_start_iter)
        if n < 3:
            sma_mean, sma_var = live.running_mean.clone(), live.running_var.clone()
        else:
            count = n - 2
            sma_mean = (sma_mean * count + live.running_mean) / (count + 1)
            sma_var = (sma_var * count + live.running_var) / (count + 1)
        # 2. one momentum step (0.1) towards the batch statistics under the averaged weights
        x = torch.cat([b[0] for b in batch])
        linear = algorithm.network_sma[0].linear
        h = x @ linear.weight.T + linear.bias
        sma_mean = 0.9 * sma_mean + 0.1 * h.mean(0)
        sma_var = 0.9 * sma_var + 0.1 * h.var(0, unbiased=True)
        assert torch.allclose(algorithm.network_sma[0].bn.running_mean, sma_mean, atol=1e-5), n
        assert torch.allclose(algorithm.network_sma[0].bn.running_var, sma_var, atol=1e-5), n
    assert not algorithm.network_sma.training  # the average always predicts in eval mode


def test_frozen_batchnorm_leaves_the_average_to_the_average(linear_bn):
    algorithm = build(featurizer=linear_bn, freeze_bn=True, sma_start_iter=1)
    initial = algorithm.network_sma[0].bn.running_mean.clone()
    algorithm.update(minibatches(0))
    # no refresh pass: the average's statistics are the mean of the initial and the live ones
    expected = (initial + algorithm.featurizer.bn.running_mean) / 2
    assert torch.allclose(algorithm.network_sma[0].bn.running_mean, expected, atol=1e-6)


def test_lars_step_by_hand():
    w = nn.Parameter(torch.tensor([[3.0, 4.0]]))
    b = nn.Parameter(torch.tensor([1.0]))
    optimizer = LARS([w, b], lr=0.5, weight_decay=0.1, momentum=0.9, trust_coefficient=0.01)
    w.grad, b.grad = torch.tensor([[0.0, 1.0]]), torch.tensor([2.0])
    optimizer.step()
    d = [0.0 + 0.1 * 3.0, 1.0 + 0.1 * 4.0]  # g + wd w, scaled by trust |w| / |d|
    scale = 0.01 * 5.0 / (d[0] ** 2 + d[1] ** 2) ** 0.5
    assert torch.allclose(w.detach(), torch.tensor([[3.0 - 0.5 * scale * d[0], 4.0 - 0.5 * scale * d[1]]]))
    assert torch.allclose(b.detach(), torch.tensor([1.0 - 0.5 * 2.0]))  # one dimension: plain momentum SGD
    optimizer.step()  # mu = 0.9 * 2 + 2
    assert torch.allclose(b.detach(), torch.tensor([1.0 - 0.5 * 2.0 - 0.5 * 3.8]))


def test_lars_trains_both_optimizers():
    algorithm = build(lars=True)
    assert isinstance(algorithm.optimizer, LARS) and isinstance(algorithm.linear_optimizer, LARS)
    for step in range(5):
        algorithm.update(minibatches(step))
    assert algorithm.optimizers().keys() == {"optimizer", "linear_optimizer"}
    assert algorithm.optimizers()["optimizer"].state  # the full optimizer has stepped


def test_domainbeds_hyperparameters_and_draws():
    space = ALGORITHMS.get("ERMPlusPlus").hparam_space()
    assert {k: space[k].default for k in ("linear_lr", "linear_steps", "lars")} == \
        {"linear_lr": 5e-5, "linear_steps": 500, "lars": False}
    # DomainBed's registry value of linear_lr for (ERMPlusPlus, PACS, hparams_seed 1, trial_seed 0), computed
    # with DomainBed in a scratch directory: 10**U(-5, -3.5) from its RandomState
    run = resolve(TrainConfig("PACS", "ERMPlusPlus", "unused", test_envs=[0], hparams_seed=1, trial_seed=0,
                              protocol="domainbed"))
    assert run.hparams["linear_lr"] == DOMAINBED_LINEAR_LR
    assert run.hparams["linear_steps"] == 500 and run.hparams["lars"] is False


DOMAINBED_LINEAR_LR = 2.7696523567489467e-05


def test_bf16_autocast_update():
    algorithm = build(linear_steps=0)
    with torch.autocast("cpu", torch.bfloat16):
        for step in range(3):
            losses = algorithm.update(minibatches(step))
    assert torch.isfinite(torch.tensor(losses["loss"]))
    assert all(p.dtype == torch.float32 for p in algorithm.network_sma.parameters())


def test_modreg_composes_and_its_mask_logits_are_averaged():
    torch.manual_seed(0)
    algorithm = ALGORITHMS.get("ERMPlusPlus+ModReg")((5,), 3, 2, {**HP, **_modreg_defaults(), "sma_start_iter": 1})
    logits = [algorithm.classifier.mask_logits.detach().clone()]
    for step in range(3):
        losses = algorithm.update(minibatches(step))
        logits.append(algorithm.classifier.mask_logits.detach().clone())
    assert "modreg_penalty" in losses
    assert torch.allclose(algorithm.network_sma[1].mask_logits, sum(logits) / len(logits), atol=1e-6)


def _modreg_defaults():
    from domaingen.algorithms.modreg import ModRegMixin

    return {k: v.default for k, v in ModRegMixin.HPARAMS.items()}


@pytest.mark.parametrize("name", ["ERMPlusPlus+EMA", "ERMPlusPlus+SWAD", "ERMPlusPlus+ModReg+SWAD"])
def test_weight_averaging_refuses_it_in_one_line(name):
    modifier = name.rpartition("+")[2]
    with pytest.raises(DomaingenError, match=rf"^{modifier} cannot be composed with ERMPlusPlus(ModReg)?: "
                                             "ERMPlusPlus evaluates its own moving average of the weights; "
                                             "average ERM instead$"):
        ALGORITHMS.get(name)


@pytest.mark.parametrize("key, value, message", [
    ("linear_steps", -1, "linear_steps must be at least 0, got -1"),
    ("sma_start_iter", 0, "sma_start_iter must be at least 1, got 0"),
    ("linear_lr", -1e-3, "linear_lr must be at least 0, got -0.001"),
])
def test_out_of_domain_values_are_refused(key, value, message):
    with pytest.raises(DomaingenError, match=f"^{message}$"):
        ALGORITHMS.get("ERMPlusPlus").check_hparams({**HP, key: value})


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("data")
    make_folder_tree(root / "PACS", ["art_painting", "cartoon", "photo", "sketch"], ["dog", "horse"], per_class=5)
    return root


def config(out, data_dir) -> TrainConfig:
    hparams = {"featurizer": "MNIST_CNN", "image_size": 16, "batch_size": 2, "num_workers": 0,
               "linear_steps": 1, "sma_start_iter": 3, "freeze_bn": False}
    return TrainConfig(dataset="PACS", algorithm="ERMPlusPlus", output_dir=str(out), test_envs=[3],
                       data_dir=str(data_dir), hparams=hparams, steps=6, checkpoint_freq=2)


def test_records_say_which_weights_and_resume_equals_an_uninterrupted_run(data_dir, tmp_path, monkeypatch):
    straight = train(config(tmp_path / "straight", data_dir)).records
    assert [r["weights_evaluated"] for r in straight] == [
        "ERM++ average: a copy of the weights after update 1 (averaging starts at update 3)",
        "ERM++ simple moving average of the weights after updates 2..3",
        "ERM++ simple moving average of the weights after updates 2..5",
        "ERM++ simple moving average of the weights after updates 2..6",
    ]
    calls = {"n": 0}
    real = training.evaluate

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # during the checkpoint at step 4, after those at 0 and 2
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed", data_dir))
    monkeypatch.setattr(training, "evaluate", real)
    resumed = train(config(tmp_path / "resumed", data_dir)).records
    drop = VOLATILE_FIELDS
    assert [{k: v for k, v in r.items() if k not in drop} for r in resumed] == \
        [{k: v for k, v in r.items() if k not in drop} for r in straight]
    a = torch.load(tmp_path / "straight" / "checkpoint.pt", weights_only=False)
    b = torch.load(tmp_path / "resumed" / "checkpoint.pt", weights_only=False)
    model_a, model_b = _model_state(a), _model_state(b)
    assert any(k.startswith("network_sma.") for k in model_a) and "sma_count" in model_a
    assert model_a.keys() == model_b.keys() and all(torch.equal(model_a[k], model_b[k]) for k in model_a)


def _model_state(checkpoint):
    return checkpoint["algorithm"]["model"] if "algorithm" in checkpoint else checkpoint["model"]


def test_diagnose_looks_at_the_average_which_predicts():
    algorithm = build()
    layers = algorithm.activation_layers()
    average = dict(algorithm.network_sma.named_modules())
    assert layers and all(module is average["0." + name.removeprefix("featurizer.")] for name, module in layers.items())
