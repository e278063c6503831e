"""CORAL, MMD, CausIRL_CORAL, CausIRL_MMD, MTL, SelfReg, CAD, CondCAD: each loss against a
hand-written computation of its formula (loops, float64), their hyperparameters and refusals,
every domain count and one-logit classifiers, bf16 autocast, and exact resumption."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from conftest import FAST_HPARAMS
from test_modreg import l2_term
from domaingen.run import training
from domaingen.algorithms import ALGORITHMS
from domaingen.cli.main import main
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.hparams import draw_hparams, run_space
from domaingen.run.rundir import RunDirectory
from domaingen.testing import default_hparams, separable_batches, VOLATILE_FIELDS
from domaingen.run.training import TrainConfig, train

NAMES = ["CORAL", "MMD", "CausIRL_CORAL", "CausIRL_MMD", "MTL", "SelfReg", "CAD", "CondCAD"]
SHAPE = (6,)
TINY = {"featurizer": "MLP", "mlp_width": 8}
# the Gaussian kernel's bandwidths (DomainBed's)
BANDWIDTHS = [1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3]


@pytest.fixture
def float64():
    """Build and run in float64, so that the hand computations agree to many digits."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    yield
    torch.set_default_dtype(old)


def make(name: str, domains: int = 3, classes: int = 3, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return ALGORITHMS.get(name)(SHAPE, classes, domains, default_hparams(name, **{**TINY, **overrides}))


def labelled_batches(labels: list[list[int]], seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(len(y), *SHAPE, generator=g).to(torch.get_default_dtype()), torch.tensor(y)) for y in labels]


# labels per domain: class 2 occurs once (no same-label partner), class 0 is missing from domain 1
LABELS = [[0, 0, 1, 2, 1, 0], [1, 1, 1, 1, 1, 1], [0, 1, 1, 0, 0, 1]]


# --- hand computations (plain Python loops over rows and coordinates) ---

def rows(t: torch.Tensor) -> list[list[float]]:
    return t.detach().double().tolist()


def cross_entropy(logits: list[list[float]], y: list[int]) -> float:
    total = 0.0
    for row, label in zip(logits, y):
        top = max(row)
        total += top + math.log(sum(math.exp(v - top) for v in row)) - row[label]
    return total / len(y)


def linear(weight: torch.Tensor, bias: torch.Tensor, inputs: list[list[float]]) -> list[list[float]]:
    w, b = rows(weight), bias.detach().double().tolist()
    return [[sum(wo[i] * x[i] for i in range(len(x))) + bo for wo, bo in zip(w, b)] for x in inputs]


def coral_loops(x: list[list[float]], y: list[list[float]]) -> float:
    k = len(x[0])

    def mean(a):
        return [sum(r[j] for r in a) / len(a) for j in range(k)]

    def cov(a):
        m = mean(a)
        return [[sum((r[i] - m[i]) * (r[j] - m[j]) for r in a) / (len(a) - 1) for j in range(k)] for i in range(k)]

    mx, my, cx, cy = mean(x), mean(y), cov(x), cov(y)
    return (sum((mx[j] - my[j]) ** 2 for j in range(k)) / k
            + sum((cx[i][j] - cy[i][j]) ** 2 for i in range(k) for j in range(k)) / k**2)


def mmd_loops(x: list[list[float]], y: list[list[float]]) -> float:
    def kernel_mean(a, b):
        total = 0.0
        for u in a:
            for v in b:
                d = sum((ui - vi) ** 2 for ui, vi in zip(u, v))
                total += sum(math.exp(-g * d) for g in BANDWIDTHS)
        return total / (len(a) * len(b))

    return kernel_mean(x, x) + kernel_mean(y, y) - 2 * kernel_mean(x, y)


DISTANCE_LOOPS = {"CORAL": coral_loops, "MMD": mmd_loops, "CausIRL_CORAL": coral_loops, "CausIRL_MMD": mmd_loops}


def logits_and_features(algorithm, batches):
    with torch.no_grad():
        features = [algorithm.featurizer(x) for x, _ in batches]
        logits = [linear(algorithm.classifier.weight, algorithm.classifier.bias, rows(z)) for z in features]
    return [rows(z) for z in features], logits


# --- the defining computations ---

