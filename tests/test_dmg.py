"""DMG: masks, penalty, test-time modes and records against independent computations."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import FAST_HPARAMS
from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.datasets import DATASETS, split_environments
from domaingen.errors import DomaingenError
from domaingen.run.evaluation import evaluate, training_domains
from domaingen.hparams import draw_hparams, log_uniform_or_zero
from domaingen.masks.neuron_masks import (
    DomainNeuronMasks,
    mean_pairwise_iou,
    neuron_mask_statistics,
    pairwise_soft_iou,
    straight_through_bernoulli,
    summed_pairwise_iou,
)
from domaingen.run.rundir import RunDirectory
from domaingen.run.training import TrainConfig, train
from test_algorithms_generic import NUM_DOMAINS, build, separable_batches

MLP_SHAPE = (64,)
CNN_SHAPE = (2, 14, 14)


def mlp_dmg(**overrides):
    return build("DMG", MLP_SHAPE, num_classes=3, seed=0, mlp_width=16, **overrides)


def hand_mlp_logits(algorithm, x: torch.Tensor, masks: list[torch.Tensor]) -> torch.Tensor:
    """The DMG MLP forward written out: masks on the inputs of the 2nd and 3rd Linear and of the classifier."""
    layers = algorithm.featurizer.layers
    first, second, third = (m for m in layers if isinstance(m, torch.nn.Linear))
    h = F.relu(first(x.flatten(1)))
    h = F.relu(second(h * masks[0]))
    h = third(h * masks[1])
    return algorithm.classifier(h * masks[2])


# --- the mask primitives ---


def test_pairwise_soft_iou_equals_hand_computation():
    a = torch.tensor([0.2, 0.9, 0.5])
    b = torch.tensor([0.6, 0.3, 0.5])
    inter = 0.2 * 0.6 + 0.9 * 0.3 + 0.5 * 0.5  # 0.64
    union = (0.2 + 0.6 - 0.12) + (0.9 + 0.3 - 0.27) + (0.5 + 0.5 - 0.25)  # 2.36
    iou = pairwise_soft_iou(torch.stack([a, b]))
    assert iou[0, 1].item() == pytest.approx(inter / union, rel=1e-6)
    assert iou[1, 0].item() == pytest.approx(inter / union, rel=1e-6)
    # discrete masks: ordinary IoU; 2 shared of 4 used
    discrete = torch.tensor([[1.0, 1, 1, 0, 0], [0.0, 1, 1, 1, 0]])
    assert pairwise_soft_iou(discrete, eps=0.0)[0, 1].item() == pytest.approx(0.5)


def hand_overlap(logits: list[torch.Tensor], reduction: str) -> float:
    """Soft IoU of every domain pair of every layer's sigmoid(logits), written out in numpy:
    summed over pairs ("sum") or averaged over them ("mean"), then summed over layers."""
    total = 0.0
    for layer in logits:
        p = torch.sigmoid(layer).detach().double().numpy()
        pairs = [
            (p[i] * p[j]).sum() / (p[i] + p[j] - p[i] * p[j]).sum()
            for i, j in itertools.combinations(range(len(p)), 2)
        ]
        total += sum(pairs) if reduction == "sum" else np.mean(pairs)
    return total


def test_overlap_penalty_sums_pairs_and_layers_by_default_or_averages_pairs():
    torch.manual_seed(0)
    masks = DomainNeuronMasks([5, 7], num_domains=3)
    summed, mean = hand_overlap(list(masks.logits), "sum"), hand_overlap(list(masks.logits), "mean")
    assert masks.overlap_penalty().item() == pytest.approx(summed, rel=1e-5)
    assert masks.overlap_penalty("sum").item() == pytest.approx(summed, rel=1e-5)
    assert masks.overlap_penalty("mean").item() == pytest.approx(mean, rel=1e-5)
    assert summed == pytest.approx(3 * mean)  # 3 domains: 3 pairs per layer
    assert mean_pairwise_iou(torch.rand(1, 4)).item() == 0.0  # one domain: no pairs, no penalty
    assert summed_pairwise_iou(torch.rand(1, 4)).item() == 0.0
    with pytest.raises(DomaingenError, match=r"^reduction must be one of sum, mean, got 'avg'$"):
        masks.overlap_penalty("avg")


@pytest.mark.parametrize("reduction", [None, "sum", "mean"])
def test_update_reports_the_penalty_its_reduction_defines(reduction):
    """3 training domains, 2 masked layers: the penalty `update` reports (and adds to the loss) is
    the hand-computed soft IoU, summed over pairs unless dmg_overlap_reduction is 'mean'."""
    overrides = {} if reduction is None else {"dmg_overlap_reduction": reduction}
    algorithm = mlp_dmg(dmg_layers="featurizer.layers.7,classifier", dmg_lambda_o=0.5, **overrides)
    assert algorithm.num_domains == 3 and len(algorithm.masks.logits) == 2
    before = [logit.detach().clone() for logit in algorithm.masks.logits]
    out = algorithm.update(separable_batches(MLP_SHAPE, seed=0))
    expected = hand_overlap(before, reduction or "sum")
    assert out["penalty"] == pytest.approx(expected, rel=1e-5)
    assert out["loss"] == pytest.approx(out["nll"] + 0.5 * expected, rel=1e-5)


def test_sparsity_penalty_is_the_l1_norm_of_the_keep_probabilities():
    torch.manual_seed(0)
    masks = DomainNeuronMasks([5, 7], num_domains=3)
    by_hand = sum(float((1 / (1 + np.exp(-layer.detach().double().numpy()))).sum()) for layer in masks.logits)
    assert masks.sparsity_penalty().item() == pytest.approx(by_hand, rel=1e-6)
    # its gradient w.r.t. each logit is p(1 - p): the L1 norm pulls every keep probability down
    masks.sparsity_penalty().backward()
    for layer in masks.logits:
        p = torch.sigmoid(layer.detach())
        torch.testing.assert_close(layer.grad, p * (1 - p))


def test_update_adds_lambda_s_times_the_sparsity_penalty_only_when_set():
    """lambda_S > 0: the loss is nll + lambda_O * overlap + lambda_S * (sigmoid(logits) summed by hand), and
    `update` reports the unweighted norm as `sparsity`; lambda_S = 0 (the default) reports what it always did."""
    algorithm = mlp_dmg(dmg_layers="featurizer.layers.7,classifier", dmg_lambda_o=0.5, dmg_lambda_s=0.03)
    before = [logit.detach().clone() for logit in algorithm.masks.logits]
    out = algorithm.update(separable_batches(MLP_SHAPE, seed=0))
    l1 = sum(float(torch.sigmoid(b.double()).sum()) for b in before)
    assert out["sparsity"] == pytest.approx(l1, rel=1e-6)
    assert out["loss"] == pytest.approx(out["nll"] + 0.5 * hand_overlap(before, "sum") + 0.03 * l1, rel=1e-5)
    off = mlp_dmg(dmg_layers="featurizer.layers.7,classifier", dmg_lambda_o=0.5)
    assert off.hparams["dmg_lambda_s"] == 0.0
    out = off.update(separable_batches(MLP_SHAPE, seed=0))
    assert set(out) == {"loss", "nll", "penalty"}


def test_lambda_s_lowers_the_fraction_of_kept_neurons():
    """Same seed and data, no overlap penalty, 30 updates: a large lambda_S leaves fewer keep probabilities
    above 0.5 than none."""
    active = {}
    for lambda_s in (0.0, 1.0):
        algorithm = mlp_dmg(dmg_lambda_o=0.0, dmg_lambda_s=lambda_s, dmg_mask_lr=0.05)
        for step in range(30):
            algorithm.update(separable_batches(MLP_SHAPE, seed=step))
        active[lambda_s] = np.mean([algorithm.diagnostics()[f"dmg_layer{k}_active"] for k in range(3)])
    assert active[0.0] > 0.8 and active[1.0] < 0.1, active


def test_logits_start_uniform_in_zero_one():
    torch.manual_seed(0)
    logits = DomainNeuronMasks([4000], num_domains=2).logits[0].detach()
    assert logits.min() >= 0 and logits.max() <= 1
    assert logits.mean().item() == pytest.approx(0.5, abs=0.02)


def test_straight_through_sample_is_binary_with_identity_gradient():
    probs = torch.full((2000,), 0.3, requires_grad=True)
    weights = torch.linspace(-1, 1, 2000)
    sample = straight_through_bernoulli(probs, torch.Generator().manual_seed(0))
    assert set(sample.detach().unique().tolist()) <= {0.0, 1.0}
    assert sample.detach().mean().item() == pytest.approx(0.3, abs=0.04)
    (sample * weights).sum().backward()
    assert torch.equal(probs.grad, weights)


def test_mask_statistics_count_shared_specific_unused():
    active = torch.tensor([[1, 1, 0, 0, 1], [1, 0, 1, 0, 1], [1, 0, 0, 0, 0]], dtype=torch.bool)
    stats = neuron_mask_statistics(active)
    # pairs: (0,1) 2 of 4, (0,2) 1 of 3, (1,2) 1 of 3
    assert stats["iou"] == pytest.approx(np.mean([2 / 4, 1 / 3, 1 / 3]))
    assert stats["active"] == pytest.approx(7 / 15)
    assert (stats["shared"], stats["specific"], stats["unused"]) == (1, 3, 1)


def test_lambda_o_sampler_is_deterministic_in_range_and_includes_zero():
    sampler = log_uniform_or_zero(-5, 0, 0.2)
    draws = [sampler(np.random.default_rng(seed)) for seed in range(2000)]
    assert draws == [sampler(np.random.default_rng(seed)) for seed in range(2000)]
    zeros = sum(d == 0.0 for d in draws)
    assert 0.16 < zeros / len(draws) < 0.24
    assert all(1e-5 <= d <= 1.0 for d in draws if d != 0.0)
    assert str(sampler) == "0 w.p. 0.2, else 10^U(-5,0)"
    space = ALGORITHMS.get("DMG").hparam_space()
    assert draw_hparams(space, "ColoredMNIST", 0)["dmg_lambda_o"] == 0.1


# --- training ---


def test_straight_through_gradient_reaches_every_mask_logit_matrix():
    algorithm = mlp_dmg(dmg_lambda_o=0.0)  # no penalty: any gradient comes through the sampled masks
    algorithm.update(separable_batches(MLP_SHAPE, seed=0))
    for logits in algorithm.masks.logits:
        assert logits.grad is not None and torch.count_nonzero(logits.grad) > 0


def test_each_example_uses_its_own_domains_mask():
    algorithm = mlp_dmg(dmg_lambda_o=0.0)
    with torch.no_grad():  # classifier input: domain 1 always dropped, the others always kept
        algorithm.masks.logits[2].fill_(50.0)
        algorithm.masks.logits[2][1].fill_(-50.0)
    seen = {}
    algorithm.classifier.register_forward_hook(lambda m, args, out: seen.update(x=args[0].detach()))
    batches = separable_batches(MLP_SHAPE, n=8, seed=0)
    algorithm.update(batches)
    rows = seen["x"].abs().sum(1).view(NUM_DOMAINS, 8)
    assert (rows[1] == 0).all() and (rows[0] > 0).all() and (rows[2] > 0).all()


def test_overlap_penalty_lowers_the_mask_iou_on_a_toy_problem():
    """Every input feature carries the label for every domain: without the penalty all domains keep
    all features; with it they keep partly different subsets and still fit the data."""
    shape = (16,)

    def train_masks(lambda_o: float) -> tuple[dict, float]:
        algorithm = build("DMG", shape, seed=0, mlp_width=16, dmg_layers="featurizer.layers.1",
                          dmg_lambda_o=lambda_o, dmg_mask_lr=0.02)
        assert algorithm.diagnostics()["dmg_iou"] == 1.0  # logits start in (0, 1): every feature on
        for step in range(100):
            nll = algorithm.update(separable_batches(shape, seed=step))["nll"]
        return algorithm.diagnostics(), nll

    with_penalty, nll = train_masks(0.1)  # summed over 3 pairs: 0.3 x their mean
    assert with_penalty["dmg_iou"] < 0.7 and with_penalty["dmg_layer0_active"] > 0.3 and nll < 0.1
    assert train_masks(0.0)[0]["dmg_iou"] > 0.9


def test_mask_logits_have_their_own_learning_rate():
    algorithm = mlp_dmg(dmg_mask_lr=0.02, lr=1e-3)
    groups = algorithm.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-3, 0.02]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in algorithm.masks.parameters()}


# --- test-time modes ---


def test_pred_ens_equals_mean_of_per_domain_logits_by_hand():
    algorithm = mlp_dmg()
    x = separable_batches(MLP_SHAPE, n=10, seed=3)[0][0]
    probs = [p.detach() for p in algorithm.masks.probs()]
    per_domain = [hand_mlp_logits(algorithm, x, [p[d].expand(10, -1) for p in probs]) for d in range(NUM_DOMAINS)]
    with torch.no_grad():
        torch.testing.assert_close(algorithm.predict(x), torch.stack(per_domain).mean(0).detach())
        mask_ens = hand_mlp_logits(algorithm, x, [p.mean(0).expand(10, -1) for p in probs])
        torch.testing.assert_close(algorithm.predict(x, mode="mask_ens"), mask_ens)


def test_pred_ens_tiled_pass_equals_loop_over_known_domains_on_the_cnn(monkeypatch):
    algorithm = build("DMG", CNN_SHAPE, num_classes=3, seed=0)
    assert algorithm.mask_layers == ["featurizer.layers.6", "featurizer.layers.9", "classifier"]
    x = separable_batches(CNN_SHAPE, n=7, seed=3)[0][0]
    with torch.no_grad():
        loop = torch.stack([algorithm.predict(x, domain=d) for d in range(NUM_DOMAINS)]).mean(0)
        torch.testing.assert_close(algorithm.predict(x), loop, rtol=1e-4, atol=1e-5)
        monkeypatch.setattr("domaingen.algorithms.dmg.PRED_ENS_CPU_ROWS", 6)  # two examples per tiled pass
        torch.testing.assert_close(algorithm.predict(x), loop, rtol=1e-4, atol=1e-5)


def test_pred_ens_passes_are_cache_sized_on_a_cpu():
    from domaingen.algorithms.dmg import PRED_ENS_CPU_ROWS, PRED_ENS_MAX_ROWS, pred_ens_rows

    assert pred_ens_rows(torch.device("cpu")) == PRED_ENS_CPU_ROWS == 128
    assert pred_ens_rows(torch.device("cuda")) == PRED_ENS_MAX_ROWS == 4096
    algorithm = build("DMG", CNN_SHAPE, num_classes=3, seed=0).eval()
    rows = []
    algorithm.classifier.register_forward_hook(lambda module, args, out: rows.append(len(out)))
    x = separable_batches(CNN_SHAPE, n=100, seed=3)[0][0]
    with torch.no_grad():
        algorithm.predict(x)
    assert NUM_DOMAINS == 3 and rows == [3 * 42, 3 * 42, 3 * 16]  # 128 // 3 = 42 examples a pass: 42 + 42 + 16


def test_known_domain_mode_uses_the_given_domain():
    algorithm = mlp_dmg()
    x = separable_batches(MLP_SHAPE, n=6, seed=4)[0][0]
    probs = [p.detach() for p in algorithm.masks.probs()]
    with torch.no_grad():
        for d in range(NUM_DOMAINS):
            expected = hand_mlp_logits(algorithm, x, [p[d].expand(6, -1) for p in probs])
            torch.testing.assert_close(algorithm.predict(x, domain=d), expected)
            torch.testing.assert_close(algorithm.predict_mode(x, "kd", d), expected)
        domains = torch.tensor([2, 0, 1, 1, 0, 2])
        expected = hand_mlp_logits(algorithm, x, [p[domains] for p in probs])
        torch.testing.assert_close(algorithm.predict(x, domain=domains), expected)


# --- bad input ---


@pytest.mark.parametrize("domain", [3, -1, torch.tensor([0, 1, 3, 0])])
def test_domain_out_of_range_is_a_clear_error(domain):
    algorithm = mlp_dmg()
    x = torch.randn(4, *MLP_SHAPE)
    with pytest.raises(DomaingenError, match=r"domain index -?\d is out of range: DMG was trained on 3 domains \(valid indices 0..2\)"):
        algorithm.predict(x, domain=domain)


def test_known_domain_mode_without_domain_labels_is_a_clear_error():
    algorithm = mlp_dmg()
    with pytest.raises(DomaingenError, match="known-domain \\(kd\\) mode needs the examples' domain labels"):
        algorithm.predict(torch.randn(4, *MLP_SHAPE), mode="kd")


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda a, x: a.predict(x, mode="vote"), "unknown DMG test-time mode 'vote'; valid modes: pred_ens, mask_ens, kd"),
        (lambda a, x: a.predict(x, domain=torch.tensor([0, 1])), r"one per example \(4\), got shape \(2,\)"),
        (lambda a, x: a.predict(x, domain=torch.tensor([0.0, 1, 1, 1])), "integer indices"),
    ],
)
def test_other_bad_prediction_arguments(call, message):
    with pytest.raises(DomaingenError, match=message):
        call(mlp_dmg(), torch.randn(4, *MLP_SHAPE))


def test_masked_layers_are_configurable_and_checked():
    algorithm = mlp_dmg(dmg_layers="classifier")
    assert algorithm.mask_layers == ["classifier"] and len(algorithm.masks.logits) == 1
    assert algorithm.masks.logits[0].shape == (NUM_DOMAINS, 16)
    with pytest.raises(DomaingenError, match="unknown module 'featurizer.nope' in dmg_layers; valid names include"):
        mlp_dmg(dmg_layers="classifier, featurizer.nope")


# --- evaluation records ---


def test_training_domains_skip_the_test_envs():
    assert training_domains(4, [1]) == [0, None, 1, 2]
    assert training_domains(3, [0, 2]) == [None, 0, None]


def test_run_records_every_mode_and_the_mask_diagnostics(tmp_path):
    cfg = TrainConfig(dataset="ColoredMNIST", algorithm="DMG", output_dir=str(tmp_path / "run"), test_envs=[1],
                      data_dir="embedded", hparams=dict(FAST_HPARAMS), steps=3, checkpoint_freq=3)
    train(cfg)
    last = RunDirectory(tmp_path / "run").records()[-1]
    assert {f"env{i}_{s}_acc_mask_ens" for i in range(3) for s in ("in", "out")} <= set(last)
    assert {k for k in last if k.endswith("_kd")} == {f"env{i}_{s}_acc_kd" for i in (0, 2) for s in ("in", "out")}
    for k in range(3):
        assert {f"dmg_layer{k}_{s}" for s in ("iou", "active", "shared", "specific", "unused")} <= set(last)
        assert last[f"dmg_layer{k}_shared"] + last[f"dmg_layer{k}_specific"] + last[f"dmg_layer{k}_unused"] == 32
    # the KD accuracy of env 2 (training domain 1) recomputed from the checkpoint
    run = training.resolve(cfg)
    model = ALGORITHMS.get("DMG")((2, 28, 28), 2, 2, run.hparams)
    model.load_checkpoint_state(torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=False)["algorithm"])
    dataset = DATASETS.get("ColoredMNIST")("embedded", [1], run.hparams)
    x, y = split_environments(dataset, 0.2, 0)[2][1].batch(slice(None))
    with torch.no_grad():
        logits = hand_mlp_logits(model, x, [p[1].expand(len(x), -1) for p in model.masks.probs()])
    assert last["env2_out_acc_kd"] == pytest.approx(np.mean(logits.argmax(1).numpy() == y.numpy()))


def test_evaluate_without_domain_mapping_reports_no_kd():
    algorithm = mlp_dmg()

    class Toy:  # the two methods of Split that evaluation uses
        def __len__(self):
            return 5

        def batch(self, positions):
            g = torch.Generator().manual_seed(0)
            return torch.randn(5, *MLP_SHAPE, generator=g)[positions], torch.arange(5)[positions] % 3

    results = evaluate(algorithm, [(Toy(), Toy())], torch.device("cpu"))
    assert set(results) == {"env0_in_acc", "env0_out_acc", "env0_in_acc_mask_ens", "env0_out_acc_mask_ens"}


# --- tables ---


def test_tables_show_known_domain_rows_in_the_in_domain_table_only():
    import pandas as pd

    from domaingen.tables.collect import Collection, expand_modes
    from domaingen.tables.reporting import build_tables, to_markdown
    from test_selection import rec

    rows = []
    for t in range(3):
        row = rec("DMG", [t], 0, 0, 0, [.5, .5, .5], [.6, .6, .6])
        for i in range(3):
            row[f"env{i}_in_acc_mask_ens"], row[f"env{i}_out_acc_mask_ens"] = 0.4, 0.3
            if i != t:  # known-domain: training envs only
                row[f"env{i}_in_acc_kd"], row[f"env{i}_out_acc_kd"] = 0.9, 0.6 + 0.1 * i
        rows.append(row)
    rows.append(rec("ERM", [0], 0, 0, 0, [.5, .5, .5], [.6, .6, .6]))
    records = pd.DataFrame(rows)
    expanded = expand_modes(records)
    assert sorted(expanded["algorithm"].unique()) == ["DMG", "DMG-KD", "DMG-MaskEns", "ERM"]
    kd = expanded[expanded["algorithm"] == "DMG-KD"].iloc[0]  # test env 0
    assert math.isnan(kd["env0_in_acc"]) and kd["env1_out_acc"] == pytest.approx(0.7) and kd["base_algorithm"] == "DMG"

    tables = {t.key: t for t in build_tables(Collection(records), ["training"])}
    test, indomain = tables["Toy/training/test"], tables["Toy/training/indomain"]
    assert sorted(test.rows) == ["DMG", "DMG-MaskEns", "ERM"]
    assert [c.mean for c in test.rows["DMG-MaskEns"][:3]] == pytest.approx([0.4] * 3)
    # DMG-KD in-domain: the mean KD out-accuracy over each run's training envs
    assert [c.mean for c in indomain.rows["DMG-KD"]] == pytest.approx([0.75, 0.7, 0.65, 0.7])
    assert "| DMG-KD " in to_markdown(list(tables.values()), Collection(records))
    # oracle selection validates on the test env, where known-domain has no accuracy
    oracle = {t.key: t for t in build_tables(Collection(records), ["oracle"])}
    assert "DMG-KD" not in oracle["Toy/oracle/test"].rows
    assert oracle["Toy/oracle/indomain"].rows["DMG-KD"][0].missing == "undefined: validated on held-out domains"


def test_resnet_featurizer_masks_layer3_layer4_and_classifier_per_channel(monkeypatch):
    """The contract of the ResNet featurizer (attribute `resnet`, fc = Identity), with torchvision's resnet18."""
    torchvision = pytest.importorskip("torchvision")

    class ResNetFeaturizer(torch.nn.Module):
        n_outputs = 512

        def __init__(self) -> None:
            super().__init__()
            self.resnet = torchvision.models.resnet18(weights=None)
            self.resnet.fc = torch.nn.Identity()

        def forward(self, x):
            return self.resnet(x)

    monkeypatch.setattr("domaingen.algorithms.base.build_featurizer", lambda shape, hparams: ResNetFeaturizer())
    algorithm = build("DMG", (3, 32, 32), num_classes=3, seed=0)
    assert algorithm.mask_layers == ["featurizer.resnet.layer3", "featurizer.resnet.layer4", "classifier"]
    assert [tuple(m.shape) for m in algorithm.masks.logits] == [(NUM_DOMAINS, 128), (NUM_DOMAINS, 256), (NUM_DOMAINS, 512)]
    algorithm.eval()  # BatchNorm statistics fixed, so Pred-Ens and the per-domain passes see the same network
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        loop = torch.stack([algorithm.predict(x, domain=d) for d in range(NUM_DOMAINS)]).mean(0)
        torch.testing.assert_close(algorithm.predict(x), loop, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("hparams, message", [
    ('{"dmg_lambda_o": -0.5}', "dmg_lambda_o must be >= 0 (the weight of the overlap penalty), got -0.5"),
    ('{"dmg_lambda_s": -0.01}', "dmg_lambda_s must be >= 0 (the weight of the sparsity penalty), got -0.01"),
    ('{"dmg_overlap_reduction": "avg"}', "dmg_overlap_reduction must be one of sum, mean, got 'avg'"),
    ('{"dmg_layers": "classifier, classifier"}', "dmg_layers names a module twice: 'classifier, classifier'"),
    ('{"dmg_layers": " , "}', "dmg_layers is empty; use 'auto' or comma-separated module names such as 'classifier'"),
])
def test_bad_hyperparameters_on_the_command_line_are_one_line_and_exit_2(hparams, message, tmp_path, capsys):
    from domaingen.cli import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--data_dir", "embedded", "--steps", "1",
                 "--algorithm", "DMG", "--hparams", hparams, "--output_dir", str(out)])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("domaingen: error: " + message)
    assert not out.exists()


