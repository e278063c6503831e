"""DANN, CDANN, SagNet, URM and ADRMX against hand computations of their papers' formulas (loops,
closed forms), their hyperparameter declarations and refusals."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from domaingen.algorithms import ALGORITHMS
from domaingen.algorithms.adrmx import domain_weighted_supcon
from domaingen.algorithms.sagnet import as_two_columns, randomize
from domaingen.datasets import DATASETS
from domaingen.errors import DomaingenError
from domaingen.hparams import HParam, draw_hparams, log_uniform, run_space, seed_hash
from test_algorithms_generic import build, default_hparams, separable_batches

SHAPE = (6,)
TINY = {"featurizer": "MLP", "mlp_width": 8}


def tiny(name: str, seed: int = 0, **overrides):
    return build(name, SHAPE, seed=seed, **{**TINY, **overrides})


def cat(batches):
    x = torch.cat([x for x, _ in batches])
    y = torch.cat([y for _, y in batches])
    d = torch.cat([torch.full((len(y),), i) for i, (_, y) in enumerate(batches)])
    return x, y, d


def ce(logits_row: torch.Tensor, label: int) -> float:
    """-log softmax(row)[label], written out."""
    z = logits_row.detach().double().numpy()
    return float(np.log(np.exp(z - z.max()).sum()) + z.max() - z[label])


def softplus(v: float) -> float:
    return math.log1p(math.exp(-abs(v))) + max(v, 0.0)


# --- DANN / CDANN ---


def hand_discriminator_loss(model, x, y, d, conditional: bool, grad_penalty: float) -> float:
    """L_D example by example: weighted CE of the discriminator plus gp * mean_i ||dCE_i / d input_i||^2."""
    n, k = len(y), model.num_classes
    counts = {c: int((y == c).sum()) for c in range(k)}
    total = penalty = 0.0
    for i in range(n):
        with torch.no_grad():
            inp = model.featurizer(x[i:i + 1])
            if conditional:
                inp = inp + model.class_embeddings.weight[int(y[i])]
        inp = inp.clone().requires_grad_()
        logits = model.discriminator(inp)[0]
        weight = 1.0 / (counts[int(y[i])] * k) if conditional else 1.0 / n
        total += weight * ce(logits, int(d[i]))
        nll = -torch.log_softmax(logits, dim=0)[int(d[i])]
        grad = torch.autograd.grad(nll, inp)[0]
        penalty += float(grad.square().sum()) / n
    return total + grad_penalty * penalty


@pytest.mark.parametrize("name", ["DANN", "CDANN"])
def test_dann_generator_and_discriminator_losses_equal_hand_computation(name):
    model = tiny(name, grad_penalty=0.3, d_steps_per_g_step=1, **{"lambda": 0.7})
    batches = separable_batches(SHAPE, n=6)
    x, y, d = cat(batches)
    conditional = name == "CDANN"
    disc_loss = hand_discriminator_loss(model, x, y, d, conditional, 0.3)
    with torch.no_grad():
        class_loss = np.mean([ce(model.classifier(model.featurizer(x[i:i + 1]))[0], int(y[i])) for i in range(len(y))])
    discriminator = copy.deepcopy(model.discriminator.state_dict())
    out = model.update(batches)  # update 1 with one D step per G step: a G step
    assert set(out) == {"loss", "gen_loss", "class_loss"}
    assert out["class_loss"] == pytest.approx(class_loss, rel=1e-5)
    assert out["gen_loss"] == pytest.approx(class_loss - 0.7 * disc_loss, rel=1e-5)
    for key, value in model.discriminator.state_dict().items():  # the G step leaves D alone
        assert torch.equal(value, discriminator[key]), key
    network = copy.deepcopy(model.network.state_dict())
    disc_loss = hand_discriminator_loss(model, x, y, d, conditional, 0.3)
    out = model.update(batches)  # update 2: a D step
    assert set(out) == {"loss", "disc_loss"}
    assert out["disc_loss"] == pytest.approx(disc_loss, rel=1e-5)
    for key, value in model.network.state_dict().items():  # the D step leaves the network alone
        assert torch.equal(value, network[key]), key
    assert any(not torch.equal(v, discriminator[k]) for k, v in model.discriminator.state_dict().items())


@pytest.mark.parametrize("d_steps, turns", [(1, "GDGDGD"), (2, "DGDDGD"), (3, "DDGDDD")])
def test_d_steps_per_g_step_alternation(d_steps, turns):
    model = tiny("DANN", d_steps_per_g_step=d_steps)
    got = ""
    for s in range(6):
        out = model.update(separable_batches(SHAPE, n=4, seed=s))
        got += "D" if "disc_loss" in out else "G"
    assert got == turns
    assert int(model.update_count) == 6


def test_dann_optimizers_have_their_own_rates_decays_and_betas():
    model = tiny("CDANN", lr_g=2e-3, lr_d=3e-4, weight_decay_g=1e-5, weight_decay_d=1e-3, beta1=0.0)
    (g,), (dgroup,) = model.optimizer.param_groups, model.disc_optimizer.param_groups
    assert (g["lr"], g["weight_decay"], g["betas"]) == (2e-3, 1e-5, (0.0, 0.9))
    assert (dgroup["lr"], dgroup["weight_decay"], dgroup["betas"]) == (3e-4, 1e-3, (0.0, 0.9))
    assert {id(p) for p in g["params"]} == {id(p) for p in model.network.parameters()}
    assert {id(p) for p in dgroup["params"]} == {id(p) for p in model.discriminator.parameters()} | {
        id(model.class_embeddings.weight)}


# --- SagNet ---


def hand_randomize(z: torch.Tensor, alpha: torch.Tensor, perm: torch.Tensor, mix_style: bool) -> torch.Tensor:
    """Row by row: (z_i - mu_i) / sd_i, re-styled with mixed (mu, var) or another row's content."""
    rows = []
    stats = []
    for row in z.double():
        mu = row.sum() / len(row)
        var = ((row - mu) ** 2).sum() / (len(row) - 1)
        stats.append((mu, var))
    for i in range(len(z)):
        mu, var = stats[i]
        j = int(perm[i])
        if mix_style:
            a = float(alpha[i, 0])
            mu_new, var_new = a * mu + (1 - a) * stats[j][0], a * var + (1 - a) * stats[j][1]
            content = (z[i].double() - mu) / torch.sqrt(var + 1e-5)
        else:
            mu_new, var_new = mu, var
            content = (z[j].double() - stats[j][0]) / torch.sqrt(stats[j][1] + 1e-5)
        rows.append(content * torch.sqrt(var_new + 1e-5) + mu_new)
    return torch.stack(rows)