@pytest.mark.parametrize("name", ["CORAL", "MMD"])
@pytest.mark.parametrize("domains", [2, 3])
def test_pairwise_penalty_is_the_mean_distance_over_domain_pairs(float64, name, domains):
    algorithm = make(name, domains=domains, mmd_gamma=0.7)
    batches = labelled_batches(LABELS[:domains])
    features, logits = logits_and_features(algorithm, batches)
    pairs = [(i, j) for i in range(domains) for j in range(i + 1, domains)]
    penalty = sum(DISTANCE_LOOPS[name](features[i], features[j]) for i, j in pairs) / len(pairs)
    risk = sum(cross_entropy(z, y.tolist()) for z, (_, y) in zip(logits, batches)) / domains
    out = algorithm.update(batches)
    assert out["penalty"] == pytest.approx(penalty, rel=1e-9)
    assert out["loss"] == pytest.approx(risk, rel=1e-9)  # DomainBed's record: the risk alone


@pytest.mark.parametrize("name", ["CausIRL_CORAL", "CausIRL_MMD"])
def test_causirl_matches_the_pooled_parts_before_and_after_random_cuts(float64, name):
    algorithm = make(name)
    batches = labelled_batches(LABELS)
    features, logits = logits_and_features(algorithm, batches)
    algorithm.numpy_rng = np.random.RandomState(11)
    draws = np.random.RandomState(11)
    cuts = [int(draws.randint(0, len(z))) for z in features]
    first = [r for z, c in zip(features, cuts) for r in z[:c]]
    second = [r for z, c in zip(features, cuts) for r in z[c:]]
    assert len(first) > 1 and len(second) > 1
    out = algorithm.update(batches)
    assert out["penalty"] == pytest.approx(DISTANCE_LOOPS[name](first, second), rel=1e-9)
    assert out["loss"] == pytest.approx(sum(cross_entropy(z, y.tolist()) for z, (_, y) in zip(logits, batches)) / 3, rel=1e-9)


def test_causirl_without_two_examples_on_each_side_has_no_penalty():
    algorithm = make("CausIRL_MMD", domains=1)
    batches = [(torch.randn(2, *SHAPE), torch.tensor([0, 1]))]  # a cut at 0 or 1 leaves one side with < 2 rows
    for _ in range(3):
        assert algorithm.update(batches)["penalty"] == 0.0


def test_mmd_gradient_flows_through_the_penalty(float64):
    # mmd_gamma moves the update: a large weight changes the step
    batches = labelled_batches(LABELS)
    steps = []
    for gamma in (0.0, 100.0):
        algorithm = make("MMD", mmd_gamma=gamma)
        algorithm.update(batches)
        steps.append(torch.cat([p.detach().flatten() for p in algorithm.network.parameters()]))
    assert not torch.allclose(steps[0], steps[1])


@pytest.mark.parametrize("ema", [0.99, 0.5, 1.0])
def test_mtl_loss_sums_domains_with_ema_embeddings(float64, ema):
    algorithm = make("MTL", mtl_ema=ema)
    embeddings = [[0.0] * 8 for _ in range(3)]
    for step in range(2):
        batches = labelled_batches(LABELS, seed=step)
        features, _ = logits_and_features(algorithm, batches)
        expected = 0.0
        for d, (z, (_, y)) in enumerate(zip(features, batches)):
            mean = [sum(r[j] for r in z) / len(z) for j in range(8)]
            embeddings[d] = [ema * m + (1 - ema) * e for m, e in zip(mean, embeddings[d])]
            logits = linear(algorithm.classifier.weight, algorithm.classifier.bias, [r + embeddings[d] for r in z])
            expected += cross_entropy(logits, y.tolist())
        assert algorithm.update(batches)["loss"] == pytest.approx(expected, rel=1e-9)
        np.testing.assert_allclose(algorithm.embeddings.numpy(), np.array(embeddings), rtol=1e-12)


def test_mtl_predicts_with_the_batch_mean_or_a_stored_domain_embedding(float64):
    algorithm = make("MTL")
    algorithm.update(labelled_batches(LABELS))
    x = labelled_batches(LABELS, seed=5)[0][0]
    with torch.no_grad():
        z = rows(algorithm.featurizer(x))
    mean = [sum(r[j] for r in z) / len(z) for j in range(8)]
    stored = algorithm.embeddings[2].tolist()
    w, b = algorithm.classifier.weight, algorithm.classifier.bias
    np.testing.assert_allclose(algorithm.predict(x).detach().numpy(), linear(w, b, [r + mean for r in z]), rtol=1e-10)
    np.testing.assert_allclose(algorithm.predict(x, domain=2).detach().numpy(), linear(w, b, [r + stored for r in z]),
                               rtol=1e-10)


