"""FeatureContamination (Zhang et al., ICML 2024): its data, its two-layer network, its optimizers,
and the per-checkpoint projections, each checked against a computation done another way."""

from __future__ import annotations

import json
import math
import sys
import time

import pytest
import torch

from domaingen.algorithms.base import make_adam
from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.datasets.contamination import (
    FeatureContaminationBase,
    first_layer_weight,
    probe_risk,
    subspace_projections,
)
from domaingen.networks import TwoLayer, build_featurizer


def build(cls=None, test_envs=(2,)):
    cls = cls or DATASETS.get("FeatureContamination")
    return cls("unused", list(test_envs), {})


def coefficients(dataset, x):
    """The dictionary coefficients of inputs x: least squares against the dictionary, solved by torch."""
    return torch.linalg.lstsq(dataset.dictionary.T.double(), x.T.double()).solution.T


def test_dictionary_is_orthonormal_and_fixed_by_the_seed():
    a, b = build(), build()
    m = a.dictionary.double()
    assert m.shape == (64, 256)
    assert torch.allclose(m @ m.T, torch.eye(64, dtype=torch.float64), atol=1e-5)
    for env_a, env_b in zip(a.environments, b.environments):
        assert torch.equal(env_a.x, env_b.x) and torch.equal(env_a.y, env_b.y)


def test_radial_core_carries_the_label_by_its_norm_and_background_shifts():
    dataset = build()
    for env, shift in zip(dataset.environments, dataset.TRAIN_SHIFTS):
        z = coefficients(dataset, env.x)
        core, background = z[:, :32], z[:, 32:]
        # class 1 on the unit sphere, class 0 on the sphere of radius 2
        radius = core.norm(dim=1)
        assert torch.allclose(radius, (2.0 - env.y).double(), atol=1e-4)
        assert env.y.float().mean().item() == 0.5
        assert background.min().item() >= -shift - 1e-4 and background.max().item() <= 1 - shift + 1e-4
        assert abs(background.mean().item() - (0.5 - shift)) < 0.01
        # independent of the label: per-class means agree within sampling noise (sd of a U[0,1] mean over 16,000)
        gap = background[env.y == 1].mean() - background[env.y == 0].mean()
        assert abs(gap.item()) < 0.02


def test_separable_core_carries_the_label_by_its_sign():
    dataset = build(DATASETS.get("FeatureContaminationSeparable"))
    z = coefficients(dataset, dataset.environments[0].x)
    signs = torch.sign(z[:, :32])
    expected = (2 * dataset.environments[0].y - 1).double().unsqueeze(1).expand_as(signs)
    assert torch.equal(signs, expected)


def test_probes_span_the_shifts_and_data_source_names_the_parameters():
    dataset = build()
    assert sorted(dataset.probes) == [0.0, 0.25, 0.5, 0.75, 1.0]
    for shift, (x, y) in dataset.probes.items():
        background = coefficients(dataset, x)[:, 32:]
        assert abs(background.mean().item() - (0.5 - shift)) < 0.01
    assert dataset.data_source == ("feature-contamination(dim=256,core=32:radial,background=32,shifts=0,0.1,0.2,"
                                   "probes=0,0.25,0.5,0.75,1,n=1000,seed=0)")
    assert dataset.ENVIRONMENTS == ("s=0", "s=0.1", "s=0.2") and dataset.input_shape == (256,)


def test_built_in_well_under_a_second():
    started = time.perf_counter()
    build()
    assert time.perf_counter() - started < 1.0


class TooWide(FeatureContaminationBase):
    CORE_DIM, BACKGROUND_DIM, DIM = 40, 30, 64


class Overshifted(FeatureContaminationBase):
    PROBE_SHIFTS = (0.0, 1.5)