@pytest.mark.parametrize("mix_style", [True, False])
def test_sagnet_randomize_equals_row_by_row_computation(mix_style):
    z = torch.randn(7, 5, generator=torch.Generator().manual_seed(0))
    torch.manual_seed(3)
    alpha, perm = torch.rand(7, 1), torch.randperm(7)
    torch.manual_seed(3)
    torch.testing.assert_close(randomize(z, mix_style).double(), hand_randomize(z, alpha, perm, mix_style),
                               rtol=1e-5, atol=1e-6)


def test_sagnet_three_losses_equal_hand_computation():
    batches = separable_batches(SHAPE, n=6)
    x, y, _ = cat(batches)
    with_adv, without_adv = tiny("SagNet", sag_w_adv=0.5), tiny("SagNet", sag_w_adv=0.5)
    start = copy.deepcopy(with_adv)
    torch.manual_seed(11)
    out = with_adv.update(batches)
    # a twin whose featurizer takes its content step only: it keeps f and the style head as the adversary saw them
    steps, real_step = [], without_adv.optimizer_f.step
    without_adv.optimizer_f.step = lambda: steps.append(1) or (real_step() if len(steps) == 1 else None)
    torch.manual_seed(11)
    without_adv.update(batches)
    assert len(steps) == 2
    torch.manual_seed(11)
    draws = [(torch.rand(len(y), 1), torch.randperm(len(y))) for _ in range(3)]
    with torch.no_grad():
        mixed = hand_randomize(start.featurizer(x), *draws[0], mix_style=True).float()
        loss_c = np.mean([ce(row, int(c)) for row, c in zip(start.classifier(mixed), y)])
        # the style and adversary steps read the featurizer after its content step
        f1 = without_adv.featurizer(x)
        swapped = hand_randomize(f1, *draws[1], mix_style=False).float()
        loss_s = np.mean([ce(row, int(c)) for row, c in zip(start.style_classifier(swapped), y)])
        swapped = hand_randomize(f1, *draws[2], mix_style=False).float()
        logits = without_adv.style_classifier(swapped).double()  # the style head after its step
        loss_adv = 0.5 * np.mean([-np.mean([l - torch.logsumexp(row, 0).item() for l in row.tolist()]) for row in logits])
    assert out["loss_c"] == pytest.approx(loss_c, rel=1e-5)
    assert out["loss_s"] == pytest.approx(loss_s, rel=1e-5)
    assert out["loss_adv"] == pytest.approx(loss_adv, rel=1e-5)
    # the content head moved only in the content step, the style head only in the style step
    assert torch.equal(with_adv.style_classifier.weight, without_adv.style_classifier.weight)
    assert torch.equal(with_adv.classifier.weight, without_adv.classifier.weight)
    assert not torch.equal(with_adv.featurizer.layers[1].weight, without_adv.featurizer.layers[1].weight)


