"""The setting of Zhang et al.'s theorem on FeatureContamination: the fixed output layer, the
hinge and logistic losses on one logit, the class-activation asymmetry of the records, and the
refusals, each checked against a computation done another way."""

from __future__ import annotations

import json
import math

import pytest
import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.base import binary_loss
from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.datasets.contamination import activation_by_class, class_asymmetry_fields, neuron_classes
from domaingen.networks import TwoLayer

THEOREM = {"fc_fixed_head": True, "fc_loss": "hinge", "full_batch": True, "optimizer": "sgd",
           "sgd_momentum": 0.0, "lr": 0.5, "weight_decay": 0.0, "mlp_width": 5, "activation": "relu"}


def erm(hparams, n_inputs=4):
    space = {**{k: v.default for k, v in DATASETS.get("FeatureContamination").hparam_space().items()}, **hparams}
    return ALGORITHMS.get("ERM")((n_inputs,), 2, 2, space)


def test_fixed_head_is_plus_minus_one_over_m_and_never_trained():
    model = erm(THEOREM)
    head = model.classifier
    assert head.weight.shape == (1, 5) and not head.weight.requires_grad and not head.bias.requires_grad
    assert head.weight[0].tolist() == pytest.approx([0.2, 0.2, 0.2, -0.2, -0.2]) and head.bias.item() == 0.0
    x = torch.randn(6, 4)
    logit = model.predict(x)[:, 0]
    by_hand = [sum((0.2 if j < 3 else -0.2) * max(0.0, float(model.featurizer.hidden.weight[j].detach() @ x[i]
                                                               + model.featurizer.hidden.bias[j].detach()))
                   for j in range(5)) for i in range(6)]
    assert logit.tolist() == pytest.approx(by_hand, abs=1e-6)
    before = model.featurizer.hidden.weight.detach().clone()
    model.update([(x[:3], torch.tensor([0, 1, 1])), (x[3:], torch.tensor([1, 0, 0]))])
    assert torch.equal(head.weight[0], torch.tensor([0.2, 0.2, 0.2, -0.2, -0.2]))
    assert not torch.equal(model.featurizer.hidden.weight, before)


def test_fixed_head_with_two_logits_has_the_one_logit_difference():
    model = erm({**THEOREM, "fc_loss": "cross_entropy"})
    x = torch.randn(7, 4)
    logits = model.predict(x)
    hidden = model.featurizer(x)
    signs = torch.tensor([1.0, 1, 1, -1, -1])
    assert logits.shape == (7, 2)
    assert torch.allclose(logits[:, 1] - logits[:, 0], hidden @ signs / 5, atol=1e-6)


def test_hinge_step_is_gradient_descent_on_the_theorems_objective():
    torch.manual_seed(0)
    model = erm({**THEOREM, "weight_decay": 0.01})
    w = model.featurizer.hidden.weight.detach().clone().requires_grad_(True)
    b = model.featurizer.hidden.bias.detach().clone().requires_grad_(True)
    x, y = torch.randn(8, 4), torch.tensor([0, 1, 0, 1, 1, 0, 1, 1])
    a = torch.tensor([0.2, 0.2, 0.2, -0.2, -0.2])
    f = (x @ w.T + b).clamp(min=0) @ a
    sign = 2.0 * y - 1.0
    objective = sum(max(0.0, 1.0 - float(s * v)) for s, v in zip(sign, f)) / 8  # the value, a loop
    loss = torch.clamp(1 - sign * f, min=0).mean()
    gw, gb = torch.autograd.grad(loss, (w, b))
    out = model.update([(x[:4], y[:4]), (x[4:], y[4:])])
    assert out["loss"] == pytest.approx(objective, rel=1e-6)
    assert torch.allclose(model.featurizer.hidden.weight, w - 0.5 * (gw + 0.01 * w), atol=1e-6)
    assert torch.allclose(model.featurizer.hidden.bias, b - 0.5 * (gb + 0.01 * b), atol=1e-6)


