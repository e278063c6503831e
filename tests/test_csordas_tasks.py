"""Csordás et al.'s arithmetic tasks (datasets/arithmetic.py, networks/digits.py) and the mask
statistics `diagnose --domain_masks` adds for them, checked by hand on tiny inputs."""

from __future__ import annotations

import itertools
import json
import sys

import pytest
import torch
import torch.nn.functional as F

from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.datasets.arithmetic import AddMul, ArithmeticBase, DoubleAddition, digits_of
from domaingen.errors import DomaingenError
from domaingen.inspect.domain_masks import mask_iou, seed_stability, weight_ratios
from domaingen.networks.digits import DigitMLP, digit_log_probs_to_numbers, parse_layer_sizes


class Tiny(AddMul):
    N_PER_ENV = 40


class TinyDouble(DoubleAddition):
    N_PER_ENV = 40


def hot(position: int, size: int) -> list[int]:
    return [int(i == position) for i in range(size)]


def test_addmul_encodes_digits_least_significant_first_and_the_operation():
    ds = Tiny("unused", [2], {})
    assert Tiny.INPUT_SHAPE == (42,) and ds.num_classes == 100
    for env, op in ((0, "add"), (1, "mul")):
        x, y = ds.environments[env].batch(slice(0, 40))
        assert ds.environments[env].name == op
        for row, label in zip(x.long().tolist(), y.tolist()):
            digits = [row[10 * k:10 * k + 10].index(1) for k in range(4)]  # a0 a1 b0 b1, one 1 per group
            assert sum(row[:40]) == 4 and row[40:] == hot(env, 2)
            a, b = digits[0] + 10 * digits[1], digits[2] + 10 * digits[3]
            assert label == ((a + b) if op == "add" else (a * b)) % 100
    # 37 and 85 by hand: the positions of their digits 7, 3, 5, 8; 37 * 85 = 3145
    x, y = ds.encode(torch.tensor([1]), torch.tensor([[37, 85]]))
    assert x[0].tolist() == hot(7, 10) + hot(3, 10) + hot(5, 10) + hot(8, 10) + [0, 1] and y.tolist() == [45]
    mixed = ds.environments[2].batch(slice(0, 40))[0]
    assert mixed[:, 40:].tolist() == [hot(n % 2, 2) for n in range(40)]


def test_double_addition_shows_one_pair_in_its_own_block():
    ds = TinyDouble("unused", [2], {})
    assert TinyDouble.INPUT_SHAPE == (80,) and [e.name for e in ds.environments] == ["pair1", "pair2", "pair1+pair2"]
    x, y = ds.encode(torch.tensor([1, 0]), torch.tensor([[37, 85], [9, 90]]))
    block = hot(7, 10) + hot(3, 10) + hot(5, 10) + hot(8, 10)
    assert x[0].tolist() == [0] * 40 + block and y.tolist() == [22, 99]
    assert x[1].tolist() == hot(9, 10) + hot(0, 10) + hot(0, 10) + hot(9, 10) + [0] * 40


def test_number_log_probs_give_the_per_digit_cross_entropy_and_exact_match():
    torch.manual_seed(0)
    logits = torch.randn(6, 2, 10)
    joint = digit_log_probs_to_numbers(logits)
    assert joint.shape == (6, 100) and torch.allclose(joint.exp().sum(1), torch.ones(6))
    y = torch.tensor([0, 9, 10, 42, 99, 57])
    per_digit = sum(F.cross_entropy(logits[:, k], digits_of(y, 2)[:, k]) for k in range(2))
    assert F.cross_entropy(joint, y).item() == pytest.approx(per_digit.item(), rel=1e-5)
    # the best number is the number of the best digits
    best = logits.argmax(-1)
    assert joint.argmax(1).tolist() == (best[:, 0] + 10 * best[:, 1]).tolist()
    three = torch.randn(2, 3, 10)
    for n in (0, 7, 305, 999):
        d = digits_of(torch.tensor(n), 3).tolist()
        expected = sum(torch.log_softmax(three[:, k], -1)[:, d[k]] for k in range(3))
        assert torch.allclose(digit_log_probs_to_numbers(three)[:, n], expected, atol=1e-6)


def test_digit_mlp_reads_the_answer_of_the_pair_it_is_shown():
    torch.manual_seed(0)
    net = DigitMLP(80, (16, 8), digits=2, slots=2)
    assert [tuple(l.weight.shape) for l in net.layers] == [(16, 80), (8, 16), (40, 8)]
    x = torch.zeros(2, 80)
    x[0, 3] = x[0, 15] = 1.0
    x[1, 43] = x[1, 55] = 1.0
    logits = net.digit_logits(x)
    out = net(x)
    assert torch.allclose(out[0], digit_log_probs_to_numbers(logits[0:1, 0])[0])
    assert torch.allclose(out[1], digit_log_probs_to_numbers(logits[1:2, 1])[0])
    assert parse_layer_sizes("400, 400,200") == (400, 400, 200)