def test_sagnet_one_logit_adversary_is_the_two_class_uniform_target():
    z = torch.tensor([[-1.5], [0.0], [2.0]])
    two = as_two_columns(z)
    expected = [-(math.log(1 / (1 + math.exp(v))) + math.log(1 / (1 + math.exp(-v)))) / 2 for v in (-1.5, 0.0, 2.0)]
    got = -torch.log_softmax(two, dim=1).mean(dim=1)
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-6)


# --- URM ---


def test_urm_generator_and_discriminator_losses_equal_hand_computation():
    model = tiny("URM", urm_adv_lambda=0.15)
    batches = separable_batches(SHAPE, n=6)
    x, y, _ = cat(batches)
    with torch.no_grad():
        z = model.featurizer(x)
        assert z.abs().max() < 1  # tanh output
        logits = model.classifier(z)
        scores = model.discriminator(z)[:, 0].tolist()
    n = len(y)
    ce_loss = np.mean([ce(logits[i], int(y[i])) for i in range(n)])
    g_loss = np.mean([softplus(-s) for s in scores])  # BCE against "noise" (1)
    discriminator = copy.deepcopy(model.discriminator)
    torch.manual_seed(5)
    out = model.update(batches)
    torch.manual_seed(5)
    noise = 2 * torch.rand(z.shape) - 1  # uniform on tanh's box [-1, 1)
    with torch.no_grad():
        noise_scores = discriminator(noise)[:, 0].tolist()
    d_loss = np.mean([softplus(-s) for s in noise_scores]) + 0.15 * np.mean([softplus(s) for s in scores])
    assert out["ce"] == pytest.approx(ce_loss, rel=1e-5)
    assert out["g_loss"] == pytest.approx(g_loss, rel=1e-5)
    assert out["loss"] == pytest.approx(ce_loss + 0.15 * g_loss, rel=1e-5)
    assert out["d_loss"] == pytest.approx(d_loss, rel=1e-5)


@pytest.mark.parametrize("output, low, high", [("relu", 0.0, None), ("sigmoid", 0.0, 1.0)])
def test_urm_feature_activation_bounds_the_features(output, low, high):
    model = tiny("URM", urm_generator_output=output, urm_discriminator_optimizer="sgd",
                 urm_discriminator_hidden_layers=2, urm_discriminator_label_smoothing=0.2)
    assert isinstance(model.disc_optimizer, torch.optim.SGD) and model.disc_optimizer.param_groups[0]["momentum"] == 0.9
    assert sum(isinstance(m, torch.nn.Linear) for m in model.discriminator) == 4
    model.update(separable_batches(SHAPE, n=4))
    with torch.no_grad():
        z = model.featurizer(separable_batches(SHAPE, n=4)[0][0])
    assert z.min() >= low and (high is None or z.max() <= high)


# --- ADRMX ---