def test_binary_losses_by_hand():
    z, y = torch.tensor([[2.0], [0.3], [-1.0]]), torch.tensor([1, 1, 1])
    assert float(binary_loss(z, y, "hinge")) == pytest.approx((0 + 0.7 + 2.0) / 3)
    assert float(binary_loss(z, torch.tensor([0, 0, 0]), "hinge")) == pytest.approx((3.0 + 1.3 + 0.0) / 3)
    expected = sum(math.log1p(math.exp(-v)) for v in (2.0, 0.3, -1.0)) / 3
    assert float(binary_loss(z, y, "logistic")) == pytest.approx(expected, rel=1e-6)
    assert erm({**THEOREM, "fc_loss": "logistic"}).classifier.out_features == 1


def hand_built():
    """TwoLayer 2 -> 3 with set weights; a one-logit head favouring class 1, class 0, class 1."""
    net = TwoLayer(2, 3, "relu")
    with torch.no_grad():
        net.hidden.weight.copy_(torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, -1.0]]))
        net.hidden.bias.copy_(torch.tensor([0.0, -0.5, 0.25]))
    head = torch.nn.Linear(3, 1)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[0.5, -2.0, 0.1]]))

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.featurizer, self.classifier = net, head

        def predict(self, x):
            return self.classifier(self.featurizer(x))

    return Model()


def test_class_asymmetry_fields_match_a_loop_on_a_hand_built_network():
    model = hand_built()
    x = torch.tensor([[1.0, 2.0], [-1.0, 0.5], [0.5, -1.0], [2.0, 1.0], [-0.5, -0.5]])
    y = torch.tensor([1, 0, 1, 0, 0])
    assert neuron_classes(model.classifier, 3).tolist() == [1, 0, 1]
    fields = class_asymmetry_fields(model, x, y, torch.device("cpu"))
    w, b, own_class = [[1, 0], [0, 1], [1, -1]], [0.0, -0.5, 0.25], [1, 0, 1]
    own_means, other_means, slope_diffs = [], [], []
    for j in range(3):
        acts = {0: [], 1: []}
        slopes = {0: [], 1: []}
        for xi, yi in zip(x.tolist(), y.tolist()):
            h = w[j][0] * xi[0] + w[j][1] * xi[1] + b[j]
            acts[yi].append(max(h, 0.0))
            slopes[yi].append(1.0 if h > 0 else 0.0)
        c = own_class[j]
        own_means.append(sum(acts[c]) / len(acts[c]))
        other_means.append(sum(acts[1 - c]) / len(acts[1 - c]))
        slope_diffs.append(sum(slopes[c]) / len(slopes[c]) - sum(slopes[1 - c]) / len(slopes[1 - c]))
    assert fields["activation_own"] == pytest.approx(sum(own_means) / 3)
    assert fields["activation_other"] == pytest.approx(sum(other_means) / 3)
    assert fields["activation_asymmetry"] == pytest.approx((sum(own_means) - sum(other_means)) / 3)
    assert fields["slope_asymmetry"] == pytest.approx(sum(slope_diffs) / 3)


def test_two_logit_head_classes_neurons_by_the_difference_and_skips_zero_weights():
    head = torch.nn.Linear(3, 2)
    with torch.no_grad():
        head.weight.copy_(torch.tensor([[1.0, 0.0, 0.5], [0.0, 1.0, 0.5]]))
    assert neuron_classes(head, 3).tolist() == [0, 1, -1]
    hidden = torch.tensor([[1.0, 2.0, 9.0], [3.0, 5.0, 9.0]])
    own, other = activation_by_class(hidden, torch.tensor([0, 1]), torch.tensor([0, 1, -1]))
    assert (own, other) == (pytest.approx((1.0 + 5.0) / 2), pytest.approx((3.0 + 2.0) / 2))


def test_linear_network_has_no_slope_asymmetry():
    model = hand_built()
    model.featurizer.act = torch.nn.Identity()
    fields = class_asymmetry_fields(model, torch.randn(10, 2), torch.tensor([0, 1] * 5), torch.device("cpu"))
    assert fields["slope_asymmetry"] == 0.0