def test_unknown_masked_layer_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    """Module names are known once the network is built: the run directory exists by then and is
    marked failed."""
    from domaingen.cli import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--data_dir", "embedded", "--steps", "1",
                 "--algorithm", "DMG", "--hparams", '{"dmg_layers": "classifier,featurizer.nope"}',
                 "--output_dir", str(out)])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("domaingen: error: unknown module 'featurizer.nope' in dmg_layers; valid names include ")
    assert (out / "failed").exists()


# --- the paper's optimisation preset ---


def test_paper_preset_sets_the_papers_adam_and_decays_the_network_lr_per_period():
    from domaingen.algorithms.dmg import DMG
    from domaingen.testing import default_hparams

    hparams = DMG.fit_hparams(
        default_hparams("DMG", mlp_width=16, dmg_preset="paper", dmg_decay_every=2),
        NUM_DOMAINS, {"mlp_width", "dmg_preset", "dmg_decay_every"},
    )
    torch.manual_seed(0)
    algorithm = DMG(MLP_SHAPE, 3, NUM_DOMAINS, hparams)
    network, masks = algorithm.optimizer.param_groups
    assert (network["lr"], network["weight_decay"]) == (1e-4, 1e-5)
    assert (masks["lr"], masks["weight_decay"]) == (1e-4, 1e-5)
    batches = [(x, y % 3) for x, y in separable_batches(MLP_SHAPE, n=4)]
    for k in range(1, 4):  # K decay periods of 2 updates each
        for _ in range(2):
            algorithm.update(batches)
        assert network["lr"] == pytest.approx(1e-4 * 0.99**k, rel=1e-12)
        assert masks["lr"] == 1e-4  # the authors' trainer leaves the mask scheduler unstepped
    algorithm.update(batches)  # mid-period: no further decay
    assert network["lr"] == pytest.approx(1e-4 * 0.99**3, rel=1e-12)


def test_explicit_lr_and_weight_decay_win_over_the_paper_preset():
    from domaingen.algorithms.dmg import DMG
    from domaingen.testing import default_hparams

    hparams = DMG.fit_hparams(
        default_hparams("DMG", dmg_preset="paper", lr=3e-3, weight_decay=0.0),
        NUM_DOMAINS, {"dmg_preset", "lr", "weight_decay"},
    )
    assert (hparams["lr"], hparams["weight_decay"], hparams["dmg_mask_lr"]) == (3e-3, 0.0, 1e-4)
    default = DMG.fit_hparams(default_hparams("DMG"), NUM_DOMAINS, set())
    assert default == default_hparams("DMG")  # the domainbed preset changes nothing


def test_unknown_preset_on_the_command_line_is_one_line_and_exit_2(tmp_path, capsys):
    from domaingen.cli.main import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--data_dir", "embedded", "--steps", "1",
                 "--algorithm", "DMG", "--hparams", '{"dmg_preset": "adam"}', "--output_dir", str(out)])
    assert code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["domaingen: error: dmg_preset must be one of domainbed, paper, got 'adam'"]
    assert not out.exists()