def test_mtl_noise_mode_feeds_standard_normal_noise_as_domainbed(float64):
    algorithm = make("MTL", mtl_embedding="noise")
    batches = labelled_batches(LABELS)
    features, _ = logits_and_features(algorithm, batches)
    torch.manual_seed(3)
    noise = [rows(torch.empty(len(z), 8).normal_()) for z in features]  # one draw per domain, in order
    expected = sum(
        cross_entropy(linear(algorithm.classifier.weight, algorithm.classifier.bias, [r + e for r, e in zip(z, n)]), y.tolist())
        for z, n, (_, y) in zip(features, noise, batches)
    )
    torch.manual_seed(3)
    assert algorithm.update(batches)["loss"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("cdpl", ["trained", "frozen"])
def test_selfreg_loss_is_ce_plus_scaled_same_class_regression(float64, cdpl):
    algorithm = make("SelfReg", selfreg_cdpl=cdpl)
    batches = labelled_batches(LABELS)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches])
    lam = float(np.random.RandomState(4).beta(0.5, 0.5))
    y_sorted, order = torch.sort(y)
    labels = y_sorted.tolist()
    torch.manual_seed(8)
    first, second = [0] * len(labels), [0] * len(labels)
    start = 0
    for c in sorted(set(labels)):  # two permutations of each class, classes in order
        count = labels.count(c)
        p, q = torch.randperm(count).tolist(), torch.randperm(count).tolist()
        for i in range(count):
            first[start + i], second[start + i] = start + p[i], start + q[i]
        start += count
    with torch.no_grad():
        z_t = algorithm.featurizer(x[order])
        h = rows(algorithm.cdpl(z_t))
        z = rows(z_t)
    o = linear(algorithm.classifier.weight, algorithm.classifier.bias, z)

    def mse(a, b):
        return sum((u - v) ** 2 for ra, rb in zip(a, b) for u, v in zip(ra, rb)) / (len(a) * len(a[0]))

    def mix(a):
        return [[lam * u + (1 - lam) * v for u, v in zip(a[first[i]], a[second[i]])] for i in range(len(a))]

    ce = cross_entropy(o, labels)
    individual = mse(o, [o[j] for j in first]) + 0.3 * mse(z, [h[j] for j in first])
    mixed = mse(o, mix(o)) + 0.3 * mse(z, mix(h))
    expected = ce + min(ce, 1.0) * (lam * individual + (1 - lam) * mixed)
    algorithm.numpy_rng = np.random.RandomState(4)
    torch.manual_seed(8)
    assert algorithm.update(batches)["loss"] == pytest.approx(expected, rel=1e-9)


def test_selfreg_cdpl_is_trained_by_default_and_frozen_as_domainbed():
    batches = separable_batches(SHAPE, n=8)
    for mode, moves in (("trained", True), ("frozen", False)):
        algorithm = make("SelfReg", selfreg_cdpl=mode)
        before = [p.detach().clone() for p in algorithm.cdpl.parameters()]
        algorithm.update(batches)
        changed = any(not torch.equal(a, b) for a, b in zip(before, algorithm.cdpl.parameters()))
        assert changed == moves, mode


def bottleneck_loops(z: list[list[float]], y: list[int], d: list[int], temperature: float,
                     conditional: bool, flipped: bool) -> float:
    n = len(z)
    s = [[sum(a * b for a, b in zip(z[i], z[j])) / temperature for j in range(n)] for i in range(n)]
    losses = []
    for i in range(n):
        if not any(y[j] == y[i] for j in range(n) if j != i):
            continue
        support = [j for j in range(n) if j != i and (y[j] == y[i] or not conditional)]
        targets = [j for j in support if (d[j] != d[i]) == flipped]
        if not targets:
            continue
        top = max(s[i][j] for j in support)
        denominator = sum(math.exp(s[i][j] - top) for j in support)
        p_targets = sum(math.exp(s[i][j] - top) for j in targets) / denominator
        sign = -1 if flipped else 1
        losses.append(sign * temperature / 0.07 * math.log(p_targets))
    return sum(losses) / len(losses) if losses else 0.0


