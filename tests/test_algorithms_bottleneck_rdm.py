"""IB_ERM, IB_IRM and RDM against hand computations of their papers' formulas, their schedules
and declarations; and, for every algorithm of dann/sagnet/urm/adrmx/ib/rdm: X+ModReg's penalty in
the objective, a resumed run equal to an uninterrupted one, and the two-domain refusal."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from conftest import FAST_HPARAMS
from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.hparams import draw_hparams, run_space
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, resolve, train
from domaingen.testing import VOLATILE_FIELDS
from test_algorithms_generic import build, default_hparams, separable_batches
from test_algorithms_specific import ce_grad_wrt_scale

SHAPE = (6,)
TINY = {"featurizer": "MLP", "mlp_width": 8}
ADDED = ["DANN", "CDANN", "SagNet", "URM", "ADRMX", "IB_ERM", "IB_IRM", "RDM"]


def tiny(name: str, seed: int = 0, **overrides):
    return build(name, SHAPE, seed=seed, **{**TINY, **overrides})


def per_env_numpy(model, batches):
    """(features, logits, labels) per environment as float64 arrays, with the model's current weights."""
    out = []
    with torch.no_grad():
        for x, y in batches:
            z = model.featurizer(x)
            out.append((z.double().numpy(), model.classifier(z).double().numpy(), y.numpy()))
    return out