@pytest.mark.parametrize("cls, message", [
    (TooWide, "TooWide has 40 core + 30 background features, more than its dimension DIM=64; orthogonal features "
              "need CORE_DIM + BACKGROUND_DIM <= DIM"),
    (Overshifted, "Overshifted.PROBE_SHIFTS holds [1.5]: a shift strength must be in [0, 1] (0: background U[0, 1], "
                  "1: U[-1, 0])"),
])
def test_inconsistent_parameters_are_one_line_exit_2_nothing_written(cls, message, tmp_path, capsys):
    from domaingen.errors import DomaingenError

    with pytest.raises(DomaingenError) as caught:
        cls.resolve_test_envs([1])
    assert str(caught.value) == message
    plugin = tmp_path / f"bad_fc_{cls.__name__.lower()}.py"
    plugin.write_text(
        "from domaingen.datasets import DATASETS\n"
        "from domaingen.datasets.contamination import FeatureContaminationBase\n"
        f"@DATASETS.register('Bad{cls.__name__}')\n"
        f"class Bad{cls.__name__}(FeatureContaminationBase):\n"
        f"    '''bad'''\n" + "".join(f"    {k} = {getattr(cls, k)!r}\n" for k in cls.__dict__ if k.isupper())
    )
    out = tmp_path / "run"
    try:
        code = main(["-q", "--plugins", str(plugin), "train", "--dataset", f"Bad{cls.__name__}", "--algorithm", "ERM",
                     "--test_envs", "1", "--steps", "2", "--output_dir", str(out)])
    finally:  # later tests' runs (and their child processes) must not be asked to load this file
        from domaingen import plugins
        from domaingen.datasets import DATASETS

        if f"Bad{cls.__name__}" in DATASETS.names():
            DATASETS.unregister(f"Bad{cls.__name__}")
        plugins.forget(str(plugin))
        sys.modules.pop(plugin.stem, None)
    err = capsys.readouterr().err.strip()
    assert code == 2 and not out.exists()
    assert err.splitlines() == [f"domaingen: error: {message.replace(cls.__name__, 'Bad' + cls.__name__)}"]


def test_subspace_projections_match_a_loop():
    dataset = build()
    weight = torch.randn(5, 256, generator=torch.Generator().manual_seed(3))
    core, background = subspace_projections(weight, dataset.core_basis, dataset.background_basis)
    per_neuron = []
    for row in weight:
        dots = [float(row @ dataset.dictionary[k]) for k in range(64)]
        per_neuron.append((math.sqrt(sum(d * d for d in dots[:32])), math.sqrt(sum(d * d for d in dots[32:]))))
    assert core == pytest.approx(sum(c for c, _ in per_neuron) / 5, rel=1e-5)
    assert background == pytest.approx(sum(b for _, b in per_neuron) / 5, rel=1e-5)
    # a neuron made of the first core feature alone projects with norm 1 on core, 0 on background
    pure = dataset.dictionary[:1] * 1.0
    assert subspace_projections(pure, dataset.core_basis, dataset.background_basis) == pytest.approx((1.0, 0.0), abs=1e-5)


def test_first_layer_weight_counts_a_masks_kept_weights_only():
    layer = torch.nn.Linear(4, 3)
    layer.mask_logits = torch.nn.Parameter(torch.tensor([[1.0, -1.0, 2.0, -3.0]] * 3))
    model = torch.nn.Sequential(torch.nn.Linear(7, 7), layer)
    weight = first_layer_weight(model, 4)
    assert torch.equal(weight, layer.weight.detach() * torch.tensor([1.0, 0.0, 1.0, 0.0]))
    assert first_layer_weight(model, 5) is None


class Fixed(torch.nn.Module):
    def __init__(self, logits):
        super().__init__()
        self.logits = logits

    def predict(self, x):
        return self.logits


def test_probe_risk_is_cross_entropy_and_accuracy():
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [3.0, 1.0]])
    y = torch.tensor([0, 0, 0])
    risk, acc = probe_risk(Fixed(logits), torch.zeros(3, 1), y, torch.device("cpu"))
    by_hand = [-math.log(math.exp(a) / (math.exp(a) + math.exp(b))) for a, b in logits.tolist()]
    assert risk == pytest.approx(sum(by_hand) / 3, rel=1e-6) and acc == pytest.approx(2 / 3)
    one = torch.tensor([[1.5], [-0.5]])
    risk, acc = probe_risk(Fixed(one), torch.zeros(2, 1), torch.tensor([1, 1]), torch.device("cpu"))
    assert risk == pytest.approx((math.log1p(math.exp(-1.5)) + math.log1p(math.exp(0.5))) / 2, rel=1e-6)
    assert acc == 0.5