@pytest.mark.parametrize("name", ["CAD", "CondCAD"])
@pytest.mark.parametrize("flipped, normalized, project", [(True, False, False), (False, False, False),
                                                          (True, True, False), (True, False, True)])
def test_cad_bottleneck_against_loops(float64, name, flipped, normalized, project):
    algorithm = make(name, is_flipped=flipped, is_normalized=normalized, is_project=project, temperature=0.5, lmbda=0.3)
    batches = labelled_batches(LABELS)
    x = torch.cat([b[0] for b in batches])
    y = torch.cat([b[1] for b in batches]).tolist()
    d = [k for k, (_, yb) in enumerate(batches) for _ in range(len(yb))]
    with torch.no_grad():
        z = algorithm.featurizer(x)
        logits = linear(algorithm.classifier.weight, algorithm.classifier.bias, rows(z))
        if project:
            z = algorithm.project(z)
        if normalized:
            z = z / z.norm(dim=1, keepdim=True)
    bottleneck = bottleneck_loops(rows(z), y, d, 0.5, name == "CondCAD", flipped)
    out = algorithm.update(batches)
    assert out["bn_loss"] == pytest.approx(bottleneck, rel=1e-9)
    assert out["clf_loss"] == pytest.approx(cross_entropy(logits, y), rel=1e-9)
    assert out["loss"] == pytest.approx(out["clf_loss"] + 0.3 * bottleneck, rel=1e-9)


def test_cad_without_a_valid_anchor_has_no_bottleneck():
    algorithm = make("CAD")
    batches = [(torch.randn(2, *SHAPE), torch.tensor([0, 1])), (torch.randn(1, *SHAPE), torch.tensor([2]))]
    assert algorithm.update(batches)["bn_loss"] == 0.0  # no example has another of its label


# --- hyperparameters ---

DOMAINBED_SPACES = {
    "CORAL": {"mmd_gamma": (1.0, "10^U(-1,1)")},
    "MMD": {"mmd_gamma": (1.0, "10^U(-1,1)")},
    "CausIRL_CORAL": {"mmd_gamma": (1.0, "10^U(-1,1)")},
    "CausIRL_MMD": {"mmd_gamma": (1.0, "10^U(-1,1)")},
    "MTL": {"mtl_ema": (0.99, "choice{0.5,0.9,0.99,1.0}")},
    "CAD": {"lmbda": (0.1, "choice{0.0001,0.001,0.01,0.1,1,10.0,100.0}"), "temperature": (0.1, "choice{0.05,0.1}"),
            "is_normalized": (False, None), "is_project": (False, None), "is_flipped": (True, None)},
}
DOMAINBED_SPACES["CondCAD"] = DOMAINBED_SPACES["CAD"]


@pytest.mark.parametrize("name", sorted(DOMAINBED_SPACES))
def test_domainbed_names_defaults_and_distributions(name):
    space = ALGORITHMS.get(name).hparam_space()
    for key, (default, sampler) in DOMAINBED_SPACES[name].items():
        assert space[key].default == default
        assert (str(space[key].sampler) if space[key].sampler else None) == sampler


def test_each_algorithm_draws_its_own_distribution():
    dataset = DATASETS.get("ColoredMNIST")
    for seed in range(1, 30):
        cad = draw_hparams(run_space("ColoredMNIST", dataset, ALGORITHMS.get("CAD")), "ColoredMNIST", seed)
        mtl = draw_hparams(run_space("ColoredMNIST", dataset, ALGORITHMS.get("MTL")), "ColoredMNIST", seed)
        coral = draw_hparams(run_space("ColoredMNIST", dataset, ALGORITHMS.get("CORAL")), "ColoredMNIST", seed)
        assert cad["temperature"] in (0.05, 0.1) and cad["lmbda"] in (1e-4, 1e-3, 1e-2, 1e-1, 1, 1e1, 1e2)
        assert (cad["is_normalized"], cad["is_project"], cad["is_flipped"]) == (False, False, True)
        assert mtl["mtl_ema"] in (0.5, 0.9, 0.99, 1.0)
        assert 0.1 <= coral["mmd_gamma"] <= 10