@pytest.mark.parametrize("value", ["", "400,0", "a,b"])
def test_bad_layer_sizes_are_one_line(value):
    with pytest.raises(DomaingenError) as caught:
        parse_layer_sizes(value)
    assert str(caught.value) == ("layer_sizes must be positive integers separated by commas (e.g. 400,400,200), "
                                 f"got {value!r}")


def test_weight_ratio_and_iou_by_a_loop_over_mask_tensors():
    torch.manual_seed(1)
    names = {"w1": "l1", "w2": "l2"}
    masks = [[{n: torch.rand(shape) > p for n, shape in (("w1", (5, 4)), ("w2", (3, 5)))} for p in (0.7, 0.3)]
             for _ in range(3)]  # 3 seeds x 2 domains
    kept = [sum(int(v) for m in masks[0][d].values() for v in m.flatten()) for d in range(2)]
    assert weight_ratios(kept) == [[1.0, kept[0] / kept[1]], [kept[1] / kept[0], 1.0]]
    report = seed_stability(["add", "mul"], [4, 5, 6], masks, names)
    assert report["pairs"] == [[4, 5], [4, 6], [5, 6]]
    for d, domain in enumerate(["add", "mul"]):
        ious = []
        for i, j in itertools.combinations(range(3), 2):
            a = [bool(v) for n in names for v in masks[i][d][n].flatten()]
            b = [bool(v) for n in names for v in masks[j][d][n].flatten()]
            ious.append(sum(p and q for p, q in zip(a, b)) / sum(p or q for p, q in zip(a, b)))
        mean = sum(ious) / 3
        assert report["domains"][domain]["pairs"] == pytest.approx(ious)
        assert report["domains"][domain]["mean"] == pytest.approx(mean)
        assert report["domains"][domain]["std"] == pytest.approx((sum((v - mean) ** 2 for v in ious) / 3) ** 0.5)
    assert mask_iou(torch.zeros(3), torch.zeros(3)) != mask_iou(torch.zeros(3), torch.zeros(3))  # NaN


class ModulusOne(ArithmeticBase):
    MODULUS = 1

    @classmethod
    def input_size(cls) -> int:
        return 42


class TooManyDigitsForTheModulus(ArithmeticBase):
    MODULUS = 1000

    @classmethod
    def input_size(cls) -> int:
        return 42


class FiveDigits(ArithmeticBase):
    DIGITS = 5
    MODULUS = 100

    @classmethod
    def input_size(cls) -> int:
        return 42


@pytest.mark.parametrize("cls, message", [
    (ModulusOne, "ModulusOne.MODULUS must be an integer of at least 2, got 1"),
    (TooManyDigitsForTheModulus, "TooManyDigitsForTheModulus.MODULUS=1000 has answers of more digits than the "
                                 "output's DIGITS=2; use MODULUS <= 100 or more DIGITS"),
    (FiveDigits, "FiveDigits.DIGITS=5 is more digits than the output allows: the head scores every number below "
                 "10**DIGITS; use DIGITS <= 4"),
])
def test_impossible_sizes_are_one_line_exit_2_nothing_written(cls, message, tmp_path, capsys):
    with pytest.raises(DomaingenError) as caught:
        cls.check_parameters()
    assert str(caught.value) == message
    name = f"Bad{cls.__name__}"
    plugin = tmp_path / f"bad_arith_{cls.__name__.lower()}.py"
    plugin.write_text(
        "from domaingen.datasets import DATASETS\n"
        "from domaingen.datasets.arithmetic import AddMul\n"
        f"@DATASETS.register('{name}')\n"
        f"class {name}(AddMul):\n"
        "    '''bad'''\n" + "".join(f"    {k} = {getattr(cls, k)!r}\n" for k in cls.__dict__ if k.isupper()))
    out = tmp_path / "run"
    try:
        code = main(["-q", "--plugins", str(plugin), "train", "--dataset", name, "--algorithm", "ERM",
                     "--test_envs", "2", "--steps", "2", "--output_dir", str(out)])
    finally:
        from domaingen import plugins

        if name in DATASETS.names():
            DATASETS.unregister(name)
        plugins.forget(str(plugin))
        sys.modules.pop(plugin.stem, None)
    assert code == 2 and not out.exists()
    assert capsys.readouterr().err.strip().splitlines() == [f"domaingen: error: {message.replace(cls.__name__, name)}"]


