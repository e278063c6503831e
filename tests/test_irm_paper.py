"""The IRM paper's Colored MNIST protocol: dataset, network, losses, penalty schedule, full batch."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.base import classification_loss
from domaingen.algorithms.irm import irm_penalty
from domaingen.datasets import DATASETS, split_environments
from domaingen.errors import DomaingenError
from domaingen.hparams import draw_hparams
from domaingen.networks import IRMPaperMLP, build_classifier
from domaingen.datasets.sampling import MinibatchSampler
from domaingen.run.training import TrainConfig, resolve, train
from tests.test_datasets import raw_images, raw_labels  # noqa: F401  (module fixtures)


@pytest.fixture(scope="module")
def irm_cmnist(mnist_dir):
    return DATASETS.get("IRMColoredMNIST")(str(mnist_dir), [2], {})


def test_environments_follow_the_irm_papers_split(irm_cmnist, raw_images, raw_labels):  # noqa: F811
    envs = irm_cmnist.environments
    assert [len(e) for e in envs] == [25000, 25000, 10000]
    train_index = torch.cat([envs[0].source_index, envs[1].source_index])
    assert sorted(train_index.tolist()) == list(range(50000))
    assert envs[2].source_index.tolist() == list(range(50000, 60000))
    assert envs[0].x.shape[1:] == (2, 14, 14)
    # the digit sits, subsampled 2x2, in exactly one channel
    for env in envs:
        src = raw_images[env.source_index.numpy()][:, ::2, ::2]
        x = env.x.numpy()
        np.testing.assert_array_equal(x.max(axis=1), src)
        assert ((x[:, 0] == 0).all(axis=(1, 2)) | (x[:, 1] == 0).all(axis=(1, 2))).all()


def test_colors_and_label_noise_match_the_flip_probabilities(irm_cmnist, raw_labels):  # noqa: F811
    for env, flip in zip(irm_cmnist.environments, (0.1, 0.2, 0.9)):
        green = env.x[:, 1].flatten(1).sum(1) > 0
        y = env.y.numpy()
        agreement = float((green.numpy().astype(int) == y).mean())
        se = np.sqrt(flip * (1 - flip) / len(y))
        assert abs(agreement - (1 - flip)) < 4 * se
        noise = float(((raw_labels[env.source_index.numpy()] < 5).astype(int) != y).mean())
        assert abs(noise - 0.25) < 4 * np.sqrt(0.25 * 0.75 / len(y))


def test_embedded_data_is_refused_with_a_clear_message():
    with pytest.raises(DomaingenError, match="needs the real MNIST files"):
        DATASETS.get("IRMColoredMNIST")("embedded", [2], {})


def test_irm_mlp_is_392_h_h_1_with_xavier_weights_and_zero_biases():
    torch.manual_seed(0)
    mlp = IRMPaperMLP(392, 390)
    head = build_classifier(mlp.n_outputs, 2, single_logit=True, init=mlp.head_init)
    linears = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)] + [head]
    assert [tuple(m.weight.shape) for m in linears] == [(390, 392), (390, 390), (1, 390)]
    for m in linears:
        bound = np.sqrt(6 / sum(m.weight.shape))
        assert m.weight.abs().max() <= bound and m.weight.abs().max() > 0.9 * bound
        assert (m.bias == 0).all()
    with pytest.raises(DomaingenError, match="single_logit needs a binary task"):
        build_classifier(8, 10, single_logit=True)


def test_single_logit_loss_is_the_logistic_loss():
    logits = torch.randn(10, 1)
    y = torch.randint(0, 2, (10,))
    expected = -(y * F.logsigmoid(logits[:, 0]) + (1 - y) * F.logsigmoid(-logits[:, 0])).mean()
    assert classification_loss(logits, y).item() == pytest.approx(expected.item(), rel=1e-6)


def test_full_penalty_estimator_is_the_squared_gradient_of_the_whole_batch():
    torch.manual_seed(0)
    z = torch.randn(20, 1)
    y = torch.randint(0, 2, (20,))
    # d/ds mean BCE(s z, y) at s = 1 is mean((sigmoid(z) - y) z)
    grad = ((torch.sigmoid(z[:, 0]) - y) * z[:, 0]).mean()
    assert irm_penalty(z, y, "full").item() == pytest.approx(grad.item() ** 2, rel=1e-5)


def irm_paper_algorithm(**overrides):
    name = "IRM"
    space = {**DATASETS.get("IRMColoredMNIST").hparam_space(), **ALGORITHMS.get(name).hparam_space()}
    hparams = {**draw_hparams(space, "IRMColoredMNIST", 0), "mlp_width": 16,
               "penalty_schedule": "irm_paper", "irm_penalty_estimator": "full", **overrides}
    torch.manual_seed(0)
    return ALGORITHMS.get(name)((2, 14, 14), 2, 2, hparams)


def toy_envs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.rand(32, 2, 14, 14, generator=g), torch.randint(0, 2, (32,), generator=g)) for _ in range(2)]


def objective_gradients(algorithm, batches, weight: float, divide: bool) -> list[torch.Tensor]:
    """Gradients of nll + l2 + weight * penalty (over weight if `divide`), computed here from the loss's definition."""
    logits = algorithm.network(torch.cat([x for x, _ in batches]))
    per_env = list(zip(logits.split(32), [y for _, y in batches]))
    nll = torch.stack([classification_loss(l, y) for l, y in per_env]).mean()
    penalty = torch.stack([irm_penalty(l, y, "full") for l, y in per_env]).mean()
    l2 = algorithm.hparams["l2_weight"] * sum(p.square().sum() for p in algorithm.network.parameters())
    total = nll + l2 + weight * penalty
    if divide:
        total = total / weight
    return list(torch.autograd.grad(total, list(algorithm.network.parameters())))