BAD_HPARAMS = [
    ("MMD", {"mmd_gamma": -0.5}, "mmd_gamma must be >= 0 (it weighs the feature distance), got -0.5"),
    ("CausIRL_CORAL", {"mmd_gamma": -1}, "mmd_gamma must be >= 0 (it weighs the feature distance), got -1"),
    ("MTL", {"mtl_ema": 1.5}, "mtl_ema must be in [0, 1] (an EMA weight), got 1.5"),
    ("MTL", {"mtl_ema": -0.1}, "mtl_ema must be in [0, 1] (an EMA weight), got -0.1"),
    ("MTL", {"mtl_embedding": "zeros"}, "mtl_embedding must be one of mean, noise, got 'zeros'"),
    ("SelfReg", {"selfreg_cdpl": "fixed"}, "selfreg_cdpl must be one of trained, frozen, got 'fixed'"),
    ("CAD", {"lmbda": -1.0}, "lmbda must be >= 0 (it weighs the bottleneck), got -1.0"),
    ("CondCAD", {"temperature": 0}, "temperature must be > 0 (it divides the similarities), got 0"),
]


@pytest.mark.parametrize("name, overrides, message", BAD_HPARAMS, ids=[f"{b[0]}-{next(iter(b[1]))}" for b in BAD_HPARAMS])
def test_out_of_domain_hyperparameters_are_refused(name, overrides, message):
    with pytest.raises(DomaingenError, match=f"^{re.escape(message)}$"):
        ALGORITHMS.get(name).check_hparams(default_hparams(name, **overrides))
    with pytest.raises(DomaingenError, match=f"^{re.escape(message)}$"):  # the composition checks them too
        ALGORITHMS.get(f"{name}+ModReg").check_hparams(default_hparams(f"{name}+ModReg", **overrides))


def test_cli_refuses_a_negative_mmd_gamma_and_one_training_domain(tmp_path, capsys):
    base = ["-q", "train", "--dataset", "ColoredMNIST", "--data_dir", "embedded", "--steps", "2"]
    cases = [
        (["--algorithm", "MMD", "--test_envs", "2", "--hparams", json.dumps({**FAST_HPARAMS, "mmd_gamma": -1})],
         "mmd_gamma must be >= 0 (it weighs the feature distance), got -1"),
        (["--algorithm", "CondCAD", "--test_envs", "0", "1", "--hparams", json.dumps(FAST_HPARAMS)],
         "CondCAD needs at least 2 training domains, got 1; hold out fewer environments"),
    ]
    for k, (extra, message) in enumerate(cases):
        out = tmp_path / f"run{k}"
        code = main([*base, *extra, "--output_dir", str(out)])
        err = capsys.readouterr().err
        assert code == 2 and err.strip() == f"domaingen: error: {message}", err
        assert not out.exists()


# --- domain counts, one-logit classifiers, bf16, composition ---

@pytest.mark.parametrize("name", NAMES)
def test_every_domain_count_and_a_one_logit_classifier(name):
    cls = ALGORITHMS.get(name)
    for domains in (1, 2, 3, 5):
        if domains < cls.MIN_TRAIN_DOMAINS:
            with pytest.raises(DomaingenError, match=f"^{name} needs at least 2 training domains, got 1; "
                                                     "hold out fewer environments$"):
                cls.check_problem(domains, default_hparams(name))
            continue
        cls.check_problem(domains, default_hparams(name))
        algorithm = make(name, domains=domains, classes=2)
        out = algorithm.update(separable_batches(SHAPE, n=8, domains=domains))
        assert math.isfinite(out["loss"])
    cls.check_problem(3, {"single_logit": True})
    algorithm = make(name, classes=2, single_logit=True)
    for _ in range(2):
        assert math.isfinite(algorithm.update(separable_batches(SHAPE, n=8))["loss"])
    assert algorithm.predict(torch.randn(5, *SHAPE)).shape == (5, 1)


def test_methods_that_compare_domains_need_two():
    needs_two = {name for name in NAMES if ALGORITHMS.get(name).MIN_TRAIN_DOMAINS == 2}
    assert needs_two == {"CORAL", "MMD", "CAD", "CondCAD"}