def test_diagnose_reports_kept_weights_ratio_and_seed_stability(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["-q", "train", "--dataset", "AddMul", "--algorithm", "ERM", "--test_envs", "2", "--steps", "3",
                 "--checkpoint_freq", "2", "--hparams", '{"layer_sizes": "8,6", "batch_size": 16}',
                 "--output_dir", str(run)]) == 0
    assert main(["-q", "diagnose", str(run), "--domain_masks", "--mask_steps", "3", "--mask_alpha", "0.5",
                 "--max_examples", "50", "--mask_seed", "3", "4", "5"]) == 0
    printed = capsys.readouterr().out
    assert "weight ratio (kept weights) add/mul" in printed and "mask stability over mask seeds 3 4 5" in printed
    masks = json.loads((run / "diagnostics.json").read_text())["domain_masks"]
    layers = masks["layers"]
    assert list(layers) == ["featurizer.layers.0", "featurizer.layers.1", "featurizer.layers.2"]
    assert [layers[n]["weights"] for n in layers] == [42 * 8, 8 * 6, 6 * 20]
    assert masks["layer_order"] == list(layers)  # input to output
    for entry in layers.values():
        assert entry["kept_weights"] == [round(f * entry["weights"]) for f in entry["kept_fraction"]]
    kept = [sum(e["kept_weights"][d] for e in layers.values()) for d in range(2)]
    assert masks["kept_weights"] == kept
    assert masks["weight_ratio"][1][0] == pytest.approx(kept[1] / kept[0])
    stability = masks["seed_stability"]
    assert masks["mask_seeds"] == stability["seeds"] == [3, 4, 5] and len(stability["domains"]["add"]["pairs"]) == 3
    assert set(stability["domains"]["mul"]["layers"]) == set(layers)
    # the first seed's masks are the report's, whatever other seeds follow
    again = tmp_path / "again.json"
    assert main(["-q", "diagnose", str(run), "--domain_masks", "--mask_steps", "3", "--mask_alpha", "0.5",
                 "--max_examples", "50", "--mask_seed", "3", "--output", str(again)]) == 0
    alone = json.loads(again.read_text())["domain_masks"]
    assert alone["layers"] == layers and alone["accuracy_matrix"] == masks["accuracy_matrix"]
    assert "seed_stability" not in alone


def test_mask_seeds_are_distinct_and_non_negative(tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["-q", "train", "--dataset", "AddMul", "--algorithm", "ERM", "--test_envs", "2", "--steps", "1",
                 "--hparams", '{"layer_sizes": "4"}', "--output_dir", str(run)]) == 0
    capsys.readouterr()
    assert main(["-q", "diagnose", str(run), "--domain_masks", "--mask_seed", "1", "1"]) == 2
    assert capsys.readouterr().err.strip() == "domaingen: error: --mask_seed takes distinct non-negative integers, got 1 1"
    assert not (run / "diagnostics.json").exists()


def test_permuted_mnist_environments_are_the_digits_with_their_pixels_reordered():
    from domaingen.datasets.mnist import load_mnist
    from domaingen.datasets.permuted_mnist import PermutedMNIST

    ds = PermutedMNIST("embedded", [2], {})
    digits = load_mnist("embedded")
    orders = [ds.pixel_permutation(e) for e in range(3)]
    assert orders[0].tolist() == list(range(784)) and sorted(orders[1].tolist()) == list(range(784))
    assert orders[1].tolist() != orders[2].tolist()
    for e, env in enumerate(ds.environments):
        images = digits.images[env.source_index].flatten(1)
        for n in (0, 5):
            pixels = images[n].tolist()
            assert env.x[n].tolist() == [pixels[int(orders[e][j])] for j in range(784)]
        assert torch.equal(env.y, digits.labels[env.source_index])


def test_a_featurizer_with_its_own_head_gets_the_identity_head_of_its_size_only():
    from domaingen.algorithms import ALGORITHMS
    from domaingen.networks import build_classifier

    erm = ALGORITHMS.get("ERM")((42,), 100, 2, {**{k: v.default for k, v in AddMul.hparam_space().items()},
                                                "layer_sizes": "6"})
    assert isinstance(erm.classifier, torch.nn.Identity)
    assert sum(p.numel() for p in erm.network.parameters()) == 42 * 6 + 6 + 6 * 20 + 20
    with pytest.raises(DomaingenError) as caught:
        build_classifier(1000, 100, included=True)
    assert str(caught.value) == ("the featurizer ends in its own head of 1000 outputs, but the dataset has 100 classes; "
                                 "use a featurizer that fits the dataset")
