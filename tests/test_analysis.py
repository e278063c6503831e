"""What `diagnose` measures, each against a hand computation on a tiny network with known activations."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from domaingen.algorithms import ALGORITHMS
from domaingen.errors import DomaingenError
from domaingen.inspect.domain_masks import mask_overlap, masked_accuracy, train_mask_logits
from domaingen.inspect.neurons import (
    activation_rates,
    capture_activations,
    class_means,
    layer_statistics,
    neuron_activations,
    selectivity,
)
from domaingen.masks import eval_mask
from domaingen.stats import histogram, summary

# 6 examples of 3 classes; neuron 0: class means 2, 0, 2; neuron 1: 0, 2, 0; neuron 2: silent
ACTS = torch.tensor([[1.0, 0.0, 0.0], [3.0, 0.0, 0.0], [0.0, 4.0, 0.0], [0.0, 0.0, 0.0], [2.0, 0.0, 0.0], [2.0, 0.0, 0.0]])
LABELS = torch.tensor([0, 0, 1, 1, 2, 2])


def test_selectivity_by_hand():
    means = class_means(ACTS, LABELS, 3)
    assert means.tolist() == [[2.0, 0.0, 0.0], [0.0, 2.0, 0.0], [2.0, 0.0, 0.0]]
    sel = selectivity(means)
    # neuron 0: mu_max 2, the other classes' mean (0 + 2) / 2 = 1: (2 - 1) / (2 + 1)
    assert sel[0].item() == pytest.approx(1 / 3)
    # neuron 1: mu_max 2, the others 0: (2 - 0) / (2 + 0 + eps)
    assert sel[1].item() == pytest.approx(1.0)
    assert sel[2].item() == 0.0  # silent on every class


def test_selectivity_leaves_out_absent_classes():
    # only classes 0 and 1 present among 3: mu = (2, 0) for neuron 0 -> (2 - 0) / 2
    sel = selectivity(class_means(ACTS[:4], LABELS[:4], 3))
    assert sel[0].item() == pytest.approx(1.0)
    assert sel[1].item() == pytest.approx(1.0)


def test_activation_rates_by_hand():
    rates = activation_rates(ACTS, LABELS, 3)
    # neuron 0 fires on both examples of classes 0 and 2; neuron 1 on one of class 1's two
    assert rates.tolist() == [[1.0, 0.0, 0.0], [0.0, 0.5, 0.0], [1.0, 0.0, 0.0]]
    stats = layer_statistics(ACTS, LABELS, 3)
    assert stats["activation_rate_per_class"] == pytest.approx([1 / 3, 1 / 6, 1 / 3])
    assert stats["dead_fraction"] == pytest.approx(1 / 3)
    assert stats["selectivity_per_neuron"] == pytest.approx([1 / 3, 1.0, 0.0])
    assert stats["selectivity"]["mean"] == pytest.approx((1 / 3 + 1 + 0) / 3)


def test_summary_and_histogram_by_hand():
    s = summary(torch.tensor([4.0, 1.0, float("nan"), 3.0, 2.0]))
    assert s == pytest.approx({"mean": 2.5, "q25": 1.75, "median": 2.5, "q75": 3.25, "min": 1.0, "max": 4.0})
    assert histogram(torch.tensor([0.01, 0.02, 0.5, 0.99, 1.0]), bins=4) == [2, 0, 1, 2]
    assert all(math.isnan(v) for v in summary(torch.tensor([])).values())


def test_captured_activations_of_a_tiny_mlp_and_cnn():
    linear = nn.Linear(2, 3, bias=False)
    with torch.no_grad():
        linear.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
    mlp = nn.Sequential(linear, nn.ReLU())
    x = torch.tensor([[1.0, 2.0], [3.0, -1.0]])
    acts = capture_activations(mlp, {"relu": mlp[1]}, [x[:1], x[1:]])
    # pre-activations [[1, 2, -1], [3, -1, 4]]
    assert acts["relu"].tolist() == [[1.0, 2.0, 0.0], [3.0, 0.0, 4.0]]

    conv = nn.Conv2d(1, 2, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
    cnn = nn.Sequential(conv, nn.ReLU())
    image = torch.tensor([[[[1.0, -2.0], [3.0, 0.0]]]])
    acts = capture_activations(cnn, {"relu": cnn[1]}, [image])
    # channel 0: relu(1, -2, 3, 0) -> mean 1; channel 1: relu(-1, 2, -3, 0) -> mean 0.5
    assert acts["relu"].tolist() == [[1.0, 0.5]]


def tiny(algorithm: str, **hparams):
    base = {"lr": 1e-3, "batch_size": 4, "weight_decay": 0.0, "featurizer": "MLP", "mlp_width": 3, "mlp_depth": 2,
            "mlp_dropout": 0.0}
    space = ALGORITHMS.get(algorithm).hparam_space()
    hp = {**{k: v.default for k, v in space.items()}, **base, **hparams}
    torch.manual_seed(0)
    return ALGORITHMS.get(algorithm)((2,), 2, 2, hp)


def test_default_activation_layers_are_the_featurizer_relus():
    model = tiny("ERM")
    assert list(model.activation_layers()) == ["featurizer.layers.3"]
    assert model.model_diagnostics() == {}


def test_dmg_mask_matrices_and_iou_by_hand():
    model = tiny("DMG")
    assert model.mask_layers == ["featurizer.layers.4", "classifier"]
    with torch.no_grad():
        model.masks.logits[0].copy_(torch.tensor([[1.0, 1.0, -1.0], [1.0, -1.0, -1.0]]))
        model.masks.logits[1].copy_(torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]]))
    section = model.model_diagnostics()["dmg_masks"]
    first = section["featurizer.layers.4"]
    assert first["mask"] == [[1, 1, 0], [1, 0, 0]]
    assert first["probs"][0] == pytest.approx([1 / (1 + math.e ** -1)] * 2 + [1 / (1 + math.e)])
    # |{0}| / |{0, 1}|
    assert np.allclose(first["iou"], [[1.0, 0.5], [0.5, 1.0]])
    assert (first["mean_iou"], first["shared"], first["specific"], first["unused"]) == (0.5, 1, 1, 1)
    empty = section["classifier"]
    assert empty["mask"] == [[0, 0, 0], [0, 0, 0]] and math.isnan(empty["iou"][0][1]) and empty["unused"] == 3


def test_dmg_records_activations_under_one_mask_ensemble_pass():
    model = tiny("DMG").eval()
    x = torch.randn(5, 2)
    acts = capture_activations(model.activation_forward, model.activation_layers(), [x])
    assert acts["featurizer.layers.3"].shape == (5, 3)


def test_modreg_kept_weights_and_sigmoid_distribution_by_hand():
    model = tiny("ERM+ModReg")
    logits = torch.tensor([[1.0, -1.0, -1.0], [2.0, -1.0, -3.0]])
    with torch.no_grad():
        model.classifier.mask_logits.copy_(logits)
    layer = model.model_diagnostics()["modreg_masks"]["classifier"]
    assert (layer["weights"], layer["kept_weights"], layer["kept_fraction"]) == (6, 2, pytest.approx(2 / 6))
    assert (layer["inputs_kept"], layer["inputs_total"]) == (1, 3)  # only input 0 keeps an outgoing weight
    probs = 1 / (1 + np.exp(-logits.numpy().ravel()))
    assert layer["sigmoid_mean"] == pytest.approx(probs.mean())
    assert layer["sigmoid_median"] == pytest.approx(np.median(probs))
    assert layer["sigmoid_q25"] == pytest.approx(np.quantile(probs, 0.25))
    assert layer["sigmoid_histogram"] == np.histogram(probs, bins=20, range=(0, 1))[0].tolist()
    # the first layer keeps everything at the initial logit 2.0
    first = model.model_diagnostics()["modreg_masks"]["featurizer.layers.1"]
    assert first["kept_fraction"] == 1.0 and first["sigmoid_min"] == pytest.approx(1 / (1 + math.e ** -2))


def test_mask_overlap_by_hand():
    stats = mask_overlap(torch.tensor([[1, 1, 0, 0], [1, 0, 1, 0]]))
    assert stats["kept_fraction"] == [0.5, 0.5]
    assert stats["shared_fraction"] == pytest.approx(1 / 3)  # weight 0 of the kept {0, 1, 2}
    assert np.allclose(stats["iou"], [[1.0, 1 / 3], [1 / 3, 1.0]])


def test_a_domain_mask_keeps_the_weight_the_task_needs_and_drops_the_unused_one():
    # y = 1[x0 > 0] and the logit is 5 x0 + 0 x1: only weight 0 matters, weight 1 contributes nothing
    torch.manual_seed(0)
    weights = {"w": torch.tensor([[5.0, 0.0]])}
    x = torch.randn(4096, 2)
    y = (x[:, 0] > 0).long()

    def batches():
        while True:
            for start in range(0, len(x), 64):
                yield x[start:start + 64], y[start:start + 64]

    def forward(masked, inputs):
        return inputs @ masked["w"].t()

    def loss(logits, labels):
        return nn.functional.binary_cross_entropy_with_logits(logits[:, 0], labels.float())

    logits = train_mask_logits(forward, weights, batches(), loss, steps=400, lr=1e-2, alpha=1e-2)
    masks = {name: eval_mask(l).bool() for name, l in logits.items()}
    assert masks["w"].tolist() == [[True, False]]
    assert masked_accuracy(forward, weights, masks, iter([(x, y)])) == 1.0
    assert masked_accuracy(forward, weights, {"w": torch.tensor([[False, True]])}, iter([(x, y)])) == pytest.approx(
        float((y == 0).float().mean()))  # logit 0 everywhere predicts class 0


def _composes(name: str) -> bool:
    try:
        ALGORITHMS.get(name)
    except DomaingenError:  # X+ModReg refused for an X with NO_ADDITIVE_PENALTY
        return False
    return True


@pytest.mark.parametrize("name", ALGORITHMS.names() + [n for n in ALGORITHMS.composed_names() if _composes(n)])
def test_every_algorithm_can_be_diagnosed(name):
    """The diagnose hooks work for every algorithm in the table with no edit elsewhere."""
    import json

    from domaingen.run.rundir import to_json

    space = ALGORITHMS.get(name).hparam_space()
    hp = {**{k: v.default for k, v in space.items()}, "lr": 1e-3, "batch_size": 4, "weight_decay": 0.0,
          "featurizer": "MLP", "mlp_width": 8, "mlp_depth": 3, "mlp_dropout": 0.0}
    torch.manual_seed(0)
    model = ALGORITHMS.get(name)((6,), 3, 2, hp).eval()
    x = torch.randn(5, 6)
    layers = model.activation_layers()
    acts = capture_activations(model.activation_forward, layers, [x])
    assert list(acts) == ["featurizer.layers.3", "featurizer.layers.6"]
    # the hooks record the ReLU outputs of one pass: equal to the featurizer's own hidden layers
    # (ARM's featurizer reads the input beside its context network's output: its width differs)
    if model.featurizer.layers[1].in_features != x.shape[1]:
        assert acts["featurizer.layers.3"].shape == (5, 8)
        return
    hidden = model.featurizer.layers[:4](x)
    if name.startswith("DMG"):
        assert acts["featurizer.layers.3"].shape == (5, 8)
    else:
        assert torch.allclose(acts["featurizer.layers.3"], hidden)
    json.loads(to_json(model.model_diagnostics()))


def test_activation_rate_of_a_channel_counts_positions_not_any_position():
    from domaingen.inspect.neurons import firing_fractions

    # two examples (class 0, class 1), two channels, 2x2 maps (already post-ReLU)
    maps = torch.tensor([
        [[[1.0, 0.0], [0.0, 0.0]], [[2.0, 3.0], [1.0, 4.0]]],   # example 0: channel 0 fires at 1/4, channel 1 at 4/4
        [[[0.0, 0.0], [5.0, 6.0]], [[0.0, 0.0], [0.0, 0.0]]],   # example 1: channel 0 at 2/4, channel 1 at 0/4
    ])
    labels = torch.tensor([0, 1])
    fired = firing_fractions(maps)
    assert fired.tolist() == [[0.25, 1.0], [0.5, 0.0]]
    rates = activation_rates(neuron_activations(maps), labels, 2, fired)
    assert rates.tolist() == [[0.25, 1.0], [0.5, 0.0]]
    # "any position fired" would have said channel 0 fires on every example of both classes
    assert activation_rates(neuron_activations(maps), labels, 2)[:, 0].tolist() == [1.0, 1.0]
    stats = layer_statistics(neuron_activations(maps), labels, 2, fired)
    assert stats["activation_rate_per_class"] == pytest.approx([(0.25 + 1.0) / 2, (0.5 + 0.0) / 2])
    # pooled over examples of one class: positions x examples where the channel fires
    two = torch.cat([maps, maps[:1]])
    pooled = activation_rates(neuron_activations(two), torch.tensor([0, 1, 1]), 2, firing_fractions(two))
    assert pooled[1, 0].item() == pytest.approx((2 + 1) / 8)


def test_capture_reports_firing_fractions_per_position():
    conv = nn.Conv2d(1, 2, 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(torch.tensor([1.0, -1.0]).view(2, 1, 1, 1))
    cnn = nn.Sequential(conv, nn.ReLU())
    image = torch.tensor([[[[1.0, -2.0], [3.0, 0.0]]]])
    fired: dict = {}
    capture_activations(cnn, {"relu": cnn[1]}, [image], fired)
    # channel 0: relu(1, -2, 3, 0) fires at 2 of 4 positions; channel 1: relu(-1, 2, -3, 0) at 1 of 4
    assert fired["relu"].tolist() == [[0.5, 0.25]]


def test_diagnose_feeds_a_batch_dependent_method_its_own_evaluation_batches():
    """ARM's and MTL's predictions depend on the batch, so diagnose reads them in the batches
    evaluation uses (64, DomainBed's); the activations equal those of predict over those batches."""
    from types import SimpleNamespace

    from domaingen.datasets.environment import Environment
    from domaingen.datasets.splits import Split
    from domaingen.inspect.diagnose import BATCH_SIZE, diagnose_batch_size, environment_activations

    def model(name):
        space = ALGORITHMS.get(name).hparam_space()
        hp = {**{k: v.default for k, v in space.items()}, "lr": 1e-3, "weight_decay": 0.0, "batch_size": 9, "featurizer": "MLP",
              "mlp_width": 8, "mlp_depth": 3, "mlp_dropout": 0.0}
        torch.manual_seed(0)
        return ALGORITHMS.get(name)((6,), 3, 2, hp).eval()

    assert [diagnose_batch_size(model(n)) for n in ("ARM", "MTL", "ERM")] == [64, 64, BATCH_SIZE]
    arm = model("ARM")
    x = torch.randn(100, 6, generator=torch.Generator().manual_seed(1)) + torch.linspace(0, 3, 100).view(-1, 1)
    split = Split(Environment("e", x, torch.zeros(100, dtype=torch.long)), torch.arange(100))
    asked = []

    def eval_batches(split, batch_size):
        asked.append(batch_size)
        for start in range(0, len(split), batch_size):
            yield split.batch(slice(start, start + batch_size))

    loaded = SimpleNamespace(algorithm=arm, dataset=SimpleNamespace(eval_batches=eval_batches), device=torch.device("cpu"))
    acts, _ = environment_activations(loaded, split)
    assert asked == [64]
    layers = arm.activation_layers()
    inputs, _ = split.batch(slice(None))
    expected = capture_activations(arm.activation_forward, layers, [inputs[:64], inputs[64:]])
    whole = capture_activations(arm.activation_forward, layers, [inputs])  # one batch: other contexts
    for name in layers:
        torch.testing.assert_close(acts[name], expected[name])
        assert not torch.allclose(acts[name], whole[name])