@pytest.mark.parametrize("name", NAMES)
def test_one_update_under_bf16_autocast(name):
    algorithm = make(name, is_project=True) if "CAD" in name else make(name)
    before = [p.detach().clone() for p in algorithm.parameters() if p.requires_grad]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = algorithm.update(separable_batches(SHAPE, n=8))
        logits = algorithm.predict(torch.randn(4, *SHAPE))
    assert all(math.isfinite(v) for v in out.values())
    assert logits.shape == (4, 3) and torch.isfinite(logits.float()).all()
    after = [p for p in algorithm.parameters() if p.requires_grad]
    assert all(p.dtype == torch.float32 for p in after)
    assert any(not torch.equal(a, b) for a, b in zip(before, after))


@pytest.mark.parametrize("name", NAMES)
def test_modreg_composes_and_masks_the_classifier(name):
    assert not ALGORITHMS.get(name).NO_ADDITIVE_PENALTY
    algorithm = make(f"{name}+ModReg")
    out = algorithm.update(separable_batches(SHAPE, n=8))
    assert out["modreg_penalty"] > 0
    in_features = 16 if name == "MTL" else 8  # MTL's classifier reads features and domain embedding
    assert algorithm.classifier.mask_logits.shape == (3, in_features)


# --- checkpoints ---

def config(out, algorithm, **hparams) -> TrainConfig:
    return TrainConfig(dataset="ColoredMNIST", algorithm=algorithm, output_dir=str(out), test_envs=[2],
                       data_dir="embedded", hparams={**FAST_HPARAMS, **hparams}, steps=7, checkpoint_freq=3)


@pytest.mark.parametrize("name, hparams", [("MTL", {"mtl_ema": 0.5}), ("MTL", {"mtl_embedding": "noise"}),
                                           ("SelfReg", {}), ("CausIRL_MMD", {})],
                         ids=["MTL", "MTL-noise", "SelfReg", "CausIRL_MMD"])