def test_records_carry_the_asymmetry_of_the_saved_network(tmp_path):
    out = tmp_path / "run"
    hparams = {**THEOREM, "mlp_width": 8}
    code = main(["-q", "train", "--dataset", "FeatureContaminationSeparable", "--algorithm", "ERM", "--test_envs", "2",
                 "--steps", "3", "--checkpoint_freq", "2", "--hparams", json.dumps(hparams), "--output_dir", str(out)])
    assert code == 0
    last = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()][-1]
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    model_state = state["algorithm"]["model"] if "algorithm" in state else state["model"]
    weight = next(v for k, v in model_state.items() if k.endswith("hidden.weight"))
    bias = next(v for k, v in model_state.items() if k.endswith("hidden.bias"))
    dataset = DATASETS.get("FeatureContaminationSeparable")("unused", [2], {})
    x, y = dataset.probes[0.0]
    act = (x @ weight.T + bias).clamp(min=0)
    own = torch.cat([act[y == 1, :4].mean(0), act[y == 0, 4:].mean(0)]).mean()
    other = torch.cat([act[y == 0, :4].mean(0), act[y == 1, 4:].mean(0)]).mean()
    assert last["fc_activation_own"] == pytest.approx(float(own), rel=1e-5)
    assert last["fc_activation_asymmetry"] == pytest.approx(float(own - other), rel=1e-4, abs=1e-6)
    assert next(v for k, v in model_state.items() if k.endswith("classifier.weight")).flatten().tolist() == \
        pytest.approx([1 / 8] * 4 + [-1 / 8] * 4)


@pytest.mark.parametrize("algorithm, hparams, message", [
    ("ERM", {"fc_loss": "squared"}, "unknown fc_loss 'squared'; valid losses: cross_entropy, logistic, hinge"),
    ("ERM", {"fc_fixed_head": True, "featurizer": "MLP"},
     "fc_fixed_head fixes TwoLayer's output layer, but the featurizer is MLP; set featurizer TwoLayer or "
     "fc_fixed_head false"),
    ("ERM", {"fc_fixed_head": True, "mlp_width": 1},
     "fc_fixed_head gives each class half the hidden neurons, but mlp_width is 1; set mlp_width 2 or more"),
    ("IRM", {"fc_loss": "hinge"},
     "fc_loss and fc_fixed_head set the theorem's setting for ERM only, but the algorithm is IRM; use ERM or "
     "leave fc_loss cross_entropy and fc_fixed_head false"),
])
def test_bad_theorem_settings_are_one_line_exit_2_nothing_written(algorithm, hparams, message, tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "FeatureContamination", "--algorithm", algorithm, "--test_envs", "2",
                 "--steps", "2", "--hparams", json.dumps(hparams), "--output_dir", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines() == [f"domaingen: error: {message}"]


def test_a_spec_with_a_bad_theorem_setting_is_refused_when_read(tmp_path, capsys):
    spec = tmp_path / "s.toml"
    spec.write_text('algorithms = ["VREx"]\ndatasets = ["FeatureContamination"]\ntest_envs = [2]\n'
                    '[hparams]\nfc_fixed_head = true\n')
    code = main(["sweep", "launch", "--spec", str(spec), "--output_dir", str(tmp_path / "out"), "--launcher", "dry"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "for ERM only, but the algorithm is VREx" in err[0]


def test_fixed_head_must_be_a_boolean(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "FeatureContamination", "--algorithm", "ERM", "--test_envs", "2",
                 "--steps", "2", "--hparams", '{"fc_fixed_head": "yes"}', "--output_dir", str(out)])
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines() == ["domaingen: error: fc_fixed_head must be true or false, got 'yes'"]


def test_theorem_spec_runs_the_theorems_setting_in_every_part():
    from pathlib import Path

    from domaingen.sweep.spec import build_jobs, load_spec

    jobs = build_jobs(load_spec(Path(__file__).resolve().parents[1] / "sweeps" / "contamination_theorem.toml"))
    assert len(jobs) == 11 * 3 and {job.args["algorithm"] for job in jobs} == {"ERM"}
    for job in jobs:
        hp = job.args["hparams"]
        assert hp["fc_fixed_head"] is True and hp["full_batch"] is True and hp["optimizer"] == "sgd"
        assert hp["sgd_momentum"] == 0.0 and hp["weight_decay"] == 0.001 and job.args["steps"] == 2001
    hinge = {job.args["hparams"]["activation"] for job in jobs if job.args["hparams"]["fc_loss"] == "hinge"}
    assert hinge == {"relu", "identity", "gelu", "tanh", "sigmoid"}
    logistic = {job.args["hparams"]["activation"] for job in jobs if job.args["hparams"]["fc_loss"] == "logistic"}
    assert logistic == {"relu", "identity"}