@pytest.mark.parametrize("name, fn", [
    ("relu", lambda h: h.clamp(min=0)), ("identity", lambda h: h), ("tanh", torch.tanh),
    ("sigmoid", lambda h: 1 / (1 + torch.exp(-h))), ("gelu", lambda h: 0.5 * h * (1 + torch.erf(h / math.sqrt(2)))),
])
def test_two_layer_featurizer_applies_its_activation(name, fn):
    net = build_featurizer((6,), {"featurizer": "TwoLayer", "mlp_width": 4, "activation": name})
    assert isinstance(net, TwoLayer) and net.n_outputs == 4
    x = torch.randn(3, 6)
    hidden = x @ net.hidden.weight.T + net.hidden.bias
    assert torch.allclose(net(x), fn(hidden), atol=1e-6)


def test_unknown_activation_and_optimizer_are_one_line_exit_2(tmp_path, capsys):
    base = ["-q", "train", "--dataset", "FeatureContamination", "--algorithm", "ERM", "--test_envs", "2",
            "--steps", "2"]
    for hparams, message in [({"activation": "swish"}, "unknown activation 'swish'; valid activations: relu, gelu, "
                                                       "tanh, sigmoid, identity"),
                             ({"optimizer": "rmsprop"}, "unknown optimizer 'rmsprop'; valid optimizers: adam, adamw, sgd")]:
        out = tmp_path / str(len(message))
        code = main([*base, "--hparams", json.dumps(hparams), "--output_dir", str(out)])
        assert code == 2 and not out.exists()
        assert capsys.readouterr().err.strip().splitlines() == [f"domaingen: error: {message}"]


def test_sgd_step_is_the_heavy_ball_update():
    model = torch.nn.Linear(3, 1)
    start = model.weight.detach().clone()
    opt = make_adam(model, {"lr": 0.1, "weight_decay": 0.01, "optimizer": "sgd", "sgd_momentum": 0.9})
    assert isinstance(opt, torch.optim.SGD)
    velocity = torch.zeros_like(start)
    expected = start.clone()
    for _ in range(2):
        opt.zero_grad()
        model(torch.ones(1, 3)).sum().backward()
        grad = model.weight.grad.detach() + 0.01 * model.weight.detach()
        opt.step()
        velocity = grad if velocity.abs().sum() == 0 else 0.9 * velocity + grad
        expected = expected - 0.1 * velocity
        assert torch.allclose(model.weight.detach(), expected, atol=1e-6)
    assert isinstance(make_adam(model, {"lr": 0.1}), torch.optim.Adam)
    assert isinstance(make_adam(model, {"lr": 0.1, "optimizer": "adamw"}), torch.optim.AdamW)


def test_every_checkpoint_records_projections_equal_to_the_saved_weights(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "FeatureContamination", "--algorithm", "ERM", "--test_envs", "2",
                 "--steps", "5", "--checkpoint_freq", "2", "--hparams", '{"mlp_width": 16}', "--output_dir", str(out)])
    assert code == 0
    records = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 2, 4]
    last = records[-1]
    state = torch.load(out / "checkpoint.pt", weights_only=False)
    model_state = state["algorithm"]["model"] if "algorithm" in state else state["model"]
    weight = next(v for k, v in model_state.items() if k.endswith("hidden.weight"))
    dataset = build()
    core, background = subspace_projections(weight.float(), dataset.core_basis, dataset.background_basis)
    assert last["fc_core_projection"] == pytest.approx(core, rel=1e-5)
    assert last["fc_background_projection"] == pytest.approx(background, rel=1e-5)
    assert last["fc_projection_ratio"] == pytest.approx(background / core, rel=1e-5)
    assert last["fc_id_risk"] == last["fc_risk_s0"] and last["fc_ood_risk"] == last["fc_risk_s1"]
    assert set(k for k in last if k.startswith("fc_acc_")) == {f"fc_acc_s{s}" for s in ("0", "0.25", "0.5", "0.75", "1")}
    assert last["data_source"] == dataset.data_source


# ---- diagnose and report -------------------------------------------------------------------


def test_class_asymmetry_by_hand():
    from domaingen.inspect.contamination import class_asymmetry

    pre = torch.tensor([[2.0, -1.0, 0.0], [1.0, -2.0, 0.0], [1.0, 3.0, -1.0], [-5.0, 1.0, 0.0]])
    labels = torch.tensor([0, 0, 1, 1])
    asym = class_asymmetry(pre, labels, 2)
    # neuron 0: class 0 sums 3, class 1 sums 1 -> 3/4; neuron 1: 0 vs 4 -> 1; neuron 2 never positive -> NaN
    assert asym[:2].tolist() == pytest.approx([0.75, 1.0]) and math.isnan(asym[2].item())