def hand_supcon(features: torch.Tensor, y: torch.Tensor, d: torch.Tensor) -> float:
    """The domain-weighted supervised contrastive loss, anchor by anchor and pair by pair."""
    u = [row / row.norm() for row in features.double()]
    n = len(y)
    total, empty = 0.0, 0
    for i in range(n):
        def term(j):
            w = 0.5 if d[j] == d[i] else 0.5
            return w * math.exp(float(u[i] @ u[j]) / 0.07)
        denominator = sum(term(j) for j in range(n) if j != i) + 1e-5
        positives = [j for j in range(n) if j != i and y[j] == y[i]]
        if not positives:
            empty += 1
            continue
        total += sum(math.log(term(j) / denominator + 1e-5) for j in positives) / len(positives)
    return -total / (n - empty + 1)


def test_adrmx_contrastive_loss_equals_pairwise_computation():
    g = torch.Generator().manual_seed(0)
    features = torch.randn(9, 4, generator=g)
    y = torch.tensor([0, 1, 0, 2, 1, 0, 1, 1, 0])  # class 2 has a single example: no positives
    d = torch.tensor([0, 0, 0, 1, 1, 1, 2, 2, 2])
    assert domain_weighted_supcon(features, y, d).item() == pytest.approx(hand_supcon(features, y, d), rel=1e-5)


def test_adrmx_generator_loss_equals_hand_computation():
    model = tiny("ADRMX", d_steps_per_g_step=1, mlp_depth=3, cnt_lambda=0.3, dclf_lambda=0.6, disc_lambda=0.75,
                 rmxd_lambda=0.9)
    batches = separable_batches(SHAPE, n=6)
    x, y, d = cat(batches)
    n = len(y)
    with torch.no_grad():
        label, domain = model.featurizer(x), model.domain_featurizer(x)
        invariant = label - domain
        label_loss = np.mean([ce(r, int(c)) for r, c in zip(model.classifier(label), y)])
        final_loss = np.mean([ce(r, int(c)) for r, c in zip(model.final_classifier(invariant), y)])
        domain_loss = np.mean([ce(r, int(e)) for r, e in zip(model.domain_classifier(domain), d)])
        disc_loss = np.mean([ce(r, int(e)) for r, e in zip(model.discriminator(invariant), d)])
        contrastive = hand_supcon(label, y, d) + hand_supcon(invariant, y, d)
        torch.manual_seed(2)
        remix = 0.0
        for c in range(model.num_classes):
            members = [i for i in range(n) if y[i] == c]
            order = [members[int(k)] for k in torch.randperm(len(members))]
            other = [j for j in order if d[j] != d[order[0]]]
            if len(order) >= 2 and other:
                remix += ce(model.classifier((invariant[order[0]] + domain[other[0]])[None])[0], c)
        remix /= model.num_classes
    torch.manual_seed(2)
    out = model.update(batches)
    assert out["contrastive_loss"] == pytest.approx(contrastive, rel=1e-4)
    assert out["remix_loss"] == pytest.approx(remix, rel=1e-5)
    expected = (label_loss + final_loss + 0.6 * domain_loss + 0.9 * remix + 0.3 * contrastive - 0.75 * disc_loss)
    assert out["loss"] == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("mode", ["paper", "domainbed"])
def test_adrmx_remix_pairs(mode):
    model = tiny("ADRMX", adrmx_remix_pairs=mode)
    y = torch.tensor([0, 1, 1, 0, 0, 1, 1, 0, 1, 0, 0, 1])
    d = torch.tensor([0] * 4 + [1] * 4 + [2] * 4)
    torch.manual_seed(0)
    firsts, seconds = model.remix_pairs(y, d)
    assert len(firsts) == len(seconds) == 2
    if mode == "paper":  # the same class, different domains
        assert all(y[a] == y[b] and d[a] != d[b] for a, b in zip(firsts, seconds))
    else:  # DomainBed: positions drawn within a class, used as indices into the whole batch
        torch.manual_seed(0)
        expected = [torch.randperm(int((y == c).sum()))[:2].tolist() for c in range(2)]
        assert [[a, b] for a, b in zip(firsts, seconds)] == expected


# --- hyperparameters ---