def after_one_annealed_update(schedule: str):
    """(the algorithm after its first update, a copy of it, the next batches)."""
    a = irm_paper_algorithm(penalty_schedule=schedule, irm_lambda=1000.0, irm_penalty_anneal_iters=1, l2_weight=0.01)
    a.update(toy_envs(0))
    b = irm_paper_algorithm(penalty_schedule=schedule, irm_lambda=1000.0, irm_penalty_anneal_iters=1, l2_weight=0.01)
    b.load_checkpoint_state(a.checkpoint_state())
    return a, b, toy_envs(1)


def test_irm_paper_schedule_divides_the_loss_and_keeps_adam():
    """After the anneal, one step equals Adam on (nll + l2 + w * penalty) / w, with the same Adam."""
    a, b, batches = after_one_annealed_update("irm_paper")
    adam = a.optimizer
    divided = objective_gradients(b, batches, 1000.0, divide=True)
    undivided = objective_gradients(b, batches, 1000.0, divide=False)
    a.update(batches)
    assert a.optimizer is adam  # no restart at the switch
    # the gradient the step used is the divided objective's, 1000 times smaller than the undivided one's
    for p, g in zip(a.network.parameters(), divided):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-9)
    used = torch.cat([p.grad.flatten() for p in a.network.parameters()])
    assert torch.cat([g.flatten() for g in undivided]).norm() / used.norm() == pytest.approx(1000.0, rel=1e-3)
    b.optimizer.zero_grad()
    for p, g in zip(b.network.parameters(), divided):
        p.grad = g.clone()
    b.optimizer.step()
    for pa, pb in zip(a.network.parameters(), b.network.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6)


def test_domainbed_schedule_restarts_adam_and_does_not_divide():
    a, b, batches = after_one_annealed_update("domainbed")
    adam = a.optimizer
    undivided = objective_gradients(b, batches, 1000.0, divide=False)
    a.update(batches)
    assert a.optimizer is not adam
    # the gradient the step used is the undivided objective's (the penalty weighs 1000, not 1)
    for p, g in zip(a.network.parameters(), undivided):
        assert torch.allclose(p.grad, g, rtol=1e-4, atol=1e-9)
    # a fresh Adam's first moment after one step is (1 - beta1) * that gradient
    beta1 = a.optimizer.param_groups[0]["betas"][0]
    for p, g in zip(a.network.parameters(), undivided):
        assert torch.allclose(a.optimizer.state[p]["exp_avg"], (1 - beta1) * g, rtol=1e-4, atol=1e-12)