def ce_each(logits: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Per-example cross-entropy, row by row."""
    return np.array([np.log(np.exp(row - row.max()).sum()) + row.max() - row[label] for row, label in zip(logits, y)])


def bottleneck(features: np.ndarray) -> float:
    """mean over dimensions of the unbiased variance over the examples, one dimension at a time."""
    n = len(features)
    return float(np.mean([((col - col.mean()) ** 2).sum() / (n - 1) for col in features.T]))


# --- IB_ERM / IB_IRM ---


def test_ib_erm_loss_and_schedule_equal_hand_computation():
    model = tiny("IB_ERM", ib_lambda=7.0, ib_penalty_anneal_iters=2)
    first = model.optimizer
    for step in range(4):
        batches = separable_batches(SHAPE, n=6, seed=step)
        envs = per_env_numpy(model, batches)
        nll = np.mean([ce_each(logits, y).mean() for _, logits, y in envs])
        ib = np.mean([bottleneck(z) for z, _, _ in envs])
        out = model.update(batches)
        weight = 0.0 if step < 2 else 7.0
        assert out["nll"] == pytest.approx(nll, rel=1e-5)
        assert out["ib_penalty"] == pytest.approx(ib, rel=1e-5)
        assert out["loss"] == pytest.approx(nll + weight * ib, rel=1e-5)
        assert (model.optimizer is first) == (step < 2)  # Adam restarts when the penalty switches on


def test_ib_irm_loss_equals_hand_computation_and_adam_restarts_at_either_switch():
    model = tiny("IB_IRM", ib_lambda=3.0, ib_penalty_anneal_iters=1, irm_lambda=20.0, irm_penalty_anneal_iters=3)
    optimizers = [model.optimizer]
    for step in range(4):
        batches = separable_batches(SHAPE, n=6, seed=step)
        envs = per_env_numpy(model, batches)
        nll = np.mean([ce_each(logits, y).mean() for _, logits, y in envs])
        irm = np.mean([ce_grad_wrt_scale(logits[::2], y[::2]) * ce_grad_wrt_scale(logits[1::2], y[1::2])
                       for _, logits, y in envs])
        ib = np.mean([bottleneck(z) for z, _, _ in envs])
        out = model.update(batches)
        w_irm, w_ib = (1.0 if step < 3 else 20.0), (0.0 if step < 1 else 3.0)
        assert out["irm_penalty"] == pytest.approx(irm, rel=1e-4, abs=1e-9)
        assert out["ib_penalty"] == pytest.approx(ib, rel=1e-5)
        assert out["loss"] == pytest.approx(nll + w_irm * irm + w_ib * ib, rel=1e-5)
        optimizers.append(model.optimizer)
    # new Adam at update 1 (the bottleneck switches on) and update 3 (IRM's penalty does)
    assert [optimizers[i] is optimizers[i + 1] for i in range(4)] == [True, False, True, False]


# --- RDM ---


def hand_mmd(a: np.ndarray, b: np.ndarray) -> float:
    gammas = [1e-4, 1e-3, 1e-2, 1e-1, 1, 10, 100, 1000]

    def k(p, q):
        return sum(math.exp(-g * (p - q) ** 2) for g in gammas)

    def mean_k(u, v):
        return sum(k(p, q) for p in u for q in v) / (len(u) * len(v))

    return mean_k(a, a) + mean_k(b, b) - 2 * mean_k(a, b)


def test_rdm_loss_equals_hand_computation_and_switches_adam_to_rdm_lr():
    model = tiny("RDM", rdm_lambda=2.0, variance_weight=0.3, rdm_penalty_anneal_iters=2, rdm_lr=4e-4, lr=1e-3)
    for step in range(4):
        batches = separable_batches(SHAPE, n=6, seed=step)
        envs = per_env_numpy(model, batches)
        losses = [ce_each(logits, y) for _, logits, y in envs]
        risks = [l.mean() for l in losses]
        worst = losses[int(np.argmax(risks))]
        pooled = np.concatenate(losses)
        matching = hand_mmd(worst, pooled)
        variance = pooled.var(ddof=1) + worst.var(ddof=1)
        out = model.update(batches)
        on = step >= 2
        assert out["nll"] == pytest.approx(np.mean(risks), rel=1e-5)
        assert out["matching_penalty"] == pytest.approx(matching, rel=1e-3, abs=1e-6)
        assert out["variance_penalty"] == pytest.approx(variance, rel=1e-4)
        expected = np.mean(risks) + (2.0 * matching + 0.3 * variance if on else 0.0)
        assert out["loss"] == pytest.approx(expected, rel=1e-5)
        assert model.optimizer.param_groups[0]["lr"] == (4e-4 if on else 1e-3)


def space(name, dataset):
    return run_space(dataset, DATASETS.get(dataset), ALGORITHMS.get(name))


@pytest.mark.parametrize("key, dataset, default, sampler", [
    ("rdm_lambda", "ColoredMNIST", 5.0, "U(0.1,10)"),
    ("rdm_lambda", "DomainNet", 0.5, "U(0.1,1)"),
    ("rdm_lambda", "PACS", 5.0, "U(1,10)"),
    ("rdm_lambda", "TerraIncognita", 5.0, "U(1,10)"),
    ("rdm_penalty_anneal_iters", "VLCS", 1500, "int(U(800,2700))"),
    ("rdm_penalty_anneal_iters", "DomainNet", 2400, "int(U(1500,3000))"),
    ("variance_weight", "PACS", 0.004, "U(0.001,0.007)"),
    ("variance_weight", "OfficeHome", 0.0, "choice{0.0}"),
    ("rdm_lr", "ColoredMNIST", 1.5e-5, "U(8e-06,2e-05)"),
    ("batch_size", "ColoredMNIST", 64, "int(2^U(3,9))"),
    ("batch_size", "PACS", 88, "int(U(70,100))"),
    ("batch_size", "TerraIncognita", 40, "int(U(30,60))"),
])
def test_rdm_dataset_dependent_declarations(key, dataset, default, sampler):
    hp = space("RDM", dataset)[key]
    assert (hp.default, str(hp.sampler)) == (default, sampler)


def test_rdm_batch_size_overrides_the_datasets_and_draws_in_its_range():
    for seed in range(1, 6):
        assert 70 <= draw_hparams(space("RDM", "PACS"), "PACS", seed)["batch_size"] < 100
        assert draw_hparams(space("ERM", "PACS"), "PACS", seed)["batch_size"] < 46


@pytest.mark.parametrize("name, overrides, message", [
    ("IB_ERM", {"ib_lambda": -1.0}, r"^ib_lambda must be >= 0 \(it weighs a penalty\), got -1.0$"),
    ("IB_IRM", {"ib_lambda": -2.0}, r"^ib_lambda must be >= 0 \(it weighs a penalty\), got -2.0$"),
    ("RDM", {"rdm_lambda": -0.1}, r"^rdm_lambda must be >= 0 \(it weighs a penalty\), got -0.1$"),
    ("RDM", {"rdm_lr": 0.0}, r"^rdm_lr must be > 0 \(the Adam learning rate after annealing\), got 0.0$"),
])
def test_out_of_domain_values_are_one_line_errors(name, overrides, message):
    with pytest.raises(DomaingenError, match=message):
        ALGORITHMS.get(name).check_hparams(default_hparams(name, **overrides))


@pytest.mark.parametrize("single_logit", [False, True])
@pytest.mark.parametrize("domains", [2, 5])
@pytest.mark.parametrize("name", ["IB_ERM", "IB_IRM", "RDM"])
def test_every_domain_count_and_one_logit(name, domains, single_logit):
    hparams = default_hparams(name, **TINY, single_logit=single_logit, ib_penalty_anneal_iters=1,
                              irm_penalty_anneal_iters=1, rdm_penalty_anneal_iters=1)
    torch.manual_seed(0)
    model = ALGORITHMS.get(name)(SHAPE, 2, domains, hparams)
    for s in range(3):
        out = model.update(separable_batches(SHAPE, n=4, seed=s, domains=domains))
        assert all(math.isfinite(v) for v in out.values())


@pytest.mark.parametrize("name", ["IB_ERM", "IB_IRM", "RDM"])
def test_updates_under_bf16_autocast(name):
    model = tiny(name, ib_penalty_anneal_iters=0, irm_penalty_anneal_iters=0, rdm_penalty_anneal_iters=0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model.update(separable_batches(SHAPE, n=4))
    assert all(math.isfinite(v) for v in out.values())


# --- every added algorithm: refusal with one training domain ---


@pytest.mark.parametrize("name", ["DANN", "CDANN", "ADRMX", "RDM"])
def test_methods_comparing_domains_refuse_one_training_domain(name, tmp_path):
    with pytest.raises(DomaingenError, match=rf"^{name} needs at least 2 training domains, got 1; "
                                             r"hold out fewer environments$"):
        resolve(TrainConfig(dataset="ColoredMNIST", algorithm=name, test_envs=[0, 1],
                            output_dir=str(tmp_path / "run"), data_dir="embedded"))
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("name", ["SagNet", "URM", "IB_ERM", "IB_IRM"])
def test_the_others_train_on_one_domain(name):
    ALGORITHMS.get(name).check_problem(1, {"single_logit": True})
    model = build(name, SHAPE, **TINY)
    model.update(separable_batches(SHAPE, n=4, domains=1))


# --- X+ModReg: the penalty is in every loss that trains the network ---

ALPHA, BETA = 2e-3, 5e-2


def brute_force_penalty(module) -> torch.Tensor:
    """alpha * S1 + beta * S2 of `module`'s mask logits, one input feature at a time."""
    total = torch.zeros(())
    for layer in module.modules():
        if hasattr(layer, "mask_logits"):
            pi = torch.sigmoid(layer.mask_logits)
            for p in range(pi.shape[1]):
                total = total + ALPHA * pi[:, p].sum() ** 2 + BETA * pi[:, p].square().sum().sqrt()
    return total


@pytest.mark.parametrize("name", ADDED)
def test_modreg_penalty_enters_the_networks_loss(name):
    """Mask-logit gradients of one network-training update = those without the penalty + d(penalty)/d(logits)."""
    overrides = dict(TINY, modreg_mask_lr=1e-2, d_steps_per_g_step=1, mlp_depth=3, ib_penalty_anneal_iters=0,
                     irm_penalty_anneal_iters=0, rdm_penalty_anneal_iters=0)
    with_penalty = build(f"{name}+ModReg", SHAPE, modreg_alpha=ALPHA, modreg_beta=BETA, **overrides)
    without = build(f"{name}+ModReg", SHAPE, modreg_alpha=0.0, modreg_beta=0.0, **overrides)
    expected = torch.autograd.grad(brute_force_penalty(with_penalty.network),
                                   [m.mask_logits for m in with_penalty.network.modules() if hasattr(m, "mask_logits")])
    batches = separable_batches(SHAPE, n=6)
    grads = []
    for model in (with_penalty, without):
        torch.manual_seed(3)
        model.update(batches)  # update 1 trains the network (a G step where the method alternates)
        grads.append([m.mask_logits.grad for m in model.network.modules() if hasattr(m, "mask_logits")])
    assert len(grads[0]) in (4, 6)  # MLP of depth 3 and the classifier (ADRMX: a three-layer head)
    # SagNet's featurizer takes a second (adversary) step, from logits its content step has moved: its
    # classifier's gradients are the content step's
    checked = slice(-1, None) if name == "SagNet" else slice(None)
    for got, base, exp in list(zip(grads[0], grads[1], expected))[checked]:
        torch.testing.assert_close(got - base, exp, rtol=1e-4, atol=1e-7)
    # every optimizer holding mask logits holds them apart, at modreg_mask_lr, without weight decay
    logits = {id(m.mask_logits) for m in with_penalty.modules() if hasattr(m, "mask_logits")}
    held = set()
    for optimizer in with_penalty.optimizers().values():
        for group in optimizer.param_groups:
            ids = {id(p) for p in group["params"]}
            if ids & logits:
                assert ids <= logits and group["lr"] == 1e-2 and group["weight_decay"] == 0.0
                held |= ids
    assert held == logits


# --- resume: an interrupted run's records equal an uninterrupted one's ---

RESUME_HPARAMS = {
    "DANN": {"d_steps_per_g_step": 2, "grad_penalty": 0.1},
    "CDANN": {"d_steps_per_g_step": 2},
    "SagNet": {},
    "URM": {"urm_discriminator_label_smoothing": 0.1},
    "ADRMX": {"mlp_depth": 3, "lr": 1e-3},
    "IB_ERM": {"ib_penalty_anneal_iters": 4},
    "IB_IRM": {"ib_penalty_anneal_iters": 4, "irm_penalty_anneal_iters": 5},
    "RDM": {"rdm_penalty_anneal_iters": 4, "rdm_lr": 1e-3},
}


def config(out, name) -> TrainConfig:
    return TrainConfig(dataset="ColoredMNIST", algorithm=name, output_dir=str(out), test_envs=[2], data_dir="embedded",
                       hparams={**FAST_HPARAMS, **RESUME_HPARAMS[name]}, steps=8, checkpoint_freq=3)


@pytest.mark.parametrize("name", ADDED)
def test_resumed_run_equals_uninterrupted_run(name, tmp_path, monkeypatch):
    train(config(tmp_path / "straight", name))
    real_evaluate, calls = training.evaluate, {"n": 0}

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the checkpoints at steps 0 and 3
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed", name))
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    train(config(tmp_path / "resumed", name))

    def stable(path):
        return [{k: v for k, v in r.items() if k not in VOLATILE_FIELDS} for r in RunDirectory(path).records()]

    assert [r["step"] for r in stable(tmp_path / "resumed")] == [0, 3, 6, 7]
    assert stable(tmp_path / "resumed") == stable(tmp_path / "straight")