def space(name, dataset="ColoredMNIST"):
    return run_space(dataset, DATASETS.get(dataset), ALGORITHMS.get(name))


def test_dann_lambda_draws_from_its_own_distribution():
    class OtherLambda(ALGORITHMS.get("ERM")):
        # the same name with another meaning and distribution, as Fishr declares it
        HPARAMS = {"lambda": HParam(1000.0, log_uniform(1, 4))}

    ALGORITHMS.register("OtherLambdaTest")(OtherLambda)
    try:
        assert space("DANN")["lambda"].default == 1.0 and str(space("DANN")["lambda"].sampler) == "10^U(-2,2)"
        assert space("OtherLambdaTest")["lambda"].default == 1000.0
        for seed in range(1, 6):
            rng = np.random.default_rng(seed_hash("ColoredMNIST", seed, "lambda"))
            u = rng.uniform()
            dann = draw_hparams(space("DANN"), "ColoredMNIST", seed)["lambda"]
            other = draw_hparams(space("OtherLambdaTest"), "ColoredMNIST", seed)["lambda"]
            assert dann == pytest.approx(10 ** (-2 + 4 * u)) and other == pytest.approx(10 ** (1 + 3 * u))
    finally:
        ALGORITHMS.unregister("OtherLambdaTest")


def test_shared_names_keep_each_algorithms_declaration():
    dann, adrmx = space("DANN"), space("ADRMX")
    assert (dann["beta1"].default, str(dann["beta1"].sampler)) == (0.5, "choice{0.0,0.5}")
    assert (adrmx["beta1"].default, str(adrmx["beta1"].sampler)) == (0.5, "choice{0.5}")
    assert (dann["d_steps_per_g_step"].default, str(dann["d_steps_per_g_step"].sampler)) == (1, "int(2^U(0,3))")
    assert (adrmx["d_steps_per_g_step"].default, str(adrmx["d_steps_per_g_step"].sampler)) == (2, "choice{2}")
    assert (dann["mlp_depth"].default, adrmx["mlp_depth"].default, space("ERM")["mlp_depth"].default) == (3, 9, 3)
    for seed in range(1, 8):
        assert draw_hparams(adrmx, "ColoredMNIST", seed)["mlp_depth"] in (8, 9, 10)
        assert draw_hparams(dann, "ColoredMNIST", seed)["d_steps_per_g_step"] in (1, 2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize("name, key, dataset, default, sampler", [
    ("DANN", "lr_g", "ColoredMNIST", 1e-3, "10^U(-4.5,-2.5)"),
    ("DANN", "lr_g", "PACS", 5e-5, "10^U(-5,-3.5)"),
    ("CDANN", "lr_d", "RotatedMNIST", 1e-3, "10^U(-4.5,-2.5)"),
    ("CDANN", "lr_d", "VLCS", 5e-5, "10^U(-5,-3.5)"),
    ("DANN", "weight_decay_g", "ColoredMNIST", 0.0, None),
    ("DANN", "weight_decay_g", "OfficeHome", 0.0, "10^U(-6,-2)"),
    ("URM", "urm_discriminator_lr", "ColoredMNIST", 1e-3, "10^U(-5.5,-3.5)"),
    ("URM", "urm_discriminator_lr", "TerraIncognita", 5e-5, "10^U(-6,-4.5)"),
    ("ADRMX", "lr", "RotatedMNIST", 3e-3, "choice{0.0005,0.001,0.002,0.003}"),
    ("ADRMX", "lr", "PACS", 3e-5, "choice{2e-05,3e-05,4e-05,5e-05}"),
    ("SagNet", "sag_w_adv", "PACS", 0.1, "10^U(-2,1)"),
])
def test_dataset_dependent_declarations(name, key, dataset, default, sampler):
    hp = space(name, dataset)[key]
    assert hp.default == default
    assert (str(hp.sampler) if hp.sampler else None) == sampler


# --- domains, one logit, bf16 ---


@pytest.mark.parametrize("single_logit", [False, True])
@pytest.mark.parametrize("domains", [2, 5])
@pytest.mark.parametrize("name", ["DANN", "CDANN", "SagNet", "URM", "ADRMX"])
def test_every_domain_count_and_one_logit(name, domains, single_logit):
    hparams = default_hparams(name, **TINY, single_logit=single_logit, mlp_depth=3)
    torch.manual_seed(0)
    model = ALGORITHMS.get(name)(SHAPE, 2, domains, hparams)
    for s in range(3):
        out = model.update(separable_batches(SHAPE, n=4, seed=s, domains=domains))
        assert all(math.isfinite(v) for v in out.values())
    assert model.predict(torch.randn(3, *SHAPE)).shape == (3, 1 if single_logit else 2)


@pytest.mark.parametrize("name", ["DANN", "CDANN", "SagNet", "URM", "ADRMX"])
def test_updates_under_bf16_autocast(name):
    model = tiny(name, d_steps_per_g_step=1, mlp_depth=3, grad_penalty=0.1)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        for s in range(2):  # a G and a D step where the method alternates
            out = model.update(separable_batches(SHAPE, n=4, seed=s))
            assert all(math.isfinite(v) for v in out.values())


# --- bad input ---


@pytest.mark.parametrize("name, overrides, message", [
    ("DANN", {"d_steps_per_g_step": 0},
     r"^d_steps_per_g_step must be an integer >= 1 \(discriminator steps per generator step\), got 0$"),
    ("CDANN", {"d_steps_per_g_step": 1.5},
     r"^d_steps_per_g_step must be an integer >= 1 \(discriminator steps per generator step\), got 1.5$"),
    ("ADRMX", {"d_steps_per_g_step": -1},
     r"^d_steps_per_g_step must be an integer >= 1 \(discriminator steps per generator step\), got -1$"),
    ("DANN", {"beta1": 1.0}, r"^beta1 must be in \[0, 1\) \(Adam's first-moment decay\), got 1.0$"),
    ("DANN", {"lambda": -1.0}, r"^lambda must be >= 0 \(it weighs a loss term\), got -1.0$"),
    ("CDANN", {"grad_penalty": -0.5}, r"^grad_penalty must be >= 0 \(it weighs a loss term\), got -0.5$"),
    ("SagNet", {"sag_w_adv": -1}, r"^sag_w_adv must be >= 0 \(it weighs the adversarial loss\), got -1$"),
    ("URM", {"urm_generator_output": "identity"},
     r"^urm_generator_output must be one of tanh, relu, sigmoid, got 'identity'$"),
    ("URM", {"urm_discriminator_optimizer": "rmsprop"},
     r"^urm_discriminator_optimizer must be adam or sgd, got 'rmsprop'$"),
    ("URM", {"urm": "mmd"}, r"^urm must be adversarial \(the only form implemented\), got 'mmd'$"),
    ("URM", {"urm_discriminator_hidden_layers": -1}, r"^urm_discriminator_hidden_layers must be an integer >= 0, got -1$"),
    ("URM", {"urm_discriminator_label_smoothing": 1.5},
     r"^urm_discriminator_label_smoothing must be in \[0, 1\], got 1.5$"),
    ("ADRMX", {"adrmx_remix_pairs": "random"},
     r"^adrmx_remix_pairs must be one of paper, domainbed, got 'random'$"),
    ("ADRMX", {"rmxd_lambda": -1.0}, r"^rmxd_lambda must be >= 0 \(it weighs a loss term\), got -1.0$"),
])
def test_out_of_domain_values_are_one_line_errors(name, overrides, message):
    hparams = default_hparams(name, **overrides)
    with pytest.raises(DomaingenError, match=message):
        ALGORITHMS.get(name).check_hparams(hparams)
    with pytest.raises(DomaingenError, match=message):
        tiny(name, **overrides)


def test_bad_d_steps_on_the_command_line_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys):
    from domaingen.cli.main import main

    out = tmp_path / "run"
    code = main(["-q", "train", "--dataset", "ColoredMNIST", "--algorithm", "DANN", "--data_dir", "embedded",
                 "--steps", "1", "--hparams", '{"d_steps_per_g_step": 0}', "--output_dir", str(out)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert err == ["domaingen: error: d_steps_per_g_step must be an integer >= 1 "
                   "(discriminator steps per generator step), got 0"]
    assert not out.exists()