@pytest.fixture(scope="module")
def diagnosed(tmp_path_factory):
    out = tmp_path_factory.mktemp("fc") / "run"
    assert main(["-q", "train", "--dataset", "FeatureContamination", "--algorithm", "ERM", "--test_envs", "2",
                 "--steps", "21", "--checkpoint_freq", "10", "--hparams", '{"mlp_width": 8, "activation": "tanh"}',
                 "--output_dir", str(out)]) == 0
    assert main(["-q", "diagnose", str(out), "--max_examples", "50"]) == 0
    return out


def test_diagnose_adds_per_neuron_projections_and_asymmetry(diagnosed):
    from domaingen.run.reload import load_run

    result = json.loads((diagnosed / "diagnostics.json").read_text())
    section = result["sections"]["feature_contamination"]["first_layer"]
    loaded = load_run(diagnosed)
    weight = loaded.algorithm.featurizer.hidden.weight.detach()
    dataset = loaded.dataset
    for j in range(8):
        z = dataset.dictionary @ weight[j]
        assert section["core_projection_per_neuron"][j] == pytest.approx(float(z[:32].norm()), abs=1e-5)
        assert section["background_projection_per_neuron"][j] == pytest.approx(float(z[32:].norm()), abs=1e-5)
    # the record of the selected step carries the same means
    record = next(json.loads(line) for line in (diagnosed / "results.jsonl").read_text().splitlines()
                  if json.loads(line)["step"] == result["step"])
    assert section["background_projection"] == pytest.approx(record["fc_background_projection"], rel=1e-5)
    # asymmetry recomputed from the training environments' out splits (50 examples each)
    xs, ys = [], []
    for env in (0, 1):
        split = loaded.splits[env][1]
        x, y = split.batch(slice(0, 50))
        xs.append(x)
        ys.append(y)
    x, y = torch.cat(xs), torch.cat(ys)
    with torch.no_grad():
        pre = loaded.algorithm.featurizer.hidden(x).clamp(min=0)
    shares = [max(pre[y == c, j].sum() for c in (0, 1)) / pre[:, j].sum() for j in range(8)]
    expected = [None if math.isnan(float(v)) else pytest.approx(float(v), abs=1e-5) for v in shares]
    assert section["asymmetry_per_neuron"] == expected  # a neuron never positive has none (null)
    # a tanh network: diagnose reads its declared activation module
    assert list(result["layers"]) == ["featurizer.act"]


def test_report_draws_projections_over_steps(diagnosed, tmp_path):
    pytest.importorskip("matplotlib")
    import shutil

    from domaingen.inspect.report import build_report

    sweep = tmp_path / "sweep"
    shutil.copytree(diagnosed, sweep / "run")
    report = build_report(sweep, tmp_path / "out", keep_figures=True)
    spec = next(f for f in report.figures if f.name.endswith("_contamination.png"))
    records = [json.loads(line) for line in (diagnosed / "results.jsonl").read_text().splitlines()]
    assert spec.data["fc_background_projection"] == {"x": [r["step"] for r in records],
                                                     "y": [r["fc_background_projection"] for r in records]}
    assert sorted(k for k in spec.data if k.startswith("fc_acc_s")) == [f"fc_acc_s{s}" for s in ("0", "0.25", "0.5", "0.75", "1")]
    assert len(spec.data["per_neuron"]["asymmetry"]) == 8
    assert "feature contamination" in spec.figure.texts[0].get_text()
    losses = next(f for f in report.figures if f.name.endswith("_losses.png"))
    assert not any(k.startswith("fc_") for k in losses.data)


def test_dmg_masks_the_two_layer_networks_hidden_layer_by_default():
    from domaingen.algorithms import ALGORITHMS

    space = ALGORITHMS.get("DMG").hparam_space()
    hparams = {**{k: v.default for k, v in space.items()}, "lr": 1e-3, "featurizer": "TwoLayer", "mlp_width": 8}
    dmg = ALGORITHMS.get("DMG")((16,), 2, 2, hparams)
    assert dmg.mask_layers == ["classifier"] and dmg.classifier.in_features == 8