@pytest.mark.parametrize("key, value, message", [
    ("penalty_schedule", "fast", "penalty_schedule must be one of domainbed, irm_paper"),
    ("irm_penalty_estimator", "half", "irm_penalty_estimator must be one of halves, full"),
])
def test_bad_protocol_switches_are_errors(key, value, message):
    with pytest.raises(DomaingenError, match=message):
        irm_paper_algorithm(**{key: value})


def test_full_batch_sampler_returns_every_example(irm_cmnist):
    splits = split_environments(irm_cmnist, 0.0, 0)
    sampler = MinibatchSampler([s for s, _ in splits[:2]], 64, 0, torch.device("cpu"), full_batch=True)
    batches = sampler.next()
    assert [len(y) for _, y in batches] == [25000, 25000]
    assert torch.equal(batches[0][1].sort().values, irm_cmnist.environments[0].y.sort().values)


def test_holdout_fraction_zero_is_allowed_and_negative_is_not(tmp_path):
    config = TrainConfig(dataset="ColoredMNIST", algorithm="ERM", output_dir=str(tmp_path), holdout_fraction=0.0)
    assert resolve(config).args["holdout_fraction"] == 0.0
    config.holdout_fraction = -0.1
    with pytest.raises(DomaingenError, match="holdout_fraction must be at least 0 and below 1"):
        resolve(config)


def test_a_short_irm_paper_run_records_train_and_test_accuracy(mnist_dir, tmp_path):
    outcome = train(TrainConfig(
        dataset="IRMColoredMNIST", algorithm="ERM+ModReg", output_dir=str(tmp_path / "run"), data_dir=str(mnist_dir),
        test_envs=[2], holdout_fraction=0.0, steps=3, checkpoint_freq=2, hparams={"mlp_width": 16},
    ))
    records = [json.loads(line) for line in (tmp_path / "run" / "results.jsonl").read_text().splitlines()]
    assert outcome.state == "done" and [r["step"] for r in records] == [0, 2]
    assert all(r["env2_out_acc"] is None for r in records)  # no validation split with holdout 0 (NaN -> null)
    assert records[-1]["epoch"] == 2.0  # one full-batch step is one epoch
    assert records[-1]["modreg_featurizer.layers.1_inputs_total"] == 2 * 14 * 14
    # the kept fraction, computed from the saved final weights: mask logits > 0 over all mask logits
    model = torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["algorithm"]["model"]
    masks = [v for k, v in model.items() if k.endswith(".mask_logits")]
    kept = sum(int((m > 0).sum()) for m in masks) / sum(m.numel() for m in masks)
    assert masks and records[-1]["modreg_kept_fraction"] == pytest.approx(kept)


def test_collect_last_selection_reports_the_final_test_accuracy(mnist_dir, tmp_path, capsys):
    from domaingen.cli.main import main

    for trial in (0, 1):
        train(TrainConfig(
            dataset="IRMColoredMNIST", algorithm="ERM", output_dir=str(tmp_path / "sweep" / f"t{trial}"),
            data_dir=str(mnist_dir), test_envs=[2], holdout_fraction=0.0, steps=2, checkpoint_freq=1,
            trial_seed=trial, hparams={"mlp_width": 8},
        ))
    finals = [json.loads((tmp_path / "sweep" / f"t{t}" / "results.jsonl").read_text().splitlines()[-1])["env2_in_acc"]
              for t in (0, 1)]
    assert main(["-q", "collect", "--input_dir", str(tmp_path / "sweep"), "--selection", "last", "--error", "std"]) == 0
    out = capsys.readouterr().out
    row = next(line for line in out.splitlines() if line.startswith("| ERM") and "test accuracy" not in line)
    assert f"{100 * np.mean(finals):.1f} ± {100 * np.std(finals, ddof=1):.1f}" in row