def test_interrupted_run_resumes_exactly(tmp_path, monkeypatch, name, hparams):
    """The state beyond weights and Adam: MTL's embeddings, SelfReg's and CausIRL's numpy stream."""
    train(config(tmp_path / "straight", name, **hparams))
    real_evaluate = training.evaluate
    calls = {"n": 0}

    def evaluate_then_die(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 3:  # after the checkpoints at steps 0 and 3
            raise KeyboardInterrupt
        return real_evaluate(*args, **kwargs)

    monkeypatch.setattr(training, "evaluate", evaluate_then_die)
    with pytest.raises(KeyboardInterrupt):
        train(config(tmp_path / "resumed", name, **hparams))
    monkeypatch.setattr(training, "evaluate", real_evaluate)
    assert [r["step"] for r in RunDirectory(tmp_path / "resumed").records()] == [0, 3]
    train(config(tmp_path / "resumed", name, **hparams))
    volatile = VOLATILE_FIELDS
    strip = lambda records: [{k: v for k, v in r.items() if k not in volatile} for r in records]  # noqa: E731
    assert strip(RunDirectory(tmp_path / "resumed").records()) == strip(RunDirectory(tmp_path / "straight").records())


def test_numpy_stream_survives_a_checkpoint_loaded_with_weights_only(tmp_path):
    a = make("SelfReg", seed=1)
    a.update(separable_batches(SHAPE, n=8))
    torch.save(a.checkpoint_state(), tmp_path / "state.pt")
    b = make("SelfReg", seed=2)
    b.load_checkpoint_state(torch.load(tmp_path / "state.pt", weights_only=True))
    assert a.numpy_rng.beta(0.5, 0.5) == b.numpy_rng.beta(0.5, 0.5)


# --- X+ModReg: the penalty (and the L2 term) is part of each objective ---

def _risk(logits, batches):
    return sum(F.cross_entropy(z, y) for z, (_, y) in zip(logits, batches)) / len(batches)


def _kernel_objective(name):
    from domaingen.algorithms.kernels import feature_distance

    kind = "gaussian" if name.endswith("MMD") else "mean_cov"

    def objective(model, batches, penalty):
        features = [model.featurizer(x) for x, _ in batches]
        risk = _risk([model.classifier(z) for z in features], batches)
        if name.startswith("CausIRL"):
            cuts = [int(model.numpy_rng.randint(0, len(z))) for z in features]
            first = torch.cat([z[:c] for z, c in zip(features, cuts)])
            second = torch.cat([z[c:] for z, c in zip(features, cuts)])
            distance = feature_distance(kind, first, second)
        else:
            n = len(features)
            distance = sum(feature_distance(kind, features[i], features[j]) for i in range(n) for j in range(i + 1, n))
            distance = distance / (n * (n - 1) / 2)
        return risk + model.hparams["mmd_gamma"] * distance + l2_term(model.network) + penalty

    return objective


def _mtl_objective(model, batches, penalty):
    ema, total = model.hparams["mtl_ema"], 0.0
    for d, (x, y) in enumerate(batches):
        z = model.featurizer(x)
        embedding = ema * z.mean(0) + (1 - ema) * model.embeddings[d]
        total = total + F.cross_entropy(model.classifier(torch.cat([z, embedding.expand(len(z), -1)], 1)), y)
    return total + l2_term(model.network) + penalty


def _selfreg_objective(model, batches, penalty):
    from domaingen.algorithms.selfreg import same_class_partners

    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    lam = float(model.numpy_rng.beta(0.5, 0.5))
    y, order = torch.sort(y)
    z = model.featurizer(x[order])
    h = model.cdpl(z)
    o = model.classifier(z)
    p, q = same_class_partners(torch.unique_consecutive(y, return_counts=True)[1].tolist())
    ce = F.cross_entropy(o, y)
    individual = F.mse_loss(o, o[p]) + 0.3 * F.mse_loss(z, h[p])
    mixed = F.mse_loss(o, lam * o[p] + (1 - lam) * o[q]) + 0.3 * F.mse_loss(z, lam * h[p] + (1 - lam) * h[q])
    return ce + min(ce.item(), 1.0) * (lam * individual + (1 - lam) * mixed) + l2_term(model.network) + penalty


def _cad_objective(conditional):
    from domaingen.algorithms.cad import bottleneck_loss

    def objective(model, batches, penalty):
        x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
        domains = torch.cat([torch.full((len(b[1]),), d) for d, b in enumerate(batches)])
        z = model.featurizer(x)
        bottleneck = bottleneck_loss(z, y, domains, model.hparams["temperature"], conditional, True)
        return F.cross_entropy(model.classifier(z), y) + model.hparams["lmbda"] * bottleneck + l2_term(model.network) + penalty

    return objective


OBJECTIVES = {
    **{name: _kernel_objective(name) for name in ("CORAL", "MMD", "CausIRL_CORAL", "CausIRL_MMD")},
    "MTL": _mtl_objective, "SelfReg": _selfreg_objective, "CAD": _cad_objective(False), "CondCAD": _cad_objective(True),
}


@pytest.mark.parametrize("name", NAMES)
def test_modreg_penalty_is_in_the_objective(name):
    """Mask-logit gradients after one X+ModReg update = autograd of X's objective + L2 + alpha*S1 + beta*S2."""
    import copy

    from test_modreg import assert_grads_match, composed, logit_grads, objective_grads

    a = composed(name, mmd_gamma=5.0, lmbda=1.0)
    b = copy.deepcopy(a)  # the same weights, masks' logits and numpy stream
    batches = separable_batches((12,), n=8)
    torch.manual_seed(7)  # the masks' samples
    a.update(batches)
    expected, without = objective_grads(b, batches, OBJECTIVES[name])
    assert_grads_match(logit_grads(a.network), expected, without)


def test_mtl_evaluates_in_domainbeds_batches_of_64_unpadded():
    """MTL's test-time embedding is the batch's mean feature, so evaluation must cut the
    examples as DomainBed does (64 at a time, the last batch short) on every device."""
    from domaingen.datasets.environment import Environment
    from domaingen.datasets.splits import Split
    from domaingen.run.evaluation import CompiledPredict, eval_batch_size, split_accuracy

    algorithm = make("MTL", domains=2, classes=2).eval()
    assert eval_batch_size(torch.device("cpu"), algorithm) == 64
    assert eval_batch_size(torch.device("cuda"), algorithm) == 64
    assert CompiledPredict(algorithm, 64).compiled is None  # padding would change the predictions
    x = torch.randint(0, 255, (150, *SHAPE), dtype=torch.uint8)
    y = torch.randint(0, 2, (150,))
    split = Split(Environment("e", x, y), torch.arange(150))
    with torch.no_grad():
        expected = torch.cat([algorithm.predict(split.batch(slice(i, i + 64))[0]).argmax(1)
                              for i in range(0, 150, 64)])
    accuracy = split_accuracy(algorithm, split, torch.device("cpu"))
    assert accuracy == pytest.approx((expected == y).float().mean().item())
